"""Load targets from Hugging Face checkpoint folders (config.json + *.safetensors, sharded index too).

Our module names follow the Hugging Face ones, so conversion only strips prefixes ("model.", or
"model.language_model." in the multimodal Qwen3.5 wrapper), drops what a text decoder does not use (vision tower,
MTP head) and splits Qwen3-Next's fused GDN in-projections into the Qwen3.5 layout (qkv, z, b, a).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from weaver.models.config import LINEAR_ATTENTION, ModelConfig
from weaver.models.registry import resolve_target
from weaver.models.transformer import Transformer

_DROPPED_PREFIXES = ("mtp.", "model.visual.", "visual.")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
_PLAIN_FAST_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")  # one class in transformers 5


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: a target folder needs a Hugging Face config.json")
    return json.loads(path.read_text())


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, or of the shards named by model.safetensors.index.json."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    missing = [f for f in files if not (folder / f).is_file()]
    if not files or missing:
        raise FileNotFoundError(
            f"no complete safetensors checkpoint in {folder} (missing: {missing or '*.safetensors'}): "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(folder / f))
    return tensors


def convert_state_dict(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face parameter names -> ours."""
    out = {}
    for name, tensor in hf.items():
        if name.startswith(_DROPPED_PREFIXES):
            continue
        for prefix in ("model.language_model.", "model."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        out[name] = tensor
    if config.family == "qwen3_next":
        for i, kind in enumerate(config.layer_types):
            if kind == LINEAR_ATTENTION:
                _split_qwen3_next_projections(out, f"layers.{i}.linear_attn.", config)
    if config.tie_word_embeddings:
        out.setdefault("lm_head.weight", out["embed_tokens.weight"])
    return out


def _split_qwen3_next_projections(sd: dict[str, torch.Tensor], prefix: str, config: ModelConfig) -> None:
    """in_proj_qkvz / in_proj_ba are grouped per key head: [H, (q K | k K | v rV | z rV)] and [H, (b r | a r)],
    r = HV / H value heads per key head. Regroup into contiguous q, k, v (the conv input order), z, b, a."""
    h, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    r = config.linear_num_value_heads // h
    qkvz = sd.pop(prefix + "in_proj_qkvz.weight")
    d = qkvz.shape[-1]
    q, k, v, z = qkvz.view(h, 2 * dk + 2 * r * dv, d).split([dk, dk, r * dv, r * dv], dim=1)
    sd[prefix + "in_proj_qkv.weight"] = torch.cat([q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)])
    sd[prefix + "in_proj_z.weight"] = z.reshape(-1, d)
    b, a = sd.pop(prefix + "in_proj_ba.weight").view(h, 2 * r, d).split([r, r], dim=1)
    sd[prefix + "in_proj_b.weight"] = b.reshape(-1, d)
    sd[prefix + "in_proj_a.weight"] = a.reshape(-1, d)


def from_state_dict(
    config: ModelConfig, hf_state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32
) -> Transformer:
    """Build our Transformer from a Hugging Face state dict; names every missing or unexpected parameter."""
    with torch.device("meta"):  # no random init of weights that are overwritten anyway
        model = Transformer(config)
    state = {k: v.to(dtype) for k, v in convert_state_dict(hf_state, config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the {config.family} architecture: missing {missing[:8]}, "
            f"unexpected {unexpected[:8]} (is config.json from the same model?)"
        )
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model = model.to(dtype).eval()
    model.prepare_for_inference()
    return model


def from_hf_model(hf_model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> Transformer:
    """Our Transformer with the weights of an in-memory transformers model (tests, conversions)."""
    return from_state_dict(ModelConfig.from_hf(hf_model.config.to_dict()), hf_model.state_dict(), dtype)


def load_checkpoint(folder: str | Path, dtype: torch.dtype = torch.float32) -> Transformer:
    """A Hugging Face checkpoint folder -> Transformer (eval mode)."""
    folder = Path(folder)
    return from_state_dict(ModelConfig.from_hf(read_config(folder)), read_safetensors(folder), dtype)


def load_tokenizer(folder: Path):
    """The tokenizer saved beside a checkpoint (tokenizer.json / tokenizer.model + tokenizer_config.json)."""
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"no tokenizer in {folder} (expected one of {', '.join(_TOKENIZER_FILES)}): save it beside the weights "
            "with tokenizer.save_pretrained(folder)"
        )
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = folder / "tokenizer_config.json"
    declared = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if declared in _PLAIN_FAST_TOKENIZERS and (folder / "tokenizer.json").is_file():
        # the class AutoTokenizer would pick, without its ~1 s of model-type resolution (paid by every bench job)
        return PreTrainedTokenizerFast.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def load_target(name_or_path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Transformer, Any]:
    """A registry name (e.g. "smollm2-135m") or a local Hugging Face folder -> (model, tokenizer)."""
    folder = resolve_target(name_or_path)
    return load_checkpoint(folder, dtype), load_tokenizer(folder)


def load_hf_reference(name_or_path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' own implementation of the same target, from the same folder (equivalence tests, benchmarks)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_target(name_or_path), dtype=dtype).eval()
