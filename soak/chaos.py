"""The chaos driver: SIGKILL the node at seeded random intervals, wait for it to return.

One interface (``Target``), two implementations:

- ``kill() -> str`` kills one node instance *now*, without grace, and names it;
- ``wait_ready(timeout_s) -> str`` returns once every instance is up and ready (the one
  killed last replaced by a new instance) and names what is up, or raises
  ``TimeoutError``.

An instance is a process (``pid N``) locally and a pod incarnation (``pod NS/NAME uid
U``) in Kubernetes; a replacement is always a different instance, which is what the
contract test (tests/soak/test_chaos.py) holds both targets to.

``LocalTarget`` drives a ``soak.node.ServeNode``: ``kill`` SIGKILLs the ``ourios serve``
process by pid and reaps it; ``wait_ready`` plays the StatefulSet controller, starting
a new process on the same data directory, and waits for its ``/readyz``.

``KubernetesTarget`` drives pods through a ``CoreV1Api`` (the ``kubernetes`` client's,
or any object with the same three methods — the tests pass a recording fake and the
real client pointed at a stub API server). The pods are named (``pods=``, which lets
the chaos Job's Role list them in ``resourceNames`` with only ``get`` and ``delete``)
or found by a label selector (``selector=``, which also needs ``list``). ``kill`` picks
one with the seeded RNG, reads its uid and deletes it with ``gracePeriodSeconds=0``
(the kubelet SIGKILLs the container) and a uid precondition (only that incarnation);
the StatefulSet recreates the pod under the same name on the same PVC. ``wait_ready``
polls ``read_namespaced_pod`` until a pod of that name with a *different uid* reports
the ``Ready`` condition.

``ChaosDriver(target, schedule, stop_at=...)`` is a thread (``start()``/``close()``):
it first waits for the target to be ready, then waits the schedule's next interval
*after the node is ready again* (the intervals are the point of the harness, not
synchronisation; the wait is on the stop event, so ``close()`` interrupts it), kills,
waits for readiness, and appends one JSON line per kill to ``log_path``. It never
starts a kill after ``stop_at`` or beyond ``max_kills``, and stops for good (recording
the error) if the node does not come back.

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

if TYPE_CHECKING:  # soak.node needs tests/support, which the soak image lacks
    from soak.node import ServeNode

__all__ = [
    "ChaosDriver",
    "Kill",
    "KillSchedule",
    "KubernetesTarget",
    "LocalTarget",
    "PodApi",
    "Target",
    "kubernetes_api",
    "read_kills",
]

DEFAULT_READY_TIMEOUT_S: Final = 180.0
POD_POLL_S: Final = 1.0


@runtime_checkable
class Target(Protocol):
    def kill(self) -> str: ...

    def wait_ready(self, timeout_s: float) -> str: ...


# ── local ────────────────────────────────────────────────────────────────────────────


class LocalTarget:
    """SIGKILL the local ``ourios serve`` by pid; restart it on the same data dir."""

    def __init__(self, node: ServeNode) -> None:
        self.node = node

    def kill(self) -> str:
        return f"pid {self.node.kill()}"

    def wait_ready(self, timeout_s: float) -> str:
        if not self.node.running:
            self.node.start(timeout_s)  # waits for server.listening, then /readyz
        elif not self.node.ready():
            raise TimeoutError(f"node pid {self.node.pid} is running but not ready")
        return f"pid {self.node.pid}"


# ── Kubernetes ───────────────────────────────────────────────────────────────────────


class PodApi(Protocol):
    """The three ``kubernetes.client.CoreV1Api`` calls the driver makes, with the
    arguments it passes (``CoreV1Api`` satisfies it)."""

    def list_namespaced_pod(self, namespace: str, *, label_selector: str | None = ...) -> Any: ...

    def read_namespaced_pod(self, name: str, namespace: str) -> Any: ...

    def delete_namespaced_pod(
        self, name: str, namespace: str, *, grace_period_seconds: int | None = ..., body: Any = ...
    ) -> Any: ...


def _is_ready(pod: Any) -> bool:
    if getattr(pod.metadata, "deletion_timestamp", None) is not None:
        return False
    status = getattr(pod, "status", None)
    if status is None or getattr(status, "phase", None) != "Running":
        return False
    for condition in getattr(status, "conditions", None) or ():
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return False


def _not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


def _delete_options(uid: str) -> Any:
    """``V1DeleteOptions``: no grace, only the incarnation ``uid``, dependents in the
    background."""
    from kubernetes import client

    return client.V1DeleteOptions(
        grace_period_seconds=0,
        preconditions=client.V1Preconditions(uid=uid),
        propagation_policy="Background",
    )


class KubernetesTarget:
    """Delete a pod with zero grace; wait for its replacement (module docstring).
    ``wait`` is the poll pause (``threading.Event.wait`` by default; a test passes one
    that advances a fake clock)."""

    def __init__(
        self,
        api: PodApi,
        namespace: str,
        *,
        pods: Sequence[str] = (),
        selector: str = "",
        seed: int = 1,
        poll_s: float = POD_POLL_S,
        wait: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if bool(pods) == bool(selector):
            raise ValueError("name the target pods or give a label selector, not both")
        self.api = api
        self.namespace = namespace
        self.pods = tuple(sorted(pods))
        self.selector = selector
        self.poll_s = poll_s
        self._rng = random.Random(f"pods:{seed}")
        self._wait = wait if wait is not None else threading.Event().wait
        self._clock = clock
        self._victim: tuple[str, str] | None = None  # (name, uid) of the last kill

    def _describe(self, pod: Any) -> str:
        return f"pod {self.namespace}/{pod.metadata.name} uid {pod.metadata.uid}"

    def _read(self, name: str) -> Any | None:
        try:
            return self.api.read_namespaced_pod(name, self.namespace)
        except Exception as exc:  # the client raises ApiException; 404 while recreated
            if _not_found(exc):
                return None
            raise

    def _current(self) -> list[Any]:
        """The target pods that exist now (named ones not found are left out)."""
        if self.pods:
            found = (self._read(name) for name in self.pods)
            return [p for p in found if p is not None]
        listed = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
        return sorted(listed.items, key=lambda p: str(p.metadata.name))

    def kill(self) -> str:
        candidates = [
            p for p in self._current() if getattr(p.metadata, "deletion_timestamp", None) is None
        ]
        if not candidates:
            wanted = ", ".join(self.pods) if self.pods else f"selector {self.selector!r}"
            raise RuntimeError(f"no live target pod ({wanted}) in namespace {self.namespace!r}")
        pod = self._rng.choice(candidates)
        name, uid = str(pod.metadata.name), str(pod.metadata.uid)
        # gracePeriodSeconds=0 both as the query parameter and in the body; the uid
        # precondition makes a retried or late delete unable to hit the replacement.
        self.api.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=0, body=_delete_options(uid)
        )
        self._victim = (name, uid)
        return self._describe(pod)

    def wait_ready(self, timeout_s: float) -> str:
        deadline = self._clock() + timeout_s
        while True:
            pods = self._current()
            names = {str(p.metadata.name) for p in pods}
            expected = set(self.pods) if self.pods else names
            if self._victim is not None:
                expected.add(self._victim[0])
            ready = [p for p in pods if _is_ready(p)]
            replaced = self._victim is None or any(
                str(p.metadata.name) == self._victim[0] and str(p.metadata.uid) != self._victim[1]
                for p in ready
            )
            if pods and replaced and {str(p.metadata.name) for p in ready} >= expected:
                self._victim = None
                return ", ".join(self._describe(p) for p in ready)
            if self._clock() >= deadline:
                waiting = sorted(expected - {str(p.metadata.name) for p in ready})
                raise TimeoutError(
                    f"pods {waiting or sorted(expected)} in {self.namespace} not replaced"
                    f" and ready within {timeout_s:g} s"
                )
            self._wait(self.poll_s)


def kubernetes_api() -> PodApi:
    """A ``CoreV1Api`` from the in-cluster config, else from ``~/.kube/config``."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
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
    back: str = ""  # what was up and ready afterwards (a new instance)


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
            try:
                self.target.wait_ready(self.ready_timeout_s)
            except Exception as exc:
                self.error = f"target not ready before the first kill: {exc!r}"
                return
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
        error = back = ""
        try:
            back = self.target.wait_ready(self.ready_timeout_s)
            down = time.monotonic() - began
        except Exception as exc:
            error = f"not ready again: {exc!r}"
            self.error = error
        kill = Kill(len(self.kills) + 1, at, target, round(waited, 3), down, error, back)
        self.kills.append(kill)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(asdict(kill)) + "\n")
        if self.on_kill is not None:
            self.on_kill(kill)
