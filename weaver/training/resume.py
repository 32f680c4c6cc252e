"""When a training state on disk may be resumed: same architecture, same recipe and same inputs, only a longer run.

A trainer that finds `train_state.pt` in its --out folder resumes from it only when the saved architecture equals the
current one, the saved training settings differ from the current ones in RESUMABLE fields at most (a run may be
extended with a larger --steps), and the fingerprints of what it trains against (the frozen drafter, the target's
embedding and head, the feature store) are the saved ones: a retrained drafter or rebuilt target must not be met by
a state trained against the old one. Otherwise it refuses with the fields that differ, or, with --restart-if-changed
(what the workflow passes, so that a changed config or input retrains), moves the old state aside and trains from
scratch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

RESUMABLE = frozenset({"steps", "save_every"})


def changed_fields(
    saved: dict[str, Any] | None, current: dict[str, Any], ignore: frozenset[str] = frozenset()
) -> list[str]:
    """'name: saved -> current' for each field that differs (all of them when nothing was saved), sorted by name."""
    if saved is None:
        return ["(not recorded in the state)"]
    names = sorted((set(saved) | set(current)) - ignore)
    return [f"{n}: {saved.get(n)!r} -> {current.get(n)!r}" for n in names if saved.get(n) != current.get(n)]


def fingerprint(tensors: Iterable[torch.Tensor]) -> str:
    """A short content hash of tensors (dtype, shape and bytes, in order): the identity of a training input."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def store_fingerprint(store: Any) -> str:
    """The identity of a feature store: its meta.json (spec and data fingerprint), or "" for a store without one."""
    meta = getattr(store, "meta", None)
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16] if meta else ""


def resumable(
    path: Path,
    state: dict[str, Any],
    model_config: dict[str, Any],
    train_config: dict[str, Any],
    restart_if_changed: bool,
    log: Callable[[str], None] = print,
    inputs: dict[str, str] | None = None,
) -> bool:
    """Whether `state` (loaded from `path`) can be resumed under the current configs (plain dicts, as in asdict).

    The state must hold "model_config", "train_config" and "step"; with `inputs` (name -> fingerprint of what the run
    trains against) also the same "inputs" (a state from before inputs were recorded counts as changed). A state at a
    step beyond the current train_config["steps"] is refused even with restart_if_changed: lowering --steps is never
    a reason to discard training. Differences elsewhere raise ValueError naming them, or with restart_if_changed
    rename the state to train_state.stale-<unix time>.pt (kept, never deleted) and return False.
    """
    step, steps = int(state["step"]), int(train_config["steps"])
    if step > steps:
        raise ValueError(f"{path} is at step {step}, beyond --steps {steps}: raise --steps or use another --out")
    diffs = [f"architecture {d}" for d in changed_fields(state.get("model_config"), model_config)]
    diffs += changed_fields(state.get("train_config"), train_config, ignore=RESUMABLE)
    if inputs is not None:
        diffs += [f"input {d}" for d in changed_fields(state.get("inputs"), inputs)]
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
