"""Evaluation prompts and training conversations (DESIGN.md: weaver.data).

Usage::

    prompts = load_prompts("mt_bench", n=10, seed=0)     # any of DATASETS.names()
    ids = format_prompt(tokenizer, prompts[0])            # the target's chat template
    corpus = training_conversations("train", limit=1000)  # ShareGPT chat messages
"""

from weaver.data import hub_sets, packaged_sets  # noqa: F401  (register their datasets)
from weaver.data.package_files import MissingDataError, package_file
from weaver.data.prompt_format import format_prompt, plain_chat
from weaver.data.registry import DATASETS, Prompt, Registry, load_prompts
from weaver.data.sharegpt import decode_complete_elements, load_conversations, training_conversations

__all__ = [
    "DATASETS",
    "MissingDataError",
    "Prompt",
    "Registry",
    "decode_complete_elements",
    "format_prompt",
    "load_conversations",
    "load_prompts",
    "package_file",
    "plain_chat",
    "training_conversations",
]
