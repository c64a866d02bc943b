"""The Helm chart: lint, render, validate, and check it against the app it deploys.

No cluster here, so a pod is emulated from the rendered objects (``PodEmulator``): the
container's command and args (the image's ENTRYPOINT/CMD when the chart sets none), its
environment with ``envFrom``, ``fieldRef`` (the pod name), ``secretKeyRef`` and
``$(VAR)`` resolved, and every volume mount mapped to a local directory (Secret volumes
written out). Paths under a mount point are rewritten to the local directory on the way
in and back on the way out, so the effective configuration reads as it would in the pod.
``ourios config`` (the same loading as ``serve``) then says what the node runs with.

What is checked:

- ``helm lint --strict``; ``helm template`` for several value sets, every object strictly
  valid for the newest Kubernetes kubernetes-validate knows and for the chart's minimum
  (CRD kinds have no schema there: their metadata is validated as ObjectMeta, the
  ServiceMonitor against the Service it selects, the PrometheusRule with promtool);
- values.schema.json is generated from app/base/config.py and up to date, carries the app's
  ranges, refuses out-of-range values at ``helm template``, and values.yaml holds the
  app's defaults; the rules between settings refuse in the chart exactly when the app
  refuses;
- for every setting the chart exposes, setting the value changes what ``ourios config``
  reports, and nothing else;
- the pod contract: node id from the pod name, probes, termination grace, security
  context, volumes, Secrets for S3 keys and tokens;
- a node started from the default values plus ``store.url`` and credentials serves and
  publishes to a real S3 server (SeaweedFS).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import (  # type: ignore[import-untyped]
    SchemaNotFoundError,
    latest_version,
)

from app.base.config import SETTINGS, Setting, ValueKind
from scripts import gen_chart_schema
from tests.support.otel import sample_request
from tests.support.seaweed import S3Bucket, SeaweedS3
from tests.support.serve import ServeProcess
from tests.support.tlscerts import Authority
from tests.support.tools import require_tool

from .test_dockerfile import DATA_DIR, dockerfile, pyproject

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ourios"
RELEASE = "logs"
NAMESPACE = "observability"
FULLNAME = "logs-ourios"
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
#: Kinds whose schema is a CRD's, not Kubernetes'.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

Obj = dict[str, Any]
Values = Mapping[str, Any]


# --- rendering ---------------------------------------------------------------------------


class RenderError(Exception):
    """``helm template`` refused the values; the message is helm's stderr."""


@dataclass(frozen=True)
class Rendered:
    objects: tuple[Obj, ...]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> Obj | None:
        return next((o for o in self.of_kind(kind) if o["metadata"]["name"] == name), None)

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    @property
    def statefulset(self) -> Obj:
        return self.one("StatefulSet")

    @property
    def pod_spec(self) -> Obj:
        spec: Obj = self.statefulset["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> Obj:
        containers: list[Obj] = self.pod_spec["containers"]
        (container,) = [c for c in containers if c["name"] == "ourios"]
        return container

    @property
    def settings(self) -> dict[str, str]:
        data: dict[str, str] = self.one("ConfigMap", f"{FULLNAME}-settings")["data"]
        return data


def helm() -> str:
    return require_tool("helm")


def helm_lint(values: Values) -> None:
    """Assert ``helm lint --strict`` passes the chart with ``values``, naming what it said."""
    proc = subprocess.run(
        [helm(), "lint", "--strict", str(CHART), "-f", "-"],
        input=yaml.safe_dump(dict(values)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _freeze(values: Values | None) -> str:
    return json.dumps(values or {}, sort_keys=True)


@functools.cache
def _render(frozen: str) -> Rendered | RenderError:
    proc = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(json.loads(frozen)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        return RenderError(proc.stderr.strip())
    return Rendered(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))


def render(values: Values | None = None) -> Rendered:
    result = _render(_freeze(values))
    if isinstance(result, RenderError):
        raise result
    return result


def render_error(values: Values) -> str:
    result = _render(_freeze(values))
    assert isinstance(result, RenderError), f"helm template accepted {values}"
    return str(result)


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"wal.barrierSecs": 30}`` → ``{"wal": {"barrierSecs": 30}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return values


def chart_meta() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    return meta


# --- the pod, emulated ---------------------------------------------------------------------


class PodEmulator:
    """Pod ``ordinal`` of the rendered StatefulSet, run locally under ``root``.

    ``secrets`` stands in for Secrets the release expects to exist (existingSecret):
    ``{name: {key: value}}``. Rendered Secrets are used as they are.
    """

    def __init__(
        self,
        rendered: Rendered,
        root: Path,
        *,
        ordinal: int = 0,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.rendered = rendered
        self.root = root
        sts = rendered.statefulset
        start = sts["spec"].get("ordinals", {}).get("start", 0)
        self.pod_name = f"{sts['metadata']['name']}-{start + ordinal}"
        self._secrets: dict[str, dict[str, str]] = {
            name: dict(data) for name, data in (secrets or {}).items()
        }
        for secret in rendered.of_kind("Secret"):
            decoded = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
            self._secrets[secret["metadata"]["name"]] = {**decoded, **secret.get("stringData", {})}
        self.mounts = self._mount_all()

    # The container, as the kubelet would start it.

    @property
    def argv(self) -> list[str]:
        image = dockerfile().final
        container = self.rendered.container
        command = container.get("command") or image.last("ENTRYPOINT").exec_form()
        args = container.get("args") or image.last("CMD").exec_form()
        return [*command, *args]

    def env(self) -> dict[str, str]:
        """The container's environment: the image's ENV, then envFrom, then env."""
        container = self.rendered.container
        env = {k: v for k, v in dockerfile().final.env().items() if k != "PATH"}
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                name = source["configMapRef"]["name"]
                data = self.rendered.one("ConfigMap", name)["data"]
            else:
                data = self._secret(source["secretRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        for entry in container.get("env", []):
            env[entry["name"]] = self._value(entry, env)
        return {k: self.localise(v) for k, v in env.items()}

    def _value(self, entry: Obj, env: Mapping[str, str]) -> str:
        if "value" in entry:
            return re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                str(entry["value"]),
            )
        source = entry["valueFrom"]
        if "fieldRef" in source:
            fields = {"metadata.name": self.pod_name, "metadata.namespace": NAMESPACE}
            return fields[source["fieldRef"]["fieldPath"]]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self._secret(ref["name"])[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value: str = self.rendered.one("ConfigMap", ref["name"])["data"][ref["key"]]
            return value
        raise AssertionError(f"cannot resolve env {entry}")

    def _secret(self, name: str) -> dict[str, str]:
        assert name in self._secrets, f"the pod needs Secret {name!r}, which nothing provides"
        return self._secrets[name]

    # Volumes.

    def _mount_all(self) -> dict[str, Path]:
        spec = self.rendered.pod_spec
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = self.rendered.statefulset["spec"].get("volumeClaimTemplates", [])
        claims = {t["metadata"]["name"] for t in templates}
        mounts: dict[str, Path] = {}
        for index, mount in enumerate(self.rendered.container.get("volumeMounts", [])):
            local = self.root / f"mount-{index}-{mount['name']}"
            local.mkdir(parents=True)
            name = mount["name"]
            if name in claims:
                pass  # the PersistentVolumeClaim: an empty directory
            elif "emptyDir" in volumes[name]:
                pass
            elif "secret" in volumes[name]:
                source = volumes[name]["secret"]
                data = self._secret(source["secretName"])
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (local / item["path"]).write_text(data[item["key"]], encoding="utf-8")
            else:
                raise AssertionError(f"volume {name} has a source the emulator cannot provide")
            mounts[mount["mountPath"]] = local
        return mounts

    def localise(self, value: str) -> str:
        for pod_path, local in self.mounts.items():
            if value == pod_path or value.startswith(pod_path + "/"):
                return str(local) + value[len(pod_path) :]
            if value.startswith(f"file://{pod_path}"):
                return f"file://{local}{value[len('file://') + len(pod_path) :]}"
        return value

    def podify(self, value: object) -> object:
        """The inverse of ``localise``, for values read back from the app."""
        if not isinstance(value, str):
            return value
        for pod_path, local in self.mounts.items():
            value = value.replace(str(local), pod_path)
        return value

    # Running it.

    def ourios_config(self) -> dict[str, object]:
        """``ourios config`` with this pod's command line and environment."""
        argv = self.argv
        assert argv[:2] == ["ourios", "serve"], argv
        proc = self._run(["config", *argv[2:]])
        assert proc.returncode == 0, f"ourios config refused the pod's settings:\n{proc.stderr}"
        effective: dict[str, object] = json.loads(proc.stdout)
        return {k: self.podify(v) for k, v in effective.items()}

    def ourios_config_refusal(self, overrides: Mapping[str, str]) -> str:
        """``ourios config`` with the pod's environment plus ``overrides``; must exit 2."""
        proc = self._run(["config"], overrides)
        assert proc.returncode == 2, f"the app accepted {overrides}: {proc.stdout}"
        return proc.stderr

    def _run(
        self, args: list[str], overrides: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        exe = shutil.which("ourios", path=str(Path(sys.executable).parent))
        assert exe, "the ourios console script is not installed in this environment"
        env = {"PATH": os.defpath, **self.env(), **(overrides or {})}
        # The console script imports this tree, not whichever checkout the venv was
        # installed from (an editable install is one path; worktrees share the venv).
        env["PYTHONPATH"] = str(ROOT)
        return subprocess.run(
            [exe, *args], env=env, capture_output=True, text=True, timeout=60, cwd=self.root
        )


# --- value sets --------------------------------------------------------------------------

S3_URL = "s3://ourios-logs/cluster-a"
TOKENS = {"tok-team-a-0123456789": ["team-a"], "tok-collector-9876543210": ["team-a", "team-b"]}
EXISTING_SECRETS = {
    "s3-creds": {"access-key": "AKIAEXAMPLE", "secret-key": "wJalrXUtnFEMIEXAMPLE"},
    "ourios-tokens": {"tokens": yaml.safe_dump(TOKENS)},
}

VALUE_SETS: dict[str, Values] = {
    "defaults": {},
    "persistence_off": {"persistence": {"enabled": False, "emptyDirSizeLimit": "8Gi"}},
    "service_monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
    "auth_tokens": {"auth": {"tokens": TOKENS}},
    "auth_existing_secret": {
        "auth": {"existingSecret": "ourios-tokens", "existingSecretKey": "tokens"}
    },
    "s3_existing_secret": {
        "store": {
            "url": S3_URL,
            "region": "eu-west-1",
            "existingSecret": "s3-creds",
            "existingSecretKeys": {"accessKeyId": "access-key", "secretAccessKey": "secret-key"},
        }
    },
    "s3_inline_credentials": {
        "store": {
            "url": S3_URL,
            "endpointUrl": "https://minio.example:9000",
            "accessKeyId": "AKIAEXAMPLE",
            "secretAccessKey": "wJalrXUtnFEMIEXAMPLE",
        }
    },
    "tls": {"tls": {"existingSecret": "ourios-tls"}},
    "tls_client_ca_metrics_port": {
        "tls": {"existingSecret": "ourios-tls", "clientCaSecret": "ourios-tls"},
        "server": {"metricsPort": 9464},
        "serviceMonitor": {"enabled": True},
    },
    "three_replicas": {
        "replicaCount": 3,
        "ordinalsStart": 4,
        "persistence": {"storageClassName": "fast", "retentionPolicy": {"whenScaled": "Delete"}},
        "shutdown": {"preStopSleepSecs": 0},
        "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]},
        "image": {"digest": "sha256:" + "ab" * 32},
    },
}


def _files_missing() -> list[str]:
    return [str(p.relative_to(CHART)) for p in (ALERTS, DASHBOARD) if not p.exists()]


def _monitoring_values() -> Values:
    return {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Logging"}},
    }


def require_monitoring_files() -> None:
    missing = _files_missing()
    if missing:
        pytest.skip(f"{', '.join(missing)} not written yet (another engineer's files)")


# --- lint, schema, defaults ----------------------------------------------------------------


def test_helm_lint_strict() -> None:
    sets = [{}, VALUE_SETS["s3_inline_credentials"], VALUE_SETS["auth_tokens"]]
    if not _files_missing():
        sets.append(_monitoring_values())
    for values in sets:
        helm_lint(values)


def test_chart_metadata() -> None:
    meta = chart_meta()
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "ourios"
    assert meta["appVersion"] == pyproject()["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    image = render().container["image"]
    assert image.endswith(f":{meta['appVersion']}")


def test_values_schema_is_generated_and_up_to_date() -> None:
    assert gen_chart_schema.main(["--check"]) == 0, "run scripts/gen_chart_schema.py"


def test_every_setting_is_a_chart_value_or_chart_managed() -> None:
    mapped = {row.yaml_key for row in gen_chart_schema.value_rows()}
    managed = set(gen_chart_schema.CHART_MANAGED)
    assert mapped.isdisjoint(managed)
    assert mapped | managed == {row.yaml_key for row in SETTINGS}


def test_values_yaml_holds_the_app_defaults() -> None:
    values = chart_values()
    for row in gen_chart_schema.value_rows():
        section = values[row.section]
        key = gen_chart_schema.camel(row.name)
        assert key in section, f"values.yaml has no {row.section}.{key} ({row.env_var})"
        expected = row.default
        if expected is None:  # unset: null for a derived number, "" for a string
            expected = None if row.kind is ValueKind.INT else ""
        assert section[key] == expected, f"{row.section}.{key}: values.yaml differs from the app"
        assert type(section[key]) is type(expected), f"{row.section}.{key}"


def test_the_schema_carries_the_app_ranges_and_choices() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    for row in gen_chart_schema.value_rows():
        prop = schema["properties"][row.section]["properties"][gen_chart_schema.camel(row.name)]
        narrowed = gen_chart_schema.NARROWED.get(row.yaml_key, {})
        if row.kind is ValueKind.INT:
            assert prop["type"] == ("integer" if row.default is not None else ["integer", "null"])
            assert prop.get("minimum") == narrowed.get("minimum", row.minimum), row.yaml_key
            assert prop.get("maximum") == narrowed.get("maximum", row.maximum), row.yaml_key
        elif row.kind is ValueKind.CHOICE:
            assert prop["enum"] == list(row.choices)
        elif row.kind is ValueKind.BOOL:
            assert prop["type"] == "boolean"
        assert row.env_var in prop["description"]


def _out_of_range(row: Setting, side: str) -> int:
    if side == "below":
        return _bound(row, "minimum") - 1
    high = _bound(row, "maximum")
    # Helm holds numbers as float64: from 2^53 on, max + 1 rounds back to max.
    return high + 1 if high < gen_chart_schema.FLOAT64_EXACT else high * 2


@pytest.mark.parametrize("side", ["below", "above"])
def test_helm_template_refuses_values_outside_the_schema_range(side: str) -> None:
    rows = [
        row
        for row in gen_chart_schema.value_rows()
        if row.kind is ValueKind.INT
        and (row.minimum if side == "below" else row.maximum) is not None
    ]
    values = nest({gen_chart_schema.value_key(r): _out_of_range(r, side) for r in rows})
    error = render_error(values)
    assert "schema" in error
    for row in rows:
        path = "/" + gen_chart_schema.value_key(row).replace(".", "/")
        assert f"'{path}'" in error, f"{path} = {_out_of_range(row, side)} was not refused"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("wal.segmentMaxBytes", "64Mi", id="bytes_as_string"),
        pytest.param("wal.archive", "yes", id="bool_as_string"),
        pytest.param("sink.parquetCompression", "lz4", id="unknown_codec"),
        pytest.param("server.logLevel", "trace", id="unknown_level"),
        pytest.param("store.url", "gs://bucket", id="unknown_store_scheme"),
        pytest.param("store.url", "s3://Bad_Bucket", id="bad_bucket"),
        pytest.param("wal.barrierSec", 30, id="typo_key"),
        pytest.param("server.dataDir", "/data", id="chart_managed_key"),
        pytest.param("extraEnv", [{"name": "OURIOS_WAL_BARRIER_SECS", "value": "1"}], id="env"),
        pytest.param("server.httpPort", 0, id="port_zero_cannot_be_probed"),
        pytest.param("auth.tokens", {"tok": ["a/b"]}, id="bad_tenant"),
    ],
)
def test_helm_template_refuses_what_the_schema_refuses(key: str, value: object) -> None:
    assert "schema" in render_error(nest({key: value}))


def test_a_null_value_leaves_the_setting_to_the_app_default(tmp_path: Path) -> None:
    rendered = render(nest({"wal.barrierSecs": None, "sink.flushAgeSecs": None}))
    assert "OURIOS_WAL_BARRIER_SECS" not in rendered.settings
    effective = PodEmulator(rendered, tmp_path).ourios_config()
    assert effective["OURIOS_WAL_BARRIER_SECS"] == 300
    assert effective["OURIOS_SINK_FLUSH_AGE_SECS"] == 300


# --- every rendered object validates --------------------------------------------------------


def _min_kube_version() -> str:
    m = re.search(r"(\d+)\.(\d+)", chart_meta()["kubeVersion"])
    assert m
    return f"{m.group(1)}.{m.group(2)}.0"


KUBE_VERSIONS = (latest_version() + ".0", _min_kube_version())


def _validate_objects(rendered: Rendered) -> list[str]:
    """Strictly validate every object; returns the reasons for what was not validated."""
    skipped = []
    for obj in rendered.objects:
        for version in KUBE_VERSIONS:
            name = f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {version})"
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                assert obj["kind"] in CRD_KINDS, f"{name}: no schema for this kind"
                # What can be validated: the metadata, as a core object's ObjectMeta.
                meta_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
                kubernetes_validate.validate(meta_only, version, strict=True)
                skipped.append(f"{obj['kind']}: a CRD, no schema in kubernetes-validate")
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name}: {exc.message} at {list(exc.path)}") from exc
    return sorted(set(skipped))


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_objects_validate(name: str) -> None:
    rendered = render(VALUE_SETS[name])
    kinds = {o["kind"] for o in rendered.objects}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    for reason in _validate_objects(rendered):
        print(f"{name}: not schema-validated: {reason}; metadata validated instead")


def test_rendered_monitoring_objects_validate() -> None:
    require_monitoring_files()
    rendered = render(_monitoring_values())
    assert {"ServiceMonitor", "PrometheusRule"} <= {o["kind"] for o in rendered.objects}
    for reason in _validate_objects(rendered):
        print(f"monitoring: not schema-validated: {reason}; metadata validated instead")


def test_monitoring_toggles_name_a_missing_file(tmp_path: Path) -> None:
    # A copy of the chart without files/: the toggles must fail naming the file.
    chart = tmp_path / "ourios"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("files"))
    for values, file in (
        ({"prometheusRule": {"enabled": True}}, "files/alerts.yaml"),
        ({"dashboard": {"enabled": True}}, "files/dashboard.json"),
    ):
        proc = subprocess.run(
            [helm(), "template", RELEASE, str(chart), "-f", "-"],
            input=yaml.safe_dump(values),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and file in proc.stderr, proc.stderr


def test_runbook_urls_get_the_base_url() -> None:
    require_monitoring_files()
    base = "https://git.example.com/ourios/ourios-py/blob/v0.1.0"
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/"}}
    rule = render(values).one("PrometheusRule")
    urls = [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "runbook_url" in r.get("annotations", {})
    ]
    assert urls and all(u.startswith(base + "/docs/") for u in urls), urls


def test_clone_7_runbook_urls_are_absolute_by_default() -> None:
    """By default every alert links to its RUNBOOK section in the chart's repository
    (Chart.yaml ``sources``); an empty base leaves them relative."""
    require_monitoring_files()
    source = yaml.safe_load((CHART / "Chart.yaml").read_text())["sources"][0]

    def urls(values: dict[str, object]) -> list[str]:
        rule = render(values).one("PrometheusRule")
        return [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]

    absolute = urls({"prometheusRule": {"enabled": True}})
    assert absolute and all(u.startswith(f"{source}/blob/main/docs/RUNBOOK.md#") for u in absolute)
    relative = urls({"prometheusRule": {"enabled": True, "runbookBaseUrl": ""}})
    assert all(u.startswith("docs/RUNBOOK.md#") for u in relative), relative


def test_clone_7_service_monitor_names_the_job_ourios() -> None:
    """The target-down alerts select up{job="ourios"}: the ServiceMonitor takes the job
    from the Service's app.kubernetes.io/name, which is "ourios" for any release name."""
    rendered = render(VALUE_SETS["service_monitor"])
    monitor = rendered.one("ServiceMonitor")
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (service,) = [
        s
        for s in rendered.of_kind("Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "ourios"


def test_service_monitor_selects_the_headless_service_once() -> None:
    rendered = render(VALUE_SETS["service_monitor"])
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        s
        for s in rendered.of_kind("Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == [f"{FULLNAME}-headless"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    require_monitoring_files()
    promtool = require_tool("promtool")
    rule = render(_monitoring_values()).one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    proc = subprocess.run(
        [promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Unchanged from the file the rules engineer wrote, but for the runbook base.
    relative = render(
        {**_monitoring_values(), "prometheusRule": {"enabled": True, "runbookBaseUrl": ""}}
    ).one("PrometheusRule")
    assert (
        relative["spec"]["groups"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    )


def test_dashboard_config_map_for_the_grafana_sidecar() -> None:
    require_monitoring_files()
    dashboard = render(_monitoring_values()).one("ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Logging"}
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text(encoding="utf-8"))


# --- the pod contract ---------------------------------------------------------------------


def test_every_ourios_variable_the_pod_gets_is_a_setting() -> None:
    known = {row.env_var for row in SETTINGS}
    for name, values in VALUE_SETS.items():
        rendered = render(values)
        names = set(rendered.settings) | {e["name"] for e in rendered.container.get("env", [])}
        unknown = {n for n in names if n.startswith("OURIOS_")} - known
        assert not unknown, f"{name}: the app would refuse {sorted(unknown)}"
        assert rendered.pod_spec["enableServiceLinks"] is False


def test_node_id_is_the_pod_name(tmp_path: Path) -> None:
    rendered = render(VALUE_SETS["three_replicas"])
    assert rendered.statefulset["spec"]["ordinals"] == {"start": 4}
    (node_id,) = [e for e in rendered.container["env"] if e["name"] == "OURIOS_SERVER_NODE_ID"]
    assert node_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    for ordinal in (0, 2):
        pod = PodEmulator(rendered, tmp_path / str(ordinal), ordinal=ordinal)
        effective = pod.ourios_config()
        assert effective["OURIOS_SERVER_NODE_ID"] == f"{FULLNAME}-{4 + ordinal}"
        assert effective["OURIOS_SERVER_NODE_ORDINAL"] == 4 + ordinal


def test_the_default_node_runs_in_the_data_volume(tmp_path: Path) -> None:
    rendered = render()
    pod = PodEmulator(rendered, tmp_path)
    effective = pod.ourios_config()
    assert effective["OURIOS_SERVER_DATA_DIR"] == DATA_DIR
    assert effective["OURIOS_STORE_URL"] == f"file://{DATA_DIR}/objects"
    assert effective["OURIOS_AUTH_TOKENS_FILE"] is None
    (claim,) = rendered.statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in rendered.container["volumeMounts"]}
    assert (
        mounts[claim["metadata"]["name"]]
        == DATA_DIR
        == dockerfile().final.env()["OURIOS_SERVER_DATA_DIR"]
    )
    assert mounts["tmp"] == "/tmp"
    # Immutable in a StatefulSet: nothing that changes with the chart version.
    assert "helm.sh/chart" not in claim["metadata"].get("labels", {})
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_persistence_off_uses_an_empty_dir() -> None:
    rendered = render(VALUE_SETS["persistence_off"])
    assert "volumeClaimTemplates" not in rendered.statefulset["spec"]
    volumes = {v["name"]: v for v in rendered.pod_spec["volumes"]}
    assert volumes["data"]["emptyDir"] == {"sizeLimit": "8Gi"}


def test_security_context() -> None:
    rendered = render()
    pod = rendered.pod_spec["securityContext"]
    image_user = dockerfile().final.last("USER").args
    assert f"{pod['runAsUser']}:{pod['runAsGroup']}" == image_user
    assert pod["runAsNonRoot"] is True
    assert pod["fsGroup"] == pod["runAsGroup"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = rendered.container["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert rendered.pod_spec["automountServiceAccountToken"] is False
    assert "memory" in rendered.container["resources"]["limits"]


def test_probes_follow_design_13() -> None:
    rendered = render(nest({"server.httpPort": 8080, "server.grpcPort": 9090}))
    container = rendered.container
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "grpc": 9090}
    startup, ready, live = (
        container["startupProbe"],
        container["readinessProbe"],
        container["livenessProbe"],
    )
    assert startup["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    assert ready["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTP"}
    assert live["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    # The listeners open after recovery: the startup probe covers a 30-minute replay.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    # A busy node is not restarted (and made to replay) for a minute's slow answers.
    assert live["periodSeconds"] * live["failureThreshold"] >= 60
    services = {s["metadata"]["name"]: s for s in rendered.of_kind("Service")}
    headless = services[f"{FULLNAME}-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert rendered.statefulset["spec"]["serviceName"] == f"{FULLNAME}-headless"
    client = services[FULLNAME]["spec"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in client["ports"]} == {
        ("grpc", 4317, "grpc"),
        ("http", 4318, "http"),
    }


@pytest.mark.parametrize(
    ("values", "grace"),
    [
        pytest.param({}, 5 + 25 + 30, id="defaults"),
        pytest.param(nest({"server.shutdownGraceSecs": 100}), 5 + 100 + 30, id="longer_drain"),
        pytest.param(nest({"shutdown.finalCutSecs": 120}), 5 + 25 + 120, id="longer_cut"),
        pytest.param({"terminationGracePeriodSeconds": 31}, 31, id="explicit"),
    ],
)
def test_termination_grace_covers_the_drain_and_the_final_cut(values: Values, grace: int) -> None:
    rendered = render(values)
    assert rendered.pod_spec["terminationGracePeriodSeconds"] == grace
    drain = int(rendered.settings["OURIOS_SERVER_SHUTDOWN_GRACE_SECS"])
    pre_stop = rendered.container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert grace > int(pre_stop[1]) + drain
    # The node's own bound (SIGTERM to exit: the drain, then the final cut) is what the
    # derived grace covers after the preStop sleep (DESIGN.md §6).
    # An explicit grace shorter than that gives the node a shorter final cut instead.
    final_cut = int(rendered.settings["OURIOS_SERVER_FINAL_CUT_SECS"])
    assert grace >= int(pre_stop[1]) + drain + final_cut
    assert final_cut == min(
        int(str(nest_get(values, "shutdown.finalCutSecs", 30))), grace - int(pre_stop[1]) - drain
    )


def nest_get(values: Values, dotted: str, default: object) -> object:
    """The value at ``a.b`` in nested ``values``, else ``default``."""
    here: object = values
    for part in dotted.split("."):
        if not isinstance(here, dict) or part not in here:
            return default
        here = here[part]
    return here


def test_termination_grace_too_short_for_the_drain_is_refused() -> None:
    assert "terminationGracePeriodSeconds" in render_error({"terminationGracePeriodSeconds": 30})


def test_pod_disruption_budget_and_spread() -> None:
    rendered = render()
    pdb = rendered.one("PodDisruptionBudget")["spec"]
    labels = rendered.statefulset["spec"]["template"]["metadata"]["labels"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    constraints = rendered.pod_spec["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    for c in constraints:
        assert c["labelSelector"]["matchLabels"].items() <= labels.items()


def _env_entry(rendered: Rendered, name: str) -> Obj:
    env: list[Obj] = rendered.container["env"]
    (entry,) = [e for e in env if e["name"] == name]
    return entry


def test_s3_credentials_from_an_existing_secret(tmp_path: Path) -> None:
    rendered = render(VALUE_SETS["s3_existing_secret"])
    assert not rendered.of_kind("Secret"), "the chart must not create a Secret here"
    key = _env_entry(rendered, "AWS_ACCESS_KEY_ID")["valueFrom"]["secretKeyRef"]
    assert key == {"name": "s3-creds", "key": "access-key"}
    pod = PodEmulator(rendered, tmp_path, secrets=EXISTING_SECRETS)
    env = pod.env()
    assert env["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"
    assert env["AWS_SECRET_ACCESS_KEY"] == "wJalrXUtnFEMIEXAMPLE"
    assert env["AWS_REGION"] == "eu-west-1"
    effective = pod.ourios_config()
    assert effective["OURIOS_STORE_URL"] == S3_URL
    assert effective["OURIOS_STORE_REGION"] == "eu-west-1"


def test_s3_credentials_given_as_values(tmp_path: Path) -> None:
    rendered = render(VALUE_SETS["s3_inline_credentials"])
    secret = rendered.one("Secret", f"{FULLNAME}-store")
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    env = PodEmulator(rendered, tmp_path).env()
    assert env["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"
    # No key appears in the ConfigMap or as a literal in the pod spec.
    assert "AKIAEXAMPLE" not in json.dumps(rendered.settings)
    assert "AKIAEXAMPLE" not in json.dumps(rendered.statefulset)


@pytest.mark.parametrize("name", ["auth_tokens", "auth_existing_secret"])
def test_auth_tokens_are_a_mounted_file(name: str, tmp_path: Path) -> None:
    rendered = render(VALUE_SETS[name])
    assert (
        _env_entry(rendered, "OURIOS_AUTH_TOKENS_FILE")["value"] == "/etc/ourios/auth/tokens.yaml"
    )
    mount = next(m for m in rendered.container["volumeMounts"] if m["name"] == "auth")
    assert mount["readOnly"] is True
    pod = PodEmulator(rendered, tmp_path, secrets=EXISTING_SECRETS)
    # `ourios config` loads and checks the tokens file, so a bad Secret would fail here.
    effective = pod.ourios_config()
    assert effective["OURIOS_AUTH_TOKENS_FILE"] == "/etc/ourios/auth/tokens.yaml"
    assert yaml.safe_load(Path(pod.env()["OURIOS_AUTH_TOKENS_FILE"]).read_text()) == TOKENS


def test_settings_changes_roll_the_pods() -> None:
    base = render().statefulset["spec"]["template"]["metadata"]["annotations"]
    changed = render(nest({"wal.barrierSecs": 30})).statefulset["spec"]["template"]
    assert changed["metadata"]["annotations"]["checksum/settings"] != base["checksum/settings"]
    tokens = render(VALUE_SETS["auth_tokens"]).statefulset["spec"]["template"]
    assert tokens["metadata"]["annotations"]["checksum/secrets"] != base["checksum/secrets"]


# --- chart ↔ app: every setting reaches the app ----------------------------------------------

#: For each chart value, a value other than the default (and other values it needs).
CHANGES: dict[str, tuple[object, dict[str, object]]] = {
    "server.host": ("::", {}),
    "server.httpPort": (8080, {}),
    "server.grpcPort": (9090, {}),
    "server.metricsPort": (9091, {}),
    "server.logLevel": ("debug", {}),
    "server.logFormat": ("console", {}),
    "server.shutdownGraceSecs": (40, {}),
    "server.workers": (3, {}),
    "server.encodeConcurrency": (3, {}),
    "server.encodeDutyPercent": (80, {}),
    "server.decoder": ("upb", {}),
    "server.threadRestarts": (2, {}),
    "server.maxRequestRecords": (1000, {}),
    "server.maxAttributesPerRecord": (64, {}),
    "server.maxAttributesPerRequest": (5000, {}),
    "server.maxAttributeKeyBytes": (1024, {}),
    "server.maxAttributeValueBytes": (65536, {}),
    "server.maxExpandedBytes": (16777216, {}),
    "server.maxInflightRequests": (32, {}),
    "server.maxInflightBytes": (128 * 2**20, {}),
    "server.maxConcurrentDecodes": (4, {}),
    "server.bodyReadTimeoutSecs": (9, {}),
    "server.openNewTenantsPerMinute": (7, {}),
    "server.grpcMaxConcurrentRpcs": (48, {}),
    "wal.segmentMaxBytes": (32 * 2**20, {}),
    "wal.segmentAgeSecs": (120, {}),
    "wal.barrierSecs": (30, {}),
    "wal.housekeepingSecs": (15, {}),
    "wal.maxUnlinksPerPass": (64, {}),
    "wal.rotationRetryAttempts": (5, {}),
    "wal.maxTenants": (4096, {}),
    "wal.maxFrameBytes": (4 * 2**20, {}),
    "wal.unreclaimedBytesLimit": (10 * 2**30, {}),
    "wal.highWaterBytes": (4 * 2**20, {}),
    "wal.archive": (True, {}),
    "wal.frameMiningAttempts": (5, {}),
    "wal.frameDecodeAttempts": (5, {}),
    "wal.turnBacklogBytes": (128 * 2**20, {}),
    "sink.flushBytes": (8 * 2**20, {}),
    "sink.flushAgeSecs": (60, {}),
    "sink.ceilingBytes": (512 * 2**20, {}),
    "sink.maxObjectBytes": (2**30, {}),
    "sink.deadLetterAttempts": (3, {}),
    "sink.publisherQueueDepth": (16, {}),
    "sink.parquetCompression": ("snappy", {}),
    "store.url": (S3_URL, {}),
    "store.endpointUrl": ("https://minio.example:9000", {"store.url": S3_URL}),
    "store.region": ("eu-west-1", {"store.url": S3_URL}),
    "store.probeSecs": (30, {}),
    "disk.lowWaterBytes": (2 * 2**30, {}),
    "disk.stopWaterBytes": (512 * 2**20, {}),
    "disk.reserveBytes": (32 * 2**20, {}),
    "miner.maxTemplates": (1000, {}),
    "miner.maxLeafTemplates": (64, {}),
    "miner.minedBodyChars": (512, {}),
    "miner.minedBodyTokens": (32, {}),
    "miner.tenantTurnPercent": (20, {}),
    "miner.tenantTurnBurstSecs": (10, {}),
    "miner.tenantBacklogBytes": (8 * 2**20, {}),
}
_ROWS = {gen_chart_schema.value_key(row): row for row in gen_chart_schema.value_rows()}


def test_the_change_table_covers_every_chart_value() -> None:
    assert set(CHANGES) == set(_ROWS)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The effective configuration of a pod rendered from the default values."""
    return PodEmulator(render(), tmp_path_factory.mktemp("baseline")).ourios_config()


@pytest.mark.parametrize("key", list(CHANGES))
def test_a_chart_value_changes_what_the_app_runs_with(
    key: str, baseline: dict[str, object], tmp_path: Path
) -> None:
    row = _ROWS[key]
    value, companions = CHANGES[key]
    assert value != row.default
    effective = PodEmulator(render(nest({key: value, **companions})), tmp_path).ourios_config()
    assert effective[row.env_var] == value
    touched = {row.env_var} | {_ROWS[k].env_var for k in companions}
    others = {k: v for k, v in effective.items() if k not in touched}
    assert others == {k: v for k, v in baseline.items() if k not in touched}


#: The sections whose every tunable the running node must be shown to use.
TUNED_SECTIONS = ("wal", "sink", "disk", "miner")


@pytest.mark.slow
def test_every_wal_sink_and_disk_value_reaches_the_running_node(tmp_path: Path) -> None:
    """All WAL, sink and disk values changed at once; the pod's command and environment
    start a real ``ourios serve``, whose start-up line (``config.effective``) and
    ``/metrics`` must show every changed value."""
    keys = [k for k in CHANGES if k.split(".")[0] in TUNED_SECTIONS]
    expected_rows = [r for r in gen_chart_schema.value_rows() if r.section in TUNED_SECTIONS]
    assert len(keys) == len(expected_rows) >= 17
    flat = {k: CHANGES[k][0] for k in keys}
    pod = PodEmulator(render(nest(flat)), tmp_path)
    assert pod.argv == ["ourios", "serve"], "ServeProcess runs the same entry point"
    env = pod.env()
    # The only substitutions: loopback and free ports, since this machine is shared.
    env.update(
        {"OURIOS_SERVER_HOST": "127.0.0.1", "OURIOS_SERVER_HTTP_PORT": "0"}
        | {"OURIOS_SERVER_GRPC_PORT": "0"}
    )
    node = ServeProcess(Path(env["OURIOS_SERVER_DATA_DIR"]), env)
    with node:
        (line,) = node.event("config.effective")
        effective = {k: pod.podify(v) for k, v in line["config"].items()}
        status, metrics = node.get("/metrics")
        assert node.terminate() == 0
    for key, value in flat.items():
        row = _ROWS[key]
        assert value != row.default, key
        assert effective[row.env_var] == value, (
            f"{key}: the node runs with {effective[row.env_var]}"
        )
    assert status == 200
    max_tenants = cast(int, flat["wal.maxTenants"])  # CHANGES holds it as an int
    assert f"ourios_wal_tenants_limit {float(max_tenants)}" in metrics.decode()


def test_the_app_accepts_the_schema_minima_and_maxima(tmp_path: Path) -> None:
    """The schema's bounds are the app's: at each bound the app starts (the refusal one
    step beyond is test_helm_template_refuses_values_outside_the_schema_range)."""
    ints = [r for r in gen_chart_schema.value_rows() if r.kind is ValueKind.INT]
    lows = {gen_chart_schema.value_key(r): _bound(r, "minimum") for r in ints}
    lows["server.grpcPort"] = lows["server.httpPort"] + 1  # the ports must differ
    highs = {gen_chart_schema.value_key(r): _bound(r, "maximum") for r in ints}
    highs["server.grpcPort"] = highs["server.httpPort"] - 1
    highs["server.metricsPort"] = highs["server.httpPort"] - 2  # differs from both
    highs["disk.stopWaterBytes"] = highs["disk.lowWaterBytes"] // 2  # must be below it
    # RECLAIM must stay under 1 GiB: maxTenants and maxUnlinksPerPass take turns at max.
    high_tenants = {**highs, "wal.maxUnlinksPerPass": 128, "wal.rotationRetryAttempts": 128}
    high_unlinks = {**highs, "wal.maxTenants": 64}
    for index, flat in enumerate((lows, high_tenants, high_unlinks)):
        pod = PodEmulator(render(nest(flat)), tmp_path / str(index))
        effective = pod.ourios_config()
        for key, value in flat.items():
            assert effective[_ROWS[key].env_var] == value, key


def _bound(row: Setting, which: str) -> int:
    narrowed = gen_chart_schema.NARROWED.get(row.yaml_key, {})
    value = narrowed.get(which, getattr(row, which))
    assert isinstance(value, int)
    return value


# --- chart ↔ app: the rules between settings -------------------------------------------------

#: (values that break a rule, the words helm's message must carry).
CROSS_RULES = [
    pytest.param(
        {"disk.stopWaterBytes": 2**30, "disk.lowWaterBytes": 2**30},
        "disk.stopWaterBytes",
        id="stop_water_not_below_low_water",
    ),
    pytest.param(
        {"sink.flushBytes": 2**28 + 1, "sink.ceilingBytes": 2**28},
        "sink.flushBytes",
        id="flush_above_ceiling",
    ),
    pytest.param(
        {"server.httpPort": 4317, "server.grpcPort": 4317}, "must differ", id="same_ports"
    ),
    pytest.param(
        {"store.endpointUrl": "https://minio.example:9000"},
        "store.endpointUrl",
        id="endpoint_without_s3",
    ),
    pytest.param({"store.region": "eu-west-1"}, "store.region", id="region_without_s3"),
    pytest.param(
        {"server.maxInflightBytes": 16 * 2**20, "wal.maxFrameBytes": 8 * 2**20},
        "server.maxInflightBytes",
        id="inflight_below_three_frames",
    ),
    pytest.param(
        {"server.maxExpandedBytes": 8 * 2**20 - 1, "wal.maxFrameBytes": 8 * 2**20},
        "server.maxExpandedBytes",
        id="expanded_below_a_frame",
    ),
    pytest.param(
        {"wal.maxUnlinksPerPass": 4, "wal.rotationRetryAttempts": 5},
        "wal.maxUnlinksPerPass",
        id="unlinks_below_rotation_attempts",
    ),
    pytest.param(
        # The first size over 1 GiB: 65536 tenants x 251 unlinks (250 is the edge below).
        {"wal.maxTenants": 65536, "wal.maxUnlinksPerPass": 251},
        "RECLAIM",
        id="reclaim_over_1_gib",
    ),
]


@pytest.mark.parametrize(("flat", "words"), CROSS_RULES)
def test_a_rule_between_settings_refuses_in_the_chart_and_in_the_app(
    flat: dict[str, object], words: str, tmp_path: Path
) -> None:
    assert words in render_error(nest(flat))
    overrides = {_ROWS[k].env_var: _env_text(v) for k, v in flat.items()}
    message = PodEmulator(render(), tmp_path).ourios_config_refusal(overrides)
    assert any(_ROWS[k].env_var in message for k in flat), message


@pytest.mark.parametrize(
    "flat",
    [
        pytest.param({"disk.stopWaterBytes": 2**30 - 1, "disk.lowWaterBytes": 2**30}, id="stop"),
        pytest.param({"sink.flushBytes": 2**28, "sink.ceilingBytes": 2**28}, id="flush"),
        pytest.param({"server.maxExpandedBytes": 2**23, "wal.maxFrameBytes": 2**23}, id="expanded"),
        pytest.param({"wal.maxUnlinksPerPass": 5, "wal.rotationRetryAttempts": 5}, id="unlinks"),
        pytest.param({"wal.maxTenants": 65536, "wal.maxUnlinksPerPass": 250}, id="reclaim"),
    ],
)
def test_the_edge_of_a_rule_is_accepted_by_both(flat: dict[str, object], tmp_path: Path) -> None:
    effective = PodEmulator(render(nest(flat)), tmp_path).ourios_config()
    for key, value in flat.items():
        assert effective[_ROWS[key].env_var] == value


def test_store_url_outside_the_volumes_is_refused() -> None:
    assert "read-only" in render_error(nest({"store.url": "file:///srv/objects"}))
    render(nest({"store.url": f"file://{DATA_DIR}/published"}))


def test_credentials_need_an_s3_store_and_come_in_pairs() -> None:
    assert "s3://" in render_error(nest({"store.accessKeyId": "a", "store.secretAccessKey": "b"}))
    assert "together" in render_error(nest({"store.url": S3_URL, "store.accessKeyId": "a"}))
    both = {"store.url": S3_URL, "store.existingSecret": "x", "store.accessKeyId": "a"}
    assert "not both" in render_error(nest({**both, "store.secretAccessKey": "b"}))


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- a working node ----------------------------------------------------------------------


@pytest.fixture
def pod_on_seaweed(
    s3_bucket: S3Bucket, seaweed_s3: SeaweedS3, tmp_path: Path
) -> Iterator[tuple[PodEmulator, dict[str, str]]]:
    """Pod 0 of a release installed with only store.url, its endpoint and credentials."""
    values = {
        "store": {
            "url": s3_bucket.url("cluster-a"),
            "endpointUrl": seaweed_s3.endpoint_url,
            "region": seaweed_s3.region,
            "accessKeyId": seaweed_s3.access_key,
            "secretAccessKey": seaweed_s3.secret_key,
        }
    }
    pod = PodEmulator(render(values), tmp_path)
    env = pod.env()
    # The only substitutions: loopback and free ports, since this machine is shared.
    env.update(
        {"OURIOS_SERVER_HOST": "127.0.0.1", "OURIOS_SERVER_HTTP_PORT": "0"}
        | {"OURIOS_SERVER_GRPC_PORT": "0", "AWS_EC2_METADATA_DISABLED": "true"}
    )
    yield pod, env


def test_a_node_installed_with_store_url_and_credentials_works(
    pod_on_seaweed: tuple[PodEmulator, dict[str, str]], s3_bucket: S3Bucket
) -> None:
    pod, env = pod_on_seaweed
    data_dir = Path(env["OURIOS_SERVER_DATA_DIR"])
    node = ServeProcess(data_dir, env)
    with node:
        first = node.events[0]
        assert first["event"] == "config.effective"
        assert first["config"]["OURIOS_SERVER_NODE_ID"] == f"{FULLNAME}-0"
        assert first["config"]["OURIOS_STORE_URL"] == s3_bucket.url("cluster-a")
        body = sample_request("chart", 5, time_base_ns=time.time_ns()).SerializeToString()
        status, _, _ = node.post_logs(body, {"X-Ourios-Tenant": "team-a"})
        assert status == 200
        assert node.terminate() == 0
    keys = s3_bucket.keys("cluster-a/records/tenant=team-a/")
    assert keys, f"nothing published; node log:\n{node.tail()}"
    assert all(k.rsplit("/", 1)[1].startswith(f"{FULLNAME}-0-") for k in keys), keys
    assert (data_dir / "wal").is_dir(), "the WAL is not in the data volume"


# --- NOTES.txt -----------------------------------------------------------------------------


def notes(values: Values) -> str:
    """NOTES.txt as ``helm install`` prints it (a client-side dry run: no cluster)."""
    proc = subprocess.run(
        [helm(), "install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
        + ["-f", "-"],
        input=yaml.safe_dump(dict(values)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert proc.returncode == 0, proc.stderr
    assert "NOTES:" in proc.stdout, proc.stdout[-2000:]
    return proc.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize("name", ["defaults", "auth_tokens", "s3_existing_secret"])
def test_notes_say_how_to_send_logs_and_where_they_land(name: str) -> None:
    values = VALUE_SETS[name]
    text = notes(values)
    rendered = render(values)
    service = rendered.one("Service", FULLNAME)
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    host = f"{FULLNAME}.{NAMESPACE}.svc"
    assert f"http://{host}:{ports['http']}/v1/logs" in text
    assert f"{host}:{ports['grpc']}" in text
    assert "X-Ourios-Tenant" in text
    if "auth" in values:
        assert "Authentication is ON" in text and "Authorization: Bearer" in text
    else:
        assert "Authentication is OFF" in text
    url = values.get("store", {}).get("url") or f"{DATA_DIR}/objects"
    assert f"{url.rstrip('/')}/records/tenant=<tenant>/date=YYYY-MM-DD/" in text
    assert f"{url.rstrip('/')}/audit/tenant=<tenant>/date=YYYY-MM-DD/" in text


# --- TLS and the metrics port (issue 24 item 5) ------------------------------------------


def _probes(rendered: Rendered) -> list[Obj]:
    c = rendered.container
    return [c[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")]


def test_clone_5_tls_secret_is_mounted_and_the_pod_serves_it(tmp_path: Path) -> None:
    authority = Authority("chart-ca")
    pair = authority.issue("ourios")
    secret = {"tls.crt": pair.cert.decode(), "tls.key": pair.key.decode()}
    secret["ca.crt"] = authority.pem.decode()
    rendered = render(VALUE_SETS["tls_client_ca_metrics_port"])
    container = rendered.container
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    # A directory mount, never subPath: a renewed Secret reaches the running pod.
    assert "subPath" not in mounts["tls"] and "subPath" not in mounts["tls-client-ca"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 9464
    assert all(p["port"] == "metrics" and p["scheme"] == "HTTP" for p in _probes(rendered))
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("metrics", "http")
    headless = rendered.one("Service", f"{FULLNAME}-headless")["spec"]["ports"]
    assert ("metrics", 9464) in {(p["name"], p["port"]) for p in headless}
    pod = PodEmulator(rendered, tmp_path, secrets={"ourios-tls": secret})
    effective = pod.ourios_config()
    assert effective["OURIOS_SERVER_TLS_CERT_FILE"] == "/etc/ourios/tls/tls.crt"
    assert effective["OURIOS_SERVER_TLS_KEY_FILE"] == "/etc/ourios/tls/tls.key"
    assert effective["OURIOS_SERVER_TLS_CLIENT_CA_FILE"] == "/etc/ourios/tls-client-ca/ca.crt"
    assert effective["OURIOS_SERVER_METRICS_PORT"] == 9464


def test_clone_5_tls_without_a_metrics_port_probes_over_https() -> None:
    rendered = render(VALUE_SETS["tls"])
    assert all(p["port"] == "http" and p["scheme"] == "HTTPS" for p in _probes(rendered))
    assert "OURIOS_SERVER_TLS_CLIENT_CA_FILE" not in {e["name"] for e in rendered.container["env"]}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        pytest.param(
            {"tls": {"existingSecret": "t", "clientCaSecret": "c"}},
            "tls.clientCaSecret needs server.metricsPort",
            id="client_ca_without_metrics_port",
        ),
        pytest.param(
            {"tls": {"clientCaSecret": "c"}, "server": {"metricsPort": 9464}},
            "tls.clientCaSecret needs tls.existingSecret",
            id="client_ca_without_tls",
        ),
        pytest.param(
            {"tls": {"existingSecret": "t"}, "serviceMonitor": {"enabled": True}},
            "serviceMonitor with tls.existingSecret needs server.metricsPort",
            id="service_monitor_over_tls",
        ),
        pytest.param(
            {"server": {"metricsPort": 4318}}, "server.metricsPort", id="metrics_port_taken"
        ),
    ],
)
def test_clone_5_tls_values_the_pod_could_not_serve_are_refused(values: Values, words: str) -> None:
    assert words in render_error(values)
