"""Sabotage runs: apply each deliberate break of a safety rule to a copy of the tree, run
the tests that must catch it, and report which did — or that none did.

A rule no test catches is a finding to fix, not to hide (segment-set seed §10). Run:

    .venv/bin/python soak/sabotage.py            # every sabotage
    .venv/bin/python soak/sabotage.py -k horizon # those whose name contains "horizon"

Exit status 0 when every sabotage was caught, 1 otherwise. Not part of ``make test``:
each run copies the tree and runs a handful of tests per sabotage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sabotage:
    name: str
    rule: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) edits in the same file


SABOTAGES: tuple[Sabotage, ...] = (
    # -- reclamation (issue 3) ---------------------------------------------------------
    Sabotage(
        "horizon_strict",
        "a tenant's horizon is inclusive: its horizon frame's segment may go",
        "wal/segment_ledger.py",
        "if h is not None and seg.tenants[name][1] > h:",
        "if h is not None and seg.tenants[name][1] >= h:",
        (
            "tests/unit/wal/test_reclamation.py::test_rfc0052_2_a_segment_holding_only_the_horizon_frame_is_unlinked",
        ),
    ),
    Sabotage(
        "pin_inclusive",
        "a pin is strict: a pinned tenant's frame is never unlinked, equality included",
        "wal/segment_ledger.py",
        "            if not infinite and h is None:\n                continue  # pinned: nothing to apply, and it costs nothing",
        "            if not infinite and h is None:\n                first = self.oldest_frame(name)\n                assert first is not None\n                h = first",
        (
            "tests/unit/wal/test_reclamation.py::test_rfc0052_13_equality_never_unlinks_a_pinned_frame",
        ),
    ),
    Sabotage(
        "checkpoint_exclusive",
        "the checkpoint is inclusive: a segment whose highest frame is the mark may go",
        "wal/segment_ledger.py",
        "            if key > mark.lsn:\n                break",
        "            if key >= mark.lsn:\n                break",
        (
            "tests/unit/wal/test_reclamation.py::test_rfc0052_2_only_covered_segments_below_the_checkpoint_are_unlinked",
        ),
    ),
    Sabotage(
        "current_segment_eligible",
        "the current segment is never reclaimed",
        "wal/segment_ledger.py",
        "        if seg is self._current or seg.in_heap:\n            return",
        "        if seg.in_heap:\n            return",
        (
            "tests/unit/wal/test_reclamation.py::test_audit_frames_are_governed_by_the_checkpoint_alone",
            "tests/unit/wal/test_reclamation.py::test_rfc0052_13_a_tenant_leaves_the_ledger_with_its_last_segment",
        ),
        more=(
            (
                "            if not seg.closed:\n                return False",
                "            if False:\n                return False",
            ),
        ),
    ),
    Sabotage(
        "unlink_before_record",
        "the RECLAIM record is durable before the first unlink it accounts for",
        "wal/reclamation.py",
        # the record is written after the unlinks and the directory fsync, not before
        "        if plan.write_record:\n            try:\n                self.write_record()\n            except OSError as exc:\n                outcome.record_error = exc\n                segments = []  # nothing the record accounts for may be unlinked\n",
        "",
        (
            "tests/unit/wal/test_reclaim_fails_closed.py::test_rfc0052_17_crash_inside_a_pass",
            "tests/unit/wal/test_reclaim_fails_closed.py",
        ),
        more=(
            (
                "                outcome.fsync_failed = True\n        return outcome\n",
                "                outcome.fsync_failed = True\n        if plan.write_record:\n            try:\n                self.write_record()\n            except OSError as exc:\n                outcome.record_error = exc\n        return outcome\n",
            ),
        ),
    ),
    # -- the barrier and recovery (issue 5) ----------------------------------------------
    Sabotage(
        "mark_before_quiesce",
        "the cut's mark is read after the quiesce, under the exclusive exclusion",
        "app/cadence/cut_runner.py",
        '        with collection_deferred(), cuts.exclusion.exclusive():\n            points.hit("barrier.after_quiesce")',
        '        early = cuts._mark()\n        with collection_deferred(), cuts.exclusion.exclusive():\n            points.hit("barrier.after_quiesce")',
        (
            "tests/unit/app/cadence/test_barrier.py::test_rfc0052_14_mark_is_read_after_the_quiesce_under_the_exclusion",
        ),
        more=(
            (
                '            cut = cuts.capture_cut_locked("timer")\n',
                '            cut = cuts.capture_cut_locked("timer")\n            cut.mark = early\n',
            ),
        ),
    ),
    Sabotage(
        "stamp_the_sync_eof",
        "a turn's mark is its own frame end, never the covering fsync's EOF",
        "app/ingest/pipeline.py",
        "            ticket.offset = ticket.pending.wait().offset\n",
        "            ticket.offset = ticket.pending.wait().durable_eof\n",
        (
            "tests/unit/app/cadence/test_barrier.py::test_rfc0052_14_own_frame_mark_across_a_two_turn_flush",
        ),
    ),
    Sabotage(
        "skip_the_recheck",
        "the latch is rechecked after the flush and the waits, before the stamp",
        "app/cadence/cut_runner.py",
        "        latched = p.failed_epoch <= cut.epoch  # the recheck, after the waits",
        "        latched = False",
        (
            "tests/unit/app/cadence/test_barrier.py::test_rfc0052_1_prior_publish_failing_while_the_barrier_waits",
            "tests/unit/app/cadence/test_barrier.py::test_rfc0052_1_raising_barrier_tick_latches_and_the_next_tick_runs",
        ),
    ),
    Sabotage(
        "pending_cut_outlives_a_failed_cut",
        "a pending cut never installs or stamps after the running cut failed",
        "app/cadence/cut_runner.py",
        "        if not outcome.ok:\n            self._invalidate_pending(outcome)",
        "        if not outcome.ok:\n            pass",
        (
            "tests/unit/app/cadence/test_barrier.py::test_rfc0052_14_pending_cut_inherits_the_running_cuts_outcome",
        ),
    ),
    Sabotage(
        "replay_feeds_records_at_or_below_x",
        "replayed records reach the sink only above max(X, S)",
        "app/node/recovery.py",
        "            publish_records=lsn > gate,",
        "            publish_records=lsn > (-1 if s is None else s.lsn),",
        (
            "tests/crash/test_recovery_gates_sigkill.py::test_rfc0052_10_s_below_x_remines_s_to_x_and_suppresses_it",
            "tests/unit/app/ingest/test_pipeline.py::test_recovery_replays_every_frame_and_gates_the_sink_on_the_checkpoint",
        ),
    ),
    Sabotage(
        "barrier_spins_on_failure",
        "a failing cut is retried after a backoff, never in a tight loop",
        "app/cadence/barrier.py",
        "                    and not (self.recapture and self._clock() >= runner.retry_not_before)",
        "                    and not self.recapture",
        (
            "tests/unit/app/cadence/test_barrier.py::test_failed_cuts_back_off_instead_of_recapturing_at_once",
        ),
    ),
    # -- the WAL core (issue 2) ---------------------------------------------------------
    Sabotage(
        "skip_set_validation",
        "open validates the set: names and headers agree, no duplicates, no overlap",
        "wal/scan.py",
        '    sizes alone. Duplicates are checked first: two files declaring one base is the more\n    useful message than the name disagreement it also implies."""',
        '    sizes alone. Duplicates are checked first: two files declaring one base is the more\n    useful message than the name disagreement it also implies."""\n    return',
        ("tests/unit/wal/test_opening.py",),
    ),
    Sabotage(
        "rename_before_header_fsync",
        "a segment's header is fsynced before the rename",
        "wal/rotation.py",
        '        step = "fsync the header of"\n        fs.fsync(fd)',
        '        step = "fsync the header of"',
        ("tests/crash/test_crash_matrix.py",),
    ),
    Sabotage(
        "ack_before_directory_entry",
        "no ack while the segment's directory entry is not durable",
        "wal/commit.py",
        "            if dir_pending is not None:\n                try:\n                    fs.fsync_dir(log.root)",
        "            if dir_pending is not None and False:\n                try:\n                    fs.fsync_dir(log.root)",
        (
            "tests/unit/wal/test_rotation.py::test_rfc0052_4_no_ack_while_the_rotation_obligation_is_pending",
            "tests/crash/test_crash_matrix.py",
        ),
    ),
    Sabotage(
        "append_behind_torn_tail",
        "open never appends behind a torn tail: it seals the segment",
        "wal/opening.py",
        "        if scan.stop.damaged:\n            seg.sealed = True",
        "        if False:\n            seg.sealed = True",
        (
            "tests/unit/wal/test_opening.py::test_torn_tail_is_sealed_and_kept_and_a_second_restart_works",
        ),
    ),
    Sabotage(
        "mark_is_the_eof",
        "the outcome's mark is the frame's own end, never the fsync's EOF",
        "wal/commit.py",
        "_finish(w, CommitOutcome(w.seq, w.offset, eof), None)",
        "_finish(w, CommitOutcome(w.seq, eof, eof), None)",
        ("tests/unit/wal/test_commit.py::test_the_mark_is_the_frames_own_end_not_the_eof",),
    ),
    Sabotage(
        "retry_forever",
        "consecutive rotation failures reach the terminal state",
        "wal/rotation.py",
        "        if attempts >= budget:",
        "        if False:",
        ("tests/unit/wal/test_rotation.py",),
    ),
    # -- a full disk, backpressure, archival and the operator's tools (issue 8) ---------
    Sabotage(
        "admit_below_stop_water",
        "below stop water new batches are refused (503 naming the bound)",
        "app/ingest/admission.py",
        "        if self._level is DiskLevel.STOP_WATER or self._unreclaimed_since is not None:",
        "        if self._unreclaimed_since is not None:",
        (
            "tests/unit/app/ingest/test_admission.py::test_stop_water_refuses_new_batches_and_resumes_by_itself",
        ),
    ),
    Sabotage(
        "clear_full_without_space",
        "only a sample showing free space lifts the disk-full refusal and the WAL's latch",
        "app/ingest/admission.py",
        "                if self._latch is not None and free_bytes >= max(floor, 1):",
        "                if self._latch is not None:",
        (
            "tests/unit/app/ingest/test_admission.py::test_enospc_refuses_at_the_next_request_and_the_tick_alone_lifts_it",
        ),
    ),
    Sabotage(
        "ack_after_enospc",
        "a failed fsync acknowledges nothing it was to cover",
        "wal/commit.py",
        '            if data_err is not None:\n                self.seal_locked(cur, "fsync", data_err)',
        '            if data_err is not None and False:\n                self.seal_locked(cur, "fsync", data_err)',
        (
            "tests/unit/wal/test_no_space.py::test_seg14_enospc_at_fsync_acknowledges_nothing_after_the_failure",
        ),
    ),
    Sabotage(
        "append_while_full",
        "after ENOSPC nothing is attempted on disk until free space is reported",
        "wal/commit.py",
        "        latch = self._log.latch.current\n        if latch is not None:\n            # Nothing",
        "        latch = None\n        if latch is not None:\n            # Nothing",
        (
            "tests/unit/wal/test_no_space.py::test_seg14_enospc_at_fsync_acknowledges_nothing_after_the_failure",
        ),
    ),
    Sabotage(
        "checkpoint_allocates",
        "a checkpoint needs no new block (the preallocated spare), so a full disk reclaims",
        "wal/checkpoint_file.py",
        "    try:\n        fs.rename(spare, tmp)\n    except FileNotFoundError:",
        "    try:\n        raise FileNotFoundError(tmp)\n    except FileNotFoundError:",
        ("tests/unit/wal/test_no_space.py::test_a_full_filesystem_still_checkpoints_and_reclaims",),
    ),
    Sabotage(
        "unlink_after_archive_failure",
        "a segment whose archive failed is kept, not unlinked",
        "wal/reclamation.py",
        "                    outcome.archive_failed.append((p.path, exc))\n                    continue",
        "                    outcome.archive_failed.append((p.path, exc))",
        (
            "tests/unit/app/cadence/test_archive.py::test_an_archive_failure_keeps_the_segment_and_is_visible",
        ),
    ),
    Sabotage(
        "unlink_before_archive",
        "a segment is archived before it is unlinked",
        "wal/reclamation.py",
        "                try:\n                    archive(ArchiveRequest(",
        "                try:\n                    fs.unlink(p.path)\n                    archive(ArchiveRequest(",
        (
            "tests/unit/app/cadence/test_archive.py::test_every_unlinked_segment_is_byte_identical_in_the_archive_before_its_unlink",
        ),
    ),
    Sabotage(
        "skip_archive_verification",
        "an archived copy is read back and compared before the unlink",
        "app/cadence/archive.py",
        "        if back == data:\n            return len(data)",
        "        if True:\n            return len(data)",
        (
            "tests/unit/app/cadence/test_archive.py::test_an_archive_failure_keeps_the_segment_and_is_visible",
        ),
    ),
    Sabotage(
        "archive_into_the_wal",
        "an archive location resolving to the WAL directory is refused at start-up",
        "app/cadence/archive.py",
        "    if inside:\n        raise ArchiveLocationError(",
        "    if False:\n        raise ArchiveLocationError(",
        (
            "tests/unit/app/cadence/test_archive.py::test_an_archive_location_inside_the_wal_is_refused",
        ),
    ),
    Sabotage(
        "quarantine_reuses_lsns",
        "after a quarantine the log never reuses the quarantined segment's LSNs",
        "wal/opening.py",
        "        if quarantined_end > log.end_lsn:",
        "        if False:",
        (
            "tests/unit/app/cli/test_wal_quarantine.py::test_quarantining_the_newest_segment_never_reuses_its_lsns",
        ),
    ),
    Sabotage(
        "stale_gap_always_explained",
        "only a quarantine record explains a missing segment under a horizon",
        "wal/reclamation.py",
        "                if any(q.explains(h.segment, h.lsn) for q in log.quarantined):",
        "                if True:",
        (
            "tests/unit/app/cli/test_wal_quarantine.py::test_seg12_a_segment_deleted_by_hand_is_caught_at_start_up_naming_tenant_and_offsets",
        ),
    ),
    Sabotage(
        "quarantine_a_sound_segment",
        "quarantine moves only a segment verify finds unreadable (or on --force)",
        "app/cli/wal.py",
        "    if not mine and not force:",
        "    if False:",
        (
            "tests/unit/app/cli/test_wal_quarantine.py::test_quarantine_refuses_a_segment_that_verifies_clean",
        ),
    ),
    # -- RFC 0055: frontiers, slots, settlement, keys (issue 7) ---------------------------
    Sabotage(
        "stamp_past_clamp",
        "no barrier stamps past an unsettled entry's clamp",
        "app/ingest/mark.py",
        "        if not clamped:\n            self._last_durable = latest",
        "        if True:\n            self._last_durable = latest",
        (
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_9_5_two_entries_the_mark_is_the_lower_clamp_until_both_settle",
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_9_5_an_unresolved_entry_clamps_the_mark_and_withholds_only_its_snapshot",
        ),
    ),
    Sabotage(
        "rebuild_from_directory",
        "settlement rebuilds from the SnapshotLedger's retained state, never the directory",
        "app/ingest/settlement.py",
        "                    state = self._ledger.state(tenant)",
        "                    state = self._pipeline.barrier.store.load_all_durable().states.get(tenant)  # type: ignore[attr-defined]",
        (
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_9_5_settlement_rebuilds_from_the_ledger_not_the_directory",
        ),
    ),
    Sabotage(
        "keep_old_tree_rows",
        "the discarded tree's buffered rows are dropped in the swap's section",
        "app/ingest/rebuild.py",
        "                dropped = self._buffers.drop_tenant(tenant)",
        "                dropped = 0",
        (
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_3_the_rebuild_publishes_no_row_under_a_template_id_it_did_not_allocate",
        ),
    ),
    Sabotage(
        "settle_twice",
        "one claim per entry: a second trigger waits instead of rebuilding again",
        "app/ingest/settlement.py",
        "                if busy:\n                    signal = busy[0].done",
        "                if False:\n                    signal = busy[0].done",
        (
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_9_5_the_tick_and_a_turn_racing_for_one_entry_make_exactly_one_rebuild",
        ),
    ),
    Sabotage(
        "gate_replay_on_x",
        "a tenant's replay gate is its own PUBLISHED frontier, never the node-wide X",
        "app/node/recovery.py",
        "        records_gate, audit_gate = gates(self._frontiers.get(tenant), self._x, lsn)",
        "        records_gate, audit_gate = self._x, self._x",
        (
            "tests/unit/app/ingest/test_settlement.py::test_rfc0055_9_5_an_unrecoverable_tenant_is_isolated_and_the_checkpoint_advances_for_others",
        ),
    ),
    Sabotage(
        "merge_ambiguous_retry",
        "a retry after an ambiguous PUT keeps its identity, never merged with new rows",
        "sink/buffers.py",
        "            if part.deterministic or part.identity is not None or part.spool is not None:",
        "            if part.deterministic or part.spool is not None:",
        (
            "tests/unit/sink/test_retry_identity.py::test_rfc0055_9_3_an_ambiguous_retry_keeps_its_identity_and_never_merges_with_new_rows",
        ),
    ),
    Sabotage(
        "slots_count_held_only",
        "Held + Reserved count against max_tenants: a burst never overshoots",
        "app/ingest/tenants.py",
        "                count = self._held + self._reserved",
        "                count = self._held",
        (
            "tests/unit/app/ingest/test_tenants.py::test_rfc0055_9_5_a_burst_of_new_ids_never_overshoots_the_limit",
        ),
    ),
    Sabotage(
        "release_on_failed_sync",
        "a failed sync keeps the reservation while its frame can be replayed",
        "app/ingest/tenants.py",
        "            if result is TurnResult.FRAME_LEFT:\n                slot.frame_pending = True",
        "            if result is TurnResult.FRAME_LEFT:\n                pass",
        (
            "tests/unit/app/ingest/test_tenants.py::test_rfc0055_4_a_failed_sync_keeps_the_reservation_and_a_restart_holds_the_tenant",
        ),
    ),
    Sabotage(
        "published_before_checkpoint",
        "PUBLISHED is written after CHECKPOINT in the checkpoint call",
        "wal/checkpointing.py",
        "        advanced = self._checkpoint_mark(mark)\n        if published:\n            self._frontiers.write(published, checkpointed=advanced)",
        "        if published:\n            self._frontiers.write(published)\n        advanced = self._checkpoint_mark(mark)",
        (
            "tests/unit/wal/test_frontiers.py::test_published_is_written_after_checkpoint_in_the_same_call",
        ),
    ),
    Sabotage(
        "ignore_id_conflict",
        "an id the two sidecars name with different tenants fails open naming both files",
        "wal/frontiers.py",
        "                if mine.tenant != rec.tenant:",
        "                if False:",
        (
            "tests/unit/wal/test_frontiers.py::test_an_id_the_two_files_name_differently_fails_open_naming_both_files_and_the_id",
        ),
    ),
    Sabotage(
        "newer_slot_read_as_older",
        "a two-slot record file whose newer slot breaks the format (its checksum holds) "
        "refuses the open naming file, slot and byte; an older broken slot is the previous "
        "record",
        "wal/two_slot_file.py",
        "            and rejected.generation > self._live_generation",
        "            and rejected.generation < self._live_generation",
        ("tests/unit/wal/test_two_slot_file.py",),
    ),
    # -- the ingest path's buffers (issues 4 and 14) --------------------------------------
    Sabotage(
        "append_drops_the_batch",
        "every buffered record reaches the store: an appended batch stays in its partition",
        "sink/parquet.py",
        "            self._batches.append(batch)\n",
        "            pass\n",
        (
            "tests/unit/sink/test_parquet.py::test_batches_encode_the_rows_in_order",
            "tests/unit/app/ingest/test_pipeline.py::test_rows_carry_the_frames_own_end_and_the_mark_follows_each_turn",
        ),
    ),
    Sabotage(
        "merge_drops_the_batches",
        "a requeue puts every row back: merging keeps the other buffer's batches, in order",
        "sink/parquet.py",
        "        self._batches.extend(other._batches)  # shared: a batch never changes",
        "        pass",
        (
            "tests/unit/sink/test_parquet.py::test_merge_appends_the_other_buffer_and_leaves_it_unchanged",
        ),
    ),
    Sabotage(
        "assemble_reorders_rows",
        "a frame's records keep their order and their template columns line up with them",
        "sink/parquet.py",
        '        "template_id": pa.array(template_id, pa.int64()),',
        '        "template_id": pa.array(list(template_id)[::-1], pa.int64()),',
        (
            "tests/unit/sink/test_parquet.py::test_assembled_records_equal_the_rows_built_from_python_values",
        ),
    ),
    # -- worker processes (issue 14) ---------------------------------------------------
    Sabotage(
        "worker_acks_before_the_core",
        "a worker answers its client with the core's answer, never before it",
        "app/receive/worker_process.py",
        """            answer = self._conn.call(
                MessageKind.INGEST,
                channel.encode_ingest(transport, tenant, payload, batch),
                ANSWER_TIMEOUT_S,
            )""",
        """            self._conn.start(
                MessageKind.INGEST, channel.encode_ingest(transport, tenant, payload, batch)
            )
            return IngestOutcome(len(batch))""",
        (
            "tests/unit/app/receive/test_worker_process.py::test_the_worker_answers_only_once_the_core_has",
            "tests/unit/app/receive/test_worker_process.py::test_the_worker_relays_the_cores_refusal_as_is",
        ),
    ),
    Sabotage(
        "core_answers_before_the_fsync",
        "the core acknowledges a worker's request only after the fsync covering its frame",
        "app/ingest/stages.py",
        "            self._durable.put((ticket, answer))",
        "            answer(IngestOutcome(len(batch)), None)\n"
        "            self._durable.put((ticket, lambda outcome, refusal: None))",
        (
            "tests/unit/app/ingest/test_stages.py::test_stages_answer_only_after_the_covering_fsync",
            "tests/unit/app/ingest/test_stages.py::test_issue15_the_ack_comes_before_the_turn_and_no_mark_covers_an_unturned_frame",
        ),
    ),
    Sabotage(
        "worker_outlives_the_core",
        "no worker outlives the core (the kernel kills it, and it exits when its channel closes)",
        "app/receive/worker_process.py",
        "    _arm_parent_death(args.parent)\n",
        "",
        (
            "tests/integration/test_workers.py::test_workers_sigkill_of_the_core_leaves_no_orphan_and_loses_nothing",
        ),
        # and the second guard: a worker also exits when its channel closes
        more=(
            (
                '        log.info("worker %d: channel closed (%s); exiting", args.index, exc)\n'
                "        return 0",
                "        threading.Event().wait()\n        return 0",
            ),
        ),
    ),
    Sabotage(
        "worker_acks_before_the_core_on_the_loop",
        "a worker answers its client with the core's answer, never before it (event loop)",
        "app/receive/worker_process.py",
        "            await asyncio.wait_for(answered, ANSWER_TIMEOUT_S)\n"
        "            answer = call.wait(0)",
        "            return IngestOutcome(len(batch))",
        (
            "tests/unit/app/receive/test_worker_process.py::test_an_ingest_awaited_on_an_event_loop_gets_the_cores_answer",
        ),
    ),
    Sabotage(
        "worker_launched_while_stopping_left_running",
        "a worker launched while the core stops is stopped with the others, never left running",
        "app/node/worker_pool.py",
        "            if not stopping:\n                self._links[index] = link",
        "            self._links[index] = link\n            stopping = False",
        (
            "tests/unit/app/node/test_worker_pool.py::test_a_worker_launched_while_stopping_is_ended_not_left_running",
        ),
    ),
    Sabotage(
        "encode_only_on_a_worker",
        "a records partition no worker encodes is encoded by the core (a dying worker loses no publish)",
        "app/node/encode_dispatch.py",
        "            return encode_records(cols, compression)\n",
        '            raise ChannelClosed("no worker encoded the partition")\n',
        (
            "tests/unit/app/node/test_worker_pool.py::test_the_core_encodes_a_partition_itself_when_no_worker_answers",
            "tests/unit/app/node/test_worker_pool.py::test_a_partition_over_the_channels_frame_bound_is_encoded_by_the_core",
        ),
    ),
    Sabotage(
        "encode_slots_unbounded",
        "TAIL.6: a rotation cut's encodes run at most server.encode_concurrency at once",
        "app/node/encode_dispatch.py",
        "        return self.in_flight + len(self._resting)\n",
        "        return 0\n",
        (
            "tests/unit/app/node/test_encode_dispatch.py::test_tail_6_no_more_encodes_than_the_slots_hold_at_once",
            "tests/unit/app/node/test_worker_pool.py::test_tail_6_an_encode_waits_for_a_slot_before_it_is_sent",
            "tests/integration/test_encode_bound_serve.py::test_tail_6_a_rotation_cut_runs_no_more_encodes_than_the_setting",
        ),
    ),
    Sabotage(
        "sliced_column_counted_by_its_rows",
        "BOUNDED.1: a column sliced out of a larger buffer counts all the memory it holds",
        "sink/parquet.py",
        "        n += batch.column(i).get_total_buffer_size()\n",
        "        n += batch.column(i).nbytes\n",
        (
            "tests/unit/sink/test_parquet.py::test_bounded_1_held_bytes_counts_a_shared_index_by_its_rows_and_a_sliced_string_whole",
        ),
    ),
    Sabotage(
        "cut_publishes_not_paced",
        "TAIL.6: a cut's publishes run paced, so the encode slots they take rest after them",
        "app/cadence/cut_runner.py",
        "            with paced():\n                return publish_now(d)\n",
        "            if True:\n                return publish_now(d)\n",
        (
            "tests/unit/app/cadence/test_cut_pacing.py::test_tail_6_every_publish_of_a_cut_runs_paced",
        ),
    ),
    Sabotage(
        "cut_pacing_not_wired",
        "TAIL.6: the node's cuts publish inside its encode slots' pacing",
        "app/node/server.py",
        "        paced=ahead.encoder.paced,\n",
        "        paced=contextlib.nullcontext,\n",
        (
            "tests/integration/test_encode_bound_serve.py::test_tail_6_a_rotation_cut_runs_no_more_encodes_than_the_setting",
        ),
    ),
    Sabotage(
        "slot_rest_ignored",
        "TAIL.6: a slot a cut's publish held rests t × (100 / server.encode_duty_percent − 1)",
        "app/node/encode_dispatch.py",
        '                if self.rest_factor and getattr(self._held, "paced", False):\n',
        "                if False:\n",
        (
            "tests/unit/app/node/test_encode_dispatch.py::test_tail_6_a_paced_publish_leaves_its_slot_resting_and_an_unpaced_one_does_not",
        ),
    ),
    Sabotage(
        "slot_rest_dropped_on_wake",
        "TAIL.6: a slot rests its whole rest, whatever wakes the threads waiting for it",
        "app/node/encode_dispatch.py",
        "                    self._cond.wait(None if rest is None else max(0.0, rest - self._clock()))\n",
        "                    self._cond.wait(None if rest is None else max(0.0, rest - self._clock()))\n"
        "                    self._resting.clear()\n",
        (
            "tests/unit/app/node/test_encode_dispatch.py::test_tail_6_a_paced_publish_leaves_its_slot_resting_and_an_unpaced_one_does_not",
        ),
    ),
    Sabotage(
        "publish_encodes_outside_the_slot",
        "TAIL.6: a publish holds the encode slot while it re-matches and encodes its rows",
        "sink/publisher.py",
        "                    with self._encode_slot():\n                        name, key, data = self._encode(d)\n",
        "                    if True:\n                        name, key, data = self._encode(d)\n",
        (
            "tests/unit/sink/test_publish_slot.py::test_tail_6_a_publish_holds_the_slot_while_it_encodes_and_settles_not_while_it_writes",
        ),
    ),
    Sabotage(
        "publish_settles_outside_the_slot",
        "TAIL.6: a publish holds the encode slot while it settles its rows, not while it writes",
        "sink/publisher.py",
        "        with self._encode_slot():\n            return self._buffers.published(d), True\n",
        "        if True:\n            return self._buffers.published(d), True\n",
        (
            "tests/unit/sink/test_publish_slot.py::test_tail_6_a_publish_holds_the_slot_while_it_encodes_and_settles_not_while_it_writes",
        ),
    ),
    Sabotage(
        "encode_slot_not_reentrant",
        "TAIL.6: the publish that holds a slot encodes without taking a second",
        "app/node/encode_dispatch.py",
        "        if depth:\n",
        "        if False:\n",
        (
            "tests/unit/app/node/test_encode_dispatch.py::test_tail_6_a_thread_that_holds_a_slot_encodes_without_taking_a_second",
        ),
    ),
    Sabotage(
        "hung_worker_keeps_getting_encodes",
        "TAIL.6: a worker that timed out an encode is sent no more (a hung one cannot hold the slots)",
        "app/node/encode_dispatch.py",
        "                    self._unanswered.add(conn)\n",
        "                    pass\n",
        (
            "tests/unit/app/node/test_encode_dispatch.py::test_tail_6_a_worker_that_timed_out_an_encode_is_sent_no_more",
        ),
    ),
    Sabotage(
        "signal_handler_takes_the_stop_lock",
        "SIGTERM always stops the node (the handler takes no lock the main thread may hold)",
        "app/node/server.py",
        "        os.write(write_end, bytes([signum]))\n",
        "        received.append(signum)\n        stop.set()\n",
        (
            "tests/unit/app/node/test_server.py::test_sigterm_while_the_main_thread_holds_the_stop_lock_still_stops_the_node",
        ),
    ),
    Sabotage(
        "cut_flushes_one_partition_at_a_time",
        "sustained ingest does not grow the WAL without bound: a cut publishes its partitions"
        " side by side, so one slow PUT does not hold the checkpoint",
        "app/cadence/cut_runner.py",
        "FLUSH_CONCURRENCY = 8\n",
        "FLUSH_CONCURRENCY = 1\n",
        (
            "tests/unit/app/cadence/test_barrier.py::test_a_cuts_partitions_are_published_side_by_side_a_held_put_holds_no_other",
        ),
    ),
    Sabotage(
        "main_thread_waits_untimed_for_stop",
        "SIGTERM always stops the node, whichever thread the kernel delivers it to",
        "app/node/server.py",
        "    while not stop.wait(STOP_POLL_SECS):\n        pass\n",
        "    stop.wait()\n",
        (
            "tests/unit/app/node/test_server.py::test_sigterm_delivered_to_another_thread_still_stops_the_node",
        ),
    ),
    Sabotage(
        "scrape_without_flush",
        "a scrape counts every request a client has had its answer to, whichever worker serves it",
        "app/node/worker_pool.py",
        "                link.conn.call(MessageKind.FLUSH, [], 5.0)",
        "                pass",
        (
            "tests/unit/app/node/test_worker_pool.py::test_a_scrape_counts_every_report_sent_before_it_through_any_worker",
        ),
    ),
    # -- no wedge on a failed audit publish; truthful cadences and shutdown (issue 18) --
    Sabotage(
        "settle_wakes_no_waiter",
        "a settled publish (written or requeued) wakes everyone waiting for it",
        "sink/buffers.py",
        "                item.outcome = outcome\n                self._settled.notify_all()",
        "                item.outcome = outcome",
        (
            "tests/unit/sink/test_publisher.py::test_nowedge_0_a_failed_audit_publish_releases_its_waiter_and_requeues_the_records",
            "tests/unit/sink/test_publisher.py::test_a_synchronous_publish_waits_for_events_another_caller_is_writing",
        ),
    ),
    Sabotage(
        "requeue_forgets_the_registration",
        "a requeue settles the publish it puts back: nothing stays registered in flight",
        "sink/buffers.py",
        "            outcome = PublishOutcome(d.id, False, epoch, error_type)\n        self.in_flight.settle(outcome)",
        "            outcome = PublishOutcome(d.id, False, epoch, error_type)",
        (
            "tests/unit/sink/test_publisher.py::test_nowedge_0_a_failed_audit_publish_releases_its_waiter_and_requeues_the_records",
            "tests/unit/app/cadence/test_barrier_never_wedges.py::test_nowedge_0_a_failed_audit_publish_redrained_by_a_pending_cut_releases_every_waiter[back]",
        ),
    ),
    Sabotage(
        "waiter_waits_for_the_owner",
        "a publish never waits for a dependency no thread is writing: it writes it itself",
        "sink/publisher.py",
        "            outcome = self.publish(item.detached)\n",
        "            item.wait(self._wait_secs)\n"
        "            outcome = item.outcome or PublishOutcome(item.detached.id, False)\n",
        (
            "tests/unit/app/cadence/test_barrier_never_wedges.py::test_nowedge_0_a_failed_audit_publish_redrained_by_a_pending_cut_releases_every_waiter[back]",
        ),
    ),
    Sabotage(
        "requeue_ignores_the_claim",
        "a partition another thread wrote (or is writing) is never put back by its owner",
        "sink/buffers.py",
        "        if not claimed and not self.in_flight.claim(d):\n            return None",
        "        if not claimed:\n            self.in_flight.claim(d)",
        (
            "tests/unit/app/cadence/test_barrier_never_wedges.py::test_nowedge_0_a_failed_audit_publish_redrained_by_a_pending_cut_releases_every_waiter[back]",
            "tests/unit/sink/test_publisher.py::test_a_park_of_events_another_thread_already_wrote_puts_nothing_back",
        ),
    ),
    Sabotage(
        "cut_waits_for_queued_publishes",
        "a cut settles the publishes registered before it, writing those nobody is writing",
        "app/ingest/cuts.py",
        "            self.publisher.publish(item.detached)\n            unsettled = unsettled or item.outcome is None",
        "            item.wait(self.publisher._wait_secs)\n            unsettled = unsettled or item.outcome is None",
        (
            "tests/unit/app/cadence/test_barrier_never_wedges.py::test_nowedge_0_a_cut_writes_the_prior_publishes_nobody_is_writing",
        ),
    ),
    Sabotage(
        "failed_stamp_counted_ok",
        "a cut whose checkpoint or frontier write failed is never counted with outcome ok",
        "app/cadence/cut_runner.py",
        '        if outcome.complete:\n            self.count("ok", "")',
        '        if outcome.ok:\n            self.count("ok", "")',
        (
            "tests/unit/app/cadence/test_barrier_never_wedges.py::test_nowedge_2_a_cut_whose_stamp_failed_is_counted_as_an_error_never_ok",
        ),
    ),
    Sabotage(
        "shutdown_counts_the_buffers_only",
        "a shutdown counts every unpublished row, in-flight publishes included",
        "sink/buffers.py",
        "        flying = self.in_flight.unsettled_rows()",
        "        flying = (0, 0)",
        (
            "tests/unit/app/node/test_server.py::test_a_barrier_that_does_not_join_is_read_as_a_failed_cut",
        ),
    ),
    Sabotage(
        "shutdown_exits_zero_with_rows_left",
        "a shutdown that leaves acknowledged rows unpublished exits non-zero",
        "app/node/server.py",
        "    code = EXIT_ROWS_LEFT if left or unturned or not final_cut or not phase.ended else 0",
        "    code = 0",
        (
            "tests/unit/app/node/test_server.py::test_nowedge_0_a_shutdown_with_the_store_down_counts_the_rows_left_and_exits_non_zero",
        ),
    ),
    Sabotage(
        "reclaim_cap_unclamped",
        "a pass never plans more unlinks than RECLAIM's geometry holds (issue 18 item 7)",
        "wal/reclamation.py",
        "        cap = max(0, min(cap, self.file.geometry.max_unlinks))",
        "        cap = max(0, cap)",
        (
            "tests/crash/test_reclaim_model.py::test_nowedge_7_rfc0052_12_a_cap_above_the_record_geometry_is_clamped_to_it",
        ),
    ),
    # -- every state ends well (issue 22 items 1 and 4) ------------------------------------
    Sabotage(
        "replay_decode_ignores_the_stop",
        "SIGTERM is honoured in every state: a replay's decoding ends at the stop",
        "app/node/worker_pool.py",
        "        if stop.is_set() or self._stopping.is_set():\n"
        '            raise DecodeStopped("the replay was stopped")',
        "        return",
        (
            "tests/unit/app/node/test_worker_pool.py::test_every_state_1_a_stop_abandons_the_decode_window",
            "tests/unit/app/node/test_worker_pool.py::test_every_state_1_stopping_workers_end_a_decode_that_waits_for_them",
        ),
    ),
    Sabotage(
        "replay_turns_past_the_halt",
        "SIGTERM is honoured in every state: a replay ends at its next frame",
        "app/ingest/stages.py",
        "                    if self._halt.is_set():\n                        break\n"
        "                    turn_replayed(item)",
        "                    turn_replayed(item)",
        (
            "tests/unit/app/ingest/test_stages.py::test_every_state_1_a_halted_replay_turns_nothing_more_and_nothing_new",
        ),
    ),
    Sabotage(
        "turns_outlive_the_drain",
        "no thread outlives server.stopped: the turn thread stops when the drain's time is up",
        "app/ingest/stages.py",
        "            self._halt.set()  # out of time: what is not turned stays in the WAL",
        "            pass",
        (
            "tests/unit/app/ingest/test_stages.py::test_every_state_1_a_drain_out_of_time_stops_after_the_frame_in_hand_and_counts_the_rest",
            "tests/crash/test_sigterm_every_state_serve.py::test_every_state_1_sigterm_exits_within_grace_and_final_cut_and_loses_nothing[backlog_full]",
        ),
    ),
    Sabotage(
        "final_cut_unbounded",
        "the process exits within grace + final cut: a cut stuck in the store is abandoned",
        "app/node/server.py",
        "        runner.join(max(0.0, until - time.monotonic()))",
        "        runner.join()",
        (
            "tests/crash/test_sigterm_every_state_serve.py::test_every_state_1_sigterm_exits_within_grace_and_final_cut_and_loses_nothing[store_down]",
        ),
    ),
    Sabotage(
        "supervised_threads_outlive_the_stop",
        "no thread outlives server.stopped: a supervised loop in its backoff ends at the stop",
        "app/node/server.py",
        "        node.threads.close()\n        node.threads.join(SUPERVISED_JOIN_SECS)",
        "        pass",
        (
            "tests/unit/app/node/test_server.py::test_every_state_1_a_supervised_loop_in_its_restart_backoff_ends_with_the_stop",
        ),
    ),
    Sabotage(
        "decode_failure_stops_the_start",
        "a frame that cannot be decoded at replay is isolated; the start goes on",
        "app/node/recovery.py",
        "            self._isolate(frame, s, decoded)\n            return",
        '            raise RuntimeError(f"frame {frame.offset} does not decode: {decoded.error}")',
        (
            "tests/unit/app/node/test_recovery.py::test_every_state_4_a_replayed_frame_that_does_not_decode_is_isolated_and_the_rest_replay",
            "tests/crash/test_replay_decode_failure_serve.py::test_every_state_4_a_frame_that_does_not_decode_at_replay_is_isolated_and_the_node_starts[raises]",
        ),
    ),
    Sabotage(
        "decode_retried_without_bound",
        "a replayed frame's decode is retried at most wal.frame_decode_attempts times",
        "app/node/worker_pool.py",
        "            if failures >= attempts:\n                return Undecodable(error, failures)",
        "            if False:\n                return Undecodable(error, failures)",
        (
            "tests/unit/app/node/test_worker_pool.py::test_every_state_4_a_payload_failing_on_every_worker_is_undecodable_at_the_bound",
        ),
    ),
    Sabotage(
        "isolated_frame_not_kept",
        "an isolated frame's payload is kept and named: nothing acknowledged vanishes unnamed",
        "app/node/recovery.py",
        "        if self._quarantine is not None:\n            try:\n                saved = str(",
        "        if False:\n            try:\n                saved = str(",
        (
            "tests/unit/app/node/test_recovery.py::test_every_state_4_a_replayed_frame_that_does_not_decode_is_isolated_and_the_rest_replay",
        ),
    ),
    # -- one writer per WAL; a poison batch isolated (issue 18 items 3 and 4) -------------
    Sabotage(
        "data_dir_lock_not_taken",
        "one writer per WAL: a node locks its data directory before anything else",
        "app/node/server.py",
        "    lock = DataDirLock.acquire(server.data_dir)\n",
        '    lock = DataDirLock.acquire(Path(__import__("tempfile").mkdtemp()))\n',
        (
            "tests/unit/app/node/test_datalock.py::test_nowedge_3_build_node_takes_the_lock_before_it_reads_or_writes_anything",
            "tests/integration/test_one_writer_per_wal.py::test_nowedge_3_a_second_serve_on_a_live_data_directory_refuses_and_the_first_serves_on",
        ),
    ),
    Sabotage(
        "data_dir_lock_after_the_wal_open",
        "the lock comes before the WAL is opened (a refused node reads and writes nothing)",
        "app/node/server.py",
        "    lock = DataDirLock.acquire(server.data_dir)\n",
        "    Journal.open(server.wal_dir, settings.wal).close()\n"
        "    lock = DataDirLock.acquire(server.data_dir)\n",
        (
            "tests/unit/app/node/test_datalock.py::test_nowedge_3_build_node_takes_the_lock_before_it_reads_or_writes_anything",
            "tests/integration/test_one_writer_per_wal.py::test_nowedge_3_a_second_serve_on_a_live_data_directory_refuses_and_the_first_serves_on",
        ),
    ),
    Sabotage(
        "quarantine_ignores_the_lock",
        "ourios wal quarantine refuses while a node holds the data directory",
        "app/cli/wal.py",
        '        lock = DataDirLock.acquire_existing(root.parent, command="ourios wal quarantine")\n',
        "        lock = None\n",
        (
            "tests/unit/app/node/test_datalock.py::test_nowedge_3_quarantine_refuses_while_a_node_holds_the_data_directory",
        ),
    ),
    Sabotage(
        "mining_attempts_unbounded",
        "a frame failing every time is isolated after wal.frame_mining_attempts attempts",
        "app/ingest/frame_attempts.py",
        "            return {lsn: a for lsn, a in frames.items() if a.failures >= self.max_attempts}",
        "            return {}",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_a_frame_failing_every_time_is_isolated_at_the_bound_and_the_mark_moves_on",
            "tests/crash/test_poison_frame_serve.py::test_nowedge_4_a_poison_frame_is_isolated_and_the_others_publish_and_reclaim_across_a_restart",
        ),
        more=(("        return failures >= self.max_attempts", "        return False"),),
    ),
    Sabotage(
        "turn_failure_not_counted",
        "the ingest turn's failure is the frame's first attempt",
        "app/ingest/pipeline.py",
        "        if failed:\n            self.settler.note_failure(tenant, offset, why)\n",
        "",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_a_frame_failing_every_time_is_isolated_at_the_bound_and_the_mark_moves_on",
        ),
    ),
    Sabotage(
        "replay_unguarded",
        "a replayed frame whose mining raises does not fail the start",
        "app/node/recovery.py",
        "        except Exception as exc:  # noqa: BLE001 - the guard: settled after the start",
        "        except NotImplementedError as exc:  # noqa: BLE001 - the guard, removed",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_replay_turns_a_failing_frame_into_an_entry_and_the_node_starts",
            "tests/crash/test_poison_frame_serve.py::test_nowedge_4_a_poison_frame_is_isolated_and_the_others_publish_and_reclaim_across_a_restart",
        ),
    ),
    Sabotage(
        "replay_mines_into_the_unknown_tree",
        "after a replay failure, the tenant's later frames are left to its settlement",
        "app/node/recovery.py",
        "        if tenant in unmined:\n",
        "        if False:\n",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_replay_turns_a_failing_frame_into_an_entry_and_the_node_starts",
        ),
    ),
    Sabotage(
        "replayed_entry_ignores_its_gates",
        "a replayed entry's settlement re-emits above the gates the replay applied",
        "app/ingest/rebuild.py",
        "            if e.gates is not None:  # a start-up replay's entry: never above its gates",
        "            if False:",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_a_replayed_entry_re_emits_above_the_gates_its_replay_applied",
        ),
    ),
    Sabotage(
        "cut_raises_a_replayed_tenants_frontier",
        "a cut leaves the frontier of a tenant whose replay failed where the replay found it",
        "app/ingest/cuts.py",
        "        skip = self._refused() | self._unmined.replayed()\n",
        "        skip = self._refused()\n",
        (
            "tests/unit/app/ingest/test_poison_batches.py::test_nowedge_4_a_replayed_entry_re_emits_above_the_gates_its_replay_applied",
        ),
    ),
    # -- the volume's headroom and a volume filled to zero (issue 18) -------------------
    Sabotage(
        "admission_by_the_last_sample_only",
        "admission refuses at stop water by the free space as of the last append (the "
        "last sample less what the node wrote since), never by the sample alone",
        "app/base/diskspace.py",
        "        return wal + self._reported - taken.reported",
        "        return 0",
        (
            "tests/unit/app/base/test_diskspace.py::test_nowedge_1_the_figure_is_the_last_sample_less_what_the_node_wrote_since",
            "tests/unit/app/base/test_diskspace.py::test_nowedge_1_admission_refuses_at_stop_water_by_the_figure_between_two_ticks",
            "tests/integration/test_disk_headroom.py::test_nowedge_1_a_store_outage_under_load_never_eats_the_headroom",
        ),
    ),
    Sabotage(
        "resume_at_stop_water",
        "a refusal at stop water lifts only at the resume point above it (no flapping)",
        "app/ingest/admission.py",
        "                floor = self.resume_bytes if self._level is DiskLevel.STOP_WATER else stop",
        "                floor = stop",
        (
            "tests/unit/app/ingest/test_admission.py::test_stop_water_refuses_new_batches_and_resumes_by_itself",
            "tests/unit/app/base/test_diskspace.py::test_nowedge_1_admission_refuses_at_stop_water_by_the_figure_between_two_ticks",
        ),
    ),
    Sabotage(
        "reserve_never_released",
        "a write that finds the volume full releases the emergency reserve and retries",
        "app/base/diskspace.py",
        "            if self.size == 0 or self._state is not ReserveState.IN_PLACE:\n                return 0",
        "            if True:\n                return 0",
        (
            "tests/unit/app/base/test_diskspace.py::test_nowedge_2_the_reserve_is_made_at_start_released_on_enospc_and_made_again",
            "tests/unit/app/base/test_diskspace.py::test_nowedge_2_a_snapshot_install_on_a_full_volume_takes_the_reserve",
            "tests/integration/test_disk_headroom.py::test_nowedge_2_a_volume_filled_to_zero_recovers_without_a_restart",
        ),
    ),
    Sabotage(
        "released_reserve_not_owed",
        "a released reserve is owed: the WAL never gets its space before it is made again",
        "app/base/diskspace.py",
        "        return reserve.owed if reserve is not None and self.reserve_on_volume else 0",
        "        return 0",
        (
            "tests/unit/app/base/test_diskspace.py::test_nowedge_2_the_reserve_is_made_at_start_released_on_enospc_and_made_again",
        ),
    ),
    Sabotage(
        "snapshot_ignores_the_reserve",
        "a snapshot install on a full volume takes the reserve (a horizon can still advance)",
        "app/ingest/snapshot_store.py",
        "            if not is_no_space(exc) or space is None:\n                raise",
        "            if True:\n                raise",
        (
            "tests/unit/app/base/test_diskspace.py::test_nowedge_2_a_snapshot_install_on_a_full_volume_takes_the_reserve",
            "tests/integration/test_disk_headroom.py::test_nowedge_2_a_volume_filled_to_zero_recovers_without_a_restart",
        ),
    ),
    Sabotage(
        "store_ignores_the_reserve",
        "the embedded store's put on a full volume takes the reserve (what a cut publishes)",
        "sink/store.py",
        '            if _local_error_type(exc) != "local_no_space" or ask is None:\n                raise',
        "            if True:\n                raise",
        (
            "tests/unit/app/base/test_diskspace.py::test_nowedge_2_the_embedded_store_on_a_full_volume_takes_the_reserve",
            "tests/integration/test_disk_headroom.py::test_nowedge_2_a_volume_filled_to_zero_recovers_without_a_restart[file]",
        ),
    ),
    Sabotage(
        "checkpoint_spare_after_the_rename",
        "a checkpoint gives up no block: the old mark's inode is the next spare",
        "wal/checkpoint_file.py",
        "    linked = _link_next_spare(fs, root)",
        "    linked = False",
        (
            "tests/unit/wal/test_no_space.py::test_nowedge_2_a_checkpoint_keeps_its_spare_when_another_writer_takes_the_freed_block",
            "tests/unit/wal/test_checkpoint_file.py::test_nowedge_2_the_old_mark_becomes_the_next_spare",
        ),
    ),
    Sabotage(
        "spare_shares_the_live_mark",
        "a spare sharing the live CHECKPOINT's inode is never overwritten in place",
        "wal/checkpoint_file.py",
        "    if st.st_size == SIZE and not _is_live_mark(fs, root, st):\n        return fd",
        "    if st.st_size == SIZE:\n        return fd",
        (
            "tests/unit/wal/test_checkpoint_file.py::test_nowedge_2_a_spare_sharing_the_live_marks_inode_is_never_overwritten_in_place",
        ),
    ),
    # -- damage inside acknowledged frames is corruption, not a torn tail (issue 18 item 5)
    Sabotage(
        "high_water_damage_read_as_torn",
        "damage below a sealed segment's synced high-water is corruption, not a torn tail",
        "wal/scan.py",
        '    how = "sealed" if nxt.header.predecessor_sealed else "closed by a clean rotation"\n',
        "    if nxt.header.predecessor_sealed and prev.stop.damaged:\n"
        "        return None  # the old rule: any damage in a sealed segment is its torn tail\n"
        '    how = "sealed" if nxt.header.predecessor_sealed else "closed by a clean rotation"\n',
        (
            "tests/unit/wal/test_high_water.py::test_nowedge_5_a_bit_flip_below_the_high_water_refuses_recovery_and_quarantine_recovers",
            "tests/integration/test_high_water_serve.py::test_nowedge_5_a_real_node_refuses_a_bit_flip_below_a_sealed_segments_high_water",
        ),
    ),
    Sabotage(
        "high_water_beyond_the_fsync",
        "the high-water a successor records never claims more than a completed fsync covered",
        "wal/rotation.py",
        "flags, old.base, old.synced_lsn)",
        "flags, old.base, old.end_lsn)",
        (
            "tests/unit/wal/test_high_water.py::test_nowedge_5_damage_above_the_high_water_stays_a_legal_torn_tail",
        ),
    ),
    Sabotage(
        "high_water_past_a_torn_tail",
        "a segment open sealed records the end of its valid frames, not of its torn bytes",
        "wal/opening.py",
        "        seg.synced_lsn = scan.valid_end_lsn\n",
        "        seg.synced_lsn = newest_file.data_end\n",
        (
            "tests/unit/wal/test_opening.py::test_torn_tail_is_sealed_and_kept_and_a_second_restart_works",
            "tests/unit/wal/test_high_water.py::test_nowedge_5_rotation_records_the_synced_end_as_the_high_water",
        ),
    ),
    Sabotage(
        "high_water_checkpoint_ignored_at_open",
        "damage below the checkpoint mark in the newest segment refuses the open",
        "wal/opening.py",
        "        if mark is not None:\n            problem = high_water_problem(scan, *mark)\n",
        "        if False:\n            problem = high_water_problem(scan, *mark)\n",
        (
            "tests/unit/wal/test_high_water.py::test_nowedge_5_damage_below_the_checkpoint_in_the_newest_segment_refuses_open",
        ),
    ),
    # -- acknowledgement at the fsync, replay ahead of new frames (issue 15) ------------
    Sabotage(
        "new_frame_turned_before_the_replay",
        "a tenant's new frame is turned only after every replayed frame",
        "app/ingest/stages.py",
        "        if replay is not None:\n            error: BaseException | None = None",
        "        if replay is not None:\n"
        "            threading.Thread(target=lambda: [turn_replayed(i) for i in replay]).start()\n"
        "            replay = None\n"
        "        if replay is not None:\n            error: BaseException | None = None",
        (
            "tests/unit/app/ingest/test_stages.py::test_issue15_replayed_frames_are_turned_before_new_ones",
        ),
    ),
    Sabotage(
        "replayed_frame_is_a_mark",
        "nothing replayed is ever a mark: only a new frame's turn sets it",
        "app/ingest/replay_feed.py",
        "            result = self.miners.mine(tenant, batch.bodies)\n            self.folded[tenant] = offset\n",
        "            result = self.miners.mine(tenant, batch.bodies)\n            self.folded[tenant] = offset\n"
        "            self.mark._last_durable = self.mark._latest = offset\n",
        ("tests/unit/app/node/test_recovery.py::test_issue15_nothing_replayed_is_a_mark",),
    ),
    # -- issue 18 item 6: settlement's intent is durable (RFC 0055 §9.4) ---------------
    Sabotage(
        "intent_never_written",
        "a settlement's intent is durable in PUBLISHED before any row of its span is published",
        "app/ingest/rebuild.py",
        "            self._journal.publish_marks({tenant: PublishedMarks(lo, lo, intent=through)})",
        "            pass",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_a_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy",
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_settlement_records_its_intent_before_the_publish_and_clears_it_with_the_marks",
            "tests/crash/test_settlement_intent_sigkill.py::test_nowedge_6_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy",
        ),
    ),
    Sabotage(
        "intent_ignored_by_recovery",
        "recovery republishes an unconfirmed intent's span under the names its attempt used",
        "app/node/recovery.py",
        "        span = intent_end(self._frontiers.get(tenant))",
        "        span = -1",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_a_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy",
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_repeated_crashes_inside_the_republish_add_no_copy",
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_the_staged_republish_alone_keeps_the_span_from_being_copied",
        ),
    ),
    Sabotage(
        "intent_gates_on_the_intended_marks",
        "an unconfirmed intent's span is never suppressed: recovery gates at the frontier it kept",
        "app/node/recovery.py",
        "    if marks is None:\n        return x, x\n",
        "    if marks is None:\n        return x, x\n    if marks.intent is not None:\n"
        "        return marks.intent.lsn, marks.intent.lsn\n",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_a_sigkill_after_a_partial_publish_loses_nothing_and_duplicates_nothing",
            "tests/crash/test_settlement_intent_sigkill.py::test_nowedge_6_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy",
        ),
    ),
    Sabotage(
        "intent_without_frontier_gated_on_x",
        "an intent recorded without a frontier is replayed from the tenant's snapshot within its span",
        "app/node/recovery.py",
        "    return marks.terminal or (marks.intent is not None and lsn <= marks.intent.lsn)",
        "    return marks.terminal",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_an_intent_without_a_frontier_is_replayed_from_the_tenants_first_frame",
        ),
    ),
    Sabotage(
        "intent_events_named_afresh",
        "an intent span's known-template events are named by their content, so a retry finds them",
        "sink/publisher.py",
        "        return audit_object_name(self._node, part.tenant, day, rows)",
        "        return new_object_name(self._node)",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_a_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy",
        ),
    ),
    Sabotage(
        "intent_cleared_short_of_its_end",
        "an intent stays in PUBLISHED until a write's marks reach the end of its span",
        "wal/frontiers.py",
        "        if m.intent is None and _reaches(m, old.intent):",
        "        if m.intent is None:",
        (
            "tests/unit/app/ingest/test_settlement_intent.py::test_nowedge_6_a_publish_the_store_refused_keeps_the_intent_until_a_cut_covers_the_span",
            "tests/unit/wal/test_frontiers.py::test_nowedge_6_an_intent_is_recorded_with_its_frontier_and_kept_until_marks_reach_its_end",
        ),
    ),
    # -- exactly once in the store (issue 16) -------------------------------------------
    Sabotage(
        "landed_ignored_by_recovery",
        "recovery suppresses what an object published above the frontier already holds",
        "app/node/recovery.py",
        "        wanted = [rec for rec in self._intents if needed(rec)]",
        "        wanted: list[IntentRecord] = []",
        (
            "tests/unit/app/ingest/test_landed.py::test_issue16_rows_published_above_the_frontier_are_not_published_again",
            "tests/unit/app/ingest/test_landed.py::test_issue16_template_events_published_before_a_crash_are_not_published_again",
            "tests/crash/test_exactly_once_serve.py::test_issue16_a_sigkill_at_each_step_of_a_publish_adds_no_copy",
        ),
    ),
    Sabotage(
        "claim_wider_than_held",
        "an object's claim names exactly the frames it holds, never a range wider than them",
        "sink/claims.py",
        "        return Claim(key, part.kind, part.tenant, part.day, frames=tuple(sorted(frames)))",
        "        return Claim(key, part.kind, part.tenant, part.day,"
        " frames=tuple(range(min(frames), max(frames) + 1)))",
        (
            "tests/unit/app/ingest/test_landed.py::test_issue16_an_object_states_exactly_the_frames_it_holds_after_a_merge",
        ),
    ),
    Sabotage(
        "intent_after_the_put",
        "an object's claim is durable before its PUT starts",
        "sink/publisher.py",
        "        intended = part.spool is not None or self._intend(key, d)\n",
        "        intended = part.spool is not None\n",
        (
            "tests/crash/test_exactly_once_serve.py::test_issue16_a_sigkill_at_each_step_of_a_publish_adds_no_copy",
        ),
        (
            (
                '            self._step("publish.stored")\n',
                '            self._step("publish.stored")\n'
                "            intended = part.spool is not None or self._intend(key, d)\n",
            ),
        ),
    ),
    Sabotage(
        "ambiguous_retry_renamed",
        "an ambiguous publish is retried under the key its attempt used",
        "sink/publisher.py",
        "                return self._failed(d, kind, exc.error_type, exc, name), exc",
        "                return self._failed(d, kind, exc.error_type, exc), exc",
        (
            "tests/unit/app/ingest/test_landed.py::test_issue16_an_ambiguous_put_retried_in_process_is_stored_once",
            "tests/unit/sink/test_retry_identity.py::test_rfc0055_9_3_an_ambiguous_retry_keeps_its_identity_and_never_merges_with_new_rows",
        ),
    ),
    # -- the native decoder (issue 23): a C file, so the copy's extension is rebuilt ------
    Sabotage(
        "native_duplicate_key_first_value",
        "the native decoder gives what the upb path gives: a duplicated key keeps its last value",
        "app/receive/_otlpdecode.c",
        "        if (e[i].first != i) {\n            e[e[i].first].voff = e[i].voff;",
        "        if (e[i].first != i && 0) {\n            e[e[i].first].voff = e[i].voff;",
        (
            "tests/unit/app/receive/test_native.py::test_native_1_fast_path_requests_decode_natively_and_equal_upb",
            "tests/unit/app/receive/test_native.py::test_native_1_many_attributes_with_repeated_keys_equal_upb",
        ),
    ),
    Sabotage(
        "native_accepts_invalid_utf8",
        "the native decoder accepts only what upb accepts: a string field that is not UTF-8 is refused",
        "app/receive/_otlpdecode.c",
        "    return utf8_valid(sub->p, (size_t)(sub->end - sub->p)) ? ST_OK : FB_UTF8;",
        "    return ST_OK;",
        (
            "tests/unit/app/receive/test_native.py::test_native_1_requests_of_every_shape_equal_upb_or_fall_back",
        ),
    ),
    Sabotage(
        "native_resource_entries_unlimited",
        "the native decoder refuses what the upb path refuses for a request limit: a "
        "resource's attributes count once per row",
        "app/receive/_otlpdecode.c",
        "            n[C_ENTRIES] > limits[2] || n[C_KEY_BYTES_MAX] > limits[3] ||",
        "            n[C_KEY_BYTES_MAX] > limits[3] ||",
        (
            "tests/unit/app/receive/test_native.py::test_native_1_each_limit_refuses_what_the_upb_path_refuses",
            "tests/unit/app/receive/test_native.py::test_native_1_a_limit_refusal_names_the_setting_on_either_decoder",
        ),
    ),
    Sabotage(
        "native_fallback_said_quietly",
        "a node on the upb path for want of the extension says so loudly (a warning)",
        "app/receive/native.py",
        '    emit("receive.decoder", details, "warning" if why else "info")',
        '    emit("receive.decoder", details, "info")',
        (
            "tests/integration/test_decoder.py::test_native_2_serve_without_the_extension_runs_on_upb_and_says_so",
        ),
    ),
    # -- the native miner (issue 23 item 5): a C file, so the copy's extension is rebuilt -
    Sabotage(
        "native_miner_tie_takes_the_last",
        "the native miner mines as the Python path: of equally similar templates with as many wildcards, the first",
        "app/ingest/mining/_minefast.c",
        "        if (sim > max_sim || (sim == max_sim && shape.nwild > max_params)) {",
        "        if (sim > max_sim || (sim == max_sim && shape.nwild >= max_params)) {",
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_of_equal_exact_templates_takes_the_first",
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_batch_for_batch",
        ),
    ),
    Sabotage(
        "native_miner_leaf_evicts_the_newest",
        "the native miner mines as the Python path: a full leaf evicts its least recently used",
        "app/ingest/mining/_minefast.c",
        "        int less = best_touched == NULL ? 1 : PyObject_RichCompareBool(touched, best_touched, Py_LT);",
        "        int less = best_touched == NULL ? 1 : PyObject_RichCompareBool(touched, best_touched, Py_GT);",
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_batch_for_batch",
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_hands_its_search_to_python_for_creations_and_widenings",
        ),
    ),
    Sabotage(
        "native_miner_widening_handed_back_as_a_creation",
        "the native miner mines as the Python path: the search it hands back for a widening "
        "names the template to widen",
        "app/ingest/mining/tenant_miner.py",
        "                template = None if best_id is None else templates[best_id]",
        "                template = None",
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_batch_for_batch",
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_hands_its_search_to_python_for_creations_and_widenings",
        ),
    ),
    Sabotage(
        "native_miner_size_not_bumped",
        "the native miner mines as the Python path: a matched cluster's size grows by one",
        "app/ingest/mining/_minefast.c",
        "    int rc = bigger == NULL ? -1 : PyObject_SetAttr(cluster, s_size, bigger);",
        "    int rc = bigger == NULL ? -1 : 0;",
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_batch_for_batch",
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_on_realistic_lines",
        ),
    ),
    Sabotage(
        "native_miner_lru_not_touched",
        "the native miner mines as the Python path: a match is Drain's most recently used",
        "app/ingest/mining/_minefast.c",
        "        if (touch != Py_None) {",
        "        if (touch != Py_None && 0) {",
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_batch_for_batch",
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_equals_the_python_path_on_realistic_lines",
        ),
    ),
    Sabotage(
        "native_miner_fallback_said_quietly",
        "a node mining on the Python path for want of the extension says so (a warning)",
        "app/ingest/mining/native_miner.py",
        '    emit("ingest.miner", details, "warning" if _UNAVAILABLE else "info")',
        '    emit("ingest.miner", details, "info")',
        (
            "tests/unit/app/ingest/mining/test_native_miner.py::test_native_miner_absent_mines_on_the_python_path_and_says_so",
        ),
    ),
    # -- issue 22 items 2, 5 and 8: every state ends well ---------------------------------
    Sabotage(
        "intent_repair_through_a_temp",
        "a torn intent tail is cut in place at open: a restart on a full volume starts",
        "wal/intents.py",
        "                        fs.ftruncate(fd, found.valid_end)\n",
        "                        _rewrite(fs, root, [encode_record(r) for r in found.records])\n",
        (
            "tests/unit/wal/test_intents.py::test_every_state_2_a_torn_tail_is_cut_in_place_without_a_new_block",
            "tests/integration/test_start_on_a_full_volume.py::test_every_state_2_a_restart_on_a_full_volume_starts",
        ),
    ),
    Sabotage(
        "start_up_write_not_from_reserve",
        "a start-up write that finds no space takes the emergency reserve's",
        "app/base/diskspace.py",
        "    try:\n        return attempt()\n    except Exception as exc:\n        if not (reserve.on_volume",
        "    return attempt()\n    try:\n        return attempt()\n    except Exception as exc:\n        if not (reserve.on_volume",
        (
            "tests/unit/app/base/test_diskspace.py::test_every_state_2_a_start_up_write_without_space_takes_the_reserve_once",
            "tests/integration/test_start_on_a_full_volume.py::test_every_state_2_a_restart_on_a_full_volume_starts",
        ),
    ),
    Sabotage(
        "small_volume_not_checked",
        "a volume no larger than the reserve and stop water refuses to start",
        "app/base/diskspace.py",
        "        if need and size <= need:\n",
        "        if need and size < 0:\n",
        (
            "tests/unit/app/base/test_diskspace.py::test_every_state_2_a_volume_too_small_for_reserve_and_stop_water_is_refused",
            "tests/integration/test_start_on_a_full_volume.py::test_every_state_2_a_volume_smaller_than_reserve_and_stop_water_refuses_to_start",
        ),
    ),
    Sabotage(
        "current_segment_high_water_not_recorded",
        "the current segment's synced high-water is recorded at the group commit's cadence",
        "wal/commit.py",
        "        if self._after_rounds is not None:\n            self._after_rounds()\n",
        "",
        (
            "tests/unit/wal/test_highwater.py::test_every_state_5_damage_below_the_recorded_high_water_is_corruption",
        ),
    ),
    Sabotage(
        "newest_damage_below_high_water_read_as_torn",
        "damage below HIGHWATER's claim in the newest segment is corruption, not a torn tail",
        "wal/opening.py",
        "                self._high_water.claim(newest_file),\n",
        "                None,\n",
        (
            "tests/unit/wal/test_highwater.py::test_every_state_5_damage_below_the_recorded_high_water_is_corruption",
        ),
    ),
    Sabotage(
        "high_water_claims_an_unsynced_end",
        "HIGHWATER never claims more than a completed data fsync covered",
        "wal/highwater.py",
        "            lsn = cur.synced_lsn\n",
        "            lsn = cur.end_lsn\n",
        (
            "tests/unit/wal/test_highwater.py::test_every_state_5_a_frame_appended_during_the_round_is_never_claimed",
            "tests/unit/wal/test_highwater.py::test_every_state_5_a_failed_data_fsync_is_never_claimed",
        ),
    ),
    Sabotage(
        "torn_tail_frames_uncounted",
        "the valid frames after a torn tail are counted and named",
        "wal/opening.py",
        "        after = frames_after_damage(scan.data, at, path)\n",
        "        after = frames_after_damage(scan.data, at, path)[:0]\n",
        (
            "tests/unit/wal/test_highwater.py::test_every_state_5_a_torn_tail_counts_and_names_the_frames_after_it",
        ),
    ),
    Sabotage(
        "store_not_probed_at_start",
        "a wrong store configuration refuses the start",
        "app/node/server.py",
        "    if given_store is None:  # the store the settings name",
        "    if False:  # the store the settings name",
        (
            "tests/integration/test_store_probe_serve.py::test_every_state_8_a_wrong_store_configuration_refuses_to_start",
        ),
    ),
    Sabotage(
        "store_outage_refuses_the_start",
        "a store that does not answer at start-up starts the node with ourios_store_up 0",
        "app/node/storeprobe.py",
        "    return error.error_type not in TRANSIENT and error.error_type not in ANSWERS\n",
        "    return error.error_type not in ANSWERS\n",
        (
            "tests/unit/app/node/test_storeprobe.py::test_every_state_8_a_transient_error_starts_with_the_store_down",
            "tests/integration/test_store_probe_serve.py::test_every_state_8_a_store_down_at_start_starts_and_says_so",
        ),
    ),
    Sabotage(
        "store_up_never_comes_back",
        "ourios_store_up returns to 1 once the store answers",
        "app/node/storeprobe.py",
        "            raise\n        self._health.answered()\n        return result\n",
        "            raise\n        return result\n",
        (
            "tests/unit/app/node/test_storeprobe.py::test_every_state_8_a_transient_error_starts_with_the_store_down",
        ),
    ),
    # -- bounded whatever the outage (issue 21 item 1) -------------------------------------
    Sabotage(
        "memory_bound_ignored",
        "the rows in memory stay under sink.ceiling_bytes: what does not fit is spooled",
        "app/node/server.py",
        "        ceiling_bytes=settings.sink.ceiling_bytes,\n        max_object_bytes",
        "        ceiling_bytes=None,\n        max_object_bytes",
        (
            "tests/crash/test_bounded_memory_serve.py::test_bounded_1_a_long_store_outage_keeps_memory_under_the_bound_and_loses_nothing",
        ),
    ),
    Sabotage(
        "spiller_never_spills",
        "past the spill mark the largest partitions leave memory",
        "sink/buffers.py",
        "            if self._held <= self.spill_target:\n                return None",
        "            if True:\n                return None",
        (
            "tests/unit/sink/test_spool.py::test_bounded_1_rows_past_the_spill_mark_spill_to_the_spool_and_memory_comes_down",
        ),
    ),
    Sabotage(
        "spooled_settled_as_published",
        "a spooled unit is a place of its own: no cut stamps behind it until it is in the store",
        "sink/publisher.py",
        "        outcome = self._buffers.requeue(d, error_type, identity=name, claimed=True, spooled=spooled)",
        "        outcome = self._buffers.published(d)",
        (
            "tests/unit/sink/test_spool.py::test_bounded_1_a_spooled_unit_is_published_from_its_file_once_under_its_name",
            "tests/unit/app/ingest/test_landed.py::test_bounded_1_a_restart_during_an_outage_re_derives_the_spool_under_the_ceiling",
        ),
    ),
    Sabotage(
        "spooled_unit_renamed",
        "a spooled unit keeps the name it was spooled (and its intent recorded) under",
        "sink/publisher.py",
        "        return part.identity, key_of(part.tenant, day, part.identity)",
        "        name = new_object_name(self._node)\n        return name, key_of(part.tenant, day, name)",
        (
            "tests/unit/sink/test_spool.py::test_bounded_1_a_spooled_unit_is_published_from_its_file_once_under_its_name",
        ),
    ),
    Sabotage(
        "intent_per_attempt",
        "a clean failure takes its intent back: one record per object that may exist",
        "sink/publisher.py",
        "                self._take_back(key)  # nothing was written: its intent holds nothing",
        "                pass",
        (
            "tests/unit/sink/test_spool.py::test_bounded_1_one_intent_per_object_that_may_exist_not_one_per_attempt",
        ),
    ),
    Sabotage(
        "absent_intents_kept_at_restart",
        "a restart takes back the intents of the objects the store does not hold",
        "app/ingest/landed.py",
        "                if self._on_absent is not None:",
        "                if False:",
        (
            "tests/unit/app/ingest/test_landed.py::test_bounded_1_a_restart_during_an_outage_re_derives_the_spool_under_the_ceiling",
            "tests/unit/app/ingest/test_landed.py::test_bounded_1_the_restart_check_lists_a_crowded_prefix_and_forgets_the_absent",
        ),
    ),
    Sabotage(
        "spool_not_counted_by_disk_admission",
        "what the spool writes counts in disk admission's free-space figure",
        "sink/spool.py",
        "        if self._on_write is not None:\n            self._on_write(len(data))",
        "        if False:\n            pass",
        (
            "tests/unit/sink/test_spool.py::test_bounded_1_the_spool_of_a_previous_run_is_discarded_and_disk_admission_counts_the_spool",
        ),
    ),
    Sabotage(
        "merged_past_max_object_bytes",
        "no partition grows past sink.max_object_bytes, a failed publish included",
        "sink/buffers.py",
        "            elif self._over_object_locked(part):",
        "            elif False:",
        ("tests/unit/sink/test_spool.py::test_bounded_1_no_partition_grows_past_max_object_bytes",),
    ),
    # -- every state ends well: dead letters (issue 22 item 6) ------------------------
    Sabotage(
        "dead_letter_never",
        "a partition the store refuses for good is dead-lettered after bounded attempts",
        "sink/publisher.py",
        "            if strikes.count < self.dead_letter_attempts:\n                return 0",
        "            if True:\n                return 0",
        (
            "tests/unit/sink/test_deadletter.py::test_every_state_6_a_partition_refused_for_good_is_dead_lettered_and_the_cut_completes",
            "tests/unit/sink/test_deadletter.py::test_every_state_6_rows_that_cannot_be_encoded_are_dead_lettered_as_an_arrow_stream",
        ),
    ),
    Sabotage(
        "dead_letter_settled_unwritten",
        "a dead-lettered partition settles only once its file is durable",
        "sink/publisher.py",
        "            path = self.dead_letter.write(key, data)",
        "            path = self.dead_letter.root / key",
        (
            "tests/unit/sink/test_deadletter.py::test_every_state_6_a_partition_refused_for_good_is_dead_lettered_and_the_cut_completes",
            "tests/unit/sink/test_deadletter.py::test_every_state_6_a_dead_letter_that_cannot_be_written_keeps_the_rows",
        ),
    ),
    Sabotage(
        "dead_letter_on_any_error",
        "only a permanent error class of one partition dead-letters it",
        "sink/publisher.py",
        "        if self.dead_letter is None or error_type not in PERMANENT_ERRORS:",
        "        if self.dead_letter is None:",
        (
            "tests/unit/sink/test_deadletter.py::test_every_state_6_no_dead_letter_for_a_node_wide_denial_or_a_transient_error",
        ),
    ),
    Sabotage(
        "dead_letter_node_wide_denial",
        "a store that denies every object dead-letters nothing: the WAL absorbs it",
        "sink/publisher.py",
        "            if error_type in DENIALS and self._landed == strikes.landed_before:",
        "            if False:",
        (
            "tests/unit/sink/test_deadletter.py::test_every_state_6_no_dead_letter_for_a_node_wide_denial_or_a_transient_error",
        ),
    ),
    # -- every state ends well: threads and clocks (issue 22 items 3 and 7) ------------
    Sabotage(
        "supervisor_swallows_without_restarting",
        "a loop that raises is logged, counted and run again, never just dropped",
        "app/threads.py",
        "                if not self.crashed(name, exc, restart=restart, stop=stop):\n"
        "                    return",
        "                self.crashed(name, exc, restart=restart, stop=stop)\n                return",
        (
            "tests/unit/app/test_threads.py::test_every_state_3_a_crashed_loop_is_logged_once_counted_and_restarted",
            "tests/integration/test_thread_supervision.py::test_every_state_3_a_crashed_housekeeping_thread_is_logged_counted_restarted_then_fails_healthz",
        ),
    ),
    Sabotage(
        "healthz_ignores_a_dead_thread",
        "a thread that cannot run again makes the node not alive: /healthz answers 503",
        "app/ingest/pipeline.py",
        "        return self._threads is None or self._threads.healthy",
        "        return True",
        (
            "tests/unit/app/ingest/test_stages.py::test_every_state_3_a_crashed_turn_thread_is_not_restarted_and_fails_the_node",
            "tests/integration/test_thread_supervision.py::test_every_state_3_a_crashed_housekeeping_thread_is_logged_counted_restarted_then_fails_healthz",
        ),
    ),
    Sabotage(
        "turn_thread_restarted",
        "the turn thread is never restarted: a restart could let the mark pass an unturned frame",
        "app/ingest/stages.py",
        '            thread_name="ourios-turn",\n            restart=False,',
        '            thread_name="ourios-turn",\n            restart=True,',
        (
            "tests/unit/app/ingest/test_stages.py::test_every_state_3_a_crashed_turn_thread_is_not_restarted_and_fails_the_node",
        ),
    ),
    Sabotage(
        "event_write_fails_the_append",
        "an event the WAL emits under its mutex goes out after it; a failed one fails nothing",
        "wal/log.py",
        "        if self._holder == threading.get_ident():\n"
        "            self._pending.append((name, fields))\n"
        "        else:\n"
        "            self._deliver(name, fields)",
        "        self._sink(name, fields)",
        (
            "tests/unit/wal/test_log.py::test_every_state_3_an_event_sink_that_raises_fails_no_append",
            "tests/unit/wal/test_log.py::test_every_state_3_an_event_sink_that_blocks_holds_no_other_append",
        ),
    ),
    Sabotage(
        "barrier_timer_on_the_wall_clock",
        "the barrier's timer and retries run on the monotonic clock",
        "app/node/server.py",
        "        segment_age_secs=wal.segment_age_secs,\n        clock=monotonic,",
        "        segment_age_secs=wal.segment_age_secs,\n        clock=clock,",
        (
            "tests/unit/app/node/test_server.py::test_every_state_7_a_wall_clock_stepped_back_an_hour_stalls_no_cadence",
        ),
    ),
    Sabotage(
        "inflight_bound_ignored",
        "a receiving process refuses requests beyond its in-flight bound (503 / "
        "RESOURCE_EXHAUSTED with Retry-After) before it reads their bodies",
        "app/receive/inflight.py",
        '        """A ticket for one request holding `size` bytes, or `Overloaded`."""\n',
        '        """A ticket for one request holding `size` bytes, or `Overloaded`."""\n'
        "        return Ticket(self, 0)\n",
        (
            "tests/unit/app/receive/test_inflight.py::test_bounded_3_requests_beyond_the_count_are_refused_with_a_retry",
            "tests/unit/app/receive/test_otlp_http.py::test_bounded_3_http_inflight_bound_refuses_503_before_reading_the_body",
            "tests/unit/app/receive/test_otlp_grpc.py::test_bounded_3_grpc_inflight_bound_is_resource_exhausted_with_retry_info",
        ),
    ),
    Sabotage(
        "attributes_per_record_unchecked",
        "a request over an expansion limit is refused 400 naming it, before it is flattened",
        "app/receive/otlp.py",
        "                    own = len(lr.attributes)\n                    if own > per_record:",
        "                    own = len(lr.attributes)\n                    if False:",
        (
            "tests/unit/app/receive/test_otlp.py::test_bounded_3_counts_are_refused_before_anything_is_flattened",
        ),
    ),
    Sabotage(
        "miner_unbounded",
        "every tenant's miner is bounded: templates (LRU, ids never reused), the body head "
        "mined, its memory and snapshot",
        "app/node/server.py",
        "    return MinerConfig(\n        max_clusters=miner.max_templates,",
        "    return MinerConfig()\n    return MinerConfig(\n        max_clusters=miner.max_templates,",
        (
            "tests/integration/test_noisy_tenant_serve.py::test_bounded_2_a_noisy_tenant_does_not_stall_31_others",
        ),
    ),
    Sabotage(
        "turn_share_ignored",
        "a tenant over its share of the ingest turn has its own batches refused (503 "
        "tenant_turn_share, Retry-After), never another tenant's",
        "app/ingest/shares.py",
        "            if over and self._contended_locked(tenant, now):",
        "            if False:",
        (
            "tests/unit/app/ingest/test_shares.py::test_bounded_2_a_tenant_over_its_share_is_refused_and_no_other_is",
            "tests/integration/test_noisy_tenant_serve.py::test_bounded_2_a_noisy_tenant_does_not_stall_31_others",
        ),
    ),
    Sabotage(
        "turn_share_cost_not_measured",
        "a tenant's share is of the turn's time: its work is charged at what a unit takes "
        "on this node, as measured",
        "app/ingest/shares.py",
        "            bucket.balance -= work * self._tenant_unit_secs_locked(bucket)",
        "            bucket.balance -= work * INITIAL_UNIT_SECS",
        (
            "tests/unit/app/ingest/test_shares.py::test_bounded_2_the_share_is_of_the_turns_measured_time",
            "tests/unit/app/ingest/test_shares.py::test_bounded_2_a_tenant_is_charged_what_its_own_units_take",
        ),
    ),
    Sabotage(
        "tenant_backlog_share_ignored",
        "a tenant over its share of the turn backlog has its own batches refused (503 "
        "tenant_backlog), never another tenant's",
        "app/ingest/stages.py",
        "            if share is not None and mine is not None and mine[0] + len(payload) > share:",
        "            if False:",
        (
            "tests/unit/app/ingest/test_stages.py::test_bounded_2_one_tenant_over_its_backlog_share_is_refused_and_others_are_not",
        ),
    ),
    Sabotage(
        "expanded_bytes_unchecked",
        "a request whose rows would hold more than server.max_expanded_bytes is refused 400 "
        "naming it, before anything is copied per row",
        "app/receive/otlp.py",
        "        if check.limits is not None:\n            check.repeated(resource, rl.scope_logs)",
        "        if False:\n            check.repeated(resource, rl.scope_logs)",
        (
            "tests/unit/app/receive/test_otlp.py::test_bounded_3_expansion_limits_refuse_naming_the_setting",
            "tests/unit/app/receive/test_native.py::test_bounded_3_the_upb_path_counts_the_bytes_the_rows_hold_on_every_shape",
        ),
        more=(
            (
                "    if check.limits is not None:\n        check.rows(",
                "    if False:\n        check.rows(",
            ),
        ),
    ),
    Sabotage(
        "refused_parse_kept_resident",
        "the parse of a large request refused over a limit is given back to the kernel",
        "app/receive/otlp.py",
        "            release_freed_memory()\n",
        "            pass\n",
        (
            "tests/unit/app/receive/test_otlp.py::test_bounded_3_a_large_request_refused_over_a_limit_gives_its_parse_back",
        ),
    ),
    Sabotage(
        "expanded_bytes_unchecked_native",
        "the native decoder refuses what the upb path refuses for server.max_expanded_bytes, "
        "before it copies a row",
        "app/receive/_otlpdecode.c",
        " || n[C_EXPANDED] > limits[5])",
        ")",
        (
            "tests/unit/app/receive/test_native.py::test_bounded_3_expanded_bytes_refuse_the_same_requests_on_either_decoder",
            "tests/unit/app/receive/test_native.py::test_bounded_3_a_small_body_expanding_to_gigabytes_is_refused_before_its_rows",
        ),
    ),
    Sabotage(
        "open_new_tenant_rate_ignored",
        "in open mode new tenants take slots at a bounded rate",
        "app/ingest/tenants.py",
        "                if self._rate is not None:\n                    self._rate.take(tenant)\n",
        "",
        (
            "tests/unit/app/ingest/test_tenants.py::test_bounded_4_open_mode_takes_new_tenants_at_the_configured_rate",
        ),
    ),
    Sabotage(
        "records_not_rematched",
        "a record's parameters fill the template version it names, the batch's last",
        "app/ingest/mining/tenant_miner.py",
        "        if events:\n            changes = ",
        "        if False:\n            changes = ",
        (
            "tests/unit/app/ingest/mining/test_tenant_miner.py::test_issue24_4_every_record_of_a_batch_fills_its_template_last_version_in_the_batch",
            "tests/integration/test_template_params_serve.py::test_issue24_4_both_records_fill_the_published_version_embedded",
        ),
    ),
    Sabotage(
        "stale_versions_not_rematched_at_encode",
        "a record is published at its template's version pinned when its partition left",
        "sink/publisher.py",
        "            if part.rematch is not None:\n",
        "            if False:\n",
        (
            "tests/unit/app/cadence/test_barrier_versions.py::test_issue24_4_a_cut_publishes_at_its_marks_versions_when_the_miner_is_past_it",
            "tests/unit/app/cadence/test_barrier_versions.py::test_issue24_4_a_replay_after_a_crash_publishes_the_same_rows_for_the_same_frames",
            "tests/integration/test_template_params_serve.py::test_issue24_4_both_records_fill_the_published_version_embedded",
            "tests/integration/test_template_params_serve.py::test_issue24_4_a_replay_after_sigkill_publishes_the_same_rows_embedded",
        ),
    ),
    Sabotage(
        "versions_map_follows_the_live_miner",
        "a cut's rows are published at the versions of its mark, not the live miner's",
        "app/ingest/mining/tenant_miner.py",
        "        self._widened_shared = True\n",
        "        self._widened_shared = False\n",
        (
            "tests/unit/app/ingest/mining/test_rematch.py::test_issue24_4_a_pinned_map_keeps_the_versions_of_its_instant",
            "tests/unit/app/cadence/test_barrier_versions.py::test_issue24_4_a_cut_publishes_at_its_marks_versions_when_the_miner_is_past_it",
        ),
    ),
    Sabotage(
        "versions_pinned_to_a_failed_tree",
        "no row is pinned to a version a mining failure's lost event announced",
        "app/ingest/cuts.py",
        "            if miner is not None and not miner.failed and tenant not in unsettled:\n",
        "            if miner is not None:\n",
        (
            "tests/unit/app/cadence/test_barrier_versions.py::test_issue24_4_a_tree_a_mining_failure_left_pins_nothing",
        ),
    ),
    Sabotage(
        "rematch_splits_the_whole_body",
        "a record is re-matched on the head of its body the miner mined",
        "app/ingest/mining/tokens.py",
        "    if max_tokens is not None and len(tokens) > max_tokens:\n        del tokens[max_tokens:]\n",
        "",
        (
            "tests/unit/app/ingest/mining/test_rematch.py::test_issue24_4_a_truncated_body_is_rematched_on_the_head_the_miner_mined",
        ),
    ),
    Sabotage(
        "malloc_arenas_unbounded",
        "the core and its workers run with two malloc arenas unless the operator says",
        "app/base/malloc_arenas.py",
        "DEFAULT_ARENAS = 2\n",
        "DEFAULT_ARENAS = 0\n",
        (
            "tests/unit/app/base/test_malloc_arenas.py::test_bounded_1_arenas_default_to_two_and_the_workers_inherit_the_limit",
        ),
    ),
    # -- what an operator sees: logs and process metrics (issue 24) ---------------------
    Sabotage(
        "floor_warns_before_first_cut",
        "a tenant waiting for its first cut is pinned by design and warns nothing",
        "app/cadence/housekeeping.py",
        "            and floor.oldest_pinned.lsn <= checkpoint.lsn\n",
        "",
        (
            "tests/unit/app/cadence/test_housekeeping.py::test_clone_6_a_new_tenant_waiting_for_its_first_cut_is_pinned_without_a_warning",
        ),
    ),
    Sabotage(
        "floor_pin_never_warns",
        "a pin the checkpoint has passed warns once (wal.floor.pinned)",
        "app/cadence/housekeeping.py",
        "        held = (\n            isinstance(floor, FloorPinned)",
        "        held = False and (\n            isinstance(floor, FloorPinned)",
        (
            "tests/unit/app/cadence/test_housekeeping.py::test_clone_6_a_pin_the_checkpoint_passed_warns_once_then_lifts",
        ),
    ),
    Sabotage(
        "process_series_core_only",
        "/metrics carries process_* for the core and for each worker",
        "app/node/metrics.py",
        '        processes += [({"worker": str(i)}, pid) for i, pid in sorted(self._workers().items())]\n',
        "",
        (
            "tests/integration/test_operator_view.py::test_clone_7_metrics_show_process_series_for_the_core_and_each_worker",
        ),
    ),
    # -- TLS (issue 24 item 5) -----------------------------------------------------------
    Sabotage(
        "tls_certificate_never_reloaded",
        "a renewed certificate is served to new connections without a restart",
        "app/receive/tls.py",
        "            if seen != self._seen:",
        "            if False:",
        (
            "tests/unit/app/receive/test_tls.py::test_clone_5_a_flipped_secret_is_served_from_the_next_handshake",
            "tests/integration/test_tls_serve.py::test_clone_5_a_rotated_certificate_is_served_to_new_connections",
        ),
    ),
    Sabotage(
        "tls_bad_pair_replaces_the_served_one",
        "a renewed pair that does not load never replaces the certificate in service",
        "app/receive/tls.py",
        "            ctx = _context(cert, key, self._ca)\n        except (TlsError, OSError) as exc:",
        "            ctx = _context(cert, cert, None)\n        except (TlsError, OSError) as exc:\n            self._pair = (cert, key)",
        (
            "tests/unit/app/receive/test_tls.py::test_clone_5_a_pair_that_does_not_load_keeps_the_certificate_in_service",
        ),
    ),
)


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".venv", ".cache", ".git", "__pycache__", ".hypothesis", "*.pyc", "build", "*.so"
    )
    shutil.copytree(ROOT, dest, ignore=ignore, dirs_exist_ok=True)


def build_native(tree: Path) -> None:
    """Compile the copy's C extension in place (app/receive/_otlpdecode.c): the tests
    import the copy, so a sabotage of the C file needs its own build, and so does the
    file restored."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_run(tree: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """Run ``tests`` in their own session, output to a file: a sabotage may leave
    processes behind (a worker that outlives its core holds inherited pipes open), so the
    run waits for pytest alone and then kills whatever is left of its session."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", *tests]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            code = -signal.SIGKILL
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        return subprocess.CompletedProcess(cmd, code, out.read(), "")


def control(tree: Path, tests: tuple[str, ...], seen: dict[tuple[str, ...], str]) -> str:
    """Run ``tests`` on the unbroken tree: a sabotage only counts as caught when the same
    tests pass without it (else a missing tool or a flake would pass for a catch).
    Returns "" when they pass, else why not."""
    if tests not in seen:
        proc = pytest_run(tree, tests)
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        seen[tests] = "" if proc.returncode == 0 else f"exit {proc.returncode}:\n{tail}"
    return seen[tests]


def run(sabotage: Sabotage, tree: Path) -> tuple[bool, str]:
    target = tree / sabotage.file
    original = (ROOT / sabotage.file).read_text()
    broken = original
    for old, new in ((sabotage.old, sabotage.new), *sabotage.more):
        if old not in broken:
            return False, f"the sabotage no longer applies: {old!r} not in {sabotage.file}"
        broken = broken.replace(old, new, 1)
    native = sabotage.file.endswith(".c")
    target.write_text(broken)
    try:
        if native:
            build_native(tree)
        proc = pytest_run(tree, sabotage.tests)
    finally:
        target.write_text(original)
        if native:
            build_native(tree)
    failed = [  # pytest's summary lines, not captured log lines that start alike
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR ")) and "::" in line.split()[1]
    ]
    if proc.returncode == 0:
        return False, "no test failed"
    if proc.returncode == 5 or not failed:
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        return False, f"the tests did not run cleanly (exit {proc.returncode}):\n{tail}"
    return True, failed[0].split(" - ")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only sabotages whose name contains this")
    args = ap.parse_args()
    chosen = [s for s in SABOTAGES if args.k in s.name]
    uncaught = 0
    with tempfile.TemporaryDirectory(prefix="sabotage-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        build_native(tree)  # from the copied source, whatever the checkout's build
        controls: dict[tuple[str, ...], str] = {}
        for s in chosen:
            unbroken = control(tree, s.tests, controls)
            if unbroken:
                caught, detail = False, f"the tests fail on the unbroken tree ({unbroken})"
            else:
                caught, detail = run(s, tree)
            mark = "caught  " if caught else "UNCAUGHT"
            print(f"{mark} {s.name:<28} {s.rule}\n         -> {detail}", flush=True)
            uncaught += not caught
    print(f"{len(chosen) - uncaught} of {len(chosen)} sabotages caught")
    return 1 if uncaught else 0


if __name__ == "__main__":
    raise SystemExit(main())
