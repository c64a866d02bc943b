"""Size-limited tmpfs mounts, for real ENOSPC instead of a simulated one.

`free_bytes(path)` is what an unprivileged writer may still use on a path's volume;
`fill_volume(ballast)` writes a file until that is nothing.

`mount -t tmpfs -o size=N` needs root (or CAP_SYS_ADMIN); a refused mount skips the test
with the reason, and fails it under `CI=true`. The kernel rounds the size up to whole
pages. Every mount is unmounted by `close()`; a mount still busy (a process or an open
file descriptor left inside it) is detached lazily so teardown never hangs.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.closing import ClosedOnExit
from tests.support.tools import skip_or_fail


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still use on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_volume(ballast: Path) -> int:
    """Append to ``ballast`` until its filesystem refuses even one more byte (ENOSPC),
    in shrinking chunks, and sync it; the ballast's size."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            while True:
                try:
                    os.write(fd, b"\xa5" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
        os.fsync(fd)
    finally:
        os.close(fd)
    return ballast.stat().st_size


class TmpfsMounts(ClosedOnExit):
    """Mounts tmpfs file systems under `base_dir` and unmounts them all on `close()`."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._mounted: list[Path] = []

    def __call__(self, size_bytes: int) -> Path:
        return self.mount(size_bytes)

    def mount(self, size_bytes: int) -> Path:
        """Mount a tmpfs of `size_bytes` (rounded up to pages) and return its path."""
        if size_bytes <= 0:
            raise ValueError(f"tmpfs size must be positive, got {size_bytes}")
        mount = shutil.which("mount")
        if mount is None:
            skip_or_fail("small_tmpfs: the mount command is not installed")
        if os.geteuid() != 0:
            skip_or_fail(f"small_tmpfs: mounting tmpfs needs root (euid {os.geteuid()})")
        target = self.base_dir / f"tmpfs{len(self._mounted)}"
        target.mkdir(parents=True)
        result = subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "ourios-test", target],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            skip_or_fail(
                f"small_tmpfs: mount -t tmpfs refused (exit {result.returncode}):"
                f" {result.stderr.strip() or result.stdout.strip()}"
            )
        self._mounted.append(target)
        return target

    def close(self) -> None:
        """Unmount everything mounted here, lazily if busy; raise if one stays mounted."""
        failures: list[str] = []
        while self._mounted:
            target = self._mounted.pop()
            if subprocess.run(["umount", target], capture_output=True, check=False).returncode:
                lazy = subprocess.run(
                    ["umount", "-l", target], capture_output=True, text=True, check=False
                )
                if lazy.returncode != 0:
                    failures.append(f"{target}: {lazy.stderr.strip()}")
        if failures:
            raise RuntimeError(f"could not unmount tmpfs: {'; '.join(failures)}")
