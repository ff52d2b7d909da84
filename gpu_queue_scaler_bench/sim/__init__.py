"""Trace-driven cluster simulator: the side-by-side cost/SLO bench (`scaler bench replay`).

Why a simulator: the scaler's claim (meet the queue SLO with fewer GPU-hours than the usual
autoscalers) can only be checked on real traces against the same fleet, the same seed and the same
starting point. One module per job:

- `workload`: trace -> request arrays (arrival, input and output tokens), `--scale` superposition;
- `profiles`: service (continuous batching), node and price figures, each with its source;
- `fleet`: the workload's queue and replicas, the service model, the signals the servers expose;
- `cluster`: Karpenter-like nodes (launch, model load, consolidateAfter) and what they cost;
- `autoscalers`: KEDA polling/activation and the HPA's arithmetic, as documented upstream;
- `policies`: always-on, HPA on GPU utilization, KEDA's Prometheus scaler, this scaler (through
  `gpu_queue_scaler.decision.policy.decide`), and an oracle with foresight;
- `run`: the fixed-step loop; `report`: measures, table, JSON and plots.
"""
