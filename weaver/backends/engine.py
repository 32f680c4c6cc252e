"""The in-process backend: our PyTorch engine (`weaver.generate`) with one target loaded once.

`Engine` is shared by the bench, `python -m weaver.serve` and the lm-eval model: it owns the target, the tokenizer,
the method's drafter / adapter options and the tree budget, and runs one request at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from weaver.bench import ADAPTER_METHODS, DRAFTER_METHODS, PAPER_CHILDREN


@dataclass(frozen=True)
class EngineConfig:
    """What the engine decodes with; request-level settings (temperature, max_new_tokens, seed) come per call."""

    model: str  # registry name or local Hugging Face folder (weaver.models.load_target)
    method: str = "ar"
    budget: int = 0
    drafter: str | None = None
    adapter: str | None = None
    mode: str = "target_only"  # sampling verifier at temperature > 0
    children: int = PAPER_CHILDREN  # weaver builders' fan-out: top pool children per expanded node
    device: str = "cpu"  # where target, drafter and adapter run ("cuda", "cuda:1"); trees and verification stay on CPU

    @classmethod
    def of(cls, source: Any) -> EngineConfig:
        """The engine fields of an object that has them as attributes (a bench CellConfig, a CLI namespace)."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})

    def check(self) -> None:
        """Refuse a configuration the engine cannot run, before the (slow) model load."""
        from weaver.sources import check_method
        from weaver.verify import SAMPLING_MODES

        check_method(self.method)
        check_device(self.device)
        if self.mode not in SAMPLING_MODES:
            raise ValueError(f"mode must be one of {', '.join(SAMPLING_MODES)}, got {self.mode!r}")
        if self.children < 1:
            raise ValueError(f"children must be >= 1 (top pool children per expanded node), got {self.children}")
        if self.method == "ar" and self.budget != 0:
            raise ValueError(f"method 'ar' drafts nothing: use budget 0, got {self.budget}")
        if self.method != "ar" and self.budget < 1:
            raise ValueError(f"method {self.method!r} needs a tree budget >= 1, got {self.budget}")
        if self.method in DRAFTER_METHODS and not self.drafter:
            raise ValueError(f"method {self.method!r} drafts with a drafter: give drafter=CHECKPOINT_DIR")
        if self.method in ADAPTER_METHODS and not self.adapter:
            raise ValueError(f"method {self.method!r} uses the Weaver adapter: give adapter=CHECKPOINT")


def parse_device(device: str) -> torch.device:
    """The torch device named by `device`; refuses a name torch cannot parse and devices other than cpu / cuda."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a torch device: use cpu, cuda or cuda:N ({error})") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: the engine runs on cpu or cuda")
    return parsed


def check_device(device: str) -> None:
    """Refuse a device torch cannot name or this machine lacks, naming the fix."""
    parsed = parse_device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device here: use device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def canonical_device(device: str) -> str:
    """One name per device: "cuda" is the current CUDA device "cuda:N" (so "cuda" and "cuda:0" are one device)."""
    parsed = torch.device(device)
    if parsed.type == "cuda" and parsed.index is None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return str(parsed)


def place(model: Any, device: str) -> Any:
    """The target on `device`, moved only when it is elsewhere (a no-op .to() would still re-fuse its fast-path
    weights)."""
    if str(model.embed_tokens.weight.device) == canonical_device(device):
        return model
    return model.to(device)


class Engine:
    """One loaded target + method. Not thread-safe: callers serialise requests (the server uses one worker)."""

    def __init__(self, config: EngineConfig, model: Any = None, tokenizer: Any = None) -> None:
        """Load the target from `config.model`, or use an already loaded `model` (and `tokenizer`, may be None)."""
        config.check()
        if model is None:
            from weaver.models import load_target

            model, tokenizer = load_target(config.model)
        model = place(model, config.device)
        self.config, self.model, self.tokenizer = config, model, tokenizer
        # checkpoints are loaded once here; each request gets a fresh source around them (sources keep request state)
        self.options: dict[str, Any] = {}
        if config.method in DRAFTER_METHODS:
            from weaver.drafter import load_drafter

            self.options["drafter"] = load_drafter(config.drafter).to(config.device)
        if config.method in ADAPTER_METHODS:
            from weaver.adapter import Weaver

            # its [V, d] tables depend on the target only: computed once, not per request (~0.5 s for SmolLM2)
            self.options["adapter"] = (
                Weaver.load(config.adapter)
                .to(config.device)
                .bind(model.embed_tokens.weight, model.lm_head.weight, children=config.children)
            )
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids: tuple[int, ...] = (eos,) if eos is not None else ()

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        ignore_eos: bool = False,
        expected: bool = False,
    ) -> Any:
        """Decode one request; returns weaver.generate.GenerationResult (`expected`: log each step's expected accept
        length, see weaver.generate.generate). Bad sampling values raise ValueError."""
        from weaver.generate import generate
        from weaver.sources import make_source
        from weaver.verify import SamplingParams

        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        source = make_source(self.config.method, self.model, **self.options)
        return generate(
            self.model,
            list(prompt_ids),
            source=source,
            budget=self.config.budget,
            max_new_tokens=max_new_tokens,
            params=params,
            mode=self.config.mode,
            eos_ids=() if ignore_eos else self.eos_ids,
            seed=seed,
            expected=expected,
        )


class EngineBackend:
    """Bench backend running each prompt through `Engine` in this process."""

    name = "engine"

    def __init__(self, engine: Engine, *, temperature: float, max_new_tokens: int, seed: int) -> None:
        self.engine, self.temperature, self.max_new_tokens, self.seed = engine, temperature, max_new_tokens, seed

    def __enter__(self) -> EngineBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> dict[str, Any]:
        """One prompt; `max_new_tokens` overrides the cell's (the bench's warm-up)."""
        new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        result = self.engine.generate(
            prompt_ids, max_new_tokens=new, temperature=self.temperature, seed=self.seed, expected=True
        )
        return result.stats.to_dict()
