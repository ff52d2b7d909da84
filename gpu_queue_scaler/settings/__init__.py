"""Settings: what a workload asks for (its trigger metadata, the tuning ConfigMap, the spec
built from both), how they are checked (`scaler check`) and reloaded. Read once, passed down:
nothing here reads metrics or decides."""
