"""Registry of named targets (SpecForge style): a name maps to a function that returns a local checkpoint folder.

    @register_target("smollm2-135m")
    def smollm2_135m() -> Path: ...          # e.g. converts a GGUF once and returns the cached folder

A pipeline-built target registers its folder with `register_folder(name, path)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from weaver.paths import MODEL_DIR

TARGETS: dict[str, Callable[[], Path]] = {}


def register_target(name: str) -> Callable[[Callable[[], Path]], Callable[[], Path]]:
    """Decorator: register a folder provider under `name`; a name can be registered only once."""

    def decorate(fn: Callable[[], Path]) -> Callable[[], Path]:
        if name in TARGETS:
            raise ValueError(f"target {name!r} is already registered (by {TARGETS[name].__qualname__})")
        TARGETS[name] = fn
        return fn

    return decorate


def register_folder(name: str, folder: str | Path) -> None:
    """Register a local Hugging Face checkpoint folder under `name`."""
    path = Path(folder)
    register_target(name)(lambda: path)


def resolve_target(name_or_path: str | Path) -> Path:
    """A registry name or a local folder -> the checkpoint folder; KeyError lists what is available."""
    if isinstance(name_or_path, str) and name_or_path in TARGETS:
        return Path(TARGETS[name_or_path]())
    path = Path(name_or_path)
    if path.is_dir():
        return path
    raise KeyError(
        f"unknown target {str(name_or_path)!r}: not a registered name ({', '.join(sorted(TARGETS)) or 'none'}) "
        "nor a local folder with config.json and *.safetensors"
    )


@register_target("smollm2-135m-gdn")
def smollm2_135m_gdn() -> Path:
    """The CPU default's 3 GDN : 1 attention hybrid, built by the pipeline (weaver.training.hybrid) into its folder."""
    folder = Path(MODEL_DIR.format(run="cpu", model="smollm2-135m-gdn"))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"the hybrid target is not built yet: {folder} has no config.json; build it from the repository root with "
            f"`snakemake {folder}` or `python -m weaver.train hybrid --out {folder}`"
        )
    return folder
