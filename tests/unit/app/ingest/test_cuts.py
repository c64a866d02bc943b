"""``app.ingest.cuts``: a cut's size is its drained partitions' and its own ids are
theirs, so a cut waits only for publishes registered before its capture; the cut owner
is wired by constructors (a turn's rotation cut, the stall observer, the latch) and the
cut's rooms stay small (issue 25 item 2)."""

from __future__ import annotations

import ast
import time
import uuid
from pathlib import Path
from typing import Any

from app.ingest.cuts import LATCH_CLEAR, Cut
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.pipeline import Pipeline
from app.receive.otlp import decode_request, flatten
from sink.buffers import Buffers
from sink.publisher import Publisher
from sink.testing import MemoryStore
from tests.support.noderig import request
from tests.support.sinkrows import frame_rows
from wal import Journal, WalConfig, WalOffset

DAY = 20_000
PROTOBUF = "application/x-protobuf"


def test_a_cut_is_sized_by_its_partitions_and_owns_their_ids() -> None:
    buffers = Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: 3)
    buffers.add_records("a", DAY, frame_rows("a", DAY, 10), wal_lsn=10, nbytes=700)
    buffers.add_records("b", DAY, frame_rows("b", DAY, 20), wal_lsn=20, nbytes=300)
    prior = buffers.last_id
    drained = buffers.drain_all("barrier")
    cut = Cut(3, WalOffset(uuid.uuid4(), 20), drained, prior, "timer")
    assert cut.nbytes == 1_000
    assert cut.own_ids == {d.id for d in drained} and len(cut.own_ids) == 2
    assert all(i > cut.prior_upto for i in cut.own_ids)
    assert cut.snaps == {} and cut.frozen == set()


def test_an_empty_cut_has_no_size_and_no_ids() -> None:
    cut = Cut(1, None, [], 0, "shutdown")
    assert cut.nbytes == 0 and cut.own_ids == set()
    other = Cut(1, None, [], 0, "shutdown")
    other.frozen.add("t")
    assert cut.frozen == set()  # each cut has its own collections


# -- issue 25 item 2: the cut in one room, wired by constructors ---------------------------

ROOT = Path(__file__).resolve().parents[4]

#: The classes of the cut's rooms and the pipeline it left (issue 25: no class over ~400).
ROOMS = {
    "app/ingest/pipeline.py": "Pipeline",
    "app/ingest/cuts.py": "CutOwner",
    "app/cadence/barrier.py": "Barrier",
    "app/cadence/cut_runner.py": "CutRunner",
}

#: The hooks a module used to assign on another module's object after construction.
HOOKS = frozenset({"on_rotation", "failed_epoch", "on_cut_stall"})


def _pipeline(tmp_path: Path, **kwargs: Any) -> tuple[Pipeline, Journal, Publisher]:
    journal = Journal.open(tmp_path / "wal", WalConfig(segment_max_bytes=64 * 1024))
    holder: dict[str, Pipeline] = {}
    buffers = Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: holder["p"].epoch)
    publisher = Publisher(MemoryStore(), buffers, node="test-0")
    miners = MinerCluster(CountingAllocator())
    holder["p"] = Pipeline(journal, miners, buffers, publisher, **kwargs)
    return holder["p"], journal, publisher


def _ingest(pipeline: Pipeline, tenant: str, tag: str) -> None:
    data = request(tag).SerializeToString()
    pipeline.ingest(tenant, data, flatten(decode_request(data, PROTOBUF), tenant), "test")


def test_house_2_a_turn_offers_its_rotation_cut_to_the_cut_owner_no_hook_assigned(
    tmp_path: Path,
) -> None:
    stalls: list[float] = []
    pipeline, journal, publisher = _pipeline(
        tmp_path, ceiling_bytes=1 << 20, on_cut_stall=stalls.append
    )
    try:
        _ingest(pipeline, "t", "a")
        assert pipeline.cuts.take_pending() is None and stalls == []
        journal.rotate()
        _ingest(pipeline, "t", "b")  # this turn observes the rotation
        cut = pipeline.cuts.take_pending()
        assert cut is not None and cut.reason == "rotation" and cut.epoch == 1
        now = pipeline.mark.current  # the rotation cut's mark is the closed segment's
        assert cut.mark is not None and now is not None and cut.mark.segment != now.segment
        assert len(stalls) == 1 and pipeline.cuts.epoch == 2  # the observer, passed in
    finally:
        publisher.close()
        journal.close()


def test_house_2_without_a_barrier_a_rotation_is_left_to_the_next_timer_cut(
    tmp_path: Path,
) -> None:
    pipeline, journal, publisher = _pipeline(tmp_path)
    try:
        _ingest(pipeline, "t", "a")
        journal.rotate()
        _ingest(pipeline, "t", "b")
        assert pipeline.cuts.pending is None and pipeline.cuts.epoch == 1
    finally:
        publisher.close()
        journal.close()


def test_house_2_the_latch_is_the_cut_owners_and_only_moves_down(tmp_path: Path) -> None:
    pipeline, journal, publisher = _pipeline(tmp_path)
    try:
        assert pipeline.failed_epoch == LATCH_CLEAR
        assert pipeline.cuts.latch(5) and pipeline.failed_epoch == 5
        assert not pipeline.cuts.latch(7) and pipeline.cuts.failed_epoch == 5
    finally:
        publisher.close()
        journal.close()


def test_house_2_the_cut_rooms_classes_stay_under_400_lines() -> None:
    sizes = {}
    for path, name in ROOMS.items():
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                assert node.end_lineno is not None
                sizes[f"{path}:{name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) == len(ROOMS), sizes
    assert {k: v for k, v in sizes.items() if v > 400} == {}


def test_house_2_no_cut_hook_is_assigned_on_another_modules_object() -> None:
    """``on_rotation``, ``failed_epoch`` and ``on_cut_stall`` are constructor parameters
    or the cut owner's own state: no module in ``app/`` assigns them on an object other
    than ``self``."""
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr in HOOKS
                    and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                ):
                    found.append(f"{path.relative_to(ROOT)}:{t.lineno} .{t.attr}")
    assert found == []
