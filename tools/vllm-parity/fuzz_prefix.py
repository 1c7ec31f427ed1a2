"""Random search for differences between vllm-v1 with prefix caching and vLLM 0.32's own
Scheduler: small workloads with random shared prompt block ids, random block sizes, C, M,
R_max, whole-prompt check and watermark; each run by vllm_v1_oracle.py (in this process)
and by `infersched simulate`, compared batch by batch with the tokens each entry took from
the cache; `infersched replay` must accept vLLM's schedule. Usage (in the vLLM venv, from a scratch directory):
  PROJECT=<checkout> INFERSCHED=<infersched binary> $VLLM_VENV/bin/python fuzz_prefix.py SEED CASES
"""
import json, os, random, subprocess, sys, argparse
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_v1_oracle as O
B = os.environ.get("INFERSCHED", os.path.join(os.environ.get("PROJECT", "."), "target/release/infersched"))
def norm(bt): return sorted((e['request'], e.get('tokens',-1), e.get('cached',0), e.get('evict',False)) for e in bt['entries'])
seed0 = int(sys.argv[1]); cases = int(sys.argv[2])
bad = 0; hits_total = 0; ev_total = 0
for case in range(seed0, seed0 + cases):
    rnd = random.Random(case)
    block = rnd.choice([1, 2, 4, 8, 16])
    idb = block * rnd.choice([1, 2, 4])
    n = rnd.randint(2, 12)
    pool = [rnd.randint(1, 4) for _ in range(6)]
    rows = []
    t = 0.0
    online = rnd.random() < 0.5
    for i in range(n):
        I = rnd.randint(1, 6 * idb)
        O_ = rnd.randint(1, 12)
        nb = -(-I // idb)
        ids = []
        for k in range(nb):
            ids.append(rnd.choice(pool[:3]) if rnd.random() < 0.7 else rnd.randint(100, 10**6))
        if online: t += rnd.expovariate(1 / 0.005)
        rows.append((round(t, 6), I, O_, ids))
    maxkv = max(I + O_ - 1 for _, I, O_, _ in rows)
    M = (-(-maxkv // block)) * block + rnd.choice([0, block, 4 * block, 20 * block, 1000 * block])
    C = rnd.choice([8, 16, 32, 64, 512])
    R = min(rnd.choice([2, 3, 8, 64]), C)
    isl = rnd.random() < 0.6
    wm = rnd.choice([0.0, 0.0, 0.05])
    with open("f.csv", "w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens,hash_block_tokens,hash_ids\n")
        for t, I, O_, ids in rows:
            f.write(f"{t},{I},{O_},{idb},{' '.join(map(str, ids))}\n")
    args = argparse.Namespace(workload="f.csv", C=C, M=M, R=R, block=block, cost_model=O.DEFAULT_COST,
        no_reserve_full_isl=not isl, watermark=wm, raw_blocks=False, num_gpu_blocks=0, max_model_len=0,
        trace=None, out="fv.json", enable_prefix_caching=True, pulled=False, held=False)
    import io, contextlib
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            O.run(args)
    except SystemExit as e:
        print(case, "vllm stopped:", e); continue
    cmd = [B, "simulate", "--workload", "f.csv", "--scheduler", "vllm-v1", "--cost-model", "llama2-7b-a100",
           "--token-budget", str(C), "--kv-capacity", str(M), "--max-running", str(R), "--block-size", str(block),
           "--watermark", str(wm), "--out", "fo"] + ([] if isl else ["--no-scheduler-reserve-full-isl"])
    subprocess.run(["rm", "-rf", "fo"])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(case, "ours failed:", p.stderr[-500:]); bad += 1; continue
    a = json.load(open("fv.json"))['batches']; b = json.load(open("fo/vllm-v1/schedule.json"))['batches']
    hits_total += sum(e.get('cached', 0) > 0 for bt in a for e in bt['entries'])
    # The replay must accept vLLM's own schedule (entries in the order vLLM acted).
    subprocess.run(["rm", "-rf", "fr"])
    r = subprocess.run([B, "replay", "--workload", "f.csv", "--schedule", "fv.json", "--cost-model",
                        "llama2-7b-a100", "--token-budget", str(C), "--kv-capacity", str(M),
                        "--max-running", str(R), "--block-size", str(block), "--out", "fr"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(case, "the replay rejects vLLM's schedule:", r.stderr[-500:]); bad += 1
    ev_total += sum(e.get('evict', False) for bt in a for e in bt['entries'])
    d = [k for k, (x, y) in enumerate(zip(a, b)) if norm(x) != norm(y)]
    if d or len(a) != len(b):
        bad += 1
        k = d[0] if d else min(len(a), len(b))
        print(f"case {case}: C={C} M={M} R={R} block={block} idb={idb} isl={isl} wm={wm} n={n}: differ at batch {k} of {len(a)}/{len(b)}")
        for j in range(max(0, k - 1), min(max(len(a), len(b)), k + 2)):
            print("  ", j, norm(a[j]) if j < len(a) else None, "|", norm(b[j]) if j < len(b) else None)
print(f"done {cases} cases, {bad} differ, hits {hits_total}, evictions {ev_total}")
