"""Checkpoints: one directory per saved step, written atomically, loadable by Hugging Face.

Layout under the save path (see ``docs/checkpoints.md``)::

    <save_root>/
      latest                    # text file naming the newest checkpoint, e.g. "step_200"
      step_200/
        config.json, model.safetensors, tokenizer.json, ...   # model + tokenizer (HF format)
        trainer_state.pt        # optimizer, scheduler, RNG states, step, data position
        config.yaml             # the resolved run config
        areno_checkpoint.json   # manifest: format version, step, time, files; written last
        critic/                 # one sub-directory per extra model (e.g. PPO critic)

A LoRA run saves the policy's adapter in PEFT's format instead of full weights
(``adapter_config.json``, ``adapter_model.safetensors``: ``PeftModel.from_pretrained(base,
step_200)`` loads it), and with ``--save-merged`` an export ``merged/`` (a plain Hugging Face
model); see ``docs/lora.md``.

A save writes everything into ``.tmp-step_<N>-<random>/`` next to the final directory and
renames it into place, so an interrupted save never leaves a partial ``step_<N>``.

::

    path = save_checkpoint(save_root, step, model=model, tokenizer=tok, optimizer=opt,
                           scheduler=sched, trainer_state={"epoch": 1, "index": 96},
                           config=cfg.to_dict())
    resume_from = resolve_resume("auto", save_root)
    if resume_from is not None:
        state = load_checkpoint(resume_from, model=model, optimizer=opt, scheduler=sched)

Why one long module: saving, the manifest, resume lookup and loading are one file format; the
reader and the writer are kept side by side so they cannot drift apart (the sharded format of
several processes is :mod:`areno_core.train.sharded_checkpoint`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import re
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_model
from torch import nn

from areno_core.data.stream import rows_fingerprint
from areno_core.errors import ConfigError
from areno_core.log import get_logger
from areno_core.models.lora import load_adapter_weights, save_adapter

logger = get_logger(__name__)

FORMAT_NAME = "areno-checkpoint"
FORMAT_VERSION = 1
MANIFEST_FILE = "areno_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"
LATEST_FILE = "latest"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
TEMP_PREFIX = ".tmp-"

_STEP_DIR = re.compile(r"^step_(\d+)$")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_RESERVED_NAMES = {"latest", "tokenizer"}

# An extra model is a module, or (module, optimizer), or (module, optimizer, scheduler); the
# optimizer and scheduler may be None.
ExtraModel = (
    nn.Module
    | tuple[nn.Module, torch.optim.Optimizer | None]
    | tuple[nn.Module, torch.optim.Optimizer | None, torch.optim.lr_scheduler.LRScheduler | None]
)


# -- RNG --------------------------------------------------------------------------------


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Snapshot every random stream a run draws from.

    Covers Python's ``random``, NumPy's global generator, torch's CPU generator, every CUDA
    device's generator when CUDA is initialised, and each named ``torch.Generator`` given.
    The result holds only plain values and tensors (safe for ``torch.load(weights_only=True)``).
    """
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def restore_rng_state(
    state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None
) -> None:
    """Put back the random streams saved by :func:`capture_rng_state`.

    A named generator missing on either side is reported as a warning, as are CUDA states
    that cannot be restored (no GPU now, or a different number of devices).
    """
    random.setstate(_as_python_random_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["key"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda")
    if cuda_states:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda_states):
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning(
                "checkpoint holds RNG states for %d CUDA device(s) but %d are visible; "
                "CUDA random streams start fresh",
                len(cuda_states),
                torch.cuda.device_count() if torch.cuda.is_available() else 0,
            )
    saved = state.get("generators", {})
    for name, gen in (generators or {}).items():
        if name in saved:
            gen.set_state(saved[name])
        else:
            logger.warning("checkpoint has no state for generator %r; it keeps its state", name)
    for name in saved:
        if name not in (generators or {}):
            logger.warning("checkpoint holds generator %r but none was passed to restore", name)


def _as_python_random_state(value: Any) -> tuple[Any, ...]:
    version, internal, gauss_next = value
    return (version, tuple(internal), gauss_next)


# -- save -------------------------------------------------------------------------------


def save_checkpoint(
    save_root: str | os.PathLike[str],
    step: int,
    *,
    model: nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    trainer_state: Mapping[str, Any],
    config: Mapping[str, Any],
    extra_models: Mapping[str, ExtraModel] | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    exports: Mapping[str, Callable[[Path], None]] | None = None,
) -> Path:
    """Write ``<save_root>/step_<step>/`` atomically and point ``latest`` at it.

    ``trainer_state`` is the loop's own state (by convention ``epoch`` and ``index``, the
    position in that epoch's sample order, plus anything else); it may hold only plain
    Python values (None, bool, int, float, str, lists, tuples, dicts) and tensors.
    ``extra_models`` maps a sub-directory name to a module, ``(module, optimizer)`` or
    ``(module, optimizer, scheduler)``. ``generators`` are named ``torch.Generator``s whose
    states are saved with the global RNG states. ``exports`` maps a sub-directory name to a
    function that writes into it (e.g. a LoRA policy's merged export); they are part of the
    checkpoint's files but are not read back by :func:`load_checkpoint`. ``model`` may be a
    PEFT model: its adapter is saved in PEFT's format. Call it on one process only.

    Returns the final checkpoint directory. An existing ``step_<step>`` is replaced.
    """
    if step < 0:
        raise ValueError(f"save_checkpoint: step must be zero or more, got {step}")
    extras = _normalise_extras(extra_models)
    for name in exports or {}:
        if name in extras:
            raise ValueError(f"{name!r} is both an extra model and an export")
        _check_sub_name(name, "export")
    rng = capture_rng_state(generators)
    state = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "trainer_state": _plain(dict(trainer_state), "trainer_state"),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng,
        "extra": {
            name: {
                "optimizer": opt.state_dict() if opt is not None else None,
                "scheduler": sched.state_dict() if sched is not None else None,
            }
            for name, (_, opt, sched) in extras.items()
        },
    }
    config_text = yaml.safe_dump(_yaml_ready(_plain(dict(config), "config")), sort_keys=False)

    root = Path(save_root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root)
    final = root / f"step_{step}"
    tmp = root / f"{TEMP_PREFIX}{final.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _save_module(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for name, (module, _, _) in extras.items():
            _save_module(module, tmp / name)
        for name, write in (exports or {}).items():
            write(tmp / name)
        torch.save(state, tmp / TRAINER_STATE_FILE)
        (tmp / CONFIG_FILE).write_text(config_text)
        _write_manifest(
            tmp, step=step, extra_names=sorted(extras), export_names=sorted(exports or {})
        )
        _fsync_tree(tmp)
        _move_into_place(tmp, final)
        _write_latest(root, final.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("saved checkpoint %s", final)
    return final


def _normalise_extras(
    extra_models: Mapping[str, ExtraModel] | None,
) -> dict[str, tuple[nn.Module, Any, Any]]:
    out: dict[str, tuple[nn.Module, Any, Any]] = {}
    for name, value in (extra_models or {}).items():
        _check_sub_name(name, "extra model")
        if isinstance(value, nn.Module):
            out[name] = (value, None, None)
        elif isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[0], nn.Module):
            out[name] = (value[0], value[1], value[2] if len(value) == 3 else None)
        else:
            raise TypeError(
                f"extra model {name!r} must be a module, (module, optimizer) or "
                f"(module, optimizer, scheduler); got {type(value).__name__}"
            )
    return out


def _check_sub_name(name: str, what: str) -> None:
    if not _EXTRA_NAME.match(name) or name in _RESERVED_NAMES or _STEP_DIR.match(name):
        raise ValueError(
            f"{what} name {name!r} must be a plain directory name (letters, digits, "
            "'_' or '-') and not one of: latest, tokenizer, step_<N>"
        )


def _plain(value: Any, where: str) -> Any:
    """Check that ``value`` is made of plain values and tensors; NumPy scalars become Python."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"{where} holds a value of type {type(value).__name__}; checkpoints store only "
        "None, bool, int, float, str, lists, tuples, dicts and tensors"
    )


def _yaml_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _yaml_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_yaml_ready(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def _unwrap(module: nn.Module) -> nn.Module:
    # torch.compile wraps the module; save and load the original.
    return getattr(module, "_orig_mod", module)


def _save_module(module: nn.Module, directory: Path) -> None:
    module = _unwrap(module)
    directory.mkdir(parents=True, exist_ok=True)
    if getattr(module, "peft_config", None) is not None and hasattr(module, "base_model"):
        save_adapter(module, directory)  # a LoRA policy: its adapter, in PEFT's format
        return
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(str(directory))
        return

    save_model(module, str(directory / WEIGHTS_FILE))


def _write_manifest(
    directory: Path, *, step: int, extra_names: list[str], export_names: list[str]
) -> None:
    files = {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": step,
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "extra_models": extra_names,
        "exports": export_names,
        "lora": (directory / ADAPTER_CONFIG_FILE).is_file(),
        "files": files,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")


def _fsync_tree(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in [*(p for p in directory.rglob("*") if p.is_dir()), directory]:
        _fsync_dir(d)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _move_into_place(tmp: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = final.with_name(f"{TEMP_PREFIX}old-{final.name}-{secrets.token_hex(4)}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f"{TEMP_PREFIX}latest-{secrets.token_hex(4)}"
    try:
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / LATEST_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(root)


def _remove_stale_temps(root: Path) -> None:
    for p in root.glob(f"{TEMP_PREFIX}*"):
        logger.info("removing %s left by an interrupted save", p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# -- find -------------------------------------------------------------------------------


def missing_files(path: str | os.PathLike[str]) -> list[str]:
    """What keeps ``path`` from being a complete checkpoint (empty when it is one).

    Each entry is a short reason naming a file, e.g. ``"trainer_state.pt is missing"``.
    """
    path = Path(path)
    # A LoRA run's checkpoint holds its policy as an adapter (PEFT's format), not full weights.
    adapter = (path / ADAPTER_CONFIG_FILE).is_file()
    model_files = (ADAPTER_WEIGHTS_FILE,) if adapter else ("config.json",)
    problems = [
        f"{name} is missing"
        for name in (MANIFEST_FILE, TRAINER_STATE_FILE, CONFIG_FILE, *model_files)
        if not (path / name).is_file()
    ]
    if (
        not adapter
        and not (path / WEIGHTS_FILE).is_file()
        and not (path / WEIGHTS_INDEX_FILE).is_file()
    ):
        problems.append(f"{WEIGHTS_FILE} (or {WEIGHTS_INDEX_FILE}) is missing")
    if problems:
        return problems
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        files = dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MANIFEST_FILE} is unreadable"]
    for rel, size in files.items():
        f = path / rel
        if not f.is_file():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{rel} has {f.stat().st_size} bytes, expected {size}")
    return problems


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    path = Path(path)
    return path.is_dir() and not missing_files(path)


def find_latest_checkpoint(save_root: str | os.PathLike[str]) -> Path | None:
    """The checkpoint to resume from under ``save_root``, or None when there is none.

    Follows the ``latest`` pointer when it names a complete checkpoint; otherwise takes the
    complete ``step_<N>`` directory with the highest N. Temporary ``.tmp-*`` entries and
    incomplete directories are ignored.
    """
    root = Path(save_root)
    if not root.is_dir():
        return None
    pointer = root / LATEST_FILE
    if pointer.is_file():
        name = pointer.read_text().strip()
        if _STEP_DIR.match(name) and is_complete_checkpoint(root / name):
            return root / name
        logger.warning("%s names %r, which is not a complete checkpoint; scanning", pointer, name)
    steps = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    )
    for _, p in reversed(steps):
        if is_complete_checkpoint(p):
            return p
    return None


def resolve_resume(resume: str, save_root: str | None) -> Path | None:
    """Turn ``--resume PATH|auto`` into a checkpoint directory.

    ``auto`` takes the latest checkpoint under ``--save-path`` and returns None when there is
    none yet (a fresh start, so the same command works for the first launch and every
    restart). A PATH must be a complete checkpoint, or a save path holding some (its latest
    is used). Anything else raises :class:`ConfigError` saying what is wrong.
    """
    if resume == "auto":
        if not save_root:
            raise ConfigError(
                "--resume auto needs --save-path: it resumes from the latest checkpoint there"
            )
        found = find_latest_checkpoint(save_root)
        if found is None:
            logger.info("--resume auto: no checkpoint under %s yet; starting fresh", save_root)
        return found
    path = Path(resume).expanduser()
    if not path.exists():
        raise ConfigError(f"--resume {resume!r}: no such directory")
    if not path.is_dir():
        raise ConfigError(f"--resume {resume!r} is a file; give a checkpoint directory")
    problems = missing_files(path)
    if not problems:
        return path
    if (path / LATEST_FILE).is_file() or any(_STEP_DIR.match(p.name) for p in path.iterdir()):
        found = find_latest_checkpoint(path)
        if found is not None:
            return found
        raise ConfigError(f"--resume {resume!r}: holds no complete checkpoint")
    hint = ""
    if (path / "config.json").is_file() and not (path / TRAINER_STATE_FILE).is_file():
        hint = "; it looks like a model directory: pass it as --ckpt to start from its weights"
    raise ConfigError(
        f"--resume {resume!r} is not a complete areno checkpoint: {problems[0]}{hint}"
    )


def check_writable_dir(path: str | os.PathLike[str], flag: str) -> None:
    """Raise :class:`ConfigError` when the directory ``path`` (given as ``flag``) cannot be
    created or written: a file in its way, or no write permission where it would be made.
    Creates nothing, so a refused run leaves nothing behind."""
    target = Path(path).expanduser()
    probe = target
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        where = "it is a file" if probe == target else f"{str(probe)!r} is a file, not a folder"
        raise ConfigError(f"{flag} {str(path)!r} cannot be used as a folder: {where}")
    if not os.access(probe, os.W_OK | os.X_OK):
        action = "written to" if probe == target else "created"
        raise ConfigError(
            f"{flag} {str(path)!r} cannot be {action}: no write permission on {str(probe)!r}"
        )


def check_resume_dataset(path: str | os.PathLike[str], rows: Sequence[Any], dataset: str) -> None:
    """Refuse to resume ``path`` on other training data than the saved run's (another row
    count, or the same count with other content or order), before any model is loaded.
    ``dataset`` names the data in the message."""

    # mmap: only the small trainer state is read, not the optimizer tensors beside it.
    state = torch.load(Path(path) / TRAINER_STATE_FILE, mmap=True, weights_only=True)
    data = state.get("trainer_state", {}).get("data", {})
    if not isinstance(data, Mapping):
        return
    saved = data.get("num_rows")
    advice = "resume with the same data and loader, or start a new run in another --save-path"
    if saved is not None and int(saved) != len(rows):
        raise ConfigError(
            f"--resume {str(path)!r}: that run trained on {int(saved)} rows, but "
            f"{dataset} gives {len(rows)} rows (after the loader); {advice}"
        )
    saved_print = data.get("fingerprint")
    if saved_print is not None and saved_print != rows_fingerprint(rows):
        raise ConfigError(
            f"--resume {str(path)!r}: {dataset} gives {len(rows)} rows, as many as that run "
            f"trained on, but not the same rows (after the loader); {advice}"
        )


def read_checkpoint_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The run config saved with a checkpoint (``config.yaml``), as a dict."""
    data = yaml.safe_load((Path(path) / CONFIG_FILE).read_text())
    return data if isinstance(data, dict) else {}


# -- load -------------------------------------------------------------------------------


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    extra_models: Mapping[str, ExtraModel] | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint` into live objects.

    Loads the model weights strictly (every parameter and persistent buffer, tied weights
    allowed to be stored once), the optimizer and scheduler states (skipped when passed as
    None), each extra model with its optimizer/scheduler, and the RNG states. Returns the
    saved ``trainer_state`` dict with ``step`` added.
    """
    path = Path(path)
    problems = missing_files(path)
    if problems:
        raise ConfigError(f"{path} is not a complete areno checkpoint: {problems[0]}")
    state = torch.load(path / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise ConfigError(
            f"{path}: checkpoint format version {version!r} is not supported "
            f"(this areno reads version {FORMAT_VERSION})"
        )
    extras = _normalise_extras(extra_models)
    saved_extra = state.get("extra", {})
    for name in extras:
        if name not in saved_extra:
            raise ConfigError(f"{path} has no {name!r} model; it holds {sorted(saved_extra)}")
    for name in saved_extra:
        if name not in extras:
            logger.warning("%s holds a %r model that is not being restored", path, name)

    load_module_weights(model, path)
    _load_states(optimizer, scheduler, state["optimizer"], state["scheduler"])
    for name, (module, opt, sched) in extras.items():
        load_module_weights(module, path / name)
        _load_states(opt, sched, saved_extra[name]["optimizer"], saved_extra[name]["scheduler"])
    if restore_rng:
        restore_rng_state(state["rng"], generators)
    result = dict(state["trainer_state"])
    result["step"] = state["step"]
    logger.info("resumed from %s (step %d)", path, state["step"])
    return result


def _load_states(
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    optimizer_state: dict[str, Any] | None,
    scheduler_state: dict[str, Any] | None,
) -> None:
    if optimizer is not None:
        if optimizer_state is None:
            raise ConfigError("checkpoint holds no optimizer state to restore")
        optimizer.load_state_dict(optimizer_state)
    if scheduler is not None:
        if scheduler_state is None:
            raise ConfigError("checkpoint holds no scheduler state to restore")
        scheduler.load_state_dict(scheduler_state)


def read_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors weights in ``directory`` (single file or sharded)."""

    directory = Path(directory)
    index = directory / WEIGHTS_INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / WEIGHTS_FILE).is_file():
        shards = [WEIGHTS_FILE]
    else:
        raise ConfigError(f"{directory}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}")
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update(load_file(str(directory / shard), device="cpu"))
    return weights


def load_module_weights(module: nn.Module, directory: str | os.PathLike[str]) -> None:
    """Load the safetensors weights in ``directory`` into ``module``, strictly.

    Parameters tied to another stored parameter (e.g. an output layer sharing the embedding)
    may be absent from the files. If the stored names do not match the module's (Hugging Face
    may save some architectures in a converted layout), a Hugging Face model is re-read
    through ``from_pretrained`` and must then match exactly.
    """
    directory = Path(directory)
    target = _unwrap(module)
    if getattr(target, "peft_config", None) is not None and hasattr(target, "base_model"):
        load_adapter_weights(target, directory)
        return
    if (directory / ADAPTER_CONFIG_FILE).is_file():
        raise ConfigError(
            f"{directory} holds a LoRA adapter, not full weights; load it into a model with "
            "the same LoRA adapters (resume with the run's --lora-* options)"
        )
    weights = read_weights(directory)
    convert = getattr(target, "convert_saved_weights", None)
    if convert is not None:  # a module saved in another layout (a ValueModel as a classifier)
        weights = convert(weights)
    expected = target.state_dict()
    unexpected = sorted(set(weights) - set(expected))
    missing = sorted(k for k in set(expected) - set(weights) if not _is_tied(k, weights, expected))
    if unexpected or missing:
        if hasattr(target, "from_pretrained") and (directory / "config.json").is_file():
            _load_via_from_pretrained(target, directory, missing, unexpected)
            return
        raise ConfigError(_mismatch_message(directory, missing, unexpected))
    try:
        target.load_state_dict(weights, strict=False)
    except RuntimeError as exc:
        raise ConfigError(f"{directory}: weights do not fit the model: {exc}") from exc


def _is_tied(key: str, weights: Mapping[str, torch.Tensor], expected: dict[str, Any]) -> bool:
    if expected[key].numel() == 0:
        return False
    ptr = expected[key].data_ptr()
    return any(k in weights and expected[k].data_ptr() == ptr for k in expected if k != key)


def _load_via_from_pretrained(
    target: nn.Module, directory: Path, missing: list[str], unexpected: list[str]
) -> None:
    try:
        loaded, info = type(target).from_pretrained(str(directory), output_loading_info=True)
    except Exception as exc:
        raise ConfigError(_mismatch_message(directory, missing, unexpected)) from exc
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise ConfigError(_mismatch_message(directory, missing, unexpected))
    try:
        target.load_state_dict(loaded.state_dict(), strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"{directory}: weights do not fit the model: {exc}") from exc


def _mismatch_message(directory: Path, missing: list[str], unexpected: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected tensor(s), e.g. {', '.join(unexpected[:3])}")
    return f"{directory}: weights do not match the model: " + "; ".join(parts)
