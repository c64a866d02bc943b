"""Recovery: replay the WAL into the miners and the sinks before any listener starts.

Gates (DESIGN.md §5.8): a replayed frame feeds its tenant's miner; its rows reach the
record sink only above the checkpoint X (everything at or below X is already in the
store). Until snapshots exist (a later issue) every surviving frame is re-mined from an
empty tree, which rebuilds each tenant's templates; the replay doubles as the WAL's
ledger rebuild. What is suppressed is counted and reported in one start-up line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.otlp import IngestRejection, decode_request, flatten
from app.pipeline import Pipeline
from wal import CorruptionError, FrameKind, Journal


@dataclass
class RecoveryReport:
    frames: int = 0
    records_replayed: int = 0
    records_suppressed: int = 0
    audit_frames_ignored: int = 0
    tenants: set[str] = field(default_factory=set)
    torn_segments: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fields(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "records_replayed": self.records_replayed,
            "records_suppressed": self.records_suppressed,
            "audit_frames_ignored": self.audit_frames_ignored,
            "tenants": len(self.tenants),
            "torn_segments": self.torn_segments,
            "seconds": round(self.seconds, 3),
        }


def recover(journal: Journal, pipeline: Pipeline) -> RecoveryReport:
    """Replay every surviving frame through ``pipeline.replay_frame``."""
    start = time.monotonic()
    report = RecoveryReport()
    mark = journal.last_checkpoint
    replay = journal.replay()
    for frame in replay:
        if frame.kind is not FrameKind.TENANT_BATCH:
            report.audit_frames_ignored += 1  # nothing writes them; RFC 0052 §3.7
            continue
        report.frames += 1
        try:
            request = decode_request(frame.payload, "application/x-protobuf")
        except IngestRejection as exc:
            # The receiver validated these bytes before the frame was written, and the
            # frame's CRC holds: an undecodable payload is damage, not a torn write.
            raise CorruptionError(
                journal.root,
                frame.start_lsn,
                f"frame at LSN {frame.start_lsn} no longer decodes: {exc}",
            ) from exc
        batch = flatten(request, frame.tenant)
        publish = mark is None or frame.offset.lsn > mark.lsn
        suppressed = pipeline.replay_frame(
            frame.tenant, batch, frame.offset, publish=publish, nbytes=len(frame.payload)
        )
        report.records_suppressed += suppressed
        report.records_replayed += len(batch) - suppressed
        report.tenants.add(frame.tenant)
    report.torn_segments = [s.name for s in replay.report.torn]
    report.seconds = time.monotonic() - start
    return report
