"""Run `scaler serve` as a real subprocess on a loopback port, for shutdown and reload tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


class ServeProcess:
    """`python -m gpu_queue_scaler serve --address 127.0.0.1:0`; the bound port is read from its
    log.

    Plaintext (`--insecure-plaintext`, on loopback) unless `plaintext=False`, when `args` carry the
    `--tls-*` flags."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, plaintext: bool = True
    ) -> None:
        self.log_path = (
            Path(os.environ.get("TMPDIR", "/tmp"))
            / f"scaler-serve-{os.getpid()}-{time.monotonic_ns()}.log"
        )
        self._log = self.log_path.open("w+")
        transport = ["--insecure-plaintext"] if plaintext else []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_queue_scaler",
                "serve",
                "--address",
                "127.0.0.1:0",
                *transport,
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.port = self._wait_for_port(timeout_s=20.0)

    def lines(self) -> list[dict[str, object]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"msg": line})
        return out

    def _wait_for_port(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for entry in self.lines():
                if entry.get("event") == "serving":
                    return int(entry["port"])  # type: ignore[call-overload]
            if self.proc.poll() is not None:
                raise RuntimeError(f"scaler serve exited early:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"scaler serve did not start:\n{self.log_path.read_text()}")

    def stop(self) -> int:
        """Stop the process this object started (by its PID), forcefully if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        return self.proc.returncode
