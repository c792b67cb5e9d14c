"""The chat-completion request the agent endpoint accepts, as pydantic models.

The models follow the OpenAI Chat Completions request schema for every field the endpoint
honours, and name the fields it cannot honour so a request that uses them is refused with a
clear ``400`` instead of being served as if they were absent. :func:`parse_chat_request`
validates a JSON body and returns a :class:`ChatRequest`; every problem becomes a
:class:`RequestError` naming the offending parameter (``messages[2].role``, ``temperature``...).

Extensions beyond the OpenAI schema: ``top_k`` (an integer, ``-1`` disables it), and
``reasoning_content`` on assistant messages (rendered by templates that know it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_N = 64
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20
MAX_MESSAGES = 4096
MAX_TOOLS = 256


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
        kind = {
            401: "authentication_error",
            404: "not_found_error",
            408: "timeout",
            413: "invalid_request_error",
            504: "timeout",
        }.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return error_payload(str(self), kind=kind, param=self.param, code=self.code)


def error_payload(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Strict(BaseModel):
    """Unknown keys are refused: the OpenAI API refuses them too, and silently ignoring one
    could change what the caller thinks it asked for. Types are strict as well, as OpenAI's
    are: ``"max_tokens": "10"`` or ``"stream": 1`` are refused, not coerced (an integer is
    still a valid float)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class _Lenient(BaseModel):
    """Message-level objects: unknown keys are dropped (SDKs add bookkeeping fields)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class RefusalPart(_Lenient):
    type: Literal["refusal"]
    refusal: str


Content = str | list[TextPart]


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Lenient):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(_Lenient):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: str | list[TextPart | RefusalPart] | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    function_call: Any = None

    @model_validator(mode="after")
    def _no_legacy_call(self) -> AssistantMessage:
        if self.function_call is not None:
            raise ValueError("'function_call' (deprecated) is not supported; use 'tool_calls'")
        return self


class ToolMessage(_Lenient):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]

FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,64}$"


class FunctionDefinition(_Lenient):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]


class StreamOptions(_Lenient):
    include_usage: bool | None = None


Probability = Annotated[float, Field(gt=0.0, le=1.0)]


class ChatRequest(_Strict):
    """A validated ``POST /v1/chat/completions`` body."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Probability | None = None
    top_k: int | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    # Accepted and ignored: they do not change what is generated.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Known but not available here: refused below when set to anything that matters.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    functions: Any = None
    function_call: Any = None

    @property
    def wants_stream(self) -> bool:
        return bool(self.stream)

    @property
    def choices(self) -> int:
        return self.n or 1


def _loc(loc: Sequence[str | int]) -> str:
    """A pydantic error location as a parameter path: ``messages[2].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("system", "developer", "user", "assistant", "tool") and out.endswith("]"):
            continue  # the discriminator's branch name, not a field
        elif part in (
            "str",
            "list[TextPart]",
            "function-after[_no_legacy_call(), AssistantMessage]",
        ):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _first_error(exc: ValidationError) -> RequestError:
    errors = exc.errors(include_url=False)
    # Prefer the most specific error: the one with the longest location.
    error = max(errors, key=lambda e: len(e.get("loc", ())))
    param = _loc(error.get("loc", ())) or None
    kind = error.get("type", "")
    if kind == "extra_forbidden" and param and "." not in param and "[" not in param:
        return RequestError(400, f"unrecognized request argument supplied: {param}", param=param)
    if kind == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        return RequestError(
            400,
            f"{param}: unknown role {tag!r}; expected one of 'system', 'developer', 'user', "
            "'assistant', 'tool'",
            param=param,
        )
    given = error.get("input")
    shown = json.dumps(given)[:120] if _jsonable(given) else repr(given)[:120]
    message = str(error.get("msg", "invalid value"))
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return RequestError(400, f"{param}: {message}, got {shown}{more}", param=param)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _refuse_unsupported(request: ChatRequest) -> None:
    def refuse(param: str, why: str) -> None:
        raise RequestError(
            400, f"'{param}' is not supported by the areno endpoint: {why}", param=param
        )

    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if value not in (None, 0.0):
            refuse(name, "the rollout engine samples without penalties; leave it unset or 0")
    if request.logit_bias:
        refuse("logit_bias", "the rollout engine cannot bias logits")
    if request.modalities not in (None, ["text"]):
        refuse("modalities", "only text is generated")
    for name in ("audio", "prediction", "web_search_options", "reasoning_effort", "verbosity"):
        if getattr(request, name) is not None:
            refuse(name, "the policy is a plain text model served as is")
    if request.functions is not None or request.function_call is not None:
        name = "functions" if request.functions is not None else "function_call"
        refuse(name, "the legacy function-calling fields are not supported; use 'tools'")
    if request.response_format is not None and request.response_format.type != "text":
        refuse(
            "response_format",
            f"{request.response_format.type!r} needs constrained decoding, which the rollout "
            "engine does not do; ask for JSON in the prompt and parse the text",
        )
    if request.top_k is not None and (request.top_k < -1 or request.top_k == 0):
        raise RequestError(400, "'top_k' must be -1 or a positive integer", param="top_k")
    if request.top_logprobs and not request.logprobs:
        raise RequestError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if any(not s for s in stops):
        raise RequestError(400, "'stop' strings must not be empty", param="stop")
    names = [t.function.name for t in request.tools or ()]
    choice = request.tool_choice
    if choice in ("required",) or isinstance(choice, NamedToolChoice):
        if not names:
            raise RequestError(
                400,
                "'tool_choice' asks for a tool call but the request has no 'tools'",
                param="tool_choice",
            )
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise RequestError(
                400,
                f"'tool_choice' names {choice.function.name!r}, which is not in 'tools' "
                f"({', '.join(names)})",
                param="tool_choice",
            )


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a request body (JSON bytes); :class:`RequestError` on any problem."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise RequestError(400, "the request body must be a JSON object")
    try:
        request = ChatRequest.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    _refuse_unsupported(request)
    return request


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# -- from the request to what the chat template sees -----------------------------------------


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text if isinstance(part, TextPart) else "" for part in content)


def template_messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The messages as the chat template sees them: text content, known keys only.

    ``developer`` messages become ``system`` messages (templates know only the latter).
    """
    out: list[dict[str, Any]] = []
    for message in request.messages:
        role = "system" if message.role == "developer" else message.role
        entry: dict[str, Any] = {"role": role, "content": _text(message.content)}
        if getattr(message, "name", None):
            entry["name"] = message.name  # type: ignore[union-attr]
        if isinstance(message, ToolMessage):
            entry["tool_call_id"] = message.tool_call_id
        if isinstance(message, AssistantMessage):
            if message.reasoning_content:
                entry["reasoning_content"] = message.reasoning_content
            if message.tool_calls:
                calls = []
                for call in message.tool_calls:
                    item: dict[str, Any] = {
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                    if call.id is not None:
                        item["id"] = call.id
                    calls.append(item)
                entry["tool_calls"] = calls
        out.append(entry)
    return out


def template_tools(request: ChatRequest) -> list[dict[str, Any]]:
    """The tools as the chat template sees them (unset fields left out)."""
    return [tool.model_dump(exclude_none=True) for tool in request.tools or ()]


def content_chars(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> int:
    """A lower bound on the characters of the rendered prompt: every text the template writes
    verbatim (message contents, tool-call arguments, tool schemas)."""
    total = sum(len(json.dumps(t)) for t in tools)
    for message in messages:
        total += len(message.get("content") or "") + len(message.get("reasoning_content") or "")
        for call in message.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            total += len(arguments if isinstance(arguments, str) else json.dumps(arguments))
            total += len(call["function"]["name"])
    return total


__all__ = [
    "MAX_N",
    "ChatRequest",
    "RequestError",
    "content_chars",
    "error_payload",
    "parse_chat_request",
    "template_messages",
    "template_tools",
]
