"""ConfigMap hot reload on a real server: a good edit takes effect, a bad one is rejected loudly
and the last good config stays in force, including through Kubernetes' symlink swap."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

from prometheus_client import REGISTRY

from gpu_queue_scaler.logs import MAX_MESSAGE_CHARS
from gpu_queue_scaler.settings import reload as config_watch
from gpu_queue_scaler.settings.config import load_config_file
from gpu_queue_scaler.settings.reload import ConfigStore
from tests.conftest import ref, synthetic


def llama() -> object:
    """A workload tuned by the `llama` profile: 16 req/s x 2 s x 1.25 = 40 in flight."""
    metadata = synthetic(
        profile="llama",
        syntheticPeakRps="16",
        scaleDownStabilizationSeconds="0",
        # Reloads apply at once: no scale-down step, no panic hold (they have tests of their own).
        scaleDownMaxPercent="100",
        panicThreshold="100",
    )
    del metadata["targetConcurrency"]  # trigger keys win over the profile; leave it to the profile
    return ref("llama", metadata)


GOOD = """
defaults:
  targetConcurrency: 8
profiles:
  llama:
    targetConcurrency: {tc}
server:
  evaluationIntervalSeconds: 0.05
  firstDecisionTimeoutSeconds: 5
"""


def reloads(result: str) -> float:
    return REGISTRY.get_sample_value("queue_scaler_config_reloads_total", {"result": result}) or 0.0


def config_valid() -> float | None:
    return REGISTRY.get_sample_value("queue_scaler_config_valid")


class KubeletVolume:
    """Lay out a ConfigMap volume as the kubelet does: config.yaml -> ..data/config.yaml,
    ..data -> ..<timestamp>/, updated by an atomic rename of the ..data symlink."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    def write(self, text: str) -> Path:
        self.version += 1
        target = self.root / f"..2026_11_29_{self.version}"
        target.mkdir()
        (target / "config.yaml").write_text(text)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(target.name)
        os.replace(tmp_link, self.root / "..data")
        path = self.root / "config.yaml"
        if not path.is_symlink():
            path.symlink_to("..data/config.yaml")
        return path


async def wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_good_edit_applies_bad_edit_keeps_last_good(start_server, tmp_path, caplog):
    volume = KubeletVolume(tmp_path)
    path = volume.write(GOOD.format(tc=8))
    store = ConfigStore(load_config_file(path), str(path))
    _, client = await start_server(store=store, config_poll_s=0.1)
    so = llama()

    async def target_is(value: float) -> bool:
        return (await client.evaluate(so)).value == value

    assert await target_is(5.0)  # 40 / 8

    volume.write(GOOD.format(tc=4))  # a good edit: takes effect without restart
    assert await wait_for(lambda: target_is(10.0))
    assert config_valid() == 1.0

    failures = reloads("failure")
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.settings.reload")
    volume.write(GOOD.format(tc="four") + "  bogusKey: 1\n")  # a bad edit
    assert await wait_for(lambda: asyncio.sleep(0, result=reloads("failure") > failures))
    assert config_valid() == 0.0
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "profiles.llama.targetConcurrency" in logged
    assert "server.bogusKey" in logged
    assert "keeping the last good config" in logged
    await asyncio.sleep(0.3)
    assert await target_is(10.0)  # the last good config stays in force
    assert reloads("failure") == failures + 1  # reported once, not on every poll

    volume.write("profiles: [not, a, mapping")  # broken YAML: rejected too
    assert await wait_for(lambda: asyncio.sleep(0, result=reloads("failure") == failures + 2))
    assert await target_is(10.0)

    volume.write(GOOD.format(tc=16))  # fixed: valid again, applied
    assert await wait_for(lambda: target_is(3.0))
    assert config_valid() == 1.0


async def test_deleted_profile_keeps_target_static_and_reports(start_server, tmp_path):
    """Removing a profile that workloads use is a valid edit, but those workloads hold their
    last target (fail static) instead of silently losing their tuning."""
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.format(tc=4))
    store = ConfigStore(load_config_file(path), str(path))
    server, client = await start_server(store=store, config_poll_s=0.1)
    so = llama()
    assert (await client.evaluate(so)).value == 10.0
    path.write_text(GOOD.replace("  llama:\n    targetConcurrency: {tc}\n", "  other: {}\n"))

    async def held() -> bool:
        decision = next(server.engine.decisions(), None)
        return decision is not None and decision.reason.value == "hold"

    assert await wait_for(held)
    decision = next(server.engine.decisions())
    assert decision.replicas == 10
    assert "'llama' is not a profile" in decision.faults[0]
    assert (await client.evaluate(so)).value == 10.0


# --- the watch loop, driven poll by poll ------------------------------------------------------


class Polls:
    """The watch's clock: each `step()` lets exactly one poll run and returns when it is done
    (when the watch asks for its next tick). Every wait is bounded."""

    def __init__(self, store: ConfigStore) -> None:
        self._go: asyncio.Queue[None] = asyncio.Queue()
        self._done: asyncio.Queue[None] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(store.watch(3600.0, self.stop, self._tick))

    async def _tick(self) -> None:
        await self._done.put(None)
        await self._go.get()

    async def start(self) -> None:
        await asyncio.wait_for(self._done.get(), 60)

    async def step(self, times: int = 1) -> None:
        for _ in range(times):
            await self._go.put(None)
            polled = asyncio.ensure_future(self._done.get())
            await asyncio.wait({polled, self.task}, timeout=60, return_when="FIRST_COMPLETED")
            assert not self.task.done(), "the watch loop ended"
            assert polled.done(), "no poll within 60 s"

    async def close(self) -> None:
        self.stop.set()
        await self._go.put(None)
        await asyncio.wait_for(self.task, 60)


async def watched_file(tmp_path: Path) -> tuple[Path, ConfigStore, Polls]:
    """A good config file, its store and the watch loop polling it (started)."""
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.format(tc=8))
    store = ConfigStore(load_config_file(path), str(path))
    polls = Polls(store)
    await polls.start()
    return path, store, polls


def laughs(levels: int) -> str:
    lines = ['l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join([*lines, f"defaults:\n  targetConcurrency: *l{levels}\n"])


def rejections(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_rejected_file_is_parsed_once_and_reported_once(tmp_path, caplog):
    """A bad file stays on disk for many polls: it is parsed once (by its digest), counted and
    logged once, in one line; a good edit after it is applied."""
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.settings.reload")
    path, store, polls = await watched_file(tmp_path)
    failures = reloads("failure")
    bad = "defaults:\n" + "".join(f"  colour{i}: {i}\n" for i in range(40))
    path.write_text(bad)
    await polls.step(20)
    assert store.parses == 1 and config_valid() == 0.0 and reloads("failure") == failures + 1
    [line] = rejections(caplog)
    assert "defaults.colour0: unknown key" in line and "and 6 more" in line
    assert len(line) <= MAX_MESSAGE_CHARS  # whole: the handler's own cut would lose the count
    path.write_text(GOOD.format(tc=4))
    await polls.step()
    assert store.current.profiles["llama"]["targetConcurrency"] == 4.0 and config_valid() == 1.0
    path.write_text(bad)  # the same bad file again: reported again, still not parsed again
    await polls.step(3)
    assert store.parses == 2 and reloads("failure") == failures + 2 and config_valid() == 0.0
    await polls.close()


async def test_a_billion_laughs_is_rejected_and_a_later_good_edit_applies(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.settings.reload")
    path, store, polls = await watched_file(tmp_path)
    path.write_text(laughs(9))
    await polls.step(5)
    assert config_valid() == 0.0 and store.parses == 1
    [line] = rejections(caplog)
    assert "nodes with its aliases expanded" in line
    path.write_text(GOOD.format(tc=2))
    await polls.step()
    assert store.current.profiles["llama"]["targetConcurrency"] == 2.0 and config_valid() == 1.0
    await polls.close()


async def test_the_watch_survives_any_fault_and_reports_it(tmp_path, caplog, monkeypatch):
    """A fault outside the file's problems (here the read raising, then the parse running out of
    memory): the loop keeps polling, config_valid is 0, each fault is counted and logged once,
    and the next good file is applied."""
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.settings.reload")
    path, store, polls = await watched_file(tmp_path)
    errors, failures = reloads("error"), reloads("failure")
    real_read, real_load = config_watch.read_config_bytes, config_watch.load_config_text

    def broken_read(_: object) -> bytes:
        raise RuntimeError("the volume went away")

    monkeypatch.setattr(config_watch, "read_config_bytes", broken_read)
    await polls.step(3)
    assert config_valid() == 0.0 and reloads("error") == errors + 1
    assert rejections(caplog) == [
        "config reload failed, keeping the last good config: RuntimeError: the volume went away"
    ]
    monkeypatch.setattr(config_watch, "read_config_bytes", real_read)

    def out_of_memory(*_: object) -> object:
        raise MemoryError

    monkeypatch.setattr(config_watch, "load_config_text", out_of_memory)
    path.write_text(GOOD.format(tc=3))
    await polls.step(3)
    assert config_valid() == 0.0 and store.parses == 1 and reloads("failure") == failures + 1
    assert "<file>: cannot be parsed: MemoryError" in rejections(caplog)[-1]
    monkeypatch.setattr(config_watch, "load_config_text", real_load)
    path.write_text(GOOD.format(tc=2))
    await polls.step()
    assert store.current.profiles["llama"]["targetConcurrency"] == 2.0 and config_valid() == 1.0
    await polls.close()


async def test_a_poll_parses_off_the_event_loop(tmp_path, monkeypatch):
    """The parse, once started, waits until the event loop has run something else: done on the
    loop, it would wait for ever (here: 30 s, then the reload fails)."""
    path, store, polls = await watched_file(tmp_path)
    parsing, loop_ran = threading.Event(), threading.Event()
    real_load = config_watch.load_config_text

    def load_after_the_loop_ran(*args: object) -> object:
        parsing.set()
        assert loop_ran.wait(30), "the event loop did not run while the file was parsed"
        return real_load(*args)

    monkeypatch.setattr(config_watch, "load_config_text", load_after_the_loop_ran)
    path.write_text(GOOD.format(tc=4))
    step = asyncio.create_task(polls.step())
    assert await asyncio.to_thread(parsing.wait, 30)
    loop_ran.set()  # the loop is running this test while the parse waits
    await step
    assert store.current.profiles["llama"]["targetConcurrency"] == 4.0
    await polls.close()
