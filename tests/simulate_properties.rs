//! Property tests: every heuristic policy, on random workloads and limits, produces a
//! schedule the independent replay accepts, with the replay's clock (checked through the
//! schedule's claimed batch times) and memory account equal to the simulator's own.

use infersched::core::{Limits, Schedule, Workload, replay};
use infersched::cost_model::preset;
use infersched::schedulers::{Knobs, McsfOrder, SCHEDULER_NAMES, SchedulerKind, SimError, Victim};
use proptest::prelude::*;

fn arb_case() -> impl Strategy<Value = (Workload, Knobs)> {
    let request = (1u32..40, 1u32..12, prop_oneof![Just(0.0), 0.0f64..0.3]);
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
                let w = infersched_test_kit::workload(&rs);
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
                    // vllm-v1's prefix caching: default (on), on or off (tied to the
                    // full-sequence check's draw).
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
