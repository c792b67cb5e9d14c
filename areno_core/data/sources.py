"""Read raw dataset rows from whatever ``--dataset-path`` names.

:func:`load_rows` returns a list of plain dicts, one per raw row, in file order. It accepts:

* a local file: ``.json`` (a list of objects, or JSON lines), ``.jsonl``, ``.parquet``,
  ``.csv``, ``.tsv``, ``.arrow`` (Arrow IPC stream or file, as ``datasets`` writes them);
* a directory written by ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``
  (a dataset dict gives its ``train`` split; ``dir:split`` picks another);
* a plain directory of data files: every supported file directly in it, sorted by name and
  concatenated;
* a Hugging Face dataset reference ``repo/name``, ``repo/name:config`` or
  ``repo/name:config:split`` (also bare names such as ``gsm8k:main``), read with
  ``datasets.load_dataset``; the split defaults to ``train``.

Anything that exists on disk is local. A string that looks like a path (starts with ``/``,
``./``, ``../`` or ``~``, ends in a supported extension, or has more than one ``/``) but does
not exist is reported as a missing file, never looked up on the hub.

CSV and TSV cells are read as strings (no type guessing); convert them in a loader if needed.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from areno_core.errors import DatasetError
from areno_core.log import get_logger

logger = get_logger(__name__)

FILE_EXTENSIONS: tuple[str, ...] = (".json", ".jsonl", ".parquet", ".csv", ".tsv", ".arrow")
DEFAULT_SPLIT = "train"
ACCEPTED = (
    "a JSON/JSONL, Parquet, CSV/TSV or Arrow file, a datasets.save_to_disk directory, "
    "a directory of such files, or a Hugging Face reference repo/name[:config[:split]]"
)

# Files datasets.save_to_disk writes next to the data; never rows of a plain directory.
_METADATA_FILES = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")
# Exception class names (anywhere in the cause chain) that mean the hub was not reachable.
_NETWORK_ERROR_NAMES = frozenset(
    {
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "TimeoutException",
        "NetworkError",
        "ProxyError",
        "ConnectionError",
    }
)


def load_rows(path: str) -> list[dict[str, Any]]:
    """Load every raw row named by ``path`` (a local path or a hub reference) as dicts."""
    text = path.strip()
    if not text:
        raise DatasetError(f"the dataset path is empty; pass {ACCEPTED}")
    local = Path(text).expanduser()
    if local.exists():
        rows = _load_local(local, split=None)
    elif (split_target := _split_suffix(text)) is not None:
        rows = _load_local(split_target[0], split=split_target[1])
    elif looks_like_path(text):
        raise DatasetError(f"dataset path not found: {text}. --dataset-path accepts {ACCEPTED}")
    else:
        rows = _load_hub(text)
    if not rows:
        raise DatasetError(f"dataset {text!r} has no rows")
    logger.info("loaded %d rows from %s", len(rows), text)
    return rows


def looks_like_path(text: str) -> bool:
    """Whether ``text`` is meant as a filesystem path rather than a hub reference."""
    if text.startswith(_PATH_PREFIXES) or text in (".", ".."):
        return True
    if text.lower().endswith(FILE_EXTENSIONS):
        return True
    return text.count("/") > 1 or "\\" in text


def parse_hub_reference(ref: str) -> tuple[str, str | None, str]:
    """Split ``repo/name[:config[:split]]`` into ``(name, config, split)``."""
    parts = ref.split(":")
    if len(parts) > 3 or any(not p.strip() for p in parts):
        raise DatasetError(
            f"dataset reference {ref!r} is not of the form repo/name, repo/name:config or "
            f"repo/name:config:split, and no such local path exists. --dataset-path accepts "
            f"{ACCEPTED}"
        )
    name = parts[0].strip()
    config = parts[1].strip() if len(parts) > 1 else None
    split = parts[2].strip() if len(parts) > 2 else DEFAULT_SPLIT
    return name, config, split


# ---------------------------------------------------------------------------------------------
# Hugging Face hub


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers (:func:`areno_core.models.loading.hub_reachable`)."""
    from areno_core.models.loading import hub_reachable as probe  # heavy: transformers' stack

    return probe()


def _load_hub(ref: str) -> list[dict[str, Any]]:
    name, config, split = parse_hub_reference(ref)
    import datasets  # heavy: only for Hugging Face dataset ids

    logger.info("loading %s (config %s, split %s) with datasets.load_dataset", name, config, split)
    # Without a reachable hub the client would retry for tens of seconds; probe first (a few
    # seconds at most) and then only look in the local cache.
    offline = not hub_reachable()
    saved = datasets.config.HF_HUB_OFFLINE
    try:
        if offline:
            datasets.config.HF_HUB_OFFLINE = True
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:
        raise _hub_error(ref, exc) from exc
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
    return _dataset_to_rows(dataset, ref)


def _hub_error(ref: str, exc: Exception) -> DatasetError:
    cause = f"{type(exc).__name__}: {exc}"
    if type(exc).__name__ == "DatasetNotFoundError":
        return DatasetError(
            f"dataset reference {ref!r} was not found on the Hugging Face Hub ({cause}). "
            f"Check the name, or pass a local file or directory path."
        )
    if _is_network_error(exc):
        import datasets  # heavy: only for Hugging Face dataset ids

        offline = " (offline: no hub is reachable)" if datasets.config.HF_HUB_OFFLINE else ""
        return DatasetError(
            f"could not reach the Hugging Face Hub for dataset reference {ref!r}{offline} and it "
            f"is not in the local cache ({cause}). Pass a local file or directory path instead: "
            "a JSON/JSONL, Parquet, CSV/TSV or Arrow file, or a datasets.save_to_disk directory."
        )
    return DatasetError(f"could not load dataset reference {ref!r}: {cause}")


def _is_network_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError | TimeoutError):
            return True
        if any(cls.__name__ in _NETWORK_ERROR_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


# ---------------------------------------------------------------------------------------------
# Local paths


def _split_suffix(text: str) -> tuple[Path, str] | None:
    """``dir:split`` where ``dir`` is a saved DatasetDict, else None."""
    head, sep, split = text.rpartition(":")
    if not sep or not head or not split:
        return None
    directory = Path(head).expanduser()
    if (directory / "dataset_dict.json").is_file():
        return directory, split
    return None


def _load_local(path: Path, *, split: str | None) -> list[dict[str, Any]]:
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            return _load_saved_dict(path, split or DEFAULT_SPLIT)
        if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
            return _load_saved_dataset(path)
        return _load_directory(path)
    return _load_file(path)


def _load_saved_dataset(path: Path) -> list[dict[str, Any]]:
    import datasets  # heavy: only for Hugging Face dataset ids

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DatasetError(
            f"could not read the datasets.save_to_disk directory {path}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return _dataset_to_rows(dataset, str(path))


def _load_saved_dict(path: Path, split: str) -> list[dict[str, Any]]:
    try:
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{path / 'dataset_dict.json'} is not a valid datasets.save_to_disk index: {exc}"
        ) from exc
    if split not in splits:
        listing = ", ".join(splits) if splits else "none"
        raise DatasetError(
            f"saved dataset dict {path} has no split {split!r}; its splits are: {listing}. "
            f"Pick one with --dataset-path {path}:SPLIT"
        )
    return _load_saved_dataset(path / split)


def _load_directory(path: Path) -> list[dict[str, Any]]:
    entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    files = [
        p
        for p in entries
        if p.is_file() and p.suffix.lower() in FILE_EXTENSIONS and p.name not in _METADATA_FILES
    ]
    if not files:
        subdirs = [p.name for p in entries if p.is_dir()]
        found = f" (it has subdirectories: {', '.join(subdirs)})" if subdirs else ""
        raise DatasetError(
            f"directory {path} has no data files with a supported extension "
            f"({', '.join(FILE_EXTENSIONS)}) and is not a datasets.save_to_disk directory{found}"
        )
    skipped = [p.name for p in entries if p.is_file() and p not in files]
    if skipped:
        logger.info("skipping files with unsupported extensions in %s: %s", path, skipped)
    logger.info("reading %d files from %s: %s", len(files), path, [p.name for p in files])
    rows: list[dict[str, Any]] = []
    for file in files:
        rows.extend(_load_file(file))
    return rows


def _load_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    reader = _READERS.get(suffix)
    if reader is None:
        shown = suffix or "(none)"
        raise DatasetError(
            f"unsupported dataset file extension {shown!r} for {path}; supported extensions: "
            f"{', '.join(FILE_EXTENSIONS)}, or a datasets.save_to_disk directory"
        )
    try:
        return reader(path)
    except DatasetError:
        raise
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset file {path} is not UTF-8 text: {exc}") from exc
    except Exception as exc:
        raise DatasetError(
            f"could not read dataset file {path}: {type(exc).__name__}: {exc}"
        ) from exc


def _row(value: Any, where: str, rule: str) -> dict[str, Any]:
    """``value`` if it is a JSON object (a row); otherwise a :class:`DatasetError` naming
    ``where`` it stands, what it is, and the ``rule`` it breaks."""
    if not isinstance(value, dict):
        raise DatasetError(f"{where} is a JSON {_json_type(value)}; {rule}")
    return value


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(_iter_json_lines(path))


def _iter_json_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{path} line {lineno} is not valid JSON: {exc.msg} (column {exc.colno})"
                ) from exc
            yield _row(value, f"{path} line {lineno}", "each line must be a JSON object (one row)")


def _read_json(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):
            raise DatasetError(
                f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from exc
        # Not one JSON document: read it as JSON lines, which reports the bad line.
        return _read_jsonl(path)
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list):
        raise DatasetError(
            f"{path} holds a JSON {_json_type(value)}; expected a list of objects or JSON lines"
        )
    rule = "every item must be an object (one row)"
    return [
        _row(item, f"{path}: item {i} of the top-level list", rule) for i, item in enumerate(value)
    ]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # heavy: only for parquet files

    return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]


def _read_arrow(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa  # heavy: only for parquet files

    with pa.memory_map(str(path)) as source:
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_file(source).read_all()
    return table.to_pylist()  # type: ignore[no-any-return]


def _read_delimited(path: Path, delimiter: str) -> list[dict[str, Any]]:
    csv.field_size_limit(2**31 - 1)
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        rows: list[dict[str, Any]] = []
        for row in reader:
            if None in row:
                raise DatasetError(
                    f"{path} line {reader.line_num} has more fields than the header "
                    f"({len(reader.fieldnames or [])} columns)"
                )
            rows.append(dict(row))
    return rows


def _read_csv(path: Path) -> list[dict[str, Any]]:
    return _read_delimited(path, ",")


def _read_tsv(path: Path) -> list[dict[str, Any]]:
    return _read_delimited(path, "\t")


_READERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    ".json": _read_json,
    ".jsonl": _read_jsonl,
    ".parquet": _read_parquet,
    ".csv": _read_csv,
    ".tsv": _read_tsv,
    ".arrow": _read_arrow,
}


def _dataset_to_rows(dataset: Any, source: str) -> list[dict[str, Any]]:
    if not hasattr(dataset, "to_list"):
        splits = ", ".join(getattr(dataset, "keys", list)())
        raise DatasetError(
            f"{source} loaded as several splits ({splits}); name one, e.g. {source}:{DEFAULT_SPLIT}"
        )
    return dataset.to_list()  # type: ignore[no-any-return]


def _json_type(value: Any) -> str:
    names = {list: "array", dict: "object", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


__all__ = ["ACCEPTED", "FILE_EXTENSIONS", "load_rows", "looks_like_path", "parse_hub_reference"]
