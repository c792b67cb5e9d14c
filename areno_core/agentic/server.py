"""A local OpenAI-compatible chat endpoint in front of the rollout engine.

    with AgentServer(engine, tokenizer, sampling_defaults=SamplingParams(max_new_tokens=64),
                     timeout_s=60) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
        reply = client.chat.completions.create(model="policy", messages=[...], tools=[...])
        server.records[reply.id].choices[0].token_ids  # what the policy sampled, exactly

The HTTP side is an ASGI app (:mod:`areno_core.agentic.asgi`, on Starlette) served by uvicorn
on a thread of its own, bound to ``127.0.0.1``; requests are validated by pydantic models that
follow the OpenAI schema (:mod:`areno_core.agentic.schema`). A request goes through:

1. the key and the body size are checked before any of the body is read;
2. the body is validated; the prompt's size is bounded from its text before anything is
   rendered or tokenised (``max_prompt_tokens`` x the longest token of the vocabulary);
3. the prompt is built on a small thread pool (so a small request is not stuck behind a
   large one) and its token count checked against ``max_prompt_tokens``;
4. one scheduler thread owns the engine: it gathers the ready requests (for as long as more
   are being rendered or keep arriving within ``batch_wait_s`` of each other, at most
   ``max_batch_wait_s``) and
   issues one ``engine.generate`` call per distinct sampling setting, so concurrent agent
   requests are decoded together. Requests with a ``seed`` are generated on their own, so
   their result does not depend on what else was queued;
5. a request whose client disconnects, or that outlives ``timeout_s`` (answered ``504``), is
   cancelled: it is dropped if its generation has not started (a running ``generate`` call
   cannot be interrupted; its result is then discarded).

Each sample of a step may get its own base URL (:meth:`AgentServer.sample_base_url`,
``http://127.0.0.1:<port>/sample/<id>/v1``): what is served through it is recorded as that
sample's (``ServedCompletion.sample``), so an agent written with any framework needs to return
nothing but a reward (see docs/agentic.md).

Every served choice is kept in :attr:`AgentServer.records` (by response id) and is returned
with an ``areno`` extension field (prompt and completion token ids, logprobs, prompt spans);
see docs/agentic.md. When a request repeats an assistant message this server returned, after
the same earlier messages, its prompt reuses that completion's exact tokens (prompt + sampled
tokens) instead of re-rendering the message text, so multi-turn trajectories share their
prefixes token for token (:mod:`areno_core.agentic.prompt`).

Why one long module: :class:`AgentServer`'s HTTP thread and its scheduler thread share one
lock-guarded queue and record store; keeping both sides in one class keeps every use of that
lock in one file (token and text helpers live in :mod:`areno_core.agentic.tokens`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import os
import secrets
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import attrs
import torch

from areno_core.agentic.asgi import SAMPLE_PREFIX, build_app
from areno_core.agentic.http_protocol import (
    HEAD_TIMEOUT_S,
    MAX_OPEN_CONNECTIONS,
    protocol_class,
)
from areno_core.agentic.prompt import Prompt, PromptBuilder
from areno_core.agentic.records import ServedChoice, ServedCompletion
from areno_core.agentic.schema import (
    ChatRequest,
    NamedToolChoice,
    RequestError,
    content_chars,
    error_payload,
    template_messages,
    template_tools,
)
from areno_core.agentic.tokens import (
    forced_tool_prefix,
    longest_token_chars,
    token_bytes,
    top_logprobs,
)
from areno_core.agentic.toolparse import parse_assistant_text
from areno_core.log import get_logger, warn_once
from areno_core.rollout.sampling import is_greedy, seeded
from areno_core.types import Completion, SamplingParams

logger = get_logger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


# -- jobs ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Job:
    """One validated request on its way through the server."""

    request: ChatRequest
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sampling: SamplingParams
    n: int
    stops: tuple[str, ...]
    parse_tools: bool
    prefill: str
    model: str
    top_logprobs: int
    prompt: Prompt | None = None
    deadline: float = 0.0
    cancelled: bool = False
    started: bool = False
    future: asyncio.Future[tuple[int, dict[str, Any]]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    sample: tuple[int, int] | None = None
    """The sample whose URL the request came through (None: the shared URL)."""
    tokens: asyncio.Queue[tuple[int, int, float | None]] | None = None
    """Streamed requests on an engine that reports tokens as they are sampled: ``(choice,
    token id, logprob or None)`` as they come (see :mod:`areno_core.agentic.sse`)."""
    response_id: str = attrs.Factory(lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = attrs.Factory(lambda: int(time.time()))

    def push_tokens(self, entries: list[tuple[int, int, float | None]]) -> None:
        """Hand sampled tokens to the streaming handler (from the scheduler thread)."""
        queue, loop = self.tokens, self.loop
        if queue is None or loop is None or self.cancelled:
            return

        def put() -> None:
            for entry in entries:
                queue.put_nowait(entry)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(put)

    def resolve(self, status: int, payload: dict[str, Any]) -> None:
        """Hand the answer to the waiting request handler (from any thread)."""
        future, loop = self.future, self.loop
        if future is None or loop is None:
            return

        def set_result() -> None:
            if not future.done():
                future.set_result((status, payload))

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(set_result)


class AgentServer:
    """The agentic endpoint: ``start()``/``stop()`` or use as a context manager.

    ``sampling_defaults`` are the run's sampling settings; a request may lower ``max_tokens``
    (never above ``sampling_defaults.max_new_tokens``) and set ``temperature``, ``top_p``,
    ``top_k`` and ``seed``. ``timeout_s`` bounds how long one request may take from the end of
    its body to its answer (``504`` after that). ``generator`` seeds the engine's random
    stream for requests without a ``seed``; a ``seed`` in ``sampling_defaults`` only seeds
    that generator (a fixed seed for every generate() call would give repeated requests
    identical samples).

    Limits: ``max_body_bytes`` per request body (``413`` above it, checked before the body is
    read), ``body_timeout_s`` to receive a body (``408``), ``max_prompt_tokens`` per prompt
    (default: the engine's own limit; ``400`` with code ``context_length_exceeded`` above it,
    checked before generation), ``max_connections`` authenticated requests in flight (``503``
    beyond), ``head_timeout_s`` to receive a request's headers (the connection is closed) and
    ``max_open_connections`` open at once (:mod:`areno_core.agentic.http_protocol`).
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
        max_batch_wait_s: float = 0.25,
        api_key: str | None = None,
        max_prompt_tokens: int | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = 30.0,
        max_connections: int = 1024,
        render_threads: int = 2,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_open_connections: int = MAX_OPEN_CONNECTIONS,
        port: int = 0,
        engine_lock: threading.Lock | None = None,
    ) -> None:
        if timeout_s <= 0 or body_timeout_s <= 0 or head_timeout_s <= 0:
            raise ValueError(
                f"timeouts must be positive, got timeout_s={timeout_s}, "
                f"body_timeout_s={body_timeout_s}, head_timeout_s={head_timeout_s}"
            )
        if max_connections < 1 or max_open_connections < 1:
            raise ValueError(
                f"connection limits must be at least 1, got max_connections={max_connections}, "
                f"max_open_connections={max_open_connections}"
            )
        self.engine = engine
        # Held around every use of the engine: endpoints of batches in flight at once (the
        # asynchronous worker's --max-inflight-batches) share it, and take turns.
        self.engine_lock = engine_lock if engine_lock is not None else threading.Lock()
        self.tokenizer = tokenizer
        if sampling_defaults.seed is not None:
            if generator is None:
                generator = torch.Generator().manual_seed(int(sampling_defaults.seed))
            sampling_defaults = attrs.evolve(sampling_defaults, seed=None)
        self.sampling_defaults = sampling_defaults
        self.disable_thinking = disable_thinking
        self.timeout_s = float(timeout_s)
        self.body_timeout_s = float(body_timeout_s)
        self.generator = generator
        self.model_name = model_name
        self.batch_wait_s = batch_wait_s
        self.max_batch_wait_s = max(batch_wait_s, max_batch_wait_s)
        self.api_key = api_key or f"areno-{secrets.token_urlsafe(24)}"
        self.max_body_bytes = int(max_body_bytes)
        self.max_connections = int(max_connections)
        self.head_timeout_s = float(head_timeout_s)
        self.max_open_connections = int(max_open_connections)
        self.in_flight = 0  # authenticated requests being served (the HTTP thread's count)
        self.max_prompt_tokens = (
            max_prompt_tokens if max_prompt_tokens is not None else _engine_prompt_limit(engine)
        )
        self.records: dict[str, ServedCompletion] = {}
        self.streams_tokens = _accepts(engine.generate, "on_tokens")
        """The engine reports tokens as it samples them, so ``stream: true`` sends them then."""
        self._samples: dict[str, tuple[int, int]] = {}  # URL segment -> sample key
        self._sample_segments: dict[tuple[int, int], str] = {}
        self.stats: dict[str, float] = dict.fromkeys(
            ("requests", "errors", "completions", "generate_calls", "prompt_tokens",
             "completion_tokens", "reused_prefixes", "max_batch", "cancelled", "timeouts"),
            0.0,
        )  # fmt: skip
        self.tokenizer_lock = threading.Lock()
        self._prompts = PromptBuilder(
            tokenizer, disable_thinking=disable_thinking, tokenizer_lock=self.tokenizer_lock
        )
        self._max_prompt_chars: int | None = None
        self._prefills: dict[tuple[str, str | None], str | None] = {}
        self._render_threads = max(1, int(render_threads))
        self._render_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._queue: deque[Job] = deque()
        self._rendering = 0  # requests whose prompt is being built (they will join soon)
        self._cond = threading.Condition()
        self._stopping = False
        self._uvicorn: Any = None
        self._socket: socket.socket | None = None
        self._port: int | None = None
        self._bind_port = int(port)  # 0: a free port chosen by the system
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("AgentServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def sample_base_url(self, key: tuple[int, int]) -> str:
        """The base URL of sample ``key`` (``AgentItem.key``): requests through it are
        attributed to that sample in :attr:`records` (``ServedCompletion.sample``), so rows
        can be built for it from the records alone (:meth:`sample_records`)."""
        key = (int(key[0]), int(key[1]))
        segment = self._sample_segments.get(key)
        if segment is None:
            segment = f"{key[0]}.{key[1]}-{secrets.token_urlsafe(6)}"
            self._sample_segments[key] = segment
            self._samples[segment] = key
        return f"http://127.0.0.1:{self.port}{SAMPLE_PREFIX}{segment}/v1"

    def sample_of(self, segment: str) -> tuple[int, int] | None:
        """The sample a URL segment names (None: no such sample)."""
        return self._samples.get(segment)

    def sample_records(self, key: tuple[int, int]) -> list[ServedCompletion]:
        """What this server served through sample ``key``'s URL, in the order it was served."""
        return [record for record in list(self.records.values()) if record.sample == key]

    def start(self) -> AgentServer:
        if self._uvicorn is not None:
            raise RuntimeError("AgentServer.start() called twice")
        import uvicorn  # the endpoint's web stack loads only when an endpoint starts

        _bypass_proxy_for_loopback()
        if self.max_prompt_tokens is not None and self._max_prompt_chars is None:
            self._max_prompt_chars = self.max_prompt_tokens * longest_token_chars(self.tokenizer)
        self._stopping = False
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._bind_port))
        sock.listen(2048)
        self._socket, self._port = sock, int(sock.getsockname()[1])
        config = uvicorn.Config(
            build_app(self),
            loop="asyncio",
            http=protocol_class(
                head_timeout_s=self.head_timeout_s, max_open=self.max_open_connections
            ),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=2,
            limit_concurrency=None,  # counted by the app, authenticated requests only
            h11_max_incomplete_event_size=64 * 1024,
        )
        self._uvicorn = uvicorn.Server(config)
        self._render_pool = concurrent.futures.ThreadPoolExecutor(
            self._render_threads, thread_name_prefix="areno-agent-render"
        )
        serve = threading.Thread(
            target=self._uvicorn.run,
            kwargs={"sockets": [sock]},
            name="areno-agent-http",
            daemon=True,
        )
        schedule = threading.Thread(target=self._schedule, name="areno-agent-sched", daemon=True)
        self._threads = [serve, schedule]
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + 30.0
        while not self._uvicorn.started:
            if not serve.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the agent endpoint did not start (see the log above)")
            time.sleep(0.005)
        logger.debug("agent endpoint listening on %s", self.base_url)
        return self

    def stop(self) -> None:
        """Refuse new requests, answer queued ones with 503, and wait for the threads; a
        generate() call in progress finishes first (the engine cannot be interrupted)."""
        server = self._uvicorn
        if server is None:
            return
        with self._cond:
            self._stopping = True
            waiting = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in waiting:
            job.resolve(
                503, error_payload("the agent endpoint is shutting down", kind="server_error")
            )
        server.should_exit = True
        for thread in self._threads:
            thread.join()
        if self._render_pool is not None:
            self._render_pool.shutdown(wait=True, cancel_futures=True)
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
        self._threads = []
        self._uvicorn = None
        self._render_pool = None
        self._socket = None
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

    @property
    def stopping(self) -> bool:
        return self._stopping

    def models_payload(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "areno"}],
        }

    # -- request side (the event loop of the HTTP thread) -----------------------------------

    def prepare(self, request: ChatRequest, *, sample: tuple[int, int] | None = None) -> Job:
        """Turn a validated request into a job; refuses what cannot be served, cheaply (no
        rendering, no tokenisation). ``sample``: the sample whose URL it came through."""
        messages = template_messages(request)
        tools = template_tools(request)
        total = content_chars(messages, tools)
        if self._max_prompt_chars is not None and total > self._max_prompt_chars:
            raise RequestError(
                400,
                f"the messages hold {total} characters of text, more than a prompt of "
                f"max_prompt_tokens={self.max_prompt_tokens} tokens can hold",
                param="messages",
                code="context_length_exceeded",
            )
        choice = request.tool_choice or "auto"
        prefill = ""
        if choice == "required" or isinstance(choice, NamedToolChoice):
            name = choice.function.name if isinstance(choice, NamedToolChoice) else None
            prefill = self._forced_prefix(tools, name)
        top = request.top_logprobs or 0
        if top and getattr(self.engine, "model", None) is None:
            raise RequestError(
                400,
                "'top_logprobs' needs the policy model, which this rollout engine does not "
                "expose; ask for 'logprobs' without alternatives",
                param="top_logprobs",
            )
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        return Job(
            request=request,
            messages=messages,
            tools=tools,
            sampling=self._sampling(request),
            n=request.choices,
            stops=tuple(stops),
            parse_tools=bool(tools) and choice != "none",
            prefill=prefill,
            model=request.model,
            top_logprobs=top,
            sample=sample,
        )

    async def render(self, job: Job) -> None:
        """Build the job's prompt on the render pool; RequestError when it is too long."""
        loop = asyncio.get_running_loop()
        if self._render_pool is None:
            raise RequestError(503, "the agent endpoint is shutting down")
        with self._cond:
            self._rendering += 1
        try:
            job.prompt = await loop.run_in_executor(self._render_pool, self._build_prompt, job)
        except RequestError:
            raise
        except RuntimeError as exc:  # the pool was shut down meanwhile
            raise RequestError(503, "the agent endpoint is shutting down") from exc
        finally:
            with self._cond:
                self._rendering -= 1
        limit = self.max_prompt_tokens
        if limit is not None and len(job.prompt.ids) > limit:
            raise RequestError(
                400,
                f"the prompt has {len(job.prompt.ids)} tokens, more than the "
                f"max_prompt_tokens={limit} the rollout engine accepts",
                param="messages",
                code="context_length_exceeded",
            )

    def _build_prompt(self, job: Job) -> Prompt:
        if job.cancelled:
            raise RequestError(499, "the request was cancelled")
        try:
            full = self._prompts.render(job.messages, job.tools, True)
        except Exception as exc:
            logger.debug("rendering a request failed", exc_info=True)
            raise RequestError(
                400,
                f"could not render the messages with the chat template: {exc}",
                param="messages",
            ) from exc
        chars = self._max_prompt_chars
        if chars is not None and len(full) + len(job.prefill) > chars:
            raise RequestError(
                400,
                f"the rendered prompt has {len(full)} characters, more than a prompt of "
                f"max_prompt_tokens={self.max_prompt_tokens} tokens can hold",
                param="messages",
                code="context_length_exceeded",
            )
        return self._prompts.build(job.messages, job.tools, full=full, prefill=job.prefill)

    def submit(self, job: Job) -> asyncio.Future[tuple[int, dict[str, Any]]]:
        """Queue a rendered job for the scheduler; the future gets ``(status, payload)``."""
        loop = asyncio.get_running_loop()
        job.loop = loop
        job.future = loop.create_future()
        with self._cond:
            if self._stopping:
                raise RequestError(503, "the agent endpoint is shutting down")
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def cancel(self, job: Job, *, timed_out: bool) -> None:
        """The client left or the deadline passed: skip the job if it has not started."""
        if not job.cancelled:
            job.cancelled = True
            self.stats["timeouts" if timed_out else "cancelled"] += 1
            self.stats["errors"] += 1

    def timeout_payload(self) -> dict[str, Any]:
        return error_payload(
            f"no completion within --agent-timeout-s={self.timeout_s:g} s",
            kind="timeout",
            code="timeout",
        )

    def _sampling(self, request: ChatRequest) -> SamplingParams:
        base = self.sampling_defaults
        limit = base.max_new_tokens
        asked = request.max_completion_tokens or request.max_tokens
        temperature = request.temperature
        sampling = attrs.evolve(
            base,
            max_new_tokens=min(asked or limit, limit),
            top_p=base.top_p if request.top_p is None else request.top_p,
            top_k=base.top_k if request.top_k is None else request.top_k,
            seed=request.seed,
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

    def _forced_prefix(self, tools: list[dict[str, Any]], name: str | None) -> str:
        """The start of an assistant reply that calls a tool (``name``, or any with None), as
        the chat template writes it; appended to the prompt to honour ``tool_choice``."""
        key = (json.dumps(tools, sort_keys=True), name)
        if key not in self._prefills:
            self._prefills[key] = forced_tool_prefix(self.tokenizer, tools, name)
        prefix = self._prefills[key]
        if prefix is None:
            raise RequestError(
                400,
                "this model's chat template does not write tool calls in a form the endpoint "
                "can start for it, so tool_choice 'required' or a named function cannot be "
                "enforced; use 'auto'",
                param="tool_choice",
            )
        return prefix

    # -- scheduler thread -------------------------------------------------------------------

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            self._gather()
            with self._cond:
                batch = [job for job in self._queue if not job.cancelled]
                self._queue.clear()
                for job in batch:
                    job.started = True
            if batch:
                try:
                    self._serve(batch)
                except Exception as exc:  # a bug here must not leave handlers waiting
                    logger.exception("agent endpoint: serving a batch failed")
                    for job in batch:
                        job.resolve(500, error_payload(repr(exc), kind="server_error"))

    def _gather(self) -> None:
        """Let a burst of requests join one batch: wait while prompts are still being built
        or new requests keep arriving within ``batch_wait_s`` of each other, for at most
        ``max_batch_wait_s`` in all."""
        deadline = time.monotonic() + self.max_batch_wait_s
        with self._cond:
            seen = len(self._queue)
        while True:
            time.sleep(self.batch_wait_s)
            with self._cond:
                now, rendering = len(self._queue), self._rendering
            if (now == seen and not rendering) or time.monotonic() >= deadline:
                return
            seen = now

    def _serve(self, batch: list[Job]) -> None:
        groups: dict[Any, list[Job]] = {}
        for job in batch:
            key: Any = (job.sampling, job.n)
            if job.sampling.seed is not None:
                key = (job.sampling, job.n, id(job))
            groups.setdefault(key, []).append(job)
        for members in groups.values():
            self._generate(members)

    def _generate(self, members: list[Job]) -> None:
        members = [job for job in members if not job.cancelled]
        if not members:
            return
        sampling, n = members[0].sampling, members[0].n
        prompts = [list(job.prompt.ids) for job in members if job.prompt is not None]
        extra: dict[str, Any] = {}
        if self.streams_tokens and any(job.tokens is not None for job in members):
            extra["on_tokens"] = functools.partial(_route_tokens, members)
        try:
            with self.engine_lock:
                outputs = self.engine.generate(
                    prompts, seeded(sampling, self.generator), n=n, **extra
                )
        except Exception as exc:
            logger.exception("agent endpoint: engine.generate failed")
            for job in members:
                job.resolve(500, error_payload(f"generation failed: {exc!r}", kind="server_error"))
            return
        self.stats["generate_calls"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], float(len(members) * n))
        for job, completions in zip(members, outputs, strict=True):
            self.stats["requests"] += 1
            assert job.prompt is not None
            if not completions:
                self.stats["errors"] += 1
                job.resolve(
                    400,
                    error_payload(
                        f"the prompt has {len(job.prompt.ids)} tokens, more than the rollout "
                        "engine accepts (--max-prompt-tokens)",
                        kind="invalid_request_error",
                        param="messages",
                        code="context_length_exceeded",
                    ),
                )
                continue
            try:
                payload = self._respond(job, job.prompt, completions)
            except Exception as exc:
                logger.exception("agent endpoint: building a response failed")
                job.resolve(500, error_payload(repr(exc), kind="server_error"))
                continue
            job.resolve(200, payload)

    def _respond(
        self, job: Job, prompt: Prompt, completions: Sequence[Completion]
    ) -> dict[str, Any]:
        response_id, created = job.response_id, job.created
        choices = tuple(self._choice(i, job, prompt, c) for i, c in enumerate(completions))
        record = ServedCompletion(
            id=response_id,
            created=created,
            model=job.model,
            messages=tuple(job.messages),
            tools=tuple(job.tools),
            choices=choices,
            sample=job.sample,
        )
        self.records[response_id] = record
        for choice in choices:
            self._prompts.remember(
                job.messages,
                job.tools,
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
        logprobs = [self._logprobs(job, c) for c in choices]
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": job.model,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "refusal": None, **dict(c.message)},
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                    "areno": c.extension(),
                }
                for c, lp in zip(choices, logprobs, strict=True)
            ],
            "usage": {
                "prompt_tokens": len(prompt.ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt.ids) + completion_tokens,
            },
            "system_fingerprint": None,
        }

    def _choice(self, index: int, job: Job, prompt: Prompt, completion: Completion) -> ServedChoice:
        tokens = list(completion.token_ids)
        logprobs = list(completion.logprobs)
        finish = completion.finish_reason
        body = tokens[:-1] if finish == "stop" and tokens else tokens
        text = self._decode(body)
        if job.stops:
            cut = _first_stop(text, job.stops)
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
            job.prefill + text, tools=job.tools, parse_tools=job.parse_tools
        )
        if calls and job.request.parallel_tool_calls is False:
            calls = calls[:1]
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
            policy_version=int(getattr(completion, "policy_version", 0)),
        )

    def _logprobs(self, job: Job, choice: ServedChoice) -> dict[str, Any] | None:
        """The OpenAI ``logprobs`` object of a choice when the request asked for it."""
        if not job.request.logprobs:
            return None
        top: list[list[tuple[int, float]]] = []
        if job.top_logprobs:
            temperature = 1.0 if is_greedy(job.sampling) else job.sampling.temperature
            with self.engine_lock:
                top = top_logprobs(
                    self.engine.model,
                    list(choice.prompt_token_ids),
                    list(choice.token_ids),
                    job.top_logprobs,
                    temperature,
                )
        content = [
            self._logprob_entry(token, value, top[k] if top else ())
            for k, (token, value) in enumerate(zip(choice.token_ids, choice.logprobs, strict=True))
        ]
        return {"content": content, "refusal": None}

    def _logprob_entry(
        self, token: int, value: float, top: Sequence[tuple[int, float]] = ()
    ) -> dict[str, Any]:
        """One token's entry of an OpenAI ``logprobs.content`` list."""
        text, raw = self._token_text(token)
        alternatives = []
        for alt, alt_value in top:
            alt_text, alt_raw = self._token_text(alt)
            alternatives.append({"token": alt_text, "logprob": alt_value, "bytes": alt_raw})
        return {"token": text, "logprob": value, "bytes": raw, "top_logprobs": alternatives}

    def stream_logprobs(
        self,
        job: Job,
        tokens: Sequence[int],
        values: Sequence[float | None],
        start: int,
        text: str,
    ) -> tuple[int, list[dict[str, Any]] | None]:
        """The ``logprobs.content`` entries to stream with ``text`` (the content streamed so
        far): those of the tokens from ``start`` on whose text it holds whole. Returns how many
        leading tokens are covered then, and the entries; None (and ``start``) when the
        request asked for no logprobs, or for ``top_logprobs`` (computed from the whole
        completion, so sent at the end), or the engine did not report a token's logprob."""
        if not job.request.logprobs or job.top_logprobs or None in values:
            return start, None
        end = start
        while end < len(tokens):
            if len(self._decode(tokens[: end + 1]).rstrip("\ufffd")) > len(text):
                break
            end += 1
        entries = [
            self._logprob_entry(token, float(value))  # type: ignore[arg-type]
            for token, value in zip(tokens[start:end], values[start:end], strict=True)
        ]
        return end, entries

    def _token_text(self, token: int) -> tuple[str, list[int]]:
        with self.tokenizer_lock:
            raw = token_bytes(self.tokenizer, token)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _decode(self, ids: Sequence[int]) -> str:
        with self.tokenizer_lock:
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

    def stream_text(self, job: Job, tokens: Sequence[int]) -> str:
        """The text of the sampled ``tokens`` that can be streamed now: what the final message
        will surely start with. Held back: an unfinished UTF-8 character, everything from a
        ``<tool_call>`` block (or a suffix that may start one) or a stop string (or a suffix
        that may start one) on, trailing whitespace when tool calls are parsed (the content
        before a call is stripped), and all of a reply that may be a plain-JSON call or that
        continues a forced call."""
        if job.prefill:
            return ""
        text = self._decode(list(tokens)).rstrip("\ufffd")
        markers = list(job.stops)
        if job.parse_tools:
            if text.lstrip().startswith(("{", "[", "```")):
                return ""
            markers.append(TOOL_CALL_OPEN)
        found = [text.find(m) for m in markers]
        cut = min((f for f in found if f >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        else:
            for marker in markers:
                for k in range(min(len(marker) - 1, len(text)), 0, -1):
                    if text.endswith(marker[:k]):
                        text = text[:-k]
                        break
        return text.rstrip() if job.parse_tools else text


# -- helpers ---------------------------------------------------------------------------------


TOOL_CALL_OPEN = "<tool_call>"


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _route_tokens(members: Sequence[Job], entries: Sequence[tuple[Any, ...]]) -> None:
    """``on_tokens`` of one generate() call: each ``(prompt, sample, token)`` or ``(prompt,
    sample, token, logprob)`` to its job."""
    by_job: dict[int, list[tuple[int, int, float | None]]] = {}
    for prompt, sample, token, *value in entries:
        if 0 <= prompt < len(members) and members[prompt].tokens is not None:
            logprob = float(value[0]) if value else None
            by_job.setdefault(prompt, []).append((sample, token, logprob))
    for prompt, tokens in by_job.items():
        members[prompt].push_tokens(tokens)


def _engine_prompt_limit(engine: Any) -> int | None:
    options = getattr(engine, "options", None)
    for source in (options, engine):
        value = getattr(source, "max_prompt_tokens", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


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


__all__ = [
    "MAX_BODY_BYTES",
    "SAMPLE_PREFIX",
    "AgentServer",
    "Job",
    "RequestError",
    "ServedChoice",
    "ServedCompletion",
    "forced_tool_prefix",
    "longest_token_chars",
    "token_bytes",
]
