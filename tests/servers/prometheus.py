"""A real Prometheus server (and a toy /metrics endpoint) for the real_servers tests.

``PrometheusServer`` runs the ``prometheus`` binary by hand (never the distro service) on a
free 127.0.0.1 port, with its config file, TSDB and log in a temp dir. It never uses :9090.
Install the binary with ``tests/servers/install_prometheus.sh``.

``MetricsEndpoint`` is a tiny threaded HTTP server on 127.0.0.1 serving ``/metrics`` with a
body (and delay and status) the test can change at any time; it is a scrape target for
Prometheus and a direct-scrape target for the scaler.

Everything here is blocking; from async tests call it through ``asyncio.to_thread``.

Fixtures (registered with ``pytest_plugins = ["tests.servers.prometheus"]``):

* ``prometheus_bin`` (session): path of the binary, or ``pytest.fail`` naming the install script.
* ``start_prometheus`` (function): a factory ``start_prometheus(scrape_targets, ...)`` that starts
  ``PrometheusServer`` instances (their dirs under ``tmp_path``, so logs survive a failure)
  and stops them all at teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from tests.servers.base import (
    StartStop,
    await_install,
    log_tail,
    start_retrying_taken_ports,
    write_reply,
)
from tests.servers.ports import free_port

INSTALL_SCRIPT = "tests/servers/install_prometheus.sh"
RESERVED_PORT = 9090  # the distro service's port: not ours, never used

# Direct connections only: an http_proxy in the environment must not see loopback traffic.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

StaticLabels = Mapping[str, str]
Relabel = Mapping[str, StaticLabels] | StaticLabels


class PrometheusError(RuntimeError):
    """Prometheus failed to start, reload or answer; the message ends with its log tail."""


class PrometheusQueryError(PrometheusError):
    """The query API answered with status=error (bad PromQL, bad range)."""


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be positive, got {seconds!r} s")
    return f"{ms}ms"


def find_prometheus() -> str | None:
    """``$PROMETHEUS_BIN``, else ``prometheus`` on PATH, else Debian's /usr/bin/prometheus."""
    explicit = os.environ.get("PROMETHEUS_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


_LIVE: set[PrometheusServer] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if a test process exits without teardown: no prometheus outlives pytest."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.kill()


class PrometheusServer:
    """One ``prometheus`` process on 127.0.0.1:<free port>, scraping the given static targets.

    ``scrape_targets`` maps job name -> ["127.0.0.1:port", ...]. ``relabel`` adds static labels:
    either per job (``{"vllm": {"namespace": "inference", "pod": "llama-0"}}``) or one flat
    mapping applied to every job (``{"namespace": "inference"}``).
    """

    def __init__(
        self,
        scrape_targets: Mapping[str, list[str]],
        scrape_interval_s: float = 1.0,
        relabel: Relabel | None = None,
        *,
        scrape_timeout_s: float | None = None,
        retention: str = "1h",
        binary: str | None = None,
        workdir: str | Path | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.scrape_interval_s = scrape_interval_s
        self.scrape_timeout_s = scrape_timeout_s
        self.retention = retention
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.binary = binary or find_prometheus()
        if not self.binary:
            raise PrometheusError(f"prometheus binary not found; run {INSTALL_SCRIPT}")
        self._owns_dir = workdir is None
        if workdir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="prometheus-"))
        else:
            self.dir = Path(workdir)
            self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "prometheus.yml"
        self.tsdb_path = self.dir / "tsdb"
        self.log_path = self.dir / "prometheus.log"
        self._targets: dict[str, list[str]] = {}
        self._labels: dict[str, dict[str, str]] = {}
        try:
            self._set_config(scrape_targets, relabel)
        except BaseException:
            if self._owns_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None  # time.monotonic() of the last (re)start

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Self:
        if self.proc is None:
            try:
                self.start()
            except BaseException:
                self.close()  # the log tail is in the exception already
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusError("not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start on a fresh free port (a few tries if another process grabs the port first)."""
        if self.running():
            raise PrometheusError("already running")
        chosen: list[int] = []

        def pick(attempt: int) -> None:
            ports = (free_port() for _ in range(10))  # 9090 comes up again only by chance
            port = next((p for p in ports if p != RESERVED_PORT), None)
            if port is None:
                raise PrometheusError(f"no free port other than {RESERVED_PORT} in 10 tries")
            chosen.append(port)

        start_retrying_taken_ports(pick, lambda: self._launch(chosen[-1]))
        return self

    def restart(self) -> Self:
        """Start again on the SAME port with the SAME TSDB dir (history survives).

        A running server is stopped gracefully first; after ``kill()`` the WAL is replayed.
        """
        if self.port is None:
            raise PrometheusError("never started; call start()")
        if self.running():
            self.stop()
        self._launch(self.port)
        return self

    def stop(self) -> None:
        """SIGTERM our PID, wait, SIGKILL after ``stop_timeout_s``. Keeps the dir for restart()."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout_s)
        self._forget()

    def kill(self) -> None:
        """SIGKILL our PID (a crash, for fault tests); ``restart()`` replays the WAL."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=self.stop_timeout_s)
        self._forget()

    def close(self) -> None:
        """stop(), then remove the temp dir if we created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _forget(self) -> None:
        self.proc = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _launch(self, port: int) -> None:
        self.tsdb_path.mkdir(parents=True, exist_ok=True)
        self.port = port
        args = [
            str(self.binary),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.tsdb_path}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=info",
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n=== harness: starting on 127.0.0.1:{port} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        self.started_at = time.monotonic()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                raise PrometheusError(f"prometheus exited during start\n{self.log_tail()}")
            try:
                with _OPENER.open(f"{self.url}/-/ready", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise PrometheusError(
            f"prometheus not ready within {self.start_timeout_s} s\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines, "prometheus")

    # -- configuration -----------------------------------------------------------------

    def _set_config(self, scrape_targets: Mapping[str, list[str]], relabel: Relabel | None) -> None:
        targets = {job: list(addrs) for job, addrs in scrape_targets.items()}
        for job, addrs in targets.items():
            for addr in addrs:
                host, _, port = addr.rpartition(":")
                if host not in ("127.0.0.1", "localhost") or not port.isdigit():
                    raise ValueError(f"job {job!r}: target {addr!r} is not 127.0.0.1:<port>")
        if relabel is not None:
            if all(isinstance(v, str) for v in relabel.values()):
                flat = {str(k): str(v) for k, v in relabel.items()}
                self._labels = {job: dict(flat) for job in targets}
            else:
                self._labels = {}
                for job, labels in relabel.items():
                    if not isinstance(labels, Mapping):
                        raise TypeError(f"relabel[{job!r}] must be a mapping of label -> value")
                    self._labels[job] = {str(k): str(v) for k, v in labels.items()}
        self._targets = targets
        self.config_path.write_text(json.dumps(self.config(), indent=2) + "\n")

    def config(self) -> dict[str, Any]:
        """The config written to prometheus.yml (JSON is valid YAML)."""
        interval = _duration(self.scrape_interval_s)
        timeout = _duration(
            min(self.scrape_timeout_s or self.scrape_interval_s, self.scrape_interval_s)
        )
        jobs = []
        for job, addrs in self._targets.items():
            static: dict[str, Any] = {"targets": addrs}
            if self._labels.get(job):
                static["labels"] = self._labels[job]
            jobs.append({"job_name": job, "metrics_path": "/metrics", "static_configs": [static]})
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": timeout,
                "evaluation_interval": interval,
            },
            "scrape_configs": jobs,
        }

    def set_targets(
        self, scrape_targets: Mapping[str, list[str]], relabel: Relabel | None = None
    ) -> None:
        """Rewrite the config (labels kept unless ``relabel`` is given) and POST /-/reload."""
        self._set_config(scrape_targets, relabel)
        if not self.running():
            return  # picked up by the next start()/restart()
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST", data=b"")
        try:
            with _OPENER.open(req, timeout=10.0) as resp:
                resp.read()
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            raise PrometheusError(f"reload failed: {err.code} {body}\n{self.log_tail()}") from err

    # -- HTTP API ----------------------------------------------------------------------

    def api(self, path: str, **params: str | float) -> Any:
        """GET /api/v1/<path>; returns ``data``, raises PrometheusQueryError on status=error."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with _OPENER.open(url, timeout=10.0) as resp:
                payload = json.load(resp)
        except urllib.error.HTTPError as err:
            try:
                payload = json.loads(err.read())
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {err.code}") from err
        if payload.get("status") != "success":
            raise PrometheusQueryError(
                f"{path} {params}: {payload.get('errorType')}: {payload.get('error')}"
            )
        return payload["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the vector/matrix ``result`` list ([] when nothing matches)."""
        params: dict[str, str | float] = {"query": promql}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        result = data["result"]
        return result if isinstance(result, list) else [result]

    def query_range(
        self, promql: str, start: float, end: float, step: float = 1.0
    ) -> list[dict[str, Any]]:
        """Range query (unix seconds); a matrix: [{"metric": {...}, "values": [[t, "v"], ...]}]."""
        data = self.api("query_range", query=promql, start=start, end=end, step=step)
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with health and lastError (handy in failure messages)."""
        return list(self.api("targets")["activeTargets"])

    def wait_until(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float,
        poll_s: float = 0.2,
    ) -> list[dict[str, Any]]:
        """Poll the instant query until ``predicate(result)``; TimeoutError with diagnostics."""
        deadline = time.monotonic() + timeout_s
        last: list[dict[str, Any]] = []
        last_err: Exception | None = None
        while True:
            if not self.running():
                raise PrometheusError(f"prometheus is not running\n{self.log_tail()}")
            try:
                last = self.query(promql)
                last_err = None
                if predicate(last):
                    return last
            except PrometheusQueryError:
                raise  # bad PromQL will not fix itself
            except (PrometheusError, urllib.error.URLError, OSError) as err:
                last_err = err
            if time.monotonic() >= deadline:
                break
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        try:
            targets: Any = [
                {k: t.get(k) for k in ("scrapeUrl", "health", "lastError", "lastScrape")}
                for t in self.targets()
            ]
        except Exception as err:  # diagnostics only
            targets = f"(targets unavailable: {err})"
        raise TimeoutError(
            f"{promql!r}: condition not met within {timeout_s} s; last result {last!r}, "
            f"last error {last_err!r}, targets {targets}\n{self.log_tail(15)}"
        )

    def wait_for_series(self, promql: str, timeout_s: float) -> list[dict[str, Any]]:
        """Poll /api/v1/query until ``promql`` returns a non-empty result, and return it."""
        return self.wait_until(promql, bool, timeout_s)


def sample_value(result: list[dict[str, Any]]) -> float:
    """The value of a single-series instant-query result."""
    if len(result) != 1:
        raise AssertionError(f"expected exactly one series, got {result!r}")
    return float(result[0]["value"][1])


# -- a toy /metrics endpoint -------------------------------------------------------------


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    server: _MetricsHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus and the scaler use it
    timeout = 30.0  # idle keep-alive connections do not hold a thread forever

    def setup(self) -> None:
        super().setup()
        with self.server.endpoint._lock:
            self.server.endpoint._conns.add(self.connection)

    def finish(self) -> None:
        with self.server.endpoint._lock:
            self.server.endpoint._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        endpoint = self.server.endpoint
        if urllib.parse.urlsplit(self.path).path != "/metrics":
            self._send(404, "not found\n")
            return
        with endpoint._lock:
            endpoint.requests += 1
        delay = endpoint.delay_s
        # Interruptible: closing the endpoint does not wait out a slow-pod delay.
        if delay > 0 and endpoint._closing.wait(delay):
            self.close_connection = True
            return
        self._send(endpoint.status, endpoint.body)

    def _send(self, status: int, body: str) -> None:
        write_reply(self, status, body.encode(), MetricsEndpoint.CONTENT_TYPE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _MetricsHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # MetricsEndpoint.stop() closes connections itself
    endpoint: MetricsEndpoint


class MetricsEndpoint(StartStop):
    """``GET /metrics`` on 127.0.0.1:<port> from a background thread.

    Change ``.body`` (exposition text), ``.delay_s`` (a slow pod) and ``.status`` (e.g. 500)
    at any time; ``.requests`` counts /metrics requests. ``port=0`` picks a free port; pass a
    previous endpoint's port to bring a "pod" back on the same address.
    """

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(
        self, body: str = "", *, delay_s: float = 0.0, status: int = 200, port: int = 0
    ) -> None:
        self.body = body
        self.delay_s = delay_s
        self.status = status
        self.requests = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._conns: set[socket.socket] = set()
        self._port = port
        self._httpd: _MetricsHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("already started")
        self._closing.clear()
        httpd = _MetricsHTTPServer(("127.0.0.1", self._port), _MetricsHandler)
        httpd.endpoint = self
        self._httpd = httpd
        self._port = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"metrics-endpoint-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._closing.set()
        httpd.shutdown()
        httpd.server_close()
        # A stopped "pod" must not keep answering on keep-alive connections.
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if thread is not None:
            thread.join(timeout=5.0)
        self._httpd = self._thread = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def target(self) -> str:
        """``127.0.0.1:<port>``, as a Prometheus static target."""
        return f"127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/metrics"


# -- pytest fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """Path of the prometheus binary; fails (never skips) when it is missing."""
    failed = await_install("prometheus")
    if failed:
        pytest.fail(f"prometheus unavailable: {failed}", pytrace=False)
    path = find_prometheus()
    if path is None:
        pytest.fail(
            "prometheus binary not found (PATH, /usr/bin/prometheus, $PROMETHEUS_BIN); "
            f"install it with `{INSTALL_SCRIPT}` (CI runs it before the tests)",
            pytrace=False,
        )
    return path


StartPrometheus = Callable[..., PrometheusServer]


@pytest.fixture
def start_prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[StartPrometheus]:
    """``start_prometheus(scrape_targets, scrape_interval_s=1.0, relabel=None, **kw)``.

    Started servers keep their config, TSDB and log under ``tmp_path`` and are all
    stopped at teardown.
    """
    servers: list[PrometheusServer] = []

    def start(
        scrape_targets: Mapping[str, list[str]],
        scrape_interval_s: float = 1.0,
        relabel: Relabel | None = None,
        **kwargs: Any,
    ) -> PrometheusServer:
        kwargs.setdefault("binary", prometheus_bin)
        kwargs.setdefault("workdir", tmp_path / f"prometheus-{len(servers)}")
        server = PrometheusServer(scrape_targets, scrape_interval_s, relabel, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in reversed(servers):
        server.close()
