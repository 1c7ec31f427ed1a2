#!/usr/bin/env bash
# Times make-schedules.sh's two schedules on the GPU (`replay --on-gpu`) and replays each
# with the measured batch times beside the H100 preset's prediction.
#   bash run-on-gpu.sh INFERSCHED OUT
set -uo pipefail
B=$1 OUT=$2
D="$(cd "$(dirname "$0")" && pwd)"
L=(--token-budget 8192 --kv-capacity 131072 --max-running 256 --block-size 16)
mkdir -p "$OUT"
for c in ${SCHEDULES:-cache nocache}; do
  timeout 280 "$B" replay --workload "$D/workload.csv" --schedule "$D/llama3-8b/vllm-v1-$c.json" \
    --cost-model llama3-8b-h100 "${L[@]}" --on-gpu llama3-8b --out "$OUT/$c" >"$OUT/$c.log" 2>&1
  echo "$c: exit $?"
done
