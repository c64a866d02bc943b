"""Which decode slots are held when the native decoder runs (the receivers' tests).

The receivers parse and flatten inside one of the process's decode slots
(``InflightBudget.decoding``, ``server.max_concurrent_decodes``); `watch` records, at
every call of ``native.decode``, how many slots the budget then holds and whether the
decoder answered (a fallback to upb would not show the native path was bounded);
`spy_native` records only the rows of each payload the native decoder answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pytest

from app.receive import native
from app.receive.inflight import InflightBudget


class WatchedBudget(InflightBudget):
    """An `InflightBudget` that counts the decode slots held."""

    held = 0

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        with super().decoding():
            self.held += 1
            try:
                yield
            finally:
                self.held -= 1


def watch(monkeypatch: pytest.MonkeyPatch, budget: WatchedBudget) -> list[tuple[int, bool]]:
    """(slots held, answered natively) at each ``native.decode`` from now on."""
    seen: list[tuple[int, bool]] = []
    real = native.decode

    def decode(data: bytes, limits: native.Limits | None = None) -> pa.RecordBatch | None:
        columns = real(data, limits)
        seen.append((budget.held, columns is not None))
        return columns

    monkeypatch.setattr(native, "decode", decode)
    return seen


def spy_native(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each payload ``native.decode`` answers from now on (none where it
    leaves the payload to upb); the native decoder must be the one selected here."""
    assert native.select("native")[0] == "native"
    answered: list[int] = []
    real = native.decode

    def decode(data: bytes, limits: native.Limits | None = None) -> pa.RecordBatch | None:
        columns = real(data, limits)
        if columns is not None:
            answered.append(columns.num_rows)
        return columns

    monkeypatch.setattr(native, "decode", decode)
    return answered
