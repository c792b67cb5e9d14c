"""A small JSON-over-HTTP client for one SGLang server's native API (standard library only).

Routes used (SGLang's ``http_server.py``): ``GET /health``, ``GET /get_model_info``,
``GET /get_server_info``, ``GET /get_weight_version`` (with fallbacks for releases that renamed
them), ``POST /generate``,
``POST /update_weights_from_disk``, ``POST /init_weights_update_group``,
``POST /update_weights_from_distributed``, ``POST /destroy_weights_update_group``,
``POST /update_weights_from_tensor``, ``POST /release_memory_occupation``,
``POST /resume_memory_occupation``, ``POST /flush_cache``.
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


class SGLangClient:
    """Calls one server at ``url`` (``http://host:port``); every error names the server."""

    def __init__(self, url: str, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"SGLangClient({self.url!r})"

    # -- transport ---------------------------------------------------------------------------

    def request(
        self, method: str, route: str, payload: Any = None, *, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """``(status, body)``; the body is parsed JSON when it is JSON, else text. Raises
        :class:`SGLangServerError` when the server cannot be reached."""
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url + route,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                return resp.status, _parse(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _parse(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SGLangServerError(
                f"SGLang server {self.url}: {method} {route} failed: {reason}"
            ) from exc

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

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 now (a server still starting answers 503 or
        refuses the connection)."""
        try:
            status, _ = self.request("GET", "/health", timeout_s=min(self.timeout_s, 30.0))
        except SGLangServerError:
            return False
        return status == 200

    def wait_healthy(
        self,
        timeout_s: float,
        *,
        poll_s: float = 0.5,
        alive: Callable[[], str | None] | None = None,
    ) -> None:
        """Poll ``/health`` until it answers 200; fail after ``timeout_s`` or as soon as
        ``alive()`` returns why the server is gone (a launched process that exited)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.healthy():
                return
            gone = alive() if alive is not None else None
            if gone is not None:
                raise SGLangServerError(f"SGLang server {self.url} {gone}")
            if time.monotonic() >= deadline:
                raise SGLangServerError(
                    f"SGLang server {self.url} did not answer /health within {timeout_s:g} s "
                    "(--sglang-health-timeout-s); is it running and reachable from here?"
                )
            time.sleep(poll_s)

    def model_info(self) -> dict[str, Any]:
        """``GET /get_model_info`` (``/model_info`` on releases that renamed it)."""
        return self._info("/get_model_info", "/model_info")

    def server_info(self) -> dict[str, Any]:
        """``GET /get_server_info`` (``/server_info`` on releases that renamed it)."""
        return self._info("/get_server_info", "/server_info")

    def _info(self, route: str, renamed: str) -> dict[str, Any]:
        status, body = self.request("GET", route)
        if status == 404:
            route = renamed
            status, body = self.request("GET", route)
        if status != 200:
            raise SGLangServerError(
                f"SGLang server {self.url}: GET {route} answered HTTP {status}: {_message(body)}"
            )
        return _mapping(body, self.url, route)

    def weight_version(self) -> str | None:
        """The version tag of the weights the server holds (``/get_weight_version``, else the
        ``weight_version`` of ``/get_model_info``); None when the server reports none."""
        status, body = self.request("GET", "/get_weight_version")
        if status == 200 and isinstance(body, dict) and "weight_version" in body:
            return _version_text(body["weight_version"])
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

    def release_memory(self) -> None:
        self.post("/release_memory_occupation", {})

    def resume_memory(self) -> None:
        self.post("/resume_memory_occupation", {})

    def flush_cache(self) -> None:
        self.post("/flush_cache", {})


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
