"""k8s/: the soak, chaos and verifier Jobs (kustomize), checked without a cluster.

``kubectl kustomize k8s`` (kubectl from the same npm package as helm,
scripts/install-test-tools.sh) renders the manifests; then:

- every object is strictly valid for the newest Kubernetes kubernetes-validate knows and
  for the chart's minimum;
- the Jobs point at a release installed by the chart (``helm template ourios`` in the
  same namespace): the Service and port locust targets, the pods the chaos Job deletes,
  the Secret the verifier reads, the store URL the release publishes to;
- the chaos Job's Role allows exactly ``get`` and ``delete`` on exactly those pods, and
  only the chaos pod gets a service-account token;
- the soak image (soak/Dockerfile) holds what the Jobs run, as the user they run as;
- the Jobs' containers, run here as the kubelet would run them (their command, args
  and environment, image paths mapped to this tree): locust against a real
  ``ourios serve``, the verifier against what it published, the chaos driver's
  arguments through its own parser.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from soak.__main__ import parser as soak_parser
from soak.durations import parse_duration
from soak.ledger import Outcome, read_ledgers
from soak.node import ServeNode, free_port
from tests.support.tools import require_tool

from .test_chart import Rendered, _validate_objects
from .test_dockerfile import dockerfile, dockerignore_patterns, is_ignored, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
SOAK_DOCKERFILE = ROOT / "soak" / "Dockerfile"
SOAK_DOCKERIGNORE = ROOT / "soak" / "Dockerfile.dockerignore"
RELEASE = "ourios"  # the release name the manifests assume (k8s/kustomization.yaml)
NAMESPACE = "observability"
STORE_URL = "s3://ourios-logs"

Obj = dict[str, Any]


def kubectl() -> str:
    """The kubectl the tool script installs (a current client with kustomize), else one
    on PATH."""
    cached = ROOT / ".cache" / "tools" / "bin" / "kubectl"
    return str(cached) if os.access(cached, os.X_OK) else require_tool("kubectl")


@functools.cache
def manifests() -> tuple[Obj, ...]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def one(kind: str, name: str | None = None) -> Obj:
    found = [
        o
        for o in manifests()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def job(name: str) -> Obj:
    return one("Job", name)


def container(job_name: str) -> Obj:
    containers: list[Obj] = job(job_name)["spec"]["template"]["spec"]["containers"]
    (c,) = containers
    return c


def settings() -> dict[str, str]:
    (cm,) = [o for o in manifests() if o["kind"] == "ConfigMap"]
    data: dict[str, str] = cm["data"]
    return data


@functools.cache
def release() -> Rendered:
    """The release the manifests point at, installed as k8s/kustomization.yaml says."""
    values = {"store": {"url": STORE_URL, "accessKeyId": "AKIAX", "secretAccessKey": "s3cr3t"}}
    proc = subprocess.run(
        [require_tool("helm"), "template", RELEASE, str(ROOT / "charts" / "ourios")]
        + ["--namespace", NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return Rendered(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))


def _args(job_name: str) -> dict[str, str]:
    out = {}
    for arg in container(job_name).get("args", []):
        key, _, value = arg.partition("=")
        out[key] = value
    return out


# --- rendering and validation --------------------------------------------------------------


def test_the_kustomization_renders_and_every_object_validates() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in manifests())
    assert [k for k in kinds if k[0] == "Job"] == [
        ("Job", "ourios-soak"),
        ("Job", "ourios-soak-chaos"),
        ("Job", "ourios-soak-verify"),
    ]
    assert {k for k, _ in kinds} == {
        "ConfigMap",
        "Job",
        "PersistentVolumeClaim",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    }
    assert all(o["metadata"]["namespace"] == NAMESPACE for o in manifests())
    assert _validate_objects(Rendered(manifests())) == [], "every kind has a schema"


def test_the_jobs_are_bounded_and_do_not_retry() -> None:
    for name in ("ourios-soak", "ourios-soak-chaos", "ourios-soak-verify"):
        spec = job(name)["spec"]
        assert spec["backoffLimit"] == 0, name
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["activeDeadlineSeconds"] > 0
    run_time = parse_duration(settings()["LOCUST_RUN_TIME"])
    assert job("ourios-soak")["spec"]["activeDeadlineSeconds"] > run_time
    verify = _args("ourios-soak-verify")
    # The verifier waits at least as long as the load runs, then gets its settling time.
    assert float(verify["--wait-ledger-end"]) >= run_time
    deadline = job("ourios-soak-verify")["spec"]["activeDeadlineSeconds"]
    assert deadline > float(verify["--wait-ledger-end"]) + float(verify["--settle-timeout"])


def test_the_jobs_run_as_the_images_non_root_user_on_a_read_only_root() -> None:
    image_user = parse_dockerfile(SOAK_DOCKERFILE.read_text()).final.last("USER").args
    assert image_user == dockerfile().final.last("USER").args == "10001:10001"
    for name in ("ourios-soak", "ourios-soak-chaos", "ourios-soak-verify"):
        pod = job(name)["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert f"{sc['runAsUser']}:{sc['runAsGroup']}" == image_user and sc["runAsNonRoot"]
        c = container(name)
        assert c["image"].startswith("ourios-soak:")
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp"}
        assert "memory" in c["resources"]["limits"]


# --- pointing at the release ---------------------------------------------------------------


def test_locust_targets_the_releases_http_service() -> None:
    host = settings()["LOCUST_HOST"]
    assert host.startswith("http://")
    name, _, port = host.removeprefix("http://").partition(":")
    service = release().one("Service", name)
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["http"] == int(port)
    assert service["metadata"]["namespace"] == NAMESPACE


def test_the_chaos_job_may_delete_exactly_the_releases_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)  # the Job's fieldRef
    sts = release().statefulset
    replicas = sts["spec"]["replicas"]
    start = sts["spec"].get("ordinals", {}).get("start", 0)
    pods = [f"{sts['metadata']['name']}-{start + i}" for i in range(replicas)]
    chaos = soak_parser().parse_args(container("ourios-soak-chaos")["command"][3:]
                                     + container("ourios-soak-chaos")["args"])  # fmt: skip
    assert chaos.pods.split(",") == pods and chaos.selector is None
    (rule,) = one("Role")["rules"]
    assert rule == {
        "apiGroups": [""],
        "resources": ["pods"],
        "resourceNames": pods,
        "verbs": ["get", "delete"],
    }
    binding = one("RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": one("Role")["metadata"]["name"],
    }
    pod = job("ourios-soak-chaos")["spec"]["template"]["spec"]
    account = one("ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    assert pod["automountServiceAccountToken"] is True
    for other in ("ourios-soak", "ourios-soak-verify"):
        assert job(other)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    # It stops killing before the load ends, so the last kill recovers under load.
    assert chaos.duration < parse_duration(settings()["LOCUST_RUN_TIME"])


def test_the_verifier_reads_the_store_and_secret_the_release_uses() -> None:
    node_settings = release().one("ConfigMap", f"{RELEASE}-settings")["data"]
    assert node_settings["OURIOS_STORE_URL"] == settings()["SOAK_STORE_URL"] == STORE_URL
    secret = release().one("Secret", f"{RELEASE}-store")
    env = {e["name"]: e for e in container("ourios-soak-verify")["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]


def test_soak_and_verifier_share_the_ledger_volume() -> None:
    claim = one("PersistentVolumeClaim")["metadata"]["name"]
    for name in ("ourios-soak", "ourios-soak-verify"):
        volumes = job(name)["spec"]["template"]["spec"]["volumes"]
        (ledger,) = [v for v in volumes if "persistentVolumeClaim" in v]
        assert ledger["persistentVolumeClaim"]["claimName"] == claim
        env = {e["name"]: e.get("value") for e in container(name)["env"]}
        mount = {m["name"]: m["mountPath"] for m in container(name)["volumeMounts"]}
        assert env["SOAK_LEDGER_DIR"] == mount[ledger["name"]]


# --- the soak image -------------------------------------------------------------------------


def test_the_soak_image_holds_what_the_jobs_run() -> None:
    image = parse_dockerfile(SOAK_DOCKERFILE.read_text()).final
    workdir = image.last("WORKDIR").args
    assert image.env()["PYTHONPATH"] == workdir
    copies = {i.args.split()[-1].rstrip("/") for i in image.all("COPY")}
    assert {"soak", "app", "wal", "sink"} <= copies
    assert any("'.[soak]'" in i.args for i in image.all("RUN"))
    locustfile = _args("ourios-soak")["--locustfile"]
    assert locustfile.startswith(workdir + "/")
    assert (ROOT / locustfile.removeprefix(workdir + "/")).is_file()
    patterns = dockerignore_patterns(SOAK_DOCKERIGNORE.read_text())
    for path in ("soak/locustfile.py", "soak/bench/loadgen.py", "soak/chaos.py", "app/cli.py",
                 "pyproject.toml", "README.md"):  # fmt: skip
        assert not is_ignored(path, patterns), path
    for path in ("soak/out/run/ledger", ".venv/bin/python", "tests/conftest.py", ".git"):
        assert is_ignored(path, patterns), path


# --- the containers, run here ----------------------------------------------------------------


def _container_env(job_name: str, **overrides: str) -> dict[str, str]:
    c = container(job_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOAK_", "LOCUST_"))}
    for source in c.get("envFrom", []):
        env.update(settings() if "configMapRef" in source else {})
    for entry in c.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            env[entry["name"]] = "from-the-secret"
    env["PYTHONPATH"] = str(ROOT)  # the image's PYTHONPATH, its WORKDIR
    env.update(overrides)
    return env


def _localise(args: list[str]) -> list[str]:
    workdir = parse_dockerfile(SOAK_DOCKERFILE.read_text()).final.last("WORKDIR").args
    return [a.replace(workdir + "/", str(ROOT) + "/") for a in args]


@pytest.mark.slow
def test_the_soak_and_verify_containers_run_against_a_node(tmp_path: Path) -> None:
    node = ServeNode(tmp_path / "data", {}, http_port=free_port(), log_path=tmp_path / "log")
    ledger = tmp_path / "ledger"
    node.start()
    try:
        soak = container("ourios-soak")
        assert soak["command"] == ["locust"]
        env = _container_env(
            "ourios-soak", LOCUST_HOST=node.url, LOCUST_RUN_TIME="4s", SOAK_LEDGER_DIR=str(ledger)
        )
        proc = subprocess.run(
            [sys.executable, "-m", "locust", *_localise(soak["args"])],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert node.terminate() == 0  # the final cut publishes what was acknowledged
    finally:
        node.close()
    index = read_ledgers(ledger)
    assert index.ended and not index.anomalies
    acked = [r for r, e in index.requests.items() if e.outcome is Outcome.ACKED]
    assert len(acked) >= 10, proc.stdout
    # LOCUST_USERS and SOAK_TENANTS reached locust and the user.
    users = {r.rsplit(".", 2)[1] for r in index.requests}
    assert len(users) == int(settings()["LOCUST_USERS"])
    tenants = {e.tenant for e in index.requests.values()}
    assert 1 < len(tenants) <= int(settings()["SOAK_TENANTS"])
    assert all(e.records == int(settings()["SOAK_BATCH"]) for e in index.requests.values())

    verify = container("ourios-soak-verify")
    report = tmp_path / "verify.json"
    env = _container_env(
        "ourios-soak-verify",
        SOAK_STORE_URL=f"file://{tmp_path / 'data' / 'objects'}",
        SOAK_LEDGER_DIR=str(ledger),
        SOAK_VERIFY_OUT=str(report),
    )
    proc = subprocess.run(
        [sys.executable, *verify["command"][1:], *verify["args"]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify["command"][:3] == ["python", "-m", "soak"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify OK" in proc.stdout and report.is_file()
