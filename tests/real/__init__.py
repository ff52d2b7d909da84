"""Against real Prometheus, Triton and vLLM servers the tests start, and the harness."""
