"""Play DuelGrid in a browser against a model served by any OpenAI-compatible endpoint.

    python -m areno_recipes_agentic.duelgrid.web_ui --base-url http://127.0.0.1:8000/v1 \\
        --api-key EMPTY --model policy [--port 0] [--host 127.0.0.1] [--replay game.jsonl] \\
        [--disable-thinking]

You play ``U``; the model plays ``A``. The page is static HTML/JS/CSS shipped in this package
(no CDN, no request leaves the machine except the server's calls to ``--base-url``). The
browser only draws: this server owns the game state and applies every action with the same
rule engine the training reward uses (:mod:`areno_recipes_agentic.duelgrid.rules`). On A's
turn the server sends the state to the model with the loader's prompt and the
``choose_action`` tool, reads the reply exactly as the reward does
(:func:`~areno_recipes_agentic.duelgrid.episode.read_choice`) and applies it.

HTTP API (JSON in and out; errors are ``{"error": "..."}`` with a 4xx/5xx status):

========================  ===================================================================
``GET /api/state``        the current game: ``state`` (state dict), ``text`` (ASCII map),
                          ``to_move``, ``over``, ``winner``, ``turn_actions`` (U's actions so
                          far this turn), ``log``, ``model``, ``busy``, ``record``
``POST /api/new``         ``{"seed": int?, "size": int?, "first": "user"|"agent"}``: a new
                          generated map (default: random seed, 7x7, you move first)
``POST /api/user_action`` ``{"action": {"type": "MOVE", "direction": "up"}}`` plays one action
                          of your turn (a rejected one changes nothing, and your turn goes
                          on); ``{"end_turn": true}`` hands the turn to A
``POST /api/agent_turn``  asks the model for A's whole turn and plays it
``POST /api/replay``      ``{"jsonl": text, "index": int?}`` or ``{"record": {...}}``: replay a
                          recorded game; answers ``frames`` (the start and the state after
                          every turn) and continues the game from its end
========================  ===================================================================

The server is a Starlette app served by uvicorn (the agent endpoint's stack), with a deadline
of ``BODY_TIMEOUT_S`` on every request head
(:mod:`areno_core.agentic.http_protocol`); the game's methods, which may wait on the model,
run on worker threads. A request with two ``Host``, ``Content-Length``, ``Origin`` or
``Content-Type`` headers is refused (``400``): which one is meant would be ambiguous.

Requests from other sites are refused: a request must name this server in its ``Host`` header
(``127.0.0.1``/``localhost`` and the bound address, on the bound port: DNS rebinding cannot
reach it under another name), a POST must come from this page's own origin when it says where
it comes from (``Origin``) and must be ``Content-Type: application/json`` (which a cross-site
form or ``text/plain`` fetch cannot send without a CORS preflight this server never grants).
Bodies are bounded (``MAX_BODY_BYTES``) and must arrive within ``BODY_TIMEOUT_S``; every
response carries ``X-Content-Type-Options: nosniff``, ``Cache-Control: no-store`` and a CSP
that forbids framing.

A recorded game is one JSON object per line: ``{"state": <start state dict>, "turns":
[{"unit": "U", "actions": [...]}, {"unit": "A", "actions": [...]}, ...]}``. ``/api/state``
returns the current game in that form (``record``), the ``duelgrid`` agent stores its games in
that form (trajectory ``metadata["game"]``), and a dataset row (``{"state": ...}``) replays as
the start of a game, so any generated position can be played from here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from importlib import resources
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from areno_core.agentic.http_protocol import protocol_class
from areno_recipes_agentic.agents import assistant_message
from areno_recipes_agentic.duelgrid.episode import (
    applied_prefix,
    describe_events,
    read_choice,
    replay,
)
from areno_recipes_agentic.duelgrid.generate import MIN_GENERATED_SIZE, generate_state
from areno_recipes_agentic.duelgrid.loader import duelgrid_prompt, read_state
from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    MAX_SIZE,
    USER,
    ActionRejected,
    Event,
    GameState,
    apply_actions,
    end_turn,
    parse_action,
    state_to_dict,
    state_to_text,
)
from areno_recipes_agentic.duelgrid.tools import choose_action_tool
from areno_recipes_agentic.toolcalls import message_turn

MAX_BODY_BYTES = 4 * 1024 * 1024
BODY_TIMEOUT_S = 30.0
MAX_LOG = 300
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}

# Asks the model for A's turn in a state: returns the assistant message (OpenAI dict form).
AskModel = Callable[[GameState], dict[str, Any]]


class RequestError(Exception):
    """A request the game cannot serve; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def openai_asker(
    base_url: str,
    api_key: str,
    model: str,
    timeout_s: float = 120.0,
    *,
    disable_thinking: bool = False,
) -> AskModel:
    """An :data:`AskModel` that calls ``/chat/completions`` at ``base_url`` with the loader's
    prompt for the state and the ``choose_action`` tool. ``disable_thinking`` adds
    ``chat_template_kwargs: {"enable_thinking": false}`` to the request, which servers such as
    vLLM and SGLang pass to the chat template (models trained with ``--disable-thinking``)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
    extra: dict[str, Any] = {}
    if disable_thinking:
        extra["extra_body"] = {"chat_template_kwargs": {"enable_thinking": False}}

    def ask(state: GameState) -> dict[str, Any]:
        response = client.chat.completions.create(
            model=model,
            messages=duelgrid_prompt(state, "tool"),  # type: ignore[arg-type]
            tools=[choose_action_tool()],  # type: ignore[list-item]
            **extra,
        )
        return assistant_message(response)

    return ask


class GameSession:
    """One game in progress, its record and its log; every method is thread-safe."""

    def __init__(self, ask: AskModel, model_name: str = "policy") -> None:
        self._ask = ask
        self.model_name = model_name
        self._lock = threading.Lock()
        self._busy = False
        self.start: GameState = _user_first(generate_state(random.Random(0)))
        self.state = self.start
        self.turns: list[dict[str, Any]] = []
        self.turn_start = self.state
        self.turn_actions: list[dict[str, Any]] = []
        self.log: list[dict[str, str]] = []
        self._note("system", "New game: you play U, the model plays A. Your turn.")

    # -- views -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        state = self.state
        return {
            "state": state_to_dict(state),
            "text": state_to_text(state, viewer=USER),
            "to_move": state.to_move,
            "over": state.is_over,
            "winner": state.winner,
            "turn_actions": list(self.turn_actions),
            "log": self.log[-MAX_LOG:],
            "model": self.model_name,
            "busy": self._busy,
            "record": self._record(),
        }

    def _record(self) -> dict[str, Any]:
        return {"state": state_to_dict(self.start), "turns": list(self.turns)}

    # -- actions -----------------------------------------------------------------------------

    def new_game(self, seed: int | None = None, size: int = 7, first: str = "user") -> None:
        if not MIN_GENERATED_SIZE <= size <= MAX_SIZE:
            raise RequestError(f"size must be between {MIN_GENERATED_SIZE} and {MAX_SIZE}")
        if first not in ("user", "agent"):
            raise RequestError("first must be 'user' or 'agent'")
        seed = random.randrange(1_000_000) if seed is None else seed
        state = generate_state(random.Random(f"duelgrid-ui:{seed}"), size)
        with self._lock:
            self._idle()
            self._reset(_user_first(state) if first == "user" else state)
            self.log = []
            who = "Your" if first == "user" else "The model's"
            self._note("system", f"New game (seed {seed}, {size}x{size}). {who} turn.")

    def user_action(self, raw: Any) -> list[Event]:
        """Play one action of U's turn; a rejected action changes nothing."""
        with self._lock:
            self._idle()
            self._expect(USER)
            try:
                action = parse_action(raw).to_dict()
            except ActionRejected as exc:
                self._note("reject", f"U: {exc}")
                return [Event("invalid", USER, len(self.turn_actions), str(exc))]
            candidate = [*self.turn_actions, action]
            after, events = apply_actions(self.turn_start, USER, candidate)
            mine = [e for e in events if e.index == len(candidate) - 1]
            if any(e.kind == "invalid" for e in mine):
                for e in mine:
                    self._note("reject", f"U: {e.text}")
                return mine
            self.turn_actions = candidate
            self.state = after
            for line in describe_events(mine):
                self._note("user", line[2:])
            self._after_move()
            return mine

    def end_user_turn(self) -> None:
        with self._lock:
            self._idle()
            self._expect(USER)
            self.turns.append({"unit": USER, "actions": list(self.turn_actions)})
            self._hand_over()
            self._note("system", "Your turn is over; the model plays A.")

    def agent_turn(self) -> dict[str, Any]:
        """Ask the model for A's turn and play it; returns the reply and what it did."""
        with self._lock:
            self._idle()
            self._expect(AGENT)
            self._busy = True
            state = self.state
        try:
            reply = self._ask(state)
        except Exception as exc:
            with self._lock:
                self._busy = False
                self._note("error", f"model request failed: {type(exc).__name__}: {exc}")
            raise RequestError(
                f"the model request failed: {type(exc).__name__}: {exc}", HTTPStatus.BAD_GATEWAY
            ) from exc
        with self._lock:
            self._busy = False
            if self.state is not state:  # a new game or a replay came in meanwhile
                raise RequestError(
                    "the game changed while the model was thinking", HTTPStatus.CONFLICT
                )
            choice = read_choice(message_turn(reply), "tool")
            actions = list(choice.actions or ())
            after, events = apply_actions(state, AGENT, actions)
            shown = reply.get("content") or ""
            if choice.actions is None:
                self._note("model", f"A: no readable actions; A does nothing. {shown}".strip())
            else:
                how = " (read from its text)" if choice.source == "text" else ""
                self._note("model", f"A chose{how}: {json.dumps(actions)[:500]}")
            for line in describe_events(events):
                self._note("agent", line[2:])
            self.turns.append({"unit": AGENT, "actions": applied_prefix(actions, events)})
            self.state = after
            self._after_move()
            if not self.state.is_over:
                self._hand_over()
                self._note("system", "Your turn.")
            played = [e.to_dict() for e in events]
            return {"reply": reply, "source": choice.source, "events": played}

    def load_replay(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Replay a recorded game and continue from its end; returns the frames."""
        if "game" in record and isinstance(record["game"], Mapping):
            record = record["game"]  # an agent trajectory's metadata
        try:
            start = read_state(record.get("state"))
            turns = record.get("turns", [])
            if not isinstance(turns, list):
                raise ValueError("'turns' must be a list")
            frames = replay(start, turns)
        except ValueError as exc:
            raise RequestError(f"cannot replay this game: {exc}") from exc
        out = [{"unit": None, "actions": [], "events": [], "state": state_to_dict(start)}]
        for frame in frames:
            out.append(
                {
                    "unit": frame.unit,
                    "actions": list(frame.actions),
                    "events": describe_events(frame.events),
                    "state": state_to_dict(frame.state),
                }
            )
        with self._lock:
            self._idle()
            self._reset(start)
            self.turns = [{"unit": f.unit, "actions": list(f.actions)} for f in frames]
            self.state = frames[-1].state if frames else start
            self.turn_start = self.state
            self.log = []
            self._note("system", f"Replayed {len(frames)} turn(s).")
            self._after_move()
        return out

    # -- helpers ------------------------------------------------------------------------------

    def _reset(self, state: GameState) -> None:
        self.start = state
        self.state = state
        self.turn_start = state
        self.turns = []
        self.turn_actions = []

    def _idle(self) -> None:
        if self._busy:
            raise RequestError("the model is still playing its turn", HTTPStatus.CONFLICT)

    def _expect(self, unit: str) -> None:
        if self.state.is_over:
            raise RequestError("the game is over; start a new one", HTTPStatus.CONFLICT)
        if self.state.to_move != unit:
            who = "your" if self.state.to_move == USER else "the model's"
            raise RequestError(f"it is {who} turn ({self.state.to_move})", HTTPStatus.CONFLICT)

    def _hand_over(self) -> None:
        self.state = end_turn(self.state)
        self.turn_start = self.state
        self.turn_actions = []

    def _after_move(self) -> None:
        if self.state.is_over:
            winner = self.state.winner
            text = {USER: "You win!", AGENT: "The model wins."}.get(winner or "", "Draw.")
            self._note("system", f"Game over. {text}")

    def _note(self, kind: str, text: str) -> None:
        self.log.append({"kind": kind, "text": text})
        del self.log[:-MAX_LOG]


def _user_first(state: GameState) -> GameState:
    """Hand a generated state (A to move) to U, who gets its per-turn energy."""
    return end_turn(state) if state.to_move == AGENT else state


def parse_record_lines(text: str, index: int = 0) -> Mapping[str, Any]:
    """Line ``index`` (0-based, blank lines skipped) of JSONL ``text`` as a game record."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise RequestError("the JSONL text holds no game")
    if not 0 <= index < len(lines):
        raise RequestError(f"index {index} is out of range: the file has {len(lines)} game(s)")
    try:
        record = json.loads(lines[index])
    except ValueError as exc:
        raise RequestError(f"line {index + 1} is not JSON: {exc}") from exc
    if not isinstance(record, Mapping):
        raise RequestError(f"line {index + 1} is not a JSON object")
    return record


# -- HTTP -------------------------------------------------------------------------------------


def allowed_hosts(host: str, port: int, extra: Sequence[str] = ()) -> frozenset[str]:
    """The ``Host`` header values this server answers: the loopback names and the bound
    address (plus ``extra`` names), each with the port."""
    names = {*LOOPBACK_NAMES, *extra}
    if host not in ("0.0.0.0", "::", ""):
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset(f"{name}:{port}".lower() for name in names)


SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
}


def _refusal(request: Request, hosts: frozenset[str] | None, *, post: bool) -> RequestError | None:
    """Why a request from another site (or a rebound DNS name, or with ambiguous framing) is
    refused; None when it is served."""
    headers = request.headers
    for name in ("host", "content-length", "origin", "content-type"):
        if len(headers.getlist(name)) > 1:
            return RequestError(f"the request has more than one {name!r} header")
    host = (headers.get("host") or "").strip().lower()
    if hosts is not None and host not in hosts:
        return RequestError(f"Host {host!r} is not served here", HTTPStatus.FORBIDDEN)
    if (headers.get("sec-fetch-site") or "").lower() == "cross-site":
        return RequestError("cross-site requests are refused", HTTPStatus.FORBIDDEN)
    origin = headers.get("origin")
    if origin is not None and origin.strip().lower() != f"http://{host}":
        return RequestError(f"requests from origin {origin!r} are refused", HTTPStatus.FORBIDDEN)
    if post:
        kind = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            return RequestError(
                "send the body as Content-Type: application/json",
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            )
        if headers.get("transfer-encoding"):
            return RequestError(
                "send the body with a Content-Length header", HTTPStatus.LENGTH_REQUIRED
            )
        declared = (headers.get("content-length") or "0").strip()
        if not declared.isdigit():
            return RequestError(f"malformed Content-Length header {declared!r}")
        if int(declared) > MAX_BODY_BYTES:
            return RequestError(
                f"request body too large (at most {MAX_BODY_BYTES} bytes)",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
    return None


def build_app(session: GameSession, hosts: frozenset[str] | None = None) -> Starlette:
    """The UI's Starlette app for ``session``, answering only ``hosts`` (``Host`` header
    values; None: any, for tests that build the app without a server)."""

    def send(status: HTTPStatus, body: bytes, kind: str, *, close: bool = False) -> Response:
        headers = {**SECURITY_HEADERS, **({"connection": "close"} if close else {})}
        return Response(body, status_code=int(status), media_type=kind, headers=headers)

    def send_json(status: HTTPStatus, data: Any, *, close: bool = False) -> Response:
        body = json.dumps(data, default=str).encode()
        return send(status, body, "application/json", close=close)

    async def get(request: Request) -> Response:
        path = request.url.path
        refusal = _refusal(request, hosts, post=False)
        if refusal is not None:
            return send_json(refusal.status, {"error": str(refusal)})
        if path == "/favicon.ico":
            return send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        if path in STATIC_FILES:
            name, kind = STATIC_FILES[path]
            body = resources.files(__package__).joinpath("static", name).read_bytes()
            return send(HTTPStatus.OK, body, kind)
        if path == "/api/state":
            return send_json(HTTPStatus.OK, await run_in_threadpool(session.snapshot))
        return send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})

    async def post(request: Request) -> Response:
        refusal = _refusal(request, hosts, post=True)
        if refusal is not None:  # the body, if any, is left unread
            return send_json(refusal.status, {"error": str(refusal)}, close=True)
        try:
            body = await _read_body(request)
            extra = await run_in_threadpool(_act, session, request.url.path, body)
        except RequestError as exc:
            snapshot = await run_in_threadpool(session.snapshot)
            close = exc.status in (HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.BAD_REQUEST)
            return send_json(exc.status, {"error": str(exc), **snapshot}, close=close)
        snapshot = await run_in_threadpool(session.snapshot)
        return send_json(HTTPStatus.OK, {**snapshot, **extra})

    return Starlette(
        routes=[
            Route("/{path:path}", get, methods=["GET"]),
            Route("/{path:path}", post, methods=["POST"]),
        ]
    )


async def _read_body(request: Request) -> dict[str, Any]:
    length = int(request.headers.get("content-length") or 0)

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > length:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        raw = await asyncio.wait_for(read(), BODY_TIMEOUT_S) if length else b"{}"
    except TimeoutError as exc:
        raise RequestError(
            f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
            HTTPStatus.REQUEST_TIMEOUT,
        ) from exc
    except ClientDisconnect as exc:
        raise RequestError("the request body ended early") from exc
    if len(raw) < length:
        raise RequestError("the request body ended early")
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    return data


def _act(session: GameSession, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Carry out one POST on ``session`` (on a worker thread: the model call blocks)."""
    extra: dict[str, Any] = {}
    if path == "/api/new":
        session.new_game(
            seed=_opt_int(body, "seed"),
            size=_opt_int(body, "size") or 7,
            first=str(body.get("first", "user")),
        )
    elif path == "/api/user_action":
        if body.get("end_turn"):
            session.end_user_turn()
        elif "action" in body:
            extra["events"] = [e.to_dict() for e in session.user_action(body["action"])]
        else:
            raise RequestError("send {'action': {...}} or {'end_turn': true}")
    elif path == "/api/agent_turn":
        extra = session.agent_turn()
    elif path == "/api/replay":
        if "record" in body:
            record = body["record"]
            if not isinstance(record, Mapping):
                raise RequestError("'record' must be an object")
        elif isinstance(body.get("jsonl"), str):
            record = parse_record_lines(body["jsonl"], _opt_int(body, "index") or 0)
        else:
            raise RequestError("send {'jsonl': text, 'index': n} or {'record': {...}}")
        extra["frames"] = session.load_replay(record)
    else:
        raise RequestError(f"no such endpoint: {path}", HTTPStatus.NOT_FOUND)
    return extra


def _opt_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise RequestError(f"{key!r} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{key!r} must be an integer, got {value!r}") from exc


class UIServer:
    """The UI's HTTP server: the Starlette app served by uvicorn on a socket bound at
    creation. ``serve_forever()`` serves until ``shutdown()`` (from another thread) or a
    signal; ``server_address`` is the bound ``(host, port)``."""

    def __init__(self, session: GameSession, host: str, port: int, allow_hosts: Sequence[str]):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self._socket.listen(128)
        self.server_address: tuple[str, int] = tuple(self._socket.getsockname()[:2])  # type: ignore[assignment]
        hosts = allowed_hosts(host, int(self.server_address[1]), [h.lower() for h in allow_hosts])
        config = uvicorn.Config(
            build_app(session, hosts),
            loop="asyncio",
            http=protocol_class(head_timeout_s=BODY_TIMEOUT_S),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=5,
            timeout_graceful_shutdown=2,
            server_header=False,
        )
        self._server = uvicorn.Server(config)
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown` (``poll_interval`` is accepted for compatibility with
        ``socketserver``; uvicorn checks for shutdown on its own)."""
        self._stopped.clear()
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._server.should_exit = True
        self._stopped.wait(10)

    def server_close(self) -> None:
        self._socket.close()


def make_server(
    session: GameSession,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allow_hosts: Sequence[str] = (),
) -> UIServer:
    """An HTTP server for ``session`` (not started; call ``serve_forever``); it answers the
    ``Host`` names of :func:`allowed_hosts` (``allow_hosts`` adds names, e.g. a LAN name)."""
    return UIServer(session, host, port, allow_hosts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_agentic.duelgrid.web_ui",
        description="Play DuelGrid in the browser against a model behind an OpenAI-compatible "
        "endpoint. You play U; the model plays A.",
    )
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--api-key", default="EMPTY", help="API key for --base-url")
    parser.add_argument("--model", default="policy", help="model name to request")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to this host name (repeatable; loopback names "
        "and the bound address are always answered)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="model request timeout, s")
    parser.add_argument("--seed", type=int, default=None, help="seed of the first map")
    parser.add_argument("--replay", default=None, help="JSONL file of recorded games to load")
    parser.add_argument("--replay-index", type=int, default=0, help="which game of --replay")
    parser.add_argument(
        "--disable-thinking",
        action="store_true",
        help="send chat_template_kwargs enable_thinking=false (vLLM/SGLang; for models "
        "trained with --disable-thinking)",
    )
    args = parser.parse_args(argv)

    ask = openai_asker(
        args.base_url,
        args.api_key,
        args.model,
        args.timeout,
        disable_thinking=args.disable_thinking,
    )
    session = GameSession(ask, args.model)
    session.new_game(seed=args.seed)
    if args.replay:
        try:
            with open(args.replay, encoding="utf-8") as fh:
                session.load_replay(parse_record_lines(fh.read(), args.replay_index))
        except (OSError, RequestError) as exc:
            parser.error(f"--replay: {exc}")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: binding {args.host}: anyone who can reach it can use your model endpoint",
            file=sys.stderr,
        )
    server = make_server(session, args.host, args.port, allow_hosts=args.allow_host)
    host, port = server.server_address[:2]
    print(f"DuelGrid UI on http://{host}:{port}/ (model {args.model} at {args.base_url})")
    sys.stdout.flush()
    try:
        server.serve_forever()  # until Ctrl-C or SIGTERM
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
