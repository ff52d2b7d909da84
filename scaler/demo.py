"""`scaler demo`: the scaler on embedded defaults, polled like KEDA, printing what it decides.

An interim main job until the trace-driven simulator lands: it starts `scaler serve` in-process on
a free loopback port, registers three synthetic ScaledObjects with different load shapes (compressed
to a 60 s period so a short run shows ramp-up, stabilization and scale to zero), polls them the
way KEDA does, and prints each poll's replica counts and the reason behind each.
"""

from __future__ import annotations

import asyncio
import time

from scaler.config_watch import ConfigStore
from scaler.kedaclient import KedaLikeClient, scaled_object
from scaler.server import ScalerServer

DEMO_OBJECTS = {
    "chat-wave": {"syntheticPattern": "wave", "syntheticPeakRps": "30"},
    "batch-sine": {"syntheticPattern": "sine", "syntheticPeakRps": "12"},
    "steady": {"syntheticPattern": "constant", "syntheticPeakRps": "6"},
}
COMMON = {
    "scalerAddress": "127.0.0.1",
    "backend": "synthetic",
    "syntheticPeriodSeconds": "60",
    "syntheticServiceSeconds": "2",
    "targetConcurrency": "8",
    "maxReplicas": "20",
    "scaleDownStabilizationSeconds": "10",
    "scaleToZeroIdleSeconds": "8",
}


async def run_demo(duration_s: float = 60.0, poll_s: float = 3.0) -> int:
    from scaler.config import Config, ServerSettings

    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=1.0)))
    server = ScalerServer(store, "127.0.0.1:0")
    await server.start()
    client = KedaLikeClient(f"127.0.0.1:{server.port}")
    refs = {
        name: scaled_object("demo", name, {**COMMON, **meta}) for name, meta in DEMO_OBJECTS.items()
    }
    replicas = dict.fromkeys(refs, 0)
    print(
        f"scaler serving on 127.0.0.1:{server.port}; polling {len(refs)} ScaledObjects "
        f"every {poll_s:g}s for {duration_s:g}s (synthetic load, 60 s period)\n"
    )
    print(f"{'t(s)':>5}  " + "  ".join(f"{n:>22}" for n in refs))
    started = time.monotonic()
    polls = 0
    try:
        while (elapsed := time.monotonic() - started) < duration_s and polls < 10_000:
            polls += 1
            cells = []
            for name, ref in refs.items():
                evaluation = await client.evaluate(ref)
                replicas[name] = evaluation.replicas(replicas[name])
                reason = next(
                    (
                        d.reason.value
                        for d in server.engine.decisions()
                        if d.workload.endswith(name)
                    ),
                    "?",
                )
                cells.append(f"{replicas[name]:>3} {reason:>18}")
            print(f"{elapsed:5.0f}  " + "  ".join(cells), flush=True)
            await asyncio.sleep(poll_s)
    finally:
        await client.close()
        await server.stop()
    print("\nEach cell: replicas KEDA + HPA would run, and the term that set the scaler's target.")
    print("Point a real ScaledObject at `scaler serve`: see deploy/examples/.")
    return 0
