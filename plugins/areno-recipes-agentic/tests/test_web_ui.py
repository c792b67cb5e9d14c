"""The DuelGrid browser UI: its HTTP API in-process, then a scripted game in headless Chromium."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.loader import duelgrid_prompt
from areno_recipes_agentic.duelgrid.rules import GameState, state_from_map, state_to_dict
from areno_recipes_agentic.duelgrid.web_ui import GameSession, make_server, openai_asker

# U (you) at (1, 1), A (the model) at (1, 3); U moves first.
DUEL = [".....", ".U.A.", ".....", ".....", "....."]
ATTACK_CALL = {
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "choose_action", "arguments": '{"actions": [{"type": "ATTACK"}]}'},
        }
    ]
}


def _request(base: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def ui() -> Iterator[Callable[..., tuple[str, GameSession]]]:
    servers = []

    def start(ask: Callable[[GameState], dict[str, Any]]) -> tuple[str, GameSession]:
        session = GameSession(ask, "fake-model")
        server = make_server(session)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        host, port = server.server_address[:2]
        return f"http://{host}:{port}", session

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _duel(**user: Any) -> dict[str, Any]:
    return state_to_dict(state_from_map(DUEL, to_move="U", user=user or None))


def test_web_ui_user_turn_then_agent_turn_applies_rule_engine(ui: Any) -> None:
    asked: list[GameState] = []

    def ask(state: GameState) -> dict[str, Any]:
        asked.append(state)
        return {"role": "assistant", "content": "", **ATTACK_CALL}

    base, _ = ui(ask)
    status, data = _request(base, "/api/replay", {"record": {"state": _duel()}})
    assert status == 200 and data["to_move"] == "U"
    assert [f["unit"] for f in data["frames"]] == [None]

    status, data = _request(base, "/api/user_action", {"action": {"type": "PICKUP"}})
    assert status == 200
    assert data["events"][0]["kind"] == "invalid" and "no pickup" in data["events"][0]["text"]
    assert data["state"] == _duel()  # a rejected action changes nothing
    assert data["turn_actions"] == []

    _, data = _request(base, "/api/user_action", {"action": {"type": "move", "direction": "RIGHT"}})
    _, data = _request(base, "/api/user_action", {"action": {"type": "ATTACK"}})
    assert data["state"]["units"]["U"]["col"] == 2
    assert data["state"]["units"]["A"]["hp"] == 7
    assert data["turn_actions"] == [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]

    status, data = _request(base, "/api/agent_turn", {})
    assert status == 409 and "your turn" in data["error"]

    _, data = _request(base, "/api/user_action", {"end_turn": True})
    assert data["to_move"] == "A"
    status, data = _request(base, "/api/user_action", {"action": {"type": "ATTACK"}})
    assert status == 409

    status, data = _request(base, "/api/agent_turn", {})
    assert status == 200
    assert asked[0].to_move == "A" and asked[0].agent.hp == 7
    assert data["source"] == "tool"
    assert data["state"]["units"]["U"]["hp"] == 7
    assert data["to_move"] == "U"
    assert data["record"]["turns"] == [
        {"unit": "U", "actions": [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]},
        {"unit": "A", "actions": [{"type": "ATTACK"}]},
    ]
    texts = [entry["text"] for entry in data["log"]]
    assert "A attacks U" in texts and "U attacks A" in texts

    # the recorded game replays, through the same endpoint, to the same state
    _, replayed = _request(base, "/api/replay", {"jsonl": json.dumps(data["record"]) + "\n"})
    assert replayed["state"] == data["state"]
    assert [f["unit"] for f in replayed["frames"]] == [None, "U", "A"]


def test_web_ui_model_failure_502_state_unchanged(ui: Any) -> None:
    def ask(state: GameState) -> dict[str, Any]:
        raise ConnectionError("endpoint down")

    base, _ = ui(ask)
    _request(base, "/api/new", {"seed": 4, "first": "agent"})
    _, before = _request(base, "/api/state")
    status, data = _request(base, "/api/agent_turn", {})
    assert status == 502 and "endpoint down" in data["error"]
    assert data["state"] == before["state"] and data["busy"] is False


def test_web_ui_unreadable_reply_agent_does_nothing(ui: Any) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": "hmm"})
    _request(base, "/api/replay", {"record": {"state": _duel()}})
    _request(base, "/api/user_action", {"end_turn": True})
    status, data = _request(base, "/api/agent_turn", {})
    assert status == 200 and data["source"] == "none"
    assert data["record"]["turns"][-1] == {"unit": "A", "actions": []}
    assert data["to_move"] == "U"


def test_web_ui_new_game_seeded_and_dataset_row_replays(ui: Any) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": ""})
    _, first = _request(base, "/api/new", {"seed": 11, "size": 6})
    _, again = _request(base, "/api/new", {"seed": 11, "size": 6})
    assert first["state"] == again["state"] and first["state"]["size"] == 6
    assert first["to_move"] == "U"
    rows = generate_states(3, seed=2)
    jsonl = "".join(json.dumps(r) + "\n" for r in rows)
    _, data = _request(base, "/api/replay", {"jsonl": jsonl, "index": 2})
    assert data["state"] == rows[2]["state"] and data["to_move"] == "A"
    status, data = _request(base, "/api/replay", {"jsonl": jsonl, "index": 5})
    assert status == 400 and "out of range" in data["error"]
    status, data = _request(base, "/api/new", {"size": 99})
    assert status == 400


def test_web_ui_static_page_local_only(ui: Any) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": ""})
    with urllib.request.urlopen(base + "/", timeout=10) as response:
        page = response.read().decode()
        assert response.headers["Content-Security-Policy"] == (
            "default-src 'self'; frame-ancestors 'none'"
        )
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert '<script src="/static/app.js"' in page
    static = resources.files("areno_recipes_agentic.duelgrid").joinpath("static")
    for name in ("index.html", "app.js", "style.css"):
        text = static.joinpath(name).read_text()
        assert not re.search(r"https?://|//cdn|@import", text), name
    assert _request(base, "/nowhere")[0] == 404


def _raw(base: str, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP exchange with the UI (headers as given); (status, headers, body)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    blob, _, payload = data.partition(b"\r\n\r\n")
    lines = blob.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, payload


def _post_head(base: str, length: str, **headers: str) -> str:
    fields = {
        "Host": base.removeprefix("http://"),
        "Content-Type": "application/json",
        "Content-Length": length,
        "Connection": "close",
        **headers,
    }
    return "POST /api/new HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "text/plain"}, 415),  # a cross-site form or no-cors fetch
        ({"Origin": "http://evil.example"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Host": "evil.example:80"}, 403),  # DNS rebinding: the page's name is not ours
    ],
)
def test_web_ui_cross_site_post_is_refused_and_changes_nothing(
    ui: Any, headers: dict[str, str], status: int
) -> None:
    base, session = ui(lambda state: {"role": "assistant", "content": ""})
    before = session.snapshot()["state"]
    body = json.dumps({"seed": 5}).encode()
    got, response_headers, payload = _raw(base, _post_head(base, str(len(body)), **headers), body)
    assert got == status, payload
    assert response_headers["x-content-type-options"] == "nosniff"
    assert session.snapshot()["state"] == before


def test_web_ui_rebound_host_cannot_read_state(ui: Any) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": ""})
    status, _, payload = _raw(
        base, "GET /api/state HTTP/1.1\r\nHost: attacker.example:8080\r\nConnection: close\r\n"
    )
    assert status == 403 and b"not served here" in payload
    own = base.removeprefix("http://")
    status, _, _ = _raw(base, f"GET /api/state HTTP/1.1\r\nHost: {own}\r\nConnection: close\r\n")
    assert status == 200


@pytest.mark.parametrize(
    ("length", "body", "status"),
    [("abc", b"{}", 400), ("-5", b"{}", 400), (str(10 * 1024 * 1024), b"", 413)],
)
def test_web_ui_bad_content_length_is_answered_not_dropped(
    ui: Any, length: str, body: bytes, status: int
) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": ""})
    started = time.monotonic()
    got, headers, payload = _raw(base, _post_head(base, length), body)
    assert got == status, payload
    if headers.get("content-type") == "application/json":
        assert "error" in json.loads(payload)
    else:  # refused by the HTTP parser itself, before the app
        assert b"Invalid HTTP request" in payload
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    "extra",
    [
        "Host: evil.example:80\r\n",  # which Host is meant is ambiguous
        "Content-Length: 999\r\n",  # so is where the body ends
        "Content-Length: 12\r\n",
    ],
)
def test_web_ui_duplicate_host_or_content_length_is_refused(ui: Any, extra: str) -> None:
    base, session = ui(lambda state: {"role": "assistant", "content": ""})
    before = session.snapshot()["state"]
    body = json.dumps({"seed": 5}).encode()
    got, _, _ = _raw(base, _post_head(base, str(len(body))) + extra, body)
    assert got == 400
    assert session.snapshot()["state"] == before


def test_web_ui_same_origin_post_from_the_page_is_served(ui: Any) -> None:
    base, _ = ui(lambda state: {"role": "assistant", "content": ""})
    body = json.dumps({"seed": 5}).encode()
    head = _post_head(base, str(len(body)), Origin=base, **{"Sec-Fetch-Site": "same-origin"})
    status, _, payload = _raw(base, head, body)
    assert status == 200 and "seed 5" in json.loads(payload)["log"][0]["text"]


@pytest.fixture
def cli_ui(fake_openai: Any) -> Iterator[tuple[str, Any]]:
    model = fake_openai(lambda body: ATTACK_CALL)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "areno_recipes_agentic.duelgrid.web_ui",
            "--base-url",
            model.base_url,
            "--api-key",
            "sk-ui",
            "--model",
            "duel-model",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert match, (
            f"no URL in {line!r}; stderr: {process.stderr.read() if process.stderr else ''}"
        )
        yield match.group(0), model
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_web_ui_browser_scripted_game_updates_dom(
    chromium: Any, cli_ui: tuple[str, Any], read_png: Any, tmp_path: Path
) -> None:
    url, model = cli_ui
    status, _ = _request(url.rstrip("/"), "/api/replay", {"record": {"state": _duel()}})
    assert status == 200

    chromium.navigate(url)
    chromium.wait_for("document.querySelectorAll('#grid .cell').length === 25")
    assert chromium.evaluate("document.getElementById('model-name').textContent") == "duel-model"
    assert "Your turn" in chromium.evaluate("document.getElementById('status').textContent")
    assert chromium.evaluate("document.querySelector('#unit-U').parentElement.dataset.col") == "1"

    # a rejected action: the server explains, nothing moves
    chromium.evaluate("document.getElementById('btn-pickup').click()")
    chromium.wait_for("document.getElementById('log').textContent.includes('no pickup')")

    # the arrow key moves U next to A; the Attack button hits it
    chromium.press("ArrowRight", "ArrowRight", 39)
    chromium.wait_for("document.querySelector('#unit-U').parentElement.dataset.col === '2'")
    chromium.evaluate("document.getElementById('btn-attack').click()")
    chromium.wait_for("document.getElementById('hp-A').textContent === '7/10'")

    # ending the turn lets the model play (automatically); its ATTACK goes through the engine
    chromium.evaluate("document.getElementById('btn-end').click()")
    chromium.wait_for("document.getElementById('hp-U').textContent === '7/10'")
    chromium.wait_for("document.getElementById('status').textContent.includes('Your turn')")
    log = chromium.evaluate("document.getElementById('log').textContent")
    assert "U attacks A" in log and "A attacks U" in log
    assert chromium.evaluate("document.getElementById('btn-end').disabled") is False

    (request,) = model.requests
    assert request["model"] == "duel-model"
    assert request["tools"][0]["function"]["name"] == "choose_action"
    assert "hp 7/10" in request["messages"][1]["content"]

    png = chromium.screenshot()
    shot = tmp_path / "duelgrid.png"
    shot.write_bytes(png)
    width, height, rows = read_png(png)
    assert width >= 800 and height >= 600
    colors = {row[i : i + 3] for row in rows[::8] for i in range(0, len(row), 24)}
    assert len(colors) > 20  # board, tiles, units, text: far from a blank page


def test_openai_asker_prompt_tool_and_thinking_switch(fake_openai: Any) -> None:
    model = fake_openai(lambda body: ATTACK_CALL)
    state = state_from_map(DUEL)  # A to move
    reply = openai_asker(model.base_url, "k", "m", disable_thinking=True)(state)
    assert reply["tool_calls"][0]["function"]["name"] == "choose_action"
    body = model.requests[0]
    assert body["messages"] == duelgrid_prompt(state, "tool")
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    openai_asker(model.base_url, "k", "m")(state)
    assert "chat_template_kwargs" not in model.requests[1]
