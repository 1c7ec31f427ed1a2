#!/usr/bin/env bash
# Solver benchmark at real scale (issue 12's families (b) and (c), and (d) online arrivals):
# for each workload and objective, `infersched solve` with a 60 s limit and 2 HiGHS threads,
# one run at a time;
# records the method, the replayed objective, the bound and its argument, the certified
# gap, the wall time and the peak resident memory (GNU time) of the whole process; and the
# best of the heuristic schedulers (`simulate`, every policy under the same C, M and block
# size, replayed) with its ratio to the bound: how far the best real policy is at most
# from the optimum.
#
#   bash notebooks-data/experiments/solver-real-scale.sh [OUT_DIR]
#
# Needs a release build (cargo build --release), GNU time (/usr/bin/time) and python3 (to
# read solve.json). Writes OUT_DIR/results.csv (default
# notebooks-data/experiments/results/solver-real-scale).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$root/target/release/infersched"
out="${1:-$root/notebooks-data/experiments/results/solver-real-scale}"
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
csv="$out/results.csv"
echo "family,n,objective,C,M,block,method,status,replayed_s,bound_s,bound_method,certified_gap,warm_start,wall_s,peak_rss_mib,best_heuristic,best_heuristic_s,heuristic_to_bound" > "$csv.tmp"

run() { # family n objective workload C M block
  local family=$1 n=$2 objective=$3 wl=$4 c=$5 m=$6 block=$7
  local dir="$work/$family-$n-$objective"
  /usr/bin/time -f "%e %M" -o "$work/time" "$bin" solve --workload "$wl" --objective "$objective" \
    --cost-model llama2-7b-a100 \
    --token-budget "$c" --kv-capacity "$m" --block-size "$block" --time-limit 60 --threads 2 \
    --out "$dir" > /dev/null
  read -r wall rss < "$work/time"
  # Policies that cannot serve the workload (prompts over C without chunking) fail; the
  # others' results are kept.
  "$bin" simulate --workload "$wl" --scheduler vllm,vllm-v1,sarathi,orca,orca-max,static,mcsf \
    --cost-model llama2-7b-a100 \
    --token-budget "$c" --kv-capacity "$m" --block-size "$block" --out "$dir-heuristics" \
    > /dev/null 2>&1 || true
  python3 - "$dir/solve.json" "$family" "$n" "$objective" "$c" "$m" "$block" "$wall" "$rss" \
    "$dir-heuristics" >> "$csv.tmp" <<'EOF'
import csv, json, os, sys
r = json.load(open(sys.argv[1]))
family, n, objective, c, m, block, wall, rss, heuristics = sys.argv[2:]
key = {"makespan": "makespan_s", "mean-latency": "mean_latency_s", "mean-ttft": "mean_ttft_s"}[objective]
sims = {}
for name in sorted(os.listdir(heuristics)):
    summary = os.path.join(heuristics, name, "summary.json")
    if os.path.exists(summary):
        sims[name] = json.load(open(summary))["objectives"][key]
best = min(sims, key=lambda s: (sims[s], s))
bm = r["bound_method"]
bm = bm if isinstance(bm, str) else "combinatorial:" + next(iter(bm.values()))
warm = (r.get("warm_start") or {}).get("heuristic", "")
# The warm start's name has commas (priority-list knobs): quote as CSV does.
csv.writer(sys.stdout, lineterminator="\n").writerow([family, n, objective, c, m, block,
    r["method"], r["status"], f'{r["replayed_objective"]:.6f}', f'{r["best_bound"]:.6f}', bm,
    f'{r["certified_gap"]:.5f}', warm, wall, f"{int(rss) / 1024:.1f}", best,
    f"{sims[best]:.6f}", f'{sims[best] / r["best_bound"]:.4f}'])
EOF
}

# (b) consecutive Splitwise code requests, real lengths (prompt cut so that I + O <= 4096),
# arrivals compressed 4x, C = 4096, M = 32,768, block 16.
for n in 8 32 128 512 1000; do
  wl="$work/b$n.csv"
  "$bin" workload sample --trace "$root/notebooks-data/traces/splitwise_code.csv" --first "$n" \
    --time-scale 0.25 --max-total-tokens 4096 --rebase-time --out "$wl" > /dev/null
  for objective in makespan mean-latency mean-ttft; do
    run b "$n" "$objective" "$wl" 4096 32768 16
  done
done
# (c) offline arXiv requests with real lengths (I + O <= 4096), C = 2048, M = 32,768.
for n in 32 128; do
  wl="$work/c$n.csv"
  "$bin" workload sample --trace "$root/notebooks-data/traces/arxiv_summarization.csv" --random "$n" \
    --seed 0 --max-total-tokens 4096 --arrival static --out "$wl" > /dev/null
  for objective in makespan mean-latency mean-ttft; do
    run c "$n" "$objective" "$wl" 2048 32768 16
  done
done
# (d) 64 random arXiv requests (seed 0, I + O <= 4096) arriving online, a Poisson process at
# 2 requests per second (low concurrency: a few requests in the system at once), C = 2048,
# M = 32,768.
wl="$work/d64.csv"
"$bin" workload sample --trace "$root/notebooks-data/traces/arxiv_summarization.csv" --random 64 \
  --seed 0 --max-total-tokens 4096 --arrival poisson:2 --out "$wl" > /dev/null
for objective in makespan mean-latency mean-ttft; do
  run d 64 "$objective" "$wl" 2048 32768 16
done
mv "$csv.tmp" "$csv"
cat "$csv"
