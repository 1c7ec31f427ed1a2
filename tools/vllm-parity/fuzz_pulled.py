"""Random search for differences between infersched's pulled disaggregation (the decode
replica of `simulate --disaggregate 1:1 --kv-connector nixl`, vllm-v1) and vLLM 0.32's own
V1 Scheduler running a decode instance whose connector pulls each prompt's KV
(vllm_v1_oracle.py --pulled), and its prefill replica with the same Scheduler keeping each
finished request's KV until the decode side has read it (--held). Each case: a small
random workload served by infersched on one prefill and one decode replica over a slow or
fast KV link; each replica's inputs (each request's arrival there, its prompt and output,
and how long its pull took or how long its KV was held) are given to the oracle, whose
schedule is compared with infersched's replica batch by batch. Usage (in the vLLM 0.32 venv, from a scratch directory):
  PROJECT=<checkout> INFERSCHED=<infersched binary> $VLLM_VENV/bin/python fuzz_pulled.py SEED CASES
A case that differs is kept as case-SEED.csv (the oracle's input) for a look.
"""
import argparse
import contextlib
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_v1_oracle as V1  # noqa: E402
from fuzz_common import random_rows  # noqa: E402

B = os.environ.get("INFERSCHED", os.path.join(os.environ.get("PROJECT", "."),
                                              "target/release/infersched"))


def norm(bt):
    return sorted((e["request"], "receive" if "receive" in e else
                   "evict" if e.get("evict") else "tokens",
                   e.get("receive", e.get("tokens", 0)), e.get("cached", 0))
                  for e in bt["entries"])


def case_of(rnd):
    block = rnd.choice([1, 2, 4, 8, 16])
    rows, need = random_rows(rnd, 0.7)
    C = max(rnd.choice([64, 128, 256, 512]), need)
    # Room for the longest request and a little or a lot more (vLLM's pool keeps one
    # null block besides M / block).
    M = (-(-need // block) + rnd.choice([0, 1, 4, 20, 1000])) * block
    R = rnd.choice([1, 2, 3, 8, 64])
    # llama2-7b moves 524,288 bytes of KV per token: 96 tokens take 50 ms at 1 GB/s.
    gbs = rnd.choice([0.2, 1.0, 10.0, 300.0])
    lat = rnd.choice([0, 100, 2000])
    return rows, C, M, R, block, gbs, lat


def decode_side(out):
    """The decode replica's oracle input from infersched's outputs: arrival there, I, O
    and the pull's seconds (KV ready minus the receive batch's start)."""
    d = os.path.join(out, "vllm-v1")
    reqs = {r["request"]: r for r in csv.DictReader(open(f"{d}/decode/replica-0/requests.csv"))}
    ready = {r["request"]: float(r["kv_ready_s"]) for r in csv.DictReader(open(f"{d}/routing.csv"))}
    sched = json.load(open(f"{d}/decode/replica-0/schedule.json"))
    recv = {str(e["request"]): b["start_s"] for b in sched["batches"] for e in b["entries"]
            if "receive" in e}
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens,transfer_s"]
    for k in sorted(reqs, key=int):
        r = reqs[k]
        rows.append(f"{r['arrival_s']},{r['input_tokens']},{r['output_tokens']},"
                    f"{ready[k] - recv[k]!r}")
    return "\n".join(rows) + "\n", sched["batches"]


def prefill_side(out):
    """The prefill replica's oracle input: arrival, I, O = 1 and how long the KV stayed
    after the first token (until the decode side had read it)."""
    d = os.path.join(out, "vllm-v1")
    reqs = {r["request"]: r for r in csv.DictReader(open(f"{d}/prefill/replica-0/requests.csv"))}
    ready = {r["request"]: float(r["kv_ready_s"]) for r in csv.DictReader(open(f"{d}/routing.csv"))}
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens,kv_hold_s"]
    for k in sorted(reqs, key=int):
        r = reqs[k]
        rows.append(f"{r['arrival_s']},{r['input_tokens']},{r['output_tokens']},"
                    f"{ready[k] - float(r['first_token_s'])!r}")
    sched = json.load(open(f"{d}/prefill/replica-0/schedule.json"))
    return "\n".join(rows) + "\n", sched["batches"]


def oracle(workload, C, M, R, block, pulled):
    """The oracle's batches for one replica's inputs (a decode replica pulling, or a prefill
    replica holding KV, with vllm-v1's prefix cache on as infersched's prefill replicas)."""
    args = argparse.Namespace(
        workload=workload, C=C, M=M, R=R, block=block, watermark=0.0,
        cost_model=V1.DEFAULT_COST, no_reserve_full_isl=False, raw_blocks=False,
        num_gpu_blocks=0, max_model_len=0, enable_prefix_caching=not pulled, pulled=pulled,
        held=not pulled, trace=None, out="fv.json")
    with contextlib.redirect_stdout(io.StringIO()):
        V1.run(args)
    return json.load(open("fv.json"))["batches"]


def differs(case, side, ours, theirs, what):
    d = [k for k, (x, y) in enumerate(zip(ours, theirs)) if norm(x) != norm(y)]
    if not d and len(ours) == len(theirs):
        return False
    k = d[0] if d else min(len(ours), len(theirs))
    print(f"case {case} ({side}): {what}: differ at batch {k} of {len(ours)}/{len(theirs)}")
    for j in range(max(0, k - 1), min(max(len(ours), len(theirs)), k + 2)):
        print("  ", j, norm(ours[j]) if j < len(ours) else None, "|",
              norm(theirs[j]) if j < len(theirs) else None)
    return True


def main():
    seed0, cases = int(sys.argv[1]), int(sys.argv[2])
    bad = batches = receives = evictions = 0
    for case in range(seed0, seed0 + cases):
        rows, C, M, R, block, gbs, lat = case_of(random.Random(case))
        with open("f.csv", "w") as f:
            f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
            for t, I, O in rows:
                f.write(f"{t},{I},{O}\n")
        shutil.rmtree("fo", ignore_errors=True)
        cmd = [B, "simulate", "--workload", "f.csv", "--scheduler", "vllm-v1",
               "--disaggregate", "1:1", "--kv-connector", "nixl", "--kv-bandwidth", str(gbs),
               "--kv-latency-us", str(lat), "--cost-model", "llama2-7b-a100",
               "--token-budget", str(C), "--kv-capacity", str(M), "--max-running", str(R),
               "--block-size", str(block), "--out", "fo"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(case, "ours failed:", p.stderr[-300:])
            bad += 1
            continue
        what = f"C={C} M={M} R={R} block={block} link={gbs} GB/s +{lat} us n={len(rows)}"
        bad_case = False
        for side, inputs, pulled in (("decode", decode_side, True), ("prefill", prefill_side, False)):
            text, ours = inputs("fo")
            name = f"{side}.csv"
            with open(name, "w") as f:
                f.write(text)
            try:
                theirs = oracle(name, C, M, R, block, pulled)
            except SystemExit as e:
                print(case, side, "vllm stopped:", e)
                bad_case = True
                continue
            batches += len(theirs)
            entries = [e for bt in theirs for e in bt["entries"]]
            receives += sum("receive" in e for e in entries)
            evictions += sum(bool(e.get("evict")) for e in entries)
            if differs(case, side, ours, theirs, what):
                shutil.copy(name, f"case-{case}-{name}")
                bad_case = True
        bad += bad_case
    print(f"done {cases} cases, {bad} differ, {batches} batches (both sides), {receives} "
          f"receives, {evictions} preemptions")


if __name__ == "__main__":
    main()
