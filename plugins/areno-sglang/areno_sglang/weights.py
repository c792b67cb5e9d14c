"""How new policy weights reach SGLang servers, with the version they are tagged with.

Three methods, one class each, all with ``push(named_tensors, version)``:

- :class:`DiskSync`: write the weights as a Hugging Face model directory (safetensors) and ask
  every server to ``/update_weights_from_disk`` from it. Any server that can read the path.
- :class:`GroupSync`: the servers join a process group with this trainer
  (``/init_weights_update_group``); each push announces names, dtypes and shapes
  (``/update_weights_from_distributed``) while the trainer broadcasts the tensors from rank 0.
  NCCL between GPUs; gloo for CPU tensors.
- :class:`TensorSync`: hand the server serialized tensors (CUDA IPC handles for GPU tensors)
  through ``/update_weights_from_tensor``; the server must share this machine (colocated).

Every push passes ``weight_version`` to the server; the engine then reads the version back
and refuses to sample from a server that did not take it.
"""

from __future__ import annotations

import base64
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from areno_core.log import get_logger
from areno_sglang.client import SGLangClient, SGLangServerError

logger = get_logger(__name__)

NamedTensors = list[tuple[str, torch.Tensor]]
BUCKET_BYTES = 512 * 2**20
"""Most bytes of tensors announced in one distributed or tensor update request."""


def named_tensors(weights: Mapping[str, Any] | nn.Module) -> NamedTensors:
    """``(name, tensor)`` pairs of a module's state dict or of a (possibly partial) state
    dict, detached, in order."""
    if isinstance(weights, nn.Module):
        module = getattr(weights, "_orig_mod", weights)  # torch.compile's wrapper
        state = module.state_dict()
    elif isinstance(weights, Mapping):
        state = dict(weights)
    else:
        raise TypeError(
            f"sync_weights() takes a state dict or a torch module, got {type(weights).__name__}"
        )
    pairs = []
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"sync_weights(): {name!r} is a {type(value).__name__}, not a tensor")
        pairs.append((str(name), value.detach()))
    return pairs


def tp_size(server_info: Mapping[str, Any]) -> int:
    """A server's tensor-parallel size, from its ``/server_info`` (1 when it reports none)."""
    return max(1, int(server_info.get("tp_size", 1) or 1))


def buckets(pairs: NamedTensors, limit: int = BUCKET_BYTES) -> Iterator[NamedTensors]:
    """``pairs`` in consecutive groups of at most ``limit`` bytes (a larger tensor alone)."""
    group: NamedTensors = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor.numel() * tensor.element_size()
        if group and size + nbytes > limit:
            yield group
            group, size = [], 0
        group.append((name, tensor))
        size += nbytes
    if group:
        yield group


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (what SGLang's ``getattr(torch, name)`` reads)."""
    return str(dtype).removeprefix("torch.")


def _each(clients: Sequence[SGLangClient], call: Callable[[SGLangClient], Any]) -> list[Any]:
    """``call(client)`` for every client at once; the first error is raised."""
    if len(clients) == 1:
        return [call(clients[0])]
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        return list(pool.map(call, clients))


# -- disk --------------------------------------------------------------------------------------


def write_model_dir(pairs: NamedTensors, directory: Path, config: Any) -> None:
    """Write ``pairs`` as ``model.safetensors`` plus ``config.json`` (when ``config`` is a
    transformers config) into a new ``directory``, through a temporary sibling renamed into
    place, so a server never reads a half-written directory."""
    from safetensors.torch import save_file

    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[tuple[int, int]] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in pairs:
        cpu = tensor.detach().to("cpu").contiguous()
        key = (cpu.untyped_storage().data_ptr(), cpu.storage_offset())
        # safetensors refuses tensors sharing memory (tied embeddings): give each its own.
        tensors[name] = cpu.clone() if key in seen else cpu
        seen.add(key)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(str(tmp))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)


def disk_payload(directory: Path, version: int) -> dict[str, Any]:
    """The ``/update_weights_from_disk`` body for a model directory tagged ``version``."""
    return {
        "model_path": str(directory),
        "abort_all_requests": False,
        "weight_version": str(version),
    }


class DiskSync:
    """``/update_weights_from_disk`` from a directory under ``root`` (a temporary directory
    when None; removed on :meth:`close`)."""

    method = "disk"

    def __init__(self, clients: Sequence[SGLangClient], root: str | None, config: Any) -> None:
        self.clients = list(clients)
        self.config = config
        self._owned = root is None
        self.root = Path(tempfile.mkdtemp(prefix="areno-sglang-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._current: Path | None = None

    def push(self, pairs: NamedTensors, version: int) -> None:
        directory = self.root / f"weights-v{version}"
        write_model_dir(pairs, directory, self.config)
        payload = disk_payload(directory, version)
        _each(self.clients, lambda c: c.update("/update_weights_from_disk", payload))
        previous, self._current = self._current, directory
        if previous is not None and previous != directory:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)
        elif self._current is not None:
            shutil.rmtree(self._current, ignore_errors=True)


# -- a process group with the servers ---------------------------------------------------------


def init_weight_group(
    backend: str,
    address: str,
    port: int,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    timeout_s: float,
) -> Any:
    """Join the weight-update group ``group_name`` (``tcp://address:port``, rank 0 hosts the
    rendezvous) without touching torch's default process group; the same construction the
    SGLang server uses on its side, so both ends meet."""
    from torch.distributed import distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(
        c10d.rendezvous(f"tcp://{address}:{port}", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    import inspect

    params = inspect.signature(c10d._new_process_group_helper).parameters
    options = "backend_options" if "backend_options" in params else "pg_options"
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        c10d.Backend(backend),
        store,
        group_name=group_name,
        timeout=timeout,
        **{options: None},
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class GroupSync:
    """``/update_weights_from_distributed`` over a group of this trainer (rank 0) and every
    tensor-parallel rank of ``clients`` (ranks 1..N in client order; ``tp_sizes`` from each
    server's ``/server_info``, see :func:`tp_size`)."""

    method = "distributed"

    def __init__(
        self,
        clients: Sequence[SGLangClient],
        *,
        tp_sizes: Sequence[int],
        address: str,
        port: int,
        backend: str,
        group_name: str,
        timeout_s: float,
    ) -> None:
        self.clients = list(clients)
        self.tp_sizes = list(tp_sizes)
        self.address = address
        self.port = port or free_port()
        self.backend = backend
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.group: Any = None

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def connect(self) -> None:
        """Form the group: every server joins (each request blocks until the group exists)
        while this process joins as rank 0."""
        sizes = self.tp_sizes
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        logger.info(
            "sglang: forming weight-update group %s (%s, %d ranks) at %s:%d",
            self.group_name,
            self.backend,
            world,
            self.address,
            self.port,
        )

        def join(index: int) -> Any:
            return self.clients[index].update(
                "/init_weights_update_group", self.join_payload(offsets[index], world)
            )

        with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
            joins = [pool.submit(join, i) for i in range(len(self.clients))]
            self.group = init_weight_group(
                self.backend,
                self.address,
                self.port,
                rank=0,
                world_size=world,
                group_name=self.group_name,
                timeout_s=self.timeout_s,
            )
            for future in joins:
                future.result()

    def join_payload(self, rank_offset: int, world_size: int) -> dict[str, Any]:
        """The ``/init_weights_update_group`` body for a server whose first rank is
        ``rank_offset`` in a group of ``world_size``."""
        return {
            "master_address": self.address,
            "master_port": self.port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": self.group_name,
            "backend": self.backend,
        }

    def update_payload(self, group: NamedTensors, *, last: bool, version: int) -> dict[str, Any]:
        """The ``/update_weights_from_distributed`` body announcing ``group`` (the last
        bucket of a push flushes the cache and sets the version)."""
        return {
            "names": [n for n, _ in group],
            "dtypes": [dtype_name(t.dtype) for _, t in group],
            "shapes": [list(t.shape) for _, t in group],
            "group_name": self.group_name,
            "flush_cache": last,
            "weight_version": str(version) if last else None,
        }

    def push(self, pairs: NamedTensors, version: int) -> None:
        import torch.distributed as dist

        if self.group is None:
            self.connect()
        groups = list(buckets(pairs))
        for i, group in enumerate(groups):
            payload = self.update_payload(group, last=i == len(groups) - 1, version=version)
            with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
                calls = [
                    pool.submit(c.update, "/update_weights_from_distributed", payload)
                    for c in self.clients
                ]
                try:
                    for _, tensor in group:
                        data = tensor.to(self.device).contiguous()
                        dist.broadcast(data, src=0, group=self.group)
                except Exception as exc:
                    raise SGLangServerError(
                        f"sglang: broadcasting weights to group {self.group_name} failed: {exc}"
                    ) from exc
                for call in calls:
                    call.result()

    def close(self) -> None:
        if self.group is None:
            return
        for client in self.clients:
            try:
                client.post("/destroy_weights_update_group", {"group_name": self.group_name})
            except SGLangServerError as exc:
                logger.debug("sglang: %s", exc)
        import torch.distributed as dist

        try:
            dist.destroy_process_group(self.group)
        except Exception as exc:  # the group may already be gone with its peers
            logger.debug("sglang: destroying the weight-update group: %s", exc)
        self.group = None


# -- tensors in memory -------------------------------------------------------------------------

Serializer = Callable[[NamedTensors], str]


def sglang_serializer() -> Serializer:
    """SGLang's own serializer (CUDA tensors travel as IPC handles, with the device named by
    UUID); needs the sglang package."""
    try:
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError:
        from sglang.srt.utils.common import MultiprocessingSerializer  # type: ignore[no-redef]
    try:
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:
        from sglang.srt.patch_torch import monkey_patch_torch_reductions  # type: ignore[no-redef]

    monkey_patch_torch_reductions()

    def serialize(pairs: NamedTensors) -> str:
        return MultiprocessingSerializer.serialize(pairs, output_str=True)

    return serialize


def pickle_serializer(pairs: NamedTensors) -> str:
    """The same wire format without the sglang package: torch's multiprocessing pickler,
    base64-encoded (shared-memory handles: the reader must be on this machine)."""
    import io
    from multiprocessing.reduction import ForkingPickler

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(pairs)
    return base64.b64encode(buffer.getvalue()).decode()


def tensor_payload(blob: str, tp_size: int, *, last: bool, version: int) -> dict[str, Any]:
    """The ``/update_weights_from_tensor`` body: one copy of the serialized bucket per
    tensor-parallel rank of the server."""
    return {
        "serialized_named_tensors": [blob] * tp_size,
        "load_format": None,
        "flush_cache": last,
        "weight_version": str(version) if last else None,
    }


class TensorSync:
    """``/update_weights_from_tensor`` with serialized tensors (one copy per tensor-parallel
    rank of the server). The tensors must stay alive until the server has copied them, which
    each request waits for."""

    method = "tensor"

    def __init__(
        self,
        clients: Sequence[SGLangClient],
        tp_sizes: Sequence[int],
        serializer: Serializer | None = None,
    ) -> None:
        self.clients = list(clients)
        self._tp = list(tp_sizes)
        self._serializer = serializer
        self._lock = threading.Lock()

    def push(self, pairs: NamedTensors, version: int) -> None:
        with self._lock:
            if self._serializer is None:
                self._serializer = sglang_serializer()
        groups = list(buckets(pairs))
        for i, group in enumerate(groups):
            last = i == len(groups) - 1
            blob = self._serializer(group)
            for client, tp in zip(self.clients, self._tp, strict=True):
                client.update(
                    "/update_weights_from_tensor",
                    tensor_payload(blob, tp, last=last, version=version),
                )

    def close(self) -> None:
        pass
