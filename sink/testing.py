"""Test doubles shipped with the sink (as ``wal.testing`` ships the WAL's): stores that
keep the ``ObjectStore`` contract of ``sink.store`` so tests need no patching.

* ``MemoryStore`` — a dict-backed store, thread-safe, with the same key rules as the
  real ones and ``snapshot()`` for assertions.
* ``FailingStore`` — wraps any store and injects faults into chosen calls: fail the
  k-th matching call once or always (``fail``), let it reach the store and lose its
  reply (``lose_reply``, the ambiguous write of RFC 0055 §9.2), or hold it until the
  test releases it (``hold``); each armed fault is a ``StoreFault`` handle the test
  waits and releases on.

Production code never imports this module.
"""

from __future__ import annotations

import builtins
import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from sink.store import (
    ObjectNotFound,
    ObjectStore,
    Op,
    StoreError,
    _check_list_prefix,
    _checked,
)

__all__ = ["FailingStore", "MemoryStore", "StoreFault", "StoreFaultKind"]

_T = TypeVar("_T")
#: the calls a fault matches unless told otherwise: the writes
_WRITE_OPS: Final[frozenset[Op]] = frozenset({"put", "put_if_absent"})


class MemoryStore:
    """A dict-backed ``ObjectStore`` for tests; thread-safe, same key rules as the others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, bytes] = {}

    def describe(self) -> str:
        return f"memory://{id(self):x}"

    def snapshot(self) -> dict[str, bytes]:
        """A copy of every object, for assertions."""
        with self._lock:
            return dict(self._objects)

    def put(self, key: str, data: bytes) -> None:
        _checked("put", key)
        with self._lock:
            self._objects[key] = bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        _checked("put_if_absent", key)
        with self._lock:
            if key in self._objects:
                return False
            self._objects[key] = bytes(data)
            return True

    def get(self, key: str) -> bytes:
        _checked("get", key)
        with self._lock:
            try:
                return self._objects[key]
            except KeyError:
                raise ObjectNotFound("get", key, "memory_not_found", "no such object") from None

    def exists(self, key: str) -> bool:
        _checked("exists", key)
        with self._lock:
            return key in self._objects

    def list(self, prefix: str) -> builtins.list[str]:
        _check_list_prefix(prefix)
        with self._lock:
            return sorted(k for k in self._objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        _checked("delete", key)
        with self._lock:
            self._objects.pop(key, None)


class StoreFaultKind(enum.Enum):
    """What an armed ``StoreFault`` does to the calls it matches."""

    FAIL = 1  # raise before the inner store is called: nothing happened
    LOSE_REPLY = 2  # call the inner store, then raise an ambiguous error: it happened
    HOLD = 3  # block until ``release()``, then carry on


@dataclass(eq=False)
class StoreFault:
    """An armed fault of a ``FailingStore``; also the handle a test waits and releases on.

    It fires on the ``nth`` matching call counted from when it was armed, and on every
    later one if ``always``.
    """

    kind: StoreFaultKind
    ops: frozenset[Op]
    nth: int
    always: bool
    error_type: str
    ambiguous: bool
    hold_timeout: float
    #: only calls whose key starts with it match ("" matches every key)
    prefix: str = ""
    #: set when the fault fires (for HOLD: when a call is blocked on it)
    reached: threading.Event = field(default_factory=threading.Event, init=False)
    #: matching calls seen and firings so far
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)
    _released: threading.Event = field(default_factory=threading.Event, init=False)

    def release(self) -> None:
        """Let held calls proceed; a HOLD fault with ``always`` no longer blocks after this."""
        self._released.set()

    def _count_call(self) -> bool:
        self.seen += 1
        if self.seen == self.nth or (self.always and self.seen > self.nth):
            self.fired += 1
            return True
        return False


class FailingStore:
    """Wraps an ``ObjectStore`` and injects faults into chosen calls (tests only).

    ``calls`` records every ``(op, key)`` in order, faulted or not. Faults are matched
    in arming order; on one call every matching HOLD blocks first, then a FAIL raises
    before the inner call, else a LOSE_REPLY raises after it.
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: builtins.list[tuple[Op, str]] = []
        self._lock = threading.Lock()
        self._faults: builtins.list[StoreFault] = []

    def describe(self) -> str:
        return f"failing({self.inner.describe()})"

    def _arm(
        self,
        kind: StoreFaultKind,
        ops: Iterable[Op],
        nth: int,
        always: bool,
        error_type: str,
        ambiguous: bool,
        hold_timeout: float = 0.0,
        prefix: str = "",
    ) -> StoreFault:
        if nth < 1:
            raise ValueError(f"nth={nth}: calls are counted from 1")
        fault = StoreFault(
            kind, frozenset(ops), nth, always, error_type, ambiguous, hold_timeout, prefix
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail(
        self,
        *,
        ops: Iterable[Op] = _WRITE_OPS,
        nth: int = 1,
        always: bool = False,
        error_type: str = "injected",
        ambiguous: bool = False,
        prefix: str = "",
    ) -> StoreFault:
        """Make the ``nth`` matching call (and every later one if ``always``) raise
        ``StoreError`` without reaching the inner store. ``prefix``: only calls on keys
        starting with it match."""
        return self._arm(
            StoreFaultKind.FAIL, ops, nth, always, error_type, ambiguous, prefix=prefix
        )

    def lose_reply(
        self,
        *,
        ops: Iterable[Op] = _WRITE_OPS,
        nth: int = 1,
        always: bool = False,
        error_type: str = "injected",
    ) -> StoreFault:
        """Make the ``nth`` matching call reach the inner store, then raise an ambiguous
        ``StoreError``: the "PUT reached the server, the reply was lost" case."""
        return self._arm(StoreFaultKind.LOSE_REPLY, ops, nth, always, error_type, True)

    def hold(
        self,
        *,
        ops: Iterable[Op] = _WRITE_OPS,
        nth: int = 1,
        always: bool = False,
        timeout: float = 60.0,
        prefix: str = "",
    ) -> StoreFault:
        """Block the ``nth`` matching call until ``release()``; ``reached`` is set when it
        blocks. A hold not released within ``timeout`` seconds fails the call
        (``hold_timeout``) so a broken test fails instead of hanging."""
        return self._arm(
            StoreFaultKind.HOLD, ops, nth, always, "hold_timeout", False, timeout, prefix
        )

    def clear(self) -> None:
        """Disarm every fault (held calls stay held until released)."""
        with self._lock:
            self._faults.clear()

    def _run(self, op: Op, key: str, call: Callable[[], _T]) -> _T:
        with self._lock:
            self.calls.append((op, key))
            fired = [
                f
                for f in self._faults
                if op in f.ops and key.startswith(f.prefix) and f._count_call()
            ]
        for fault in fired:
            if fault.kind is StoreFaultKind.HOLD:
                fault.reached.set()
                if not fault._released.wait(fault.hold_timeout):
                    raise StoreError(op, key, "hold_timeout", "held call never released")
        failing = [f for f in fired if f.kind is StoreFaultKind.FAIL]
        if failing:
            failing[0].reached.set()
            raise StoreError(
                op,
                key,
                failing[0].error_type,
                "injected failure",
                ambiguous=failing[0].ambiguous,
            )
        result = call()
        losing = [f for f in fired if f.kind is StoreFaultKind.LOSE_REPLY]
        if losing:
            losing[0].reached.set()
            raise StoreError(op, key, losing[0].error_type, "injected lost reply", ambiguous=True)
        return result

    def put(self, key: str, data: bytes) -> None:
        self._run("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._run("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def get(self, key: str) -> bytes:
        return self._run("get", key, lambda: self.inner.get(key))

    def exists(self, key: str) -> bool:
        return self._run("exists", key, lambda: self.inner.exists(key))

    def list(self, prefix: str) -> builtins.list[str]:
        return self._run("list", prefix, lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.inner.delete(key))
