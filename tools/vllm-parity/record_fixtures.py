#!/usr/bin/env python3
"""Record real vLLM V1 schedules as parity fixtures.

For each case: writes DIR/<name>/workload.csv, config.json (the limits, in infersched's and
vLLM's words) and vllm-schedule.csv (what vLLM's own Scheduler did, in infersched's schedule
CSV form `batch,request,tokens` with `evict` where vLLM preempted, one batch per engine
step; converted from the infersched-schedule/1 JSON that vllm_v1_oracle.py writes, which is
kept only with KEEP_JSON=1). tests/vllm_parity.rs reads these. Usage:
  PROJECT=<infersched checkout> VLLM_VENV=<venv> record_fixtures.py shared|prefix OUTDIR
  PROJECT=<infersched checkout> VLLM_V0_VENV=<vLLM 0.6.3 venv> record_fixtures.py v0|v0-prefix OUTDIR

`v0` records vLLM 0.6.3.post1's v0 Scheduler (chunked prefill off; vllm_v0_oracle.py) for
infersched's `vllm` policy (tests/vllm_v0_parity.rs). `v0-prefix` records it on windows of
the Mooncake traces with its automatic prefix caching on (vllm_v0_oracle.py
--enable-prefix-caching); their schedule stays JSON (vllm-schedule.json), which names the
cache rule it follows (`"prefix_cache": "vllm-v0"`).

`pulled` records the decode side of disaggregated serving as vLLM 0.32 runs it with a
connector that pulls each prompt's KV (vllm_v1_oracle.py --pulled): each case's requests
are served by infersched (`simulate --disaggregate 1:1 --kv-connector nixl`, over the
case's KV link), and its decode replica's inputs (arrival there, I, O and the pull's
seconds, workload.csv's `transfer_s`) are given to vLLM's Scheduler; vllm-schedule.csv
then has `receive` entries (the tokens received in the `cached` column). Each case's
`prefill/` folder is its prefill replica the same way (vllm_v1_oracle.py --held, prefix
caching on as on infersched's prefill replicas): arrival, I, O = 1 and how long the KV was
kept after the first token (`kv_hold_s`, until the decode side had read it); its schedule
is vllm-schedule.json, with each batch's start and end (a batch waiting for held KV to be
read starts after the one before ended). Needs a
release build of infersched (INFERSCHED=<binary> to name another). tests/vllm_parity.rs
reads them.

`prefix` records windows of the Mooncake traces (prompt block ids of 512 tokens) with vLLM's
automatic prefix caching on; their workload.csv carries `hash_block_tokens,hash_ids` and
vllm-schedule.csv a fourth column `cached` (tokens each entry took from the cache).
"""
import csv, json, os, random, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.environ.get("PROJECT", ".")
VENV = os.environ.get("VLLM_VENV", os.path.join(HERE, ".venv-vllm"))
BIN = os.environ.get("INFERSCHED", os.path.join(PROJECT, "target/release/infersched"))


def rows_from(path, start, n, time_div=1.0, cap=None):
    rows = list(csv.DictReader(open(path)))[start:start + n]
    t0 = float(rows[0].get("arrived_at") or 0.0)
    out = []
    for r in rows:
        o = int(r["num_decode_tokens"]); i = int(r["num_prefill_tokens"])
        if cap: i = max(1, min(i, cap - o))
        t = r.get("arrived_at")
        out.append((i, o, (float(t) - t0) / time_div if t not in (None, "") else 0.0))
    return out


def mooncake(name, start, n, time_div, cap):
    """Requests start..start+n of a Mooncake trace, arrivals rebased and divided by
    time_div, prompts cut so that I + O <= cap (their block ids cut with them, as
    `workload sample --max-total-tokens` does): (I, O, t, ids)."""
    path = os.path.join(PROJECT, "notebooks-data/traces/mooncake", name)
    rows = [json.loads(l) for l in open(path)][start:start + n]
    t0 = rows[0]["timestamp"]
    out = []
    for r in rows:
        o = int(r["output_length"]); i = max(1, min(int(r["input_length"]), cap - o))
        ids = r["hash_ids"][: -(-i // 512)]
        out.append((i, o, (r["timestamp"] - t0) / 1000.0 / time_div, ids))
    return out


def synth(seed, n, qps):
    rnd = random.Random(seed); t = 0.0; out = []
    for _ in range(n):
        if qps: t += rnd.expovariate(qps)
        out.append((rnd.randint(16, 1500), rnd.randint(1, 300), round(t, 6)))
    return out


def cases(kind):
    if kind == "shared":
        ax = os.path.join(PROJECT, "notebooks-data/traces/arxiv_summarization.csv")
        return [
            ("hand-chunk-preempt", [(100, 5, 0), (200, 4, 0), (60, 8, 0)], 64, 256, 8, True, 0.0),
            ("hand-rmax2", [(30, 6, 0), (40, 5, 0), (20, 9, 0), (10, 3, 0)], 64, 512, 2, True, 0.0),
            ("arxiv200-c512-m8000", rows_from(ax, 1000, 200, cap=4096), 512, 8000, 64, True, 0.0),
            ("arxiv200-c512-m20000", rows_from(ax, 3000, 200, cap=4096), 512, 20000, 64, True, 0.0),
            ("arxiv200-c2048-m12000", rows_from(ax, 5000, 200, cap=4096), 2048, 12000, 64, True, 0.0),
            ("arxiv200-c8192-m20000-r256", rows_from(ax, 7000, 200, cap=4096), 8192, 20000, 256, True, 0.0),
            ("arxiv200-c512-m8000-noisl", rows_from(ax, 1000, 200, cap=4096), 512, 8000, 64, False, 0.0),
            ("arxiv200-c2048-m8000-wm05", rows_from(ax, 9000, 200, cap=4096), 2048, 8000, 64, True, 0.05),
            ("poisson2-c512-m8000", synth(1, 300, 2.0), 512, 8000, 64, True, 0.0),
            ("poisson8-c2048-m12000", synth(2, 300, 8.0), 2048, 12000, 128, True, 0.0),
            ("poisson8-c512-m20000-noisl", synth(3, 300, 8.0), 512, 20000, 64, False, 0.0),
        ]
    if kind == "prefix":
        conv, syn = "conversation_trace.jsonl", "synthetic_trace.jsonl"
        return [
            ("mooncake-conv100-c2048-m32768", mooncake(conv, 0, 100, 1.0, 8192), 2048, 32768, 64, True, 0.0),
            ("mooncake-conv100-c8192-m65536-x4", mooncake(conv, 2000, 100, 4.0, 8192), 8192, 65536, 128, True, 0.0),
            ("mooncake-syn100-c2048-m24576", mooncake(syn, 0, 100, 1.0, 8192), 2048, 24576, 64, True, 0.0),
            ("mooncake-syn100-c512-m16384-noisl", mooncake(syn, 500, 100, 2.0, 8192), 512, 16384, 64, False, 0.0),
        ]
    if kind == "v0":
        ax = os.path.join(PROJECT, "notebooks-data/traces/arxiv_summarization.csv")
        sw = os.path.join(PROJECT, "notebooks-data/traces/splitwise_code.csv")
        return [
            ("v0-hand-self-preempt", [(31, 20, 0), (31, 20, 0), (20, 20, 0)], 64, 128, 8, None, 0.0),
            ("v0-arxiv200-c4096-m8000", rows_from(ax, 1000, 200, cap=4096), 4096, 8000, 256, None, 0.01),
            ("v0-arxiv200-c4096-m20000-r64", rows_from(ax, 3000, 200, cap=4096), 4096, 20000, 64, None, 0.01),
            ("v0-arxiv200-c8192-m12000-wm05", rows_from(ax, 5000, 200, cap=4096), 8192, 12000, 256, None, 0.05),
            ("v0-splitwise200-c4096-m16000-x4", rows_from(sw, 0, 200, time_div=4.0, cap=4096), 4096, 16000, 256, None, 0.01),
            ("v0-poisson2-c2048-m8000", synth(1, 300, 2.0), 2048, 8000, 256, None, 0.01),
            ("v0-poisson8-c2048-m12000-r128", synth(2, 300, 8.0), 2048, 12000, 128, None, 0.01),
            ("v0-poisson8-c4096-m20000-wm0", synth(3, 300, 8.0), 4096, 20000, 256, None, 0.0),
        ]
    if kind == "v0-prefix":
        conv, syn = "conversation_trace.jsonl", "synthetic_trace.jsonl"
        return [
            ("v0-mooncake-conv100-c8192-m65536", mooncake(conv, 0, 100, 1.0, 8192), 8192, 65536, 256, None, 0.01),
            ("v0-mooncake-conv100-c8192-m32768-x4", mooncake(conv, 2000, 100, 4.0, 8192), 8192, 32768, 256, None, 0.01),
            ("v0-mooncake-syn100-c8192-m24576", mooncake(syn, 0, 100, 1.0, 8192), 8192, 24576, 256, None, 0.01),
            ("v0-mooncake-syn100-c8192-m16384-x2", mooncake(syn, 500, 100, 2.0, 8192), 8192, 16384, 64, None, 0.0),
        ]
    if kind == "pulled":
        import fuzz_pulled
        sw = os.path.join(PROJECT, "notebooks-data/traces/splitwise_code.csv")
        ax = os.path.join(PROJECT, "notebooks-data/traces/arxiv_summarization.csv")
        poisson = [(i, o, t) for (i, o, _), (_, _, t) in
                   zip(rows_from(ax, 2000, 100, cap=4096), synth(4, 100, 2.0))]

        def fuzz(seed):
            rows, C, M, R, block, gbs, lat = fuzz_pulled.case_of(random.Random(seed))
            return [(i, o, t) for t, i, o in rows], C, M, R, (block, gbs, lat)
        return [
            # (name, requests, C, M, R, (block, link GB/s or None for NVLink, latency us))
            ("pulled-splitwise200-x4-nvlink", rows_from(sw, 0, 200, time_div=4.0, cap=4096),
             8192, 32768, 256, (16, None, 0)),
            ("pulled-splitwise200-x4-1gbs-m16384", rows_from(sw, 0, 200, time_div=4.0, cap=4096),
             8192, 16384, 256, (16, 1.0, 2000)),
            ("pulled-arxiv100-poisson2-10gbs-m12000", poisson, 2048, 12000, 64, (16, 10.0, 0)),
            # Small random cases where infersched differed before 2026-11-28 (fuzz_pulled.py):
            # a request arriving while the replica waits for another's KV, and the victim
            # of a preemption when KV arrived out of arrival order.
            ("pulled-fuzz41-arrival-during-transfer",) + fuzz(41),
            ("pulled-fuzz28-victim-order",) + fuzz(28),
            # ... and a prefill replica waiting for the release of KV the decode side had
            # yet to receive.
            ("pulled-fuzz11-prefill-release-order",) + fuzz(11),
        ]
    raise SystemExit("unknown case set: " + kind)


def record_pulled(d, reqs, C, M, R, link):
    """Both sides of a case (infersched's disaggregated run over `link`, then each
    replica's inputs given to vLLM 0.32's V1 Scheduler): DIR/workload.csv and
    vllm-schedule.csv for the decode replica, DIR/prefill/ the same for the prefill
    replica, and config.json in each. Returns the recorded schedules' entries."""
    import fuzz_pulled
    block, gbs, lat = link
    with open(os.path.join(d, "cluster.csv"), "w") as f:
        f.write("num_prefill_tokens,num_decode_tokens,arrived_at\n")
        for i, o, t in reqs:
            f.write(f"{i},{o},{t:.6f}\n")
    out = os.path.join(d, "infersched-run")
    subprocess.run(["rm", "-rf", out])
    cmd = [BIN, "simulate", "--workload", os.path.join(d, "cluster.csv"), "--scheduler",
           "vllm-v1", "--disaggregate", "1:1", "--kv-connector", "nixl", "--cost-model",
           "llama2-7b-a100", "--token-budget", str(C), "--kv-capacity", str(M),
           "--max-running", str(R), "--block-size", str(block), "--kv-latency-us", str(lat),
           "--out", out] + (["--kv-bandwidth", str(gbs)] if gbs else [])
    subprocess.run(cmd, check=True, capture_output=True)
    entries = []
    for sub, inputs, pulled in (("", fuzz_pulled.decode_side, True),
                                ("prefill", fuzz_pulled.prefill_side, False)):
        side = os.path.join(d, sub)
        os.makedirs(side, exist_ok=True)
        text, _ = inputs(out)
        with open(os.path.join(side, "workload.csv"), "w") as f:
            f.write(text)
        cfg = {"vllm_version": "0.32.0", "policy": "fcfs", "cost_model": "llama2-7b-a100",
               "token_budget": C, "kv_capacity": M, "max_running": R, "block_size": block,
               "watermark": 0.0, "reserve_full_isl": True,
               "kv_link": {"gb_per_s": gbs or "NVLink of the cost model's GPU",
                           "latency_us": lat},
               "vllm": {"max_num_batched_tokens": C, "max_num_seqs": R, "block_size": block,
                        "num_gpu_blocks": M // block + 1, "scheduler_reserve_full_isl": True,
                        "watermark": 0.0, "enable_chunked_prefill": True,
                        "enable_prefix_caching": not pulled,
                        "long_prefill_token_threshold": 0, "async_scheduling": False,
                        "kv_connector": "OraclePullConnector (NixlConnector's rules)"},
               "note": ("the decode instance alone: arrived_at is the request's arrival there "
                        "(its first token on the prefill replica), transfer_s its pull")
               if pulled else
               ("the prefill instance alone: each request's KV kept kv_hold_s after its "
                "first token (until the decode side had read it)")}
        json.dump(cfg, open(os.path.join(side, "config.json"), "w"), indent=1)
        oracle = [os.path.join(VENV, "bin/python"), os.path.join(HERE, "vllm_v1_oracle.py"),
                  os.path.join(side, "workload.csv"), "--C", str(C), "--M", str(M), "--R",
                  str(R), "--block", str(block), "--out", os.path.join(side, "schedule.json")]
        oracle += ["--pulled"] if pulled else ["--held", "--enable-prefix-caching"]
        subprocess.run(oracle, check=True, capture_output=True)
        s = json.load(open(os.path.join(side, "schedule.json")))
        if pulled:
            write_csv(side, s, True)
        else:
            # With its batches' times: a batch that waited for held KV to be read started
            # later than the one before ended, which the replay takes from them.
            os.rename(os.path.join(side, "schedule.json"),
                      os.path.join(side, "vllm-schedule.json"))
        entries += [e for b in s["batches"] for e in b["entries"]]
    subprocess.run(["rm", "-rf", out, os.path.join(d, "cluster.csv")])
    return entries


def main():
    kind, outdir = sys.argv[1], sys.argv[2]
    if kind == "pulled":
        return main_pulled(outdir)
    for name, reqs, C, M, R, isl, wm in cases(kind):
        d = os.path.join(outdir, name); os.makedirs(d, exist_ok=True)
        prefix = kind in ("prefix", "v0-prefix")
        with open(os.path.join(d, "workload.csv"), "w") as f:
            if prefix:
                f.write("num_prefill_tokens,num_decode_tokens,arrived_at,hash_block_tokens,hash_ids\n")
                for i, o, t, ids in reqs:
                    f.write(f"{i},{o},{t:.6f},512,{' '.join(map(str, ids))}\n")
            else:
                f.write("num_prefill_tokens,num_decode_tokens,arrived_at\n")
                for i, o, t in reqs: f.write(f"{i},{o},{t:.6f}\n")
        if kind.startswith("v0"):
            cmd = record_v0(d, C, M, R, wm, prefix)
        else:
            cmd = record_v1(d, C, M, R, isl, wm, prefix)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode: print(name, "FAILED", r.stderr[-500:]); continue
        s = json.load(open(os.path.join(d, "schedule.json")))
        if kind == "v0-prefix":
            os.replace(os.path.join(d, "schedule.json"), os.path.join(d, "vllm-schedule.json"))
        else:
            write_csv(d, s, prefix)
        ev = sum(1 for b in s["batches"] for e in b["entries"] if e.get("evict"))
        hits = sum(e.get("cached", 0) for b in s["batches"] for e in b["entries"])
        print(f"{name}: {len(reqs)} requests, {len(s['batches'])} batches, {ev} evictions, "
              f"{hits} tokens from the cache", flush=True)


def main_pulled(outdir):
    for name, reqs, C, M, R, link in cases("pulled"):
        d = os.path.join(outdir, name); os.makedirs(d, exist_ok=True)
        try:
            entries = record_pulled(d, reqs, C, M, R, link)
        except subprocess.CalledProcessError as e:
            print(name, "FAILED", (e.stderr or b"")[-500:]); continue
        recv = sum(1 for e in entries if "receive" in e)
        ev = sum(1 for e in entries if e.get("evict"))
        print(f"{name}: {len(reqs)} requests, {recv} receives, {ev} evictions (both sides)",
              flush=True)


def record_v0(d, C, M, R, wm, prefix=False):
    """config.json and the command of vLLM 0.6.3's v0 Scheduler (vllm_v0_oracle.py)."""
    venv = os.environ.get("VLLM_V0_VENV", os.path.join(HERE, ".venv-vllm-v0"))
    cfg = {"vllm_version": "0.6.3.post1", "policy": "fcfs", "cost_model": "llama2-7b-a100",
           "token_budget": C, "kv_capacity": M, "max_running": R, "block_size": 16,
           "watermark": wm,
           "vllm": {"max_num_batched_tokens": C, "max_num_seqs": R, "max_model_len": C,
                    "block_size": 16, "num_gpu_blocks": M // 16, "watermark": wm,
                    "enable_chunked_prefill": False, "enable_prefix_caching": prefix,
                    "block_manager": "SelfAttnBlockSpaceManager",
                    "async_output_proc": False},
           "note": "vLLM v0 has no null block: num_gpu_blocks x 16 = M tokens"}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    cmd = [os.path.join(venv, "bin/python"), os.path.join(HERE, "vllm_v0_oracle.py"),
           os.path.join(d, "workload.csv"), "--C", str(C), "--M", str(M), "--R", str(R),
           "--block", "16", "--watermark", str(wm), "--out", os.path.join(d, "schedule.json")]
    if prefix:
        cmd.append("--enable-prefix-caching")
    return cmd


def record_v1(d, C, M, R, isl, wm, prefix):
    """config.json and the command of vLLM 0.32's V1 Scheduler (vllm_v1_oracle.py)."""
    cfg = {"vllm_version": "0.32.0", "policy": "fcfs", "cost_model": "llama2-7b-a100",
           "token_budget": C, "kv_capacity": M, "max_running": R, "block_size": 16,
           "watermark": wm, "reserve_full_isl": isl,
           "vllm": {"max_num_batched_tokens": C, "max_num_seqs": R, "block_size": 16,
                    "num_gpu_blocks": M // 16 + 1, "scheduler_reserve_full_isl": isl,
                    "watermark": wm, "enable_chunked_prefill": True, "enable_prefix_caching": prefix,
                    "long_prefill_token_threshold": 0, "async_scheduling": False},
           "note": "num_gpu_blocks includes vLLM's null block, so M tokens are usable"}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    cmd = [os.path.join(VENV, "bin/python"), os.path.join(HERE, "vllm_v1_oracle.py"), os.path.join(d, "workload.csv"),
           "--C", str(C), "--M", str(M), "--R", str(R), "--block", "16", "--watermark", str(wm),
           "--out", os.path.join(d, "schedule.json")]
    if not isl: cmd.append("--no-reserve-full-isl")
    if prefix: cmd.append("--enable-prefix-caching")
    return cmd


def write_csv(d, s, prefix):
    """vllm-schedule.csv from the oracle's schedule.json (removed unless KEEP_JSON)."""
    with open(os.path.join(d, "vllm-schedule.csv"), "w") as f:
        f.write("batch,request,tokens,cached\n" if prefix else "batch,request,tokens\n")
        for k, b in enumerate(s["batches"]):
            for e in b["entries"]:
                if "receive" in e:
                    f.write(f"{k},{e['request']},receive,{e['receive']}\n")
                    continue
                tail = f",{e.get('cached', 0)}" if prefix else ""
                f.write(f"{k},{e['request']},{'evict' if e.get('evict') else e['tokens']}{tail}\n")
    if not os.environ.get("KEEP_JSON"):
        os.remove(os.path.join(d, "schedule.json"))


if __name__ == "__main__":
    main()
