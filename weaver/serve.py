"""`python -m weaver.serve`: our engine behind SGLang's HTTP protocol, on loopback.

    python -m weaver.serve --model smollm2-135m --method weaver --budget 16 --drafter DIR --adapter FILE --port 30000

Routes: GET /health; POST /generate (SGLang's GenerateReqInput: `text` or `input_ids`, `sampling_params` with
max_new_tokens, temperature, top_k, top_p, sampling_seed (alias seed), ignore_eos, stop) answering `text`,
`output_ids` and `meta_info` (prompt_tokens, completion_tokens, finish_reason, e2e_latency, and for speculative
methods spec_verify_ct, spec_accept_length, spec_correct_drafts_histogram; extensions weaver_accept_lengths,
weaver_ttft_s); POST /v1/completions (OpenAI-compatible, with the same meta_info under `usage`'s sibling
`meta_info`). One engine worker thread runs requests one at a time behind an asyncio lock, so the event loop stays
responsive; bad requests get 400 with the reason and never reach the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from weaver.backends.engine import Engine, EngineConfig


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


def _number(params: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = params.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise BadRequest(f"sampling_params.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def parse_sampling(params: Any) -> dict[str, Any]:
    """SGLang sampling_params -> keyword arguments of Engine.generate (top_k -1 or 0 = off)."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be a JSON object")
    out = {
        "max_new_tokens": _number(params, "max_new_tokens", int, 128),
        "temperature": _number(params, "temperature", float, 1.0),
        "top_k": max(_number(params, "top_k", int, -1), 0),
        "top_p": _number(params, "top_p", float, 1.0),
        "seed": _number(params, "sampling_seed", int, _number(params, "seed", int, 0)),
    }
    if out["max_new_tokens"] < 1:
        raise BadRequest(f"sampling_params.max_new_tokens must be >= 1, got {out['max_new_tokens']}")
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
        raise BadRequest("sampling_params: temperature must be >= 0 and top_p in (0, 1]")
    stop = params.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("sampling_params.stop must be a non-empty string or a list of them")
    return {**out, "ignore_eos": bool(params.get("ignore_eos", False)), "stop": stop}


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


def meta_info(result: Any, *, speculative: bool, latency: float, finish: dict[str, Any]) -> dict[str, Any]:
    """SGLang's meta_info for one finished request (+ weaver_* extensions)."""
    stats = result.stats
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "cached_tokens": 0,
        "finish_reason": finish,
        "e2e_latency": latency,
        "weaver_ttft_s": stats.ttft_s,
        "weaver_accept_lengths": stats.accept_lengths,
    }
    verify_ct = stats.steps - 1  # SGLang counts verify passes; the prefill is not one (weaver.generate)
    if speculative and verify_ct > 0:
        histogram = [0] * (max(stats.accept_lengths) if stats.accept_lengths else 1)
        for length in stats.accept_lengths:
            histogram[length - 1] += 1  # indexed by correct drafts = accept length - 1 bonus
        meta.update(
            spec_verify_ct=verify_ct,
            spec_accept_length=stats.new_tokens / verify_ct,
            spec_num_correct_drafts=sum(stats.accept_lengths) - verify_ct,
            spec_correct_drafts_histogram=histogram,
        )
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
        c = self.engine.config
        return web.json_response({"model_path": c.model, "method": c.method, "budget": c.budget, "mode": c.mode})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def _run(self, ids: list[int], sampling: dict[str, Any]) -> tuple[dict[str, Any], list[int], str | None]:
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
        return meta_info(result, speculative=speculative, latency=latency, finish=finish), output, text

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
        sampling = parse_sampling(body.get("sampling_params"))
        ids = parse_prompt(body, self.engine.tokenizer, self.engine.model.config.vocab_size)
        meta, output, text = await self._run(ids, sampling)
        return web.json_response({"text": text, "output_ids": output, "meta_info": meta})

    async def completions(self, request: web.Request) -> web.Response:
        """OpenAI /v1/completions: prompt (string or token list), max_tokens, temperature, top_p, seed, stop."""
        body = await self._body(request)
        if isinstance(body.get("prompt"), list):  # token ids
            body["input_ids"] = body.pop("prompt")
        keys = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed"}
        params = {ours: body[theirs] for theirs, ours in keys.items() if theirs in body}
        params.setdefault("max_new_tokens", 16)  # OpenAI's default max_tokens
        params["stop"] = body.get("stop")
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
    p.add_argument("--mode", default="target_only", choices=("target_only", "traversal"), help="verifier at T > 0")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (loopback by default)")
    p.add_argument("--port", type=int, default=30000, help="TCP port")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = EngineConfig(args.model, args.method, args.budget, args.drafter, args.adapter, args.mode)
    config.check()  # refuse a bad configuration before the (slow) model load
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    server = Server(Engine(config))
    web.run_app(server.app, host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
