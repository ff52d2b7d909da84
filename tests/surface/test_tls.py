"""TLS and mTLS on the gRPC port, as KEDA's external-scaler client uses them, over real gRPC on
loopback; certificate rotation without restart; plaintext only on request; no key material in
logs. Throwaway CAs and certificates are made with the `openssl` CLI (`cryptography` is not a
dependency)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpu_queue_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from gpu_queue_scaler.serve import tls as tls_module
from gpu_queue_scaler.serve.server import ScalerServer
from gpu_queue_scaler.serve.tls import CertificateReloader, TlsError, TlsFiles
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.reload import ConfigStore
from tests.conftest import FAST, ref, synthetic
from tests.serve_process import ServeProcess
from tests.tools import require

# --- a throwaway PKI --------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(
        [require("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60
    )


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()

    def fingerprint(self) -> str:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert.read_text())).hexdigest()


def _ca(directory: Path, name: str) -> Pair:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return Pair(directory / f"{name}.crt", directory / f"{name}.key")


def _leaf(directory: Path, ca: Pair, name: str, usage: str) -> Pair:
    """A certificate for 127.0.0.1/localhost (server) or a client, signed by `ca`."""
    (directory / f"{name}.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={usage}\n"
        + ("subjectAltName=DNS:localhost,IP:127.0.0.1\n" if usage == "serverAuth" else "")
    )
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip
    return Pair(directory / f"{name}.crt", directory / f"{name}.key")


@dataclass(frozen=True)
class Pki:
    ca: Pair
    other_ca: Pair
    server: Pair
    server_next: Pair  # the same CA's next certificate, as cert-manager renews it
    server_other: Pair  # from other_ca
    client: Pair
    client_other: Pair  # from other_ca: must be refused

    def secrets(self) -> list[bytes]:
        """Every private key, and the base64 body lines of each (what a leak would show)."""
        out: list[bytes] = []
        for pair in (self.ca, self.other_ca, self.server, self.server_next, self.server_other):
            pem = pair.key_pem()
            out.append(pem)
            out += [line for line in pem.splitlines() if line and not line.startswith(b"-----")]
        for pair in (self.client, self.client_other):
            out.append(pair.key_pem())
        return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = _ca(d, "ca"), _ca(d, "other-ca")
    return Pki(
        ca=ca,
        other_ca=other,
        server=_leaf(d, ca, "server", "serverAuth"),
        server_next=_leaf(d, ca, "server-next", "serverAuth"),
        server_other=_leaf(d, other, "server-other", "serverAuth"),
        client=_leaf(d, ca, "keda", "clientAuth"),
        client_other=_leaf(d, other, "intruder", "clientAuth"),
    )


class SecretVolume:
    """A directory laid out as the kubelet mounts a Secret: `tls.crt -> ..data/tls.crt`, with
    `..data` a symlink to a timestamped directory, swapped atomically on every update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir(parents=True, exist_ok=True)

    def publish(self, files: dict[str, bytes]) -> None:
        self.version += 1
        target = self.root / f"..2026_01_01_00_00_{self.version:02d}.{os.getpid()}"
        target.mkdir()
        for name, content in files.items():
            (target / name).write_bytes(content)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(target.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    def publish_pair(self, pair: Pair, ca: Pair) -> None:
        self.publish(
            {"tls.crt": pair.cert_pem(), "tls.key": pair.key_pem(), "ca.crt": ca.cert_pem()}
        )

    def files(self, mutual: bool) -> TlsFiles:
        return TlsFiles(
            self.root / "tls.crt", self.root / "tls.key", self.root / "ca.crt" if mutual else None
        )


# --- clients, as KEDA dials -------------------------------------------------------------------

OPTIONS = [("grpc.use_local_subchannel_pool", 1)]  # a new connection for every channel


def _credentials(ca: Pair, client: Pair | None = None) -> grpc.ChannelCredentials:
    """KEDA's TriggerAuthentication: caCert, and tlsClientCert/tlsClientKey when set."""
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem(),
        private_key=client.key_pem() if client else None,
        certificate_chain=client.cert_pem() if client else None,
    )


async def _call(port: int, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """One GetMetricSpec on a new connection: OK, or the status code of the failure."""
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.aio.insecure_channel(target, options=OPTIONS)
        if credentials is None
        else grpc.aio.secure_channel(target, credentials, options=OPTIONS)
    )
    try:
        await pb_grpc.ExternalScalerStub(channel).GetMetricSpec(ref("tls", synthetic()), timeout=5)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


async def _eventually_ok(port: int, credentials: grpc.ChannelCredentials) -> None:
    deadline = time.monotonic() + 30  # a bound on the wait for the reload, not a claim
    while (code := await _call(port, credentials)) != grpc.StatusCode.OK:
        assert time.monotonic() < deadline, code
        await asyncio.sleep(0.2)


@pytest.fixture
async def tls_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[object]:
    monkeypatch.setattr(tls_module, "CHECK_INTERVAL_S", 0.2)
    servers: list[ScalerServer] = []

    async def start(files: TlsFiles, **kwargs: object) -> ScalerServer:
        server = ScalerServer(
            ConfigStore(Config(server=FAST)), "127.0.0.1:0", tls=files, grace_s=1.0, **kwargs
        )
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


# --- TLS and mTLS -----------------------------------------------------------------------------


async def test_tls_serves_a_client_that_trusts_the_ca_and_nobody_else(pki, tls_server, tmp_path):
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    server = await tls_server(volume.files(mutual=False))
    assert server.transport == "tls"
    assert await _call(server.port, _credentials(pki.ca)) == grpc.StatusCode.OK
    # KEDA's enableTLS without caCert would use system CAs: a private CA is then not trusted.
    assert await _call(server.port, _credentials(pki.other_ca)) == grpc.StatusCode.UNAVAILABLE
    assert await _call(server.port, None) == grpc.StatusCode.UNAVAILABLE  # plaintext client


async def test_mtls_accepts_only_a_client_certificate_from_the_client_ca(pki, tls_server, tmp_path):
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    server = await tls_server(volume.files(mutual=True), health_address="127.0.0.1:0")
    assert server.transport == "mtls"
    assert await _call(server.port, _credentials(pki.ca, pki.client)) == grpc.StatusCode.OK
    assert await _call(server.port, _credentials(pki.ca)) == grpc.StatusCode.UNAVAILABLE
    refused = await _call(server.port, _credentials(pki.ca, pki.client_other))
    assert refused == grpc.StatusCode.UNAVAILABLE
    assert await _call(server.port, None) == grpc.StatusCode.UNAVAILABLE

    # The plaintext health port (Kubernetes' gRPC probes cannot do TLS) serves health only.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="externalscaler.ExternalScaler"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert await _call(server.health_port, None) == grpc.StatusCode.UNIMPLEMENTED


async def test_rotated_certificates_reach_new_connections_without_restart(
    pki, tls_server, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.serve.tls")
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    server = await tls_server(volume.files(mutual=True))
    keda = _credentials(pki.ca, pki.client)
    assert await _call(server.port, keda) == grpc.StatusCode.OK

    # cert-manager renews from the same CA: new connections present the new certificate.
    volume.publish_pair(pki.server_next, pki.ca)
    deadline = time.monotonic() + 30  # a bound on the wait for the reload, not a claim
    while server.tls_reloader is not None and server.tls_reloader.reloads < 1:
        assert await _call(server.port, keda) == grpc.StatusCode.OK  # no failed call meanwhile
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert server.tls_reloader.fingerprint == pki.server_next.fingerprint()
    assert await _call(server.port, keda) == grpc.StatusCode.OK
    [reloaded] = [r for r in caplog.records if getattr(r, "event", "") == "tls_reloaded"]
    assert reloaded.cert_sha256 == pki.server_next.fingerprint()  # type: ignore[attr-defined]

    # A certificate from another CA (and that CA for clients): clients that trust only the old
    # CA are refused on new connections, clients of the new one accepted, all without restart.
    volume.publish_pair(pki.server_other, pki.other_ca)
    await _eventually_ok(server.port, _credentials(pki.other_ca, pki.client_other))
    assert await _call(server.port, keda) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    "breakage",
    ["mismatched-key", "truncated-cert", "key-missing", "garbage-ca"],
)
async def test_a_broken_replacement_keeps_serving_the_last_good_certificates(
    pki, tls_server, tmp_path, caplog, breakage
):
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.serve.tls")
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    server = await tls_server(volume.files(mutual=True))
    keda = _credentials(pki.ca, pki.client)
    good = {"tls.crt": pki.server_next.cert_pem(), "tls.key": pki.server_next.key_pem()}
    broken, named = {
        "mismatched-key": ({**good, "tls.key": pki.server.key_pem()}, "tls.key"),
        "truncated-cert": ({**good, "tls.crt": good["tls.crt"][:150]}, "tls.crt"),
        "key-missing": ({"tls.crt": good["tls.crt"], "tls.key": b""}, "tls.key"),
        "garbage-ca": ({**good, "ca.crt": b"-----BEGIN CERTIFICATE-----\nAAAA\n"}, "ca.crt"),
    }[breakage]
    volume.publish({"ca.crt": pki.ca.cert_pem(), **broken})

    deadline = time.monotonic() + 30  # a bound on the wait for the reload, not a claim
    assert server.tls_reloader is not None
    while server.tls_reloader.rejected < 1:
        assert time.monotonic() < deadline
        assert await _call(server.port, keda) == grpc.StatusCode.OK
        await asyncio.sleep(0.1)
    for _ in range(3):  # still the old certificate, and the error was logged once
        assert await _call(server.port, keda) == grpc.StatusCode.OK
        await asyncio.sleep(0.25)
    assert server.tls_reloader.fingerprint == pki.server.fingerprint()
    errors = [r for r in caplog.records if getattr(r, "event", "") == "tls_reload_rejected"]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert str(volume.root / named) in message, message
    for secret in [*pki.secrets(), pki.server_next.cert_pem(), pki.server.cert_pem()]:
        assert secret.decode() not in caplog.text

    # Fixed: the next good set is picked up.
    volume.publish({"ca.crt": pki.ca.cert_pem(), **good})
    while server.tls_reloader.fingerprint != pki.server_next.fingerprint():
        assert time.monotonic() < deadline
        assert await _call(server.port, keda) == grpc.StatusCode.OK
        await asyncio.sleep(0.1)


def test_unusable_files_at_start_name_the_file_and_never_its_content(pki, tmp_path):
    with pytest.raises(TlsError, match="does not match") as info:
        CertificateReloader(TlsFiles(pki.server.cert, pki.server_next.key))
    assert str(pki.server_next.key) in str(info.value)
    with pytest.raises(TlsError, match="cannot read") as info:
        CertificateReloader(TlsFiles(pki.server.cert, tmp_path / "absent.key"))
    assert "absent.key" in str(info.value)
    bad = tmp_path / "bad.crt"
    bad.write_bytes(pki.server.key_pem())  # the key where the certificate belongs
    with pytest.raises(TlsError, match="no PEM certificate") as info:
        CertificateReloader(TlsFiles(bad, pki.server.key))
    for secret in pki.secrets():
        assert secret.decode() not in str(info.value)


def test_a_read_straddling_a_swap_is_not_an_error(pki, tmp_path, caplog):
    """Certificate of one version and key of the next (read across a swap): read again, no
    error logged when the second read is consistent."""
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    reloader = CertificateReloader(volume.files(mutual=False), check_interval_s=0)
    real_read = tls_module._read
    calls = 0

    def straddling(files: TlsFiles) -> object:
        nonlocal calls
        calls += 1
        loaded = real_read(files)
        if calls == 1:  # the old certificate with the new key
            volume.publish_pair(pki.server_next, pki.ca)
            return tls_module._Loaded(
                pki.server.cert_pem(), pki.server_next.key_pem(), None, "mixed"
            )
        return loaded

    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.serve.tls")
    tls_module._read = straddling  # type: ignore[assignment]
    try:
        assert reloader() is not None
    finally:
        tls_module._read = real_read
    assert reloader.fingerprint == pki.server_next.fingerprint()
    assert reloader.rejected == 0
    assert "tls_reload_rejected" not in {getattr(r, "event", "") for r in caplog.records}


# --- the CLI: plaintext only on request, and what reaches the logs ----------------------------


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_queue_scaler", "serve", "--address", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_serve_refuses_to_start_without_tls_or_an_explicit_plaintext_flag(pki, tmp_path):
    refused = _serve("--metrics-address", "off")
    assert refused.returncode == 2
    assert "--tls-cert" in refused.stderr
    assert "--insecure-plaintext" in refused.stderr

    both = _serve("--insecure-plaintext", "--tls-cert", str(pki.server.cert))
    assert both.returncode == 2
    assert "contradicts" in both.stderr

    mismatched = _serve(
        "--metrics-address", "off",
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server_next.key),
    )  # fmt: skip
    assert mismatched.returncode == 2
    assert str(pki.server_next.key) in mismatched.stderr
    output = mismatched.stdout + mismatched.stderr
    for secret in pki.secrets():
        assert secret.decode() not in output


@pytest.mark.slow
def test_insecure_plaintext_warns_that_the_port_is_unauthenticated() -> None:
    server = ServeProcess("--metrics-address", "off")
    try:
        [warning] = [e for e in server.lines() if e.get("event") == "insecure_plaintext"]
        assert warning["level"] == "warning"
        assert "unauthenticated" in str(warning["msg"])
        [serving] = [e for e in server.lines() if e.get("event") == "serving"]
        assert serving["transport"] == "plaintext"
    finally:
        assert server.stop() == 0


@pytest.mark.slow
async def test_serve_with_mtls_end_to_end_and_no_key_material_in_its_logs(pki, tmp_path):
    volume = SecretVolume(tmp_path / "certs")
    volume.publish_pair(pki.server, pki.ca)
    files = volume.files(mutual=True)
    server = ServeProcess(
        "--metrics-address", "off", "--log-level", "debug",
        "--tls-cert", str(files.cert), "--tls-key", str(files.key),
        "--tls-client-ca", str(files.client_ca),
        "--health-address", "127.0.0.1:0",
        plaintext=False,
    )  # fmt: skip
    try:
        [serving] = [e for e in server.lines() if e.get("event") == "serving"]
        assert serving["transport"] == "mtls"
        assert serving["cert_sha256"] == pki.server.fingerprint()
        assert await _call(server.port, _credentials(pki.ca, pki.client)) == grpc.StatusCode.OK
        refused = await _call(server.port, _credentials(pki.ca, pki.client_other))
        assert refused == grpc.StatusCode.UNAVAILABLE
        assert await _call(server.port, _credentials(pki.ca)) == grpc.StatusCode.UNAVAILABLE

        # A broken rotation (wrong key), then a good one: both logged, neither with content.
        volume.publish(
            {"tls.crt": pki.server_next.cert_pem(), "tls.key": pki.server.key_pem(),
             "ca.crt": pki.ca.cert_pem()}
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not any(e.get("event") == "tls_reload_rejected" for e in server.lines()):
            assert time.monotonic() < deadline, server.log_path.read_text()[-2000:]
            assert await _call(server.port, _credentials(pki.ca, pki.client)) == (
                grpc.StatusCode.OK
            )
            await asyncio.sleep(0.3)
        volume.publish_pair(pki.server_next, pki.ca)
        while not any(e.get("event") == "tls_reloaded" for e in server.lines()):
            assert time.monotonic() < deadline, server.log_path.read_text()[-2000:]
            assert await _call(server.port, _credentials(pki.ca, pki.client)) == (
                grpc.StatusCode.OK
            )
            await asyncio.sleep(0.3)
    finally:
        assert server.stop() == 0
    text = server.log_path.read_text()
    assert "PRIVATE KEY" not in text
    assert "BEGIN CERTIFICATE" not in text
    for secret in pki.secrets():
        assert secret.decode() not in text
    # Nor any long-enough piece of a key's DER, however encoded.
    for pair in (pki.server, pki.server_next, pki.client):
        der = ssl.PEM_cert_to_DER_cert(
            pair.key_pem().decode().replace("PRIVATE KEY", "CERTIFICATE")
        )
        assert base64.b64encode(der[-32:]).decode()[:24] not in text
        assert der[-32:].hex() not in text
