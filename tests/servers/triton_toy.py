"""A toy model served by a real Triton Inference Server (pytriton), on the CPU.

Run by `.venv-triton/bin/python` (pytriton needs numpy<2, so it has its own venv; see
tests/servers/install_triton.sh), normally through tests.servers.triton.TritonServer, which also
sets LD_LIBRARY_PATH so that the Python backend stub loads this interpreter's libpython.

Model `toy`: input `x` float32 shape (1,), output `y` = 2 * x; dynamic batching, max batch 8,
~50 ms per batch. HTTP, gRPC and metrics bind 127.0.0.1 only. Serves until SIGTERM or SIGINT
(or --max-lifetime-s), then stops Triton cleanly.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

LOG = logging.getLogger("triton_toy")

MAX_BATCH_SIZE = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--batch-sleep-s", type=float, default=0.05)
    parser.add_argument(
        "--max-lifetime-s",
        type=float,
        default=6 * 3600.0,
        help="stop by itself after this long even if never signalled",
    )
    return parser.parse_args(argv)


def make_infer(batch_sleep_s: float) -> Any:
    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(batch_sleep_s)
        return {"y": (x * 2.0).astype(np.float32)}

    return infer


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        LOG.info("signal %s received, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port,
        allow_metrics=True,
        allow_gpu_metrics=False,
        allow_cpu_metrics=False,
        allow_sagemaker=False,
        allow_vertex_ai=False,
        metrics_interval_ms=200,
        exit_timeout_secs=5,
    )
    triton = Triton(config=config)
    try:
        triton.bind(
            model_name="toy",
            infer_func=make_infer(args.batch_sleep_s),
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
            config=ModelConfig(max_batch_size=MAX_BATCH_SIZE, batcher=DynamicBatcher()),
            strict=True,
        )
        triton.run()
        LOG.info(
            "triton_toy serving: http=127.0.0.1:%d grpc=127.0.0.1:%d metrics=127.0.0.1:%d",
            args.http_port,
            args.grpc_port,
            args.metrics_port,
        )
        deadline = time.monotonic() + args.max_lifetime_s
        while not stop.is_set() and time.monotonic() < deadline:
            stop.wait(timeout=1.0)
            if not triton.is_alive():
                LOG.error("Triton server or model proxy died")
                return 1
        return 0
    finally:
        LOG.info("stopping Triton")
        triton.stop()
        LOG.info("Triton stopped")


if __name__ == "__main__":
    sys.exit(main())
