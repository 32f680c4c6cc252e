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
        ({"input_ids": [1, 2], "sampling_params": {"max_tokens": 4}}, "unsupported field(s) ['max_tokens']"),
        ({"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.2}}, "repetition_penalty is not impl"),
        ({"input_ids": [1, 2], "sampling_params": {"min_new_tokens": 3}}, "min_new_tokens is not implemented"),
        ({"input_ids": [1, 2], "sampling_params": {"n": 2}}, "n is not implemented"),
        ({"input_ids": [1, 2], "stream": True}, "'stream' is not supported"),
        ({"input_ids": [1, 2], "return_logprob": True}, "'return_logprob' is not supported"),
        ({"input_ids": [1, 2], "image_data": "x"}, "unsupported field(s) ['image_data']"),
        ({"input_ids": [1, 2], "sampling_params": {"stop": 5}}, "stop must be"),
        ({"input_ids": [1, 2], "sampling_params": {"stop": {"x": 1}}}, "stop must be"),
        ({"input_ids": [1, 2], "sampling_params": {"ignore_eos": "false"}}, "ignore_eos must be true or false"),
        ({"input_ids": [1, 2], "sampling_params": {"sampling_seed": 2**70}}, "2**63 - 1"),
        ({"input_ids": [1, 2], "sampling_params": {"top_k": -5}}, "top_k"),
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
        "misspelt-field",
        "penalty",
        "min-new-tokens",
        "n",
        "stream",
        "logprobs",
        "unknown-top-level",
        "stop-int",
        "stop-object",
        "ignore-eos-string",
        "huge-seed",
        "top-k",
    ],
)
def test_bad_requests_get_400_and_the_server_lives(oracle_server, payload, reason) -> None:
    status, out = post(f"{oracle_server}/generate", payload)
    assert status == 400 and reason in out["error"]["message"]
    status, _ = post(f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert status == 200


def test_neutral_values_of_unimplemented_fields_are_accepted(oracle_server) -> None:
    """What a client such as the bench pins (SGLang's defaults) is accepted and changes nothing."""
    neutral = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
    base = {"max_new_tokens": 6, "temperature": 0}
    _, plain = post(f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": base})
    status, pinned = post(f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": base | neutral})
    assert status == 200 and pinned["output_ids"] == plain["output_ids"]


@pytest.mark.parametrize(
    "payload, reason",
    [
        ({"prompt": PROMPT, "max_token": 4}, "unsupported field(s) ['max_token']"),
        ({"prompt": PROMPT, "n": 2}, "n is not implemented"),
        ({"prompt": PROMPT, "logprobs": 5}, "'logprobs' is not supported"),
        ({"prompt": PROMPT, "stream": True}, "'stream' is not supported"),
        ({"prompt": PROMPT, "echo": True}, "'echo' is not supported"),
        ({"prompt": PROMPT, "presence_penalty": 0.5}, "presence_penalty is not implemented"),
    ],
    ids=["misspelt", "n", "logprobs", "stream", "echo", "penalty"],
)
def test_bad_completions_get_400(oracle_server, payload, reason) -> None:
    status, out = post(f"{oracle_server}/v1/completions", payload)
    assert status == 400 and reason in out["error"]["message"]


def test_completions_pass_every_sampling_field_to_the_engine(tiny_model) -> None:
    """/v1/completions hands max_tokens, temperature, top_p, top_k, seed and ignore_eos to the engine as /generate."""
    engine = Engine(EngineConfig("tiny", "oracle", 4), tiny_model)
    seen: list[dict[str, Any]] = []
    generate_ = engine.generate
    engine.generate = lambda ids, **kw: seen.append(kw) or generate_(ids, **kw)
    fields = {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "ignore_eos": True}
    with ServerThread(Server(engine)) as thread:
        status, out = post(f"{thread.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 6, **fields})
        assert status == 200 and out["usage"]["completion_tokens"] == 6
        status, _ = post(
            f"{thread.url}/generate",
            {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, **fields, "sampling_seed": 3}},
        )
    expected = {"max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "ignore_eos": True}
    assert status == 200 and seen == [expected, expected]


def test_one_token_request_still_reports_speculation(oracle_server) -> None:
    """max_new_tokens 1 needs no verify pass: spec_verify_ct is 0, present, so a client can tell speculation is on."""
    status, out = post(f"{oracle_server}/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    meta = out["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 1 and meta["spec_verify_ct"] == 0
    assert "spec_accept_length" not in meta and meta["spec_correct_drafts_histogram"] == []


def test_server_info_names_the_configuration(oracle_server) -> None:
    with urllib.request.urlopen(f"{oracle_server}/get_server_info", timeout=10) as response:
        info = json.loads(response.read())
    assert info["model_path"] == "tiny" and info["weaver_method"] == "oracle" and info["weaver_budget"] == 4
    assert info["speculative_algorithm"] == "WEAVER_ENGINE" and info["version"]


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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "chain", "--drafter", "d"], "budget"),
        (["--method", "eagle", "--budget", "4"], "unknown method 'eagle'"),
        (["--method", "ar", "--mode", "nucleus"], "invalid choice"),
    ],
    ids=["no-budget", "unknown-method", "bad-mode"],
)
def test_bad_configuration_is_refused_before_loading(argv: list[str], message: str, capsys) -> None:
    from weaver.serve import main

    with pytest.raises((ValueError, SystemExit)) as caught:
        main(["--model", "no-such-model", *argv])  # refused before the model would fail to load
    assert message in str(caught.value) + capsys.readouterr().err


def test_bad_port_is_refused(capsys) -> None:
    from weaver.serve import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--port", "70000"])
    assert "--port must be" in capsys.readouterr().err
