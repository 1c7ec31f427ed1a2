//! The cycle-ratio bound on makespan (milp.md, "The cycle-ratio bound").
//!
//! Drop a pooled vector's pools (requests waiting for their first prefill or for a refill)
//! and its finished requests: what is left, the *configuration*, is what holds memory
//! (decode-ready requests per generation count, each class's partial prompt). Give every
//! pool an endless supply (first prefills and refills may complete whenever a batch has
//! room for them, and an evicted request leaves the configuration). Every schedule's
//! pooled path is then a walk from the empty configuration back to it, batch by batch,
//! with the same durations and the same tokens generated per batch (a decode, a completed
//! first prefill and a refill through a token generate one each). A closed walk splits
//! into cycles, each costing at least `rho*` times the tokens it generates, `rho*` the
//! least duration-to-tokens ratio of a cycle; and every request generates exactly its `O`
//! tokens, so
//!
//! `makespan >= rho* x (sum of O over the requests)`.
//!
//! The graph does not depend on how many requests there are, only on C, M, R_max and the
//! classes' lengths: where the best cycle is what a schedule repeats (family (a) with C =
//! 64 and no evictions: four prompts in one batch, seven decodes of the four), the bound
//! is the optimum at every n. `rho*` is found by Dinkelbach's method: from a known ratio,
//! a negative cycle of `duration - rho x tokens` (Bellman-Ford, whose parent edges close
//! a cycle when there is one) has a lower ratio; with none left, `rho` is the least.

use std::time::{Duration, Instant};

use super::super::store::Reached;
use super::{Choices, Model, batches};

/// What the bound found: a lower bound on the makespan from the common arrival (ms), and
/// the size of its graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CycleRatio {
    pub bound_ms: f64,
    pub configurations: usize,
    pub edges: usize,
    /// For the balanced bound ([`super::balanced`]): the rounds of its price search.
    pub price_rounds: Option<usize>,
}

/// Bytes one edge of the graph takes (its ends, tokens and duration).
pub(crate) const EDGE_BYTES: usize = 20;

/// The configuration graph: per edge its ends, duration (ms) and tokens generated; only
/// the Pareto-best (more tokens, less time) edges between two configurations.
#[derive(Clone)]
pub(super) struct Graph {
    /// Nodes (configurations; in [`super::balanced`], states within a batch too).
    pub configurations: usize,
    pub from: Vec<u32>,
    pub to: Vec<u32>,
    pub ms: Vec<f64>,
    pub tokens: Vec<u32>,
}

impl Graph {
    /// Where Dinkelbach's method starts: `start_rho` (a known schedule's ratio), at most
    /// the costliest edge's ratio of duration to tokens (which it is without one).
    pub(super) fn start_ratio(&self, start_rho: Option<f64>) -> f64 {
        let costliest = (0..self.from.len())
            .filter(|&e| self.tokens[e] > 0)
            .map(|e| self.ms[e] / f64::from(self.tokens[e]))
            .fold(0.0, f64::max);
        start_rho.map_or(costliest, |r| r.min(costliest))
    }
}

/// Adds an edge of `tokens` and `ms` to the Pareto set of edges between two nodes (more
/// tokens, less time), unless one there is at least as good.
pub(super) fn keep_pareto(set: &mut Vec<(u32, f64)>, tokens: u32, ms: f64) {
    if !set.iter().any(|&(t, m)| t >= tokens && m <= ms) {
        set.retain(|&(t, m)| !(tokens >= t && ms <= m));
        set.push((tokens, ms));
    }
}

/// How many first prefills or refills of one kind a batch can complete at most: each takes
/// a token and (all but one partial prompt's) a prompt's KV, within C, M and R_max.
pub(super) fn supply(model: &Model) -> Vec<u16> {
    let l = model.limits;
    let mut supply = vec![0u16; model.width];
    for c in &model.classes {
        let room = l
            .token_budget
            .unwrap_or(u64::MAX)
            .min(l.kv_capacity.unwrap_or(u64::MAX));
        let most = (room / c.input.max(1))
            .saturating_add(2)
            .min(l.max_running.map_or(u64::MAX, |r| r.saturating_add(1)))
            .min(u64::from(c.size));
        for g in 0..c.output {
            supply[c.pool(g)] = most as u16;
        }
    }
    supply
}

/// Builds the graph reachable from the empty configuration. None past `deadline`, past
/// `max_edges` (or a quarter as many configurations, each taking more), or where the build would not end by the deadline at the pace of its first
/// configurations (it gives up early instead of using its whole share).
fn graph(model: &Model, deadline: Instant, max_edges: usize) -> Option<Graph> {
    let supply = supply(model);
    let started = Instant::now();
    let mut configs = Reached::new(model.width);
    configs.insert(&vec![0u16; model.width], 0.0, u32::MAX);
    let mut g = Graph {
        configurations: 0,
        from: Vec::new(),
        to: Vec::new(),
        ms: Vec::new(),
        tokens: Vec::new(),
    };
    // Per configuration reached from the one expanded: its Pareto set of (tokens, ms).
    let mut pareto: Vec<Vec<(u32, f64)>> = Vec::new();
    let mut touched: Vec<u32> = Vec::new();
    let (mut key, mut counts) = (vec![0u16; model.width], vec![0u16; model.width]);
    let mut at = 0;
    while at < configs.len() {
        let now = Instant::now();
        if now > deadline || g.from.len() > max_edges {
            return None;
        }
        // The pace so far, over the configurations known (a breadth-first search finds
        // most of them early): give up if it would not end in time.
        if at >= 8 {
            let pace = (now - started).as_secs_f64() / at as f64;
            let left = Duration::try_from_secs_f64(pace * (configs.len() - at) as f64).ok()?;
            if now + left > deadline {
                return None;
            }
        }
        for ((c, s), k) in counts.iter_mut().zip(&supply).zip(configs.counts(at)) {
            *c = s + k;
        }
        let have = prompts_held(model, &counts);
        let mut emitted = 0usize;
        let complete = batches(
            model,
            &counts,
            None,
            &mut |next: &[u16], ms: f64, choices: &Choices| {
                // One configuration may have millions of batches (many classes): the clock
                // is read as they come.
                emitted += 1;
                if (emitted.is_multiple_of(4096) && Instant::now() > deadline)
                    || configs.len() > max_edges / 4
                {
                    return false;
                }
                configuration(model, next, &mut key);
                let to = match configs.find(&key) {
                    Some(j) => j,
                    None => configs.insert(&key, 0.0, u32::MAX),
                };
                if pareto.len() <= to {
                    pareto.resize(to + 1, Vec::new());
                }
                let tokens = generated(model, &have, &supply, choices);
                let set = &mut pareto[to];
                if set.is_empty() {
                    touched.push(to as u32);
                }
                keep_pareto(set, tokens, ms);
                true
            },
        );
        if !complete {
            return None;
        }
        for &to in &touched {
            for &(t, m) in &pareto[to as usize] {
                g.from.push(at as u32);
                g.to.push(to);
                g.tokens.push(t);
                g.ms.push(m);
            }
            pareto[to as usize].clear();
        }
        touched.clear();
        at += 1;
    }
    g.configurations = configs.len();
    Some(g)
}

/// The configuration of pooled vector `next` into `key`: without its pools and its
/// finished requests.
pub(super) fn configuration(model: &Model, next: &[u16], key: &mut [u16]) {
    key.copy_from_slice(next);
    for c in &model.classes {
        for count in 0..c.output {
            key[c.pool(count)] = 0;
        }
        key[c.finished()] = 0;
    }
}

/// Per class, the prompt tokens its partial first prefill holds in `counts` (what
/// [`generated`] counts completed prefills from).
pub(super) fn prompts_held(model: &Model, counts: &[u16]) -> Vec<u64> {
    model
        .classes
        .iter()
        .map(|c| u64::from(counts[c.prompt_held()]))
        .collect()
}

/// Tokens a pooled batch generates: completed first prefills, decodes and refills
/// through a token ([`Choices`], in the walk's order of steps).
pub(super) fn generated(model: &Model, have: &[u64], supply: &[u16], choices: &Choices) -> u32 {
    let mut slot = 0;
    let mut tokens = 0u64;
    for (k, c) in model.classes.iter().enumerate() {
        tokens += ((have[k] + choices[slot][0]) / c.input).min(u64::from(supply[c.pool(0)]));
        slot += 1;
        for _ in 1..c.output {
            tokens += choices[slot][0];
            slot += 1;
        }
        if c.output > 1 {
            for _ in 1..c.output {
                tokens += choices[slot][1];
                slot += 1;
            }
        }
    }
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// How a Bellman-Ford run at one ratio ended.
pub(super) enum Cycles {
    /// No cycle of negative `ms - rho x tokens`.
    None,
    /// One, as its edges.
    Negative(Vec<usize>),
}

/// Bellman-Ford from every configuration at once (all distances 0) on `ms - rho x tokens`;
/// None past the deadline.
pub(super) fn negative_cycle(g: &Graph, rho: f64, deadline: Instant) -> Option<Cycles> {
    Some(match bellman_ford(g, rho, SLACK_MS, deadline)? {
        Ok(_) => Cycles::None,
        Err(cycle) => Cycles::Negative(cycle),
    })
}

/// Bellman-Ford from every node at once (all distances 0) on `ms - rho x tokens`, an edge
/// relaxing only where it improves by more than `tolerance`: the distances (potentials
/// under which no edge's reduced cost is below `-tolerance`), or a cycle costing less than
/// 0 (among the parent edges). None past the deadline, or where neither is found.
pub(super) fn bellman_ford(
    g: &Graph,
    rho: f64,
    tolerance: f64,
    deadline: Instant,
) -> Option<Result<Vec<f64>, Vec<usize>>> {
    let n = g.configurations;
    let mut dist = vec![0.0f64; n];
    let mut parent = vec![u32::MAX; n];
    for _ in 0..=n {
        if Instant::now() > deadline {
            return None;
        }
        let mut changed = false;
        for e in 0..g.from.len() {
            let (u, v) = (g.from[e] as usize, g.to[e] as usize);
            let d = dist[u] + g.ms[e] - rho * f64::from(g.tokens[e]);
            if d < dist[v] - tolerance {
                dist[v] = d;
                parent[v] = e as u32;
                changed = true;
            }
        }
        if !changed {
            return Some(Ok(dist));
        }
        if let Some(cycle) = parent_cycle(g, &parent) {
            return Some(Err(cycle));
        }
    }
    parent_cycle(g, &parent).map(Err)
}

/// How much an edge may undercut its ends' distances and still count as relaxed (ms): a
/// walk of `N` batches then costs at least `rho x tokens - N x SLACK_MS`.
pub(super) const SLACK_MS: f64 = 1e-9;

/// A cycle among the parent edges (then a negative one), if any.
fn parent_cycle(g: &Graph, parent: &[u32]) -> Option<Vec<usize>> {
    let n = parent.len();
    let mut mark = vec![0u32; n];
    for s in 0..n {
        if mark[s] != 0 {
            continue;
        }
        let tag = s as u32 + 1;
        let mut v = s;
        while mark[v] == 0 && parent[v] != u32::MAX {
            mark[v] = tag;
            v = g.from[parent[v] as usize] as usize;
        }
        if mark[v] == tag {
            let (start, mut cycle) = (v, Vec::new());
            loop {
                let e = parent[v] as usize;
                cycle.push(e);
                v = g.from[e] as usize;
                if v == start {
                    return Some(cycle);
                }
            }
        }
        mark[v] = tag;
    }
    None
}

/// The cycle-ratio bound of the model's workload (makespan), starting from `start_rho`
/// (ms per token: a known schedule's ratio; None: the costliest edge's). None where the
/// graph passes `max_edges` or the deadline comes first (or would at its pace), or where
/// batches may cost nothing (the slack could not be bounded).
pub(crate) fn cycle_ratio(
    model: &Model,
    start_rho: Option<f64>,
    deadline: Instant,
    max_edges: usize,
) -> Option<CycleRatio> {
    let least_batch_ms = model.theta[infersched_core::Feature::One as usize];
    if least_batch_ms <= 0.0 {
        return None;
    }
    let g = graph(model, deadline, max_edges)?;
    // Every batch costs at least `least_batch_ms`, so a schedule of makespan `T` has at
    // most `T / least_batch_ms` batches, each undercutting by at most SLACK_MS.
    let bound_ms =
        least_ratio(&g, start_rho, deadline, 1.0 / least_batch_ms)? * model.tokens_generated();
    Some(CycleRatio {
        bound_ms,
        configurations: g.configurations,
        edges: g.from.len(),
        price_rounds: None,
    })
}

/// The least duration-to-tokens ratio of a cycle of `g` (Dinkelbach's method from
/// `start_rho`, or from the costliest edge's ratio), lowered for rounding: where a walk
/// of duration `T` has at most `T x edges_per_ms` edges, each undercutting by at most
/// SLACK_MS, its duration is at least the returned ratio times its tokens. None past the
/// deadline, or where a negative cycle generates no tokens or does not lower the ratio
/// (rounding).
pub(super) fn least_ratio(
    g: &Graph,
    start_rho: Option<f64>,
    deadline: Instant,
    edges_per_ms: f64,
) -> Option<f64> {
    match least_cycle_ratio(g, start_rho, deadline)? {
        // `T >= rho x tokens - T x edges_per_ms x SLACK_MS`.
        Least::Ratio(rho, _) => Some(rho / (1.0 + SLACK_MS * edges_per_ms)),
        Least::Unbounded(_) => None,
    }
}

/// How [`least_cycle_ratio`] ended.
pub(super) enum Least {
    /// No cycle has a ratio below this (before rounding), with the cycle that has it
    /// (None where it is the start).
    Ratio(f64, Option<Vec<usize>>),
    /// A cycle of negative duration and no tokens (no ratio bounds the graph).
    Unbounded(Vec<usize>),
}

/// Dinkelbach's method on `g` from `start_rho` (or the costliest edge's ratio): the
/// least ratio and its cycle. None past the deadline, or where a negative cycle does
/// not lower the ratio (rounding).
pub(super) fn least_cycle_ratio(
    g: &Graph,
    start_rho: Option<f64>,
    deadline: Instant,
) -> Option<Least> {
    let mut rho = g.start_ratio(start_rho);
    let mut last = None;
    loop {
        match negative_cycle(g, rho, deadline)? {
            Cycles::None => return Some(Least::Ratio(rho, last)),
            Cycles::Negative(cycle) => {
                let ms: f64 = cycle.iter().map(|&e| g.ms[e]).sum();
                let generated: f64 = cycle.iter().map(|&e| f64::from(g.tokens[e])).sum();
                if generated == 0.0 {
                    return (ms < 0.0).then_some(Least::Unbounded(cycle));
                }
                let ratio = ms / generated;
                // A negative cycle with tokens has a lower ratio; anything else is
                // rounding, where the search stops.
                if ratio >= rho {
                    return None;
                }
                rho = ratio;
                last = Some(cycle);
            }
        }
    }
}
