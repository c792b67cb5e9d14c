"""``areno serve``: a checkpoint behind the OpenAI-compatible endpoint of agentic rollouts.

::

    areno serve --ckpt runs/demo-arith/step_500 --port 8000 --api-key sk-local
    # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-local")

The endpoint is :class:`areno_core.agentic.server.AgentServer`, the one ``run_agent`` talks to
during training: the same request checks and limits (key, body size, prompt length,
connections, timeouts), tool calls, logprobs and streaming, decoded by a registered rollout
engine. So an agent developed against ``areno serve`` sees what it will see in training, and
serving a checkpoint before and after training compares the two policies. It listens on
127.0.0.1 only; reach it from elsewhere through an SSH tunnel or a proxy of your own.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import attrs

from areno_core.agentic.server import AgentServer
from areno_core.checkpoint_eval import eval_device, load_checkpoint_model, looks_local
from areno_core.config import DTYPE_CHOICES
from areno_core.contracts.engine import EngineOptions
from areno_core.errors import ConfigError
from areno_core.recipe import resolve_resource
from areno_core.registry import Registry
from areno_core.train.checkpoint import find_latest_checkpoint
from areno_core.types import SamplingParams

# Served responses the endpoint keeps (it keeps every one during a training step); older
# ones are dropped so a long-running server does not grow without bound.
KEEP_RECORDS = 4096


@attrs.frozen
class ServeSettings:
    ckpt: str
    port: int = 8000
    api_key: str | None = None
    model_name: str = "policy"
    max_new_tokens: int = 512
    max_prompt_tokens: int = 4096
    temperature: float = 1.0
    disable_thinking: bool = False
    engine: str = "native"
    max_running_prompts: int | None = None
    attn_backend: str | None = None  # flash on a GPU, native elsewhere
    timeout_s: float = 300.0
    device: str = "auto"
    dtype: str = "auto"
    seed: int | None = None


def resolve_serve_ckpt(ref: str) -> str:
    """A model directory as given; a run's ``--save-path`` means its latest checkpoint; a
    reference that is not a path (hub id, ``random:...``) goes to the loader as it is."""
    path = Path(str(resolve_resource(ref)))
    if path.is_dir():
        if any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            return str(path)
        latest = find_latest_checkpoint(path)
        if latest is None:
            raise ConfigError(f"--ckpt {ref!r}: a directory with no model and no checkpoints")
        return str(latest)
    if path.exists() or looks_local(ref):
        raise ConfigError(f"--ckpt {ref!r}: no such checkpoint directory")
    return ref


def check_settings(s: ServeSettings, registry: Registry) -> None:
    """Every cheap check, before the model is loaded."""
    if not 0 <= s.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {s.port}")
    for name in ("max_new_tokens", "max_prompt_tokens", "max_running_prompts"):
        value = getattr(s, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if s.timeout_s <= 0:
        raise ConfigError(f"--timeout-s must be positive, got {s.timeout_s}")
    if s.api_key is not None and not s.api_key.strip():
        raise ConfigError("--api-key is empty; leave it out for a random key")
    if s.attn_backend not in (None, "flash", "native"):
        raise ConfigError(f"--attn-backend must be flash or native, got {s.attn_backend!r}")
    if s.dtype not in DTYPE_CHOICES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {s.dtype!r}")
    registry.engine(s.engine)
    if s.port:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", s.port))
            except OSError as exc:
                raise ConfigError(
                    f"--port {s.port}: 127.0.0.1:{s.port} is not free ({exc.strerror}); pick "
                    "another port, or --port 0 for any free one"
                ) from None


def start_server(s: ServeSettings, registry: Registry) -> Any:
    """Load the checkpoint, build its rollout engine and start the endpoint (an
    :class:`AgentServer`; stop it with ``.stop()``)."""

    check_settings(s, registry)
    path = resolve_serve_ckpt(s.ckpt)
    device = eval_device(s.device)
    attention = s.attn_backend or ("flash" if device.startswith("cuda") else "native")
    model, tokenizer = load_checkpoint_model(path, device, s.dtype, attention)
    model.eval()
    spec = registry.engine(s.engine)
    options = EngineOptions(
        max_running=s.max_running_prompts,
        max_prompt_tokens=s.max_prompt_tokens,
        attn_backend=attention,
    )
    engine = spec.create(model, tokenizer, options, spec.make_config({}))
    engine.start_session()
    server = AgentServer(
        engine,
        tokenizer,
        sampling_defaults=SamplingParams(
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=s.seed
        ),
        disable_thinking=s.disable_thinking,
        timeout_s=s.timeout_s,
        model_name=s.model_name,
        api_key=s.api_key,
        max_prompt_tokens=s.max_prompt_tokens,
        port=s.port,
    )
    try:
        server.start()
    except BaseException:
        engine.end_session(drop_state=True)
        raise
    return server


def trim_records(server: Any, keep: int = KEEP_RECORDS) -> None:
    """Drop the oldest served responses beyond ``keep`` (called between requests' arrivals;
    a response stored meanwhile is simply kept for the next call)."""
    records = server.records
    extra = len(records) - keep
    for _ in range(max(0, extra)):
        with contextlib.suppress(StopIteration, RuntimeError, KeyError):
            records.pop(next(iter(records)))
