"""RFC0052.10 — no acknowledged record is lost across the whole cycle, and recovery
republishes nothing at or below its gates (seed 000 §3.7 "Recovery gains the
Parquet-side gate", DESIGN.md §5.8, §6, §13).

Four tests:

- ``..._sigkill_at_random_points``: real ``ourios serve`` processes with the barrier,
  housekeeping and segment-age cadences at 1 s (the issue says 100 ms; 1 s is the
  minimum ``docs/CONFIG.md`` validates) under concurrent load (``tests.support.ackload``),
  SIGKILLed after K acknowledged requests (K drawn from the seed), restarted on the same
  data directory, stopped at the end with SIGTERM (the final cut flushes and
  checkpoints). Every acknowledged record is in the store, and no restart republished a
  record at or below max(X, S) of its tenant or an audit event at or below X: for each
  restart, X is ``recovery.done``'s ``checkpoint``, S is read from ``snapshots/*.snap``
  before the start, and the objects the instance published (the listing after it minus
  the listing before it) must hold no row with ``wal_lsn`` at or below the gate. A live
  frame of the instance lies above the WAL's end at its start, so such a row can only be
  a republished one. Reclamation must have happened (segments unlinked, RECLAIM entries).
- ``..._sigkill_inside_cut_and_file_half``: the same properties, with every kill placed
  inside the window this RFC introduces: mid-flush of a barrier cut, mid-snapshot-install,
  between the snapshot installs and the CHECKPOINT write (a real-process S > X), and
  mid-unlink of a housekeeping file half (RECLAIM written, segments half unlinked); and
  once after a failed snapshot install whose cut still checkpointed (a real-process
  tenant with frames in (S, X], the incident's shape), before the next cut repairs it.
- ``..._s_above_x`` and ``..._s_below_x``: the two orderings built in-process
  (``NodeRig``: real journal, barrier, snapshots on a ``FaultyFs``), crashed and
  recovered by the same ``recover()``: a failed CHECKPOINT rename after the snapshot
  installed (S > X), and a failed ``.snap.tmp`` open while the checkpoint advanced
  (S < X). Exact record ids, offsets and counters; the audit stream is compared with a
  reference ``TenantMiner`` restored from the same snapshot bytes (``CountingAllocator``
  ids, matched up to one consistent renaming) and fed the same frames in the same order.
  Every (S, X] event is suppressed, as DESIGN.md §13 says, except the seed's 2026-10-06
  amendment, which recovery implements: an (S, X] event of a template this replay
  minted afresh (an id no published event binds) is forwarded once, so every
  republished template id has its audit event. The real-process rounds allow exactly
  that exception: an audit row at or below X is a failure unless its template id is
  bound by no audit row published before the start.

How the kills are placed and observed: the test writes a small probe, loaded by the
served interpreter as ``sitecustomize`` (only that process's ``PYTHONPATH`` has it). It
reports, as datagrams on an abstract Unix socket, the barrier's named sync points
(``app.points``), each cut's entry and exit, each store put of the barrier thread, each
snapshot temp and CHECKPOINT temp open, and each housekeeping file half and segment
unlink. With ``RFC0052_10_HOLD=<where>:<n>`` it holds the thread at the n-th such step
and says so; the test SIGKILLs the process when that message arrives, so the kill lands
inside the window by construction, with no sleep anywhere. With
``RFC0052_10_FAIL=snap:<n>`` the n-th snapshot temp open raises EIO (as ``FaultyFs``
would in process) and the cut after the next checkpointing one is held. Otherwise the
probe only observes and holds; it changes no behaviour.

The seed is printed; set ``RFC0052_10_SEED`` to rerun one.
"""

from __future__ import annotations

import io
import json
import os
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import TenantMiner
from app.ingest.snapshot_store import decode_snapshot
from app.receive.otlp import decode_request, flatten
from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import (
    CYCLE_ENV,
    Row,
    lsn_of,
    read_rows,
    release,
    seed_from,
    snapshot_horizons,
    store_objects,
    write_probe,
)
from tests.support.noderig import NodeRig, bodies_request
from tests.support.scrape import try_scrape
from tests.support.serve import ServeProcess
from wal.inspection import inspect_root

TENANTS = ("acme", "globex", "initech")

#: Where a kill can be placed (module docstring): the steps the probe holds a thread at,
#: and "snapfail" (a failed snapshot install, then a checkpoint, then the kill).
HOLDS = ("flush", "snap", "ckpt", "unlink", "snapfail")

_PROBE_SOURCE = '''"""Probe for tests/crash/test_recovery_gates_sigkill.py, loaded as sitecustomize
by the ourios serve that test starts: reports steps of the barrier and housekeeping threads as
datagrams and, with RFC0052_10_HOLD=<where>:<n>, holds the n-th such step."""

import errno
import json
import os
import socket
import threading


def _install(address):
    from app import points
    from app.cadence import cut_runner
    from sink import store
    from wal import fs as walfs
    from wal import reclamation

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(10)
    lock = threading.Lock()
    where, _, nth = os.environ.get("RFC0052_10_HOLD", "").partition(":")
    fail_where, _, fail_nth = os.environ.get("RFC0052_10_FAIL", "").partition(":")
    seen = {}
    #: "failed": the injected failure happened; "armed": a cut checkpointed after it
    state = {}

    def send(probe, **fields):
        fields["probe"] = probe
        fields["thread"] = threading.current_thread().name
        data = json.dumps(fields).encode()
        with lock:
            try:
                sock.sendto(data, address)
            except OSError:
                pass

    def reach(step, **fields):
        with lock:
            n = seen[step] = seen.get(step, 0) + 1
        send(step, n=n, **fields)
        if step == where and n == int(nth):
            send("held", at=step, n=n)
            threading.Event().wait(120)  # until the test's SIGKILL

    hit = points.hit

    def probe_hit(name):
        if name.startswith("barrier."):
            send("point", name=name)
        hit(name)

    points.hit = probe_hit

    run_cut = cut_runner.CutRunner.run_cut

    def probe_run_cut(self, cut):
        if state.get("armed") and threading.current_thread().name == "ourios-barrier":
            # The next cut would install the snapshot that failed: hold it off.
            send("held", at="after_snapfail", n=1)
            threading.Event().wait(120)  # until the test's SIGKILL
        mark = None if cut.mark is None else cut.mark.lsn
        send("cut.enter", epoch=cut.epoch, reason=cut.reason, mark=mark)
        outcome = run_cut(self, cut)
        send("cut.exit", epoch=outcome.epoch, ok=outcome.ok, checkpointed=outcome.checkpointed)
        if state.get("failed") and outcome.checkpointed:
            state["armed"] = True
        return outcome

    cut_runner.CutRunner.run_cut = probe_run_cut

    put = store.LocalStore.put

    def probe_put(self, key, data):
        # a cut's flush runs on the barrier thread or on the cut's own lanes
        name = threading.current_thread().name
        if name == "ourios-barrier" or name.startswith("ourios-flush-"):
            reach("flush", key=key)
        return put(self, key, data)

    store.LocalStore.put = probe_put

    fs_open = walfs.OsFs.open

    def probe_open(self, path, flags, mode=0o644):
        if threading.current_thread().name == "ourios-barrier":
            if path.name.endswith(".snap.tmp"):
                reach("snap", path=path.name)
                if fail_where == "snap" and seen["snap"] == int(fail_nth):
                    state["failed"] = True
                    send("failed", at="snap", path=path.name)
                    raise OSError(errno.EIO, "injected by the RFC0052.10 probe", str(path))
            elif path.name == "CHECKPOINT.tmp":
                reach("ckpt")
        return fs_open(self, path, flags, mode)

    walfs.OsFs.open = probe_open

    fs_unlink = walfs.OsFs.unlink

    def probe_unlink(self, path):
        if threading.current_thread().name == "ourios-housekeeping" and path.name.endswith(
            ".wal"
        ):
            reach("unlink", path=path.name)
        return fs_unlink(self, path)

    walfs.OsFs.unlink = probe_unlink

    execute = reclamation.Reclamation.execute

    def probe_execute(self, plan):
        busy = bool(plan.segments or plan.partials or plan.write_record)
        if busy:
            send("file_half.enter", segments=len(plan.segments), record=plan.write_record)
        outcome = execute(self, plan)
        if busy:
            send("file_half.exit", removed=len(outcome.removed))
        return outcome

    reclamation.Reclamation.execute = probe_execute
    send("probe.ready", pid=os.getpid())


if os.environ.get("RFC0052_10_PROBE"):
    _install("\\0" + os.environ["RFC0052_10_PROBE"])
'''


class ProbeLog:
    """Receives the probe's datagrams on an abstract Unix socket (no file, no path
    length limit); ``wait_for`` blocks on a condition the reader thread notifies."""

    def __init__(self) -> None:
        self.name = f"ourios-rfc0052-10-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + self.name)
        self._cond = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self._markers = 0
        self._thread = threading.Thread(target=self._read, name="rfc0052-10-probe", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            data = self._sock.recv(65536)
            if data == b"stop":
                return
            if data == b"marker":
                with self._cond:
                    self._markers += 1
                    self._cond.notify_all()
                continue
            event = json.loads(data)
            with self._cond:
                self._events.append(event)
                self._cond.notify_all()

    def _send_self(self, data: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(data, "\0" + self.name)

    def wait_for(self, probe: str, timeout: float) -> dict[str, Any]:
        """The first event named ``probe`` of the current instance (raises on timeout)."""
        with self._cond:
            found: list[dict[str, Any]] = []

            def seen() -> bool:
                found[:] = [e for e in self._events if e["probe"] == probe]
                return bool(found)

            if not self._cond.wait_for(seen, timeout):
                raise TimeoutError(f"the probe never reported {probe!r} in {timeout:g} s")
            return found[0]

    def take(self) -> list[dict[str, Any]]:
        """Every event of the instance just ended. The datagram queue is FIFO, so once a
        marker sent after the kill is read, everything the dead process sent is too."""
        with self._cond:
            target = self._markers + 1
        self._send_self(b"marker")
        with self._cond:
            if not self._cond.wait_for(lambda: self._markers >= target, 30):
                raise TimeoutError("the probe socket's reader is stuck")
            events, self._events = self._events, []
        return events

    def close(self) -> None:
        self._send_self(b"stop")
        self._thread.join(10)
        self._sock.close()


def _landed(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the process was when it died: ``cut:<phase>`` for a barrier cut running,
    ``file_half`` for a housekeeping file half; empty when neither."""
    phase = ""
    file_half = False
    phases = {
        "barrier.before_flush": "flush",
        "barrier.after_flush": "prior_publishes",
        "barrier.before_stamp": "stamp",
    }
    for e in events:
        name = e["probe"]
        if name == "cut.enter" and e["thread"] == "ourios-barrier":
            phase = "serialize"
        elif name == "point" and phase and e["name"] in phases:
            phase = phases[e["name"]]
        elif name == "snap" and phase:
            phase = "stamp:snapshots"
        elif name == "ckpt" and phase:
            phase = "stamp:checkpoint"
        elif name == "cut.exit" and e["thread"] == "ourios-barrier":
            phase = ""
        elif name == "file_half.enter":
            file_half = True
        elif name == "file_half.exit":
            file_half = False
    return ([f"cut:{phase}"] if phase else []) + (["file_half"] if file_half else [])


# -- what the store and the data directory hold ----------------------------------------------


def _rid_round(rid: str | None) -> int:
    """The ackload round of a record id ``r<round>-s..``; 0 when it is not one."""
    if not rid or not rid.startswith("r"):
        return 0
    head = rid[1:].partition("-")[0]
    return int(head) if head.isdigit() else 0


def _metric(serve: ServeProcess, name: str) -> float | None:
    s = try_scrape(serve)
    return s.value(name) if s else None


# -- the real-process campaign ---------------------------------------------------------------


@dataclass
class Round:
    number: int
    mode: str  # "random", a hold from HOLDS, or "sigterm"
    recovery: dict[str, Any]
    x: int  # the checkpoint LSN this start recovered with (-1: none)
    s: dict[str, int]  # tenant -> snapshot horizon LSN this start recovered with
    hold_nth: int = 0
    kill_after: int = 0
    acked_at_signal: int = 0
    segments_at_signal: float | None = None
    landed: list[str] = field(default_factory=list)
    unlinks: int = 0  # segments the probe saw housekeeping unlink
    cuts_checkpointed: int = 0
    new_rows: list[Row] = field(default_factory=list)
    planned_after: int = 0  # RECLAIM planned entries left by the kill
    #: template ids some audit event published before this start binds
    bound_before: set[int] = field(default_factory=set)

    def republished(self) -> int:
        """Rows of earlier rounds this instance published (replays above the gates)."""
        return sum(1 for r in self.new_rows if r.rid and _rid_round(r.rid) < self.number)

    def below_gate(self) -> list[Row]:
        """Rows this instance published at or below its gates: must be none. The one
        exception (RFC0052.10's 2026-10-06 amendment, implemented by recovery): an
        event at or below X of a template this replay minted afresh, which no event
        published before binds — its id is new, so it cannot duplicate anything."""
        out = []
        for r in self.new_rows:
            gate = self.x if r.kind == "audit" else max(self.x, self.s.get(r.tenant, -1))
            if r.wal_lsn > gate:
                continue
            if r.kind == "audit" and r.template_id not in self.bound_before:
                continue  # minted afresh by this replay
            out.append(r)
        return out


@dataclass
class Campaign:
    data_dir: Path
    probe_env: Mapping[str, str]
    probe: ProbeLog
    seed: int
    env: Mapping[str, str]
    senders: int = 6
    ack_window: tuple[int, int] = (150, 600)
    ledger: AckLedger = field(default_factory=AckLedger)
    rounds: list[Round] = field(default_factory=list)

    def run(self, modes: Sequence[str]) -> None:
        rng = random.Random(self.seed)
        for mode in [*modes, "sigterm"]:
            self._round(rng, mode)

    def _round(self, rng: random.Random, mode: str) -> None:
        before = store_objects(self.data_dir)
        horizons = snapshot_horizons(self.data_dir)
        env = {**self.env, **self.probe_env, "RFC0052_10_PROBE": self.probe.name}
        nth = 0
        if mode == "snapfail":
            nth = rng.randint(1, 3)
            env["RFC0052_10_FAIL"] = f"snap:{nth}"
        elif mode in HOLDS:
            nth = rng.randint(1, {"flush": 4, "snap": 3, "ckpt": 2, "unlink": 2}[mode])
            env["RFC0052_10_HOLD"] = f"{mode}:{nth}"
        serve = ServeProcess(self.data_dir, env)
        try:
            with serve:
                recovery = serve.event("recovery.done")
                assert len(recovery) == 1, f"seed {self.seed}: {recovery}\n{serve.tail()}"
                self.probe.wait_for("probe.ready", 30)
                r = Round(
                    len(self.rounds) + 1,
                    mode,
                    recovery[0],
                    lsn_of(recovery[0]["checkpoint"]),
                    horizons,
                    hold_nth=nth,
                )
                self.rounds.append(r)
                self._serve(serve, rng, r)
        finally:
            release(serve)
        events = self.probe.take()
        r.landed = _landed(events) if mode != "sigterm" else []
        r.unlinks = sum(1 for e in events if e["probe"] == "unlink")
        r.cuts_checkpointed = sum(
            1 for e in events if e["probe"] == "cut.exit" and e["checkpointed"]
        )
        reclaim = inspect_root(self.data_dir / "wal").reclaim
        r.planned_after = 0 if reclaim is None else len(reclaim.planned)
        r.new_rows = read_rows(store_objects(self.data_dir) - before)
        r.bound_before = {
            row.template_id
            for row in read_rows(path for path in before if "audit" in path.parts)
            if row.template_id is not None
        }

    def _serve(self, serve: ServeProcess, rng: random.Random, r: Round) -> None:
        with AckLoad(
            self.ledger,
            serve.http_port,
            senders=self.senders,
            tenants=TENANTS,
            seed=rng.getrandbits(64),
        ) as load:
            assert load.round == r.number
            if r.mode in HOLDS:
                try:
                    held = self.probe.wait_for("held", 30)
                except TimeoutError:
                    pytest.fail(
                        f"seed {self.seed} round {r.number}: the probe never reached"
                        f" {r.mode}:{r.hold_nth} ({load.acked} acks)\n{serve.tail()}"
                    )
                assert held["at"] == ("after_snapfail" if r.mode == "snapfail" else r.mode), held
            else:
                r.kill_after = rng.randint(*self.ack_window)
                got = load.wait_acked(r.kill_after, timeout=30)
                assert got >= r.kill_after, (
                    f"seed {self.seed} round {r.number}: the load stopped after {got} acks"
                    f" of {r.kill_after}: {self.ledger.summary()} {self.ledger.details()}"
                    f"\n{serve.tail()}"
                )
            r.segments_at_signal = _metric(serve, "ourios_wal_segments")
            r.acked_at_signal = load.acked
            if r.mode == "sigterm":
                # Reclamation is part of the cycle: the last instance stops only after
                # its housekeeping unlinked a segment (a timeout here means it never did).
                self.probe.wait_for("unlink", 30)
                load.stop()
                serve.wait_turned()  # a stop leaves the unturned to the WAL (exit 75)
                code = serve.terminate()
                assert code == 0, f"seed {self.seed}: exit {code}\n{serve.tail()}"
                stopped = serve.event("server.stopped")
                assert stopped and stopped[0]["rows_left_in_wal"] == 0, serve.tail()
                assert stopped[0]["final_cut_ok"] is True, serve.tail()
            else:
                serve.kill()
                load.join()

    def report(self) -> str:
        lines = [f"seed {self.seed}: {len(self.rounds)} rounds"]
        for r in self.rounds:
            how = f"hold {r.mode}:{r.hold_nth}" if r.mode in HOLDS else f"{r.mode} K={r.kill_after}"
            rec = {
                k: r.recovery.get(k)
                for k in ("frames", "frames_skipped", "records_replayed", "records_suppressed")
            }
            lines.append(
                f"  round {r.number}: {how}, {r.acked_at_signal} acks, X={r.x},"
                f" S={dict(sorted(r.s.items()))}, recovery {rec};"
                f" landed {r.landed or ['outside a cut and a file half']};"
                f" segments {r.segments_at_signal}, unlinked {r.unlinks},"
                f" cuts checkpointed {r.cuts_checkpointed}, planned left {r.planned_after};"
                f" republished above the gates {r.republished()},"
                f" at or below {len(r.below_gate())}"
            )
        return "\n".join(lines)

    def check(self) -> str:
        """The properties of the module docstring; returns the report."""
        report = self.report()
        print(report)
        for r in self.rounds[1:]:
            bad = r.below_gate()
            assert not bad, (
                f"{report}\nround {r.number} (X={r.x}, S={r.s}) republished {len(bad)} rows at"
                f" or below its gates max(X, S) (records) / X (audit); first: {bad[:5]}"
            )
        rows = [r for r in read_rows(store_objects(self.data_dir)) if r.kind == "records"]
        present = Counter(r.rid for r in rows if r.rid)
        acked = self.ledger.rids(Outcome.ACKED)
        missing = sorted(acked - present.keys())
        assert not missing, (
            f"{report}\n{len(missing)} of {len(acked)} acknowledged records are not in the"
            f" store; first: {missing[:10]}"
        )
        maybe = self.ledger.rids(Outcome.ACKED, Outcome.REFUSED, Outcome.UNKNOWN)
        never_sent = sorted(present.keys() - maybe)
        assert not never_sent, f"{report}\nids never sent: {never_sent[:10]}"
        # Reclamation ran: segments were unlinked, RECLAIM carries reclaimed_through for
        # tenants, and the first segment of the run is gone.
        unlinked = sum(r.unlinks for r in self.rounds)
        wal = inspect_root(self.data_dir / "wal")
        assert wal.ok, f"{report}\n{wal.problems}"
        assert wal.reclaim is not None and wal.reclaim.entries, f"{report}\n{wal.reclaim}"
        assert all(t.lsn > 0 for _, t in wal.reclaim.entries.values()), wal.reclaim.entries
        assert unlinked > 0 and wal.segments and wal.segments[0].base_lsn > 0, (
            f"{report}\nno segment was reclaimed ({unlinked} unlinks seen)"
        )
        dup = sum(c - 1 for c in present.values() if c > 1)
        most = max((r.segments_at_signal or 0) for r in self.rounds)
        print(
            f"{len(acked)} acknowledged records, all present; {dup} extra copies (all above"
            f" the gates); {unlinked} segments reclaimed, {len(wal.segments)} left, at most"
            f" {most:g} live at a signal"
        )
        return report


@pytest.fixture
def campaign(tmp_path: Path) -> Iterator[Callable[..., Campaign]]:
    probe_env = write_probe(tmp_path / "probe", _PROBE_SOURCE)
    probe = ProbeLog()

    def make(**kwargs: Any) -> Campaign:
        return Campaign(tmp_path / "data", probe_env, probe, **kwargs)

    try:
        yield make
    finally:
        probe.close()


def test_rfc0052_10_sigkill_at_random_points_loses_nothing_and_republishes_nothing_gated(
    campaign: Callable[..., Campaign],
) -> None:
    started = time.monotonic()
    c = campaign(seed=seed_from("RFC0052_10_SEED"), env=CYCLE_ENV, ack_window=(200, 900))
    c.run(["random"] * 6)
    c.check()
    inside = [r for r in c.rounds[:-1] if r.landed]
    print(
        f"{len(inside)} of {len(c.rounds) - 1} random kills landed inside a cut or a file"
        f" half: {[(r.number, r.landed) for r in inside]}; {time.monotonic() - started:.1f} s"
    )


def test_rfc0052_10_sigkill_inside_cut_and_file_half_loses_nothing_and_republishes_nothing_gated(
    campaign: Callable[..., Campaign],
) -> None:
    started = time.monotonic()
    seed = seed_from("RFC0052_10_SEED")
    modes = list(HOLDS) * 2
    random.Random(seed).shuffle(modes)
    # A larger size trigger leaves more for each cut to flush.
    c = campaign(seed=seed, env={**CYCLE_ENV, "OURIOS_SINK_FLUSH_BYTES": "16384"})
    c.run(modes)
    c.check()
    expected = {
        "flush": "cut:flush",
        "snap": "cut:stamp:snapshots",
        "ckpt": "cut:stamp:checkpoint",
        "unlink": "file_half",
    }
    for r, after in zip(c.rounds[:-1], c.rounds[1:], strict=True):
        if r.mode == "snapfail":
            # The restart after it found a tenant with frames in (S, X]: re-mined into the
            # miner only, its records suppressed (and, per check(), none republished).
            assert after.recovery["records_suppressed"] > 0, f"round {after.number}: {after}"
        else:
            assert expected[r.mode] in r.landed, f"round {r.number} {r.mode}: landed {r.landed}"
    in_cut = sum(1 for r in c.rounds[:-1] if any(p.startswith("cut:") for p in r.landed))
    in_half = sum(1 for r in c.rounds[:-1] if "file_half" in r.landed)
    print(
        f"kills inside a running cut: {in_cut}, inside a housekeeping file half: {in_half},"
        f" of {len(c.rounds) - 1}; {time.monotonic() - started:.1f} s"
    )


# -- S > X and S < X, in process --------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    tenant: str
    lsn: int  # the frame's end (its mark; the rows' wal_lsn)
    rids: tuple[str, ...]
    bodies: tuple[str, ...]


def _ingest(rig: NodeRig, tenant: str, tag: str, bodies: Sequence[str]) -> Frame:
    rids = tuple(f"{tag}/{i}" for i in range(len(bodies)))
    data = bodies_request(tag, bodies).SerializeToString()
    batch = flatten(decode_request(data, "application/x-protobuf"), tenant)
    rig.pipeline.ingest(tenant, data, batch, "test")
    mark = rig.pipeline.last_durable
    assert mark is not None
    return Frame(tenant, mark.lsn, rids, tuple(batch.bodies))


#: Bodies per phase: each phase creates templates of its own and widens earlier ones,
#: so every range of the log carries template events.
PHASES = {
    1: ("user alice logged in from 10.0.0.1", "GET /api/items/17 returned 200 in 3 ms"),
    2: (
        "disk sda1 is 91 percent full on node n1",
        "user bob logged in from 10.0.0.2",
        "cache miss for key 9f3a on shard 4",
    ),
    3: (
        "disk sdb2 is 97 percent full on node n7",
        "cache miss for key 9f3a on shard 4",  # an (S, X] template, unchanged
        "worker carol finished job 12 after 40 ms",
        "GET /api/items/99 returned 404 in 8 ms",
    ),
}


def _phase(rig: NodeRig, phase: int) -> list[Frame]:
    """Two frames per tenant for ``phase``, tenants interleaved."""
    frames = []
    for k in range(2):
        for tenant in ("acme", "globex"):
            bodies = [f"{b} #{k}" if k else b for b in PHASES[phase]]
            frames.append(_ingest(rig, tenant, f"p{phase}-{tenant}-{k}", bodies))
    return frames


Event = tuple[int, int, int, str, str]  # wal_lsn, template id, version, template, change


#: The reference miner's first id: every id at or above it is one it minted afresh.
REFERENCE_FRESH = 1 << 40


def _reference(snapshot: bytes, frames: Sequence[Frame]) -> list[Event]:
    """The events a miner restored from ``snapshot`` mines from ``frames``, in order."""
    miner = TenantMiner.from_snapshot(snapshot, CountingAllocator(first=REFERENCE_FRESH))
    out: list[Event] = []
    for f in frames:
        for e in miner.mine(f.bodies).events:
            out.append((f.lsn, e.template_id, e.version, e.template, e.change))
    return out


def _audit(rig: NodeRig, tenant: str, keys: Iterable[str] | None = None) -> list[Event]:
    rows: list[Event] = []
    for key in sorted(rig.memory.list("audit/") if keys is None else keys):
        for row in pq.read_table(io.BytesIO(rig.memory.get(key))).to_pylist():
            if row["tenant"] == tenant:
                rows.append(
                    (
                        row["wal_lsn"],
                        row["template_id"],
                        row["template_version"],
                        row["template"],
                        row["change"],
                    )
                )
    return rows


def _assert_same_events(actual: Sequence[Event], expected: Sequence[Event], what: str) -> None:
    """Equal event for event, in order, with template ids equal up to one consistent
    renaming (the reference allocates its own ids for templates it creates)."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} events, reference {len(expected)}"
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for a, e in zip(actual, expected, strict=True):
        assert (a[0], a[2], a[3], a[4]) == (e[0], e[2], e[3], e[4]), f"{what}: {a} vs {e}"
        assert forward.setdefault(e[1], a[1]) == a[1], f"{what}: id {e[1]} maps to two ids"
        assert backward.setdefault(a[1], e[1]) == e[1], f"{what}: id {a[1]} maps to two ids"
    lsns = [a[0] for a in actual]
    assert lsns == sorted(lsns), f"{what}: not in frame order: {lsns}"


def _snapshot(rig: NodeRig, tenant: str) -> tuple[int, bytes]:
    path = rig.snapshots.path_of(tenant)
    state = decode_snapshot(path.read_bytes(), path)
    return state.horizon.lsn, state.miner


def _rows_by_rid(rig: NodeRig, keys: Iterable[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for key in keys:
        table = pq.read_table(io.BytesIO(rig.memory.get(key)), columns=["wal_lsn", "attributes"])
        for lsn, attrs in zip(
            table.column("wal_lsn").to_pylist(), table.column("attributes").to_pylist(), strict=True
        ):
            out.setdefault(dict(attrs)["rid"], []).append(lsn)
    return out


def _crash_and_recover(rig: NodeRig) -> tuple[set[str], set[str]]:
    """SIGKILL the rig and recover it; the record and audit keys recovery published."""
    records, audit = set(rig.memory.list("records/")), set(rig.memory.list("audit/"))
    rig.fs.clear_faults()
    rig.restart(crash=True)
    return set(rig.memory.list("records/")) - records, set(rig.memory.list("audit/")) - audit


def test_rfc0052_10_s_above_x_republishes_nothing_at_or_below_s(tmp_path: Path) -> None:
    """The snapshots install, then the CHECKPOINT rename fails: S > X. Nothing in (X, S]
    is re-mined or republished; above X the audit stream is the reference's, once."""
    rig = NodeRig(tmp_path)
    try:
        f1 = _phase(rig, 1)
        first = rig.barrier.step()
        assert first is not None and first.checkpointed, first
        x = rig.journal.last_checkpoint
        assert x is not None and x.lsn == f1[-1].lsn
        s1 = {t: _snapshot(rig, t) for t in ("acme", "globex")}
        f2 = _phase(rig, 2)
        rig.fs.fail("rename", "CHECKPOINT")
        second = rig.barrier.step()
        assert second is not None and second.ok and not second.checkpointed, second
        assert second.snapshots_installed == 2 and "CHECKPOINT" in second.checkpoint_error
        assert rig.journal.last_checkpoint == x
        s = {t: _snapshot(rig, t)[0] for t in ("acme", "globex")}
        assert (
            s == {t: max(f.lsn for f in f2 if f.tenant == t) for t in s} and min(s.values()) > x.lsn
        )
        f3 = _phase(rig, 3)  # buffered only: lost with the process, in the WAL
        new_records, new_audit = _crash_and_recover(rig)
        report = rig.report
        print(f"S > X: X={x.lsn} S={s} recovery {report.fields()}")
        assert report.checkpoint == x
        assert report.frames == len(f1 + f2 + f3)
        assert report.frames_skipped == len(f1 + f2)  # at or below each tenant's S
        assert report.records_suppressed == 0 and report.audit_events_suppressed == 0
        # Records: recovery published exactly the frames above S, once; nothing of (X, S].
        republished = _rows_by_rid(rig, new_records)
        assert sorted(republished) == sorted(rid for f in f3 for rid in f.rids)
        assert all(lsn > s[rid.split("-")[1]] for rid, lsns in republished.items() for lsn in lsns)
        everything = Counter(rig.published_rids())
        assert everything == Counter(rid for f in f1 + f2 + f3 for rid in f.rids)
        # Audit: above X the store holds exactly the reference's events for (X, tail] —
        # (X, S] from the live cut whose checkpoint failed, (S, tail] regenerated — once.
        for tenant in ("acme", "globex"):
            above = [e for e in _audit(rig, tenant) if e[0] > x.lsn]
            mine = [f for f in f2 + f3 if f.tenant == tenant]
            _assert_same_events(above, _reference(s1[tenant][1], mine), f"S > X {tenant}")
            regenerated = _audit(rig, tenant, new_audit)
            assert regenerated and all(e[0] > s[tenant] for e in regenerated), regenerated
    finally:
        rig.close()


def test_rfc0052_10_s_below_x_remines_s_to_x_and_suppresses_it(tmp_path: Path) -> None:
    """acme's ``.snap.tmp`` open fails while the checkpoint advances: S < X. (S, X] feeds
    the miner only — its records and its template events are suppressed and counted,
    except the events of templates replay mints afresh (RFC0052.10's 2026-10-06
    amendment: no published event binds their new ids, so each is forwarded once) — and
    above X records and events are forwarded once, as the reference mines them."""
    rig = NodeRig(tmp_path)
    try:
        f1 = _phase(rig, 1)
        first = rig.barrier.step()
        assert first is not None and first.checkpointed, first
        s_acme, snap_acme = _snapshot(rig, "acme")
        f2 = _phase(rig, 2)
        rig.fs.fail("open", "acme.*.snap.tmp")
        second = rig.barrier.step()
        assert second is not None and second.checkpointed, second
        assert second.snapshot_failures == 1 and second.snapshots_installed == 1, second
        x = rig.journal.last_checkpoint
        assert x is not None and x.lsn == f2[-1].lsn
        assert _snapshot(rig, "acme")[0] == s_acme < x.lsn
        s_globex, snap_globex = _snapshot(rig, "globex")
        assert s_globex == max(f.lsn for f in f2 if f.tenant == "globex")
        f3 = _phase(rig, 3)
        new_records, new_audit = _crash_and_recover(rig)
        report = rig.report
        print(f"S < X: X={x.lsn} S(acme)={s_acme} S(globex)={s_globex} {report.fields()}")
        acme2 = [f for f in f2 if f.tenant == "acme"]
        acme3 = [f for f in f3 if f.tenant == "acme"]
        ref_acme = _reference(snap_acme, acme2 + acme3)
        in_s_x = [e for e in ref_acme if e[0] <= x.lsn]
        assert in_s_x, "the scenario must regenerate template events in (S, X]"
        assert report.checkpoint == x
        # acme re-mines (S, X]; globex skips to its own S, which is X's frame for it.
        assert report.frames_skipped == len(f1) + len(f2) - len(acme2)
        assert report.records_suppressed == sum(len(f.rids) for f in acme2)
        fresh_s_x = [e for e in in_s_x if e[1] >= REFERENCE_FRESH]
        assert report.audit_events_suppressed == len(in_s_x) - len(fresh_s_x)
        republished = _rows_by_rid(rig, new_records)
        assert sorted(republished) == sorted(rid for f in f3 for rid in f.rids)
        assert all(lsn > x.lsn for lsns in republished.values() for lsn in lsns)
        everything = Counter(rig.published_rids())
        assert everything == Counter(rid for f in f1 + f2 + f3 for rid in f.rids)
        # Audit: at or below X only the freshly minted templates' events; above X exactly
        # the reference's events; each once, in frame order.
        order = lambda e: (e[0], e[3], e[2])  # noqa: E731 - frame order, then a stable key
        forwarded = sorted(_audit(rig, "acme", new_audit), key=order)
        expected = sorted(
            [e for e in ref_acme if e[0] > x.lsn or e[1] >= REFERENCE_FRESH], key=order
        )
        _assert_same_events(forwarded, expected, "S < X acme")
        globex3 = [f for f in f3 if f.tenant == "globex"]
        above = [e for e in _audit(rig, "globex") if e[0] > x.lsn]
        _assert_same_events(above, _reference(snap_globex, globex3), "S < X globex")
        assert not _unbound_template_ids(rig, "acme", new_records)
    finally:
        rig.close()


def _unbound_template_ids(rig: NodeRig, tenant: str, keys: Iterable[str]) -> set[int]:
    """Template ids that records republished by recovery carry and no audit event in the
    store names (there must be none: the 2026-10-06 amendment to RFC0052.10 forwards a
    freshly minted template's events whatever the X gate)."""
    ids: set[int] = set()
    for key in keys:
        table = pq.read_table(io.BytesIO(rig.memory.get(key)), columns=["tenant", "template_id"])
        for t, tid in zip(
            table.column("tenant").to_pylist(), table.column("template_id").to_pylist(), strict=True
        ):
            if t == tenant:
                ids.add(tid)
    bound = {e[1] for e in _audit(rig, tenant)}
    return ids - bound
