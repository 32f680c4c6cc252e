"""Tree shapes and random GDN inputs shared by the kernel tests."""

from __future__ import annotations

import torch

SHAPES = ("chain", "star", "depth1", "binary", "random")


def make_parents(shape: str, n: int, generator: torch.Generator) -> torch.Tensor:
    """[n] int64 parents in topological order, parents[0] = -1.

    chain: a single path; star: every node a child of node 0; depth1: node 0 plus one child (n = 2 unless n = 1);
    binary: a full binary tree in breadth-first order; random: each node picks a uniformly random earlier parent.
    """
    if shape == "chain":
        parents = list(range(-1, n - 1))
    elif shape == "star":
        parents = [-1] + [0] * (n - 1)
    elif shape == "depth1":
        parents = [-1, 0][: min(n, 2)]
    elif shape == "binary":
        parents = [-1] + [(i - 1) // 2 for i in range(1, n)]
    elif shape == "random":
        parents = [-1] + [int(torch.randint(0, i, (), generator=generator)) for i in range(1, n)]
    else:
        raise ValueError(f"unknown tree shape {shape!r}; choose from {SHAPES}")
    return torch.tensor(parents, dtype=torch.long)


def gdn_inputs(
    n: int, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random GDN layer inputs as the model produces them (METHOD.md section 7).

    q, k [n, h, dk] L2-normalised, q scaled by dk^-1/2; v [n, hv, dv]; g [n, hv] = -exp(A_log) softplus(.) <= 0;
    beta [n, hv] = sigmoid(.); initial_state [hv, dk, dv].
    """

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q = torch.nn.functional.normalize(randn(n, h, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(randn(n, h, dk), dim=-1)
    g = -torch.nn.functional.softplus(randn(n, hv)) * randn(hv).exp()
    out = dict(q=q, k=k, v=randn(n, hv, dv), g=g, beta=torch.sigmoid(randn(n, hv)), initial_state=randn(hv, dk, dv))
    return {name: x.to(dtype) for name, x in out.items()}


def path_of(parents: torch.Tensor, node: int) -> list[int]:
    """Node indices root..node, walked independently of the code under test."""
    path = [node]
    while int(parents[path[-1]]) >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, name: str = "") -> None:
    """Relative RMS error check (flash-linear-attention style), NaN-intolerant."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    err = (actual.double() - expected.double()).pow(2).mean().sqrt()
    scale = expected.double().pow(2).mean().sqrt().clamp_min(1e-30)
    assert err <= rtol * scale, f"{name}: relative RMS error {float(err / scale):.3e} > {rtol:.1e}"
