"""Muon with its Newton-Schulz iteration in a chosen dtype.

torch.optim.Muon (torch 2.13) orthogonalises every update in bfloat16. CPUs without bfloat16 matrix units compute
that slowly: on this project's 2-core EPYC one step over the CPU adapter's seven matrices took 2.9 s against 5 ms for
AdamW. `Muon` here is torch's optimizer (same hyper-parameters, same `momentum_buffer` state, so a state_dict written
by either loads in the other) whose step runs the iteration in `ns_dtype`: float32 on a CPU, bfloat16 on CUDA, unless
told otherwise.
"""

from __future__ import annotations

import argparse
import math
import time

import torch


def orthogonalize(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Approximate U V^T of update [R, C] = U S V^T: the quintic Newton-Schulz iteration X <- aX + (bA + cA^2) X,
    A = X X^T, on the wide orientation of X, after scaling X to spectral norm <= 1 (Frobenius norm 1)."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if tall else x).to(update.dtype)


def rms_matched_lr(lr: float, shape: torch.Size) -> float:
    """torch's adjust_lr_fn="match_rms_adamw": the orthogonal update scaled to AdamW's RMS (0.2 sqrt(max dim))."""
    return lr * 0.2 * math.sqrt(max(shape[0], shape[1]))


class Muon(torch.optim.Muon):
    """torch.optim.Muon (Nesterov momentum, orthogonalised update, decoupled weight decay, lr matched to AdamW's RMS)
    with the Newton-Schulz iteration in `ns_dtype` (default: bfloat16 for CUDA parameters, float32 otherwise)."""

    def __init__(self, params, *, ns_dtype: torch.dtype | None = None, **kwargs) -> None:
        if kwargs.setdefault("adjust_lr_fn", "match_rms_adamw") != "match_rms_adamw":
            raise ValueError("weaver.training.muon.Muon implements adjust_lr_fn='match_rms_adamw' only")
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                dtype = self.ns_dtype or (torch.bfloat16 if param.is_cuda else torch.float32)
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
                param.mul_(1 - lr * decay)
                param.add_(update, alpha=-rms_matched_lr(lr, param.shape))
        return loss


def bench(matrices: list[torch.Tensor], steps: int) -> dict[str, float]:
    """Milliseconds per optimizer step over `matrices` (random gradients), side by side in one process."""
    for matrix in matrices:
        matrix.grad = torch.randn_like(matrix) * 1e-3
    optimizers = {
        "torch.optim.Muon (bfloat16 iteration)": torch.optim.Muon(matrices, lr=1e-3, adjust_lr_fn="match_rms_adamw"),
        "weaver Muon (float32 iteration on CPU)": Muon(matrices, lr=1e-3),
        "AdamW": torch.optim.AdamW(matrices, lr=1e-3),
    }
    timings = {}
    for name, optimizer in optimizers.items():
        optimizer.step()  # warm-up, creates the state
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        timings[name] = (time.perf_counter() - start) / steps * 1e3
    return timings


def main(argv: list[str] | None = None) -> None:
    from weaver.adapter import Weaver
    from weaver.training.adapter import new_adapter

    parser = argparse.ArgumentParser(
        prog="python -m weaver.training.muon", description="Time one optimizer step over an adapter's matrices."
    )
    parser.add_argument("--adapter", default=None, help="adapter.pt (default: a fresh adapter of the CPU default)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per optimizer")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    adapter = Weaver.load(args.adapter) if args.adapter else new_adapter(576, 576, 256, 1, 4, 512, 512)
    matrices = [p.detach().clone().requires_grad_(True) for p in adapter.parameters() if p.ndim == 2]
    weights = sum(m.numel() for m in matrices)
    print(f"{len(matrices)} matrices, {weights} weights, torch threads {torch.get_num_threads()}")
    print("| optimizer | ms per step |\n|---|---|")
    for name, ms in bench(matrices, args.steps).items():
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
