#!/usr/bin/env python3
"""Render charts/ourios/values.schema.json from ``app.base.config.SETTINGS`` and the chart's
own keys.

    scripts/gen_chart_schema.py            rewrite charts/ourios/values.schema.json
    scripts/gen_chart_schema.py --check    exit 1 if the file differs from what this renders

The settings sections (``server``, ``wal``, ``sink``, ``store``, ``disk``) are derived
from the app's table, so the chart refuses exactly the ranges and choices ``ourios serve``
refuses (DESIGN.md §8): ``<section>.<name>`` becomes ``<section>.<camelCaseName>``, typed
and bounded as the table says, with the app's default as ``default``. A setting the
chart manages itself (``CHART_MANAGED``) has no value. The rules between settings cannot
be said in JSON Schema; ``templates/_validate.tpl`` checks them when rendering.

The rest of the schema (image, persistence, probes, ...) is declared here, closed
(``additionalProperties: false``) wherever the chart reads the keys itself, so a typo in
a values file is refused instead of silently ignored, as the app refuses unknown
``OURIOS_*`` variables. Output depends only on the table and this file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.base.config import SETTINGS, Setting, ValueKind  # noqa: E402 - needs the repository root

SCHEMA_PATH = ROOT / "charts" / "ourios" / "values.schema.json"

Schema = dict[str, Any]

#: Sections of the app whose settings are chart values.
VALUE_SECTIONS = ("server", "wal", "sink", "store", "disk", "miner")
#: Settings the chart sets itself, with where their value comes from.
CHART_MANAGED = {
    "server.data_dir": "the data volume's mount path, /var/lib/ourios",
    "server.node_id": "the pod name (downward API metadata.name)",
    "server.node_ordinal": "derived by the app from the pod name's trailing -<n>",
    "server.final_cut_secs": "shutdown.finalCutSecs (also in terminationGracePeriodSeconds)",
    "auth.tokens_file": "the mounted auth Secret (auth.existingSecret or auth.tokens)",
    "server.tls_cert_file": "the mounted TLS Secret (tls.existingSecret)",
    "server.tls_key_file": "the mounted TLS Secret (tls.existingSecret)",
    "server.tls_client_ca_file": "the mounted client CA Secret (tls.clientCaSecret)",
}
#: Settings the chart's templates read (ports, probes, the termination grace), so they may
#: not be removed with null.
REQUIRED = (
    "server.http_port",
    "server.grpc_port",
    "server.metrics_port",
    "server.shutdown_grace_secs",
)
#: Helm holds every number in values as a float64, exact only up to 2^53 (8 PiB); above
#: it a value is rounded and even the app's own maximum (2^62) fails Helm's comparison.
FLOAT64_EXACT = 2**53
#: Where the chart is narrower than the app: port 0 ("pick a free port") cannot be probed,
#: and byte sizes stop at FLOAT64_EXACT.
NARROWED: dict[str, Schema] = {
    "server.http_port": {"minimum": 1},
    "server.grpc_port": {"minimum": 1},
    **{
        row.yaml_key: {"maximum": FLOAT64_EXACT}
        for row in SETTINGS
        if row.kind is ValueKind.INT and row.maximum is not None and row.maximum > FLOAT64_EXACT
    },
}
#: String settings: the app checks them with code; these patterns are the same grammar
#: as far as a regular expression can say it (the app still has the last word).
STRING_PATTERNS = {
    "server.host": r"^\S+$",
    "store.url": r"^(file:///[^?#]*|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^?#]*)?)$",
    "store.endpoint_url": r"^https?://[^/@?#\s]+(/[^?#\s]*)?$",
    "store.region": r"^[A-Za-z0-9-]{1,64}$",
}
#: DESIGN.md §3's tenant grammar: 1-128 ASCII graphic bytes except ':', '#' and '/'.
TENANT_PATTERN = r'^[!"$-.0-9;-~]{1,128}$'
#: A bearer token: printable ASCII without spaces (app.base.config.load_tokens).
TOKEN_PATTERN = r"^[!-~]+$"


def camel(name: str) -> str:
    """``segment_max_bytes`` → ``segmentMaxBytes``."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def value_key(row: Setting) -> str:
    """The chart value of a setting: ``wal.segmentMaxBytes``."""
    return f"{row.section}.{camel(row.name)}"


def value_rows() -> tuple[Setting, ...]:
    """The settings that are chart values, in the table's order."""
    return tuple(
        row
        for row in SETTINGS
        if row.section in VALUE_SECTIONS and row.yaml_key not in CHART_MANAGED
    )


def setting_schema(row: Setting) -> Schema:
    """One setting's schema: its type, range or choices, its default and its variable."""
    schema: Schema
    if row.kind is ValueKind.INT:
        schema = {"type": "integer"}
        if row.minimum is not None:
            schema["minimum"] = row.minimum
        if row.maximum is not None:
            schema["maximum"] = row.maximum
    elif row.kind is ValueKind.BOOL:
        schema = {"type": "boolean"}
    elif row.kind is ValueKind.CHOICE:
        schema = {"type": "string", "enum": list(row.choices)}
    else:
        schema = {"type": "string"}
        pattern = STRING_PATTERNS[row.yaml_key]
        # An optional setting is unset when empty, as in the app.
        schema["pattern"] = f"^$|{pattern}" if row.optional else pattern
    schema.update(NARROWED.get(row.yaml_key, {}))
    if row.default is not None:
        schema["default"] = row.default
    elif row.optional and row.kind is ValueKind.INT:
        # An optional number the app derives when unset (server.workers): null.
        schema["type"] = ["integer", "null"]
    elif row.optional:
        schema["default"] = ""
    unit = f" ({row.unit})" if row.unit else ""
    text = f"{row.env_var}{unit}: {row.doc} Allowed: {row.allowed}."
    narrowed = NARROWED.get(row.yaml_key, {})
    if "minimum" in narrowed:
        text += f" The chart needs at least {narrowed['minimum']} (the probes need a fixed port)."
    if "maximum" in narrowed:
        text += f" The chart allows at most {narrowed['maximum']} (Helm's numbers are float64)."
    schema["description"] = text
    return schema


def settings_sections() -> dict[str, Schema]:
    """The schema of each settings section, closed to unknown keys."""
    out: dict[str, Schema] = {}
    for section in VALUE_SECTIONS:
        rows = [row for row in value_rows() if row.section == section]
        out[section] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {camel(row.name): setting_schema(row) for row in rows},
        }
        required = [camel(row.name) for row in rows if row.yaml_key in REQUIRED]
        if required:
            out[section]["required"] = required
    return out


# --- building blocks of the chart's own keys ------------------------------------------


def obj(properties: dict[str, Schema], *, required: tuple[str, ...] = ()) -> Schema:
    """A closed object: only ``properties``."""
    schema: Schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def string(description: str = "", **extra: Any) -> Schema:
    return _described({"type": "string", **extra}, description)


def integer(
    minimum: int | None = None, maximum: int | None = None, description: str = "", **extra: Any
) -> Schema:
    schema: Schema = {"type": "integer", **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return _described(schema, description)


def boolean(description: str = "") -> Schema:
    return _described({"type": "boolean"}, description)


def free_object(description: str = "") -> Schema:
    """A Kubernetes structure passed through as is (resources, affinity, ...)."""
    return _described({"type": "object"}, description)


def free_list(description: str = "") -> Schema:
    return _described({"type": "array"}, description)


def string_map(description: str = "") -> Schema:
    """Labels and annotations."""
    return _described({"type": "object", "additionalProperties": {"type": "string"}}, description)


def nullable(schema: Schema) -> Schema:
    out = dict(schema)
    kind = out["type"]
    out["type"] = [kind, "null"] if isinstance(kind, str) else [*kind, "null"]
    return out


def _described(schema: Schema, description: str) -> Schema:
    if description:
        schema["description"] = description
    return schema


_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_DURATION = r"^([0-9]+(ms|s|m|h))+$"


def _probe(*, readiness: bool = False) -> Schema:
    props = {
        "periodSeconds": integer(1),
        "timeoutSeconds": integer(1),
        "failureThreshold": integer(1),
    }
    if readiness:
        props["successThreshold"] = integer(1)
    return obj(props)


def store_chart_keys() -> dict[str, Schema]:
    """The ``store`` section's chart keys beside its settings: the S3 credentials."""
    return {
        "existingSecret": string("A Secret holding the S3 keys (see existingSecretKeys)."),
        "existingSecretKeys": obj(
            {
                "accessKeyId": string("Key of AWS_ACCESS_KEY_ID in existingSecret.", minLength=1),
                "secretAccessKey": string(
                    "Key of AWS_SECRET_ACCESS_KEY in existingSecret.", minLength=1
                ),
            }
        ),
        "accessKeyId": string("AWS_ACCESS_KEY_ID; the chart creates the Secret."),
        "secretAccessKey": string("AWS_SECRET_ACCESS_KEY; the chart creates the Secret."),
    }


#: Why extraEnv refuses an OURIOS_* name, in the words the user reads: helm prints a
#: schema failure as "value must be '<const>'", so the const is the reason.
EXTRA_ENV_RULE = (
    "a name outside OURIOS_*: the ourios settings are values of this chart "
    "(OURIOS_WAL_BARRIER_SECS is wal.barrierSecs), which it renders itself into the "
    "settings ConfigMap; a second definition in extraEnv would silently override it"
)


def extra_env_name() -> Schema:
    """An extraEnv name: an OURIOS_* one fails with the reason as the expected value."""
    return {
        "type": "string",
        "description": f"Must be {EXTRA_ENV_RULE}.",
        "if": {"pattern": "^OURIOS_"},
        "then": {"const": EXTRA_ENV_RULE},
    }


def _peers(description: str) -> Schema:
    return {"type": "array", "items": {"type": "object"}, "description": description}


def network_policy() -> Schema:
    """``networkPolicy``: who may reach the pods, and (optionally) where they connect."""
    return obj(
        {
            "enabled": boolean("Render a NetworkPolicy for the release's pods."),
            "ingress": obj(
                {
                    "from": _peers("NetworkPolicyPeers allowed to the OTLP ports; empty: any."),
                    "metricsNamespaceSelector": string_map(
                        "Labels of the namespace allowed to scrape /metrics (the HTTP port)."
                    ),
                    "extra": _peers("More NetworkPolicyIngressRules, as they are."),
                }
            ),
            "egress": obj(
                {
                    "enabled": boolean("Restrict egress to DNS, the store and egress.extra."),
                    "dnsTo": _peers("NetworkPolicyPeers answering DNS (UDP and TCP 53)."),
                    "storeTo": _peers("NetworkPolicyPeers of an s3:// store; empty: any."),
                    "storePorts": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 1, "maximum": 65_535},
                        "description": "The store's ports; empty: store.endpointUrl's, else 443.",
                    },
                    "extra": _peers("More NetworkPolicyEgressRules, as they are."),
                }
            ),
        }
    )


def chart_properties() -> dict[str, Schema]:
    """The chart's own top-level keys (everything but the settings sections)."""
    return {
        "global": {
            "type": "object",
            "description": "Values shared with other charts of an umbrella release.",
            "properties": {
                "imageRegistry": string(
                    "A registry (mirror) replacing image.repository's own; empty: none.",
                    pattern=r"^[^\s/]*(/[^\s/]+)*/?$",
                )
            },
        },
        "tls": obj(
            {
                "existingSecret": string(
                    "A kubernetes.io/tls Secret (tls.crt, tls.key) both receivers serve; "
                    "empty: plaintext."
                ),
                "clientCaSecret": string(
                    "A Secret holding the client CA bundle (mutual TLS); needs server.metricsPort."
                ),
                "clientCaKey": string("The CA bundle's key in clientCaSecret.", minLength=1),
            }
        ),
        "auth": obj(
            {
                "existingSecret": string("A Secret holding the tokens file."),
                "existingSecretKey": string(
                    "The tokens file's key in existingSecret.", minLength=1
                ),
                "tokens": {
                    "type": "object",
                    "description": "token: [tenant, ...]; the chart creates the Secret.",
                    "propertyNames": {"pattern": TOKEN_PATTERN},
                    "additionalProperties": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "string", "pattern": TENANT_PATTERN},
                    },
                },
            }
        ),
        "image": obj(
            {
                "repository": string(minLength=1),
                "tag": string("Empty: the chart's appVersion."),
                "digest": string("sha256:...; wins over tag.", pattern=r"^(sha256:[0-9a-f]{64})?$"),
                "pullPolicy": string(enum=["Always", "IfNotPresent", "Never"]),
            },
            required=("repository",),
        ),
        "imagePullSecrets": free_list(),
        "nameOverride": string(),
        "fullnameOverride": string(),
        "commonLabels": string_map(),
        "replicaCount": integer(0),
        "podManagementPolicy": string(enum=["OrderedReady", "Parallel"]),
        "updateStrategy": free_object(),
        "ordinalsStart": nullable(integer(0, 65_535, "First pod ordinal; null: 0.")),
        "serviceAccount": obj({"create": boolean(), "name": string(), "annotations": string_map()}),
        "automountServiceAccountToken": boolean(),
        "persistence": obj(
            {
                "enabled": boolean(),
                "size": string(pattern=_QUANTITY),
                "storageClassName": nullable(string()),
                "accessModes": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "string",
                        "enum": ["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"],
                    },
                },
                "annotations": string_map(),
                "retentionPolicy": obj(
                    {
                        "whenDeleted": string(enum=["Retain", "Delete"]),
                        "whenScaled": string(enum=["Retain", "Delete"]),
                    }
                ),
                "emptyDirSizeLimit": nullable(string(pattern=_QUANTITY)),
            }
        ),
        "tmp": obj({"sizeLimit": nullable(string(pattern=_QUANTITY))}),
        "shutdown": obj(
            {
                "preStopSleepSecs": integer(0, 300),
                "finalCutSecs": integer(1, 3600),
            },
            required=("preStopSleepSecs", "finalCutSecs"),
        ),
        "terminationGracePeriodSeconds": nullable(integer(1)),
        "probes": obj(
            {
                "startup": _probe(),
                "readiness": _probe(readiness=True),
                "liveness": _probe(),
            }
        ),
        "resources": free_object(),
        "podSecurityContext": free_object(),
        "securityContext": free_object(),
        "topologySpreadConstraints": free_list(),
        "nodeSelector": string_map(),
        "tolerations": free_list(),
        "affinity": free_object(),
        "priorityClassName": string(),
        "podAnnotations": string_map(),
        "podLabels": string_map(),
        "extraEnv": {
            "type": "array",
            "description": "Extra container env. " + EXTRA_ENV_RULE,
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": extra_env_name()},
            },
        },
        "extraEnvFrom": free_list(
            "envFrom sources (ConfigMaps, Secrets) before the chart's settings, which win."
        ),
        "extraVolumes": free_list(),
        "extraVolumeMounts": free_list(),
        "initContainers": free_list("Containers run to completion before ourios starts."),
        "extraContainers": free_list("Containers beside ourios in the pod (sidecars)."),
        "lifecycleHooks": obj(
            {
                "postStart": free_object("A LifecycleHandler run after the container starts."),
                "preStop": free_object(
                    "A LifecycleHandler replacing the shutdown.preStopSleepSecs sleep."
                ),
            }
        ),
        "dnsPolicy": string(
            "The pod's dnsPolicy; empty: Kubernetes' default (ClusterFirst).",
            enum=["", "ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
        ),
        "dnsConfig": free_object("The pod's dnsConfig (nameservers, searches, options)."),
        "networkPolicy": network_policy(),
        "service": obj(
            {
                "type": string(enum=["ClusterIP", "NodePort", "LoadBalancer"]),
                "annotations": string_map(),
                "labels": string_map(),
                "grpcPort": integer(1, 65_535),
                "httpPort": integer(1, 65_535),
                "externalTrafficPolicy": string(enum=["", "Cluster", "Local"]),
                "loadBalancerSourceRanges": {"type": "array", "items": {"type": "string"}},
            }
        ),
        "podDisruptionBudget": obj(
            {
                "enabled": boolean(),
                "maxUnavailable": {"type": ["integer", "string"]},
                "unhealthyPodEvictionPolicy": string(enum=["", "IfHealthyBudget", "AlwaysAllow"]),
            }
        ),
        "serviceMonitor": obj(
            {
                "enabled": boolean(),
                "interval": string(pattern=_DURATION),
                "scrapeTimeout": string(pattern=_DURATION),
                "labels": string_map(),
                "relabelings": free_list(),
                "metricRelabelings": free_list(),
                "namespace": string("Where the ServiceMonitor lives; empty: the release's."),
            }
        ),
        "prometheusRule": obj(
            {
                "enabled": boolean(),
                "labels": string_map(),
                "runbookBaseUrl": string(
                    "Prefix for the rules' relative runbook_url annotations.",
                    pattern=r"^(https?://\S+)?$",
                ),
            }
        ),
        "dashboard": obj(
            {
                "enabled": boolean(),
                "labels": string_map(),
                "annotations": string_map(),
                "namespace": string(),
            }
        ),
        "tests": obj({"enabled": boolean()}),
    }


def render() -> str:
    """The whole of values.schema.json."""
    properties = settings_sections()
    properties["store"]["properties"].update(store_chart_keys())
    properties.update(chart_properties())
    schema: Schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the ourios chart",
        "description": "Generated by scripts/gen_chart_schema.py from app/base/config.py; "
        "do not edit by hand.",
        "type": "object",
        "additionalProperties": False,
        "required": list(VALUE_SECTIONS),
        "properties": dict(sorted(properties.items())),
    }
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if the schema is out of date")
    parser.add_argument("--path", type=Path, default=SCHEMA_PATH, help="the file to write or check")
    args = parser.parse_args(argv)
    path: Path = args.path
    text = render()
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is out of date; run scripts/gen_chart_schema.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
