"""lm-eval integration: `weaver` runs a local generate_until task; speculative outputs and scores equal AR's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from weaver.lm_eval_model import WeaverLM  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "lm_eval"


@pytest.fixture
def in_repo_root(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the task YAML names its JSONL relative to the repository root
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))


def evaluate(lm: WeaverLM) -> tuple[float, list[str]]:
    out = lm_eval.simple_evaluate(
        model=lm, tasks=["weaver_copy"], task_manager=TaskManager(include_path=str(FIXTURES)), log_samples=True
    )
    samples = sorted(out["samples"]["weaver_copy"], key=lambda s: s["doc_id"])
    return out["results"]["weaver_copy"]["exact_match,none"], [s["filtered_resps"][0] for s in samples]


def test_registered() -> None:
    assert get_model("weaver") is WeaverLM


def test_speculative_scores_and_outputs_equal_ar(in_repo_root) -> None:
    ar = WeaverLM.create_from_arg_string("model=smollm2-135m,method=ar")
    score_ar, outputs_ar = evaluate(ar)
    spec = WeaverLM.create_from_arg_string("model=smollm2-135m,method=prompt_lookup,budget=4")
    score_spec, outputs_spec = evaluate(spec)
    assert outputs_spec == outputs_ar and score_spec == score_ar
    assert score_ar > 0  # the task is solvable: a broken prompt or cut would score 0 for both
    assert sum(s["tau"] for s in spec.stats) / len(spec.stats) > 1.2  # speculation was really on (copying)


def test_loglikelihood_prefers_the_copy(in_repo_root) -> None:
    from lm_eval.api.instance import Instance

    lm = WeaverLM(model="smollm2-135m")
    context = "Copy: cat dog bird\nCopied:"
    requests = [
        Instance("loglikelihood", {}, (context, cont), idx) for idx, cont in enumerate([" cat dog bird", " seven"])
    ]
    (copy_ll, copy_greedy), (other_ll, _) = lm.loglikelihood(requests)
    assert copy_ll > other_ll and copy_ll < 0


def test_loglikelihood_splits_pairs_like_hflm(in_repo_root) -> None:
    """A context ending in a space scores the same tokens as the space moved into the continuation (HFLM's split);
    before, " cat" tokenized apart from "cat" left an empty continuation scored 0.0."""
    from lm_eval.api.instance import Instance

    lm = WeaverLM(model="smollm2-135m")
    pairs = [("Copy: cat dog\nCopied: ", "cat dog"), ("Copy: cat dog\nCopied:", " cat dog"), ("", "Hello there")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    (spaced, _), (moved, _), (no_context, _) = lm.loglikelihood(requests)
    assert spaced == pytest.approx(moved) and spaced < 0 and no_context < 0
    with pytest.raises(ValueError, match="encodes to no tokens"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("Copy:", ""), 0)])


def test_model_args_are_checked_and_children_reaches_the_engine() -> None:
    with pytest.raises(ValueError, match=r"unknown weaver model_args \['budgett'\]"):
        WeaverLM.create_from_arg_string("model=smollm2-135m,method=ar,budgett=4")
    with pytest.raises(ValueError, match="runs on cpu or cuda"):
        WeaverLM.create_from_arg_string("model=smollm2-135m", {"device": "mps"})
    with pytest.raises(ValueError, match="not a torch device"):  # parsed before cuda means the CPU here
        WeaverLM.create_from_arg_string("model=smollm2-135m", {"device": "cuda:banana"})
    with pytest.raises(ValueError, match="unknown method"):
        WeaverLM.create_from_arg_string("model=smollm2-135m,method=eagle,budget=4")
    lm = WeaverLM.create_from_arg_string(
        "model=smollm2-135m,method=prompt_lookup,budget=4,children=16", {"batch_size": 1}
    )
    assert lm.engine.config.children == 16 and lm.engine.config.budget == 4


@pytest.mark.slow
def test_cli_command(in_repo_root, tmp_path) -> None:
    """The documented command line, end to end."""
    command = [sys.executable, "-m", "weaver.lm_eval_model", "--model", "weaver", "--model_args"]
    command += ["model=smollm2-135m,method=prompt_lookup,budget=4", "--tasks", "weaver_copy"]
    command += ["--include_path", str(FIXTURES), "--output_path", str(tmp_path / "out")]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True, timeout=300)
    (result,) = list((tmp_path / "out").rglob("results_*.json"))
    score_cli = json.loads(result.read_text())["results"]["weaver_copy"]["exact_match,none"]
    score_ar, _ = evaluate(WeaverLM.create_from_arg_string("model=smollm2-135m,method=ar"))
    assert score_cli == score_ar > 0  # the speculative CLI run scores what plain decoding does in process
