"""Target models: one decoder for Llama, Qwen3 and Qwen3-Next / Qwen3.5 GDN hybrids, with caches and loaders."""

from weaver.models import gguf  # noqa: F401  (registers the GGUF targets)
from weaver.models.cache import Cache, GDNCache, KVCache
from weaver.models.config import ModelConfig
from weaver.models.loading import from_hf_model, load_checkpoint, load_hf_reference, load_target
from weaver.models.registry import TARGETS, register_folder, register_target, resolve_target
from weaver.models.transformer import ModelOutput, Transformer

__all__ = [
    "TARGETS",
    "Cache",
    "GDNCache",
    "KVCache",
    "ModelConfig",
    "ModelOutput",
    "Transformer",
    "from_hf_model",
    "load_checkpoint",
    "load_hf_reference",
    "load_target",
    "register_folder",
    "register_target",
    "resolve_target",
]
