#!/usr/bin/env bash
# Goodput on the GPU: the first 300 Splitwise code requests at 10x their arrival rate,
# `compare --slo ttft-p90=2s --slo tbt-p99=200ms` with the H100 preset (vLLM V1, Sarathi
# and the goodput search's schedule), whose schedules run-on-gpu.sh then times batch by
# batch on an H100 (docs/cost-models.md, "Goodput on the GPU").
#   bash make-schedules.sh INFERSCHED
set -euo pipefail
B=$1
D="$(cd "$(dirname "$0")" && pwd)"
"$B" workload sample --trace "$D/../../traces/splitwise_code.csv" --first 300 \
  --time-scale 0.1 --rebase-time --out "$D/workload.csv"
T=$(mktemp -d)
"$B" compare --workload "$D/workload.csv" --schedulers vllm-v1,sarathi --cost-model llama3-8b-h100 \
  --slo ttft-p90=2s --slo tbt-p99=200ms --out "$T" > "$D/compare.txt"
mkdir -p "$D/llama3-8b"
for s in vllm-v1 sarathi goodput-search; do
  cp "$T/$s/schedule.json" "$D/llama3-8b/$s.json"
done
rm -rf "$T"
