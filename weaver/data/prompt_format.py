"""Prompt -> token ids with the target's chat template (what the paper's benchmark sends to the server)."""

from __future__ import annotations

import logging

from weaver.data.registry import Prompt

log = logging.getLogger(__name__)
_warned_plain = False


def plain_chat(prompt: Prompt) -> str:
    """A template-free rendering for tokenizers without a chat template: "User: ...\\n\\nAssistant:"."""
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in prompt.messages]
    return "\n\n".join(turns) + "\n\nAssistant:"


def format_prompt(tokenizer, prompt: Prompt, *, enable_thinking: bool = True) -> list[int]:
    """Token ids of ``prompt`` rendered by the tokenizer's chat template with the generation prompt appended.

    ``enable_thinking`` reaches templates that read it (Qwen3 / Qwen3.5: the paper runs with thinking on); other
    templates ignore it. A tokenizer without a chat template gets plain_chat, logged once per process.
    """
    global _warned_plain
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            list(prompt.messages), tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
        # The template already wrote BOS and role markers; encoding must not add them twice.
        return list(tokenizer.encode(text, add_special_tokens=False))
    if not _warned_plain:
        log.warning("the tokenizer has no chat template; prompts use the plain 'User: ... Assistant:' format")
        _warned_plain = True
    return list(tokenizer.encode(plain_chat(prompt)))
