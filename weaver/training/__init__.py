"""Training of the drafter, the Weaver adapter and the hybrid target; `python -m weaver.train {drafter,adapter,hybrid}`.

Each trainer module exposes `add_arguments(parser)` and `main(args)`; shared loss helpers live in `losses`.
"""
