"""lm-eval integration: `weaver` as an lm-eval model, decoding generation tasks with our (speculative) engine.

Importing this module registers the model. lm-eval 0.4 discovers no third-party models from its `lm_eval`
executable (no entry-point hook), so run its CLI through this module, with the same arguments:

    python -m weaver.lm_eval_model --model weaver \
        --model_args model=smollm2-135m,method=weaver,budget=16,drafter=DIR,adapter=FILE --tasks gsm8k

or from Python: `import weaver.lm_eval_model; lm_eval.simple_evaluate(model="weaver", model_args=...)`.
Generation is lossless, so at temperature 0 every method's outputs and scores equal method=ar's.
Log-likelihood requests (multiple-choice tasks) are answered by one plain target forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from weaver.backends.engine import Engine, EngineConfig, parse_device
from weaver.bench import PAPER_CHILDREN

MODEL_ARGS = ("model", "method", "budget", "drafter", "adapter", "mode", "children", "max_gen_toks", "seed")


def _cut(text: str, until: list[str]) -> str:
    """The text before the first stop string (lm-eval's `until`)."""
    cuts = [text.index(s) for s in until if s and s in text]
    return text[: min(cuts)] if cuts else text


@register_model("weaver")
class WeaverLM(LM):
    """model_args: model, method, budget, drafter, adapter, mode, children, max_gen_toks, seed (lm-eval passes
    strings). lm-eval's own batch_size / max_batch_size are accepted (requests run one at a time: the outputs do not
    depend on it); device is cpu, cuda or cuda:N (lm-eval's default cuda:0 is taken as the CPU where CUDA is absent, as
    its HFLM does); any other argument is refused, so a misspelt one cannot go unnoticed."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        method: str = "ar",
        budget: int | str = 0,
        drafter: str | None = None,
        adapter: str | None = None,
        mode: str = "target_only",
        children: int | str = PAPER_CHILDREN,
        max_gen_toks: int | str = 256,
        seed: int | str = 0,
        batch_size: int | str | None = None,
        max_batch_size: int | str | None = None,
        device: str | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ValueError(
                f"unknown weaver model_args {sorted(unknown)}; the weaver model takes {', '.join(MODEL_ARGS)}"
            )
        if device is None or (parse_device(device).type == "cuda" and not torch.cuda.is_available()):
            device = "cpu"  # lm-eval's CLI passes cuda:0 unless told otherwise; without CUDA that means the CPU
        config = EngineConfig(
            model, method, int(budget), drafter, adapter, mode, children=int(children), device=str(device)
        )  # Engine checks the device (and the rest) before loading
        self.engine = Engine(config)
        self.tokenizer = self.engine.tokenizer
        self.max_gen_toks, self.seed = int(max_gen_toks), int(seed)
        self.stats: list[dict[str, Any]] = []  # per generate_until request: GenerationStats.to_dict()

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", self.engine.config.model)).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate_until(self, requests: list[Any]) -> list[str]:
        outputs = []
        for request in requests:
            context, kwargs = request.args
            kwargs = dict(kwargs)
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            sampled = kwargs.get("do_sample", False) and float(kwargs.get("temperature", 1.0)) > 0
            result = self.engine.generate(
                self._encode(context) or [self.tokenizer.bos_token_id or 0],
                max_new_tokens=int(kwargs.get("max_gen_toks", self.max_gen_toks)),
                temperature=float(kwargs.get("temperature", 1.0)) if sampled else 0.0,
                top_k=int(kwargs.get("top_k", 0) or 0),
                top_p=float(kwargs.get("top_p", 1.0)) if sampled else 1.0,
                seed=self.seed,
            )
            self.stats.append(result.stats.to_dict())
            text = _cut(self.tokenizer.decode(result.output_ids, skip_special_tokens=True), until)
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", (context, kwargs), text)
        return outputs

    @torch.inference_mode()
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Sum of log p(continuation | context) under the target, and whether it is the greedy continuation."""
        device = self.engine.model.embed_tokens.weight.device
        ids = torch.tensor([context + continuation], device=device)
        logprobs = self.engine.model(ids[:, :-1]).logits[0, len(context) - 1 :].float().log_softmax(-1)
        target = torch.tensor(continuation, device=device)
        total = float(logprobs.gather(-1, target[:, None]).sum())
        return total, bool((logprobs.argmax(-1) == target).all())

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of (context, continuation), as lm-eval's HFLM splits them: trailing whitespace of the context
        moves to the continuation (" cat" is one token, not " " + "cat"), the whole text is encoded and split where
        the context's ids end; if the tokenizer merges across that boundary, the continuation is encoded alone."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        ctx, whole = self._encode(context), self._encode(context + continuation)
        cont = whole[len(ctx) :] if whole[: len(ctx)] == ctx else self._encode(continuation)
        if not cont:
            raise ValueError(f"the continuation {continuation!r} encodes to no tokens: nothing to score")
        return ctx or [self.tokenizer.bos_token_id or 0], cont  # empty context: condition on the BOS token

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        return [self._score(*self._encode_pair(*request.args)) for request in requests]

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        bos = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id
        return [self._score([bos], self._encode(request.args[0]))[0] for request in requests]


def main() -> None:
    """lm-eval's own CLI, with `weaver` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
