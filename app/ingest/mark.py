"""The mark: what a cut captures and stamps (RFC 0052 §3.1, RFC 0055 §9.4).

``latest`` is the latest acknowledged (and mined) turn's own frame end — never the
fsync's EOF; ``last_durable`` is the mark, ``latest`` clamped below every unmined
entry (a frame whose mining raised, until settlement rebuilds its tenant), so no cut
stamps past a frame whose rows and events were never buffered. Both change under
``lock`` (the pipeline's last lock, DESIGN.md §5.3): a turn advances ``latest`` there,
a failed turn or replay adds its entry there, a settlement recomputes there.
"""

from __future__ import annotations

import threading
from typing import Final

from app.ingest.settlement import ReplayGates, UnminedEntry, UnminedSet
from wal import FrameSpan, WalOffset

__all__ = ["AT_LATEST", "DurableMark"]


class _AtLatest:
    """The clamp of an entry a turn records: the latest acknowledged offset."""


#: ``add_unmined``'s default clamp: the previous acknowledged turn's frame end.
AT_LATEST: Final = _AtLatest()


class DurableMark:
    """The mark and the unmined entries that clamp it (module docstring)."""

    def __init__(self, unmined: UnminedSet) -> None:
        self.lock = threading.Lock()
        self.unmined = unmined
        #: the mark: the latest acknowledged offset, clamped below every unmined entry
        self._last_durable: WalOffset | None = None
        #: the latest acknowledged turn's own frame end, unclamped
        self._latest: WalOffset | None = None

    @property
    def current(self) -> WalOffset | None:
        """The mark without the lock: for the turn and a cut's capture, which read it
        under the exclusion, where nothing else moves it."""
        return self._last_durable

    def advance_locked(self, offset: WalOffset) -> None:
        """A turn was acknowledged and mined at ``offset`` (``lock`` held)."""
        self._latest = offset
        self._recompute_locked()

    def add_unmined(
        self,
        span: FrameSpan,
        tenant: str,
        clamp: WalOffset | None | _AtLatest = AT_LATEST,
        gates: ReplayGates | None = None,
    ) -> UnminedEntry:
        """Record a frame whose mining raised, clamped at ``clamp`` (by default the
        previous acknowledged offset), and hold the mark below it."""
        with self.lock:
            at = self._latest if isinstance(clamp, _AtLatest) else clamp
            entry = UnminedEntry(span, tenant, at, gates=gates)
            self.unmined.add(entry)
            self._recompute_locked()
        return entry

    def recompute(self) -> None:
        with self.lock:
            self._recompute_locked()

    def _recompute_locked(self) -> None:
        """``last_durable = min(latest, clamp)`` while any entry clamps (None stays None)."""
        clamped, clamp = self.unmined.clamp()
        latest = self._latest
        if not clamped:
            self._last_durable = latest
        elif clamp is None or latest is None:
            self._last_durable = None
        else:
            self._last_durable = latest if latest.lsn <= clamp.lsn else clamp

    @property
    def last_durable(self) -> WalOffset | None:
        """The mark a cut captures: the latest acknowledged offset, clamped."""
        with self.lock:
            return self._last_durable

    @property
    def latest(self) -> WalOffset | None:
        """The latest acknowledged (and mined) turn's own frame end, never clamped."""
        with self.lock:
            return self._latest
