"""Settings of ``ourios serve``: one table, three sources, validated once at start-up.

Every setting is a row of ``SETTINGS`` (section, name, kind, default, range or
choices, unit, meaning). The ``wal`` rows are derived from the field metadata of
``WalSettings`` (``wal.WalConfig``'s knobs plus the application's one, settlement's
bound), so their ranges and defaults are declared exactly once, there.
``ourios serve --help``, ``docs/CONFIG.md`` (``scripts/gen_config_doc.py``) and the
validation below all read this table; nothing else declares a default or a range.

Sources, highest precedence first (DESIGN.md §3):

1. the environment: ``OURIOS_<SECTION>_<NAME>``, e.g. ``OURIOS_WAL_BARRIER_SECS``;
2. the optional YAML file of ``ourios serve --config FILE``, nested as
   ``<section>: {<name>: value}``;
3. the table's default.

Integers are plain decimal; byte-sized settings also take a binary suffix
(``64MiB``, ``64Mi``; KiB, MiB, GiB, TiB). Booleans are true/false/1/0/yes/no. An
empty value of an optional setting means "unset". An unknown YAML key or an unknown
``OURIOS_*`` variable is refused, naming it, because a typo in the chart would
otherwise silently run the default (Kubernetes service-link variables such as
``OURIOS_SERVICE_HOST`` are recognised and ignored).

Invalid values refuse to start: each ``ConfigError`` names the environment variable,
the YAML key, the value and what is allowed. Nothing is clamped. The loaded
``Settings`` is frozen; ``Settings.effective()`` renders it keyed by environment
variable for the one ``config.effective`` start-up log line. No setting holds a secret:
bearer tokens live only in ``AuthSettings.tokens``, which is neither rendered nor part
of ``repr``, and URLs with embedded credentials are refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import yaml

from wal import MAX_TENANT_BYTES, InvalidConfig, WalConfig, in_range, is_valid_tenant, range_text

__all__ = [
    "CROSS_RULES",
    "DERIVED_FIELDS",
    "EFFECTIVE_EVENT",
    "SECTIONS",
    "SETTINGS",
    "AuthSettings",
    "ConfigError",
    "CrossRule",
    "DiskSettings",
    "ValueKind",
    "MinerSettings",
    "ServerSettings",
    "Setting",
    "Settings",
    "SinkSettings",
    "StoreSettings",
    "WalSettings",
    "available_cpus",
    "default_encode_concurrency",
    "default_workers",
    "human_bytes",
    "load_settings",
    "load_tokens",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
PiB = 1024 * TiB
EiB = 1024 * PiB

ENV_PREFIX = "OURIOS_"
#: The ``event`` field of the start-up line carrying ``Settings.effective()``.
EFFECTIVE_EVENT = "config.effective"
#: Section order: the YAML file, the docs, ``--help`` and ``effective()`` follow it.
SECTIONS = ("server", "wal", "sink", "store", "auth", "disk", "miner")

_MAX_BYTES = 2**62
_MAX_PORT = 65_535
#: Ordinals are folded into template ids next to a per-node counter; 16 bits.
_MAX_ORDINAL = 65_535
#: Worker processes at most: more than a pod has CPUs only adds contention.
_MAX_WORKERS = 256

Compression = Literal["zstd", "snappy", "gzip", "none"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "json", "console"]
Decoder = Literal["native", "upb"]


class ConfigError(Exception):
    """A setting (or the config file, or the tokens file) refuses start-up.

    ``keys`` are the YAML keys involved (``("disk.stop_water_bytes", ...)``), empty
    when the file itself is at fault. The message is meant for an operator's eyes.
    """

    def __init__(self, message: str, *, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


class ValueKind(enum.Enum):
    """How a setting's text is parsed and checked."""

    INT = 1
    BOOL = 2
    STR = 3
    PATH = 4
    CHOICE = 5


_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_INT_RE = re.compile(r"-?[0-9]+")
_BYTES_RE = re.compile(r"(-?[0-9]+)\s*(KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti)", re.IGNORECASE)
_BYTE_SUFFIXES = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}


@dataclass(frozen=True)
class Setting:
    """One row of the table: where a setting comes from and what it may be."""

    section: str
    name: str
    kind: ValueKind
    #: the default value; ``None`` for an optional setting whose default is derived
    default: object
    doc: str
    unit: str = ""
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    #: an empty value means "unset" (``None``, or derived as ``default_text`` says)
    optional: bool = False
    #: how the docs show a derived default
    default_text: str = ""
    #: what a string setting may be, for messages and docs
    allowed_text: str = ""
    #: returns what is wrong with a parsed string value, or ``None``
    check: Callable[[str], str | None] | None = field(default=None, compare=False)

    @property
    def env_var(self) -> str:
        return f"{ENV_PREFIX}{self.section}_{self.name}".upper()

    @property
    def yaml_key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def label(self) -> str:
        """How messages name the setting: both the variable and the key."""
        return f"{self.env_var} ({self.yaml_key})"

    @property
    def allowed(self) -> str:
        """What the value must be, completing "must be ..."."""
        if self.kind is ValueKind.INT:
            text = f"an integer {_range_text(self.minimum, self.maximum, self.unit)}"
            return f"{text} {self.unit}" if self.unit else text
        if self.kind is ValueKind.BOOL:
            return "true or false"
        if self.kind is ValueKind.CHOICE:
            return "one of " + ", ".join(self.choices)
        if self.allowed_text:
            return self.allowed_text
        return "a path" if self.kind is ValueKind.PATH else "a non-empty string"

    @property
    def default_display(self) -> str:
        """The default as the docs and ``--help`` show it."""
        if self.default_text:
            return self.default_text
        return _display(self.default, self.unit)

    def parse(self, raw: object, source: str) -> Any:
        """The typed value of ``raw`` (an env string or a YAML scalar).

        Returns ``None`` for an empty value of an optional setting. Checks the range,
        so the error can say where the value came from.
        """
        if isinstance(raw, str):
            raw = raw.strip()
        if raw is None or raw == "":
            if self.optional:
                return None
            raise self.error(raw, f"{self.allowed} (it may not be empty)", source)
        value = self._convert(raw, source)
        self.check_value(value, source)
        return value

    def check_value(self, value: object, source: str = "") -> None:
        """Raise ``ConfigError`` unless ``value`` (already typed) is allowed."""
        if value is None and self.optional:
            return
        if self.kind is ValueKind.INT:
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.error(value, self.allowed, source)
            if not in_range(value, self.minimum, self.maximum):
                raise self.error(value, self.allowed, source)
        elif self.kind is ValueKind.BOOL:
            if not isinstance(value, bool):
                raise self.error(value, self.allowed, source)
        elif self.kind is ValueKind.CHOICE:
            if value not in self.choices:
                raise self.error(value, self.allowed, source)
        elif self.kind is ValueKind.PATH:
            if not isinstance(value, Path) or str(value) == "":
                raise self.error(value, self.allowed, source)
        else:
            if not isinstance(value, str) or value == "":
                raise self.error(value, self.allowed, source)
            problem = self.check(value) if self.check is not None else None
            if problem is not None:
                raise self.error(value, f"{self.allowed} ({problem})", source)

    def error(self, value: object, allowed: str, source: str = "") -> ConfigError:
        where = f" (from {source})" if source else ""
        return ConfigError(
            f"invalid setting {self.label} = {_show(value)}{where}: must be {allowed}",
            keys=(self.yaml_key,),
        )

    def _convert(self, raw: object, source: str) -> object:
        if self.kind is ValueKind.INT:
            return self._convert_int(raw, source)
        if self.kind is ValueKind.BOOL:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, int) and raw in (0, 1):
                return bool(raw)
            if isinstance(raw, str) and raw.lower() in _BOOL_WORDS:
                return _BOOL_WORDS[raw.lower()]
            raise self.error(raw, "true, false, 1, 0, yes or no", source)
        if not isinstance(raw, str):
            # YAML turned it into a number or a list; refuse rather than guess.
            raise self.error(raw, f"{self.allowed} (quote it in YAML)", source)
        if self.kind is ValueKind.PATH:
            return Path(raw)
        if self.kind is ValueKind.CHOICE:
            return raw.lower()
        return raw

    def _convert_int(self, raw: object, source: str) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            if _INT_RE.fullmatch(raw):
                return int(raw)
            if self.unit == "bytes":
                m = _BYTES_RE.fullmatch(raw)
                if m is not None:
                    return int(m.group(1)) * _BYTE_SUFFIXES[m.group(2)[0].lower()]
        suffixes = ", optionally with a KiB, MiB, GiB or TiB suffix" if self.unit == "bytes" else ""
        raise self.error(raw, f"{self.allowed}{suffixes}", source)


# --- string grammars ------------------------------------------------------------

_NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_REGION_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
_ORDINAL_RE = re.compile(r"-([0-9]+)$")


def _check_node_id(value: str) -> str | None:
    if _NODE_ID_RE.fullmatch(value):
        return None
    return "letters, digits, '.', '_' and '-', starting with a letter or digit"


def _check_host(value: str) -> str | None:
    return "no whitespace" if any(c.isspace() for c in value) else None


def _check_store_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.query or parts.fragment:
        return "no query or fragment"
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return f"a file URL names no host, got {parts.netloc!r}"
        if not parts.path.startswith("/"):
            return "a file URL needs an absolute path"
        return None
    if parts.scheme == "s3":
        if "@" in parts.netloc:
            return "no credentials in the URL; use the AWS credential chain"
        if not _BUCKET_RE.fullmatch(parts.netloc):
            return f"bucket {parts.netloc!r} is not a valid S3 bucket name"
        if "//" in parts.path:
            return "the prefix has an empty path component"
        return None
    return f"unsupported scheme {parts.scheme!r}"


def _check_endpoint_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "no credentials in the URL; use the AWS credential chain"
    if parts.query or parts.fragment:
        return "no query or fragment"
    try:
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return "a valid port"
    return None


def _check_region(value: str) -> str | None:
    return None if _REGION_RE.fullmatch(value) else "letters, digits and '-'"


# --- the table ---------------------------------------------------------------------


@dataclass(frozen=True)
class WalSettings(WalConfig):
    """The ``wal`` section: ``WalConfig``'s knobs (the journal's own) and the knobs of
    the ``wal`` section the application reads — settlement's bound, which the WAL never
    sees. Declared with the same field metadata, so one table carries them all and
    ``WalConfig.validate`` checks their ranges too."""

    frame_mining_attempts: int = field(
        default=3,
        metadata={
            "doc": "Failed attempts at mining (or emitting) one frame - the ingest turn, "
            "each settlement rebuild, a restart's replay - after which the frame is "
            "isolated: its records are published without templates (template_id 0) and "
            "its tenant goes on, so the checkpoint no longer waits on it (RUNBOOK: "
            "OuriosFrameIsolated).",
            "minimum": 1,
            "maximum": 100,
            "unit": "",
        },
    )
    frame_decode_attempts: int = field(
        default=3,
        metadata={
            "doc": "Failed attempts at decoding one frame's payload during a restart's "
            "replay (a worker's exception or refusal, or its death while it held the "
            "payload, each retry on the next worker) after which the frame is isolated: "
            "not mined, its records not published, its payload kept in "
            "<data_dir>/quarantine/frames/ and named by replay.frame_isolated; every "
            "other frame is replayed (RUNBOOK: OuriosReplayFrameIsolated).",
            "minimum": 1,
            "maximum": 100,
            "unit": "",
        },
    )
    turn_backlog_bytes: int = field(
        default=64 * MiB,
        metadata={
            "doc": "Frames acknowledged (durable) but not yet mined and buffered, in bytes: "
            "at this bound new batches are refused with 503 ingest_backlog and "
            "Retry-After until the turn thread catches up (also while a restart replays "
            "the WAL, whose frames are turned first). A single frame larger than the "
            "bound is still taken when nothing waits.",
            "minimum": 1 * MiB,
            "maximum": 16 * GiB,
            "unit": "bytes",
        },
    )


def _wal_rows() -> tuple[Setting, ...]:
    """The ``wal`` rows, read from ``WalSettings``' field metadata (never re-declared)."""
    rows = []
    for f in dataclasses.fields(WalSettings):
        rows.append(
            Setting(
                section="wal",
                name=f.name,
                kind=ValueKind.BOOL if isinstance(f.default, bool) else ValueKind.INT,
                default=f.default,
                doc=f.metadata["doc"],
                unit=f.metadata["unit"],
                minimum=f.metadata["minimum"],
                maximum=f.metadata["maximum"],
            )
        )
    return tuple(rows)


_SERVER_ROWS = (
    Setting(
        "server",
        "data_dir",
        ValueKind.PATH,
        Path("./data"),
        "Directory holding the WAL (wal/), the miner snapshots (snapshots/) and the "
        "embedded object store (objects/); must not be a file. Relative paths are taken "
        "from the working directory.",
        default_text="./data",
    ),
    Setting(
        "server",
        "host",
        ValueKind.STR,
        "0.0.0.0",
        "Address both listeners bind to.",
        allowed_text="a host name or IP address",
        check=_check_host,
    ),
    Setting(
        "server",
        "http_port",
        ValueKind.INT,
        4318,
        "OTLP/HTTP port (POST /v1/logs, /metrics, /healthz, /readyz); 0 picks a free port.",
        minimum=0,
        maximum=_MAX_PORT,
    ),
    Setting(
        "server",
        "grpc_port",
        ValueKind.INT,
        4317,
        "OTLP/gRPC port (LogsService/Export); 0 picks a free port.",
        minimum=0,
        maximum=_MAX_PORT,
    ),
    Setting(
        "server",
        "metrics_port",
        ValueKind.INT,
        0,
        "Plaintext port serving GET /metrics, /healthz and /readyz only (never the "
        "receivers), so Prometheus and the kubelet need no TLS client certificate; 0: "
        "they are served on the OTLP/HTTP port only.",
        minimum=0,
        maximum=_MAX_PORT,
    ),
    Setting(
        "server",
        "tls_cert_file",
        ValueKind.PATH,
        None,
        "PEM certificate chain both receivers serve over TLS (with server.tls_key_file); "
        "reloaded for new connections when the file changes (a renewed Secret). Unset: "
        "plaintext.",
        optional=True,
        default_text="unset (plaintext)",
        allowed_text="a readable PEM file",
    ),
    Setting(
        "server",
        "tls_key_file",
        ValueKind.PATH,
        None,
        "PEM private key (unencrypted) of server.tls_cert_file; reloaded with it.",
        optional=True,
        default_text="unset (plaintext)",
        allowed_text="a readable PEM file",
    ),
    Setting(
        "server",
        "tls_client_ca_file",
        ValueKind.PATH,
        None,
        "PEM CA bundle: with TLS on, both receivers require a client certificate it "
        "signed (mutual TLS); read at start-up.",
        optional=True,
        default_text="unset (no client certificate asked)",
        allowed_text="a readable PEM file",
    ),
    Setting(
        "server",
        "node_id",
        ValueKind.STR,
        None,
        "This node's identity in object keys and template ids; in a StatefulSet the pod "
        "name (ourios-2). Replicas sharing a store must differ.",
        optional=True,
        default_text="the host name",
        allowed_text="1-253 letters, digits, '.', '_' or '-'",
        check=_check_node_id,
    ),
    Setting(
        "server",
        "node_ordinal",
        ValueKind.INT,
        None,
        "This node's number, folded into template ids so replicas never collide; unset, "
        "it is the trailing -<n> of server.node_id (ourios-2 gives 2), else 0.",
        minimum=0,
        maximum=_MAX_ORDINAL,
        optional=True,
        default_text="from server.node_id",
    ),
    Setting(
        "server",
        "log_level",
        ValueKind.CHOICE,
        "info",
        "Least severe structured log event written to stderr.",
        choices=("debug", "info", "warning", "error"),
    ),
    Setting(
        "server",
        "log_format",
        ValueKind.CHOICE,
        "auto",
        "Format of the events on stderr (core and workers): json, one object per line "
        "with an RFC 3339 ts, for machines; console, one readable line per event and a "
        "start-up summary, for a person; auto, console when stderr is a terminal, else json.",
        choices=("auto", "json", "console"),
    ),
    Setting(
        "server",
        "shutdown_grace_secs",
        ValueKind.INT,
        25,
        "Time SIGTERM gives in-flight requests to finish (half to HTTP, then half to "
        "gRPC) before the listeners close; the final cut runs after it, bounded by the "
        "store's timeouts, so keep terminationGracePeriodSeconds above this plus the cut "
        "(an unfinished cut loses nothing: the WAL replays it).",
        minimum=1,
        maximum=3600,
        unit="seconds",
    ),
    Setting(
        "server",
        "final_cut_secs",
        ValueKind.INT,
        30,
        "Time SIGTERM gives the final cut after the drain (server.shutdown_grace_secs): "
        "join the timers, flush to the store, snapshots, checkpoint, stop the publisher. "
        "The process exits within shutdown_grace_secs + final_cut_secs of SIGTERM in "
        "every state (replaying, store down, disk full, backlog full); what did not reach "
        "the store by then stays in the WAL for the next start (exit 75). The chart sets it "
        "from shutdown.finalCutSecs.",
        minimum=1,
        maximum=3600,
        unit="seconds",
    ),
    Setting(
        "server",
        "workers",
        ValueKind.INT,
        None,
        "Worker processes doing the per-request work (the HTTP and gRPC receivers, auth, "
        "decompression, decoding, flattening to Arrow) beside the core process, which "
        "keeps the WAL, the miners and the publisher; 0 runs everything in one process "
        "(tests, tiny pods).",
        minimum=0,
        maximum=_MAX_WORKERS,
        optional=True,
        default_text="the CPUs the container may use minus one, at least 1",
    ),
    Setting(
        "server",
        "encode_concurrency",
        ValueKind.INT,
        None,
        "Parquet encodes of records partitions in flight at once across the worker "
        "processes (a WAL rotation's cut publishes every tenant's partition together); a "
        "publish holds its slot while it re-matches, encodes and settles its rows (not "
        "while it writes them), and one that finds every slot taken waits for one, so the "
        "cut's CPU leaves the rest to the requests being served (docs/BENCHMARKS.md, "
        "issue 23; TAIL.6). No effect with server.workers 0.",
        minimum=1,
        maximum=_MAX_WORKERS,
        optional=True,
        default_text="half the CPUs the container may use, at least 1",
    ),
    Setting(
        "server",
        "encode_duty_percent",
        ValueKind.INT,
        50,
        "The share of the wall time a cut's publish may hold an encode slot: after a "
        "WAL cut's publish held one for t seconds (re-matching, encoding, settling its "
        "rows), that slot rests t × (100 / percent − 1) before it is taken again, so a "
        "rotation's cut spreads its CPU instead of taking it in one burst from the "
        "requests being served (docs/BENCHMARKS.md, issue 23; TAIL.6). 100: no rest. "
        "Spills and recovery's publishes never rest. No effect with server.workers 0.",
        minimum=1,
        maximum=100,
    ),
    Setting(
        "server",
        "decoder",
        ValueKind.CHOICE,
        "native",
        "The OTLP/protobuf decoder of the receivers and the replay: native (the C "
        "extension; requests outside its fast path, and every refusal, take the upb path) "
        "or upb (the reference alone). native falls back to upb, with a warning event, "
        "when the extension cannot be imported.",
        choices=("native", "upb"),
    ),
    Setting(
        "server",
        "thread_restarts",
        ValueKind.INT,
        5,
        "Restarts a background thread (barrier, housekeeping, publisher, age sweep, "
        "worker supervision) gets within 10 minutes after an unexpected exception, each "
        "after a backoff (0.5 s doubling to 30 s); one more crash and /healthz and /readyz "
        "answer 503 naming it, so Kubernetes restarts the pod. 0: the first crash does.",
        minimum=0,
        maximum=1000,
    ),
    # What one request may expand to, and what one receiving process holds at once
    # (DESIGN.md §7; app/receive/otlp.py RequestLimits, app/receive/inflight.py).
    Setting(
        "server",
        "max_request_records",
        ValueKind.INT,
        131_072,
        "Log records in one request (resource and scope groups are bounded by it too); "
        "more is refused 400 naming this setting before the request is flattened.",
        minimum=1,
        maximum=1 << 24,
    ),
    Setting(
        "server",
        "max_attributes_per_record",
        ValueKind.INT,
        4096,
        "Attributes of one log record, and of one resource; more is refused 400 naming "
        "this setting before the request is flattened.",
        minimum=1,
        maximum=1 << 20,
    ),
    Setting(
        "server",
        "max_attributes_per_request",
        ValueKind.INT,
        1_048_576,
        "Attribute entries one request expands to (each record's own plus its "
        "resource's, which every row repeats), and separately the values nested in "
        "array and kvlist values; more is refused 400 naming this setting before the "
        "request is flattened.",
        minimum=1,
        maximum=1 << 26,
    ),
    Setting(
        "server",
        "max_attribute_key_bytes",
        ValueKind.INT,
        4 * KiB,
        "Length of one attribute key in UTF-8 bytes; longer is refused 400 naming this setting.",
        minimum=1,
        maximum=256 * MiB,
        unit="bytes",
    ),
    Setting(
        "server",
        "max_attribute_value_bytes",
        ValueKind.INT,
        1 * MiB,
        "Length of one attribute value in UTF-8 bytes (a non-string value as the JSON "
        "text it is stored as); longer is refused 400 naming this setting.",
        minimum=1,
        maximum=256 * MiB,
        unit="bytes",
    ),
    Setting(
        "server",
        "max_expanded_bytes",
        ValueKind.INT,
        64 * MiB,
        "String bytes one request's rows may hold: each record's severity text, body and "
        "attributes plus its resource's attributes and scope name, which every record "
        "repeats (UTF-8, as stored). More is refused 400 naming this setting, counted from "
        "sizes before anything is copied per record. The default is eight default frames: "
        "a full Collector batch of 8192 records under 8 KiB of resource attributes, while "
        "two decodes at once hold at most 128 MiB (docs/RUNBOOK.md).",
        minimum=64 * KiB,
        maximum=1 * GiB,
        unit="bytes",
    ),
    Setting(
        "server",
        "max_inflight_requests",
        ValueKind.INT,
        256,
        "Requests one receiving process (each worker, or the node with workers 0) holds "
        "at once, taken after authentication and before the body is read; beyond it a "
        "request is refused 503 / RESOURCE_EXHAUSTED with a 1 s Retry-After.",
        minimum=1,
        maximum=65_536,
    ),
    Setting(
        "server",
        "max_inflight_bytes",
        ValueKind.INT,
        64 * MiB,
        "Request body bytes one receiving process holds at once (raw and inflated; a "
        "gRPC message reserves wal.max_frame_bytes + 64 KiB until received), taken before "
        "the body is read or inflated; beyond it 503 / RESOURCE_EXHAUSTED with a 1 s "
        "Retry-After. It bounds the process's memory (docs/RUNBOOK.md).",
        minimum=4 * MiB,
        maximum=64 * GiB,
        unit="bytes",
    ),
    Setting(
        "server",
        "max_concurrent_decodes",
        ValueKind.INT,
        2,
        "Requests one receiving process parses and flattens at once (the step whose memory "
        "is a multiple of the body); others wait, holding their in-flight share.",
        minimum=1,
        maximum=256,
    ),
    Setting(
        "server",
        "body_read_timeout_secs",
        ValueKind.INT,
        30,
        "Time a request's body (HTTP) or message (gRPC) may take to arrive once the "
        "request is admitted; then HTTP answers 408 and a gRPC call is cancelled.",
        minimum=1,
        maximum=3600,
        unit="seconds",
    ),
    Setting(
        "server",
        "open_new_tenants_per_minute",
        ValueKind.INT,
        60,
        "In open mode only (no auth.tokens_file): tenants the node takes a slot for per "
        "minute (a burst of that many, refilled evenly); a new tenant beyond it is refused "
        "503 with a Retry-After, so no client can take all wal.max_tenants slots at once "
        "(DESIGN.md §3).",
        minimum=1,
        maximum=1_000_000,
    ),
    Setting(
        "server",
        "grpc_max_concurrent_rpcs",
        ValueKind.INT,
        256,
        "gRPC calls one receiving process accepts at once (grpcio's "
        "maximum_concurrent_rpcs; 64 run, the rest wait for a thread without their "
        "message); beyond it grpcio answers RESOURCE_EXHAUSTED itself.",
        minimum=1,
        maximum=65_536,
    ),
)

_SINK_ROWS = (
    Setting(
        "sink",
        "flush_bytes",
        ValueKind.INT,
        16 * MiB,
        "Size trigger: a buffered partition is detached and published once it holds this.",
        minimum=1 * KiB,
        maximum=1 * GiB,
        unit="bytes",
    ),
    Setting(
        "sink",
        "flush_age_secs",
        ValueKind.INT,
        300,
        "Age trigger: buffered rows older than this are published by the age sweep.",
        minimum=1,
        maximum=86_400,
        unit="seconds",
    ),
    Setting(
        "sink",
        "ceiling_bytes",
        ValueKind.INT,
        256 * MiB,
        "Bound on the rows the sink holds in memory (buffered, and in publishes under "
        "way): from three quarters of it the largest partitions are published early, and "
        "what the store does not take is spooled as Parquet to <data_dir>/spool on the "
        "data volume (counted by disk admission); at the bound the ingest turn waits for "
        "room instead of buffering more. Nothing is refused while the disk has room.",
        minimum=1 * KiB,
        maximum=64 * GiB,
        unit="bytes",
    ),
    Setting(
        "sink",
        "max_object_bytes",
        ValueKind.INT,
        512 * MiB,
        "Largest object the sink writes: a partition is detached before its rows reach "
        "it, a failed publish is never merged past it, and an encoded object above it is "
        "split (one frame's rows of one day are never split). S3 takes at most 5 GiB in "
        "one PUT.",
        minimum=64 * KiB,
        maximum=5 * GiB,
        unit="bytes",
    ),
    Setting(
        "sink",
        "dead_letter_attempts",
        ValueKind.INT,
        5,
        "Failed publishes of one partition (tenant, kind, day) with a permanent error "
        "(s3_access_denied or local_denied while the store takes other objects, "
        "s3_client_error such as "
        "EntityTooLarge, encode_error) before it is written durably to "
        "<data_dir>/deadletter instead, so that the other partitions' cut completes and "
        "the checkpoint advances (ourios_sink_dead_lettered_total; re-driven by an "
        "operator).",
        minimum=1,
        maximum=1000,
        unit="",
    ),
    Setting(
        "sink",
        "publisher_queue_depth",
        ValueKind.INT,
        64,
        "Detached partitions queued for the publisher thread.",
        minimum=1,
        maximum=4096,
    ),
    Setting(
        "sink",
        "parquet_compression",
        ValueKind.CHOICE,
        "zstd",
        "Compression codec of the Parquet objects.",
        choices=("zstd", "snappy", "gzip", "none"),
    ),
)

_STORE_ROWS = (
    Setting(
        "store",
        "url",
        ValueKind.STR,
        None,
        "Object store: file:///absolute/path (the embedded store) or s3://bucket/prefix.",
        optional=True,
        default_text="file://<data_dir>/objects",
        allowed_text="file:///absolute/path or s3://bucket[/prefix]",
        check=_check_store_url,
    ),
    Setting(
        "store",
        "endpoint_url",
        ValueKind.STR,
        None,
        "Endpoint of an S3-compatible server (SeaweedFS, MinIO); unset uses AWS. Keys "
        "come from the standard AWS credential chain, never from here.",
        optional=True,
        default_text="unset",
        allowed_text="an http:// or https:// URL",
        check=_check_endpoint_url,
    ),
    Setting(
        "store",
        "region",
        ValueKind.STR,
        None,
        "S3 region; unset uses the AWS chain (AWS_REGION, the profile).",
        optional=True,
        default_text="unset",
        allowed_text="a region name such as us-east-1",
        check=_check_region,
    ),
    Setting(
        "store",
        "probe_secs",
        ValueKind.INT,
        10,
        "While the store does not answer (found at the start-up probe, or by a failed "
        "call since), it is probed again this often with a LIST, PUT and DELETE of "
        "probe/<node> under its prefix; ourios_store_up says whether it answers. (The "
        "same probe at start-up refuses the start on a permanent error: a wrong bucket, "
        "access denied, bad credentials.)",
        minimum=1,
        maximum=3600,
        unit="seconds",
    ),
)

_AUTH_ROWS = (
    Setting(
        "auth",
        "tokens_file",
        ValueKind.PATH,
        None,
        "YAML file mapping each bearer token to the list of tenants it may write. Unset, "
        "the node runs in open mode (a warning at start-up; no header means tenant "
        "default).",
        optional=True,
        default_text="unset (open mode)",
        allowed_text="a readable YAML file of token: [tenant, ...]",
    ),
)

_DISK_ROWS = (
    Setting(
        "disk",
        "low_water_bytes",
        ValueKind.INT,
        1 * GiB,
        "Free space on the data volume below which the node warns and runs housekeeping at once.",
        minimum=1,
        maximum=_MAX_BYTES,
        unit="bytes",
    ),
    Setting(
        "disk",
        "stop_water_bytes",
        ValueKind.INT,
        256 * MiB,
        "Free space below which new batches are refused (503 with a retry hint) while "
        "housekeeping keeps reclaiming; 0 never refuses.",
        minimum=0,
        maximum=_MAX_BYTES,
        unit="bytes",
    ),
    Setting(
        "disk",
        "reserve_bytes",
        ValueKind.INT,
        64 * MiB,
        "Size of the emergency reserve file <data_dir>/disk-reserve, allocated at start-up "
        "and released when a write fails for lack of space, so a full volume can still be "
        "reclaimed (snapshots, the embedded store's objects); allocated again once there is "
        "room for it and stop water beside it. At least the largest snapshot (plus, with the "
        "embedded store, what one cut publishes); 0 disables it. A volume no larger than "
        "this plus disk.stop_water_bytes refuses to start (it could never admit a batch).",
        minimum=0,
        maximum=_MAX_BYTES,
        unit="bytes",
    ),
)

_MINER_ROWS = (
    Setting(
        "miner",
        "max_templates",
        ValueKind.INT,
        4096,
        "Templates one tenant's miner keeps; at the bound the least recently used is "
        "evicted (its id is never reused: a body like it gets a new template, id and "
        "created event). With the two body bounds it bounds the miner's memory and its "
        "snapshot (DESIGN.md §5.14).",
        minimum=1,
        maximum=10_000_000,
    ),
    Setting(
        "miner",
        "max_leaf_templates",
        ValueKind.INT,
        128,
        "Templates one leaf of a tenant's Drain tree keeps (the leaf's least recently "
        "used is evicted): the most templates one record is compared with.",
        minimum=1,
        maximum=1_000_000,
    ),
    Setting(
        "miner",
        "mined_body_chars",
        ValueKind.INT,
        1024,
        "Characters of a body that are mined (its head); the record keeps its whole body.",
        minimum=16,
        maximum=1_048_576,
    ),
    Setting(
        "miner",
        "mined_body_tokens",
        ValueKind.INT,
        64,
        "Tokens of a body's head that are mined; the rest is stored, not mined.",
        minimum=1,
        maximum=65_536,
    ),
    Setting(
        "miner",
        "tenant_turn_percent",
        ValueKind.INT,
        2,
        "A tenant's share of the ingest turn, in percent of the turn thread's time: its "
        "mining work (a unit per record and per template compared, 32 per template "
        "created) is charged at the seconds a unit takes on this node, as the turn "
        "measures it, so the share means the same on any node and under any load. A "
        "tenant over it (its burst spent) has its batches refused, 503 tenant_turn_share "
        "with Retry-After, never another tenant's; a tenant alone on the node is not "
        "held to it (DESIGN.md §5.14).",
        minimum=1,
        maximum=100,
        unit="percent",
    ),
    Setting(
        "miner",
        "tenant_turn_burst_secs",
        ValueKind.INT,
        1,
        "Seconds of miner.tenant_turn_percent a tenant may spend at once before it is "
        "refused (its bucket); also the longest Retry-After of a tenant_turn_share "
        "refusal.",
        minimum=1,
        maximum=3600,
        unit="seconds",
    ),
    Setting(
        "miner",
        "tenant_backlog_bytes",
        ValueKind.INT,
        16 * MiB,
        "One tenant's share of wal.turn_backlog_bytes (frames acknowledged, not yet "
        "turned): above it that tenant's batches are refused, 503 tenant_backlog with "
        "Retry-After, and no other tenant's (at or above wal.turn_backlog_bytes it adds "
        "nothing). A single frame larger than it is still taken when the tenant has none "
        "waiting.",
        minimum=64 * KiB,
        maximum=16 * GiB,
        unit="bytes",
    ),
)

#: Every setting, in section order. The only place defaults and ranges are declared
#: (the ``wal`` rows point at ``WalSettings``, which is ``WalConfig`` and one app knob).
SETTINGS: tuple[Setting, ...] = (
    _SERVER_ROWS + _wal_rows() + _SINK_ROWS + _STORE_ROWS + _AUTH_ROWS + _DISK_ROWS + _MINER_ROWS
)
_BY_KEY = {row.yaml_key: row for row in SETTINGS}
_BY_ENV = {row.env_var: row for row in SETTINGS}


# --- the typed result -------------------------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    """The ``server`` section, resolved (node id and ordinal filled in)."""

    data_dir: Path
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    tls_cert_file: Path | None
    tls_key_file: Path | None
    tls_client_ca_file: Path | None
    node_id: str
    node_ordinal: int
    log_level: LogLevel
    log_format: LogFormat
    shutdown_grace_secs: int
    final_cut_secs: int
    workers: int
    encode_concurrency: int
    encode_duty_percent: int
    decoder: Decoder
    thread_restarts: int
    max_request_records: int
    max_attributes_per_record: int
    max_attributes_per_request: int
    max_attribute_key_bytes: int
    max_attribute_value_bytes: int
    max_expanded_bytes: int
    max_inflight_requests: int
    max_inflight_bytes: int
    max_concurrent_decodes: int
    body_read_timeout_secs: int
    open_new_tenants_per_minute: int
    grpc_max_concurrent_rpcs: int

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def snapshots_dir(self) -> Path:
        return self.data_dir / "snapshots"


@dataclass(frozen=True)
class SinkSettings:
    """The ``sink`` section."""

    flush_bytes: int
    flush_age_secs: int
    ceiling_bytes: int
    max_object_bytes: int
    dead_letter_attempts: int
    publisher_queue_depth: int
    parquet_compression: Compression


@dataclass(frozen=True)
class StoreSettings:
    """The ``store`` section, with ``url`` resolved to a ``file://`` or ``s3://`` URL."""

    url: str
    endpoint_url: str | None
    region: str | None
    probe_secs: int = 10

    @property
    def scheme(self) -> Literal["file", "s3"]:
        return "s3" if urlsplit(self.url).scheme == "s3" else "file"

    @property
    def local_root(self) -> Path | None:
        """The directory of a ``file://`` store; ``None`` for S3."""
        if self.scheme != "file":
            return None
        return Path(unquote(urlsplit(self.url).path))

    @property
    def bucket(self) -> str | None:
        """The bucket of an ``s3://`` store; ``None`` for a local one."""
        return urlsplit(self.url).netloc if self.scheme == "s3" else None

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket, without slashes at either end ('' if none)."""
        return urlsplit(self.url).path.strip("/") if self.scheme == "s3" else ""


@dataclass(frozen=True)
class AuthSettings:
    """The ``auth`` section plus the parsed tokens file (never rendered or repr'd)."""

    tokens_file: Path | None
    #: token → tenants it may write; empty in open mode
    tokens: Mapping[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def open_mode(self) -> bool:
        return self.tokens_file is None


@dataclass(frozen=True)
class DiskSettings:
    """The ``disk`` section."""

    low_water_bytes: int
    stop_water_bytes: int
    reserve_bytes: int


@dataclass(frozen=True)
class MinerSettings:
    """The ``miner`` section: one tenant's miner bounds and its share of the turn."""

    max_templates: int
    max_leaf_templates: int
    mined_body_chars: int
    mined_body_tokens: int
    tenant_turn_percent: int
    tenant_turn_burst_secs: int
    tenant_backlog_bytes: int


_SECTION_TYPES: dict[str, type[Any]] = {
    "server": ServerSettings,
    "wal": WalSettings,
    "sink": SinkSettings,
    "store": StoreSettings,
    "auth": AuthSettings,
    "disk": DiskSettings,
    "miner": MinerSettings,
}
#: fields of a section class that are derived, not settings
DERIVED_FIELDS = {"auth": ("tokens",)}


@dataclass(frozen=True)
class CrossRule:
    """A rule between settings. ``text`` uses ``{0}``, ``{1}`` for the keys' names."""

    text: str
    keys: tuple[str, ...]
    holds: Callable[[Settings], bool]

    def describe(self) -> str:
        """The rule with YAML keys, for the docs."""
        return self.text.format(*self.keys)

    def error(self, settings: Settings) -> ConfigError:
        rows = [_BY_KEY[key] for key in self.keys]
        got = ", ".join(f"{row.env_var}={_show(settings.value(row))}" for row in rows)
        return ConfigError(
            f"invalid settings: {self.text.format(*(row.label for row in rows))}; got {got}",
            keys=self.keys,
        )


CROSS_RULES: tuple[CrossRule, ...] = (
    CrossRule(
        "{0} must be at least three times {1} plus 2 MiB (a largest coded body and what it "
        "inflates to, within the three quarters large bodies may hold)",
        ("server.max_inflight_bytes", "wal.max_frame_bytes"),
        lambda s: s.server.max_inflight_bytes >= 3 * s.wal.max_frame_bytes + 2 * MiB,
    ),
    CrossRule(
        "{0} must be at least {1} (a body the WAL takes is never refused for what its rows "
        "hold when they repeat nothing)",
        ("server.max_expanded_bytes", "wal.max_frame_bytes"),
        lambda s: s.server.max_expanded_bytes >= s.wal.max_frame_bytes,
    ),
    CrossRule(
        "{0} must be below {1}",
        ("disk.stop_water_bytes", "disk.low_water_bytes"),
        lambda s: s.disk.stop_water_bytes < s.disk.low_water_bytes,
    ),
    CrossRule(
        "{0} must be at most {1}",
        ("sink.flush_bytes", "sink.ceiling_bytes"),
        lambda s: s.sink.flush_bytes <= s.sink.ceiling_bytes,
    ),
    CrossRule(
        "{0} must be at most {1}",
        ("sink.flush_bytes", "sink.max_object_bytes"),
        lambda s: s.sink.flush_bytes <= s.sink.max_object_bytes,
    ),
    CrossRule(
        "{0} and {1} must differ (unless 0)",
        ("server.http_port", "server.grpc_port"),
        lambda s: s.server.http_port != s.server.grpc_port or s.server.http_port == 0,
    ),
    CrossRule(
        "{0} must differ from {1} and {2} (unless 0)",
        ("server.metrics_port", "server.http_port", "server.grpc_port"),
        lambda s: (
            s.server.metrics_port == 0
            or s.server.metrics_port not in (s.server.http_port, s.server.grpc_port)
        ),
    ),
    CrossRule(
        "{0} and {1} go together (set both for TLS, or neither)",
        ("server.tls_cert_file", "server.tls_key_file"),
        lambda s: (s.server.tls_cert_file is None) == (s.server.tls_key_file is None),
    ),
    CrossRule(
        "{0} needs {1} (client certificates are asked for over TLS only)",
        ("server.tls_client_ca_file", "server.tls_cert_file"),
        lambda s: s.server.tls_client_ca_file is None or s.server.tls_cert_file is not None,
    ),
    CrossRule(
        "{0} applies only to an s3:// {1}",
        ("store.endpoint_url", "store.url"),
        lambda s: s.store.endpoint_url is None or s.store.scheme == "s3",
    ),
    CrossRule(
        "{0} applies only to an s3:// {1}",
        ("store.region", "store.url"),
        lambda s: s.store.region is None or s.store.scheme == "s3",
    ),
)


@dataclass(frozen=True)
class Settings:
    """Everything ``ourios serve`` is configured with; build it with ``load_settings``."""

    server: ServerSettings
    wal: WalSettings
    sink: SinkSettings
    store: StoreSettings
    auth: AuthSettings
    disk: DiskSettings
    miner: MinerSettings

    def value(self, row: Setting) -> object:
        """The effective value of one table row."""
        return getattr(getattr(self, row.section), row.name)

    def validate(self) -> None:
        """Raise ``ConfigError`` for the first value out of range or rule broken.

        Pure: the filesystem checks (data directory, tokens file) are ``load_settings``'s.
        """
        for row in SETTINGS:
            row.check_value(self.value(row))
        try:
            self.wal.validate()
        except InvalidConfig as exc:
            raise _wal_error(exc) from exc
        for rule in CROSS_RULES:
            if not rule.holds(self):
                raise rule.error(self)

    def effective(self) -> dict[str, object]:
        """The effective configuration keyed by environment variable, JSON-ready."""
        out: dict[str, object] = {}
        for row in SETTINGS:
            value = self.value(row)
            out[row.env_var] = str(value) if isinstance(value, Path) else value
        return out

    def effective_json(self) -> str:
        """The one start-up log line: ``{"event": "config.effective", "config": {...}}``."""
        return json.dumps({"event": EFFECTIVE_EVENT, "config": self.effective()})


# --- loading ---------------------------------------------------------------------

# Kubernetes injects <SERVICE>_SERVICE_HOST, <SERVICE>_PORT_4318_TCP... for every
# Service in the namespace; a Service named "ourios" would otherwise refuse start-up.
_SERVICE_LINK_RE = re.compile(
    r"OURIOS(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?"
    r"|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)"
)
_SERVICE_LINK_PORT_RE = re.compile(r"OURIOS(_[A-Z0-9_]+)?_PORT")
_SERVICE_LINK_VALUE_RE = re.compile(r"(tcp|udp|sctp)://\S+")


def _is_service_link(name: str, value: str) -> bool:
    if _SERVICE_LINK_RE.fullmatch(name):
        return True
    return bool(_SERVICE_LINK_PORT_RE.fullmatch(name) and _SERVICE_LINK_VALUE_RE.fullmatch(value))


def load_settings(
    env: Mapping[str, str] | None = None, config_file: Path | str | None = None
) -> Settings:
    """Read, resolve and validate the settings; raise ``ConfigError`` on the first fault.

    ``env`` defaults to ``os.environ``; tests pass a dict. Precedence: ``env``, then
    ``config_file``, then the table's defaults.
    """
    env = os.environ if env is None else env
    from_file = _read_config_file(Path(config_file)) if config_file is not None else {}
    from_env = _read_env(env)
    values: dict[str, Any] = {}
    for row in SETTINGS:
        if row.yaml_key in from_env:
            value = row.parse(from_env[row.yaml_key], "the environment")
        elif row.yaml_key in from_file:
            value = row.parse(from_file[row.yaml_key], f"config file {config_file}")
        else:
            value = row.default
        values[row.yaml_key] = value

    _resolve(values)
    settings = Settings(
        **{
            section: _SECTION_TYPES[section](
                **{r.name: values[r.yaml_key] for r in SETTINGS if r.section == section}
            )
            for section in SECTIONS
        }
    )
    settings.validate()
    _check_data_dir(settings.server.data_dir)
    if settings.auth.tokens_file is not None:
        tokens = load_tokens(settings.auth.tokens_file)
        settings = dataclasses.replace(
            settings, auth=dataclasses.replace(settings.auth, tokens=tokens)
        )
    return settings


def _resolve(values: dict[str, Any]) -> None:
    """Fill in the derived defaults: absolute data dir, node id and ordinal, store URL."""
    data_dir: Path = values["server.data_dir"].absolute()
    values["server.data_dir"] = data_dir
    if values["server.node_id"] is None:
        values["server.node_id"] = socket.gethostname()
    if values["server.node_ordinal"] is None:
        node_id = values["server.node_id"]
        m = _ORDINAL_RE.search(node_id)
        ordinal = int(m.group(1)) if m else 0
        row = _BY_KEY["server.node_ordinal"]
        if ordinal > _MAX_ORDINAL:
            raise row.error(
                ordinal,
                f"{row.allowed}; it was derived from server.node_id {node_id!r}, "
                f"set {row.env_var} explicitly",
            )
        values["server.node_ordinal"] = ordinal
    if values["server.workers"] is None:
        values["server.workers"] = default_workers()
    if values["server.encode_concurrency"] is None:
        values["server.encode_concurrency"] = default_encode_concurrency()
    if values["store.url"] is None:
        values["store.url"] = (data_dir / "objects").as_uri()
    if values["auth.tokens_file"] is not None:
        values["auth.tokens_file"] = values["auth.tokens_file"].absolute()
    for key in ("server.tls_cert_file", "server.tls_key_file", "server.tls_client_ca_file"):
        if values[key] is not None:
            values[key] = values[key].absolute()


def default_workers() -> int:
    """``server.workers``'s default: the CPUs this container may use minus one (the core
    process's), at least 1."""
    return max(1, available_cpus() - 1)


def default_encode_concurrency() -> int:
    """``server.encode_concurrency``'s default: one encode per two CPUs this container may
    use, at least 1 (measured in docs/BENCHMARKS.md, issue 23)."""
    return max(1, available_cpus() // 2)


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: the affinity mask, capped by a cgroup v2
    ``cpu.max`` quota (a fraction of a CPU counts as one)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    try:
        limit = -(-int(quota) // int(period))
    except (ValueError, ZeroDivisionError):
        return cpus
    return max(1, min(cpus, limit))


def _read_env(env: Mapping[str, str]) -> dict[str, str]:
    """``OURIOS_*`` variables by YAML key; an unknown one is refused."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        row = _BY_ENV.get(name)
        if row is not None:
            out[row.yaml_key] = value
        elif not _is_service_link(name, value):
            raise ConfigError(
                f"unknown environment variable {name}{_suggest(name, _BY_ENV)}; "
                f"every OURIOS_* variable must name a setting (see ourios serve --help)"
            )
    return out


def _read_config_file(path: Path) -> dict[str, object]:
    """The YAML file's values by ``section.name``; an unknown key is refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of sections ({', '.join(SECTIONS)}), "
            f"got {type(doc).__name__}"
        )
    out: dict[str, object] = {}
    for section, body in doc.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section {section!r} in config file {path}"
                f"{_suggest(str(section), SECTIONS)}; sections are {', '.join(SECTIONS)}",
                keys=(str(section),),
            )
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(
                f"section {section!r} in config file {path} must be a mapping of "
                f"settings, got {type(body).__name__}",
                keys=(section,),
            )
        for name, value in body.items():
            key = f"{section}.{name}"
            if key not in _BY_KEY:
                raise ConfigError(
                    f"unknown key {key} in config file {path}{_suggest(key, _BY_KEY)}",
                    keys=(key,),
                )
            out[key] = value
    return out


def _wal_error(exc: InvalidConfig) -> ConfigError:
    """``WalConfig.validate``'s refusal, with every knob it mentions named by its variable."""
    allowed = exc.allowed
    for wal_row in SETTINGS:
        if wal_row.section == "wal":
            allowed = re.sub(rf"\b{wal_row.name}\b", wal_row.env_var, allowed)
    row = _BY_KEY.get(f"wal.{exc.knob}")
    if row is None:
        return ConfigError(str(exc))
    return row.error(exc.value, allowed)


def _check_data_dir(path: Path) -> None:
    row = _BY_KEY["server.data_dir"]
    if path.exists() and not path.is_dir():
        raise row.error(path, "a directory (or a path that does not exist yet); it is a file")


def load_tokens(path: Path) -> dict[str, frozenset[str]]:
    """Parse a tokens file: a YAML mapping of bearer token → non-empty list of tenants.

    Messages name entries by position, never by token, so a secret does not reach
    the log.
    """
    row = _BY_KEY["auth.tokens_file"]

    def refuse(problem: str) -> ConfigError:
        return row.error(path, f"{row.allowed}; {problem}")

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise refuse(f"cannot read it: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # PyYAML's message quotes the offending line, which may hold a token.
        raise refuse("it is not valid YAML") from exc
    if not isinstance(doc, dict) or not doc:
        raise refuse("it must be a non-empty mapping of token to a list of tenants")
    tokens: dict[str, frozenset[str]] = {}
    for index, (token, tenants) in enumerate(doc.items(), start=1):
        entry = f"entry {index}"
        if not isinstance(token, str) or not token:
            raise refuse(f"the token of {entry} must be a non-empty string (quote it)")
        if not all("!" <= c <= "~" for c in token):
            raise refuse(f"the token of {entry} must be printable ASCII without spaces")
        if not isinstance(tenants, list) or not tenants:
            raise refuse(f"{entry} must list at least one tenant")
        for tenant in tenants:
            if not isinstance(tenant, str) or not is_valid_tenant(tenant):
                raise refuse(
                    f"{entry} lists tenant {tenant!r}, which is not 1-{MAX_TENANT_BYTES} "
                    "ASCII graphic bytes without ':', '#' or '/'"
                )
        tokens[token] = frozenset(tenants)
    return tokens


# --- helpers ---------------------------------------------------------------------


def _range_text(lo: int | None, hi: int | None, unit: str) -> str:
    def bound(n: int) -> str:
        human = human_bytes(n) if unit == "bytes" else str(n)
        return str(n) if human == str(n) else f"{n} ({human})"

    return range_text(lo, hi, bound, unbounded="(any)")


def _show(value: object) -> str:
    """``repr`` for messages, with a URL's user and password replaced by ``***``."""
    if isinstance(value, Path):
        return repr(str(value))
    if isinstance(value, str) and "@" in value and "://" in value:
        parts = urlsplit(value)
        if "@" in parts.netloc:
            host = parts.netloc.rpartition("@")[2]
            return repr(parts._replace(netloc=f"***@{host}").geturl())
    return repr(value)


def _display(value: object, unit: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and unit == "bytes":
        return human_bytes(value)
    return str(value)


def human_bytes(value: int) -> str:
    """``16 MiB`` for an exact binary multiple, else the plain number."""
    units = ((EiB, "EiB"), (PiB, "PiB"), (TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))
    for size, suffix in units:
        if value >= size and value % size == 0:
            return f"{value // size} {suffix}"
    return str(value)


def _suggest(name: str, known: Mapping[str, object] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""
