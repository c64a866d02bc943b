"""Helpers for WAL tests: small configs, a ledger of acknowledged frames, reopen+replay."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from wal import AppendError, Fs, Journal, OsFs, WalConfig
from wal.testing import FaultyFs

KiB = 1024

#: The smallest segments the config allows, so a handful of frames rotate.
SMALL = WalConfig(segment_max_bytes=64 * KiB, max_frame_bytes=32 * KiB)


def payload(i: int, size: int = 1000) -> bytes:
    """A recognisable payload for frame ``i``, unique per ``i`` for sizes >= 12."""
    head = f"{i}:".encode()
    filler = f"frame-{i:08d};".encode()
    return (head + filler * (size // len(filler) + 1))[:size]


@dataclass
class Ledger:
    """What a test wrote: every attempted frame and the ones that were acknowledged."""

    acked: list[tuple[str, bytes, int]] = field(default_factory=list)  # tenant, payload, end
    attempted: set[bytes] = field(default_factory=set)

    def commit(self, journal: Journal, tenant: str, data: bytes) -> bool:
        self.attempted.add(data)
        try:
            out = journal.commit(tenant, data)
        except AppendError:
            return False
        self.acked.append((tenant, data, out.offset.lsn))
        return True


def replay_all(root: Path, config: WalConfig = SMALL, fs: Fs | None = None) -> list[bytes]:
    """Reopen the WAL at ``root`` and return every replayed payload, in order."""
    with Journal.open(root, config, fs=fs or OsFs()) as j:
        return [f.payload for f in j.replay()]


def assert_recovers(root: Path, ledger: Ledger, config: WalConfig = SMALL) -> list[bytes]:
    """Every acknowledged frame is replayed, in order; nothing never written appears."""
    replayed = replay_all(root, config)
    acked = [p for _, p, _ in ledger.acked]
    positions = {p: i for i, p in enumerate(replayed)}
    missing = [p[:20] for p in acked if p not in positions]
    assert not missing, f"acknowledged frames lost: {missing[:5]}"
    order = [positions[p] for p in acked]
    assert order == sorted(order), "acknowledged frames replayed out of order"
    unknown = [p[:20] for p in replayed if p not in ledger.attempted]
    assert not unknown, f"frames that were never written: {unknown[:5]}"
    assert len(set(replayed)) == len(replayed), "a frame was replayed twice"
    return replayed


def faulty(tmp_path: Path) -> FaultyFs:
    return FaultyFs(tmp_path / ".shadow")


def seeded(seed: int) -> random.Random:
    return random.Random(seed)
