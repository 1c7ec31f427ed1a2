//! The heuristic portfolio: the best schedule the heuristics reach in the policy class
//! (the MILP's warm start and first upper bound).

use crate::store::Incumbent;
use crate::{Objective, PolicyConstraints, dominance};
use infersched_core::{Limits, Replay, Schedule, Workload, replay};
use infersched_cost_model::LinearCostModel;
use infersched_schedulers::{Knobs, McsfOrder, SchedulerKind};
use std::time::Instant;

/// The best heuristic schedule in the class, with its replay. Past `deadline` no further
/// variant is tried once one schedule is in hand (each simulates the whole workload, and
/// there are dozens: on 20,000 requests they took a minute).
pub(crate) fn best_heuristic(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    from: &[SchedulerKind],
    deadline: Instant,
) -> Option<Incumbent> {
    // The solver's model has no prefix cache: its schedules take nothing from one.
    let knobs = Knobs {
        watermark: Some(0.0),
        prefix_caching: Some(false),
        ..Knobs::matching(limits)
    };
    // A portfolio: each heuristic with and without preemption, and with its running set
    // capped below R_max (a schedule under a tighter cap is valid under the real one, and
    // limiting concurrency is often what avoids costly evictions).
    let n = w.len() as u64;
    let r_cap = limits.max_running.unwrap_or(n).min(n).max(1);
    let caps: Vec<u64> = if r_cap <= 32 {
        (1..=r_cap).collect()
    } else {
        let mut v: Vec<u64> = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
            .into_iter()
            .filter(|&c| c < r_cap)
            .collect();
        v.push(r_cap);
        v
    };
    // (name, schedule, replay, objective, the candidate's place in the portfolio).
    let mut best: Option<(String, Schedule, Replay, f64, usize)> = None;
    let kinds: &[SchedulerKind] = if from.is_empty() {
        &[
            SchedulerKind::Sarathi,
            SchedulerKind::VllmV1,
            SchedulerKind::Vllm,
            SchedulerKind::Orca,
            SchedulerKind::Mcsf,
        ]
    } else {
        from
    };
    let candidates = candidates(kinds, &caps);
    // Tried uncapped first, then by cap from the largest (the order that reaches good
    // schedules soonest where the deadline cuts the portfolio short); ties go to the
    // earlier place, so the result does not depend on this order when all are tried.
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(candidates[i].2));
    for place in order {
        let (kind, (no_preemption, mcsf_order, reserve_full_isl), cap) = candidates[place];
        if best.is_some() && Instant::now() >= deadline {
            break;
        }
        let k = Knobs {
            no_preemption,
            mcsf_order,
            reserve_full_isl: Some(reserve_full_isl),
            max_running: Some(cap),
            ..knobs
        };
        let Ok(mut sim) = kind.simulate(w, &k, cost) else {
            continue;
        };
        if class.no_chunk && dominance::chunking_never_helps(w, limits, class) {
            // The model has no chunk arcs here; the merged schedule is never worse.
            sim.schedule = dominance::merge_prefill_chunks(w, &sim.schedule);
        }
        // Replay under the problem's limits (the heuristic's are the same or tighter).
        let Ok(r) = replay(w, limits, cost, &sim.schedule) else {
            continue;
        };
        if !class.admits(w, limits, &sim.schedule) {
            continue;
        }
        let v = objective.of_replay(&r);
        if best
            .as_ref()
            .is_none_or(|b| v < b.3 || (v == b.3 && place < b.4))
        {
            let name = variant_name(
                kind,
                no_preemption,
                reserve_full_isl,
                mcsf_order,
                cap,
                r_cap,
            );
            best = Some((name, sim.schedule, r, v, place));
        }
    }
    best.map(|(name, schedule, replay, _, _)| Incumbent {
        name,
        schedule,
        replay,
    })
}

/// A candidate of the portfolio: the heuristic, its variant (no preemption, MC-SF order,
/// vLLM V1's whole-prompt check) and its running-set cap.
type Candidate = (SchedulerKind, (bool, McsfOrder, bool), u64);

/// Every candidate in the portfolio's order: heuristic, variant (no preemption, MC-SF
/// order, vLLM V1's whole-prompt check; MC-SF never preempts, so its variants are its
/// admission orders instead; vllm-v1 also runs without the whole-prompt check, which only
/// matters with preemption), cap.
fn candidates(kinds: &[SchedulerKind], caps: &[u64]) -> Vec<Candidate> {
    kinds
        .iter()
        .flat_map(|&kind| {
            let variants: Vec<(bool, McsfOrder, bool)> = match kind {
                SchedulerKind::Mcsf => McsfOrder::ALL.iter().map(|&o| (false, o, true)).collect(),
                SchedulerKind::VllmV1 => vec![
                    (false, McsfOrder::Output, true),
                    (false, McsfOrder::Output, false),
                    (true, McsfOrder::Output, true),
                ],
                _ => vec![
                    (false, McsfOrder::Output, true),
                    (true, McsfOrder::Output, true),
                ],
            };
            variants
                .into_iter()
                .flat_map(move |v| caps.iter().map(move |&c| (kind, v, c)))
        })
        .collect()
}

/// A candidate's name, e.g. `mcsf+order=tokens+max-running=24` (no cap named where it is
/// the problem's own, `r_cap`).
fn variant_name(
    kind: SchedulerKind,
    no_preemption: bool,
    reserve_full_isl: bool,
    mcsf_order: McsfOrder,
    cap: u64,
    r_cap: u64,
) -> String {
    format!(
        "{}{}{}{}{}",
        kind.name(),
        if no_preemption { "+no-preemption" } else { "" },
        if reserve_full_isl {
            ""
        } else {
            "+no-reserve-full-isl"
        },
        if kind == SchedulerKind::Mcsf {
            format!("+order={}", mcsf_order.name())
        } else {
            String::new()
        },
        if cap < r_cap {
            format!("+max-running={cap}")
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;
    use std::time::Duration;

    #[test]
    fn past_its_deadline_the_portfolio_keeps_its_first_schedule_uncapped() {
        // Twelve requests under M: given all the time, the portfolio picks some capped or
        // preemption-free variant; with its deadline passed it tries only its first
        // candidate, uncapped Sarathi, and returns that schedule (never none).
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let w = Workload::new(
            (0..12)
                .map(|i| Request {
                    input_tokens: 100 + 40 * i,
                    output_tokens: 5 + 3 * i,
                    arrival_s: 0.0,
                })
                .collect(),
        )
        .unwrap();
        let limits = Limits {
            kv_capacity: Some(1600),
            token_budget: Some(512),
            ..Limits::unlimited()
        };
        let class = PolicyConstraints::default();
        let far = Instant::now() + Duration::from_secs(3600);
        let all =
            best_heuristic(&w, &limits, &cost, Objective::MeanLatency, &class, &[], far).unwrap();
        let past = Instant::now();
        let first = best_heuristic(
            &w,
            &limits,
            &cost,
            Objective::MeanLatency,
            &class,
            &[],
            past,
        )
        .unwrap();
        assert_eq!(first.name, "sarathi");
        assert!(
            all.objective_value(Objective::MeanLatency)
                <= first.objective_value(Objective::MeanLatency)
        );
        assert_ne!(all.name, "sarathi", "the whole portfolio finds better here");
    }
}
