"""The decision: a workload's signal and forecast in, a replica target out (the capacity model,
the policy, the outlook, the shared forecaster's rows, the per-workload decider). Pure and
deterministic: time is an argument, no I/O, so the server and the simulator run the same code."""
