"""Every log line is cut to a bound (`gpu_queue_scaler.logs`), whoever logs it: a library's message
can carry input of any size (urllib3's retry warning, the whole URL-encoded PromQL query)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator

import pytest

from gpu_queue_scaler import logs
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.prometheus import PrometheusSource


@pytest.fixture
def root_logging() -> Iterator[None]:
    """`logs.setup` replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def refused_url() -> str:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_a_retry_warning_carrying_a_long_query_is_cut(root_logging, capsys, fmt):
    """A real urllib3 retry warning, from a read whose query is ~20,000 characters URL-encoded
    (a long regex selector), against a refused Prometheus."""
    logs.setup("warning", fmt)
    url = refused_url()
    selector = 'pod=~"' + "|".join(f"llama-{i}" for i in range(1500)) + '"'
    metadata = {"backend": "vllm", "serverAddress": url, "labelSelector": selector}
    spec = resolve(parse_trigger("team-a", "llama", metadata), Config())
    source = PrometheusSource(url, combine=False, batch=False)
    try:
        with pytest.raises(SourceError):
            await asyncio.wait_for(source.read(spec, 0.0), 60)
    finally:
        source._pool.shutdown(wait=True)
    lines = capsys.readouterr().err.splitlines()
    retries = [line for line in lines if "Retrying" in line]
    assert retries, lines[:3]
    for line in lines:
        assert len(line) <= logs.MAX_LINE_CHARS
    for line in retries:
        message = json.loads(line)["msg"] if fmt == "json" else line
        assert len(message) <= logs.MAX_MESSAGE_CHARS + 100
        assert "[cut: " in message


def test_every_json_line_stays_within_the_bound_and_valid():
    """Many fields, each within its own bound, can still make a long line: it keeps what says
    what happened, as valid JSON."""
    record = logging.makeLogRecord(
        {"msg": "x" * 50_000, "levelname": "WARNING", "name": "t", "event": "e"}
    )
    for i in range(100):
        setattr(record, f"field{i}", "y" * 1000)
    line = logs.JsonFormatter().format(record)
    assert len(line) <= logs.MAX_LINE_CHARS
    entry = json.loads(line)
    assert entry["event"] == "e" and entry["msg"].startswith("x") and "cut" in entry


def test_cut_keeps_short_text_and_bounds_long_text():
    assert logs.cut("short", 100) == "short"
    cut = logs.cut("z" * 10_000, 100)
    assert len(cut) <= 100 and cut.startswith("z") and "10000 characters" in cut
