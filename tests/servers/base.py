"""What every test server shares: start on `with`, stop on exit, and a readable log tail."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Self


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
