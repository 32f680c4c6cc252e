"""When a training state on disk may be resumed: same architecture and same recipe, only a longer run.

A trainer that finds `train_state.pt` in its --out folder resumes from it only when the saved architecture equals the
current one and the saved training settings differ from the current ones in RESUMABLE fields at most (a run may be
extended with a larger --steps). Otherwise it refuses with the fields that differ, or, with --restart-if-changed (what
the workflow passes, so that a changed config retrains), moves the old state aside and trains from scratch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESUMABLE = frozenset({"steps", "save_every"})


def changed_fields(
    saved: dict[str, Any] | None, current: dict[str, Any], ignore: frozenset[str] = frozenset()
) -> list[str]:
    """'name: saved -> current' for each field that differs (all of them when nothing was saved), sorted by name."""
    if saved is None:
        return ["(not recorded in the state)"]
    names = sorted((set(saved) | set(current)) - ignore)
    return [f"{n}: {saved.get(n)!r} -> {current.get(n)!r}" for n in names if saved.get(n) != current.get(n)]


def resumable(
    path: Path,
    state: dict[str, Any],
    model_config: dict[str, Any],
    train_config: dict[str, Any],
    restart_if_changed: bool,
    log: Callable[[str], None] = print,
) -> bool:
    """Whether `state` (loaded from `path`) can be resumed under the current configs (plain dicts, as in asdict).

    The state must hold "model_config", "train_config" and "step". A state at a step beyond the current
    train_config["steps"] is refused even with restart_if_changed: lowering --steps is never a reason to discard
    training. Differences elsewhere raise ValueError naming them, or with restart_if_changed rename the state to
    train_state.stale-<unix time>.pt (kept, never deleted) and return False.
    """
    step, steps = int(state["step"]), int(train_config["steps"])
    if step > steps:
        raise ValueError(f"{path} is at step {step}, beyond --steps {steps}: raise --steps or use another --out")
    diffs = [f"architecture {d}" for d in changed_fields(state.get("model_config"), model_config)]
    diffs += changed_fields(state.get("train_config"), train_config, ignore=RESUMABLE)
    if not diffs:
        return True
    listed = "; ".join(diffs)
    if not restart_if_changed:
        raise ValueError(
            f"{path} was written by a run with other settings ({listed}): delete it, use another --out, or pass "
            "--restart-if-changed to move it aside and train from scratch"
        )
    stale = path.with_name(f"{path.stem}.stale-{int(time.time())}{path.suffix}")
    path.rename(stale)
    log(f"{path} was written by a run with other settings ({listed}): moved to {stale.name}, training from scratch")
    return False


def add_restart_argument(parser: argparse.ArgumentParser) -> None:
    """--restart-if-changed, shared by the trainers that resume from --out."""
    parser.add_argument(
        "--restart-if-changed",
        action="store_true",
        help="when --out holds a train_state.pt of other settings, move it aside (train_state.stale-<time>.pt) and "
        "train from scratch instead of refusing (a larger --steps alone resumes)",
    )
