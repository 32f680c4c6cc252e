"""The paper's GPU evaluation sets, loaded with `datasets` from the Hugging Face hub (METHOD.md section 8).

Each set is pinned to a repository revision and has the paper's sample count as its default n (GSM8K 128, MATH500
128; the others in full, ShareChat 128). Revisions are commit SHAs where one could be confirmed; 'main' marks the
three sets (aime25, livecodebench, sharechat) whose commit must be pinned on first hub access. The ShareChat set is
not public under that name: we use the original ShareGPT dump it stands for. ``path`` replaces the hub with a local
JSON / JSON-lines file in the hub schema (how the tests run, since this machine has no hub access).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from weaver.data.registry import DATASETS, Prompt, subsample
from weaver.data.sharegpt import to_messages

BOXED = "{}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
LIVECODEBENCH = "{}\n\nWrite a Python program that solves the problem above.{}"
STARTER = "\nStart from this code:\n```python\n{}\n```"


@dataclass(frozen=True)
class HubSet:
    """One hub dataset and how a row becomes a prompt.

    Attributes:
        name: registry name.
        repo / config / split / revision / data_files: the ``datasets.load_dataset`` arguments.
        id_field: the row's id column; None = the row index.
        text: row -> user message, or None to skip the row.
        default_n: prompts drawn when n is None (the paper's count); None = all rows.
    """

    name: str
    repo: str
    revision: str
    split: str
    id_field: str | None
    text: Callable[[dict], str | None]
    config: str | None = None
    data_files: str | None = None
    default_n: int | None = None

    def rows(self, path: str | Path | None) -> list[dict]:
        try:
            import datasets
        except ImportError:
            raise ImportError(f"the {self.name} loader needs the `datasets` package: `pip install datasets`") from None
        if path is not None:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{self.name}: no local file at {path}; pass a JSON or JSON-lines file")
            return list(datasets.load_dataset("json", data_files=str(path), split="train"))
        return list(
            datasets.load_dataset(
                self.repo, self.config, split=self.split, revision=self.revision, data_files=self.data_files
            )
        )

    def __call__(self, *, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]:
        prompts = []
        for index, row in enumerate(self.rows(path)):
            text = self.text(row)
            if text:
                prompt_id = index if self.id_field is None else row[self.id_field]
                prompts.append(Prompt(str(prompt_id), self.name, ({"role": "user", "content": text},)))
        return subsample(prompts, self.default_n if n is None else n, seed)


def first_user_turn(row: dict) -> str | None:
    messages = to_messages(row.get("conversations") or [])
    return next((m["content"] for m in messages if m["role"] == "user"), None)


def livecodebench_text(row: dict) -> str:
    starter = row.get("starter_code") or ""
    return LIVECODEBENCH.format(row["question_content"], STARTER.format(starter) if starter.strip() else "")


HUB_SETS = (
    HubSet("gsm8k", "openai/gsm8k", "cc7b047b6e5bb11b4f1af84efc572db110a51b3c", "test", None,
           lambda r: BOXED.format(r["question"]), config="main", default_n=128),
    HubSet("math500", "HuggingFaceH4/MATH-500", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", "test", "unique_id",
           lambda r: BOXED.format(r["problem"]), default_n=128),
    HubSet("aime25", "MathArena/aime_2025", "main", "train", "problem_idx", lambda r: BOXED.format(r["problem"])),
    HubSet("mbpp", "google-research-datasets/mbpp", "4bb6404fdc6cacfda99d4ac4205087b89d32030c", "test", "task_id",
           lambda r: r["prompt"], config="sanitized"),
    HubSet("livecodebench", "livecodebench/code_generation_lite", "main", "train", "question_id", livecodebench_text,
           data_files="test6.jsonl"),
    HubSet("sharechat", "anon8231489123/ShareGPT_Vicuna_unfiltered", "main", "train", "id", first_user_turn,
           data_files="ShareGPT_V3_unfiltered_cleaned_split.json", default_n=128),
)  # fmt: skip
for hub_set in HUB_SETS:
    DATASETS.register(hub_set.name)(hub_set)
