#!/usr/bin/env bash
# Run `scaler bench replay` on every trace in bench/traces, cold start 60 s and 180 s, and write
#   bench/results/replay.md                      the tables, with each command line and runtime
#   bench/results/replay/<trace>-cs<S>.json      one JSON object per run (`--json` format)
#   bench/results/replay/<trace>-cs<S>/*.png     fleet.png and queue_wait.png per run
# Each trace gets a --scale that makes its peak need 16+ GPUs (the oracle's peak; "always-on" in
# the tables); the synthetic idle-bursts trace runs at its native rate on one-GPU L4 nodes.
# Every run fails (exit 1, and so does this script) if the oracle misses 0.999 or drops a request. ServeGen rate files (600 s windows) are time-compressed 24x, a day to an hour, and
# the 14-day language files are cut to their first two days (--duration 7200 after compression).
# Plots need the `sim` extra: pip install -e '.[sim]'. Extra arguments go to every call.
# Takes ~25 minutes on 2 idle cores (--companion adds three rows, the KEDA sweep five runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT=bench/results
RUNS="$OUT/replay"
mkdir -p "$RUNS"

# trace | replay arguments
CASES=(
  "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv|--scale 10"
  "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv|--scale 20"
  "bench/traces/mooncake/conversation_trace.jsonl|--scale 3"
  "bench/traces/servegen/aggregate_rate_language_m-large.csv|--scale 0.15 --compress 24 --duration 7200"
  "bench/traces/servegen/aggregate_rate_language_m-small.csv|--scale 0.04 --compress 24 --duration 7200"
  "bench/traces/servegen/aggregate_rate_multimodal_mm-image.csv|--scale 6 --compress 24"
  "bench/traces/servegen/aggregate_rate_reason_deepseek-r1.csv|--scale 2 --compress 24"
  # native rate, idle half an hour between bursts: a fleet of a few replicas, one-GPU nodes
  "bench/traces/synthetic/idle-bursts.csv|--profile llama3-8b-l4"
)

index="$(mktemp)"  # json path, runtime s, command line: read by bench/replay_md.py
trap 'rm -f "$index" "$OUT/.replay.md.tmp"' EXIT
: > "$index"
for case in "${CASES[@]}"; do
  trace="${case%%|*}"
  read -r -a args <<< "${case#*|}"
  name="$(basename "${trace%.*}")"
  for cold in 60 180; do
    run="$RUNS/$name-cs$cold"
    cmd=(scaler bench replay --trace "$trace" "${args[@]}" --cold-start "$cold" --companion --plots "$run")
    echo "bench: ${cmd[*]}" >&2
    SECONDS=0
    "$PYTHON" -m gpu_queue_scaler bench replay --trace "$trace" "${args[@]}" --cold-start "$cold" \
      --companion --plots "$run" --json --no-progress "$@" > "$run.json"
    printf '%s\t%d\t%s\n' "$run.json" "$SECONDS" "${cmd[*]} $*" >> "$index"
  done
done
"$PYTHON" bench/replay_md.py "$index" "$(nproc)" > "$OUT/.replay.md.tmp"
mv "$OUT/.replay.md.tmp" "$OUT/replay.md"
echo "wrote $OUT/replay.md, $RUNS/*.json and $RUNS/*/*.png" >&2
