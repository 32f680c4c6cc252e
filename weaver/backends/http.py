"""The HTTP backend: SGLang's native `/generate` protocol, spoken to SGLang or to `python -m weaver.serve`.

`ServerClient` posts one request per prompt and turns the response's `meta_info` into the bench's per-prompt stats.
`ServerProcess` launches a server command on loopback, waits for `/health`, and always shuts it down.
Counting (weaver.generate): the prefill is one step and SGLang's `spec_verify_ct` leaves it out, so
steps = spec_verify_ct + 1 for a speculative method and steps = completion_tokens for AR.
A speculative method without `spec_verify_ct`, a dead server and a timeout are errors, never tau = 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class ServerError(RuntimeError):
    """The server died, timed out, refused a request or answered without the fields a record needs."""


def post_json(url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST `payload` as JSON; a non-2xx answer raises ServerError with the server's reason."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise ServerError(f"{url} answered {e.code}: {e.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise ServerError(f"{url} failed: {e} (server down or request over {timeout:.0f} s)") from None


def stats_from_response(
    response: dict[str, Any], *, speculative: bool, prompt_tokens: int, wall_s: float
) -> dict[str, Any]:
    """Per-prompt stats (the keys of GenerationStats.to_dict()) from a `/generate` response."""
    meta = response.get("meta_info")
    if not isinstance(meta, dict) or "completion_tokens" not in meta:
        raise ServerError(f"response has no meta_info.completion_tokens: {str(response)[:300]}")
    new_tokens = int(meta["completion_tokens"])
    if speculative:
        if meta.get("spec_verify_ct") is None:
            raise ServerError(
                "speculative method but meta_info has no spec_verify_ct: speculation is off on the server "
                "(check --speculative-algorithm) or the server is too old to report it"
            )
        steps = int(meta["spec_verify_ct"]) + 1
    else:
        steps = new_tokens
    # weaver_accept_lengths: our server's per-step list (in order); SGLang only gives the histogram
    accept = meta.get("weaver_accept_lengths") or _lengths_from_histogram(meta.get("spec_correct_drafts_histogram"))
    wall = float(meta.get("e2e_latency", wall_s))
    finish = meta.get("finish_reason") or {}
    return {
        "prompt_tokens": int(meta.get("prompt_tokens", prompt_tokens)),
        "new_tokens": new_tokens,
        "steps": steps,
        "accept_lengths": [int(a) for a in accept],
        "tree_sizes": [],
        "draft_s": [],
        "tree_s": [],
        "verify_s": [],
        "ttft_s": meta.get("weaver_ttft_s"),  # SGLang's non-streaming answer has no TTFT: None
        "wall_s": wall,
        "tau": new_tokens / max(steps, 1),
        "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
        "hit_eos": isinstance(finish, dict) and finish.get("type") == "stop",
    }


def _lengths_from_histogram(histogram: Sequence[int] | None) -> list[int]:
    """Accept lengths (drafts + bonus) from counts indexed by accepted drafts; the order of steps is lost."""
    return [k + 1 for k, count in enumerate(histogram or ()) for _ in range(int(count))]


class ServerClient:
    """Bench backend over HTTP: one `/generate` request per prompt to `base_url`."""

    name = "server"

    def __init__(
        self,
        base_url: str,
        *,
        method: str,
        temperature: float,
        max_new_tokens: int,
        seed: int,
        timeout: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.speculative = method != "ar"
        self.sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "sampling_seed": seed}
        self.timeout = timeout

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, prompt_ids: list[int]) -> dict[str, Any]:
        start = time.perf_counter()
        payload = {"input_ids": list(prompt_ids), "sampling_params": self.sampling}
        response = post_json(f"{self.base_url}/generate", payload, self.timeout)
        wall = time.perf_counter() - start
        return stats_from_response(response, speculative=self.speculative, prompt_tokens=len(prompt_ids), wall_s=wall)


class ServerProcess:
    """A server command run on loopback for the duration of a `with` block; killed on exit, also on failure."""

    def __init__(self, command: Sequence[str], base_url: str, *, startup_timeout: float = 900.0, log=None) -> None:
        self.command, self.base_url = list(command), base_url.rstrip("/")
        self.startup_timeout, self.log = startup_timeout, log
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.process = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT if self.log else None, start_new_session=True
        )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(f"server exited with code {self.process.returncode}: {' '.join(self.command[:6])} ...")

    def wait_healthy(self) -> None:
        """Poll `/health` until 200; the process dying or the timeout passing raises ServerError."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise ServerError(f"server at {self.base_url} not healthy after {self.startup_timeout:.0f} s")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the server's process group (SGLang spawns workers), then SIGKILL after `grace_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait()
