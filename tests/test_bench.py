"""weaver.bench: one record per prompt, resume after an interrupt, meta.json as the completion marker."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from weaver.bench import CellConfig, main, parse_args, read_records, run_prompts

PROMPTS = [(f"p{i}", list(range(1, 4 + i))) for i in range(5)]


def fake_stats(ids: list[int]) -> dict[str, Any]:
    """A stand-in for GenerationStats.to_dict(): deterministic in the prompt, two speculative steps."""
    accept = [len(ids) % 3 + 1, 2]
    new = 1 + sum(accept)
    return {
        "prompt_tokens": len(ids),
        "new_tokens": new,
        "steps": 1 + len(accept),
        "accept_lengths": accept,
        "tree_sizes": [4, 4],
        "draft_s": [0.01, 0.01],
        "tree_s": [0.0, 0.0],
        "verify_s": [0.02, 0.02],
        "ttft_s": 0.05,
        "wall_s": 0.1,
        "tau": new / 3,
        "tokens_per_s": new / 0.1,
        "hit_eos": False,
    }


class Interrupt(Exception):
    pass


def make_cell(out: Path, **changes: Any) -> CellConfig:
    cell = CellConfig(
        model="smollm2-135m",
        model_name="smollm2-135m",
        dataset="mt_bench",
        method="chain",
        budget=4,
        temperature=0.0,
        n_prompts=len(PROMPTS),
        max_new_tokens=16,
        seed=0,
        mode="target_only",
        drafter="drafter",
        adapter=None,
        out=str(out),
        threads=1,
        warmup_tokens=0,
    )
    return replace(cell, **changes)


def test_records_and_meta(tmp_path: Path) -> None:
    cell = make_cell(tmp_path / "cell")
    summary = run_prompts(cell, PROMPTS, fake_stats)
    records = read_records(tmp_path / "cell" / "records.jsonl")
    assert [r["prompt_id"] for r in records] == [pid for pid, _ in PROMPTS]
    assert records[0]["accept_lengths"] == fake_stats(PROMPTS[0][1])["accept_lengths"]
    assert records[0]["method"] == "chain" and records[0]["budget"] == 4 and records[0]["temperature"] == 0.0
    meta = json.loads((tmp_path / "cell" / "meta.json").read_text())
    assert meta["cell"]["dataset"] == "mt_bench"
    assert meta["summary"]["n_records"] == summary.n_records == len(PROMPTS)
    assert set(meta["git"]) == {"sha", "dirty"}
    assert meta["packages"]["torch"] is not None
    assert meta["hardware"]["cores"] >= 1
    assert meta["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_resume_after_interrupt(tmp_path: Path) -> None:
    cell = make_cell(tmp_path / "cell")
    calls: list[list[int]] = []

    def crash_after_two(ids: list[int]) -> dict[str, Any]:
        if len(calls) == 2:
            raise Interrupt
        calls.append(ids)
        return fake_stats(ids)

    with pytest.raises(Interrupt):
        run_prompts(cell, PROMPTS, crash_after_two)
    assert not (tmp_path / "cell" / "meta.json").exists(), "an interrupted cell must not look finished"
    assert len(read_records(tmp_path / "cell" / "records.jsonl")) == 2

    rerun: list[list[int]] = []
    summary = run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [ids for _, ids in PROMPTS[2:]], "finished prompts must be skipped"
    assert summary.n_resumed == 2 and summary.n_records == len(PROMPTS)
    ids = [r["prompt_id"] for r in read_records(tmp_path / "cell" / "records.jsonl")]
    assert sorted(ids) == sorted(pid for pid, _ in PROMPTS)


def test_torn_last_line_is_dropped(tmp_path: Path) -> None:
    cell = make_cell(tmp_path / "cell")
    run_prompts(cell, PROMPTS[:2], fake_stats)
    path = tmp_path / "cell" / "records.jsonl"
    path.write_text(path.read_text() + '{"prompt_id": "p2", "ta')  # killed in the middle of a write
    rerun: list[list[int]] = []
    run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [ids for _, ids in PROMPTS[2:]]
    assert len(read_records(path)) == len(PROMPTS)


def test_records_of_another_configuration_are_rerun(tmp_path: Path) -> None:
    run_prompts(make_cell(tmp_path / "cell"), PROMPTS, fake_stats)
    rerun: list[list[int]] = []
    cell = make_cell(tmp_path / "cell", max_new_tokens=32)
    run_prompts(cell, PROMPTS[:3], lambda ids: rerun.append(ids) or fake_stats(ids))
    records = read_records(tmp_path / "cell" / "records.jsonl")
    assert len(rerun) == 3 and len(records) == 3
    assert {r["max_new_tokens"] for r in records} == {32}


def rewrite(path: Path, text: str) -> None:
    """Rewrite a checkpoint as training would: new content, a later modification time."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_a_retrained_checkpoint_reruns_every_prompt(tmp_path: Path) -> None:
    """Records made with another drafter or adapter are not reused, even with every other setting equal."""
    adapter, drafter = tmp_path / "adapter.pt", tmp_path / "drafter"
    drafter.mkdir()
    rewrite(adapter, "weights v1")
    rewrite(drafter / "model.safetensors", "drafter v1")
    cell = make_cell(tmp_path / "cell", method="weaver", drafter=str(drafter), adapter=str(adapter))
    run_prompts(cell, PROMPTS[:-1], fake_stats)  # interrupted before the last prompt
    rerun: list[list[int]] = []
    run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [PROMPTS[-1][1]], "unchanged checkpoints: every record is reused"
    rerun.clear()
    rewrite(adapter, "weights v2")
    run_prompts(cell, PROMPTS[:-1], lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [ids for _, ids in PROMPTS[:-1]], "a retrained adapter must rerun every prompt"
    rerun.clear()
    rewrite(drafter / "model.safetensors", "drafter v2")
    run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert len(rerun) == len(PROMPTS), "a retrained drafter must rerun every prompt"
    meta = json.loads((tmp_path / "cell" / "meta.json").read_text())
    record = read_records(tmp_path / "cell" / "records.jsonl")[0]
    assert meta["checkpoints"] == record["checkpoints"] and meta["checkpoints"]["adapter"].startswith("sha256:")


@pytest.mark.parametrize(
    ("method", "changes", "reruns"),
    [
        ("weaver", {"children": 16}, True),
        ("chain", {"children": 16}, False),  # only the Weaver builders read the fan-out
        ("chain", {"backend": "server"}, True),
    ],
    ids=["weaver-children", "chain-children", "backend"],
)
def test_settings_that_change_the_decode_rerun(tmp_path: Path, method: str, changes: dict, reruns: bool) -> None:
    cell = make_cell(tmp_path / "cell", method=method, adapter="a" if method == "weaver" else None)
    run_prompts(cell, PROMPTS[:-1], fake_stats)  # interrupted before the last prompt
    rerun: list[list[int]] = []
    run_prompts(replace(cell, **changes), PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert len(rerun) == (len(PROMPTS) if reruns else 1)


def test_warmup_runs_once_untimed_before_the_prompts_left(tmp_path: Path) -> None:
    cell = make_cell(tmp_path / "cell", warmup_tokens=3)
    calls: list[tuple[list[int], int | None]] = []

    def run_one(ids: list[int], max_new_tokens: int | None = None) -> dict[str, Any]:
        calls.append((ids, max_new_tokens))
        return fake_stats(ids)

    run_prompts(cell, PROMPTS, run_one)
    assert calls[0] == (PROMPTS[0][1], 3) and [n for _, n in calls[1:]] == [None] * len(PROMPTS)
    assert len(read_records(tmp_path / "cell" / "records.jsonl")) == len(PROMPTS)  # the warm-up is not a record
    path = tmp_path / "cell" / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in read_records(path)[:2]))  # interrupted after two prompts
    calls.clear()
    run_prompts(cell, PROMPTS, run_one)
    assert calls == [(PROMPTS[2][1], 3)] + [(ids, None) for _, ids in PROMPTS[2:]]


def test_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"prompt_id": "p0"}\nnot json\n{"prompt_id": "p1"}\n')
    with pytest.raises(ValueError, match="records.jsonl:2"):
        read_records(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "ar", "--budget", "4"], "use --budget 0"),
        (["--method", "chain", "--budget", "0"], "needs a tree budget"),
        (["--method", "chain", "--budget", "8"], "--drafter"),
        (["--method", "weaver", "--budget", "8", "--drafter", "d"], "--adapter"),
        (["--method", "weaver", "--budget", "8", "--drafter", "d", "--adapter", "a", "--children", "0"], ">= 1"),
        (
            [
                "--method",
                "weaver",
                "--budget",
                "8",
                "--drafter",
                "d",
                "--adapter",
                "a",
                "--children",
                "16",
                "--backend",
                "sglang",
            ],
            "fan-out of 8",
        ),
        (["--method", "eagle", "--budget", "8"], "unknown --method 'eagle'"),
        (["--method", "ar", "--budget", "0", "--dataset", "gsm9k"], "unknown --dataset 'gsm9k'"),
        (["--method", "ar", "--budget", "0", "--temperature", "-1"], "--temperature must be >= 0"),
        (["--method", "ar", "--budget", "0", "--n-prompts", "0"], "--n-prompts"),
        (["--method", "ar", "--budget", "0", "--backend", "sglang", "--port", "70000"], "--port must be"),
        (["--method", "ar", "--budget", "0", "--warmup-tokens", "-1"], "--warmup-tokens"),
        (["--method", "ar", "--budget", "0", "--device", "gpu0"], "not a torch device"),
        (["--method", "ar", "--budget", "0", "--backend", "sglang", "--device", "cuda"], "a server picks its own"),
    ],
    ids=[
        "ar-budget",
        "chain-no-budget",
        "chain-no-drafter",
        "weaver-no-adapter",
        "zero-children",
        "children-sglang",
        "unknown-method",
        "unknown-dataset",
        "negative-temperature",
        "no-prompts",
        "bad-port",
        "negative-warmup",
        "bad-device",
        "device-for-a-server",
    ],
)
def test_bad_cells_are_refused(tmp_path: Path, argv: list[str], message: str) -> None:
    """Refused before anything is loaded, and before a finished cell's files are touched."""
    out = tmp_path / "cell"
    run_prompts(make_cell(out), PROMPTS, fake_stats)
    finished = {p.name: p.read_bytes() for p in out.iterdir()}
    base = ["--model", "smollm2-135m", "--dataset", "mt_bench", "--temperature", "0", "--n-prompts", "2"]
    with pytest.raises(ValueError, match=message):
        main([*base, "--max-new-tokens", "8", "--out", str(out), *argv])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == finished


def test_model_name_defaults_to_folder_name() -> None:
    argv = ["--model", "results/cpu/models/smollm2-hybrid/", "--dataset", "mt_bench", "--method", "ar"]
    cell = parse_args(
        [*argv, "--budget", "0", "--temperature", "1", "--n-prompts", "1", "--max-new-tokens", "4"]
        + [
            "--out",
            "x",
        ]
    )
    assert cell.model_name == "smollm2-hybrid"


def test_device_is_part_of_an_engine_cell_only(tmp_path: Path) -> None:
    """Records of an engine cell carry its device (a CPU record is not resumed as a GPU one); a server cell's carry
    None (the server runs where it was launched)."""
    assert make_cell(tmp_path).key()["device"] == "cpu"
    assert make_cell(tmp_path, device="cuda:1").key()["device"] == "cuda:1"
    assert make_cell(tmp_path, backend="server", server_url="http://x").key()["device"] is None


def test_engine_records_from_before_the_device_key_resume_as_cpu(tmp_path: Path) -> None:
    cell = make_cell(tmp_path / "cell")
    run_prompts(cell, PROMPTS, fake_stats)
    path = tmp_path / "cell" / "records.jsonl"
    old = [{k: v for k, v in r.items() if k != "device"} for r in read_records(path)][:-1]  # interrupted
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "cell" / "meta.json").unlink()
    rerun: list[list[int]] = []
    summary = run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [PROMPTS[-1][1]] and summary.n_resumed == len(PROMPTS) - 1
    path.write_text("".join(json.dumps(r) + "\n" for r in read_records(path)[:-1]))
    on_gpu = run_prompts(replace(cell, device="cuda:0"), PROMPTS, fake_stats)
    assert on_gpu.n_resumed == 0  # a GPU run does not reuse CPU records


def test_a_finished_cell_run_again_is_measured_again_and_its_records_kept_aside(tmp_path: Path) -> None:
    """Snakemake deletes meta.json before rerunning a cell (an input changed, --forcerun, a fresh clone rebuilding the
    committed results): complete records then mean a finished run, not an interrupted one, so nothing is resumed."""
    cell = make_cell(tmp_path / "cell")
    run_prompts(cell, PROMPTS, fake_stats)
    path = tmp_path / "cell" / "records.jsonl"
    first = path.read_text()
    (tmp_path / "cell" / "meta.json").unlink()
    rerun: list[list[int]] = []
    summary = run_prompts(cell, PROMPTS, lambda ids: rerun.append(ids) or fake_stats(ids))
    assert rerun == [ids for _, ids in PROMPTS] and summary.n_resumed == 0
    assert len(read_records(path)) == len(PROMPTS)
    (aside,) = (tmp_path / "cell").glob("records.replaced-*.jsonl")
    assert aside.read_text() == first


def test_records_of_another_configuration_are_kept_aside_not_lost(tmp_path: Path) -> None:
    run_prompts(make_cell(tmp_path / "cell"), PROMPTS[:2], fake_stats)  # interrupted at budget 4
    first = (tmp_path / "cell" / "records.jsonl").read_text()
    summary = run_prompts(make_cell(tmp_path / "cell", budget=8), PROMPTS, fake_stats)
    assert summary.n_resumed == 0
    assert {r["budget"] for r in read_records(tmp_path / "cell" / "records.jsonl")} == {8}
    (aside,) = (tmp_path / "cell").glob("records.replaced-*.jsonl")
    assert aside.read_text() == first
    run_prompts(make_cell(tmp_path / "cell", budget=16), PROMPTS[:1], fake_stats)  # same second: a free name
    assert len(list((tmp_path / "cell").glob("records.replaced-*.jsonl"))) == 2
