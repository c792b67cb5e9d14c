"""The ``sglang`` rollout engine: areno's engine contract over SGLang servers.

Token ids go in (``input_ids``) and come out (``output_token_logprobs``: the sampled ids with
the sampling policy's logprobs), so nothing is detokenized and re-tokenized on the way; the
completion ``text`` is decoded here with the run's tokenizer, as the native engine does.

The engine talks to one or several servers (``remote``: the user's ``--sglang-url``;
``colocated``: one it starts on the trainer's GPU). Each ``generate`` call spreads its prompts
over the servers (all samples of a prompt on one server, which shares their prefix) and sends
each server one ``/generate`` batch. ``sync_weights`` pushes the weights to every server
(:mod:`areno_sglang.weights`), tagged with the policy version, then reads the version back:
a server that did not take the new weights stops the run, and so does any output stamped
with another version. On remote servers (which other clients may share) a push runs inside
pause (``retract``) -> push -> flush the cache (retried while requests are pending) ->
continue, so no request samples from half-updated weights or a cache of the old ones.

Lifecycle (see :mod:`areno_core.contracts.engine`): a colocated server releases its memory when a
session ends and resumes it at the next one. SGLang's memory saver discards the weights on
release unless the server keeps a CPU copy (``--enable-weights-cpu-backup`` in
``--sglang-server-args``), so the engine then says ``drops_weights`` and, after each release,
``holds_weights = False``: it refuses to generate until the runner pushes the weights again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch import nn

from areno_core.contracts.engine import EngineOptions, WeightsNotHeldError
from areno_core.log import get_logger
from areno_core.rollout.kit import (
    GENERATION_STAT_KEYS,
    FinishedSample,
    add_completions,
    admit_prompts,
    count_generation,
    resolve_eos,
)
from areno_core.types import Completion, SamplingParams
from areno_sglang.client import SGLangClient, SGLangServerError, StaleWeightsError
from areno_sglang.config import SGLangEngineConfig, is_local, servers_for_rank
from areno_sglang.protocol import Output, Request, generate_payload, parse_output
from areno_sglang.weights import (
    DiskSync,
    GroupSync,
    Serializer,
    TensorSync,
    named_tensors,
    tp_size,
    write_model_dir,
)

logger = get_logger(__name__)

STAT_KEYS = (*GENERATION_STAT_KEYS, "cached_tokens", "requests", "weight_sync_time_s")


def data_parallel_rank() -> tuple[int, int]:
    """``(rank, size)`` of this process among the run's data-parallel ranks: torch's default
    process group when one exists, else ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class SGLangEngine:
    """Rollout engine over SGLang servers (see the module docstring).

    ``policy`` is the module being trained (its config goes with weights written to disk, and
    a colocated server starts from it); ``tokenizer_or_eos_ids`` is the run's tokenizer (its
    EOS and the policy's ``generation_config`` EOS end completions, and completions get
    ``text``) or the exact EOS ids. ``dp_rank``/``dp_size`` override the data-parallel
    placement; ``launch_module`` and ``tensor_serializer`` replace the SGLang server module and
    the tensor serializer (tests use them to run without the sglang package).
    """

    name = "sglang"

    def __init__(
        self,
        policy: nn.Module,
        tokenizer_or_eos_ids: Any,
        options: EngineOptions | None = None,
        config: SGLangEngineConfig | None = None,
        *,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        launch_module: str | None = None,
        tensor_serializer: Serializer | None = None,
    ) -> None:
        self.options = options if options is not None else EngineOptions()
        self.config = config if config is not None else SGLangEngineConfig()
        self.policy = policy
        self.tokenizer, self.eos_token_ids = resolve_eos(policy, tokenizer_or_eos_ids)
        rank, size = data_parallel_rank()
        self.dp_rank = rank if dp_rank is None else dp_rank
        self.dp_size = size if dp_size is None else dp_size
        self.policy_version = 0
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0.0)
        self.holds_weights = False  # the servers hold other weights until the first sync
        self.drops_weights = False  # set once the servers say whether they back weights up
        self._released = False
        self._pushed = False
        self._lock = threading.Lock()
        self._server: Any = None
        self._model_dir: Path | None = None
        cfg = self.config
        try:
            if cfg.mode == "remote":
                urls = servers_for_rank(cfg.urls, self.dp_rank, self.dp_size)
            else:
                urls = [self._launch(launch_module)]
            far = [u for u in urls if not is_local(u)]
            if cfg.weight_sync == "tensor" and far:
                raise SGLangServerError(
                    f"--sglang-weight-sync tensor hands memory handles to the server, which "
                    f"must run on this machine; {far[0]} does not (use disk or distributed)"
                )
            if cfg.weight_sync == "tensor" and tensor_serializer is None:
                _require_cuda_weights(policy)
            api_key, admin_key = cfg.keys()
            self.clients = [
                SGLangClient(
                    u, timeout_s=cfg.sglang_timeout_s, api_key=api_key, admin_api_key=admin_key
                )
                for u in urls
            ]
            infos = self._wait_ready()
            if cfg.mode == "colocated" and cfg.sglang_release_memory:
                self.drops_weights = not all(
                    bool(i.get("enable_weights_cpu_backup")) for i in infos
                )
            self._weights = self._make_sync(tensor_serializer, infos)
        except BaseException:
            _shutdown(getattr(self, "_weights", None), self._server, self._model_dir)
            raise
        # Stops a launched server and removes written weights on close(), when the engine is
        # collected, or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(
            self, _shutdown, self._weights, self._server, self._model_dir
        )
        logger.info(
            "sglang: %s mode, %d server(s) for data-parallel rank %d/%d (%s), weights by %s",
            cfg.mode,
            len(self.clients),
            self.dp_rank,
            self.dp_size,
            ", ".join(c.url for c in self.clients),
            self._weights.method,
        )

    # -- set-up ------------------------------------------------------------------------------

    def _launch(self, launch_module: str | None) -> str:
        import torch

        from areno_sglang.launch import LAUNCH_MODULE, launch_colocated

        self._model_dir = Path(tempfile.mkdtemp(prefix="areno-sglang-model-")) / "policy"
        save = getattr(self.policy, "save_pretrained", None)
        if callable(save):
            save(str(self._model_dir))
        else:
            write_model_dir(
                named_tensors(self.policy), self._model_dir, getattr(self.policy, "config", None)
            )
        device = None
        if torch.cuda.is_available():
            device = torch.cuda.current_device()
        self._server = launch_colocated(
            str(self._model_dir),
            mem_fraction=self.config.sglang_mem_fraction,
            extra_args=self.config.sglang_server_args,
            eager=self.options.eager_decode,
            module=launch_module or LAUNCH_MODULE,
            device_index=device,
        )
        return self._server.url

    def _wait_ready(self) -> list[dict[str, Any]]:
        """Wait for every server's health, check what it serves; its ``/server_info``."""
        alive = self._server.exited if self._server is not None else None
        remote = self.config.mode == "remote"

        def ready(client: SGLangClient) -> dict[str, Any]:
            client.wait_healthy(
                self.config.sglang_health_timeout_s, alive=alive, refused_is_final=remote
            )
            info = client.model_info()
            if info.get("is_generation") is False:
                raise SGLangServerError(
                    f"SGLang server {client.url} serves a model that does not generate text "
                    f"({info.get('model_path')!r})"
                )
            if "weight_version" not in info:
                raise SGLangServerError(
                    f"SGLang server {client.url} reports no weight_version in /model_info; "
                    "areno needs it to check that every rollout samples from the weights it "
                    "pushed. Use a newer SGLang release"
                )
            return client.server_info()

        return _each(self.clients, ready)

    def _make_sync(self, serializer: Serializer | None, infos: list[dict[str, Any]]) -> Any:
        cfg = self.config
        method = cfg.weight_sync
        if method == "distributed":
            for client, info in zip(self.clients, infos, strict=True):
                sizes = {k: int(info.get(k) or 1) for k in ("dp_size", "pp_size")}
                if any(v > 1 for v in sizes.values()):
                    raise SGLangServerError(
                        f"SGLang server {client.url} runs with "
                        + ", ".join(f"{k} {v}" for k, v in sizes.items() if v > 1)
                        + ": SGLang joins a weight-update group from tensor-parallel ranks "
                        "only (data-parallel replicas are refused, pipeline stages would "
                        "take the same group rank), so --sglang-weight-sync distributed "
                        "cannot reach every copy of the weights. Use --sglang-weight-sync "
                        "disk, or one server per data-parallel replica in --sglang-url"
                    )
        if method == "disk":
            root = cfg.sglang_weights_dir
            if root is not None and self.dp_size > 1:
                root = str(Path(root) / f"rank{self.dp_rank}")
            return DiskSync(self.clients, root, getattr(self.policy, "config", None))
        tp_sizes = [tp_size(info) for info in infos]
        if method == "tensor":
            return TensorSync(self.clients, tp_sizes, serializer)
        address = cfg.sglang_group_address or "127.0.0.1"
        port = cfg.sglang_group_port + self.dp_rank if cfg.sglang_group_port else 0
        return GroupSync(
            self.clients,
            tp_sizes=tp_sizes,
            address=address,
            port=port,
            backend=cfg.sglang_group_backend,
            group_name=f"areno-weights-{self.dp_rank}",
            timeout_s=cfg.sglang_timeout_s,
        )

    # -- sessions and memory ---------------------------------------------------------------

    def start_session(self) -> None:
        self.stats = dict.fromkeys(STAT_KEYS, 0.0)
        self._resume()

    def end_session(self, *, drop_state: bool = False) -> None:
        if self.config.mode == "colocated" and self.config.sglang_release_memory:
            self._release()
        elif drop_state:
            _each(self.clients, lambda c: c.flush_cache(timeout_s=self.config.sglang_timeout_s))

    def _release(self) -> None:
        if not self._released:
            _each(self.clients, lambda c: c.release_memory())
            self._released = True
            if self.drops_weights:  # the memory saver unmapped them: push before sampling
                self.holds_weights = False

    def _resume(self) -> None:
        if self._released:
            _each(self.clients, lambda c: c.resume_memory())
            self._released = False

    # -- weights -----------------------------------------------------------------------------

    def sync_weights(self, weights: Mapping[str, Any] | nn.Module, *, version: int) -> None:
        """Push ``weights`` (the policy module or a state dict of it) to every server, tagged
        ``version``, and check that each server now reports that version."""
        pairs = named_tensors(weights)
        began = time.perf_counter()
        with self._lock:
            self._resume()
            if self.config.mode == "remote":
                self._push_paused(pairs, int(version))
            else:  # a server of this run alone, idle between sessions
                self._weights.push(pairs, int(version))
            expected = str(int(version))

            def check(client: SGLangClient) -> None:
                held = client.weight_version()
                if held != expected:
                    raise StaleWeightsError(
                        f"SGLang server {client.url} reports weight version {held!r} after "
                        f"areno pushed version {expected} ({self._weights.method}); it did "
                        "not take the new weights, so rolling out from it would be stale"
                    )

            _each(self.clients, check)
            self.policy_version = int(version)
            self.holds_weights = True
            self._pushed = True
        self.stats["weight_syncs"] += 1
        self.stats["weight_sync_time_s"] += time.perf_counter() - began
        logger.debug("sglang: %d tensors at version %d on every server", len(pairs), version)

    def _push_paused(self, pairs: Any, version: int) -> None:
        """pause (retract) -> push -> flush (retried while busy) -> continue, on every server;
        generation continues even when the push fails, so a shared server is never left
        paused."""
        timeout = self.config.sglang_timeout_s
        _each(self.clients, lambda c: c.pause_generation("retract"))
        try:
            self._weights.push(pairs, version)
            _each(self.clients, lambda c: c.flush_cache(timeout_s=timeout))
        finally:
            _each(self.clients, lambda c: c.continue_generation())

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, n: int = 1
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt on the servers (see the module docstring)."""
        if not self.holds_weights:
            why = (
                "the servers' memory was released since the last push, and SGLang discards "
                "released weights unless it runs with --enable-weights-cpu-backup"
                if self._pushed
                else "the servers may hold other weights than the policy"
            )
            raise WeightsNotHeldError(
                f"SGLangEngine.generate() before sync_weights(): {why}; push the weights of "
                f"version {self.policy_version} first (the run's rollout runner does)"
            )
        began = time.perf_counter()
        kept = admit_prompts(prompts, sampling, n, max_prompt_tokens=self.options.max_prompt_tokens)
        results: list[list[Completion]] = [[] for _ in prompts]
        if kept:
            with self._lock:
                self._resume()
                outputs = self._run(prompts, kept, sampling, n)
            self._fill(results, prompts, outputs)
        self._count(prompts, kept, results, outputs if kept else [], began)
        return results

    def _run(
        self, prompts: Sequence[Sequence[int]], kept: list[int], sampling: SamplingParams, n: int
    ) -> list[tuple[Request, Output]]:
        stop_ids = sorted({*self.eos_token_ids, *sampling.stop_token_ids})
        per_server: list[list[Request]] = [[] for _ in self.clients]
        for position, p in enumerate(kept):
            requests = per_server[position % len(self.clients)]
            requests.extend(Request(p, s) for s in range(n))
        chunk = self.options.max_running or max(len(r) for r in per_server)

        def serve(index: int) -> list[tuple[Request, Output]]:
            client, requests = self.clients[index], per_server[index]
            done: list[tuple[Request, Output]] = []
            for start in range(0, len(requests), chunk):
                part = requests[start : start + chunk]
                items = client.generate(generate_payload(prompts, part, sampling, stop_ids))
                if len(items) != len(part):
                    raise SGLangServerError(
                        f"SGLang server {client.url}: /generate answered {len(items)} outputs "
                        f"for {len(part)} inputs"
                    )
                for request, item in zip(part, items, strict=True):
                    out = parse_output(
                        item, stop_ids, max_new_tokens=sampling.max_new_tokens, server=client.url
                    )
                    self._check_version(out, client.url)
                    done.append((request, out))
            return done

        active = [i for i, r in enumerate(per_server) if r]
        return [pair for part in _each_index(active, serve) for pair in part]

    def _check_version(self, out: Output, url: str) -> None:
        expected = str(self.policy_version)
        if out.weight_version is not None and out.weight_version != expected:
            raise StaleWeightsError(
                f"SGLang server {url} sampled a completion with weight version "
                f"{out.weight_version!r}, but the policy is at version {expected}"
            )

    def _fill(
        self,
        results: list[list[Completion]],
        prompts: Sequence[Sequence[int]],
        outputs: list[tuple[Request, Output]],
    ) -> None:
        outputs = sorted(outputs, key=lambda pair: (pair[0].prompt_index, pair[0].sample_index))
        finished = (
            FinishedSample(request.prompt_index, out.token_ids, out.logprobs, out.finish_reason)
            for request, out in outputs
        )
        add_completions(results, prompts, finished, self.tokenizer, self.policy_version)

    def _count(
        self,
        prompts: Sequence[Sequence[int]],
        kept: list[int],
        results: list[list[Completion]],
        outputs: list[tuple[Request, Output]],
        began: float,
    ) -> None:
        count_generation(self.stats, prompts, kept, results, time.perf_counter() - began)
        self.stats["cached_tokens"] += sum(o.cached_tokens for _, o in outputs)
        self.stats["requests"] += len(outputs)

    # -- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the weight-update group, stop a launched server, delete written weights."""
        self._finalizer()


def _require_cuda_weights(policy: nn.Module) -> None:
    """--sglang-weight-sync tensor passes CUDA IPC handles (SGLang's serializer handles no
    other device): refuse a policy held elsewhere before anything starts."""
    for name, param in policy.named_parameters():
        if param.device.type != "cuda":
            raise SGLangServerError(
                f"--sglang-weight-sync tensor hands the server CUDA memory handles, but the "
                f"policy's {name} is on {param.device}; use --sglang-weight-sync disk (or "
                "distributed) for a policy that is not on a GPU"
            )


def _shutdown(weights: Any, server: Any, model_dir: Path | None) -> None:
    if weights is not None:
        weights.close()
    if server is not None:
        server.stop()
    if model_dir is not None:
        shutil.rmtree(model_dir.parent, ignore_errors=True)


def _each(clients: Sequence[SGLangClient], call: Callable[[SGLangClient], Any]) -> list[Any]:
    if len(clients) == 1:
        return [call(clients[0])]
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        return list(pool.map(call, clients))


def _each_index(indices: list[int], call: Callable[[int], Any]) -> list[Any]:
    if len(indices) == 1:
        return [call(indices[0])]
    with ThreadPoolExecutor(max_workers=len(indices)) as pool:
        return list(pool.map(call, indices))


def create_sglang_engine(
    policy: nn.Module,
    tokenizer: Any,
    options: EngineOptions | None = None,
    config: SGLangEngineConfig | None = None,
) -> SGLangEngine:
    """Factory of the ``sglang`` rollout engine."""
    return SGLangEngine(policy, tokenizer, options, config)
