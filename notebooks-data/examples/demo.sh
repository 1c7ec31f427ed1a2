#!/usr/bin/env bash
# The main job on bundled data (run it through `bash run.sh demo`).
set -euo pipefail
BIN=${1:-target/release/infersched}
OUT=${OUT:-out/demo}
mkdir -p "$OUT"

echo "== 1. The bundled real traces"
"$BIN" workload describe notebooks-data/traces/splitwise_code.csv
echo
"$BIN" workload describe notebooks-data/traces/arxiv_summarization.csv
echo
echo "== 2. A small workload: 16 arXiv requests, lengths scaled to I + O <= 128, poisson arrivals at 20/s"
"$BIN" workload sample --trace notebooks-data/traces/arxiv_summarization.csv \
  --random 16 --seed 0 --prefill-scale 0.05 --decode-scale 0.2 --max-total-tokens 128 \
  --arrival poisson:20 --arrival-seed 0 --out "$OUT/arxiv-16.csv"
echo
echo "== 3. The cost model: Llama-2-7B on an A100 (published InferMax coefficients)"
"$BIN" cost-model show llama2-7b-a100
echo
echo "== 4. Replay of a hand-written schedule: chunked prefill, a mixed batch, an eviction and its refill"
echo "   (C = 128 tokens per batch, M = 196 KV tokens; see the notes in the schedule file)"
"$BIN" replay --workload notebooks-data/examples/tiny-workload.csv \
  --schedule notebooks-data/examples/tiny-schedule.json --cost-model llama2-7b-a100 \
  --token-budget 128 --kv-capacity 196 --out "$OUT/replay"
echo
echo "== 5. The same schedule with M = 190: the replay rejects it and says why"
if "$BIN" replay --workload notebooks-data/examples/tiny-workload.csv \
  --schedule notebooks-data/examples/tiny-schedule.json --cost-model llama2-7b-a100 \
  --token-budget 128 --kv-capacity 190 \
  --out "$OUT/replay-rejected"; then
  echo "unexpected: the schedule was accepted" >&2
  exit 1
fi
echo
echo
echo "== 6. Every heuristic scheduler on the first 1,000 requests of the Splitwise code trace"
echo "   (Llama-3-70B TP4 on A100s, the InferMax setting: M = 100,000 KV tokens, C = 16,384, block 1)"
"$BIN" workload sample --trace notebooks-data/traces/splitwise_code.csv --first 1000 \
  --out "$OUT/splitwise-1000.csv" > /dev/null
"$BIN" simulate --workload "$OUT/splitwise-1000.csv" \
  --scheduler vllm,vllm-v1,sarathi,orca,orca-max,static --cost-model llama3-70b-tp4-a100 \
  --kv-capacity 100000 --token-budget 16384 --block-size 1 --out "$OUT/simulate" | tail -n 8
echo
echo "== 7. How far from optimal? 4 arXiv requests (lengths scaled down), M = 20 KV tokens in blocks of 1, Llama-2-7B on an A100"
echo "   (made with: workload sample --trace notebooks-data/traces/arxiv_summarization.csv --random 4 --seed 3"
echo "    --prefill-scale 0.003 --decode-scale 0.02 --max-total-tokens 16)"
"$BIN" compare --workload notebooks-data/examples/arxiv-4.csv --cost-model llama2-7b-a100 \
  --schedulers optimal,vllm,vllm-v1,sarathi,orca,static --kv-capacity 20 --block-size 1 \
  --time-limit 60 --out "$OUT/compare"
echo
echo "== 8. How far from optimal on real requests? The first 8 Splitwise code requests (real lengths,"
echo "   arrivals 4x compressed), mean latency, C = 4,096, M = 32,768 KV tokens in blocks of 16, 10 s"
echo "   (no proof of optimality here: the optimum lies between the proven bound and the best schedule found)"
"$BIN" workload sample --trace notebooks-data/traces/splitwise_code.csv --first 8 --time-scale 0.25 \
  --max-total-tokens 4096 --rebase-time --out "$OUT/splitwise-8.csv" > /dev/null
"$BIN" compare --workload "$OUT/splitwise-8.csv" --objective mean-latency --cost-model llama2-7b-a100 \
  --schedulers optimal,vllm,vllm-v1,sarathi,orca,mcsf --token-budget 4096 --kv-capacity 32768 \
  --block-size 16 --time-limit 10 --out "$OUT/compare-real"
echo
echo "Done. Open $OUT/compare/report.html: the table, each scheduler's batch timeline, KV memory,"
echo "latency CDFs and the objective against the optimum and its proven bound; $OUT/compare-real/report.html"
echo "for the real requests. Also in $OUT/: compare/comparison.csv (the table),"
echo "compare/trace-<scheduler>.json (load in ui.perfetto.dev), compare/<scheduler>/ (schedule.json,"
echo "requests.csv, batches.csv, summary.json), simulate/ (every heuristic on 1,000 Splitwise requests),"
echo "replay/ (the validated hand-written schedule)."
