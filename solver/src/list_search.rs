//! Priority-list local search (milp.md, "Schedules that scale"): better schedules than the
//! heuristics' for workloads no exact model fits, in time linear in the schedule per try.
//!
//! A [`PriorityList`] schedule is fixed by three things: a priority order of the requests,
//! a cap on the prefill tokens of one batch (the chunk), and a cap on the running set.
//! Every step it goes through the arrived requests in priority order: a running request
//! that is decode-ready decodes, one with prompt left gets as much of it as the budgets
//! (C, P and the chunk cap) leave, and a waiting one is admitted with its whole `I + O - 1`
//! reserved (Orca's reservation, so nothing is ever evicted) while that fits M and the
//! running cap; the first that does not fit closes admission for the step. A high-priority
//! arrival thus pauses the prompts of lower ones at the next step (their KV stays held),
//! which is how the shortest-first schedules that mean latency rewards are reached.
//!
//! The search starts from the best heuristic schedule of the portfolio and from orders by
//! arrival, by minimum work, by `I + O`, by `O`, by `I` and by the heuristic's own
//! admission and completion orders, under chunk caps in powers of two; it then moves one
//! request at a time to another place in the order (first improvement, nearest places
//! first) and retunes the caps, until a pass improves nothing or the evaluation budget is
//! spent. Every try is simulated and replayed under the problem's limits and checked to be
//! in the policy class; the result is never worse than the start (the start is kept when
//! nothing beats it). The budget is a count of tries, so the result is deterministic; the
//! deadline only stops a search that would overrun the solve's time limit.

use crate::store::Incumbent;
use crate::{Objective, PolicyConstraints, bounds};
use infersched_core::{Feature, Limits, Workload, replay};
use infersched_cost_model::LinearCostModel;
use infersched_schedulers::{Policy, SimError, Simulator, simulate};
use std::time::Instant;

/// A list schedule: requests served in a fixed priority order (module documentation).
#[derive(Debug, Clone)]
pub struct PriorityList {
    /// Each request's place in the order (0 first).
    rank: Vec<u32>,
    /// Prompt tokens one batch may take.
    chunk_cap: u64,
    /// Prompt tokens a batch may take once a higher-priority request decodes in it (they
    /// delay that decode).
    decode_chunk_cap: u64,
    /// Requests that may hold KV at once (on top of R_max).
    max_running: u64,
    /// Each prompt in one batch (no chunking).
    whole_prompts: bool,
    /// A waiting request that gets no tokens also closes admission (keeps admission in
    /// priority order, e.g. FCFS).
    strict_admission: bool,
    /// Order by remaining work first (the order breaking ties): seconds per prompt token,
    /// per prompt token and token of context, per decode step, per decode step and token
    /// of context.
    remaining_work: Option<[f64; 4]>,
    /// Running requests come before every waiting one (admitted work is never paused).
    running_first: bool,
    /// The waiting requests by priority (see [`Self::key`]).
    queue: std::collections::BTreeSet<(u64, u32, u32)>,
    /// Whether a request has joined `queue`.
    queued: Vec<bool>,
    /// Scratch: the running requests' keys, sorted every step.
    ranked_running: Vec<(u64, u32, u32)>,
}

impl PriorityList {
    /// Requests in `order` (first = highest priority), at most `chunk_cap` prompt tokens
    /// per batch, `decode_chunk_cap` once a higher-priority request decodes in the batch,
    /// and `max_running` requests holding KV.
    pub fn new(order: &[u32], chunk_cap: u64, decode_chunk_cap: u64, max_running: u64) -> Self {
        let mut rank = vec![0u32; order.len()];
        for (place, &i) in order.iter().enumerate() {
            rank[i as usize] = place as u32;
        }
        Self {
            rank,
            chunk_cap: chunk_cap.max(1),
            decode_chunk_cap,
            max_running: max_running.max(1),
            whole_prompts: false,
            strict_admission: false,
            remaining_work: None,
            running_first: false,
            queue: std::collections::BTreeSet::new(),
            queued: vec![false; order.len()],
            ranked_running: Vec::new(),
        }
    }

    /// Processes every prompt in one batch.
    pub fn whole_prompts(mut self, yes: bool) -> Self {
        self.whole_prompts = yes;
        self
    }

    /// Admits strictly in priority order (a request that gets no tokens closes admission).
    pub fn strict_admission(mut self, yes: bool) -> Self {
        self.strict_admission = yes;
        self
    }

    /// Puts every running request before every waiting one (admitted work is never
    /// paused for a new arrival, as in MC-SF and vLLM).
    pub fn running_first(mut self, yes: bool) -> Self {
        self.running_first = yes;
        self
    }

    /// Serves the request with the least remaining work first every step (shortest
    /// remaining processing time, with the work estimated from `cost` alone on the GPU);
    /// the order breaks ties.
    pub fn shortest_remaining_first(mut self, cost: &LinearCostModel) -> Self {
        let t = |f| cost.theta(f);
        self.remaining_work = Some([
            t(Feature::Tokens),
            t(Feature::PrefillAttn),
            t(Feature::One) + t(Feature::HasDecode) + t(Feature::Tokens) + t(Feature::NDecode),
            t(Feature::DecodeKv),
        ]);
        self
    }

    /// The work `i` has left, by the estimate of [`Self::shortest_remaining_first`].
    fn work_left(sim: &Simulator<'_>, coef: &[f64; 4], i: u32) -> f64 {
        let r = sim.request(i);
        let known = sim.known(i) as f64;
        let prompt_left = sim.remaining(i).saturating_sub(1) as f64;
        let steps_left = f64::from(r.output_tokens - sim.generated(i));
        prompt_left * (coef[0] + coef[1] * known) + steps_left * (coef[2] + coef[3] * known)
    }
}

impl Policy for PriorityList {
    fn name(&self) -> String {
        "priority-list".into()
    }

    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        let limits = sim.limits();
        let budget = limits
            .token_budget
            .unwrap_or(u64::MAX)
            .min(limits.effective_prefill_budget().unwrap_or(u64::MAX));
        for i in 0..sim.requests().len() as u32 {
            let r = sim.request(i);
            let reason = if self.rank.len() != sim.requests().len() {
                Some("the priority order does not cover the workload".to_string())
            } else if sim.blocks_for(r.max_kv_tokens()) > sim.total_blocks() {
                Some(format!(
                    "its reservation of {} KV tokens does not fit M",
                    r.max_kv_tokens()
                ))
            } else if self.whole_prompts && u64::from(r.input_tokens) > budget {
                Some(format!(
                    "its prompt of {} tokens does not fit one batch",
                    r.input_tokens
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(SimError::Unservable {
                    policy: self.name(),
                    request: i,
                    reason,
                });
            }
        }
        Ok(())
    }

    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        self.sync_queue(sim);
        self.ranked_running.clear();
        for &i in sim.running() {
            let key = self.key(sim, i);
            self.ranked_running.push(key);
        }
        self.ranked_running.sort_unstable();
        let mut running_count = sim.running().len() as u64;
        let mut prefill_left = if self.whole_prompts {
            u64::MAX
        } else {
            self.chunk_cap
        };
        let mut admitting = true;
        let mut admitted = Vec::new();
        let mut waiting = self.queue.iter().peekable();
        let mut next_running = 0;
        // Running and waiting requests merged in priority order; waiting ones only while
        // admission is open.
        while sim.token_room() > 0 {
            let running_first = match (
                self.ranked_running.get(next_running),
                waiting.peek().filter(|_| admitting),
            ) {
                (Some(r), Some(w)) => self.running_first || r < *w,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if running_first {
                let i = self.ranked_running[next_running].2;
                next_running += 1;
                if sim.is_decode_ready(i) {
                    let target = sim.held(i) + 1;
                    if sim.extra_blocks(i, target) <= sim.free_blocks() {
                        sim.process(i, 1, target);
                        // Lower-priority prompts now delay this decode: cap them.
                        if !self.whole_prompts {
                            prefill_left = prefill_left.min(self.decode_chunk_cap);
                        }
                    }
                } else {
                    let c = self.chunk(sim, i, prefill_left);
                    if c > 0 {
                        let target = sim.held(i) + c;
                        sim.process(i, c, target);
                        prefill_left -= c;
                    }
                }
                continue;
            }
            let Some(&key) = waiting.next() else {
                break;
            };
            let i = key.2;
            let c = self.chunk(sim, i, prefill_left);
            if c == 0 {
                // With no prompt room left at all, no later waiting request gets a token
                // either: stop scanning the queue (the schedule is the same, and a long
                // queue is not walked at every decode step).
                let room = prefill_left.min(sim.token_room()).min(sim.prefill_room());
                admitting = !self.strict_admission && room > 0;
                continue;
            }
            let reservation = sim.request(i).max_kv_tokens();
            if !sim.running_room()
                || running_count >= self.max_running
                || sim.extra_blocks(i, reservation) > sim.free_blocks()
            {
                admitting = false;
                continue;
            }
            sim.admit(i);
            sim.process(i, c, reservation);
            running_count += 1;
            prefill_left -= c;
            admitted.push(key);
        }
        for key in admitted {
            self.queue.remove(&key);
        }
    }
}

impl PriorityList {
    /// Prompt tokens `i` gets now: as many as the budgets and `prefill_left` allow (all or
    /// nothing for whole prompts).
    fn chunk(&self, sim: &Simulator<'_>, i: u32, prefill_left: u64) -> u64 {
        let need = sim.remaining(i);
        let c = need
            .min(sim.token_room())
            .min(sim.prefill_room())
            .min(prefill_left);
        if self.whole_prompts && c < need { 0 } else { c }
    }

    /// `i`'s place in the priority order: (remaining work as ordered bits, or 0; rank; id).
    fn key(&self, sim: &Simulator<'_>, i: u32) -> (u64, u32, u32) {
        // The work is finite and >= 0, so its bits sort as it does.
        let work = self.remaining_work.as_ref().map_or(0, |coef| {
            (Self::work_left(sim, coef, i).max(0.0) + 0.0).to_bits()
        });
        (work, self.rank[i as usize], i)
    }

    /// Brings `queue` in step with the simulator's waiting queue: nothing is ever evicted,
    /// so it only gains arrivals, at its back.
    fn sync_queue(&mut self, sim: &Simulator<'_>) {
        for &i in sim.waiting().iter().rev() {
            if self.queued[i as usize] {
                break;
            }
            self.queued[i as usize] = true;
            let key = self.key(sim, i);
            self.queue.insert(key);
        }
    }
}

/// How much the search may do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchBudget {
    /// Schedules simulated and replayed, at most.
    pub evaluations: usize,
    /// Stop (keeping the best so far) at this instant.
    pub deadline: Instant,
}

/// The starting orders tried, with their names.
fn starting_orders(
    w: &Workload,
    cost: &LinearCostModel,
    start: &Incumbent,
    class: &PolicyConstraints,
) -> Vec<(&'static str, Vec<u32>)> {
    let fcfs = w.fcfs_order();
    if class.fcfs {
        return vec![("arrival", fcfs)];
    }
    let reqs = w.requests();
    // Stable sorts of the FCFS order: ties keep arrival order.
    let by = |key: &dyn Fn(usize) -> f64| {
        let mut v = fcfs.clone();
        v.sort_by(|&a, &b| key(a as usize).total_cmp(&key(b as usize)));
        v
    };
    let by_record = |key: &dyn Fn(&infersched_core::RequestRecord) -> f64| {
        by(&|i| key(&start.replay.requests[i]))
    };
    vec![
        ("arrival", fcfs.clone()),
        ("work", by(&|i| bounds::request_min_work(cost, &reqs[i]))),
        ("tokens", by(&|i| reqs[i].max_kv_tokens() as f64)),
        ("output", by(&|i| f64::from(reqs[i].output_tokens))),
        ("input", by(&|i| f64::from(reqs[i].input_tokens))),
        ("start-admission", by_record(&|r| r.first_scheduled_s)),
        ("start-completion", by_record(&|r| r.completion_s)),
    ]
}

/// The most prompt tokens one batch can take: C, P and the longest prompt (at least 1).
pub fn largest_chunk(w: &Workload, limits: &Limits) -> u64 {
    let largest_prompt = w
        .requests()
        .iter()
        .map(|r| u64::from(r.input_tokens))
        .max()
        .unwrap_or(1);
    limits
        .token_budget
        .unwrap_or(u64::MAX)
        .min(limits.effective_prefill_budget().unwrap_or(u64::MAX))
        .min(largest_prompt)
        .max(1)
}

/// Chunk caps tried: powers of two from the block size (or 16) below the batch budget,
/// and the budget itself; one "no cap" without C or P.
fn chunk_caps(w: &Workload, limits: &Limits, class: &PolicyConstraints) -> Vec<u64> {
    let budget = largest_chunk(w, limits);
    if class.no_chunk {
        return vec![budget];
    }
    let mut caps = Vec::new();
    let mut c = u64::from(limits.block_size).max(16);
    while c < budget {
        caps.push(c);
        c *= 2;
    }
    caps.push(budget);
    caps
}

/// Running-set caps tried: R_max (or every request) first, then the portfolio's smaller
/// caps (1, 2, 3, 4, 6, 8, 12, ...: powers of two and their halfway points).
fn running_caps(w: &Workload, limits: &Limits) -> Vec<u64> {
    let top = limits
        .max_running
        .unwrap_or(w.len() as u64)
        .min(w.len() as u64)
        .max(1);
    let mut caps = vec![top];
    let mut c = 1;
    while c < top {
        caps.push(c);
        if c >= 2 && c + c / 2 < top {
            caps.push(c + c / 2);
        }
        c *= 2;
    }
    caps
}

/// One candidate: order, chunk caps, running cap.
#[derive(Debug, Clone)]
struct Candidate {
    order: Vec<u32>,
    chunk_cap: u64,
    decode_chunk_cap: u64,
    max_running: u64,
    /// Shortest remaining work first (the order breaking ties).
    shortest_remaining: bool,
    /// Running requests before waiting ones.
    running_first: bool,
}

/// The search's state: the problem and the best found so far.
struct Search<'a> {
    w: &'a Workload,
    limits: &'a Limits,
    cost: &'a LinearCostModel,
    objective: Objective,
    class: &'a PolicyConstraints,
    budget: SearchBudget,
    evaluations: usize,
    best: Option<(f64, Candidate, Incumbent)>,
    /// The best candidate with a static order (the one single moves change).
    best_static: Option<(f64, Candidate)>,
}

impl Search<'_> {
    fn exhausted(&self) -> bool {
        self.evaluations >= self.budget.evaluations || Instant::now() >= self.budget.deadline
    }

    /// Simulates and replays `cand`; returns its objective (infinite when it is not a valid
    /// schedule of the class) and keeps it if it is the best so far.
    fn evaluate(&mut self, cand: &Candidate) -> f64 {
        self.evaluations += 1;
        let sim_limits = Limits {
            watermark: 0.0,
            ..*self.limits
        };
        let mut policy = PriorityList::new(
            &cand.order,
            cand.chunk_cap,
            cand.decode_chunk_cap,
            cand.max_running,
        )
        .whole_prompts(self.class.no_chunk)
        .strict_admission(self.class.fcfs);
        if cand.shortest_remaining {
            policy = policy.shortest_remaining_first(self.cost);
        }
        policy = policy.running_first(cand.running_first);
        let Ok(sim) = simulate(self.w, &sim_limits, &mut policy, self.cost) else {
            return f64::INFINITY;
        };
        let Ok(r) = replay(self.w, self.limits, self.cost, &sim.schedule) else {
            return f64::INFINITY;
        };
        if !self.class.admits(self.w, self.limits, &sim.schedule) {
            return f64::INFINITY;
        }
        let v = self.objective.of_replay(&r);
        if !cand.shortest_remaining && self.best_static.as_ref().is_none_or(|b| v < b.0) {
            self.best_static = Some((v, cand.clone()));
        }
        if self.best.as_ref().is_none_or(|b| v < b.0) {
            self.best = Some((
                v,
                cand.clone(),
                Incumbent {
                    name: String::new(),
                    schedule: sim.schedule,
                    replay: r,
                },
            ));
        }
        v
    }

    fn best_value(&self) -> f64 {
        self.best.as_ref().map_or(f64::INFINITY, |b| b.0)
    }

    fn best_candidate(&self) -> Option<Candidate> {
        self.best.as_ref().map(|b| b.1.clone())
    }

    /// Tries every value of each knob in turn on the best candidate (the others kept);
    /// whether one improved.
    fn retune_caps(&mut self, chunks: &[u64], decode_chunks: &[u64], runnings: &[u64]) -> bool {
        let before = self.best_value();
        for knob in 0..5 {
            let Some(base) = self.best_candidate() else {
                return false;
            };
            let values = match knob {
                0 => chunks,
                1 => decode_chunks,
                2 => runnings,
                _ => &[0, 1],
            };
            for &v in values {
                if self.exhausted() {
                    return self.best_value() < before;
                }
                let mut cand = base.clone();
                let mut srpt = u64::from(cand.shortest_remaining);
                let mut running_first = u64::from(cand.running_first);
                let slot = match knob {
                    0 => &mut cand.chunk_cap,
                    1 => &mut cand.decode_chunk_cap,
                    2 => &mut cand.max_running,
                    3 => &mut srpt,
                    _ => &mut running_first,
                };
                if *slot == v {
                    continue;
                }
                *slot = v;
                cand.shortest_remaining = srpt == 1;
                cand.running_first = running_first == 1;
                self.evaluate(&cand);
            }
        }
        self.best_value() < before
    }

    /// One pass of single moves over the best order (first improvement, nearest places
    /// first); whether one improved.
    fn move_pass(&mut self) -> bool {
        let Some((mut base_value, mut base)) = self.best_static.clone() else {
            return false;
        };
        let n = base.order.len();
        let mut improved = false;
        for distance in 1..n {
            for from in 0..n {
                for to in [from.checked_sub(distance), from.checked_add(distance)] {
                    let Some(to) = to.filter(|&t| t < n) else {
                        continue;
                    };
                    if self.exhausted() {
                        return improved;
                    }
                    let mut order = base.order.clone();
                    let i = order.remove(from);
                    order.insert(to, i);
                    let cand = Candidate { order, ..base };
                    let v = self.evaluate(&cand);
                    if v < base_value {
                        improved = true;
                        (base_value, base) = (v, cand);
                    }
                }
            }
        }
        improved
    }
}

/// The best schedule the priority-list search reaches from `start` (which it returns
/// unchanged when nothing beats it), and the number of schedules tried.
pub(crate) fn improve(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    start: Incumbent,
    budget: SearchBudget,
) -> (Incumbent, usize) {
    if class.no_mix || w.is_empty() {
        return (start, 0);
    }
    let start_value = start.objective_value(objective);
    let chunks = chunk_caps(w, limits, class);
    let runnings = running_caps(w, limits);
    let mut search = Search {
        w,
        limits,
        cost,
        objective,
        class,
        budget,
        evaluations: 0,
        best: None,
        best_static: None,
    };
    // Decode chunk caps: none, or one of the chunk caps.
    let decode_chunks: Vec<u64> = std::iter::once(0).chain(chunks.iter().copied()).collect();
    let mut starts: Vec<(&'static str, Vec<u32>, bool)> = starting_orders(w, cost, &start, class)
        .into_iter()
        .map(|(name, order)| (name, order, false))
        .collect();
    if !class.fcfs {
        starts.push(("shortest-remaining", w.fcfs_order(), true));
    }
    let mut from = "";
    'start: for (name, order, shortest_remaining) in &starts {
        for &chunk_cap in &chunks {
            for (decode_chunk_cap, running_first) in
                [(0, false), (chunk_cap, false), (chunk_cap, true)]
            {
                if search.exhausted() {
                    break 'start;
                }
                let before = search.best_value();
                search.evaluate(&Candidate {
                    order: order.clone(),
                    chunk_cap,
                    decode_chunk_cap,
                    max_running: runnings[0],
                    shortest_remaining: *shortest_remaining,
                    running_first,
                });
                if search.best_value() < before {
                    from = name;
                }
            }
        }
    }
    loop {
        let retuned = search.retune_caps(&chunks, &decode_chunks, &runnings);
        let moved = !class.fcfs && search.move_pass();
        if search.exhausted() || (!moved && !retuned) {
            break;
        }
    }
    let evaluations = search.evaluations;
    match search.best {
        Some((v, cand, mut found)) if v < start_value => {
            found.name = format!(
                "{} improved by priority-list(from={from}, chunk={}, decode-chunk={}, max-running={}, shortest-remaining={}, running-first={}, tries={evaluations})",
                start.name,
                cand.chunk_cap,
                cand.decode_chunk_cap,
                cand.max_running,
                cand.shortest_remaining,
                cand.running_first,
            );
            (found, evaluations)
        }
        _ => (start, evaluations),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Action;
    use infersched_test_kit::workload;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn cost() -> LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    fn random_workload(rng: &mut ChaCha8Rng, n: usize) -> Workload {
        let requests: Vec<(u32, u32, f64)> = (0..n)
            .map(|_| {
                (
                    rng.random_range(1..200),
                    rng.random_range(1..20),
                    f64::from(rng.random_range(0..5u32)) * 0.01,
                )
            })
            .collect();
        workload(&requests)
    }

    fn limits(m: u64, c: u64) -> Limits {
        Limits {
            kv_capacity: Some(m),
            token_budget: Some(c),
            block_size: 16,
            ..Limits::unlimited()
        }
    }

    #[test]
    fn list_schedules_are_valid_and_never_evict() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let cost = cost();
        for _ in 0..200 {
            let n = rng.random_range(1..12);
            let w = random_workload(&mut rng, n);
            let l = limits(rng.random_range(240..1200), rng.random_range(16..300));
            let mut order: Vec<u32> = (0..n as u32).collect();
            for k in (1..n).rev() {
                order.swap(k, rng.random_range(0..=k));
            }
            let mut p = PriorityList::new(
                &order,
                rng.random_range(1..300),
                rng.random_range(0..64),
                rng.random_range(1..6),
            )
            .whole_prompts(false)
            .running_first(rng.random_bool(0.5));
            if rng.random_bool(0.5) {
                p = p.shortest_remaining_first(&cost);
            }
            let sim = simulate(&w, &l, &mut p, &cost).unwrap();
            let r = replay(&w, &l, &cost, &sim.schedule)
                .unwrap_or_else(|e| panic!("{w:?} {l:?} {order:?}: {e}"));
            assert!(r.requests.iter().all(|q| q.evictions == 0));
            // Orca's reservation holds, so the schedule is in the `reserve` class.
            let reserve = PolicyConstraints {
                reserve: true,
                no_evict: true,
                ..PolicyConstraints::default()
            };
            assert!(reserve.admits(&w, &l, &sim.schedule));
        }
    }

    #[test]
    fn one_at_a_time_follows_the_order() {
        // Offline, one running request, whole prompts: completions in priority order.
        let w = workload(&[(50, 3, 0.0), (10, 2, 0.0), (30, 4, 0.0), (20, 1, 0.0)]);
        let cost = cost();
        let order = [2, 0, 3, 1];
        let mut p = PriorityList::new(&order, u64::MAX, u64::MAX, 1).whole_prompts(true);
        let sim = simulate(&w, &Limits::unlimited(), &mut p, &cost).unwrap();
        let r = replay(&w, &Limits::unlimited(), &cost, &sim.schedule).unwrap();
        let mut by_completion: Vec<u32> = (0..4).collect();
        by_completion.sort_by(|&a, &b| {
            r.requests[a as usize]
                .completion_s
                .total_cmp(&r.requests[b as usize].completion_s)
        });
        assert_eq!(by_completion, order);
        // Every prompt in one entry.
        assert_eq!(
            sim.schedule
                .batches
                .iter()
                .flat_map(|b| &b.entries)
                .filter(|e| matches!(e.action, Action::Process(c) if c > 1))
                .count(),
            4
        );
    }

    #[test]
    fn a_short_arrival_pauses_a_long_prompt_at_the_next_chunk() {
        // A 1,000-token prompt in chunks of 100; a short request arrives during the first
        // chunk. Shortest remaining first serves it next (its prompt first, the long
        // prompt the rest of the chunk), then its decodes with no prompt tokens beside them
        // (decode chunk 0).
        let w = workload(&[(1000, 2, 0.0), (8, 3, 0.001)]);
        let cost = cost();
        let mut p = PriorityList::new(&[0, 1], 100, 0, 8).shortest_remaining_first(&cost);
        let sim = simulate(&w, &Limits::unlimited(), &mut p, &cost).unwrap();
        let b = &sim.schedule.batches;
        assert_eq!(b[0].entries, vec![infersched_core::Entry::process(0, 100)]);
        assert_eq!(
            b[1].entries,
            vec![
                infersched_core::Entry::process(1, 8),
                infersched_core::Entry::process(0, 92)
            ]
        );
        // Its two decodes run alone, then the long prompt resumes.
        assert_eq!(b[2].entries, vec![infersched_core::Entry::process(1, 1)]);
        assert_eq!(b[3].entries, vec![infersched_core::Entry::process(1, 1)]);
        assert_eq!(b[4].entries, vec![infersched_core::Entry::process(0, 100)]);
        // Static order with the long one first: it keeps its chunks, the short one gets
        // the prompt budget left (none) and waits.
        let mut p = PriorityList::new(&[0, 1], 100, 0, 8);
        let sim = simulate(&w, &Limits::unlimited(), &mut p, &cost).unwrap();
        assert!(
            sim.schedule.batches[..10]
                .iter()
                .all(|b| b.entries == vec![infersched_core::Entry::process(0, 100)])
        );
    }

    fn heuristic(w: &Workload, l: &Limits, objective: Objective) -> Incumbent {
        crate::portfolio::best_heuristic(
            w,
            l,
            &cost(),
            objective,
            &PolicyConstraints::default(),
            &[],
            far_future(),
        )
        .unwrap()
    }

    fn far_future() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    fn budget(evaluations: usize) -> SearchBudget {
        SearchBudget {
            evaluations,
            deadline: Instant::now() + std::time::Duration::from_secs(3600),
        }
    }

    #[test]
    fn the_search_never_returns_worse_than_its_start_and_is_deterministic() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let cost = cost();
        let mut improved = 0;
        for _ in 0..20 {
            let n = rng.random_range(2..10);
            let w = random_workload(&mut rng, n);
            let l = limits(rng.random_range(240..1200), rng.random_range(16..300));
            for objective in [Objective::Makespan, Objective::MeanLatency] {
                let start = heuristic(&w, &l, objective);
                let start_name = start.name.clone();
                let before = start.objective_value(objective);
                let class = PolicyConstraints::default();
                let (found, tries) =
                    improve(&w, &l, &cost, objective, &class, start.clone(), budget(300));
                assert!(tries <= 300);
                // The returned schedule is replayed, not taken from the search.
                let r = replay(&w, &l, &cost, &found.schedule).unwrap();
                let after = objective.of_replay(&r);
                assert!(after <= before, "{w:?}: {after} > {before}");
                if after < before {
                    improved += 1;
                    assert!(
                        found
                            .name
                            .starts_with(&format!("{} improved by priority-list(", start_name)),
                        "{}",
                        found.name
                    );
                }
                let (again, _) = improve(&w, &l, &cost, objective, &class, start, budget(300));
                assert_eq!(again.schedule, found.schedule);
            }
        }
        // The search is not idle: it beats the portfolio on some of these.
        assert!(improved >= 5, "improved {improved} of 40");
    }

    #[test]
    fn the_search_keeps_to_the_policy_class() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let cost = cost();
        for class in [
            PolicyConstraints {
                fcfs: true,
                ..PolicyConstraints::default()
            },
            PolicyConstraints {
                no_chunk: true,
                ..PolicyConstraints::default()
            },
        ] {
            for _ in 0..10 {
                let n = rng.random_range(2..8);
                let w = random_workload(&mut rng, n);
                let l = limits(rng.random_range(400..1200), rng.random_range(200..400));
                let start = crate::portfolio::best_heuristic(
                    &w,
                    &l,
                    &cost,
                    Objective::MeanLatency,
                    &class,
                    &[],
                    far_future(),
                );
                let Some(start) = start else { continue };
                let (found, _) = improve(
                    &w,
                    &l,
                    &cost,
                    Objective::MeanLatency,
                    &class,
                    start,
                    budget(200),
                );
                assert!(class.admits(&w, &l, &found.schedule), "{class:?} {w:?}");
            }
        }
    }
}
