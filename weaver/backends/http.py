"""The HTTP backend: SGLang's native `/generate` protocol, spoken to SGLang or to `python -m weaver.serve`.

`ServerClient` first asks the server who it is (`/get_server_info`, SGLang's route, which `python -m weaver.serve`
answers too) and refuses a server that runs another model, method, budget or proposal than the cell (a forgotten
server on the port would otherwise be benchmarked silently); then it posts one request per prompt, with SGLang's
neutral sampling parameters pinned, and turns the response's `meta_info` into the bench's per-prompt stats.
`ServerProcess` launches a server command on loopback (refusing a port that already answers), waits for `/health`,
and always shuts its whole process group down.
Counting (weaver.generate): the prefill is one step and SGLang's `spec_verify_ct` leaves it out, so
steps = spec_verify_ct + 1 for a speculative method and steps = completion_tokens for AR.
A speculative method without `spec_verify_ct`, a dead server and a timeout are errors, never tau = 1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# SGLang's --speculative-algorithm per method (None: plain decoding); the fork's DFLASH_TFM runs weaver and ddtree
SGLANG_ALGORITHMS = {"ar": None, "chain": "DFLASH", "weaver": "DFLASH_TFM", "ddtree": "DFLASH_TFM"}
# sampling parameters SGLang applies unless told otherwise, pinned to their neutral values (the authors' harness too)
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


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


def get_json(url: str, timeout: float) -> dict[str, Any]:
    """GET a JSON object; a non-2xx answer or a failed connection raises ServerError."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise ServerError(f"{url} answered {e.code}: {e.read().decode(errors='replace')[:300]}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
        raise ServerError(f"{url} failed: {e}") from None
    if not isinstance(body, dict):
        raise ServerError(f"{url} answered {str(body)[:200]}, not a JSON object")
    return body


@dataclass(frozen=True)
class ServerExpectation:
    """What the server must be running for a bench cell's records to mean what they say."""

    model: str
    method: str
    budget: int
    mode: str = "target_only"
    children: int | None = None  # Weaver fan-out (weaver methods); SGLang's fork uses PAPER_CHILDREN


def identity_problems(info: dict[str, Any], want: ServerExpectation) -> list[str]:
    """How the server described by `info` (`/get_server_info`) differs from `want`; empty if it matches.

    Our server (`weaver_method` in info) is compared field by field; an SGLang server by its server arguments:
    the speculative algorithm of the method, and for DFLASH_TFM the tree budget, proposal and sampling mode.
    """
    from weaver.bench import ADAPTER_METHODS, PAPER_CHILDREN

    problems = []
    model = info.get("model_path")
    if not isinstance(model, str) or Path(model.rstrip("/")).name != Path(want.model.rstrip("/")).name:
        problems.append(f"it serves model {model!r}, the cell's --model is {want.model!r}")
    speculative = want.method != "ar"
    if "weaver_method" in info:  # python -m weaver.serve
        expected = {"weaver_method": want.method, "weaver_budget": want.budget}
        if speculative:
            expected["weaver_mode"] = want.mode
        if want.method in ADAPTER_METHODS and want.children is not None:
            expected["weaver_children"] = want.children
        return problems + _differences(info, expected)
    if want.method not in SGLANG_ALGORITHMS:
        return [*problems, f"method {want.method!r} has no SGLang configuration"]
    algorithm = info.get("speculative_algorithm")
    if algorithm != SGLANG_ALGORITHMS[want.method]:
        problems.append(
            f"its speculative_algorithm is {algorithm!r}, method {want.method!r} needs "
            f"{SGLANG_ALGORITHMS[want.method]!r}"
        )
    if SGLANG_ALGORITHMS[want.method] == "DFLASH_TFM":
        proposal = info.get("speculative_dflash_tfm_proposal") or "weaver"  # the fork's default; absent at aeac03f
        expected = {
            "speculative_dflash_tfm_tree_budget": want.budget,
            "speculative_dflash_tfm_tree_sampling_mode": want.mode,
        }
        problems += _differences(info, expected)
        if proposal != want.method:
            problems.append(
                f"its speculative_dflash_tfm_proposal is {proposal!r}, the cell's method is {want.method!r}"
            )
        if want.method in ADAPTER_METHODS and want.children not in (None, PAPER_CHILDREN):
            problems.append(
                f"the fork's Weaver expands {PAPER_CHILDREN} children per node, the cell asks {want.children}"
            )
    return problems


def _differences(info: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    return [f"its {k} is {info.get(k)!r}, the cell's is {v!r}" for k, v in expected.items() if info.get(k) != v]


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
        "tree_sizes": None,  # not reported over HTTP: unknown, not "no trees" (weaver.analyze --budget-free)
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
    """Bench backend over HTTP: one `/generate` request per prompt to `base_url`.

    With `expect`, entering checks the server's identity (identity_problems) and keeps its `/get_server_info` answer
    in `info` (meta.json's backend_info); a mismatch, or a server that cannot say who it is, is a ServerError.
    """

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
        expect: ServerExpectation | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.speculative = method != "ar"
        self.sampling = {
            **NEUTRAL_SAMPLING,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "sampling_seed": seed,
        }
        self.timeout, self.expect = timeout, expect
        self.info: dict[str, Any] | None = None

    def __enter__(self) -> ServerClient:
        if self.expect is not None:
            self.identify()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def identify(self) -> dict[str, Any]:
        """Ask `/get_server_info` and refuse a server that is not running `expect`."""
        url = f"{self.base_url}/get_server_info"
        try:
            info = get_json(url, timeout=60)
        except ServerError as e:
            raise ServerError(f"cannot identify the server ({e}): it must answer SGLang's /get_server_info") from None
        info.pop("internal_states", None)  # per-request scheduler state, not configuration
        problems = identity_problems(info, self.expect) if self.expect is not None else []
        if problems:
            raise ServerError(
                f"the server at {self.base_url} is not the cell's configuration: {'; '.join(problems)}. Start the "
                "server with the cell's settings, or point --server-url / --port at the right one"
            )
        self.info = info
        return info

    def run(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> dict[str, Any]:
        """One prompt; `max_new_tokens` overrides the cell's (the bench's warm-up)."""
        sampling = dict(self.sampling)
        if max_new_tokens is not None:
            sampling["max_new_tokens"] = max_new_tokens
        start = time.perf_counter()
        payload = {"input_ids": list(prompt_ids), "sampling_params": sampling}
        response = post_json(f"{self.base_url}/generate", payload, self.timeout)
        wall = time.perf_counter() - start
        return stats_from_response(response, speculative=self.speculative, prompt_tokens=len(prompt_ids), wall_s=wall)


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on `host` (another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server command run on loopback for the duration of a `with` block; killed on exit, also on failure."""

    def __init__(self, command: Sequence[str], base_url: str, *, startup_timeout: float = 900.0, log=None) -> None:
        self.command, self.base_url = list(command), base_url.rstrip("/")
        self.startup_timeout, self.log = startup_timeout, log
        self.process: subprocess.Popen | None = None
        self.pgid: int | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the command in its own process group; a port that already answers is refused first."""
        address = urllib.parse.urlsplit(self.base_url)
        if address.hostname and address.port and port_in_use(address.hostname, address.port):
            raise ServerError(
                f"{address.hostname}:{address.port} is already in use (another server?): stop it or choose another "
                "port (bench: omit --port to take a free one)"
            )
        self.process = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT if self.log else None, start_new_session=True
        )
        self.pgid = self.process.pid  # start_new_session: the server leads its own process group

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
        """SIGTERM the server's whole process group (SGLang spawns workers, which may outlive the leader), then
        SIGKILL whatever is left after `grace_s`; safe to call twice."""
        if self.process is None or self.pgid is None:
            return
        if not _signal_group(self.pgid, signal.SIGTERM):
            self.process.wait()
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _signal_group(self.pgid, 0):
            self.process.poll()  # reap the leader so that it does not count as alive
            time.sleep(0.05)
        _signal_group(self.pgid, signal.SIGKILL)
        self.process.wait()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group (0: only test); False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
