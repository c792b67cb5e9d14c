"""The native rollout engine: batched sampling from the very module being trained.

``NativeEngine`` runs the policy (a transformers causal LM) with a KV cache on CPU or one GPU,
in ``torch.inference_mode()`` and eval mode, then puts the module back as it found it. No
weights are copied, so ``sync_weights`` is free when handed the shared module.

How a ``generate()`` call runs
------------------------------
Each (prompt, sample) pair is a *request*. At most ``max_running`` requests occupy *rows* of a
batch at once (continuous batching): when a row finishes (EOS or ``max_new_tokens``) a waiting
request takes it over, so the batch stays full while long and short completions mix.

The KV cache (:class:`KVStore`) is one preallocated ``[rows, kv_heads, columns, head_dim]``
buffer per layer, plus a ``[rows, columns]`` attention mask. All rows share one column window
``[lo, hi)``: a row's tokens are right-aligned at ``hi`` (left padding) and the mask hides the
columns before its first token; every token carries an explicit position id, so where a row
sits in the buffer does not change what the model computes. A decode step writes column ``hi``
for every row and moves ``hi`` one to the right; the window's left edge follows the oldest
running row, so finished rows stop costing attention. Admitting requests prefills their prompts
in batches (identical prompts of the ``n`` samples are run once) and writes their keys and
values straight into the rows they take, ending at column ``hi``. Rows that finish with nobody
waiting are closed by moving the last rows into the gaps. The buffers grow (or the window is
moved back to the left) only when the window reaches the end, so this happens rarely; between
``generate()`` calls they are kept unless the session ends with ``drop_state``.

When a prompt is sampled ``n > 1`` times and the lean forward pass runs (a CPU), its keys and
values are kept once per group of samples in a :class:`~areno_core.rollout.prefix.PrefixStore`
instead of in each row, and the rows hold only their generated tokens; decode steps attend to
the group's prompt once per group and merge it with each row's own attention (see
:mod:`areno_core.rollout.prefix`). By default a call does so when its prompts average at least
16 tokens; ``shared_prompt_cache`` True or False decides for every call. With the
transformers module (GPUs, ``lean_forward`` off, other model families) every row holds a copy.

Per decode step the engine makes one device-to-host copy (the sampled tokens and their
logprobs, needed to spot EOS); everything else is tensor ops on all rows or numpy bookkeeping.

On a GPU a decode step whose running rows fit a batch-size bucket is replayed from a captured
CUDA graph of a static-shape step (every cache column, the window applied by a mask computed
from device scalars; see :mod:`areno_core.rollout.cuda_graphs`); ``eager_decode`` turns that
off. The static step computes what the eager step computes, up to rounding.

Random numbers are a hash of ``(seed, request, token index)``, so a request samples the same
tokens whatever else runs in its batch and whatever ``max_running`` is (up to floating-point
differences between batch shapes). A request is numbered by its prompt's place in the whole
step's batch (``SamplingParams.prompt_offset`` plus its index in the call), so data-parallel
ranks that each sample a share of the prompts draw what one process would.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch
from torch import nn
from transformers.cache_utils import Cache

from areno_core.accel.attention import FLASH, attention_of, choose_attention, sdpa_without_cudnn
from areno_core.contracts.engine import EngineOptions
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger, warn_once
from areno_core.models.compat import cache_argument
from areno_core.models.families import has_sliding_window
from areno_core.models.lean import (
    LeanDecoder,
    lean_unavailable_reason,
    prepack_unavailable_reason,
)
from areno_core.rollout.cuda_graphs import DecodeGraphs
from areno_core.rollout.generation import Generation, TokenCallback
from areno_core.rollout.kit import (
    FinishedSample,
    add_completions,
    admit_prompts,
    count_generation,
    resolve_eos,
)
from areno_core.rollout.kv_cache import KVStore
from areno_core.rollout.native_config import NativeEngineConfig
from areno_core.rollout.sampling import (
    draw_seed,
)
from areno_core.types import Completion, SamplingParams

logger = get_logger(__name__)

# The fewest new tokens a generate() call may decode for its bfloat16 weights to be reordered
# for oneDNN first (``prepacked_weights``). Measured on an AVX512-BF16 CPU with the 20.6M
# random:qwen3-small: reordering took about 36 ms of CPU time, and a decode step saved 3-5 ms
# at 32 rows and under 2 ms at 8, so the reordering paid for itself after roughly 10 to 20
# steps.
PREPACK_MIN_NEW_TOKENS = 32

_STAT_KEYS = (
    "prompts",
    "skipped_prompts",
    "completions",
    "prompt_tokens",
    "generated_tokens",
    "prefill_forwards",
    "decode_steps",
    "peak_running",
    "generate_time_s",
    "tokens_per_s",
    "weight_syncs",
    "graph_decode_steps",
    "graph_captures",
)


class NativeEngine:
    """Rollout engine that samples from the training module itself (see the module docstring).

    ``tokenizer_or_eos_ids`` is either a tokenizer (its ``eos_token_id`` and the model's
    ``generation_config.eos_token_id`` end a completion, and completions get decoded ``text``)
    or the exact EOS token ids (an int or a sequence of ints; ``text`` is then empty).
    """

    name = "native"
    lora_weights = "module"  # see EngineSpec: it samples from the module, adapters included

    def __init__(
        self,
        model: nn.Module,
        tokenizer_or_eos_ids: Any = None,
        options: EngineOptions | None = None,
        config: NativeEngineConfig | None = None,
    ) -> None:
        self.model = model
        self.options = options if options is not None else EngineOptions()
        self.config = config if config is not None else NativeEngineConfig()
        self.tokenizer, self.eos_token_ids = resolve_eos(model, tokenizer_or_eos_ids)
        text_config = _text_config(model)
        # Sliding windows are masks over the kept keys; a static decode step (CUDA graphs)
        # passes one mask to every layer, so windowed models decode eagerly.
        self._windowed = _check_attention(text_config)
        self._num_layers = int(text_config.num_hidden_layers)
        self.attn_implementation = _pick_attention(model, self.options.attn_backend)
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cache_argument = cache_argument(model)
        self._store: KVStore | None = None
        self._lean: LeanDecoder | None = None
        # Decode steps from captured CUDA graphs: created with the first store on a GPU,
        # never with eager_decode (tests may install one with capture=False on a CPU).
        self._graphs: DecodeGraphs | None = None
        self._weights_key: tuple[int, ...] = ()
        self._in_session = False
        self.policy_version = 0
        self.stats: dict[str, float] = dict.fromkeys(_STAT_KEYS, 0.0)

    # -- session -----------------------------------------------------------------------------

    def start_session(self) -> None:
        if self._in_session:
            raise RuntimeError("start_session() called while a rollout session is already open")
        self._in_session = True
        self.stats = dict.fromkeys(_STAT_KEYS, 0.0)

    def end_session(self, *, drop_state: bool = False) -> None:
        self._in_session = False
        if drop_state:
            self.drop_state()

    def drop_state(self) -> None:
        """Free the KV cache, per-row buffers and captured decode graphs (they are rebuilt on
        the next generate())."""
        if self._graphs is not None:
            self._graphs.reset()
        if self._store is not None:
            device = self._store.device
            self._store.free()
            self._store = None
            if device.type == "cuda":
                torch.cuda.empty_cache()

    @property
    def uses_graphs(self) -> bool:
        """Whether decode steps may replay captured CUDA graphs (a GPU, ``eager_decode`` off)."""
        return self._graphs is not None

    @property
    def state_bytes(self) -> int:
        """Bytes held by the KV cache and masks between generate() calls."""
        return 0 if self._store is None else self._store.nbytes()

    def sync_weights(self, weights: Mapping[str, Any] | nn.Module, *, version: int) -> None:
        """Sample from ``weights`` (version ``version``) from now on. The shared module itself
        costs nothing; a state dict (possibly partial) or another module's weights are copied
        into the module in place."""
        if isinstance(weights, nn.Module):
            state = None if weights is self.model else weights.state_dict()
        elif isinstance(weights, Mapping):
            state = dict(weights)
        else:
            raise TypeError(
                f"sync_weights() takes a state dict or a torch module, got {type(weights).__name__}"
            )
        self.stats["weight_syncs"] += 1
        self.policy_version = int(version)
        if state is None:
            return
        with torch.no_grad():
            result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise ValueError(
                "sync_weights(): keys not in the policy model: "
                + ", ".join(sorted(result.unexpected_keys)[:5])
            )
        logger.debug("synced %d tensors into the rollout model", len(state))

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        on_tokens: TokenCallback | None = None,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (token ids). See the module docstring.

        The random stream comes from ``sampling.seed`` when set, else one draw from torch's
        global generator. ``on_tokens`` (optional; the agent endpoint streams with it) is
        called after every prefill and decode step, on this thread, with one ``(prompt index,
        sample index, token id, logprob)`` per row that sampled a token.
        """
        began = time.perf_counter()
        kept = admit_prompts(prompts, sampling, n, max_prompt_tokens=self.options.max_prompt_tokens)
        results: list[list[Completion]] = [[] for _ in prompts]
        run: Generation | None = None
        if kept:
            seed = sampling.seed if sampling.seed is not None else draw_seed()
            with self._rollout_mode(), self._prepacked(len(kept) * n, sampling.max_new_tokens):
                run = Generation(
                    self, self._get_store(), prompts, kept, sampling, n, seed, on_tokens=on_tokens
                )
                raw = run.run()
            if any(out is None for out in raw):
                raise AssertionError("every request must finish")
            finished = (
                FinishedSample(p, out.token_ids, out.logprobs, out.finish_reason)
                for out, p in zip(raw, run.req_prompt.tolist(), strict=True)
                if out is not None
            )
            add_completions(results, prompts, finished, self.tokenizer, self.policy_version)
        count_generation(self.stats, prompts, kept, results, time.perf_counter() - began)
        if run is not None:
            stats = self.stats
            stats["prefill_forwards"] += run.prefill_forwards
            stats["decode_steps"] += run.decode_steps
            stats["peak_running"] = max(stats["peak_running"], float(run.peak_running))
        return results

    def probe_memory(
        self,
        rows: int,
        *,
        prompt_tokens: int,
        context_tokens: int,
        sampling: SamplingParams,
        n: int = 1,
        decode_steps: int = 2,
    ) -> None:
        """Reproduce the most memory-hungry moment of a rollout, for memory probes
        (``--tune-params``): ``rows`` sequences decoded at once, each with a prompt of
        ``prompt_tokens`` random tokens (``n`` samples per prompt, so prefills are shared as in a
        run) and a cache window of ``context_tokens``; then ``decode_steps`` decode steps with
        ``sampling`` (top-k/top-p included; EOS never stops a row).

        The tokens between the prompt and the last decode steps are not computed: the rows
        jump there with zero keys and values, which cost the same memory. Stats and the
        session are left alone; the cache is kept like after ``generate``.
        """
        if rows < 1 or prompt_tokens < 1 or decode_steps < 1:
            raise ValueError("probe_memory: rows, prompt_tokens and decode_steps must be >= 1")
        per_prompt = n if rows % n == 0 else 1
        vocab = int(_text_config(self.model).vocab_size)
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (rows // per_prompt, prompt_tokens), generator=generator)
        steps = SamplingParams(
            max_new_tokens=decode_steps + 1,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            greedy=sampling.greedy,
        )
        skip = max(0, context_tokens - prompt_tokens - steps.max_new_tokens)
        previous = self.options
        self.options = attrs.evolve(previous, max_running=rows)
        try:
            with self._rollout_mode(), self._prepacked(rows, context_tokens - prompt_tokens):
                run = Generation(
                    self,
                    self._get_store(),
                    prompts.tolist(),
                    list(range(len(prompts))),
                    steps,
                    per_prompt,
                    seed=0,
                    skip_ahead=skip,
                    stop=False,
                )
                run.run()
        finally:
            self.options = previous

    def _get_store(self) -> KVStore:
        device = _model_device(self.model)
        if self._store is None or self._store.device != device:
            self.drop_state()
            self._store = KVStore(self._num_layers, device)
        if (
            self._graphs is None
            and device.type == "cuda"
            and not self.options.eager_decode
            and not self._windowed
        ):
            self._graphs = DecodeGraphs(capture=True)
        if self._graphs is not None:
            self._weights_key = _weights_key(self.model)
        return self._store

    def lean_decoder(self) -> LeanDecoder | None:
        """The lean forward pass for this generate() call (None: the transformers module runs,
        on GPUs, with ``lean_forward`` off, or for a model the lean pass does not support)."""
        if not self.config.lean_forward or _model_device(self.model).type != "cpu":
            self._lean = None
            return None
        lean = self._lean
        if lean is not None and lean.is_current(self.model):
            return lean
        self._lean = None
        reason = lean_unavailable_reason(self.model)
        if reason is not None:
            warn_once(
                logger,
                f"rollout.no_lean.{type(self.model).__name__}",
                "native engine: %s decodes through its transformers forward (the lean forward "
                "pass does not run it: %s)",
                type(self.model).__name__,
                reason,
                level=logging.INFO,
            )
            return None
        self._lean = LeanDecoder(self.model)
        return self._lean

    def graph_step(self, store: KVStore) -> torch.Tensor | None:
        """Logits of this decode step from a captured graph (a static step without capture on
        a CPU); None when graphs are off or the running rows fit no graph size."""
        graphs = self._graphs
        if graphs is None or self._windowed:
            return None
        store.set_scalars()
        key = (id(store), store.generation, self._weights_key)
        before = graphs.stats.captures
        logits = graphs.step(key, store.n, store.rows, lambda rows: self._static_forward(rows))
        if logits is None:
            return None
        self.stats["graph_decode_steps"] += 1
        self.stats["graph_captures"] += graphs.stats.captures - before
        return logits[: store.n]

    def _static_forward(self, rows: int) -> torch.Tensor:
        """One decode step over the first ``rows`` rows and every cache column (what a graph
        records). It runs SDPA with an explicit 4D mask whatever the model's attention
        implementation, since flash-attn's padded decode reads lengths back to the host."""
        store = self._store
        assert store is not None
        input_ids, mask, positions = store.static_inputs(rows)
        with _attention(self.model, "sdpa"), store.static_step(rows):
            return self.forward_logits(input_ids, mask, positions, store.cache)

    @contextlib.contextmanager
    def _prepacked(self, rows: int, new_tokens: int) -> Iterator[None]:
        """The block's decoding on linear weights reordered once for oneDNN, where that pays
        (``prepacked_weights``; see :meth:`LeanDecoder.prepacked`). Weights change only
        between generate() calls (``sync_weights``, or a trainer's step on the shared
        module), and the copies are made anew for every call, so they are never stale. A call
        that may decode fewer than :data:`PREPACK_MIN_NEW_TOKENS` tokens keeps the plain
        weights: reordering costs more than so few steps save."""
        lean = self.lean_decoder() if self.config.prepacked_weights else None
        if (
            lean is None
            or new_tokens < PREPACK_MIN_NEW_TOKENS
            or prepack_unavailable_reason(self.model)
        ):
            yield
            return
        with lean.prepacked(min(rows, self.options.max_running or rows)):
            yield

    @contextlib.contextmanager
    def _rollout_mode(self) -> Iterator[None]:
        model = self.model
        was_training = model.training
        config = getattr(model, "config", None)
        previous = getattr(config, "_attn_implementation", None)
        switch = (
            previous is not None
            and previous != self.attn_implementation
            and hasattr(model, "set_attn_implementation")
        )
        model.eval()
        try:
            if switch:
                model.set_attn_implementation(self.attn_implementation)
            with torch.inference_mode(), sdpa_without_cudnn(_model_device(model)):
                yield
        finally:
            if switch:
                model.set_attn_implementation(previous)
            model.train(was_training)

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache,
    ) -> torch.Tensor:
        """Run the model; return the logits of the last position of each row, [B, V]."""
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_argument: cache,
            "use_cache": True,
        }
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1, :]


def create_native_engine(
    model: nn.Module,
    tokenizer: Any,
    options: EngineOptions | None = None,
    config: NativeEngineConfig | None = None,
) -> NativeEngine:
    """Factory of the ``native`` rollout engine."""
    return NativeEngine(model, tokenizer, options, config)


# -- helpers ----------------------------------------------------------------------------------


def _model_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError("NativeEngine needs a transformers model (with a .config)")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _check_attention(config: Any) -> bool:
    """Whether some layers of a model with this config attend through a sliding window (the
    cache keeps every key; each layer's mask applies its window). Layer kinds other than full
    and sliding attention are refused."""
    try:
        return has_sliding_window(config)
    except ConfigError as exc:
        raise NotAvailableError(f"the native rollout engine cannot run this model: {exc}") from None


def _pick_attention(model: nn.Module, backend: str) -> str:
    """flash_attention_2 when ``backend`` is flash and flash-attn can run this model (see
    :func:`areno_core.accel.attention.choose_attention`, which warns once otherwise); else the
    model's own SDPA or eager attention."""
    dtype = next(model.parameters()).dtype
    chosen = choose_attention(backend, _model_device(model), dtype)
    if chosen == FLASH:
        return chosen
    current = attention_of(model) or "sdpa"
    return current if current in ("sdpa", "eager") else "sdpa"


def _weights_key(model: nn.Module) -> tuple[int, ...]:
    """Where the model's weights live: captured graphs read them there, so any move (an
    offload, a reload) must drop the graphs."""
    return tuple(p.data_ptr() for p in model.parameters())


@contextlib.contextmanager
def _attention(model: nn.Module, implementation: str) -> Iterator[None]:
    """Run ``model`` with ``implementation`` for the block (no change when it already does)."""
    previous = attention_of(model)
    switch = previous not in (None, implementation) and hasattr(model, "set_attn_implementation")
    if switch:
        model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)


def benchmark_decode(
    model: nn.Module,
    *,
    batch_size: int,
    prompt_len: int = 16,
    new_tokens: int = 64,
    with_hf_generate: bool = True,
) -> dict[str, float]:
    """Rough decode throughput (generated tokens per second) of the native engine and, for
    reference, of ``model.generate``, on random prompts with EOS disabled. For humans, not
    tests: the numbers depend on the machine."""
    vocab = int(_text_config(model).vocab_size)
    device = _model_device(model)
    rng = torch.Generator().manual_seed(0)
    prompt_t = torch.randint(0, vocab, (batch_size, prompt_len), generator=rng)
    sampling = SamplingParams(max_new_tokens=new_tokens, greedy=True)
    engine = NativeEngine(model, (), EngineOptions(attn_backend="native"))
    engine.generate(prompt_t[:, :4].tolist(), SamplingParams(max_new_tokens=2, greedy=True))
    began = time.perf_counter()
    out = engine.generate(prompt_t.tolist(), sampling)
    seconds = time.perf_counter() - began
    result = {"native_tokens_per_s": sum(len(c[0].token_ids) for c in out) / seconds}
    if with_hf_generate:
        ids = prompt_t.to(device)
        with torch.inference_mode():
            began = time.perf_counter()
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
            seconds = time.perf_counter() - began
        result["hf_generate_tokens_per_s"] = batch_size * new_tokens / seconds
    return result


__all__ = [
    "EngineOptions",
    "NativeEngine",
    "NativeEngineConfig",
    "benchmark_decode",
    "create_native_engine",
]
