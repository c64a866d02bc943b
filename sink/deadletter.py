"""The dead-letter directory: partitions the store refuses for good, kept durably on the
data volume so that the other partitions' cut completes (DESIGN.md §5.13).

A publish that fails with a *permanent* error class — the store refused this object and
would refuse it again (``s3_access_denied``: a bucket policy on the tenant's prefix;
``s3_client_error``: EntityTooLarge, an invalid argument; ``local_denied``: the
embedded store's directory for the key refuses it; ``encode_error``: its rows
cannot be encoded) — is retried like any failure, but after ``sink.dead_letter_attempts``
such failures of one partition (tenant, kind, day) the publisher writes the object here
instead of requeueing it, and settles it as published. Without that, the partition went
back into every cut for ever, every cut failed node-wide, the checkpoint stopped for
every tenant and the WAL grew until the volume was full (issue 22 item 6).

Layout: ``<data_dir>/deadletter/<store key>`` — the very key the store refused, so an
operator re-drives the directory by copying it into the bucket under the node's prefix
once the cause is fixed (docs/RUNBOOK.md). An object whose rows could not be encoded as
Parquet is written as an Arrow IPC stream of the same rows (``.arrows`` after the key).

Why it is durable (fsync of the file and of every directory it creates): a dead-lettered
partition counts as published, so the next cut's checkpoint passes its frames and the
WAL reclaims them — the file must be on disk before that (RULES.md EVERYSTATE.6). It is
never emptied by the node; disk admission counts what it writes, so stop water covers
it like the WAL and the spool.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pyarrow as pa

#: failure classes that a retry of the same object cannot cure (module docstring);
#: ``s3_auth`` and ``s3_no_such_bucket`` are node-wide, not one partition's, and stay
#: out: they fail every partition alike, and the WAL absorbs them
PERMANENT_ERRORS: Final = frozenset(
    {"s3_access_denied", "s3_client_error", "local_denied", "encode_error"}
)
#: permanent classes that may also be the whole store's (a policy or a directory's
#: permissions denying the node everything): they count only while other objects land
DENIALS: Final = frozenset({"s3_access_denied", "local_denied"})
#: the suffix of an object written as an Arrow IPC stream (its Parquet encode failed)
ARROW_SUFFIX: Final = ".arrows"


def arrow_stream(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Rows whose Parquet encode failed, as an Arrow IPC stream (no encoding to fail)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


class DeadLetter:
    """Writes refused objects durably under ``root`` (module docstring). Thread-safe."""

    def __init__(self, root: Path, *, on_write: Callable[[int], None] | None = None) -> None:
        self.root = root
        self._on_write = on_write
        self._lock = threading.Lock()
        #: objects and bytes written since start
        self.files = 0
        self.bytes = 0

    def write(self, key: str, data: bytes) -> Path:
        """Write ``data`` at ``root/key`` and make it durable (file and directories
        fsynced) before returning; ``OSError`` on failure, nothing left behind."""
        path = self.root / key
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise OSError(f"dead-letter key {key!r} leaves {self.root}")
        self._make_dirs(path.parent)
        temp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
            _fsync_dir(path.parent)
        except OSError:
            temp.unlink(missing_ok=True)
            raise
        with self._lock:
            self.files += 1
            self.bytes += len(data)
        if self._on_write is not None:
            self._on_write(len(data))
        return path

    def _make_dirs(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents, each new one's parent fsynced."""
        missing: list[Path] = []
        probe = directory
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        for d in reversed(missing):
            d.mkdir(exist_ok=True)
            _fsync_dir(d.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
