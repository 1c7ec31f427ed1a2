//! A schedule from the phase relaxation's plan (milp.md, "Schedules from the phase
//! relaxation"): the relaxation's best point says in which order requests complete and in
//! which phases each prompt is worked on; this turns that plan into batches.
//!
//! Phase by phase (the phase ends when its request completes), every batch holds:
//! * a decode step of every request that is decode-ready (decodes share the batch's bias,
//!   so the plan's decode counts are not followed one by one), in plan order;
//! * the prompt chunks the plan puts in the current phase, for the requests that have
//!   arrived by the batch's start, each up to the share of its prompt planned by the end
//!   of the phase (the whole prompt by its completion phase), within C and P.
//!
//! Batch times come from the cost model as the replay computes them, so that a batch never
//! waits for a prompt that has not arrived while others could run; when nothing planned can
//! run until the earliest planned arrival, a chunk of the first prompt in plan order that
//! has arrived runs meanwhile, as much as ends by that arrival (work the plan does later
//! anyway, done while the machine would stand idle), and the next batch waits for the
//! arrival. KV is never evicted: a request
//! is admitted (its first chunk) only while its whole `I + O - 1`, with that of every
//! admitted unfinished request, fits M, and while R_max allows, so an admitted request can
//! always take its next step; a prompt that cannot be admitted waits. The caller replays
//! the schedule and keeps it only where it is valid, in the policy class and better than
//! what it has: the plan is a guide, not a proof (it ignores M and the budgets).
//!
//! [`search_plans`] improves a plan by iterated local search, and [`plan_of_schedule`]
//! gives a schedule's own plan, so the search also starts where no relaxation ran.
//!
//! Where it pays: on bursts of real requests the priority-list search keeps long prompts in
//! the way of short ones that arrive a few milliseconds later; the relaxation's plan starts
//! the prompt that arrives next and splits long prompts around the short requests' decodes.
//! On the first burst of README family (b) (12 Splitwise requests) the relaxation's plan
//! gives 608.7 ms and the plan search 599.2 ms, against the list search's 645.2 ms.

use crate::bounds::PhasePlan;
use crate::{Objective, PolicyConstraints};
use infersched_core::{
    Batch, BatchFeatures, CostModel, Entry, Limits, Replay, Request, Schedule, Workload, replay,
};
use infersched_cost_model::LinearCostModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// The most requests the plan search takes: a plan holds `n^2` prompt shares and each try
/// replays the whole schedule.
pub(crate) const MAX_REQUESTS: usize = 256;

/// The schedule the plan describes, or None when it cannot be followed (a class it does
/// not model, or a request that can never be admitted).
pub(crate) fn schedule_from_plan(
    w: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    class: &PolicyConstraints,
    plan: &PhasePlan,
) -> Option<Schedule> {
    let n = w.requests().len();
    // Reservations and unmixed batches change what a step may hold: not modelled here.
    if class.reserve || class.no_mix || plan.completes.len() != n || plan.prompt_share.len() != n {
        return None;
    }
    let mut sim = PlanRun::new(w, limits, cost, class, plan)?;
    let mut batches = Vec::new();
    let mut phase = 0usize;
    loop {
        while phase < n && sim.finished(plan.completes[phase]) {
            phase += 1;
        }
        if phase == n {
            break;
        }
        let mut step = sim.step();
        sim.decodes(&mut step);
        let waiting_for = sim.prompt_chunks(&mut step, phase)?;
        if step.entries.is_empty() {
            // Nothing planned can run before the next planned prompt arrives (or ever: give
            // up). Rather than stand idle until then, work on the first prompt in plan
            // order that has arrived and can be admitted, a chunk that ends by that arrival.
            let next = waiting_for.filter(|&t| t > sim.now)?;
            if !sim.idle_chunk(&mut step, next)? {
                sim.now = next;
                continue;
            }
        }
        batches.push(sim.run(&step));
    }
    Some(Schedule::new(batches))
}

/// A batch being filled: its entries (request, tokens), features, tokens, and the KV
/// reserved and requests admitted with it.
struct Step {
    entries: Vec<(usize, u32)>,
    features: BatchFeatures,
    tokens: u64,
    prefill_tokens: u64,
    reserved: u64,
    running: u64,
    latest_arrival: f64,
}

/// Following a plan batch by batch: the requests' state and the clock.
struct PlanRun<'a> {
    reqs: &'a [Request],
    limits: &'a Limits,
    cost: &'a dyn CostModel,
    /// Prompt tokens planned by the end of each phase, per request.
    target: Vec<Vec<u64>>,
    /// Requests by planned completion.
    by_plan: Vec<usize>,
    c_max: u64,
    p_max: u64,
    m_max: u64,
    r_max: u64,
    held: Vec<u64>,
    generated: Vec<u32>,
    admitted: Vec<bool>,
    now: f64,
}

impl<'a> PlanRun<'a> {
    fn new(
        w: &'a Workload,
        limits: &'a Limits,
        cost: &'a dyn CostModel,
        class: &PolicyConstraints,
        plan: &PhasePlan,
    ) -> Option<Self> {
        let reqs = w.requests();
        let n = reqs.len();
        let mut phase_of = vec![0usize; n];
        for (p, &i) in plan.completes.iter().enumerate() {
            *phase_of.get_mut(i)? = p;
        }
        let target = (0..n)
            .map(|i| {
                prompt_targets(
                    reqs[i].input_tokens,
                    &plan.prompt_share[i],
                    phase_of[i],
                    class.no_chunk,
                    n,
                )
            })
            .collect();
        let mut by_plan: Vec<usize> = (0..n).collect();
        by_plan.sort_by_key(|&i| (phase_of[i], i));
        Some(Self {
            reqs,
            limits,
            cost,
            target,
            by_plan,
            c_max: limits.token_budget.unwrap_or(u64::MAX),
            p_max: limits.effective_prefill_budget().unwrap_or(u64::MAX),
            m_max: limits.kv_capacity.unwrap_or(u64::MAX),
            r_max: limits.max_running.unwrap_or(u64::MAX),
            held: vec![0u64; n],
            generated: vec![0u32; n],
            admitted: vec![false; n],
            now: 0.0,
        })
    }

    fn finished(&self, i: usize) -> bool {
        self.generated[i] >= self.reqs[i].output_tokens
    }

    /// An empty batch. Admitted requests reserve their whole I + O - 1 (so nothing ever
    /// has to be evicted: every admitted request can always take its next step).
    fn step(&self) -> Step {
        let live = || (0..self.reqs.len()).filter(|&i| self.admitted[i] && !self.finished(i));
        Step {
            entries: Vec::new(),
            features: BatchFeatures::default(),
            tokens: 0,
            prefill_tokens: 0,
            reserved: live()
                .map(|i| self.limits.occupied(self.reqs[i].max_kv_tokens()))
                .sum(),
            running: live().count() as u64,
            latest_arrival: self.now,
        }
    }

    /// Decode steps of every decode-ready request.
    fn decodes(&self, step: &mut Step) {
        for &i in &self.by_plan {
            let known = u64::from(self.reqs[i].input_tokens) + u64::from(self.generated[i]);
            if self.generated[i] == 0 || self.finished(i) || self.held[i] + 1 != known {
                continue;
            }
            if step.tokens + 1 > self.c_max {
                continue;
            }
            step.tokens += 1;
            step.features.add_decode(self.held[i] + 1);
            step.entries.push((i, 1u32));
        }
    }

    /// Prompt chunks planned for `phase`, for requests that have arrived (or, when nothing
    /// else runs, the earliest of them to arrive). Where nothing at all could run, a second
    /// pass lets admitted prompts run past their plan. Returns the earliest arrival of a
    /// planned prompt not yet arrived; None (the outer) when a chunk overflows u32.
    fn prompt_chunks(&mut self, step: &mut Step, phase: usize) -> Option<Option<f64>> {
        let mut waiting_for: Option<f64> = None;
        for pass in 0..2 {
            if pass == 1 && (!step.entries.is_empty() || waiting_for.is_some()) {
                break;
            }
            for k in 0..self.by_plan.len() {
                let i = self.by_plan[k];
                let goal = if pass == 0 {
                    self.target[i][phase]
                } else if self.admitted[i] {
                    u64::from(self.reqs[i].input_tokens)
                } else {
                    continue;
                };
                if self.generated[i] > 0 || self.held[i] >= goal {
                    continue;
                }
                let arrival = self.reqs[i].arrival_s;
                if arrival > self.now {
                    waiting_for = Some(waiting_for.map_or(arrival, |t: f64| t.min(arrival)));
                    continue;
                }
                if !self.admit(i, step) {
                    continue;
                }
                let c = (goal - self.held[i])
                    .min(self.c_max.saturating_sub(step.tokens))
                    .min(self.p_max.saturating_sub(step.prefill_tokens));
                if c == 0 {
                    continue;
                }
                step.tokens += c;
                step.prefill_tokens += c;
                step.features.add_prefill(c, self.held[i]);
                step.latest_arrival = step.latest_arrival.max(arrival);
                step.entries.push((i, u32::try_from(c).ok()?));
            }
        }
        Some(waiting_for)
    }

    /// Admits request `i` if it is not yet and R and M (whole reservations) allow it.
    fn admit(&mut self, i: usize, step: &mut Step) -> bool {
        if self.admitted[i] {
            return true;
        }
        let need = self.limits.occupied(self.reqs[i].max_kv_tokens());
        if step.running + 1 > self.r_max || step.reserved + need > self.m_max {
            return false;
        }
        self.admitted[i] = true;
        step.running += 1;
        step.reserved += need;
        true
    }

    /// Instead of standing idle until `next`: a chunk of the first prompt in plan order
    /// that has arrived and can be admitted, ending by `next`. Some(false) when there is
    /// none; None when a chunk overflows u32.
    fn idle_chunk(&mut self, step: &mut Step, next: f64) -> Option<bool> {
        let (reqs, held) = (self.reqs, &self.held);
        let idle = IdleGap {
            now: self.now,
            next,
            c_max: self.c_max,
            p_max: self.p_max,
        };
        let chunk = self.by_plan.iter().find_map(|&i| {
            let prompt = u64::from(reqs[i].input_tokens);
            let admissible = self.admitted[i]
                || (step.running < self.r_max
                    && step.reserved + self.limits.occupied(reqs[i].max_kv_tokens()) <= self.m_max);
            (self.generated[i] == 0
                && held[i] < prompt
                && reqs[i].arrival_s <= self.now
                && admissible)
                .then(|| {
                    idle.chunk(self.cost, prompt - held[i], held[i])
                        .map(|c| (i, c))
                })
                .flatten()
        });
        let Some((i, c)) = chunk else {
            return Some(false);
        };
        self.admitted[i] = true;
        step.features.add_prefill(c, self.held[i]);
        step.entries.push((i, u32::try_from(c).ok()?));
        Some(true)
    }

    /// Runs the batch: the clock, the KV held and the tokens generated; its entries.
    fn run(&mut self, step: &Step) -> Batch {
        let start = self.now.max(step.latest_arrival);
        self.now = start + self.cost.batch_time_s(&step.features);
        for &(i, c) in &step.entries {
            self.held[i] += u64::from(c);
            let known = u64::from(self.reqs[i].input_tokens) + u64::from(self.generated[i]);
            if self.held[i] == known {
                self.generated[i] += 1;
                if self.finished(i) {
                    self.held[i] = 0;
                }
            }
        }
        Batch::new(
            step.entries
                .iter()
                .map(|&(i, c)| Entry::process(i as u32, c))
                .collect(),
        )
    }
}

/// Prompt tokens planned by the end of each of `n` phases for a prompt of `input_tokens`
/// with these per-phase shares, completing in `completes` (all of it by then).
fn prompt_targets(
    input_tokens: u32,
    shares: &[f64],
    completes: usize,
    no_chunk: bool,
    n: usize,
) -> Vec<u64> {
    let prompt = u64::from(input_tokens);
    let mut cumulative = 0.0;
    let mut started = false;
    (0..n)
        .map(|p| {
            let share = shares.get(p).copied().unwrap_or(0.0);
            cumulative += share;
            started |= share > 1e-9;
            if p >= completes {
                prompt
            } else if no_chunk {
                if started { prompt } else { 0 }
            } else {
                ((cumulative * prompt as f64).round() as u64).min(prompt)
            }
        })
        .collect()
}

/// Time the plan's schedule would stand idle: from `now` until `next`, when the next planned
/// prompt arrives.
struct IdleGap {
    now: f64,
    next: f64,
    c_max: u64,
    p_max: u64,
}

impl IdleGap {
    /// The most of a prompt's `left` tokens (with `held` already in KV) that one batch of
    /// its chunk alone processes within the gap and the budgets; None when not one token
    /// fits. Batch times grow with the chunk (no coefficient is negative where a plan is
    /// followed; where one is, the chunk found still fits).
    fn chunk(&self, cost: &dyn CostModel, left: u64, held: u64) -> Option<u64> {
        let fits = |c: u64| {
            let mut f = BatchFeatures::default();
            f.add_prefill(c, held);
            self.now + cost.batch_time_s(&f) <= self.next
        };
        let (mut lo, mut hi) = (0u64, left.min(self.c_max).min(self.p_max));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        (lo > 0).then_some(lo)
    }
}

/// The plan a schedule follows: its completion order, and the share of each prompt
/// processed between consecutive completions (refills after evictions do not count: a
/// plan never evicts). A start for [`search_plans`] where no relaxation gives one.
pub(crate) fn plan_of_schedule(w: &Workload, schedule: &Schedule, replay: &Replay) -> PhasePlan {
    let reqs = w.requests();
    let n = reqs.len();
    let mut completes: Vec<usize> = (0..n).collect();
    completes.sort_by(|&a, &b| {
        replay.requests[a]
            .completion_s
            .total_cmp(&replay.requests[b].completion_s)
            .then(a.cmp(&b))
    });
    let ends: Vec<f64> = completes
        .iter()
        .map(|&i| replay.requests[i].completion_s)
        .collect();
    let mut prompt_share = vec![vec![0.0; n]; n];
    let mut prompt_done = vec![0u64; n];
    for (batch, record) in schedule.batches.iter().zip(&replay.batches) {
        // The phase this batch ends in: the first completion at or after its end.
        let phase = ends
            .partition_point(|&e| e < record.end_s)
            .min(n.saturating_sub(1));
        for e in &batch.entries {
            let i = e.request as usize;
            if let (Some(r), infersched_core::Action::Process(c)) = (reqs.get(i), e.action) {
                let prompt = u64::from(r.input_tokens);
                let add = u64::from(c).min(prompt.saturating_sub(prompt_done[i]));
                if add > 0 {
                    prompt_done[i] += add;
                    prompt_share[i][phase] += add as f64 / prompt as f64;
                }
            }
        }
    }
    PhasePlan {
        completes,
        prompt_share,
    }
}

/// `plan` with the requests at completion places `m` and `m2` swapped; each one's prompt
/// shares move with it, keeping their places relative to its completion.
fn swapped(plan: &PhasePlan, m: usize, m2: usize) -> PhasePlan {
    let n = plan.completes.len();
    let mut p = plan.clone();
    p.completes.swap(m, m2);
    for (i, from, to) in [(plan.completes[m], m, m2), (plan.completes[m2], m2, m)] {
        let mut shifted = vec![0.0; n];
        for (q, &x) in plan.prompt_share[i].iter().enumerate() {
            let target = (q as isize + to as isize - from as isize).clamp(0, n as isize - 1);
            shifted[target as usize] += x;
        }
        p.prompt_share[i] = shifted;
    }
    p
}

/// The plans one move from `plan` (see [`search_plans`]), nearest first, made one at a
/// time as they are asked for (a plan is `n^2` shares).
fn neighbours(plan: &PhasePlan) -> impl Iterator<Item = PhasePlan> + '_ {
    let n = plan.completes.len();
    let swaps = (1..=3usize)
        .flat_map(move |gap| (0..n.saturating_sub(gap)).map(move |m| swapped(plan, m, m + gap)));
    let shares = (0..n).flat_map(move |i| {
        let share = &plan.prompt_share[i];
        let phases: Vec<usize> = (0..n).filter(|&q| share[q] > 1e-9).collect();
        // A split prompt whole in its first or its last phase.
        let whole: Vec<usize> = if phases.len() > 1 {
            vec![phases[0], phases[phases.len() - 1]]
        } else {
            Vec::new()
        };
        let whole = whole.into_iter().map(move |q| {
            let mut p = plan.clone();
            p.prompt_share[i] = (0..n).map(|k| if k == q { 1.0 } else { 0.0 }).collect();
            p
        });
        // A phase's share one phase earlier or later, or half of it (a split).
        let moved = phases.into_iter().flat_map(move |q| {
            let to = [q.checked_sub(1), Some(q + 1).filter(|&t| t < n)];
            to.into_iter().flatten().flat_map(move |t| {
                [1.0, 0.5].into_iter().map(move |part| {
                    let mut p = plan.clone();
                    p.prompt_share[i][t] += share[q] * part;
                    p.prompt_share[i][q] -= share[q] * part;
                    p
                })
            })
        });
        whole.chain(moved)
    });
    swaps.chain(shares)
}

/// A plan's schedule, its replay and objective.
struct Found {
    value: f64,
    plan: PhasePlan,
    schedule: Schedule,
    replay: Replay,
}

/// Iterated local search over plans: the schedule of `plan`, then of plans one move away,
/// keeping the first improvement, until no neighbour improves; then a kick (three random
/// swaps of completion places within eight of each other, from a fixed seed) and a descent
/// from there, kept where it ends better; until `evaluations` schedules were tried or
/// `deadline` passes. Moves: two requests up to three places apart swap places in the
/// completion order (their prompt shares go with them), a prompt split over several
/// phases runs whole in its first or its last phase, and a phase's share of a prompt moves,
/// whole or half, to the phase before or after. Returns the best schedule found with its replay and
/// the plans tried, or None when the first plan gives no valid schedule in the class.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search_plans(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    plan: &PhasePlan,
    evaluations: usize,
    deadline: Instant,
) -> Option<(Schedule, Replay, usize)> {
    let mut tried = 0usize;
    let mut evaluate = |p: &PhasePlan| -> Option<Option<Found>> {
        if tried >= evaluations || Instant::now() > deadline {
            return None;
        }
        tried += 1;
        let found = schedule_from_plan(w, limits, cost, class, p).and_then(|schedule| {
            let replay = replay(w, limits, cost, &schedule).ok()?;
            class.admits(w, limits, &schedule).then(|| Found {
                value: objective.of_replay(&replay),
                plan: p.clone(),
                schedule,
                replay,
            })
        });
        Some(found)
    };
    // Descends from `from` by first improvement; None once the budget is spent (with the
    // best point reached so far kept in `from`).
    let descend =
        |from: &mut Found, evaluate: &mut dyn FnMut(&PhasePlan) -> Option<Option<Found>>| {
            'pass: loop {
                let plan = from.plan.clone();
                for p in neighbours(&plan) {
                    let found = evaluate(&p)?;
                    if let Some(f) = found
                        && f.value < from.value * (1.0 - 1e-12)
                    {
                        *from = f;
                        continue 'pass;
                    }
                }
                return Some(());
            }
        };
    let mut best = evaluate(plan)??;
    let n = plan.completes.len();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    if descend(&mut best, &mut evaluate).is_some() && n >= 2 {
        loop {
            let mut kicked = best.plan.clone();
            for _ in 0..3 {
                let m = rng.random_range(0..n);
                let m2 = rng.random_range(m.saturating_sub(8)..(m + 9).min(n));
                if m != m2 {
                    kicked = swapped(&kicked, m, m2);
                }
            }
            let Some(found) = evaluate(&kicked) else {
                break;
            };
            let Some(mut current) = found else {
                continue;
            };
            let finished = descend(&mut current, &mut evaluate).is_none();
            if current.value < best.value * (1.0 - 1e-12) {
                best = current;
            }
            if finished {
                break;
            }
        }
    }
    Some((best.schedule, best.replay, tried))
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Summary;
    use infersched_test_kit::workload;

    fn cost() -> infersched_cost_model::LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    #[test]
    fn the_plan_splits_a_long_prompt_around_a_short_request() {
        // A long prompt at 0, a short request 10 ms later. The plan: the short one completes
        // first; half the long prompt before it, half after.
        let w = workload(&[(2000, 3, 0.0), (10, 3, 0.010)]);
        let limits = Limits::unlimited();
        let plan = PhasePlan {
            completes: vec![1, 0],
            prompt_share: vec![vec![0.5, 0.5], vec![1.0, 0.0]],
        };
        let s = schedule_from_plan(&w, &limits, &cost(), &PolicyConstraints::default(), &plan)
            .expect("a schedule");
        let r = replay(&w, &limits, &cost(), &s).expect("valid");
        // Batch 0: the first 1,000 prompt tokens; then the short prompt (with nothing of the
        // long one, which is planned after it), its two decodes, then the rest.
        let batches: Vec<String> = s.batches.iter().map(ToString::to_string).collect();
        assert_eq!(batches[..5], ["0:1000", "1:10", "1:1", "1:1", "0:1000"]);
        assert!(r.requests[1].completion_s < r.requests[0].first_token_s);
        assert_eq!(Summary::from_replay(&r).requests, 2);
    }

    #[test]
    fn the_machine_works_on_an_arrived_prompt_until_the_planned_one_arrives() {
        // A long prompt at 0, a short request 50 ms later, planned first: the long prompt is
        // planned after it, and nothing planned can run before 50 ms. A chunk of the long
        // prompt fills the gap, ending by the arrival, and the short request still starts
        // on its arrival.
        let w = workload(&[(2000, 3, 0.0), (10, 3, 0.050)]);
        let limits = Limits::unlimited();
        let plan = PhasePlan {
            completes: vec![1, 0],
            prompt_share: vec![vec![0.0, 1.0], vec![1.0, 0.0]],
        };
        let s = schedule_from_plan(&w, &limits, &cost(), &PolicyConstraints::default(), &plan)
            .expect("a schedule");
        let r = replay(&w, &limits, &cost(), &s).expect("valid");
        let first = &s.batches[0].entries;
        assert_eq!((first.len(), first[0].request), (1, 0));
        let chunk = match first[0].action {
            infersched_core::Action::Process(c) => c,
            other => panic!("a prompt chunk, got {other:?}"),
        };
        assert!(chunk > 0 && chunk < 2000, "a part of the prompt: {chunk}");
        // As much as fits: one more token would run past the arrival.
        let mut more = BatchFeatures::default();
        more.add_prefill(u64::from(chunk) + 1, 0);
        assert!(cost().batch_time_s(&more) > 0.050);
        assert!(r.batches[0].end_s <= 0.050 + 1e-12);
        assert_eq!(r.requests[1].first_scheduled_s, 0.050);
        assert!(r.requests[1].completion_s < r.requests[0].first_token_s);
        // Without the gap's chunk the long prompt would start after the short request's
        // last token; with it, it completes earlier by about the chunk's work.
        let alone = LinearCostModel::batch_time_s(&cost(), &{
            let mut f = BatchFeatures::default();
            f.add_prefill(2000, 0);
            f
        });
        assert!(r.requests[0].first_token_s < r.requests[1].completion_s + alone);
    }

    #[test]
    fn a_plan_that_overfills_memory_waits_and_stays_valid() {
        // Three requests at 0 planned together; M fits two prompts at a time.
        let w = workload(&[(40, 4, 0.0), (40, 4, 0.0), (40, 4, 0.0)]);
        let limits = Limits {
            kv_capacity: Some(90),
            token_budget: Some(64),
            ..Limits::unlimited()
        };
        let plan = PhasePlan {
            completes: vec![0, 1, 2],
            prompt_share: vec![vec![1.0, 0.0, 0.0]; 3],
        };
        let s = schedule_from_plan(&w, &limits, &cost(), &PolicyConstraints::default(), &plan)
            .expect("a schedule");
        let r = replay(&w, &limits, &cost(), &s).expect("valid under M and C");
        assert!(
            r.batches
                .iter()
                .all(|b| b.kv_tokens <= 90 && b.features.tokens <= 64)
        );
        assert!(r.requests.iter().all(|q| q.evictions == 0));
    }

    #[test]
    fn the_plan_search_moves_the_short_request_first_and_never_gets_worse() {
        // The plan serves the long prompt first; finishing the short request first is
        // better for mean latency, one swap away.
        let w = workload(&[(2000, 3, 0.0), (10, 3, 0.0)]);
        let limits = Limits::unlimited();
        let plan = PhasePlan {
            completes: vec![0, 1],
            prompt_share: vec![vec![1.0, 0.0], vec![0.0, 1.0]],
        };
        let class = PolicyConstraints::default();
        let first = schedule_from_plan(&w, &limits, &cost(), &class, &plan).unwrap();
        let mean = |s: &Schedule| {
            Objective::MeanLatency.of(&Summary::from_replay(
                &replay(&w, &limits, &cost(), s).unwrap(),
            ))
        };
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let (found, r, tried) = search_plans(
            &w,
            &limits,
            &cost(),
            Objective::MeanLatency,
            &class,
            &plan,
            100,
            far,
        )
        .expect("a schedule");
        assert!(tried > 1);
        assert!(
            mean(&found) < mean(&first) * 0.9,
            "{} vs {}",
            mean(&found),
            mean(&first)
        );
        assert!(r.requests[1].completion_s < r.requests[0].first_token_s);
        // The same search again: the same schedule (deterministic).
        let (again, _, _) = search_plans(
            &w,
            &limits,
            &cost(),
            Objective::MeanLatency,
            &class,
            &plan,
            100,
            far,
        )
        .unwrap();
        assert_eq!(found, again);
        // With one evaluation it returns the plan's own schedule.
        let (only, _, tried) = search_plans(
            &w,
            &limits,
            &cost(),
            Objective::MeanLatency,
            &class,
            &plan,
            1,
            far,
        )
        .unwrap();
        assert_eq!((only, tried), (first, 1));
    }

    #[test]
    fn a_schedules_own_plan_gives_that_schedule_back() {
        // Half the long prompt, the short request whole and its decodes, then the rest.
        let w = workload(&[(2000, 3, 0.0), (10, 3, 0.010)]);
        let limits = Limits::unlimited();
        let s = Schedule::new(
            [
                (0, 1000),
                (1, 10),
                (1, 1),
                (1, 1),
                (0, 1000),
                (0, 1),
                (0, 1),
            ]
            .into_iter()
            .map(|(i, c)| Batch::new(vec![Entry::process(i, c)]))
            .collect(),
        );
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        let plan = plan_of_schedule(&w, &s, &r);
        assert_eq!(plan.completes, [1, 0]);
        assert_eq!(plan.prompt_share, [vec![0.5, 0.5], vec![1.0, 0.0]]);
        let again =
            schedule_from_plan(&w, &limits, &cost(), &PolicyConstraints::default(), &plan).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn classes_it_does_not_model_give_no_schedule() {
        let w = workload(&[(10, 2, 0.0)]);
        let plan = PhasePlan {
            completes: vec![0],
            prompt_share: vec![vec![1.0]],
        };
        for class in [
            PolicyConstraints {
                reserve: true,
                ..PolicyConstraints::default()
            },
            PolicyConstraints {
                no_mix: true,
                ..PolicyConstraints::default()
            },
        ] {
            assert!(schedule_from_plan(&w, &Limits::unlimited(), &cost(), &class, &plan).is_none());
        }
    }
}
