//! The layered bound on mean latency (milp.md, "The layered bound on mean latency").
//!
//! The sum of latencies of an offline workload is the sum over its batches of each
//! batch's duration times the requests not finished before it. Of identical requests, a
//! schedule's state between batches is its configuration (what holds memory, module
//! [`super::cycle`]), how many requests have finished, and its refill pools. Copy the
//! split graph of [`super::balanced`] once per count finished (a *layer*), weight each
//! batch's edges by the requests unfinished in its layer, and let a batch's close edge
//! lead to the layer of the count after it: every schedule is then a path from the empty
//! configuration with none finished to it with all finished, weighing at most its sum of
//! latencies, so the shortest path is a lower bound. Without evictions (no pools) it is
//! the pooled optimum.
//!
//! With evictions, the graph gives every refill pool an endless supply. A price per pool
//! position `j`, paid by each eviction into it and refunded by each refill from it, keeps
//! the bound valid when the price in layer `f` is `(n - f) x a_j` with `a_j <= 0`: a
//! request evicted in layer `f1` is refilled in a layer `f2 >= f1`, so its two prices add
//! `a_j x (f2 - f1) <= 0`. Each layer's costs are then `n - f` times one priced graph's,
//! searched by Dijkstra's method on reduced costs (potentials from Bellman-Ford on that
//! graph), the layers in the order of their counts. The prices are chosen by the level
//! bundle method ([`super::prices`]); they hardly depend on `n`, so it searches them on a
//! few requests first (each evaluation costs a fraction), then on all from there.
//!
//! The same graph, searched backwards from the goal, gives every configuration and count
//! finished a least cost to go ([`LayeredEstimate`]), the pooled search's estimate: less
//! the prices its pooled requests' refills may be refunded.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use infersched_core::Feature;

use super::super::store::Reached;
use super::balanced::{Split, minus_balance, price, split_graph};
use super::cycle::{Graph, bellman_ford, configuration};
use super::prices::{self, Cut, Stall};
use super::{Class, Model};

/// Bytes one edge takes here: the split graph's (its ends, tokens, duration, balance and
/// finishes: 26), the priced copy's and the copy without evictions' (20 each), and its
/// place in the adjacency by tail or by head (4).
pub(crate) const EDGE_BYTES: usize = 70;

/// What the bound found: the sum of latencies is at least `bound_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Layered {
    pub bound_ms: f64,
    /// Nodes and edges of one layer.
    pub nodes: usize,
    pub edges: usize,
    /// Rounds of the price search (with evictions).
    pub price_rounds: Option<usize>,
}

/// An entry of Dijkstra's queue: its key and node.
#[derive(PartialEq)]
struct Entry(f64, u32);

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// How much an edge's cost may undercut the schedule's (rounding, ms per request it
/// delays), and an improvement of a distance must exceed to count. The graph's durations
/// and the replay's are sums of a few products in f64 (errors of about 1e-15 ms), so the
/// allowance of a path is far above its rounding and far below the gaps a proof needs.
const ROUNDING_MS: f64 = 1e-12;

/// Potentials of `g.ms` (Bellman-Ford from every node at once) under which no edge's
/// reduced cost is below `-ROUNDING_MS`, or a cycle costing less than 0; None past the
/// deadline.
fn potentials(g: &Graph, deadline: Instant) -> Option<Result<Vec<f64>, Vec<usize>>> {
    bellman_ford(g, 0.0, ROUNDING_MS, deadline)
}

/// The edges of a graph by tail (`first[v] .. first[v + 1]` into `edge`), or by head.
struct Adjacency {
    first: Vec<u32>,
    edge: Vec<u32>,
}

impl Adjacency {
    fn new(nodes: usize, ends: &[u32]) -> Adjacency {
        let mut first = vec![0u32; nodes + 1];
        for &u in ends {
            first[u as usize + 1] += 1;
        }
        for v in 0..nodes {
            first[v + 1] += first[v];
        }
        let mut next = first.clone();
        let mut edge = vec![0u32; ends.len()];
        for (e, &u) in ends.iter().enumerate() {
            edge[next[u as usize] as usize] = e as u32;
            next[u as usize] += 1;
        }
        Adjacency { first, edge }
    }
    fn of(&self, v: usize) -> &[u32] {
        &self.edge[self.first[v] as usize..self.first[v + 1] as usize]
    }
}

/// How a layered search ended.
enum Layers {
    /// The shortest path's weight (ms), and its edges with their layers where asked for.
    Path(f64, Option<Vec<(usize, usize)>>),
    /// A cycle costing less than 0 (no bound at these prices).
    Negative(Vec<usize>),
}

/// One layer's labels (a ring of `window` layers of `nodes` labels each).
struct Ring {
    window: usize,
    nodes: usize,
    label: Vec<f64>,
}

impl Ring {
    fn new(split: &Split) -> Ring {
        let window = split.finishes.iter().copied().max().unwrap_or(0) as usize + 1;
        let nodes = split.graph.configurations;
        Ring {
            window,
            nodes,
            label: vec![f64::INFINITY; window * nodes],
        }
    }
    fn at(&self, f: usize, v: usize) -> usize {
        (f % self.window) * self.nodes + v
    }
    fn clear(&mut self, f: usize) {
        let at = self.at(f, 0);
        self.label[at..at + self.nodes].fill(f64::INFINITY);
    }
}

/// The shortest layered path (edge costs `g.ms`, prices included, in layer `f`
/// multiplied by `n - f`) from the empty configuration with none finished to it with all
/// `requests` finished. None past the deadline or where no path reaches it. Its edges
/// are returned where their parents (4 bytes a node and layer) fit `max_parents`.
fn shortest_layered_path(
    split: &Split,
    g: &Graph,
    requests: usize,
    deadline: Instant,
    max_parents: usize,
) -> Option<Layers> {
    let pi = match potentials(g, deadline)? {
        Ok(pi) => pi,
        Err(cycle) => return Some(Layers::Negative(cycle)),
    };
    let nodes = g.configurations;
    let out = Adjacency::new(nodes, &g.from);
    let mut ring = Ring::new(split);
    let track = (requests + 1).saturating_mul(nodes) <= max_parents;
    let mut parent = if track {
        vec![u32::MAX; (requests + 1) * nodes]
    } else {
        Vec::new()
    };
    let start = ring.at(0, 0);
    ring.label[start] = 0.0;
    let mut heap = BinaryHeap::new();
    for f in 0..requests {
        let m = (requests - f) as f64;
        let tolerance = m * ROUNDING_MS;
        // Keys `label - m x pi`: reduced costs are (about) non-negative.
        for (v, &p) in pi.iter().enumerate() {
            let d = ring.label[ring.at(f, v)];
            if d.is_finite() {
                heap.push(Reverse(Entry(d - m * p, v as u32)));
            }
        }
        let mut popped = 0usize;
        while let Some(Reverse(Entry(key, v))) = heap.pop() {
            let v = v as usize;
            let d = ring.label[ring.at(f, v)];
            if key > d - m * pi[v] {
                continue;
            }
            popped += 1;
            if popped.is_multiple_of(4096) && Instant::now() > deadline {
                return None;
            }
            // Requests held (and finishing) are among those not finished.
            if usize::from(split.holding[v]) + f > requests {
                continue;
            }
            for &e in out.of(v) {
                let e = e as usize;
                let to = g.to[e] as usize;
                let k = usize::from(split.finishes[e]);
                let (layer, nd) = if k == 0 {
                    (f, d + m * g.ms[e])
                } else if f + k <= requests {
                    // A close edge (no cost): to the layer of those finished after it.
                    (f + k, d)
                } else {
                    continue;
                };
                let at = ring.at(layer, to);
                if nd < ring.label[at] - tolerance {
                    ring.label[at] = nd;
                    if track {
                        parent[layer * nodes + to] = e as u32;
                    }
                    if k == 0 {
                        heap.push(Reverse(Entry(nd - m * pi[to], to as u32)));
                    }
                }
            }
        }
        ring.clear(f);
    }
    let total = ring.label[ring.at(requests, 0)];
    if !total.is_finite() {
        return None;
    }
    let path = track.then(|| {
        let (mut f, mut v, mut edges) = (requests, 0usize, Vec::new());
        while parent[f * nodes + v] != u32::MAX {
            let e = parent[f * nodes + v] as usize;
            f -= usize::from(split.finishes[e]);
            edges.push((e, f));
            v = g.from[e] as usize;
        }
        edges.reverse();
        edges
    });
    Some(Layers::Path(total, path))
}

/// The least cost to go (ms, prices included, before rounding) from every configuration
/// with every count finished to the goal, backwards through the layers: per count `f`,
/// one value per configuration (`f x configurations + id`). None past the deadline or
/// on a cycle costing less than 0.
fn costs_to_go(split: &Split, g: &Graph, requests: usize, deadline: Instant) -> Option<Vec<f64>> {
    let pi = potentials(g, deadline)?.ok()?;
    let nodes = g.configurations;
    let configs = split.config_node.len();
    let into = Adjacency::new(nodes, &g.to);
    // The close edges of batches that finish requests: the only ones between layers.
    let closes: Vec<usize> = (0..g.from.len())
        .filter(|&e| split.finishes[e] != 0)
        .collect();
    // One layer's labels: the layers after it are kept in `to_go`.
    let mut label = vec![f64::INFINITY; nodes];
    let mut to_go = vec![f64::INFINITY; (requests + 1) * configs];
    to_go[requests * configs] = 0.0;
    let mut heap = BinaryHeap::new();
    for f in (0..requests).rev() {
        let m = (requests - f) as f64;
        let tolerance = m * ROUNDING_MS;
        label.fill(f64::INFINITY);
        // From every node within a batch finishing `k` requests, the cost to go of its
        // configuration `k` layers on.
        for &e in &closes {
            let k = usize::from(split.finishes[e]);
            let from = g.from[e] as usize;
            if f + k > requests || usize::from(split.holding[from]) + f > requests {
                continue;
            }
            let config = split.config_of[g.to[e] as usize] as usize;
            label[from] = label[from].min(to_go[(f + k) * configs + config]);
        }
        // Keys `label + m x pi`: reduced costs (about) non-negative, backwards.
        for (v, &p) in pi.iter().enumerate() {
            if label[v].is_finite() {
                heap.push(Reverse(Entry(label[v] + m * p, v as u32)));
            }
        }
        let mut popped = 0usize;
        while let Some(Reverse(Entry(key, v))) = heap.pop() {
            let v = v as usize;
            let d = label[v];
            if key > d + m * pi[v] {
                continue;
            }
            popped += 1;
            if popped.is_multiple_of(4096) && Instant::now() > deadline {
                return None;
            }
            for &e in into.of(v) {
                let e = e as usize;
                if split.finishes[e] != 0 {
                    continue;
                }
                let from = g.from[e] as usize;
                if usize::from(split.holding[from]) + f > requests {
                    continue;
                }
                let nd = d + m * g.ms[e];
                if nd < label[from] - tolerance {
                    label[from] = nd;
                    heap.push(Reverse(Entry(nd + m * pi[from], from as u32)));
                }
            }
        }
        for (id, &node) in split.config_node.iter().enumerate() {
            if usize::from(split.holding[node as usize]) + f <= requests {
                to_go[f * configs + id] = label[node as usize];
            }
        }
    }
    Some(to_go)
}

/// The pooled search's estimate from the layered graph: a vector's least cost to go is at
/// least its configuration's in the layer of its count finished, less `(n - f) x
/// (-a_j)` per pooled request at position `j` (a refill is refunded at most its price in
/// the current layer, prices being non-decreasing in the count finished).
pub(crate) struct LayeredEstimate {
    class: Class,
    requests: usize,
    /// The graph's configurations (ids).
    configs: Reached,
    /// Per count finished and configuration: its cost to go (ms, after rounding).
    to_go: Vec<f64>,
    /// Per vector position: minus its price per request unfinished (0 but for pools).
    refund: Vec<f64>,
    key: std::cell::RefCell<Vec<u16>>,
}

impl LayeredEstimate {
    /// The estimate at pooled vector `counts` (ms of the sum of latencies); 0 where its
    /// configuration is not in the graph.
    pub(super) fn of(&self, model: &Model, counts: &[u16]) -> f64 {
        let mut key = self.key.borrow_mut();
        configuration(model, counts, &mut key);
        let Some(id) = self.configs.find(&key) else {
            return 0.0;
        };
        let f = usize::from(counts[self.class.finished()]);
        let configs = self.configs.len();
        let to_go = self.to_go[f.min(self.requests) * configs + id];
        let unfinished = self.requests.saturating_sub(f) as f64;
        let refunds: f64 = (1..self.class.output)
            .map(|g| {
                let j = self.class.pool(g);
                f64::from(counts[j]) * self.refund[j]
            })
            .sum();
        (to_go - unfinished * refunds).max(0.0)
    }
}

/// What [`layered_mean_latency`] found.
pub(crate) struct LayeredFound {
    pub bound: Layered,
    /// The pooled search's estimate, where asked for and it fits.
    pub estimate: Option<LayeredEstimate>,
}

/// When the price search on a few requests has done what it can for the prices on all:
/// family (a) with C = 64 gains under 1e-5 a round after about 20 rounds on 8 requests.
const FEW_STALL: Stall = Stall {
    rounds: 4,
    gain: 1e-5,
};

/// When the price search on all requests stops short of a proof, leaving the rest of its
/// share to the pooled search its costs to go guide.
const ALL_STALL: Stall = Stall {
    rounds: 4,
    gain: 1e-6,
};

/// The requests the price search first runs on (then on all): twice as many as a batch
/// may finish, and at least 8 (family (a) with C = 64: the prices found on 8 requests bound
/// 32 within 0.26%, as many rounds on 32 took 24 evaluations); all where that is not under
/// half of them (an evaluation on all costs at most twice as much).
fn few_requests(split: &Split, requests: usize) -> usize {
    let most_finishing = split.finishes.iter().copied().max().unwrap_or(0) as usize;
    let few = (2 * most_finishing).max(8);
    if 2 * few > requests { requests } else { few }
}

/// The layered bound on the sum of latencies (ms) of the model's workload: one class of
/// identical requests, each generating at least two tokens. `target_ms`: a known
/// schedule's sum of latencies, where the price search stops (with evictions). With
/// `estimate_until`, also the pooled search's estimate from the same graph by then, where
/// its table (8 bytes per configuration and count) fits `max_edges` edges' memory. None
/// where it does not apply, where the graph passes `max_edges`, or past the deadline (the
/// first evaluation on all requests may run to `estimate_until`, unless at the pace of those
/// on a few it would not end by then).
pub(crate) fn layered_mean_latency(
    model: &Model,
    target_ms: f64,
    deadline: Instant,
    max_edges: usize,
    estimate_until: Option<Instant>,
) -> Option<LayeredFound> {
    let least_batch_ms = model.theta[Feature::One as usize];
    let [class] = model.classes.as_slice() else {
        return None;
    };
    if least_batch_ms <= 0.0 || model.no_mix || class.output < 2 || !target_ms.is_finite() {
        return None;
    }
    let requests = usize::from(class.size);
    let started = Instant::now();
    let split = split_graph(model, deadline, max_edges)?;
    let mut edges_per_ms = 2.0 / least_batch_ms;
    let mut priced = split.graph.clone();
    let memory = max_edges.saturating_mul(EDGE_BYTES);
    let mut prices = vec![0.0; model.width];
    // The longest an evaluation took per request (s).
    let per_request_s = std::cell::Cell::new(0.0f64);
    let (total, rounds) = if model.evictions {
        if split.least_refill_ms <= 0.0 {
            return None;
        }
        edges_per_ms += 2.0 / split.least_refill_ms;
        let run = PricedSearch {
            split: &split,
            requests,
            started,
            deadline,
            latest: estimate_until.map_or(deadline, |until| until.max(deadline)),
            max_parents: memory / 4,
            per_request_s: &per_request_s,
        };
        let (total, rounds, found) = run.search(&mut priced, &prices, target_ms)?;
        prices = found;
        (total, Some(rounds))
    } else {
        match shortest_layered_path(&split, &priced, requests, deadline, 0)? {
            Layers::Path(total, _) => (total, None),
            Layers::Negative(_) => return None,
        }
    };
    if !total.is_finite() {
        return None;
    }
    // Each edge may undercut by ROUNDING_MS in the graph and as much in the search, per
    // request unfinished (at most n); a schedule whose sum of latencies is `S` has a
    // makespan of at most `S`, so at most `S x edges_per_ms` edges.
    let rounding = 1.0 + 2.0 * ROUNDING_MS * edges_per_ms * requests as f64;
    let bound = Layered {
        bound_ms: total / rounding,
        nodes: split.graph.configurations,
        edges: split.graph.from.len(),
        price_rounds: rounds,
    };
    let configs = split.config_node.len();
    let fits = (requests + 1).saturating_mul(configs).saturating_mul(8) <= memory;
    let pace = Duration::try_from_secs_f64(per_request_s.get() * requests as f64);
    let estimate = match estimate_until {
        // Where it would end in time at the pace of the evaluations.
        Some(until) if fits && pace.is_ok_and(|pace| Instant::now() + pace <= until) => {
            price(&split, &prices, &mut priced);
            costs_to_go(&split, &priced, requests, until).map(|to_go| LayeredEstimate {
                class: class.clone(),
                requests,
                to_go: to_go.into_iter().map(|c| c / rounding).collect(),
                refund: prices.iter().map(|&a| -a).collect(),
                key: std::cell::RefCell::new(vec![0; model.width]),
                configs: split.configs,
            })
        }
        _ => None,
    };
    Some(LayeredFound { bound, estimate })
}

/// The price search of the layered bound with evictions: eviction prices that make the
/// shortest layered path as long as possible.
struct PricedSearch<'s> {
    split: &'s Split,
    requests: usize,
    started: Instant,
    deadline: Instant,
    /// The first evaluation on all requests may run until then (the pooled search's
    /// deadline for the estimate, if later).
    latest: Instant,
    /// Parents of every layer's nodes take 4 bytes each.
    max_parents: usize,
    /// The longest an evaluation took per request (s).
    per_request_s: &'s std::cell::Cell<f64>,
}

impl PricedSearch<'_> {
    /// First on a few requests, in up to half the time; then on all: the first evaluation
    /// (the bound) by `latest` if need be (unless it would not end by then at the pace of
    /// those on a few), more within this share. The best total, the rounds, the prices.
    fn search(
        &self,
        priced: &mut Graph,
        start: &[f64],
        target_ms: f64,
    ) -> Option<(f64, usize, Vec<f64>)> {
        let split = self.split;
        let mut prices = start.to_vec();
        let few = few_requests(split, self.requests);
        let mut rounds = 0;
        if few < self.requests {
            let half = self.started + self.deadline.saturating_duration_since(self.started) / 2;
            // Their target: their optimum without evictions (the graph without its eviction
            // and refill edges), at least their optimum with them.
            let mut plain = split.graph.clone();
            for (ms, &b) in plain.ms.iter_mut().zip(&split.balance) {
                if b != 0 {
                    *ms = f64::INFINITY;
                }
            }
            let few_target = match shortest_layered_path(split, &plain, few, half, 0)? {
                Layers::Path(total, _) => total,
                Layers::Negative(_) => return None,
            };
            drop(plain);
            let stretch = std::cell::Cell::new(None);
            if let Some((_, r, found)) =
                self.best_prices(priced, few, &prices, few_target, FEW_STALL, half, &stretch)
            {
                prices = found;
                rounds += r;
            }
        }
        let per_request = self.per_request_s.get() * self.requests as f64;
        let pace = Duration::try_from_secs_f64(per_request).ok()?;
        if Instant::now() + pace > self.latest {
            return None;
        }
        let stretch = std::cell::Cell::new(Some(self.latest));
        let (total, r, found) = self.best_prices(
            priced,
            self.requests,
            &prices,
            target_ms,
            ALL_STALL,
            self.deadline,
            &stretch,
        )?;
        Some((total, rounds + r, found))
    }

    /// The best prices for `n` requests from `start` toward `target` (ms), each evaluation
    /// the shortest layered path under them by `until` (the first one by `stretch`, if set
    /// and later).
    #[allow(clippy::too_many_arguments)]
    fn best_prices(
        &self,
        priced: &mut Graph,
        n: usize,
        start: &[f64],
        target: f64,
        stall: Stall,
        until: Instant,
        stretch: &std::cell::Cell<Option<Instant>>,
    ) -> Option<(f64, usize, Vec<f64>)> {
        let split = self.split;
        let mut evaluate = |a: &[f64], _: f64, cuts: &mut Vec<Cut>| -> Option<f64> {
            let until = stretch.take().map_or(until, |later| later.max(until));
            price(split, a, priced);
            let began = Instant::now();
            let found = shortest_layered_path(split, priced, n, until, self.max_parents);
            let s = began.elapsed().as_secs_f64() / n as f64;
            self.per_request_s.set(self.per_request_s.get().max(s));
            match found? {
                Layers::Path(total, path) => {
                    if let Some(path) = path {
                        cuts.push(path_cut(split, n, &path));
                    }
                    Some(total)
                }
                Layers::Negative(cycle) => {
                    cuts.push(cycle_cut(split, &cycle));
                    Some(f64::NEG_INFINITY)
                }
            }
        };
        // Prices beyond the target per request evicted are not searched.
        let most = target.max(1.0);
        prices::best_prices(
            start,
            -most..=0.0,
            target,
            target * (1.0 - 4e-9),
            stall,
            until,
            &mut evaluate,
        )
    }
}

/// A path as the price search sees it: `t - weighted balance . a <= weight`, each edge's
/// duration and balance weighted by the requests unfinished in its layer.
fn path_cut(split: &Split, requests: usize, path: &[(usize, usize)]) -> Cut {
    let weighted = || path.iter().map(|&(e, f)| (e, (requests - f) as f64));
    Cut {
        rhs: weighted().map(|(e, m)| m * split.graph.ms[e]).sum(),
        t_coef: 1.0,
        coefs: minus_balance(split, weighted()),
    }
}

/// A cycle costing less than 0 at some prices: every price allowed keeps it at least 0,
/// `- balance . a <= ms`.
fn cycle_cut(split: &Split, cycle: &[usize]) -> Cut {
    Cut {
        rhs: cycle.iter().map(|&e| split.graph.ms[e]).sum(),
        t_coef: 0.0,
        coefs: minus_balance(split, cycle.iter().map(|&e| (e, 1.0))),
    }
}
