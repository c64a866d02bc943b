"""Segment-set seed deliverable 10, adapted: reclamation never removes what the checkpoint
and every tenant's snapshot horizon do not cover, while appends run concurrently.

Writers append for three tenants on their own threads; the test thread plays barrier and
housekeeper — it advances the checkpoint to an acknowledged mark and each tenant's
horizon to one of its acknowledged frames (seeded, monotonic), then runs a pass. After
every pass, each acknowledged frame whose segment is gone must be at or below both the
checkpoint and its tenant's horizon; at the end every frame above its horizon replays.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.walkit import SMALL, payload, seeded
from wal import Journal, KnownHorizons, OsFs, WalOffset
from wal.scan import list_root

TENANTS = ("a", "b", "c")
PER_WRITER = 60


def test_seg10_reclamation_never_outruns_the_checkpoint_or_a_horizon_under_load(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    rng = seeded(10)
    acked: list[tuple[str, WalOffset]] = []
    lock = threading.Lock()
    sizes = {t: [rng.randint(500, 9000) for _ in range(PER_WRITER)] for t in TENANTS}
    j = Journal.open(root, SMALL)

    def writer(tenant: str) -> None:
        for i, size in enumerate(sizes[tenant]):
            out = j.commit(tenant, payload(i, size))
            with lock:
                acked.append((tenant, out.offset))

    threads = [threading.Thread(target=writer, args=(t,)) for t in TENANTS]
    for t in threads:
        t.start()
    horizons: dict[str, WalOffset] = {}
    mark: WalOffset | None = None
    passes = removed = 0
    try:
        while any(t.is_alive() for t in threads) or passes < 3:
            with lock:
                seen = list(acked)
            if not seen:
                continue
            latest = max(seen, key=lambda a: a[1].lsn)[1]
            if mark is None or latest.lsn > mark.lsn:
                j.checkpoint(latest)
                mark = latest
            for tenant in TENANTS:
                mine = [o for t, o in seen if t == tenant and o.lsn <= mark.lsn]
                if mine:
                    pick = mine[rng.randrange(len(mine))]
                    if tenant not in horizons or pick.lsn > horizons[tenant].lsn:
                        horizons[tenant] = pick
            progress = j.maintain(KnownHorizons(dict(horizons)), 4)
            passes += 1
            removed += progress.removed_segments
            alive = {f.header.uuid for f in list_root(OsFs(), root).segments}
            for tenant, offset in seen:
                if offset.segment in alive:
                    continue
                assert offset.lsn <= mark.lsn, f"{offset} unlinked above the checkpoint {mark}"
                h = horizons.get(tenant)
                assert h is not None and offset.lsn <= h.lsn, (
                    f"{tenant}'s frame {offset} unlinked above its horizon {h}"
                )
    finally:
        for t in threads:
            t.join()
        j.close()
    assert removed > 0, "the test never reclaimed anything: it proves nothing"
    with Journal.open(root, SMALL) as again:
        replayed = {f.offset for f in again.replay()}
    for tenant, offset in acked:
        if offset.lsn > horizons[tenant].lsn:
            assert offset in replayed, f"{tenant}'s frame {offset} above its horizon was lost"
