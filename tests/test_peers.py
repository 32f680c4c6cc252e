"""weaver.peers: transformers and dflash reference peers on the same target, rows for the peers table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_drafter import tiny_config
from tiny_models import tiny_hf_model

from weaver.backends.engine import Engine, EngineConfig
from weaver.drafter import Drafter, save_drafter
from weaver.models import from_hf_model
from weaver.peers import load_dflash_drafter, main, run_dflash_reference, run_ours, run_transformers

PROMPT = [5, 17, 3, 42, 8, 9, 5, 17, 3, 42, 8, 9, 5, 17]


@pytest.fixture(scope="module")
def target():
    """A tiny llama (the SmolLM2 family) matching the tiny drafter config: 6 layers, width 32, vocab 97."""
    torch.manual_seed(1)
    hf = tiny_hf_model("llama", num_hidden_layers=6, hidden_size=32, head_dim=8, intermediate_size=48)
    return hf, from_hf_model(hf)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory) -> Path:
    torch.manual_seed(2)
    path = tmp_path_factory.mktemp("drafter")
    save_drafter(Drafter(tiny_config()).eval(), path)
    return path


def test_dflash_reference_loop_drives_our_drafter(target, drafter_dir) -> None:
    """z-lab's loop loads our z-lab-format drafter and, like our chain at the same block, is lossless."""
    hf, model = target
    dflash_model = load_dflash_drafter(drafter_dir)
    reference = run_dflash_reference(dflash_model, hf, PROMPT, 16, None)
    ar = run_ours(Engine(EngineConfig("tiny"), model), PROMPT, 16)
    chain = run_ours(Engine(EngineConfig("tiny", "chain", 4, drafter=str(drafter_dir)), model), PROMPT, 16)
    assert reference.output_ids == ar.output_ids == chain.output_ids
    assert reference.steps == chain.steps <= ar.steps == 16  # same drafts (argmax of the block) => same rounds


def test_engine_shares_one_config_across_methods(target, drafter_dir) -> None:
    """The peers run builds every engine from one drafter path: methods without a drafter ignore it, the drafter-based
    ones load it once (not per request)."""
    _, model = target
    for method, budget in (("ar", 0), ("prompt_lookup", 4), ("chain", 4)):
        engine = Engine(EngineConfig("tiny", method, budget, drafter=str(drafter_dir)), model)
        first, second = run_ours(engine, PROMPT, 8), run_ours(engine, PROMPT, 8)
        assert first.output_ids == second.output_ids
        assert ("drafter" in engine.options) == (method == "chain")
        assert not isinstance(engine.options.get("drafter"), (str, Path))


def test_weaver_engine_binds_the_adapter_once_with_its_fan_out(target, drafter_dir, tmp_path) -> None:
    """The engine binds the adapter (its [V, d] tables) once, with EngineConfig.children, and stays lossless."""
    from tiny_models import tiny_adapter

    from weaver.adapter import BoundAdapter

    _, model = target
    tiny_adapter(model).save(tmp_path / "adapter.pt")
    ar = run_ours(Engine(EngineConfig("tiny"), model), PROMPT, 12)
    for children in (1, 4):
        config = EngineConfig("tiny", "weaver", 8, str(drafter_dir), str(tmp_path / "adapter.pt"), children=children)
        engine = Engine(config, model)
        bound = engine.options["adapter"]
        assert isinstance(bound, BoundAdapter) and bound.children == children
        assert run_ours(engine, PROMPT, 12).output_ids == ar.output_ids
        assert engine.options["adapter"] is bound  # not rebound per request
    with pytest.raises(ValueError, match="children must be >= 1"):
        EngineConfig("tiny", "weaver", 8, str(drafter_dir), "a.pt", children=0).check()


def test_transformers_peers_count_forwards(target) -> None:
    hf, model = target
    plain = run_transformers(hf, PROMPT, 12, None)
    lookup = run_transformers(hf, PROMPT, 12, None, lookup=4)
    assert plain.output_ids == lookup.output_ids == run_ours(Engine(EngineConfig("tiny"), model), PROMPT, 12).output_ids
    assert plain.steps == 12  # one forward per token, prefill included
    assert lookup.steps <= plain.steps


def test_main_writes_one_row_per_peer_and_prompt(tmp_path: Path) -> None:
    out = tmp_path / "peers.jsonl"
    peers = "transformers_ar,transformers_prompt_lookup,ar,prompt_lookup"
    argv = ["--dataset", "humaneval", "--n-prompts", "1", "--max-new-tokens", "12", "--budget", "8"]
    main([*argv, "--peers", peers, "--warmup-tokens", "2", "--threads", "1", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["peer"] for r in rows] == peers.split(",")
    assert all(r["same_output"] for r in rows)  # greedy everywhere: the same tokens
    by_peer = {r["peer"]: r for r in rows}
    assert by_peer["ar"]["tau"] == by_peer["transformers_ar"]["tau"] == 1.0
    assert by_peer["prompt_lookup"]["tau"] >= 1.0 and by_peer["ar"]["model"] == "smollm2-135m"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peers", "chain"], "--drafter"),
        (["--peers", "nope"], "unknown peers"),
        (["--peers", "weaver", "--drafter", "d"], "--adapter"),
        (["--peers", "ar", "--n-prompts", "0"], "--n-prompts must be >= 1"),
        (["--peers", "ar", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--peers", "ar", "--dataset", "gsm9k"], "unknown --dataset 'gsm9k'"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--dataset", "humaneval", "--out", "x.jsonl", *argv])
    assert message in capsys.readouterr().err


def test_peers_table_speedup_over_transformers_ar() -> None:
    import importlib.util

    import pandas as pd

    path = Path(__file__).resolve().parent.parent / "workflow/scripts/peers_table.py"
    spec = importlib.util.spec_from_file_location("peers_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = pd.DataFrame(
        [
            {"model": "m", "dataset": d, "peer": p, "new_tokens": 10, "wall_s": w, "tau": t, "same_output": True}
            for d in ("a", "b")
            for p, w, t in (("transformers_ar", 2.0, 1.0), ("weaver", 0.5, 3.0), ("ar", 1.0, 1.0))
        ]
    )
    table = module.peers_table(rows).set_index(["dataset", "peer"])
    assert table.loc[("a", "weaver"), "speedup"] == pytest.approx(4.0)
    assert table.loc[("macro", "ar"), "speedup"] == pytest.approx(2.0)
    assert table.loc[("macro", "weaver"), "tau"] == pytest.approx(3.0)
    assert list(table.loc["a"].index) == ["transformers_ar", "ar", "weaver"]  # the peers' fixed order
