#!/usr/bin/env python3
"""Drive the REAL vLLM v0 scheduler on CPU and emit its schedule in infersched's format.

Written apart from infersched, as an independent oracle for its `vllm` policy (vLLM v0,
chunked prefill off). Checked against vLLM 0.6.3.post1 (PyPI), the last v0 release whose
`vllm/core/scheduler.py` is the v0 engine's only scheduler; its block manager is
`SelfAttnBlockSpaceManager` (`vllm/core/block_manager.py`, the "v2" block manager, the
only one left in 0.6.3), watermark 0.01.

What it does
  * builds `vllm.core.scheduler.Scheduler` with a SchedulerConfig (max_num_batched_tokens
    = C, max_num_seqs = R, max_model_len = C, chunked prefill off, FCFS) and a CacheConfig
    (block size --block, num_gpu_blocks = M / block, no CPU blocks, prefix caching off),
    synchronous (no output_proc_callback: the engine's async output processing off);
  * adds one SequenceGroup per workload row (prompt of I distinct tokens, SamplingParams
    max_tokens = O, ignore_eos) in FCFS order (arrival, then row index);
  * loops: schedule(); for every scheduled group, what `LLMEngine._process_model_outputs`
    does: update_num_computed_tokens(token_chunk_size) and, where the step samples, one
    token appended; a sequence with O tokens is marked FINISHED_LENGTH_CAPPED, then
    free_finished_seq_groups();
  * records per step the scheduled token counts and the preempted requests (left
    `running` for `waiting`: v0 recomputes a single-sequence group) and writes
    {"format": "infersched-schedule/1", "batches": [...]}, an eviction entry in the batch
    of the step that preempted;
  * online arrivals: the clock of infersched's linear cost model, as vllm_v1_oracle.py.

Self-checks on every step: the preempted set is what left `running`; num_computed_tokens
and the sequence length agree with this script's own account of KV held (m) and tokens
generated (G); a refill processes I + G tokens.

With --enable-prefix-caching the block manager caches (PrefixCachingBlockAllocator): prompt
tokens come from the CSV's hash_ids as in the V1 oracle, and an entry whose leading blocks
the model runner skips (`computed_block_nums`: blocks computed in an earlier step, never a
sequence's last) is written `{"request": k, "tokens": c - h, "cached": h}`, its time that
of the c - h tokens computed over h cached, and the schedule names its cache rule
(`"prefix_cache": "vllm-v0"`: vLLM v0's budget counts all c, a block two prompts share
within one step is held once and computed by both, LRU eviction; semantics.md). Each step's
entries are written in the order vLLM acted: a preemption just before the running request
it made room for (logged from `Scheduler._preempt` and `_append_slots`), as blocks are
freed and taken in that order.

usage:
  $VLLM_V0_VENV/bin/python vllm_v0_oracle.py WORKLOAD.csv --C 2048 --M 8000 --R 256 \
      --block 16 [--watermark 0.01] [--enable-prefix-caching] [--cost-model FILE] \
      --out schedule.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_v1_oracle import (DEFAULT_COST, batch_time, load_theta, load_workload,  # noqa: E402
                            prompt_tokens)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def build_scheduler(C, R, block, num_blocks, watermark, caching=False):
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler

    sc = SchedulerConfig(max_num_batched_tokens=C, max_num_seqs=R, max_model_len=C,
                         enable_chunked_prefill=False, policy="fcfs")
    cc = CacheConfig(block_size=block, gpu_memory_utilization=0.9, swap_space=0,
                     cache_dtype="auto", enable_prefix_caching=caching)
    cc.num_gpu_blocks = num_blocks
    cc.num_cpu_blocks = 0
    sched = Scheduler(sc, cc, None)
    bm = sched.block_manager
    # The settings this run depends on, read back from the live objects.
    assert type(bm).__name__ == "SelfAttnBlockSpaceManager", type(bm).__name__
    bm.watermark = watermark
    bm.watermark_blocks = int(watermark * num_blocks)
    assert not sched.scheduler_config.chunked_prefill_enabled
    assert not sched.use_async_output_proc
    return sched


def make_group(i, I, O, arrival, block, prefix=None):
    from vllm.inputs import token_inputs
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Sequence, SequenceGroup
    # With prompt block ids (hash_ids), equal chains of ids give equal tokens, as in the V1
    # oracle; otherwise every request's tokens are its own.
    prompt = (prompt_tokens(i, I, prefix) if prefix else
              [10**6 + i * 10**4 + p % 10**4 for p in range(I)])
    seq = Sequence(i, token_inputs(prompt_token_ids=prompt), block, eos_token_id=2)
    sp = SamplingParams(max_tokens=O, ignore_eos=True, temperature=0.0)
    return SequenceGroup(request_id=str(i), seqs=[seq], arrival_time=arrival,
                         sampling_params=sp)


def record_actions(sched):
    """Logs, in order, each request vLLM preempts (`_preempt`) and each running request it
    grows (`_append_slots`) during one `schedule()`: [("evict" | "grow", request)]."""
    acts = []
    preempt, append = sched._preempt, sched._append_slots

    def logged_preempt(seq_group, *a, **kw):
        acts.append(("evict", int(seq_group.request_id)))
        return preempt(seq_group, *a, **kw)

    def logged_append(seq_group, *a, **kw):
        acts.append(("grow", int(seq_group.request_id)))
        return append(seq_group, *a, **kw)

    sched._preempt, sched._append_slots = logged_preempt, logged_append
    return acts


def run(args):
    from vllm.sequence import Logprob, SequenceStatus

    reqs, prefix = load_workload(args.workload)
    n = len(reqs)
    theta = load_theta(args.cost_model)
    block = args.block
    num_blocks = args.M // block
    caching = args.enable_prefix_caching
    sched = build_scheduler(args.C, args.R, block, num_blocks, args.watermark, caching)
    acts = record_actions(sched)
    groups = {}
    order = sorted(range(n), key=lambda i: (reqs[i][2], i))
    next_pending, done, clock, step = 0, 0, 0.0, 0
    m, G = [0] * n, [0] * n
    batches = []
    while done < n:
        while next_pending < n and reqs[order[next_pending]][2] <= clock:
            i = order[next_pending]
            groups[i] = make_group(i, reqs[i][0], reqs[i][1], reqs[i][2], block,
                                   prefix if caching else None)
            sched.add_seq_group(groups[i])
            next_pending += 1
        running_before = [int(g.request_id) for g in sched.running]
        acts.clear()
        metas, out, _ = sched.schedule()
        # With caching: the leading blocks the model runner skips (computed in an earlier
        # step; the budget paid for them all the same).
        skipped = {int(md.request_id): len(md.computed_block_nums or []) * block
                   for md in metas if md.is_prompt} if caching else {}
        step += 1
        running_after = {int(g.request_id) for g in sched.running}
        preempted = [k for k in running_before if k not in running_after
                     and not groups[k].is_finished()]
        assert out.preempted == len(preempted), (step, out.preempted, preempted)
        if out.ignored_seq_groups:
            raise SystemExit(f"step {step}: vLLM ignored requests "
                             f"{[g.request_id for g in out.ignored_seq_groups]} (too long)")
        if not out.scheduled_seq_groups and not preempted:
            if next_pending < n and not sched.running and not sched.waiting:
                clock = max(clock, reqs[order[next_pending]][2])
                continue
            raise SystemExit(f"vLLM scheduled nothing at step {step} (clock {clock}) with "
                             f"{len(sched.running)} running and {len(sched.waiting)} waiting")
        # Preemptions where vLLM made them, between the running requests it grew (their
        # blocks are freed then, which the prefix cache's evictor order follows).
        assert sorted(k for a, k in acts if a == "evict") == sorted(preempted), (step, acts)
        evicted_before = {}
        for a, k in acts:
            if a == "evict":
                evicted_before.setdefault(None, []).append(k)
            else:
                evicted_before[k] = evicted_before.pop(None, [])
        entries = []
        for k in preempted:
            assert m[k] > 0, (step, k)
            m[k] = 0
        feats = dict(tokens=0, decode_kv=0, prefill_attn=0, prefill_ctx=0,
                     n_prefill=0, n_decode=0)
        sampled = []
        for s in out.scheduled_seq_groups:
            k, c = int(s.seq_group.request_id), s.token_chunk_size
            seq = s.seq_group.seqs[0]
            K = reqs[k][0] + G[k]
            assert seq.get_len() == K, (step, k, seq.get_len(), K)
            assert seq.data.get_num_computed_tokens() == m[k], (step, k)
            before, after = m[k], m[k] + c
            assert after == K, (step, k, before, c, K)
            h = skipped.get(k, 0)
            if G[k] >= 1 and before == K - 1:
                assert h == 0, (step, k, h)
                feats["decode_kv"] += after
                feats["n_decode"] += 1
            else:
                assert before == 0 and h % block == 0 and h < c, (step, k, before, h)
                feats["prefill_attn"] += (c - h) * (c - h) + 2 * (c - h) * h
                feats["prefill_ctx"] += h
                feats["n_prefill"] += 1
            feats["tokens"] += c - h
            m[k] = after
            entries += [{"request": v, "evict": True} for v in evicted_before.pop(k, [])]
            entries.append({"request": k, "tokens": c - h, "cached": h} if h else
                           {"request": k, "tokens": c})
            s.seq_group.update_num_computed_tokens(c)
            sampled.append((k, seq))
        entries += [{"request": v, "evict": True} for v in evicted_before.pop(None, [])]
        assert not evicted_before, (step, evicted_before)
        for k, seq in sampled:
            tok = 3 + k % 1000
            seq.append_token_id(tok, {tok: Logprob(0.0)})
            G[k] += 1
            if G[k] == reqs[k][1]:
                seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                m[k] = 0
                done += 1
        sched.free_finished_seq_groups()
        start = clock
        clock = start + batch_time(theta, feats)
        batch = {"entries": entries}
        if feats["tokens"] > 0:
            batch["start_s"], batch["end_s"] = start, clock
        batches.append(batch)
        if step > 64 * sum(I + O for I, O, _ in reqs) + 10**6:
            raise SystemExit(f"recomputation livelock after {step} steps")
    import vllm
    meta = {"producer": f"vllm-{vllm.__version__} Scheduler (vllm_v0_oracle.py)",
            "C": args.C, "M": args.M, "R": args.R, "block": block,
            "num_gpu_blocks": num_blocks, "watermark": args.watermark,
            "enable_prefix_caching": caching, "steps": step}
    with open(args.out, "w") as f:
        doc = {"format": "infersched-schedule/1", "meta": meta}
        if caching:
            doc["prefix_cache"] = "vllm-v0"
        doc["batches"] = batches
        json.dump(doc, f)
    ev = sum(1 for b in batches for e in b["entries"] if e.get("evict"))
    hits = sum(e.get("cached", 0) for b in batches for e in b["entries"])
    print(json.dumps({"batches": len(batches), "evictions": ev, "makespan_s": clock,
                      "cached_tokens": hits}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload")
    ap.add_argument("--C", type=int, required=True, help="max_num_batched_tokens")
    ap.add_argument("--M", type=int, required=True, help="KV capacity in tokens")
    ap.add_argument("--R", type=int, required=True, help="max_num_seqs")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--watermark", type=float, default=0.01,
                    help="the block manager's watermark (vLLM v0 default 0.01)")
    ap.add_argument("--cost-model", default=DEFAULT_COST,
                    help="infersched cost-model JSON (for the clock of online arrivals)")
    ap.add_argument("--enable-prefix-caching", action="store_true",
                    help="vLLM v0's automatic prefix caching (prompt block ids from the CSV's "
                         "hash_block_tokens/hash_ids columns; the leading blocks the model "
                         "runner skips written as \"cached\": the budget still counts them, "
                         "and blocks shared within a step are computed by each request)")
    ap.add_argument("--out", required=True)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
