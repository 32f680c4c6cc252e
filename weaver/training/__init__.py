"""Training of the drafter, the Weaver adapter and the hybrid target, and the target features they train on.

`python -m weaver.train {drafter,features,adapter,hybrid}`.

Each trainer module exposes `add_arguments(parser)` and `main(args)`; shared loss helpers live in `losses`.
"""
