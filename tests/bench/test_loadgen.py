"""`scaler bench loadgen`: open-loop replay of a trace against an endpoint.

Unit tests drive a tiny fake OpenAI/Triton HTTP server in this process (a thread on 127.0.0.1);
the `real_servers` tests drive the real vLLM and Triton harnesses (tests/servers/) and check, in
the servers' own metrics, that the requests arrived.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler.cli import main
from gpu_queue_scaler_bench.load.traffic import (
    LoadOptions,
    Outcome,
    Report,
    TensorSpec,
    TritonSender,
    drive,
    plan_requests,
    prompt_of,
    run_loadgen,
)
from tests.servers.base import write_reply
from tests.servers.ports import free_port
from tests.servers.triton import TritonServer
from tests.servers.vllm import VllmServer

JSON_KEYS = {
    "endpoint",
    "api",
    "requests",
    "sent",
    "completed",
    "errors",
    "shed",
    "duration_s",
    "achieved_rps",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
}


# ---- a fake endpoint ---------------------------------------------------------------------------


class FakeEndpoint:
    """OpenAI `/v1/models`, streaming `/v1/completions`, and a KServe v2 model `toy`.

    `first_chunk_s` before the first streamed chunk (or the Triton answer), `chunk_gap_s` between
    chunks; `status` answers every `fail_every`-th request with that status instead; `hang_s`
    holds every request that long (until close()). Records each POST's arrival time and body.
    """

    def __init__(self) -> None:
        self.first_chunk_s = 0.0
        self.chunk_gap_s = 0.0
        self.fail_every = 0
        self.status = 500
        self.hang_s = 0.0
        self.stream_error = False
        self.arrivals: list[float] = []
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, payload: Any) -> None:
                write_reply(self, status, json.dumps(payload).encode(), "application/json")

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": "fake-model"}]})
                elif self.path == "/v2/models/toy":
                    inputs = [
                        {"name": "x", "datatype": "FP32", "shape": [-1, 1]},
                        {"name": "ids", "datatype": "INT32", "shape": [-1, -1]},
                        {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
                        {"name": "max_tokens", "datatype": "INT32", "shape": [-1, 1]},
                        {"name": "temperature", "datatype": "FP32", "shape": [-1, 1]},
                    ]
                    self._json(200, {"name": "toy", "inputs": inputs})
                elif self.path == "/v2/models/toy/config":
                    optional = {"name": "temperature", "optional": True}
                    self._json(200, {"name": "toy", "max_batch_size": 8, "input": [optional]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.arrivals.append(time.monotonic())
                    endpoint.bodies.append(body)
                    n = len(endpoint.arrivals)
                if endpoint.hang_s:
                    endpoint.closing.wait(endpoint.hang_s)
                    return
                if endpoint.fail_every and n % endpoint.fail_every == 0:
                    self._json(endpoint.status, {"error": "injected"})
                    return
                if self.path == "/v1/completions":
                    self._stream(body)
                elif self.path == "/v2/models/toy/infer":
                    endpoint.closing.wait(endpoint.first_chunk_s)
                    self._json(200, {"model_name": "toy", "outputs": [{"name": "y", "data": [2]}]})
                else:
                    self._json(404, {"error": "not found"})

            def _stream(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                endpoint.closing.wait(endpoint.first_chunk_s)
                if endpoint.stream_error:
                    self.wfile.write(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
                    return
                for i in range(min(int(body["max_tokens"]), 4)):
                    if i:
                        endpoint.closing.wait(endpoint.chunk_gap_s)
                    chunk = {"choices": [{"index": 0, "text": " tok"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def fake() -> Iterator[FakeEndpoint]:
    with FakeEndpoint() as endpoint:
        yield endpoint


def write_trace(path: Path, times: list[float], inputs: int = 20, outputs: int = 8) -> str:
    lines = ["timestamp,input_tokens,output_tokens"]
    lines += [f"{t},{inputs + i % 5},{outputs + i % 3}" for i, t in enumerate(times)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def replay(trace: str, url: str, api: str = "openai", **kwargs: Any) -> Report:
    options = LoadOptions(endpoint=url, api=api, trace=trace, progress=False, **kwargs)  # type: ignore[arg-type]
    requests = plan_requests(
        trace, scale=options.scale, speedup=options.speedup, duration_s=options.duration_s
    )
    return await run_loadgen(options, requests)


# ---- the plan ------------------------------------------------------------------------------------


def test_plan_reuses_the_simulators_workload_with_speedup_and_scale(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", [0.0, 1.0, 2.5, 4.0])
    plain = plan_requests(trace)
    assert plain.arrivals_s.tolist() == [0.0, 1.0, 2.5, 4.0]  # the last one is not wrapped to 0
    assert plain.input_tokens.tolist() == [20, 21, 22, 23]
    fast = plan_requests(trace, speedup=2.0)
    assert np.allclose(fast.arrivals_s, plain.arrivals_s / 2)
    assert fast.input_tokens.tolist() == plain.input_tokens.tolist()
    assert plan_requests(trace, scale=3.0).count == 12
    assert plan_requests(trace, duration_s=2.0).arrivals_s.tolist() == [0.0, 1.0]
    assert plan_requests(trace, speedup=2.0, duration_s=2.0).count == 3  # 0, 0.5, 1.25 s
    with pytest.raises(ValueError, match="speedup"):
        plan_requests(trace, speedup=0.0)


def test_prompt_is_about_the_input_tokens_and_unique() -> None:
    assert len(prompt_of(7, 100).split()) == 2 + 96  # "request 7:" then the words
    assert prompt_of(1, 50) != prompt_of(2, 50)
    assert prompt_of(3, 1).startswith("request 3: ")


def test_triton_inputs_follow_the_metadata() -> None:
    sender = TritonSender(
        "toy",
        (
            TensorSpec("x", "FP32", (-1, 1)),
            TensorSpec("ids", "INT32", (-1, -1)),
            TensorSpec("text", "BYTES", (-1, 1)),
            TensorSpec("max_tokens", "INT32", (-1, 1)),
        ),
        batched=True,
        max_tokens=16,
        max_input_tokens=None,
    )
    tensors = {t["name"]: t for t in sender.body(5, 30, 100)["inputs"]}
    assert tensors["x"]["shape"] == [1, 1] and tensors["x"]["data"] == [1.0]
    assert tensors["ids"]["shape"] == [1, 30] and len(tensors["ids"]["data"]) == 30
    assert tensors["text"]["data"] == [prompt_of(5, 30)]
    assert tensors["max_tokens"]["data"] == [16]  # capped by --max-tokens


# ---- against the fake endpoint -------------------------------------------------------------------


async def test_open_loop_sends_without_waiting_for_answers(
    fake: FakeEndpoint, tmp_path: Path
) -> None:
    fake.first_chunk_s = 0.4  # slower than the gaps: a closed loop would fall behind
    fake.chunk_gap_s = 0.02
    times = [round(0.1 * i, 3) for i in range(10)]
    report = await replay(write_trace(tmp_path / "t.csv", times), fake.url, max_in_flight=50)
    t = report.tally
    assert (t.requests, t.sent, t.completed, t.shed, t.error_count) == (10, 10, 10, 0, 0)
    seen = np.array(fake.arrivals) - fake.arrivals[0]
    # Not after answers: each request takes >= 0.46 s at the endpoint, and at least 4 arrived
    # within 0.4 s of each other (a closed loop has 1 in flight); a stalled machine only bunches
    # them closer. The send times themselves: the test below, in the event loop's own time.
    assert max(int(np.sum((seen >= a) & (seen < a + 0.4))) for a in seen) >= 4, seen
    assert all(0.35 < ttft <= lat for ttft, lat in zip(t.ttfts_s, t.latencies_s, strict=True))
    assert min(t.latencies_s) >= 0.4 + 3 * 0.02 - 0.01  # 4 chunks streamed
    assert report.model == "fake-model"  # asked /v1/models
    body = fake.bodies[0]
    assert body["stream"] is True and body["model"] == "fake-model"
    assert body["max_tokens"] == 8 and body["ignore_eos"] is True
    assert len(body["prompt"].split()) == 2 + 20 - 4


@pytest.mark.looptime  # the event loop's clock is virtual: the schedule, not the machine's speed
async def test_open_loop_sends_at_the_traces_times_not_after_answers(tmp_path: Path) -> None:
    """Each request goes out at its trace time, to the microsecond of the loop's clock, while the
    earlier ones are still unanswered: every answer takes 0.45 s, the trace's gaps are 0.1 s, so
    from the fifth send on four are in flight (a closed loop would have none)."""
    loop = asyncio.get_running_loop()
    times = [round(0.1 * i, 3) for i in range(10)]
    requests = plan_requests(write_trace(tmp_path / "t.csv", times))
    sent_at: list[float] = []
    in_flight_at_send: list[int] = []
    in_flight = [0]

    async def send(client: httpx.AsyncClient, index: int, n_in: int, n_out: int) -> Outcome:
        sent_at.append(loop.time())
        in_flight_at_send.append(in_flight[0])
        in_flight[0] += 1
        try:
            await asyncio.sleep(0.45)
        finally:
            in_flight[0] -= 1
        return Outcome(None, 0.45, ttft_s=0.1)

    options = LoadOptions(endpoint="http://127.0.0.1:9", api="openai", trace="t", progress=False)
    async with httpx.AsyncClient() as client:
        began = loop.time()
        tally, _, _ = await drive(requests, send, client, options)
    assert (tally.sent, tally.completed, tally.shed, tally.error_count) == (10, 10, 0, 0)
    assert np.allclose(np.array(sent_at) - began, times, rtol=0, atol=1e-3), sent_at
    assert max(tally.send_lags_s) < 1e-3
    assert in_flight_at_send == [0, 1, 2, 3, 4, 4, 4, 4, 4, 4]


async def test_arrivals_beyond_max_in_flight_are_shed_not_queued(
    fake: FakeEndpoint, tmp_path: Path
) -> None:
    fake.first_chunk_s = 1.0
    times = [round(0.05 * i, 3) for i in range(10)]  # all within 0.5 s, each answer takes 1 s
    report = await replay(write_trace(tmp_path / "t.csv", times), fake.url, max_in_flight=3)
    t = report.tally
    assert (t.sent, t.shed, t.completed) == (3, 7, 3)
    assert len(fake.arrivals) == 3
    assert report.to_json()["achieved_rps"] < report.to_json()["offered_rps"]


async def test_duration_bounds_the_sending_and_the_drain_bounds_the_wait(
    fake: FakeEndpoint, tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "t.csv", [0.2 * i for i in range(500)])  # 100 s of trace
    # Counted, not timed: an unbounded run would send the whole trace (500), and without the
    # drain's bound the hung requests would end as answered or failed, not unfinished.
    report = await replay(trace, fake.url, duration_s=1.0)
    assert report.tally.requests == report.tally.sent == report.tally.completed == 5

    fake.hang_s = 30.0  # no answers: the drain ends the run, the rest are unfinished
    report = await replay(trace, fake.url, duration_s=0.5, drain_s=0.5)
    t = report.tally
    assert (t.sent, t.unfinished, t.completed, t.error_count) == (3, 3, 0, 0)


async def test_errors_are_counted_by_kind_and_never_stop_the_run(
    fake: FakeEndpoint, tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "t.csv", [0.02 * i for i in range(9)])
    fake.fail_every, fake.status = 3, 503
    report = await replay(trace, fake.url)
    assert report.tally.completed == 6 and report.tally.errors == {"http_503": 3}
    assert "injected" in report.tally.first_error["http_503"]

    fake.fail_every, fake.stream_error = 0, True
    report = await replay(trace, fake.url)
    assert report.tally.errors == {"stream_error": 9}

    fake.stream_error, fake.hang_s = False, 30.0
    report = await replay(trace, fake.url, timeout_s=0.3)
    assert report.tally.errors == {"timeout": 9} and report.tally.unfinished == 0

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    report = await replay(trace, closed, model="m")
    assert report.tally.errors == {"connection": 9}
    assert report.to_json()["latency_p50_s"] is None


async def test_triton_api_fills_inputs_from_metadata_and_ttft_is_latency(
    fake: FakeEndpoint, tmp_path: Path
) -> None:
    fake.first_chunk_s = 0.05
    trace = write_trace(tmp_path / "t.csv", [0.05 * i for i in range(6)])
    report = await replay(trace, fake.url, api="triton", model="toy", max_tokens=5)
    t = report.tally
    assert t.completed == 6 and t.ttfts_s == t.latencies_s
    assert any("TTFT is the full latency" in note for note in report.notes)
    tensors = {x["name"]: x for x in fake.bodies[0]["inputs"]}
    assert set(tensors) == {"x", "ids", "text", "max_tokens"}  # optional `temperature` left out
    assert tensors["ids"]["shape"] == [1, 20] and tensors["max_tokens"]["data"] == [5]


def test_cli_prints_one_json_object_and_progress_lines(
    fake: FakeEndpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.csv", [0.05 * i for i in range(8)])
    argv = ["bench", "loadgen", "--endpoint", fake.url, "--api", "openai", "--trace", trace]
    assert main([*argv, "--json", "--speedup", "2", "--max-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    found = json.loads(out)
    assert set(found) >= JSON_KEYS
    assert found["completed"] == found["sent"] == found["requests"] == 8
    assert found["ttft_p50_s"] <= found["latency_p50_s"]
    assert {b["max_tokens"] for b in fake.bodies} <= {2}
    assert "loadgen" in err and "sent" in err  # not a terminal: plain progress lines

    assert main([*argv, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "completed" in out and "TTFT s" in out and err == ""

    assert main([*argv, "--speedup", "0"]) == 2
    closed = f"http://127.0.0.1:{free_port()}"
    assert main([*argv[:2], "--endpoint", closed, *argv[4:], "--no-progress"]) == 1
    assert "/v1/models" in capsys.readouterr().err


# ---- against the real servers --------------------------------------------------------------------


def family_totals(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (name, f"{name}_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                total += sample.value
    return total


async def metrics_once_counted(
    http: httpx.AsyncClient, url: str, name: str, at_least: float, **labels: str
) -> str:
    """The server's /metrics once counter `name` reaches `at_least` (at most 5 s): a server
    can answer a request before it counts it, so a read right after the last answer may miss
    it. The caller still asserts the exact count, so over-counting fails."""
    text = (await http.get(url)).text
    for _ in range(50):
        if family_totals(text, name, **labels) >= at_least:
            break
        await asyncio.sleep(0.1)
        text = (await http.get(url)).text
    return text


@pytest.mark.real_servers
@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_real_vllm_serves_the_replayed_trace(vllm_server: VllmServer, tmp_path: Path) -> None:
    times = [0.25 * i for i in range(16)]  # 4 req/s for 4 s: more than 2 sequences can keep up
    trace = write_trace(tmp_path / "t.csv", times, inputs=40, outputs=12)
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        before = (await http.get(vllm_server.metrics_url)).text
        report = await replay(trace, vllm_server.url, timeout_s=40.0, drain_s=40.0)
        success = "vllm:request_success"
        after = await metrics_once_counted(
            http, vllm_server.metrics_url, success, family_totals(before, success) + 16
        )
    print("\n" + report.table())
    t = report.tally
    assert report.model == vllm_server.model
    assert t.completed == t.sent == 16 and t.error_count == 0, report.table()
    assert all(ttft <= lat for ttft, lat in zip(t.ttfts_s, t.latencies_s, strict=True))

    def grew(name: str) -> float:
        return family_totals(after, name) - family_totals(before, name)

    assert grew("vllm:request_success") == 16
    assert grew("vllm:generation_tokens") == 16 * 12 + sum(i % 3 for i in range(16))
    prompt_tokens = 16 * 40 + sum(i % 5 for i in range(16))
    assert 0.8 * prompt_tokens <= grew("vllm:prompt_tokens") <= 1.2 * prompt_tokens


@pytest.mark.real_servers
@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_real_triton_serves_the_replayed_trace(
    triton_server: TritonServer, tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "t.csv", [0.05 * i for i in range(20)])
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        before = (await http.get(triton_server.metrics_url)).text
        report = await replay(trace, triton_server.http_url, api="triton", model="toy")
        counted = family_totals(before, "nv_inference_request_success", model="toy") + 20
        after = await metrics_once_counted(
            http, triton_server.metrics_url, "nv_inference_request_success", counted, model="toy"
        )
    print("\n" + report.table())
    t = report.tally
    assert t.completed == t.sent == 20 and t.error_count == 0, report.table()
    # Each request waits at least one batch of the toy model.
    assert t.ttfts_s == t.latencies_s and min(t.latencies_s) >= 0.8 * triton_server.batch_sleep_s
    success = "nv_inference_request_success"
    grew = family_totals(after, success, model="toy") - family_totals(before, success, model="toy")
    assert grew == 20
