//! Schedules of a policy class from schedules outside it (milp.md, "Class repair"): two
//! classes ask something any schedule can be brought to at a small cost, so the best
//! schedule found without the rule is repaired into the class and kept where it beats the
//! class's own searches (which, for these classes, serve in arrival order or by whole
//! phases and find much worse schedules).
//!
//! * **`--no-mix`** (no batch holds prefill and decode entries): every mixed batch becomes
//!   its decodes (and evictions), then its prefill chunks ([`split_mixed_batches`]). Both
//!   halves hold subsets of the batch's entries from the same states, so memory, budgets
//!   and every other rule still hold; each split costs one more batch bias.
//! * **`--fcfs`** asks only that requests are *first* processed in arrival order (none
//!   starts before an earlier one has); what they do after that is free. So every
//!   earlier-arriving request not yet started is admitted, in the batch where a later one
//!   is first processed, with one prompt token ([`admit_in_arrival_order`]). The token is
//!   taken from the request's own first chunk later on (its prompt is processed once, as
//!   before), so it holds one token of KV, one block, until then; where M or R_max does
//!   not allow that and evictions are allowed, it is evicted in the next batch instead and
//!   its prompt is processed whole later, as before ([`Admitted::Evicted`]). The token goes
//!   into the batch that needs it, or the latest earlier batch with room for it in C and P
//!   (and without decodes under `--no-mix`) that starts after its arrival. Where kept
//!   tokens do not fit M, the solve without the rule runs again with M less the most
//!   admission blocks held at once ([`most_admission_tokens_held`]).
//!
//! The replay judges the result, and the caller keeps it only where it is valid, in the
//! class and better. Where it pays (`solve --time-limit 10`): on 300 Splitwise requests,
//! mean TTFT, C = 4096, M = 10,000, the best schedule in the FCFS class was the
//! heuristics' 15.9 s, twice the 7.5 s found without the rule; with `--no-mix`, mean
//! latency, M = 16,384, 16.3 s against 10.2 s without the rule; with `--fcfs --no-evict`,
//! mean latency, M = 16,384, 20.1 s before the repair, 10.1 s after.

use crate::report::certified_gap;
use crate::{
    Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions, SolveReport, SolveStatus,
};
use infersched_core::{
    Action, Batch, Entry, EntryKind, Limits, Replay, Schedule, Workload, classify_entries, replay,
};
use infersched_cost_model::LinearCostModel;
use std::time::Instant;

/// The share of the time limit the solve in the class itself takes first; the solve
/// without the repaired rules gets what it leaves.
const IN_CLASS_SHARE: f64 = 0.5;

/// Whether [`solve_with_class_repair`] applies: a class with a rule it repairs.
pub(crate) fn applies(class: &PolicyConstraints) -> bool {
    class.fcfs || class.no_mix
}

/// A solve in a class with FCFS admission or unmixed batches: the class's own solve
/// (`solve_in_class`, half the time, first, so an interrupt meanwhile still has its
/// schedules), then the same class without those rules for the rest of the time, whose
/// schedule is repaired into the class ([`repaired`]) and kept where it is better; its
/// bound holds for the class too (the class is a subset), so the higher bound is kept.
pub(crate) fn solve_with_class_repair(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    solve_in_class: impl Fn(&Limits, &SolveOptions) -> Result<SolveReport, SolveError>,
) -> Result<SolveReport, SolveError> {
    let started = Instant::now();
    let class = options.constraints;
    let mut report = solve_in_class(
        limits,
        &SolveOptions {
            time_limit_s: options.time_limit_s * IN_CLASS_SHARE,
            ..options.clone()
        },
    )?;
    if report.status == SolveStatus::Optimal {
        return Ok(report);
    }
    let left = options.time_limit_s - started.elapsed().as_secs_f64();
    let free = PolicyConstraints {
        fcfs: false,
        no_mix: false,
        ..class
    };
    // Where the solve without the rules fails (it should not where this one did not), the
    // class's own answer stands.
    let Ok(without) = solve_in_class(
        limits,
        &SolveOptions {
            time_limit_s: left.max(0.0),
            constraints: free,
            observer: None,
            ..options.clone()
        },
    ) else {
        return Ok(report);
    };
    let mut best = repaired(w, limits, cost, objective, &class, &without.schedule);
    let mut set_aside = None;
    if class.fcfs
        && best
            .as_ref()
            .is_none_or(|(value, _)| *value >= report.replayed_objective)
        && let Some((found, aside)) = with_admission_tokens_set_aside(
            w,
            limits,
            cost,
            objective,
            options,
            &without.schedule,
            started,
            &solve_in_class,
        )
        && best.as_ref().is_none_or(|(value, _)| found.0 < *value)
    {
        best = Some(found);
        set_aside = Some(aside);
    }
    adopt(&mut report, &without, best, set_aside, options);
    Ok(report)
}

/// A schedule found without the class's rules under M less what its admission tokens
/// hold, repaired into the class, with (that M, its method, its own objective).
type SetAside = ((f64, Schedule), (u64, SolveMethod, f64));

/// Kept admission tokens hold KV the schedule found without FCFS may not have left free:
/// the solve without the rules again (with the time left, at least a tenth of the limit)
/// with M less the most those tokens hold at once, its schedule repaired. Only its schedule
/// is used: its bound is of smaller limits.
#[allow(clippy::too_many_arguments)]
fn with_admission_tokens_set_aside(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    without: &Schedule,
    started: Instant,
    solve_in_class: &impl Fn(&Limits, &SolveOptions) -> Result<SolveReport, SolveError>,
) -> Option<SetAside> {
    let class = options.constraints;
    let block = u64::from(limits.block_size.max(1));
    let m = limits.kv_capacity?;
    let held = most_admission_tokens_held(w, without)
        .map(|most| most.saturating_mul(block))
        .filter(|&held| held > 0 && held < m)?;
    let left = options.time_limit_s - started.elapsed().as_secs_f64();
    let tighter = Limits {
        kv_capacity: Some(m - held),
        ..*limits
    };
    if left < options.time_limit_s * 0.1 || tighter.check_feasible(w).is_err() {
        return None;
    }
    let free = PolicyConstraints {
        fcfs: false,
        no_mix: false,
        ..class
    };
    let again = solve_in_class(
        &tighter,
        &SolveOptions {
            time_limit_s: left,
            constraints: free,
            observer: None,
            ..options.clone()
        },
    )
    .ok()?;
    let found = repaired(w, limits, cost, objective, &class, &again.schedule)?;
    Some((found, (m - held, again.method, again.replayed_objective)))
}

/// `report` (the class's own solve) with the higher bound of the solve `without` the rules
/// and, where better, the repaired schedule `best`; the notes say which came from where.
fn adopt(
    report: &mut SolveReport,
    without: &SolveReport,
    best: Option<(f64, Schedule)>,
    set_aside: Option<(u64, SolveMethod, f64)>,
    options: &SolveOptions,
) {
    let class = options.constraints;
    let own_note = report.note.take();
    let mut notes: Vec<String> = Vec::new();
    if without.best_bound > report.best_bound {
        report.best_bound = without.best_bound;
        report.bound_method = without.bound_method;
        notes.push(format!(
            "the bound ({}) is the one found without {}, which holds for the class too",
            without.bound_method.name(),
            rules(&class)
        ));
    }
    if let Some((value, schedule)) = best
        && value < report.replayed_objective
    {
        let (found_under, found_method, found_value) = match set_aside {
            Some((m, method, value)) => (
                format!(
                    " under M = {m} (KV set aside for the admission tokens of the schedule found under M)"
                ),
                method,
                value,
            ),
            None => (String::new(), without.method, without.replayed_objective),
        };
        notes.push(format!(
            "the schedule is the best found without {}{} ({}: {:.6} ms), repaired into the class (class repair: {})",
            rules(&class),
            found_under,
            found_method.name(),
            found_value * 1e3,
            [
                class.no_mix.then_some("mixed batches split, decodes first"),
                class.fcfs.then_some("each request processed before an earlier arrival brings that one in with a one-token chunk"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ")
        ));
        if let Some(observer) = &options.observer {
            observer.0.incumbent("class repair", &schedule);
        }
        report.replayed_objective = value;
        report.schedule = schedule;
        report.method = found_method;
        notes.reverse();
    }
    if let Some(own) = own_note {
        notes.push(if notes.is_empty() {
            own
        } else {
            format!("the solve in the class itself: {own}")
        });
    }
    report.certified_gap = certified_gap(report.replayed_objective, report.best_bound);
    report.note = (!notes.is_empty()).then(|| notes.join("; "));
}

/// The rules repaired, as the flags say them.
fn rules(class: &PolicyConstraints) -> String {
    [
        class.no_mix.then_some("--no-mix"),
        class.fcfs.then_some("--fcfs"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" and ")
}

/// `schedule` brought into `class` (mixed batches split, then FCFS admission, each way of
/// keeping the admission tokens tried): the best that replays and is in the class, with its
/// objective; None where none is.
pub(crate) fn repaired(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    schedule: &Schedule,
) -> Option<(f64, Schedule)> {
    let mut s = schedule.clone();
    if class.no_mix {
        s = split_mixed_batches(w, &s).unwrap_or(s);
    }
    let split = replay(w, limits, cost, &s).ok()?;
    let in_class = |c: Schedule, r: &Replay| {
        class
            .admits(w, limits, &c)
            .then(|| (objective.of_replay(r), c))
    };
    let mut candidates: Vec<(f64, Schedule)> = Vec::new();
    if class.fcfs {
        let mut kinds = vec![Admitted::Kept];
        if !class.no_evict && !class.reserve {
            kinds.push(Admitted::Evicted);
        }
        for kind in kinds {
            match admit_in_arrival_order(w, limits, &s, &split, kind, class.no_mix) {
                Some(c) => {
                    if let Ok(r) = replay(w, limits, cost, &c) {
                        candidates.extend(in_class(c, &r));
                    }
                }
                None => candidates.extend(in_class(s.clone(), &split)),
            }
        }
    } else {
        candidates.extend(in_class(s, &split));
    }
    candidates.into_iter().min_by(|a, b| a.0.total_cmp(&b.0))
}

/// `schedule` (which the replay accepts) with each batch that mixes prefill chunks and
/// decode steps split in two: its decodes and evictions, then its prefill chunks. None
/// where no batch mixes.
pub(crate) fn split_mixed_batches(w: &Workload, schedule: &Schedule) -> Option<Schedule> {
    let kinds = classify_entries(w, schedule);
    let mut batches = Vec::with_capacity(schedule.batches.len());
    let mut split = false;
    for (b, kinds) in schedule.batches.iter().zip(&kinds) {
        let mixed = kinds.iter().any(|k| k.kind == EntryKind::Prefill)
            && kinds.iter().any(|k| k.kind == EntryKind::Decode);
        if !mixed {
            batches.push(Batch::new(b.entries.clone()));
            continue;
        }
        split = true;
        let (prefills, rest): (Vec<_>, Vec<_>) = b
            .entries
            .iter()
            .zip(kinds)
            .partition(|(_, k)| k.kind == EntryKind::Prefill);
        batches.push(Batch::new(rest.into_iter().map(|(e, _)| *e).collect()));
        batches.push(Batch::new(prefills.into_iter().map(|(e, _)| *e).collect()));
    }
    split.then(|| Schedule {
        batches,
        meta: schedule.meta.clone(),
        prefix_cache: schedule.prefix_cache,
    })
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
    unmixed: bool,
) -> Option<Schedule> {
    let batches = &schedule.batches;
    let (first_batch, due) = first_and_due_batches(w, schedule)?;
    let order = w.fcfs_order();
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
    let mut tokens: Vec<u64> = replayed.batches.iter().map(|b| b.features.tokens).collect();
    if tokens.len() != batches.len() {
        return None;
    }
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
                    .is_some_and(|r| r.start_s >= arrival && !(unmixed && r.features.n_decode > 0))
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

/// Per request, the batch of its first step in `schedule` and the batch by which FCFS
/// admission needs it started (the earliest first batch of it and of every later
/// arrival); None where some request is never processed (no valid schedule).
fn first_and_due_batches(w: &Workload, schedule: &Schedule) -> Option<(Vec<usize>, Vec<usize>)> {
    let n = w.len();
    let mut first_batch = vec![usize::MAX; n];
    for (j, b) in schedule.batches.iter().enumerate() {
        for e in &b.entries {
            if matches!(e.action, Action::Process(_)) {
                let f = first_batch.get_mut(e.request as usize)?;
                *f = (*f).min(j);
            }
        }
    }
    if first_batch.contains(&usize::MAX) {
        return None;
    }
    let mut due = vec![usize::MAX; n];
    let mut earliest = usize::MAX;
    for &i in w.fcfs_order().iter().rev() {
        earliest = earliest.min(first_batch[i as usize]);
        due[i as usize] = earliest;
    }
    Some((first_batch, due))
}

/// The most requests that kept admission tokens ([`Admitted::Kept`]) would hold at once
/// while waiting for their own first chunks, each admitted where it is due.
fn most_admission_tokens_held(w: &Workload, schedule: &Schedule) -> Option<u64> {
    let (first, due) = first_and_due_batches(w, schedule)?;
    // +1 where a hold starts, -1 where it ends.
    let mut change = vec![0i64; schedule.batches.len() + 1];
    for (f, d) in first.iter().zip(&due) {
        if d < f {
            change[*d] += 1;
            change[*f] -= 1;
        }
    }
    let mut held = 0i64;
    let mut most = 0i64;
    for c in change {
        held += c;
        most = most.max(held);
    }
    u64::try_from(most).ok()
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
        Action::Evict | Action::Receive => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Objective, PolicyConstraints, SolveOptions, SolveReport};
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
            prefix_cache: None,
        };
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        assert!(!fcfs.admits(&w, &limits, &s));
        let kept = admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Kept, false).unwrap();
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
        let evicted =
            admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Evicted, false).unwrap();
        // Its first chunk is the next batch: it keeps the token.
        assert_eq!(evicted, kept);
        // An FCFS schedule needs nothing.
        assert!(
            admit_in_arrival_order(&w, &limits, &kept, &r_kept, Admitted::Kept, false).is_none()
        );
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
            prefix_cache: None,
        };
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..Default::default()
        };
        let evicted =
            admit_in_arrival_order(&w, &limits, &s, &r, Admitted::Evicted, false).unwrap();
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
            prefix_cache: None,
        };
        let r_full = replay(&w, &full, &cost(), &s_full).unwrap();
        let kept = admit_in_arrival_order(&w, &full, &s_full, &r_full, Admitted::Kept, false);
        // Batch 0 has no room for request 0's token, and nothing is earlier: none.
        assert!(kept.is_none());
    }

    /// The solve in `class` itself and the whole solve (with the repair) on `w`, without
    /// exact models (the class's own answer is its searches'); checks that the whole
    /// solve's schedule is in the class, replays to its reported value and beats the
    /// class's own by 20%.
    fn own_and_repaired(
        w: &Workload,
        limits: &Limits,
        class: PolicyConstraints,
        objective: Objective,
    ) -> (SolveReport, SolveReport) {
        let options = SolveOptions {
            time_limit_s: 4.0,
            constraints: class,
            memory_limit_bytes: 1 << 10,
            ..Default::default()
        };
        let cost = cost();
        let own = crate::solve_in_class(w, limits, &cost, objective, &options).unwrap();
        let report = crate::solve(w, limits, &cost, objective, &options).unwrap();
        assert!(class.admits(w, limits, &report.schedule));
        let r = replay(w, limits, &cost, &report.schedule).unwrap();
        assert_eq!(objective.of_replay(&r), report.replayed_objective);
        assert!(
            report.replayed_objective < own.replayed_objective * 0.8,
            "{} vs {}",
            report.replayed_objective,
            own.replayed_objective
        );
        (own, report)
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
        let (own, report) = own_and_repaired(&w, &limits, fcfs, Objective::MeanTtft);
        assert!(report.best_bound >= own.best_bound);
        assert!(report.best_bound <= report.replayed_objective);
        assert!(report.note.unwrap().contains("one-token chunk"));
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
                let Some(s) = admit_in_arrival_order(&w, &limits, &sim.schedule, &r, kind, false)
                else {
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

    /// A mixed batch becomes its decodes, then its prefills; the result replays, is
    /// unmixed, and costs one more batch bias per split.
    #[test]
    fn mixed_batches_split_into_decodes_then_prefills() {
        let w = workload(&[(8, 3, 0.0), (20, 2, 0.0)]);
        let limits = Limits::unlimited();
        let s = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 1), Entry::process(1, 20)]),
                Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
            ],
            meta: None,
            prefix_cache: None,
        };
        let split = split_mixed_batches(&w, &s).unwrap();
        assert_eq!(
            split.batches,
            vec![
                Batch::new(vec![Entry::process(0, 8)]),
                Batch::new(vec![Entry::process(0, 1)]),
                Batch::new(vec![Entry::process(1, 20)]),
                Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
            ]
        );
        let unmixed = PolicyConstraints {
            no_mix: true,
            ..Default::default()
        };
        assert!(!unmixed.admits(&w, &limits, &s));
        assert!(unmixed.admits(&w, &limits, &split));
        let (before, after) = (
            replay(&w, &limits, &cost(), &s).unwrap(),
            replay(&w, &limits, &cost(), &split).unwrap(),
        );
        let bias = cost().theta(infersched_core::Feature::One);
        assert!((after.makespan_s() - before.makespan_s() - bias).abs() < 0.2 * bias);
        assert!(split_mixed_batches(&w, &split).is_none());
    }

    /// Through the solve with `--no-mix`: the schedule found without the rule, split, beats
    /// the class's own searches on a burst of requests with long outputs.
    #[test]
    fn the_solve_splits_the_schedule_found_with_mixed_batches() {
        let w = workload(&[
            (300, 40, 0.0),
            (200, 30, 0.0),
            (400, 50, 0.01),
            (100, 20, 0.02),
            (300, 40, 0.03),
            (250, 30, 0.04),
        ]);
        let limits = Limits {
            token_budget: Some(256),
            kv_capacity: Some(2048),
            ..Limits::unlimited()
        };
        let unmixed = PolicyConstraints {
            no_mix: true,
            ..Default::default()
        };
        let (_, report) = own_and_repaired(&w, &limits, unmixed, Objective::MeanLatency);
        assert!(report.note.unwrap().contains("mixed batches split"));
    }

    /// Requests 0 and 1 arrive first and start last: both hold admission tokens from batch
    /// 0 (where request 2 starts) until their own first batches, 3 and 4; requests 2 and 3
    /// start on time.
    #[test]
    fn admission_tokens_held_at_once() {
        let w = workload(&[(8, 1, 0.0), (8, 1, 0.0), (8, 1, 0.0), (8, 1, 1.0)]);
        let step = |i: u32| Batch::new(vec![Entry::process(i, 8)]);
        let s = Schedule {
            batches: vec![step(2), step(3), Batch::new(vec![]), step(0), step(1)],
            meta: None,
            prefix_cache: None,
        };
        assert_eq!(most_admission_tokens_held(&w, &s), Some(2));
        let in_order = Schedule {
            batches: vec![step(0), step(1), step(2), step(3)],
            meta: None,
            prefix_cache: None,
        };
        assert_eq!(most_admission_tokens_held(&w, &in_order), Some(0));
        let missing = Schedule {
            batches: vec![step(0), step(1), step(2)],
            meta: None,
            prefix_cache: None,
        };
        assert_eq!(most_admission_tokens_held(&w, &missing), None);
    }
}
