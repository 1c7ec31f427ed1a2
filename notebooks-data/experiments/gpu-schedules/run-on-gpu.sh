#!/usr/bin/env bash
# Whole schedules timed on a GPU: every batch of each schedule run in order through all the
# model's layers over a paged KV cache carried from batch to batch, then replayed with the
# measured times (`infersched replay --on-gpu`; docs/cost-models.md, "Whole schedules timed
# on the GPU").
#   bash run-on-gpu.sh INFERSCHED GPU OUT    GPU: the cost models' suffix (h100, h200)
# The cost model that predicts is $COST_DIR/MODEL/coefficients.json when COST_DIR is set
# (a calibration just run on this GPU), else the preset MODEL-GPU.
set -uo pipefail
B=$1 G=$2 OUT=$3
D="$(cd "$(dirname "$0")" && pwd)"
# The limits every schedule here was made under (replay checks them).
L=(--token-budget 8192 --kv-capacity 65536 --max-running 256 --block-size 16)
mkdir -p "$OUT"
for m in ${MODELS:-llama2-7b llama3-8b}; do
  cost="$m-$G"
  [ -n "${COST_DIR:-}" ] && cost="$COST_DIR/$m/coefficients.json"
  for s in ${SCHEDULES:-vllm-v1 sarathi solver}; do
    [ -f "$D/$m/$s.json" ] || continue
    timeout 300 "$B" replay --workload "$D/workload.csv" --schedule "$D/$m/$s.json" \
      --cost-model "$cost" "${L[@]}" --on-gpu "$m" --out "$OUT/$m/$s" >"$OUT/$m-$s.log" 2>&1
    echo "$m $s: exit $?"
  done
done
