"""A function run on a named thread, for tests that must hold one thread at a sync point
while another goes on: ``join`` hands back the result or re-raises what the thread
raised, so a failure on the thread fails the test that started it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar, cast

T = TypeVar("T")
#: how long a thread the test expects to finish may take before it is called hung
WAIT_S = 10.0


class Worker(Generic[T]):
    """Runs ``fn`` on a named thread; ``join`` returns its result or re-raises."""

    def __init__(self, name: str, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._result: T | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join
            self._error = exc

    def finished(self, timeout: float = WAIT_S) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def join(self) -> T:
        assert self.finished(), f"thread {self.thread.name} did not finish in {WAIT_S} s"
        if self._error is not None:
            raise self._error
        return cast(T, self._result)
