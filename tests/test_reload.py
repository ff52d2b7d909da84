"""ConfigMap hot reload on a real server: a good edit takes effect, a bad one is rejected loudly
and the last good config stays in force, including through Kubernetes' symlink swap."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from prometheus_client import REGISTRY

from scaler.config import load_config_file
from scaler.config_watch import ConfigStore
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
    caplog.set_level(logging.ERROR, logger="scaler.config_watch")
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
