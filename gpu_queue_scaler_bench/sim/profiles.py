"""Named service, node and price profiles for the simulator, each figure with its source.

Why named profiles: a bench result is only worth its assumptions, so every number the fleet runs on
lives here, once, with where it comes from. Figures marked [I] are inferred (arithmetic on a
published figure), not measured; replace them with your own load test when you have one.

Service model (see `gpu_queue_scaler_bench.sim.fleet`): one replica = one vLLM engine on one GPU
(TP=1) running continuous batching. Each engine iteration decodes one token for every running
request and takes `decode_base_s + decode_per_seq_s x batch`; prefill runs at `prefill_tokens_per_s`
and, while requests are decoding, gets at most the share of an iteration that a full chunk of
`max_batched_tokens` takes (chunked prefill keeps decodes moving). A request is admitted while the
engine has fewer than `max_num_seqs` requests and its KV cache (`kv_capacity_tokens`) has room for
the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceProfile:
    """One inference engine replica on one GPU."""

    model: str
    gpu: str
    decode_base_s: float  # iteration time at batch 0 (weights read once per iteration)
    decode_per_seq_s: float  # added per running request (KV reads, attention)
    prefill_tokens_per_s: float  # prompt tokens per second with the GPU to itself
    max_batched_tokens: int  # vLLM --max-num-batched-tokens: the prefill chunk per iteration
    max_num_seqs: int  # vLLM --max-num-seqs: running requests per engine
    kv_capacity_tokens: int  # tokens of KV cache the engine can hold
    model_load_s: float  # pod start on a ready node: image pull (cached layers) + weight load
    source: str

    def decode_step_s(self, batch: float) -> float:
        """Seconds per engine iteration with `batch` requests decoding."""
        return self.decode_base_s + self.decode_per_seq_s * max(batch, 1.0)

    def prefill_share(self, decoding: float) -> float:
        """Largest share of GPU time prefill gets while `decoding` requests decode: a full chunk
        of max_batched_tokens next to one decode iteration; all of it when nothing decodes."""
        if decoding <= 0:
            return 1.0
        chunk_s = self.max_batched_tokens / self.prefill_tokens_per_s
        return chunk_s / (chunk_s + self.decode_step_s(decoding))


@dataclass(frozen=True)
class NodeType:
    """A GPU instance type as Karpenter would launch it."""

    name: str
    gpus: int
    # Spot prices move every few minutes by zone, so none is kept here: pass the one you pay
    # with `scaler bench replay --node-price` (SimConfig.node_usd_per_hour).
    on_demand_usd_per_hour: float
    source: str


@dataclass(frozen=True)
class Profile:
    name: str
    service: ServiceProfile
    node: NodeType
    description: str


# Llama-3-8B KV cache per token: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB.
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
_WEIGHTS_BYTES = 16.1e9  # 8.03e9 parameters in BF16


def _kv_tokens(gpu_bytes: float, overhead_bytes: float) -> int:
    """KV tokens left at vLLM's default gpu_memory_utilization 0.9 after weights and activations."""
    return int((0.9 * gpu_bytes - _WEIGHTS_BYTES - overhead_bytes) / _KV_BYTES_PER_TOKEN)


LLAMA3_8B_A100 = ServiceProfile(
    model="meta-llama/Llama-3.1-8B-Instruct (BF16, vLLM, TP=1)",
    gpu="A100-SXM4-40GB",
    # 75 tok/s for one request (13.3 ms/token) and a 6.6x throughput gain at 8 concurrent requests
    # with "almost no latency cost" (~16 ms/token at 8): base 12.9 ms + 0.4 ms per request [I].
    decode_base_s=0.0129,
    decode_per_seq_s=0.0004,
    # 312 TFLOPS BF16 peak, 2 x 8.03e9 FLOP per prompt token, ~50% MFU in prefill [I].
    prefill_tokens_per_s=10_000.0,
    max_batched_tokens=2048,
    max_num_seqs=256,
    kv_capacity_tokens=_kv_tokens(40e9, 2e9),  # ~137k tokens [I]
    model_load_s=60.0,
    source=(
        "decode: johnmusgrave.com/p/vllm-throughput-latency-sweep-on (Llama-3.1-8B-Instruct, "
        "A100 40GB, vLLM 0.23, 1024 in / 128 out, concurrency 1-64); prefill from A100 peak "
        "BF16 FLOPS at ~50% MFU [I]; max_num_seqs 256 and max_num_batched_tokens 2048: vLLM "
        "V1's OpenAI-server defaults for an A100 (vllm/engine/arg_utils.py "
        "get_batch_defaults); KV from memory arithmetic [I]; model load 60 s [I] (16 GB of "
        "weights at "
        "~1 GB/s plus CUDA graph capture)"
    ),
)

LLAMA3_8B_H100 = ServiceProfile(
    model="meta-llama/Llama-3.1-8B-Instruct (BF16, vLLM, TP=1)",
    gpu="H100-SXM-80GB",
    # TPOT p50 6.48 ms at concurrency 1, 6.59 at 4, 10.94 at 16: base 6.2 ms + 0.29 ms per
    # request [I] (at 64 the benchmark's 46.9 ms includes prefill interference at saturation).
    decode_base_s=0.0062,
    decode_per_seq_s=0.00029,
    # 989 TFLOPS BF16 dense peak, 2 x 8.03e9 FLOP per token, ~50% MFU [I].
    prefill_tokens_per_s=30_000.0,
    max_batched_tokens=8192,
    max_num_seqs=1024,
    kv_capacity_tokens=_kv_tokens(80e9, 3e9),  # ~404k tokens [I]
    model_load_s=60.0,
    source=(
        "decode: yobitelcomm.github.io/bench/recipes/concurrency-sweep (Llama-3.1-8B-Instruct, "
        "H100-80GB-HBM3, vLLM 0.21, fp16); prefill from H100 SXM peak BF16 FLOPS at ~50% MFU "
        "[I]; max_num_seqs 1024 and max_num_batched_tokens 8192: vLLM V1's OpenAI-server "
        "defaults for >= 70 GiB GPUs other than A100 (arg_utils.py get_batch_defaults); KV "
        "from memory arithmetic [I]; model load 60 s [I]"
    ),
)

LLAMA3_8B_L4 = ServiceProfile(
    model="meta-llama/Llama-3.1-8B-Instruct (BF16, vLLM, TP=1, --max-model-len 8192)",
    gpu="L4-24GB",
    # Decode is memory bound: 16.1 GB of weights read per iteration at the L4's 300 GB/s is
    # 53.5 ms; the per-request KV read scales the A100's 0.4 ms by the bandwidth ratio
    # (1555 / 300 GB/s) [I].
    decode_base_s=0.0535,
    decode_per_seq_s=0.0021,
    # 121 TFLOPS BF16 dense peak, 2 x 8.03e9 FLOP per prompt token, ~50% MFU [I].
    prefill_tokens_per_s=3_770.0,
    max_batched_tokens=2048,
    max_num_seqs=256,
    kv_capacity_tokens=_kv_tokens(24e9, 1.5e9),  # ~30k tokens [I]: 8k-token contexts fit
    model_load_s=60.0,
    source=(
        "NVIDIA L4 datasheet (24 GB GDDR6, 300 GB/s, 121 TFLOPS BF16 dense); decode and "
        "prefill from those at the A100 profile's efficiencies [I]; max_num_seqs 256 and "
        "max_num_batched_tokens 2048: vLLM V1's OpenAI-server defaults below 70 GiB "
        "(arg_utils.py get_batch_defaults); KV from memory arithmetic [I]; model load 60 s [I]"
    ),
)

P4D_24XLARGE = NodeType(
    name="p4d.24xlarge",
    gpus=8,
    on_demand_usd_per_hour=32.77,
    source="AWS EC2 On-Demand pricing page, us-east-1, Linux (8x A100 40GB)",
)

P5_48XLARGE = NodeType(
    name="p5.48xlarge",
    gpus=8,
    on_demand_usd_per_hour=98.32,
    source="AWS EC2 On-Demand pricing page, us-east-1, Linux (8x H100 80GB)",
)

G6_XLARGE = NodeType(
    name="g6.xlarge",
    gpus=1,
    on_demand_usd_per_hour=0.8048,
    source="AWS EC2 On-Demand pricing (aws.amazon.com/ec2/pricing/on-demand), us-east-1, Linux: "
    "g6.xlarge (1x L4 24GB, 4 vCPU, 16 GiB) $0.8048/h, as listed in 2025",
)

PROFILES: dict[str, Profile] = {
    "llama3-8b-a100": Profile(
        "llama3-8b-a100",
        LLAMA3_8B_A100,
        P4D_24XLARGE,
        "Llama-3.1-8B on one A100 40GB per replica, p4d.24xlarge nodes",
    ),
    "llama3-8b-h100": Profile(
        "llama3-8b-h100",
        LLAMA3_8B_H100,
        P5_48XLARGE,
        "Llama-3.1-8B on one H100 80GB per replica, p5.48xlarge nodes",
    ),
    # A node shape that fits a small workload: one GPU per node, so a fleet of one or two
    # replicas pays for one or two GPUs, not for a p4d's eight.
    "llama3-8b-l4": Profile(
        "llama3-8b-l4",
        LLAMA3_8B_L4,
        G6_XLARGE,
        "Llama-3.1-8B on one L4 24GB per replica, g6.xlarge nodes of one GPU (for workloads "
        "of one or two replicas)",
    ),
}
DEFAULT_PROFILE = "llama3-8b-a100"


def get_profile(name: str) -> Profile:
    """The named profile, or a ValueError that lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}; known: {known}") from None
