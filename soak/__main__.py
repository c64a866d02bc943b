"""``python -m soak``: the soak harness's commands (docs/SOAK.md).

- ``run``     — a local soak: SeaweedFS, ``ourios serve``, locust, chaos, sampler,
  verify, report (``soak.run``);
- ``verify``  — the store against the ack ledgers (``soak.verify``), exit 1 on loss;
- ``report``  — rebuild the plots and summary of a run directory (``soak.report``);
- ``chaos``   — the chaos driver against Kubernetes pods (``soak.chaos``), as the
  chaos Job runs it;
- ``sample``  — the metrics sampler alone, for a bounded time (``soak.sampler``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from soak.durations import parse_duration


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cmd_run(args: argparse.Namespace) -> int:
    from soak.run import SoakConfig, run

    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("OURIOS_"):
            raise SystemExit(f"--set {item!r}: expected OURIOS_<SECTION>_<NAME>=VALUE")
        settings[key] = value
    out = args.out or Path("soak") / "out" / time.strftime("%Y%m%d-%H%M%S")
    config = SoakConfig(
        duration_s=args.duration,
        out=out,
        kill_every_s=args.kill_every,
        rate=args.rate,
        batch=args.batch,
        tenants=args.tenants,
        users=args.users,
        seed=args.seed,
        store="local" if args.local_store else "seaweed",
        sample_interval_s=args.sample_every,
        max_kills=args.max_kills,
        node_settings=settings,
        label=args.label,
    )
    try:
        result = run(config)
    except ValueError as exc:  # a bad setting or a used --out: nothing was started
        print(f"python -m soak run: {exc}", file=sys.stderr)
        return 2
    print()
    print((out / "summary.md").read_text())
    print(f"report: {out.resolve()}")
    return 0 if result.summary.verdict == "PASS" else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from soak import verify

    return verify.main(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from soak.report import report_dir

    summary = report_dir(args.dir)
    print(summary.markdown())
    return 0 if summary.verdict == "PASS" else 1


def _cmd_chaos(args: argparse.Namespace) -> int:
    from soak.chaos import ChaosDriver, KillSchedule, KubernetesTarget, kubernetes_api

    pods = [p for p in (args.pods or "").split(",") if p]
    target = KubernetesTarget(
        kubernetes_api(), args.namespace, pods=pods, selector=args.selector or "", seed=args.seed
    )
    driver = ChaosDriver(
        target,
        KillSchedule(args.kill_every, args.seed),
        args.log,
        stop_at=time.monotonic() + args.duration,
        max_kills=args.max_kills,
        ready_timeout_s=args.ready_timeout,
        on_kill=lambda k: print(
            f"kill {k.number}: {k.target}; back: {k.back or 'no'}"
            f" after {k.down_s} s {k.error}".rstrip(),
            flush=True,
        ),
    )
    with driver:
        # The driver ends by itself at stop_at (or max_kills); the bound is for a hang.
        driver.join(args.duration + 2 * args.ready_timeout + 60)
    print(f"{len(driver.kills)} kills; {driver.error or 'every pod came back ready'}", flush=True)
    return 1 if driver.error else 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from soak.sampler import Sampler

    done = threading.Event()
    with Sampler(args.url, args.out, args.interval) as sampler:
        done.wait(args.duration)  # the sampler's lifetime, not synchronisation
    print(f"{sampler.samples} samples ({sampler.down} with the node down) in {args.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m soak", description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="a local soak with chaos, verification and report")
    p.add_argument("--duration", type=_duration, default=parse_duration("10m"))
    p.add_argument(
        "--kill-every",
        type=_duration,
        default=parse_duration("60s"),
        help="mean SIGKILL interval (±50 %%, seeded); 0 disables chaos",
    )
    p.add_argument("--rate", type=float, default=20.0, help="requests/s over all users")
    p.add_argument("--batch", type=int, default=50, help="records per request")
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--users", type=int, default=8, help="locust users (connections)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="report dir (soak/out/<time>)")
    p.add_argument("--local-store", action="store_true", help="embedded store, no SeaweedFS")
    p.add_argument("--sample-every", type=_duration, default=2.0)
    p.add_argument("--max-kills", type=int, default=None)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OURIOS_X_Y=V",
        help="override a node setting (repeatable)",
    )
    p.add_argument("--label", default="", help="title of the report")
    p.set_defaults(func=_cmd_run)

    from soak.verify import add_arguments

    p = sub.add_parser("verify", help="the store against the ack ledgers")
    add_arguments(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("report", help="rebuild the report of a run directory")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("chaos", help="SIGKILL Kubernetes pods at seeded intervals")
    p.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or None,
        required=not os.environ.get("POD_NAMESPACE"),
        help="namespace of the target pods (default $POD_NAMESPACE)",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pods", help="comma-separated pod names (RBAC: get, delete)")
    which.add_argument("--selector", help="label selector (RBAC: list, get, delete)")
    p.add_argument("--kill-every", type=_duration, default=parse_duration("60s"))
    p.add_argument("--duration", type=_duration, default=parse_duration("60m"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-kills", type=int, default=None)
    p.add_argument("--ready-timeout", type=_duration, default=parse_duration("5m"))
    p.add_argument("--log", type=Path, default=Path("kills.jsonl"))
    p.set_defaults(func=_cmd_chaos)

    p = sub.add_parser("sample", help="scrape /metrics into a JSONL series")
    p.add_argument("--url", required=True, help="http://HOST:PORT/metrics")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--interval", type=_duration, default=5.0)
    p.add_argument("--duration", type=_duration, default=parse_duration("60m"))
    p.set_defaults(func=_cmd_sample)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("interrupted: everything the run started has been stopped", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
