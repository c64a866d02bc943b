"""TLS on both receivers, with the certificate reloaded from disk (DESIGN.md §7).

``server.tls_cert_file`` and ``server.tls_key_file`` turn TLS on for the OTLP/HTTP and
the OTLP/gRPC port (``server.tls_client_ca_file`` adds client-certificate verification);
``server.metrics_port`` is the plaintext way in for scrapes and probes.

``ServerTls`` owns one process's certificate. Before every TLS handshake (a new
connection) it takes a fingerprint of the two files — the path each resolves to through
its symlinks, its inode, size and modification time — and when it differs from the one
last loaded it reads both files again, checks the pair (a key that does not match the
certificate, a half-written file) and, only when it loads, serves it to this and every
later connection. Connections already open keep theirs. No thread and no timer: a Secret
that cert-manager renews is swapped by the kubelet with one symlink flip (``..data``),
which changes the resolved path of both files at once, and the next handshake sees it;
a few ``stat`` calls per handshake cost nothing beside its public-key operation. A pair
that does not load is reported once (``tls.reload_failed``) and the previous certificate
stays in service; the next change of the files is tried again. A good one is reported as
``tls.reloaded``.

The client CA bundle is read once, at start: verifying clients against a bundle that
changes under a running node is a decision an operator makes with a restart.

How each server takes a new certificate without a restart:

* uvicorn (``http_context``) is given one ``ssl.SSLContext`` for the life of its
  listening socket. Its ``sni_callback`` — which OpenSSL calls on every ClientHello, with
  or without a server name — sets the connection's context to the current one
  (``SSLObject.context``), which carries the current chain. A context is never modified
  once built: ``load_cert_chain`` on a context in use would leave it half-replaced when
  the key does not match, and would race handshakes running on another thread.
* grpcio (``grpc_credentials``) takes ``grpc.dynamic_ssl_server_credentials`` whose
  fetcher grpcio calls before each handshake; it returns the new configuration once per
  reload and None (no change) otherwise.

Encrypted private keys are refused at load (the node has no passphrase to give, and
OpenSSL would otherwise prompt on a terminal).
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from app.base.config import Settings

__all__ = ["ServerTls", "TlsError", "TlsFiles", "server_tls"]

#: What the files' settings are called in refusals and events.
CERT_SETTING: Final = "OURIOS_SERVER_TLS_CERT_FILE"
KEY_SETTING: Final = "OURIOS_SERVER_TLS_KEY_FILE"
CA_SETTING: Final = "OURIOS_SERVER_TLS_CLIENT_CA_FILE"

#: (event, fields, level); ``EventLog.emit``'s shape.
EventSink = Callable[[str, Mapping[str, object], str], None]
_Fingerprint = tuple[tuple[str, int, int, int], ...]


class TlsError(Exception):
    """The certificate, key or client CA could not be loaded; names the settings."""


@dataclass(frozen=True)
class TlsFiles:
    """The files TLS is served from."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    @classmethod
    def from_settings(
        cls, cert: Path | None, key: Path | None, client_ca: Path | None
    ) -> TlsFiles | None:
        """None when TLS is off (the settings' rules make cert and key come together)."""
        if cert is None or key is None:
            return None
        return cls(cert, key, client_ca)


def server_tls(settings: Settings, events: EventSink | None = None) -> ServerTls | None:
    """This process's ``ServerTls`` from the settings; None when TLS is off. Raises
    ``TlsError`` naming the setting when the files do not load."""
    server = settings.server
    files = TlsFiles.from_settings(
        server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file
    )
    return None if files is None else ServerTls(files, events)


def _no_passphrase() -> str:
    raise TlsError(f"the private key ({KEY_SETTING}) is encrypted; give it unencrypted")


def _memfile(data: bytes, name: str) -> int:
    # ssl loads a chain only from a path: an anonymous in-memory file makes the bytes
    # checked here the bytes served, whatever happens to the files meanwhile.
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def _context(cert: bytes, key: bytes, client_ca: bytes | None) -> ssl.SSLContext:
    """A server context serving (cert, key), verifying clients against client_ca."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    cert_fd, key_fd = _memfile(cert, "tls-cert"), _memfile(key, "tls-key")
    try:
        ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}", _no_passphrase)
    except ssl.SSLError as exc:
        raise TlsError(
            f"{CERT_SETTING} and {KEY_SETTING} do not load as a PEM certificate chain and "
            f"its private key: {exc.reason or exc}"
        ) from exc
    finally:
        os.close(cert_fd)
        os.close(key_fd)
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise TlsError(f"{CA_SETTING} does not load as PEM CA certificates: {exc}") from exc
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _fingerprint(paths: tuple[Path, ...]) -> _Fingerprint:
    out = []
    for path in paths:
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
        except OSError:
            out.append((str(path), -1, -1, -1))  # missing now: a change, tried (and refused)
            continue
        out.append((real, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ServerTls:
    """One process's certificate, reloaded when its files change (module docstring).

    Raises ``TlsError`` naming the setting when the files do not load at start."""

    def __init__(self, files: TlsFiles, events: EventSink | None = None) -> None:
        self.files = files
        self._events = events
        self._lock = threading.Lock()
        try:
            self._ca = files.client_ca.read_bytes() if files.client_ca is not None else None
        except OSError as exc:
            raise TlsError(f"cannot read {CA_SETTING} {files.client_ca}: {exc.strerror}") from exc
        self._seen = _fingerprint((files.cert, files.key))
        cert, key = self._read()
        self._ctx = _context(cert, key, self._ca)
        self._pair = (cert, key)
        #: bumped on every reload; the gRPC fetcher compares it with the one it served
        self.generation = 0

    @property
    def client_ca(self) -> bytes | None:
        return self._ca

    def _read(self) -> tuple[bytes, bytes]:
        try:
            cert = self.files.cert.read_bytes()
        except OSError as exc:
            raise TlsError(f"cannot read {CERT_SETTING} {self.files.cert}: {exc.strerror}") from exc
        try:
            key = self.files.key.read_bytes()
        except OSError as exc:
            raise TlsError(f"cannot read {KEY_SETTING} {self.files.key}: {exc.strerror}") from exc
        return cert, key

    def current(self) -> tuple[ssl.SSLContext, bytes, bytes, int]:
        """The context, PEM pair and generation to serve a new connection with, after
        reloading the files if they changed since the last look."""
        with self._lock:
            seen = _fingerprint((self.files.cert, self.files.key))
            if seen != self._seen:
                # Recorded before reading: a change during the read is seen next time.
                self._seen = seen
                self._reload()
            return self._ctx, self._pair[0], self._pair[1], self.generation

    def _reload(self) -> None:
        fields: dict[str, object] = {
            "cert_file": str(self.files.cert),
            "key_file": str(self.files.key),
        }
        try:
            cert, key = self._read()
            ctx = _context(cert, key, self._ca)
        except (TlsError, OSError) as exc:
            self._emit(
                "tls.reload_failed",
                {**fields, "error": str(exc), "action": "the previous certificate is still served"},
                "warning",
            )
            return
        self._ctx, self._pair = ctx, (cert, key)
        self.generation += 1
        self._emit("tls.reloaded", {**fields, "generation": self.generation}, "info")

    def _emit(self, event: str, fields: Mapping[str, object], level: str) -> None:
        if self._events is not None:
            self._events(event, fields, level)

    # -- the servers' ends -----------------------------------------------------------

    def http_context(self) -> ssl.SSLContext:
        """The context uvicorn listens with: each handshake is switched to the current
        context by the SNI callback (module docstring)."""
        base = _context(*self._pair, self._ca)

        def switch(conn: Any, server_name: str | None, _: ssl.SSLContext) -> None:
            conn.context = self.current()[0]

        base.sni_callback = switch
        return base

    def grpc_credentials(self) -> Any:
        """grpcio's server credentials, fetching the current pair before each handshake."""
        import grpc

        def config(cert: bytes, key: bytes) -> Any:
            return grpc.ssl_server_certificate_configuration(
                [(key, cert)], root_certificates=self._ca
            )

        _, cert, key, generation = self.current()
        served = [generation]

        def fetch() -> Any:
            _, cert, key, generation = self.current()
            if generation == served[0]:
                return None
            served[0] = generation
            return config(cert, key)

        return grpc.dynamic_ssl_server_credentials(
            config(cert, key), fetch, require_client_authentication=self._ca is not None
        )
