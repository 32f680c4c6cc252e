"""Training entry point: `python -m weaver.train {drafter,features,adapter,hybrid} [flags]`.

Each subcommand delegates to `weaver.training.<name>` (`add_arguments(parser)`, `main(args)`). Trainer modules are
imported lazily, so one that is missing or broken fails only its own subcommand, with a message naming it.
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
from types import ModuleType

TRAINERS = {
    "drafter": "DFlash-style block drafter (METHOD.md section 2)",
    "features": "cache target features for a trained drafter's taps (an adapter's own training data)",
    "adapter": "Weaver adapter over the frozen drafter (METHOD.md section 3)",
    "hybrid": "Gated DeltaNet hybrid target for the CPU default (METHOD.md section 7)",
}


def trainer_module(name: str) -> ModuleType:
    """weaver.training.<name>, or a SystemExit that names the missing module."""
    try:
        return importlib.import_module(f"weaver.training.{name}")
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("weaver"):
            raise SystemExit(
                f"`python -m weaver.train {name}` needs module weaver.training.{name}, which is not available "
                f"({err}); the other trainers still work"
            ) from err
        raise


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser; only the chosen subcommand's module is imported (the others appear in --help by name)."""
    parser = argparse.ArgumentParser(prog="python -m weaver.train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="trainer", required=True, metavar="{" + ",".join(TRAINERS) + "}")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, summary in TRAINERS.items():
        sp = sub.add_parser(name, help=summary, description=summary)
        if name == chosen:
            trainer_module(name).add_arguments(sp)
    return parser


def line_buffered_stdout() -> None:
    """Flush stdout at every line even when it is a file or a pipe (the workflow's logs), so that the progress of an
    hour-long training run can be followed while it runs instead of appearing at its end."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    line_buffered_stdout()
    args = build_parser(argv).parse_args(argv)
    print_host()
    trainer_module(args.trainer).main(args)


def print_host() -> None:
    """One log line of what decides a run's floating-point results besides its flags: packages and the CPU's kernels
    (a rebuild on a host with other SIMD kernels trains to different weights)."""
    import torch
    import transformers

    from weaver.bench import hardware

    hw = hardware()
    print(
        f"host: torch {torch.__version__} ({hw['cpu_capability']} kernels, {hw['torch_threads']} threads), "
        f"transformers {transformers.__version__}, {hw['cpu']}, {hw['cores']} cores, gpu {hw['gpu']}"
    )


if __name__ == "__main__":
    main()
