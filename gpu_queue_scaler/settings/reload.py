"""Hot reload of the tuning ConfigMap: the last good config stays in force through any bad edit.

Kubernetes updates a mounted ConfigMap by swapping a symlink (`..data`), which inotify on the file
misses; so the watcher polls the file's content hash. Reading a few KiB every couple of seconds
costs nothing next to the kubelet's own ~1 minute propagation delay.

A poll reads and parses in a worker thread, so a slow file never stalls the RPCs on the event
loop; a file rejected once (by its SHA-256) is not parsed again until it changes; and no exception
ends the watch: it is reported (`config_valid` 0, a `result="error"` reload, one log line) and
the next poll tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpu_queue_scaler import telemetry
from gpu_queue_scaler.logs import MAX_MESSAGE_CHARS, cut
from gpu_queue_scaler.settings.config import (
    MAX_PROBLEM_CHARS,
    Config,
    ConfigError,
    load_config_text,
    read_config_bytes,
)
from gpu_queue_scaler.settings.fields import FieldError

log = logging.getLogger(__name__)

MAX_LOGGED_PROBLEMS = 5  # a rejection is one log line: its first problems (each cut) and a count


@dataclass(frozen=True)
class _Read:
    """What a poll found, worked out off the event loop."""

    digest: str | None = None  # None: the file could not be read (no digest to cache an error by)
    config: Config | None = None
    error: ConfigError | None = None
    unchanged: bool = False


class ConfigStore:
    """Holds the config in force. Readers take `current` once per decision (one snapshot)."""

    def __init__(self, config: Config | None = None, path: str | None = None) -> None:
        self.current = config or Config()
        self.path = path
        self.generation = 0
        self.last_error: ConfigError | None = None
        self.parses = 0  # files parsed by reloads (a rejected file is parsed once)
        self._rejected: tuple[str, ConfigError] | None = None  # the last rejected file, by digest
        self._reported: str | None = None  # the failure last logged, so it is logged once
        telemetry.CONFIG_VALID.set(1)
        telemetry.CONFIG_LAST_SUCCESS.set(time.time())

    async def poll(self) -> bool:
        """Read the file again, in a worker thread; True if a new config is now in force."""
        if self.path is None:
            return False
        try:
            found = await asyncio.to_thread(self._read, self.path)
            return self._apply(found)
        except Exception as exc:  # the watch outlives any fault; it is reported
            return self._fail(exc)

    def _read(self, path: str) -> _Read:
        """Read and, if the file is new, parse it. Touches no state but `parses`: it runs in a
        worker thread while the loop reads `current`."""
        try:
            data = read_config_bytes(path)
        except ConfigError as exc:
            return _Read(error=exc)
        digest = hashlib.sha256(data).hexdigest()
        rejected = self._rejected
        if digest == self.current.digest:
            return _Read(digest=digest, unchanged=True)
        if rejected is not None and rejected[0] == digest:
            return _Read(digest=digest, error=rejected[1])
        self.parses += 1
        try:
            return _Read(digest=digest, config=load_config_text(data, path))
        except ConfigError as exc:
            return _Read(digest=digest, error=exc)
        except Exception as exc:  # e.g. MemoryError: rejected, by its digest
            return _Read(digest=digest, error=_as_error(path, exc))

    def _apply(self, found: _Read) -> bool:
        if found.unchanged:
            if self.last_error is not None or self._reported is not None:
                self.last_error = None  # the file went back to the config in force
                self._reported = None
                telemetry.CONFIG_VALID.set(1)
            return False
        if found.error is not None:
            if found.digest is not None:
                self._rejected = (found.digest, found.error)
            return self._reject(found.error)
        assert found.config is not None
        config = found.config
        self.current = config
        self.generation += 1
        self.last_error = None
        self._reported = None
        telemetry.CONFIG_RELOADS.labels(result="success").inc()
        telemetry.CONFIG_VALID.set(1)
        telemetry.CONFIG_LAST_SUCCESS.set(time.time())
        log.info(
            "config reloaded",
            extra={"event": "config_reloaded", "source": self.path, "digest": config.digest[:12]},
        )
        return True

    def _reject(self, error: ConfigError) -> bool:
        """Report a rejected file once, in one log line."""
        if self.last_error is not None and str(self.last_error) == str(error):
            return False  # already reported; do not log the same bad file every poll
        self.last_error = error
        self._reported = None
        telemetry.CONFIG_RELOADS.labels(result="failure").inc()
        telemetry.CONFIG_VALID.set(0)
        shown = error.problems[:MAX_LOGGED_PROBLEMS]
        more = len(error.problems) - len(shown)
        each = (MAX_MESSAGE_CHARS - 200) // MAX_LOGGED_PROBLEMS  # the line is never cut after
        log.error(
            "config rejected, keeping the last good config: %s%s",
            "; ".join(cut(str(problem), each) for problem in shown),
            f"; and {more} more (scaler check-config prints them all)" if more else "",
            extra={
                "event": "config_rejected",
                "source": error.source,
                "path": shown[0].path if shown else "",
                "problems": len(error.problems),
            },
        )
        return False

    def _fail(self, exc: BaseException) -> bool:
        """Report a fault outside the file's parse, once; the config in force stays."""
        text = cut(f"{type(exc).__name__}: {exc}", MAX_PROBLEM_CHARS)
        telemetry.CONFIG_VALID.set(0)
        if self._reported == text:
            return False
        self._reported = text
        self.last_error = None
        telemetry.CONFIG_RELOADS.labels(result="error").inc()
        log.error(
            "config reload failed, keeping the last good config: %s",
            text,
            extra={"event": "config_reload_failed", "source": self.path},
        )
        return False

    async def watch(
        self,
        interval_s: float,
        stop: asyncio.Event,
        tick: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Poll every `interval_s` (or after each `tick()`, for a test's own clock) until `stop`
        is set."""

        async def wait() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

        while not stop.is_set():
            await (tick() if tick is not None else wait())
            if not stop.is_set():
                await self.poll()


def _as_error(source: str, exc: Exception) -> ConfigError:
    return ConfigError(
        source, [FieldError("<file>", f"cannot be parsed: {type(exc).__name__}: {exc}")]
    )
