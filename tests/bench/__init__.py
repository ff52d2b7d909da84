"""The measuring package: the simulator, the benches, the load generators and the trace reader."""
