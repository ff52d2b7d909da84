"""A real Triton Inference Server (pytriton, CPU) for tests, plus a closed-loop load generator.

The server runs in its own venv, `.venv-triton` (pytriton needs numpy<2); create it with
`tests/servers/install_triton.sh`. This module runs in the main venv and uses only the stdlib
and httpx. Load it as a pytest plugin for the session-scoped `triton_server` fixture:

    .venv/bin/pytest -p tests.servers.triton tests/real/test_harness_triton.py

Everything binds and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_queue_scaler.sources.httpclient import async_client
from tests.servers.base import (
    REPO_ROOT,
    LoadTally,
    NotReadyError,
    StartStop,
    await_install,
    start_retrying_taken_ports,
    wait_until_ready,
)
from tests.servers.ports import free_port

TRITON_VENV = REPO_ROOT / ".venv-triton"
TRITON_PYTHON = TRITON_VENV / "bin" / "python"
TOY_SCRIPT = Path(__file__).resolve().with_name("triton_toy.py")
INSTALL_SCRIPT = "tests/servers/install_triton.sh"
MODEL = "toy"

START_TIMEOUT_S = 60.0
RESTART_ATTEMPTS = 5  # restart() on the same ports: the old process's sockets may linger
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 4000


def infer_body(value: float = 1.0) -> dict[str, Any]:
    """KServe v2 JSON request for the toy model: one row, x = [value]."""
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


class TritonStartError(RuntimeError):
    pass


def missing_install() -> str | None:
    """Why a Triton server cannot be started here, or None when it can (once `./dev test`'s
    background install, if one runs, is done)."""
    failed = await_install("triton")
    if failed:
        return failed
    return None if TRITON_PYTHON.exists() else triton_venv_missing_message()


def require_install() -> None:
    """Fail the test, naming why, when `missing_install` finds a reason."""
    reason = missing_install()
    if reason:
        pytest.fail(f"real Triton server unavailable: {reason}", pytrace=False)


def triton_venv_missing_message() -> str:
    return (
        f"{TRITON_PYTHON.relative_to(REPO_ROOT)} not found: the real Triton tests need their own "
        f"venv. Create it with `bash {INSTALL_SCRIPT}` (installs nvidia-pytriton==0.7.0 into "
        ".venv-triton)."
    )


def triton_libdir(python: Path = TRITON_PYTHON) -> str:
    """LIBDIR of the .venv-triton interpreter: the Python backend stub must load its libpython."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    libdir = out.stdout.strip()
    if not libdir or libdir == "None":
        raise TritonStartError(f"{python} reports no LIBDIR")
    return libdir


class TritonServer(StartStop):
    """`.venv-triton/bin/python tests/servers/triton_toy.py` on free loopback ports.

    Use as a context manager (or start()/stop()). Ready means /v2/health/ready answered 200 AND
    one inference succeeded (the ready endpoint can answer slightly before the model serves).
    """

    def __init__(
        self, *, start_timeout_s: float = START_TIMEOUT_S, batch_sleep_s: float = 0.05
    ) -> None:
        self.start_timeout_s = start_timeout_s
        self.batch_sleep_s = batch_sleep_s  # the toy model's time per batch of up to 8
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.start_seconds: float | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_target}/metrics"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace")
        return text[-chars:]

    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("TritonServer already started")

        def pick(attempt: int) -> None:
            self.http_port, self.grpc_port, self.metrics_port = _distinct_free_ports(3)

        start_retrying_taken_ports(pick, self._launch)

    def restart(self) -> None:
        """Start again on the SAME ports after stop() or kill() (a pod coming back at its
        address). A port still held by the old process's sockets is retried for a few seconds."""
        if self.http_port == 0:
            raise RuntimeError("TritonServer.restart() before start()")
        if self.proc is not None:
            if self.proc.poll() is None:
                raise RuntimeError("TritonServer.restart() while it is running; stop() first")
            self._reap_group()
            self.proc = None

        def pause(attempt: int) -> None:  # the same ports; the old sockets take a moment to go
            if attempt > 1:
                time.sleep(1.0)

        start_retrying_taken_ports(pause, self._launch, RESTART_ATTEMPTS)

    def _launch(self) -> None:
        """One start on the current ports; a failed start is stopped and raised with its log."""
        if not TRITON_PYTHON.exists():
            raise TritonStartError(triton_venv_missing_message())
        env = dict(os.environ)
        libdir = triton_libdir()
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        fd, log_name = tempfile.mkstemp(prefix="triton-toy-", suffix=".log")
        self.log_path = Path(log_name)
        started = time.monotonic()
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(TRITON_PYTHON),
                    str(TOY_SCRIPT),
                    f"--http-port={self.http_port}",
                    f"--grpc-port={self.grpc_port}",
                    f"--metrics-port={self.metrics_port}",
                    f"--batch-sleep-s={self.batch_sleep_s}",
                ],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: a SIGKILL fallback also reaches tritonserver and the
                # Python backend stub that triton_toy.py starts.
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except TritonStartError as err:
            tail = self.log_tail()
            self.kill()
            self._reap_group()
            self.proc = None
            raise TritonStartError(f"{err}\n--- {self.log_path} (tail) ---\n{tail}") from None
        self.start_seconds = time.monotonic() - started

    def _wait_ready(self) -> None:
        assert self.proc is not None
        with httpx.Client(base_url=self.http_url, timeout=2.0, trust_env=False) as client:

            def health() -> str | None:
                status = client.get("/v2/health/ready").status_code
                return None if status == 200 else f"/v2/health/ready -> {status}"

            def infer() -> str | None:  # ready can answer slightly before the model serves
                resp = client.post(f"/v2/models/{MODEL}/infer", json=infer_body(1.5))
                if resp.status_code == 200 and resp.json()["outputs"][0]["data"] == [3.0]:
                    return None
                return f"infer -> {resp.status_code} {resp.text[:200]}"

            try:
                wait_until_ready(
                    "triton_toy.py",
                    self.proc,
                    (health, infer),
                    self.start_timeout_s,
                    errors=(httpx.HTTPError, ValueError, KeyError, IndexError),
                )
            except NotReadyError as err:
                raise TritonStartError(str(err)) from None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM our PID, wait; SIGKILL our process group if it does not exit in time."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap_group()
        self.proc = None
        if proc.returncode == 0 and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once: triton_toy.py and everything it started (our own process group)."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)

    def _reap_group(self) -> None:
        """After our PID exited, SIGKILL any child it left in its (our) process group."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 0)  # raises ProcessLookupError if the group is empty
            os.killpg(proc.pid, signal.SIGKILL)


def _distinct_free_ports(n: int) -> tuple[int, ...]:
    ports: list[int] = []
    for _ in range(20 * n):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == n:
            return tuple(ports)
    raise RuntimeError("could not find distinct free ports")


async def triton_load(
    http_url: str,
    concurrency: int = 32,
    duration_s: float = 10.0,
    max_requests: int = 20_000,
    *,
    stop: asyncio.Event | None = None,
    request_timeout_s: float = 10.0,
) -> LoadTally:
    """Closed-loop load: `concurrency` clients each send one inference at a time to the toy model.

    Ends at the first of: duration_s elapsed, max_requests sent, `stop` set.
    """
    result = LoadTally()
    sent = 0
    started = time.monotonic()
    deadline = started + duration_s
    body = infer_body(1.0)
    async with async_client(
        max_connections=concurrency,
        max_keepalive_connections=concurrency,
        base_url=http_url,
        timeout=request_timeout_s,
    ) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < max_requests and time.monotonic() < deadline:
                if stop is not None and stop.is_set():
                    return
                sent += 1
                await result.count(lambda: client.post(f"/v2/models/{MODEL}/infer", json=body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.monotonic() - started
    return result


SESSION_BATCH_SLEEP_S = 0.2


@pytest.fixture(scope="session")
def triton_server() -> Iterator[TritonServer]:
    """One real Triton (toy model) for the whole test session; fails, never skips, if missing.

    Batches of 8 take 0.2 s (40 req/s): the queue tests need a queue that a slow, GIL-sharing
    in-process client still builds (at 50 ms, 160 req/s, a loaded CI runner kept only ~5
    waiting under 32 clients)."""
    require_install()
    server = TritonServer(batch_sleep_s=SESSION_BATCH_SLEEP_S)
    try:
        server.start()
    except TritonStartError as err:
        pytest.fail(f"could not start Triton: {err}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


__all__ = [
    "INSTALL_SCRIPT",
    "MODEL",
    "TRITON_PYTHON",
    "LoadTally",
    "TritonServer",
    "TritonStartError",
    "infer_body",
    "missing_install",
    "require_install",
    "triton_load",
    "triton_server",
]

if __name__ == "__main__":  # manual smoke: start, print the endpoints, stop
    with TritonServer() as srv:
        print(f"started in {srv.start_seconds:.1f}s: {srv.http_url} {srv.metrics_url}")
    sys.exit(0)
