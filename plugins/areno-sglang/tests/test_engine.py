"""The sglang engine against protocol servers: placement over servers, weight pushes and their
versions, stale servers, health, memory release, and the three weight-sync methods."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from areno_sglang.client import (
    ConnectionRefused,
    SGLangClient,
    SGLangServerError,
    StaleWeightsError,
)
from areno_sglang.config import SGLangEngineConfig
from areno_sglang.engine import SGLangEngine
from areno_sglang.weights import free_port, pickle_serializer

from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.engine_conformance import (
    EOS,
    conformance_model,
    conformance_prompts,
    native_reference,
    tokens,
)
from areno_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=8, greedy=True)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _inputs(server, route="/generate"):
    return [body["input_ids"] for m, path, body in server.calls if path == route]


def test_generate_spreads_prompts_over_servers_with_all_samples_of_a_prompt_together(
    protocol_server, sglang_engine
):
    policy = conformance_model(0)
    servers = [protocol_server(), protocol_server()]
    engine = sglang_engine(policy, servers)
    engine.sync_weights(policy, version=0)
    prompts = conformance_prompts()[:4]
    out = engine.generate(prompts, GREEDY, n=2)
    expected = tokens(native_reference(policy).generate(prompts, GREEDY))
    assert tokens(out) == [g * 2 for g in expected]
    # prompts 0 and 2 on the first server, 1 and 3 on the second, each twice in a row
    assert _inputs(servers[0]) == [[prompts[0], prompts[0], prompts[2], prompts[2]]]
    assert _inputs(servers[1]) == [[prompts[1], prompts[1], prompts[3], prompts[3]]]
    assert engine.stats["requests"] == 8


def test_sync_weights_pushes_from_disk_tagged_with_the_version_to_every_server(
    protocol_server, sglang_engine, tmp_path
):
    policy = conformance_model(0)
    servers = [protocol_server(), protocol_server()]
    engine = sglang_engine(policy, servers, sglang_weights_dir=str(tmp_path / "w"))
    assert not _same_weights(servers[0].model, policy)
    engine.sync_weights(policy, version=0)
    for server in servers:
        assert server.weight_version == "0"
        assert _same_weights(server.model, policy)
        [push] = [b for _, p, b in server.calls if p == "/update_weights_from_disk"]
        assert push["weight_version"] == "0"
        assert push["model_path"] == str(tmp_path / "w" / "weights-v0")
    engine.sync_weights(conformance_model(1).state_dict(), version=4)
    assert [s.weight_version for s in servers] == ["4", "4"]
    assert _same_weights(servers[1].model, conformance_model(1))
    # only the latest weights stay on disk; config.json goes with them
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["weights-v4"]
    assert (tmp_path / "w" / "weights-v4" / "config.json").is_file()


def test_sync_weights_partial_state_dict_updates_only_those_tensors(protocol_server, sglang_engine):
    policy = conformance_model(0)
    server = protocol_server()
    engine = sglang_engine(policy, [server])
    engine.sync_weights(policy, version=0)
    head = {"lm_head.weight": torch.randn_like(policy.lm_head.weight)}
    engine.sync_weights(head, version=1)
    assert torch.equal(server.model.lm_head.weight, head["lm_head.weight"])
    embed = server.model.model.embed_tokens.weight
    assert torch.equal(embed, policy.model.embed_tokens.weight)


def test_server_that_keeps_its_old_weights_is_a_stale_weights_error(protocol_server, sglang_engine):
    policy = conformance_model(0)
    good, stale = protocol_server(), protocol_server()
    engine = sglang_engine(policy, [good, stale])
    engine.sync_weights(policy, version=0)
    stale.ignore_weight_updates = True
    with pytest.raises(StaleWeightsError, match=rf"{stale.url} reports weight version '0' after"):
        engine.sync_weights(policy, version=1)
    assert engine.policy_version == 0


def test_output_stamped_with_another_version_is_a_stale_weights_error(
    protocol_server, sglang_engine
):
    policy = conformance_model(0)
    server = protocol_server()
    engine = sglang_engine(policy, [server])
    engine.sync_weights(policy, version=3)
    server.stamp_version = "2"
    with pytest.raises(StaleWeightsError, match="weight version '2', but the policy is at ver"):
        engine.generate([[5, 6]], GREEDY)


def test_generate_before_any_sync_is_refused(protocol_server, sglang_engine):
    engine = sglang_engine(conformance_model(0), [protocol_server()])
    with pytest.raises(RuntimeError, match="before sync_weights"):
        engine.generate([[5, 6]], GREEDY)


def test_remote_server_that_refuses_the_connection_fails_at_once_naming_it(sglang_engine):
    port = free_port()  # nothing listens there
    server = type("Gone", (), {"url": f"http://127.0.0.1:{port}"})()
    began = time.monotonic()
    with pytest.raises(ConnectionRefused, match=rf"127.0.0.1:{port} refused the connection"):
        sglang_engine(conformance_model(0), [server], sglang_health_timeout_s=600.0)
    assert time.monotonic() - began < 5.0  # not the 600 s health timeout


def test_server_still_starting_is_waited_for_with_a_line_then_times_out(
    protocol_server, sglang_engine, monkeypatch, caplog
):
    server = protocol_server()
    monkeypatch.setattr(server, "get", lambda path: (503, "starting"))  # /health: 503
    monkeypatch.setattr(SGLangClient, "wait_healthy", _fast_reports(SGLangClient.wait_healthy))
    with (
        caplog.at_level(logging.INFO, logger="areno"),
        pytest.raises(SGLangServerError, match=r"did not answer /health within 0.6 s"),
    ):
        sglang_engine(conformance_model(0), [server], sglang_health_timeout_s=0.6)
    lines = [r.getMessage() for r in caplog.records if "waiting for SGLang" in r.getMessage()]
    assert lines and all(server.url in line and "HTTP 503" in line for line in lines)


def _fast_reports(wait_healthy):
    def wait(self, timeout_s, **kwargs):
        return wait_healthy(self, timeout_s, **{**kwargs, "poll_s": 0.05, "report_s": 0.2})

    return wait


def test_server_without_weight_versions_is_refused(protocol_server, sglang_engine, monkeypatch):
    server = protocol_server()
    original = server.get

    def old_sglang(path):
        status, body = original(path)
        if path == "/get_weight_version":
            return 404, {"detail": "Not Found"}
        if isinstance(body, dict):
            body.pop("weight_version", None)
        return status, body

    monkeypatch.setattr(server, "get", old_sglang)
    with pytest.raises(SGLangServerError, match="reports no weight_version"):
        sglang_engine(conformance_model(0), [server])


def test_max_running_prompts_bounds_each_generate_request(protocol_server, sglang_engine):
    policy = conformance_model(0)
    server = protocol_server()
    engine = sglang_engine(
        policy, [server], options=EngineOptions(attn_backend="native", max_running=3)
    )
    engine.sync_weights(policy, version=0)
    prompts = conformance_prompts()[:4]
    out = engine.generate(prompts, GREEDY, n=2)
    assert [len(batch) for batch in _inputs(server)] == [3, 3, 2]
    expected = tokens(native_reference(policy).generate(prompts, GREEDY))
    assert tokens(out) == [g * 2 for g in expected]


def test_session_end_with_drop_state_flushes_the_server_cache(protocol_server, sglang_engine):
    policy = conformance_model(0)
    server = protocol_server()
    engine = sglang_engine(policy, [server])
    engine.sync_weights(policy, version=0)
    pushed = len(server.calls)
    with RolloutSession(engine, drop_state=False):
        engine.generate([[5, 6]], GREEDY)
    assert "/flush_cache" not in [path for _, path, _ in server.calls[pushed:]]
    with RolloutSession(engine, drop_state=True):
        engine.generate([[5, 6]], GREEDY)
    assert server.routes("POST")[-1] == "/flush_cache"


def test_completion_text_is_decoded_here_like_the_native_engine(protocol_server, sglang_engine):
    from areno_core.models.loading import load_model_and_tokenizer
    from areno_core.rollout.native import NativeEngine

    torch.manual_seed(0)
    policy, tokenizer = load_model_and_tokenizer("random:qwen3-tiny")
    torch.manual_seed(1)
    other, _ = load_model_and_tokenizer("random:qwen3-tiny")
    engine = sglang_engine(policy, [protocol_server(other)], eos=tokenizer)
    engine.sync_weights(policy, version=0)
    prompts = [tokenizer.encode("2+2="), tokenizer.encode("hello")]
    sampling = SamplingParams(max_new_tokens=12, greedy=True)
    got = engine.generate(prompts, sampling)
    expected = NativeEngine(policy, tokenizer, EngineOptions(attn_backend="native")).generate(
        prompts, sampling
    )
    assert [g[0].text for g in got] == [g[0].text for g in expected]
    assert tokens(got) == tokens(expected)


def test_tensor_sync_hands_serialized_tensors_to_a_local_server(protocol_server, sglang_engine):
    policy = conformance_model(0)
    server = protocol_server()
    engine = SGLangEngine(
        policy,
        [EOS],
        EngineOptions(attn_backend="native"),
        SGLangEngineConfig(sglang_url=server.url, sglang_weight_sync="tensor"),
        dp_rank=0,
        dp_size=1,
        tensor_serializer=pickle_serializer,
    )
    try:
        engine.sync_weights(policy, version=5)
        assert server.routes("POST") == [
            "/pause_generation",
            "/update_weights_from_tensor",
            "/flush_cache",
            "/continue_generation",
        ]
        [push] = [b for _, p, b in server.calls if p == "/update_weights_from_tensor"]
        assert push["weight_version"] == "5" and push["flush_cache"] is True
        assert _same_weights(server.model, policy)
        prompts = conformance_prompts()
        out = engine.generate(prompts, GREEDY)
        assert tokens(out) == tokens(native_reference(policy).generate(prompts, GREEDY))
    finally:
        engine.close()


def test_tensor_sync_refuses_a_server_on_another_machine(protocol_server):
    server = protocol_server()
    far = server.url.replace("127.0.0.1", "localhost-but-far.invalid")
    config = SGLangEngineConfig(sglang_url=far, sglang_weight_sync="tensor")
    with pytest.raises(SGLangServerError, match="must run on this machine"):
        SGLangEngine(conformance_model(0), [EOS], None, config, dp_rank=0, dp_size=1)


def _spawn_protocol_server(model_dir: Path, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "areno_sglang.protocol_server", "--model-path", str(model_dir),
         "--port", str(port), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def test_distributed_sync_broadcasts_over_a_gloo_group_to_a_server_process(tmp_path):
    # The server runs in its own process, as SGLang does: both sides build the group the same
    # way, the server joins from /init_weights_update_group and receives each push by
    # broadcast from this trainer (rank 0).
    conformance_model(5).save_pretrained(tmp_path / "server-model")
    port = free_port()
    process = _spawn_protocol_server(tmp_path / "server-model", port)
    policy = conformance_model(0)
    config = SGLangEngineConfig(
        sglang_url=f"http://127.0.0.1:{port}",
        sglang_weight_sync="distributed",
        sglang_group_backend="gloo",
        sglang_health_timeout_s=120.0,
        sglang_timeout_s=120.0,
    )
    engine = None
    try:
        # A remote server must be up before the run starts (a refused connection fails fast).
        SGLangClient(f"http://127.0.0.1:{port}").wait_healthy(120.0)
        engine = SGLangEngine(policy, [EOS], None, config, dp_rank=0, dp_size=1)
        prompts = conformance_prompts()
        engine.sync_weights(policy, version=0)
        assert tokens(engine.generate(prompts, GREEDY)) == tokens(
            native_reference(policy).generate(prompts, GREEDY)
        )
        other = conformance_model(1)
        engine.sync_weights(other, version=1)
        out = engine.generate(prompts, GREEDY)
        assert tokens(out) == tokens(native_reference(other).generate(prompts, GREEDY))
        assert {c.policy_version for g in out for c in g} == {1}
    finally:
        if engine is not None:
            engine.close()
        process.terminate()
        process.wait(timeout=30)


def _post(url: str, route: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_colocated_mode_launches_a_server_releases_it_between_sessions_and_stops_it(tmp_path):
    # The launched module is the protocol server instead of sglang.launch_server (no GPU
    # here): areno writes the policy, starts the process with the colocated flags, waits for
    # health, pushes weights, releases memory when a session ends and resumes it before the
    # next rollout, and stops the process on close.
    policy = conformance_model(0)
    config = SGLangEngineConfig(
        sglang_mode="colocated", sglang_weight_sync="disk", sglang_health_timeout_s=120.0
    )
    engine = SGLangEngine(
        policy,
        [EOS],
        EngineOptions(attn_backend="native"),
        config,
        dp_rank=0,
        dp_size=1,
        launch_module="areno_sglang.protocol_server",
    )
    process = engine._server.process
    try:
        assert "--enable-memory-saver" in engine._server.command
        assert "--skip-tokenizer-init" in engine._server.command
        url = engine.clients[0].url
        prompts = conformance_prompts()
        engine.sync_weights(policy, version=0)
        with RolloutSession(engine):
            out = engine.generate(prompts, GREEDY)
        assert tokens(out) == tokens(native_reference(policy).generate(prompts, GREEDY))
        status, body = _post(url, "/generate", {"input_ids": [5, 6], "sampling_params": {}})
        assert status == 400 and "memory is released" in body["message"]
        engine.sync_weights(conformance_model(1), version=1)  # resumes, then pushes
        with RolloutSession(engine):
            again = engine.generate(prompts, GREEDY)
        expected = native_reference(conformance_model(1)).generate(prompts, GREEDY)
        assert tokens(again) == tokens(expected)
    finally:
        engine.close()
    assert process.poll() is not None
    assert not engine._model_dir.exists()
