//! The exhaustive optimum of tiny instances, checked by the replay, bounds every
//! heuristic from below; hand-checkable cases pin the search itself.

use infersched_core::{Limits, Summary, Workload, replay};
use infersched_cost_model::preset;
use infersched_schedulers::{Knobs, SCHEDULER_NAMES, SchedulerKind, SimError};
use infersched_test_kit::exhaustive::{Class, Objective, optimum};
use proptest::prelude::*;

fn workload(reqs: &[(u32, u32)]) -> Workload {
    let offline: Vec<(u32, u32, f64)> = reqs.iter().map(|&(i, o)| (i, o, 0.0)).collect();
    infersched_test_kit::workload(&offline)
}

#[test]
fn single_request_optimum_is_prefill_then_decodes() {
    // One request alone: the cheapest schedule is its whole prompt in one batch (fewer
    // batches, each paying the fixed cost), then one decode per remaining token.
    let cost = preset("llama2-7b-a100").unwrap();
    let w = workload(&[(3, 3)]);
    let (best, s) = optimum(
        &w,
        &Limits::unlimited(),
        &cost,
        Objective::Makespan,
        Class::default(),
        100_000,
    )
    .unwrap();
    let batches: Vec<String> = s.batches.iter().map(ToString::to_string).collect();
    assert_eq!(batches, ["0:3", "0:1", "0:1"]);
    let r = replay(&w, &Limits::unlimited(), &cost, &s).unwrap();
    assert!((r.makespan_s() - best).abs() < 1e-12);
}

fn arb_tiny() -> impl Strategy<Value = (Workload, Limits)> {
    (
        prop::collection::vec((1u32..4, 1u32..4), 2..4),
        prop::option::of(2u64..8),
        0u64..3,
    )
        .prop_map(|(rs, c, slack)| {
            let w = workload(&rs);
            let need = infersched_test_kit::largest_kv_need(&w);
            let limits = Limits {
                token_budget: c,
                kv_capacity: Some(need + slack),
                ..Limits::unlimited()
            };
            (w, limits)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn no_heuristic_beats_the_exhaustive_optimum((w, limits) in arb_tiny()) {
        let cost = preset("llama2-7b-a100").unwrap();
        for objective in [Objective::Makespan, Objective::MeanLatency, Objective::MeanTtft] {
            let Some((best, s)) = optimum(&w, &limits, &cost, objective, Class::default(), 200_000) else {
                continue;
            };
            // The search's schedule is valid and its value is the replay's.
            let r = replay(&w, &limits, &cost, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let summary = Summary::from_replay(&r);
            let replayed = match objective {
                Objective::Makespan => summary.makespan_s,
                Objective::MeanLatency => summary.mean_e2e_s,
                Objective::MeanTtft => summary.mean_ttft_s,
            };
            prop_assert!((replayed - best).abs() <= 1e-12 * best.max(1.0), "{replayed} vs {best}");
            let knobs = Knobs::matching(&limits);
            for name in SCHEDULER_NAMES {
                let kind: SchedulerKind = name.parse().unwrap();
                let sim = match kind.simulate(&w, &knobs, &cost) {
                    Ok(s) => s,
                    Err(SimError::Unservable { .. }) => continue,
                    Err(e) => return Err(TestCaseError::fail(format!("{name}: {e}"))),
                };
                let h = Summary::from_replay(&replay(&w, &sim.limits, &cost, &sim.schedule).unwrap());
                let value = match objective {
                    Objective::Makespan => h.makespan_s,
                    Objective::MeanLatency => h.mean_e2e_s,
                    Objective::MeanTtft => h.mean_ttft_s,
                };
                prop_assert!(value >= best * (1.0 - 1e-12), "{name} {objective:?}: {value} < optimum {best}");
            }
        }
    }
}
