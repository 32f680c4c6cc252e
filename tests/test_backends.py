"""Bench backends: the HTTP client and record parsing against our server, the server launcher, SGLang commands."""

from __future__ import annotations

import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_bench import make_cell
from tiny_models import tiny_hf_model

from weaver.backends.engine import Engine, EngineBackend, EngineConfig
from weaver.backends.http import ServerClient, ServerError, ServerProcess, stats_from_response
from weaver.backends.sglang import SglangLaunch, sglang_command
from weaver.bench import _LaunchedServer, read_records, run_prompts
from weaver.models import from_hf_model
from weaver.serve import Server, ServerThread

PROMPTS = [(f"p{i}", [5 + i, 17, 3, 42, 8, 9, 5 + i, 17, 3]) for i in range(3)]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 10, "seed": 0}


@pytest.fixture(scope="module")
def tiny_model():
    return from_hf_model(tiny_hf_model("llama"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("method, budget", [("ar", 0), ("oracle", 4), ("prompt_lookup", 3)])
def test_server_records_equal_engine_records(tmp_path: Path, tiny_model, method: str, budget: int) -> None:
    """The same cell through the engine backend and through HTTP gives the same tokens, steps and accept lengths."""
    engine = Engine(EngineConfig("tiny", method, budget), tiny_model)
    cell = make_cell(tmp_path / "engine", method=method, budget=budget, drafter=None, max_new_tokens=10)
    with EngineBackend(engine, **SAMPLING) as backend:
        run_prompts(cell, PROMPTS, backend.run)
    with ServerThread(Server(engine)) as thread, ServerClient(thread.url, method=method, **SAMPLING) as client:
        run_prompts(replace(cell, out=str(tmp_path / "server"), backend="server"), PROMPTS, client.run)
    ours, theirs = read_records(tmp_path / "engine/records.jsonl"), read_records(tmp_path / "server/records.jsonl")
    for a, b in zip(ours, theirs, strict=True):
        assert (a["new_tokens"], a["steps"], a["accept_lengths"]) == (b["new_tokens"], b["steps"], b["accept_lengths"])
        assert b["tau"] == pytest.approx(a["tau"]) and b["wall_s"] > 0
    if method == "oracle":
        assert min(r["tau"] for r in theirs) > 2


def test_speculative_method_against_an_ar_server_fails_loudly(tiny_model) -> None:
    """An AR server answers without spec_verify_ct: a speculative cell must not report tau = 1."""
    with ServerThread(Server(Engine(EngineConfig("tiny"), tiny_model))) as thread:
        client = ServerClient(thread.url, method="chain", **SAMPLING)
        with pytest.raises(ServerError, match="spec_verify_ct"):
            client.run(PROMPTS[0][1])


def test_refused_request_and_bad_response_are_errors(tiny_model) -> None:
    with ServerThread(Server(Engine(EngineConfig("tiny"), tiny_model))) as thread:
        with pytest.raises(ServerError, match="400.*vocabulary"):
            ServerClient(thread.url, method="ar", **SAMPLING).run([1, 10_000])
    with pytest.raises(ServerError, match="completion_tokens"):
        stats_from_response({"text": "x"}, speculative=False, prompt_tokens=1, wall_s=1.0)


def test_sglang_meta_info_parsing() -> None:
    """SGLang's answer (no per-step list): steps = spec_verify_ct + 1, accept lengths from the histogram."""
    meta = {"completion_tokens": 20, "prompt_tokens": 7, "spec_verify_ct": 5, "e2e_latency": 0.5}
    meta |= {"spec_correct_drafts_histogram": [1, 0, 2, 2], "finish_reason": {"type": "stop", "matched": 2}}
    stats = stats_from_response({"meta_info": meta}, speculative=True, prompt_tokens=7, wall_s=0.6)
    assert stats["steps"] == 6 and stats["tau"] == pytest.approx(20 / 6)
    assert sorted(stats["accept_lengths"]) == [1, 3, 3, 4, 4]
    assert stats["wall_s"] == 0.5 and stats["tokens_per_s"] == 40 and stats["hit_eos"] and stats["ttft_s"] is None


def test_unreachable_server_is_an_error() -> None:
    with pytest.raises(ServerError, match="failed"):
        ServerClient(f"http://127.0.0.1:{free_port()}", method="ar", timeout=5, **SAMPLING).run([1, 2])


def test_server_process_dies_at_startup() -> None:
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(ServerError, match="exited with code 3"):
        with ServerProcess(command, f"http://127.0.0.1:{free_port()}", startup_timeout=30):
            pass


def test_server_process_startup_timeout_kills_it() -> None:
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    process = ServerProcess(command, f"http://127.0.0.1:{free_port()}", startup_timeout=1)
    with pytest.raises(ServerError, match="not healthy"):
        process.__enter__()
    assert process.process.poll() is not None  # stopped, not left running


def test_launched_serve_runs_a_cell_and_stops(tmp_path: Path) -> None:
    """`python -m weaver.serve` launched like SGLang: health, records, clean shutdown; then death mid-run is loud."""
    port = free_port()
    command = [sys.executable, "-m", "weaver.serve", "--model", "smollm2-135m", "--port", str(port), "--threads", "1"]
    url = f"http://127.0.0.1:{port}"
    backend = _LaunchedServer(
        ServerProcess(command, url, startup_timeout=120), ServerClient(url, method="ar", **SAMPLING)
    )
    cell = make_cell(tmp_path / "cell", method="ar", budget=0, drafter=None, max_new_tokens=10, backend="server")
    with backend:
        run_prompts(cell, PROMPTS[:1], backend.run)
        backend.process.stop()
        with pytest.raises(ServerError, match="exited"):
            backend.run(PROMPTS[1][1])
    (record,) = read_records(tmp_path / "cell/records.jsonl")
    assert 1 <= record["new_tokens"] == record["steps"] and record["tau"] == 1.0  # AR: one token per step


def test_sglang_commands_per_method() -> None:
    base = dict(model="Qwen/Qwen3.6-27B", port=30001, drafter="z-lab/Qwen3.6-27B-DFlash")
    ar = sglang_command(SglangLaunch(method="ar", **base))
    assert ar[1:3] == ["-m", "sglang.launch_server"] and "--speculative-algorithm" not in ar
    assert ar[ar.index("--host") + 1] == "127.0.0.1" and ar[ar.index("--port") + 1] == "30001"
    chain = sglang_command(SglangLaunch(method="chain", **base))
    assert chain[chain.index("--speculative-algorithm") + 1] == "DFLASH"
    assert chain[chain.index("--speculative-dflash-block-size") + 1] == "16"
    weaver = sglang_command(
        SglangLaunch(method="weaver", budget=64, adapter="a.pt", mode="traversal", candidate_pool_size=256, **base)
    )
    flag = {k: v for k, v in zip(weaver, weaver[1:], strict=False) if k.startswith("--")}
    assert flag["--speculative-algorithm"] == "DFLASH_TFM" and flag["--speculative-dflash-tfm-path"] == "a.pt"
    assert flag["--speculative-dflash-tfm-tree-budget"] == "64"
    assert flag["--speculative-dflash-tfm-tree-sampling-mode"] == "traversal"
    assert flag["--speculative-dflash-tfm-candidate-pool-size"] == "256"
    assert flag["--speculative-draft-model-path"] == base["drafter"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(method="ddtree", budget=8), "no SGLang configuration"),
        (dict(method="chain", drafter=None), "drafter"),
        (dict(method="weaver", budget=64), "adapter"),
        (dict(method="weaver", adapter="a.pt"), "budget"),
    ],
)
def test_sglang_commands_refuse_what_cannot_run(changes: dict, message: str) -> None:
    launch = SglangLaunch(model="m", method="ar", port=1, drafter="d")
    with pytest.raises(ValueError, match=message):
        sglang_command(replace(launch, **changes))


def test_our_adapter_checkpoint_has_what_the_fork_reads(tmp_path: Path) -> None:
    """The file `--speculative-dflash-tfm-path` receives: the fork's DFLASH_TFM worker does `Weaver.load(path)` =
    torch.load -> `Weaver(**config)` + strict state_dict, then reads these attributes and config values."""
    import torch

    from weaver.adapter import Weaver, WeaverConfig

    config = WeaverConfig(
        d_model=32, d_embed=32, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, K=4, candidate_pool_size=8
    )
    path = tmp_path / "adapter.pt"
    Weaver(config).save(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    assert set(checkpoint) == {"config", "state_dict"}
    for key in ("d_rank", "num_layers", "num_heads", "K", "candidate_pool_size"):
        assert checkpoint["config"][key] == getattr(config, key)
    state = checkpoint["state_dict"]
    for name in ("embed_norm.weight", "embed_norm.bias", "token_in.weight", "token_in.bias"):
        assert name in state
    assert state["lm_head_query_in.weight"].shape == (32, 16)  # W_lm @ W_lmq: [V, d_model] @ [d_model, d_rank]
    launch = SglangLaunch(model="m", method="weaver", port=1, budget=8, drafter="d", adapter=str(path))
    command = sglang_command(launch)
    assert command[command.index("--speculative-dflash-tfm-path") + 1] == str(path)
