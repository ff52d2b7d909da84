"""A port already in use stops `scaler serve` with a clear error instead of sharing the port.

gRPC sets SO_REUSEPORT by default, so a second server on a port in use used to bind too, log
`serving`, and get half of the connections. Real servers on loopback ports, in process and as
`scaler serve` processes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_queue_scaler.serve.server import ScalerServer
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler_bench.emulators.keda import KedaLikeClient
from tests.conftest import FAST, ServerFactory, ref, synthetic
from tests.serve_process import ServeProcess
from tests.servers.ports import free_port


def _server(address: str, **kwargs: str) -> ScalerServer:
    return ScalerServer(ConfigStore(Config(server=FAST)), address, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["address", "health_address"])
async def test_a_grpc_port_in_use_fails_the_second_server(
    start_server: ServerFactory, which: str
) -> None:
    first, client = await start_server(health_address="127.0.0.1:0")
    taken = f"127.0.0.1:{first.port if which == 'address' else first.health_port}"
    addresses = {"address": f"127.0.0.1:{free_port()}", "health_address": "127.0.0.1:0"}
    addresses[which] = taken
    second = _server(**addresses)
    what = "gRPC" if which == "address" else "health"
    with pytest.raises(OSError, match=rf"cannot listen on {taken} \({what}\): the port is in use"):
        await second.start()
    # The first server still has the port to itself and answers.
    assert (await client.evaluate(ref("chat", synthetic()))).target == 1.0


async def test_a_metrics_port_in_use_fails_and_releases_the_grpc_port(
    start_server: ServerFactory,
) -> None:
    first, _ = await start_server(metrics_address="127.0.0.1:0")
    grpc_port = free_port()
    taken = f"127.0.0.1:{first.metrics_port}"
    second = _server(f"127.0.0.1:{grpc_port}", metrics_address=taken)
    with pytest.raises(OSError, match=rf"cannot listen on {taken} \(metrics\)"):
        await second.start()
    # What the failed start had bound is free again: a third server gets the same gRPC port.
    third = _server(f"127.0.0.1:{grpc_port}")
    await third.start()
    try:
        assert third.port == grpc_port
        client = KedaLikeClient(f"127.0.0.1:{grpc_port}")
        try:
            assert (await client.evaluate(ref("chat", synthetic()))).target == 1.0
        finally:
            await client.close()
    finally:
        third.grace_s = 1.0
        await third.stop()


def test_a_second_scaler_serve_on_the_same_port_exits_2_naming_it() -> None:
    first = ServeProcess("--metrics-address", "off")
    try:
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_queue_scaler",
                "serve",
                "--insecure-plaintext",
                "--metrics-address",
                "off",
                "--address",
                f"127.0.0.1:{first.port}",
            ],
            capture_output=True,
            text=True,
            timeout=30,  # without the fix it serves until killed here
        )
        assert second.returncode == 2, second.stderr
        assert f"cannot listen on 127.0.0.1:{first.port} (gRPC)" in second.stderr
        assert '"serving"' not in second.stdout + second.stderr
        assert first.proc.poll() is None  # the first one is untouched
    finally:
        assert first.stop() == 0
