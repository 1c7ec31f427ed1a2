"""Random search for differences between infersched's `vllm` policy and vLLM 0.6.3's own
v0 Scheduler (chunked prefill off): small workloads, offline or online, random block sizes,
C, M, R_max and watermark; each run by vllm_v0_oracle.py (in this process) and by
`infersched simulate --scheduler vllm`, compared batch by batch. With --prefix, prompts get
random shared block ids and both run with vLLM v0's automatic prefix caching
(`--enable-prefix-caching`): batches are compared with the tokens each entry took from the
cache, and `infersched replay` must accept vLLM's schedule. Usage (in the vLLM 0.6.3 venv,
from a scratch directory):
  PROJECT=<checkout> INFERSCHED=<infersched binary> $VLLM_V0_VENV/bin/python fuzz_v0.py SEED CASES [--prefix]
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_v0_oracle as V0  # noqa: E402
from fuzz_common import random_rows  # noqa: E402

B = os.environ.get("INFERSCHED", os.path.join(os.environ.get("PROJECT", "."),
                                              "target/release/infersched"))


def norm(bt):
    return sorted((e["request"], e.get("tokens", -1), e.get("cached", 0), e.get("evict", False))
                  for e in bt["entries"])


def with_ids(rnd, rows, block):
    """Each row with random prompt block ids (id blocks of 1-4 KV blocks), most of them
    from a small pool so that prompts share prefixes: (rows, id block)."""
    idb = block * rnd.choice([1, 2, 4])
    pool = [rnd.randint(1, 4) for _ in range(3)]
    out = []
    for t, I, O in rows:
        ids = [rnd.choice(pool) if rnd.random() < 0.7 else rnd.randint(100, 10**6)
               for _ in range(-(-I // idb))]
        out.append((t, I, O, ids))
    return out, idb


def case_of(rnd):
    block = rnd.choice([1, 2, 4, 8, 16])
    rows, need = random_rows(rnd, 0.5)
    C = max(rnd.choice([128, 256, 512]), need)
    wm = rnd.choice([0.0, 0.01, 0.05])
    # Room for the longest request above the watermark (else both refuse it: vLLM ignores
    # it, infersched says it cannot serve it), and a little or a lot more.
    blocks = -(-need // block) + 1 + rnd.choice([0, 1, 4, 20, 1000])
    while blocks - int(wm * blocks) < -(-need // block) + 1:
        blocks += 1
    M = blocks * block
    R = rnd.choice([2, 3, 8, 64])
    return rows, C, M, R, block, wm


def main():
    seed0, cases = int(sys.argv[1]), int(sys.argv[2])
    prefix = "--prefix" in sys.argv[3:]
    bad = evictions = batches = hits = 0
    for case in range(seed0, seed0 + cases):
        rnd = random.Random(case)
        rows, C, M, R, block, wm = case_of(rnd)
        with open("f.csv", "w") as f:
            if prefix:
                rows, idb = with_ids(rnd, rows, block)
                f.write("arrived_at,num_prefill_tokens,num_decode_tokens,hash_block_tokens,"
                        "hash_ids\n")
                for t, I, O, ids in rows:
                    f.write(f"{t},{I},{O},{idb},{' '.join(map(str, ids))}\n")
            else:
                f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
                for t, I, O in rows:
                    f.write(f"{t},{I},{O}\n")
        args = argparse.Namespace(workload="f.csv", C=C, M=M, R=R, block=block,
                                  watermark=wm, cost_model=V0.DEFAULT_COST, out="fv.json",
                                  enable_prefix_caching=prefix)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                V0.run(args)
        except SystemExit as e:
            print(case, "vllm stopped:", e)
            continue
        cmd = [B, "simulate", "--workload", "f.csv", "--scheduler", "vllm", "--cost-model",
               "llama2-7b-a100", "--token-budget", str(C), "--kv-capacity", str(M),
               "--max-running", str(R), "--block-size", str(block), "--watermark", str(wm),
               "--out", "fo"] + (["--enable-prefix-caching"] if prefix else [])
        subprocess.run(["rm", "-rf", "fo"])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(case, "ours failed:", p.stderr[-500:])
            bad += 1
            continue
        a = json.load(open("fv.json"))["batches"]
        b = json.load(open("fo/vllm/schedule.json"))["batches"]
        evictions += sum(e.get("evict", False) for bt in a for e in bt["entries"])
        hits += sum(e.get("cached", 0) > 0 for bt in a for e in bt["entries"])
        if prefix:
            subprocess.run(["rm", "-rf", "fr"])
            r = subprocess.run([B, "replay", "--workload", "f.csv", "--schedule", "fv.json",
                                "--cost-model", "llama2-7b-a100", "--token-budget", str(C),
                                "--kv-capacity", str(M), "--max-running", str(R),
                                "--block-size", str(block), "--out", "fr"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(case, "the replay rejects vLLM's schedule:", r.stderr[-500:])
                bad += 1
        batches += len(a)
        d = [k for k, (x, y) in enumerate(zip(a, b)) if norm(x) != norm(y)]
        if d or len(a) != len(b):
            bad += 1
            k = d[0] if d else min(len(a), len(b))
            print(f"case {case}: C={C} M={M} R={R} block={block} wm={wm} n={len(rows)}: "
                  f"differ at batch {k} of {len(a)}/{len(b)}")
            for j in range(max(0, k - 1), min(max(len(a), len(b)), k + 2)):
                print("  ", j, norm(a[j]) if j < len(a) else None, "|",
                      norm(b[j]) if j < len(b) else None)
    print(f"done {cases} cases, {bad} differ, {batches} batches, {evictions} evictions, "
          f"{hits} cache hits")


if __name__ == "__main__":
    main()
