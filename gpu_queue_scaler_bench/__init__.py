"""Offline benchmarks on recorded traces (``scaler bench ...``): pure computation."""
