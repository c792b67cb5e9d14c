"""Tests for areno_core.data.sources.load_rows on real GSM8K rows written in every format."""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path
from typing import Any

import datasets
import pytest
from datasets.exceptions import DatasetNotFoundError

import areno_core.data.sources as sources
from areno_core.data.sources import load_rows, looks_like_path, parse_hub_reference
from areno_core.errors import DatasetError

N_SAMPLE = 50


def _read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            rows.append(json.loads(line))
            if limit is not None and len(rows) == limit:
                break
    return rows


@pytest.fixture
def train_rows(gsm8k_dir: Path) -> list[dict[str, Any]]:
    """The first 50 real GSM8K training rows."""
    return _read_jsonl(gsm8k_dir / "train.jsonl", N_SAMPLE)


@pytest.fixture
def test_rows(gsm8k_dir: Path) -> list[dict[str, Any]]:
    """The first 50 real GSM8K test rows."""
    return _read_jsonl(gsm8k_dir / "test.jsonl", N_SAMPLE)


# --- whole real files (the repository's GSM8K excerpt: the first 256 train, 64 test rows) -------


def test_load_rows_gsm8k_train_jsonl_has_all_rows(gsm8k_dir: Path) -> None:
    rows = load_rows(str(gsm8k_dir / "train.jsonl"))
    assert len(rows) == 256
    assert set(rows[0]) == {"question", "answer"}
    assert rows[0]["question"].startswith("Natalia sold clips to 48 of her friends")
    assert rows[-1] == _read_jsonl(gsm8k_dir / "train.jsonl")[-1]


def test_load_rows_gsm8k_test_jsonl_has_all_rows(gsm8k_dir: Path) -> None:
    rows = load_rows(str(gsm8k_dir / "test.jsonl"))
    assert len(rows) == 64
    assert all(row["answer"].split("####")[-1].strip() for row in rows)


# --- one format at a time ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "writer", "rows_fixture"),
    [
        ("sample.jsonl", "to_json", "train_rows"),
        ("sample.parquet", "to_parquet", "test_rows"),
        # the answers hold newlines: the CSV quoting must survive
        ("sample.csv", "to_csv", "train_rows"),
    ],
)
def test_load_rows_file_written_by_datasets_roundtrips(
    tmp_path: Path, request: pytest.FixtureRequest, name: str, writer: str, rows_fixture: str
) -> None:
    rows = request.getfixturevalue(rows_fixture)
    path = tmp_path / name
    getattr(datasets.Dataset.from_list(rows), writer)(str(path))
    assert load_rows(str(path)) == rows


def test_load_rows_json_list_roundtrips(tmp_path: Path, train_rows: list) -> None:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(train_rows, indent=2), encoding="utf-8")
    assert load_rows(str(path)) == train_rows


def test_load_rows_json_file_holding_json_lines_roundtrips(
    tmp_path: Path, train_rows: list
) -> None:
    path = tmp_path / "sample.json"
    path.write_text("\n".join(json.dumps(r) for r in train_rows) + "\n", encoding="utf-8")
    assert load_rows(str(path)) == train_rows


def test_load_rows_jsonl_blank_lines_are_skipped(tmp_path: Path, train_rows: list) -> None:
    path = tmp_path / "sample.jsonl"
    path.write_text(
        "\n" + "\n\n".join(json.dumps(r) for r in train_rows[:5]) + "\n\n", encoding="utf-8"
    )
    assert load_rows(str(path)) == train_rows[:5]


def test_load_rows_parquet_roundtrips(tmp_path: Path, train_rows: list) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "sample.parquet"
    pq.write_table(pa.Table.from_pylist(train_rows), path)
    assert load_rows(str(path)) == train_rows


def test_load_rows_tsv_roundtrips(tmp_path: Path, train_rows: list) -> None:
    path = tmp_path / "sample.tsv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["question", "answer"], delimiter="\t")
        writer.writeheader()
        writer.writerows(train_rows)
    assert load_rows(str(path)) == train_rows


def test_load_rows_csv_numbers_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "numbers.csv"
    path.write_text("prompt,answer\nwhat is 6*7?,42\nleading zero?,007\n", encoding="utf-8")
    assert load_rows(str(path)) == [
        {"prompt": "what is 6*7?", "answer": "42"},
        {"prompt": "leading zero?", "answer": "007"},
    ]


def test_load_rows_arrow_stream_from_save_to_disk_roundtrips(
    tmp_path: Path, train_rows: list
) -> None:
    datasets.Dataset.from_list(train_rows).save_to_disk(str(tmp_path / "saved"))
    arrow_files = sorted((tmp_path / "saved").glob("*.arrow"))
    assert len(arrow_files) == 1
    assert load_rows(str(arrow_files[0])) == train_rows


def test_load_rows_arrow_ipc_file_format_roundtrips(tmp_path: Path, train_rows: list) -> None:
    import pyarrow as pa

    table = pa.Table.from_pylist(train_rows)
    path = tmp_path / "sample.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert load_rows(str(path)) == train_rows


def test_load_rows_save_to_disk_dataset_dir_roundtrips(tmp_path: Path, train_rows: list) -> None:
    datasets.Dataset.from_list(train_rows).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(str(tmp_path / "saved")) == train_rows


def test_load_rows_save_to_disk_dict_dir_picks_train(
    tmp_path: Path, train_rows: list, test_rows: list
) -> None:
    dd = datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_list(test_rows),
            "train": datasets.Dataset.from_list(train_rows),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    assert load_rows(str(tmp_path / "dd")) == train_rows
    assert load_rows(f"{tmp_path / 'dd'}:test") == test_rows


def test_load_rows_save_to_disk_dict_without_train_lists_splits(
    tmp_path: Path, test_rows: list
) -> None:
    dd = datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_list(test_rows),
            "validation": datasets.Dataset.from_list(test_rows[:3]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        DatasetError,
        match=r"^saved dataset dict .*dd has no split 'train'; its splits are: test, validation\. "
        r"Pick one with --dataset-path .*dd:SPLIT$",
    ):
        load_rows(str(tmp_path / "dd"))


def test_load_rows_directory_of_mixed_files_concatenates_sorted(
    tmp_path: Path, train_rows: list
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    # Written out of order on purpose; names sort as part-0, part-1, part-2.
    with (data / "part-2.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["question", "answer"])
        writer.writeheader()
        writer.writerows(train_rows[30:])
    (data / "part-0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in train_rows[:10]), encoding="utf-8"
    )
    pq.write_table(pa.Table.from_pylist(train_rows[10:30]), data / "part-1.parquet")
    (data / "README.md").write_text("# not data\n", encoding="utf-8")
    (data / ".hidden.jsonl").write_text('{"question": "x", "answer": "y"}\n', encoding="utf-8")
    assert load_rows(str(data)) == train_rows


def test_load_rows_directory_skips_dataset_metadata_json(tmp_path: Path, train_rows: list) -> None:
    (tmp_path / "dataset_info.json").write_text('{"features": {}}', encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in train_rows), encoding="utf-8"
    )
    assert load_rows(str(tmp_path)) == train_rows


def test_load_rows_directory_without_data_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "nested").mkdir()
    with pytest.raises(
        DatasetError,
        match=r"^directory .* has no data files with a supported extension \(\.json, \.jsonl, "
        r"\.parquet, \.csv, \.tsv, \.arrow\) and is not a datasets\.save_to_disk directory "
        r"\(it has subdirectories: nested\)$",
    ):
        load_rows(str(tmp_path))


def test_load_rows_tilde_path_expands_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train_rows: list
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rows.jsonl").write_text(json.dumps(train_rows[0]) + "\n", encoding="utf-8")
    assert load_rows("~/rows.jsonl") == train_rows[:1]


# --- malformed input ---------------------------------------------------------------------------


def test_load_rows_malformed_jsonl_line_names_file_and_line(
    tmp_path: Path, train_rows: list
) -> None:
    lines = [json.dumps(r) for r in train_rows[:20]]
    lines[16] = lines[16][:-5]  # truncate line 17 (1-based)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"^.*bad\.jsonl line 17 is not valid JSON: "):
        load_rows(str(path))


def test_load_rows_malformed_json_lines_in_json_file_names_line(
    tmp_path: Path, train_rows: list
) -> None:
    lines = [json.dumps(r) for r in train_rows[:5]]
    lines[3] = "{not json"
    path = tmp_path / "bad.json"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad\.json line 4 is not valid JSON"):
        load_rows(str(path))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        pytest.param(
            "arrays.jsonl",
            '{"a": 1}\n[1, 2]\n',
            r"arrays\.jsonl line 2 is a JSON array; each line must be a JSON object \(one row\)",
            id="jsonl-line-not-object",
        ),
        pytest.param(
            "broken.json",
            '[\n  {"a": 1},\n  {"a": }\n]\n',
            r"broken\.json is not valid JSON: Expecting value at line 3 column 9",
            id="broken-json-list-names-line-and-column",
        ),
        pytest.param(
            "mixed.json",
            '[{"a": 1}, "oops"]',
            r"mixed\.json: item 1 of the top-level list is a JSON string; every item must be "
            r"an object \(one row\)",
            id="json-list-with-non-object-item",
        ),
        pytest.param(
            "ragged.csv",
            "a,b\n1,2\n3,4,5\n",
            r"ragged\.csv line 3 has more fields than the header \(2 columns\)",
            id="csv-row-with-extra-fields-names-line",
        ),
        pytest.param(
            "corrupt.parquet",
            "this is not parquet",
            r"^could not read dataset file .*corrupt\.parquet: ",
            id="corrupt-parquet-names-file",
        ),
        pytest.param(
            "empty.jsonl", "\n\n", r"^dataset '.*empty\.jsonl' has no rows$", id="empty-jsonl"
        ),
        pytest.param("empty.json", "[]", r"has no rows", id="empty-json-list"),
        pytest.param(
            "rows.xlsx",
            "binary",
            r"^unsupported dataset file extension '\.xlsx' for .*rows\.xlsx; supported "
            r"extensions: \.json, \.jsonl, \.parquet, \.csv, \.tsv, \.arrow, or a "
            r"datasets\.save_to_disk directory$",
            id="unknown-extension-names-it-and-accepted-ones",
        ),
    ],
)
def test_load_rows_malformed_file_is_an_error_naming_the_problem(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=message):
        load_rows(str(path))


@pytest.mark.parametrize(
    "missing", ["/no/such/file.jsonl", "./missing", "data/train.parquet", "a/b/c", "~/nope"]
)
def test_load_rows_missing_path_names_it_and_formats(missing: str) -> None:
    pattern = (
        rf"^dataset path not found: {re.escape(missing)}\. --dataset-path accepts a "
        r"JSON/JSONL, Parquet, CSV/TSV or Arrow file, a datasets\.save_to_disk directory, a "
        r"directory of such files, or a Hugging Face reference repo/name\[:config\[:split\]\]$"
    )
    with pytest.raises(DatasetError, match=pattern):
        load_rows(missing)


def test_load_rows_empty_string_is_an_error() -> None:
    with pytest.raises(DatasetError, match=r"^the dataset path is empty"):
        load_rows("  ")


# --- hub references ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("gsm8k", ("gsm8k", None, "train")),
        ("gsm8k:main", ("gsm8k", "main", "train")),
        ("AI-MO/NuminaMath-TIR", ("AI-MO/NuminaMath-TIR", None, "train")),
        ("openai/gsm8k:main:test", ("openai/gsm8k", "main", "test")),
    ],
)
def test_parse_hub_reference_forms_split_correctly(
    ref: str, expected: tuple[str, str | None, str]
) -> None:
    assert parse_hub_reference(ref) == expected


@pytest.mark.parametrize("ref", ["a:b:c:d", "org/name::test", "org/name:"])
def test_load_rows_malformed_hub_reference_is_an_error(ref: str) -> None:
    with pytest.raises(
        DatasetError,
        match=r"is not of the form repo/name, repo/name:config or repo/name:config:split, and no "
        r"such local path exists",
    ):
        load_rows(ref)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gsm8k:main", False),
        ("openai/gsm8k", False),
        ("openai/gsm8k:main:train", False),
        ("train.jsonl", True),
        ("/abs/dir", True),
        ("./rel", True),
        ("../up", True),
        ("~/data", True),
        ("a/b/c", True),
        ("DATA.PARQUET", True),
    ],
)
def test_looks_like_path_distinguishes_paths_from_references(text: str, expected: bool) -> None:
    assert looks_like_path(text) is expected


def test_load_rows_hub_reference_passes_name_config_split(
    monkeypatch: pytest.MonkeyPatch, train_rows: list
) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake_load_dataset(name: str, config: str | None, split: str) -> datasets.Dataset:
        calls.append((name, config, split))
        return datasets.Dataset.from_list(train_rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_rows("gsm8k:main") == train_rows
    assert load_rows("openai/gsm8k:main:test") == train_rows
    assert calls == [("gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]


def test_load_rows_hub_unreachable_offline_fails_fast_with_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import huggingface_hub.constants

    # Both libraries read HF_HUB_OFFLINE once at import, so patch the parsed flags directly.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(
        DatasetError,
        match=r"^could not reach the Hugging Face Hub for dataset reference "
        r"'nonexistent-org/nonexistent-ds:main' \(offline: no hub is reachable\) and it is not "
        r"in the local cache \(ConnectionError: .*\)\. Pass a local file or directory path "
        r"instead: a JSON/JSONL, Parquet, CSV/TSV or Arrow file, or a datasets\.save_to_disk "
        r"directory\.$",
    ):
        load_rows("nonexistent-org/nonexistent-ds:main")
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    ("error", "reference", "message"),
    [
        pytest.param(
            ConnectionError("Couldn't reach 'gsm8k' on the Hub (LocalEntryNotFoundError)"),
            "gsm8k:main",
            r"^could not reach the Hugging Face Hub for dataset reference 'gsm8k:main' and it "
            r"is not in the local cache \(ConnectionError: Couldn't reach 'gsm8k' on the Hub "
            r"\(LocalEntryNotFoundError\)\)\. Pass a local file or directory path instead",
            id="connection-error-suggests-local-path",
        ),
        pytest.param(
            DatasetNotFoundError("Dataset 'org/typo' doesn't exist on the Hub"),
            "org/typo",
            r"^dataset reference 'org/typo' was not found on the Hugging Face Hub "
            r"\(DatasetNotFoundError: Dataset 'org/typo' doesn't exist on the Hub\)\. Check the "
            r"name",
            id="not-found-says-so",
        ),
        pytest.param(
            ValueError("Unknown split \"tset\". Should be one of ['train', 'test']."),
            "gsm8k:main:tset",
            r"^could not load dataset reference 'gsm8k:main:tset': ValueError: Unknown split",
            id="other-failure-reports-cause",
        ),
    ],
)
def test_load_rows_hub_failure_is_a_dataset_error_naming_the_cause(
    monkeypatch: pytest.MonkeyPatch, error: Exception, reference: str, message: str
) -> None:
    def failing(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(datasets, "load_dataset", failing)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(sources, "hub_reachable", lambda *a, **k: True)  # fails mid-download
    with pytest.raises(DatasetError, match=message):
        load_rows(reference)
