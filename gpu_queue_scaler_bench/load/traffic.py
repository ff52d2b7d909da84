"""`scaler bench loadgen`: replay a trace's arrivals and token lengths against a real endpoint.

Why: the simulator (`scaler bench replay`) checks the policy on a model of a fleet; a platform team
also wants to watch the real scaler size a real staging deployment under a known load. This module
sends the trace's requests, **open loop** (each at its arrival time, without waiting for earlier
answers, as independent users do), to an OpenAI-compatible server (vLLM) or to Triton's KServe v2
HTTP API, and reports what it achieved: rate, errors by kind, latency and TTFT percentiles.

The trace becomes requests through :func:`gpu_queue_scaler_bench.sim.workload.build_requests`,
exactly as in the simulator (rate files expanded, `--scale` superposition, tokens drawn when the
trace has none); `--speedup X` then runs the trace's clock X times faster (the same requests in 1/X
of the time).

Bounds: the run stops sending at `--duration` (or the trace's end), requests still in flight get at
most `--drain` more seconds and are then cancelled (counted `unfinished`); each request has its own
`--timeout`; at most `--max-in-flight` requests are outstanding, and an arrival that finds them all
busy is **shed** (counted, never queued: a queue inside the load generator would hide the server's).

OpenAI: `POST /v1/completions` with `stream: true`; TTFT is the time to the first streamed chunk;
the prompt is about the trace's input tokens (one common word is one token in Llama-style and
GPT-style vocabularies; a per-request prefix defeats prefix caching), `max_tokens` the output tokens
(capped by `--max-tokens`), `ignore_eos` so answers are that long (vLLM). Triton: `POST
/v2/models/{model}/infer` with input tensors filled from the model's metadata; a non-decoupled model
answers all at once, so its TTFT **is** its latency. Only httpx and the stdlib here; tqdm (the `sim`
extra) is imported only for a progress bar on a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import httpx

from gpu_queue_scaler.sources.httpclient import async_client
from gpu_queue_scaler_bench.load import quantile
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import TraceError, load_trace

Api = Literal["openai", "triton"]
APIS: tuple[Api, ...] = ("openai", "triton")

# Words that are one token each in Llama (SentencePiece) and GPT (BPE) vocabularies.
WORDS = ("once", "upon", "a", "time", "there", "was", "a", "little", "fox", "in", "the", "river")
PREFIX_TOKENS = 4  # "request 123:" is about four tokens
MAX_TENSOR_ELEMENTS = 1_000_000  # a Triton input never gets more elements than this
ERROR_BODY_CHARS = 300
PLAIN_PROGRESS_EVERY_S = 5.0
LATE_S = 0.1  # a p99 send lag above this is reported: the run was not the trace's schedule


class LoadgenError(Exception):
    """The endpoint cannot be driven at all (e.g. no model to name); the message says why."""


@dataclass(frozen=True)
class LoadOptions:
    endpoint: str
    api: Api
    trace: str
    scale: float = 1.0
    speedup: float = 1.0
    duration_s: float | None = None
    max_in_flight: int = 256
    timeout_s: float = 60.0
    drain_s: float = 30.0
    model: str | None = None
    max_tokens: int | None = None
    max_input_tokens: int | None = None
    ignore_eos: bool = True
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class Outcome:
    """One request's end: `error` is None on success, else its kind (`http_503`, `timeout`...)."""

    error: str | None
    latency_s: float
    ttft_s: float | None = None
    detail: str = ""


@dataclass
class Tally:
    """Counts as the run goes (read by the progress display), and each completion's timings."""

    requests: int = 0
    sent: int = 0
    shed: int = 0
    completed: int = 0
    unfinished: int = 0
    in_flight: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    send_lags_s: list[float] = field(default_factory=list)
    first_error: dict[str, str] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def record(self, outcome: Outcome) -> None:
        if outcome.error is None:
            self.completed += 1
            self.latencies_s.append(outcome.latency_s)
            self.ttfts_s.append(
                outcome.latency_s
                if outcome.ttft_s is None
                else min(outcome.ttft_s, outcome.latency_s)
            )
        else:
            self.errors[outcome.error] += 1
            if outcome.detail:
                self.first_error.setdefault(outcome.error, outcome.detail)


@dataclass(frozen=True)
class Report:
    endpoint: str
    api: Api
    model: str
    tally: Tally
    duration_s: float
    send_window_s: float
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        t = self.tally
        window = max(self.send_window_s, 1e-9)
        return {
            "endpoint": self.endpoint,
            "api": self.api,
            "model": self.model,
            "requests": t.requests,
            "sent": t.sent,
            "completed": t.completed,
            "errors": t.error_count,
            "shed": t.shed,
            "unfinished": t.unfinished,
            "errors_by_kind": dict(sorted(t.errors.items())),
            "duration_s": round(self.duration_s, 3),
            "offered_rps": round(t.requests / window, 3),
            "achieved_rps": round(t.sent / window, 3),
            "completed_rps": round(t.completed / max(self.duration_s, 1e-9), 3),
            "latency_p50_s": _quantile(t.latencies_s, 0.50),
            "latency_p99_s": _quantile(t.latencies_s, 0.99),
            "ttft_p50_s": _quantile(t.ttfts_s, 0.50),
            "ttft_p99_s": _quantile(t.ttfts_s, 0.99),
            "send_lag_p99_s": _quantile(t.send_lags_s, 0.99),
        }

    def table(self) -> str:
        data = self.to_json()

        def show(value: Any) -> str:
            if value is None:
                return "-"
            return f"{value:.3f}" if isinstance(value, float) else str(value)

        rows = [
            ("endpoint", f"{self.endpoint} ({self.api}, model {self.model})"),
            ("requests", f"{data['requests']} in the trace window of {self.send_window_s:.1f} s"),
            ("sent", f"{data['sent']} (shed {data['shed']} at --max-in-flight)"),
            (
                "completed",
                f"{data['completed']} (errors {data['errors']}, unfinished {data['unfinished']})",
            ),
            (
                "rate req/s",
                f"offered {show(data['offered_rps'])}, achieved {show(data['achieved_rps'])}, "
                f"completed {show(data['completed_rps'])}",
            ),
            (
                "latency s",
                f"p50 {show(data['latency_p50_s'])}, p99 {show(data['latency_p99_s'])}",
            ),
            ("TTFT s", f"p50 {show(data['ttft_p50_s'])}, p99 {show(data['ttft_p99_s'])}"),
            ("send lag p99 s", show(data["send_lag_p99_s"])),
            ("duration s", show(data["duration_s"])),
        ]
        lines = [f"{key:>14}: {value}" for key, value in rows]
        for kind, count in data["errors_by_kind"].items():
            detail = self.tally.first_error.get(kind, "")
            lines.append(
                f"{'error':>14}: {kind} x{count}" + (f" (first: {detail})" if detail else "")
            )
        lines.extend(f"{'note':>14}: {note}" for note in self.notes)
        return "\n".join(lines)


def _quantile(values: Sequence[float], q: float) -> float | None:
    return round(quantile(values, q), 6) if values else None


# ---- the plan: trace -> requests -----------------------------------------------------------------


def plan_requests(
    trace_path: str,
    *,
    scale: float = 1.0,
    speedup: float = 1.0,
    duration_s: float | None = None,
    seed: int = 0,
) -> Requests:
    """The requests to send, arrival times in wall seconds from the start (after `speedup`)."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"--speedup must be a positive number, got {speedup!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"--duration must be a positive number of seconds, got {duration_s!r}")
    trace = load_trace(trace_path)
    requests = build_requests(
        trace,
        scale=scale,
        seed=seed,
        duration_s=None if duration_s is None else duration_s * speedup,
    )
    if speedup == 1.0:
        return requests
    return Requests(
        arrivals_s=requests.arrivals_s / speedup,
        input_tokens=requests.input_tokens,
        output_tokens=requests.output_tokens,
        duration_s=requests.duration_s / speedup,
        name=requests.name,
    )


def prompt_of(index: int, tokens: int) -> str:
    """About `tokens` tokens: a unique prefix (no prefix-cache hits), then common words."""
    words = max(1, tokens - PREFIX_TOKENS)
    body = " ".join(WORDS[(index + k) % len(WORDS)] for k in range(words))
    return f"request {index}: {body}"


# ---- senders -------------------------------------------------------------------------------------

Send = Callable[[httpx.AsyncClient, int, int, int], Awaitable[Outcome]]


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection"
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.NetworkError):
        return "connection"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ProtocolError):
        return "protocol"
    if isinstance(exc, ValueError | KeyError | TypeError):
        return "bad_response"
    return "other"


async def _http_error(response: httpx.Response, began: float) -> Outcome:
    try:
        text = (await response.aread()).decode(errors="replace")
    except httpx.HTTPError:
        text = ""
    return Outcome(
        f"http_{response.status_code}",
        time.monotonic() - began,
        detail=" ".join(text.split())[:ERROR_BODY_CHARS],
    )


@dataclass(frozen=True)
class OpenAISender:
    """Streaming `/v1/completions`; TTFT = the first `data:` chunk."""

    model: str
    max_tokens: int | None
    max_input_tokens: int | None
    ignore_eos: bool

    async def __call__(
        self, client: httpx.AsyncClient, index: int, input_tokens: int, output_tokens: int
    ) -> Outcome:
        if self.max_input_tokens is not None:
            input_tokens = min(input_tokens, self.max_input_tokens)
        if self.max_tokens is not None:
            output_tokens = min(output_tokens, self.max_tokens)
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_of(index, input_tokens),
            "max_tokens": max(1, output_tokens),
            "stream": True,
            "temperature": 0.0,
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        began = time.monotonic()
        ttft: float | None = None
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return await _http_error(response, began)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                if ttft is None:
                    ttft = time.monotonic() - began
                if '"error"' in payload:  # vLLM reports a failure inside the stream
                    found = json.loads(payload)
                    if isinstance(found, dict) and (
                        "error" in found or found.get("object") == "error"
                    ):
                        detail = json.dumps(found.get("error", found))[:ERROR_BODY_CHARS]
                        return Outcome("stream_error", time.monotonic() - began, detail=detail)
        latency = time.monotonic() - began
        if ttft is None:
            return Outcome("empty_response", latency, detail="no data chunk in the stream")
        return Outcome(None, latency, ttft)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TritonSender:
    """KServe v2 `/infer`; a non-decoupled model answers once, so TTFT = latency.

    Inputs are filled from the model's metadata: BYTES inputs get the prompt; an integer input
    named like `max_tokens` / `*output_len*` gets the output tokens; other inputs get ones, each
    variable dimension after the batch one sized to the input tokens (a token sequence).
    """

    model: str
    inputs: tuple[TensorSpec, ...]
    batched: bool
    max_tokens: int | None
    max_input_tokens: int | None

    def body(self, index: int, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        if self.max_input_tokens is not None:
            input_tokens = min(input_tokens, self.max_input_tokens)
        if self.max_tokens is not None:
            output_tokens = min(output_tokens, self.max_tokens)
        tensors: list[dict[str, Any]] = []
        for spec in self.inputs:
            lowered = spec.name.lower()
            is_bytes = spec.datatype == "BYTES"
            is_int = spec.datatype.startswith(("INT", "UINT"))
            is_length = is_int and ("max_tokens" in lowered or "output_len" in lowered)
            shape: list[int] = []
            for position, dim in enumerate(spec.shape):
                if position == 0 and self.batched:
                    shape.append(1)
                elif dim >= 0:
                    shape.append(dim)
                else:
                    shape.append(1 if (is_bytes or is_length) else max(1, input_tokens))
            count = math.prod(shape)
            if count > MAX_TENSOR_ELEMENTS:
                raise ValueError(f"input {spec.name}: {count} elements (shape {shape}) is too many")
            data: list[Any]
            if is_bytes:
                data = [prompt_of(index, input_tokens)] * count
            elif is_length:
                data = [max(1, output_tokens)] * count
            elif spec.datatype == "BOOL":
                data = [False] * count
            elif is_int:
                data = [1] * count
            else:
                data = [1.0] * count
            tensors.append(
                {"name": spec.name, "shape": shape, "datatype": spec.datatype, "data": data}
            )
        return {"inputs": tensors}

    async def __call__(
        self, client: httpx.AsyncClient, index: int, input_tokens: int, output_tokens: int
    ) -> Outcome:
        body = self.body(index, input_tokens, output_tokens)
        began = time.monotonic()
        async with client.stream("POST", f"/v2/models/{self.model}/infer", json=body) as response:
            if response.status_code != 200:
                return await _http_error(response, began)
            content = await response.aread()
        latency = time.monotonic() - began
        answer = json.loads(content)
        if not isinstance(answer, dict) or "outputs" not in answer:
            return Outcome("bad_response", latency, detail=content[:ERROR_BODY_CHARS].decode())
        return Outcome(None, latency, latency)


async def _get_json(client: httpx.AsyncClient, method: str, path: str) -> Any:
    try:
        response = await client.request(method, path, json={} if method == "POST" else None)
    except httpx.HTTPError as exc:
        raise LoadgenError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise LoadgenError(f"{method} {path}: HTTP {response.status_code} {response.text[:200]}")
    try:
        return response.json()
    except ValueError:
        raise LoadgenError(f"{method} {path}: not JSON") from None


async def make_sender(
    client: httpx.AsyncClient, options: LoadOptions
) -> tuple[Send, str, tuple[str, ...]]:
    """The sender for `options.api`, the model it names, and notes for the report."""
    if options.api == "openai":
        return await _openai_sender(client, options)
    return await _triton_sender(client, options)


async def _openai_sender(
    client: httpx.AsyncClient, options: LoadOptions
) -> tuple[Send, str, tuple[str, ...]]:
    notes: list[str] = []
    model = options.model
    if model is None:
        listed = await _get_json(client, "GET", "/v1/models")
        found = listed.get("data", []) if isinstance(listed, dict) else []
        ids = [m["id"] for m in found if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if not ids:
            raise LoadgenError("GET /v1/models lists no model; pass --model")
        model = str(ids[0])
        if len(ids) > 1:
            notes.append(f"/v1/models lists {len(ids)} models; using {model} (see --model)")
    sender = OpenAISender(model, options.max_tokens, options.max_input_tokens, options.ignore_eos)
    return sender, model, tuple(notes)


async def _triton_sender(
    client: httpx.AsyncClient, options: LoadOptions
) -> tuple[Send, str, tuple[str, ...]]:
    notes: list[str] = []
    model = options.model
    if model is None:
        index = await _get_json(client, "POST", "/v2/repository/index")
        ready = [m["name"] for m in index if isinstance(m, dict) and m.get("state") == "READY"]
        if len(set(ready)) != 1:
            raise LoadgenError(f"pass --model: the repository has {sorted(set(ready))} ready")
        model = str(ready[0])
    metadata = await _get_json(client, "GET", f"/v2/models/{model}")
    config: dict[str, Any] = {}
    with contextlib.suppress(LoadgenError):
        found = await _get_json(client, "GET", f"/v2/models/{model}/config")
        config = found if isinstance(found, dict) else {}
    optional = {
        str(i.get("name"))
        for i in config.get("input", [])
        if isinstance(i, dict) and i.get("optional")
    }
    inputs = tuple(
        TensorSpec(str(i["name"]), str(i["datatype"]), tuple(int(d) for d in i["shape"]))
        for i in metadata.get("inputs", [])
        if str(i.get("name")) not in optional
    )
    if not inputs:
        raise LoadgenError(f"model {model}: its metadata lists no required input")
    batched = (
        int(config.get("max_batch_size", 0) or 0) > 0 if config else inputs[0].shape[:1] == (-1,)
    )
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        notes.append(f"model {model} is decoupled: /infer may refuse it; TTFT here is latency")
    else:
        notes.append("Triton /infer answers at once: TTFT is the full latency")
    triton = TritonSender(model, inputs, batched, options.max_tokens, options.max_input_tokens)
    return triton, model, tuple(notes)


# ---- the run -------------------------------------------------------------------------------------


async def _one(
    send: Send,
    client: httpx.AsyncClient,
    index: int,
    input_tokens: int,
    output_tokens: int,
    timeout_s: float,
) -> Outcome:
    began = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            return await send(client, index, input_tokens, output_tokens)
    except Exception as exc:  # every failure is counted by kind; the run never crashes on one
        detail = f"{type(exc).__name__}: {exc}"[:ERROR_BODY_CHARS]
        return Outcome(_error_kind(exc), time.monotonic() - began, detail=detail)


Progress = Callable[[Tally, float], None]


async def drive(
    requests: Requests,
    send: Send,
    client: httpx.AsyncClient,
    options: LoadOptions,
    *,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> tuple[Tally, float, float]:
    """Send every request at its time, open loop; returns the tally, run and send-window seconds."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    tally = Tally(requests=requests.count)
    tasks: set[asyncio.Task[None]] = set()
    limit = options.duration_s if options.duration_s is not None else math.inf
    window = min(requests.duration_s, limit)

    async def run_one(index: int, n_in: int, n_out: int) -> None:
        try:
            tally.record(await _one(send, client, index, n_in, n_out, options.timeout_s))
        finally:
            tally.in_flight -= 1

    async def ticker(began: float) -> None:
        assert progress is not None
        while True:
            progress(tally, loop.time() - began)
            await asyncio.sleep(0.25)

    began = loop.time()
    ticking = asyncio.create_task(ticker(began)) if progress is not None else None
    arrivals = requests.arrivals_s.tolist()
    inputs = requests.input_tokens.tolist()
    outputs = requests.output_tokens.tolist()
    try:
        for index, (at, n_in, n_out) in enumerate(zip(arrivals, inputs, outputs, strict=True)):
            if at >= limit or stop.is_set():
                break
            delay = began + at - loop.time()
            if delay > 0.2:  # a long gap: wake at once if stopped
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            elif delay > 0:
                await asyncio.sleep(delay)
            if loop.time() - began >= limit:  # fell behind past the duration
                break
            if tally.in_flight >= options.max_in_flight:
                tally.shed += 1
                continue
            tally.send_lags_s.append(max(0.0, loop.time() - began - at))
            tally.sent += 1
            tally.in_flight += 1
            task = asyncio.create_task(run_one(index, int(n_in), int(n_out)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if not stop.is_set():  # the trace's quiet tail is part of the load too
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, began + window - loop.time()))
        window = loop.time() - began if stop.is_set() else max(window, loop.time() - began)
        if tasks:
            pending = set(tasks)
            drain_end = loop.time() + options.drain_s
            while pending and not stop.is_set() and loop.time() < drain_end:
                _, pending = await asyncio.wait(
                    pending, timeout=min(0.25, max(0.0, drain_end - loop.time()))
                )
    finally:
        left = [t for t in tasks if not t.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
        tally.unfinished = len(left)
        tally.in_flight = 0
        if ticking is not None:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
    return tally, loop.time() - began, window


async def run_loadgen(
    options: LoadOptions,
    requests: Requests,
    *,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> Report:
    """Find the model, then drive the endpoint; raises LoadgenError if it cannot start."""
    if options.max_in_flight < 1:
        raise ValueError("--max-in-flight must be at least 1")
    for name, value in (("--timeout", options.timeout_s), ("--drain", options.drain_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a non-negative number of seconds")
    timeout = httpx.Timeout(options.timeout_s, pool=options.timeout_s)
    # Idle connections are reused only briefly (gpu_queue_scaler.sources.httpclient): a trace's gaps
    # outlast a server's keep-alive timer, and a request crossing it would count as the server's
    # error.
    async with async_client(
        max_connections=options.max_in_flight + 2,  # never wait on the pool: shed instead
        max_keepalive_connections=options.max_in_flight,
        base_url=options.endpoint.rstrip("/"),
        timeout=timeout,
    ) as client:
        send, model, notes = await make_sender(client, options)
        tally, elapsed, window = await drive(
            requests, send, client, options, stop=stop, progress=progress
        )
    lag = _quantile(tally.send_lags_s, 0.99)
    if lag is not None and lag > LATE_S:
        notes += (
            f"1% of requests left over {lag:.2f} s late: this process was starved of CPU or "
            "blocked, so the achieved load is not the trace's (run it on a machine of its own)",
        )
    return Report(options.endpoint, options.api, model, tally, elapsed, window, notes)


# ---- the command ---------------------------------------------------------------------------------


def _progress_display(total: int, stream: TextIO) -> tuple[Progress, Callable[[], None]]:
    """A tqdm bar when `stream` is a terminal and tqdm is installed, else a plain line every 5 s."""
    bar: Any = None
    if stream.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            bar = None
        else:
            bar = tqdm(total=total, unit="req", file=stream, leave=False, desc="loadgen")
    last = [-math.inf]

    def update(tally: Tally, elapsed_s: float) -> None:
        if bar is not None:
            bar.n = tally.sent + tally.shed
            counts = {
                "in_flight": tally.in_flight,
                "ok": tally.completed,
                "err": tally.error_count,
                "shed": tally.shed,
            }
            bar.set_postfix(counts, refresh=False)
            bar.refresh()
            return
        if elapsed_s - last[0] >= PLAIN_PROGRESS_EVERY_S:
            last[0] = elapsed_s
            print(
                f"loadgen {elapsed_s:6.1f}s: sent {tally.sent}/{total}, in flight "
                f"{tally.in_flight}, completed {tally.completed}, errors {tally.error_count}, "
                f"shed {tally.shed}",
                file=stream,
                flush=True,
            )

    def close() -> None:
        if bar is not None:
            bar.close()

    return update, close


def run_command(options: LoadOptions, *, as_json: bool = False) -> int:
    """`scaler bench loadgen`: 0 when something completed, 1 when nothing did, 2 on bad input."""
    try:
        requests = plan_requests(
            options.trace,
            scale=options.scale,
            speedup=options.speedup,
            duration_s=options.duration_s,
            seed=options.seed,
        )
    except (TraceError, ValueError) as exc:
        print(f"scaler bench loadgen: {exc}", file=sys.stderr)
        return 2
    progress, close = (
        _progress_display(requests.count, sys.stderr) if options.progress else (None, None)
    )

    async def main() -> Report:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGINT, stop.set)  # first Ctrl-C: stop and report
        try:
            return await run_loadgen(options, requests, stop=stop, progress=progress)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    try:
        report = asyncio.run(main())
    except (LoadgenError, ValueError) as exc:
        print(f"scaler bench loadgen: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    finally:
        if close is not None:
            close()
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        print(report.table())
    return 0 if report.tally.completed > 0 or report.tally.sent == 0 else 1


def options_from(args: Any) -> LoadOptions:
    """LoadOptions from `scaler bench loadgen`'s parsed arguments (see gpu_queue_scaler.cli)."""
    return LoadOptions(
        endpoint=args.endpoint,
        api=args.api,
        trace=args.trace,
        scale=args.scale,
        speedup=args.speedup,
        duration_s=args.duration,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        drain_s=args.drain,
        model=args.model,
        max_tokens=args.max_tokens,
        max_input_tokens=args.max_input_tokens,
        ignore_eos=not args.no_ignore_eos,
        seed=args.seed,
        progress=not args.no_progress,
    )
