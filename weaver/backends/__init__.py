"""Bench backends: where a grid cell's prompts are decoded (DESIGN.md "Bench backends").

A backend is a context manager with `run(prompt_ids, max_new_tokens=None) -> stats` (the keys of
GenerationStats.to_dict(); `max_new_tokens` overrides the cell's, for the warm-up request); HTTP backends also expose
`info`, the server's identity, which the bench writes into meta.json:
- `engine`: our PyTorch engine in this process (weaver.backends.engine);
- `server`: an already running server speaking SGLang's `/generate` (SGLang, or `python -m weaver.serve`);
- `sglang`: launches `python -m sglang.launch_server` for the method on loopback, then as `server` (GPU only).
"""

from __future__ import annotations

from typing import Any, Protocol

BACKENDS = ("engine", "server", "sglang")


class Backend(Protocol):
    name: str

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> dict[str, Any]: ...
