"""The paper's kernel table: per-branch recurrent vs fused masked-solve GDN tree verify, microseconds per layer.

    python -m weaver_kernels.bench [--device cpu|cuda] [--n 16 32 64 128] [--out DIR]

On CPU both sides run their PyTorch paths (report the ratio); on CUDA they run the Triton kernels (and the CUDA C++
extension for the fused solve with `--backend cuda`, once `python -m weaver_kernels.build` has built it). CUDA timings:
`graph` replays one call captured in a CUDA graph (GPU time, as a serving engine runs verify under CUDA graphs);
`eager` times one Python call between CUDA events (launch overhead included). Batch 1; trees are random topological
trees of N nodes (node 0 = the first new token). Paper (B200, bf16, Qwen3.6-27B layout): N=128: 408.3 vs 57.3 us
(7.1x), METHOD.md section 7.

Layout `weaver-step` times one batched Weaver step (METHOD.md section 3: indexed attention of w = ceil(N / 16) nodes
per layer plus the pool scoring) at the paper's adapter width; its per_branch_us column is the PyTorch reference and
fused_us the dispatched path (the same reference on CPU, Triton on CUDA).

Layout `tree-attention` (not in the default list) times one attention layer of a tree verify at Qwen3-8B's width
over a committed prefix: per_branch_us is what the target runs without a fast backend (SDPA over the dense
[N, T + N] ancestor mask, `weaver.models.attention`), fused_us the dispatched `tree_attention` (Triton on CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import weaver_kernels as wk
from weaver_kernels.gdn_tree.naive import ancestor_masks

# name -> (H key heads, HV value heads, K, V)
LAYOUTS = {
    "qwen3.6-27b": (16, 48, 128, 128),
    "qwen3-next-80b": (16, 32, 128, 128),
    "small-hybrid": (4, 8, 64, 64),
}
# the adapter's step: (d_rank, heads, pool size K, depth D); the residual table has STEP_VOCAB rows (its size only
# matters for memory, each node gathers K of them)
WEAVER_STEP = {"weaver-step": (2048, 16, 512, 15)}
STEP_VOCAB = 8192
# one attention layer of a verify: (HQ query heads, HKV key/value heads, D, T committed prefix tokens)
TREE_ATTENTION = {"tree-attention": (32, 8, 128, 1024)}


@dataclass(frozen=True)
class Row:
    layout: str
    n: int
    device: str
    backend: str
    dtype: str
    timing: str
    per_branch_us: float
    fused_us: float
    speedup: float


def make_inputs(layout: str, n: int, device: torch.device, dtype: torch.dtype, seed: int) -> tuple:
    """Random single-sequence GDN inputs (q, k, v, g, beta, parents, initial_state) of one layer."""
    h, hv, dk, dv = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)])
    q = torch.nn.functional.normalize(torch.randn(n, h, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, h, dk, generator=gen), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(n, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(n, hv, generator=gen))
    s0 = torch.randn(hv, dk, dv, generator=gen)
    return tuple(x.to(device, dtype) for x in (q, k, v, g, beta)) + (parents.to(device), s0.to(device, dtype))


def make_step_inputs(n: int, device: torch.device, dtype: torch.dtype, seed: int) -> tuple[tuple, tuple]:
    """Random inputs of one Weaver step on a tree of n nodes: (attention args, scoring args), w = ceil(n / 16) nodes,
    each seeing the 1 + D context tokens and up to D + 1 node slots (a full-depth path)."""
    d_rank, heads, pool, depth = WEAVER_STEP["weaver-step"]
    gen = torch.Generator().manual_seed(seed)
    w, dh = -(-n // 16), d_rank // heads
    q = torch.randn(w, heads, dh, generator=gen)
    ctx_k, ctx_v = (torch.randn(1 + depth, heads, dh, generator=gen) for _ in range(2))
    node_k, node_v = (torch.randn(n, heads, dh, generator=gen) for _ in range(2))
    slots = torch.randint(0, n, (w, min(n, depth + 1)), generator=gen)
    query, table = torch.randn(w, d_rank, generator=gen), torch.randn(STEP_VOCAB, d_rank, generator=gen)
    ids, logits = torch.randint(0, STEP_VOCAB, (w, pool), generator=gen), torch.randn(w, pool, generator=gen)
    attention = tuple(x.to(device, dtype) for x in (q, ctx_k, ctx_v, node_k, node_v)) + (slots.to(device),)
    return attention, (query.to(device, dtype), table.to(device, dtype), ids.to(device), logits.to(device))


def make_attention_inputs(n: int, device: torch.device, dtype: torch.dtype, seed: int) -> tuple:
    """Random single-sequence tree-attention inputs (q, k, v, k_prefix, v_prefix, parents) of one layer."""
    hq, hkv, d, t = TREE_ATTENTION["tree-attention"]
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)])
    q = torch.randn(n, hq, d, generator=gen)
    k, v = (torch.randn(n, hkv, d, generator=gen) for _ in range(2))
    k_prefix, v_prefix = (torch.randn(t, hkv, d, generator=gen) for _ in range(2))
    return tuple(x.to(device, dtype) for x in (q, k, v, k_prefix, v_prefix)) + (parents.to(device),)


def masked_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The target's verify attention without a fast backend: SDPA over prefix + nodes under mask [N, T + N]."""
    keys, values = (torch.cat([p, x]).transpose(0, 1)[None] for p, x in ((k_prefix, k), (v_prefix, v)))
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys, values, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


TIMINGS = {"cpu": ("wall",), "cuda": ("graph", "eager")}


def time_us(fn: Callable[[], object], device: torch.device, repeats: int, timing: str = "wall") -> float:
    """Median time of one call of fn in microseconds, after one warm-up call (which also compiles Triton kernels).

    timing: "wall" (CPU, perf_counter), "eager" (CUDA events around a Python call) or "graph" (CUDA events around the
    replay of one call captured in a CUDA graph).
    """
    if timing not in TIMINGS[device.type]:
        raise ValueError(f"timing {timing!r} is not available on {device.type}; choose from {TIMINGS[device.type]}")
    fn()
    if timing == "wall":
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    run = fn
    if timing == "graph":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def resolved_backend(layout: str, device: torch.device, backend: str) -> str:
    """The implementation the timed fast path of `layout` runs under `backend` ("ref", "triton" or "cuda")."""
    op = "gdn_tree_verify"
    if layout in WEAVER_STEP:
        op = "weaver_step_attention"
    elif layout in TREE_ATTENTION:
        op = "tree_attention"
    with wk.use_backend(backend):
        return wk.resolve(op, device)


def measure_attention(n: int, device: torch.device, dtype: torch.dtype, backend: str, repeats: int, timing: str) -> Row:
    """One verify attention layer: SDPA over the dense ancestor mask vs the dispatched tree_attention."""
    args = make_attention_inputs(n, device, dtype, seed=n)
    _, ancestors_or_self = ancestor_masks(args[5])
    mask = torch.cat([torch.ones(n, args[3].shape[0], dtype=torch.bool, device=device), ancestors_or_self], dim=1)
    sdpa = time_us(lambda: masked_sdpa(*args[:5], mask), device, repeats, timing)
    with wk.use_backend(backend):
        fast = time_us(lambda: wk.tree_attention(*args), device, repeats, timing)
    used, dt = resolved_backend("tree-attention", device, backend), str(dtype).removeprefix("torch.")
    return Row(
        "tree-attention", n, device.type, used, dt, timing, round(sdpa, 1), round(fast, 1), round(sdpa / fast, 2)
    )


def measure_step(n: int, device: torch.device, dtype: torch.dtype, backend: str, repeats: int, timing: str) -> Row:
    """One Weaver step (attention of one layer + pool scoring): the reference vs the dispatched path."""
    attention, scores = make_step_inputs(n, device, dtype, seed=n)

    def step() -> None:
        wk.weaver_step_attention(*attention)
        wk.weaver_step_scores(*scores)

    with wk.use_backend("ref"):
        ref = time_us(step, device, repeats, timing)
    with wk.use_backend(backend):
        fast = time_us(step, device, repeats, timing)
    used, dt = resolved_backend("weaver-step", device, backend), str(dtype).removeprefix("torch.")
    return Row("weaver-step", n, device.type, used, dt, timing, round(ref, 1), round(fast, 1), round(ref / fast, 2))


def measure(
    layout: str, n: int, device: torch.device, dtype: torch.dtype, backend: str, repeats: int, timing: str = "wall"
) -> Row:
    """One cell of the table: per-branch recurrent vs fused masked solve (or the Weaver step) under one backend."""
    if layout in WEAVER_STEP:
        return measure_step(n, device, dtype, backend, repeats, timing)
    if layout in TREE_ATTENTION:
        return measure_attention(n, device, dtype, backend, repeats, timing)
    args = make_inputs(layout, n, device, dtype, seed=n)
    with wk.use_backend(backend):
        per_branch = time_us(lambda: wk.gdn_tree_verify_per_branch(*args), device, repeats, timing)
        fused = time_us(lambda: wk.gdn_tree_verify(*args), device, repeats, timing)
    used, dt = resolved_backend(layout, device, backend), str(dtype).removeprefix("torch.")
    return Row(
        layout, n, device.type, used, dt, timing, round(per_branch, 1), round(fused, 1), round(per_branch / fused, 2)
    )


def write(rows: list[Row], out: Path, hardware: str) -> None:
    """kernel_table.csv and kernel_table.json (rows + the machine) under out, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"hardware": hardware, "torch": torch.__version__, "rows": [asdict(r) for r in rows]}
    tmp = out / "kernel_table.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(out / "kernel_table.json")
    tmp = out / "kernel_table.csv.tmp"
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    tmp.replace(out / "kernel_table.csv")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=[*LAYOUTS, *WEAVER_STEP],
        choices=[*LAYOUTS, *WEAVER_STEP, *TREE_ATTENTION],
        help="GDN head layouts, weaver-step (the adapter's step at the paper's width) and tree-attention (a verify's"
        " attention layer: SDPA over the dense mask vs the tree_attention kernel; not in the default)",
    )
    parser.add_argument("--n", nargs="+", type=int, default=[16, 32, 64, 128], help="verify widths N (tree nodes)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on cuda, fp32 on cpu)")
    parser.add_argument(
        "--backend",
        nargs="+",
        default=["auto"],
        choices=["auto", "ref", "triton", "cuda"],
        help="kernel backends to time (one row each; a backend that resolves to an implementation already timed for the"
        " cell is skipped). cuda needs the extension built by python -m weaver_kernels.build",
    )
    parser.add_argument(
        "--timing",
        nargs="+",
        default=None,
        choices=["wall", "graph", "eager"],
        help="how to time: wall on cpu; graph (CUDA-graph replay) and/or eager (CUDA events) on cuda (default: all of"
        " the device's)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per cell (default 5 cpu, 50 cuda)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: leave as is)")
    parser.add_argument("--out", type=Path, default=None, help="folder for kernel_table.csv / .json (optional)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    timings = args.timing or list(TIMINGS[device.type])
    wrong = [t for t in timings if t not in TIMINGS[device.type]]
    if wrong:
        parser.error(
            f"--timing {' '.join(wrong)} is not available on {device.type}: use {' '.join(TIMINGS[device.type])}"
        )
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    repeats = args.repeats or (50 if device.type == "cuda" else 5)
    try:  # the implementations to time, each once per cell (a backend that cannot run here is refused up front)
        plan = [
            (layout, n, backend, timing)
            for layout in args.layouts
            for n in args.n
            for backend in dict.fromkeys(resolved_backend(layout, device, b) for b in args.backend)
            for timing in timings
        ]
    except RuntimeError as error:
        parser.error(str(error))
    print(f"{'layout':<16}{'N':>5}  {'backend':<8}{'timing':<7}{'per-branch us':>15}{'fused us':>12}{'speedup':>9}")
    rows, failed = [], []
    # the timed device is the current one (CUDA events, synchronize, graph capture and Triton all use it)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for layout, n, backend, timing in plan:
            try:
                row = measure(layout, n, device, dtype, backend, repeats, timing)
            except Exception as error:  # Triton's compile / resource errors are not RuntimeErrors
                # one broken cell (e.g. a path that cannot be captured in a CUDA graph) must not cost the rest of a
                # GPU session's table; it is named here and in the exit status
                failed.append(f"{layout} N={n} {backend} {timing}: {type(error).__name__}: {error}")
                print(f"{layout:<16}{n:>5}  {backend:<8}{timing:<7}FAILED: {error}", flush=True)
                continue
            rows.append(row)
            times = f"{row.per_branch_us:>15.1f}{row.fused_us:>12.1f}{row.speedup:>8.2f}x"
            print(f"{layout:<16}{n:>5}  {row.backend:<8}{timing:<7}{times}", flush=True)
        hardware = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    if args.out is not None and rows:
        write(rows, args.out, hardware)
        print(f"wrote {args.out / 'kernel_table.csv'} and kernel_table.json")
    if failed:
        print(f"{len(failed)} cell(s) failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
