"""Frames a replay isolated because their payload did not decode (DESIGN.md §6).

Layout: ``<data_dir>/quarantine/frames/<segment file>-<byte offset>.pb`` is the frame's
payload byte for byte — the OTLP ``ExportLogsServiceRequest`` (protobuf) the node
acknowledged — and ``….json`` beside it says what it was: tenant, frame, segment, byte
offset, attempts, the last error, whether its records were already in the store. The
names derive from the frame's place in the WAL, so isolating the same frame again (a
second start that meets it before a checkpoint passes it) rewrites the same two files.

Each file is written to a temporary name, fsynced, renamed, and the directory fsynced
(the ``.pb`` first): a crash leaves at most a ``.tmp`` that the next write of that frame
replaces, never a record naming a payload that is not there. Nothing in the node reads
these files back; they are for an operator (docs/RUNBOOK.md, OuriosReplayFrameIsolated).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["keep_frame"]


def keep_frame(root: Path, payload: bytes, record: dict[str, object], name: str) -> Path:
    """Keep ``payload`` as ``root/<name>.pb`` and ``record`` as ``root/<name>.json``;
    returns the payload's path. ``OSError`` when either cannot be made durable."""
    root.mkdir(parents=True, exist_ok=True)
    kept = root / f"{name}.pb"
    _write_durably(kept, payload)
    _write_durably(
        root / f"{name}.json", (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    )
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return kept


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
