"""SGLang /generate requests and responses, translated by hand-computed examples."""

from __future__ import annotations

import pytest
from areno_sglang.client import SGLangServerError
from areno_sglang.protocol import (
    Request,
    generate_payload,
    parse_output,
    sample_seed,
    sglang_sampling,
)

from areno_core.types import SamplingParams


def test_sample_seed_is_a_function_of_the_seed_and_the_position():
    seeds = {sample_seed(7, p, s) for p in range(4) for s in range(4)}
    assert len(seeds) == 16
    assert sample_seed(7, 1, 2) == sample_seed(7, 1, 2)
    assert sample_seed(8, 1, 2) != sample_seed(7, 1, 2)
    assert all(0 <= s < 2**62 for s in seeds)


def test_greedy_sends_temperature_zero_and_no_truncation_or_seed():
    params = sglang_sampling(
        SamplingParams(max_new_tokens=5, temperature=0.7, top_k=3, greedy=True), [9, 2], 11
    )
    assert params == {
        "max_new_tokens": 5,
        "temperature": 0.0,
        "top_k": -1,
        "top_p": 1.0,
        "min_p": 0.0,
        "stop_token_ids": [2, 9],
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }


def test_sampling_sends_temperature_top_k_top_p_and_the_sample_seed():
    params = sglang_sampling(SamplingParams(temperature=0.5, top_k=4, top_p=0.9), [2], 11)
    assert (params["temperature"], params["top_k"], params["top_p"]) == (0.5, 4, 0.9)
    assert params["sampling_seed"] == 11
    assert "sampling_seed" not in sglang_sampling(SamplingParams(), [2], None)


def test_generate_payload_has_one_entry_per_sample_in_request_order():
    prompts = [[1, 2], [3]]
    requests = [Request(0, 0), Request(0, 1), Request(1, 0)]
    payload = generate_payload(prompts, requests, SamplingParams(seed=3), [0])
    assert payload["input_ids"] == [[1, 2], [1, 2], [3]]
    assert [p["sampling_seed"] for p in payload["sampling_params"]] == [
        sample_seed(3, 0, 0),
        sample_seed(3, 0, 1),
        sample_seed(3, 1, 0),
    ]
    assert payload["return_logprob"] is True and payload["stream"] is False


def _item(pairs, finish, **meta):
    return {"meta_info": {"output_token_logprobs": pairs, "finish_reason": finish, **meta}}


def test_parse_output_reads_tokens_logprobs_version_and_reason():
    item = _item(
        [[-0.5, 7, None], [-1.25, 2, "x"]],
        {"type": "stop", "matched": 2},
        weight_version="4",
        cached_tokens=3,
    )
    item["output_ids"] = [7, 2]
    out = parse_output(item, [2], max_new_tokens=8, server="s")
    assert out.token_ids == (7, 2) and out.logprobs == (-0.5, -1.25)
    assert (out.finish_reason, out.weight_version, out.cached_tokens) == ("stop", "4", 3)


def test_parse_output_stop_token_at_the_cap_is_stop_like_the_native_engine():
    item = _item([[-0.1, 5, None], [-0.2, 2, None]], {"type": "length", "length": 2})
    assert parse_output(item, [2], max_new_tokens=2, server="s").finish_reason == "stop"
    capped = _item([[-0.1, 5, None], [-0.2, 6, None]], {"type": "length", "length": 2})
    assert parse_output(capped, [2], max_new_tokens=2, server="s").finish_reason == "length"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"text": "hi"}, "has no meta_info"),
        ({"meta_info": {"finish_reason": None}}, "has no output_token_logprobs"),
        (_item([[-0.1]], {"type": "stop"}), "entries must be \\[logprob, token_id"),
        (_item([], {"type": "length"}), "has 0 tokens, expected 1 to 4"),
        (_item([[-0.1, 5, None]] * 5, {"type": "length"}), "has 5 tokens"),
        (_item([[-0.1, 5, None]], {"type": "abort", "message": "oom"}), "aborted a request: oom"),
        (_item([[-0.1, 5, None]], {"type": "weird"}), "unexpected finish_reason"),
        ({**_item([[-0.1, 5, None]], {"type": "length"}), "output_ids": [6]}, "disagree"),
    ],
)
def test_parse_output_malformed_or_aborted_is_an_error_naming_the_server(item, message):
    with pytest.raises(SGLangServerError, match=message) as info:
        parse_output(item, [2], max_new_tokens=4, server="http://srv:1")
    assert "http://srv:1" in str(info.value)
