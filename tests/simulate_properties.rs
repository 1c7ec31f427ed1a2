//! Property tests: every heuristic policy, on random workloads and limits, produces a
//! schedule the independent replay accepts, with the replay's clock (checked through the
//! schedule's claimed batch times) and memory account equal to the simulator's own.

use infersched::core::{
    ClassifiedEntry, EntryKind, Limits, Pipeline, PrefixIds, Schedule, Workload, classify_entries,
    replay, replay_pipelined,
};
use infersched::cost_model::preset;
use infersched::schedulers::{Knobs, McsfOrder, SCHEDULER_NAMES, SchedulerKind, SimError, Victim};
use proptest::prelude::*;

/// The workload of `rs` (`(I, O, arrival)` and a prefix: 0 the request's own, else the
/// shared prefix of that number) with prompt ids in blocks of `id_block` tokens: requests
/// with one prefix share their leading blocks up to the shorter prompt (vllm-v1's and
/// vllm's prefix caches take them).
fn with_prefixes(rs: &[((u32, u32, f64), u64)], id_block: u32) -> Workload {
    let plain: Vec<(u32, u32, f64)> = rs.iter().map(|r| r.0).collect();
    let ids = rs
        .iter()
        .enumerate()
        .map(|(r, &((i, _, _), prefix))| {
            let owner = if prefix == 0 { 100 + r as u64 } else { prefix };
            (0..u64::from(i.div_ceil(id_block)))
                .map(|k| owner * 1000 + k)
                .collect()
        })
        .collect();
    infersched_test_kit::workload(&plain)
        .with_prefix(PrefixIds {
            block_tokens: id_block,
            ids,
        })
        .expect("prefix ids")
}

fn arb_case() -> impl Strategy<Value = (Workload, Knobs)> {
    // Each request's prompt prefix: 0 its own, else one of three shared ones.
    let request = (
        (1u32..40, 1u32..12, prop_oneof![Just(0.0), 0.0f64..0.3]),
        0u64..4,
    );
    (
        prop::collection::vec(request, 1..12),
        prop::option::of(1u64..64),
        prop::option::of(1u64..3),
        0u64..40,
        prop::option::of(1u64..6),
        1u32..5,
        prop_oneof![Just(0.0), Just(0.01), Just(0.1)],
        any::<bool>(),
        prop_oneof![
            Just(Victim::Newest),
            Just(Victim::Oldest),
            Just(Victim::Shortest),
            Just(Victim::Longest)
        ],
        prop_oneof![
            Just(McsfOrder::Output),
            Just(McsfOrder::Tokens),
            Just(McsfOrder::KvArea)
        ],
        prop::option::of(any::<bool>()),
        prop::option::of(0u64..6),
    )
        .prop_map(
            |(
                rs,
                c,
                p_div,
                m_slack,
                r_max,
                block,
                watermark,
                no_preemption,
                victim,
                mcsf_order,
                reserve_full_isl,
                long_prefill_token_threshold,
            )| {
                let w = with_prefixes(&rs, 2 * block);
                let need = infersched_test_kit::largest_kv_need(&w);
                let b = u64::from(block);
                let m = need.div_ceil(b) * b + m_slack;
                let knobs = Knobs {
                    token_budget: c,
                    prefill_budget: c.zip(p_div).map(|(c, d)| (c / d).max(1)),
                    kv_capacity: Some(m),
                    max_running: r_max,
                    block_size: Some(block),
                    watermark: Some(watermark),
                    no_preemption,
                    victim,
                    max_model_len: None,
                    mcsf_order,
                    reserve_full_isl,
                    long_prefill_token_threshold,
                    // fastgen's sequences per step, 1 to 6 (tied to the threshold's draw:
                    // the strategy tuple is full).
                    max_ragged_sequence_count: long_prefill_token_threshold.map(|t| t + 1),
                    max_waiting_iters: long_prefill_token_threshold,
                    // vllm-v1's and vllm's prefix caching: default (on for vllm-v1, off
                    // for vllm), on or off (tied to the full-sequence check's draw).
                    prefix_caching: reserve_full_isl,
                };
                (w, knobs)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn every_policy_is_valid_and_agrees_with_the_replay((w, knobs) in arb_case()) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        for name in SCHEDULER_NAMES {
            let kind: SchedulerKind = name.parse().unwrap();
            let sim = match kind.simulate(&w, &knobs, &cost) {
                Ok(s) => s,
                // Legitimate: this policy cannot serve some request under these limits
                // (e.g. a prompt larger than C for a policy that does not chunk).
                Err(SimError::Unservable { .. }) => continue,
                // Legitimate too: a victim rule other than vLLM's newest-first can evict
                // the request that was about to finish, over and over (e.g. `longest`
                // with a per-request cap of 1 token per step). The simulator must say so
                // instead of hanging; with the newest as victim the oldest always
                // progresses, so it never happens.
                Err(SimError::Stalled { state, .. })
                    if knobs.victim != Victim::Newest && state.contains("recomputation livelock") =>
                {
                    continue
                }
                Err(e) => return Err(TestCaseError::fail(format!("{name}: {e}"))),
            };
            let limits: Limits = sim.limits;
            // The replay checks every rule, the claimed start/end of every batch (the
            // simulator's clock), and that every request finishes.
            let r = replay(&w, &limits, &cost, &sim.schedule)
                .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            prop_assert_eq!(r.batches.len(), sim.accounts.len());
            for (b, a) in r.batches.iter().zip(&sim.accounts) {
                prop_assert_eq!(b.kv_tokens, a.kv_tokens, "{} batch {}", name, b.index);
                prop_assert_eq!(b.running, a.running, "{} batch {}", name, b.index);
            }
            for (rec, req) in r.requests.iter().zip(w.requests()) {
                prop_assert_eq!(
                    rec.processed_tokens + rec.cached_tokens,
                    req.max_kv_tokens() + rec.recomputed_tokens
                );
            }
            let evictions: u32 = r.requests.iter().map(|x| x.evictions).sum();
            if knobs.no_preemption || matches!(kind, SchedulerKind::Orca | SchedulerKind::OrcaMax | SchedulerKind::Static | SchedulerKind::Mcsf | SchedulerKind::Lightllm | SchedulerKind::FasterTransformer) {
                prop_assert_eq!(evictions, 0, "{} must not preempt", name);
            }
            // The schedule file written reads back to the same schedule, bit for bit
            // (random arrival times included), and the replay accepts it.
            let mut bytes = Vec::new();
            sim.schedule.write_json(&mut bytes).unwrap();
            let back = Schedule::from_json_str(
                std::str::from_utf8(&bytes).unwrap(),
                std::path::Path::new("schedule.json"),
            )
            .unwrap();
            prop_assert_eq!(&back.batches, &sim.schedule.batches);
            replay(&w, &limits, &cost, &back)
                .map_err(|e| TestCaseError::fail(format!("{name} after a round trip: {e}")))?;
            // Identical input, identical schedule.
            let again = kind.simulate(&w, &knobs, &cost).unwrap();
            prop_assert_eq!(&again.schedule, &sim.schedule);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// vllm-v1, vllm (vLLM v0's virtual engines) and sarathi on a pipeline of 2 to 4
    /// stages (semantics.md, "Pipeline parallelism"): the pipelined replay accepts their
    /// schedules with the simulator's clock (and memory account, where there is one), no
    /// request is in two batches while its last token is in flight (for vllm and sarathi,
    /// while any batch of it is), sarathi's batches hold at most R_max / P requests, and
    /// one stage is the plain simulation bit for bit.
    #[test]
    fn pipelined_policies_agree_with_the_pipelined_replay(
        (w, knobs) in arb_case(),
        stages in 2u32..5,
        send_latency_s in prop_oneof![Just(0.0), Just(1e-4)],
        send_s_per_token in prop_oneof![Just(0.0), Just(1e-6)],
    ) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        let pipeline = Pipeline { stages, send_latency_s, send_s_per_token };
        for kind in [SchedulerKind::VllmV1, SchedulerKind::Vllm, SchedulerKind::Sarathi] {
            check_pipelined(kind, &w, &knobs, &cost, &pipeline)?;
        }
        // Other policies are refused on a pipeline, naming it.
        let err = SchedulerKind::Orca.simulate_on(&w, &knobs, &cost, &pipeline).unwrap_err();
        let refused = matches!(err, SimError::NotPipelined { .. });
        prop_assert!(refused, "{}", err);
    }
}

/// `kind` on `pipeline`: the pipelined replay accepts its schedule with the simulator's
/// clock and memory account; the rules for requests in flight and micro-batches hold;
/// one stage is the plain simulation.
fn check_pipelined(
    kind: SchedulerKind,
    w: &Workload,
    knobs: &Knobs,
    cost: &infersched::cost_model::LinearCostModel,
    pipeline: &Pipeline,
) -> Result<(), TestCaseError> {
    // One stage is the plain simulation, bit for bit (its errors too).
    let one = kind.simulate_on(w, knobs, cost, &Pipeline::none());
    let plain = kind.simulate(w, knobs, cost);
    match (&one, &plain) {
        (Ok(a), Ok(b)) => prop_assert_eq!(&a.schedule, &b.schedule),
        (a, b) => prop_assert_eq!(a.as_ref().err(), b.as_ref().err()),
    }
    let sim = match kind.simulate_on(w, knobs, cost, pipeline) {
        Ok(s) => s,
        Err(SimError::Unservable { .. }) => return Ok(()),
        // vLLM v0's virtual engines each keep their own prefix cache: refused, by name.
        Err(SimError::CacheOnVirtualEngines { policy })
            if kind == SchedulerKind::Vllm && knobs.prefix_caching == Some(true) =>
        {
            prop_assert_eq!(policy, "vllm");
            return Ok(());
        }
        // As without a pipeline: a victim rule other than the newest can evict the
        // request about to finish over and over; the simulator says so. On a pipeline
        // sarathi's victims are only requests not in flight (Vidur's
        // `_preempted_requests`), so a request short of a block while the others are in
        // flight restarts itself, and two can do so in turn forever (2 requests, C = 1,
        // M = 45 tokens in blocks of 3, 2 stages), whatever the rule.
        Err(SimError::Stalled { state, .. })
            if (knobs.victim != Victim::Newest || kind == SchedulerKind::Sarathi)
                && state.contains("recomputation livelock") =>
        {
            return Ok(());
        }
        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
    };
    let r = replay_pipelined(w, &sim.limits, cost, pipeline, &sim.schedule)
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    // vllm's virtual engines keep an account each (none for the whole schedule).
    let engines = kind == SchedulerKind::Vllm;
    if !engines {
        prop_assert_eq!(r.batches.len(), sim.accounts.len());
    }
    for (b, a) in r.batches.iter().zip(&sim.accounts) {
        prop_assert_eq!(b.kv_tokens, a.kv_tokens, "batch {}", b.index);
        prop_assert_eq!(b.running, a.running, "batch {}", b.index);
    }
    // Every entry of a request that has a token starts after the batch that generated
    // its last token completed (vllm, sarathi: after any batch that processed it: an
    // engine runs one batch at a time, Vidur's Sarathi holds a request in flight).
    let holds_all = kind != SchedulerKind::VllmV1;
    let cap = sim
        .limits
        .max_running
        .filter(|_| kind == SchedulerKind::Sarathi)
        .map_or(u64::MAX, |r| (r / u64::from(pipeline.stages)).max(1));
    let mut last_end = vec![f64::NEG_INFINITY; w.len()];
    for (entries, rec) in classify_entries(w, &sim.schedule).iter().zip(&r.batches) {
        for e in entries {
            let i = e.request as usize;
            prop_assert!(
                rec.start_s >= last_end[i],
                "batch {} request {}",
                rec.index,
                i
            );
        }
        let processed = |e: &&ClassifiedEntry| e.kind != EntryKind::Evict;
        for e in entries
            .iter()
            .filter(processed)
            .filter(|e| e.generated_token || holds_all)
        {
            last_end[e.request as usize] = rec.end_s;
        }
        prop_assert!(rec.processing_entries() <= cap, "batch {}", rec.index);
    }
    Ok(())
}

/// Two stages overlap batches: a burst of prompts that each fill a batch (compute-bound)
/// is served in about half the time, each stage running half the layers of one batch
/// while the other runs the next; with nothing to overlap (one request decoding) each
/// token takes as long as on one GPU, plus the send between the stages.
#[test]
fn two_stages_overlap_batches_but_not_a_requests_own_tokens() {
    let cost = preset("llama3-70b-tp4-a100").unwrap();
    let knobs = Knobs {
        token_budget: Some(512),
        ..Knobs::default()
    };
    let kind = SchedulerKind::VllmV1;
    let span = |rs: &[(u32, u32, f64)], stages, send_latency_s| {
        let w = infersched_test_kit::workload(rs);
        let p = Pipeline {
            stages,
            send_latency_s,
            send_s_per_token: 0.0,
        };
        let sim = kind.simulate_on(&w, &knobs, &cost, &p).unwrap();
        replay_pipelined(&w, &sim.limits, &cost, &p, &sim.schedule)
            .unwrap()
            .makespan_s()
    };
    let burst: Vec<(u32, u32, f64)> = (0..16).map(|_| (512, 1, 0.0)).collect();
    let (one, two) = (span(&burst, 1, 0.0), span(&burst, 2, 0.0));
    assert!(
        two < 0.55 * one && two > 0.45 * one,
        "one stage {one} s, two {two} s"
    );
    let alone = [(16, 32, 0.0)];
    let (one, two) = (span(&alone, 1, 0.0), span(&alone, 2, 1e-3));
    assert!(
        (two - one - 32.0 * 1e-3).abs() < 1e-9,
        "one stage {one} s, two {two} s"
    );
}

/// Sarathi on a pipeline, as Vidur simulates it, picks victims only among requests not in
/// flight: two requests short of a block while the other is in flight restart themselves
/// in turn forever, which the simulator reports instead of running on
/// (docs/design/schedulers.md, "sarathi").
#[test]
fn sarathi_on_a_pipeline_can_restart_requests_forever_and_says_so() {
    let cost = preset("llama3-70b-tp4-a100").unwrap();
    let w = infersched_test_kit::workload(&[(13, 5, 0.0), (28, 7, 0.0)]);
    let knobs = Knobs {
        token_budget: Some(1),
        kv_capacity: Some(45),
        block_size: Some(3),
        watermark: Some(0.0),
        ..Knobs::default()
    };
    let pipeline = Pipeline {
        stages: 2,
        send_latency_s: 0.0,
        send_s_per_token: 0.0,
    };
    // One stage serves them.
    assert!(SchedulerKind::Sarathi.simulate(&w, &knobs, &cost).is_ok());
    match SchedulerKind::Sarathi.simulate_on(&w, &knobs, &cost, &pipeline) {
        Err(SimError::Stalled { state, .. }) => {
            assert!(state.contains("recomputation livelock"), "{state}")
        }
        other => panic!(
            "expected a livelock, got {:?}",
            other.map(|s| s.schedule.batches.len())
        ),
    }
}
