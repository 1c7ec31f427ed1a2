//! An exact search for offline workloads made of a few classes of identical requests, used
//! before the MILP when it applies (milp.md, "the counting search").
//!
//! When chunked prefill never helps ([`crate::dominance`]: offline, no C, no P, no FCFS),
//! each request lives on the few states of its no-chunk graph (not started, after each
//! generated token, evicted after each, finished). Requests of a class are
//! interchangeable, so the system's state is how many requests of each class sit in each
//! state, and a batch is a transition between such count vectors whose cost depends only on
//! how many requests take each arc. The optimum is then a shortest path over count vectors:
//! for `makespan` a batch costs its duration; for `mean-latency` (`mean-ttft`) its duration
//! times the requests not yet finished (without a first token), over n. A* with an
//! admissible estimate (module `estimate`: own remaining work, batch counts and pattern
//! prices; for the means, the positions of the requests still to be done) returns a proven
//! optimum, or shows that nothing beats the best schedule known before it (the
//! incumbent), or gives up past a state budget, the memory limit or a deadline.
//!
//! Modules: `store` keeps the count vectors reached, `batches` enumerates the batches from
//! one, `estimate` bounds what is left.

mod batches;
mod estimate;
pub(crate) mod pooled;
mod store;

use std::collections::{BinaryHeap, HashMap};

use infersched_core::{Batch, Entry, Feature, Limits, Schedule};
use infersched_cost_model::LinearCostModel;

use crate::bounds::BoundArgument;
use crate::classes::{class_graph, request_classes};
use crate::graph::{ArcKind, StateGraph};
use crate::report::Answer;
use crate::store::Incumbent;
use crate::{
    BoundMethod, Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions, SolveReport,
    SolveStatus, WarmStart,
};
use batches::Move;
use estimate::Estimate;
use infersched_core::{Workload, replay};
use pooled::LayeredEstimate;
use std::ops::ControlFlow;
use std::time::Instant;
use store::{Open, Reached};

/// A proven optimum found by the search.
pub(crate) struct Found {
    /// The schedule (request ids assigned in order within each class).
    pub schedule: Schedule,
    /// Its objective in milliseconds (as the model counts it: absolute times).
    pub objective_ms: f64,
    /// Count vectors expanded.
    pub expanded: usize,
    /// The search's estimate at the start (ms): a lower bound on `objective_ms`.
    pub start_estimate_ms: f64,
}

/// How a search ended.
pub(crate) enum Outcome {
    /// A proven optimum better than the incumbent (or without one).
    Found(Found),
    /// Every schedule has been shown to cost at least the incumbent's objective, so the
    /// incumbent is optimal; count vectors expanded.
    IncumbentOptimal { expanded: usize },
    /// It gave up (state budget, memory, deadline, or too many batches from one state).
    GaveUp,
}

/// One request state of one class, as a position in the count vector.
struct Slot {
    class: usize,
    state: usize,
}

struct Search<'a> {
    graphs: &'a [StateGraph],
    limits: &'a Limits,
    no_mix: bool,
    slots: Vec<Slot>,
    /// Position of (class, state) in the count vector.
    position: HashMap<(usize, usize), usize>,
    theta: [f64; 9],
    /// Per class and arc: the arc's own cost (ms) without the per-batch terms.
    arc_ms: Vec<Vec<f64>>,
    /// Per class and arc: the slot its requests move to.
    arc_to: Vec<Vec<usize>>,
    /// Per slot: the arcs that hold KV after the step (idle holding, process).
    holding: Vec<Vec<usize>>,
    /// Per slot: the one arc without KV after the step (idle without KV, evict) that the
    /// requests given no holding arc take, if any.
    free: Vec<Option<usize>>,
}

/// Runs the search for classes of identical requests (`graphs[k]` built without chunk
/// arcs, `sizes[k]` members, `members[k]` their ids), giving up after `max_states` count
/// vectors, past `memory_bytes` of them, or at `deadline`. With `incumbent_ms` (the
/// objective of a known schedule, as the search counts it) it keeps only count vectors
/// that could still lead to a better one, and ends with
/// [`Outcome::IncumbentOptimal`] when none does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search(
    graphs: &[StateGraph],
    sizes: &[u16],
    members: &[Vec<usize>],
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    no_mix: bool,
    max_states: usize,
    memory_bytes: u64,
    incumbent_ms: Option<f64>,
    deadline: std::time::Instant,
) -> Outcome {
    let mut theta = [0.0; 9];
    for f in Feature::ALL {
        theta[f as usize] = cost.theta(f) * 1e3;
    }
    // States reachable from the start, per class.
    let mut slots = Vec::new();
    let mut position = HashMap::new();
    for (k, g) in graphs.iter().enumerate() {
        let mut seen = vec![false; g.states.len()];
        let mut stack = vec![StateGraph::START];
        seen[StateGraph::START] = true;
        while let Some(s) = stack.pop() {
            for &a in &g.out[s] {
                let to = g.arcs[a].to;
                if !seen[to] {
                    seen[to] = true;
                    stack.push(to);
                }
            }
        }
        for (s, &r) in seen.iter().enumerate() {
            if r {
                position.insert((k, s), slots.len());
                slots.push(Slot { class: k, state: s });
            }
        }
    }
    let arc_costs: Vec<Vec<f64>> = graphs
        .iter()
        .map(|g| {
            g.arcs
                .iter()
                .map(|a| crate::classes::entry_cost_ms(cost, &a.features))
                .collect()
        })
        .collect();
    let max_states = Reached::state_cap(slots.len(), max_states, memory_bytes);
    let arc_to = graphs
        .iter()
        .enumerate()
        .map(|(k, g)| {
            g.arcs
                .iter()
                .map(|a| position.get(&(k, a.to)).copied().unwrap_or(usize::MAX))
                .collect()
        })
        .collect();
    // Per slot: its arcs holding KV after the step, and the first one without.
    let (holding, free) = slots
        .iter()
        .map(|sl| {
            let g = &graphs[sl.class];
            let (holding, free): (Vec<usize>, Vec<usize>) =
                g.out[sl.state].iter().partition(|&&a| g.arcs[a].kv > 0);
            (holding, free.first().copied())
        })
        .unzip();
    let search = Search {
        graphs,
        limits,
        no_mix,
        slots,
        position,
        theta,
        arc_ms: arc_costs,
        arc_to,
        holding,
        free,
    };
    search.run(
        sizes,
        members,
        objective,
        max_states,
        incumbent_ms,
        deadline,
    )
}

impl Search<'_> {
    fn run(
        &self,
        sizes: &[u16],
        members: &[Vec<usize>],
        objective: Objective,
        max_states: usize,
        incumbent_ms: Option<f64>,
        deadline: std::time::Instant,
    ) -> Outcome {
        let n: f64 = sizes.iter().map(|&s| f64::from(s)).sum();
        let estimate = Estimate::new(self, objective, sizes);
        let finished = &estimate.finished;
        let no_first_token = &estimate.no_first_token;
        let estimate = |counts: &[u16]| estimate.of(counts);
        let width = self.slots.len();
        let mut start = vec![0u16; width];
        for (k, &size) in sizes.iter().enumerate() {
            start[self.position[&(k, StateGraph::START)]] = size;
        }
        // A class whose finished state is unreachable (a whole prompt over C or P) has no
        // schedule of whole prefills: nothing to search.
        let mut goal = vec![0u16; width];
        for (k, &size) in sizes.iter().enumerate() {
            let Some(&at) = self.position.get(&(k, self.graphs[k].finished())) else {
                return Outcome::GaveUp;
            };
            goal[at] = size;
        }
        // A vector whose estimate reaches the incumbent cannot lead to a better schedule.
        let cutoff = incumbent_ms.map_or(f64::INFINITY, |ub| ub - 1e-9 * ub.abs().max(1.0));
        let mut reached = Reached::new(width);
        let h0 = estimate(&start);
        reached.insert(&start, 0.0, u32::MAX);
        let mut open = BinaryHeap::new();
        open.push(Open {
            f: h0,
            g: 0.0,
            id: 0,
        });
        let mut expanded = 0usize;
        let mut counts = vec![0u16; width];
        // The batches from the vector being expanded: next vectors (flat) and durations.
        let (mut next_counts, mut durations) = (Vec::new(), Vec::new());
        while let Some(Open { g, id, .. }) = open.pop() {
            if g > reached.cost[id] + 1e-12 {
                continue;
            }
            counts.copy_from_slice(reached.counts(id));
            if counts == goal {
                return Outcome::Found(Found {
                    start_estimate_ms: h0,
                    schedule: self.schedule(
                        &reached,
                        id,
                        members,
                        objective,
                        finished,
                        no_first_token,
                        n,
                    ),
                    objective_ms: g,
                    expanded,
                });
            }
            expanded += 1;
            if reached.len() > max_states
                || (expanded.is_multiple_of(1024) && std::time::Instant::now() > deadline)
            {
                return Outcome::GaveUp;
            }
            let weight = self.weight(&counts, objective, finished, no_first_token, n);
            next_counts.clear();
            durations.clear();
            // Many distinct requests make the batches from one state explode: give up.
            let complete = self.batches(&counts, |next, duration, _| {
                next_counts.extend_from_slice(next);
                durations.push(duration);
                true
            });
            if !complete {
                return Outcome::GaveUp;
            }
            for (next, &duration) in next_counts.chunks_exact(width).zip(&durations) {
                reached.reach(&mut open, id, next, g + duration * weight, estimate, cutoff);
            }
        }
        // Nothing left below the cutoff: with an incumbent, it is optimal; without one,
        // the goal is unreachable under the limits.
        if incumbent_ms.is_some() {
            Outcome::IncumbentOptimal { expanded }
        } else {
            Outcome::GaveUp
        }
    }

    /// What one unit of batch time costs from `counts`: 1 for makespan, the share of
    /// requests not yet finished (without a first token) for mean latency (mean TTFT).
    fn weight(
        &self,
        counts: &[u16],
        objective: Objective,
        finished: &[bool],
        no_first_token: &[bool],
        n: f64,
    ) -> f64 {
        let pending = |flags: &[bool], want: bool| {
            counts
                .iter()
                .zip(flags)
                .filter(|(_, f)| **f == want)
                .map(|(c, _)| f64::from(*c))
                .sum::<f64>()
                / n
        };
        match objective {
            Objective::Makespan => 1.0,
            Objective::MeanLatency => pending(finished, false),
            Objective::MeanTtft => pending(no_first_token, true),
        }
    }

    /// The schedule along the path to `goal`: members of a class take the move's arcs in
    /// id order among those in the arc's state; an evict-first arc adds a zero-time
    /// eviction batch before its batch.
    #[allow(clippy::too_many_arguments)]
    fn schedule(
        &self,
        reached: &Reached,
        goal: usize,
        members: &[Vec<usize>],
        objective: Objective,
        finished: &[bool],
        no_first_token: &[bool],
        n: f64,
    ) -> Schedule {
        let mut ids = vec![goal];
        while let Some(&at) = ids.last()
            && reached.parent[at] != u32::MAX
        {
            ids.push(reached.parent[at] as usize);
        }
        ids.reverse();
        let path: Vec<Move> = ids
            .windows(2)
            .map(|pair| {
                let (from, to) = (reached.counts(pair[0]), reached.counts(pair[1]));
                let weight = self.weight(from, objective, finished, no_first_token, n);
                let cost = reached.cost[pair[1]] - reached.cost[pair[0]];
                self.move_between(from, to, cost, weight)
            })
            .collect();
        let mut state: Vec<Vec<usize>> = members
            .iter()
            .map(|m| vec![StateGraph::START; m.len()])
            .collect();
        let mut batches = Vec::new();
        for mv in &path {
            let mut moved: Vec<Vec<bool>> = members.iter().map(|m| vec![false; m.len()]).collect();
            let mut evict_first = Vec::new();
            let mut entries = Vec::new();
            for &(class, a, n) in mv {
                let arc = &self.graphs[class].arcs[a];
                let mut left = n;
                for (i, &id) in members[class].iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    if moved[class][i] || state[class][i] != arc.from {
                        continue;
                    }
                    moved[class][i] = true;
                    left -= 1;
                    state[class][i] = arc.to;
                    match arc.kind {
                        ArcKind::Idle => {}
                        ArcKind::Evict => entries.push(Entry::evict(id as u32)),
                        ArcKind::Process {
                            c, evict_first: ef, ..
                        } => {
                            if ef {
                                evict_first.push(Entry::evict(id as u32));
                            }
                            entries.push(Entry::process(id as u32, c));
                        }
                    }
                }
            }
            // Requests not named by the move stay where they are (idle arcs are named
            // too, so nobody is left; kept for safety).
            evict_first.sort_by_key(|e| e.request);
            entries.sort_by_key(|e| e.request);
            if !evict_first.is_empty() {
                batches.push(Batch::new(evict_first));
            }
            batches.push(Batch::new(entries));
        }
        Schedule::new(batches)
    }
}

/// What [`unchunked_optimum`] found.
pub(crate) enum Searched {
    /// The optimum over whole prefills, its replay and its objective (seconds).
    Optimum(Box<(Found, infersched_core::Replay, f64)>),
    /// No whole-prefill schedule beats the incumbent; count vectors expanded.
    IncumbentOptimal(usize),
    /// It gave up.
    GaveUp,
}

/// The counting search over whole-prefill schedules (the `no-chunk` class plus `class`'s
/// other constraints) of an offline workload without FCFS, with a deadline: the optimum of
/// that class with its replay and objective value, or the proof that nothing beats
/// `incumbent_s` (a known schedule's objective, seconds), or [`Searched::GaveUp`] (too many
/// states for `max_states` or `memory_bytes`, or past `deadline`). C and P are enforced
/// per batch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unchunked_optimum(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    max_states: usize,
    memory_bytes: u64,
    incumbent_s: Option<f64>,
    deadline: Instant,
) -> Result<Searched, SolveError> {
    let members = request_classes(w, true);
    let reqs = w.requests();
    let Ok(sizes) = members
        .iter()
        .map(|m| u16::try_from(m.len()))
        .collect::<Result<Vec<u16>, _>>()
    else {
        return Ok(Searched::GaveUp);
    };
    let unchunked = PolicyConstraints {
        no_chunk: true,
        ..*class
    };
    if Instant::now() >= deadline {
        return Ok(Searched::GaveUp);
    }
    let graphs: Vec<StateGraph> = members
        .iter()
        .map(|m| class_graph(&reqs[m[0]], limits, &unchunked))
        .collect();
    // The search counts time from the common arrival; makespan is from 0.
    let offset_s = if objective == Objective::Makespan {
        reqs.first().map_or(0.0, |q| q.arrival_s)
    } else {
        0.0
    };
    let incumbent_ms = incumbent_s.map(|v| (v - offset_s) * 1e3);
    let found = match search(
        &graphs,
        &sizes,
        &members,
        limits,
        cost,
        objective,
        class.no_mix,
        max_states,
        memory_bytes,
        incumbent_ms,
        deadline,
    ) {
        Outcome::Found(found) => found,
        Outcome::IncumbentOptimal { expanded } => {
            return Ok(Searched::IncumbentOptimal(expanded));
        }
        Outcome::GaveUp => return Ok(Searched::GaveUp),
    };
    // An estimate above the optimum would have made the search's proof unsound.
    debug_assert!(
        found.start_estimate_ms <= found.objective_ms * (1.0 + 1e-9) + 1e-9,
        "inadmissible estimate: {} ms at the start, optimum {} ms",
        found.start_estimate_ms,
        found.objective_ms
    );
    let r = replay(w, limits, cost, &found.schedule)?;
    let replayed = objective.of_replay(&r);
    let searched = found.objective_ms / 1e3 + offset_s;
    if (searched - replayed).abs() > 1e-9 * replayed.max(1e-3) {
        return Err(SolveError::Internal(format!(
            "the counting search's optimum {searched} s does not replay ({replayed} s)"
        )));
    }
    Ok(Searched::Optimum(Box::new((found, r, replayed))))
}

/// The report of a search that proved `best` (the schedule it was given as its incumbent)
/// optimal, expanding `expanded` count vectors.
pub(crate) fn incumbent_report(
    best: &Incumbent,
    objective: Objective,
    class: PolicyConstraints,
    expanded: usize,
    note: String,
    started: Instant,
) -> SolveReport {
    let value = best.objective_value(objective);
    SolveReport {
        note: Some(note),
        horizon_proven_sufficient: true,
        solve_s: started.elapsed().as_secs_f64(),
        states_expanded: Some(expanded as u64),
        warm_start: Some(WarmStart {
            heuristic: best.name.clone(),
            objective: value,
        }),
        ..SolveReport::from_answer(Answer {
            status: SolveStatus::Optimal,
            method: SolveMethod::CountingSearch,
            objective,
            constraints: class,
            schedule: best.schedule.clone(),
            replayed: value,
            bound: value,
            bound_method: BoundMethod::Exact,
        })
    }
}

/// The counting search (module `counting`) where it is exact: an offline workload without
/// FCFS whose optimum needs no chunked prefill (no C and P, see [`crate::dominance`]) or
/// whose class forbids it (`no-chunk`). A report with the proven optimum (the search's, or
/// `incumbent`'s schedule when the search shows nothing beats it), or None when it gave up
/// (too many states, or half the time limit).
pub(crate) fn solve_by_counting(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    incumbent: Option<&Incumbent>,
    started: Instant,
) -> Result<Option<SolveReport>, SolveError> {
    let class = options.constraints;
    let t_solve = Instant::now();
    // Half the time limit at most; the MILP gets what is left.
    let deadline = t_solve + std::time::Duration::from_secs_f64(options.time_limit_s / 2.0);
    let incumbent_s = incumbent.map(|b| b.objective_value(objective));
    let (schedule, replayed, expanded) = match unchunked_optimum(
        w,
        limits,
        cost,
        objective,
        &class,
        options.max_search_states,
        options.memory_limit_bytes,
        incumbent_s,
        deadline,
    )? {
        Searched::Optimum(optimum) => {
            let (found, _, replayed) = *optimum;
            (found.schedule, replayed, found.expanded)
        }
        Searched::IncumbentOptimal(expanded) => {
            let Some(best) = incumbent else {
                return Ok(None);
            };
            let note = format!(
                "the counting search showed that no schedule beats {}'s, so it is optimal",
                best.name
            );
            return Ok(Some(incumbent_report(
                best, objective, class, expanded, note, started,
            )));
        }
        Searched::GaveUp => return Ok(None),
    };
    let solve_s = t_solve.elapsed().as_secs_f64();
    Ok(Some(SolveReport {
        horizon_proven_sufficient: true,
        build_s: t_solve.duration_since(started).as_secs_f64(),
        solve_s,
        states_expanded: Some(expanded as u64),
        ..SolveReport::from_answer(Answer {
            status: SolveStatus::Optimal,
            method: SolveMethod::CountingSearch,
            objective,
            constraints: class,
            schedule,
            replayed,
            bound: replayed,
            bound_method: BoundMethod::Exact,
        })
    }))
}

/// What [`pooled_search`] found.
pub(crate) enum PooledSearch {
    /// The best schedule so far, or the pooled optimum's followed path, is proven optimal.
    Proven(SolveReport),
    /// Not proven: its bound (seconds, where it ran and found one) and the followed path
    /// where it beats the best schedule so far.
    Bounded {
        bound: Option<(f64, BoundArgument)>,
        /// The followed path, where it beats the schedule the search was given.
        improved: Option<Incumbent>,
    },
}

/// The pooled search (module [`pooled`]) until `deadline` on a workload where the counting
/// search applies but is not exact (chunks may pay): it proves `warm` optimal where no
/// pooled path beats it; where it reaches the pooled optimum, that path, followed request
/// by request and replayed, is optimal if it replays at the bound, else the warm start if
/// it is better than `warm`. `started`: when the solve began (reports count from it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pooled_search(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    warm: Option<&Incumbent>,
    deadline: Instant,
    started: Instant,
) -> Result<PooledSearch, SolveError> {
    let run = PooledRun {
        w,
        limits,
        cost,
        objective,
        options,
        warm,
        deadline,
        started,
    };
    Ok(match run.search() {
        ControlFlow::Break(answer) | ControlFlow::Continue(answer) => answer,
    })
}

/// One pooled search: the bounds in turn, each of which may prove the best schedule
/// (`Break` with the proof), then the pooled path followed request by request.
struct PooledRun<'a> {
    w: &'a Workload,
    limits: &'a Limits,
    cost: &'a LinearCostModel,
    objective: Objective,
    options: &'a SolveOptions,
    warm: Option<&'a Incumbent>,
    deadline: Instant,
    started: Instant,
}

impl PooledRun<'_> {
    fn search(&self) -> ControlFlow<PooledSearch, PooledSearch> {
        let cycle_s = self.cycle_ratio()?;
        let (layered_s, estimate) = self.layered()?;
        let (bound_s, expanded, schedule) = self.pooled(estimate.as_ref())?;
        let improved = self.follow(bound_s, expanded, schedule)?;
        // The best of the bounds, with its argument.
        let bound = [
            bound_s.map(|b| (b, BoundArgument::PooledSearch)),
            cycle_s.map(|b| (b, BoundArgument::CycleRatio)),
            layered_s.map(|b| (b, BoundArgument::Layered)),
        ]
        .into_iter()
        .flatten()
        .fold(None, |best: Option<(f64, BoundArgument)>, b| match best {
            Some(a) if a.0 >= b.0 => Some(a),
            _ => Some(b),
        });
        ControlFlow::Continue(PooledSearch::Bounded { bound, improved })
    }

    fn incumbent_s(&self) -> Option<f64> {
        self.warm.map(|best| best.objective_value(self.objective))
    }

    /// `best` proven optimal by an argument that `how` names, over `states` states.
    fn proven(&self, best: &Incumbent, states: usize, how: &str) -> PooledSearch {
        let note = format!(
            "{how} that no schedule beats {}'s, so it is optimal",
            best.name
        );
        let class = self.options.constraints;
        let report = incumbent_report(best, self.objective, class, states, note, self.started);
        PooledSearch::Proven(report)
    }

    /// The best schedule where a bound (seconds) meets it: within the relative gap the
    /// MILP stops at (`--mip-gap`), and never finer than the bounds' rounding allowance
    /// (the price searches' LPs are solved to about 1e-7, and each of a few edges per batch
    /// may undercut by 1e-9 ms).
    fn meets(&self, bound_s: f64) -> Option<&Incumbent> {
        let tolerance = self.options.mip_rel_gap.max(CYCLE_RATIO_ROUNDING);
        self.warm
            .filter(|best| best.objective_value(self.objective) <= bound_s * (1.0 + tolerance))
    }

    /// Makespan: first the cycle-ratio bound, in part of the time (it gives up at once
    /// where its graph would not be built in time), which may prove the best schedule.
    fn cycle_ratio(&self) -> ControlFlow<PooledSearch, Option<f64>> {
        if self.objective != Objective::Makespan {
            return ControlFlow::Continue(None);
        }
        let (w, limits, cost, options) = (self.w, self.limits, self.cost, self.options);
        let found = cycle_ratio_step(w, limits, cost, options, self.incumbent_s(), self.deadline);
        let Some((bound_s, states, how)) = found else {
            return ControlFlow::Continue(None);
        };
        if let Some(best) = self.meets(bound_s) {
            return ControlFlow::Break(self.proven(best, states, &how));
        }
        ControlFlow::Continue(Some(bound_s))
    }

    /// Mean latency of identical requests: first the layered bound, in part of the time,
    /// which may prove the best schedule; its costs to go then guide the pooled search.
    fn layered(&self) -> ControlFlow<PooledSearch, (Option<f64>, Option<LayeredEstimate>)> {
        let none = ControlFlow::Continue((None, None));
        let Some(incumbent_s) = self.incumbent_s() else {
            return none;
        };
        if self.objective != Objective::MeanLatency {
            return none;
        }
        let Some((bound_s, found)) = pooled::layered_bound(
            self.w,
            self.limits,
            self.cost,
            &self.options.constraints,
            incumbent_s,
            self.options.memory_limit_bytes,
            (share_of_left(self.deadline, LAYERED_SHARE), self.deadline),
        ) else {
            return none;
        };
        if let Some(best) = self.meets(bound_s) {
            let b = found.bound;
            let priced = b.price_rounds.map(|r| format!("{}; ", priced_in(r)));
            let how = format!(
                "the layered bound ({}{} states per count finished, {} edges) shows",
                priced.unwrap_or_default(),
                b.nodes,
                b.edges
            );
            return ControlFlow::Break(self.proven(best, b.nodes, &how));
        }
        ControlFlow::Continue((Some(bound_s), found.estimate))
    }

    /// The pooled search itself: its bound (seconds), states expanded and optimal path.
    fn pooled(
        &self,
        estimate: Option<&LayeredEstimate>,
    ) -> ControlFlow<PooledSearch, (Option<f64>, usize, Option<Schedule>)> {
        let options = self.options;
        let found = pooled::pooled_bound(
            self.w,
            self.limits,
            self.cost,
            self.objective,
            &options.constraints,
            options.max_search_states,
            options.memory_limit_bytes,
            self.incumbent_s(),
            self.deadline,
            estimate,
        );
        match found {
            Some(pooled::Pooled::IncumbentOptimal { expanded }) => {
                let Some(best) = self.warm else {
                    return ControlFlow::Break(PooledSearch::Bounded {
                        bound: None,
                        improved: None,
                    });
                };
                let how = if estimate.is_some() {
                    "the pooled search over chunked schedules, guided by the layered bound's costs to go, showed"
                } else {
                    "the pooled search over chunked schedules showed"
                };
                ControlFlow::Break(self.proven(best, expanded, how))
            }
            Some(pooled::Pooled::Bound {
                bound_s,
                expanded,
                schedule,
                ..
            }) => {
                ControlFlow::Continue((bound_s.is_finite().then_some(bound_s), expanded, schedule))
            }
            None => ControlFlow::Continue((None, 0, None)),
        }
    }

    /// The optimal pooled path, followed request by request, may replay at the bound (then
    /// it is optimal), or at least beat the best schedule so far (returned).
    fn follow(
        &self,
        bound_s: Option<f64>,
        expanded: usize,
        schedule: Option<Schedule>,
    ) -> ControlFlow<PooledSearch, Option<Incumbent>> {
        let (w, limits, objective) = (self.w, self.limits, self.objective);
        let class = self.options.constraints;
        let followed = schedule.and_then(|schedule| {
            let replay = replay(w, limits, self.cost, &schedule).ok()?;
            class.admits(w, limits, &schedule).then(|| Incumbent {
                name: format!("the pooled search's optimal path (states: {expanded})"),
                schedule,
                replay,
            })
        });
        if let (Some(path), Some(bound_s)) = (&followed, bound_s)
            && path.objective_value(objective) <= bound_s * (1.0 + 1e-9)
        {
            let note = "the pooled search's optimal path, followed request by request, replays at the pooled bound, so it is optimal";
            let mut report =
                incumbent_report(path, objective, class, expanded, note.into(), self.started);
            // The warm start is the best schedule it beat.
            report.warm_start = self.warm.map(|best| WarmStart {
                heuristic: best.name.clone(),
                objective: best.objective_value(objective),
            });
            return ControlFlow::Break(PooledSearch::Proven(report));
        }
        let warm = self.warm;
        ControlFlow::Continue(followed.filter(|path| {
            warm.is_none_or(|best| {
                path.objective_value(objective) < best.objective_value(objective)
            })
        }))
    }
}

/// `share` of the time from now to `deadline`, as a deadline.
fn share_of_left(deadline: Instant, share: f64) -> Instant {
    Instant::now()
        + deadline
            .saturating_duration_since(Instant::now())
            .mul_f64(share)
}

/// The cycle-ratio bound (makespan) in [`CYCLE_RATIO_SHARE`] of the time to `deadline`:
/// its bound (seconds), the states it counts and how a proof by it reads.
fn cycle_ratio_step(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    options: &SolveOptions,
    incumbent_s: Option<f64>,
    deadline: Instant,
) -> Option<(f64, usize, String)> {
    let (bound_s, found) = pooled::cycle_ratio_bound(
        w,
        limits,
        cost,
        &options.constraints,
        incumbent_s,
        options.memory_limit_bytes,
        share_of_left(deadline, CYCLE_RATIO_SHARE),
    )?;
    let how = match found.price_rounds {
        None => format!(
            "the cycle-ratio bound ({} memory configurations, {} batch kinds) shows",
            found.configurations, found.edges
        ),
        Some(rounds) => format!(
            "the balanced cycle-ratio bound ({}; {} states, {} edges) shows",
            priced_in(rounds),
            found.configurations,
            found.edges
        ),
    };
    Some((bound_s, found.configurations, how))
}

/// How a bound's note names its price search.
fn priced_in(rounds: usize) -> String {
    format!("evictions priced against refills in {rounds} rounds")
}

/// The cycle-ratio bound's share of the time left to the pooled search.
const CYCLE_RATIO_SHARE: f64 = 0.5;

/// The layered bound's share of the time left to the pooled search (mean latency): its
/// price search and the costs to go that guide the search after it.
const LAYERED_SHARE: f64 = 0.5;

/// The least relative distance within which the cycle-ratio bound proves the best schedule
/// (where `--mip-gap` asks for less): its rounding allowance lowers it by a few parts per
/// billion.
const CYCLE_RATIO_ROUNDING: f64 = 1e-8;

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;

    fn identical(n: usize) -> Workload {
        Workload::new(
            (0..n)
                .map(|_| Request {
                    input_tokens: 8,
                    output_tokens: 4,
                    arrival_s: 0.0,
                })
                .collect(),
        )
        .unwrap()
    }

    fn run(w: &Workload, incumbent_s: Option<f64>) -> Searched {
        let limits = Limits {
            kv_capacity: Some(33),
            ..Limits::unlimited()
        };
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        unchunked_optimum(
            w,
            &limits,
            &cost,
            Objective::Makespan,
            &PolicyConstraints::default(),
            1_000_000,
            1 << 30,
            incumbent_s,
            Instant::now() + std::time::Duration::from_secs(60),
        )
        .unwrap()
    }

    #[test]
    fn the_start_estimate_is_a_positive_lower_bound_for_every_objective() {
        // Long outputs: the time to a first token is far below the time to finish, which
        // the TTFT estimate must not count.
        for (n, input, output, m) in [(5u16, 4u32, 12u32, 40u64), (6, 8, 4, 33), (4, 3, 9, 20)] {
            let w = Workload::new(
                (0..n)
                    .map(|_| Request {
                        input_tokens: input,
                        output_tokens: output,
                        arrival_s: 0.0,
                    })
                    .collect(),
            )
            .unwrap();
            let limits = Limits {
                kv_capacity: Some(m),
                ..Limits::unlimited()
            };
            let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
            for objective in [
                Objective::Makespan,
                Objective::MeanLatency,
                Objective::MeanTtft,
            ] {
                let searched = unchunked_optimum(
                    &w,
                    &limits,
                    &cost,
                    objective,
                    &PolicyConstraints::default(),
                    1_000_000,
                    1 << 30,
                    None,
                    Instant::now() + std::time::Duration::from_secs(60),
                )
                .unwrap();
                let Searched::Optimum(searched) = searched else {
                    panic!("{objective:?}: no optimum");
                };
                let found = &searched.0;
                assert!(
                    found.start_estimate_ms > 0.0
                        && found.start_estimate_ms <= found.objective_ms * (1.0 + 1e-12),
                    "{objective:?} n = {n}: estimate {} vs optimum {}",
                    found.start_estimate_ms,
                    found.objective_ms
                );
            }
        }
    }

    #[test]
    fn an_incumbent_at_the_optimum_is_proven_and_a_worse_one_is_beaten() {
        let w = identical(8);
        let Searched::Optimum(searched) = run(&w, None) else {
            panic!("no optimum without an incumbent");
        };
        let (found, _, optimum) = *searched;
        // Family (a) at n = 8 (README): 44.070 ms.
        assert!((optimum - 0.044_070).abs() < 1e-6, "{optimum}");
        // An incumbent at the optimum: the search shows nothing beats it, expanding no
        // more than the search that found it.
        match run(&w, Some(optimum)) {
            Searched::IncumbentOptimal(expanded) => assert!(expanded <= found.expanded),
            _ => panic!("an incumbent at the optimum was not proven optimal"),
        }
        // A worse incumbent: the optimum itself comes back.
        match run(&w, Some(optimum * 1.01)) {
            Searched::Optimum(searched) => assert!((searched.2 - optimum).abs() < 1e-12),
            _ => panic!("a worse incumbent was not beaten"),
        }
    }
}
