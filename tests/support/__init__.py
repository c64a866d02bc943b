"""Shared test support: external tools, a real SeaweedFS S3 server, size-limited tmpfs.

The fixtures that use these live in `tests/conftest.py`:

- `seaweed_s3` (session): a running `SeaweedS3` with explicit credentials.
- `s3_bucket` (function): a fresh `S3Bucket` in that server, deleted afterwards.
- `small_tmpfs` (function): `small_tmpfs(size_bytes) -> Path`, a mounted tmpfs.
- an autouse check that fails a test which leaves a thread it started running.

A missing tool or a refused mount skips the test with a reason, and fails it under
`CI=true` (`require_tool`, `skip_or_fail`), so CI never passes by skipping.
"""

from tests.support.seaweed import S3Bucket, SeaweedS3, SeaweedStartError
from tests.support.tmpfs import TmpfsMounts
from tests.support.tools import in_ci, require_tool, skip_or_fail

__all__ = [
    "S3Bucket",
    "SeaweedS3",
    "SeaweedStartError",
    "TmpfsMounts",
    "in_ci",
    "require_tool",
    "skip_or_fail",
]
