"""What every test server shares: start on `with`, stop on exit, a bounded wait until it serves,
and a readable log tail."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

import httpx

# A readiness probe: None once it passes, else why not (shown if the wait runs out).
Probe = Callable[[], str | None]


REPO_ROOT = Path(__file__).resolve().parent.parent.parent
INSTALLS = REPO_ROOT / ".cache"  # `./dev test` puts install-<server>.{pid,rc,log} here
INSTALL_WAIT_S = 1800.0  # a background install still running after this is reported, not awaited
ERROR_PAUSE_S = 0.05  # a client's pause after a failed request: a down server is not spun on
PORT_TAKEN = "address already in use"  # what a server's bind error says, in every log here
START_ATTEMPTS = 3
T = TypeVar("T")


def start_retrying_taken_ports(
    pick: Callable[[int], None], launch: Callable[[], T], attempts: int = START_ATTEMPTS
) -> T:
    """`launch()` after `pick(attempt)` chose its ports; again, at most `attempts` times, when
    the start failed because a port was taken (its error names PORT_TAKEN): a port found free
    can be bound by any other socket before a server that takes seconds to import binds it.
    Any other failure is raised at once; so is the last."""
    for attempt in range(1, attempts + 1):
        pick(attempt)
        try:
            return launch()
        except Exception as err:
            if attempt == attempts or PORT_TAKEN not in str(err).lower():
                raise
    raise ValueError(f"attempts must be at least 1, got {attempts}")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's: not an install of ours
        return False
    return True


def await_install(
    server: str, timeout_s: float = INSTALL_WAIT_S, where: Path = INSTALLS
) -> str | None:
    """Wait for `./dev test`'s background install of `server` (prometheus, triton, vllm), if one
    is running: pytest starts while the slow ones (vLLM's, minutes of downloads) go on, and the
    first test that needs the server waits here. Returns why the server cannot be used (the
    install failed, or is still running after `timeout_s`), or None; a server installed by hand
    (no install of ours on record) is None too, and its own checks then apply."""
    pid_file, rc_file = where / f"install-{server}.pid", where / f"install-{server}.rc"
    log = where / f"install-{server}.log"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    deadline = time.monotonic() + timeout_s
    while not rc_file.exists() and _running(pid):
        if time.monotonic() > deadline:
            return f"its install (PID {pid}) is still running after {timeout_s:g} s; see {log}"
        time.sleep(1.0)
    try:
        rc = rc_file.read_text().strip()
    except OSError:
        return None  # ended without a word (killed with its run): the server's own checks apply
    if rc != "0":
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        return f"its install failed (exit {rc}); the end of {log}:\n{tail}"
    return None


@dataclass
class LoadTally:
    """What a closed-loop test load has had answered so far (a test may read it while the load
    runs), and what each failure was (the first FAILURES_KEPT): the exception, or the status and
    the start of the body."""

    FAILURES_KEPT: ClassVar[int] = 100

    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list, repr=False)

    async def count(self, send: Callable[[], Awaitable[httpx.Response]]) -> None:
        """Send one request and count its answer; after a failure, pause ERROR_PAUSE_S."""
        try:
            response = await send()
        except httpx.HTTPError as exc:
            failure = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code == 200:
                self.ok += 1
                return
            failure = f"HTTP {response.status_code}: {response.text[:200]}"
        self.errors += 1
        if len(self.failures) < self.FAILURES_KEPT:
            self.failures.append(failure)
        await asyncio.sleep(ERROR_PAUSE_S)


class StartStop:
    """Context-manager protocol for the servers the tests start (each stops only its own PID)."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def log_tail(path: Path, lines: int, title: str) -> str:
    """The last lines of a server's log, for failure messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"--- {title}: last {lines} lines of {path} ---\n" + "\n".join(
        text.splitlines()[-lines:]
    )


class NotReadyError(RuntimeError):
    """The server exited while starting (`exit_code` set), or did not serve in time."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def wait_until_ready(
    name: str,
    proc: subprocess.Popen[bytes],
    probes: Sequence[Probe],
    timeout_s: float,
    *,
    errors: tuple[type[Exception], ...] = (OSError, ValueError, LookupError),
    interval_s: float = 0.25,
) -> float:
    """Poll until every probe has passed, in order (one that passed is not asked again), e.g. a
    health endpoint, then one real request. Bounded in time and in attempts; a probe raising one
    of `errors` is a failed attempt. Returns the seconds waited; raises NotReadyError if `proc`
    exits first or the time runs out."""
    began = time.monotonic()
    deadline = began + timeout_s
    passed = 0
    last = "no answer yet"
    for _ in range(math.ceil(timeout_s / interval_s) + 1):
        code = proc.poll()
        if code is not None:
            raise NotReadyError(f"{name} exited with code {code} while starting", code)
        try:
            while passed < len(probes):
                reason = probes[passed]()
                if reason is not None:
                    last = reason
                    break
                passed += 1
        except errors as exc:
            last = f"{type(exc).__name__}: {exc}"
        if passed == len(probes):
            return time.monotonic() - began
        if time.monotonic() + interval_s >= deadline:
            break
        time.sleep(interval_s)
    raise NotReadyError(f"{name} not ready within {timeout_s:g} s ({last})")


def write_reply(
    handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str
) -> None:
    """Send one whole HTTP response from a test server's handler; a client that already hung up
    (a timeout under test) is not an error."""
    with contextlib.suppress(OSError):
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
