"""The unmined entries: frames whose mining raised, the clamp they hold the mark at, and
what a settlement of them ends in (``app.ingest.settlement``, RFC 0055 §9.4)."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

from wal import FrameSpan, WalOffset


class EntryState(enum.Enum):
    UNRESOLVED = 1
    SETTLING = 2
    REFUSED = 3  # the tenant is unrecoverable: out of the clamp set


@dataclass(eq=False)
class UnminedEntry:
    """A frame whose mining raised: where it is, whose it is, and the clamp."""

    span: FrameSpan
    tenant: str
    #: the last acknowledged offset when the frame was appended (the previous turn's)
    clamp: WalOffset | None
    state: EntryState = EntryState.UNRESOLVED
    #: the completion signal of the current claim
    done: threading.Event = field(default_factory=threading.Event)
    #: the index of the first record of the frame not known durable (this pipeline
    #: never forwards part of a failed batch, so it is always 0)
    emit_from: int = 0
    failures: int = 0
    error: str = ""
    #: settlements of the entry that failed for a reason no frame explains (a journal
    #: read, ``replace_tenant``): at the bound the tenant is refused as unrecoverable
    unexplained: int = 0
    #: set when a start-up replay recorded the entry: the gates it applied to the tenant
    gates: ReplayGates | None = None


@dataclass(frozen=True, slots=True)
class ReplayGates:
    """The frontiers a start-up replay published a tenant's rows above (None: nothing of
    that side is known published). Its rows between these and a higher frontier were
    buffered by that replay and are dropped with the tenant's buffers, so a settlement of
    its entry re-emits above these, and a terminal entry written for it never claims
    more (``PUBLISHED`` only moves forward)."""

    records: WalOffset | None
    audit: WalOffset | None


def lower(a: WalOffset | None, b: WalOffset | None) -> WalOffset | None:
    """The earlier of two clamps or frontiers (None: nothing, so None wins)."""
    if a is None or b is None:
        return None
    return a if a.lsn <= b.lsn else b


class UnminedSet:
    """The entries (a set, not a slot) and the clamp over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[UnminedEntry] = []

    def add(self, entry: UnminedEntry) -> None:
        with self._lock:
            self._entries.append(entry)

    def remove(self, entries: list[UnminedEntry]) -> None:
        with self._lock:
            self._entries = [e for e in self._entries if e not in entries]

    def of(self, tenant: str) -> list[UnminedEntry]:
        """The tenant's entries that still hold it (not Refused)."""
        with self._lock:
            return [
                e for e in self._entries if e.tenant == tenant and e.state is not EntryState.REFUSED
            ]

    def has(self, tenant: str) -> bool:
        return bool(self.of(tenant))

    def tenants(self) -> set[str]:
        """Tenants with an entry that holds them (Unresolved or Settling)."""
        with self._lock:
            return {e.tenant for e in self._entries if e.state is not EntryState.REFUSED}

    def replayed(self) -> set[str]:
        """Tenants with an entry a start-up replay recorded (gates set), until settled."""
        with self._lock:
            return {e.tenant for e in self._entries if e.gates is not None}

    def clamp(self) -> tuple[bool, WalOffset | None]:
        """(whether any entry clamps, the minimum effective clamp — None stays None)."""
        with self._lock:
            active = [e for e in self._entries if e.state is not EntryState.REFUSED]
        if not active:
            return False, None
        low: WalOffset | None = active[0].clamp
        for e in active[1:]:
            low = lower(low, e.clamp)
        return True, low

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class SettleResult(enum.Enum):
    """How one settlement ended (``SettleOutcome.result``)."""

    NOTHING = 1  # no entry for the tenant
    SETTLED = 2  # rebuilt, swapped in, entries removed
    WAITED = 3  # another trigger held the claim; this one waited for its signal
    UNRECOVERABLE = 4
    FAILED = 5  # an exception inside the settlement: entries back to Unresolved


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    tenant: str
    result: SettleResult
    frames: int = 0
    records: int = 0
    events: int = 0
    dropped: int = 0
    marks_written: bool = False
    error: str = ""


def lsn(offset: WalOffset | None) -> int:
    """An offset's LSN, -1 for None (below every frame)."""
    return -1 if offset is None else offset.lsn


def higher(a: WalOffset | None, b: WalOffset | None) -> WalOffset | None:
    """The later of two frontiers (None: nothing, below every offset)."""
    if a is None:
        return b
    if b is None:
        return a
    return a if a.lsn >= b.lsn else b
