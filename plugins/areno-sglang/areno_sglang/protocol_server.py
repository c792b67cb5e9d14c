"""A CPU stand-in for an SGLang server: the HTTP routes the ``sglang`` engine uses, with the
request and response JSON of SGLang's native API, backed by areno's native engine, so the
tokens and logprobs it returns are real samples of its model.

It exists to test the engine (and to try the remote mode) on a machine without a GPU. It is not
SGLang: no radix cache, no CUDA graphs, one request batch at a time, and only what the engine
sends is supported (``ignore_eos``, ``min_p`` and stop strings are refused). ::

    python -m areno_sglang.protocol_server --model-path random:qwen3-tiny --port 30000
    areno train --algo grpo --ckpt random:qwen3-tiny ... --sglang-url http://127.0.0.1:30000

Where it matters for a trainer it is as strict as SGLang 0.5.23 (``areno_sglang.compat``),
whose server code it follows:

* ``/release_memory_occupation`` frees the weights (tags ``weights``, ``kv_cache``,
  ``cuda_graph``; none given: all) and ``/resume_memory_occupation`` maps *fresh* memory: the
  weights come back as noise, still stamped with the old ``weight_version``, unless the server
  was started with ``--enable-weights-cpu-backup``. Releasing needs an idle server.
* ``/flush_cache`` answers 400 while requests run (or wait, unless generation is paused).
* ``/pause_generation`` (modes ``abort``, ``retract``, ``in_place``) holds new requests until
  ``/continue_generation``.
* ``sampling_params`` with a key SGLang does not know is a 400, as SGLang's contract gate does.
* ``--api-key`` and ``--admin-api-key`` are enforced with SGLang's rules: health routes are
  open; admin routes (weights, memory, cache, pause) take the admin key when one is set, else
  the API key; the others take the API key.
* ``/model_info`` and ``/server_info`` are the current routes; the deprecated
  ``/get_model_info`` and ``/get_server_info`` still answer (each call is counted in
  ``deprecated_calls``); ``/get_weight_version`` does not exist.

Like SGLang, it starts at weight version ``"default"``, takes a new version only with weights
that loaded, and stamps every output with its version.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from torch import nn

from areno_core.contracts.engine import EngineOptions
from areno_core.log import get_logger
from areno_core.rollout.native import NativeEngine
from areno_core.types import SamplingParams
from areno_sglang.client import ADMIN_ROUTES

logger = get_logger(__name__)


class ProtocolError(Exception):
    """A request the server refuses (answered with HTTP 400 and SGLang's error JSON)."""


SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
        "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
        "min_new_tokens", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
        "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
        "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
        "watermark", "choice",
    }
)  # fmt: skip
"""The ``sampling_params`` keys SGLang's ``/generate`` accepts (its API's ``SamplingParams``;
a test compares this set with the installed sglang's)."""
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
PAUSE_MODES = ("abort", "retract", "in_place")


class ProtocolServer:
    """Serve ``model`` on ``host:port`` (port 0: a free one) until :meth:`stop`.

    ``calls`` records every request as ``(method, path, body)`` (tensor payloads left out).
    Test hooks: ``ignore_weight_updates`` answers weight updates with success but keeps the old
    weights and version (a server that silently did not take them); ``stamp_version``
    overrides the version stamped on outputs.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_path: str = "areno-protocol-server",
        api_key: str | None = None,
        admin_api_key: str | None = None,
        weights_cpu_backup: bool = False,
        tp_size: int = 1,
        dp_size: int = 1,
        pp_size: int = 1,
    ) -> None:
        self.model = model.eval()
        self.model_path = model_path
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.weights_cpu_backup = weights_cpu_backup
        self.parallel = {"tp_size": tp_size, "dp_size": dp_size, "pp_size": pp_size}
        self.released_tags: set[str] = set()
        self.paused: str | None = None
        self.running = 0
        self.waiting = 0
        self.deprecated_calls: list[str] = []
        self._state = threading.Condition()
        self._backup: dict[str, torch.Tensor] | None = None
        config = getattr(model, "config", None)
        self.context_len = int(getattr(config, "max_position_embeddings", 0) or 32768)
        self.engine = NativeEngine(
            model, None, EngineOptions(attn_backend="native", max_prompt_tokens=self.context_len)
        )
        self.weight_version = "default"
        self.ignore_weight_updates = False
        self.stamp_version: str | None = None
        self.calls: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._groups: dict[str, Any] = {}
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ProtocolServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ProtocolServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def routes(self, method: str | None = None) -> list[str]:
        """The paths requested so far (of one HTTP method when given), in order."""
        return [path for m, path, _ in self.calls if method is None or m == method]

    @property
    def released(self) -> bool:
        """Whether any memory (weights, KV cache) is released now."""
        return bool(self.released_tags)

    def authorize(self, path: str, header: str | None) -> int | None:
        """None when a request to ``path`` with this ``Authorization`` header may proceed,
        else its HTTP status (401), by SGLang's rules (see the module docstring)."""
        if path.startswith(("/health", "/ready", "/metrics")):
            return None
        route = path.split("?", 1)[0]
        key = self.api_key
        if route in ADMIN_ROUTES and self.admin_api_key:
            key = self.admin_api_key
        if key is None:
            return None
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode()):
            return None
        return 401

    # -- GET ---------------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, Any]:
        if path in ("/health", "/health_generate"):
            return 200, ""
        if path in ("/get_model_info", "/get_server_info"):
            self.deprecated_calls.append(path)
            path = path.replace("/get_", "/", 1)
        if path == "/model_info":
            return 200, {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                "tokenizer_path": "",
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
            }
        if path == "/server_info":
            return 200, {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                **self.parallel,
                "enable_memory_saver": True,
                "enable_weights_cpu_backup": self.weights_cpu_backup,
                "max_context_length": self.context_len,
                "version": "areno-protocol-server",
                "internal_states": [],
            }
        return 404, {"detail": "Not Found"}

    # -- POST --------------------------------------------------------------------------------

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        handlers = {
            "/generate": self._generate,
            "/update_weights_from_disk": self._from_disk,
            "/update_weights_from_tensor": self._from_tensor,
            "/init_weights_update_group": self._init_group,
            "/update_weights_from_distributed": self._from_group,
            "/destroy_weights_update_group": self._destroy_group,
            "/release_memory_occupation": self._release,
            "/resume_memory_occupation": self._resume,
            "/flush_cache": self._flush,
            "/pause_generation": self._pause,
            "/continue_generation": self._continue,
        }
        handler = handlers.get(path)
        if handler is None:
            return 404, {"detail": "Not Found"}
        if not isinstance(body, dict):
            return 400, _error(f"{path} expects a JSON object")
        try:
            return handler(body)
        except ProtocolError as exc:
            return 400, _error(str(exc))

    def _generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        params = body.get("sampling_params") or {}
        for sp in params if isinstance(params, list) else [params]:
            unknown = sorted(set(sp) - SAMPLING_KEYS) if isinstance(sp, dict) else []
            if unknown:  # SGLang's contract gate answers {"error": ...} with HTTP 400
                return 400, {"error": f"unknown field `{unknown[0]}` in sampling_params"}
        with self._state:
            self.waiting += 1
            try:
                while self.paused is not None:
                    self._state.wait()
            finally:
                self.waiting -= 1
            self.running += 1
        try:
            return self._generate_now(body)
        finally:
            with self._state:
                self.running -= 1
                self._state.notify_all()

    def _generate_now(self, body: dict[str, Any]) -> tuple[int, Any]:
        if self.released:
            raise ProtocolError("memory is released: call /resume_memory_occupation first")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids:
            raise ProtocolError("/generate needs input_ids (the protocol server takes no text)")
        single = all(isinstance(t, int) for t in ids)
        prompts = [ids] if single else ids
        params = body.get("sampling_params") or {}
        per_request = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_request) != len(prompts):
            raise ProtocolError("sampling_params must be one object or one per input")
        logprobs = bool(body.get("return_logprob", False))
        began = time.perf_counter()
        samplings = [_native_sampling(sp) for sp in per_request]
        for prompt in prompts:
            if len(prompt) >= self.context_len:
                raise ProtocolError(
                    f"the input ({len(prompt)} tokens) is longer than the model's context "
                    f"length ({self.context_len} tokens)"
                )
        completions: list[Any] = [None] * len(prompts)
        with self._lock:
            # Greedy requests with equal settings share one batch; a sampled request has its
            # own random stream (its sampling_seed), so it runs alone.
            batches: dict[SamplingParams, list[int]] = {}
            for i, sampling in enumerate(samplings):
                if sampling.greedy:
                    batches.setdefault(sampling, []).append(i)
                else:
                    completions[i] = self.engine.generate([list(prompts[i])], sampling)[0][0]
            for sampling, members in batches.items():
                groups = self.engine.generate([list(prompts[i]) for i in members], sampling)
                for i, group in zip(members, groups, strict=True):
                    completions[i] = group[0]
        outputs = list(zip(prompts, per_request, completions, strict=True))
        version = self.stamp_version or self.weight_version
        answers = []
        for prompt, sp, c in outputs:
            max_new = int(sp.get("max_new_tokens", 128))
            # SGLang checks the length cap before stop tokens.
            if len(c.token_ids) >= max_new:
                finish = {"type": "length", "length": max_new}
            elif c.finish_reason == "stop":
                finish = {"type": "stop", "matched": c.token_ids[-1]}
            else:
                finish = {"type": "length", "length": max_new}
            meta: dict[str, Any] = {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": len(prompt),
                "completion_tokens": len(c.token_ids),
                "cached_tokens": 0,
                "weight_version": version,
                "e2e_latency": time.perf_counter() - began,
            }
            if logprobs:
                meta["output_token_logprobs"] = [
                    [lp, tok, None] for lp, tok in zip(c.logprobs, c.token_ids, strict=True)
                ]
            answers.append({"output_ids": list(c.token_ids), "meta_info": meta})
        return 200, answers[0] if single else answers

    def _load(self, pairs: Iterator[tuple[str, torch.Tensor]], version: Any) -> tuple[int, Any]:
        state = dict(pairs)
        if self.ignore_weight_updates:
            return 200, {"success": True, "message": "ignored (test hook)"}
        with self._lock, torch.no_grad():
            current = self.model.state_dict()
            unknown = sorted(k for k in state if k not in current)
            if unknown:
                return 400, {"success": False, "message": f"unknown weights: {unknown[:5]}"}
            for name, tensor in state.items():
                if tuple(tensor.shape) != tuple(current[name].shape):
                    return 400, {
                        "success": False,
                        "message": f"{name}: shape {list(tensor.shape)}, the model has "
                        f"{list(current[name].shape)}",
                    }
            self.model.load_state_dict(state, strict=False)
            if version is not None:
                self.weight_version = str(version)
        return 200, {"success": True, "message": f"Updated {len(state)} tensors."}

    def _from_disk(self, body: dict[str, Any]) -> tuple[int, Any]:
        from safetensors.torch import load_file

        path = Path(str(body.get("model_path", "")))
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            return 400, {
                "success": False,
                "message": f"no safetensors files in {str(path)!r}",
                "num_paused_requests": 0,
            }
        pairs = ((k, v) for f in files for k, v in load_file(str(f)).items())
        status, answer = self._load(pairs, body.get("weight_version"))
        answer["num_paused_requests"] = 0
        return status, answer

    def _from_tensor(self, body: dict[str, Any]) -> tuple[int, Any]:
        from multiprocessing.reduction import ForkingPickler

        blobs = body.get("serialized_named_tensors")
        if not isinstance(blobs, list) or not blobs:
            raise ProtocolError("serialized_named_tensors must be a list (one per TP rank)")
        pairs = ForkingPickler.loads(base64.b64decode(blobs[0]))
        return self._load(((str(n), t.clone()) for n, t in pairs), body.get("weight_version"))

    def _init_group(self, body: dict[str, Any]) -> tuple[int, Any]:
        from areno_sglang.weights import init_weight_group

        name = str(body.get("group_name", "weight_update_group"))
        self._groups[name] = init_weight_group(
            str(body.get("backend", "nccl")),
            str(body["master_address"]),
            int(body["master_port"]),
            rank=int(body["rank_offset"]),
            world_size=int(body["world_size"]),
            group_name=name,
            timeout_s=300.0,
        )
        return 200, {"success": True, "message": f"joined {name}"}

    def _from_group(self, body: dict[str, Any]) -> tuple[int, Any]:
        import torch.distributed as dist

        name = str(body.get("group_name", "weight_update_group"))
        group = self._groups.get(name)
        if group is None:
            return 400, {"success": False, "message": f"no weight-update group {name!r}"}
        received = []
        for weight, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(tensor, src=0, group=group)
            received.append((weight, tensor))
        return self._load(iter(received), body.get("weight_version"))

    def _destroy_group(self, body: dict[str, Any]) -> tuple[int, Any]:
        import torch.distributed as dist

        group = self._groups.pop(str(body.get("group_name", "weight_update_group")), None)
        if group is not None:
            dist.destroy_process_group(group)
        return 200, {"success": True, "message": "destroyed"}

    def _idle(self) -> bool:
        """No request runs, and none waits unless generation is paused (SGLang's test before
        flushing the cache or releasing memory)."""
        return self.running == 0 and (self.waiting == 0 or self.paused is not None)

    def _tags(self, body: dict[str, Any]) -> set[str]:
        tags = body.get("tags")
        if not tags:
            return set(MEMORY_TAGS)
        unknown = sorted(set(tags) - set(MEMORY_TAGS))
        if unknown:
            raise ProtocolError(f"unknown memory tags {unknown}; expected some of {MEMORY_TAGS}")
        return set(tags)

    def _release(self, body: dict[str, Any]) -> tuple[int, Any]:
        tags = self._tags(body)
        with self._state:
            if not self._idle():
                raise ProtocolError(
                    "release_memory_occupation should be called only when server is idle."
                )
            if "weights" in tags and "weights" not in self.released_tags:
                # The memory saver unmaps the weights; only a CPU backup brings them back.
                self._backup = (
                    {k: v.detach().clone() for k, v in self.model.state_dict().items()}
                    if self.weights_cpu_backup
                    else None
                )
            self.released_tags |= tags
        return 200, None

    def _resume(self, body: dict[str, Any]) -> tuple[int, Any]:
        tags = self._tags(body)
        with self._state, self._lock, torch.no_grad():
            if "weights" in tags & self.released_tags:
                if self._backup is not None:
                    self.model.load_state_dict(self._backup)
                else:  # fresh memory: whatever it holds, not the weights
                    generator = torch.Generator().manual_seed(len(self.calls))
                    for tensor in self.model.state_dict().values():
                        if tensor.is_floating_point():
                            tensor.copy_(torch.randn(tensor.shape, generator=generator))
                self._backup = None
            self.released_tags -= tags
        return 200, None

    def _flush(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._state:
            if not self._idle():
                return 400, (
                    "Cache not flushed because there are pending requests. "
                    f"#running-req: {self.running}, #queue-req: {self.waiting}\n"
                )
        return 200, "Cache flushed.\n"

    def _pause(self, body: dict[str, Any]) -> tuple[int, Any]:
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise ProtocolError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        with self._state:
            self.paused = str(mode)
            if mode != "in_place":  # aborted or retracted: nothing keeps running
                while self.running:
                    self._state.wait()
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def _continue(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._state:
            self.paused = None
            self._state.notify_all()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}


def _native_sampling(sp: dict[str, Any]) -> SamplingParams:
    if sp.get("ignore_eos"):
        raise ProtocolError("ignore_eos is not supported by the protocol server")
    if float(sp.get("min_p", 0.0) or 0.0) != 0.0:
        raise ProtocolError("min_p is not supported by the protocol server")
    if sp.get("stop") or sp.get("stop_regex"):
        raise ProtocolError("stop strings are not supported by the protocol server")
    temperature = float(sp.get("temperature", 1.0))
    return SamplingParams(
        max_new_tokens=int(sp.get("max_new_tokens", 128)),
        temperature=temperature if temperature > 0 else 1.0,
        top_k=int(sp.get("top_k", -1)),
        top_p=float(sp.get("top_p", 1.0)),
        greedy=temperature == 0.0,
        stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
        seed=None if sp.get("sampling_seed") is None else int(sp["sampling_seed"]),
    )


def _error(message: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "Bad Request", "code": 400}


def _summary(path: str, body: Any) -> Any:
    if path == "/update_weights_from_tensor" and isinstance(body, dict):
        return {k: v for k, v in body.items() if k != "serialized_named_tensors"}
    return body


def _handler(server: ProtocolServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("protocol server: " + format, *args)

        def _send(self, status: int, body: Any) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            kind = "text/plain" if isinstance(body, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _denied(self) -> bool:
            status = server.authorize(self.path, self.headers.get("Authorization"))
            if status is None:
                return False
            server.calls.append((self.command, self.path, "unauthorized"))
            self._send(status, {"error": "Unauthorized"})
            return True

        def do_GET(self) -> None:
            if self._denied():
                return
            server.calls.append(("GET", self.path, None))
            self._send(*server.get(self.path))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0) or 0)
            raw = self.rfile.read(length) if length else b"{}"
            if self._denied():
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, _error("the body is not JSON"))
                return
            server.calls.append(("POST", self.path, _summary(self.path, body)))
            try:
                self._send(*server.post(self.path, body))
            except Exception as exc:  # a bug or a broken peer: answer, and keep serving
                logger.exception("protocol server: %s failed", self.path)
                self._send(500, _error(f"{type(exc).__name__}: {exc}"))

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve a model (a local directory or an areno reference such as ``random:qwen3-tiny``).
    Unknown arguments (SGLang server flags) are accepted and ignored."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--admin-api-key", default=None)
    parser.add_argument("--enable-weights-cpu-backup", action="store_true")
    args, ignored = parser.parse_known_args(argv)
    from areno_core.models.loading import load_model

    torch.set_num_threads(1)
    torch.manual_seed(args.random_seed)
    model = load_model(args.model_path, device="cpu")
    server = ProtocolServer(
        model,
        host=args.host,
        port=args.port,
        model_path=args.model_path,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        weights_cpu_backup=args.enable_weights_cpu_backup,
    )
    if ignored:
        logger.info("protocol server: ignoring SGLang arguments %s", " ".join(ignored))
    print(f"areno protocol server: {args.model_path} at {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
