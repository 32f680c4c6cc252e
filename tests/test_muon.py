"""weaver.training.muon.Muon against torch.optim.Muon: the same step in bfloat16, float32 close to it, shared state."""

from __future__ import annotations

import io

import pytest
import torch

from weaver.training.muon import Muon, orthogonalize

SHAPES = [(6, 10), (12, 5), (8, 8)]


def params_and_grads(seed: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=gen) for shape in SHAPES]
    grads = [[torch.randn(shape, generator=gen) for shape in SHAPES] for _ in range(3)]
    return params, grads


def run(optimizer_cls, params: list[torch.Tensor], grads: list[list[torch.Tensor]], **kwargs) -> list[torch.Tensor]:
    params = [p.clone().requires_grad_(True) for p in params]
    optimizer = optimizer_cls(params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw", **kwargs)
    for step in grads:
        for param, grad in zip(params, step, strict=True):
            param.grad = grad.clone()
        optimizer.step()
    return [p.detach() for p in params]


def test_bfloat16_iteration_is_torchs_muon() -> None:
    params, grads = params_and_grads(0)
    ours = run(Muon, params, grads, ns_dtype=torch.bfloat16)
    torchs = run(torch.optim.Muon, params, grads)
    for a, b, p in zip(ours, torchs, params, strict=True):
        assert not torch.equal(a, p)  # the steps moved the parameters
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_float32_iteration_is_close_to_bfloat16_and_orthogonalises() -> None:
    params, grads = params_and_grads(1)
    fp32 = run(Muon, params, grads)  # CPU parameters: float32 by default
    bf16 = run(torch.optim.Muon, params, grads)
    for a, b, p in zip(fp32, bf16, params, strict=True):
        assert (a - b).norm() < 0.05 * (b - p).norm()
    update = torch.randn(12, 5, generator=torch.Generator().manual_seed(2))
    singular = torch.linalg.svdvals(orthogonalize(update, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32))
    assert singular.min() > 0.5 and singular.max() < 1.5  # U S' V^T with S' near 1, as the quintic iteration gives


def test_state_dicts_load_across_torchs_and_ours() -> None:
    params, grads = params_and_grads(3)
    torchs_params = [p.clone().requires_grad_(True) for p in params]
    torchs = torch.optim.Muon(torchs_params, lr=0.02, adjust_lr_fn="match_rms_adamw")
    for param, grad in zip(torchs_params, grads[0], strict=True):
        param.grad = grad.clone()
    torchs.step()
    ours_params = [p.detach().clone().requires_grad_(True) for p in torchs_params]
    ours = Muon(ours_params, lr=0.02, adjust_lr_fn="match_rms_adamw", ns_dtype=torch.bfloat16)
    saved = io.BytesIO()  # through a file, as train_state.pt: a loaded state shares no tensor with torch's optimizer
    torch.save(torchs.state_dict(), saved)
    saved.seek(0)
    ours.load_state_dict(torch.load(saved))
    for optimizer, group in ((torchs, torchs_params), (ours, ours_params)):
        for param, grad in zip(group, grads[1], strict=True):
            param.grad = grad.clone()
        optimizer.step()
    for a, b in zip(ours_params, torchs_params, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)  # the momentum buffers carried over


def test_other_lr_adjustments_are_refused() -> None:
    with pytest.raises(ValueError, match="match_rms_adamw"):
        Muon([torch.zeros(2, 2, requires_grad=True)], lr=0.1, adjust_lr_fn="original")


def test_bench_times_every_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    from weaver.training.muon import main

    main(["--steps", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "7 matrices" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms per step" not in line]
    assert len(rows) == 3 and all(float(row.rsplit("|", 2)[1]) > 0 for row in rows)
