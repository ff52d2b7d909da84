"""Load against real servers: KEDA-like polls of a running scaler (`scaler bench load`) and a
trace's requests against an inference endpoint (`scaler bench loadgen`)."""
