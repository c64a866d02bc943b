"""The chaos driver: SIGKILL the node at seeded random intervals, wait for it to return.

One interface, two targets:

- ``Target.kill() -> str`` kills one node *now*, without grace, and says what it killed;
- ``Target.wait_ready(timeout_s)`` returns once the node is back and ready, or raises
  ``TimeoutError``.

``LocalTarget`` drives a ``soak.node.ServeNode``: ``kill`` SIGKILLs the ``ourios serve``
process by pid and reaps it; ``wait_ready`` plays the StatefulSet controller, starting
a new process on the same data directory, and waits for its ``/readyz``.
``KubernetesTarget`` drives pods through a ``CoreV1Api`` (the ``kubernetes`` client's,
or any object with the same three methods — the tests pass a fake): ``kill`` lists the
pods matching the label selector in the namespace, picks one with the seeded RNG and
deletes it with ``grace_period_seconds=0`` (the kubelet SIGKILLs the container; the
StatefulSet recreates the pod under the same name on the same PVC); ``wait_ready``
polls ``read_namespaced_pod`` until a pod of that name with a *different uid* reports
the ``Ready`` condition.

``ChaosDriver(target, schedule, stop_at=...)`` is a thread (``start()``/``close()``):
it waits the schedule's next interval *after the node is ready again* (the intervals
are the point of the harness, not synchronisation; the wait is on the stop event, so
``close()`` interrupts it), kills, waits for readiness, and appends one JSON line per
kill to ``log_path``. It never kills after ``stop_at`` or beyond ``max_kills``, and
stops for good (recording the error) if the node does not come back.

``KillSchedule(kill_every_s, seed)`` draws each interval uniformly from
``kill_every_s × [1 - jitter, 1 + jitter]`` with ``random.Random(seed)``: the same seed
gives the same intervals, so a failing run can be replayed.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

if TYPE_CHECKING:  # soak.node needs tests/support, which the Kubernetes image lacks
    from soak.node import ServeNode

__all__ = [
    "ChaosDriver",
    "Kill",
    "KillSchedule",
    "KubernetesTarget",
    "LocalTarget",
    "PodApi",
    "Target",
    "read_kills",
]

DEFAULT_READY_TIMEOUT_S: Final = 180.0
POD_POLL_S: Final = 1.0


@runtime_checkable
class Target(Protocol):
    def kill(self) -> str: ...

    def wait_ready(self, timeout_s: float) -> None: ...


# ── local ────────────────────────────────────────────────────────────────────────────


class LocalTarget:
    """SIGKILL the local ``ourios serve`` by pid; restart it on the same data dir."""

    def __init__(self, node: ServeNode) -> None:
        self.node = node

    def kill(self) -> str:
        return f"pid {self.node.kill()}"

    def wait_ready(self, timeout_s: float) -> None:
        if not self.node.running:
            self.node.start_timeout_s = timeout_s
            self.node.start()  # ServeProcess waits for server.listening then /readyz
        elif not self.node.ready():
            raise TimeoutError("node is running but not ready")


# ── Kubernetes ───────────────────────────────────────────────────────────────────────


class PodApi(Protocol):
    """The three ``kubernetes.client.CoreV1Api`` calls the driver makes."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


def _is_ready(pod: Any) -> bool:
    status = getattr(pod, "status", None)
    if status is None or getattr(status, "phase", None) != "Running":
        return False
    for condition in getattr(status, "conditions", None) or ():
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return False


def _not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


class KubernetesTarget:
    """Delete a pod of the selector with zero grace; wait for its replacement (module
    docstring). ``wait`` is the poll pause (``threading.Event.wait`` by default, so a
    stop event can cut it short; a test passes one that returns at once)."""

    def __init__(
        self,
        api: PodApi,
        namespace: str,
        selector: str,
        *,
        seed: int = 1,
        poll_s: float = POD_POLL_S,
        wait: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.poll_s = poll_s
        self._rng = random.Random(f"pods:{seed}")
        self._wait = wait if wait is not None else threading.Event().wait
        self._clock = clock
        self._victim: tuple[str, str] | None = None  # (name, uid) of the last kill

    def kill(self) -> str:
        pods = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
        candidates = sorted(
            (p for p in pods.items if getattr(p.metadata, "deletion_timestamp", None) is None),
            key=lambda p: str(p.metadata.name),
        )
        if not candidates:
            raise RuntimeError(f"no pod matches {self.selector!r} in namespace {self.namespace!r}")
        pod = self._rng.choice(candidates)
        name, uid = str(pod.metadata.name), str(pod.metadata.uid)
        # grace_period_seconds=0 both as a parameter and in the body: the API server
        # honours either, and the kubelet then sends SIGKILL without a SIGTERM first.
        self.api.delete_namespaced_pod(
            name,
            self.namespace,
            grace_period_seconds=0,
            body={"gracePeriodSeconds": 0, "propagationPolicy": "Background"},
        )
        self._victim = (name, uid)
        return f"pod {self.namespace}/{name} uid {uid}"

    def wait_ready(self, timeout_s: float) -> None:
        if self._victim is None:
            return
        name, old_uid = self._victim
        deadline = self._clock() + timeout_s
        while True:
            try:
                pod = self.api.read_namespaced_pod(name, self.namespace)
            except Exception as exc:  # the client raises ApiException; 404 while recreated
                if not _not_found(exc):
                    raise
            else:
                if str(pod.metadata.uid) != old_uid and _is_ready(pod):
                    self._victim = None
                    return
            if self._clock() >= deadline:
                raise TimeoutError(
                    f"pod {self.namespace}/{name} not replaced and ready within {timeout_s:g} s"
                )
            self._wait(self.poll_s)


def kubernetes_api() -> PodApi:
    """A ``CoreV1Api`` from the in-cluster config, else from ``~/.kube/config``."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api: PodApi = client.CoreV1Api()
    return api


# ── schedule and driver ──────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class KillSchedule:
    kill_every_s: float
    seed: int
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not self.kill_every_s > 0:
            raise ValueError(f"kill_every_s {self.kill_every_s}: must be > 0")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter {self.jitter}: must be in [0, 1)")

    def intervals(self) -> Iterator[float]:
        rng = random.Random(f"kills:{self.seed}")
        low, high = 1 - self.jitter, 1 + self.jitter
        while True:
            yield self.kill_every_s * rng.uniform(low, high)


@dataclass(frozen=True)
class Kill:
    number: int
    at: float  # unix time of the kill
    target: str  # what was killed
    waited_s: float  # the interval waited before it
    down_s: float | None  # kill → ready again (None: it did not come back)
    error: str = ""


def read_kills(path: Path) -> list[Kill]:
    if not path.exists():
        return []
    kills = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            kills.append(Kill(**json.loads(line)))
    return kills


@dataclass
class ChaosDriver:
    """The kill loop as a thread (module docstring)."""

    target: Target
    schedule: KillSchedule
    log_path: Path
    stop_at: float | None = None  # time.monotonic() after which no kill starts
    max_kills: int | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    on_kill: Callable[[Kill], None] | None = None
    kills: list[Kill] = field(default_factory=list)
    error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ChaosDriver:
        if self._thread is not None:
            raise RuntimeError("chaos driver already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="soak-chaos", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Stop after the kill in progress (if any) has come back ready, and join."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.ready_timeout_s + 30 if timeout_s is None else timeout_s)
            if self._thread.is_alive():
                raise TimeoutError("chaos driver did not stop")
            self._thread = None

    def __enter__(self) -> ChaosDriver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def join(self, timeout_s: float) -> None:
        """Wait for the driver to end by itself (max_kills or stop_at reached)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            for waited in self.schedule.intervals():
                if self.max_kills is not None and len(self.kills) >= self.max_kills:
                    return
                if self.stop_at is not None and time.monotonic() + waited > self.stop_at:
                    return
                if self._stop.wait(waited):
                    return
                self._kill_once(waited)
                if self.error:
                    return
        except Exception as exc:  # a thread must not die silently: say why chaos stopped
            self.error = f"chaos driver failed: {exc!r}"

    def _kill_once(self, waited: float) -> None:
        at = time.time()
        began = time.monotonic()
        target = self.target.kill()
        down: float | None = None
        error = ""
        try:
            self.target.wait_ready(self.ready_timeout_s)
            down = time.monotonic() - began
        except Exception as exc:
            error = f"not ready again: {exc!r}"
            self.error = error
        kill = Kill(len(self.kills) + 1, at, target, round(waited, 3), down, error)
        self.kills.append(kill)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(asdict(kill)) + "\n")
        if self.on_kill is not None:
            self.on_kill(kill)


def kill_times(kills: Sequence[Kill]) -> list[float]:
    return [k.at for k in kills]
