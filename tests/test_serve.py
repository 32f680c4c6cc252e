"""weaver.serve: SGLang's /generate and OpenAI /v1/completions over our engine; bad input gets 400, never a crash."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from tiny_models import tiny_hf_model

from weaver.backends.engine import Engine, EngineConfig
from weaver.generate import generate
from weaver.models import from_hf_model
from weaver.serve import Server, ServerThread
from weaver.sources import make_source

PROMPT = [5, 17, 3, 42, 8, 9, 5, 17, 3]


@pytest.fixture(scope="module")
def tiny_model():
    return from_hf_model(tiny_hf_model("llama"))


def post(url: str, payload: Any, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def oracle_server(tiny_model):
    """A server drafting with the target itself (accepts everything at T = 0), budget 4."""
    engine = Engine(EngineConfig("tiny", "oracle", 4), tiny_model)
    with ServerThread(Server(engine)) as thread:
        yield thread.url


def test_generate_equals_the_engine_and_reports_spec_stats(oracle_server, tiny_model) -> None:
    status, out = post(
        f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    )
    assert status == 200
    greedy = generate(tiny_model, PROMPT, max_new_tokens=12)
    assert out["output_ids"] == greedy.output_ids
    meta = out["meta_info"]
    ref = generate(tiny_model, PROMPT, source=make_source("oracle", tiny_model), budget=4, max_new_tokens=12).stats
    assert meta["completion_tokens"] == 12 and meta["prompt_tokens"] == len(PROMPT)
    assert meta["spec_verify_ct"] == ref.steps - 1
    assert meta["spec_accept_length"] == pytest.approx(12 / (ref.steps - 1))
    assert meta["spec_accept_length"] > 2  # the oracle accepts whole trees: speculation is really on
    histogram = meta["spec_correct_drafts_histogram"]
    assert sum(histogram) == meta["spec_verify_ct"]
    assert sum((k + 1) * c for k, c in enumerate(histogram)) == sum(meta["weaver_accept_lengths"])
    assert meta["finish_reason"]["type"] == "length" and meta["e2e_latency"] > 0


def test_health_and_openai_completions(oracle_server, tiny_model) -> None:
    with urllib.request.urlopen(f"{oracle_server}/health", timeout=10) as response:
        assert response.status == 200
    status, out = post(f"{oracle_server}/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert status == 200
    assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 6
    assert out["meta_info"]["spec_verify_ct"] >= 1


@pytest.mark.parametrize(
    "payload, reason",
    [
        ({"sampling_params": {"max_new_tokens": 4}}, "exactly one of"),
        ({"input_ids": [], "sampling_params": {}}, "non-empty list"),
        ({"input_ids": [1, 2, 10_000]}, "vocabulary"),
        ({"input_ids": [1, "a"]}, "list of integers"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "many"}}, "integer"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10_000}}, "context"),
        ({"text": "hello"}, "no tokenizer"),
        ([1, 2, 3], "JSON object"),
    ],
    ids=[
        "no-prompt",
        "empty",
        "vocab",
        "type",
        "zero-new",
        "neg-temp",
        "bad-number",
        "too-long",
        "text-no-tok",
        "list",
    ],
)
def test_bad_requests_get_400_and_the_server_lives(oracle_server, payload, reason) -> None:
    status, out = post(f"{oracle_server}/generate", payload)
    assert status == 400 and reason in out["error"]["message"]
    status, _ = post(f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert status == 200


def test_malformed_json_is_400(oracle_server) -> None:
    status, out = post(f"{oracle_server}/generate", None, raw=b"{not json")
    assert status == 400 and "JSON" in out["error"]["message"]


def test_concurrent_requests_queue_and_stay_deterministic(oracle_server) -> None:
    """Sampled requests with a seed give the same tokens however they interleave (one engine worker)."""
    payload = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 3}}
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(post(f"{oracle_server}/generate", payload)[1])) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r["output_ids"] == results[0]["output_ids"] for r in results)


def test_ar_server_reports_no_spec_fields(tiny_model) -> None:
    with ServerThread(Server(Engine(EngineConfig("tiny"), tiny_model))) as thread:
        status, out = post(f"{thread.url}/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5}})
    assert status == 200 and "spec_verify_ct" not in out["meta_info"]


def test_bad_configuration_is_refused_before_loading() -> None:
    from weaver.serve import main

    with pytest.raises(ValueError, match="budget"):
        main(["--model", "smollm2-135m", "--method", "chain", "--drafter", "d"])
