"""The Snakemake DAG: dry runs of every config and profile, schema rejections, figures from committed raw logs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
PRODUCERS = {
    "build_hybrid", "train_drafter", "adapter_features", "train_adapter", "build_kernels", "kernel_bench", "bench_cell",
    "eval_depth",
}  # fmt: skip


def snakemake(*argv: str, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    # PATH without the venv, as after the README's quick start: the Snakefile puts its interpreter first for the jobs
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1"}
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--cores", "1", *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _slurm_answers() -> bool:
    return shutil.which("sbatch") is not None and subprocess.run(["sinfo"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A one-node SLURM cluster on this machine, started like a test database (workflow/ci/slurm_up.sh)."""
    if _slurm_answers():
        return
    if os.geteuid() != 0:
        pytest.skip("starting the one-node SLURM cluster needs root (it apt-installs slurm-wlm and munge)")
    up = subprocess.run(
        ["bash", str(ROOT / "workflow" / "ci" / "slurm_up.sh")], capture_output=True, text=True, timeout=900
    )
    assert up.returncode == 0 and _slurm_answers(), f"workflow/ci/slurm_up.sh failed:\n{up.stdout}\n{up.stderr}"


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run as {rule: count}."""
    counts: dict[str, int] = {}
    stats = output.split("Job stats:", 1)
    if len(stats) < 2:
        return counts
    for line in stats[1].splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        counts[match[1]] = int(match[2])
    return counts


@pytest.mark.parametrize("config", ["config.yaml", "smoke.yaml", "paper.yaml"])
def test_dry_run_of_every_config(config: str, tmp_path: Path) -> None:
    """The full DAG of each config in an empty working directory (the checkout holds the committed CPU run)."""
    run = snakemake("-n", "--configfile", str(ROOT / "config" / config), "--directory", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    counts = job_counts(run.stdout)
    assert counts.get("bench_cell", 0) > 0 and counts.get("analyze") == 1
    resolved = yaml.safe_load((ROOT / "config" / config).read_text())
    children = resolved.get("weaver_children", 8)
    weaver_commands = [line for line in run.stdout.splitlines() if "--method weaver " in line]
    assert weaver_commands and all(f"--children {children} " in line for line in weaver_commands)
    own = [name for name, recipe in adapter_recipes(resolved) if "features_args" in recipe]
    assert counts.get("adapter_features", 0) == len(own)
    for name in own:  # such an adapter trains on its own features, not on the drafter's
        run_dir = f"results/{resolved['run']}"
        assert f"--features {run_dir}/adapter_features/{name} --out {run_dir}/adapters/{name} " in run.stdout
    grids = resolved["grids"]
    for grid in grids:  # a budget-free method runs at the grid's smallest budget only
        for method in grid.get("budget_free", []):
            runs = set(re.findall(rf"/{method}/b(\d+)-t", run.stdout))
            assert runs == {str(min(grid["budgets"]))}, runs


def adapter_recipes(config: dict) -> list[tuple[str, dict]]:
    """(name in paths, recipe) of every adapter of a config: each model's, then its per_temperature ones."""
    found = []
    for model, spec in config["models"].items():
        found.append((model, spec["adapter"]))
        found += [(f"{model}.t{e['temperature']:g}", e) for e in spec["adapter"].get("per_temperature", [])]
    return found


TRAINER_KEYS = {
    "drafter": ("drafter", "train_args"),
    "features": ("adapter", "features_args"),
    "adapter": ("adapter", "train_args"),
    "hybrid": ("build_args",),
}
REQUIRED_FLAGS = {
    "drafter": ["--model", "m", "--out", "o"],
    "features": ["--model", "m", "--drafter", "d", "--out", "o"],
    "adapter": ["--model", "m", "--drafter", "d", "--out", "o"],
    "hybrid": ["--out", "o"],
}


def trainer_args(config: dict) -> list[tuple[str, str, list[str]]]:
    """(model, trainer, extra flags) for every trainer invocation a config's models spell out."""
    found = []
    for model, spec in config["models"].items():
        for trainer, keys in TRAINER_KEYS.items():
            value = spec
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                found.append((model, trainer, [str(a) for a in value]))
    for name, recipe in adapter_recipes(config):  # the model's own adapter is above; here its per_temperature ones
        if name not in config["models"]:
            for trainer, key in (("features", "features_args"), ("adapter", "train_args")):
                if key in recipe:
                    found.append((name, trainer, [str(a) for a in recipe[key]]))
    return found


@pytest.mark.parametrize("config", ["config.yaml", "smoke.yaml", "paper.yaml"])
def test_trainer_args_of_every_config_parse(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each config's train_args / build_args are flags the trainer accepts, with values of the right type and choice
    (a typo such as `--optimizer mun` would otherwise surface only when the workflow reaches that job)."""
    from weaver.train import build_parser

    found = trainer_args(yaml.safe_load((ROOT / "config" / config).read_text()))
    assert any(trainer == "adapter" for _, trainer, _ in found)
    for model, trainer, extra in found:
        argv = [trainer, *REQUIRED_FLAGS[trainer], *extra]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit:
            pytest.fail(f"{config}: {model}'s {trainer} arguments {extra} do not parse: {capsys.readouterr().err}")


def test_trainer_args_check_rejects_a_bad_choice(capsys: pytest.CaptureFixture[str]) -> None:
    from weaver.train import build_parser

    argv = ["adapter", *REQUIRED_FLAGS["adapter"], "--optimizer", "mun"]
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)
    assert "mun" in capsys.readouterr().err


def with_temperature_one(config: dict, per_temperature: list[dict]) -> dict:
    """The smoke config with Weaver also at temperature 1 and these per_temperature adapters."""
    config["grids"][0]["temperatures"] = [0, 1]
    config["models"]["smollm2-135m"]["adapter"]["per_temperature"] = per_temperature
    return config


def test_a_per_temperature_adapter_serves_its_temperature_only(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    features = ["--data", "target", "--num-sequences", "12", "--regen-tokens", "16", "--regen-temperatures", "1"]
    one = {"temperature": 1, "features_args": features, "train_args": ["--steps", "4"]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(with_temperature_one(config, [one])))
    run = snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    counts = job_counts(run.stdout)
    assert counts["adapter_features"] == 2 and counts["train_adapter"] == 2
    lines = run.stdout.splitlines()
    default, own = "results/smoke/adapters/smollm2-135m/adapter.pt", "results/smoke/adapters/smollm2-135m.t1/adapter.pt"
    for temperature, adapter in ((0, default), (1, own)):
        cells = [line for line in lines if "--method weaver " in line and f"--temperature {temperature} " in line]
        assert cells and all(f"--adapter {adapter} " in line for line in cells), cells
    assert f"--adapter {default} --adapter-at 1 {own} --dataset" in run.stdout  # eval_depth: each its own
    assert (
        "--out results/smoke/adapter_features/smollm2-135m.t1 --data target --num-sequences 12 --regen-tokens 16 "
        "--regen-temperatures 1 > results/smoke/logs/adapter_features/smollm2-135m.t1.log" in run.stdout
    )

    # an adapter for every temperature Weaver runs at: the model's default one is not trained at all
    zero = {"temperature": 0, "train_args": ["--steps", "4"]}  # on the drafter's features
    path.write_text(yaml.safe_dump(with_temperature_one(config, [zero, one])))
    run = snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert job_counts(run.stdout)["train_adapter"] == 2 and default not in run.stdout
    assert f"--adapter-at 0 results/smoke/adapters/smollm2-135m.t0/adapter.pt --adapter-at 1 {own} " in run.stdout


@pytest.mark.parametrize(
    ("per_temperature", "names"),
    [
        ([{"temperature": 0.5, "train_args": []}], ["per_temperature", "temperature 0.5", "Weaver's temperatures"]),
        ([{"temperature": 1, "train_args": []}, {"temperature": 1.0, "path": "a.pt"}], ["1 is listed twice"]),
        ([{"train_args": []}], ["per_temperature.0", "'temperature' is a required property"]),
    ],
    ids=["temperature-not-served", "twice", "no-temperature"],
)
def test_bad_per_temperature_adapter_fails_naming_it(tmp_path: Path, per_temperature: list, names: list[str]) -> None:
    config = with_temperature_one(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()), per_temperature)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run = snakemake("-n", "--configfile", str(path))
    assert run.returncode != 0
    for name in names:
        assert name in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_model_named_like_a_per_temperature_adapter_is_refused(tmp_path: Path) -> None:
    config = with_temperature_one(
        yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()), [{"temperature": 1, "train_args": []}]
    )
    config["models"]["smollm2-135m.t1"] = config["models"]["smollm2-135m"] | {"adapter": {"train_args": []}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run = snakemake("-n", "--configfile", str(path))
    assert run.returncode != 0
    assert "'smollm2-135m.t1' names both a model and the temperature-1 adapter" in run.stdout + run.stderr


@pytest.mark.parametrize("profile", ["default", "gpu-smoke", "slurm"])
def test_dry_run_of_every_profile(profile: str) -> None:
    run = snakemake(
        "-n", "--profile", str(ROOT / "profiles" / profile), "--configfile", str(ROOT / "config/smoke.yaml")
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert job_counts(run.stdout).get("bench_cell", 0) > 0


def test_paper_config_has_the_papers_grid() -> None:
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    main, qwen3 = paper["grids"]
    assert len(main["datasets"]) == 8 and max(main["budgets"]) == 128 and main["temperatures"] == [1]
    assert {"ar", "chain", "ddtree", "weaver"} <= set(main["methods"])
    assert qwen3["models"] == ["qwen3-8b"] and qwen3["temperatures"] == [0]
    assert paper["datasets"]["gsm8k"] == 128 and paper["datasets"]["math500"] == 128


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"grids": [{"models": ["smollm2-135m"], "datasets": ["mt_bench"], "methods": ["medusa"], "budgets": [4],
                     "temperatures": [0]}]}, ["grids.0.methods.0", "'medusa' is not one of", "'weaver'"]),
        ({"verify_mode": "minp"}, ["verify_mode", "'traversal'"]),
        ({"max_new_token": 8}, ["max_new_token", "allowed keys", "max_new_tokens"]),
        ({"datasets": {"mt_bench": 0}}, ["datasets.mt_bench", "minimum"]),
        ({"grids": [{"models": ["smollm2-135m"], "datasets": ["mt_bench"], "methods": ["ar", "chain"], "budgets": [4],
                     "temperatures": [0], "budget_free": ["ddtree"]}]}, ["grids.budget_free", "'ddtree'", "'chain'"]),
        ({"weaver_children": 16, "backend": "sglang"}, ["weaver_children", "backend engine", "'sglang'"]),
        ({"figures": {"tree_methods": ["ddtree"]}}, ["figures.tree_methods", "'smollm2-135m'", "'chain', 'weaver'"]),
        ({"models": {"pretrained": {"target": "smollm2-135m", "drafter": {"path": "d"},
                                    "adapter": {"path": "a.pt", "features_args": ["--num-sequences", "8"]}}}},
         ["models.pretrained.adapter", "'train_args' is a dependency of 'features_args'"]),
    ],
    ids=["unknown-method", "unknown-verify-mode", "misspelt-key", "zero-prompts", "budget-free-not-in-grid",
         "children-on-sglang", "no-tree-method-benchmarked", "features-of-a-pretrained-adapter"],
)  # fmt: skip
def test_bad_config_fails_at_once_naming_key_and_allowed(tmp_path: Path, change: dict, names: list[str]) -> None:
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config.update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run = snakemake("-n", "--configfile", str(path))
    assert run.returncode != 0
    message = run.stdout + run.stderr
    for name in names:
        assert name in message, message


def test_figures_rebuild_from_committed_logs_without_producing_jobs(tmp_path: Path) -> None:
    """A fresh clone: raw logs only, no checkpoints, no .snakemake metadata, raw logs newer than everything."""
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    for path in (tmp_path / "results").rglob("*"):
        path.touch()  # timestamps after a fresh clone are arbitrary: make the raw logs the newest files
    config = str(FIXTURES / "config.yaml")
    dry = snakemake("figures", "-n", "--configfile", config, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    scheduled = set(job_counts(dry.stdout))
    assert scheduled and not scheduled & PRODUCERS, f"figures would run producing jobs: {scheduled & PRODUCERS}"

    run = snakemake("figures", "--configfile", config, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    figures = tmp_path / "figures" / "fixture"
    names = ["table1.md", "table1.tex", "per_dataset.md", "tau_vs_budget.png", "tau_vs_budget.pdf"]
    names += ["depth_acceptance.png", "speedup_vs_budget.pdf", "gdn_kernel_time.png", "gdn_kernel_time.tex"]
    names += ["tree_tau.md", "tree_tau.tex", "tau_ratios.md", "tau_ratios.tex"]
    for name in names:
        assert (figures / name).stat().st_size > 0, name
    for tex in figures.glob("*.tex"):  # names such as transformers_ar and "95% CI" would break LaTeX unescaped
        unescaped = re.findall(r".{0,20}(?<!\\)[%_#].{0,20}", tex.read_text())
        assert not unescaped, f"{tex.name}: {unescaped[:3]}"
    table1 = (figures / "table1.md").read_text()
    rows = markdown_rows(table1)
    speedups = {row[1]: row[4] for row in rows[2:]}  # columns: model, method, budget, tok/s, speedup, tau, datasets
    expected = macro_throughput(tmp_path, "weaver", 8) / macro_throughput(tmp_path, "ar", 0)
    assert speedups["AR"] == "1.00" and speedups["Weaver tree"] == f"{expected:.2f}", table1
    trees = (figures / "tree_tau.md").read_text()  # fixture: Weaver macro (1.75 + 1.625) / 2 over DDTree's 1.375
    weaver_row = next(line for line in trees.splitlines() if "Weaver tree" in line)
    assert "1.69" in weaver_row and "1.23" in weaver_row, trees
    ratios = (figures / "tau_ratios.md").read_text()  # fixture, budget 8: Weaver 3.171, DDTree 2.838, chain 2.056
    rows = markdown_rows(ratios)
    budget8 = next(row for row in rows if row[2] == "8")
    assert budget8[3:9] == ["2.06", "2.84", "3.17", "1.12", "1.54", "1.38"], ratios
    low, high = (float(x) for x in budget8[9].strip("[]").split(","))  # paired bootstrap over the fixture's prompts
    reachable = resampled_ratios(tmp_path, "weaver", "ddtree", 8)
    assert min(reachable) - 0.005 <= low <= 3.171 / 2.838 <= high <= max(reachable) + 0.005, (low, high)
    assert high - low > 0.01  # the fixture's prompts differ, so the resamples do
    assert budget8[10:12] == [budget8[6], budget8[9]]  # temperature 0: tau_expected is tau, ratio and interval too
    steps = (figures / "step_time.md").read_text()
    rows = markdown_rows(steps)
    weaver8 = next(row for row in rows if row[1] == "Weaver tree" and row[2] == "8")
    expected = decode_ms_per_step(tmp_path, "weaver", 8) / decode_ms_per_step(tmp_path, "ar", 0)
    assert weaver8[6] == f"{decode_ms_per_step(tmp_path, 'weaver', 8):.2f}" and weaver8[8] == f"{expected:.2f}", steps

    again = snakemake("figures", "-n", "--configfile", config, cwd=tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr

    meta = next((tmp_path / "results").rglob("weaver/*/meta.json"))  # a cell's raw log rewritten after the tables
    meta.write_text(meta.read_text() + "\n")  # new content: Snakemake 9 skips an input newer but of the same checksum
    stale = snakemake("figures", "-n", "--configfile", config, cwd=tmp_path)
    scheduled = set(job_counts(stale.stdout))
    assert "analyze" in scheduled and not scheduled & PRODUCERS, stale.stdout

    report = snakemake("--report", "report.html", "--configfile", config, cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    html = (tmp_path / "report.html").read_text(errors="replace")
    for name in ("tau_vs_budget.png", "depth_acceptance.png", "table1.md"):
        assert name in html, f"{name} missing from snakemake --report"


def markdown_rows(table: str) -> list[list[str]]:
    """The cells of every row of a Markdown table (header and separator rows included)."""
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("|")]


def cell_records(root: Path, method: str, budget: int) -> list[list[dict]]:
    """A run's raw records of one method and budget at temperature 0, one list per dataset."""
    paths = sorted(root.glob(f"results/*/raw/bench/*/*/{method}/b{budget}-t0/records.jsonl"))
    assert paths, f"no {method} b{budget} records under {root}"
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in paths]


def macro_throughput(root: Path, method: str, budget: int) -> float:
    """From a run's raw records: tokens per second pooled over each dataset's requests (prefill included), then
    averaged over datasets (Table 1's tok/s; its speedup is the ratio of two such macros)."""
    per_dataset = [
        sum(r["new_tokens"] for r in rows) / sum(r["wall_s"] for r in rows)
        for rows in cell_records(root, method, budget)
    ]
    return sum(per_dataset) / len(per_dataset)


def assert_smoke_table1(root: Path) -> None:
    """The smoke run's Table 1 lists its four methods with the speedups its raw records give."""
    table1 = (root / "figures" / "smoke" / "table1.md").read_text()
    speedups = {row[1]: row[4] for row in markdown_rows(table1)[2:]}  # model, method, budget, tok/s, speedup, ...
    assert set(speedups) == {"AR", "Prompt lookup", "DFlash chain", "Weaver tree"}, table1
    assert speedups["AR"] == "1.00"
    ar = macro_throughput(root, "ar", 0)
    for label, method in (("Prompt lookup", "prompt_lookup"), ("DFlash chain", "chain"), ("Weaver tree", "weaver")):
        assert speedups[label] == f"{macro_throughput(root, method, 4) / ar:.2f}", table1


def resampled_ratios(root: Path, num: str, den: str, budget: int) -> list[float]:
    """Every macro(num) / macro(den) a paired resample of each dataset's prompts can give (exhaustive, small runs)."""
    import itertools

    per_dataset = []  # datasets in the same (path) order for both methods
    for num_rows, den_rows in zip(cell_records(root, num, budget), cell_records(root, den, budget), strict=True):
        den_tau = {r["prompt_id"]: r["tau"] for r in den_rows}
        per_dataset.append([(r["tau"], den_tau[r["prompt_id"]]) for r in num_rows])
    ratios = []
    for picks in itertools.product(*(itertools.combinations_with_replacement(d, len(d)) for d in per_dataset)):
        macro = [sum(sum(pair[i] for pair in pick) / len(pick) for pick in picks) / len(picks) for i in (0, 1)]
        ratios.append(macro[0] / macro[1])
    return ratios


def decode_ms_per_step(root: Path, method: str, budget: int) -> float:
    """From a run's raw records: ms per decoding step (wall time less time to first token) pooled over each
    dataset's requests, then averaged over datasets (what figures/*/step_time reports)."""
    per_dataset = [
        1000 * sum(r["wall_s"] - r["ttft_s"] for r in rows) / sum(r["steps"] for r in rows)
        for rows in cell_records(root, method, budget)
    ]
    return sum(per_dataset) / len(per_dataset)


def test_rerun_benchmark_cells_rebuild_the_tables_in_the_same_invocation(tmp_path: Path) -> None:
    """Cells that rerun (here forced; after a retrained adapter, by Snakemake itself) bring analyze along: with
    ancient() raw logs Snakemake 9 left the tidy tables and figures of the old cells in place."""
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    config = str(FIXTURES / "config.yaml")
    assert snakemake("figures", "--configfile", config, cwd=tmp_path).returncode == 0
    dry = snakemake("figures", "-n", "--forcerun", "bench_cell", "--configfile", config, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    counts = job_counts(dry.stdout)
    assert counts.get("bench_cell", 0) > 0 and counts.get("analyze") == 1, counts
    analyze = dry.stdout.split("rule analyze:", 1)[1]
    reason = next(line for line in analyze.splitlines() if line.strip().startswith("reason:"))
    assert "meta.json" in reason, reason  # brought along by the cells, not only by the kernel table


def test_environment_yml_matches_pyproject() -> None:
    """conda is not available here: environment.yml must list the same dependencies as pyproject.toml."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for group in project.get("optional-dependencies", {}).values():
        wanted |= set(group)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {d for d in pip if not d.startswith("-e")}
    assert listed == wanted, f"only in pyproject: {wanted - listed}; only in environment.yml: {listed - wanted}"


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path: Path) -> None:
    """config/smoke.yaml from nothing to every artifact (needs the real engine, trainers and kernels)."""
    run = snakemake("--configfile", str(ROOT / "config" / "smoke.yaml"), "--directory", str(tmp_path), timeout=600)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    assert_smoke_table1(tmp_path)


@pytest.mark.slow
def test_smoke_run_trains_and_serves_an_adapter_per_temperature(tmp_path: Path) -> None:
    """A temperature-1 adapter from nothing: its own sampled completions, its training, the temperature-1 Weaver cell
    and eval_depth's temperature-1 rows on it, while temperature 0 keeps the model's default adapter."""
    import csv

    from weaver.bench import checkpoint_id

    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    features = ["--data", "target", "--num-sequences", "8", "--regen-tokens", "8", "--regen-batch", "8",
                "--regen-temperatures", "1"]  # fmt: skip
    one = {"temperature": 1, "features_args": features, "train_args": ["--steps", "2"]}
    config = with_temperature_one(config, [one])
    config["datasets"] = {"mt_bench": 1}
    config["grids"][0]["datasets"] = ["mt_bench"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "results" / "smoke"
    cell = "results/smoke/raw/bench/smollm2-135m/mt_bench/weaver/b4-t{}/meta.json"
    targets = [cell.format(0), cell.format(1), "results/smoke/raw/depth/smollm2-135m.trees.csv"]
    run = snakemake(*targets, "--configfile", str(path), "--directory", str(tmp_path), timeout=600)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]

    settings = json.loads((run_dir / "adapter_features" / "smollm2-135m.t1" / "completions.settings.json").read_text())
    assert settings["regen_temperatures"] == [1.0], settings
    names = {0: "smollm2-135m", 1: "smollm2-135m.t1"}
    adapters = {t: str(run_dir / "adapters" / name / "adapter.pt") for t, name in names.items()}
    for temperature, adapter in adapters.items():
        meta = json.loads((tmp_path / cell.format(temperature)).read_text())
        assert meta["cell"]["adapter"] == os.path.relpath(adapter, tmp_path), meta["cell"]
        assert meta["checkpoints"]["adapter"] == checkpoint_id(adapter)
        assert meta["summary"]["n_records"] == 1
    with (run_dir / "raw" / "depth" / "smollm2-135m.trees.csv").open() as f:
        temperatures = {float(row["temperature"]) for row in csv.DictReader(f) if row["method"] == "weaver"}
    assert temperatures == {0.0, 1.0}
    log = (run_dir / "logs" / "eval_depth" / "smollm2-135m.log").read_text()
    for temperature, adapter in adapters.items():
        assert f"t={temperature}: adapter {os.path.relpath(adapter, tmp_path)}\n" in log, log


@pytest.mark.slow
def test_smoke_run_through_slurm(tmp_path: Path, slurm_cluster: None) -> None:
    """The smoke config via sbatch on a one-node cluster."""
    profile = str(ROOT / "profiles" / "slurm")
    config = str(ROOT / "config" / "smoke.yaml")
    # the profile sizes jobs for the paper's GPU nodes (64 GB); this one-node CI cluster has the machine's memory
    small = [f"{rule}:mem_mb=3000" for rule in ("train_drafter", "train_adapter", "bench_cell")]
    run = snakemake(
        "--profile", profile, "--set-resources", *small, "--configfile", config, "--directory", str(tmp_path),
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    assert_smoke_table1(tmp_path)


@pytest.mark.slow
def test_figures_through_slurm(tmp_path: Path, slurm_cluster: None) -> None:
    """The SLURM profile for real (sbatch on the one-node cluster), on the fixture logs."""
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    profile = str(ROOT / "profiles" / "slurm")
    run = snakemake("figures", "--profile", profile, "--configfile", str(FIXTURES / "config.yaml"), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    assert "submitted with SLURM jobid" in run.stdout + run.stderr
    assert (tmp_path / "figures" / "fixture" / "table1.md").exists()
