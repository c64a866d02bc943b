"""``ClosedOnExit``: the context-manager half every test resource shares.

A SeaweedFS server, a tmpfs mount, an SDK client or a real ``ourios serve`` is used as
``with resource:`` and released by its own ``close()`` on the way out, whatever happened
inside; the class says so once instead of each resource spelling ``__exit__`` again.
"""

from __future__ import annotations

from typing import Self


class ClosedOnExit:
    """Mix in for ``with x:``: gives ``x`` (a subclass may start it in ``__enter__``) and
    calls ``x.close()`` when the block ends, on success or failure."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
