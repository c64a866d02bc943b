"""The soak report: PNG plots of the sampled series and a markdown summary.

Inputs are the files a run leaves in its output directory: ``samples.jsonl``
(``soak.sampler``), ``kills.jsonl`` (``soak.chaos``), ``verify.json``
(``soak.verify``) and ``run.json`` (the run's settings and timeline, written by
``soak.run``). Outputs, in the same directory:

- ``wal.png`` — WAL bytes on disk and unreclaimed bytes against the checkpoint LSN
  (all in MiB; the checkpoint is a byte position, so its slope is the WAL write rate
  behind the barrier), and the segment count against the derived bound;
- ``ingest.png`` — acknowledged records/s and refused/failed requests/s;
- ``latency.png`` — ack latency p50/p99 per sampling interval (from the
  ``ourios_ingest_ack_seconds`` bucket deltas);
- ``summary.md`` — the table below, then the verifier's lines.

Every plot marks each SIGKILL with a vertical line and shades the samples where the
node did not answer. Matplotlib runs on the Agg backend (no display).

The segment bound (``segment_bound``), derived from the reclamation rule (DESIGN.md §5.7):
a closed segment is unlinked by the first housekeeping pass after a barrier whose
checkpoint covers it. A segment closed just after a cut waits up to one barrier period
B for the next cut; if a SIGKILL lands just before that cut, it waits the downtime D and
a further B for the new process's first cut; the cut's flush and publish take at most
another B at soak rates; then up to one housekeeping period H. So no closed segment is
older than 3B + D + H, and segments are created at most ``r/S + 1/A`` per second
(size rotation at WAL write rate r bytes/s with S-byte segments, plus age rotation every
A seconds). With the active segment and one sealed by a torn tail at restart::

    max segments ≤ ceil((r/S + 1/A) · (3B + D + H)) + 2

r is estimated from the run itself: the highest checkpoint LSN over the load's
duration, × 1.5 for burstiness.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from soak.chaos import Kill  # noqa: E402
from soak.sampler import counter_deltas, interval_quantiles, restarts  # noqa: E402

__all__ = [
    "Summary",
    "estimate_wal_rate",
    "segment_bound",
    "summarise",
    "write_report",
]

MIB: Final = 1024 * 1024
RATE_HEADROOM: Final = 1.5
PLOTS: Final = ("wal.png", "ingest.png", "latency.png")


def segment_bound(
    *,
    wal_bytes_per_s: float,
    segment_max_bytes: int,
    segment_age_s: float,
    barrier_s: float,
    housekeeping_s: float,
    down_s: float,
) -> int:
    """The most WAL segments the reclamation rule allows (module docstring)."""
    created_per_s = wal_bytes_per_s / segment_max_bytes + 1 / segment_age_s
    oldest_s = 3 * barrier_s + down_s + housekeeping_s
    return math.ceil(created_per_s * oldest_s) + 2


def estimate_wal_rate(samples: Sequence[dict[str, Any]], load_s: float) -> float:
    """WAL write rate (bytes/s) for the bound: the highest checkpoint LSN over the
    load's duration, with headroom."""
    lsns = [float(s["wal_checkpoint_lsn"]) for s in samples if s.get("wal_checkpoint_lsn")]
    if not lsns or load_s <= 0:
        return 0.0
    return max(lsns) / load_s * RATE_HEADROOM


@dataclass(frozen=True)
class Summary:
    label: str
    duration_s: float
    records_sent: int
    records_acked: int
    records_refused: int
    records_no_response: int
    lost: int
    never_sent: int
    wrong_tenant: int
    duplicates: int
    kills: int
    max_down_s: float | None
    max_recovery_s: float | None
    max_segments: int | None
    segment_bound: int | None
    max_wal_disk_bytes: int | None
    max_unreclaimed_bytes: int | None
    final_checkpoint_lsn: int | None
    ack_p50_ms: float | None
    ack_p99_ms: float | None
    samples: int
    samples_down: int
    verdict: str

    def markdown(self) -> str:
        def num(v: float | int | None, unit: str = "", digits: int = 0) -> str:
            if v is None:
                return "—"
            text = f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"
            return f"{text}{unit}"

        def mib(v: int | None) -> str:
            return "—" if v is None else f"{v / MIB:,.1f} MiB ({v:,} B)"

        bound_ok = (
            ""
            if self.max_segments is None or self.segment_bound is None
            else (" ✓" if self.max_segments <= self.segment_bound else " ✗ over the bound")
        )
        rows = [
            ("verdict", self.verdict),
            ("duration", f"{self.duration_s:,.0f} s ({self.duration_s / 60:.1f} min)"),
            ("records sent", num(self.records_sent)),
            ("records acknowledged", num(self.records_acked)),
            ("records refused (non-2xx)", num(self.records_refused)),
            ("records without a response", num(self.records_no_response)),
            ("**lost** (acknowledged, not published)", num(self.lost)),
            ("never sent (published, not in a ledger)", num(self.never_sent)),
            ("published under the wrong tenant", num(self.wrong_tenant)),
            ("duplicates (extra copies)", num(self.duplicates)),
            ("SIGKILLs", num(self.kills)),
            ("longest kill → ready", num(self.max_down_s, " s", 1)),
            ("longest recovery (recovery.done)", num(self.max_recovery_s, " s", 2)),
            ("max WAL segments", f"{num(self.max_segments)}{bound_ok}"),
            ("segment bound (derived)", num(self.segment_bound)),
            ("max WAL bytes on disk", mib(self.max_wal_disk_bytes)),
            ("max unreclaimed WAL bytes", mib(self.max_unreclaimed_bytes)),
            ("final checkpoint LSN", mib(self.final_checkpoint_lsn)),
            ("ack latency p50 / p99", f"{num(self.ack_p50_ms, ' ms', 1)} / "
                                      f"{num(self.ack_p99_ms, ' ms', 1)}"),
            ("samples (node down)", f"{self.samples:,} ({self.samples_down:,})"),
        ]  # fmt: skip
        lines = [f"## Soak summary: {self.label}", "", "| | |", "|---|---|"]
        lines.extend(f"| {k} | {v} |" for k, v in rows)
        return "\n".join(lines) + "\n"


def _max_int(samples: Sequence[dict[str, Any]], key: str) -> int | None:
    values = [s[key] for s in samples if s.get("up") and s.get(key) is not None]
    return int(max(values)) if values else None


def _overall_quantiles(samples: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """p50/p99 of every acknowledgement of the run: bucket deltas summed over samples."""
    from soak.sampler import histogram_quantile

    total: dict[float, float] = {}
    previous: list[tuple[float, float]] | None = None
    for row, restarted in zip(samples, restarts(samples), strict=True):
        raw = row.get("ack_buckets") if row.get("up") else None
        current = (
            [(math.inf if le == "+Inf" else float(le), float(c)) for le, c in raw] if raw else None
        )
        if current is not None:
            if previous is None or restarted or current[-1][1] < previous[-1][1]:
                delta = current
            else:
                delta = [(le, c - p) for (le, c), (_, p) in zip(current, previous, strict=True)]
            for le, c in delta:
                total[le] = total.get(le, 0.0) + c
        previous = current
    buckets = sorted(total.items())
    p50 = histogram_quantile(0.5, buckets)
    p99 = histogram_quantile(0.99, buckets)
    return (
        None if p50 is None else p50 * 1000,
        None if p99 is None else p99 * 1000,
    )


def summarise(
    samples: Sequence[dict[str, Any]],
    kills: Sequence[Kill],
    verified: dict[str, Any],
    run: dict[str, Any],
) -> Summary:
    settings = run.get("settings", {})
    load_s = float(run.get("load_seconds") or run.get("duration_s") or 0.0)
    downs = [k.down_s for k in kills if k.down_s is not None]
    bound: int | None = None
    if settings:
        bound = segment_bound(
            wal_bytes_per_s=estimate_wal_rate(samples, load_s),
            segment_max_bytes=int(settings["segment_max_bytes"]),
            segment_age_s=float(settings["segment_age_secs"]),
            barrier_s=float(settings["barrier_secs"]),
            housekeeping_s=float(settings["housekeeping_secs"]),
            down_s=max(downs, default=0.0),
        )
    recoveries = [float(r) for r in run.get("recovery_seconds", []) if r is not None]
    p50, p99 = _overall_quantiles(samples)
    max_segments = _max_int(samples, "wal_segments")
    problems = [] if verified.get("ok") else ["verifier"]
    if bound is not None and max_segments is not None and max_segments > bound:
        problems.append(f"segments {max_segments} > bound {bound}")
    problems.extend(str(p) for p in run.get("problems", []))
    return Summary(
        label=str(run.get("label", "")),
        duration_s=float(run.get("duration_s") or 0.0),
        records_sent=int(verified.get("records_sent", 0)),
        records_acked=int(verified.get("records_acked", 0)),
        records_refused=int(verified.get("records_refused", 0)),
        records_no_response=int(verified.get("records_error", 0))
        + int(verified.get("records_in_flight", 0)),
        lost=int(verified.get("lost", 0)),
        never_sent=int(verified.get("never_sent", 0)),
        wrong_tenant=int(verified.get("wrong_tenant", 0)),
        duplicates=int(verified.get("duplicates", 0)),
        kills=len(kills),
        max_down_s=max(downs) if downs else None,
        max_recovery_s=max(recoveries) if recoveries else None,
        max_segments=max_segments,
        segment_bound=bound,
        max_wal_disk_bytes=_max_int(samples, "wal_disk_bytes"),
        max_unreclaimed_bytes=_max_int(samples, "wal_unreclaimed_bytes"),
        final_checkpoint_lsn=_max_int(samples, "wal_checkpoint_lsn"),
        ack_p50_ms=p50,
        ack_p99_ms=p99,
        samples=len(samples),
        samples_down=sum(1 for s in samples if not s.get("up")),
        verdict="PASS" if not problems else "FAIL: " + "; ".join(problems),
    )


# ── plots ────────────────────────────────────────────────────────────────────────────


def _timeline(samples: Sequence[dict[str, Any]], t0: float, minutes: bool) -> list[float]:
    scale = 60.0 if minutes else 1.0
    return [(float(s["t"]) - t0) / scale for s in samples]


def _mark(
    ax: Axes, kills: Sequence[Kill], downs: Sequence[float], t0: float, scale: float, width: float
) -> None:
    """Kills as vertical lines, samples where the node did not answer shaded."""
    for i, kill in enumerate(kills):
        ax.axvline(
            (kill.at - t0) / scale,
            color="tab:red",
            linestyle="--",
            linewidth=0.8,
            label="SIGKILL" if i == 0 else None,
        )
    for i, x in enumerate(downs):
        ax.axvspan(
            x - width / 2, x + width / 2, color="0.85", linewidth=0,
            label="node down" if i == 0 else None,
        )  # fmt: skip


def _step(xs: Sequence[float]) -> float:
    """The median spacing of the samples, the width of one shaded sample."""
    gaps = sorted(b - a for a, b in zip(xs, xs[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else 0.01


def _series(samples: Sequence[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    return [
        float(s[key]) / scale if s.get("up") and s.get(key) is not None else math.nan
        for s in samples
    ]


def _outcome_total(row: dict[str, Any], key: str, ok: bool) -> float | None:
    if not row.get("up"):
        return None
    values: dict[str, float] = row.get(key) or {}
    return sum(v for k, v in values.items() if (k == "ok") == ok)


def _rates(samples: Sequence[dict[str, Any]], values: Sequence[float | None]) -> list[float]:
    deltas = counter_deltas(values, restarts(samples))
    out = [math.nan]
    for i in range(1, len(samples)):
        d = deltas[i]
        dt = float(samples[i]["t"]) - float(samples[i - 1]["t"])
        out.append(d / dt if d is not None and dt > 0 else math.nan)
    return out


def write_plots(
    out_dir: Path,
    samples: Sequence[dict[str, Any]],
    kills: Sequence[Kill],
    run: dict[str, Any],
    bound: int | None,
) -> list[Path]:
    t0 = float(run.get("started_at") or (samples[0]["t"] if samples else 0.0))
    span = (float(samples[-1]["t"]) - t0) if samples else 0.0
    minutes = span > 600
    scale = 60.0 if minutes else 1.0
    xlabel = "minutes since start" if minutes else "seconds since start"
    xs = _timeline(samples, t0, minutes)
    downs = [x for x, s in zip(xs, samples, strict=True) if not s.get("up")]
    width = _step(xs)
    title = str(run.get("label", "soak"))
    paths: list[Path] = []

    # WAL bytes and segments against the checkpoint.
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    top.plot(xs, _series(samples, "wal_disk_bytes", MIB), label="WAL bytes on disk")
    top.plot(xs, _series(samples, "wal_unreclaimed_bytes", MIB), label="unreclaimed WAL bytes")
    top.set_ylabel("MiB")
    right = top.twinx()
    right.plot(
        xs,
        _series(samples, "wal_checkpoint_lsn", MIB),
        color="tab:green",
        linewidth=1.2,
        label="checkpoint LSN",
    )
    right.set_ylabel("checkpoint LSN (MiB of WAL written)")
    _mark(top, kills, downs, t0, scale, width)
    handles, labels = top.get_legend_handles_labels()
    more_h, more_l = right.get_legend_handles_labels()
    top.legend(handles + more_h, labels + more_l, loc="upper left", fontsize=8)
    top.set_title(f"{title}: WAL against the checkpoint")
    bottom.step(xs, _series(samples, "wal_segments"), where="post", label="WAL segments")
    if bound is not None:
        bottom.axhline(bound, color="tab:orange", linestyle=":", label=f"bound {bound}")
    _mark(bottom, kills, downs, t0, scale, width)
    bottom.set_ylabel("segments")
    bottom.set_xlabel(xlabel)
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "wal.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    # Ingest rate.
    fig, ax = plt.subplots(figsize=(11, 4))
    ok_records = [_outcome_total(s, "ingest_records", True) for s in samples]
    bad_requests = [_outcome_total(s, "ingest_requests", False) for s in samples]
    ax.plot(xs, _rates(samples, ok_records), label="records acknowledged /s")
    ax.set_ylabel("records/s")
    right = ax.twinx()
    right.plot(
        xs, _rates(samples, bad_requests), color="tab:purple", linewidth=0.8,
        label="requests refused /s",
    )  # fmt: skip
    right.set_ylabel("refused requests/s")
    _mark(ax, kills, downs, t0, scale, width)
    handles, labels = ax.get_legend_handles_labels()
    more_h, more_l = right.get_legend_handles_labels()
    ax.legend(handles + more_h, labels + more_l, loc="upper left", fontsize=8)
    ax.set_title(f"{title}: ingest rate (node's counters; gaps: node down)")
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    paths.append(out_dir / "ingest.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    # Ack latency.
    fig, ax = plt.subplots(figsize=(11, 4))
    quantiles = interval_quantiles(samples, (0.5, 0.99))
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        ys = [(v * 1000 if (v := row.get(q)) is not None else math.nan) for row in quantiles]
        ax.plot(xs, ys, label=f"ack latency {label}")
    if any(row.get(0.99) for row in quantiles):
        ax.set_yscale("log")
    ax.set_ylabel("ms")
    _mark(ax, kills, downs, t0, scale, width)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"{title}: ack latency per sampling interval (ourios_ingest_ack_seconds)")
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    paths.append(out_dir / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def write_report(
    out_dir: Path,
    samples: Sequence[dict[str, Any]],
    kills: Sequence[Kill],
    verified: dict[str, Any],
    run: dict[str, Any],
    verify_lines: Sequence[str] = (),
) -> Summary:
    """Write the plots and ``summary.md`` (and ``summary.json``) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(samples, kills, verified, run)
    write_plots(out_dir, samples, kills, run, summary.segment_bound)
    text = summary.markdown()
    if verify_lines:
        text += "\n```\n" + "\n".join(verify_lines) + "\n```\n"
    if kills:
        text += "\n| kill | at (s) | target | waited (s) | down (s) |\n|---:|---:|---|---:|---:|\n"
        t0 = float(run.get("started_at") or kills[0].at)
        for k in kills:
            down = "—" if k.down_s is None else f"{k.down_s:.1f}"
            text += f"| {k.number} | {k.at - t0:.1f} | {k.target} | {k.waited_s:.1f} | {down} |\n"
    (out_dir / "summary.md").write_text(text, encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def report_dir(out_dir: Path) -> Summary:
    """Rebuild the report from a run's files (``python -m soak report DIR``)."""
    from soak.chaos import read_kills
    from soak.sampler import load_samples

    samples = load_samples(out_dir / "samples.jsonl")
    kills = read_kills(out_dir / "kills.jsonl")
    verified = json.loads((out_dir / "verify.json").read_text())
    run = json.loads((out_dir / "run.json").read_text())
    lines = [str(x) for x in verified.get("lines", [])]
    return write_report(out_dir, samples, kills, verified, run, lines)
