//! FCFS admission from any schedule (milp.md, "FCFS admission"): the class `--fcfs` asks
//! only that requests are *first* processed in arrival order (none starts before an earlier
//! one has); what they do after that is free. So the best schedule found without the rule
//! becomes one with it by admitting, in the batch where a request is first processed, every
//! earlier-arriving request not yet started, with one prompt token each
//! ([`admit_in_arrival_order`]).
//!
//! Such a token is taken from the request's own first chunk later on (its prompt is
//! processed once, as before), so it holds one token of KV, one block, until then; where M
//! or R_max does not allow that and evictions are allowed, it is evicted in the next batch
//! instead and its prompt is processed whole later, as before ([`Admitted::Evicted`]). The
//! token goes into the batch that needs it, or the latest earlier batch with room for it in
//! C and P that starts after its arrival. The replay judges the result, and the caller
//! keeps it only where it is valid, in the class and better.
//!
//! Where it pays: on 300 Splitwise requests (mean TTFT, C = 4096, M = 10,000) the best
//! schedule in the FCFS class was the heuristics' 15.9 s, twice the 7.5 s found without the
//! rule, because the list search in the FCFS class only serves in arrival order.

use crate::report::certified_gap;
use crate::{Objective, PolicyConstraints, SolveError, SolveOptions, SolveReport, SolveStatus};
use infersched_core::{Action, Entry, Limits, Replay, Schedule, Workload, replay};
use infersched_cost_model::LinearCostModel;
use std::time::Instant;

/// The share of the time limit the solve in the FCFS class itself takes first; the solve
/// without the rule gets what it leaves.
const IN_CLASS_SHARE: f64 = 0.5;

/// A solve in a class with FCFS admission: the class's own solve (`solve_in_class`, half the
/// time, first, so an interrupt meanwhile still has its schedules), then the same class
/// without the rule for the rest of the time, whose schedule is brought into the class by
/// [`admit_in_arrival_order`] and kept where it is better, and whose bound holds for the
/// class too (the class is a subset), so the higher bound is kept.
pub(crate) fn solve_with_admission_repair(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    solve_in_class: impl Fn(&SolveOptions) -> Result<SolveReport, SolveError>,
) -> Result<SolveReport, SolveError> {
    let started = Instant::now();
    let class = options.constraints;
    let mut report = solve_in_class(&SolveOptions {
        time_limit_s: options.time_limit_s * IN_CLASS_SHARE,
        ..options.clone()
    })?;
    if report.status == SolveStatus::Optimal {
        return Ok(report);
    }
    let left = options.time_limit_s - started.elapsed().as_secs_f64();
    let free = PolicyConstraints {
        fcfs: false,
        ..class
    };
    // Where the solve without the rule fails (it should not where this one did not), the
    // class's own answer stands.
    let Ok(without) = solve_in_class(&SolveOptions {
        time_limit_s: left.max(0.0),
        constraints: free,
        observer: None,
        ..options.clone()
    }) else {
        return Ok(report);
    };
    let Ok(replayed) = replay(w, limits, cost, &without.schedule) else {
        return Ok(report);
    };
    let mut kinds = vec![Admitted::Kept];
    if !class.no_evict && !class.reserve {
        kinds.push(Admitted::Evicted);
    }
    let repaired = kinds
        .into_iter()
        .filter_map(|kind| {
            let schedule = admit_in_arrival_order(w, limits, &without.schedule, &replayed, kind)
                .unwrap_or_else(|| without.schedule.clone());
            let r = replay(w, limits, cost, &schedule).ok()?;
            class
                .admits(w, limits, &schedule)
                .then(|| (objective.of_replay(&r), schedule))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let own_note = report.note.take();
    let mut notes: Vec<String> = Vec::new();
    if without.best_bound > report.best_bound {
        report.best_bound = without.best_bound;
        report.bound_method = without.bound_method;
        notes.push(format!(
            "the bound ({}) is the class's without FCFS admission, which holds for it too",
            without.bound_method.name()
        ));
    }
    if let Some((value, schedule)) = repaired
        && value < report.replayed_objective
    {
        notes.push(format!(
            "the schedule is the best found without FCFS admission ({}: {:.6} ms), each request processed before an earlier arrival bringing that one in with a one-token chunk (FCFS admission repair)",
            without.method.name(),
            without.replayed_objective * 1e3
        ));
        if let Some(observer) = &options.observer {
            observer.0.incumbent("FCFS admission repair", &schedule);
        }
        report.replayed_objective = value;
        report.schedule = schedule;
        report.method = without.method;
        notes.reverse();
    }
    if !notes.is_empty()
        && let Some(own) = own_note
    {
        notes.push(format!("the solve in the FCFS class itself: {own}"));
    } else if let Some(own) = own_note {
        notes.push(own);
    }
    report.certified_gap = certified_gap(report.replayed_objective, report.best_bound);
    report.note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(report)
}

/// What becomes of a late request's admission token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// It keeps the token's KV; its first chunk later has one token less.
    Kept,
    /// It is evicted in the next batch; its prompt runs whole later.
    Evicted,
}

/// `schedule` (replayed as `replayed`) with every request first processed in arrival order:
/// each request processed before an earlier arrival that has not started yet brings that
/// one in with a one-token chunk in the same batch or an earlier one (module
/// documentation). None when nothing needs to change, or where a token finds no batch.
pub(crate) fn admit_in_arrival_order(
    w: &Workload,
    limits: &Limits,
    schedule: &Schedule,
    replayed: &Replay,
    admitted: Admitted,
) -> Option<Schedule> {
    let n = w.len();
    let batches = &schedule.batches;
    let mut first_batch = vec![usize::MAX; n];
    for (j, b) in batches.iter().enumerate() {
        for e in &b.entries {
            if matches!(e.action, Action::Process(_)) {
                let f = first_batch.get_mut(e.request as usize)?;
                *f = (*f).min(j);
            }
        }
    }
    let order = w.fcfs_order();
    // The batch by which each request must have started: the earliest first batch of it
    // and every later arrival.
    let mut due = vec![usize::MAX; n];
    let mut earliest = usize::MAX;
    for &i in order.iter().rev() {
        earliest = earliest.min(first_batch[i as usize]);
        due[i as usize] = earliest;
    }
    if order
        .iter()
        .all(|&i| first_batch[i as usize] == due[i as usize])
    {
        return None;
    }
    let prompt_room = limits
        .token_budget
        .unwrap_or(u64::MAX)
        .min(limits.effective_prefill_budget().unwrap_or(u64::MAX));
    // Tokens per batch: every token counts against the prompt budget here, which is
    // conservative where decodes share the batch.
    let mut tokens: Vec<u64> = batches
        .iter()
        .map(|b| {
            b.entries
                .iter()
                .map(|e| match e.action {
                    Action::Process(c) => u64::from(c),
                    Action::Evict => 0,
                })
                .sum()
        })
        .collect();
    let mut out = schedule.clone();
    for b in &mut out.batches {
        b.start_s = None;
        b.end_s = None;
    }
    let mut evictions: Vec<(usize, u32)> = Vec::new();
    let mut previous = 0usize;
    for &i in &order {
        let (first, by) = (first_batch[i as usize], due[i as usize]);
        if first == by {
            previous = first;
            continue;
        }
        let arrival = w.requests()[i as usize].arrival_s;
        // The latest batch at or before `by`, not before the previous admission, that
        // starts after the arrival and has a token to spare.
        let at = (previous..=by).rev().find(|&j| {
            tokens[j] < prompt_room
                && replayed
                    .batches
                    .get(j)
                    .is_some_and(|r| r.start_s >= arrival)
                && !out.batches[j].entries.iter().any(|e| e.request == i)
        })?;
        tokens[at] += 1;
        out.batches[at].entries.push(Entry::process(i, 1));
        // Evicted in the next batch, before its first chunk there at the latest: where that
        // is the next batch, it keeps the token instead.
        if admitted == Admitted::Evicted && at + 1 < first {
            evictions.push((at + 1, i));
        } else {
            first_chunk_less_one_token(&mut out.batches[first].entries, i)?;
        }
        previous = at;
    }
    for (j, i) in evictions {
        out.batches.get_mut(j)?.entries.push(Entry::evict(i));
    }
    Some(out)
}

/// `i`'s chunk in `entries` one token shorter (gone where it was one token); None where
/// `i` has no chunk there.
fn first_chunk_less_one_token(entries: &mut Vec<Entry>, i: u32) -> Option<()> {
    let k = entries.iter().position(|e| e.request == i)?;
    match entries[k].action {
        Action::Process(1) => {
            entries.remove(k);
        }
        Action::Process(c) => entries[k].action = Action::Process(c - 1),
        Action::Evict => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Objective, PolicyConstraints, SolveOptions};
    use infersched_core::{Batch, replay};
    use infersched_test_kit::workload;

    fn cost() -> infersched_cost_model::LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    /// A long prompt arriving first, a short one after it served first: the short one's
    /// batch admits the long one with one token, which its own chunk then lacks.
    #[test]
    fn a_short_request_served_first_admits_the_earlier_long_one() {
        let w = workload(&[(100, 2, 0.0), (10, 2, 0.0)]);
        let limits = Limits {
            token_budget: Some(128),
            ..Limits::unlimited()
        };
        let s = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(1, 10)]),
                Batch::new(vec![Entry::process(1, 1), Entry::process(0, 100)]),
                Batch::new(vec![Entry::process(0, 1)]),
            ],
            meta: None,
        };
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        assert!(!fcfs.admits(&w, &limits, &s));
        let kept = admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Kept).unwrap();
        assert_eq!(
            kept.batches[0].entries,
            vec![Entry::process(1, 10), Entry::process(0, 1)]
        );
        assert_eq!(
            kept.batches[1].entries,
            vec![Entry::process(1, 1), Entry::process(0, 99)]
        );
        let r_kept = replay(&w, &limits, &cost(), &kept).unwrap();
        assert!(fcfs.admits(&w, &limits, &kept));
        // One token more in the first batch (an entry of about 0.11 ms): both first tokens
        // move by about that.
        for k in 0..2 {
            let (before, after) = (
                r.requests[k].first_token_s,
                r_kept.requests[k].first_token_s,
            );
            assert!((after - before).abs() < 2e-4, "{k}: {before} -> {after}");
        }
        let evicted = admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Evicted).unwrap();
        // Its first chunk is the next batch: it keeps the token.
        assert_eq!(evicted, kept);
        // An FCFS schedule needs nothing.
        assert!(admit_in_arrival_order(&w, &limits, &kept, &r_kept, Admitted::Kept).is_none());
    }

    /// Evicted admissions leave the later chunks as they were, and a batch that is full in
    /// C takes no admission token: the latest earlier batch with room does.
    #[test]
    fn evicted_admissions_and_full_batches() {
        let w = workload(&[(50, 2, 0.0), (8, 3, 0.0), (8, 2, 0.0)]);
        let limits = Limits {
            token_budget: Some(16),
            ..Limits::unlimited()
        };
        let s = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(1, 8)]),
                Batch::new(vec![Entry::process(1, 1), Entry::process(2, 8)]),
                Batch::new(vec![Entry::process(1, 1), Entry::process(2, 1)]),
                Batch::new(vec![Entry::process(0, 16)]),
                Batch::new(vec![Entry::process(0, 16)]),
                Batch::new(vec![Entry::process(0, 16)]),
                Batch::new(vec![Entry::process(0, 2)]),
                Batch::new(vec![Entry::process(0, 1)]),
            ],
            meta: None,
        };
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let evicted = admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Evicted).unwrap();
        assert_eq!(
            evicted.batches[0].entries,
            vec![Entry::process(1, 8), Entry::process(0, 1)]
        );
        assert_eq!(
            evicted.batches[1].entries,
            vec![Entry::process(1, 1), Entry::process(2, 8), Entry::evict(0)]
        );
        assert_eq!(evicted.batches[3..], s.batches[3..]);
        let r_evicted = replay(&w, &limits, &cost(), &evicted).unwrap();
        assert!(fcfs.admits(&w, &limits, &evicted));
        assert_eq!(r_evicted.requests[0].evictions, 1);
        // Batch 0 is full (16 tokens) once request 0 is in it: request 2 is due there too
        // (request 1 starts there), but only where it has arrived and there is room.
        let full = Limits {
            token_budget: Some(8),
            ..Limits::unlimited()
        };
        let s_full = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(1, 8)]),
                Batch::new(vec![Entry::process(1, 1)]),
                Batch::new(vec![Entry::process(1, 1)]),
                Batch::new(vec![Entry::process(2, 8)]),
                Batch::new(vec![Entry::process(2, 1)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 2)]),
                Batch::new(vec![Entry::process(0, 1)]),
            ],
            meta: None,
        };
        let r_full = replay(&w, &full, &cost(), &s_full).unwrap();
        let kept = admit_in_arrival_order(&w, &full, &s_full, &r_full, Admitted::Kept);
        // Batch 0 has no room for request 0's token, and nothing is earlier: none.
        assert!(kept.is_none());
    }

    /// Through the solve: a long prompt arriving just before short ones keeps them waiting
    /// in arrival order; the repaired schedule serves them first and is in the class.
    #[test]
    fn the_solve_repairs_the_schedule_found_without_fcfs_into_the_class() {
        let w = workload(&[
            (2000, 4, 0.0),
            (20, 4, 0.001),
            (30, 4, 0.002),
            (10, 4, 0.003),
        ]);
        let limits = Limits {
            token_budget: Some(512),
            kv_capacity: Some(4096),
            ..Limits::unlimited()
        };
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let options = SolveOptions {
            time_limit_s: 4.0,
            constraints: fcfs,
            // No exact model: the class's own answer is its searches'.
            memory_limit_bytes: 1 << 10,
            ..Default::default()
        };
        let cost = cost();
        let own = crate::solve_in_class(&w, &limits, &cost, Objective::MeanTtft, &options).unwrap();
        let report = crate::solve(&w, &limits, &cost, Objective::MeanTtft, &options).unwrap();
        assert!(fcfs.admits(&w, &limits, &report.schedule));
        let r = replay(&w, &limits, &cost, &report.schedule).unwrap();
        assert_eq!(Objective::MeanTtft.of_replay(&r), report.replayed_objective);
        assert!(
            report.replayed_objective < own.replayed_objective * 0.8,
            "{} vs {}",
            report.replayed_objective,
            own.replayed_objective
        );
        assert!(report.best_bound >= own.best_bound);
        assert!(report.best_bound <= report.replayed_objective);
        assert!(report.note.unwrap().contains("FCFS admission repair"));
    }

    /// On random workloads served shortest first (out of arrival order), the repair always
    /// gives a schedule whose first steps are in arrival order and which keeps every
    /// request's tokens; most replay as valid, and then the class admits them.
    #[test]
    fn repaired_schedules_start_in_arrival_order_and_keep_every_token() {
        use infersched_core::Request;
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let (mut repaired, mut valid) = (0, 0);
        for _ in 0..80 {
            let n = rng.random_range(2..12);
            let reqs: Vec<Request> = (0..n)
                .map(|_| Request {
                    input_tokens: rng.random_range(1..400),
                    output_tokens: rng.random_range(1..20),
                    arrival_s: rng.random_range(0.0..0.2),
                })
                .collect();
            let w = Workload::new(reqs).unwrap();
            let limits = Limits {
                kv_capacity: Some(rng.random_range(800..4000)),
                token_budget: Some(rng.random_range(64..512)),
                ..Limits::unlimited()
            };
            if limits.check_feasible(&w).is_err() {
                continue;
            }
            let order = w.fcfs_order();
            let mut list = crate::list_search::PriorityList::new(&order, 128, 16, 8)
                .shortest_remaining_first(&cost());
            let Ok(sim) = infersched_schedulers::simulate(&w, &limits, &mut list, &cost()) else {
                continue;
            };
            let r = replay(&w, &limits, &cost(), &sim.schedule).unwrap();
            let tokens = |s: &Schedule| {
                let mut t = vec![0u64; w.len()];
                for e in s.batches.iter().flat_map(|b| &b.entries) {
                    if let Action::Process(c) = e.action {
                        t[e.request as usize] += u64::from(c);
                    }
                }
                t
            };
            for kind in [Admitted::Kept, Admitted::Evicted] {
                let Some(s) = admit_in_arrival_order(&w, &limits, &sim.schedule, &r, kind) else {
                    continue;
                };
                repaired += 1;
                let mut first = vec![usize::MAX; w.len()];
                for (j, b) in s.batches.iter().enumerate() {
                    for e in &b.entries {
                        if matches!(e.action, Action::Process(_)) {
                            first[e.request as usize] = first[e.request as usize].min(j);
                        }
                    }
                }
                assert!(
                    order
                        .windows(2)
                        .all(|p| first[p[0] as usize] <= first[p[1] as usize])
                );
                // Kept: the same tokens; evicted: one more per evicted admission.
                let evicted = s
                    .batches
                    .iter()
                    .flat_map(|b| &b.entries)
                    .filter(|e| e.action == Action::Evict)
                    .count() as u64;
                let (before, after) = (tokens(&sim.schedule), tokens(&s));
                assert_eq!(
                    after.iter().sum::<u64>(),
                    before.iter().sum::<u64>() + evicted
                );
                if kind == Admitted::Kept {
                    assert_eq!(after, before);
                }
                if replay(&w, &limits, &cost(), &s).is_ok() {
                    valid += 1;
                    assert!(fcfs.admits(&w, &limits, &s));
                }
            }
        }
        assert!(repaired >= 40, "only {repaired} schedules needed a repair");
        assert!(valid * 10 >= repaired * 8, "{valid} of {repaired} valid");
    }
}
