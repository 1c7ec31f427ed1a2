#!/usr/bin/env bash
# Times make-schedules.sh's three schedules on the GPU (`replay --on-gpu`) and reads the
# SLOs on the replay with the measured batch times beside the H100 preset's prediction.
#   bash run-on-gpu.sh INFERSCHED OUT
set -uo pipefail
B=$1 OUT=$2
D="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
L=${LAUNCH:-queued}
for s in ${SCHEDULES:-goodput-search vllm-v1 sarathi}; do
  timeout 240 "$B" replay --workload "$D/workload.csv" --schedule "$D/llama3-8b/$s.json" \
    --cost-model llama3-8b-h100 --slo ttft-p90=2s --slo tbt-p99=200ms \
    --on-gpu llama3-8b --gpu-launch "$L" --out "$OUT/$s" >"$OUT/$s.log" 2>&1
  echo "$s: exit $?"
  tail -12 "$OUT/$s.log"
done
