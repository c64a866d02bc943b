"""``app.receive.tls.ServerTls``: the certificate reloaded when a mounted Secret's files
are swapped (the kubelet's symlink flip), a pair that does not load refused without
dropping the one in service, and start-up refusals naming the setting."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from app.receive.tls import ServerTls, TlsError, TlsFiles
from tests.support.tlscerts import Authority, Pair, SecretVolume

Events = list[tuple[str, dict[str, object], str]]


def _node(tmp_path: Path, pair: Pair) -> tuple[ServerTls, SecretVolume, Events]:
    volume = SecretVolume(tmp_path / "tls", {"tls.crt": pair.cert, "tls.key": pair.key})
    events: Events = []

    def sink(name: str, fields: Mapping[str, object], level: str) -> None:
        events.append((name, dict(fields), level))

    tls = ServerTls(TlsFiles(volume.path("tls.crt"), volume.path("tls.key")), sink)
    return tls, volume, events


def test_clone_5_a_flipped_secret_is_served_from_the_next_handshake(tmp_path: Path) -> None:
    ca = Authority("unit-ca")
    first, second = ca.issue("one"), ca.issue("two")
    tls, volume, events = _node(tmp_path, first)
    assert tls.current()[1:] == (first.cert, first.key, 0)
    volume.update({"tls.crt": second.cert, "tls.key": second.key})
    ctx, cert, key, generation = tls.current()
    assert (cert, key, generation) == (second.cert, second.key, 1)
    assert tls.current()[0] is ctx  # unchanged files: the same context, no reload
    assert [name for name, _, _ in events] == ["tls.reloaded"]


def test_clone_5_a_pair_that_does_not_load_keeps_the_certificate_in_service(
    tmp_path: Path,
) -> None:
    ca = Authority("unit-ca")
    first, second = ca.issue("one"), ca.issue("two")
    tls, volume, events = _node(tmp_path, first)
    volume.update({"tls.crt": second.cert, "tls.key": first.key})  # key of another cert
    assert tls.current()[1:] == (first.cert, first.key, 0)
    assert tls.current()[1:] == (first.cert, first.key, 0)
    ((name, fields, level),) = events  # reported once, not per handshake
    assert (name, level) == ("tls.reload_failed", "warning")
    assert "OURIOS_SERVER_TLS_CERT_FILE" in str(fields["error"])
    volume.update({"tls.crt": second.cert, "tls.key": second.key})
    assert tls.current()[1:] == (second.cert, second.key, 1)


@pytest.mark.parametrize(
    ("cert", "key", "named"),
    [
        pytest.param(b"not pem", None, "OURIOS_SERVER_TLS_CERT_FILE", id="garbage_cert"),
        pytest.param(None, b"", "OURIOS_SERVER_TLS_KEY_FILE", id="empty_key"),
    ],
)
def test_clone_5_files_that_do_not_load_refuse_the_start_naming_the_setting(
    tmp_path: Path, cert: bytes | None, key: bytes | None, named: str
) -> None:
    pair = Authority("unit-ca").issue("one")
    (tmp_path / "c").write_bytes(pair.cert if cert is None else cert)
    (tmp_path / "k").write_bytes(pair.key if key is None else key)
    with pytest.raises(TlsError, match=named):
        ServerTls(TlsFiles(tmp_path / "c", tmp_path / "k"))
    with pytest.raises(TlsError, match="OURIOS_SERVER_TLS_KEY_FILE"):
        ServerTls(TlsFiles(tmp_path / "c", tmp_path / "missing"))
