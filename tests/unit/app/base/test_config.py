"""Tests for app.base.config: the settings table, its three sources and start-up validation."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.base.config import (
    CROSS_RULES,
    DERIVED_FIELDS,
    SECTIONS,
    SETTINGS,
    ConfigError,
    Setting,
    Settings,
    ValueKind,
    WalSettings,
    available_cpus,
    default_workers,
    load_settings,
    load_tokens,
)
from wal.config import WalConfig

ROOT = Path(__file__).resolve().parents[4]
KiB, MiB, GiB = 1024, 1024**2, 1024**3
ROWS = {row.yaml_key: row for row in SETTINGS}
INT_ROWS = [row for row in SETTINGS if row.kind is ValueKind.INT]


def row_id(row: Setting) -> str:
    return row.yaml_key


def write_yaml(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def nested(flat: dict[str, object]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for key, value in flat.items():
        section, name = key.split(".")
        out.setdefault(section, {})[name] = value
    return out


@dataclasses.dataclass(frozen=True)
class Sample:
    """A non-default valid value: its environment text and its loaded value."""

    text: str
    expected: object
    #: other settings it needs (store.endpoint_url needs an s3:// store.url)
    needs: tuple[tuple[str, str], ...] = ()

    @property
    def yaml_value(self) -> object:
        # Native YAML scalars for numbers and booleans; the text otherwise.
        if isinstance(self.expected, bool | int):
            return self.expected
        return self.text


S3 = (("store.url", "s3://logs/ourios"),)
TLS_CERT = (("server.tls_cert_file", "/tls/tls.crt"),)
TLS_KEY = (("server.tls_key_file", "/tls/tls.key"),)


def samples(tmp_path: Path) -> dict[str, Sample]:
    tokens = write_yaml(tmp_path / "tokens.yaml", {"tok-1": ["acme"]})
    return {
        "server.data_dir": Sample("/srv/ourios", Path("/srv/ourios")),
        "server.host": Sample("127.0.0.1", "127.0.0.1"),
        "server.http_port": Sample("8080", 8080),
        "server.grpc_port": Sample("9090", 9090),
        "server.metrics_port": Sample("9464", 9464),
        "server.tls_cert_file": Sample("/tls/tls.crt", Path("/tls/tls.crt"), TLS_KEY),
        "server.tls_key_file": Sample("/tls/tls.key", Path("/tls/tls.key"), TLS_CERT),
        "server.tls_client_ca_file": Sample("/tls/ca.crt", Path("/tls/ca.crt"), TLS_CERT + TLS_KEY),
        "server.node_id": Sample("ourios-7", "ourios-7"),
        "server.node_ordinal": Sample("5", 5),
        "server.log_level": Sample("debug", "debug"),
        "server.log_format": Sample("console", "console"),
        "server.shutdown_grace_secs": Sample("10", 10),
        "server.final_cut_secs": Sample("12", 12),
        "server.workers": Sample("3", 3),
        "server.encode_concurrency": Sample("37", 37),
        "server.encode_duty_percent": Sample("80", 80),
        "server.decoder": Sample("upb", "upb"),
        "server.thread_restarts": Sample("2", 2),
        "server.max_request_records": Sample("1000", 1000),
        "server.max_attributes_per_record": Sample("64", 64),
        "server.max_attributes_per_request": Sample("5000", 5000),
        "server.max_attribute_key_bytes": Sample("1KiB", KiB),
        "server.max_attribute_value_bytes": Sample("64KiB", 64 * KiB),
        "server.max_expanded_bytes": Sample("16MiB", 16 * MiB),
        "server.max_inflight_requests": Sample("32", 32),
        "server.max_inflight_bytes": Sample("128MiB", 128 * MiB),
        "server.max_concurrent_decodes": Sample("4", 4),
        "server.body_read_timeout_secs": Sample("9", 9),
        "server.open_new_tenants_per_minute": Sample("7", 7),
        "server.grpc_max_concurrent_rpcs": Sample("48", 48),
        "wal.segment_max_bytes": Sample("128MiB", 128 * MiB),
        "wal.segment_age_secs": Sample("60", 60),
        "wal.barrier_secs": Sample("30", 30),
        "wal.housekeeping_secs": Sample("5", 5),
        "wal.max_unlinks_per_pass": Sample("64", 64),
        "wal.rotation_retry_attempts": Sample("5", 5),
        "wal.max_tenants": Sample("16", 16),
        "wal.max_frame_bytes": Sample("4MiB", 4 * MiB),
        "wal.unreclaimed_bytes_limit": Sample("1GiB", GiB),
        "wal.high_water_bytes": Sample("4MiB", 4 * MiB),
        "store.probe_secs": Sample("30", 30),
        "wal.frame_mining_attempts": Sample("7", 7),
        "wal.frame_decode_attempts": Sample("5", 5),
        "wal.turn_backlog_bytes": Sample("128MiB", 128 * MiB),
        "wal.archive": Sample("true", True),
        "sink.flush_bytes": Sample("1MiB", MiB),
        "sink.flush_age_secs": Sample("60", 60),
        "sink.ceiling_bytes": Sample("512MiB", 512 * MiB),
        "sink.max_object_bytes": Sample("1GiB", GiB),
        "sink.dead_letter_attempts": Sample("3", 3),
        "sink.publisher_queue_depth": Sample("8", 8),
        "sink.parquet_compression": Sample("snappy", "snappy"),
        "store.url": Sample("s3://logs/ourios/prod", "s3://logs/ourios/prod"),
        "store.endpoint_url": Sample("http://seaweed:8333", "http://seaweed:8333", S3),
        "store.region": Sample("eu-west-1", "eu-west-1", S3),
        "auth.tokens_file": Sample(str(tokens), tokens),
        "disk.low_water_bytes": Sample("2GiB", 2 * GiB),
        "disk.stop_water_bytes": Sample("512MiB", 512 * MiB),
        "disk.reserve_bytes": Sample("32MiB", 32 * MiB),
        "miner.max_templates": Sample("500", 500),
        "miner.max_leaf_templates": Sample("16", 16),
        "miner.mined_body_chars": Sample("256", 256),
        "miner.mined_body_tokens": Sample("32", 32),
        "miner.tenant_turn_percent": Sample("20", 20),
        "miner.tenant_turn_burst_secs": Sample("2", 2),
        "miner.tenant_backlog_bytes": Sample("8MiB", 8 * MiB),
    }


def env_of(flat: dict[str, str]) -> dict[str, str]:
    return {ROWS[key].env_var: value for key, value in flat.items()}


def refused(env: dict[str, str] | None = None, config_file: Path | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(env or {}, config_file)
    return info.value


# --- the table --------------------------------------------------------------------


def test_sample_for_every_setting(tmp_path: Path) -> None:
    assert set(samples(tmp_path)) == set(ROWS)


def test_env_var_is_prefix_section_name_upper() -> None:
    for row in SETTINGS:
        assert row.env_var == f"OURIOS_{row.section.upper()}_{row.name.upper()}"
        assert row.yaml_key == f"{row.section}.{row.name}"
    assert len({row.env_var for row in SETTINGS}) == len(SETTINGS)
    assert ROWS["wal.barrier_secs"].env_var == "OURIOS_WAL_BARRIER_SECS"
    assert ROWS["store.url"].env_var == "OURIOS_STORE_URL"
    assert ROWS["auth.tokens_file"].env_var == "OURIOS_AUTH_TOKENS_FILE"
    assert ROWS["server.data_dir"].env_var == "OURIOS_SERVER_DATA_DIR"


def test_wal_rows_are_read_from_walconfig_metadata() -> None:
    """WalConfig's knobs, then the application's (settlement's bound), one table."""
    wal_rows = [row for row in SETTINGS if row.section == "wal"]
    fields = dataclasses.fields(WalSettings)
    assert [f.name for f in fields[: len(dataclasses.fields(WalConfig))]] == [
        f.name for f in dataclasses.fields(WalConfig)
    ]
    assert isinstance(load_settings({}).wal, WalConfig)  # what Journal.open takes
    assert [row.name for row in wal_rows] == [f.name for f in fields]
    for row, f in zip(wal_rows, fields, strict=True):
        assert row.default == f.default
        assert (row.minimum, row.maximum) == (f.metadata["minimum"], f.metadata["maximum"])
        assert (row.doc, row.unit) == (f.metadata["doc"], f.metadata["unit"])


def test_sections_match_the_typed_dataclasses() -> None:
    settings = load_settings({})
    assert [f.name for f in dataclasses.fields(Settings)] == list(SECTIONS)
    for section in SECTIONS:
        declared = [f.name for f in dataclasses.fields(getattr(settings, section))]
        derived = DERIVED_FIELDS.get(section, ())
        expected = [row.name for row in SETTINGS if row.section == section]
        assert [name for name in declared if name not in derived] == expected


def test_defaults_match_design_section_8() -> None:
    data_dir = Path("./data").absolute()
    expected = {
        "OURIOS_SERVER_DATA_DIR": str(data_dir),
        "OURIOS_SERVER_HOST": "0.0.0.0",
        "OURIOS_SERVER_HTTP_PORT": 4318,
        "OURIOS_SERVER_GRPC_PORT": 4317,
        "OURIOS_SERVER_METRICS_PORT": 0,
        "OURIOS_SERVER_TLS_CERT_FILE": None,
        "OURIOS_SERVER_TLS_KEY_FILE": None,
        "OURIOS_SERVER_TLS_CLIENT_CA_FILE": None,
        "OURIOS_SERVER_NODE_ID": socket.gethostname(),
        "OURIOS_SERVER_NODE_ORDINAL": load_settings({}).server.node_ordinal,
        "OURIOS_SERVER_LOG_LEVEL": "info",
        "OURIOS_SERVER_LOG_FORMAT": "auto",
        "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": 25,
        "OURIOS_SERVER_FINAL_CUT_SECS": 30,
        "OURIOS_SERVER_WORKERS": max(1, available_cpus() - 1),
        "OURIOS_SERVER_ENCODE_CONCURRENCY": max(1, available_cpus() // 2),
        "OURIOS_SERVER_ENCODE_DUTY_PERCENT": 50,
        "OURIOS_SERVER_DECODER": "native",
        "OURIOS_SERVER_THREAD_RESTARTS": 5,
        "OURIOS_SERVER_MAX_REQUEST_RECORDS": 131_072,
        "OURIOS_SERVER_MAX_ATTRIBUTES_PER_RECORD": 4096,
        "OURIOS_SERVER_MAX_ATTRIBUTES_PER_REQUEST": 1_048_576,
        "OURIOS_SERVER_MAX_ATTRIBUTE_KEY_BYTES": 4 * KiB,
        "OURIOS_SERVER_MAX_ATTRIBUTE_VALUE_BYTES": 1 * MiB,
        "OURIOS_SERVER_MAX_EXPANDED_BYTES": 64 * MiB,
        "OURIOS_SERVER_MAX_INFLIGHT_REQUESTS": 256,
        "OURIOS_SERVER_MAX_INFLIGHT_BYTES": 64 * MiB,
        "OURIOS_SERVER_MAX_CONCURRENT_DECODES": 2,
        "OURIOS_SERVER_BODY_READ_TIMEOUT_SECS": 30,
        "OURIOS_SERVER_OPEN_NEW_TENANTS_PER_MINUTE": 60,
        "OURIOS_SERVER_GRPC_MAX_CONCURRENT_RPCS": 256,
        "OURIOS_WAL_SEGMENT_MAX_BYTES": 64 * MiB,
        "OURIOS_WAL_SEGMENT_AGE_SECS": 600,
        "OURIOS_WAL_BARRIER_SECS": 300,
        "OURIOS_WAL_HOUSEKEEPING_SECS": 60,
        "OURIOS_WAL_MAX_UNLINKS_PER_PASS": 128,
        "OURIOS_WAL_ROTATION_RETRY_ATTEMPTS": 3,
        "OURIOS_WAL_MAX_TENANTS": 1024,
        "OURIOS_WAL_MAX_FRAME_BYTES": 8 * MiB,
        "OURIOS_WAL_UNRECLAIMED_BYTES_LIMIT": 0,
        "OURIOS_WAL_HIGH_WATER_BYTES": 1 * MiB,
        "OURIOS_STORE_PROBE_SECS": 10,
        "OURIOS_WAL_ARCHIVE": False,
        "OURIOS_WAL_FRAME_MINING_ATTEMPTS": 3,
        "OURIOS_WAL_FRAME_DECODE_ATTEMPTS": 3,
        "OURIOS_WAL_TURN_BACKLOG_BYTES": 64 * MiB,
        "OURIOS_SINK_FLUSH_BYTES": 16 * MiB,
        "OURIOS_SINK_FLUSH_AGE_SECS": 300,
        "OURIOS_SINK_CEILING_BYTES": 256 * MiB,
        "OURIOS_SINK_MAX_OBJECT_BYTES": 512 * MiB,
        "OURIOS_SINK_DEAD_LETTER_ATTEMPTS": 5,
        "OURIOS_SINK_PUBLISHER_QUEUE_DEPTH": 64,
        "OURIOS_SINK_PARQUET_COMPRESSION": "zstd",
        "OURIOS_STORE_URL": (data_dir / "objects").as_uri(),
        "OURIOS_STORE_ENDPOINT_URL": None,
        "OURIOS_STORE_REGION": None,
        "OURIOS_AUTH_TOKENS_FILE": None,
        "OURIOS_DISK_LOW_WATER_BYTES": 1 * GiB,
        "OURIOS_DISK_STOP_WATER_BYTES": 256 * MiB,
        "OURIOS_DISK_RESERVE_BYTES": 64 * MiB,
        "OURIOS_MINER_MAX_TEMPLATES": 4096,
        "OURIOS_MINER_MAX_LEAF_TEMPLATES": 128,
        "OURIOS_MINER_MINED_BODY_CHARS": 1024,
        "OURIOS_MINER_MINED_BODY_TOKENS": 64,
        "OURIOS_MINER_TENANT_TURN_PERCENT": 2,
        "OURIOS_MINER_TENANT_TURN_BURST_SECS": 1,
        "OURIOS_MINER_TENANT_BACKLOG_BYTES": 16 * MiB,
    }
    assert load_settings({}).effective() == expected


def test_design_minimums() -> None:
    # DESIGN.md §8's explicit lower bounds.
    assert ROWS["wal.segment_max_bytes"].minimum == 64 * KiB
    for key in ("wal.segment_age_secs", "wal.barrier_secs", "wal.housekeeping_secs"):
        assert ROWS[key].minimum == 1
    assert ROWS["wal.rotation_retry_attempts"].minimum == 1
    assert ROWS["wal.max_tenants"].maximum == 65_536
    assert ROWS["sink.flush_age_secs"].minimum == 1


# --- sources and precedence -------------------------------------------------------


@pytest.mark.parametrize("row", SETTINGS, ids=row_id)
def test_every_setting_loads_from_env(row: Setting, tmp_path: Path) -> None:
    sample = samples(tmp_path)[row.yaml_key]
    settings = load_settings(env_of({row.yaml_key: sample.text, **dict(sample.needs)}))
    assert settings.value(row) == sample.expected
    assert settings.value(row) != row.default


@pytest.mark.parametrize("row", SETTINGS, ids=row_id)
def test_every_setting_loads_from_yaml(row: Setting, tmp_path: Path) -> None:
    sample = samples(tmp_path)[row.yaml_key]
    doc = nested({row.yaml_key: sample.yaml_value, **dict(sample.needs)})
    settings = load_settings({}, write_yaml(tmp_path / "ourios.yaml", doc))
    assert settings.value(row) == sample.expected


def test_all_samples_together_from_yaml_and_env(tmp_path: Path) -> None:
    every = samples(tmp_path)
    from_yaml = load_settings(
        {}, write_yaml(tmp_path / "all.yaml", nested({k: s.yaml_value for k, s in every.items()}))
    )
    from_env = load_settings(env_of({k: s.text for k, s in every.items()}))
    assert from_yaml == from_env
    for key, sample in every.items():
        assert from_env.value(ROWS[key]) == sample.expected


@pytest.mark.parametrize(
    ("key", "in_file", "in_env", "expected"),
    [
        ("wal.barrier_secs", 30, "45", 45),
        ("wal.archive", True, "false", False),
        ("sink.parquet_compression", "gzip", "none", "none"),
        ("sink.flush_bytes", 2 * MiB, "1MiB", MiB),
        ("server.data_dir", "/from/file", "/from/env", Path("/from/env")),
        ("store.url", "s3://file-bucket/x", "s3://env-bucket/y", "s3://env-bucket/y"),
    ],
)
def test_env_overrides_yaml(
    key: str, in_file: object, in_env: str, expected: object, tmp_path: Path
) -> None:
    config = write_yaml(tmp_path / "ourios.yaml", nested({key: in_file}))
    assert load_settings(env_of({key: in_env}), config).value(ROWS[key]) == expected
    assert load_settings({}, config).value(ROWS[key]) != expected


def test_file_values_not_in_env_survive_an_override(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", {"wal": {"barrier_secs": 30, "housekeeping_secs": 7}})
    settings = load_settings({"OURIOS_WAL_BARRIER_SECS": "45"}, config)
    assert (settings.wal.barrier_secs, settings.wal.housekeeping_secs) == (45, 7)


def test_empty_yaml_file_and_empty_section_mean_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert load_settings({}, empty) == load_settings({})
    null_section = tmp_path / "null.yaml"
    null_section.write_text("wal:\n", encoding="utf-8")
    assert load_settings({}, null_section) == load_settings({})


def test_other_environment_variables_are_ignored() -> None:
    env = {"PATH": "/bin", "AWS_REGION": "us-east-1", "OURIOSX": "1", "ourios_wal_x": "1"}
    assert load_settings(env) == load_settings({})


# --- parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("65536", 64 * KiB),
        ("64KiB", 64 * KiB),
        ("64Ki", 64 * KiB),
        ("64 MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("2GiB", 2 * GiB),
        ("1TiB", 1024 * GiB),
    ],
)
def test_byte_settings_accept_binary_suffixes(text: str, expected: int) -> None:
    settings = load_settings({"OURIOS_WAL_UNRECLAIMED_BYTES_LIMIT": text})
    assert settings.wal.unreclaimed_bytes_limit == expected


@pytest.mark.parametrize(
    ("var", "text"),
    [
        ("OURIOS_WAL_SEGMENT_MAX_BYTES", "64MB"),
        ("OURIOS_WAL_SEGMENT_MAX_BYTES", "1.5GiB"),
        ("OURIOS_WAL_SEGMENT_MAX_BYTES", "64 M"),
        ("OURIOS_WAL_BARRIER_SECS", "5KiB"),
        ("OURIOS_WAL_BARRIER_SECS", "1.5"),
        ("OURIOS_WAL_BARRIER_SECS", "12abc"),
        ("OURIOS_WAL_BARRIER_SECS", "1_000"),
        ("OURIOS_WAL_BARRIER_SECS", ""),
        ("OURIOS_SERVER_HTTP_PORT", "0x10"),
    ],
)
def test_malformed_integers_are_refused(var: str, text: str) -> None:
    err = refused({var: text})
    assert var in str(err)
    assert repr(text.strip()) in str(err)
    assert "must be an integer" in str(err)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("Yes", True),
        ("false", False),
        ("0", False),
        ("no", False),
        (" false\n", False),
    ],
)
def test_booleans(text: str, expected: bool) -> None:
    assert load_settings({"OURIOS_WAL_ARCHIVE": text}).wal.archive is expected


@pytest.mark.parametrize("text", ["on", "off", "2", "maybe", "t"])
def test_malformed_booleans_are_refused(text: str) -> None:
    err = refused({"OURIOS_WAL_ARCHIVE": text})
    assert "OURIOS_WAL_ARCHIVE (wal.archive)" in str(err)
    assert "true, false, 1, 0, yes or no" in str(err)


@pytest.mark.parametrize(
    ("doc", "allowed"),
    [
        ({"wal": {"barrier_secs": True}}, "an integer"),
        ({"wal": {"barrier_secs": 1.5}}, "an integer"),
        ({"wal": {"barrier_secs": [1]}}, "an integer"),
        ({"wal": {"barrier_secs": None}}, "may not be empty"),
        ({"wal": {"archive": 2}}, "true, false"),
        ({"server": {"host": 127}}, "quote it in YAML"),
        ({"server": {"data_dir": ["a"]}}, "quote it in YAML"),
    ],
)
def test_yaml_values_of_the_wrong_type_are_refused(
    doc: object, allowed: str, tmp_path: Path
) -> None:
    err = refused(config_file=write_yaml(tmp_path / "c.yaml", doc))
    assert allowed in str(err)
    assert "from config file" in str(err)


def test_yaml_accepts_integer_strings_and_native_booleans(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", {"wal": {"segment_max_bytes": "1MiB", "archive": 1}})
    settings = load_settings({}, config)
    assert (settings.wal.segment_max_bytes, settings.wal.archive) == (MiB, True)


def test_choices_match_without_case_and_refuse_others() -> None:
    assert load_settings({"OURIOS_SINK_PARQUET_COMPRESSION": "ZSTD"}).sink.parquet_compression == (
        "zstd"
    )
    err = refused({"OURIOS_SINK_PARQUET_COMPRESSION": "lz4"})
    assert "OURIOS_SINK_PARQUET_COMPRESSION (sink.parquet_compression) = 'lz4'" in str(err)
    assert "one of zstd, snappy, gzip, none" in str(err)
    err = refused({"OURIOS_SERVER_LOG_LEVEL": "trace"})
    assert "one of debug, info, warning, error" in str(err)


def test_empty_optional_means_unset() -> None:
    settings = load_settings(
        {"OURIOS_STORE_REGION": "", "OURIOS_AUTH_TOKENS_FILE": " ", "OURIOS_STORE_URL": ""}
    )
    assert settings.store.region is None
    assert settings.auth.tokens_file is None
    assert settings == load_settings({})


@pytest.mark.parametrize("var", ["OURIOS_SERVER_HOST", "OURIOS_SERVER_DATA_DIR"])
def test_empty_required_string_is_refused(var: str) -> None:
    assert "may not be empty" in str(refused({var: ""}))


# --- ranges -----------------------------------------------------------------------


def out_of_range_cases() -> list[object]:
    cases: list[object] = []
    for row in INT_ROWS:
        if row.minimum is not None:
            cases.append(pytest.param(row, row.minimum - 1, id=f"{row.yaml_key}-below"))
        if row.maximum is not None:
            cases.append(pytest.param(row, row.maximum + 1, id=f"{row.yaml_key}-above"))
    return cases


@pytest.mark.parametrize(("row", "value"), out_of_range_cases())
def test_out_of_range_refused_from_env(row: Setting, value: int) -> None:
    message = str(refused({row.env_var: str(value)}))
    assert row.env_var in message
    assert row.yaml_key in message
    assert f"= {value} " in message
    assert "from the environment" in message
    for bound in (row.minimum, row.maximum):
        if bound is not None:
            assert str(bound) in message


@pytest.mark.parametrize(("row", "value"), out_of_range_cases())
def test_out_of_range_refused_from_yaml(row: Setting, value: int, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", nested({row.yaml_key: value}))
    message = str(refused(config_file=config))
    assert f"{row.env_var} ({row.yaml_key}) = {value} (from config file {config})" in message
    assert f"must be {row.allowed}" in message


@pytest.mark.parametrize("row", INT_ROWS, ids=row_id)
def test_bounds_themselves_are_accepted(row: Setting) -> None:
    # Nothing is clamped and nothing inside the range is refused (companions keep
    # the cross rules satisfied at the extremes).
    companions = {
        "disk.low_water_bytes": {"disk.stop_water_bytes": "0"},
        "sink.flush_bytes": {
            "sink.ceiling_bytes": str(ROWS["sink.flush_bytes"].maximum),
            "sink.max_object_bytes": str(ROWS["sink.flush_bytes"].maximum),
        },
        "sink.ceiling_bytes": {"sink.flush_bytes": str(KiB)},
        "sink.max_object_bytes": {"sink.flush_bytes": str(KiB)},
        "wal.max_unlinks_per_pass": {"wal.rotation_retry_attempts": "1", "wal.max_tenants": "1"},
        "wal.rotation_retry_attempts": {"wal.max_unlinks_per_pass": "1000"},
        "wal.max_tenants": {"wal.max_unlinks_per_pass": "1", "wal.rotation_retry_attempts": "1"},
        "server.http_port": {"server.grpc_port": "0"},
        "server.grpc_port": {"server.http_port": "0"},
        "server.max_inflight_bytes": {"wal.max_frame_bytes": "1KiB"},
        "server.max_expanded_bytes": {"wal.max_frame_bytes": "1KiB"},
        "wal.max_frame_bytes": {
            "server.max_inflight_bytes": "1GiB",
            "server.max_expanded_bytes": "1GiB",
        },
    }
    for bound in (row.minimum, row.maximum):
        if bound is None:
            continue
        if row.yaml_key == "disk.stop_water_bytes" and bound == row.maximum:
            continue  # must stay below low_water_bytes, whose maximum is the same
        env = env_of({row.yaml_key: str(bound), **companions.get(row.yaml_key, {})})
        assert load_settings(env).value(row) == bound


# --- cross rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "first", "second"),
    [
        pytest.param(
            {"disk.stop_water_bytes": "1GiB", "disk.low_water_bytes": "1GiB"},
            "disk.stop_water_bytes",
            "disk.low_water_bytes",
            id="stop_water_equal_low_water",
        ),
        pytest.param(
            {"disk.stop_water_bytes": "2GiB"},
            "disk.stop_water_bytes",
            "disk.low_water_bytes",
            id="stop_water_above_low_water",
        ),
        pytest.param(
            {"sink.flush_bytes": "512MiB"},
            "sink.flush_bytes",
            "sink.ceiling_bytes",
            id="flush_above_ceiling",
        ),
        pytest.param(
            {"sink.flush_bytes": "256MiB", "sink.max_object_bytes": "128MiB"},
            "sink.flush_bytes",
            "sink.max_object_bytes",
            id="flush_above_max_object",
        ),
        pytest.param(
            {"server.http_port": "5000", "server.grpc_port": "5000"},
            "server.http_port",
            "server.grpc_port",
            id="same_port",
        ),
        pytest.param(
            {"store.endpoint_url": "http://seaweed:8333"},
            "store.endpoint_url",
            "store.url",
            id="endpoint_without_s3",
        ),
        pytest.param(
            {"store.region": "eu-west-1", "store.url": "file:///srv/objects"},
            "store.region",
            "store.url",
            id="region_without_s3",
        ),
        pytest.param(
            {"server.max_inflight_bytes": "16MiB"},
            "server.max_inflight_bytes",
            "wal.max_frame_bytes",
            id="inflight_below_three_frames",
        ),
        pytest.param(
            {"server.max_expanded_bytes": "4MiB", "wal.max_frame_bytes": "8MiB"},
            "server.max_expanded_bytes",
            "wal.max_frame_bytes",
            id="expanded_below_a_frame",
        ),
    ],
)
def test_cross_rules_refuse(env: dict[str, str], first: str, second: str) -> None:
    err = refused(env_of(env))
    message = str(err)
    assert message.startswith("invalid settings: ")
    for key in (first, second):
        assert f"{ROWS[key].env_var} ({key})" in message
        assert f"{ROWS[key].env_var}=" in message
    assert err.keys == (first, second)


def test_every_cross_rule_is_exercised() -> None:
    assert {rule.keys for rule in CROSS_RULES} == {
        # test_clone_5_tls_settings_that_cannot_serve_are_refused_naming_them
        ("server.metrics_port", "server.http_port", "server.grpc_port"),
        ("server.tls_cert_file", "server.tls_key_file"),
        ("server.tls_client_ca_file", "server.tls_cert_file"),
        ("disk.stop_water_bytes", "disk.low_water_bytes"),
        ("sink.flush_bytes", "sink.ceiling_bytes"),
        ("sink.flush_bytes", "sink.max_object_bytes"),
        ("server.http_port", "server.grpc_port"),
        ("store.endpoint_url", "store.url"),
        ("store.region", "store.url"),
        ("server.max_inflight_bytes", "wal.max_frame_bytes"),
        ("server.max_expanded_bytes", "wal.max_frame_bytes"),
    }


def test_flush_equal_to_ceiling_and_both_ports_zero_are_allowed() -> None:
    settings = load_settings(
        env_of(
            {
                "sink.flush_bytes": "64MiB",
                "sink.ceiling_bytes": "64MiB",
                "server.http_port": "0",
                "server.grpc_port": "0",
            }
        )
    )
    assert settings.sink.flush_bytes == settings.sink.ceiling_bytes


def test_wal_unlinks_below_rotation_attempts_names_both_variables() -> None:
    message = str(
        refused({"OURIOS_WAL_MAX_UNLINKS_PER_PASS": "2", "OURIOS_WAL_ROTATION_RETRY_ATTEMPTS": "3"})
    )
    assert "OURIOS_WAL_MAX_UNLINKS_PER_PASS (wal.max_unlinks_per_pass) = 2" in message
    assert ">= OURIOS_WAL_ROTATION_RETRY_ATTEMPTS (3)" in message


def test_wal_reclaim_geometry_too_large_is_refused() -> None:
    message = str(
        refused({"OURIOS_WAL_MAX_TENANTS": "65536", "OURIOS_WAL_MAX_UNLINKS_PER_PASS": "4096"})
    )
    assert "OURIOS_WAL_MAX_UNLINKS_PER_PASS (wal.max_unlinks_per_pass) = 4096" in message
    assert "OURIOS_WAL_MAX_TENANTS=65536" in message


def test_validate_rechecks_a_replaced_settings_object() -> None:
    settings = load_settings({})
    settings.validate()
    broken = dataclasses.replace(settings, sink=dataclasses.replace(settings.sink, flush_bytes=0))
    with pytest.raises(ConfigError, match="OURIOS_SINK_FLUSH_BYTES"):
        broken.validate()
    swapped = dataclasses.replace(
        settings, disk=dataclasses.replace(settings.disk, stop_water_bytes=2 * GiB)
    )
    with pytest.raises(ConfigError, match="must be below"):
        swapped.validate()


def test_settings_are_frozen() -> None:
    settings = load_settings({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.sink.flush_bytes = 1  # type: ignore[misc]


# --- unknown keys and variables ------------------------------------------------------


def test_unknown_env_var_is_refused_with_a_suggestion() -> None:
    message = str(refused({"OURIOS_WAL_BARIER_SECS": "30"}))
    assert "unknown environment variable OURIOS_WAL_BARIER_SECS" in message
    assert "did you mean OURIOS_WAL_BARRIER_SECS?" in message


@pytest.mark.parametrize("name", ["OURIOS_", "OURIOS_FOO", "OURIOS_WAL", "OURIOS_PORT"])
def test_other_unknown_env_vars_are_refused(name: str) -> None:
    assert f"unknown environment variable {name}" in str(refused({name: "4318"}))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OURIOS_SERVICE_HOST", "10.0.0.7"),
        ("OURIOS_SERVICE_PORT", "4318"),
        ("OURIOS_SERVICE_PORT_OTLP_HTTP", "4318"),
        ("OURIOS_PORT", "tcp://10.0.0.7:4318"),
        ("OURIOS_PORT_4318_TCP", "tcp://10.0.0.7:4318"),
        ("OURIOS_PORT_4318_TCP_PROTO", "tcp"),
        ("OURIOS_PORT_4318_TCP_PORT", "4318"),
        ("OURIOS_PORT_4318_TCP_ADDR", "10.0.0.7"),
        ("OURIOS_HEADLESS_SERVICE_HOST", "10.0.0.8"),
        ("OURIOS_HEADLESS_PORT", "tcp://10.0.0.8:4317"),
        ("OURIOS_HEADLESS_PORT_4317_TCP_ADDR", "10.0.0.8"),
    ],
)
def test_kubernetes_service_link_variables_are_ignored(name: str, value: str) -> None:
    assert load_settings({name: value}) == load_settings({})


def test_unknown_yaml_key_is_refused(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", {"wal": {"barier_secs": 30}})
    err = refused(config_file=config)
    assert f"unknown key wal.barier_secs in config file {config}" in str(err)
    assert "did you mean wal.barrier_secs?" in str(err)
    assert err.keys == ("wal.barier_secs",)


def test_unknown_yaml_section_is_refused(tmp_path: Path) -> None:
    message = str(refused(config_file=write_yaml(tmp_path / "c.yaml", {"sinks": {"x": 1}})))
    assert "unknown section 'sinks'" in message
    assert "did you mean sink?" in message


def test_flat_dotted_keys_are_not_sections(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", {"wal.barrier_secs": 30})
    assert "unknown section 'wal.barrier_secs'" in str(refused(config_file=config))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", "must be a mapping of sections"),
        ("wal: 5\n", "section 'wal' in config file"),
        ("wal: [barrier_secs]\n", "must be a mapping of settings"),
        ("wal: {barrier_secs: [\n", "is not valid YAML"),
    ],
)
def test_malformed_config_file_is_refused(text: str, expected: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    assert expected in str(refused(config_file=config))


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert f"cannot read config file {missing}" in str(refused(config_file=missing))


# --- server ---------------------------------------------------------------------------


def test_data_dir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings({"OURIOS_SERVER_DATA_DIR": "state"})
    assert settings.server.data_dir == tmp_path / "state"
    assert settings.server.wal_dir == tmp_path / "state" / "wal"
    assert settings.server.snapshots_dir == tmp_path / "state" / "snapshots"
    assert settings.store.url == (tmp_path / "state" / "objects").as_uri()
    assert settings.store.local_root == tmp_path / "state" / "objects"


def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "data"
    a_file.write_text("", encoding="utf-8")
    message = str(refused({"OURIOS_SERVER_DATA_DIR": str(a_file)}))
    assert f"OURIOS_SERVER_DATA_DIR (server.data_dir) = {str(a_file)!r}" in message
    assert "it is a file" in message


def test_existing_data_dir_is_accepted(tmp_path: Path) -> None:
    assert load_settings({"OURIOS_SERVER_DATA_DIR": str(tmp_path)}).server.data_dir == tmp_path


@pytest.mark.parametrize(
    ("node_id", "ordinal"),
    [("ourios-2", 2), ("ourios-0", 0), ("ourios-east-17", 17), ("ourios", 0), ("node7", 0)],
)
def test_node_ordinal_is_derived_from_node_id(node_id: str, ordinal: int) -> None:
    settings = load_settings({"OURIOS_SERVER_NODE_ID": node_id})
    assert (settings.server.node_id, settings.server.node_ordinal) == (node_id, ordinal)


def test_explicit_node_ordinal_wins() -> None:
    env = {"OURIOS_SERVER_NODE_ID": "ourios-2", "OURIOS_SERVER_NODE_ORDINAL": "9"}
    assert load_settings(env).server.node_ordinal == 9


def test_derived_ordinal_out_of_range_says_to_set_it() -> None:
    message = str(refused({"OURIOS_SERVER_NODE_ID": "build-70000"}))
    assert "OURIOS_SERVER_NODE_ORDINAL (server.node_ordinal) = 70000" in message
    assert "derived from server.node_id 'build-70000'" in message


def test_node_id_defaults_to_the_host_name() -> None:
    assert load_settings({}).server.node_id == socket.gethostname()


@pytest.mark.parametrize("node_id", ["bad id", "-lead", "a/b", "é", "x" * 254])
def test_invalid_node_id_is_refused(node_id: str) -> None:
    assert "OURIOS_SERVER_NODE_ID (server.node_id)" in str(
        refused({"OURIOS_SERVER_NODE_ID": node_id})
    )


def test_host_with_whitespace_is_refused() -> None:
    assert "no whitespace" in str(refused({"OURIOS_SERVER_HOST": "0.0.0.0 ::"}))


# --- store ---------------------------------------------------------------------------


def test_s3_store_parts() -> None:
    store = load_settings({"OURIOS_STORE_URL": "s3://logs/ourios/prod/"}).store
    assert (store.scheme, store.bucket, store.prefix, store.local_root) == (
        "s3",
        "logs",
        "ourios/prod",
        None,
    )
    bare = load_settings({"OURIOS_STORE_URL": "s3://logs"}).store
    assert (bare.bucket, bare.prefix) == ("logs", "")


def test_file_store_parts() -> None:
    store = load_settings({"OURIOS_STORE_URL": "file:///srv/my%20objects"}).store
    assert (store.scheme, store.bucket, store.prefix) == ("file", None, "")
    assert store.local_root == Path("/srv/my objects")
    assert load_settings({"OURIOS_STORE_URL": "file://localhost/srv"}).store.local_root == Path(
        "/srv"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://logs/x", "unsupported scheme 'http'"),
        ("/srv/objects", "unsupported scheme ''"),
        ("file:relative/objects", "needs an absolute path"),
        ("file://host/srv", "names no host"),
        ("file:///srv?x=1", "no query or fragment"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://ab", "not a valid S3 bucket name"),
        ("s3://logs//x", "empty path component"),
        ("s3://key:secret@logs/x", "no credentials"),
    ],
)
def test_invalid_store_url_is_refused(url: str, problem: str) -> None:
    message = str(refused({"OURIOS_STORE_URL": url}))
    assert "OURIOS_STORE_URL (store.url)" in message
    assert "file:///absolute/path or s3://bucket[/prefix]" in message
    assert problem in message
    assert "secret" not in message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("seaweed:8333", "an http:// or https:// URL with a host"),
        ("ftp://seaweed", "an http:// or https:// URL with a host"),
        ("http://key:secret@seaweed:8333", "no credentials"),
        ("http://seaweed:port", "a valid port"),
        ("http://seaweed:8333/?x=1", "no query or fragment"),
    ],
)
def test_invalid_endpoint_url_is_refused(url: str, problem: str) -> None:
    message = str(refused({"OURIOS_STORE_URL": "s3://logs", "OURIOS_STORE_ENDPOINT_URL": url}))
    assert "OURIOS_STORE_ENDPOINT_URL (store.endpoint_url)" in message
    assert problem in message
    assert "secret" not in message


def test_invalid_region_is_refused() -> None:
    env = {"OURIOS_STORE_URL": "s3://logs", "OURIOS_STORE_REGION": "eu west"}
    assert "OURIOS_STORE_REGION (store.region) = 'eu west'" in str(refused(env))


# --- auth --------------------------------------------------------------------------


def test_tokens_file_loads(tmp_path: Path) -> None:
    tokens = write_yaml(
        tmp_path / "tokens.yaml", {"tok-a": ["acme", "globex"], "tok-b": ["initech"]}
    )
    auth = load_settings({"OURIOS_AUTH_TOKENS_FILE": str(tokens)}).auth
    assert auth.tokens_file == tokens
    assert not auth.open_mode
    assert auth.tokens == {"tok-a": frozenset({"acme", "globex"}), "tok-b": {"initech"}}


def test_open_mode_without_tokens_file() -> None:
    auth = load_settings({}).auth
    assert auth.open_mode
    assert auth.tokens == {}


SECRET = "s3cr3t-token-value"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(f"{SECRET}: [acme\n", "not valid YAML", id="not_yaml"),
        pytest.param(f"- {SECRET}\n", "non-empty mapping", id="a_list"),
        pytest.param("{}\n", "non-empty mapping", id="empty_mapping"),
        pytest.param("", "non-empty mapping", id="empty_file"),
        pytest.param('"": [acme]\n', "token of entry 1 must be a non-empty string", id="empty"),
        pytest.param("12345: [acme]\n", "token of entry 1 must be a non-empty string", id="int"),
        pytest.param(
            f"ok: [a]\n'{SECRET} x': [acme]\n", "token of entry 2 must be printable", id="space"
        ),
        pytest.param(f"{SECRET}: acme\n", "entry 1 must list at least one tenant", id="scalar"),
        pytest.param(f"{SECRET}: []\n", "entry 1 must list at least one tenant", id="no_tenant"),
        pytest.param(f"{SECRET}:\n", "entry 1 must list at least one tenant", id="null"),
        pytest.param(f"{SECRET}: ['a:b']\n", "tenant 'a:b'", id="colon"),
        pytest.param(f"{SECRET}: ['a/b']\n", "tenant 'a/b'", id="slash"),
        pytest.param(f"{SECRET}: ['a#b']\n", "tenant 'a#b'", id="hash"),
        pytest.param(f"{SECRET}: ['a b']\n", "tenant 'a b'", id="space_in_tenant"),
        pytest.param(f"{SECRET}: ['']\n", "tenant ''", id="empty_tenant"),
        pytest.param(f"{SECRET}: [{'x' * 129}]\n", "not 1-128", id="long_tenant"),
        pytest.param(f"{SECRET}: [7]\n", "tenant 7", id="int_tenant"),
    ],
)
def test_invalid_tokens_file_is_refused(text: str, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text, encoding="utf-8")
    message = str(refused({"OURIOS_AUTH_TOKENS_FILE": str(path)}))
    assert f"OURIOS_AUTH_TOKENS_FILE (auth.tokens_file) = {str(path)!r}" in message
    assert problem in message
    assert SECRET not in message


def test_missing_tokens_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "tokens.yaml"
    message = str(refused({"OURIOS_AUTH_TOKENS_FILE": str(missing)}))
    assert "OURIOS_AUTH_TOKENS_FILE (auth.tokens_file)" in message
    assert "cannot read it" in message


def test_load_tokens_directly(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "t.yaml", {"t": ["a", "a", "b"]})
    assert load_tokens(path) == {"t": frozenset({"a", "b"})}


# --- effective configuration ----------------------------------------------------------


def test_effective_is_keyed_by_env_var_and_json_ready(tmp_path: Path) -> None:
    every = samples(tmp_path)
    settings = load_settings(env_of({k: s.text for k, s in every.items()}))
    effective = settings.effective()
    assert list(effective) == [row.env_var for row in SETTINGS]
    assert json.loads(json.dumps(effective)) == effective
    assert effective["OURIOS_WAL_BARRIER_SECS"] == 30
    assert effective["OURIOS_SERVER_DATA_DIR"] == "/srv/ourios"
    assert effective["OURIOS_AUTH_TOKENS_FILE"] == every["auth.tokens_file"].text


def test_effective_json_is_one_config_effective_line() -> None:
    settings = load_settings({"OURIOS_WAL_BARRIER_SECS": "30"})
    line = settings.effective_json()
    assert "\n" not in line
    event = json.loads(line)
    assert event == {"event": "config.effective", "config": settings.effective()}


def test_tokens_never_reach_effective_or_repr(tmp_path: Path) -> None:
    tokens = write_yaml(tmp_path / "tokens.yaml", {SECRET: ["acme"]})
    settings = load_settings({"OURIOS_AUTH_TOKENS_FILE": str(tokens)})
    assert settings.auth.tokens == {SECRET: frozenset({"acme"})}
    for rendered in (settings.effective_json(), repr(settings), str(settings.auth)):
        assert SECRET not in rendered


# --- docs ----------------------------------------------------------------------------


def run_doc_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_doc.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def test_config_doc_is_up_to_date() -> None:
    result = run_doc_script("--check")
    assert result.returncode == 0, result.stderr


def test_config_doc_check_detects_staleness(tmp_path: Path) -> None:
    doc = tmp_path / "CONFIG.md"
    assert run_doc_script("--path", str(doc)).returncode == 0
    assert run_doc_script("--check", "--path", str(doc)).returncode == 0
    doc.write_text(doc.read_text(encoding="utf-8").replace("300", "301"), encoding="utf-8")
    stale = run_doc_script("--check", "--path", str(doc))
    assert stale.returncode == 1
    assert "out of date" in stale.stderr


def test_config_doc_lists_every_setting() -> None:
    text = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for row in SETTINGS:
        assert f"| `{row.env_var}` | `{row.yaml_key}` |" in text
    for section in SECTIONS:
        assert f"## `{section}`" in text


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        pytest.param("150000 100000\n", 2, id="quota_of_one_and_a_half_cpus"),
        pytest.param("100000 100000\n", 1, id="quota_of_one_cpu"),
        pytest.param("max 100000\n", None, id="no_quota"),
        pytest.param(None, None, id="no_cgroup_file"),
        pytest.param("garbage\n", None, id="unreadable"),
    ],
)
def test_available_cpus_follows_the_cgroup_quota_else_the_affinity_mask(
    tmp_path: Path, cpu_max: str | None, expected: int | None
) -> None:
    if cpu_max is not None:
        (tmp_path / "cpu.max").write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    want = affinity if expected is None else min(affinity, expected)
    assert available_cpus(tmp_path) == want
    assert default_workers() >= 1


# --- TLS and the metrics port (issue 24 item 5) ----------------------------------------


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param(
            {"OURIOS_SERVER_TLS_CERT_FILE": "/tls/tls.crt"},
            ("OURIOS_SERVER_TLS_CERT_FILE", "OURIOS_SERVER_TLS_KEY_FILE"),
            id="cert_without_key",
        ),
        pytest.param(
            {"OURIOS_SERVER_TLS_KEY_FILE": "/tls/tls.key"},
            ("OURIOS_SERVER_TLS_CERT_FILE", "OURIOS_SERVER_TLS_KEY_FILE"),
            id="key_without_cert",
        ),
        pytest.param(
            {"OURIOS_SERVER_TLS_CLIENT_CA_FILE": "/tls/ca.crt"},
            ("OURIOS_SERVER_TLS_CLIENT_CA_FILE", "OURIOS_SERVER_TLS_CERT_FILE"),
            id="client_ca_without_tls",
        ),
        pytest.param(
            {"OURIOS_SERVER_METRICS_PORT": "4318"},
            ("OURIOS_SERVER_METRICS_PORT", "OURIOS_SERVER_HTTP_PORT"),
            id="metrics_port_on_the_http_port",
        ),
    ],
)
def test_clone_5_tls_settings_that_cannot_serve_are_refused_naming_them(
    env: dict[str, str], named: tuple[str, ...]
) -> None:
    message = str(refused(env))
    for name in named:
        assert name in message, message
