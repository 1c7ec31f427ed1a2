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
use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use infersched_core::{Batch, Entry, Feature, Limits, Schedule};
use infersched_cost_model::LinearCostModel;

use crate::bounds::patterns::{BatchTerms, EntryType, pattern_prices};
use crate::classes::{class_graph, request_classes};
use crate::graph::{ArcKind, StateGraph};
use crate::portfolio::BestHeuristic;
use crate::{
    BoundMethod, Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions, SolveReport,
    SolveStatus, WarmStart,
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
    /// The search's estimate at the start (ms): a lower bound on `objective_ms`.
    pub start_estimate_ms: f64,
}

/// The least per-batch term of a batch that processes anything (ms).
fn bias_of(theta: &[f64; 9]) -> f64 {
    theta[Feature::One as usize]
        + theta[Feature::HasPrefill as usize].min(theta[Feature::HasDecode as usize])
}

/// `sum_k max(P_k, T_k)` over the requests not `done`, where `P_k` is the sum of the `k`
/// smallest `share` and `T_k` the `k`-th smallest `time` (slots listed in increasing order
/// of each in `by_share`, `by_time`; a slot holds `counts[slot]` requests).
fn sum_of_positions(
    counts: &[u16],
    done: &[bool],
    by_share: &[usize],
    share: &[f64],
    by_time: &[usize],
    time: &[f64],
) -> f64 {
    let pending = |order: &[usize]| {
        order
            .iter()
            .filter(|&&i| counts[i] > 0 && !done[i])
            .flat_map(|&i| std::iter::repeat_n(i, usize::from(counts[i])))
            .collect::<Vec<usize>>()
    };
    let (w, t) = (pending(by_share), pending(by_time));
    let mut prefix = 0.0;
    let mut sum = 0.0;
    for (&i, &j) in w.iter().zip(&t) {
        prefix += share[i];
        sum += prefix.max(time[j]);
    }
    sum
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

/// The most batches enumerated from one count vector before the search gives up (many
/// distinct requests, each with its own choices, multiply them).
const MAX_MOVES: usize = 50_000;

/// What a batch holds while its moves are enumerated: KV after it, requests holding KV,
/// tokens processed and prefill tokens (the last two against C and P), and what it costs.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    kv: u64,
    holders: u64,
    tokens: u64,
    prefill: u64,
    /// The process arcs' own cost (ms), without the per-batch terms.
    ms: f64,
    has_prefill: bool,
    has_decode: bool,
}

/// What a batch does: how many requests of `(class, arc)` take it.
type Move = Vec<(usize, usize, u16)>;

/// The count vectors reached by the search, stored flat (`width` counts each), with the
/// best cost found to reach each and the vector it was reached from; indexed by a hash
/// table of ids, so a vector is stored once and looked up without allocating.
struct Reached {
    width: usize,
    counts: Vec<u16>,
    cost: Vec<f64>,
    parent: Vec<u32>,
    index: HashTable<u32>,
}

fn key_hash(key: &[u16]) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl Reached {
    /// Bytes one reached vector may take: its counts, cost and parent (twice: a growing
    /// vector reallocates to double), its table slot (with the table's spare room), and
    /// about two open-list entries. Family (a) with C = 64, n = 32: 556,373 vectors of
    /// 16 counts, estimated 55 MB before this doubling; the whole process peaked at 54 MB.
    fn bytes_per_vector(width: usize) -> usize {
        2 * (2 * width + 8 + 4) + 16 + 2 * std::mem::size_of::<Open>()
    }

    fn new(width: usize) -> Self {
        Self {
            width,
            counts: Vec::new(),
            cost: Vec::new(),
            parent: Vec::new(),
            index: HashTable::new(),
        }
    }

    fn len(&self) -> usize {
        self.cost.len()
    }

    fn counts(&self, id: usize) -> &[u16] {
        &self.counts[id * self.width..(id + 1) * self.width]
    }

    fn find(&self, key: &[u16]) -> Option<usize> {
        let (counts, width) = (&self.counts, self.width);
        self.index
            .find(key_hash(key), |&j| {
                &counts[j as usize * width..(j as usize + 1) * width] == key
            })
            .map(|&j| j as usize)
    }

    /// Stores a vector not reached before; its id.
    fn insert(&mut self, key: &[u16], cost: f64, parent: u32) -> usize {
        let id = self.len();
        self.counts.extend_from_slice(key);
        self.cost.push(cost);
        self.parent.push(parent);
        let (counts, width) = (&self.counts, self.width);
        self.index.insert_unique(key_hash(key), id as u32, |&j| {
            key_hash(&counts[j as usize * width..(j as usize + 1) * width])
        });
        id
    }
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
    // Each state stores its count vector twice (list and index): keep that under ~256 MB.
    // Within the memory limit too (the reached vectors and the open list).
    let per_vector = Reached::bytes_per_vector(slots.len()) as u64;
    let max_states =
        max_states.min(usize::try_from(memory_bytes / per_vector).unwrap_or(usize::MAX));
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
    let holding = slots
        .iter()
        .map(|sl| {
            let g = &graphs[sl.class];
            g.out[sl.state]
                .iter()
                .copied()
                .filter(|&a| g.arcs[a].kv > 0)
                .collect()
        })
        .collect();
    let free = slots
        .iter()
        .map(|sl| {
            let g = &graphs[sl.class];
            g.out[sl.state].iter().copied().find(|&a| g.arcs[a].kv == 0)
        })
        .collect();
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

    /// Per slot: the least sum of `weight(class, arc)` over the process arcs of a path to
    /// a slot in `target` (infinite where none).
    fn cheapest_to(&self, target: &[bool], weight: impl Fn(usize, usize) -> f64) -> Vec<f64> {
        let mut best: Vec<f64> = target
            .iter()
            .map(|&t| if t { 0.0 } else { f64::INFINITY })
            .collect();
        loop {
            let mut changed = false;
            for (i, slot) in self.slots.iter().enumerate() {
                let g = &self.graphs[slot.class];
                for &a in &g.out[slot.state] {
                    let arc = &g.arcs[a];
                    if arc.to == slot.state {
                        continue;
                    }
                    let rest = best[self.arc_to[slot.class][a]];
                    if !rest.is_finite() {
                        continue;
                    }
                    let own = if matches!(arc.kind, ArcKind::Process { .. }) {
                        weight(slot.class, a)
                    } else {
                        0.0
                    };
                    if rest + own < best[i] - 1e-12 {
                        best[i] = rest + own;
                        changed = true;
                    }
                }
            }
            if !changed {
                return best;
            }
        }
    }

    /// Per class and arc: the pattern price (ms, [`crate::bounds::patterns`]) of the
    /// arc's entry (0 for idle and evict arcs), a lower bound on its share of its batch's
    /// per-batch terms; None when no prices could be computed.
    fn arc_prices(&self, sizes: &[u16]) -> Option<Vec<Vec<f64>>> {
        let mut types: Vec<EntryType> = Vec::new();
        let mut type_of: Vec<Vec<usize>> = Vec::new();
        for (class, g) in self.graphs.iter().enumerate() {
            let mut row = Vec::with_capacity(g.arcs.len());
            for arc in &g.arcs {
                if !self.position.contains_key(&(class, arc.from)) {
                    row.push(usize::MAX);
                    continue;
                }
                let t = match arc.kind {
                    ArcKind::Process { c, decode, .. } => EntryType {
                        kv: arc.kv,
                        tokens: u64::from(c),
                        prefill: !decode,
                    },
                    _ => {
                        row.push(usize::MAX);
                        continue;
                    }
                };
                let k = types.iter().position(|x| *x == t).unwrap_or_else(|| {
                    types.push(t);
                    types.len() - 1
                });
                row.push(k);
            }
            type_of.push(row);
        }
        // The demand the prices are tuned for: each request's path without evictions,
        // taking the longest process arc (a whole prompt, then decodes).
        let mut demand = vec![0.0; types.len()];
        for (k, g) in self.graphs.iter().enumerate() {
            let mut at = StateGraph::START;
            let mut steps = 0;
            while at != g.finished() && steps <= g.states.len() {
                let Some(a) = g.out[at]
                    .iter()
                    .copied()
                    .filter(|&a| {
                        matches!(
                            g.arcs[a].kind,
                            ArcKind::Process {
                                evict_first: false,
                                ..
                            }
                        )
                    })
                    .max_by_key(|&a| match g.arcs[a].kind {
                        ArcKind::Process { c, .. } => c,
                        _ => 0,
                    })
                else {
                    break;
                };
                demand[type_of[k][a]] += f64::from(sizes[k]);
                at = g.arcs[a].to;
                steps += 1;
            }
        }
        let terms = BatchTerms {
            one: self.theta[Feature::One as usize],
            has_prefill: self.theta[Feature::HasPrefill as usize],
            has_decode: self.theta[Feature::HasDecode as usize],
        };
        let prices = pattern_prices(&types, &demand, self.limits, terms, self.no_mix)?;
        Some(
            type_of
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|&t| if t == usize::MAX { 0.0 } else { prices[t] })
                        .collect()
                })
                .collect(),
        )
    }

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
        let remaining = self.remaining();
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
        let prices = self.arc_prices(sizes);
        // Makespan: per slot, the least sum of prices still to pay.
        let patterns = prices
            .as_ref()
            .filter(|_| objective == Objective::Makespan)
            .map(|y| self.cheapest_to(&finished, |class, a| y[class][a]));
        // Mean latency (TTFT): per slot, the least own work plus prices until the request
        // finishes (gets its first token), its share of the time until then, and its own
        // minimum time (that work plus a bias per step); each with the slots in increasing
        // order.
        let done: Vec<bool> = match objective {
            Objective::MeanTtft => no_first_token.iter().map(|&p| !p).collect(),
            _ => finished.clone(),
        };
        let own_work = self.cheapest_to(&done, |class, a| self.arc_ms[class][a]);
        let steps = self.cheapest_to(&done, |_, _| 1.0);
        let share: Vec<f64> = match &prices {
            Some(y) => self.cheapest_to(&done, |class, a| self.arc_ms[class][a] + y[class][a]),
            None => own_work.clone(),
        };
        let own_time: Vec<f64> = own_work
            .iter()
            .zip(&steps)
            .map(|(w, k)| w + bias_of(&self.theta) * k)
            .collect();
        let by = |v: &[f64]| {
            let mut order: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_finite()).collect();
            order.sort_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b)));
            order
        };
        let (by_share, by_time) = (by(&share), by(&own_time));
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
                    let by_counts =
                        bias * batches as f64 + (t_pre - t_dec).max(0.0) * prefill_batches as f64;
                    let by_prices = patterns.as_ref().map_or(0.0, |per_slot| {
                        counts
                            .iter()
                            .zip(per_slot)
                            .filter(|(c, _)| **c > 0)
                            .map(|(&c, y)| f64::from(c) * y)
                            .sum()
                    });
                    own + by_counts.max(by_prices)
                }
                // The k-th of the requests still to finish (to get a first token) gets there
                // no earlier than the k smallest shares of time add up to (own work plus
                // prices: the batches until then hold all their entries), nor than the
                // k-th smallest own minimum time.
                Objective::MeanLatency | Objective::MeanTtft => {
                    sum_of_positions(counts, &done, &by_share, &share, &by_time, &own_time) / n
                }
            }
        };
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
                        &finished,
                        &no_first_token,
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
            let weight = self.weight(&counts, objective, &finished, &no_first_token, n);
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
                let g2 = g + duration * weight;
                match reached.find(next) {
                    Some(j) if reached.cost[j] <= g2 + 1e-12 => {}
                    Some(j) => {
                        let f = g2 + estimate(next);
                        if f >= cutoff {
                            continue;
                        }
                        reached.cost[j] = g2;
                        reached.parent[j] = id as u32;
                        open.push(Open { f, g: g2, id: j });
                    }
                    None => {
                        let f = g2 + estimate(next);
                        if !f.is_finite() || f >= cutoff {
                            continue;
                        }
                        let j = reached.insert(next, g2, id as u32);
                        open.push(Open { f, g: g2, id: j });
                    }
                }
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

    /// Calls `emit(next, duration_ms, move)` for every batch from `counts` (one processing
    /// at least one token) until it returns false. False when there were more than
    /// [`MAX_MOVES`] batches (or `emit` stopped the walk).
    fn batches(&self, counts: &[u16], emit: impl FnMut(&[u16], f64, &Move) -> bool) -> bool {
        let mut walk = Walk {
            search: self,
            counts,
            occupied: (0..counts.len()).filter(|&i| counts[i] > 0).collect(),
            next: vec![0; counts.len()],
            mv: Vec::new(),
            emitted: 0,
            stopped: false,
            emit,
        };
        walk.go(0, Load::default());
        !walk.stopped
    }

    /// The move that takes `from` to `to` at cost `cost_ms` (duration times weight), for
    /// writing the schedule of the path found.
    fn move_between(&self, from: &[u16], to: &[u16], cost_ms: f64, weight: f64) -> Move {
        let mut best: Option<(f64, Move)> = None;
        self.batches(from, |next, duration, mv| {
            if next == to {
                let miss = (duration * weight - cost_ms).abs();
                if best.as_ref().is_none_or(|(m, _)| miss < *m) {
                    best = Some((miss, mv.clone()));
                }
            }
            true
        });
        best.map(|(_, mv)| mv).unwrap_or_default()
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

/// Enumerates the batches from one count vector: the requests of each occupied slot are
/// distributed over the slot's arcs, holding arcs first (within C, P, M and R_max), the
/// rest taking the slot's free arc.
struct Walk<'b, F> {
    search: &'b Search<'b>,
    counts: &'b [u16],
    occupied: Vec<usize>,
    /// The count vector after the batch built so far.
    next: Vec<u16>,
    mv: Move,
    emitted: usize,
    /// Set when there are more than `MAX_MOVES` batches or `emit` said stop.
    stopped: bool,
    emit: F,
}

impl<F: FnMut(&[u16], f64, &Move) -> bool> Walk<'_, F> {
    /// Distributes the requests of occupied slot `o` and after; `load` is what the batch
    /// holds so far.
    fn go(&mut self, o: usize, load: Load) {
        if self.stopped {
            return;
        }
        if o == self.occupied.len() {
            self.finish(load);
            return;
        }
        let n = self.counts[self.occupied[o]];
        self.assign(o, 0, n, load);
    }

    /// Moves `take` requests of `class` along arc `a` (or back, `sign` -1).
    fn shift(&mut self, class: usize, a: usize, take: u16, undo: bool) {
        let to = self.search.arc_to[class][a];
        if undo {
            self.next[to] -= take;
            self.mv.pop();
        } else {
            self.next[to] += take;
            self.mv.push((class, a, take));
        }
    }

    fn assign(&mut self, o: usize, h: usize, left: u16, load: Load) {
        let s = self.search;
        let slot = self.occupied[o];
        let class = s.slots[slot].class;
        let holding = &s.holding[slot];
        if h == holding.len() {
            if left > 0 {
                let Some(a) = s.free[slot] else { return };
                self.shift(class, a, left, false);
                self.go(o + 1, load);
                self.shift(class, a, left, true);
            } else {
                self.go(o + 1, load);
            }
            return;
        }
        let a = holding[h];
        let arc = &s.graphs[class].arcs[a];
        let (tokens, prefill, decode) = match arc.kind {
            ArcKind::Process { c, decode, .. } => (
                u64::from(c),
                if decode { 0 } else { u64::from(c) },
                Some(decode),
            ),
            _ => (0, 0, None),
        };
        for take in (0..=left).rev() {
            let t = u64::from(take);
            let mut next = Load {
                kv: load.kv + arc.kv * t,
                holders: load.holders + t,
                tokens: load.tokens + tokens * t,
                prefill: load.prefill + prefill * t,
                ms: load.ms,
                has_prefill: load.has_prefill,
                has_decode: load.has_decode,
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
                if let Some(d) = decode {
                    next.ms += f64::from(take) * s.arc_ms[class][a];
                    next.has_decode |= d;
                    next.has_prefill |= !d;
                }
                self.shift(class, a, take, false);
            }
            self.assign(o, h + 1, left - take, next);
            if take > 0 {
                self.shift(class, a, take, true);
            }
        }
    }

    fn finish(&mut self, load: Load) {
        let s = self.search;
        if !(load.has_prefill || load.has_decode)
            || (s.no_mix && load.has_prefill && load.has_decode)
        {
            return;
        }
        let duration = load.ms
            + s.theta[Feature::One as usize]
            + if load.has_prefill {
                s.theta[Feature::HasPrefill as usize]
            } else {
                0.0
            }
            + if load.has_decode {
                s.theta[Feature::HasDecode as usize]
            } else {
                0.0
            };
        self.emitted += 1;
        if !(self.emit)(&self.next, duration, &self.mv) || self.emitted > MAX_MOVES {
            self.stopped = true;
        }
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
    incumbent: Option<&BestHeuristic>,
    started: Instant,
) -> Result<Option<SolveReport>, SolveError> {
    let class = options.constraints;
    let t_solve = Instant::now();
    // Half the time limit at most; the MILP gets what is left.
    let deadline = t_solve + std::time::Duration::from_secs_f64(options.time_limit_s / 2.0);
    let incumbent_s = incumbent.map(|b| b.objective_value(objective));
    let (schedule, replayed, expanded, warm_start, note) = match unchunked_optimum(
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
            (found.schedule, replayed, found.expanded, None, None)
        }
        Searched::IncumbentOptimal(expanded) => {
            let Some(best) = incumbent else {
                return Ok(None);
            };
            let value = best.objective_value(objective);
            (
                best.schedule.clone(),
                value,
                expanded,
                Some(WarmStart {
                    heuristic: best.name.clone(),
                    objective: value,
                }),
                Some(format!(
                    "the counting search showed that no schedule beats {}'s, so it is optimal",
                    best.name
                )),
            )
        }
        Searched::GaveUp => return Ok(None),
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
        note,
        horizon: schedule.batches.len(),
        horizon_proven_sufficient: true,
        model: None,
        build_s: t_solve.duration_since(started).as_secs_f64(),
        solve_s,
        nodes: None,
        states_expanded: Some(expanded as u64),
        warm_start,
        schedule,
    }))
}

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
    fn positions_take_the_larger_of_the_share_prefix_and_the_own_time() {
        // Slots: 0 done; 1 holds 2 requests (share 1, time 5); 2 holds 1 (share 3, time 2).
        let counts = [4, 2, 1];
        let done = [true, false, false];
        let share = [0.0, 1.0, 3.0];
        let time = [0.0, 5.0, 2.0];
        // Shares in order 1, 1, 3: prefixes 1, 2, 5; times in order 2, 5, 5.
        let sum = sum_of_positions(&counts, &done, &[0, 1, 2], &share, &[0, 2, 1], &time);
        assert_eq!(sum, 2.0 + 5.0 + 5.0);
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
