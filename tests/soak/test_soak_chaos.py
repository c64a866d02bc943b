"""The chaos driver (soak/chaos.py): its schedule, its loop, and its two targets.

The contract (``Target``) is checked the same way against the local target (a real
``ourios serve`` SIGKILLed by pid and restarted on its data directory) and the
Kubernetes target (pods of a fake StatefulSet, through an in-process fake
``CoreV1Api`` and through the real ``kubernetes`` client talking to a stub API server).
No cluster exists here; the stub serves the core v1 pod endpoints the client calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from soak.chaos import (
    ChaosDriver,
    KillSchedule,
    KubernetesTarget,
    LocalTarget,
    Target,
    read_kills,
)
from soak.node import ServeNode, free_port
from tests.support.fakekube import FakeCluster, StubApiServer

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "soak"
PODS = ("ourios-0", "ourios-1")


# --- the schedule -------------------------------------------------------------------------


def test_the_schedule_is_seeded_and_within_its_jitter() -> None:
    def first(seed: int, n: int = 50) -> list[float]:
        it = KillSchedule(60.0, seed).intervals()
        return [next(it) for _ in range(n)]

    assert first(7) == first(7)
    assert first(7) != first(8)
    assert all(30.0 <= v <= 90.0 for v in first(7))
    assert min(first(7)) < 40 and max(first(7)) > 80  # it does spread
    with pytest.raises(ValueError, match="kill_every_s"):
        KillSchedule(0, 1)
    with pytest.raises(ValueError, match="jitter"):
        KillSchedule(1, 1, jitter=1.0)


# --- the contract, against every target ----------------------------------------------------


@dataclass
class Harness:
    target: Target
    #: Is the instance a kill() or wait_ready() named still alive?
    alive: Callable[[str], bool]
    #: Whatever else the target promises about the kill it just made.
    check_kill: Callable[[str], None]


def _pid(identity: str) -> int:
    assert identity.startswith("pid "), identity
    return int(identity.split()[1])


def _pid_alive(identity: str) -> bool:
    try:
        os.kill(_pid(identity), 0)
    except ProcessLookupError:
        return False
    return True


def _uids(identity: str) -> list[str]:
    words = identity.replace(",", " ").split()
    return [words[i + 1] for i, w in enumerate(words) if w == "uid"]


@pytest.fixture
def local_harness(tmp_path: Path) -> Iterator[Harness]:
    node = ServeNode(
        tmp_path / "data",
        {"OURIOS_SERVER_NODE_ID": "chaos-0"},
        http_port=free_port(),
        log_path=tmp_path / "serve.log",
    )
    node.start()
    try:
        yield Harness(LocalTarget(node), _pid_alive, lambda _: None)
    finally:
        node.close()


def _kube_harness(cluster: FakeCluster, target: KubernetesTarget) -> Harness:
    def alive(identity: str) -> bool:
        return all(cluster.exists(uid) for uid in _uids(identity))

    def check_kill(killed: str) -> None:
        (uid,) = _uids(killed)
        last = cluster.deletes()[-1]
        assert last.args["grace"] == 0
        assert last.args["body"]["gracePeriodSeconds"] == 0
        assert last.args["body"]["preconditions"] == {"uid": uid}
        assert last.args["namespace"] == NAMESPACE and last.name in killed

    return Harness(target, alive, check_kill)


@pytest.fixture
def kube_harness() -> Harness:
    cluster = FakeCluster(NAMESPACE, PODS)
    target = KubernetesTarget(cluster.api(), NAMESPACE, pods=PODS, seed=3, wait=lambda _: None)
    return _kube_harness(cluster, target)


@pytest.fixture
def kube_http_harness() -> Iterator[Harness]:
    cluster = FakeCluster(NAMESPACE, PODS)
    with StubApiServer(cluster) as server:
        api = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))
        target = KubernetesTarget(api, NAMESPACE, selector="app.kubernetes.io/name=ourios",
                                  seed=3, poll_s=0.01)  # fmt: skip
        yield _kube_harness(cluster, target)


@pytest.mark.parametrize("harness", ["local_harness", "kube_harness", "kube_http_harness"])
def test_the_target_contract(harness: str, request: pytest.FixtureRequest) -> None:
    """Ready names what is up; kill kills one of those, at once; ready again names a new
    instance in its place; twice in a row."""
    h: Harness = request.getfixturevalue(harness)
    assert isinstance(h.target, Target)
    up = h.target.wait_ready(60)
    assert up and h.alive(up)
    seen = {up}
    for _ in range(2):
        killed = h.target.kill()
        assert killed and killed in up, (killed, up)
        assert not h.alive(killed), f"{killed} still alive after kill()"
        h.check_kill(killed)
        up = h.target.wait_ready(60)
        assert up not in seen and h.alive(up)
        seen.add(up)


# --- the Kubernetes target in detail ---------------------------------------------------------


def test_kubernetes_target_picks_pods_with_its_seed() -> None:
    def victims(seed: int) -> list[str]:
        cluster = FakeCluster(NAMESPACE, ("a-0", "a-1", "a-2"), absent_reads=1, starting_reads=0)
        target = KubernetesTarget(cluster.api(), NAMESPACE, pods=("a-2", "a-0", "a-1"), seed=seed)
        names = []
        for _ in range(12):
            names.append(target.kill().split("/")[1].split()[0])
            target.wait_ready(5)
        return names

    assert victims(1) == victims(1)
    assert victims(1) != victims(2)
    assert set(victims(1)) == {"a-0", "a-1", "a-2"}


def test_named_pods_need_only_get_and_delete() -> None:
    """The chaos Job's Role grants get and delete on the named pods: no list."""
    cluster = FakeCluster(NAMESPACE, PODS)
    target = KubernetesTarget(cluster.api(), NAMESPACE, pods=PODS, wait=lambda _: None)
    target.wait_ready(5)
    target.kill()
    target.wait_ready(5)
    assert {c.method for c in cluster.calls} == {"read", "delete"}
    assert {c.name for c in cluster.calls} <= set(PODS)


def test_waiting_tolerates_404_until_the_replacement_is_ready() -> None:
    cluster = FakeCluster(NAMESPACE, ("p-0",), absent_reads=3, starting_reads=4)
    target = KubernetesTarget(cluster.api(), NAMESPACE, pods=("p-0",), wait=lambda _: None)
    old = cluster.uid("p-0")
    target.kill()
    back = target.wait_ready(5)
    assert old not in back and cluster.uid("p-0") in back
    reads = [c for c in cluster.calls if c.method == "read"]
    assert len(reads) >= 3 + 4  # absent, then starting, then ready


def test_a_pod_that_never_returns_times_out() -> None:
    cluster = FakeCluster(NAMESPACE, ("p-0",), recreate=False)
    now = [0.0]

    def wait(seconds: float) -> None:  # a fake clock: every poll advances it
        now[0] += seconds

    target = KubernetesTarget(
        cluster.api(), NAMESPACE, pods=("p-0",), wait=wait, clock=lambda: now[0], poll_s=1.0
    )
    target.kill()
    with pytest.raises(TimeoutError, match="p-0"):
        target.wait_ready(30)
    assert 30 <= now[0] <= 31


def test_other_api_errors_are_not_swallowed() -> None:
    cluster = FakeCluster(NAMESPACE, PODS)
    target = KubernetesTarget(cluster.api(), "elsewhere", pods=PODS)
    with pytest.raises(client.exceptions.ApiException) as raised:
        target.kill()
    assert raised.value.status == 403


def test_no_live_pod_to_kill_is_an_error() -> None:
    cluster = FakeCluster(NAMESPACE, PODS, labels={"app": "other"})
    target = KubernetesTarget(cluster.api(), NAMESPACE, selector="app=ourios")
    with pytest.raises(RuntimeError, match="no live target pod"):
        target.kill()


def test_pods_or_selector_not_both() -> None:
    api = FakeCluster(NAMESPACE, PODS).api()
    with pytest.raises(ValueError):
        KubernetesTarget(api, NAMESPACE, pods=PODS, selector="a=b")
    with pytest.raises(ValueError):
        KubernetesTarget(api, NAMESPACE)


def test_the_chaos_command_against_a_stub_api_server(tmp_path: Path) -> None:
    """``python -m soak chaos`` as the chaos Job runs it, with a kubeconfig for the stub:
    the real client, zero grace, one kill per interval, the kill log, exit 0."""
    cluster = FakeCluster(NAMESPACE, ("ourios-0",))
    log = tmp_path / "kills.jsonl"
    with StubApiServer(cluster) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update({"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE})
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.run(
            [sys.executable, "-m", "soak", "chaos", "--pods", "ourios-0"]
            + ["--kill-every", "50ms", "--max-kills", "3", "--duration", "60s"]
            + ["--ready-timeout", "30s", "--seed", "5", "--log", str(log)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kills; every pod came back ready" in proc.stdout
    kills = read_kills(log)
    assert [k.number for k in kills] == [1, 2, 3]
    assert all(k.down_s is not None and not k.error for k in kills)
    deletes = [r for r in server.requests if r[0] == "DELETE"]
    assert len(deletes) == 3
    assert all(path.endswith("/namespaces/soak/pods/ourios-0?gracePeriodSeconds=0")
               for _, path in deletes)  # fmt: skip
    assert not [r for r in server.requests if r[0] == "GET" and "/pods?" in r[1]], "listed"


# --- the driver loop ----------------------------------------------------------------------


class ScriptedTarget:
    """A target whose instances are numbers; ``fail_after`` kills, it never returns."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.instance = 1
        self.up = True
        self.kills = 0
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def kill(self) -> str:
        with self.lock:
            self.up = False
            self.kills += 1
            return f"instance {self.instance}"

    def wait_ready(self, timeout_s: float) -> str:
        with self.lock:
            if not self.up:
                if self.fail_after is not None and self.kills > self.fail_after:
                    raise TimeoutError(f"instance {self.instance} not back in {timeout_s:g} s")
                self.instance += 1
                self.up = True
            return f"instance {self.instance}"


def test_the_driver_kills_on_schedule_and_logs_each_kill(tmp_path: Path) -> None:
    target = ScriptedTarget()
    schedule = KillSchedule(0.02, seed=11)
    log = tmp_path / "kills.jsonl"
    seen: list[int] = []
    driver = ChaosDriver(
        target, schedule, log, max_kills=4, on_kill=lambda k: seen.append(k.number)
    )
    with driver:
        driver.join(30)
    assert not driver.error
    assert seen == [1, 2, 3, 4] and target.kills == 4
    intervals = schedule.intervals()
    expected = [round(next(intervals), 3) for _ in range(4)]
    kills = read_kills(log)
    assert kills == driver.kills
    assert [k.waited_s for k in kills] == expected
    assert [(k.target, k.back) for k in kills] == [
        (f"instance {i}", f"instance {i + 1}") for i in range(1, 5)
    ]
    assert all(k.down_s is not None and k.down_s >= 0 for k in kills)


def test_the_driver_stops_when_the_node_does_not_come_back(tmp_path: Path) -> None:
    target = ScriptedTarget(fail_after=1)
    driver = ChaosDriver(target, KillSchedule(0.01, 1), tmp_path / "k.jsonl", max_kills=5)
    with driver:
        driver.join(30)
    assert target.kills == 2
    assert "not ready again" in driver.error
    last = read_kills(tmp_path / "k.jsonl")[-1]
    assert last.down_s is None and "TimeoutError" in last.error


def test_no_kill_starts_after_stop_at_and_close_interrupts_the_wait(tmp_path: Path) -> None:
    target = ScriptedTarget()
    soon = ChaosDriver(
        target, KillSchedule(3600, 1), tmp_path / "a.jsonl", stop_at=time.monotonic() + 5
    )
    with soon:
        soon.join(10)
    assert target.kills == 0 and not soon.error
    waiting = ChaosDriver(target, KillSchedule(3600, 1), tmp_path / "b.jsonl")
    waiting.start()
    began = time.monotonic()
    waiting.close()
    assert time.monotonic() - began < 5 and target.kills == 0


def test_a_target_down_before_the_first_kill_is_reported(tmp_path: Path) -> None:
    target = ScriptedTarget(fail_after=-1)
    target.up = False
    driver = ChaosDriver(target, KillSchedule(0.01, 1), tmp_path / "k.jsonl")
    with driver:
        driver.join(10)
    assert target.kills == 0 and "before the first kill" in driver.error
