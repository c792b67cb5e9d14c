"""Real memory probes for ``--tune-params``: the run's architecture with random weights, its
backend, its rollout engine, and synthetic token rows at the run's lengths.

:class:`RunProbes` builds, on first use, everything a run keeps resident: the policy (and a
reference, critic or reward model when the algorithm has one) initialised from the
checkpoint's *config* only, no weights read, in the run's dtype and attention kernels; the
backend's optimizer, whose state is created by one warm-up step on a tiny synthetic batch
(so it is resident during the rollout probes, as from the second step of a run on); and the
run's rollout engine. Then:

* ``rollout(R)``: ``R`` sequences decoded at once with prompts of ``--max-prompt-tokens`` and a
  cache window of the whole row (``--max-prompt-tokens + --max-new-tokens``, or
  ``--max-context-len`` for agentic runs), with the run's sampling settings, in a rollout
  session that drops its state at the end (the native engine reproduces the last decode
  steps of such a rollout without computing the tokens before them, see
  :meth:`~areno_core.rollout.native.NativeEngine.probe_memory`);
* ``train(M)``: one training step of the run's algorithm on ``M`` synthetic rows of the full
  row length (one microbatch, one optimizer step), rewards alternating so advantages are not
  zero.

Nothing here reads a dataset row or writes a checkpoint. Memory is measured by
:class:`~areno_core.accel.memory.MemoryMeter`: the GPU's memory on a GPU, the process's
resident memory against the machine's RAM on a CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM

from areno_core.accel.memory import MemoryMeter
from areno_core.contracts.backend import TrainingBackend
from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.log import get_logger
from areno_core.model import TrainableModel
from areno_core.models.loading import ValueModel, load_model_config, load_tokenizer
from areno_core.models.lora import LoraSettings
from areno_core.models.scratch import build_random_model, is_random_ref
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from areno_core.resolve import ResolvedRun

logger = get_logger(__name__)

DECODE_STEPS = 2  # decode steps a rollout probe runs at the full window
WARMUP_TOKENS = 4  # row length of the warm-up step that creates the optimizer state


def row_lengths(resolved: ResolvedRun) -> tuple[int, int]:
    """(prompt tokens, whole-row tokens) the probes use: the run's longest prompt and row."""
    cfg = resolved.config
    prompt = cfg.max_prompt_tokens
    total = prompt + cfg.max_new_tokens
    if cfg.agent_fn is not None and cfg.max_context_len is not None:
        total = max(cfg.max_context_len, prompt + 1)
    return prompt, total


def kv_cache_bytes(config: Any, rows: int, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of a dense KV cache of ``rows`` x ``tokens`` for a transformers ``config``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    element = torch.empty((), dtype=dtype).element_size()
    return rows * tokens * layers * 2 * kv_heads * head_dim * element


def dummy_causal_lm(ref: str, *, dtype: torch.dtype, device: torch.device, attention: str) -> Any:
    """A causal LM of ``ref``'s architecture with random weights (no weights are read)."""
    if is_random_ref(ref):
        model = build_random_model(ref, dtype=dtype).to(device)
        model.set_attn_implementation(attention)
        return model

    config = load_model_config(ref)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    return model.eval()


def dummy_value_model(
    ref: str, *, dtype: torch.dtype, device: torch.device, attention: str
) -> ValueModel:
    """A critic or reward model of ``ref``'s architecture with random weights."""
    if is_random_ref(ref):
        backbone = dummy_causal_lm(ref, dtype=dtype, device=device, attention=attention).model
    else:
        config = load_model_config(ref)
        with torch.device(device):
            backbone = AutoModel.from_config(config, dtype=dtype, attn_implementation=attention)
    head = nn.Linear(backbone.config.hidden_size, 1, bias=False).to(device=device, dtype=dtype)
    return ValueModel(backbone, head).eval()


def synthetic_groups(
    rows: int,
    *,
    n_samples: int,
    prompt_tokens: int,
    total_tokens: int,
    vocab: int,
    seed: int = 0,
) -> list[TrajectoryGroup]:
    """``rows`` trajectories of ``total_tokens`` random tokens, in groups of ``n_samples``
    sharing a ``prompt_tokens`` prompt (the last group may be smaller); rewards alternate 0/1."""
    generator = torch.Generator().manual_seed(seed)
    prompt_tokens = min(prompt_tokens, total_tokens - 1)
    completion = total_tokens - prompt_tokens
    groups = []
    index = 0
    while rows > 0:
        size = min(n_samples, rows)
        prompt = torch.randint(0, vocab, (prompt_tokens,), generator=generator).tolist()
        trajectories = []
        for sample in range(size):
            tail = torch.randint(0, vocab, (completion,), generator=generator).tolist()
            trajectories.append(
                Trajectory(
                    input_ids=prompt + tail,
                    loss_mask=[0] * prompt_tokens + [1] * completion,
                    rollout_logprobs=[0.0] * prompt_tokens + [-math.log(vocab)] * completion,
                    reward=float(sample % 2),
                    prompt_len=prompt_tokens,
                    prompt_index=index,
                    sample_index=sample,
                )
            )
        groups.append(TrajectoryGroup(PromptItem(index, {}, prompt="synthetic"), trajectories))
        rows -= size
        index += 1
    return groups


def release_memory() -> None:
    """Give freed memory back: Python garbage, torch's CUDA cache, and glibc's heap (so the
    next probe's resident memory starts from what is really in use)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    _malloc_trim()


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class RunProbes:
    """The :class:`~areno_core.tune.search.Probes` of one resolved run (module docstring)."""

    def __init__(
        self,
        resolved: ResolvedRun,
        *,
        backend: TrainingBackend,
        train_kwargs: dict[str, Any],
        setup_kwargs: dict[str, Any],
        dtype: torch.dtype,
        attention: str,
    ) -> None:
        self.resolved = resolved
        self.cfg = resolved.config
        self.backend = backend
        self.train_kwargs = dict(train_kwargs)
        self.setup_kwargs = dict(setup_kwargs)
        self.dtype = dtype
        self.attention = attention
        self.device = torch.device(backend.device)
        self.meter = MemoryMeter(self.device)
        self.prompt_tokens, self.total_tokens = row_lengths(resolved)
        self._model: TrainableModel | None = None
        self._engine: Any = None
        self._reward: ValueModel | None = None
        self._resident = 0

    # -- the Probes protocol ---------------------------------------------------------------

    def capacity_bytes(self) -> int:
        return self.meter.capacity_bytes()

    def rollout_floor(self, running: int) -> int:
        model = self._ready()
        kv = kv_cache_bytes(model.policy.config, running, self.total_tokens, self.dtype)
        return self._resident + kv

    def rollout(self, running: int) -> int | None:
        self._ready()
        cfg = self.cfg
        sampling = cfg.rollout.sampling(max_new_tokens=DECODE_STEPS + 1)
        engine = self._engine_for(running)
        release_memory()
        try:
            with self.meter.measure() as measured, RolloutSession(engine, drop_state=True):
                if hasattr(engine, "probe_memory"):
                    engine.probe_memory(
                        running,
                        prompt_tokens=self.prompt_tokens,
                        context_tokens=self.total_tokens,
                        sampling=sampling,
                        n=min(cfg.n_samples, running),
                        decode_steps=DECODE_STEPS,
                    )
                else:  # another engine: generate rows that end at the whole row length
                    prompt = [1] * max(1, self.total_tokens - sampling.max_new_tokens)
                    engine.generate([prompt] * running, sampling, n=1)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            logger.info("--tune-params: a rollout of %d sequences ran out of memory", running)
            release_memory()
            return None
        return measured.peak_bytes

    def train(self, mini_bs: int) -> int | None:
        model = self._ready()
        vocab = int(model.policy.config.get_text_config().vocab_size)
        groups = synthetic_groups(
            mini_bs,
            n_samples=self.cfg.n_samples,
            prompt_tokens=self.prompt_tokens,
            total_tokens=self.total_tokens,
            vocab=vocab,
        )
        kwargs = {**self.train_kwargs, "mini_bs": mini_bs, "gradient_accumulation_steps": None}
        release_memory()
        try:
            with self.meter.measure() as measured:
                self.backend.train(model, groups, **kwargs)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            logger.info(
                "--tune-params: a training microbatch of %d rows ran out of memory", mini_bs
            )
            return None
        finally:
            if model.optimizer is not None:
                model.optimizer.zero_grad(set_to_none=True)
            release_memory()
        return measured.peak_bytes

    # -- setup and teardown ----------------------------------------------------------------

    def _ready(self) -> TrainableModel:
        if self._model is not None:
            return self._model
        cfg, spec = self.cfg, self.resolved.algorithm
        how = {"dtype": self.dtype, "device": self.device, "attention": self.attention}
        logger.info(
            "--tune-params: building %s with random weights on %s (%s)",
            cfg.ckpt,
            self.device,
            self.dtype,
        )
        policy = dummy_causal_lm(cfg.ckpt, **how)
        policy.generation_config.eos_token_id = None  # probes never stop early
        reference = dummy_causal_lm(cfg.ref_ckpt, **how) if cfg.ref_ckpt else None
        critic = None
        if "critic" in spec.roles:
            critic = dummy_value_model(cfg.critic_ckpt or cfg.ckpt, **how)
        if cfg.reward_ckpt is not None:
            self._reward = dummy_value_model(cfg.reward_ckpt, **how)
            self._reward.requires_grad_(False)
        model = TrainableModel(
            policy, load_tokenizer(cfg.ckpt), reference=reference, critic=critic, seed=cfg.seed
        )
        lora = LoraSettings.from_config(cfg)
        if lora is not None:  # train what the run trains: adapters, the base as reference
            model.add_lora(lora)
        # Past the critic warm-up, so the policy's optimizer state exists like in a long run.
        model.step = cfg.critic_warmup_steps
        self.backend.setup(model, spec, **self.setup_kwargs)
        vocab = int(policy.config.get_text_config().vocab_size)
        rows = min(2, self.cfg.n_samples)
        warmup = synthetic_groups(
            rows,
            n_samples=self.cfg.n_samples,
            prompt_tokens=WARMUP_TOKENS // 2,
            total_tokens=WARMUP_TOKENS,
            vocab=vocab,
        )
        self.backend.train(model, warmup, **{**self.train_kwargs, "mini_bs": rows})
        if model.optimizer is not None:
            model.optimizer.zero_grad(set_to_none=True)
        self._model = model
        release_memory()
        self._resident = self.meter.current_bytes()
        return model

    def _engine_for(self, running: int) -> Any:
        """A fresh engine of the run's kind for ``running`` concurrent sequences."""
        engine_spec = self.resolved.engine
        if engine_spec is None:
            raise ValueError("--tune-params needs an online algorithm (it probes rollouts)")
        assert self._model is not None
        self._engine = None
        self._engine = engine_spec.create(
            self._model.policy,
            self._model.tokenizer,
            EngineOptions(
                max_running=running,
                max_prompt_tokens=self.total_tokens,
                attn_backend=self.cfg.attn_backend,
                eager_decode=self.cfg.eager_decode,
            ),
            self.resolved.engine_config,
        )
        return self._engine

    def close(self) -> None:
        """Free every probe object (the real run loads its own models next)."""
        if self._engine is not None and hasattr(self._engine, "drop_state"):
            self._engine.drop_state()
        self._engine = self._model = self._reward = None
        release_memory()


__all__ = [
    "RunProbes",
    "dummy_causal_lm",
    "dummy_value_model",
    "kv_cache_bytes",
    "release_memory",
    "row_lengths",
    "synthetic_groups",
]
