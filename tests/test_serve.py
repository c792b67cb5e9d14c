"""``areno serve``: a checkpoint behind the agentic endpoint, answered through the ``openai``
client (plain and streamed), with the endpoint's key check, and its CLI's start and stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from areno_core.cli.main import main
from areno_core.errors import ConfigError
from areno_core.registry import get_registry
from areno_core.serve import ServeSettings, resolve_serve_ckpt, start_server, trim_records

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A saved model directory, as a step_N holds one."""
    from areno_core.models.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("random:qwen3-tiny")
    path = tmp_path_factory.mktemp("ckpt") / "step_3"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_checkpoint_answers_the_openai_client_plain_and_streamed(checkpoint) -> None:
    settings = ServeSettings(
        ckpt=str(checkpoint), port=0, api_key="sk-test", max_new_tokens=8, attn_backend="native"
    )
    server = start_server(settings, get_registry())
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["policy"]
        reply = client.chat.completions.create(
            model="policy", messages=MESSAGES, temperature=0, max_tokens=6
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert 1 <= reply.usage.completion_tokens <= 6
        stream = client.chat.completions.create(
            model="policy", messages=MESSAGES, temperature=0, max_tokens=6, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == reply.choices[0].message.content  # greedy: the same answer
        wrong = openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="policy", messages=MESSAGES)
        assert len(server.records) == 2
        trim_records(server, keep=1)
        assert len(server.records) == 1
    finally:
        server.stop()
        server.engine.end_session(drop_state=True)


def test_serve_command_starts_prints_the_address_and_stops_on_sigterm(checkpoint) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "areno_core.cli", "serve", "--ckpt", str(checkpoint),
         "--port", str(port), "--api-key", "sk-cli", "--max-new-tokens", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-cli", max_retries=0, timeout=10
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                reply = client.chat.completions.create(model="policy", messages=MESSAGES)
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.5)
        assert reply.usage.completion_tokens <= 4
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{port}/v1" in out and "sk-cli" in out
    assert "areno serve stopped." in out


def test_busy_port_is_a_clear_error_before_the_model_loads(capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--ckpt", "./not/loaded", "--port", str(port)])
    assert exc.value.code == 2
    assert f"--port {port}: 127.0.0.1:{port} is not free" in capsys.readouterr().err


def test_checkpoint_references_resolve_or_fail_clearly(checkpoint, tmp_path) -> None:
    assert resolve_serve_ckpt(str(checkpoint)) == str(checkpoint)
    assert resolve_serve_ckpt("random:qwen3-tiny") == "random:qwen3-tiny"
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        resolve_serve_ckpt(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no model and no checkpoints"):
        resolve_serve_ckpt(str(tmp_path))
