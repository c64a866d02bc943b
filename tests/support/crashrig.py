"""What the SIGKILL campaigns against a real ``ourios serve`` share (``tests/crash/``).

A campaign starts a node on a data directory, loads it, kills it, starts the next one on
the same directory and at the end reads back what the store holds. The pieces here are
the ones every such test wrote for itself: the cadences that keep cuts, rotations and
reclamation running all the time, the printed seed a failing run is repeated with, the
probe a served interpreter loads as ``sitecustomize``, a killed process's release, and
reading the published rows and the snapshot horizons back from the data directory.
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from app.ingest.snapshot_store import decode_snapshot
from tests.support.serve import ROOT, ServeProcess

#: No cut and no reclamation while the test runs (a day's cadences), so a restart after
#: a SIGKILL replays every frame written so far; small segments, a 1 s flush age.
NO_CUT_ENV = {
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",
    "OURIOS_WAL_BARRIER_SECS": "86400",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "86400",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
}

#: The shortest cadences the configuration accepts (1 s), so cuts, rotations and
#: reclamation run all the time; small segments and flushes so each happens often.
CYCLE_ENV = {
    "OURIOS_WAL_BARRIER_SECS": "1",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
    "OURIOS_WAL_SEGMENT_AGE_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_SINK_FLUSH_BYTES": "4096",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "20",
}


def seed_from(var: str) -> int:
    """The run's seed: ``$var`` when set (to rerun one), else a fresh one; printed so a
    failing run names the value that repeats it."""
    raw = os.environ.get(var)
    seed = int(raw) if raw else random.SystemRandom().randrange(2**32)
    print(f"{var}={seed}")
    return seed


def write_probe(probe_dir: Path, source: str) -> dict[str, str]:
    """Write ``source`` as the ``sitecustomize`` of the node a test starts and return the
    environment that loads it: only that process's ``PYTHONPATH`` has the directory, so
    no other interpreter ever runs the probe."""
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(source)
    return {"PYTHONPATH": f"{probe_dir}{os.pathsep}{ROOT}"}


def release(serve: ServeProcess) -> None:
    """The process is gone and its stderr pipe closed (``ServeProcess`` leaves it open,
    a ResourceWarning, an error under ``filterwarnings = error``)."""
    serve.kill()
    if serve.proc is not None and serve.proc.stderr is not None:
        serve.proc.stderr.close()


def lsn_of(offset: object) -> int:
    """The LSN of an offset as events print it (``"<lsn>@<uuid>"``), -1 for None."""
    return -1 if offset is None else int(str(offset).partition("@")[0])


def store_objects(data_dir: Path) -> set[Path]:
    """Every records and audit object the local store under ``data_dir`` holds."""
    root = data_dir / "objects"
    return set(root.glob("records/tenant=*/date=*/*.parquet")) | set(
        root.glob("audit/tenant=*/date=*/*.parquet")
    )


def snapshot_horizons(data_dir: Path) -> dict[str, int]:
    """Each tenant's installed snapshot horizon S (LSN), as the next start will load it."""
    out: dict[str, int] = {}
    for path in sorted((data_dir / "snapshots").glob("*.snap")):
        state = decode_snapshot(path.read_bytes(), path)
        out[state.tenant] = state.horizon.lsn
    return out


@dataclass(frozen=True)
class Row:
    """One published row, as much of it as the campaigns check."""

    kind: str  # "records" or "audit"
    tenant: str
    wal_lsn: int
    rid: str | None  # records only: the load's record id attribute
    template_id: int
    change: str | None = None  # audit only


def read_rows(paths: Iterable[Path]) -> list[Row]:
    rows: list[Row] = []
    for path in sorted(paths):
        table = pq.read_table(io.BytesIO(path.read_bytes()))
        cols = table.to_pydict()
        if "records" in path.parts:
            for tenant, lsn, attrs, tid in zip(
                cols["tenant"],
                cols["wal_lsn"],
                cols["attributes"],
                cols["template_id"],
                strict=True,
            ):
                rows.append(Row("records", tenant, lsn, dict(attrs).get("rid"), tid))
        else:
            for tenant, lsn, tid, change in zip(
                cols["tenant"], cols["wal_lsn"], cols["template_id"], cols["change"], strict=True
            ):
                rows.append(Row("audit", tenant, lsn, None, tid, change))
    return rows
