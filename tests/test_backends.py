"""Bench backends: the HTTP client and record parsing against our server, the server launcher, SGLang commands."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_bench import make_cell
from tiny_models import tiny_hf_model

from weaver.backends.engine import Engine, EngineBackend, EngineConfig
from weaver.backends.http import (
    ServerClient,
    ServerError,
    ServerExpectation,
    ServerProcess,
    free_port,
    identity_problems,
    stats_from_response,
)
from weaver.backends.sglang import (
    DDTREE_FLAG,
    FORK_DDTREE_COMMIT,
    SglangBuildError,
    SglangLaunch,
    check_sglang_build,
    sglang_command,
)
from weaver.bench import _LaunchedServer, read_records, run_prompts
from weaver.models import from_hf_model
from weaver.serve import Server, ServerThread

PROMPTS = [(f"p{i}", [5 + i, 17, 3, 42, 8, 9, 5 + i, 17, 3]) for i in range(3)]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 10, "seed": 0}


@pytest.fixture(scope="module")
def tiny_model():
    return from_hf_model(tiny_hf_model("llama"))


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
        # the engine backend logs each step's expectation (temperature 0: the accept lengths); HTTP cannot
        assert a["expected_accept_lengths"] == a["accept_lengths"] and a["tau_expected"] == pytest.approx(a["tau"])
        assert b["expected_accept_lengths"] is None and b["tau_expected"] is None
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


def test_client_checks_the_server_is_the_cells_configuration(tiny_model) -> None:
    """A server left running with another budget (or method) is refused before a single prompt is sent."""
    with ServerThread(Server(Engine(EngineConfig("tiny", "oracle", 4), tiny_model))) as thread:
        with ServerClient(thread.url, method="oracle", expect=ServerExpectation("tiny", "oracle", 4), **SAMPLING) as c:
            assert c.info["weaver_method"] == "oracle" and c.info["weaver_budget"] == 4
        for wrong, field in [
            (ServerExpectation("tiny", "oracle", 8), "weaver_budget"),
            (ServerExpectation("tiny", "ar", 0), "weaver_method"),
            (ServerExpectation("other-model", "oracle", 4), "serves model 'tiny'"),
        ]:
            with pytest.raises(ServerError, match=field):
                ServerClient(thread.url, method=wrong.method, expect=wrong, **SAMPLING).__enter__()


SGLANG_INFO = {"model_path": "Qwen/Qwen3.6-27B", "speculative_algorithm": "DFLASH_TFM", "version": "0.5.23"}
SGLANG_INFO |= {"speculative_dflash_tfm_tree_budget": 64, "speculative_dflash_tfm_tree_sampling_mode": "target_only"}


@pytest.mark.parametrize(
    "info, want, problem",
    [
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "weaver", 64), None),
        (SGLANG_INFO, ServerExpectation("/models/Qwen3.6-27B/", "weaver", 64), None),  # same model, local folder
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "weaver", 32), "tree_budget is 64"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "ddtree", 64), "proposal is 'weaver'"),
        (
            SGLANG_INFO | {"speculative_dflash_tfm_proposal": "ddtree"},
            ServerExpectation("Qwen/Qwen3.6-27B", "ddtree", 64),
            None,
        ),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "chain", 16), "needs 'DFLASH'"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "ar", 0), "needs None"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "weaver", 64, "traversal"), "sampling_mode"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "weaver", 64, children=16), "8 children"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-8B", "weaver", 64), "serves model"),
        (SGLANG_INFO, ServerExpectation("Qwen/Qwen3.6-27B", "prompt_lookup", 16), "no SGLang configuration"),
    ],
    ids=[
        "match",
        "same-model-folder",
        "budget",
        "proposal",
        "ddtree",
        "chain",
        "ar",
        "mode",
        "children",
        "model",
        "lookup",
    ],
)
def test_sglang_server_identity(info: dict, want: ServerExpectation, problem: str | None) -> None:
    problems = identity_problems(info, want)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_server_process_refuses_a_busy_port() -> None:
    """A server already on the port would answer /health for us: refused before anything is launched."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = ServerProcess([sys.executable, "-c", "pass"], f"http://127.0.0.1:{port}", startup_timeout=5)
        with pytest.raises(ServerError, match="already in use"):
            process.__enter__()
        assert process.process is None  # nothing was launched


def test_server_process_stop_kills_workers_that_outlive_the_leader(tmp_path: Path) -> None:
    """SGLang's launcher can exit before its workers: stop() still ends the whole process group."""
    script = (
        "import subprocess, sys; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(w.pid, flush=True)"
    )
    with open(tmp_path / "log", "w") as log:
        process = ServerProcess([sys.executable, "-c", script], "http://127.0.0.1:1", log=log)
        process.start()
        process.process.wait(timeout=30)  # the leader is gone, its worker is not
        worker = int((tmp_path / "log").read_text().split()[0])
        assert _alive(worker)
        process.stop(grace_s=5)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"  # a zombie waits only for its parent (init) to reap it


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
    client = ServerClient(url, method="ar", expect=ServerExpectation("smollm2-135m", "ar", 0), **SAMPLING)
    backend = _LaunchedServer(ServerProcess(command, url, startup_timeout=120), client)
    cell = make_cell(tmp_path / "cell", method="ar", budget=0, drafter=None, max_new_tokens=10, backend="server")
    with backend:
        assert backend.info["server_info"]["weaver_method"] == "ar" and backend.info["command"] == command
        run_prompts(cell, PROMPTS[:1], backend.run, backend_info=backend.info)
        backend.process.stop()
        with pytest.raises(ServerError, match="exited"):
            backend.run(PROMPTS[1][1])
    (record,) = read_records(tmp_path / "cell/records.jsonl")
    assert 1 <= record["new_tokens"] == record["steps"] and record["tau"] == 1.0  # AR: one token per step


def flags(command: list[str]) -> dict[str, str | None]:
    """--flag -> its value (None for a switch) of a launch_server command."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(command):
        if word.startswith("--"):
            value = command[i + 1] if i + 1 < len(command) else None
            out[word] = None if value is None or value.startswith("--") else value
    return out


# The fork's reproduction.sh (trymirai/sglang, serve-ar / serve-dflash / serve-tfm; the flags of serve-tfm are those of
# python/sglang/srt/server_args.py at FORK_COMMIT aeac03f0d4c8789559411be95c5c127bdff24d1c), minus --revision and
# --speculative-draft-model-revision (given only when SglangLaunch names revisions) and host / port / model / drafter.
COMMON = {
    "--dtype": "bfloat16",
    "--tp-size": "1",
    "--max-running-requests": "1",
    "--cuda-graph-max-bs": "32",
    "--mem-fraction-static": "0.75",
    "--page-size": "64",
    "--disable-radix-cache": None,
}
SERVE_AR = COMMON | {"--decode-attention-backend": "trtllm_mha", "--prefill-attention-backend": "flashinfer"}
SERVE_DFLASH = COMMON | {
    "--attention-backend": "trtllm_mha",
    "--speculative-draft-attention-backend": "fa4",
    "--speculative-algorithm": "DFLASH",
    "--speculative-dflash-block-size": "16",
    "--speculative-num-draft-tokens": "16",
}
SERVE_TFM = SERVE_AR | {
    "--speculative-draft-attention-backend": "fa4",
    "--speculative-algorithm": "DFLASH_TFM",
    "--speculative-dflash-tfm-tree-budget": "64",
    "--speculative-gdn-verify-kernel": "chunk",
    "--disable-overlap-schedule": None,
}
# serve-ddtree (reproduction.sh at 02700cab56df67cccba8ca0657d4d60430bb9b03): serve-tfm with the DDTree proposal in
# place of --speculative-dflash-tfm-path
SERVE_DDTREE = SERVE_TFM | {"--speculative-dflash-tfm-proposal": "ddtree"}
PLACES = {"--model-path", "--host", "--port", "--speculative-draft-model-path", "--speculative-dflash-tfm-path"}


def test_sglang_commands_per_method() -> None:
    base = dict(model="Qwen/Qwen3.6-27B", port=30001, drafter="z-lab/Qwen3.6-27B-DFlash")
    ar = sglang_command(SglangLaunch(method="ar", **base))
    assert ar[1:3] == ["-m", "sglang.launch_server"]
    assert {k: v for k, v in flags(ar).items() if k not in PLACES} == SERVE_AR
    assert flags(ar)["--host"] == "127.0.0.1" and flags(ar)["--port"] == "30001"
    chain = flags(sglang_command(SglangLaunch(method="chain", **base)))
    assert {k: v for k, v in chain.items() if k not in PLACES} == SERVE_DFLASH
    assert chain["--speculative-draft-model-path"] == base["drafter"]
    # serve-tfm leaves the sampling mode at its default (target_only); we always name it
    weaver = flags(sglang_command(SglangLaunch(method="weaver", budget=64, adapter="a.pth", **base)))
    mode = {"--speculative-dflash-tfm-tree-sampling-mode": "target_only"}
    assert {k: v for k, v in weaver.items() if k not in PLACES} == SERVE_TFM | mode
    assert weaver["--speculative-dflash-tfm-path"] == "a.pth"
    assert weaver["--speculative-draft-model-path"] == base["drafter"]
    tuned = SglangLaunch(method="weaver", budget=32, adapter="a.pt", mode="traversal", candidate_pool_size=256, **base)
    tuned_flags = flags(sglang_command(tuned))
    assert tuned_flags["--speculative-dflash-tfm-tree-budget"] == "32"
    assert tuned_flags["--speculative-dflash-tfm-tree-sampling-mode"] == "traversal"
    assert tuned_flags["--speculative-dflash-tfm-candidate-pool-size"] == "256"


def test_sglang_ddtree_command_is_serve_ddtree() -> None:
    """ddtree: DFLASH_TFM with `--speculative-dflash-tfm-proposal ddtree`, the budget, the weaver method's serving
    flags, and no Weaver checkpoint (an adapter given to the cell is not passed)."""
    base = dict(model="Qwen/Qwen3.6-27B", port=30001, drafter="z-lab/Qwen3.6-27B-DFlash", drafter_revision="09196886")
    command = sglang_command(SglangLaunch(method="ddtree", budget=64, adapter="a.pth", **base))
    assert command[1:] == [
        *("-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.6-27B", "--dtype", "bfloat16", "--tp-size", "1"),
        *("--max-running-requests", "1", "--cuda-graph-max-bs", "32", "--mem-fraction-static", "0.75"),
        *("--page-size", "64", "--disable-radix-cache", "--host", "127.0.0.1", "--port", "30001"),
        *("--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"),
        *("--speculative-draft-attention-backend", "fa4", "--speculative-draft-model-path", "z-lab/Qwen3.6-27B-DFlash"),
        *("--speculative-draft-model-revision", "09196886", "--speculative-algorithm", "DFLASH_TFM"),
        *("--speculative-dflash-tfm-proposal", "ddtree", "--speculative-dflash-tfm-tree-budget", "64"),
        *("--speculative-dflash-tfm-tree-sampling-mode", "target_only"),
        *("--speculative-gdn-verify-kernel", "chunk", "--disable-overlap-schedule"),
    ]
    got = {k: v for k, v in flags(command).items() if k not in PLACES | {"--speculative-draft-model-revision"}}
    assert got == SERVE_DDTREE | {"--speculative-dflash-tfm-tree-sampling-mode": "target_only"}
    weaver = flags(sglang_command(SglangLaunch(method="weaver", budget=64, adapter="a.pth", **base)))
    assert set(weaver) - set(flags(command)) == {"--speculative-dflash-tfm-path"}
    for budget in (16, 32, 128):  # the paper's DDTree budgets, all within the fork's cap
        assert flags(sglang_command(SglangLaunch(method="ddtree", budget=budget, **base)))[
            "--speculative-dflash-tfm-tree-budget"
        ] == str(budget)


def test_sglang_commands_pin_revisions_like_reproduction_sh() -> None:
    launch = SglangLaunch(
        model="Qwen/Qwen3.6-27B", method="weaver", port=1, budget=64, drafter="z-lab/Qwen3.6-27B-DFlash",
        adapter="a.pth", revision="6a9e13bd", drafter_revision="09196886",
    )  # fmt: skip
    got = flags(sglang_command(launch))
    assert got["--revision"] == "6a9e13bd" and got["--speculative-draft-model-revision"] == "09196886"
    assert "--revision" not in flags(sglang_command(replace(launch, revision=None)))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(method="ddtree", budget=129), r"takes --budget 16\.\.128, got 129: .*cap the budget at 128"),
        (dict(method="ddtree", budget=15), r"takes --budget 16\.\.128, got 15: .*exceed the DFlash block size"),
        (dict(method="ddtree", budget=64, mode="traversal"), "target_only only"),
        (dict(method="ddtree", budget=64, candidate_pool_size=64), "top-k equal to the budget"),
        (dict(method="ddtree", budget=64, drafter=None), "drafter"),
        (dict(method="weaver_chain", budget=8), "no SGLang configuration"),
        (dict(method="prompt_lookup", budget=8), "no SGLang configuration"),
        (dict(method="chain", drafter=None), "drafter"),
        (dict(method="weaver", budget=64), "adapter"),
        (dict(method="weaver", adapter="a.pt"), "budget"),
        (dict(method="weaver", adapter="a.pt", budget=64, mode="greedy"), "target_only or traversal"),
    ],
)
def test_sglang_commands_refuse_what_cannot_run(changes: dict, message: str) -> None:
    launch = SglangLaunch(model="m", method="ar", port=1, drafter="d")
    with pytest.raises(ValueError, match=message):
        sglang_command(replace(launch, **changes))


ARGPARSE_HELP = """usage: launch_server.py [-h] --model-path MODEL_PATH
  --speculative-dflash-block-size SPECULATIVE_DFLASH_BLOCK_SIZE
                        DFLASH only. Block size (verify window length).
  --speculative-dflash-tfm-proposal {weaver,ddtree}
                        Proposal builder using the shared DFlash tree verification runtime.
  --speculative-dflash-tfm-path SPECULATIVE_DFLASH_TFM_PATH
"""


def test_ddtree_launch_needs_an_sglang_with_the_proposal_flag() -> None:
    """Before a ddtree launch the installed SGLang's `launch_server --help` must list the DDTree proposal; without it
    (upstream SGLang, the fork at FORK_COMMIT, a choice list without ddtree, or no SGLang at all) the error names the
    flag and the fork commit to install. Other methods never ask."""
    launch = SglangLaunch(model="m", method="ddtree", port=1, budget=64, drafter="d", python="/envs/fork/bin/python")
    asked = []

    def helps(text: str):
        def help_text(python: str) -> str:
            asked.append(python)
            return text

        return help_text

    check_sglang_build(launch, helps(ARGPARSE_HELP))
    assert asked == ["/envs/fork/bin/python"]
    check_sglang_build(launch, helps("  --speculative-dflash-tfm-proposal SPECULATIVE_DFLASH_TFM_PROPOSAL\n"))
    without = ARGPARSE_HELP.replace("  --speculative-dflash-tfm-proposal {weaver,ddtree}\n", "")
    for text in (without, ARGPARSE_HELP.replace("{weaver,ddtree}", "{weaver}")):
        with pytest.raises(SglangBuildError, match=f"does not accept {DDTREE_FLAG} ddtree.*{FORK_DDTREE_COMMIT}"):
            check_sglang_build(launch, helps(text))
    prefixed = without.replace("--speculative-dflash-tfm-path", "--speculative-dflash-tfm-proposal-x")
    with pytest.raises(SglangBuildError, match="does not accept"):
        check_sglang_build(launch, helps(prefixed))

    def broken(python: str) -> str:
        raise SglangBuildError("No module named sglang")

    with pytest.raises(SglangBuildError, match=f"{DDTREE_FLAG} ddtree.*No module named sglang.*{FORK_DDTREE_COMMIT}"):
        check_sglang_build(launch, broken)
    asked.clear()
    for method in ("ar", "chain", "weaver"):
        check_sglang_build(replace(launch, method=method), helps(""))
    assert asked == []


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_ddtree_check_runs_launch_server_help() -> None:
    """The real check: this interpreter has no SGLang, so `python -m sglang.launch_server --help` fails, loudly."""
    launch = SglangLaunch(model="m", method="ddtree", port=1, budget=64, drafter="d", python=sys.executable)
    with pytest.raises(SglangBuildError, match=f"sglang.launch_server --help.*exited with 1.*{FORK_DDTREE_COMMIT}"):
        check_sglang_build(launch)


# What the fork's loader reads (trymirai/sglang python/sglang/srt/speculative/dflash_tfm.py at FORK_COMMIT
# aeac03f0d4c8789559411be95c5c127bdff24d1c): `Weaver.load` = torch.load(path, map_location=device), requires a dict
# with 'config' and 'state_dict', builds `Weaver(**config)` (these keyword arguments, no others), casts it with
# .to(device, dtype) and load_state_dict(strict=True) (exactly these parameter names).
FORK_CONFIG_KEYS = [
    "d_model",
    "d_embed",
    "d_rank",
    "num_layers",
    "num_heads",
    "mlp_dim",
    "K",
    "candidate_pool_size",
    "encoder_mode",
    "score_head",
    "activation",
    "rope_base",
]
FORK_TOP_LEVEL_PARAMETERS = [
    "output_norm.weight",
    "output_norm.bias",
    "embed_norm.weight",
    "embed_norm.bias",
    "token_in.weight",
    "token_in.bias",
    "proposal_in.weight",
    "proposal_in.bias",
    "out_norm.weight",
    "out_norm.bias",
    "lm_head_query_in.weight",
]
FORK_BLOCK_PARAMETERS = [  # blocks.{i}. + name (WeaverBlock)
    "norm_attn.weight",
    "norm_attn.bias",
    "qkv_proj.weight",
    "o_proj.weight",
    "norm_mlp.weight",
    "norm_mlp.bias",
    "gate_up_proj.weight",
    "gate_up_proj.bias",
    "down_proj.weight",
    "down_proj.bias",
]


def test_our_adapter_checkpoint_has_what_the_fork_reads(tmp_path: Path) -> None:
    """The file `--speculative-dflash-tfm-path` receives loads the fork's way: exact config keys and parameter names,
    plain Python config values (torch.load's weights_only default), a strict load after a cast to bf16, and K
    (the fork drafts min(block_size - 1, K) depths) covering the drafter's 15 depths."""
    import torch

    from weaver.adapter import Weaver, WeaverConfig
    from weaver.training.adapter import new_adapter

    adapter = new_adapter(32, 32, d_rank=16, num_layers=2, num_heads=2, mlp_dim=24, pool_size=8)
    path = tmp_path / "adapter.pth"
    adapter.save(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    assert sorted(checkpoint) == ["config", "state_dict"]
    config, state = checkpoint["config"], checkpoint["state_dict"]
    assert list(config) == FORK_CONFIG_KEYS
    assert all(type(v) in (int, float, str) for v in config.values())
    assert (config["encoder_mode"], config["score_head"], config["activation"]) == (3, 4, "swiglu")
    assert config["K"] >= 15 and config["candidate_pool_size"] == 8
    blocks = [f"blocks.{i}.{name}" for i in range(config["num_layers"]) for name in FORK_BLOCK_PARAMETERS]
    assert sorted(state) == sorted(FORK_TOP_LEVEL_PARAMETERS + blocks)
    assert all(t.device.type == "cpu" for t in state.values())
    assert state["lm_head_query_in.weight"].shape == (32, 16)  # W_lm @ W_lmq: [V, d_model] @ [d_model, d_rank]
    served = Weaver(WeaverConfig(**config)).to(dtype=torch.bfloat16)  # the fork: Weaver(**config).to(dtype)
    served.load_state_dict(state, strict=True)
    for name, tensor in served.state_dict().items():
        torch.testing.assert_close(tensor, state[name].to(torch.bfloat16), rtol=0, atol=0)
    launch = SglangLaunch(model="m", method="weaver", port=1, budget=8, drafter="d", adapter=str(path))
    command = sglang_command(launch)
    assert command[command.index("--speculative-dflash-tfm-path") + 1] == str(path)


def test_the_pinned_sglang_builds_agree_everywhere() -> None:
    """config/paper.yaml `sglang` and environment.yml's GPU block name the builds weaver.backends.sglang targets."""
    import yaml

    from weaver.backends import sglang

    root = Path(__file__).resolve().parents[1]
    pinned = yaml.safe_load((root / "config/paper.yaml").read_text())["sglang"]
    assert pinned == dict(
        upstream=sglang.UPSTREAM_VERSION,
        fork_repo=sglang.FORK_REPO,
        fork_commit=sglang.FORK_COMMIT,
        fork_ddtree_commit=sglang.FORK_DDTREE_COMMIT,
    )
    environment = (root / "environment.yml").read_text()
    assert f"git checkout {sglang.FORK_COMMIT}" in environment and f"git clone {sglang.FORK_REPO}" in environment
    assert f"git checkout {sglang.FORK_DDTREE_COMMIT}" in environment
    assert f"sglang[all]=={sglang.UPSTREAM_VERSION}" in environment


def test_engine_device_is_checked_before_loading() -> None:
    """A device torch cannot name, another device type, or CUDA on a machine without it: refused with the fix."""
    import torch

    with pytest.raises(ValueError, match="not a torch device"):
        EngineConfig("tiny", device="gpu0").check()
    with pytest.raises(ValueError, match="runs on cpu or cuda"):
        EngineConfig("tiny", device="meta").check()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device here: use device cpu"):
            EngineConfig("tiny", device="cuda").check()
    else:
        with pytest.raises(ValueError, match="CUDA device"):
            EngineConfig("tiny", device=f"cuda:{torch.cuda.device_count()}").check()
    EngineConfig("tiny", device="cpu").check()


def test_cli_device_is_checked_before_the_model_load() -> None:
    """`python -m weaver.generate --device ...` refuses a bad device before loading anything (the model name here
    does not exist: reaching the load would raise another error)."""
    from weaver.generate import main

    with pytest.raises(ValueError, match="not a torch device"):
        main(["--model", "no-such-model", "--prompt", "hi", "--device", "gpu0"])


def test_place_moves_the_target_only_when_it_is_elsewhere(tiny_model) -> None:
    """A target already on the device is returned as it is (no re-fusing .to())."""
    from weaver.backends.engine import canonical_device, place

    def moved(*args, **kwargs):
        raise AssertionError(".to() called on a target already on the device")

    tiny_model.to = moved  # nn.Module.to returns self even when it re-fuses, so the call itself is what to catch
    assert place(tiny_model, "cpu") is tiny_model
    assert canonical_device("cpu") == "cpu" and canonical_device("cuda:1") == "cuda:1"
