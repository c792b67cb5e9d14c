"""A small JSON-over-HTTP client for one SGLang server's native API (standard library only).

Routes used (SGLang's ``http_server.py``, 0.5.23): ``GET /health``, ``GET /model_info`` and
``GET /server_info`` (the deprecated ``/get_model_info`` and ``/get_server_info`` of older
releases only when those answer 404), ``POST /generate``, ``POST /update_weights_from_disk``,
``POST /init_weights_update_group``, ``POST /update_weights_from_distributed``,
``POST /destroy_weights_update_group``, ``POST /update_weights_from_tensor``,
``POST /release_memory_occupation``, ``POST /resume_memory_occupation``,
``POST /flush_cache``, ``POST /pause_generation``, ``POST /continue_generation``.

Servers started with ``--api-key`` or ``--admin-api-key`` get the key as a bearer token: the
admin key (when given) on the admin routes, the API key everywhere else, as SGLang checks them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from areno_core.errors import ArenoError
from areno_core.log import get_logger

logger = get_logger(__name__)


class SGLangServerError(ArenoError):
    """A server could not be reached, refused a request, or answered something unexpected."""


class StaleWeightsError(SGLangServerError):
    """A server does not hold the weights areno pushed to it (its weight version differs)."""


class ConnectionRefused(SGLangServerError):
    """Nothing listens at the server's address (the connection was refused)."""


ADMIN_ROUTES = frozenset(
    {
        "/update_weights_from_disk", "/update_weights_from_tensor",
        "/update_weights_from_distributed", "/init_weights_update_group",
        "/destroy_weights_update_group", "/release_memory_occupation",
        "/resume_memory_occupation", "/flush_cache", "/pause_generation",
        "/continue_generation",
    }
)  # fmt: skip
"""The routes SGLang marks admin-optional (with ``--admin-api-key`` only that key opens them)."""


class SGLangClient:
    """Calls one server at ``url`` (``http://host:port``); every error names the server.

    ``api_key`` / ``admin_api_key``: the server's ``--api-key`` / ``--admin-api-key``, sent as
    ``Authorization: Bearer ...`` (never logged)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        admin_api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._api_key = api_key or None
        self._admin_api_key = admin_api_key or None

    def __repr__(self) -> str:
        return f"SGLangClient({self.url!r})"

    # -- transport ---------------------------------------------------------------------------

    def request(
        self, method: str, route: str, payload: Any = None, *, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """``(status, body)``; the body is parsed JSON when it is JSON, else text. Raises
        :class:`SGLangServerError` when the server cannot be reached."""
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        key = self._admin_api_key if route in ADMIN_ROUTES else None
        key = key or self._api_key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url + route, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                return resp.status, _parse(resp.read())
        except urllib.error.HTTPError as exc:
            status, body = exc.code, _parse(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            kind = (
                ConnectionRefused
                if isinstance(reason, ConnectionRefusedError)
                else SGLangServerError
            )
            raise kind(f"SGLang server {self.url}: {method} {route} failed: {reason}") from exc
        if status in (401, 403):
            which = "admin API key" if route in ADMIN_ROUTES else "API key"
            given = "the key areno sent was refused" if key else "areno sent no key"
            raise SGLangServerError(
                f"SGLang server {self.url}: {method} {route} answered HTTP {status} "
                f"({_message(body)}): the server needs its {which} and {given}. Put the key in "
                "the environment variable named by --sglang-api-key-env (default "
                "SGLANG_API_KEY; admin routes: --sglang-admin-api-key-env, default "
                "SGLANG_ADMIN_API_KEY)"
            )
        return status, body

    def get(self, route: str, *, timeout_s: float | None = None) -> Any:
        return self._ok("GET", route, None, timeout_s)

    def post(self, route: str, payload: Any, *, timeout_s: float | None = None) -> Any:
        return self._ok("POST", route, payload, timeout_s)

    def _ok(self, method: str, route: str, payload: Any, timeout_s: float | None) -> Any:
        status, body = self.request(method, route, payload, timeout_s=timeout_s)
        if status != 200:
            raise SGLangServerError(
                f"SGLang server {self.url}: {method} {route} answered HTTP {status}: "
                f"{_message(body)}"
            )
        return body

    # -- routes ------------------------------------------------------------------------------

    def health(self) -> str | None:
        """None when ``GET /health`` answers 200 now, else what it answered (a server still
        starting answers 503). A refused connection raises :class:`ConnectionRefused`."""
        try:
            status, _ = self.request("GET", "/health", timeout_s=min(self.timeout_s, 30.0))
        except ConnectionRefused:
            raise
        except SGLangServerError as exc:
            return str(exc.__cause__ or exc)
        return None if status == 200 else f"HTTP {status}"

    def wait_healthy(
        self,
        timeout_s: float,
        *,
        poll_s: float = 0.5,
        report_s: float = 10.0,
        alive: Callable[[], str | None] | None = None,
        refused_is_final: bool = False,
    ) -> None:
        """Poll ``/health`` until it answers 200, logging a "waiting for SGLang at URL (n s)"
        line every ``report_s``; fail after ``timeout_s``, as soon as ``alive()`` returns why
        the server is gone (a launched process that exited), or, with ``refused_is_final``,
        at the first refused connection (a remote server that is not running there)."""
        started = time.monotonic()
        report_at = started + report_s
        while True:
            try:
                answer = self.health()
            except ConnectionRefused as exc:
                if refused_is_final:
                    raise ConnectionRefused(
                        f"SGLang server {self.url} refused the connection: nothing listens "
                        "there. Check --sglang-url, and that the server has finished starting "
                        "(it opens its port once the model is loaded)"
                    ) from exc
                answer = "connection refused"
            if answer is None:
                return
            gone = alive() if alive is not None else None
            if gone is not None:
                raise SGLangServerError(f"SGLang server {self.url} {gone}")
            now = time.monotonic()
            if now - started >= timeout_s:
                raise SGLangServerError(
                    f"SGLang server {self.url} did not answer /health within {timeout_s:g} s "
                    f"(--sglang-health-timeout-s; last answer: {answer}); is it running and "
                    "reachable from here?"
                )
            if now >= report_at:
                logger.info(
                    "waiting for SGLang at %s (%.0f s, last answer: %s)",
                    self.url,
                    now - started,
                    answer,
                )
                report_at = now + report_s
            time.sleep(poll_s)

    def model_info(self) -> dict[str, Any]:
        """``GET /model_info`` (``/get_model_info`` on releases before the rename)."""
        return self._info("/model_info", "/get_model_info")

    def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (``/get_server_info`` on releases before the rename)."""
        return self._info("/server_info", "/get_server_info")

    def _info(self, route: str, older: str) -> dict[str, Any]:
        status, body = self.request("GET", route)
        if status == 404:
            route = older
            status, body = self.request("GET", route)
        if status != 200:
            raise SGLangServerError(
                f"SGLang server {self.url}: GET {route} answered HTTP {status}: {_message(body)}"
            )
        return _mapping(body, self.url, route)

    def weight_version(self) -> str | None:
        """The version tag of the weights the server holds (``weight_version`` of
        ``/model_info``); None when the server reports none."""
        return _version_text(self.model_info().get("weight_version"))

    def generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """``POST /generate`` for a batch; one output per ``input_ids`` entry, in order."""
        body = self.post("/generate", payload)
        items = body if isinstance(body, list) else [body]
        if not all(isinstance(item, dict) for item in items):
            raise SGLangServerError(
                f"SGLang server {self.url}: /generate answered {str(body)[:200]!r}, not a list "
                "of outputs"
            )
        return items

    def update(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A weight-update route; its ``{"success": false, "message": ...}`` is an error."""
        status, body = self.request("POST", route, payload)
        if status != 200 or not isinstance(body, dict) or not body.get("success", False):
            raise SGLangServerError(
                f"SGLang server {self.url}: {route} failed (HTTP {status}): {_message(body)}"
            )
        return body

    def release_memory(self, tags: list[str] | None = None) -> None:
        """Hand back memory (``tags``: ``weights``, ``kv_cache``, ``cuda_graph``; all by
        default). Without ``--enable-weights-cpu-backup`` released weights are gone."""
        self.post("/release_memory_occupation", {} if tags is None else {"tags": tags})

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self.post("/resume_memory_occupation", {} if tags is None else {"tags": tags})

    def flush_cache(self, *, timeout_s: float = 60.0, poll_s: float = 0.2) -> None:
        """Flush the prefix cache. SGLang refuses (HTTP 400) while requests are pending, so
        this retries until it is idle, for at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            status, body = self.request("POST", "/flush_cache", {})
            if status == 200:
                return
            if status != 400 or time.monotonic() >= deadline:
                raise SGLangServerError(
                    f"SGLang server {self.url}: POST /flush_cache answered HTTP {status}"
                    + (f" for {timeout_s:g} s" if status == 400 else "")
                    + f": {_message(body)}"
                )
            time.sleep(poll_s)

    def pause_generation(self, mode: str = "retract") -> None:
        """Stop the scheduler between batches (``retract``: running requests go back to the
        queue, so the cache can be flushed; they resume on :meth:`continue_generation`)."""
        self.post("/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self.post("/continue_generation", {})


def _parse(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]


def _mapping(body: Any, url: str, route: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise SGLangServerError(f"SGLang server {url}: {route} answered {str(body)[:200]!r}")
    return body


def _version_text(value: Any) -> str | None:
    return None if value is None else str(value)
