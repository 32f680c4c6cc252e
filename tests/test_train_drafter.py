"""Drafter training: anchors and packing, feature cache (atomic, resumable), losses, optimisation, CLI."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from weaver import train as train_cli
from weaver.drafter import DrafterConfig, load_drafter
from weaver.models import from_hf_model
from weaver.training.drafter import (
    DrafterTrainConfig,
    add_arguments,
    batch_loss,
    block_hidden,
    init_drafter,
    pack_blocks,
    sample_anchors,
    train_drafter,
)
from weaver.training.features import (
    FeatureSpec,
    FeatureStore,
    TrainingSequence,
    compute_features,
    interleave_full_batches,
    read_token_jsonl,
    regenerate,
    write_token_jsonl,
)
from weaver.training.losses import argmax_cross_entropy, position_decay, sparse_kl

V, D_MODEL, N_LAYERS = 64, 32, 6


def tiny_hf_target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=D_MODEL,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,  # peaked target distributions, so that a drafter has something to learn
    )
    return LlamaForCausalLM(cfg).eval()


class CountingTarget(nn.Module):
    """Our Transformer (weaver.models) of a tiny random Llama, counting its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.model = from_hf_model(tiny_hf_target())
        self.config, self.embed_tokens, self.lm_head = self.model.config, self.model.embed_tokens, self.model.lm_head
        self.calls = 0

    def forward(self, input_ids, cache=None, hidden_layers=()):
        self.calls += 1
        return self.model(input_ids, cache=cache, hidden_layers=hidden_layers)


def drafter_config() -> DrafterConfig:
    return DrafterConfig(
        block_size=4,
        target_layer_ids=(1, 3),
        mask_token_id=V - 1,
        num_target_layers=N_LAYERS,
        hidden_size=D_MODEL,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=V,
        rope_theta=10_000.0,
    )


def sequences(n: int, seed: int = 0) -> list[TrainingSequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 12 + 3 * (i % 4)
        out.append(TrainingSequence(tuple(torch.randint(0, V - 1, (length,), generator=g).tolist()), prompt_len=4))
    return out


@pytest.fixture(scope="module")
def target() -> CountingTarget:
    return CountingTarget().requires_grad_(False)


@pytest.fixture
def store(tmp_path, target) -> FeatureStore:
    spec = FeatureSpec("stand-in", drafter_config().hidden_layers, top_k=8, shard_size=3)
    return compute_features(target, sequences(7), tmp_path / "features", spec, log=lambda _: None)


# ---------------------------------------------------------------- anchors and block packing


def test_anchors_stay_in_the_completion_and_leave_a_target():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = sample_anchors(prompt_len=5, seq_len=12, n=6, generator=g)
        assert a.numel() == 6 and a.unique().numel() == 6 and torch.equal(a, a.sort().values)
        assert a.min() >= 4 and a.max() <= 10
    assert sample_anchors(prompt_len=11, seq_len=11, n=3, generator=g).numel() == 0


def test_pack_blocks_masks_targets_and_validity():
    cfg = drafter_config()
    ids = torch.arange(10)
    packed = pack_blocks(torch.tensor([2, 8]), 10, cfg, ids)
    assert packed["block_ids"].tolist() == [2, V - 1, V - 1, V - 1, 8, V - 1, V - 1, V - 1]
    assert packed["positions"].tolist() == [2, 3, 4, 5, 8, 9, 10, 11]
    mask = packed["mask"]
    assert mask[0, :10].tolist() == [True, True] + [False] * 8  # anchor 2 sees context positions 0, 1
    assert mask[5, :10].sum() == 8 and mask[5, 10:].tolist() == [False] * 4 + [True] * 4
    assert packed["targets"].tolist() == [[3, 4, 5], [9, 9, 9]]
    assert packed["valid"].tolist() == [[True, True, True], [True, False, False]]


# ---------------------------------------------------------------- losses


def test_position_decay_and_losses():
    w = position_decay(4, gamma=2.0)
    torch.testing.assert_close(w, torch.exp(-torch.arange(4.0) / 2))
    target_ids = torch.tensor([[3, 1]])
    target_logprobs = torch.log(torch.tensor([[0.75, 0.25]]))
    exact = torch.full((1, 6), -1e9)
    exact[0, 3], exact[0, 1] = math.log(0.75), math.log(0.25)
    assert sparse_kl(exact, target_ids, target_logprobs).item() == pytest.approx(0.0, abs=1e-5)
    assert sparse_kl(torch.zeros(1, 6), target_ids, target_logprobs).item() > 0.1
    assert argmax_cross_entropy(exact, target_ids).item() == pytest.approx(-math.log(0.75), abs=1e-5)


# ---------------------------------------------------------------- feature cache


def test_features_hold_target_hidden_and_top_logprobs(store, target):
    assert len(store) == 7 and len(store.shards) == 3
    ex = next(store.iterate())
    ids = ex["ids"]
    out = target(ids[None], hidden_layers=store.hidden_layers)
    torch.testing.assert_close(ex["hidden"].float(), out.hidden[0], rtol=1e-2, atol=1e-2)
    logprobs = torch.log_softmax(out.logits[0], dim=-1)
    assert torch.equal(ex["top_ids"][:, 0].long(), logprobs.argmax(-1))
    torch.testing.assert_close(ex["top_logprobs"], logprobs.gather(-1, ex["top_ids"].long()))


def test_feature_cache_resumes_missing_shards_only(tmp_path, target):
    spec = FeatureSpec("stand-in", drafter_config().hidden_layers, top_k=8, shard_size=3)
    data = sequences(7)
    compute_features(target, data, tmp_path / "f", spec, log=lambda _: None)
    (tmp_path / "f" / "shard_00001.pt").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        FeatureStore(tmp_path / "f")
    before = target.calls
    store = compute_features(target, data, tmp_path / "f", spec, log=lambda _: None)
    assert target.calls - before == 3  # only the 3 sequences of the missing shard
    assert [ex["ids"].tolist() for ex in store.iterate()] == [list(s.ids) for s in data]
    assert not [p for p in (tmp_path / "f").iterdir() if p.name.startswith(".")]  # no temp files left
    with pytest.raises(ValueError, match="another target"):
        compute_features(target, sequences(7, seed=1), tmp_path / "f", spec)


def test_feature_workers_split_the_shards_of_one_folder(tmp_path, target):
    spec = FeatureSpec("stand-in", drafter_config().hidden_layers, top_k=8, shard_size=2)
    data = sequences(7)  # 4 shards
    single = compute_features(target, data, tmp_path / "one", spec, log=lambda _: None)
    before = target.calls
    assert compute_features(target, data, tmp_path / "two", spec, log=lambda _: None, worker=1, workers=2) is None
    assert target.calls - before == 3  # shards 1 and 3: sequences 2, 3 and 6
    assert sorted(p.name for p in (tmp_path / "two").glob("shard_*")) == ["shard_00001.pt", "shard_00003.pt"]
    store = compute_features(target, data, tmp_path / "two", spec, log=lambda _: None, worker=0, workers=2)
    assert target.calls - before == 7 and store is not None
    assert store.meta == single.meta
    for a, b in zip(store.iterate(), single.iterate(), strict=True):
        assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["top_ids"], b["top_ids"])
    with pytest.raises(ValueError, match="0 <= --worker < --workers"):
        compute_features(target, data, tmp_path / "three", spec, worker=2, workers=2)


def test_read_token_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"ids": [1, 2, 3], "prompt_len": 1}) + "\n" + json.dumps([4, 5]) + "\n")
    assert read_token_jsonl(path) == [TrainingSequence((1, 2, 3), 1), TrainingSequence((4, 5), 0)]
    path.write_text('{"text": "hello"}\n')
    with pytest.raises(ValueError, match="token ids"):
        read_token_jsonl(path)


def test_regenerate_greedy_equals_full_recompute_and_stops_at_eos(tmp_path):
    """Batched cached decoding of equal-length prompts == argmax of a fresh full pass per token, per prompt."""
    model = from_hf_model(tiny_hf_target())
    prompts = [[5, 6, 7], [9, 3, 2], [4, 4, 4, 4], [8, 1, 2]]
    progress: list[str] = []
    got = regenerate(model, prompts, 6, temperatures=[0.0], eos_id=None, batch_size=2, log=progress.append)
    assert progress == [f"regenerate: batch {i}/3 ({n} completions)" for i, n in ((1, 2), (2, 3), (3, 4))]
    assert sorted(s.ids[: s.prompt_len] for s in got) == sorted(tuple(p) for p in prompts)
    for seq in got:
        ids = list(seq.ids[: seq.prompt_len])
        for _ in range(6):
            with torch.no_grad():
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert list(seq.ids) == ids
    eos = got[0].ids[got[0].prompt_len + 1]
    cut = regenerate(model, [list(got[0].ids[: got[0].prompt_len])], 6, [0.0], eos_id=eos)
    assert cut[0].ids == got[0].ids[: got[0].ids.index(eos, got[0].prompt_len) + 1]
    sampled = regenerate(model, prompts, 6, [1.0], eos_id=None, seed=1)
    assert sampled == regenerate(model, prompts, 6, [1.0], eos_id=None, seed=1)
    write_token_jsonl(tmp_path / "c.jsonl", got)
    assert read_token_jsonl(tmp_path / "c.jsonl") == got


def test_regeneration_prompts_come_in_full_equal_length_batches_of_diverse_lengths():
    by_len = {3: [[3, i] for i in range(5)], 5: [[5, i] for i in range(2)], 4: [[4, i] for i in range(3)]}
    order = interleave_full_batches(by_len, batch=2)
    assert sorted(map(tuple, order)) == sorted(tuple(ids) for group in by_len.values() for ids in group)
    assert [ids[0] for ids in order] == [3, 3, 4, 4, 5, 5, 3, 3, 3, 4]  # one batch per length, then the next round


# ---------------------------------------------------------------- optimisation


def test_a_few_steps_reduce_the_loss_on_a_fixed_batch(store, target):
    drafter = init_drafter(drafter_config(), seed=0)
    ex = next(store.iterate())
    anchors = torch.tensor([3, 5, 7, 9])
    train = DrafterTrainConfig(gamma=4.0)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = batch_loss(drafter, target.embed_tokens, target.lm_head, [(ex, anchors)], train)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is None for p in target.parameters())  # the target stays frozen


def test_batch_loss_is_the_mean_of_the_per_example_losses(store, target):
    """One LM head pass over all examples' rows == the mean of the examples' own position-weighted losses."""
    drafter = init_drafter(drafter_config(), seed=0)
    examples = store.iterate()
    batch = [(next(examples), torch.tensor([3, 5, 7])), (next(examples), torch.tensor([2, 4]))]
    for loss in ("kl", "ce"):
        train = DrafterTrainConfig(gamma=4.0, loss=loss)
        alone = [batch_loss(drafter, target.embed_tokens, target.lm_head, [pair], train) for pair in batch]
        together = batch_loss(drafter, target.embed_tokens, target.lm_head, batch, train)
        assert abs(alone[0].item() - alone[1].item()) > 1e-3  # two different losses, so the mean is a real check
        assert torch.allclose(together, (alone[0] + alone[1]) / 2, rtol=1e-5)


def test_train_drafter_checkpoints_and_resumes(tmp_path, store, target):
    train = DrafterTrainConfig(steps=4, save_every=2, seqs_per_step=2, anchors_per_seq=4, warmup_steps=1)
    messages: list[str] = []
    first = init_drafter(drafter_config(), seed=0)
    stats = train_drafter(first, store, target.embed_tokens, target.lm_head, train, tmp_path, log=messages.append)
    assert stats.steps == 4 and (tmp_path / "train_state.pt").exists()
    longer = DrafterTrainConfig(steps=6, save_every=2, seqs_per_step=2, anchors_per_seq=4, warmup_steps=1)
    resumed = init_drafter(drafter_config(), seed=1)
    stats = train_drafter(resumed, store, target.embed_tokens, target.lm_head, longer, tmp_path, log=messages.append)
    assert stats.steps == 2 and any("resumed" in m and "step 4" in m for m in messages)
    assert torch.load(tmp_path / "train_state.pt", weights_only=False)["step"] == 6
    other_lr = DrafterTrainConfig(steps=6, save_every=2, seqs_per_step=2, anchors_per_seq=4, warmup_steps=1, lr=1e-3)
    with pytest.raises(ValueError, match=r"lr: 0.0006 -> 0.001"):
        train_drafter(
            init_drafter(drafter_config(), seed=1), store, target.embed_tokens, target.lm_head, other_lr, tmp_path
        )
    stats = train_drafter(
        init_drafter(drafter_config(), seed=1),
        store,
        target.embed_tokens,
        target.lm_head,
        other_lr,
        tmp_path,
        log=messages.append,
        restart_if_changed=True,
    )
    assert stats.steps == 6 and len(list(tmp_path.glob("train_state.stale-*.pt"))) == 1


def test_train_drafter_refuses_a_state_of_another_target(tmp_path, store, target):
    """The same recipe against another target (here its LM head changed) must not resume the old drafter."""
    train = DrafterTrainConfig(steps=2, save_every=2, seqs_per_step=2, anchors_per_seq=4, warmup_steps=1)
    train_drafter(init_drafter(drafter_config(), seed=0), store, target.embed_tokens, target.lm_head, train, tmp_path)
    weight = next(target.lm_head.parameters())
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.01)
        with pytest.raises(ValueError, match="input target_embed_head"):
            train_drafter(
                init_drafter(drafter_config(), seed=0), store, target.embed_tokens, target.lm_head, train, tmp_path
            )
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    messages: list[str] = []
    stats = train_drafter(
        init_drafter(drafter_config(), seed=0), store, target.embed_tokens, target.lm_head, train, tmp_path,
        log=messages.append,
    )  # fmt: skip
    assert stats.steps == 0 and any("resumed" in m for m in messages)  # same inputs: resumes at the end


def test_training_blocks_match_inference_drafts(store, target):
    """A block as trained (cached features, masked pack) equals the block drafted at inference (prefill + cache)."""
    drafter = init_drafter(drafter_config(), seed=2)
    randomize_norms(drafter)
    ex = next(store.iterate())
    anchors = torch.tensor([4, 9])
    packed_hidden, _ = block_hidden(drafter, target.embed_tokens, ex, anchors)
    for j, a in enumerate(anchors.tolist()):
        cache = target.model.new_cache(max_seq_len=64)
        out = target(ex["ids"][None, :a], cache=cache, hidden_layers=drafter.hidden_layers)
        dcache = drafter.new_cache()
        drafter.extend(dcache, out.hidden[0, : a - 2])  # in two steps, as begin() then observe() would
        drafter.extend(dcache, out.hidden[0, a - 2 :])
        block = drafter.draft(dcache, int(ex["ids"][a]), target.embed_tokens, target.lm_head)
        torch.testing.assert_close(block.hidden, packed_hidden[j], rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(block.target_hidden, out.hidden[0, -1, -1])


def randomize_norms(drafter) -> None:
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)


# ---------------------------------------------------------------- command line


def test_every_drafter_flag_has_help():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for action in parser._actions:
        assert action.help, f"flag {action.option_strings} has no help"


def test_missing_trainer_module_fails_clearly():
    with pytest.raises(SystemExit, match="weaver.training.no_such_trainer"):
        train_cli.trainer_module("no_such_trainer")


def test_cli_parses_the_drafter_subcommand():
    args = train_cli.build_parser(["drafter", "--model", "m", "--out", "o"]).parse_args(
        ["drafter", "--model", "m", "--out", "o", "--steps", "3"]
    )
    assert args.trainer == "drafter" and args.steps == 3 and args.data == "sharegpt"


def write_tiny_target_folder(folder) -> None:
    """A Hugging Face folder (weights + a word-level tokenizer) that weaver.models.load_target accepts."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tiny_hf_target().save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1").save_pretrained(folder)


def test_cli_trains_a_loadable_drafter(tmp_path, capsys):
    write_tiny_target_folder(tmp_path / "target")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"ids": list(s.ids), "prompt_len": s.prompt_len}) + "\n" for s in sequences(6)))
    out = tmp_path / "drafter"
    train_cli.main(
        ["drafter", "--model", str(tmp_path / "target"), "--out", str(out), "--data", str(data), "--steps", "3",
         "--block-size", "4", "--num-layers", "1", "--target-layer-ids", "1", "3", "--seqs-per-step", "2",
         "--shard-size", "4", "--top-k", "4", "--warmup-steps", "1"]
    )  # fmt: skip
    first_line = capsys.readouterr().out.splitlines()[0]  # what decides the run's float results, atop its log
    assert first_line.startswith(f"host: torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels")
    drafter = load_drafter(out)
    assert drafter.cfg.target_layer_ids == (1, 3) and drafter.cfg.hidden_size == D_MODEL
    assert drafter.hidden_layers == (1, 3, N_LAYERS - 1)
    assert FeatureStore(out / "features").hidden_layers == drafter.hidden_layers


def test_training_progress_reaches_a_redirected_log_line_by_line():
    def buffering(setup: str) -> str:
        code = f"import sys, weaver.train; {setup}; print(sys.stdout.line_buffering)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert buffering("pass") == "False"  # a pipe is block-buffered by default: a log would fill only at exit
    assert buffering("weaver.train.line_buffered_stdout()") == "True"


def test_cli_caches_features_for_a_trained_drafters_taps(tmp_path):
    """`weaver.train features`: the adapter's own (larger) feature set for a drafter that was trained on another."""
    from weaver.models import load_target
    from weaver.training.features import add_arguments as add_feature_arguments
    from weaver.training.features import target_features

    write_tiny_target_folder(tmp_path / "target")
    data = tmp_path / "data.jsonl"
    write_token_jsonl(data, sequences(6))
    drafter_dir = tmp_path / "drafter"
    train_cli.main(
        ["drafter", "--model", str(tmp_path / "target"), "--out", str(drafter_dir), "--data", str(data), "--steps", "1",
         "--block-size", "4", "--num-layers", "1", "--target-layer-ids", "0", "2", "--seqs-per-step", "2",
         "--num-sequences", "3", "--shard-size", "4", "--top-k", "4", "--warmup-steps", "1"]
    )  # fmt: skip
    feature_args = ["features", "--model", str(tmp_path / "target"), "--drafter", str(drafter_dir), "--data", str(data),
                    "--shard-size", "2", "--top-k", "4", "--out", str(tmp_path / "feat")]  # fmt: skip
    train_cli.main([*feature_args, "--num-sequences", "5"])

    store = FeatureStore(tmp_path / "feat")
    assert store.hidden_layers == load_drafter(drafter_dir).hidden_layers == (0, 2, N_LAYERS - 1)
    assert len(store) == 5 and len(FeatureStore(drafter_dir / "features")) == 3
    model, _ = load_target(str(tmp_path / "target"))
    spec = FeatureSpec(str(tmp_path / "target"), store.hidden_layers, top_k=4, shard_size=2)
    first = next(store.iterate())
    expected = target_features(model.eval(), sequences(6)[0], spec)
    assert torch.equal(first["ids"], expected["ids"]) and torch.equal(first["top_ids"], expected["top_ids"])
    torch.testing.assert_close(first["hidden"], expected["hidden"])

    with pytest.raises(ValueError, match="another target, layer set or data"):  # never mixes two data sets
        train_cli.main([*feature_args, "--num-sequences", "4"])
    with pytest.raises(ValueError, match="0 <= --worker < --workers"):
        train_cli.main([*feature_args, "--num-sequences", "5", "--workers", "2", "--worker", "2"])
    with pytest.raises(ValueError, match="worker 0 regenerates it"):  # a worker > 0 never regenerates completions
        train_cli.main([*feature_args, "--data", "target", "--out", str(tmp_path / "regen"), "--workers", "2",
                        "--worker", "1"])  # fmt: skip

    parser = argparse.ArgumentParser()
    add_feature_arguments(parser)
    assert all(action.help for action in parser._actions)


def test_cached_completions_of_other_settings_are_refused(tmp_path):
    from weaver.training.features import COMPLETIONS_SETTINGS, regen_settings, training_sequences

    def args(**change) -> argparse.Namespace:
        settings = dict(data="target", model="m", num_sequences=2, regen_tokens=80, regen_temperatures=[0.0, 1.0],
                        regen_batch=16, max_prompt_len=96, seed=0)  # fmt: skip
        return argparse.Namespace(**{**settings, **change})

    write_token_jsonl(tmp_path / "completions.jsonl", sequences(2))
    with pytest.raises(ValueError, match="fewer than --num-sequences 3"):  # a cache without settings (before them)
        training_sequences(args(num_sequences=3), None, None, tmp_path)
    (tmp_path / COMPLETIONS_SETTINGS).write_text(json.dumps(regen_settings(args())))
    assert len(training_sequences(args(), None, None, tmp_path)) == 2
    with pytest.raises(ValueError, match=r"regen_tokens: 80 -> 40.*delete"):
        training_sequences(args(regen_tokens=40), None, None, tmp_path)
    with pytest.raises(ValueError, match=r"regen_temperatures: \[0.0, 1.0\] -> \[1.0\]"):
        training_sequences(args(regen_temperatures=[1.0]), None, None, tmp_path)
