"""The native extensions' differential tests against a build with AddressSanitizer and
UndefinedBehaviorSanitizer (``make fuzz``; docs/BENCHMARKS.md records the result):
``--target decoder`` (the default) or ``--target miner`` (app/ingest/mining/_minefast.c
and tests/unit/app/ingest/mining/test_native_miner.py, the same way).

A copy of the tree in a temporary directory gets ``app/receive/_otlpdecode.c`` compiled
with ``-fsanitize=address,undefined -fno-sanitize-recover=all`` (any finding aborts the
process, so it fails the run), then tests/unit/app/receive/test_native.py runs there
with the ASan runtime preloaded (``LD_PRELOAD``: the interpreter itself is not
instrumented, so the runtime must come first). First the corpus ``make test`` runs
(derandomized: the same cases), then, with ``--examples N``, N fresh cases a property.
Prints the cases checked, how many the native decoder answered, and the verdict.

Run: ``.venv/bin/python scripts/sanitize_native.py [--target miner] [--examples 5000]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: target → (C source, the extension's module path, its differential tests)
TARGETS = {
    "decoder": (
        "app/receive/_otlpdecode.c",
        "app/receive/_otlpdecode",
        "tests/unit/app/receive/test_native.py",
    ),
    "miner": (
        "app/ingest/mining/_minefast.c",
        "app/ingest/mining/_minefast",
        "tests/unit/app/ingest/mining/test_native_miner.py",
    ),
}
SOURCE, _, TEST = TARGETS["decoder"]
FLAGS = [
    "-shared", "-fPIC", "-O1", "-g", "-std=c11", "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
]  # fmt: skip


def build(tree: Path, source: str = SOURCE, module: str = TARGETS["decoder"][1]) -> Path:
    """The sanitized extension, in place in `tree`."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = tree / f"{module}{suffix}"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["gcc", *FLAGS, f"-I{include}", str(tree / source), "-o", str(out)], check=True)
    return out


def copy(tree: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", ".hypothesis")
    for name in ("app", "sink", "wal", "tests"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tree)


def run(tree: Path, examples: int | None, test: str = TEST) -> tuple[int, dict[str, int], float]:
    asan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True, text=True
    ).stdout.strip()
    cases = tree / "cases.json"
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        PYTHONDONTWRITEBYTECODE="1",
        LD_PRELOAD=asan,
        # Python frees what it allocated at exit only in part; leaks are not the question.
        # The reports go to files: pytest's capture of fd 2 is lost when the process aborts.
        ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=1:log_path={tree}/asan",
        UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:log_path={tree}/ubsan",
        FUZZ_CASES_FILE=str(cases),
    )
    env.pop("FUZZ_EXAMPLES", None)
    if examples:
        env["FUZZ_EXAMPLES"] = str(examples)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", test]
    code = subprocess.run(cmd, cwd=tree, env=env).returncode
    for report in sorted(tree.glob("[au]bsan.*")) + sorted(tree.glob("asan.*")):
        print(report.read_text(errors="replace"), file=sys.stderr)
    counted = json.loads(cases.read_text()) if cases.exists() else {}
    return code, counted, time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=0, help="then N fresh cases a property")
    ap.add_argument("--target", choices=sorted(TARGETS), default="decoder")
    args = ap.parse_args()
    source, module, test = TARGETS[args.target]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ourios-sanitize-") as tmp:
        tree = Path(tmp)
        copy(tree)
        build(tree, source, module)
        for label, examples in (("make test's corpus", None), ("fresh cases", args.examples)):
            if label == "fresh cases" and not examples:
                continue
            code, counted, seconds = run(tree, examples, test)
            verdict = "clean" if code == 0 else f"FAILED (exit {code})"
            if args.target == "decoder":
                cases = (
                    f"{counted.get('checked', 0)} cases, "
                    f"{counted.get('native', 0)} decoded natively"
                )
            else:
                cases = (
                    f"{counted.get('streams', 0)} streams, {counted.get('bodies', 0)} bodies, "
                    f"{counted.get('native', 0)} mined natively"
                )
            print(
                f"ASan+UBSan {args.target}, {label}: {cases}, {seconds:.0f} s: {verdict}",
                flush=True,
            )
            failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
