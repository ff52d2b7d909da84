"""The simulated inference fleet of one workload: its queue, its replicas, what they serve.

Why this shape: the scaler reads queue signals (waiting, running, queue time, KV pressure) and the
baselines read GPU utilization or queue depth, so the fleet must produce all of them from the same
requests. One FIFO queue per workload (what an inference gateway in front of the pods holds; it
also makes the waiting count visible at zero replicas) feeds the ready replicas, least loaded
first. Each replica runs continuous batching (`gpu_queue_scaler_bench.sim.profiles` has the model):
prefill first come first served, decode of every running request per iteration, iterations slower
with more requests. Time advances in fixed steps of `dt`; within a step, per-request work is
vectorised with numpy and arrival, first-token and finish times are interpolated inside the step, so
one request alone takes exactly prefill + decode time whatever `dt` is.

Signals follow `gpu_queue_scaler.catalog` for vLLM: waiting and running are gauges; arrival_rate is
rate(success) + deriv(waiting) + deriv(running) over the rate window, at least 0; queue time mean
and p99 come from the queue-time histogram of requests admitted in the window (p99 with
Prometheus's `histogram_quantile` on vLLM's buckets), TTFT p99 likewise; kv_cache_usage is the
hottest replica's; ready_pods counts the replicas that are ready and serving; service_time_s (a
field being added to the catalog) is the mean time completed requests held a slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources.window import histogram_quantile
from gpu_queue_scaler_bench.sim.profiles import ServiceProfile
from gpu_queue_scaler_bench.sim.workload import Requests

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py): request_queue_time_seconds uses the request
# latency buckets, time_to_first_token_seconds its own.
QUEUE_TIME_BUCKETS = np.array(
    [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
     240.0, 480.0, 960.0, 1920.0, 7680.0]
)  # fmt: skip
TTFT_BUCKETS = np.array(
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
)  # fmt: skip
_LEVEL_SEARCH_MAX = 64  # bisection steps of the least-loaded fill (bounded)


def _quantile(q: float, observations: FloatArray, bounds: FloatArray) -> float | None:
    """Prometheus's histogram_quantile on these observations bucketed at `bounds` (+Inf added)."""
    if observations.size == 0:
        return None
    counts = np.searchsorted(np.sort(observations), bounds, side="right").astype(np.float64)
    cumulative = [(float(b), float(c)) for b, c in zip(bounds, counts, strict=True)]
    cumulative.append((math.inf, float(observations.size)))
    return histogram_quantile(q, cumulative)


def fill_least_loaded(running: IntArray, allowance: IntArray, wanted: int) -> IntArray:
    """How many of `wanted` requests each replica takes, least loaded first (water-filling):
    the load balancer of a gateway that routes to the replica with the fewest requests."""
    take = np.zeros(running.size, dtype=np.int64)
    total = int(allowance.sum())
    wanted = min(wanted, total)
    if wanted <= 0:
        return take
    lo, hi = int(running.min()), int((running + allowance).max())
    for _ in range(_LEVEL_SEARCH_MAX):  # smallest level L with sum(clip(L - running)) >= wanted
        if lo >= hi:
            break
        mid = (lo + hi) // 2
        if int(np.minimum(np.maximum(mid - running, 0), allowance).sum()) >= wanted:
            hi = mid
        else:
            lo = mid + 1
    take = np.minimum(np.maximum(lo - 1 - running, 0), allowance)
    rest = wanted - int(take.sum())
    if rest > 0:
        room = np.flatnonzero(take < allowance)
        room = room[running[room] + take[room] <= lo - 1]
        take[room[:rest]] += 1
    return take


@dataclass
class StepStats:
    """What one step left behind, for the autoscalers' metrics and the report."""

    waiting: int
    running: int
    busy: FloatArray  # per serving replica, share of the step a kernel ran (DCGM GPU_UTIL)
    kv_max: float | None


class ServingFleet:
    """The queue and the replicas of one workload. Replicas are named by integer pod ids that
    `gpu_queue_scaler_bench.sim.cluster` hands out; the fleet only learns which are serving each
    step."""

    def __init__(
        self,
        requests: Requests,
        service: ServiceProfile,
        dt: float,
        n_steps: int,
        max_wait_s: float,
        rate_window_s: float = 60.0,
        preemption: bool = False,
    ) -> None:
        self.req = requests
        self.preemption = preemption
        self.svc = service
        self.dt = dt
        self.max_wait_s = max_wait_s
        self.rate_window_s = rate_window_s
        n = requests.count
        self.admit_t = np.full(n, np.nan)
        self.first_token_t = np.full(n, np.nan)
        self.finish_t = np.full(n, np.nan)
        self.pod_of = np.full(n, -1, dtype=np.int64)
        self.dropped = np.zeros(n, dtype=bool)
        self.head = 0  # next request to admit (FIFO on arrival order)
        self.arrived = 0
        # The running set, compact; admission order is the FCFS order of prefill.
        self.r_id = np.zeros(0, dtype=np.int64)
        self.r_pod = np.zeros(0, dtype=np.int64)
        self.r_start = np.zeros(0)  # offset in the current step when the request joined
        self.r_prefill = np.zeros(0)  # prompt tokens still to prefill
        self.r_decode = np.zeros(0)  # output tokens still to decode (the first comes from prefill)
        # Requests preempted for KV (`preemption`), oldest preemption first: what each must
        # prefill again (its prompt and what it generated) and decode still. vLLM puts them at
        # the front of its waiting queue and schedules them before any new request.
        self.p_id = np.zeros(0, dtype=np.int64)
        self.p_prefill = np.zeros(0)
        self.p_decode = np.zeros(0)
        self.preemptions = 0
        # Per-step history for rate-window signals (index k = state at the end of step k).
        self.k = -1
        self.h_waiting = np.zeros(n_steps + 1, dtype=np.int64)
        self.h_running = np.zeros(n_steps + 1, dtype=np.int64)
        self.h_done = np.zeros(n_steps + 1, dtype=np.int64)  # cumulative completions
        self.h_infer = np.zeros(n_steps + 1)  # cumulative seconds completed requests ran
        # Cumulative prompt and generated tokens, counted as vLLM V1 counts them
        # (vllm/v1/metrics/stats.py, IterationStats): a prompt's tokens when its prefill
        # completes, generated tokens at every decode iteration. Counted at completion instead,
        # a long answer would land in one step and the token rates would jump with it.
        self.h_prompt = np.zeros(n_steps + 1)
        self.h_generated = np.zeros(n_steps + 1)
        self.h_head = np.zeros(n_steps + 1, dtype=np.int64)  # cumulative admitted (FIFO index)
        self.h_ttft = np.zeros((n_steps + 1, TTFT_BUCKETS.size + 1), dtype=np.int64)
        self.completed = 0
        self.infer_s = 0.0
        self.prompt_tokens = 0.0
        self.generated_tokens = 0.0
        self.kv_max: float | None = None
        self.kv_mean: float | None = None
        self.serving_count = 0
        self._kv_by_pod = np.zeros(0)  # KV tokens per pod id after the last step
        self._prefill_by_pod = np.zeros(0)  # prompt tokens not yet prefilled, per pod id

    # --- the queue ----------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """vLLM's num_requests_waiting: new requests not yet scheduled and preempted ones."""
        return self.arrived - self.head + int(self.p_id.size)

    @property
    def running(self) -> int:
        return int(self.r_id.size)

    def running_per_pod(self, pods: IntArray) -> IntArray:
        """Running requests on each of `pods` (0 for a pod the fleet never saw)."""
        if pods.size == 0:
            return np.zeros(0, dtype=np.int64)
        size = max(int(pods.max()), int(self.r_pod.max()) if self.r_pod.size else 0) + 1
        return np.bincount(self.r_pod, minlength=size)[pods].astype(np.int64)

    def drain_bound_s(self, pods: IntArray) -> FloatArray:
        """An upper bound on how long each of `pods` takes to finish its running requests if it
        gets no new ones (a deleted pod draining): its prompt tokens left at the slowest
        prefill share of its batch, then the longest decode left at the iteration time of its
        current batch (a draining batch only shrinks, so iterations only get faster)."""
        out = np.zeros(pods.size)
        if pods.size == 0 or self.r_id.size == 0:
            return out
        svc = self.svc
        size = max(int(pods.max()), int(self.r_pod.max())) + 1
        n = np.bincount(self.r_pod, minlength=size).astype(np.float64)
        prefill = np.bincount(self.r_pod, weights=self.r_prefill, minlength=size)
        decode = np.zeros(size)
        np.maximum.at(decode, self.r_pod, self.r_decode)
        step = svc.decode_base_s + svc.decode_per_seq_s * np.maximum(n, 1.0)
        chunk_s = svc.max_batched_tokens / svc.prefill_tokens_per_s
        share = np.where(n > 0, chunk_s / (chunk_s + step), 1.0)  # `prefill_share`, per pod
        bound = prefill / (svc.prefill_tokens_per_s * share) + (decode + 1.0) * step
        bound[n == 0] = 0.0
        return bound[pods] + self.dt

    def kv_usage(self, pods: IntArray) -> FloatArray:
        """KV-cache usage (0-1) of each of `pods` after the last step (vLLM's
        kv_cache_usage_perc; growth past the cache would preempt, so it reads at most 1)."""
        held = self._by_pod(self._kv_by_pod, np.asarray(pods, dtype=np.int64))
        return np.minimum(1.0, held / self.svc.kv_capacity_tokens)

    def kill(self, pods: IntArray) -> None:
        """Pods removed while still serving (termination grace over): their requests drop."""
        if pods.size == 0 or self.r_id.size == 0:
            return
        gone = np.isin(self.r_pod, pods)
        self.dropped[self.r_id[gone]] = True
        self._keep(~gone)

    def _keep(self, mask: NDArray[np.bool_]) -> None:
        self.r_id, self.r_pod = self.r_id[mask], self.r_pod[mask]
        self.r_start, self.r_prefill = self.r_start[mask], self.r_prefill[mask]
        self.r_decode = self.r_decode[mask]

    def _admit(self, t: float, serving: IntArray) -> None:
        """Move queued requests onto serving replicas with room (slots and KV), FIFO; requests
        preempted for KV go first (`_readmit`)."""
        if self.p_id.size and serving.size:
            self._readmit(serving)
        if self.p_id.size:  # new requests wait behind the preempted ones
            return
        queued = self.arrived - self.head
        if queued <= 0 or serving.size == 0:
            return
        slots = np.maximum(self.svc.max_num_seqs - self.running_per_pod(serving), 0)
        budget = int(min(queued, slots.sum()))
        if budget <= 0:
            return
        ids = np.arange(self.head, self.head + budget)
        running, allowance = self._room(serving, float(np.mean(self.req.input_tokens[ids])))
        take = fill_least_loaded(running, allowance, budget)
        n = int(take.sum())
        if n == 0:
            return
        ids = np.arange(self.head, self.head + n)
        pods = np.repeat(serving, take)
        arrival = self.req.arrivals_s[ids]
        start = np.maximum(arrival - t, 0.0)
        self.admit_t[ids] = t + start
        self.pod_of[ids] = pods
        self.head += n
        self.r_id = np.concatenate([self.r_id, ids])
        self.r_pod = np.concatenate([self.r_pod, pods])
        self.r_start = np.concatenate([self.r_start, start])
        self.r_prefill = np.concatenate([self.r_prefill, self.req.input_tokens[ids].astype(float)])
        self.r_decode = np.concatenate(
            [self.r_decode, np.maximum(self.req.output_tokens[ids] - 1, 0).astype(float)]
        )

    def _room(self, serving: IntArray, tokens: float) -> tuple[IntArray, IntArray]:
        """Running requests per serving pod, and how many more of `tokens` prompt tokens each
        takes now: a free slot, room in its KV cache, and room in this step's prefill budget."""
        svc = self.svc
        running = self.running_per_pod(serving)
        slots = np.maximum(svc.max_num_seqs - running, 0)
        held = self._by_pod(self._kv_by_pod, serving)
        backlog = self._by_pod(self._prefill_by_pod, serving)
        by_kv = np.floor(np.maximum(svc.kv_capacity_tokens - held, 0.0) / max(tokens, 1.0))
        # vLLM schedules a waiting request when its first prefill chunk fits an iteration's
        # token budget: over a step, what the pod can prefill in it.
        room = svc.prefill_tokens_per_s * self.dt - backlog
        by_prefill = np.where(room > 0, np.ceil(room / max(tokens, 1.0)), 0)
        allowance = np.minimum(
            np.minimum(slots, by_kv.astype(np.int64)), by_prefill.astype(np.int64)
        )
        allowance[(running == 0) & (allowance == 0) & (slots > 0)] = 1  # a huge prompt still runs
        return running, allowance.astype(np.int64)

    def _readmit(self, serving: IntArray) -> None:
        """Requests preempted for KV back onto pods with room, oldest preemption first: they
        prefill their prompt and what they had generated again (vLLM's recompute), then decode
        the rest. Their queue wait and first token were counted when first admitted."""
        running, allowance = self._room(serving, float(np.mean(self.p_prefill)))
        take = fill_least_loaded(running, allowance, int(self.p_id.size))
        n = int(take.sum())
        if n == 0:
            return
        pods = np.repeat(serving, take)
        self.r_id = np.concatenate([self.r_id, self.p_id[:n]])
        self.r_pod = np.concatenate([self.r_pod, pods])
        self.r_start = np.concatenate([self.r_start, np.zeros(n)])
        self.r_prefill = np.concatenate([self.r_prefill, self.p_prefill[:n]])
        self.r_decode = np.concatenate([self.r_decode, self.p_decode[:n]])
        self.pod_of[self.p_id[:n]] = pods
        self.p_id, self.p_prefill, self.p_decode = (
            self.p_id[n:],
            self.p_prefill[n:],
            self.p_decode[n:],
        )
        # What was admitted moves into the pods' KV and prefill backlog for new admissions.
        self._kv_refresh(serving)

    def _preempt(self, pods: IntArray) -> None:
        """On each pod whose running requests hold more KV than its cache, the most recently
        scheduled ones are preempted until the rest fit (vLLM's scheduler, recompute mode): their
        KV is freed and they wait, ahead of new requests, to prefill everything again."""
        if self.r_id.size == 0:
            return
        svc = self.svc
        held = self._held()
        size = int(self.r_pod.max()) + 1
        per_pod = np.bincount(self.r_pod, weights=held, minlength=size)
        over = np.flatnonzero(per_pod > svc.kv_capacity_tokens)
        if over.size == 0:
            return
        victims = np.zeros(self.r_id.size, dtype=bool)
        for pod in over.tolist():  # bounded: one pass per over-full pod
            on = np.flatnonzero(self.r_pod == pod)  # admission order: latest last
            keep_upto = np.cumsum(held[on]) <= svc.kv_capacity_tokens
            keep_upto[0] = True  # the oldest request always keeps its place
            victims[on[~keep_upto]] = True
        ids = self.r_id[victims]
        generated = np.maximum(self.req.output_tokens[ids] - 1, 0) - self.r_decode[victims]
        self.p_id = np.concatenate([self.p_id, ids])
        self.p_prefill = np.concatenate(
            [self.p_prefill, self.req.input_tokens[ids] + np.maximum(generated, 0.0)]
        )
        self.p_decode = np.concatenate([self.p_decode, self.r_decode[victims]])
        self.preemptions += int(ids.size)
        self._keep(~victims)

    def _held(self) -> FloatArray:
        """KV tokens each running request holds: its context so far (for a request prefilling
        again after a preemption, what it has recomputed)."""
        ids = self.r_id
        generated = np.maximum(self.req.output_tokens[ids] - 1, 0) - self.r_decode
        return np.maximum(self.req.input_tokens[ids] + generated - self.r_prefill, 0.0)

    @staticmethod
    def _by_pod(values: FloatArray, pods: IntArray) -> FloatArray:
        """values[pod] for each pod id, 0 for ids past the end (pods new since the refresh)."""
        if values.size == 0:
            return np.zeros(pods.size)
        inside = pods < values.size
        return np.where(inside, values[np.where(inside, pods, 0)], 0.0)

    def _kv_refresh(self, pods: IntArray) -> FloatArray:
        """KV tokens held per pod id (prompt prefilled so far plus tokens generated), kept for
        the next admission; returns the values for `pods`."""
        if self.r_id.size == 0:
            self._kv_by_pod = self._prefill_by_pod = np.zeros(0)
            return np.zeros(pods.size)
        held = self._held()
        size = max(int(pods.max()) if pods.size else 0, int(self.r_pod.max())) + 1
        self._kv_by_pod = np.bincount(self.r_pod, weights=held, minlength=size).astype(np.float64)
        self._prefill_by_pod = np.bincount(
            self.r_pod, weights=self.r_prefill, minlength=size
        ).astype(np.float64)
        return self._kv_by_pod[pods]

    # --- one step ------------------------------------------------------------------------------

    def step(self, t: float, serving: IntArray) -> StepStats:
        """Advance [t, t + dt): arrivals, timeouts, admission to `serving` replicas, service."""
        dt = self.dt
        self.k += 1
        arr = self.req.arrivals_s
        self.arrived = int(np.searchsorted(arr, t + dt, side="left"))
        # Clients give up after max_wait_s in the queue (FIFO: the oldest are at the head).
        cut = int(np.searchsorted(arr, t - self.max_wait_s, side="left"))
        if cut > self.head:
            self.dropped[self.head : cut] = True
            self.head = cut
        serving = np.asarray(serving, dtype=np.int64)
        self.serving_count = int(serving.size)
        self._admit(t, serving)
        busy = self._serve(t, serving)
        if self.preemption:
            self._preempt(serving)
        kv = self._kv_refresh(serving)
        # Growth past the cache would make vLLM preempt (not modelled): usage reads at most 1.
        # The scaler reads the mean across pods (the vLLM catalog's), the stats the hottest pod.
        usage = np.minimum(1.0, kv / self.svc.kv_capacity_tokens)
        self.kv_max = float(usage.max()) if usage.size else None
        self.kv_mean = float(usage.mean()) if usage.size else None
        k = self.k
        self.h_waiting[k] = self.waiting
        self.h_running[k] = self.running
        self.h_done[k] = self.completed
        self.h_infer[k] = self.infer_s
        self.h_prompt[k] = self.prompt_tokens
        self.h_generated[k] = self.generated_tokens
        self.h_head[k] = self.head
        if k > 0:
            self.h_ttft[k] += self.h_ttft[k - 1]
        return StepStats(self.waiting, self.running, busy, self.kv_max)

    def _serve(self, t: float, serving: IntArray) -> FloatArray:
        """Continuous batching on every replica for one step; returns each serving replica's
        busy share. See the module docstring for the model."""
        dt, svc = self.dt, self.svc
        if self.r_id.size == 0:
            return np.zeros(serving.size)
        # Per-pod quantities are indexed by pod id (small integers handed out by the cluster).
        local = self.r_pod
        n_pods = int(max(int(local.max()), int(serving.max()) if serving.size else 0)) + 1
        in_prefill = self.r_prefill > 0
        decoding0 = np.bincount(local, weights=~in_prefill, minlength=n_pods)
        share = np.where(
            decoding0 > 0,
            (svc.max_batched_tokens / svc.prefill_tokens_per_s)
            / (
                svc.max_batched_tokens / svc.prefill_tokens_per_s
                + svc.decode_base_s
                + svc.decode_per_seq_s * np.maximum(decoding0, 1.0)
            ),
            1.0,
        )
        rate = svc.prefill_tokens_per_s * share  # prompt tokens/s per pod while prefilling
        # Prefill, first come first served per pod: finish e_i = C_i + max_{j<=i}(s_j - C_{j-1}).
        pre = np.flatnonzero(in_prefill)
        start_of_decode = np.where(in_prefill, np.inf, self.r_start)  # when decode may begin
        busy_end = np.zeros(n_pods)
        if pre.size:
            order = pre[np.argsort(local[pre], kind="stable")]  # by pod, then admission order
            g = local[order]
            need = self.r_prefill[order] / rate[g]
            s = self.r_start[order]
            cum = np.cumsum(need)
            first = np.r_[True, g[1:] != g[:-1]]
            base = np.where(first, cum - need, 0.0)
            base = np.maximum.accumulate(base)  # cumsum before each group's first element
            c_incl = cum - base
            c_excl = c_incl - need
            span = float(dt) * 4 + float(cum[-1]) + 1.0  # separates groups in one accumulate
            lift = g * span
            end = c_incl + (np.maximum.accumulate(s - c_excl + lift) - lift)
            began = end - need
            done = end <= dt
            progressed = np.clip(dt - began, 0.0, need) * rate[g]
            self.r_prefill[order] = np.where(done, 0.0, self.r_prefill[order] - progressed)
            self.r_prefill[order] = np.maximum(self.r_prefill[order], 0.0)
            start_of_decode[order[done]] = end[done]
            np.maximum.at(busy_end, g, np.minimum(end, dt))
            # TTFT histogram (vLLM observes it when the first token is out).
            ids = self.r_id[order[done]]
            first = np.isnan(self.first_token_t[ids])  # not again after a preemption
            ids = ids[first]
            self.prompt_tokens += float(np.sum(self.req.input_tokens[ids]))
            self.generated_tokens += float(np.sum(np.minimum(self.req.output_tokens[ids], 1)))
            self.first_token_t[ids] = t + end[done][first]
            ttft = self.first_token_t[ids] - self.req.arrivals_s[ids]
            self.h_ttft[self.k] += np.bincount(
                np.searchsorted(TTFT_BUCKETS, ttft, side="left"),
                minlength=TTFT_BUCKETS.size + 1,
            )
        # Decode: every request past prefill gets the iterations left after prefill's share.
        dec = np.isfinite(start_of_decode)
        n_dec = np.bincount(local, weights=dec, minlength=n_pods)
        step_s = svc.decode_base_s + svc.decode_per_seq_s * np.maximum(n_dec, 1.0)
        a = np.where(dec, start_of_decode, dt)
        avail = (dt - a) - share[local] * np.maximum(busy_end[local] - a, 0.0)
        avail = np.maximum(avail, 0.0)
        tokens = avail / step_s[local]
        finishes = dec & (self.r_decode <= tokens + 1e-9)
        frac = np.where(tokens > 0, self.r_decode / np.maximum(tokens, 1e-12), 0.0)
        finish_at = t + a + np.minimum(frac, 1.0) * (dt - a)
        self.generated_tokens += float(np.sum(np.minimum(tokens, self.r_decode)[dec]))
        self.r_decode = np.where(dec, np.maximum(self.r_decode - tokens, 0.0), self.r_decode)
        # Busy share per pod: from the first request's start to the last one's end in the step.
        end_in_step = np.where(finishes, finish_at - t, dt)
        last = np.zeros(n_pods)
        np.maximum.at(last, local, end_in_step)
        earliest = np.full(n_pods, dt)
        np.minimum.at(earliest, local, self.r_start)
        pod_busy = np.clip(last - earliest, 0.0, dt) / dt
        done_ids = self.r_id[finishes]
        self.finish_t[done_ids] = finish_at[finishes]
        self.completed += int(done_ids.size)
        self.infer_s += float(np.sum(self.finish_t[done_ids] - self.admit_t[done_ids]))
        self.r_start = np.zeros(self.r_start.size)  # carried requests start at the next step
        self._keep(~finishes)
        has = np.bincount(local, minlength=n_pods) > 0
        return np.where(has[serving], pod_busy[serving], 0.0)

    # --- signals ---------------------------------------------------------------------------------

    def signal(self, at: float) -> Signal:
        """The workload's signal at the end of the current step, as the vLLM catalog defines it."""
        k = self.k
        lag = max(1, round(self.rate_window_s / self.dt))
        k0 = k - lag
        values: dict[str, float | None] = {
            "waiting": float(self.h_waiting[k]),
            "running": float(self.h_running[k]),
            "ready_pods": float(self.serving_count),
            "kv_cache_usage": self.kv_mean,
        }
        reasons: list[str] = []
        if k0 < 0:
            reasons.append("arrival_rate: a rate needs two scrapes within the window")
            values["arrival_rate"] = None
            k0 = -1
        window = (k - k0) * self.dt
        before = (
            (0, 0, 0, 0) if k0 < 0 else
            (self.h_done[k0], self.h_waiting[k0], self.h_running[k0], self.h_head[k0])
        )  # fmt: skip
        if k0 >= 0:
            growth = (
                (self.h_done[k] - before[0])
                + (self.h_waiting[k] - before[1])
                + (self.h_running[k] - before[2])
            )
            values["arrival_rate"] = max(0.0, float(growth) / window)
            # vLLM: rate(prompt_tokens_total), rate(generation_tokens_total)
            values["prompt_tokens_rate"] = float(self.h_prompt[k] - self.h_prompt[k0]) / window
            values["generation_tokens_rate"] = (
                float(self.h_generated[k] - self.h_generated[k0]) / window
            )
        done = int(self.h_done[k] - before[0])
        if done > 0:  # vLLM: rate(request_inference_time_seconds_sum) / rate(..._count)
            ran = self.h_infer[k] - (self.h_infer[k0] if k0 >= 0 else 0.0)
            values["service_time_s"] = float(ran) / done
        lo = int(before[3])
        admitted = self.admit_t[lo : int(self.h_head[k])]
        waits = admitted - self.req.arrivals_s[lo : int(self.h_head[k])]
        waits = waits[np.isfinite(waits)]
        if waits.size:
            values["queue_time_mean_s"] = float(waits.mean())
            values["queue_time_p99_s"] = _quantile(0.99, waits, QUEUE_TIME_BUCKETS)
        else:
            reasons.append("queue_time_mean_s: no completed requests in the rate window")
        ttft_counts = self.h_ttft[k] - (self.h_ttft[k0] if k0 >= 0 else 0)
        if ttft_counts.sum() > 0:
            cumulative = [
                (float(b), float(c))
                for b, c in zip(TTFT_BUCKETS, np.cumsum(ttft_counts)[:-1], strict=True)
            ]
            cumulative.append((math.inf, float(ttft_counts.sum())))
            values["ttft_p99_s"] = histogram_quantile(0.99, cumulative)
        if self.kv_mean is None:
            reasons.append("kv_cache_usage: no pod answered recently")
        return Signal.from_values(at, "sim", values, 0.0, tuple(reasons))
