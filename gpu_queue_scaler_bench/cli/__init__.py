"""The measuring package's commands, `scaler demo` and `scaler bench ...`: each module's
`register` is an entry point of the `gpu_queue_scaler.commands` group (pyproject.toml)."""
