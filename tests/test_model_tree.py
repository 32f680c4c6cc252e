"""Tree verification through the target (METHOD.md 6-7): verify == each root-to-node path run as a plain chain, and
commit(path) then continuing == having decoded the path sequentially (logits, GDN states, conv windows, K/V)."""

from __future__ import annotations

import copy

import pytest
import torch

from weaver.models import GDNCache, KVCache
from weaver.tree import Tree

TOL = 1e-4
PROMPT_LEN = 9


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def random_tree(n: int, generator: torch.Generator) -> Tree:
    """n nodes, random topological parents, distinct sibling tokens (the vocabulary is 97)."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, n)]
    tokens = torch.randperm(97, generator=generator)[:n].tolist()
    return Tree.from_lists(tokens, parents)


def shaped_tree(shape: str) -> Tree:
    g = torch.Generator().manual_seed(1)
    if shape == "chain":
        return Tree.chain([5, 6, 7, 8, 9, 10, 11])
    if shape == "star":
        return Tree.from_lists([5, 6, 7, 8, 9, 10], [-1, 0, 0, 0, 0, 0])
    if shape == "root_only":
        return Tree.root_only(5)
    if shape == "depth1":
        return Tree.from_lists([5, 6], [-1, 0])
    return random_tree(13, g)


def prefilled(model, prompt: torch.Tensor, max_tree_nodes: int = 16):
    cache = model.new_cache(max_seq_len=40, max_tree_nodes=max_tree_nodes)
    model(prompt, cache=cache)
    return cache


@pytest.mark.parametrize("family", ("qwen3_next", "qwen3_5_text", "llama"))
@pytest.mark.parametrize("shape", ("chain", "star", "root_only", "depth1", "random"))
def test_verify_equals_each_path_as_a_chain(family, shape, tiny_pair):
    _, model = tiny_pair(family)
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    tree = shaped_tree(shape)
    with torch.no_grad():
        cache = prefilled(model, prompt)
        out = model.verify(tree, cache, hidden_layers=(1,))
        assert cache.seq_len == PROMPT_LEN  # verify commits nothing
        for node in range(tree.num_nodes):
            path = tree.path_to(node)
            ref = model(tree.tokens[path][None], cache=prefilled(model, prompt), hidden_layers=(1,))
            assert rel_err(out.logits[0, node], ref.logits[0, -1]) < TOL
            assert rel_err(out.hidden[0, node], ref.hidden[0, -1]) < TOL


def _states(cache) -> list[torch.Tensor]:
    """Everything that must match after commit: GDN states and conv windows, committed K/V slots."""
    out = []
    for layer in cache.layers:
        if isinstance(layer, GDNCache):
            out += [layer.state, layer.conv]
        else:
            assert isinstance(layer, KVCache)
            out += [layer.k[:, :, : cache.seq_len], layer.v[:, :, : cache.seq_len]]
    return out


@pytest.mark.parametrize("family", ("qwen3_next", "qwen3_5_text", "qwen3"))
@pytest.mark.parametrize("leaf", (0, 3, 8, 12))
def test_commit_then_continue_equals_sequential_decode(family, leaf, tiny_pair):
    _, model = tiny_pair(family)
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    tree = random_tree(13, torch.Generator().manual_seed(3))
    path = tree.path_to(leaf)
    nxt = torch.tensor([[3, 4, 50]])
    with torch.no_grad():
        cache = prefilled(model, prompt)
        model.verify(tree, cache)
        model.commit(cache, path)
        seq = prefilled(model, prompt)
        for tok in tree.tokens[path].tolist():  # token by token: the sequential truth
            model(torch.tensor([[tok]]), cache=seq)
        assert cache.seq_len == seq.seq_len == PROMPT_LEN + len(path)
        for ours, ref in zip(_states(cache), _states(seq), strict=True):
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
        assert rel_err(model(nxt, cache=cache).logits, model(nxt, cache=seq).logits) < TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (kernels/gpu_check.sh runs this on a GPU)")
@pytest.mark.parametrize("family", ("qwen3_next", "qwen3_5_text", "llama"))
def test_verify_and_commit_on_cuda_match_the_cpu_run(family, tiny_pair):
    """On CUDA the GDN layers verify and commit through the dispatched fast kernels (Triton); logits, committed states
    and the next step's logits equal the CPU run's (PyTorch references)."""
    _, model = tiny_pair(family)
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    tree = random_tree(13, torch.Generator().manual_seed(3))
    path = tree.path_to(8)
    runs = []
    with torch.no_grad():
        for m, device in ((model, "cpu"), (copy.deepcopy(model).cuda(), "cuda")):
            cache = prefilled(m, prompt.to(device))
            logits = m.verify(tree, cache).logits
            m.commit(cache, path)
            nxt = m(torch.tensor([[3, 4, 50]], device=device), cache=cache).logits
            runs.append([logits, *_states(cache), nxt])
    assert all(x.is_cuda for x in runs[1])
    for ours, ref in zip(runs[1], runs[0], strict=True):
        assert rel_err(ours.cpu(), ref) < TOL


@pytest.mark.parametrize("family", ("qwen3_next", "llama"))
def test_verify_through_the_tree_attention_kernel_equals_the_masked_sdpa(family, tiny_pair, monkeypatch):
    """With a fast kernel backend (the default on CUDA tensors; here Triton's interpreter on CPU tensors), a verify's
    attention layers run weaver_kernels.tree_attention instead of SDPA over a dense mask: same logits."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by resolve(); tests/conftest.py set it before triton loaded
    import weaver_kernels

    _, model = tiny_pair(family)
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    tree = random_tree(13, torch.Generator().manual_seed(3))
    calls = []
    kernel = weaver_kernels.tree_attention
    monkeypatch.setattr(weaver_kernels, "tree_attention", lambda *a: calls.append(a[0].shape) or kernel(*a))
    with torch.no_grad():
        masked = model.verify(tree, prefilled(model, prompt)).logits
        assert not calls  # auto on CPU tensors: the reference backend, i.e. SDPA with the tree mask
        cache = prefilled(model, prompt)
        with weaver_kernels.use_backend("triton"):
            fast = model.verify(tree, cache).logits
    n_attention = sum(isinstance(layer, KVCache) for layer in cache.layers)
    assert len(calls) == n_attention > 0 and calls[0][:2] == (1, tree.num_nodes)
    assert rel_err(fast, masked) < TOL


def test_repeated_verify_commit_steps_follow_the_sequence(tiny_pair):
    """Several verify/commit rounds (as the engine runs them) == one sequential decode of all accepted tokens."""
    _, model = tiny_pair("qwen3_next")
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    g = torch.Generator().manual_seed(5)
    accepted: list[int] = []
    with torch.no_grad():
        cache = prefilled(model, prompt)
        for _ in range(3):
            tree = random_tree(7, g)
            model.verify(tree, cache)
            path = tree.path_to(6)
            model.commit(cache, path)
            accepted += tree.tokens[path].tolist()
        seq = prefilled(model, prompt)
        model(torch.tensor([accepted]), cache=seq)
        nxt = torch.tensor([[1]])
        assert rel_err(model(nxt, cache=cache).logits, model(nxt, cache=seq).logits) < TOL


def test_verify_and_commit_refuse_bad_input(tiny_pair):
    _, model = tiny_pair("qwen3_next")
    prompt = torch.randint(0, 97, (1, PROMPT_LEN))
    tree = Tree.from_lists([5, 6, 7, 8], [-1, 0, 0, 1])
    with torch.no_grad():
        cache = prefilled(model, prompt, max_tree_nodes=4)
        with pytest.raises(RuntimeError, match="without a pending verify"):
            model.commit(cache, [0])
        with pytest.raises(ValueError, match="max_tree_nodes 4"):
            model.verify(random_tree(5, torch.Generator().manual_seed(0)), cache)
        with pytest.raises(ValueError, match="vocabulary"):
            model.verify(Tree.from_lists([5, 97], [-1, 0]), cache)
        model.verify(tree, cache)
        with pytest.raises(RuntimeError, match="uncommitted verify"):
            model(torch.tensor([[1]]), cache=cache)
        with pytest.raises(RuntimeError, match="uncommitted verify"):
            model.verify(tree, cache)
        for bad in ([1, 3], [0, 2, 3], [0, 3], []):
            with pytest.raises(ValueError, match="root-to-node path"):
                model.commit(cache, bad)
        cache.discard_pending()
        model.verify(tree, cache)
        model.commit(cache, [0, 1, 3])
        assert cache.seq_len == PROMPT_LEN + 3 and cache.pending is None


def test_commit_beyond_max_seq_len_is_refused(tiny_pair):
    _, model = tiny_pair("llama")
    cache = model.new_cache(max_seq_len=4, max_tree_nodes=4)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        model.verify(Tree.chain([4, 5, 6]), cache)
        with pytest.raises(ValueError, match="max_seq_len 4"):
            model.commit(cache, [0, 1])


def test_reset_gives_a_fresh_sequence(tiny_pair):
    _, model = tiny_pair("qwen3_5_text")
    ids = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        cache = model.new_cache(max_seq_len=16)
        first = model(ids, cache=cache).logits
        model(torch.tensor([[7]]), cache=cache)
        cache.reset()
        assert cache.seq_len == 0
        assert rel_err(model(ids, cache=cache).logits, first) < 1e-6
