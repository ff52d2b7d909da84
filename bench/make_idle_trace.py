"""Write bench/traces/synthetic/idle-bursts.csv: a synthetic trace with idle periods.

None of the shared real traces idles longer than KEDA's cooldown at the scales the bench uses
(the longest gap is 217 s), so none shows scale-to-zero and scale-from-zero. This one does, on
purpose: 10-minute bursts of Poisson arrivals at 2 req/s every 40 minutes for 3 hours, with 30
minutes of silence between them, and prompt / output lengths drawn like a chat service's
(lognormal, medians 1,000 and 200 tokens). Seeded, so the file is reproducible:

    python bench/make_idle_trace.py            # rewrites the CSV byte for byte
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "traces" / "synthetic" / "idle-bursts.csv"
PERIOD_S, BURST_S, BURSTS, RATE = 2400.0, 600.0, 5, 2.0


def main(out: Path = OUT) -> None:
    rng = np.random.default_rng(20261130)
    rows: list[tuple[str, int, int]] = []
    for k in range(BURSTS):
        start = k * PERIOD_S
        t = start + rng.exponential(1.0 / RATE)
        while t < start + BURST_S:
            prompt = int(np.clip(round(rng.lognormal(np.log(1000.0), 0.8)), 1, 32000))
            output = int(np.clip(round(rng.lognormal(np.log(200.0), 0.8)), 1, 4096))
            rows.append((f"{t:.3f}", prompt, output))
            t += rng.exponential(1.0 / RATE)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(rows)
    print(f"wrote {out} ({len(rows)} requests)")


if __name__ == "__main__":
    main()
