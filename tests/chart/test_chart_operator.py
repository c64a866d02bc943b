"""The chart's values an operator expects from the Loki and OpenTelemetry Collector charts
(issue 24, item 8): ``global.imageRegistry``, ``extraEnvFrom``, ``initContainers``,
``extraContainers``, ``lifecycleHooks``, ``dnsPolicy``/``dnsConfig``, a ServiceMonitor
``namespace`` and a ``networkPolicy``; and why an ``OURIOS_*`` name in ``extraEnv`` is
refused, in the words the user reads.

Each value is rendered with ``helm template``, linted with ``helm lint --strict`` and every
object it renders is validated strictly with kubernetes-validate (``test_chart.py``'s
helpers); what reaches the app is read back with the pod emulator's ``ourios config``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import gen_chart_schema

from .test_chart import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    S3_URL,
    Obj,
    PodEmulator,
    Rendered,
    Values,
    _validate_objects,
    chart_meta,
    helm,
    helm_lint,
    nest,
    render,
    render_error,
)

SIDECAR = {"name": "shipper", "image": "busybox:1.36", "args": ["sleep", "infinity"]}
INIT = {"name": "wait-for-store", "image": "busybox:1.36", "command": ["true"]}
PROXY_SECRET = {"proxy": {"HTTPS_PROXY": "http://proxy.corp:3128", "OURIOS_WAL_BARRIER_SECS": "1"}}
CLIENTS = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}

#: One value set per new value (and one with them all), each linted and validated.
OPERATOR_SETS: dict[str, Values] = {
    "image_registry": {"global": {"imageRegistry": "registry.corp:5000"}},
    "extra_env_from": {"extraEnvFrom": [{"secretRef": {"name": "proxy"}}]},
    "containers": {"initContainers": [INIT], "extraContainers": [SIDECAR]},
    "lifecycle_hooks": {
        "lifecycleHooks": {"postStart": {"exec": {"command": ["sh", "-c", "echo started"]}}}
    },
    "dns": {
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "2"}]},
    },
    "service_monitor_namespace": {
        "serviceMonitor": {"enabled": True, "namespace": "monitoring"},
    },
    "network_policy": {
        "networkPolicy": {
            "enabled": True,
            "ingress": {"from": CLIENTS, "metricsNamespaceSelector": MONITORING},
        }
    },
    "network_policy_egress_s3": {
        "store": {"url": S3_URL, "endpointUrl": "http://minio.storage:9000"},
        "networkPolicy": {"enabled": True, "egress": {"enabled": True}},
    },
    "everything": {
        "global": {"imageRegistry": "mirror.corp"},
        "extraEnvFrom": [{"configMapRef": {"name": "proxy-env"}}],
        "initContainers": [INIT],
        "extraContainers": [SIDECAR],
        "lifecycleHooks": {"preStop": {"httpGet": {"path": "/healthz", "port": "http"}}},
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "serviceMonitor": {"enabled": True, "namespace": "monitoring"},
        "store": {"url": S3_URL},
        "networkPolicy": {
            "enabled": True,
            "ingress": {
                "from": CLIENTS,
                "metricsNamespaceSelector": MONITORING,
                "extra": [{"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}],
            },
            "egress": {
                "enabled": True,
                "storeTo": [{"ipBlock": {"cidr": "52.0.0.0/8"}}],
                "storePorts": [443, 8443],
                "extra": [{"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}]}],
            },
        },
    },
}


@pytest.mark.parametrize("name", list(OPERATOR_SETS))
def test_clone_8_each_new_value_lints_renders_and_validates(name: str) -> None:
    values = OPERATOR_SETS[name]
    helm_lint(values)
    rendered = render(values)
    for reason in _validate_objects(rendered):
        print(f"{name}: not schema-validated: {reason}; metadata validated instead")


def test_clone_8_every_new_value_is_in_values_yaml_and_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = gen_chart_schema.chart_properties()
    for key in ("extraEnvFrom", "initContainers", "extraContainers", "lifecycleHooks"):
        assert key in values and key in schema, key
    for key in ("dnsPolicy", "dnsConfig", "networkPolicy"):
        assert key in values and key in schema, key
    assert values["global"]["imageRegistry"] == ""
    assert "imageRegistry" in schema["global"]["properties"]
    assert values["serviceMonitor"]["namespace"] == ""
    assert values["networkPolicy"]["enabled"] is False
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    for documented in (
        "global.imageRegistry",
        "extraEnvFrom",
        "initContainers",
        "extraContainers",
        "lifecycleHooks",
        "dnsConfig",
        "serviceMonitor.namespace",
        "networkPolicy",
    ):
        assert f"`{documented}" in readme, f"charts/ourios/README.md does not document {documented}"


# --- global.imageRegistry ---------------------------------------------------------------


def _images(rendered: Rendered) -> set[str]:
    pods = [rendered.pod_spec] + [p["spec"] for p in rendered.of_kind("Pod")]
    return {c["image"] for spec in pods for c in spec["containers"] if c["name"] != "shipper"}


@pytest.mark.parametrize(
    ("repository", "registry", "image"),
    [
        ("ghcr.io/ourios/ourios", "", "ghcr.io/ourios/ourios"),
        ("ghcr.io/ourios/ourios", "registry.corp:5000", "registry.corp:5000/ourios/ourios"),
        ("ghcr.io/ourios/ourios", "mirror.corp/ghcr/", "mirror.corp/ghcr/ourios/ourios"),
        ("ourios/ourios", "mirror.corp", "mirror.corp/ourios/ourios"),
        ("localhost/ourios", "mirror.corp", "mirror.corp/ourios"),
    ],
)
def test_clone_8_global_image_registry_replaces_the_registry_of_every_image(
    repository: str, registry: str, image: str
) -> None:
    values = {"global": {"imageRegistry": registry}, "image": {"repository": repository}}
    tag = chart_meta()["appVersion"]
    # the StatefulSet's and the `helm test` pod's
    assert _images(render(values)) == {f"{image}:{tag}"}
    pinned = render({**values, "image": {"repository": repository, "digest": "sha256:" + "c" * 64}})
    assert _images(pinned) == {f"{image}@sha256:{'c' * 64}"}


# --- extraEnvFrom, initContainers, extraContainers --------------------------------------


def test_clone_8_extra_env_from_reaches_the_pod_and_the_settings_win(tmp_path: Path) -> None:
    rendered = render(OPERATOR_SETS["extra_env_from"])
    sources = rendered.container["envFrom"]
    assert sources[0] == {"secretRef": {"name": "proxy"}}
    assert sources[-1] == {"configMapRef": {"name": f"{FULLNAME}-settings"}}
    pod = PodEmulator(rendered, tmp_path, secrets=PROXY_SECRET)
    assert pod.env()["HTTPS_PROXY"] == "http://proxy.corp:3128"
    # a later envFrom source wins: the chart's settings, not the Secret's stray variable
    assert pod.ourios_config()["OURIOS_WAL_BARRIER_SECS"] == 300


def test_clone_8_init_containers_and_sidecars_beside_ourios() -> None:
    rendered = render(OPERATOR_SETS["containers"])
    spec = rendered.pod_spec
    assert spec["initContainers"] == [INIT]
    assert [c["name"] for c in spec["containers"]] == ["ourios", "shipper"]
    assert spec["containers"][1] == SIDECAR
    assert "initContainers" not in render().pod_spec
    assert [c["name"] for c in render().pod_spec["containers"]] == ["ourios"]


# --- lifecycleHooks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, {"preStop": {"exec": {"command": ["sleep", "5"]}}}, id="defaults"),
        pytest.param(
            OPERATOR_SETS["lifecycle_hooks"],
            {
                "postStart": {"exec": {"command": ["sh", "-c", "echo started"]}},
                "preStop": {"exec": {"command": ["sleep", "5"]}},
            },
            id="post_start_keeps_the_sleep",
        ),
        pytest.param(
            {
                "lifecycleHooks": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 9"]}}},
                "shutdown": {"preStopSleepSecs": 9},
            },
            {"preStop": {"exec": {"command": ["sh", "-c", "sleep 9"]}}},
            id="pre_stop_replaces_the_sleep",
        ),
        pytest.param({"shutdown": {"preStopSleepSecs": 0}}, None, id="no_hook"),
    ],
)
def test_clone_8_lifecycle_hooks_beside_the_pre_stop_sleep(
    values: Values, expected: Obj | None
) -> None:
    assert render(values).container.get("lifecycle") == expected


def test_clone_8_lifecycle_hooks_refuse_an_unknown_hook() -> None:
    assert "schema" in render_error({"lifecycleHooks": {"preStopp": {"exec": {}}}})


# --- dnsPolicy, dnsConfig, serviceMonitor.namespace --------------------------------------


def test_clone_8_dns_policy_and_config() -> None:
    spec = render(OPERATOR_SETS["dns"]).pod_spec
    assert spec["dnsPolicy"] == "None"
    assert spec["dnsConfig"] == OPERATOR_SETS["dns"]["dnsConfig"]
    default = render().pod_spec
    assert "dnsPolicy" not in default and "dnsConfig" not in default
    assert "schema" in render_error({"dnsPolicy": "ClusterFirstt"})


def test_clone_8_service_monitor_in_another_namespace_selects_the_release() -> None:
    monitor = render(OPERATOR_SETS["service_monitor_namespace"]).one("ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    default = render({"serviceMonitor": {"enabled": True}}).one("ServiceMonitor")
    assert default["metadata"]["namespace"] == NAMESPACE


# --- networkPolicy -------------------------------------------------------------------------


def _ports(rule: Obj) -> set[tuple[int, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def _policy(values: Values) -> Obj:
    policy: Obj = render(values).one("NetworkPolicy")["spec"]
    return policy


def test_clone_8_network_policy_ingress_from_clients_and_the_monitoring_namespace() -> None:
    assert not render().of_kind("NetworkPolicy")
    rendered = render(OPERATOR_SETS["network_policy"])
    spec = rendered.one("NetworkPolicy")["spec"]
    labels = rendered.statefulset["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    otlp, metrics, own = spec["ingress"]
    assert _ports(otlp) == {(4317, "TCP"), (4318, "TCP")} and otlp["from"] == CLIENTS
    assert _ports(metrics) == {(4318, "TCP")}
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": MONITORING}}]
    assert _ports(own) == {(4318, "TCP")}
    assert own["from"] == [{"podSelector": spec["podSelector"]}]
    # The ports follow the server's, and no `from` admits any client.
    moved = _policy(
        {"networkPolicy": {"enabled": True}, "server": {"httpPort": 8080, "grpcPort": 9090}}
    )
    assert "from" not in moved["ingress"][0]
    assert _ports(moved["ingress"][0]) == {(8080, "TCP"), (9090, "TCP")}


@pytest.mark.parametrize(
    ("store", "storePorts", "ports"),
    [
        pytest.param({"url": S3_URL}, [], [443], id="aws"),
        pytest.param(
            {"url": S3_URL, "endpointUrl": "http://minio.storage:9000"}, [], [9000], id="port"
        ),
        pytest.param({"url": S3_URL, "endpointUrl": "http://minio.storage"}, [], [80], id="http"),
        pytest.param({"url": S3_URL, "endpointUrl": "https://r2.example"}, [], [443], id="https"),
        pytest.param({"url": S3_URL}, [8443, 443], [8443, 443], id="explicit"),
        pytest.param({}, [], None, id="embedded_store"),
    ],
)
def test_clone_8_network_policy_egress_to_dns_and_the_store(
    store: dict[str, Any], storePorts: list[int], ports: list[int] | None
) -> None:
    spec = _policy(
        {
            "store": store,
            "networkPolicy": {
                "enabled": True,
                "egress": {"enabled": True, "storePorts": storePorts},
            },
        }
    )
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    dns, *rest = spec["egress"]
    assert _ports(dns) == {(53, "UDP"), (53, "TCP")}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    if ports is None:
        assert len(rest) == 1  # the embedded store is on the volume: no store rule
    else:
        store_rule = rest[0]
        assert [p["port"] for p in store_rule["ports"]] == ports
        assert "to" not in store_rule  # any address (AWS S3's change) unless storeTo
    own = rest[-1]
    assert _ports(own) == {(4318, "TCP")} and own["to"] == [{"podSelector": spec["podSelector"]}]


def test_clone_8_network_policy_passes_extra_rules_and_store_peers_through() -> None:
    spec = _policy(OPERATOR_SETS["everything"])
    assert spec["ingress"][-1] == {"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}
    assert spec["egress"][-1] == {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}]}
    assert spec["egress"][1]["to"] == [{"ipBlock": {"cidr": "52.0.0.0/8"}}]


# --- extraEnv OURIOS_*: the user reads why -------------------------------------------------


def test_clone_8_an_ourios_variable_in_extra_env_is_refused_saying_why() -> None:
    env = {
        "extraEnv": [{"name": "AWS_ROLE_ARN", "value": "x"}, {"name": "OURIOS_WAL_BARRIER_SECS"}]
    }
    # helm checks the schema first: its message is the one the user sees
    error = render_error(env)
    assert "/extraEnv/1/name" in error
    assert "the ourios settings are values of this chart" in error
    assert "OURIOS_WAL_BARRIER_SECS is wal.barrierSecs" in error
    # and the chart's own check says it too when the schema is skipped, naming the value
    proc = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--skip-schema-validation", "-f", "-"],
        input=yaml.safe_dump(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "extraEnv[1] OURIOS_WAL_BARRIER_SECS" in proc.stderr
    assert "(OURIOS_WAL_BARRIER_SECS is wal.barrierSecs; docs/CONFIG.md)" in proc.stderr
    # any other name passes
    assert render(nest({"extraEnv": [{"name": "AWS_ROLE_ARN", "value": "x"}]}))
