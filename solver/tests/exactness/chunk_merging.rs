//! The solver leaves chunked-prefill arcs out of the model when no token or prefill budget
//! binds (solver::dominance). Two independent checks of that claim:
//! - merging the chunks of real chunked schedules (Sarathi and vLLM-V1 under a budget,
//!   with evictions; offline, as the claim needs) gives a schedule the replay accepts without the budget,
//!   in the no-chunk class, with no request finishing or starting later;
//! - on tiny instances the exhaustive search's optimum with chunking allowed equals its
//!   optimum with chunking forbidden, for makespan and mean latency.

use infersched_core::{Limits, Summary, Workload, replay};
use infersched_cost_model::preset;
use infersched_schedulers::{Knobs, SchedulerKind};
use infersched_solver::PolicyConstraints;
use infersched_solver::dominance::{chunking_never_helps, merge_prefill_chunks};
use infersched_test_kit::exhaustive::{Class, Objective, optimum};
use proptest::prelude::*;

fn arb_chunked_case() -> impl Strategy<Value = (Workload, Knobs, bool)> {
    let request = (1u32..40, 1u32..10, Just(0.0));
    (
        prop::collection::vec(request, 1..10),
        2u64..24,
        0u64..30,
        prop::option::of(1u64..5),
        1u32..4,
        any::<bool>(),
    )
        .prop_map(|(rs, c, m_slack, r_max, block, v1)| {
            let w = infersched_test_kit::workload(&rs);
            let need = infersched_test_kit::largest_kv_need(&w);
            let b = u64::from(block);
            let knobs = Knobs {
                token_budget: Some(c),
                kv_capacity: Some(need.div_ceil(b) * b + m_slack),
                max_running: r_max,
                block_size: Some(block),
                watermark: Some(0.0),
                // The claim is about the solver's model, which has no prefix cache.
                prefix_caching: Some(false),
                ..Knobs::default()
            };
            (w, knobs, v1)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn merged_chunked_schedules_are_valid_unchunked_and_never_later(
        (w, knobs, v1) in arb_chunked_case()
    ) {
        let cost = preset("llama2-7b-a100").unwrap();
        let kind = if v1 { SchedulerKind::VllmV1 } else { SchedulerKind::Sarathi };
        let Ok(sim) = kind.simulate(&w, &knobs, &cost) else {
            return Ok(());
        };
        // The same limits without the token budget: the setting of the claim.
        let limits = Limits {
            token_budget: None,
            prefill_budget: None,
            ..sim.limits
        };
        prop_assert!(chunking_never_helps(&w, &limits, &PolicyConstraints::default()));
        let before = replay(&w, &limits, &cost, &sim.schedule).unwrap();
        let merged = merge_prefill_chunks(&w, &sim.schedule);
        let after = replay(&w, &limits, &cost, &merged)
            .map_err(|e| TestCaseError::fail(format!("merged schedule rejected: {e}")))?;
        let no_chunk = PolicyConstraints { no_chunk: true, ..Default::default() };
        prop_assert!(no_chunk.admits(&w, &limits, &merged));
        prop_assert!(merged.batches.len() <= sim.schedule.batches.len());
        let evictions = |r: &infersched_core::Replay| r.requests.iter().map(|q| q.evictions).sum::<u32>();
        prop_assert!(evictions(&after) <= evictions(&before));
        for (a, b) in after.requests.iter().zip(&before.requests) {
            prop_assert!(a.completion_s <= b.completion_s + 1e-12);
            prop_assert!(a.first_token_s <= b.first_token_s + 1e-12);
        }
        let (sa, sb) = (Summary::from_replay(&after), Summary::from_replay(&before));
        prop_assert!(sa.makespan_s <= sb.makespan_s + 1e-12);
    }
}

fn tiny(seed: u64) -> (Workload, Limits) {
    // Deterministic small instances: 2-3 requests, I <= 4, O <= 3, M from tight to loose.
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let n = 2 + next(2) as usize;
    let reqs: Vec<(u32, u32, f64)> = (0..n)
        .map(|_| (1 + next(4) as u32, 1 + next(3) as u32, 0.0))
        .collect();
    let w = infersched_test_kit::workload(&reqs);
    let need = infersched_test_kit::largest_kv_need(&w);
    let limits = Limits {
        kv_capacity: Some(need + next(3)),
        max_running: if next(3) == 0 { Some(2) } else { None },
        ..Limits::unlimited()
    };
    (w, limits)
}

#[test]
fn without_budgets_forbidding_chunks_does_not_change_the_exhaustive_optimum() {
    let cost = preset("llama2-7b-a100").unwrap();
    let mut compared = 0;
    for seed in 0..40 {
        let (w, limits) = tiny(seed);
        for objective in [Objective::Makespan, Objective::MeanLatency] {
            let free = optimum(&w, &limits, &cost, objective, Class::default(), 400_000);
            let unchunked = optimum(
                &w,
                &limits,
                &cost,
                objective,
                Class {
                    no_chunk: true,
                    ..Class::default()
                },
                400_000,
            );
            if let (Some((a, _)), Some((b, _))) = (free, unchunked) {
                assert!(
                    (a - b).abs() <= 1e-12 * a.max(1.0),
                    "seed {seed} {objective:?}: chunking allowed {a}, forbidden {b}"
                );
                compared += 1;
            }
        }
    }
    assert!(
        compared >= 40,
        "only {compared} instances were small enough"
    );
}
