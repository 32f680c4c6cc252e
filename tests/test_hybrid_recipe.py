"""The hybrid-target recipe (weaver.training.hybrid) at tiny size: conversion, distillation, a loadable folder."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from weaver.models import load_target, resolve_target
from weaver.training import hybrid as recipe

WORDS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(59)]
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} </s> {% endfor %}"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny random Llama teacher (2 GQA groups, 8 layers) with a word-level chat tokenizer."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         initializer_range=0.3)  # fmt: skip
    path = tmp_path_factory.mktemp("teacher")
    LlamaForCausalLM(config).save_pretrained(path)
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sharegpt_file(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    records = []
    for i in range(60):
        start = int(torch.randint(0, 50, (), generator=g))
        turn = " ".join(f"w{start + j % 8}" for j in range(24))  # counting patterns: learnable
        records.append(
            {"id": str(i), "conversations": [{"from": "human", "value": turn}, {"from": "gpt", "value": turn}]}
        )
    path = tmp_path_factory.mktemp("data") / "sharegpt.json"
    path.write_text(json.dumps(records))
    return str(path)


def test_converted_gdn_layers_start_near_skips_and_attention_keeps_its_shapes(teacher_dir):
    teacher, _ = recipe.load_teacher(str(teacher_dir))
    hybrid = recipe.convert(teacher)
    kinds = hybrid.config.layer_types
    assert kinds == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    outputs = {}
    for i, layer in enumerate(hybrid.model.layers):
        mixer = layer.linear_attn if kinds[i] == "linear_attention" else layer.self_attn
        mixer.register_forward_hook(
            lambda m, inp, out, i=i: outputs.__setitem__(i, out[0] if isinstance(out, tuple) else out)
        )
    hybrid(torch.randint(0, len(WORDS), (1, 12)))
    scale = {kind: max(outputs[i].abs().max().item() for i in range(8) if kinds[i] == kind) for kind in set(kinds)}
    assert 0 < scale["linear_attention"] < 0.2 * scale["full_attention"]  # near a skip, yet with gradients
    gdn, attn = hybrid.model.layers[0].linear_attn, teacher.model.layers[0].self_attn
    q, k, v = gdn.in_proj_qkv.weight.split([16, 16, 32])
    assert torch.equal(q, attn.q_proj.weight.view(4, 8, 32)[::2].flatten(0, 1)) and torch.equal(k, attn.k_proj.weight)
    assert torch.equal(v[8:16], attn.v_proj.weight[:8]) and torch.equal(v[16:24], attn.v_proj.weight[8:])
    decay = torch.exp(-gdn.A_log.exp() * torch.nn.functional.softplus(gdn.dt_bias))
    assert torch.allclose(decay, torch.linspace(*recipe.DECAY_RANGE, 4))


def test_gdn_with_one_key_head_per_query_head_copies_every_query_head(teacher_dir):
    teacher, _ = recipe.load_teacher(str(teacher_dir))
    gdn, attn = recipe.convert(teacher, key_heads=4).model.layers[0].linear_attn, teacher.model.layers[0].self_attn
    q, k, v = gdn.in_proj_qkv.weight.split([32, 32, 32])
    shared_v = attn.v_proj.weight.view(2, 8, 32).repeat_interleave(2, dim=0).flatten(0, 1)  # value head i: GQA group
    assert torch.equal(q, attn.q_proj.weight) and torch.equal(v, shared_v)
    assert torch.equal(k[8:16], attn.k_proj.weight[:8]) and torch.equal(k[16:24], attn.k_proj.weight[8:])
    with pytest.raises(ValueError, match="must divide"):
        recipe.convert(teacher, key_heads=3)


def test_qk_norm_calibration_brings_kept_attention_closer_to_the_teacher(teacher_dir):
    teacher, _ = recipe.load_teacher(str(teacher_dir))
    hybrid = recipe.convert(teacher)
    batch = torch.randint(0, len(WORDS), (2, 24), generator=torch.Generator().manual_seed(1))

    def attention_error() -> list[float]:
        io = recipe.teacher_mixer_io(teacher, batch)
        rope = hybrid.model.rotary_emb(io[0][0], torch.arange(24)[None])
        mixers = recipe.mixers(hybrid)
        return [((mixers[i](io[i][0], rope, None)[0] - io[i][1]).norm() / io[i][1].norm()).item() for i in (3, 7)]

    with torch.no_grad():
        before = attention_error()
        recipe.calibrate_qk_norms(hybrid, teacher, batch)
        after = attention_error()
    assert all(a < b for a, b in zip(after, before, strict=True)), (before, after)


def test_recipe_distils_and_writes_a_loadable_folder(tmp_path, teacher_dir, sharegpt_file):
    parser = argparse.ArgumentParser()
    recipe.add_arguments(parser)
    out = tmp_path / "hybrid"
    args = parser.parse_args(["--out", str(out), "--teacher", str(teacher_dir), "--data", sharegpt_file,
                              "--cpu-minutes", "1", "--max-steps", "20", "--batch-size", "2", "--seq-len", "32",
                              "--layerwise-lr", "1e-2", "--lr", "3e-3", "--heldout-rows", "2",
                              "--log-every", "100"])  # fmt: skip
    report = recipe.main(args)
    assert report.layerwise.steps == 20 and report.logits.steps == 20
    assert report.layerwise.last_loss < report.layerwise.first_loss
    assert (
        report.final.kl < report.after_layerwise.kl < report.converted.kl
        and report.final.kl < 0.8 * report.converted.kl
    )
    assert math.isfinite(report.final.hybrid_ppl) and math.isfinite(report.final.teacher_ppl)
    assert json.loads((out / "distill_report.json").read_text())["final"]["hybrid_ppl"] == report.final.hybrid_ppl
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["layer_types"].count("full_attention") == 2
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[3, 10, 11, 12]])
    generated = loaded.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 8)
    target, tokenizer = load_target(out)
    assert target.config.hybrid and tokenizer.encode("w1 w2", add_special_tokens=False) == [6, 7]
    with torch.no_grad():
        torch.testing.assert_close(target(generated).logits, loaded(generated).logits, rtol=1e-4, atol=1e-4)


def test_step_budget_builds_the_same_hybrid_twice(tmp_path, teacher_dir, sharegpt_file):
    """--steps fixes both schedules by step count: the seeded build is reproducible (a CPU-time budget is not)."""
    parser = argparse.ArgumentParser()
    recipe.add_arguments(parser)
    weights = []
    for name in ("a", "b"):
        args = parser.parse_args(["--out", str(tmp_path / name), "--teacher", str(teacher_dir), "--data", sharegpt_file,
                                  "--steps", "3", "2", "--batch-size", "2", "--seq-len", "32", "--heldout-rows", "2",
                                  "--log-every", "100"])  # fmt: skip
        report = recipe.main(args)
        assert (report.layerwise.steps, report.logits.steps) == (3, 2)
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x", "--steps", "3", "2", "--cpu-minutes", "1"])
    with pytest.raises(ValueError, match="--steps needs two positive"):
        recipe.main(parser.parse_args(["--out", str(tmp_path / "c"), "--steps", "0", "2"]))


def test_registry_name_resolves_to_the_pipeline_folder_once_built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="weaver.train hybrid"):
        resolve_target("smollm2-135m-gdn")
    folder = tmp_path / "results" / "cpu" / "models" / "smollm2-135m-gdn"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert resolve_target("smollm2-135m-gdn").resolve() == folder.resolve()
