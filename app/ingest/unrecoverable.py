"""A tenant the settlement cannot rebuild, refused as unrecoverable (the settlement's
"unrecoverable", ``app.ingest.settlement``): its terminal PUBLISHED entry, its entries out
of the clamp set, its appends refused, ``tenant.unrecoverable`` once. Every other tenant
continues."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from app.ingest.settle_parts import SettleParts
from app.ingest.unmined import EntryState, SettleOutcome, SettleResult, UnminedEntry, lower
from wal import ConsumerMode, PublishedMarks, WalOffset

log = logging.getLogger("ourios.settlement")


class Unrecoverable:
    """Refuses a tenant for good, with the parts it was given."""

    def __init__(self, parts: SettleParts) -> None:
        self._journal = parts.journal
        self._exclusion = parts.exclusion
        self._miner_lock = parts.miner_lock
        self._tenants = parts.tenants
        self._ledger = parts.ledger
        self._pipeline = parts.pipeline
        self._events = parts.events

    def if_reclaimed(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        claim_x: WalOffset | None,
        horizon: WalOffset | None,
    ) -> SettleOutcome | None:
        """The refusal when RECLAIM took frames above the horizon the rebuild starts from
        (its template state cannot be rebuilt from the WAL); None when it can."""
        reclaimed = self._journal.reclaimed_through(tenant)
        if (
            reclaimed is not None
            and reclaimed[0] is ConsumerMode.KNOWN
            and (horizon is None or horizon.lsn < reclaimed[1].lsn)
        ):
            have = "no restorable snapshot" if horizon is None else f"a snapshot at {horizon}"
            return self.refuse(
                tenant,
                entries,
                done,
                claim_x,
                f"it has {have}, but RECLAIM records its frames reclaimed through "
                f"{reclaimed[1]}; its template state cannot be rebuilt from the WAL (a restart "
                f"halts naming it)",
                {
                    "reason": "reclaimed",
                    "horizon": None if horizon is None else str(horizon),
                    "reclaimed_through": str(reclaimed[1]),
                },
            )
        return None

    def refuse(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        claim_x: WalOffset | None,
        detail: str,
        fields: Mapping[str, object],
    ) -> SettleOutcome:
        """The tenant cannot be rebuilt (module docstring): isolate it. Its terminal
        PUBLISHED entry is durable before its entries leave the clamp set; it claims no
        more than a start-up replay's gates (the rows above them are not all durable)."""
        records, audit = claim_x, claim_x
        for e in entries:
            if e.gates is not None:
                records = lower(records, e.gates.records)
                audit = lower(audit, e.gates.audit)
        self._journal.publish_marks({tenant: PublishedMarks(records, audit, terminal=True)})
        with self._exclusion.exclusive():
            with self._miner_lock:
                for e in entries:
                    e.state = EntryState.REFUSED
                self._pipeline.refuse_tenant(tenant, detail)
                self._pipeline.recompute_durable()
        done.set()
        first = self._tenants.set_unrecoverable(tenant, detail)
        self._tenants.settled(tenant, installed=False)
        self._ledger.refuse(tenant)
        if first:
            self._events(
                "tenant.unrecoverable",
                {"tenant": tenant, **fields, "frame": str(entries[0].span.offset)},
            )
        log.error("tenant %r is unrecoverable: %s", tenant, detail)
        return SettleOutcome(tenant, SettleResult.UNRECOVERABLE, error=detail)
