"""Run configuration: every option of ``areno train``, documented once.

Each option is an attrs field whose metadata carries its help text; the CLI's ``--help``, the
generated reference page (``docs/cli.md``) and YAML config loading all come from these classes.

Precedence, lowest first: field defaults < recipe < ``--config`` YAML < explicit flags.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml

from areno_core.errors import ConfigError


def opt(
    default: Any,
    help: str,
    *,
    validator: Any = None,
    choices: tuple[str, ...] | None = None,
    negatable: bool = False,
    metavar: str | None = None,
    default_text: str | None = None,
    cli_default: Any = attrs.NOTHING,
) -> Any:
    """Declare one run option. ``help`` is its only documentation."""
    validators = []
    if validator is not None:
        validators.append(validator)
    if choices is not None:
        validators.append(_one_of(choices))
    return attrs.field(
        default=default,
        validator=validators or None,
        metadata={
            "help": help,
            "choices": choices,
            "negatable": negatable,
            "metavar": metavar,
            "default_text": default_text,
        },
    )


# -- validators -------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"{_flag(attribute.name)} must be positive, got {value!r}")


def _non_negative(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not value >= 0:
        raise ConfigError(f"{_flag(attribute.name)} must be zero or more, got {value!r}")


def _fraction(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not 0.0 < value <= 1.0:
        raise ConfigError(f"{_flag(attribute.name)} must be in (0, 1], got {value!r}")


def _unit_interval(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(f"{_flag(attribute.name)} must be in [0, 1], got {value!r}")


def _top_k(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value != -1 and value < 1:
        raise ConfigError(f"--top-k must be -1 (disabled) or a positive integer, got {value!r}")


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None and value not in choices:
            raise ConfigError(
                f"{_flag(attribute.name)} must be one of {', '.join(choices)}; got {value!r}"
            )

    return check


def _finite(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{_flag(attribute.name)} must be a finite number, got {value!r}")


def _all(*validators: Any) -> Any:
    return attrs.validators.and_(*validators)


# -- sections ---------------------------------------------------------------------------


@attrs.define(kw_only=True)
class BasicConfig:
    """Inputs, dataset loader, the algorithm and run length, and device counts."""

    ckpt: str | None = opt(
        None,
        "Policy model and tokenizer: a local directory, a Hugging Face model id, or a "
        "randomly initialised model such as random:qwen3-tiny.",
    )
    dataset_path: str | None = opt(
        None,
        "Training data: a JSON/JSONL, Parquet, CSV/TSV or Arrow file, a directory of such "
        "files, a datasets.save_to_disk directory, or a Hugging Face dataset reference "
        "repo/name, repo/name:config or repo/name:config:split (e.g. gsm8k:main).",
    )
    dataset_loader_fn: str | None = opt(
        None,
        "Turns raw rows into the rows the algorithm expects: file.py, file.py:function, or "
        "the name of a registered loader. Without one, rows pass through unchanged.",
    )
    algo: str = opt("gspo", "Training algorithm, by registered name (see `areno plugins`).")
    recipe: str | None = opt(
        None,
        "Named recipe (pack/name) whose defaults fill every option not given explicitly.",
    )
    epochs: int = opt(10, "Passes over the dataset.", validator=_positive)
    max_steps: int | None = opt(
        None,
        "Stop after this many trainer steps, even in the middle of an epoch.",
        validator=_positive,
    )
    seed: int = opt(0, "Seed for data order, sampling and initialisation.", validator=_non_negative)
    world_size: int | None = opt(
        None,
        "Total number of devices. Must be a multiple of --tp-size.",
        validator=_positive,
        default_text="number of GPUs, or 1 on CPU",
    )
    tp_size: int | None = opt(
        None,
        "Tensor-parallel group size.",
        validator=_positive,
        default_text="1",
    )


@attrs.define(kw_only=True)
class RolloutConfig:
    """Generating and scoring completions: volume, lengths, sampling, agents and rewards."""

    batch_size: int = opt(
        32, "Prompts (or preference pairs) per trainer step.", validator=_positive
    )
    n_samples: int = opt(8, "Completions sampled per prompt (online RL).", validator=_positive)
    max_running_prompts: int | None = opt(
        None,
        "Most sequences decoded at once by the rollout engine.",
        validator=_positive,
        default_text="batch-size x n-samples",
    )
    max_prompt_tokens: int = opt(
        1024, "Longest tokenized prompt; longer prompts are skipped.", validator=_positive
    )
    max_new_tokens: int = opt(
        3071, "Longest generated or supervised response, in tokens.", validator=_positive
    )
    max_context_len: int | None = opt(
        None,
        "Longest agentic trajectory row (prompt plus every turn); longer ones are dropped.",
        validator=_positive,
        default_text="the model's context limit",
    )
    temperature: float = opt(1.0, "Sampling temperature.", validator=_all(_positive, _finite))
    top_k: int = opt(-1, "Keep only the k most likely tokens; -1 keeps all.", validator=_top_k)
    top_p: float = opt(1.0, "Nucleus sampling probability mass.", validator=_fraction)
    greedy: bool = opt(False, "Decode greedily instead of sampling.")
    eager_decode: bool = opt(False, "Run decode eagerly, without captured CUDA graphs.")
    drop_rollout_state: bool = opt(
        False, "Free the rollout engine's cache after every step (less memory, slower setup)."
    )
    attn_backend: str = opt(
        "flash",
        "Attention kernels. flash needs flash-attn and a supported GPU; otherwise areno "
        "falls back to native with a warning.",
        choices=("flash", "native"),
    )
    disable_thinking: bool = opt(
        False,
        "Pass enable_thinking=False to chat templates that accept it.",
    )
    agent_fn: str | None = opt(
        None,
        "Agentic rollout: file.py defining `async def run_agent(ctx, batch)`, or a registered "
        "agent name. The agent talks to a local OpenAI-compatible endpoint.",
    )
    agent_timeout_s: float = opt(
        300.0, "Timeout for each agent request and for the agent function.", validator=_positive
    )
    train_tool_results: bool = opt(
        False, "Also train on tool-result spans of agentic trajectories (masked by default)."
    )
    reward_fn_path: str | None = opt(
        None,
        "file.py defining reward_fn(record) (file.py:function picks another name), or a "
        "registered reward name.",
    )
    reward_ckpt: str | None = opt(None, "Reward model for PPO: local path or Hugging Face id.")
    rollout_engine: str = opt("native", "Rollout engine, by registered name (see `areno plugins`).")
    drop_uniform_groups: bool = opt(
        False,
        "Drop prompt groups whose samples all got the same reward (they carry no signal for "
        "group-relative advantages); counted in rollout/uniform_groups either way.",
    )
    tune_params: bool = opt(
        False,
        "Probe memory first and pick --max-running-prompts, --batch-size and --mini-bs.",
    )
    mem_frac: float = opt(0.9, "GPU memory fraction the tuner may plan for.", validator=_fraction)
    tune_max_samples: int = opt(256, "Most rollout rows the tuner considers.", validator=_positive)


@attrs.define(kw_only=True)
class TrainConfig:
    """Consuming rollouts: batching, optimizer, reference/critic roles, algorithm knobs."""

    mini_bs: int = opt(16, "Rows per training microbatch.", validator=_positive)
    gradient_accumulation_steps: int | None = opt(
        None,
        "Microbatches per optimizer step. By default one step consumes the whole batch.",
        validator=_positive,
        default_text="all microbatches of a step",
    )
    activation_checkpointing: bool = opt(
        True, "Recompute decoder-layer activations in the backward pass.", negatable=True
    )
    lr: float = opt(1.0e-6, "Policy learning rate.", validator=_all(_positive, _finite))
    min_lr: float = opt(1.0e-7, "Learning rate at the end of decay.", validator=_non_negative)
    lr_decay_steps: int = opt(
        1000, "Optimizer steps over which the LR decays.", validator=_positive
    )
    lr_decay_style: str = opt("cosine", "Decay shape.", choices=("cosine", "linear", "constant"))
    adam_beta1: float = opt(0.9, "AdamW beta1.", validator=_unit_interval)
    adam_beta2: float = opt(0.999, "AdamW beta2.", validator=_unit_interval)
    adam_8bit: bool = opt(False, "Keep Adam moments in 8 bits (needs bitsandbytes and a GPU).")
    weight_decay: float = opt(1.0e-2, "AdamW weight decay.", validator=_non_negative)
    grad_clip_norm: float = opt(1.0, "Clip the global gradient norm to this.", validator=_positive)
    ref_ckpt: str | None = opt(
        None, "Reference model for DPO/PPO (default: a frozen copy of the initial policy)."
    )
    critic_ckpt: str | None = opt(
        None, "Critic for PPO (default: the policy's backbone with a fresh value head)."
    )
    critic_lr: float = opt(1.0e-5, "PPO critic learning rate.", validator=_positive)
    critic_warmup_steps: int = opt(
        20, "PPO steps that train only the critic before the actor.", validator=_non_negative
    )
    loss_agg: str | None = opt(
        None,
        "How online-RL token losses are averaged.",
        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"),
        default_text="per algorithm",
    )
    gspo_clip_eps: float = opt(
        3.0e-4, "GSPO lower clip on the sequence ratio.", validator=_positive
    )
    gspo_clip_eps_high: float = opt(
        4.0e-4, "GSPO upper clip on the sequence ratio.", validator=_positive
    )
    grpo_clip_eps: float = opt(0.2, "GRPO clip on the token ratio.", validator=_positive)
    grpo_clip_eps_high: float | None = opt(
        None,
        "GRPO upper clip (clip-higher); defaults to --grpo-clip-eps.",
        validator=_positive,
    )
    scale_rewards: bool = opt(
        True,
        "GRPO: divide group-centred rewards by the group's standard deviation.",
        negatable=True,
    )
    dpo_beta: float = opt(0.1, "DPO temperature on the preference margin.", validator=_positive)
    use_kl_loss: bool = opt(True, "Add a KL loss against the reference (PPO).", negatable=True)
    kl_loss_coef: float = opt(0.001, "PPO KL loss weight.", validator=_non_negative)
    kl_loss_type: str = opt(
        "low_var_kl", "KL estimator for PPO.", choices=("k1", "k2", "k3", "low_var_kl")
    )
    clip_eps: float = opt(0.2, "PPO (and RLOO) clip on the token ratio.", validator=_positive)
    clip_ratio_c: float = opt(
        3.0, "PPO dual-clip bound for negative advantages (> 1).", validator=_positive
    )
    value_clip_eps: float = opt(0.5, "PPO value clipping range.", validator=_positive)
    value_loss_coef: float = opt(0.5, "PPO value loss weight.", validator=_non_negative)
    gamma: float = opt(1.0, "PPO discount for GAE.", validator=_unit_interval)
    lam: float = opt(0.95, "PPO GAE lambda.", validator=_unit_interval)


@attrs.define(kw_only=True)
class CheckpointConfig:
    """Produced artifacts."""

    save_path: str | None = opt(None, "Directory for checkpoints and run outputs.")
    save_interval: int = opt(100, "Save a checkpoint every N steps.", validator=_positive)
    resume: str | None = opt(
        None,
        "Continue from a checkpoint directory, or `auto` for the latest under --save-path.",
    )


@attrs.define(kw_only=True)
class ObservabilityConfig:
    """Logs and metrics."""

    metrics_log_dir: str | None = opt(
        None,
        "TensorBoard log directory for rollout/*, train/* and time/* metrics.",
        default_text="<save-path or run dir>/tensorboard",
    )


@attrs.define(kw_only=True)
class EvalConfig:
    """Held-out evaluation during training."""

    eval_dataset_path: str | None = opt(
        None,
        "Held-out dataset, read like --dataset-path and passed through --dataset-loader-fn. "
        "Online RL: greedy completions scored by the run's reward (eval/accuracy, "
        "eval/reward_mean, ...); sft and dpo: the loss and statistics without an update "
        "(eval/loss, eval/nll, eval/rewards/accuracy, ...).",
    )
    eval_interval: int | None = opt(
        None,
        "Evaluate every N steps, besides before the first step and after the last.",
        validator=_positive,
        default_text="--save-interval",
    )
    eval_limit: int | None = opt(
        None,
        "Evaluate only the first N rows of --eval-dataset-path.",
        validator=_positive,
        default_text="every row",
    )


SECTIONS: dict[str, type] = {
    "basic": BasicConfig,
    "rollout": RolloutConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
    "observability": ObservabilityConfig,
}
SECTION_TITLES = {
    "basic": "Basic",
    "rollout": "Rollout",
    "train": "Train",
    "checkpoint": "Checkpoint",
    "eval": "Evaluation",
    "observability": "Observability",
}


@attrs.define(kw_only=True)
class RunConfig:
    """All options of a run, by section."""

    basic: BasicConfig = attrs.Factory(BasicConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    train: TrainConfig = attrs.Factory(TrainConfig)
    checkpoint: CheckpointConfig = attrs.Factory(CheckpointConfig)
    eval: EvalConfig = attrs.Factory(EvalConfig)
    observability: ObservabilityConfig = attrs.Factory(ObservabilityConfig)

    def __getattr__(self, name: str) -> Any:
        # Flat access: cfg.lr is cfg.train.lr. Only called for names not found normally.
        section = OPTION_SECTIONS.get(name)
        if section is None:
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, section), name)

    def flat(self) -> dict[str, Any]:
        """Every option by name."""
        return {name: getattr(self, name) for name in OPTION_SECTIONS}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {s: attrs.asdict(getattr(self, s)) for s in SECTIONS}

    def replace(self, **options: Any) -> RunConfig:
        """A copy with some options changed (validated)."""
        return build_config(options, base=self)


def iter_options() -> Iterator[tuple[str, attrs.Attribute]]:
    """(section, field) for every option, in documentation order."""
    for section, cls in SECTIONS.items():
        for field in attrs.fields(cls):
            yield section, field


OPTION_SECTIONS: dict[str, str] = {f.name: s for s, f in iter_options()}


def normalize_key(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def build_config(options: Mapping[str, Any], *, base: RunConfig | None = None) -> RunConfig:
    """Apply flat ``options`` (by option name) on top of ``base`` and validate."""
    base = base or RunConfig()
    per_section: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, value in options.items():
        name = normalize_key(key)
        section = OPTION_SECTIONS.get(name)
        if section is None:
            raise ConfigError(_unknown_option(key))
        per_section[section][name] = value
    try:
        sections = {
            s: attrs.evolve(getattr(base, s), **_coerce(SECTIONS[s], vals))
            for s, vals in per_section.items()
        }
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from exc
    return RunConfig(**sections)


_converter = cattrs.Converter(forbid_extra_keys=True)


def _coerce(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Convert YAML/CLI values to each field's declared type, with errors naming the option."""
    fields = attrs.fields_dict(cls)
    out = {}
    for name, value in values.items():
        ftype = fields[name].type
        if value is None:
            if not _allows_none(ftype):
                raise ConfigError(f"{_flag(name)} cannot be empty (null)")
            out[name] = None
            continue
        target = _base_type(ftype)
        try:
            if target is bool and not isinstance(value, bool):
                raise TypeError
            if target is int and isinstance(value, float) and not value.is_integer():
                raise TypeError
            if target in (int, float) and isinstance(value, bool):
                raise TypeError
            out[name] = _converter.structure(value, target)
        except Exception as exc:
            raise ConfigError(f"{_flag(name)} expects {target.__name__}, got {value!r}") from exc
    return out


def _allows_none(ftype: Any) -> bool:
    return "None" in str(ftype)


def _base_type(ftype: Any) -> type:
    text = str(ftype)
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if text.startswith(name):
            return typ
    raise TypeError(f"unsupported option type {ftype!r}")


def _unknown_option(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(normalize_key(key), list(OPTION_SECTIONS), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(_flag(c)[2:] for c in close)}?" if close else ""
    return f"unknown option {key!r}.{hint}"


def load_yaml_options(path: str | Path) -> dict[str, Any]:
    """Read a ``--config`` YAML file into flat options; sections may nest or not."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {str(path)!r}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config {str(path)!r} must hold a mapping of options, got {type(data).__name__}"
        )
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = normalize_key(str(key))
        if name in SECTIONS and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                sub_name = normalize_key(str(sub_key))
                if OPTION_SECTIONS.get(sub_name) != name:
                    raise ConfigError(
                        f"--config {str(path)!r}: unknown key {sub_key!r} in section {key!r}. "
                        f"{_unknown_option(str(sub_key))}"
                    )
                flat[sub_name] = sub_value
        elif name in OPTION_SECTIONS:
            flat[name] = value
        else:
            raise ConfigError(f"--config {str(path)!r}: {_unknown_option(str(key))}")
    return flat


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
                + ", ".join(_flag(o) for o in clash)
                + ": greedy decoding does not sample; drop one of them"
            )
    if cfg.train_tool_results and cfg.agent_fn is None:
        raise ConfigError("--train-tool-results needs --agent-fn (it applies to agentic rollouts)")
    if cfg.eval_dataset_path is None:
        clash = [o for o in ("eval_interval", "eval_limit") if o in explicit]
        if clash:
            raise ConfigError(
                ", ".join(_flag(o) for o in clash) + " needs --eval-dataset-path (the rows to "
                "evaluate on)"
            )
    if "max_context_len" in explicit and cfg.agent_fn is None:
        raise ConfigError("--max-context-len applies to agentic rollouts; it needs --agent-fn")
    if cfg.tune_max_samples < cfg.n_samples and cfg.tune_params:
        raise ConfigError(
            f"--tune-max-samples {cfg.tune_max_samples} is below --n-samples {cfg.n_samples}"
        )


def dump_yaml(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config (loadable again with --config)."""
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
