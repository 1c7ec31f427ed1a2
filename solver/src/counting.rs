//! An exact search for offline workloads made of a few classes of identical requests, used
//! before the MILP when it applies.
//!
//! When chunked prefill never helps ([`crate::dominance`]: offline, no C, no P, no FCFS),
//! each request lives on the few states of its no-chunk graph (not started, after each
//! generated token, evicted after each, finished). Requests of a class are
//! interchangeable, so the system's state is how many requests of each class sit in each
//! state, and a batch is a transition between such count vectors whose cost depends only on
//! how many requests take each arc. The optimum is then a shortest path over count vectors:
//! for `makespan` a batch costs its duration; for `mean-latency` (`mean-ttft`) its duration
//! times the requests not yet finished (without a first token), over n. A* with an
//! admissible bound (each request's own cheapest remaining work, the per-batch bias times
//! the batches still needed, by path length and by KV area, and the prefill flag of the
//! prefill batches still needed) returns a proven optimum, or gives up past a state budget
//! or a deadline.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use infersched_core::{Batch, Entry, Feature, Limits, Schedule};
use infersched_cost_model::LinearCostModel;

use crate::classes::{class_graph, request_classes};
use crate::graph::{ArcKind, StateGraph};
use crate::{
    BoundMethod, Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions, SolveReport,
    SolveStatus,
};
use infersched_core::{Workload, replay};
use std::time::Instant;

/// A proven optimum found by the search.
pub(crate) struct Found {
    /// The schedule (request ids assigned in order within each class).
    pub schedule: Schedule,
    /// Its objective in milliseconds (as the model counts it: absolute times).
    pub objective_ms: f64,
    /// Count vectors expanded.
    pub expanded: usize,
}

/// One request state of one class, as a position in the count vector.
struct Slot {
    class: usize,
    state: usize,
}

/// The most batches enumerated from one count vector before the search gives up (many
/// distinct requests, each with its own choices, multiply them).
const MAX_MOVES: usize = 50_000;

/// What a batch holds while its moves are enumerated: KV after it, requests holding KV,
/// tokens processed and prefill tokens (the last two against C and P).
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    kv: u64,
    holders: u64,
    tokens: u64,
    prefill: u64,
}

/// What a batch does: how many requests of `(class, arc)` take it.
type Move = Vec<(usize, usize, u16)>;

/// A count vector reached by the search: the counts, the best cost to reach it, and the
/// node and move it was reached from.
type Node = (Vec<u16>, f64, Option<(usize, Move)>);

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
}

#[derive(PartialEq)]
struct Open {
    f: f64,
    g: f64,
    id: usize,
}

impl Eq for Open {}

impl Ord for Open {
    fn cmp(&self, other: &Self) -> Ordering {
        // Min-heap on f, then the larger g (deeper) first; ids for determinism.
        other
            .f
            .total_cmp(&self.f)
            .then(self.g.total_cmp(&other.g))
            .then(other.id.cmp(&self.id))
    }
}

impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Runs the search for classes of identical requests (`graphs[k]` built without chunk
/// arcs, `sizes[k]` members, `members[k]` their ids), giving up after `max_states` count
/// vectors or at `deadline`. None when it gives up.
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
    deadline: std::time::Instant,
) -> Option<Found> {
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
    // Each state stores its count vector twice (list and index): keep that under ~256 MB.
    let max_states = max_states.min((1usize << 28) / (4 * slots.len().max(1)));
    let search = Search {
        graphs,
        limits,
        no_mix,
        slots,
        position,
        theta,
        arc_ms: arc_costs,
    };
    search.run(sizes, members, objective, max_states, deadline)
}

impl Search<'_> {
    /// Per slot: the cheapest own remaining cost (ms, arc costs only), the fewest
    /// processing steps to finish, and the least KV-batch area (sum of the KV held in the
    /// batches that process it) to finish, each minimised on its own.
    fn remaining(&self) -> Vec<(f64, u32, u64)> {
        let mut best: Vec<(f64, u32, u64)> =
            vec![(f64::INFINITY, u32::MAX, u64::MAX); self.slots.len()];
        // Relaxation over the graphs (acyclic apart from idle loops).
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.state == self.graphs[slot.class].finished() {
                best[i] = (0.0, 0, 0);
            }
        }
        loop {
            let mut changed = false;
            for (i, slot) in self.slots.iter().enumerate() {
                let g = &self.graphs[slot.class];
                for &a in &g.out[slot.state] {
                    let arc = &g.arcs[a];
                    if arc.to == slot.state {
                        continue;
                    }
                    let j = self.position[&(slot.class, arc.to)];
                    let (c, steps, area) = best[j];
                    if !c.is_finite() {
                        continue;
                    }
                    let process = matches!(arc.kind, ArcKind::Process { .. });
                    let cand = (
                        c + self.arc_ms[slot.class][a],
                        steps + u32::from(process),
                        area + if process { arc.kv } else { 0 },
                    );
                    if cand.0 < best[i].0 - 1e-12 {
                        best[i].0 = cand.0;
                        changed = true;
                    }
                    if cand.1 < best[i].1 {
                        best[i].1 = cand.1;
                        changed = true;
                    }
                    if cand.2 < best[i].2 {
                        best[i].2 = cand.2;
                        changed = true;
                    }
                }
            }
            if !changed {
                return best;
            }
        }
    }

    fn run(
        &self,
        sizes: &[u16],
        members: &[Vec<usize>],
        objective: Objective,
        max_states: usize,
        deadline: std::time::Instant,
    ) -> Option<Found> {
        let n: f64 = sizes.iter().map(|&s| f64::from(s)).sum();
        let remaining = self.remaining();
        let (t_pre, t_dec) = (
            self.theta[Feature::HasPrefill as usize],
            self.theta[Feature::HasDecode as usize],
        );
        let bias = self.theta[Feature::One as usize] + t_pre.min(t_dec);
        // KV a request on this slot must hold in some prefill batch before it finishes:
        // not started or evicted (m = 0) requests must prefill to I + G.
        let prefill_kv: Vec<u64> = self
            .slots
            .iter()
            .map(|sl| {
                let g = &self.graphs[sl.class];
                let (m, _) = g.states[sl.state];
                if m > 0 || sl.state == g.finished() {
                    return 0;
                }
                g.out[sl.state]
                    .iter()
                    .filter(|&&a| matches!(g.arcs[a].kind, ArcKind::Process { .. }))
                    .map(|&a| g.arcs[a].kv)
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        let cap = self.limits.kv_capacity;
        let finished: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.state == self.graphs[s.class].finished())
            .collect();
        let no_first_token: Vec<bool> = self
            .slots
            .iter()
            .map(|s| self.graphs[s.class].states[s.state].1 == 0)
            .collect();
        // Admissible estimate of what is left from a count vector.
        let estimate = |counts: &[u16]| -> f64 {
            // A request on a state from which it cannot finish under the limits (with P, an
            // evicted request whose refill I + G no longer fits a batch): a dead end.
            if counts
                .iter()
                .zip(&remaining)
                .any(|(&c, r)| c > 0 && !r.0.is_finite())
            {
                return f64::INFINITY;
            }
            match objective {
                // Remaining batches B >= the longest path and >= area / M; batches with a
                // prefill P >= pending prefill KV / M; each batch costs the bias, and each
                // prefill batch the difference of the flags on top (when it is larger).
                Objective::Makespan => {
                    let (mut own, mut steps, mut area, mut pre) = (0.0, 0u32, 0u64, 0u64);
                    for (i, &c) in counts.iter().enumerate() {
                        if c > 0 {
                            own += f64::from(c) * remaining[i].0;
                            steps = steps.max(remaining[i].1);
                            area += u64::from(c) * remaining[i].2;
                            pre += u64::from(c) * prefill_kv[i];
                        }
                    }
                    let (mut batches, mut prefill_batches) = (u64::from(steps), 0);
                    if let Some(m) = cap {
                        batches = batches.max(area.div_ceil(m));
                        prefill_batches = pre.div_ceil(m);
                    }
                    own + bias * batches as f64 + (t_pre - t_dec).max(0.0) * prefill_batches as f64
                }
                // Each request still to finish (or to get its first token) needs at least
                // its own remaining work and one bias per remaining step.
                Objective::MeanLatency | Objective::MeanTtft => {
                    let mut sum = 0.0;
                    for (i, &c) in counts.iter().enumerate() {
                        let pending = if objective == Objective::MeanLatency {
                            !finished[i]
                        } else {
                            no_first_token[i]
                        };
                        if c > 0 && pending {
                            sum +=
                                f64::from(c) * (remaining[i].0 + bias * f64::from(remaining[i].1));
                        }
                    }
                    sum / n
                }
            }
        };
        let mut start = vec![0u16; self.slots.len()];
        for (k, &size) in sizes.iter().enumerate() {
            start[self.position[&(k, StateGraph::START)]] = size;
        }
        // A class whose finished state is unreachable (a whole prompt over C or P) has no
        // schedule of whole prefills: nothing to search.
        let mut goal = vec![0u16; self.slots.len()];
        for (k, &size) in sizes.iter().enumerate() {
            goal[*self.position.get(&(k, self.graphs[k].finished()))?] = size;
        }
        let mut ids: HashMap<Vec<u16>, usize> = HashMap::new();
        let mut nodes: Vec<Node> = Vec::new();
        ids.insert(start.clone(), 0);
        let h0 = estimate(&start);
        nodes.push((start, 0.0, None));
        let mut open = BinaryHeap::new();
        open.push(Open {
            f: h0,
            g: 0.0,
            id: 0,
        });
        let mut expanded = 0usize;
        while let Some(Open { g, id, .. }) = open.pop() {
            if g > nodes[id].1 + 1e-12 {
                continue;
            }
            if nodes[id].0 == goal {
                return Some(Found {
                    schedule: self.schedule(&nodes, id, members),
                    objective_ms: g,
                    expanded,
                });
            }
            expanded += 1;
            if nodes.len() > max_states
                || (expanded.is_multiple_of(1024) && std::time::Instant::now() > deadline)
            {
                return None;
            }
            let counts = nodes[id].0.clone();
            let weight = match objective {
                Objective::Makespan => 1.0,
                Objective::MeanLatency => {
                    counts
                        .iter()
                        .zip(&finished)
                        .filter(|(_, f)| !**f)
                        .map(|(c, _)| f64::from(*c))
                        .sum::<f64>()
                        / n
                }
                Objective::MeanTtft => {
                    counts
                        .iter()
                        .zip(&no_first_token)
                        .filter(|(_, f)| **f)
                        .map(|(c, _)| f64::from(*c))
                        .sum::<f64>()
                        / n
                }
            };
            // Many distinct requests make the batches from one state explode: give up.
            let moves = self.moves(&counts)?;
            for (next, duration, mv) in moves {
                let g2 = g + duration * weight;
                match ids.get(&next) {
                    Some(&j) if nodes[j].1 <= g2 + 1e-12 => {}
                    Some(&j) => {
                        nodes[j].1 = g2;
                        nodes[j].2 = Some((id, mv));
                        open.push(Open {
                            f: g2 + estimate(&next),
                            g: g2,
                            id: j,
                        });
                    }
                    None => {
                        let j = nodes.len();
                        let f = g2 + estimate(&next);
                        if !f.is_finite() {
                            continue;
                        }
                        ids.insert(next.clone(), j);
                        nodes.push((next, g2, Some((id, mv))));
                        open.push(Open { f, g: g2, id: j });
                    }
                }
            }
        }
        None
    }

    /// Every batch from `counts`: the next count vector, the batch's duration (ms) and the
    /// move. A batch processes at least one token.
    fn moves(&self, counts: &[u16]) -> Option<Vec<(Vec<u16>, f64, Move)>> {
        struct Walk<'b> {
            search: &'b Search<'b>,
            occupied: Vec<usize>,
            out: Vec<(Vec<u16>, f64, Move)>,
            mv: Move,
            /// Set when there are more than `MAX_MOVES` batches from one state.
            overflow: bool,
        }
        impl Walk<'_> {
            /// Distributes the requests of occupied slot `o` and after; `load` is what the
            /// batch holds so far: KV after it, KV holders, tokens, prefill tokens.
            fn go(&mut self, o: usize, counts: &[u16], load: Load) {
                let s = self.search;
                if self.overflow {
                    return;
                }
                if o == self.occupied.len() {
                    self.finish(counts);
                    return;
                }
                let slot = &s.slots[self.occupied[o]];
                let g = &s.graphs[slot.class];
                let n = counts[self.occupied[o]];
                // Arcs holding KV after the step take room; the rest (idle without KV,
                // evict) take whatever is left, and one of them must exist for that.
                let arcs = &g.out[slot.state];
                let free = arcs.iter().copied().find(|&a| g.arcs[a].kv == 0);
                let holding: Vec<usize> =
                    arcs.iter().copied().filter(|&a| g.arcs[a].kv > 0).collect();
                self.assign(o, counts, &holding, 0, n, free, load);
            }

            #[allow(clippy::too_many_arguments)]
            fn assign(
                &mut self,
                o: usize,
                counts: &[u16],
                holding: &[usize],
                h: usize,
                left: u16,
                free: Option<usize>,
                load: Load,
            ) {
                let s = self.search;
                let class = s.slots[self.occupied[o]].class;
                if h == holding.len() {
                    if left > 0 {
                        let Some(a) = free else { return };
                        self.mv.push((class, a, left));
                        self.go(o + 1, counts, load);
                        self.mv.pop();
                    } else {
                        self.go(o + 1, counts, load);
                    }
                    return;
                }
                let a = holding[h];
                let arc = &s.graphs[class].arcs[a];
                let (tokens, prefill) = match arc.kind {
                    ArcKind::Process { c, decode, .. } => {
                        (u64::from(c), if decode { 0 } else { u64::from(c) })
                    }
                    _ => (0, 0),
                };
                for take in (0..=left).rev() {
                    let t = u64::from(take);
                    let next = Load {
                        kv: load.kv + arc.kv * t,
                        holders: load.holders + t,
                        tokens: load.tokens + tokens * t,
                        prefill: load.prefill + prefill * t,
                    };
                    if s.limits.kv_capacity.is_some_and(|m| next.kv > m)
                        || s.limits.max_running.is_some_and(|r| next.holders > r)
                        || s.limits.token_budget.is_some_and(|c| next.tokens > c)
                        || s.limits
                            .effective_prefill_budget()
                            .is_some_and(|p| next.prefill > p)
                    {
                        continue;
                    }
                    if take > 0 {
                        self.mv.push((class, a, take));
                    }
                    self.assign(o, counts, holding, h + 1, left - take, free, next);
                    if take > 0 {
                        self.mv.pop();
                    }
                }
            }

            fn finish(&mut self, counts: &[u16]) {
                let s = self.search;
                let (mut prefill, mut decode) = (false, false);
                let mut duration = 0.0;
                let mut next = vec![0u16; counts.len()];
                for &(class, a, n) in &self.mv {
                    let arc = &s.graphs[class].arcs[a];
                    if let ArcKind::Process { decode: d, .. } = arc.kind {
                        if d {
                            decode = true;
                        } else {
                            prefill = true;
                        }
                        duration += f64::from(n) * s.arc_ms[class][a];
                    }
                    next[s.position[&(class, arc.to)]] += n;
                }
                if !(prefill || decode) || (s.no_mix && prefill && decode) {
                    return;
                }
                duration += s.theta[Feature::One as usize]
                    + if prefill {
                        s.theta[Feature::HasPrefill as usize]
                    } else {
                        0.0
                    }
                    + if decode {
                        s.theta[Feature::HasDecode as usize]
                    } else {
                        0.0
                    };
                self.out.push((next, duration, self.mv.clone()));
                if self.out.len() > MAX_MOVES {
                    self.overflow = true;
                }
            }
        }
        let occupied: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        let mut walk = Walk {
            search: self,
            occupied,
            out: Vec::new(),
            mv: Vec::new(),
            overflow: false,
        };
        walk.go(0, counts, Load::default());
        (!walk.overflow).then_some(walk.out)
    }

    /// The schedule along the path to `goal`: members of a class take the move's arcs in
    /// id order among those in the arc's state; an evict-first arc adds a zero-time
    /// eviction batch before its batch.
    fn schedule(&self, nodes: &[Node], goal: usize, members: &[Vec<usize>]) -> Schedule {
        let mut path = Vec::new();
        let mut at = goal;
        while let Some((parent, mv)) = &nodes[at].2 {
            path.push(mv);
            at = *parent;
        }
        path.reverse();
        let mut state: Vec<Vec<usize>> = members
            .iter()
            .map(|m| vec![StateGraph::START; m.len()])
            .collect();
        let mut batches = Vec::new();
        for mv in path {
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

/// The counting search over whole-prefill schedules (the `no-chunk` class plus `class`'s
/// other constraints) of an offline workload without FCFS, with a deadline: the optimum of
/// that class with its replay and objective value, or None when it gave up (too many states or past `deadline`).
/// C and P are enforced per batch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unchunked_optimum(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    max_states: usize,
    deadline: Instant,
) -> Result<Option<(Found, infersched_core::Replay, f64)>, SolveError> {
    let members = request_classes(w, true);
    let reqs = w.requests();
    let Ok(sizes) = members
        .iter()
        .map(|m| u16::try_from(m.len()))
        .collect::<Result<Vec<u16>, _>>()
    else {
        return Ok(None);
    };
    let unchunked = PolicyConstraints {
        no_chunk: true,
        ..*class
    };
    let graphs: Vec<StateGraph> = members
        .iter()
        .map(|m| class_graph(&reqs[m[0]], limits, &unchunked))
        .collect();
    let Some(found) = search(
        &graphs,
        &sizes,
        &members,
        limits,
        cost,
        objective,
        class.no_mix,
        max_states,
        deadline,
    ) else {
        return Ok(None);
    };
    let r = replay(w, limits, cost, &found.schedule)?;
    let replayed = objective.of_replay(&r);
    // The search counts time from the common arrival; makespan is from 0.
    let offset_s = if objective == Objective::Makespan {
        reqs.first().map_or(0.0, |q| q.arrival_s)
    } else {
        0.0
    };
    let searched = found.objective_ms / 1e3 + offset_s;
    if (searched - replayed).abs() > 1e-9 * replayed.max(1e-3) {
        return Err(SolveError::Internal(format!(
            "the counting search's optimum {searched} s does not replay ({replayed} s)"
        )));
    }
    Ok(Some((found, r, replayed)))
}

/// The counting search (module `counting`) where it is exact: an offline workload without
/// FCFS whose optimum needs no chunked prefill (no C and P, see [`crate::dominance`]) or
/// whose class forbids it (`no-chunk`). A report with the proven optimum, or None when it
/// gave up (too many states, or half the time limit).
pub(crate) fn solve_by_counting(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    started: Instant,
) -> Result<Option<SolveReport>, SolveError> {
    let class = options.constraints;
    let t_solve = Instant::now();
    // Half the time limit at most; the MILP gets what is left.
    let deadline = t_solve + std::time::Duration::from_secs_f64(options.time_limit_s / 2.0);
    let Some((found, _, replayed)) = unchunked_optimum(
        w,
        limits,
        cost,
        objective,
        &class,
        options.max_search_states,
        deadline,
    )?
    else {
        return Ok(None);
    };
    let solve_s = t_solve.elapsed().as_secs_f64();
    Ok(Some(SolveReport {
        status: SolveStatus::Optimal,
        method: SolveMethod::CountingSearch,
        objective,
        constraints: class,
        milp_objective: None,
        replayed_objective: replayed,
        best_bound: replayed,
        certified_gap: 0.0,
        bound_method: BoundMethod::Exact,
        note: None,
        horizon: found.schedule.batches.len(),
        horizon_proven_sufficient: true,
        model: None,
        build_s: t_solve.duration_since(started).as_secs_f64(),
        solve_s,
        nodes: None,
        states_expanded: Some(found.expanded as u64),
        warm_start: None,
        schedule: found.schedule,
    }))
}
