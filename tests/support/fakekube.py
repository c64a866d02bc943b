"""A fake Kubernetes API for the chaos driver's pod target: no cluster exists here.

``FakeCluster`` holds the pods of one StatefulSet in one namespace and plays its
controller, deterministically: the state advances one step per API read, never with
time. After a pod is deleted it is absent for ``absent_reads`` reads of it, then exists
again under the same name with a new uid, not ready, for ``starting_reads`` reads, then
ready. ``recreate=False`` is a controller that never brings it back.

Two ways in, both recording every call in ``FakeCluster.calls``:

- ``FakeCluster.api()`` — an object with the three ``CoreV1Api`` methods the driver
  calls, returning the ``kubernetes`` client's own models and raising its
  ``ApiException`` (404 for a missing pod, 409 for a failed uid precondition);
- ``StubApiServer(cluster)`` — the same over HTTP on 127.0.0.1 (the pod paths of the
  core v1 API, JSON in and out), so the real ``kubernetes`` client, configured by a
  kubeconfig file (``write_kubeconfig``), can be pointed at it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

_SERIALIZER = client.ApiClient()


@dataclass
class _Pod:
    uid: str
    absent: int = 0  # reads left before it exists again (after a delete)
    starting: int = 0  # reads left before it is ready


@dataclass(frozen=True)
class Call:
    method: str  # "list", "read", "delete"
    name: str
    args: Mapping[str, Any]


@dataclass
class FakeCluster:
    namespace: str
    names: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "ourios"})
    absent_reads: int = 2
    starting_reads: int = 2
    recreate: bool = True
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._uids: Iterator[int] = itertools.count(1)
        self._pods = {name: _Pod(self._new_uid(name)) for name in self.names}

    def _new_uid(self, name: str) -> str:
        return f"{name}-uid-{next(self._uids)}"

    def uid(self, name: str) -> str:
        with self._lock:
            return self._pods[name].uid

    def exists(self, uid: str) -> bool:
        with self._lock:
            return any(p.uid == uid and p.absent == 0 for p in self._pods.values())

    def deletes(self) -> list[Call]:
        return [c for c in self.calls if c.method == "delete"]

    # The controller: one step per read of a pod.

    def _step(self, name: str) -> _Pod | None:
        pod = self._pods[name]
        if pod.absent > 0:
            if not self.recreate:
                return None
            pod.absent -= 1
            if pod.absent > 0:
                return None
            pod.uid = self._new_uid(name)
            pod.starting = self.starting_reads
            return pod
        if pod.starting > 0:
            pod.starting -= 1
        return pod

    def _model(self, name: str, pod: _Pod) -> client.V1Pod:
        ready = pod.starting == 0
        return client.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=client.V1ObjectMeta(
                name=name, namespace=self.namespace, uid=pod.uid, labels=dict(self.labels)
            ),
            status=client.V1PodStatus(
                phase="Running" if ready else "Pending",
                conditions=[
                    client.V1PodCondition(type="Ready", status="True" if ready else "False")
                ],
            ),
        )

    def _check_namespace(self, namespace: str) -> None:
        if namespace != self.namespace:
            raise ApiException(status=403, reason=f"forbidden: namespace {namespace}")

    def read(self, name: str, namespace: str) -> client.V1Pod:
        with self._lock:
            self.calls.append(Call("read", name, {"namespace": namespace}))
            self._check_namespace(namespace)
            pod = self._step(name) if name in self._pods else None
            if pod is None:
                raise ApiException(status=404, reason="Not Found")
            return self._model(name, pod)

    def list(self, namespace: str, label_selector: str) -> client.V1PodList:
        with self._lock:
            self.calls.append(
                Call("list", "", {"namespace": namespace, "selector": label_selector})
            )
            self._check_namespace(namespace)
            wanted = dict(kv.split("=", 1) for kv in label_selector.split(",") if kv)
            if not wanted.items() <= dict(self.labels).items():
                return client.V1PodList(items=[])
            items = []
            for name in sorted(self._pods):
                pod = self._step(name)
                if pod is not None:
                    items.append(self._model(name, pod))
            return client.V1PodList(items=items)

    def delete(self, name: str, namespace: str, query_grace: Any, body: Mapping[str, Any]) -> Any:
        with self._lock:
            self.calls.append(
                Call("delete", name, {"namespace": namespace, "grace": query_grace, "body": body})
            )
            self._check_namespace(namespace)
            pod = self._pods.get(name)
            if pod is None or pod.absent > 0:
                raise ApiException(status=404, reason="Not Found")
            want = (body.get("preconditions") or {}).get("uid")
            if want is not None and want != pod.uid:
                raise ApiException(status=409, reason=f"precondition failed: uid {want}")
            model = self._model(name, pod)
            pod.absent = self.absent_reads
            return model

    def api(self) -> FakeCoreV1Api:
        return FakeCoreV1Api(self)


class FakeCoreV1Api:
    """The three ``CoreV1Api`` methods, in process."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        return self.cluster.list(namespace, kwargs.get("label_selector") or "")

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self.cluster.read(name, namespace)

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        body = kwargs.get("body")
        wire = _SERIALIZER.sanitize_for_serialization(body) if body is not None else {}
        return self.cluster.delete(name, namespace, kwargs.get("grace_period_seconds"), wire)


class StubApiServer:
    """``FakeCluster`` behind the core v1 pod endpoints on 127.0.0.1 (module docstring).
    A context manager; ``url`` is the API server's address."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        handler = self._handler()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="stub-kube-api", daemon=True
        )

    @property
    def url(self) -> str:
        # an AF_INET server's address: (host, port)
        host, port = cast(tuple[str, int], self._server.server_address[:2])
        return f"http://{host}:{port}"

    def __enter__(self) -> StubApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def write_kubeconfig(self, path: Path, namespace: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "chaos", "user": {"token": "stub-token"}}],
            "contexts": [
                {
                    "name": "stub",
                    "context": {"cluster": "stub", "user": "chaos", "namespace": namespace},
                }
            ],
            "current-context": "stub",
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self
        cluster = self.cluster

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # the calls are recorded; nothing goes to stderr

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[str, str | None, dict[str, list[str]]] | None:
                parts = urlsplit(self.path)
                segments = parts.path.strip("/").split("/")
                # api/v1/namespaces/<ns>/pods[/<name>]
                if segments[:3] != ["api", "v1", "namespaces"] or len(segments) not in (5, 6):
                    return None
                if segments[4] != "pods":
                    return None
                name = segments[5] if len(segments) == 6 else None
                return segments[3], name, parse_qs(parts.query)

            def _handle(self, method: str) -> None:
                stub.requests.append((method, self.path))
                route = self._route()
                if route is None:
                    self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                    return
                namespace, name, query = route
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                try:
                    if method == "GET" and name is None:
                        selector = (query.get("labelSelector") or [""])[0]
                        result: Any = cluster.list(namespace, selector)
                    elif method == "GET":
                        result = cluster.read(name or "", namespace)
                    elif method == "DELETE" and name is not None:
                        graces = query.get("gracePeriodSeconds")
                        grace = graces[0] if graces else None
                        result = cluster.delete(
                            name, namespace, None if grace is None else int(grace), body
                        )
                    else:
                        self._send(405, {"kind": "Status", "code": 405})
                        return
                except ApiException as exc:
                    self._send(
                        int(exc.status or 500),
                        {"kind": "Status", "code": exc.status, "message": str(exc.reason)},
                    )
                    return
                self._send(200, _SERIALIZER.sanitize_for_serialization(result))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        return Handler
