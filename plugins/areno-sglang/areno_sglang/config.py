"""The SGLang engine's own options (``--rollout-engine sglang``) and the pure helpers that read
them: which mode, which weight-sync method, which servers serve which data-parallel rank."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from areno_core import option
from areno_core.errors import ConfigError
from areno_core.validators import number

MODES = ("auto", "colocated", "remote")
WEIGHT_SYNCS = ("auto", "disk", "distributed", "tensor")
GROUP_BACKENDS = ("nccl", "gloo")
INSTALL_HINT = "pip install areno-sglang (it brings sglang), or pip install sglang"


@attrs.frozen
class SGLangEngineConfig:
    """Options of the ``sglang`` rollout engine (areno-sglang). They say where and how the
    policy is sampled, not what is trained, so a resumed run may change any of them (a server
    restarted at another address, a longer timeout)."""

    sglang_mode: str = option(
        "auto",
        "SGLang engine: 'colocated' starts an SGLang server on this process's GPU and shares it "
        "with training (memory released between phases, weights updated in memory); 'remote' "
        "uses the servers of --sglang-url. 'auto': remote when --sglang-url is given, else "
        "colocated.",
        choices=MODES,
        resume_may_change=True,
    )
    sglang_url: str | None = option(
        None,
        "SGLang engine, remote mode: base URL of a running SGLang server (http://host:port), or "
        "several separated by commas. With --world-size N, data-parallel rank r uses the "
        "servers at positions r, r+N, r+2N, ...",
        metavar="URL[,URL...]",
        resume_may_change=True,
    )
    sglang_weight_sync: str = option(
        "auto",
        "SGLang engine: how new weights reach the servers after each step. 'disk': write them "
        "as safetensors under --sglang-weights-dir and call /update_weights_from_disk; "
        "'distributed': broadcast them over a NCCL (or gloo) group joined by the servers "
        "(/update_weights_from_distributed); 'tensor': hand CUDA IPC handles to a server on "
        "the same GPU (/update_weights_from_tensor, needs the sglang package). 'auto': tensor "
        "when colocated, disk when remote.",
        choices=WEIGHT_SYNCS,
        resume_may_change=True,
    )
    sglang_weights_dir: str | None = option(
        None,
        "SGLang engine, --sglang-weight-sync disk: directory the weights are written to; the "
        "servers read them at the same path, so remote servers on other machines need a shared "
        "filesystem. Default: a temporary directory on this machine.",
        metavar="DIR",
        resume_may_change=True,
    )
    sglang_group_address: str | None = option(
        None,
        "SGLang engine, --sglang-weight-sync distributed: address of this trainer that the "
        "servers can reach to join the weight-update group. Default: 127.0.0.1 when every "
        "server is on this machine (required otherwise).",
        metavar="HOST",
        resume_may_change=True,
    )
    sglang_group_port: int = option(
        0,
        "SGLang engine, --sglang-weight-sync distributed: port of the weight-update group's "
        "rendezvous on this trainer (0: a free port; otherwise data-parallel rank r uses "
        "this port + r).",
        validator=number(min=0, max=65535, integer=True),
        resume_may_change=True,
    )
    sglang_group_backend: str = option(
        "nccl",
        "SGLang engine, --sglang-weight-sync distributed: collective backend of the "
        "weight-update group ('nccl' between GPUs; 'gloo' for CPU tensors).",
        choices=GROUP_BACKENDS,
        resume_may_change=True,
    )
    sglang_api_key_env: str = option(
        "SGLANG_API_KEY",
        "SGLang engine: name of the environment variable holding the servers' --api-key, sent "
        "as a bearer token (unset or empty: no key). The key itself is never a flag, so it "
        "stays out of the run's config.yaml and logs.",
        metavar="VAR",
        resume_may_change=True,
    )
    sglang_admin_api_key_env: str = option(
        "SGLANG_ADMIN_API_KEY",
        "SGLang engine: name of the environment variable holding the servers' --admin-api-key, "
        "sent on the admin routes (weight updates, memory release, cache flush, pause); unset "
        "or empty: those routes get the --sglang-api-key-env key.",
        metavar="VAR",
        resume_may_change=True,
    )
    sglang_timeout_s: float = option(
        600.0,
        "SGLang engine: seconds to wait for one request to a server (a generate batch or a "
        "weight update) before the run fails.",
        validator=number(min=0.0, min_inclusive=False),
        resume_may_change=True,
    )
    sglang_health_timeout_s: float = option(
        900.0,
        "SGLang engine: seconds to wait for the servers to answer /health before the first "
        "step (colocated: includes starting the server and loading the model).",
        validator=number(min=0.0, min_inclusive=False),
        resume_may_change=True,
    )
    sglang_release_memory: bool = option(
        True,
        "SGLang engine, colocated: release the server's GPU memory (weights and KV cache) when "
        "a rollout phase ends and resume it when the next begins, so training gets the GPU.",
        negatable=True,
        resume_may_change=True,
    )
    sglang_mem_fraction: float = option(
        0.5,
        "SGLang engine, colocated: share of the GPU's memory the server may take for weights "
        "and KV cache while it runs (SGLang's --mem-fraction-static).",
        validator=number(min=0.0, max=1.0, min_inclusive=False),
        resume_may_change=True,
    )
    sglang_server_args: str | None = option(
        None,
        "SGLang engine, colocated: extra arguments for the launched server, as one string "
        "(e.g. '--attention-backend triton --disable-cuda-graph').",
        metavar="ARGS",
        resume_may_change=True,
    )

    def __attrs_post_init__(self) -> None:
        urls = parse_urls(self.sglang_url)
        if self.sglang_mode == "remote" and not urls:
            raise ConfigError(
                "--sglang-mode remote needs --sglang-url (the base URL of a running SGLang "
                "server, e.g. http://localhost:30000)"
            )
        if self.sglang_mode == "colocated" and urls:
            raise ConfigError(
                f"--sglang-url {self.sglang_url!r} is for --sglang-mode remote; colocated mode "
                "starts its own server (drop one of the two)"
            )
        if self.mode == "colocated" and self.sglang_weight_sync == "distributed":
            raise ConfigError(
                "--sglang-weight-sync distributed is for remote servers; a colocated server "
                "shares the trainer's GPU and takes its weights in memory (tensor) or from disk"
            )

    def keys(self, environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
        """``(api key, admin api key)`` read from the variables the options name."""
        env = os.environ if environ is None else environ
        return (
            env.get(self.sglang_api_key_env) or None,
            env.get(self.sglang_admin_api_key_env) or None,
        )

    @property
    def mode(self) -> str:
        """'colocated' or 'remote' (``auto`` resolved)."""
        if self.sglang_mode != "auto":
            return self.sglang_mode
        return "remote" if parse_urls(self.sglang_url) else "colocated"

    @property
    def urls(self) -> list[str]:
        return parse_urls(self.sglang_url)

    @property
    def weight_sync(self) -> str:
        """'disk', 'distributed' or 'tensor' (``auto`` resolved)."""
        if self.sglang_weight_sync != "auto":
            return self.sglang_weight_sync
        return "tensor" if self.mode == "colocated" else "disk"


def parse_urls(text: str | None) -> list[str]:
    """``"http://a:1, b:2/"`` -> ``["http://a:1", "http://b:2"]``: comma-separated base URLs,
    ``http://`` added when no scheme is given; a URL without a host or port is an error."""
    if not text or not text.strip():
        return []
    urls = []
    for part in text.split(","):
        raw = part.strip()
        if not raw:
            continue
        url = raw if "://" in raw else f"http://{raw}"
        parsed = urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(
                f"--sglang-url {raw!r} is not a server URL (expected http://host:port)"
            )
        try:
            port = parsed.port
        except ValueError as exc:
            raise ConfigError(f"--sglang-url {raw!r} has a bad port") from exc
        if port is None:
            raise ConfigError(f"--sglang-url {raw!r} names no port (expected http://host:port)")
        urls.append(url.rstrip("/"))
    if len(set(urls)) != len(urls):
        raise ConfigError(f"--sglang-url {text!r} names a server twice")
    return urls


def servers_for_rank(urls: list[str], dp_rank: int, dp_size: int) -> list[str]:
    """The servers data-parallel rank ``dp_rank`` of ``dp_size`` uses: positions ``dp_rank``,
    ``dp_rank + dp_size``, ...; every rank needs at least one."""
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"data-parallel rank {dp_rank} of {dp_size} is not a valid rank")
    if len(urls) < dp_size:
        raise ConfigError(
            f"--sglang-url names {len(urls)} server(s) for {dp_size} data-parallel ranks; "
            "give at least one server per rank (rank r uses servers r, r+N, ...)"
        )
    return urls[dp_rank::dp_size]


def is_local(url: str) -> bool:
    """Whether the server at ``url`` runs on this machine (a loopback host)."""
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def unavailable_reason(run_config: Any, config: SGLangEngineConfig) -> str | None:
    """Why the engine cannot run here with ``config`` (checked before any model loads)."""
    if getattr(run_config, "tune_params", False):
        return (
            "--tune-params measures rollout memory in this process, but SGLang servers hold "
            "their own (--sglang-mem-fraction, the server's --max-running-requests); set "
            "--max-running-prompts, --batch-size and --mini-bs yourself"
        )
    needs_package = config.mode == "colocated" or config.weight_sync == "tensor"
    if needs_package and not sglang_installed():
        what = (
            "colocated mode starts an SGLang server in this environment"
            if config.mode == "colocated"
            else "--sglang-weight-sync tensor serializes CUDA tensors with sglang's serializer"
        )
        return (
            f"the sglang package is not installed ({what}). Install it: {INSTALL_HINT}; or use "
            "servers you started yourself: --sglang-url http://HOST:PORT (remote mode speaks "
            "HTTP only and needs no sglang package here)"
        )
    if config.mode == "colocated" or config.weight_sync == "tensor":
        import torch

        if not torch.cuda.is_available():
            return (
                "colocated mode and --sglang-weight-sync tensor need a CUDA GPU, and this "
                "machine has none; run SGLang servers elsewhere and pass --sglang-url"
            )
    if config.weight_sync == "distributed" and config.sglang_group_address is None:
        far = [u for u in config.urls if not is_local(u)]
        if far:
            return (
                f"--sglang-weight-sync distributed: server {far[0]} is on another machine; pass "
                "--sglang-group-address with an address of this trainer it can reach"
            )
    world = int(getattr(run_config, "world_size", None) or 1)
    dp = max(1, world // int(getattr(run_config, "tp_size", None) or 1))
    if config.mode == "remote" and len(config.urls) < dp:
        return (
            f"--world-size {world} runs {dp} data-parallel ranks, each with its own engine, "
            f"but --sglang-url names {len(config.urls)} server(s); give at least {dp}"
        )
    return None
