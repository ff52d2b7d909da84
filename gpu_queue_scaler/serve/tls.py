"""TLS and mTLS for the gRPC port, with certificate files reloaded on change (no restart).

KEDA's external-scaler client (pkg/scalers/external_scaler.go) dials TLS when the trigger sets
`enableTLS: "true"` or its TriggerAuthentication sets `caCert` or `tlsClientCert`/`tlsClientKey`:
it verifies the server's certificate against `caCert` (else the operator's system CAs; not at all
with `unsafeSsl: "true"`) for the host in `scalerAddress`, and presents the client certificate
when one is set. Here: `--tls-cert`/`--tls-key` serve TLS, and `--tls-client-ca` also requires
every client to present a certificate signed by that CA (mTLS).

Reload: gRPC calls `CertificateReloader` before every new connection's handshake. At most every
`check_interval_s` it reads the files and compares a SHA-256 of their content (not mtimes:
cert-manager's Secret volume changes by an atomic symlink swap, and a copy may keep the mtime).
New content is checked before use (the certificate parses, the key matches it, the CA parses); a
bad set (half-written, mismatched key, wrong file) is logged once, naming the file but never its
content, and the last good certificates keep serving. Open connections keep the certificate they
were set up with; new ones get the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0


class TlsError(ValueError):
    """A certificate, key or CA file is unusable. The message names the file, never its content."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate chain and key, and optionally the client CA (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def paths(self) -> list[Path]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca is not None else [])


@dataclass(frozen=True)
class _Loaded:
    cert: bytes
    key: bytes
    client_ca: bytes | None
    digest: str

    def fingerprint(self) -> str:
        """SHA-256 of the leaf certificate (public; compare with `openssl x509 -fingerprint`)."""
        first = self.cert.decode("ascii", "replace")
        end = "-----END CERTIFICATE-----"
        der = ssl.PEM_cert_to_DER_cert(first[: first.index(end) + len(end)])
        return hashlib.sha256(der).hexdigest()


def _read(files: TlsFiles) -> _Loaded:
    contents: list[bytes] = []
    for path in files.paths():
        try:
            contents.append(path.read_bytes())
        except OSError as exc:
            raise TlsError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    digest = hashlib.sha256()
    for content in contents:
        digest.update(len(content).to_bytes(8, "big"))
        digest.update(content)
    return _Loaded(
        cert=contents[0],
        key=contents[1],
        client_ca=contents[2] if files.client_ca is not None else None,
        digest=digest.hexdigest(),
    )


@contextlib.contextmanager
def _in_memory_file(data: bytes) -> Iterator[str]:
    """A path to `data` for OpenSSL's file-only loaders: an anonymous in-memory file on Linux
    (key material never touches a disk), else a private temporary file removed at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("scaler-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    handle, name = tempfile.mkstemp(prefix="scaler-tls-")
    try:
        os.write(handle, data)
        os.close(handle)
        yield name
    finally:
        os.unlink(name)


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason code (e.g. KEY_VALUES_MISMATCH): never any file content."""
    return str(exc.reason or exc.library or "invalid")


def _has_pem_block(data: bytes, label: bytes) -> bool:
    return b"-----BEGIN " in data and label in data and b"-----END " in data


def _check(files: TlsFiles, loaded: _Loaded) -> None:
    """Raise TlsError naming the bad file unless the set is usable: the chain parses, the key
    parses and belongs to the leaf certificate, the client CA parses."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if not _has_pem_block(loaded.cert, b"CERTIFICATE"):
        raise TlsError(f"{files.cert}: no PEM certificate")
    try:  # each certificate of the chain parses
        context.load_verify_locations(cadata=loaded.cert.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        why = _reason(exc) if isinstance(exc, ssl.SSLError) else "not PEM text"
        raise TlsError(f"{files.cert}: not a valid PEM certificate chain ({why})") from None
    if not _has_pem_block(loaded.key, b"PRIVATE KEY"):
        raise TlsError(f"{files.key}: no PEM private key")
    with _in_memory_file(loaded.cert) as cert, _in_memory_file(loaded.key) as key:
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            if "MISMATCH" in _reason(exc):
                raise TlsError(
                    f"{files.key} does not match the certificate in {files.cert}"
                ) from None
            raise TlsError(f"{files.key}: not a usable private key ({_reason(exc)})") from None
    if files.client_ca is not None and loaded.client_ca is not None:
        if not _has_pem_block(loaded.client_ca, b"CERTIFICATE"):
            raise TlsError(f"{files.client_ca}: no PEM CA certificate")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(
                cadata=loaded.client_ca.decode("ascii")
            )
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
            why = _reason(exc) if isinstance(exc, ssl.SSLError) else "not PEM text"
            raise TlsError(f"{files.client_ca}: not a valid PEM CA certificate ({why})") from None


def _configuration(loaded: _Loaded) -> Any:
    return grpc.ssl_server_certificate_configuration(
        [(loaded.key, loaded.cert)], root_certificates=loaded.client_ca
    )


class CertificateReloader:
    """The certificate-configuration fetcher for `grpc.dynamic_ssl_server_credentials`.

    Construction loads and checks the files (TlsError if unusable: a startup error). Calling it
    returns a new configuration when the files' content changed to a usable set, else None (gRPC
    keeps the current one). gRPC calls it from its own threads, before each new handshake.
    """

    def __init__(self, files: TlsFiles, check_interval_s: float | None = None) -> None:
        self.files = files
        self.check_interval_s = CHECK_INTERVAL_S if check_interval_s is None else check_interval_s
        self._lock = threading.Lock()
        loaded = _read(files)
        _check(files, loaded)
        self._current = loaded
        self._seen = loaded.digest  # the content last looked at, good or bad
        self._last_error = ""
        self._next_check = time.monotonic() + self.check_interval_s
        self.reloads = 0
        self.rejected = 0
        self.initial = _configuration(loaded)

    @property
    def fingerprint(self) -> str:
        return self._current.fingerprint()

    def credentials(self) -> Any:
        return grpc.dynamic_ssl_server_credentials(
            self.initial, self, require_client_authentication=self.files.mutual
        )

    def __call__(self) -> Any:
        try:
            return self._poll()
        except Exception:  # never let a surprise end the handshake path; keep serving
            log.exception("TLS certificate check failed", extra={"event": "tls_reload_error"})
            return None

    def _poll(self) -> Any:
        now = time.monotonic()
        with self._lock:
            if now < self._next_check:
                return None
            self._next_check = now + self.check_interval_s
            try:
                loaded = self._read_changed()
            except TlsError as exc:
                return self._reject(str(exc))
            if loaded is None:
                if self._seen == self._current.digest:
                    self._last_error = ""  # back to the serving set: a new fault is news again
                return None
            self._current = loaded
            self._last_error = ""
            self.reloads += 1
            log.info(
                "TLS certificates reloaded from %s",
                ", ".join(str(p) for p in self.files.paths()),
                extra={"event": "tls_reloaded", "cert_sha256": loaded.fingerprint()},
            )
            return _configuration(loaded)

    def _read_changed(self) -> _Loaded | None:
        """The files' content if it changed since last looked at and is usable; None if
        unchanged; TlsError if changed and unusable."""
        loaded = _read(self.files)
        if loaded.digest == self._seen:
            return None
        self._seen = loaded.digest
        try:
            _check(self.files, loaded)
        except TlsError:
            # Read mid-swap (the certificate of one version, the key of the next)? Read once
            # more: only a set that stays bad is an error.
            again = _read(self.files)
            if again.digest == loaded.digest:
                raise
            self._seen = again.digest
            _check(self.files, again)
            return again
        return loaded

    def _reject(self, why: str) -> None:
        """Log a rejected set once (not on every handshake while it stays bad); keep serving."""
        self.rejected += 1
        if why != self._last_error:
            self._last_error = why
            log.error(
                "keeping the previous TLS certificates: %s",
                why,
                extra={"event": "tls_reload_rejected", "cert_sha256": self._current.fingerprint()},
            )
        return None
