"""The DATASETS registry: lowercase dataset names -> prompt loaders (METHOD.md section 8).

Every loader has the same keyword signature ``loader(*, n, seed, path) -> list[Prompt]``: ``n`` prompts drawn with
``seed`` (all of them when ``n`` is None), and ``path`` a local file that replaces the packaged or hub copy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Prompt:
    """One evaluation request: the chat messages sent to the target before it generates.

    Attributes:
        prompt_id: stable id within the dataset (the source's own id where it has one).
        dataset: registry name of the dataset it came from.
        messages: chat messages ({"role": "system" | "user" | "assistant", "content": str}); the target answers
            the last user turn (MT-Bench and ShareGPT use their first turn only, as in the paper).
    """

    prompt_id: str
    dataset: str
    messages: tuple[dict[str, str], ...]


class PromptLoader(Protocol):
    def __call__(self, *, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]: ...


class Registry(Generic[T]):
    """A name -> object map filled by a decorator; duplicates are refused and unknown names list what exists."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase; got {name!r}, use {name.lower()!r}")

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)


DATASETS: Registry[PromptLoader] = Registry("dataset")


def subsample(items: Sequence[T], n: int | None, seed: int) -> list[T]:
    """``n`` items drawn without replacement by ``seed``, in source order; all of them when n is None."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 0:
        raise ValueError(f"n must be positive or None (all prompts), got {n}")
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]


def load_prompts(name: str, *, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]:
    """Prompts of the registered dataset ``name`` (see DATASETS.names())."""
    return DATASETS[name](n=n, seed=seed, path=path)


def user_prompt(dataset: str, prompt_id: object, text: str) -> Prompt:
    """A single-turn prompt."""
    return Prompt(prompt_id=str(prompt_id), dataset=dataset, messages=({"role": "user", "content": text},))
