"""A local OpenAI-compatible chat endpoint in front of the rollout engine.

    with AgentServer(engine, tokenizer, sampling_defaults=SamplingParams(max_new_tokens=64),
                     timeout_s=60) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
        reply = client.chat.completions.create(model="policy", messages=[...], tools=[...])
        reply.choices[0].areno["token_ids"]  # what the policy sampled, exactly

Threads: the stdlib ``ThreadingHTTPServer`` answers each connection on its own thread; handler
threads only parse and validate JSON, queue the request and wait. One scheduler thread owns the
engine and the tokenizer: it gathers the queued requests for ``batch_wait_s``, renders their
prompts, and issues one ``engine.generate`` call per distinct sampling setting, so concurrent
agent requests are decoded together. Requests with a ``seed`` are generated on their own, so
their result does not depend on what else was queued.

Every served choice is kept in :attr:`AgentServer.records` (by response id) and is returned
with an ``areno`` extension field (prompt and completion token ids, logprobs, prompt spans);
see docs/agentic.md. When a request repeats an assistant message this server returned, after
the same earlier messages, its prompt reuses that completion's exact tokens (prompt +
sampled tokens) instead of re-rendering the message text, so multi-turn trajectories share
their prefixes token for token (:mod:`areno_core.agentic.prompt`).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import attrs
import torch

from areno_core.agentic.prompt import Prompt, PromptBuilder
from areno_core.agentic.toolparse import parse_assistant_text
from areno_core.log import get_logger, warn_once
from areno_core.rollout.sampling import is_greedy, seeded
from areno_core.types import Completion, SamplingParams

logger = get_logger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_N = 64
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class RequestError(Exception):
    """A request the endpoint refuses; becomes an OpenAI-style error response."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def payload(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )
        return error_payload(str(self), kind=kind, param=self.param, code=self.code)


def error_payload(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- records ---------------------------------------------------------------------------------


@attrs.frozen
class ServedChoice:
    """One choice the endpoint returned, with everything needed to rebuild its token row."""

    index: int
    message: Mapping[str, Any]
    finish_reason: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    engine_finish_reason: str
    prompt_spans: tuple[Mapping[str, Any], ...] = ()
    prefix_reused: bool = False

    def extension(self) -> dict[str, Any]:
        """The ``areno`` field of the choice in the response (see docs/agentic.md)."""
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "finish_reason": self.engine_finish_reason,
            "prompt_spans": [dict(s) for s in self.prompt_spans],
            "prefix_reused": self.prefix_reused,
        }


@attrs.frozen
class ServedCompletion:
    """One ``chat.completion`` response and the request it answered."""

    id: str
    created: int
    model: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    choices: tuple[ServedChoice, ...]


# -- messages --------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise RequestError(
                    400, "only text content parts are supported", param="messages", code=None
                )
        return "".join(parts)
    raise RequestError(400, f"message content must be a string or a list, got {content!r}")


def normalize_message(message: Any, index: int) -> dict[str, Any]:
    """A request message as the chat template sees it: text content, known keys only."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise RequestError(
            400, f"messages[{index}] must be an object with a string 'role'", param="messages"
        )
    out: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"))}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise RequestError(400, f"messages[{index}].tool_calls must be a list")
        normalized = []
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise RequestError(400, f"messages[{index}].tool_calls entries need function.name")
            arguments = function.get("arguments", "{}")
            entry: dict[str, Any] = {
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
            if isinstance(call.get("id"), str):
                entry["id"] = call["id"]
            normalized.append(entry)
        out["tool_calls"] = normalized
    return out


# -- requests --------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Pending:
    """A validated request waiting for the scheduler; a handler thread waits on ``done``."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    parse_tools: bool
    sampling: SamplingParams
    n: int
    stops: tuple[str, ...]
    model: str
    done: threading.Event = attrs.field(factory=threading.Event)
    status: int = 0
    payload: dict[str, Any] | None = None
    cancelled: bool = False

    def resolve(self, status: int, payload: dict[str, Any]) -> None:
        if not self.done.is_set():
            self.status, self.payload = status, payload
            self.done.set()


def _number(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise RequestError(400, f"'{key}' must be a {kind.__name__}, got {value!r}", param=key)
    return kind(value)


class AgentServer:
    """The agentic endpoint: ``start()``/``stop()`` or use as a context manager.

    ``sampling_defaults`` are the run's sampling settings; a request may lower
    ``max_tokens`` (never above ``sampling_defaults.max_new_tokens``) and set ``temperature``,
    ``top_p``, ``top_k`` and ``seed``. ``timeout_s`` bounds how long one request may wait for
    its answer (``504`` after that). ``generator`` seeds the engine's random stream for
    requests without a ``seed``; a ``seed`` in ``sampling_defaults`` only seeds that generator
    (a fixed seed for every generate() call would give repeated requests identical samples).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        sampling_defaults: SamplingParams,
        disable_thinking: bool = False,
        timeout_s: float = 300.0,
        generator: Any = None,
        model_name: str = "policy",
        batch_wait_s: float = 0.005,
        api_key: str | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        if sampling_defaults.seed is not None:
            if generator is None:
                generator = torch.Generator().manual_seed(int(sampling_defaults.seed))
            sampling_defaults = attrs.evolve(sampling_defaults, seed=None)
        self.sampling_defaults = sampling_defaults
        self.disable_thinking = disable_thinking
        self.timeout_s = float(timeout_s)
        self.generator = generator
        self.model_name = model_name
        self.batch_wait_s = batch_wait_s
        self.api_key = api_key or f"areno-{secrets.token_urlsafe(24)}"
        self.records: dict[str, ServedCompletion] = {}
        self.stats: dict[str, float] = dict.fromkeys(
            ("requests", "errors", "completions", "generate_calls", "prompt_tokens",
             "completion_tokens", "reused_prefixes", "max_batch"),
            0.0,
        )  # fmt: skip
        self._prompts = PromptBuilder(tokenizer, disable_thinking=disable_thinking)
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._httpd: _HTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("AgentServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> AgentServer:
        if self._httpd is not None:
            raise RuntimeError("AgentServer.start() called twice")
        _bypass_proxy_for_loopback()
        self._stopping = False
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler, self)
        serve = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="areno-agent-http",
            daemon=True,
        )
        schedule = threading.Thread(target=self._schedule, name="areno-agent-sched", daemon=True)
        self._threads = [serve, schedule]
        for thread in self._threads:
            thread.start()
        logger.debug("agent endpoint listening on %s", self.base_url)
        return self

    def stop(self) -> None:
        """Refuse new requests, answer queued ones with 503, and wait for the threads; a
        generate() call in progress finishes first (the engine cannot be interrupted)."""
        httpd = self._httpd
        if httpd is None:
            return
        with self._cond:
            self._stopping = True
            waiting = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for pending in waiting:
            pending.resolve(
                503, error_payload("the agent endpoint is shutting down", kind="server_error")
            )
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._httpd = None
        logger.debug("agent endpoint stopped (%d responses served)", len(self.records))

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def get_choice(self, response_id: str, index: int = 0) -> ServedChoice | None:
        """The recorded choice ``index`` of response ``response_id``, if this server served it."""
        record = self.records.get(response_id)
        if record is None or not 0 <= index < len(record.choices):
            return None
        return record.choices[index]

    # -- handler side (any thread) ----------------------------------------------------------

    def check_auth(self, header: str | None) -> None:
        expected = f"Bearer {self.api_key}"
        if header is None or not hmac.compare_digest(header.encode(), expected.encode()):
            raise RequestError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <ctx.api_key>'",
                code="invalid_api_key",
            )

    def models_payload(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "areno"}],
        }

    def complete(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Validate, queue and wait for one chat-completion request: (status, payload)."""
        pending = self._parse(body)
        with self._cond:
            if self._stopping:
                raise RequestError(503, "the agent endpoint is shutting down")
            self._queue.append(pending)
            self._cond.notify_all()
        if not pending.done.wait(self.timeout_s):
            pending.cancelled = True
            self.stats["errors"] += 1
            return 504, error_payload(
                f"no completion within --agent-timeout-s={self.timeout_s:g} s",
                kind="timeout",
                code="timeout",
            )
        assert pending.payload is not None
        return pending.status, pending.payload

    def _parse(self, body: Any) -> _Pending:
        if not isinstance(body, Mapping):
            raise RequestError(400, "the request body must be a JSON object")
        if body.get("stream"):
            raise RequestError(
                400,
                "streaming is not supported by the areno agent endpoint; send stream=false",
                param="stream",
            )
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        messages = [normalize_message(m, i) for i, m in enumerate(raw_messages)]
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise RequestError(400, "'tools' must be a list of objects", param="tools")
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none", "required") and not isinstance(choice, Mapping):
            raise RequestError(400, f"unsupported tool_choice {choice!r}", param="tool_choice")
        n = _number(body, "n", int, 1)
        if not 1 <= n <= MAX_N:
            raise RequestError(400, f"'n' must be between 1 and {MAX_N}", param="n")
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise RequestError(400, "'stop' must be a string or a list of strings", param="stop")
        return _Pending(
            messages=messages,
            tools=[dict(t) for t in tools],
            parse_tools=bool(tools) and choice != "none",
            sampling=self._sampling(body),
            n=n,
            stops=tuple(stops),
            model=str(body.get("model") or self.model_name),
        )

    def _sampling(self, body: Mapping[str, Any]) -> SamplingParams:
        base = self.sampling_defaults
        limit = base.max_new_tokens
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = limit if asked is None else _number({"max_tokens": asked}, "max_tokens", int, 0)
        if max_new < 1:
            raise RequestError(400, "'max_tokens' must be at least 1", param="max_tokens")
        temperature = _number(body, "temperature", float, None)
        top_p = _number(body, "top_p", float, base.top_p)
        top_k = _number(body, "top_k", int, base.top_k)
        seed = _number(body, "seed", int, None)
        if temperature is not None and temperature < 0:
            raise RequestError(400, "'temperature' must be >= 0", param="temperature")
        if not 0.0 < top_p <= 1.0:
            raise RequestError(400, "'top_p' must be in (0, 1]", param="top_p")
        if top_k < -1 or top_k == 0:
            raise RequestError(400, "'top_k' must be -1 or a positive integer", param="top_k")
        sampling = attrs.evolve(
            base,
            max_new_tokens=min(max_new, limit),
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            **({} if temperature is None else {"temperature": temperature, "greedy": False}),
        )
        run_t = 1.0 if is_greedy(base) else base.temperature
        if (1.0 if is_greedy(sampling) else sampling.temperature) != run_t:
            warn_once(
                logger,
                "agentic.temperature",
                "an agent request set temperature=%s but the run trains at %s: rollout "
                "logprobs follow the request, so importance ratios of those tokens start off 1",
                temperature,
                run_t,
            )
        return sampling

    # -- scheduler thread -------------------------------------------------------------------

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            time.sleep(self.batch_wait_s)  # let requests sent at the same moment join
            with self._cond:
                batch = [p for p in self._queue if not p.cancelled]
                self._queue.clear()
            if batch:
                try:
                    self._serve(batch)
                except Exception as exc:  # a bug here must not leave handlers waiting
                    logger.exception("agent endpoint: serving a batch failed")
                    for pending in batch:
                        pending.resolve(500, error_payload(repr(exc), kind="server_error"))

    def _serve(self, batch: list[_Pending]) -> None:
        groups: dict[Any, list[tuple[_Pending, Prompt]]] = {}
        for pending in batch:
            try:
                prompt = self._prompts.build(pending.messages, pending.tools)
            except RequestError as exc:
                pending.resolve(exc.status, exc.payload())
                continue
            except Exception as exc:
                logger.debug("rendering a request failed", exc_info=True)
                pending.resolve(
                    400,
                    error_payload(
                        f"could not render the messages with the chat template: {exc}",
                        kind="invalid_request_error",
                        param="messages",
                    ),
                )
                continue
            key: Any = (pending.sampling, pending.n)
            if pending.sampling.seed is not None:
                key = (pending.sampling, pending.n, id(pending))
            groups.setdefault(key, []).append((pending, prompt))
        for members in groups.values():
            self._generate(members)

    def _generate(self, members: list[tuple[_Pending, Prompt]]) -> None:
        members = [(p, prompt) for p, prompt in members if not p.cancelled]
        if not members:
            return
        sampling, n = members[0][0].sampling, members[0][0].n
        try:
            outputs = self.engine.generate(
                [m[1].ids for m in members], seeded(sampling, self.generator), n=n
            )
        except Exception as exc:
            logger.exception("agent endpoint: engine.generate failed")
            for pending, _ in members:
                pending.resolve(
                    500, error_payload(f"generation failed: {exc!r}", kind="server_error")
                )
            return
        self.stats["generate_calls"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], float(len(members) * n))
        for (pending, prompt), completions in zip(members, outputs, strict=True):
            self.stats["requests"] += 1
            if not completions:
                self.stats["errors"] += 1
                pending.resolve(
                    400,
                    error_payload(
                        f"the prompt has {len(prompt.ids)} tokens, more than the rollout "
                        "engine accepts (--max-prompt-tokens)",
                        kind="invalid_request_error",
                        param="messages",
                        code="context_length_exceeded",
                    ),
                )
                continue
            pending.resolve(200, self._respond(pending, prompt, completions))

    def _respond(
        self, pending: _Pending, prompt: Prompt, completions: Sequence[Completion]
    ) -> dict[str, Any]:
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        choices = tuple(self._choice(i, pending, prompt, c) for i, c in enumerate(completions))
        record = ServedCompletion(
            id=response_id,
            created=created,
            model=pending.model,
            messages=tuple(pending.messages),
            tools=tuple(pending.tools),
            choices=choices,
        )
        self.records[response_id] = record
        for choice in choices:
            self._prompts.remember(
                pending.messages,
                pending.tools,
                choice.message,
                prompt_ids=choice.prompt_token_ids,
                prompt_spans=choice.prompt_spans,
                token_ids=choice.token_ids,
            )
        completion_tokens = sum(len(c.token_ids) for c in choices)
        self.stats["completions"] += len(choices)
        self.stats["prompt_tokens"] += len(prompt.ids)
        self.stats["completion_tokens"] += completion_tokens
        self.stats["reused_prefixes"] += float(prompt.reused)
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": pending.model,
            "choices": [
                {
                    "index": c.index,
                    "message": dict(c.message),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "areno": c.extension(),
                }
                for c in choices
            ],
            "usage": {
                "prompt_tokens": len(prompt.ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt.ids) + completion_tokens,
            },
        }

    def _choice(
        self, index: int, pending: _Pending, prompt: Prompt, completion: Completion
    ) -> ServedChoice:
        tokens = list(completion.token_ids)
        logprobs = list(completion.logprobs)
        finish = completion.finish_reason
        body = tokens[:-1] if finish == "stop" and tokens else tokens
        text = self._decode(body)
        if pending.stops:
            cut = _first_stop(text, pending.stops)
            if cut is not None:
                position, stop = cut
                keep = self._tokens_through(body, stop)
                text, tokens, logprobs, finish = (
                    text[:position],
                    tokens[:keep],
                    logprobs[:keep],
                    "stop",
                )
        content, calls = parse_assistant_text(
            text, tools=pending.tools, parse_tools=pending.parse_tools
        )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return ServedChoice(
            index=index,
            message=message,
            finish_reason="tool_calls" if calls and finish == "stop" else finish,
            prompt_token_ids=tuple(prompt.ids),
            token_ids=tuple(tokens),
            logprobs=tuple(float(x) for x in logprobs),
            engine_finish_reason=finish,
            prompt_spans=prompt.spans,
            prefix_reused=prompt.reused,
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _tokens_through(self, ids: list[int], stop: str) -> int:
        """The fewest leading tokens of ``ids`` whose text contains ``stop``."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if stop in self._decode(ids[:mid]):
                hi = mid
            else:
                lo = mid + 1
        return hi


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    found = [(text.find(s), s) for s in stops]
    hits = [(pos, s) for pos, s in found if pos >= 0]
    return min(hits) if hits else None


def _bypass_proxy_for_loopback() -> None:
    """HTTP clients honour proxy variables; make sure loopback requests skip the proxy."""
    if not any(os.environ.get(v) for v in _PROXY_VARS):
        return
    for var in ("NO_PROXY", "no_proxy"):
        entries = [e.strip() for e in os.environ.get(var, "").split(",") if e.strip()]
        missing = [h for h in ("127.0.0.1", "localhost") if h not in entries]
        if missing:
            os.environ[var] = ",".join([*entries, *missing])
            logger.info("added %s to %s so agent requests bypass the proxy", missing, var)


# -- HTTP ------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, owner: AgentServer) -> None:
        self.owner = owner
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Close kept-alive client connections so their handler threads end now."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("agent endpoint: error while handling %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    timeout = 600  # idle keep-alive connections are closed after this many seconds

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("agent endpoint: " + format, *args)

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise RequestError(411, "send the body with a Content-Length header")
            return b""
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError(413, f"the request body must be at most {MAX_BODY_BYTES} bytes")
        return self.rfile.read(int(length))

    def _route(self, method: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        owner = self.server.owner
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models" or path.startswith("/v1/models/"):
            expected = "GET"
        elif path == "/v1/chat/completions":
            expected = "POST"
        else:
            raise RequestError(
                404, f"unknown path {path!r}; served: /v1/models, /v1/chat/completions"
            )
        owner.check_auth(self.headers.get("Authorization"))
        if method != expected:
            raise RequestError(405, f"{path} takes {expected}, not {method}")
        if path == "/v1/models":
            return 200, owner.models_payload()
        if path.startswith("/v1/models/"):
            name = path.rsplit("/", 1)[1]
            if name != owner.model_name:
                raise RequestError(404, f"no model {name!r}", param="model")
            return 200, owner.models_payload()["data"][0]
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}") from exc
        return owner.complete(body)

    def _handle(self, method: str) -> None:
        try:
            status, payload = self._route(method, self._read_body())
        except RequestError as exc:
            status, payload = exc.status, exc.payload()
        except Exception as exc:
            logger.exception("agent endpoint: unexpected error")
            status, payload = 500, error_payload(repr(exc), kind="server_error")
        self._send(status, payload)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


__all__ = [
    "AgentServer",
    "RequestError",
    "ServedChoice",
    "ServedCompletion",
    "normalize_message",
]
