#!/usr/bin/env bash
# Prefix caching on the GPU: 150 consecutive Mooncake conversation requests (prompts cut to
# I + O <= 8192 with their block ids), vLLM V1's schedules with and without its prefix
# cache made with the H100 preset, then timed batch by batch on an H100 with
# run-on-gpu.sh (docs/cost-models.md, "Prefix caching on the GPU").
#   bash make-schedules.sh INFERSCHED
set -euo pipefail
B=$1
D="$(cd "$(dirname "$0")" && pwd)"
"$B" workload sample --trace "$D/../../traces/mooncake/conversation_trace.jsonl" --first 150 \
  --max-total-tokens 8192 --rebase-time --out "$D/workload.csv"
L=(--token-budget 8192 --kv-capacity 131072 --max-running 256 --block-size 16)
T=$(mktemp -d)
for c in cache nocache; do
  f=(); [ "$c" = nocache ] && f=(--no-enable-prefix-caching)
  "$B" simulate --workload "$D/workload.csv" --scheduler vllm-v1 --cost-model llama3-8b-h100 \
    "${L[@]}" "${f[@]}" --out "$T/$c" >/dev/null
  mkdir -p "$D/llama3-8b"
  cp "$T/$c/vllm-v1/schedule.json" "$D/llama3-8b/vllm-v1-$c.json"
done
rm -rf "$T"
