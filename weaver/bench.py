"""One benchmark grid cell: (model, dataset, method, budget, temperature) -> records.jsonl + meta.json.

`python -m weaver.bench --model M --dataset D --method X --budget B --temperature T --n-prompts N
--max-new-tokens K --seed S [--drafter PATH] [--adapter PATH] --out DIR`

Each finished prompt is appended to DIR/records.jsonl as one JSON line and fsync'ed (Spec-Bench style: per-step
accept lengths and times), so an interrupted run resumes by skipping the prompt ids already there; a torn last line
is dropped. A record is reused only if it was made by the same configuration (CELL_KEYS) with the same checkpoints:
every record carries the fingerprints of the local target / drafter / adapter files it ran with (checkpoint_id), so a
retrained drafter or adapter reruns every prompt. Only an interrupted cell resumes: when every prompt already has a
reusable record, the cell had finished and is being run again (Snakemake reruns it after an input changed or on
--forcerun, a fresh clone rebuilding the committed results), so it is measured again from the first prompt. Earlier
records that are not reused are not lost: the old file is renamed to records.replaced-<UTC time>.jsonl first.
DIR/meta.json is written last, atomically (temp file + fsync + rename), and is the cell's completion marker:
Snakemake declares only meta.json as the output, so a partial records.jsonl is never taken as finished.

Before the timed prompts one untimed warm-up request (the first prompt, --warmup-tokens new tokens) pays for lazy
initialisation and allocator growth, which otherwise slow the first record (measured: 10.5 vs 19 tok/s on the CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from weaver.backends import BACKENDS
from weaver.paths import temperature_label

DRAFTER_METHODS = ("chain", "ddtree", "weaver", "weaver_chain")  # need a drafter checkpoint
ADAPTER_METHODS = ("weaver", "weaver_chain")  # need a Weaver adapter checkpoint too
PAPER_CHILDREN = 8  # the Weaver builder's fan-out in the paper and the authors' SGLang fork
PACKAGES = (
    "weaver-repro",
    "torch",
    "transformers",
    "numpy",
    "safetensors",
    "gguf",
    "triton",
    "snakemake",
    "aiohttp",
    "sglang",
)
# Fields that must match for an existing record to count as done for this cell (with the checkpoints' fingerprints).
CELL_KEYS = (
    "model",
    "dataset",
    "method",
    "budget",
    "temperature",
    "seed",
    "max_new_tokens",
    "mode",
    "backend",
    "children",
    "device",
)
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class CellConfig:
    """The resolved configuration of one grid cell (stored in meta.json)."""

    model: str  # registry name or local folder given to weaver.models.load_target
    model_name: str  # the name used in paths, records and legends
    dataset: str
    method: str
    budget: int
    temperature: float
    n_prompts: int
    max_new_tokens: int
    seed: int
    mode: str  # sampling verifier for temperature > 0
    drafter: str | None
    adapter: str | None
    out: str
    threads: int | None
    backend: str = "engine"  # weaver.backends.BACKENDS
    server_url: str | None = None  # backend "server": base URL of a running SGLang-protocol server
    port: int | None = None  # backend "sglang": loopback port of the launched server; None = a free one
    children: int = PAPER_CHILDREN  # weaver builders' fan-out (engine backend; the servers use their own)
    warmup_tokens: int = WARMUP_TOKENS  # untimed warm-up request before the prompts; 0 = none
    device: str = "cpu"  # backend "engine": where target, drafter and adapter run (a server picks its own)

    def key(self) -> dict[str, Any]:
        """The fields every record of this cell carries and resume checks (with `checkpoints()`)."""
        fields = asdict(self)
        fields["model"] = self.model_name
        fields["temperature"] = float(self.temperature)
        if self.method not in ADAPTER_METHODS:
            fields["children"] = None  # only the Weaver builders read the fan-out
        if self.backend != "engine":
            fields["device"] = None  # a server runs where it was launched
        else:
            from weaver.backends.engine import canonical_device  # (it imports this module)

            fields["device"] = canonical_device(self.device)
        return {k: fields[k] for k in CELL_KEYS}

    def checkpoints(self) -> dict[str, str | None]:
        """Fingerprints of the files this cell decodes with (checkpoint_id); None where the method reads none."""
        return {
            "target": checkpoint_id(self.model),
            "drafter": checkpoint_id(self.drafter) if self.method in DRAFTER_METHODS else None,
            "adapter": checkpoint_id(self.adapter) if self.method in ADAPTER_METHODS else None,
        }


def checkpoint_id(path: str | None) -> str | None:
    """A fingerprint of a local checkpoint (file, or the files at the top of a folder): sha256 of their names, sizes
    and modification times, so it changes whenever training or a build rewrites them (as Snakemake decides what is
    stale). A name that is not a local path (registry target, hub repo id) is its own fingerprint."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        return str(path)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file())
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "sha256:" + digest.hexdigest()[:16]


@dataclass(frozen=True)
class CellSummary:
    """What a finished cell reports in meta.json."""

    n_records: int
    n_resumed: int  # records reused from an earlier, interrupted run
    new_tokens: int
    steps: int
    wall_s: float


def check_cell(cell: CellConfig) -> None:
    """Refuse an inconsistent cell with a message that names the fix, before anything is loaded or overwritten."""
    from weaver.data import DATASETS
    from weaver.sources import check_method
    from weaver.verify import SAMPLING_MODES

    check_method(cell.method, "--method")
    if cell.dataset not in DATASETS:
        raise ValueError(f"unknown --dataset {cell.dataset!r}; choose from {', '.join(DATASETS.names())}")
    if not cell.temperature >= 0:  # also refuses NaN
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {cell.temperature}")
    if cell.mode not in SAMPLING_MODES:
        raise ValueError(f"--mode must be one of {', '.join(SAMPLING_MODES)}, got {cell.mode!r}")
    if cell.warmup_tokens < 0:
        raise ValueError(f"--warmup-tokens must be >= 0 (0 = no warm-up), got {cell.warmup_tokens}")
    if cell.port is not None and not 1 <= cell.port <= 65535:
        raise ValueError(f"--port must be a TCP port in 1..65535 (or omitted: a free one), got {cell.port}")
    if cell.budget < 0:
        raise ValueError(f"--budget must be >= 0, got {cell.budget}")
    if cell.method == "ar" and cell.budget != 0:
        raise ValueError(f"method 'ar' drafts nothing: use --budget 0, got {cell.budget}")
    if cell.method != "ar" and cell.budget == 0:
        raise ValueError(f"method {cell.method!r} needs a tree budget: give --budget > 0")
    if cell.n_prompts < 1 or cell.max_new_tokens < 1:
        raise ValueError("--n-prompts and --max-new-tokens must be >= 1")
    if cell.method in DRAFTER_METHODS and not cell.drafter:
        raise ValueError(f"method {cell.method!r} drafts with a drafter: give --drafter CHECKPOINT_DIR")
    if cell.method in ADAPTER_METHODS and not cell.adapter:
        raise ValueError(f"method {cell.method!r} uses the Weaver adapter: give --adapter CHECKPOINT")
    if cell.children < 1:
        raise ValueError(f"--children must be >= 1, got {cell.children}")
    if cell.children != PAPER_CHILDREN and cell.backend == "sglang":
        raise ValueError(
            f"--children {cell.children}: the authors' SGLang fork builds Weaver trees with a fan-out of "
            f"{PAPER_CHILDREN}; other fan-outs run on --backend engine (or server, checked against the server's)"
        )
    if cell.backend == "engine":
        from weaver.backends.engine import check_device

        check_device(cell.device)
    elif cell.device != "cpu":
        raise ValueError(f"--device {cell.device}: only --backend engine runs in this process; a server picks its own")
    if cell.backend == "server" and not cell.server_url:
        raise ValueError("--backend server needs --server-url http://HOST:PORT (a running SGLang-protocol server)")


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of an earlier run; a torn last line (killed mid-write) is dropped, any other bad line is an error."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1} is not valid JSON; delete the file to rerun the cell") from None
    return records


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def set_aside(path: Path) -> Path:
    """Rename `path` (DIR/records.jsonl) to a free DIR/records.replaced-<UTC time>[-n].jsonl and return the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        aside = path.with_name(f"{path.stem}.replaced-{stamp}{f'-{n}' if n else ''}{path.suffix}")
        if not aside.exists():
            os.replace(path, aside)
            return aside
    raise FileExistsError(f"{path}: 1000 records.replaced-{stamp}*.jsonl files already exist; remove old ones")


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync it, so a finished prompt survives a crash right after."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_record(key: dict[str, Any], prompt_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    """One JSONL record (DESIGN.md "Engine stats and result records") from GenerationStats.to_dict() and the cell's
    identity (`cell_identity`). tree_sizes, expected_accept_lengths and tau_expected are None where the backend
    cannot know them (an HTTP server)."""
    return {
        "prompt_id": prompt_id,
        **key,
        "prompt_tokens": stats["prompt_tokens"],
        "new_tokens": stats["new_tokens"],
        "steps": stats["steps"],
        "tau": stats["tau"],
        "accept_lengths": stats["accept_lengths"],
        "expected_accept_lengths": stats.get("expected_accept_lengths"),
        "tau_expected": stats.get("tau_expected"),
        "tree_sizes": stats.get("tree_sizes"),
        "ttft_s": stats["ttft_s"],
        "wall_s": stats["wall_s"],
        "draft_s": stats["draft_s"],
        "tree_s": stats["tree_s"],
        "verify_s": stats["verify_s"],
        "tokens_per_s": stats["tokens_per_s"],
        "hit_eos": stats.get("hit_eos", False),
    }


def cell_identity(cell: CellConfig) -> dict[str, Any]:
    """What a record must carry to count as done for `cell`: its CELL_KEYS and the checkpoints' fingerprints."""
    return {**cell.key(), "checkpoints": cell.checkpoints()}


def run_prompts(
    cell: CellConfig,
    prompts: Sequence[tuple[str, list[int]]],
    run_one: Callable[..., dict[str, Any]],
    backend_info: dict[str, Any] | None = None,
) -> CellSummary:
    """Run `run_one` (prompt ids -> GenerationStats dict) on every prompt not yet in records.jsonl, then meta.json.

    Earlier records resume only an interrupted run: those of another configuration or checkpoint, or of prompts no
    longer asked for, are not reused, and neither is a complete set (a finished cell run again is measured again).
    Whenever earlier records are not all reused, the old file is first renamed (`set_aside`), so the finished file
    holds exactly this cell's prompts and nothing is lost. When a prompt is left to run and
    `cell.warmup_tokens` > 0, `run_one(ids, max_new_tokens=cell.warmup_tokens)` runs once first, untimed and not
    recorded. `backend_info` (what the backend reports about itself, e.g. a server's identity) goes into meta.json.
    """
    out = Path(cell.out)
    out.mkdir(parents=True, exist_ok=True)
    meta, records_path = out / "meta.json", out / "records.jsonl"
    identity = cell_identity(cell)
    meta.unlink(missing_ok=True)  # from here on the cell is unfinished
    wanted = {pid for pid, _ in prompts}
    previous = read_records(records_path)
    kept = [r for r in previous if r["prompt_id"] in wanted and _matches(r, identity)]
    kept = list({r["prompt_id"]: r for r in kept}.values())
    done = {r["prompt_id"] for r in kept}
    if done == wanted:
        kept, done = [], set()  # a finished cell run again: measure it again
    if len(kept) < len(previous):
        aside = set_aside(records_path)
        print(f"{cell.out}: kept {len(previous)} earlier records as {aside.name}; {len(kept)} resumed", file=sys.stderr)
    write_atomic(records_path, "".join(json.dumps(r) + "\n" for r in kept))
    todo = [(i, pid, ids) for i, (pid, ids) in enumerate(prompts) if pid not in done]
    if todo and cell.warmup_tokens:
        run_one(todo[0][2], max_new_tokens=cell.warmup_tokens)
    records = list(kept)
    for i, prompt_id, ids in todo:
        record = make_record(identity, prompt_id, run_one(ids))
        append_record(records_path, record)
        records.append(record)
        print(
            f"[{cell.method} b{cell.budget} t{temperature_label(cell.temperature)}] {cell.dataset} "
            f"{i + 1}/{len(prompts)}: tau {record['tau']:.2f}, {record['tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    summary = CellSummary(
        n_records=len(records),
        n_resumed=len(kept),
        new_tokens=sum(r["new_tokens"] for r in records),
        steps=sum(r["steps"] for r in records),
        wall_s=sum(r["wall_s"] for r in records),
    )
    meta_obj = {
        "cell": asdict(cell),
        "checkpoints": identity["checkpoints"],
        "summary": asdict(summary),
        "backend_info": backend_info,
        **environment(),
    }
    write_atomic(meta, json.dumps(meta_obj, indent=2) + "\n")
    return summary


def _matches(record: dict[str, Any], identity: dict[str, Any]) -> bool:
    if "device" not in record and record.get("backend") == "engine":
        record = {**record, "device": "cpu"}  # engine records written before the device key ran on the CPU
    return all(record.get(k) == v for k, v in identity.items())


def environment() -> dict[str, Any]:
    """Provenance for meta.json: git sha + dirty flag, package versions, hardware."""
    return {"git": _git_state(), "packages": _package_versions(), "hardware": hardware(), "created": time.time()}


def _git_state() -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return {"sha": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"sha": None, "dirty": None}


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict[str, Any]:
    """The machine a run ran on (meta.json's "hardware"; the trainers print it at the top of their logs)."""
    import torch

    cpu = platform.processor() or None
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # the SIMD kernels torch dispatches to (e.g. AVX2, AVX512): float results, and so trained weights, can differ
        # between hosts that differ here even with equal packages and seeds
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": gpu,
        "machine": platform.machine(),
        "host": platform.node(),
    }


def parse_args(argv: Sequence[str] | None = None) -> CellConfig:
    from weaver.verify import SAMPLING_MODES

    p = argparse.ArgumentParser(prog="python -m weaver.bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="target: a registry name or a local Hugging Face folder")
    p.add_argument("--model-name", default=None, help="name in records and paths (default: basename of --model)")
    p.add_argument("--dataset", required=True, help="dataset registry name (weaver.data.DATASETS)")
    p.add_argument("--method", required=True, help="ar or a tree source name (weaver.sources)")
    p.add_argument("--budget", type=int, required=True, help="drafted tree nodes per step; 0 for ar")
    p.add_argument("--temperature", type=float, required=True, help="sampling temperature; 0 = greedy")
    p.add_argument("--n-prompts", type=int, required=True, help="prompts drawn from the dataset with --seed")
    p.add_argument("--max-new-tokens", type=int, required=True, help="upper bound on generated tokens per prompt")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt draw and of the sampling generator")
    p.add_argument("--mode", default="target_only", choices=SAMPLING_MODES, help="verifier at T > 0")
    p.add_argument("--drafter", default=None, help="drafter checkpoint folder (chain, ddtree, weaver, weaver_chain)")
    p.add_argument("--adapter", default=None, help="Weaver adapter checkpoint file (weaver, weaver_chain)")
    p.add_argument(
        "--children",
        type=int,
        default=PAPER_CHILDREN,
        help=f"weaver builders' fan-out per expanded node (paper and SGLang fork: {PAPER_CHILDREN})",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, help="cell folder: records.jsonl and meta.json are written there")
    p.add_argument("--backend", default="engine", choices=BACKENDS, help="engine (in process), server, or sglang")
    p.add_argument("--server-url", default=None, help="backend server: base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="backend sglang: loopback port of the launched server (default: a free one; a busy port is refused)",
    )
    p.add_argument(
        "--warmup-tokens",
        type=int,
        default=WARMUP_TOKENS,
        help="new tokens of the untimed warm-up request on the first prompt (0 = none)",
    )
    p.add_argument(
        "--device", default="cpu", help="backend engine: where the models run, cpu, cuda or cuda:N (default cpu)"
    )
    a = p.parse_args(argv)
    cell = CellConfig(
        model=a.model,
        model_name=a.model_name or Path(a.model.rstrip("/")).name,
        dataset=a.dataset,
        method=a.method,
        budget=a.budget,
        temperature=a.temperature,
        n_prompts=a.n_prompts,
        max_new_tokens=a.max_new_tokens,
        seed=a.seed,
        mode=a.mode,
        drafter=a.drafter,
        adapter=a.adapter,
        out=a.out,
        threads=a.threads,
        backend=a.backend,
        server_url=a.server_url,
        port=a.port,
        children=a.children,
        warmup_tokens=a.warmup_tokens,
        device=a.device,
    )
    check_cell(cell)
    return cell


def make_backend(cell: CellConfig, model: Any = None, tokenizer: Any = None):
    """The cell's backend (weaver.backends), not yet entered; `model`/`tokenizer` are reused by the engine.

    The HTTP backends check on entry that the server runs the cell's configuration (ServerClient.identify).
    """
    from weaver.backends.http import ServerClient, ServerExpectation, ServerProcess, free_port

    sampling = {"temperature": cell.temperature, "max_new_tokens": cell.max_new_tokens, "seed": cell.seed}
    if cell.backend == "engine":
        from weaver.backends.engine import Engine, EngineBackend, EngineConfig

        return EngineBackend(Engine(EngineConfig.of(cell), model, tokenizer), **sampling)
    expect = ServerExpectation(cell.model, cell.method, cell.budget, cell.mode, cell.children)
    if cell.backend == "server":
        return ServerClient(cell.server_url, method=cell.method, expect=expect, **sampling)
    from weaver.backends.sglang import SglangLaunch, check_sglang_build, sglang_command

    port = cell.port if cell.port is not None else free_port()
    launch = SglangLaunch(cell.model, cell.method, port, cell.budget, cell.drafter, cell.adapter, cell.mode)
    command = sglang_command(launch)  # refuses what SGLang cannot run
    check_sglang_build(launch)  # ddtree: the installed SGLang must offer the fork's DDTree proposal
    url = f"http://{launch.host}:{launch.port}"
    client = ServerClient(url, method=cell.method, expect=expect, **sampling)
    return _LaunchedServer(ServerProcess(command, url), client)


class _LaunchedServer:
    """A launched server and its client as one backend: the server is stopped on exit, also after a failure."""

    name = "sglang"

    def __init__(self, process: Any, client: Any) -> None:
        self.process, self.client = process, client

    def __enter__(self) -> _LaunchedServer:
        self.process.__enter__()
        try:
            self.client.__enter__()  # the launched server must be the one answering, with the cell's configuration
        except BaseException:
            self.process.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.__exit__(*exc)

    @property
    def info(self) -> dict[str, Any]:
        return {"command": self.process.command, "server_info": self.client.info}

    def run(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> dict[str, Any]:
        try:
            return self.client.run(prompt_ids, max_new_tokens)
        except Exception:
            self.process.check_alive()  # a dead server is the better error message
            raise


def _tokenizer(model: str) -> Any:
    """The tokenizer of a registry target or local folder, else of a Hugging Face repo id (SGLang targets)."""
    from transformers import AutoTokenizer

    from weaver.models import resolve_target
    from weaver.models.loading import load_tokenizer

    try:
        return load_tokenizer(resolve_target(model))
    except (KeyError, FileNotFoundError, ValueError):
        return AutoTokenizer.from_pretrained(model)


def main(argv: Sequence[str] | None = None) -> int:
    cell = parse_args(argv)
    import torch

    from weaver.data import format_prompt, load_prompts

    if cell.threads:
        torch.set_num_threads(cell.threads)
    if cell.backend == "engine":
        from weaver.models import load_target

        model, tokenizer = load_target(cell.model)
    else:  # the server owns the model; only the tokenizer is needed here
        model, tokenizer = None, _tokenizer(cell.model)
    drawn = load_prompts(cell.dataset, n=cell.n_prompts, seed=cell.seed)  # the same draw for every method
    prompts = [(p.prompt_id, format_prompt(tokenizer, p)) for p in drawn]
    with make_backend(cell, model, tokenizer) as backend:
        summary = run_prompts(cell, prompts, backend.run, backend_info=getattr(backend, "info", None))
    print(f"{cell.out}: {summary.n_records} records ({summary.n_resumed} resumed)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
