"""The Prometheus harness itself: real scrapes, label selectors, live changes, crash + restart."""

from __future__ import annotations

import time

import pytest

from tests.servers.prometheus import MetricsEndpoint, sample_value

pytestmark = pytest.mark.real_servers

SERIES = 'vllm:num_requests_waiting{namespace="inference"}'


def vllm_body(waiting: float) -> str:
    """A slice of vLLM 0.32's /metrics (HELP/TYPE as in metrics-samples)."""
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(waiting)}\n'
    )


def test_prometheus_scrapes_relabels_follows_changes_and_survives_a_crash(
    start_prometheus,
) -> None:
    with MetricsEndpoint(vllm_body(7)) as pod:
        prom = start_prometheus(
            {"vllm": [pod.target]},
            scrape_interval_s=1.0,
            relabel={"vllm": {"namespace": "inference", "pod": "llama-0"}},
        )
        # The first scrape lands a few seconds after start (target discovery is throttled).
        result = prom.wait_for_series(SERIES, timeout_s=30)
        assert prom.started_at is not None
        first_series_s = time.monotonic() - prom.started_at
        assert sample_value(result) == 7.0
        labels = result[0]["metric"]
        assert labels["pod"] == "llama-0"
        assert labels["model_name"] == "m"
        assert labels["engine"] == "0"
        assert labels["job"] == "vllm"
        assert prom.query('vllm:num_requests_waiting{namespace="other"}') == []
        assert pod.requests >= 1

        pod.body = vllm_body(9)
        prom.wait_until(SERIES, lambda r: len(r) == 1 and sample_value(r) == 9.0, timeout_s=5)

        crashed_at = time.time()
        prom.kill()
        assert not prom.running()
        port = prom.port
        prom.restart()
        assert prom.port == port

        # History from before the crash comes back from the WAL: evaluated points...
        now = time.time()
        points = prom.query_range(SERIES, start=now - 60, end=now, step=1)
        assert len(points) == 1, points
        before = [float(v) for t, v in points[0]["values"] if t < crashed_at]
        assert 7.0 in before, points
        # ...and the raw samples, including the last one scraped before the SIGKILL.
        raw = prom.query(f"{SERIES}[1m]", at=now)
        assert len(raw) == 1, raw
        samples = [(t, float(v)) for t, v in raw[0]["values"]]
        assert {v for t, v in samples if t < crashed_at} == {7.0, 9.0}, samples
        print(f"start to first series: {first_series_s:.1f} s")
