"""Run configuration: every option of ``areno train``, documented once.

Each option is an attrs field whose metadata carries its help text; the CLI's ``--help``, the
generated reference page (``docs/cli.md``) and YAML config loading all come from these classes.

Precedence, lowest first: field defaults < recipe < ``--config`` YAML < explicit flags.

Why one long module: most of its lines are the option declarations themselves (name, default,
help, validator), kept together so the reference page and ``--help`` read from one table.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from areno_core.errors import ConfigError
from areno_core.options import OptionTable, Section, coerce_value, normalize_key, option
from areno_core.types import SamplingParams
from areno_core.validators import (
    flag,
    fraction,
    non_negative,
    positive,
    unit_interval,
)


def _top_k(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (value != -1 and value < 1):
        raise ConfigError(f"--top-k must be -1 (disabled) or a positive integer, got {value!r}")


# ``--dtype`` values (areno_core.accel.precision maps them to torch dtypes).
DTYPE_CHOICES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")


# -- sections ---------------------------------------------------------------------------


@attrs.define(kw_only=True)
class BasicConfig:
    """Inputs, dataset loader, the algorithm and run length, and device counts."""

    ckpt: str | None = option(
        None,
        "Policy model and tokenizer: a local directory, a Hugging Face model id, or a "
        "randomly initialised model such as random:qwen3-tiny.",
    )
    dataset_path: str | None = option(
        None,
        "Training data: a JSON/JSONL, Parquet, CSV/TSV or Arrow file, a directory of such "
        "files, a datasets.save_to_disk directory, or a Hugging Face dataset reference "
        "repo/name, repo/name:config or repo/name:config:split (e.g. gsm8k:main).",
    )
    dataset_loader_fn: str | None = option(
        None,
        "Turns raw rows into the rows the algorithm expects: file.py, file.py:function, or "
        "the name of a registered loader. Without one, rows pass through unchanged.",
    )
    env_args: str | None = option(
        None,
        "Options for the environment behind --dataset-loader-fn, as a JSON object such as "
        "'{\"min_terms\": 2}': given to a loader that takes an env_args keyword (the "
        "areno-envs loaders rg/<task> and vf, which check each option by name); any other "
        "loader refuses them.",
        metavar="JSON",
    )
    algo: str = option("gspo", "Training algorithm, by registered name (see `areno plugins`).")
    recipe: str | None = option(
        None,
        "Named recipe (pack/name) whose defaults fill every option not given explicitly.",
    )
    epochs: int = option(10, "Passes over the dataset.", validator=positive)
    max_steps: int | None = option(
        None,
        "Stop after this many trainer steps, even in the middle of an epoch.",
        validator=positive,
    )
    seed: int = option(
        0, "Seed for data order, sampling and initialisation.", validator=non_negative
    )
    world_size: int | None = option(
        None,
        "Processes (one per device) to train on. Above 1, `areno train` starts them on this "
        "machine (the distributed backend); under torchrun the default is its WORLD_SIZE. "
        "Must be a multiple of --tp-size.",
        validator=positive,
        default_text="1",
    )
    tp_size: int | None = option(
        None,
        "Tensor-parallel size: processes that split each decoder layer (Qwen3, Qwen2, Llama); "
        "--world-size / --tp-size groups of them split the batch.",
        validator=positive,
        default_text="1",
    )
    backend: str | None = option(
        None,
        "Training backend, by registered name (see `areno plugins`).",
        default_text="the first installed backend that runs --world-size x --tp-size "
        "(local: one process)",
    )


@attrs.define(kw_only=True)
class RolloutConfig:
    """Generating and scoring completions: volume, lengths, sampling, agents and rewards."""

    batch_size: int = option(
        32, "Prompts (or preference pairs) per trainer step.", validator=positive
    )
    n_samples: int = option(8, "Completions sampled per prompt (online RL).", validator=positive)
    max_running_prompts: int | None = option(
        None,
        "Most sequences decoded at once by the rollout engine.",
        validator=positive,
        default_text="batch-size x n-samples",
    )
    max_prompt_tokens: int = option(
        1024, "Longest tokenized prompt; longer prompts are skipped.", validator=positive
    )
    max_new_tokens: int = option(
        3071, "Longest generated or supervised response, in tokens.", validator=positive
    )
    max_context_len: int | None = option(
        None,
        "Longest agentic trajectory row (prompt plus every turn); longer ones are dropped.",
        validator=positive,
        default_text="the model's context limit",
    )
    temperature: float = option(1.0, "Sampling temperature.", validator=positive)
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 keeps all.", validator=_top_k)
    top_p: float = option(1.0, "Nucleus sampling probability mass.", validator=fraction)
    greedy: bool = option(False, "Decode greedily instead of sampling.")
    eager_decode: bool = option(False, "Run decode eagerly, without captured CUDA graphs.")
    drop_rollout_state: bool = option(
        False, "Free the rollout engine's cache after every step (less memory, slower setup)."
    )
    offload_optimizer: bool = option(
        False,
        "Move the optimizer state (and float32 master weights) to CPU memory during each "
        "rollout phase and back before the update: more device memory for the KV cache, two "
        "copies per step. No effect when training on a CPU.",
    )
    attn_backend: str = option(
        "flash",
        "Attention kernels. flash needs flash-attn and a supported GPU; otherwise areno "
        "falls back to native with a warning.",
        choices=("flash", "native"),
    )
    disable_thinking: bool = option(
        False,
        "Pass enable_thinking=False to chat templates that accept it.",
    )
    agent_fn: str | None = option(
        None,
        "Agentic rollout: file.py defining `async def run_agent(ctx, batch)`, or a registered "
        "agent name. The agent talks to a local OpenAI-compatible endpoint.",
    )
    agent_timeout_s: float = option(
        300.0, "Timeout for each agent request and for the agent function.", validator=positive
    )
    train_tool_results: bool = option(
        False, "Also train on tool-result spans of agentic trajectories (masked by default)."
    )
    reward_fn_path: str | None = option(
        None,
        "file.py defining reward_fn(record) (file.py:function picks another name), or a "
        "registered reward name.",
    )
    reward_ckpt: str | None = option(
        None,
        "Reward model (local path or Hugging Face id) scoring samples by its last-token value, "
        "for algorithms with a reward-model role such as PPO.",
    )
    rollout_engine: str = option(
        "native", "Rollout engine, by registered name (see `areno plugins`)."
    )
    drop_uniform_groups: bool = option(
        False,
        "Drop prompt groups whose samples all got the same reward (they carry no signal for "
        "group-relative advantages); counted in rollout/uniform_groups either way.",
    )
    async_rollout: bool = option(
        False,
        "Roll out in a worker process that keeps sampling while the trainer trains (online "
        "RL); see docs/async.md.",
    )
    max_staleness: int = option(
        1,
        "With --async-rollout: train on no sample drawn by a policy more than this many "
        "versions (train steps that changed it) behind the trainer's; 0 is synchronous "
        "training in two processes.",
        validator=non_negative,
    )
    rollout_threads: int | None = option(
        None,
        "With --async-rollout: CPU threads of the rollout worker; the trainer keeps the rest "
        "of this process's torch threads when it trains on the CPU.",
        validator=positive,
        default_text="half of torch's threads",
    )
    max_inflight_batches: int = option(
        1,
        "With --async-rollout and --agent-fn: agentic batches the rollout worker runs at once, "
        "all with one policy version, so a slow episode of one batch does not hold the next; "
        "newer weights wait until those in flight finish. Above 1, the agent and the reward "
        "function may run for two steps at once (from two threads); pays in steady state with "
        "--max-staleness 2 or more.",
        validator=positive,
    )
    step_fill: str = option(
        "batch",
        "With --async-rollout and --agent-fn: what a train step trains on. batch: the groups of "
        "its own rows, once all of them are done; completion: the first --batch-size groups to "
        "finish, from any batch sent to the worker, so a slow episode is trained by a later "
        "step instead of holding this one (needs --max-staleness 1 or more; which rows a step "
        "trains then depends on timing). See docs/async.md.",
        choices=("batch", "completion"),
    )
    tune_params: bool = option(
        False,
        "Probe memory with a randomly initialised model of the same architecture first, then "
        "pick --max-running-prompts, --batch-size and --mini-bs (values you give are kept) and "
        "turn on --drop-rollout-state. Online RL only.",
    )
    mem_frac: float = option(
        0.9,
        "With --tune-params: fraction of the device's memory the tuner may plan for: GPU "
        "memory, or system RAM when training on a CPU.",
        validator=fraction,
    )
    tune_max_samples: int = option(
        256,
        "With --tune-params: most rollout rows the tuner considers: the largest "
        "--max-running-prompts it tries; the batch size it derives is at most this / "
        "--n-samples.",
        validator=positive,
    )

    def sampling(self, max_new_tokens: int | None = None) -> SamplingParams:
        """How this run's rollouts sample (the seed is drawn per step), up to
        ``max_new_tokens`` new tokens (default: ``--max-new-tokens``)."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            greedy=self.greedy,
        )


@attrs.define(kw_only=True)
class TrainConfig:
    """Consuming rollouts: batching, optimizer, the reference and critic roles. Each
    algorithm's own options follow in a section of their own."""

    mini_bs: int = option(16, "Rows per training microbatch.", validator=positive)
    gradient_accumulation_steps: int | None = option(
        None,
        "Microbatches per optimizer step. By default one step consumes the whole batch.",
        validator=positive,
        default_text="all microbatches of a step",
    )
    activation_checkpointing: bool | None = option(
        None,
        "Recompute decoder-layer activations in the backward pass (less memory, more "
        "compute). Unset: auto, on when one microbatch's estimated activations (--mini-bs "
        "rows of --max-prompt-tokens + --max-new-tokens tokens) would take more than half of "
        "the memory free on the training device, off otherwise; the run logs the decision.",
        negatable=True,
        default_text="auto",
    )
    dtype: str = option(
        "auto",
        "Floating-point type of the policy, reference and critic. auto: bfloat16 on a CUDA "
        "GPU with native bfloat16 (compute capability 8.0 or newer), float32 elsewhere (the "
        "CPU included; bfloat16 is faster there only on CPUs with AVX512-BF16 or AMX). Models "
        "in a 16-bit type train through float32 master weights.",
        choices=DTYPE_CHOICES,
    )
    lr: float = option(1.0e-6, "Policy learning rate.", validator=positive)
    min_lr: float = option(1.0e-7, "Learning rate at the end of decay.", validator=non_negative)
    lr_decay_steps: int = option(
        1000, "Optimizer steps over which the LR decays.", validator=positive
    )
    lr_decay_style: str = option("cosine", "Decay shape.", choices=("cosine", "linear", "constant"))
    adam_beta1: float = option(0.9, "AdamW beta1.", validator=unit_interval)
    adam_beta2: float = option(0.999, "AdamW beta2.", validator=unit_interval)
    adam_8bit: bool = option(False, "Keep Adam moments in 8 bits (needs bitsandbytes and a GPU).")
    weight_decay: float = option(1.0e-2, "AdamW weight decay.", validator=non_negative)
    grad_clip_norm: float = option(
        1.0, "Clip the global gradient norm to this.", validator=positive
    )
    ref_ckpt: str | None = option(
        None,
        "Reference model, for algorithms with a reference role such as DPO and PPO (default: a "
        "frozen copy of the initial policy; with --lora-rank, the base model with the adapters "
        "switched off, no copy).",
    )
    critic_ckpt: str | None = option(
        None,
        "Critic, for algorithms with a critic role such as PPO (default: the policy's backbone "
        "with a fresh value head).",
    )
    critic_lr: float = option(1.0e-5, "Critic learning rate.", validator=positive)
    critic_warmup_steps: int = option(
        20, "Steps that train only the critic before the policy.", validator=non_negative
    )
    proximal_logprobs: str = option(
        "recompute",
        "With --async-rollout, for samples of an older policy: how the decoupled objective "
        "gets the log-probabilities of the policy at the start of the train step. recompute: "
        "one more forward pass per step, exact; interpolate: between the sampler's and the "
        "current policy's by version, no extra pass, exact in a step's first optimizer step.",
        choices=("recompute", "interpolate"),
    )


def _dropout(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(f"--lora-dropout must be in [0, 1), got {value!r}")


def _check_name_list(flag: str, value: Any, expected: str) -> None:
    """A comma-separated list of plain names (``expected`` says which names, with examples)."""
    names = [n.strip() for n in str(value).split(",")]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", n)]
    if bad:
        raise ConfigError(
            f"{flag} {value!r}: expected comma-separated {expected}; {bad[0]!r} is not one"
        )


def _target_modules(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _check_name_list(
            "--lora-target-modules", value, "module names such as 'q_proj,v_proj' (or 'all-linear')"
        )


@attrs.define(kw_only=True)
class LoraConfig:
    """Low-rank adapters (LoRA, through PEFT): train small adapter matrices instead of every
    weight, for any algorithm. Off unless --lora-rank is given. See docs/lora.md."""

    lora_rank: int | None = option(
        None,
        "Train LoRA adapters of this rank on the policy instead of all its weights; the "
        "reference model is then the base with the adapters switched off (no second copy). "
        "Needs peft: pip install 'areno-core[lora]'.",
        validator=positive,
        default_text="off: every weight trains",
    )
    lora_alpha: float | None = option(
        None,
        "LoRA scaling numerator: adapter outputs are scaled by alpha / rank.",
        validator=positive,
        default_text="2 x --lora-rank",
    )
    lora_dropout: float = option(
        0.0, "Dropout on the adapters' input while training.", validator=_dropout
    )
    lora_target_modules: str | None = option(
        None,
        "Comma-separated names of the linear layers to adapt (e.g. q_proj,v_proj), or "
        "all-linear (every linear layer but the output layer).",
        validator=_target_modules,
        default_text="every attention and MLP projection (Qwen2/3, Llama, Mistral, Gemma, "
        "OLMo 2, Phi-3); the attention projections of Qwen3-MoE and GPT-OSS; all-linear for "
        "other families",
    )
    save_merged: bool = option(
        False,
        "With LoRA, every checkpoint also holds merged/: the adapted policy with the adapters "
        "merged into the base weights, a plain Hugging Face model.",
    )


def _report_to(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    _check_name_list("--report-to", value, "sink names such as 'tensorboard,wandb' (or 'none')")


@attrs.define(kw_only=True)
class CheckpointConfig:
    """Produced artifacts."""

    save_path: str | None = option(None, "Directory for checkpoints and run outputs.")
    save_interval: int = option(100, "Save a checkpoint every N steps.", validator=positive)
    resume: str | None = option(
        None,
        "Continue from a checkpoint directory, or `auto` for the latest under --save-path.",
    )


@attrs.define(kw_only=True)
class ObservabilityConfig:
    """Logs and metrics."""

    metrics_log_dir: str | None = option(
        None,
        "TensorBoard log directory for rollout/*, train/* and time/* metrics.",
        default_text="<save-path or run dir>/tensorboard",
    )
    report_to: str = option(
        "tensorboard",
        "Where metrics go besides metrics.jsonl (always written): comma-separated metric "
        "sinks, e.g. tensorboard,wandb; none for metrics.jsonl only. W&B, MLflow and trackio "
        "come with the areno-trackers package.",
        validator=_report_to,
    )


@attrs.define(kw_only=True)
class EvalConfig:
    """Held-out evaluation during training."""

    eval_dataset_path: str | None = option(
        None,
        "Held-out dataset, read like --dataset-path and passed through --dataset-loader-fn. "
        "Online RL: greedy completions scored by the run's reward (eval/accuracy, "
        "eval/reward_mean, ...); sft and dpo: the loss and statistics without an update "
        "(eval/loss, eval/nll, eval/rewards/accuracy, ...).",
    )
    eval_interval: int | None = option(
        None,
        "Evaluate every N steps, besides before the first step and after the last.",
        validator=positive,
        default_text="--save-interval",
    )
    eval_limit: int | None = option(
        None,
        "Evaluate only the first N rows of --eval-dataset-path.",
        validator=positive,
        default_text="every row",
    )


SECTIONS: dict[str, type] = {
    "basic": BasicConfig,
    "rollout": RolloutConfig,
    "train": TrainConfig,
    "lora": LoraConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
    "observability": ObservabilityConfig,
}
SECTION_TITLES = {
    "basic": "Basic",
    "rollout": "Rollout",
    "train": "Train",
    "lora": "LoRA",
    "checkpoint": "Checkpoint",
    "eval": "Evaluation",
    "observability": "Observability",
}


@functools.cache
def core_sections() -> tuple[Section, ...]:
    """The core's option sections, in ``--help`` order (a plugin's sections follow the core
    section they belong to; see :meth:`areno_core.registry.Registry.options`)."""
    return tuple(
        Section(
            key,
            SECTION_TITLES[key],
            " ".join((cls.__doc__ or "").split()),
            tuple(attrs.fields(cls)),
        )
        for key, cls in SECTIONS.items()
    )


def core_option_table() -> OptionTable:
    """The core's own options only (no plugin's)."""
    return OptionTable(core_sections())


# Core options that only matter to algorithms with a given role (``AlgorithmSpec.roles`` or
# ``optional_roles``); set for an algorithm without that role they are refused or named in a
# warning. The core names roles, never algorithms.
ROLE_OPTIONS: dict[str, str] = {
    "ref_ckpt": "reference",
    "critic_ckpt": "critic",
    "critic_lr": "critic",
    "critic_warmup_steps": "critic",
    "reward_ckpt": "reward_model",
}


@attrs.define(kw_only=True)
class RunConfig:
    """All options of a run: the core's, by section, and ``plugin``, the values given for
    options that plugins declare (an algorithm's, a rollout engine's, a backend's)."""

    basic: BasicConfig = attrs.Factory(BasicConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    train: TrainConfig = attrs.Factory(TrainConfig)
    lora: LoraConfig = attrs.Factory(LoraConfig)
    checkpoint: CheckpointConfig = attrs.Factory(CheckpointConfig)
    eval: EvalConfig = attrs.Factory(EvalConfig)
    observability: ObservabilityConfig = attrs.Factory(ObservabilityConfig)
    plugin: dict[str, Any] = attrs.Factory(dict)

    def __getattr__(self, name: str) -> Any:
        # Flat access: cfg.lr is cfg.train.lr. Only called for names not found normally.
        section = OPTION_SECTIONS.get(name)
        if section is None:
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, section), name)

    def flat(self) -> dict[str, Any]:
        """Every core option by name."""
        return {name: getattr(self, name) for name in OPTION_SECTIONS}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The core options by section (plugin options: see :func:`areno_core.resolve`)."""
        return {s: attrs.asdict(getattr(self, s)) for s in SECTIONS}

    def replace(self, **options: Any) -> RunConfig:
        """A copy with some core options changed (validated)."""
        return build_config(options, base=self)


def iter_options() -> Iterator[tuple[str, attrs.Attribute]]:
    """(section, field) for every core option, in documentation order."""
    for section, cls in SECTIONS.items():
        for field in attrs.fields(cls):
            yield section, field


OPTION_SECTIONS: dict[str, str] = {f.name: s for s, f in iter_options()}


def default_of(name: str) -> Any:
    """The built-in default of a core option (the Python API uses the same defaults)."""
    return attrs.fields_dict(SECTIONS[OPTION_SECTIONS[name]])[name].default


def build_config(
    options: Mapping[str, Any],
    *,
    base: RunConfig | None = None,
    table: OptionTable | None = None,
) -> RunConfig:
    """Apply flat ``options`` (by option name) on top of ``base`` and validate.

    ``table`` says which plugin options exist (default: none, the core's options only). Plugin
    option values are converted to their declared type here and validated by their owner's
    config class when the run is resolved.
    """
    table = table or core_option_table()
    base = base or RunConfig()
    per_section: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    plugin = dict(base.plugin)
    for key, value in options.items():
        name = table.check_name(key)
        if name in OPTION_SECTIONS:
            per_section[OPTION_SECTIONS[name]][name] = value
        else:
            plugin[name] = table.coerce(name, value)
    try:
        sections = {
            s: attrs.evolve(getattr(base, s), **_coerce(SECTIONS[s], vals))
            for s, vals in per_section.items()
        }
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from exc
    return RunConfig(**sections, plugin=plugin)


def _coerce(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    fields = attrs.fields_dict(cls)
    return {name: coerce_value(fields[name], value) for name, value in values.items()}


# Sections of a config.yaml that hold plugin options (see ``resolve.resolved_dict``).
PLUGIN_SECTIONS = ("algorithm", "rollout_engine", "backend")


def load_yaml_options(path: str | Path, table: OptionTable | None = None) -> dict[str, Any]:
    """Read a ``--config`` YAML file into flat options; sections may nest or not.

    Core options may sit under their section (``train: {lr: ...}``); plugin options under
    ``algorithm``, ``rollout_engine`` or ``backend`` (as a run's config.yaml writes them).
    """
    table = table or core_option_table()
    path = Path(path)
    where = f"--config {str(path)!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of options, got {type(data).__name__}")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = normalize_key(str(key))
        if (name in SECTIONS or name in PLUGIN_SECTIONS) and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                sub_name = table.check_name(str(sub_key), where=f"{where}, section {key!r}")
                home = OPTION_SECTIONS.get(sub_name)
                if (name in SECTIONS and home != name) or (name in PLUGIN_SECTIONS and home):
                    raise ConfigError(
                        f"{where}: {sub_key!r} does not belong in section {key!r}"
                        + (f"; it is in section {home!r}" if home else "")
                    )
                flat[sub_name] = sub_value
        else:
            flat[table.check_name(str(key), where=where)] = value
    return flat


def flatten_saved_config(
    data: Mapping[str, Any], table: OptionTable
) -> tuple[dict[str, Any], list[str]]:
    """The options of a saved run's config.yaml, flat, and the names no installed code
    declares (an older version's, or an uninstalled plugin's). Lenient about sections, since
    an option may have moved between versions."""
    flat: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        nested = isinstance(value, Mapping) and (key in SECTIONS or key in PLUGIN_SECTIONS)
        for name, item in value.items() if nested else [(key, value)]:
            name = normalize_key(str(name))
            if name in table:
                flat[name] = item
            else:
                unknown.append(name)
    return flat, unknown


def check_consistency(cfg: RunConfig, explicit: set[str] | None = None) -> None:
    """Cross-option checks that no single field can make; ``explicit`` = options the user set."""
    explicit = explicit or set()
    ws, tp = cfg.world_size, cfg.tp_size
    if ws is not None and tp is not None and ws % tp != 0:
        raise ConfigError(
            f"--world-size {ws} is not divisible by --tp-size {tp}; world size must be a "
            "multiple of the tensor-parallel size"
        )
    if cfg.min_lr > cfg.lr:
        raise ConfigError(f"--min-lr {cfg.min_lr:g} is larger than --lr {cfg.lr:g}")
    if cfg.greedy:
        clash = [o for o in ("temperature", "top_k", "top_p") if o in explicit]
        if clash:
            raise ConfigError(
                "--greedy contradicts "
                + ", ".join(flag(o) for o in clash)
                + ": greedy decoding does not sample; drop one of them"
            )
    if cfg.train_tool_results and cfg.agent_fn is None:
        raise ConfigError("--train-tool-results needs --agent-fn (it applies to agentic rollouts)")
    if cfg.eval_dataset_path is None:
        clash = [o for o in ("eval_interval", "eval_limit") if o in explicit]
        if clash:
            raise ConfigError(
                ", ".join(flag(o) for o in clash) + " needs --eval-dataset-path (the rows to "
                "evaluate on)"
            )
    if "max_context_len" in explicit and cfg.agent_fn is None:
        raise ConfigError("--max-context-len applies to agentic rollouts; it needs --agent-fn")
    if cfg.lora_rank is None:
        clash = [
            o
            for o in ("lora_alpha", "lora_dropout", "lora_target_modules", "save_merged")
            if getattr(cfg, o) != default_of(o)
        ]
        if clash:
            raise ConfigError(
                ", ".join(flag(o) for o in clash) + " only applies with --lora-rank (LoRA "
                "adapters are off without it)"
            )
    if cfg.tune_max_samples < cfg.n_samples and cfg.tune_params:
        raise ConfigError(
            f"--tune-max-samples {cfg.tune_max_samples} is below --n-samples {cfg.n_samples}"
        )


def dump_yaml(data: Mapping[str, Any], path: str | Path) -> None:
    """Write a resolved config (loadable again with --config)."""
    Path(path).write_text(yaml.safe_dump(dict(data), sort_keys=False))
