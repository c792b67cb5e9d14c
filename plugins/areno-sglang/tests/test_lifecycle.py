"""The engine held to SGLang's rules where a trainer can go wrong: released weights are gone,
a busy server refuses to flush, keys are checked, shared servers are paused around a push."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from areno_sglang.client import SGLangClient, SGLangServerError
from areno_sglang.engine import SGLangEngine

from areno_core.contracts.engine import RolloutSession, WeightsNotHeldError
from areno_core.engine_conformance import (
    EOS,
    conformance_model,
    conformance_prompts,
    native_reference,
    tokens,
)
from areno_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=8, greedy=True)


def _call(url: str, route: str, body: dict | None = None, key: str | None = None):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + route, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# -- the defect: a release discards the weights ----------------------------------------------------


def test_strict_server_loses_released_weights_but_keeps_their_version(protocol_server):
    # What SGLang's memory saver does, and what made colocated RL sample garbage stamped as the
    # current version: the server still reports the version it no longer holds.
    policy = conformance_model(0)
    server = protocol_server(policy)
    prompts = conformance_prompts()
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    status, before = _call(server.url, "/generate", body)
    assert status == 200
    assert _call(server.url, "/release_memory_occupation", {})[0] == 200
    assert _call(server.url, "/resume_memory_occupation", {})[0] == 200
    status, after = _call(server.url, "/generate", body)
    assert status == 200
    first = [o["output_ids"] for o in json.loads(before)]
    again = [o["output_ids"] for o in json.loads(after)]
    assert sum(a == b for a, b in zip(first, again, strict=True)) <= 1  # noise now
    assert {o["meta_info"]["weight_version"] for o in json.loads(after)} == {"default"}


def test_cpu_backup_brings_released_weights_back(protocol_server):
    server = protocol_server(conformance_model(0), weights_cpu_backup=True)
    body = {"input_ids": conformance_prompts(), "sampling_params": {"temperature": 0}}
    _, before = _call(server.url, "/generate", body)
    _call(server.url, "/release_memory_occupation", {"tags": ["weights", "kv_cache"]})
    _call(server.url, "/resume_memory_occupation", {})
    _, after = _call(server.url, "/generate", body)
    assert [o["output_ids"] for o in json.loads(after)] == [
        o["output_ids"] for o in json.loads(before)
    ]


def test_sync_eval_rollout_samples_the_policy_with_the_version_it_came_from(
    protocol_server, colocated_engine
):
    # Done means of the lifecycle issue: sync(v0) -> evaluation session (releases) -> the
    # step-1 rollout, through the runner the run uses, on a server that discards weights.
    from types import SimpleNamespace

    from areno_core.runner.rollout import RolloutRunner

    policy = conformance_model(0)
    prompts = conformance_prompts()
    expected = native_reference(policy).generate(prompts, GREEDY)
    server = protocol_server()
    engine = colocated_engine(policy, server)
    assert engine.drops_weights and not engine.holds_weights
    owner = SimpleNamespace(optimizer_steps=0, policy=policy, adapter=None)
    runner = RolloutRunner(
        owner, engine, sampling=GREEDY, n_samples=1, reward_fn=lambda r: 0.0, batch_size=8
    )
    runner.sync_weights()
    with RolloutSession(engine, drop_state=True):  # the step-0 evaluation
        assert tokens(engine.generate(prompts, GREEDY)) == tokens(expected)
    assert server.released and not engine.holds_weights
    with (
        pytest.raises(WeightsNotHeldError, match="--enable-weights-cpu-backup"),
        RolloutSession(engine),
    ):
        engine.generate(prompts, GREEDY)  # what the old runner did: refused now
    runner.sync_weights()  # the version did not move, but the weights are gone: pushed again
    with RolloutSession(engine):
        out = engine.generate(prompts, GREEDY)
    assert tokens(out) == tokens(expected)  # 8/8 (0/8 before the fix)
    assert {c.policy_version for g in out for c in g} == {0}
    assert runner.weight_restores == 1
    pushes = [b["weight_version"] for _, p, b in server.calls if p == "/update_weights_from_disk"]
    assert pushes == ["0", "0"]


def test_colocated_server_with_cpu_backup_is_not_pushed_again(protocol_server, colocated_engine):
    policy = conformance_model(0)
    server = protocol_server(weights_cpu_backup=True)
    engine = colocated_engine(policy, server)
    assert not engine.drops_weights
    engine.sync_weights(policy, version=0)
    with RolloutSession(engine, drop_state=True):
        engine.generate([[5, 6]], GREEDY)
    assert server.released and engine.holds_weights
    with RolloutSession(engine):
        out = engine.generate(conformance_prompts(), GREEDY)
    assert tokens(out) == tokens(native_reference(policy).generate(conformance_prompts(), GREEDY))


# -- a busy server, pause and continue -------------------------------------------------------------


def test_flush_while_a_request_runs_is_400_and_the_client_retries_until_idle(protocol_server):
    server = protocol_server()
    started = threading.Event()
    original = server._generate_now

    def slow(body):
        started.set()
        time.sleep(1.0)
        return original(body)

    server._generate_now = slow
    body = {"input_ids": [[5, 6, 7]], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    worker = threading.Thread(target=_call, args=(server.url, "/generate", body))
    worker.start()
    started.wait(10)
    status, text = _call(server.url, "/flush_cache", {})
    assert status == 400 and "pending requests" in text
    client = SGLangClient(server.url)
    with pytest.raises(SGLangServerError, match=r"/flush_cache answered HTTP 400 for 0.1 s"):
        client.flush_cache(timeout_s=0.1)
    client.flush_cache(timeout_s=30.0)  # succeeds once the request is done
    worker.join()
    assert server.running == 0


def test_remote_push_pauses_flushes_and_continues_and_held_requests_wait(
    protocol_server, sglang_engine
):
    policy = conformance_model(0)
    server = protocol_server()
    engine = sglang_engine(policy, [server])
    _call(server.url, "/pause_generation", {"mode": "retract"})
    done: list[int] = []
    body = {"input_ids": [[5, 6]], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    held = threading.Thread(target=lambda: done.append(_call(server.url, "/generate", body)[0]))
    held.start()
    time.sleep(0.3)
    assert not done and server.waiting == 1  # another client's request, held by the pause
    _call(server.url, "/continue_generation", {})
    held.join(30)
    assert done == [200]
    engine.sync_weights(policy, version=1)
    assert server.routes("POST")[-4:] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/flush_cache",
        "/continue_generation",
    ]
    assert server.paused is None


def test_failed_remote_push_still_continues_generation(protocol_server, sglang_engine):
    server = protocol_server()
    engine = sglang_engine(conformance_model(0), [server])
    with pytest.raises(SGLangServerError, match="unknown weights"):
        engine.sync_weights({"no.such.weight": conformance_model(0).lm_head.weight}, version=1)
    assert server.routes("POST")[-1] == "/continue_generation" and server.paused is None


# -- requests SGLang refuses -----------------------------------------------------------------------


def test_unknown_sampling_parameter_is_refused_like_sglang(protocol_server):
    server = protocol_server()
    body = {"input_ids": [[5, 6]], "sampling_params": {"temprature": 0.5}}
    status, text = _call(server.url, "/generate", body)
    assert status == 400 and "unknown field `temprature`" in text


def test_routes_are_the_current_ones_and_no_weight_version_route(protocol_server, sglang_engine):
    server = protocol_server()
    assert _call(server.url, "/get_weight_version")[0] == 404
    before = len(server.routes("GET"))
    engine = sglang_engine(conformance_model(0), [server])
    engine.sync_weights(conformance_model(0), version=0)
    gets = server.routes("GET")[before:]
    assert "/model_info" in gets and "/server_info" in gets
    assert server.deprecated_calls == [] and not any(r.startswith("/get_") for r in gets)


def test_api_key_is_sent_from_the_environment_and_a_missing_one_is_named(
    protocol_server, sglang_engine, monkeypatch
):
    server = protocol_server(api_key="s3cret")
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    with pytest.raises(SGLangServerError, match=r"HTTP 401.*areno sent no key.*SGLANG_API_KEY"):
        sglang_engine(conformance_model(0), [server])
    monkeypatch.setenv("MY_KEY", "s3cret")
    engine = sglang_engine(conformance_model(0), [server], sglang_api_key_env="MY_KEY")
    engine.sync_weights(conformance_model(0), version=0)
    assert tokens(engine.generate([[5, 6]], GREEDY))
    assert "s3cret" not in repr(engine.clients[0])


def test_admin_routes_take_the_admin_key(protocol_server, sglang_engine, monkeypatch):
    server = protocol_server(api_key="user", admin_api_key="admin")
    monkeypatch.setenv("SGLANG_API_KEY", "user")
    monkeypatch.delenv("SGLANG_ADMIN_API_KEY", raising=False)
    engine = sglang_engine(conformance_model(0), [server])  # health and info: the user key
    with pytest.raises(SGLangServerError, match=r"/pause_generation answered HTTP 401.*admin"):
        engine.sync_weights(conformance_model(0), version=0)
    monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "admin")
    engine = sglang_engine(conformance_model(0), [server])
    engine.sync_weights(conformance_model(0), version=0)
    assert engine.generate([[5, 6]], GREEDY)[0][0].policy_version == 0


# -- set-ups the engine refuses before sampling ----------------------------------------------------


def test_distributed_sync_to_a_data_parallel_server_is_refused(protocol_server, sglang_engine):
    server = protocol_server(dp_size=2)
    with pytest.raises(SGLangServerError, match=r"dp_size 2.*--sglang-weight-sync disk"):
        sglang_engine(
            conformance_model(0),
            [server],
            sglang_weight_sync="distributed",
            sglang_group_backend="gloo",
        )


def test_tensor_sync_of_a_policy_on_the_cpu_is_refused_before_anything_starts(protocol_server):
    from areno_sglang.config import SGLangEngineConfig

    server = protocol_server()
    config = SGLangEngineConfig(sglang_url=server.url, sglang_weight_sync="tensor")
    with pytest.raises(SGLangServerError, match=r"CUDA memory handles.*is on cpu.*disk"):
        SGLangEngine(conformance_model(0), [EOS], None, config, dp_rank=0, dp_size=1)
    assert server.calls == []
