//! Independent groups: a workload whose requests come in bursts is solved one burst at a
//! time.
//!
//! **The bound.** Take any schedule of the whole workload and drop every entry of the
//! requests outside a subset `S`: batches get shorter (no cost coefficient is negative) or
//! vanish, and with start times `max(previous end, latest arrival)` no batch starts later,
//! so no request of `S` completes (or gets its first token) later, and memory, budgets and
//! every policy constraint still hold. So the restriction is a schedule of `S` alone, and
//! for any partition of the requests into groups, the sum over groups of each group's
//! least total latency (or TTFT) is at most the whole workload's: the mean of the groups'
//! lower bounds, weighted by their sizes, is a lower bound. The partition is free; it is
//! strong where the groups do not compete for the machine, so the groups are cut where the
//! best schedule found so far (the portfolio's, improved by the list search) has completed
//! every earlier request before the next arrives; for mean TTFT also where Sarathi's
//! schedule has ([`bursts_served_in_turn`]: the best TTFT schedules finish every request
//! at the end), whichever split has more groups.
//!
//! **The schedule.** Each group is solved on its own (its own heuristics, priority-list
//! search, phase relaxation or exact model) and the groups' schedules are concatenated in
//! arrival order. The replay judges the concatenation; the whole workload's best
//! schedule so far is kept where it is better.
//!
//! Sum objectives only (mean latency, mean TTFT): for makespan the single-machine release
//! bound already sees the bursts, and one group's makespan says nothing of another's.

use crate::bounds::{self, BoundArgument, CombinatorialBound};
use crate::report::Answer;
use crate::store::Incumbent;
use crate::{
    BoundMethod, Objective, SolveError, SolveMethod, SolveOptions, SolveReport, SolveStatus,
    WarmStart,
};
use infersched_core::{Batch, Entry, Limits, Replay, Request, Schedule, Workload, replay};
use infersched_cost_model::LinearCostModel;
use std::time::Instant;

/// The requests of each group (ids in `w`, ascending), groups in arrival order: a new group
/// starts at a request (in arrival order) that arrives no earlier than every earlier
/// request's completion in `served`.
pub fn independent_groups(w: &Workload, served: &Replay) -> Vec<Vec<u32>> {
    let mut groups: Vec<Vec<u32>> = Vec::new();
    let mut done_by = f64::NEG_INFINITY;
    for i in w.fcfs_order() {
        let r = &served.requests[i as usize];
        match groups.last_mut() {
            Some(group) if r.arrival_s < done_by => group.push(i),
            _ => groups.push(vec![i]),
        }
        done_by = done_by.max(r.completion_s);
    }
    for group in &mut groups {
        group.sort_unstable();
    }
    groups
}

/// The groups of [`independent_groups`] under a schedule that serves each burst in turn
/// (Sarathi's, as configured by `limits`), for mean TTFT, whose best schedules (first
/// tokens first) finish every request at the end; None where it does not simulate or
/// replay. Any partition gives a valid bound; this one is where the groups do not compete.
pub fn bursts_served_in_turn(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
) -> Option<Vec<Vec<u32>>> {
    let knobs = infersched_schedulers::Knobs::matching(limits);
    let sim = infersched_schedulers::SchedulerKind::Sarathi
        .simulate(w, &knobs, cost)
        .ok()?;
    let served = replay(w, limits, cost, &sim.schedule).ok()?;
    Some(independent_groups(w, &served))
}

/// One group's solve.
struct GroupResult {
    requests: Vec<u32>,
    report: SolveReport,
}

/// Solves each of `groups` (at least two) on its own within `time_s` seconds and combines
/// them (module docs). `whole` is the whole workload's best schedule so far and `bound`
/// its combinatorial bound; the report keeps whichever of each is better. `None` when a
/// group's solve fails (the caller goes on with the whole workload).
#[allow(clippy::too_many_arguments)]
pub(crate) fn solve_by_groups(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    groups: &[Vec<u32>],
    whole: &Incumbent,
    bound: CombinatorialBound,
    time_s: f64,
    started: Instant,
) -> Result<Option<SolveReport>, SolveError> {
    debug_assert!(groups.len() >= 2 && objective != Objective::Makespan);
    let Some(solved) = solve_each(w, limits, cost, objective, options, groups, time_s)? else {
        return Ok(None);
    };
    let group_bound: f64 = solved
        .iter()
        .map(|g| g.report.best_bound * g.requests.len() as f64)
        .sum::<f64>()
        / w.len() as f64;
    let concatenated = concatenate(&solved);
    let joined = replay(w, limits, cost, &concatenated)
        .ok()
        .filter(|_| options.constraints.admits(w, limits, &concatenated))
        .map(|r| objective.of_replay(&r));
    let whole_value = whole.objective_value(objective);
    let (schedule, replayed, warm_start) = match joined {
        Some(v) if v < whole_value => (
            concatenated,
            v,
            WarmStart {
                heuristic: joined_name(&solved),
                objective: v,
            },
        ),
        _ => (
            whole.schedule.clone(),
            whole_value,
            WarmStart {
                heuristic: whole.name.clone(),
                objective: whole_value,
            },
        ),
    };
    let (value, bound_method) = if group_bound > bound.value_s {
        (
            group_bound,
            BoundMethod::Combinatorial(BoundArgument::IndependentGroups),
        )
    } else {
        (bound.value_s, BoundMethod::Combinatorial(bound.argument))
    };
    let best_bound = value.min(replayed).max(0.0);
    let proven = solved
        .iter()
        .all(|g| g.report.status == SolveStatus::Optimal)
        && replayed <= best_bound * (1.0 + 1e-9);
    let note = note(&solved, warm_start.heuristic == whole.name);
    let status = if proven {
        SolveStatus::Optimal
    } else {
        SolveStatus::NotProven
    };
    Ok(Some(SolveReport {
        note: Some(note),
        build_s: started.elapsed().as_secs_f64(),
        solve_s: solved.iter().map(|g| g.report.solve_s).sum(),
        warm_start: Some(warm_start),
        ..SolveReport::from_answer(Answer {
            status,
            method: SolveMethod::IndependentGroups,
            objective,
            constraints: options.constraints,
            schedule,
            replayed,
            bound: value,
            bound_method,
        })
    }))
}

/// Each group solved on its own, in `groups`' order; None when one fails.
///
/// Time goes to the groups in turn, each its share of what is left by its size. Groups
/// beyond the phase relaxation's reach need only the heuristics and the searches, so they
/// go first (what they leave goes to the others). Not by the square of the size (the
/// relaxation's model grows so): on README family (b) n = 32, the 20-request burst's
/// relaxation ends its root cuts within its share either way and barely moves after, while
/// the 12-request burst's bound keeps rising with time (bound 807.2 -> 807.6 ms).
fn solve_each(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    groups: &[Vec<u32>],
    time_s: f64,
) -> Result<Option<Vec<GroupResult>>, SolveError> {
    let begun = Instant::now();
    let reqs = w.requests();
    let relaxed = |g: &[u32]| {
        objective == Objective::MeanLatency
            && options.phase_relaxation
            && g.len() <= bounds::PHASE_RELAXATION_MAX_REQUESTS
    };
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&k| relaxed(&groups[k]));
    let weights: Vec<f64> = order.iter().map(|&k| groups[k].len() as f64).collect();
    let mut solved: Vec<Option<GroupResult>> = (0..groups.len()).map(|_| None).collect();
    for (turn, &k) in order.iter().enumerate() {
        let requests = groups[k].clone();
        let left = (time_s - begun.elapsed().as_secs_f64()).max(0.0);
        let share = weights[turn] / weights[turn..].iter().sum::<f64>();
        let sub = Workload::new(
            requests
                .iter()
                .map(|&i| reqs[i as usize])
                .collect::<Vec<Request>>(),
        )
        .map_err(|e| SolveError::Internal(format!("a group of requests: {e}")))?;
        let sub_options = SolveOptions {
            time_limit_s: left * share,
            observer: None,
            independent_groups: false,
            // The whole workload's schedules do not fit a group's requests.
            seeds: Vec::new(),
            ..options.clone()
        };
        match crate::solve(&sub, limits, cost, objective, &sub_options) {
            Ok(report) => solved[k] = Some(GroupResult { requests, report }),
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(solved.into_iter().flatten().collect()))
}

/// The groups' schedules one after another, in arrival order, with the ids of the whole
/// workload.
fn concatenate(solved: &[GroupResult]) -> Schedule {
    let batches: Vec<Batch> = solved
        .iter()
        .flat_map(|g| {
            g.report.schedule.batches.iter().map(|b| {
                Batch::new(
                    b.entries
                        .iter()
                        .map(|e| Entry {
                            request: g.requests[e.request as usize],
                            ..*e
                        })
                        .collect(),
                )
            })
        })
        .collect();
    Schedule::new(batches)
}

/// The name of the concatenated schedule: each group's source (listed where there are
/// few), or the count of each method.
fn joined_name(solved: &[GroupResult]) -> String {
    if solved.len() <= MAX_LISTED_GROUPS {
        let names: Vec<String> = solved
            .iter()
            .map(|g| {
                g.report
                    .warm_start
                    .as_ref()
                    .map_or(g.report.method.name().to_string(), |s| {
                        format!("{} ({})", s.heuristic, g.report.method.name())
                    })
            })
            .collect();
        format!("independent-groups[{}]", names.join("; "))
    } else {
        let methods: Vec<String> = solved
            .iter()
            .map(|g| g.report.method.name().to_string())
            .collect();
        format!(
            "independent-groups[{} groups; their schedules by method: {}]",
            solved.len(),
            counted(&methods)
        )
    }
}

/// The report's note: the groups' sizes and bounds (listed where there are few), and
/// whether the whole workload's schedule beat their concatenation.
fn note(solved: &[GroupResult], whole_kept: bool) -> String {
    let group_bounds: Vec<String> = solved
        .iter()
        .map(|g| g.report.bound_method.name().to_string())
        .collect();
    let (sizes, group_bounds) = if solved.len() <= MAX_LISTED_GROUPS {
        let sizes: Vec<String> = solved
            .iter()
            .map(|g| g.requests.len().to_string())
            .collect();
        (sizes.join(", "), group_bounds.join(", "))
    } else {
        let mut largest: Vec<usize> = solved.iter().map(|g| g.requests.len()).collect();
        largest.sort_unstable_by(|a, b| b.cmp(a));
        let smallest = largest.last().copied().unwrap_or(0);
        let top: Vec<String> = largest.iter().take(5).map(usize::to_string).collect();
        (
            format!(
                "{smallest} to {} (the five largest: {})",
                largest[0],
                top.join(", ")
            ),
            counted(&group_bounds),
        )
    };
    format!(
        "the workload splits into {} independent groups of {} requests (a schedule found \
         completes each group before the next one arrives); each group is solved on \
         its own (bounds: {}), the bound is their size-weighted mean and the schedule their \
         concatenation{}",
        solved.len(),
        sizes,
        group_bounds,
        if whole_kept {
            ", which the whole workload's best schedule found beats"
        } else {
            ""
        }
    )
}

/// The most groups whose sizes, bounds and schedules the report lists one by one; beyond
/// it, it gives their range and counts (a trace of thousands of requests has hundreds of
/// groups).
const MAX_LISTED_GROUPS: usize = 12;

/// `items` counted, in the order each first appears: `"a x 3, b x 1"`.
fn counted(items: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for item in items {
        match counts.iter_mut().find(|(name, _)| *name == item) {
            Some((_, n)) => *n += 1,
            None => counts.push((item, 1)),
        }
    }
    counts
        .iter()
        .map(|(name, n)| format!("{name} x {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_schedulers::{Knobs, SchedulerKind};

    fn served(reqs: &[(u32, u32, f64)]) -> (Workload, Replay) {
        let w = infersched_test_kit::workload(reqs);
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let limits = Limits::unlimited();
        let sim = SchedulerKind::Sarathi
            .simulate(&w, &Knobs::matching(&limits), &cost)
            .unwrap();
        let r = replay(&w, &limits, &cost, &sim.schedule).unwrap();
        (w, r)
    }

    #[test]
    fn bursts_for_mean_ttft_follow_a_schedule_that_serves_them_in_turn() {
        // Two bursts 5 s apart: first tokens first gives every first token before it
        // finishes anyone, so its completions show one group; Sarathi serves each burst
        // in turn, so the split for mean TTFT has two.
        let reqs = [
            (374, 14, 0.0),
            (34, 12, 0.01),
            (137, 9, 5.0),
            (1145, 7, 5.01),
        ];
        let w = infersched_test_kit::workload(&reqs);
        let limits = Limits {
            token_budget: Some(512),
            ..Limits::unlimited()
        };
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let first_tokens = crate::first_tokens::first_tokens_first(
            &w,
            &limits,
            &cost,
            &crate::PolicyConstraints::default(),
        )
        .unwrap();
        let served = replay(&w, &limits, &cost, &first_tokens).unwrap();
        assert_eq!(independent_groups(&w, &served).len(), 1);
        assert_eq!(
            bursts_served_in_turn(&w, &limits, &cost),
            Some(vec![vec![0, 1], vec![2, 3]])
        );
    }

    #[test]
    fn many_groups_are_counted_not_listed() {
        let items: Vec<String> = ["exact", "machine-srpt", "exact", "pairwise", "exact"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(counted(&items), "exact x 3, machine-srpt x 1, pairwise x 1");
        assert_eq!(counted(&[]), "");
    }

    #[test]
    fn groups_start_where_every_earlier_request_is_done() {
        // Ids out of arrival order: the groups list ids ascending, in arrival order.
        let (w, r) = served(&[(64, 4, 10.0), (32, 8, 0.0), (16, 2, 0.001), (8, 3, 10.002)]);
        assert_eq!(independent_groups(&w, &r), vec![vec![1, 2], vec![0, 3]]);
        // A request arriving while an earlier one still runs joins its group.
        let (w, r) = served(&[(512, 64, 0.0), (8, 2, 0.01), (8, 2, 30.0)]);
        assert!(r.requests[0].completion_s > 0.01);
        assert_eq!(independent_groups(&w, &r), vec![vec![0, 1], vec![2]]);
        // An arrival exactly at the last completion starts a group (the machine is free).
        let (w, r) = served(&[(8, 2, 0.0)]);
        let done = r.requests[0].completion_s;
        let (w2, r2) = served(&[(8, 2, 0.0), (8, 2, done)]);
        assert_eq!(independent_groups(&w, &r), vec![vec![0]]);
        assert_eq!(independent_groups(&w2, &r2), vec![vec![0], vec![1]]);
    }
}
