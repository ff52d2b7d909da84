"""Hot reload of the tuning ConfigMap: the last good config stays in force through any bad edit.

Kubernetes updates a mounted ConfigMap by swapping a symlink (`..data`), which inotify on the file
misses; so the watcher polls the file's content hash. Reading a few KiB every couple of seconds
costs nothing next to the kubelet's own ~1 minute propagation delay.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

from scaler import telemetry
from scaler.config import Config, ConfigError, load_config_text
from scaler.fields import FieldError

log = logging.getLogger(__name__)


class ConfigStore:
    """Holds the config in force. Readers take `current` once per decision (one snapshot)."""

    def __init__(self, config: Config | None = None, path: str | None = None) -> None:
        self.current = config or Config()
        self.path = path
        self.generation = 0
        self.last_error: ConfigError | None = None
        telemetry.CONFIG_VALID.set(1)
        telemetry.CONFIG_LAST_SUCCESS.set(time.time())

    def reload(self) -> bool:
        """Read the file again; True if a new config is now in force."""
        if self.path is None:
            return False
        try:
            data = Path(self.path).read_bytes()
        except OSError as exc:
            return self._reject(
                ConfigError(self.path, [FieldError("<file>", f"cannot read: {exc.strerror}")])
            )
        if hashlib.sha256(data).hexdigest() == self.current.digest:
            if self.last_error is not None:  # the file went back to the config in force
                self.last_error = None
                telemetry.CONFIG_VALID.set(1)
            return False
        try:
            config = load_config_text(data, self.path)
        except ConfigError as exc:
            return self._reject(exc)
        self.current = config
        self.generation += 1
        self.last_error = None
        telemetry.CONFIG_RELOADS.labels(result="success").inc()
        telemetry.CONFIG_VALID.set(1)
        telemetry.CONFIG_LAST_SUCCESS.set(time.time())
        log.info(
            "config reloaded",
            extra={"event": "config_reloaded", "source": self.path, "digest": config.digest[:12]},
        )
        return True

    def _reject(self, error: ConfigError) -> bool:
        if self.last_error is not None and str(self.last_error) == str(error):
            return False  # already reported; do not log the same bad file every poll
        self.last_error = error
        telemetry.CONFIG_RELOADS.labels(result="failure").inc()
        telemetry.CONFIG_VALID.set(0)
        for problem in error.problems:
            log.error(
                "config rejected, keeping the last good config: %s",
                problem,
                extra={"event": "config_rejected", "source": error.source, "path": problem.path},
            )
        return False

    async def watch(self, interval_s: float, stop: asyncio.Event) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                self.reload()
