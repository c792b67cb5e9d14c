"""Read a W&B offline run file (``run-<id>.wandb``) back without uploading it.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version), then records
in 32 KiB blocks, each chunk behind a 7-byte header (CRC32, length, type: full, first,
middle or last piece), each record a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def chunks(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        piece = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield piece
        elif kind == FIRST:
            pending = piece
        elif kind == MIDDLE:
            pending += piece
        elif kind == LAST:
            yield pending + piece


def read_run(path: Path) -> dict[str, Any]:
    """``{"config": {...}, "history": [{...}, ...], "summary": {...}}`` of one run file."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}}
    for data in chunks(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            out["history"].append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                 for item in record.history.item}
            )  # fmt: skip
        elif kind in ("config", "summary"):
            for item in getattr(record, kind).update:
                key = item.key or "/".join(item.nested_key)
                out[kind][key] = json.loads(item.value_json)
        elif kind == "run":
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
    return out
