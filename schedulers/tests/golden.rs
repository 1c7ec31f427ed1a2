//! Golden tests: tiny hand-made workloads whose batches are derived by hand from
//! `schedulers.md`. Each batch is written as "request:tokens" or "request:evict".

use infersched_core::Workload;
use infersched_cost_model::preset;
use infersched_schedulers::{Knobs, Policy, SchedulerKind, SimError, Simulator, simulate};
use infersched_test_kit::workload;

fn knobs(c: Option<u64>, m: u64, block: u32) -> Knobs {
    Knobs {
        token_budget: c,
        kv_capacity: Some(m),
        block_size: Some(block),
        watermark: Some(0.0),
        max_running: Some(1000),
        // vllm-v1's prefix caching is off in these cases unless a test turns it on (the
        // vLLM parity fixtures were recorded without it).
        prefix_caching: Some(false),
        ..Knobs::default()
    }
}

fn run(kind: &str, w: &Workload, k: &Knobs) -> Vec<String> {
    let cost = preset("llama2-7b-a100").unwrap();
    let kind: SchedulerKind = kind.parse().unwrap();
    let sim = kind.simulate(w, k, &cost).unwrap();
    // Whatever the simulator claims, the independent replay must accept.
    infersched_core::replay(w, &sim.limits, &cost, &sim.schedule).unwrap();
    sim.schedule
        .batches
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn vllm_prefill_only_batches_and_head_of_line_admission() {
    // C = 8: r0's prompt (4) is admitted; r1's (6) does not fit the 4 left, and r2 (2),
    // which would, is not considered (head-of-line). Batch 1 admits r1 and r2 and is
    // prefill-only: r0 does not decode in it.
    let w = workload(&[(4, 3, 0.0), (6, 2, 0.0), (2, 2, 0.0)]);
    let got = run("vllm", &w, &knobs(Some(8), 100, 1));
    assert_eq!(got, ["0:4", "1:6 2:2", "0:1 1:1 2:1", "0:1"]);
}

#[test]
fn vllm_lifo_victim_and_recompute_of_generated_tokens() {
    // M = 6. After two decode steps both hold 3. r0 needs a 4th slot: the last-arrived
    // (r1) is preempted. r1's refill cannot be admitted while r0 holds 4 (needs 4, 2 free);
    // after r0 finishes, r1 refills I + G = 2 + 2 = 4 tokens, generated ones included.
    let w = workload(&[(2, 4, 0.0), (2, 4, 0.0)]);
    let got = run("vllm", &w, &knobs(Some(64), 6, 1));
    assert_eq!(
        got,
        ["0:2 1:2", "0:1 1:1", "1:evict 0:1", "0:1", "1:4", "1:1"]
    );
}

#[test]
fn vllm_v0_needs_a_free_block_before_every_decode() {
    // vLLM v0's block manager lets a sequence append only while a block is free, even if
    // its last block has room (can_append_slots). M = 32 in blocks of 16: r0 and r1 (8
    // prompt tokens each) take one block each. Batch 1: r0's decode fits its own block,
    // but no block is free, so the newest (r1) is preempted. r1 refills I + G = 9 tokens
    // (its second token), is preempted again at r0's next decode, and once r0 has
    // finished refills I + G = 10 tokens, which yields its third and last token.
    let w = workload(&[(8, 3, 0.0), (8, 3, 0.0)]);
    let got = run("vllm", &w, &knobs(Some(64), 32, 16));
    assert_eq!(
        got,
        ["0:8 1:8", "1:evict 0:1", "1:9", "1:evict 0:1", "1:10"]
    );
    // Sarathi-Serve runs on the same block manager.
    let got = run("sarathi", &w, &knobs(Some(64), 32, 16));
    assert_eq!(got[1], "1:evict 0:1");
    // Alone, a request whose blocks fill M decodes into its last block's room instead of
    // preempting itself forever (found by the property test: I = 21, O = 11, M = 32 in
    // blocks of 4; its refill of 30 tokens takes all 8 blocks).
    let w = workload(&[(21, 11, 0.0)]);
    let got = run("vllm", &w, &knobs(Some(64), 32, 4));
    assert_eq!(got.len(), 11);
    assert!(got.iter().all(|b| !b.contains("evict")), "{got:?}");
}

#[test]
fn sarathi_decodes_first_then_chunks_under_the_budget() {
    // C = 4. r0's prompt (6) is chunked 4 + 2; the rest of the budget goes to r1's prompt
    // (10) in chunks 2, 3, 3, 2, after the decode of r0 in each batch.
    let w = workload(&[(6, 3, 0.0), (10, 2, 0.0)]);
    let got = run("sarathi", &w, &knobs(Some(4), 100, 1));
    assert_eq!(got, ["0:4", "0:2 1:2", "0:1 1:3", "0:1 1:3", "1:2", "1:1"]);
}

#[test]
fn vllm_v1_chunks_admission_to_the_remaining_budget() {
    let w = workload(&[(6, 2, 0.0), (3, 2, 0.0)]);
    let got = run("vllm-v1", &w, &knobs(Some(4), 100, 1));
    assert_eq!(got, ["0:4", "0:2 1:2", "0:1 1:1", "1:1"]);
}

#[test]
fn vllm_v1_admits_nothing_in_a_step_that_preempted() {
    // Without the whole-prompt check (vLLM's --no-scheduler-reserve-full-isl). C = 4,
    // M = 7. Batch 1: r0 decodes; r1's next chunk (3) needs 3 blocks, 2 are free, so r1
    // (the newest) is preempted. Its refill's first chunk (3) would now fit the 4 free
    // blocks, but V1 admits nothing in a step that preempted: it waits a step.
    let w = workload(&[(2, 3, 0.0), (6, 1, 0.0)]);
    let k = Knobs {
        reserve_full_isl: Some(false),
        ..knobs(Some(4), 7, 1)
    };
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:2 1:2", "0:1 1:evict", "0:1 1:3", "1:3"]);
}

#[test]
fn vllm_v1_with_prefix_caching_takes_its_own_blocks_back_after_a_preemption() {
    // The same case with vLLM V1's default prefix caching (block 1). r1's 2 prompt tokens
    // stay cached after its preemption (freed blocks keep their contents). Batch 2: r1
    // would take them back (a hit of 2, at most K - 1 = 5) and process 3 more (C = 4, r0
    // decodes), but vLLM counts the hit's 2 free blocks against the free ones: 5 blocks
    // needed, 3 free (M = 7, r0 holds 4), so r1 waits. Batch 3: r0 has finished; the hit
    // is still cached (r0 grew into never-used blocks), and r1 takes it and processes the
    // remaining 4 tokens of its refill, generating its only token.
    let w = workload(&[(2, 3, 0.0), (6, 1, 0.0)]);
    let k = Knobs {
        reserve_full_isl: Some(false),
        prefix_caching: Some(true),
        ..knobs(Some(4), 7, 1)
    };
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:2 1:2", "0:1 1:evict", "0:1", "1:hit2+4"]);
}

#[test]
fn vllm_v1_admits_only_prompts_that_fit_whole() {
    // vLLM 0.32's default (scheduler_reserve_full_isl): the same workload. After r0's
    // prompt, 5 blocks are free; r1's first chunk (2) would fit, but its whole prompt (6)
    // does not, so r1 waits until r0 has finished, and nobody is preempted.
    let w = workload(&[(2, 3, 0.0), (6, 1, 0.0)]);
    let got = run("vllm-v1", &w, &knobs(Some(4), 7, 1));
    assert_eq!(got, ["0:2", "0:1", "0:1", "1:4", "1:2"]);
}

#[test]
fn vllm_v1_long_prefill_token_threshold_caps_each_request_unless_alone() {
    // Threshold 3, C = 8. Batch 0: r0 and r1 both waiting, so each prompt chunk is at most
    // 3 tokens. Batch 1: r0's remaining 2 and r1's next 3. Batch 2: r0 decodes, r1's last
    // 2 (its first token), r0 finishes. Batch 3: r1 alone, no cap (a decode anyway).
    let w = workload(&[(5, 2, 0.0), (8, 2, 0.0)]);
    let k = Knobs {
        long_prefill_token_threshold: Some(3),
        ..knobs(Some(8), 100, 1)
    };
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:3 1:3", "0:2 1:3", "0:1 1:2", "1:1"]);
    // Alone, a long prompt takes the whole budget: nobody to starve.
    let w = workload(&[(20, 1, 0.0)]);
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:8", "0:8", "0:4"]);
}

#[test]
fn vllm_v1_watermark_counts_the_null_block_and_waits_while_nothing_runs() {
    // M = 144 in blocks of 16: 9 usable blocks, a pool of 10 with vLLM's null block, so
    // watermark 0.1 is int(0.1 x 10) = 1 block (int(0.1 x 9) would be 0). r0 (15 tokens,
    // 1 block) is admitted alone; r1's prompt of 128 tokens needs 8 blocks + the watermark
    // = 9 > 8 free while r0 runs. Once r0 has finished nothing runs, the watermark is
    // waived (vLLM's has_scheduled_reqs) and r1 is admitted with all 9 blocks free.
    let w = workload(&[(15, 2, 0.0), (128, 1, 0.0)]);
    let k = Knobs {
        watermark: Some(0.1),
        ..knobs(None, 144, 16)
    };
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:15", "0:1", "1:128"]);
    // A prompt that fills M whole is admitted alone although the watermark could never
    // be kept beside it.
    let w = workload(&[(144, 1, 0.0)]);
    let got = run("vllm-v1", &w, &k);
    assert_eq!(got, ["0:144"]);
}

#[test]
fn orca_reserves_i_plus_o_minus_1_and_never_preempts() {
    // M = 10: r0 reserves 6, r1 reserves 4; r2 (reserve 2) must wait until r1 finishes,
    // although only 5 tokens are really held. Then r2's prompt joins r0's decode (mixed).
    let w = workload(&[(3, 4, 0.0), (2, 3, 0.0), (1, 2, 0.0)]);
    let got = run("orca", &w, &knobs(None, 10, 1));
    assert_eq!(got, ["0:3 1:2", "0:1 1:1", "0:1 1:1", "0:1 2:1", "2:1"]);
    // vLLM admits all three at once in the same memory.
    let got = run("vllm", &w, &knobs(Some(64), 10, 1));
    assert_eq!(got[0], "0:3 1:2 2:1");
}

#[test]
fn static_batching_waits_for_the_whole_batch() {
    let w = workload(&[(2, 1, 0.0), (2, 3, 0.0), (1, 1, 0.0)]);
    let k = Knobs {
        max_running: Some(2),
        ..knobs(None, 100, 1)
    };
    let got = run("static", &w, &k);
    assert_eq!(got, ["0:2 1:2", "1:1", "1:1", "2:1"]);
}

#[test]
fn idle_gap_waits_for_the_next_arrival() {
    let w = workload(&[(2, 1, 0.0), (2, 1, 5.0)]);
    let cost = preset("llama2-7b-a100").unwrap();
    let sim = SchedulerKind::Vllm
        .simulate(&w, &knobs(None, 100, 1), &cost)
        .unwrap();
    assert_eq!(sim.schedule.batches.len(), 2);
    assert_eq!(sim.schedule.batches[1].start_s, Some(5.0));
}

#[test]
fn requests_that_can_never_fit_fail_before_simulating() {
    let cost = preset("llama2-7b-a100").unwrap();
    let w = workload(&[(8, 4, 0.0)]);
    // I + O - 1 = 11 > M = 10: nobody can serve it.
    for kind in infersched_schedulers::SCHEDULER_NAMES {
        let kind: SchedulerKind = kind.parse().unwrap();
        let e = kind
            .simulate(&w, &knobs(Some(64), 10, 1), &cost)
            .unwrap_err();
        assert!(
            e.to_string().contains("request 0 needs 11 KV tokens"),
            "{kind:?}: {e}"
        );
    }
    // A prompt larger than C cannot run under policies that do not chunk.
    let w = workload(&[(100, 2, 0.0)]);
    let e = SchedulerKind::Vllm
        .simulate(&w, &knobs(Some(64), 1000, 1), &cost)
        .unwrap_err();
    assert!(e.to_string().contains("does not chunk prompts"), "{e}");
    assert!(
        SchedulerKind::Sarathi
            .simulate(&w, &knobs(Some(64), 1000, 1), &cost)
            .is_ok()
    );
    // Orca reserving max_model_len beyond M.
    let k = Knobs {
        max_model_len: Some(5000),
        ..knobs(None, 1000, 1)
    };
    let e = SchedulerKind::OrcaMax.simulate(&w, &k, &cost).unwrap_err();
    assert!(e.to_string().contains("5000 tokens reserved"), "{e}");
    // A first chunk (the whole prompt, C unlimited) that fits M only without the
    // watermark: found by the property test as a stall; now refused up front.
    let w = workload(&[(21, 1, 0.0)]);
    let k = Knobs {
        watermark: Some(0.1),
        ..knobs(None, 21, 1)
    };
    match SchedulerKind::Vllm.simulate(&w, &k, &cost) {
        Err(SimError::Unservable { reason, .. }) => {
            assert!(reason.contains("watermark"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // vLLM V1 waives the watermark while nothing runs, so alone it is served.
    assert!(SchedulerKind::VllmV1.simulate(&w, &k, &cost).is_ok());
    // With a token budget the first chunk is small enough, and v1 serves it.
    let k = Knobs {
        watermark: Some(0.1),
        ..knobs(Some(8), 21, 1)
    };
    assert!(SchedulerKind::VllmV1.simulate(&w, &k, &cost).is_ok());
}

#[test]
fn a_policy_that_makes_no_progress_stops_with_a_diagnostic() {
    struct Lazy;
    impl Policy for Lazy {
        fn name(&self) -> String {
            "lazy".into()
        }
        fn check(&self, _: &Simulator<'_>) -> Result<(), SimError> {
            Ok(())
        }
        fn next_batch(&mut self, _: &mut Simulator<'_>) {}
    }
    let w = workload(&[(2, 1, 0.0)]);
    let cost = preset("llama2-7b-a100").unwrap();
    let limits = infersched_core::Limits::unlimited();
    let e = simulate(&w, &limits, &mut Lazy, &cost).unwrap_err();
    assert!(matches!(e, SimError::Stalled { .. }), "{e}");
    assert!(
        e.to_string().contains("waiting 1 [0(I=2,O=1,m=0,G=0)]"),
        "{e}"
    );
}

#[test]
fn sarathi_preempts_the_newest_on_a_decode_shortfall_and_refills_generated_tokens() {
    // C = 8, M = 9, block 1. Batch 0 admits r0 (4) and r1 (4): 8 blocks, 1 free.
    // Batch 1: r0's decode takes the last free block; r1's decode finds none, and the
    // newest unscheduled running request is r1 itself, so it is preempted.
    // Batch 2: r0 decodes (6 held); r1's refill of I + G = 5 tokens needs 5 blocks, 3 are
    // free, so it waits. Batch 3: after r0 finished, r1 refills 5 tokens and finishes.
    let w = workload(&[(4, 3, 0.0), (4, 2, 0.0)]);
    let got = run("sarathi", &w, &knobs(Some(8), 9, 1));
    assert_eq!(got, ["0:4 1:4", "0:1 1:evict", "0:1", "1:5"]);
}

#[test]
fn matching_knobs_reproduce_the_limits_for_every_policy() {
    let w = workload(&[(4, 2, 0.0)]);
    let limits = infersched_core::Limits {
        token_budget: Some(7),
        prefill_budget: Some(5),
        kv_capacity: Some(64),
        max_running: None,
        block_size: 4,
        watermark: 0.05,
    };
    for name in infersched_schedulers::SCHEDULER_NAMES {
        let kind: SchedulerKind = name.parse().unwrap();
        let got = kind.limits(&Knobs::matching(&limits), &w);
        assert_eq!(got.token_budget, limits.token_budget, "{name}");
        assert_eq!(got.prefill_budget, limits.prefill_budget, "{name}");
        assert_eq!(got.kv_capacity, limits.kv_capacity, "{name}");
        assert_eq!((got.block_size, got.watermark), (4, 0.05), "{name}");
        // Unlimited stays (effectively) unlimited rather than a policy default of 256.
        assert!(got.max_running.unwrap() > 1 << 40, "{name}");
    }
}

#[test]
fn mcsf_admits_shortest_outputs_first_while_the_future_peak_fits() {
    // M = 8, block 1, no C. Shortest output first: r1 (O = 1), r2 (O = 2), r0 (O = 4).
    // Batch 0: r1's prompt (2 tokens, finished at once) and r2's (3, then 4 at its one
    // decode). With r0 admitted too, at the next step r2 would hold 4 and r0 5: 9 > 8, so
    // r0 waits although its prompt fits the 3 free tokens now (vLLM would admit it and
    // preempt later). Batch 1: r2 decodes and finishes; r1 has freed its KV, so r0's
    // peak 7 fits and it is admitted. Then r0 decodes alone.
    let w = workload(&[(4, 4, 0.0), (2, 1, 0.0), (3, 2, 0.0)]);
    let got = run("mcsf", &w, &knobs(None, 8, 1));
    assert_eq!(got, ["1:2 2:3", "2:1 0:4", "0:1", "0:1", "0:1"]);
    // With room for everyone's peak, all three start in batch 0, shortest first.
    let got = run("mcsf", &w, &knobs(None, 12, 1));
    assert_eq!(got, ["1:2 2:3 0:4", "0:1 2:1", "0:1", "0:1"]);
    // Ordered by I + O instead: r1 (3), r2 (5), r0 (8): the same here; by KV area
    // O I + O (O - 1) / 2: r1 (2), r2 (7), r0 (22).
    for &order in infersched_schedulers::McsfOrder::ALL {
        let k = Knobs {
            mcsf_order: order,
            ..knobs(None, 8, 1)
        };
        assert_eq!(
            run("mcsf", &w, &k),
            ["1:2 2:3", "2:1 0:4", "0:1", "0:1", "0:1"],
            "{order:?}"
        );
    }
    // Output order and area order differ: r0 (I = 10, O = 2: area 21) against r1 (I = 1,
    // O = 3: area 6). Output-first admits r0 first; area-first admits r1 first.
    let w = workload(&[(10, 2, 0.0), (1, 3, 0.0)]);
    let by_output = run("mcsf", &w, &knobs(None, 100, 1));
    assert_eq!(by_output[0], "0:10 1:1");
    let k = Knobs {
        mcsf_order: infersched_schedulers::McsfOrder::KvArea,
        ..knobs(None, 100, 1)
    };
    assert_eq!(run("mcsf", &w, &k)[0], "1:1 0:10");
}

#[test]
fn mcsf_never_admits_past_the_block_rounded_peak() {
    // Block 4, M = 16 (4 blocks). r0 (I = 5, O = 4) ends holding 8 tokens = 2 blocks;
    // r1 (I = 6, O = 4) ends at 9 = 3 blocks: together 5 blocks > 4 at their last steps,
    // so r1 waits for r0 although both prompts (2 + 2 blocks) fit at once.
    let w = workload(&[(5, 4, 0.0), (6, 4, 0.0)]);
    let got = run("mcsf", &w, &knobs(None, 16, 4));
    assert_eq!(got[0], "0:5");
    assert!(got.iter().all(|b| !b.contains("evict")));
}

#[test]
fn fastgen_splits_a_prompt_to_fill_the_budget_and_fuses_it_with_decodes() {
    // C = 8. Step 0: r0's prompt (4) whole, then r1's cut to the 4 tokens left (its
    // remainder goes to the buffer's front, no token yet); r2 gets nothing. Step 1: the
    // decodes first (r0), then the prompts in buffer order: r1's remainder (2), r2 (2).
    let w = workload(&[(4, 3, 0.0), (6, 2, 0.0), (2, 2, 0.0)]);
    let got = run("fastgen", &w, &knobs(Some(8), 100, 1));
    assert_eq!(got, ["0:4 1:4", "0:1 1:2 2:2", "0:1 1:1 2:1"]);
    // At most `max_ragged_sequence_count` sequences per step, decodes first: with 2, r2
    // waits for r0 and r1 to finish.
    let w = workload(&[(2, 2, 0.0), (2, 2, 0.0), (2, 2, 0.0)]);
    let k = Knobs {
        max_ragged_sequence_count: Some(2),
        ..knobs(Some(64), 100, 1)
    };
    assert_eq!(run("fastgen", &w, &k), ["0:2 1:2", "0:1 1:1", "2:2", "2:1"]);
}

#[test]
fn fastgen_counts_one_token_prompts_against_the_prefill_budget() {
    // C = 2, P = 1: r0's 4-token prompt runs 1 token per step (P). r1's 1-token prompt
    // arrives when r0 has 1 prompt token left: both are walked with the decodes (their
    // next input is one token, as MII groups them), but both are prompt tokens, so only
    // r0's runs (before, both did: 2 prompt tokens over P).
    let w = workload(&[(4, 1, 0.0), (1, 1, 0.014)]);
    let k = Knobs {
        prefill_budget: Some(1),
        ..knobs(Some(2), 6, 1)
    };
    let got = run("fastgen", &w, &k);
    assert!(got.iter().all(|b| b.matches(' ').count() == 0), "{got:?}");
    assert_eq!(got, ["0:1", "0:1", "0:1", "0:1", "1:1"]);
}

#[test]
fn fastgen_resets_when_no_decode_gets_a_block_and_no_prompt_fits() {
    // M = 16 in blocks of 4. Four prompts of 4 tokens take a block each; then every
    // decode needs a second block and none is free, and there is no prompt: nothing can
    // run, so MII flushes every request holding KV (one batch of evictions). They come
    // back as prompts of I + G = 5 tokens (2 blocks each, the whole remainder must fit):
    // r0 and r1 fit, r2 does not and stops the walk. r0 and r1 finish; then r2 and r3.
    let w = workload(&[(4, 3, 0.0); 4]);
    let got = run("fastgen", &w, &knobs(Some(64), 16, 4));
    assert_eq!(
        got,
        [
            "0:4 1:4 2:4 3:4",
            "0:evict 1:evict 2:evict 3:evict",
            "0:5 1:5",
            "0:1 1:1",
            "2:5 3:5",
            "2:1 3:1"
        ]
    );
    // With --no-preemption each admission takes its whole I + O - 1 (6 tokens, 2 blocks):
    // two at a time, never a reset.
    let k = Knobs {
        no_preemption: true,
        ..knobs(Some(64), 16, 4)
    };
    let got = run("fastgen", &w, &k);
    assert_eq!(got[0], "0:4 1:4");
    assert!(got.iter().all(|b| !b.contains("evict")), "{got:?}");
}

#[test]
fn lightllm_admits_by_the_future_peak_and_tries_new_requests_every_few_decodes() {
    // M = 13, block 1, max_waiting_iters = 1. Each request is (has_run, left) = (KV after
    // its next token, tokens after that); the peak sorted by left, largest first, must
    // stay below M. Step 0: r0 (5, 2): 7; with r1 (5, 2): 2 * 2 + 10 = 14: r1 waits.
    // Step 2: r0 is (6, 1), r1 (5, 2): 1 * 2 + 11 = 13, not below 13: a decode instead.
    // Step 3: r0 (7, 0): 12, so r1 is admitted in a prefill-only batch (r0 waits), r2
    // (3, 0) would make it 15. Then decodes of both, r2 on the next try, and so on.
    let w = workload(&[(4, 4, 0.0), (4, 4, 0.0), (2, 2, 0.0)]);
    let k = Knobs {
        max_waiting_iters: Some(1),
        ..knobs(Some(64), 13, 1)
    };
    assert_eq!(
        run("lightllm", &w, &k),
        [
            "0:4", "0:1", "0:1", "1:4", "0:1 1:1", "2:2", "1:1 2:1", "1:1"
        ]
    );
    // With the default of 10 decodes between tries, r1 waits until r0 has finished.
    let got = run("lightllm", &w, &knobs(Some(64), 13, 1));
    assert_eq!(got[..5], ["0:4", "0:1", "0:1", "0:1", "1:4 2:2"]);
}

#[test]
fn fastertransformer_reserves_max_model_len_per_request() {
    // M = 24, block 1, max_model_len = 10: two requests' reservations fit, a third does
    // not; the batch runs to its end before r2 is admitted. Static batching reserves
    // I + O - 1 = 5 each and takes all three.
    let w = workload(&[(4, 2, 0.0), (4, 2, 0.0), (4, 2, 0.0)]);
    let k = Knobs {
        max_model_len: Some(10),
        ..knobs(None, 24, 1)
    };
    assert_eq!(
        run("fastertransformer", &w, &k),
        ["0:4 1:4", "0:1 1:1", "2:4", "2:1"]
    );
    assert_eq!(run("static", &w, &k), ["0:4 1:4 2:4", "0:1 1:1 2:1"]);
}
