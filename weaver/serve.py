"""`python -m weaver.serve`: our engine behind SGLang's HTTP protocol, on loopback.

    python -m weaver.serve --model smollm2-135m --method weaver --budget 16 --drafter DIR --adapter FILE --port 30000

Routes: GET /health, /get_model_info, /get_server_info (the configuration: model_path, speculative_algorithm and
weaver_method / weaver_budget / weaver_mode / weaver_children / weaver_checkpoints, which the bench checks before it
benchmarks a server); POST /generate (SGLang's GenerateReqInput: `text` or `input_ids`, `rid`, `sampling_params`
with max_new_tokens, temperature, top_k, top_p, sampling_seed (alias seed), ignore_eos, stop; min_p, penalties,
min_new_tokens and n only at their neutral values) answering `text`, `output_ids` and `meta_info` (prompt_tokens,
completion_tokens, finish_reason, e2e_latency, and for speculative methods spec_verify_ct (also when it is 0),
spec_accept_length, spec_correct_drafts_histogram; extensions weaver_accept_lengths, weaver_ttft_s); POST
/v1/completions (OpenAI-compatible, with the same meta_info under `usage`'s sibling `meta_info`). One engine worker
thread runs requests one at a time behind an asyncio lock, so the event loop stays responsive. A request with a field
the server does not know or implement (a misspelt key, streaming, logprobs, a penalty) gets 400 naming it, as does
any malformed value; nothing is silently ignored and bad input never reaches the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from weaver.backends.engine import Engine, EngineConfig
from weaver.bench import PAPER_CHILDREN
from weaver.verify import SAMPLING_MODES


class BadRequest(ValueError):
    """A request the server refuses with 400; the message names the field and the fix."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    ignore_eos: bool
    stop: tuple[str, ...]


# sampling_params fields of SGLang's /generate: the ones the engine implements, and those it accepts only at the
# neutral value (anything else would be silently ignored, so a request asking for it is refused)
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "sampling_seed", "seed", "ignore_eos", "stop")
NEUTRAL_ONLY = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
}
GENERATE_FIELDS = ("text", "input_ids", "sampling_params", "rid", "stream", "return_logprob")
# OpenAI /v1/completions fields -> sampling_params fields (top_k, min_p, repetition_penalty, ignore_eos: SGLang's
# extensions); `model` and `user` are accepted and not used
COMPLETION_FIELDS = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop",
    "ignore_eos": "ignore_eos",
    "n": "n",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
}
COMPLETION_OTHER = ("model", "prompt", "user", "stream", "logprobs", "echo", "best_of", "suffix")
MAX_SEED = 2**63 - 1


def _number(params: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = params.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (kind is int and not float(value).is_integer())
    ):
        raise BadRequest(f"sampling_params.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _refuse_unknown(fields: Any, known: Sequence[str], where: str) -> None:
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise BadRequest(f"{where}: unsupported field(s) {unknown}; this server takes {', '.join(known)}")


def _refuse_true(body: dict[str, Any], keys: Sequence[str], why: str) -> None:
    for key in keys:
        if body.get(key) not in (None, False, 0):
            raise BadRequest(f"{key!r} is not supported ({why}): leave it out or set it to false")


def parse_sampling(params: Any) -> dict[str, Any]:
    """SGLang sampling_params -> keyword arguments of Engine.generate (top_k -1 or 0 = off), plus `stop`.

    Unknown fields, and penalties or options the engine does not implement at non-neutral values, are refused: a
    request is never decoded with settings other than the ones it asked for.
    """
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be a JSON object")
    _refuse_unknown(params, [*SAMPLING_FIELDS, *NEUTRAL_ONLY], "sampling_params")
    for key, neutral in NEUTRAL_ONLY.items():
        if params.get(key) is not None and _number(params, key, float, neutral) != neutral:
            raise BadRequest(f"sampling_params.{key} is not implemented by this engine: leave it out or use {neutral}")
    out = {
        "max_new_tokens": _number(params, "max_new_tokens", int, 128),
        "temperature": _number(params, "temperature", float, 1.0),
        "top_k": _number(params, "top_k", int, -1),
        "top_p": _number(params, "top_p", float, 1.0),
        "seed": _number(params, "sampling_seed", int, _number(params, "seed", int, 0)),
    }
    if out["max_new_tokens"] < 1:
        raise BadRequest(f"sampling_params.max_new_tokens must be >= 1, got {out['max_new_tokens']}")
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
        raise BadRequest("sampling_params: temperature must be >= 0 and top_p in (0, 1]")
    if out["top_k"] < -1:
        raise BadRequest(f"sampling_params.top_k must be >= 1, or -1 / 0 for no top-k, got {out['top_k']}")
    out["top_k"] = max(out["top_k"], 0)
    if not 0 <= out["seed"] <= MAX_SEED:
        raise BadRequest(f"sampling_params.sampling_seed must lie in [0, 2**63 - 1], got {out['seed']}")
    stop = params.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest(f"sampling_params.stop must be a non-empty string or a list of them, got {stop!r}")
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"sampling_params.ignore_eos must be true or false, got {ignore_eos!r}")
    return {**out, "ignore_eos": ignore_eos, "stop": tuple(stop)}


def parse_prompt(body: dict[str, Any], tokenizer: Any, vocab_size: int, text_key: str = "text") -> list[int]:
    """Prompt token ids from `input_ids` (a list of ints) or `text_key` (tokenized as is, no chat template)."""
    ids, text = body.get("input_ids"), body.get(text_key)
    if (ids is None) == (text is None):
        raise BadRequest(f"give exactly one of {text_key!r} or 'input_ids'")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise BadRequest(f"{text_key!r} must be a non-empty string (batched requests are not supported)")
        if tokenizer is None:
            raise BadRequest(f"this server has no tokenizer: send 'input_ids' instead of {text_key!r}")
        return list(tokenizer.encode(text, add_special_tokens=False)) or [tokenizer.bos_token_id or 0]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise BadRequest("'input_ids' must be a non-empty list of integers (batched requests are not supported)")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise BadRequest(f"'input_ids' must lie in [0, {vocab_size}) (the target's vocabulary)")
    return ids


def meta_info(
    result: Any, *, speculative: bool, latency: float, finish: dict[str, Any], rid: str | None = None
) -> dict[str, Any]:
    """SGLang's meta_info for one finished request (+ weaver_* extensions); `id` is the request's rid if given."""
    stats = result.stats
    meta: dict[str, Any] = {
        "id": rid or uuid.uuid4().hex,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "cached_tokens": 0,
        "finish_reason": finish,
        "e2e_latency": latency,
        "weaver_ttft_s": stats.ttft_s,
        "weaver_accept_lengths": stats.accept_lengths,
    }
    verify_ct = stats.steps - 1  # SGLang counts verify passes; the prefill is not one (weaver.generate)
    if speculative:  # also with no verify pass (one new token, or EOS first): a client must see speculation is on
        histogram = [0] * max(stats.accept_lengths, default=0)
        for length in stats.accept_lengths:
            histogram[length - 1] += 1  # indexed by correct drafts = accept length - 1 bonus
        meta.update(
            spec_verify_ct=verify_ct,
            spec_num_correct_drafts=sum(stats.accept_lengths) - verify_ct,
            spec_correct_drafts_histogram=histogram,
        )
        if verify_ct > 0:
            meta["spec_accept_length"] = stats.new_tokens / verify_ct
    return meta


class Server:
    """The request handlers around one Engine; `app` is the aiohttp application."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lock = asyncio.Lock()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weaver-engine")
        self.app = web.Application(middlewares=[self.errors])
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/get_model_info", self.model_info),
                web.get("/get_server_info", self.server_info),
                web.post("/generate", self.generate),
                web.post("/v1/completions", self.completions),
            ]
        )
        self.app.on_shutdown.append(self._stop_worker)

    @web.middleware
    async def errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Refused requests -> 400 with the reason; an engine failure -> 500; the server itself keeps running."""
        try:
            return await handler(request)
        except BadRequest as e:
            return web.json_response({"error": {"message": str(e), "code": 400}}, status=400)
        except web.HTTPException:
            raise
        except ValueError as e:  # the engine's input checks (context length, vocabulary)
            return web.json_response({"error": {"message": str(e), "code": 400}}, status=400)
        except Exception as e:
            return web.json_response({"error": {"message": f"{type(e).__name__}: {e}", "code": 500}}, status=500)

    async def _stop_worker(self, app: web.Application) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /get_model_info fields."""
        c = self.engine.config
        return web.json_response({"model_path": c.model, "tokenizer_path": c.model, "is_generation": True})

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's /get_server_info: the configuration a client checks before it benchmarks this server."""
        from importlib import metadata

        from weaver.bench import checkpoint_id

        c = self.engine.config
        return web.json_response(
            {
                "model_path": c.model,
                "speculative_algorithm": None if c.method == "ar" else "WEAVER_ENGINE",
                "weaver_method": c.method,
                "weaver_budget": c.budget,
                "weaver_mode": c.mode,
                "weaver_children": c.children,
                "weaver_checkpoints": {"drafter": checkpoint_id(c.drafter), "adapter": checkpoint_id(c.adapter)},
                "version": metadata.version("weaver-repro"),
            }
        )

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def _run(
        self, ids: list[int], sampling: dict[str, Any], rid: str | None = None
    ) -> tuple[dict[str, Any], list[int], str | None]:
        """Decode one request in the worker thread (one at a time); returns (meta_info, output ids, text)."""
        stop = sampling.pop("stop")
        start = time.perf_counter()
        async with self.lock:
            result = await asyncio.get_running_loop().run_in_executor(
                self.worker, lambda: self.engine.generate(ids, **sampling)
            )
        latency = time.perf_counter() - start
        output, text, finish = self._finish(result, stop, sampling["max_new_tokens"])
        speculative = self.engine.config.method != "ar"
        meta = meta_info(result, speculative=speculative, latency=latency, finish=finish, rid=rid)
        return meta, output, text

    def _finish(self, result: Any, stop: tuple[str, ...], max_new: int) -> tuple[list[int], str | None, dict]:
        tokenizer = self.engine.tokenizer
        output = result.output_ids
        text = tokenizer.decode(output, skip_special_tokens=True) if tokenizer is not None else None
        for s in stop:  # stop strings cut the text (decoding itself is unchanged: lossless)
            if text is not None and s in text:
                return output, text[: text.index(s)], {"type": "stop", "matched": s}
        if result.stats.hit_eos:
            return output, text, {"type": "stop", "matched": output[-1]}
        return output, text, {"type": "length", "length": max_new}

    async def generate(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        _refuse_unknown(body, GENERATE_FIELDS, "/generate")
        _refuse_true(body, ("stream", "return_logprob"), "this server answers whole, non-streamed texts")
        rid = body.get("rid")
        if rid is not None and not isinstance(rid, str):
            raise BadRequest(f"'rid' must be a string (batched requests are not supported), got {rid!r}")
        sampling = parse_sampling(body.get("sampling_params"))
        ids = parse_prompt(body, self.engine.tokenizer, self.engine.model.config.vocab_size)
        meta, output, text = await self._run(ids, sampling, rid)
        return web.json_response({"text": text, "output_ids": output, "meta_info": meta})

    async def completions(self, request: web.Request) -> web.Response:
        """OpenAI /v1/completions: prompt (string or token list), max_tokens (default 16), temperature, top_p, top_k,
        seed, stop, ignore_eos; n, penalties, min_p only at their neutral values; no streaming, logprobs or echo."""
        body = await self._body(request)
        _refuse_unknown(body, [*COMPLETION_FIELDS, *COMPLETION_OTHER], "/v1/completions")
        _refuse_true(body, ("stream", "logprobs", "echo", "suffix"), "not implemented by this server")
        if body.get("best_of") not in (None, 1):
            raise BadRequest("'best_of' is not supported: leave it out or set it to 1")
        if isinstance(body.get("prompt"), list):  # token ids
            body["input_ids"] = body.pop("prompt")
        params = {ours: body[theirs] for theirs, ours in COMPLETION_FIELDS.items() if theirs in body}
        params.setdefault("max_new_tokens", 16)  # OpenAI's default max_tokens
        sampling = parse_sampling(params)
        ids = parse_prompt(body, self.engine.tokenizer, self.engine.model.config.vocab_size, text_key="prompt")
        meta, _, text = await self._run(ids, sampling)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": meta["finish_reason"]["type"]}
        usage = {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        }
        return web.json_response(
            {
                "id": f"cmpl-{meta['id']}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.engine.config.model,
                "choices": [choice],
                "usage": usage,
                "meta_info": meta,
            }
        )


class ServerThread:
    """Run a Server on loopback in a background thread (tests, notebooks); `url` once entered."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server, self.host, self.port = server, host, port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None

    def __enter__(self) -> ServerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.server.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the port the OS chose for port 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m weaver.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="target: a registry name or a local Hugging Face folder")
    p.add_argument("--method", default="ar", help="ar or a tree source name (weaver.sources)")
    p.add_argument("--budget", type=int, default=0, help="drafted tree nodes per step; 0 for ar")
    p.add_argument("--drafter", default=None, help="drafter checkpoint folder (chain, ddtree, weaver, weaver_chain)")
    p.add_argument("--adapter", default=None, help="Weaver adapter checkpoint file (weaver, weaver_chain)")
    p.add_argument("--mode", default="target_only", choices=SAMPLING_MODES, help="verifier at T > 0")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (loopback by default)")
    p.add_argument("--port", type=int, default=30000, help="TCP port (1..65535)")
    p.add_argument(
        "--children",
        type=int,
        default=PAPER_CHILDREN,
        help=f"weaver builders' fan-out per expanded node (paper: {PAPER_CHILDREN})",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--device", default="cpu", help="where the target, drafter and adapter run: cpu, cuda or cuda:N (default cpu)"
    )
    args = p.parse_args(argv)
    if not 1 <= args.port <= 65535:
        p.error(f"--port must be a TCP port in 1..65535, got {args.port}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = EngineConfig.of(args)
    config.check()  # refuse a bad configuration before the (slow) model load
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    server = Server(Engine(config))
    web.run_app(server.app, host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
