//! The balanced cycle-ratio bound on makespan with evictions (milp.md, "The balanced
//! cycle-ratio bound").
//!
//! The cycle-ratio bound ([`super::cycle`]) gives every refill pool an endless supply, so
//! with evictions its best cycle may evict requests late and "refill" others early that
//! were never evicted. A schedule refills exactly as many requests of each pool as it
//! evicts into it, so a price `mu_j` per pool `j`, paid by each eviction into it and
//! refunded by each refill from it, adds nothing to any schedule: every schedule still
//! costs at least `rho x tokens`, `rho` now the least ratio of a cycle of
//! `duration + mu x (evictions - refills)` to tokens. The prices are chosen by a linear
//! program (below) to make that ratio as large as they can.
//!
//! The graph splits a batch into its parts, so that its edges stay as few as without
//! evictions. Per configuration three nodes: the configuration between batches, and
//! within a batch after its decodes and first prefills, without or with a prompt token.
//!
//! - a *batch* edge: a pooled batch without evictions or refills (the Pareto-best of
//!   duration and tokens per end), to the node within the batch after it; or the empty
//!   batch (its per-batch cost only) for a batch of refills alone;
//! - a *refill* edge within a batch, to decode-ready (`k - 1` tokens) or through a token
//!   (`k`): its tokens, phase and, from a batch without a prompt token, the prefill flag,
//!   with the refilled request's KV and holder within M and R_max;
//! - a *close* edge from within a batch to its configuration, at no cost;
//! - an *eviction* edge between configurations, at no cost but its price.
//!
//! Every pooled path maps onto a walk of it with no more cost (a batch's evictions before
//! it, its refills after its other parts, each refill costing no more than it adds to the
//! batch, and C, M checked on fewer tokens), from the empty configuration back to it; its
//! prices cancel, so the bound holds.
//!
//! The prices come from the linear program `max rho` over potentials `pi` and prices `mu`
//! such that every edge `u -> v` has `pi_v - pi_u + rho x tokens - mu x balance <= ms`
//! (no cycle's weight below 0 at `rho`). Its rows are added as they are violated (per node,
//! the most violated edge into it), each round warm-started from the last basis. Whatever
//! prices it ends with, the bound is then proven by Dinkelbach's method on the graph with
//! the prices' costs (Bellman-Ford, exactly as [`super::cycle`]), so a round cut short by the
//! clock still gives a valid bound.

use std::time::{Duration, Instant};

use infersched_core::Feature;

use super::super::batches::Load;
use super::super::store::Reached;
use super::cycle::{
    CycleRatio, Graph, Least, SLACK_MS, configuration, generated, keep_pareto, least_cycle_ratio,
    prompts_held, supply,
};
use super::prices::{self, Cut, Stall, add_coef};
use super::{Model, batches};

/// Bytes one edge of the split graph takes: its ends, tokens, duration, balance and
/// finishes (26), and its copy with prices the search evaluates (20).
pub(crate) const EDGE_BYTES: usize = 46;

/// The split graph. Its nodes are configurations between batches and states within a
/// batch after its decodes and first prefills ([`Inner`]).
pub(super) struct Split {
    pub graph: Graph,
    /// Per edge: 0, `j + 1` for an eviction into pool position `j`, `-(j + 1)` for a
    /// refill from it.
    pub balance: Vec<i32>,
    /// Per edge: the requests it finishes (a close edge: those finishing in its batch).
    pub finishes: Vec<u16>,
    /// Per node: the requests it holds (a state within a batch: after the batch, and
    /// those finishing in it).
    pub holding: Vec<u16>,
    /// The cheapest refill edge (ms).
    pub least_refill_ms: f64,
    /// The configurations (ids), the node of each, and per node its configuration.
    pub configs: Reached,
    pub config_node: Vec<u32>,
    pub config_of: Vec<u32>,
}

/// A state within a batch: its configuration after the batch (id), whether the batch has
/// a prompt token, the KV its finishing requests hold in it, and the prompt tokens it can
/// still take (within C and P; `u32::MAX`: no limit).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Inner {
    config: u32,
    prompt: bool,
    finishing: u32,
    finishing_kv: u64,
    room: u32,
}

/// A node of the split graph.
#[derive(Clone, Copy)]
enum Node {
    Config(u32),
    Inner(Inner),
}

/// KV (tokens) and holders of a configuration.
fn held(model: &Model, key: &[u16]) -> (u64, u64) {
    let (mut kv, mut holders) = (0, 0);
    for c in &model.classes {
        for g in 1..c.output {
            let n = u64::from(key[c.ready(g)]);
            kv += n * (c.known(g) - 1);
            holders += n;
        }
        let prompt = u64::from(key[c.prompt_held()]);
        kv += prompt;
        holders += u64::from(prompt > 0);
    }
    (kv, holders)
}

/// The prompt tokens a batch of `tokens` tokens (`prefill` of them prompt tokens) can
/// still take within C and P.
fn room(model: &Model, tokens: u64, prefill: u64) -> u32 {
    let load = Load {
        tokens,
        prefill,
        ..Load::default()
    };
    u32::try_from(load.prompt_room(model.limits)).unwrap_or(u32::MAX)
}

/// The nodes and configurations found so far.
struct Nodes {
    configs: Reached,
    config_node: Vec<u32>,
    inner: rustc_hash::FxHashMap<Inner, u32>,
    nodes: Vec<Node>,
}

impl Nodes {
    fn config(&mut self, key: &[u16]) -> u32 {
        match self.configs.find(key) {
            Some(i) => i as u32,
            None => {
                let i = self.configs.insert(key, 0.0, u32::MAX) as u32;
                self.config_node.push(self.nodes.len() as u32);
                self.nodes.push(Node::Config(i));
                i
            }
        }
    }
    fn config_node(&mut self, key: &[u16]) -> usize {
        let i = self.config(key);
        self.config_node[i as usize] as usize
    }
    fn inner(&mut self, state: Inner) -> usize {
        let next = self.nodes.len() as u32;
        let id = *self.inner.entry(state).or_insert(next);
        if id == next {
            self.nodes.push(Node::Inner(state));
        }
        id as usize
    }
}

impl Split {
    fn push(&mut self, from: usize, to: usize, ms: f64, tokens: u32, balance: i32) {
        let g = &mut self.graph;
        g.from.push(from as u32);
        g.to.push(to as u32);
        g.ms.push(ms);
        g.tokens.push(tokens);
        self.balance.push(balance);
        self.finishes.push(0);
    }
}

/// Builds the split graph reachable from the empty configuration; None past `deadline`
/// (or where its pace says it would not end by then) or past `max_edges`.
pub(super) fn split_graph(model: &Model, deadline: Instant, max_edges: usize) -> Option<Split> {
    let plain = model.without_evictions();
    let mut b = SplitBuilder::new(model, &plain, deadline, max_edges);
    let started = Instant::now();
    let mut at = 0;
    while at < b.n.nodes.len() {
        let now = Instant::now();
        if now > deadline || b.split.graph.from.len() > max_edges {
            return None;
        }
        if at >= 64 {
            let pace = (now - started).as_secs_f64() / at as f64;
            let left = Duration::try_from_secs_f64(pace * (b.n.nodes.len() - at) as f64).ok()?;
            if now + left > deadline {
                return None;
            }
        }
        match b.n.nodes[at] {
            Node::Config(config) => b.expand_config(at, config)?,
            Node::Inner(state) => b.expand_inner(at, state),
        }
        at += 1;
    }
    Some(b.finish())
}

/// The split graph under construction, node by node.
struct SplitBuilder<'m, 'a> {
    model: &'m Model<'a>,
    /// The model without evictions (the pooled batches of a configuration).
    plain: &'m Model<'a>,
    supply: Vec<u16>,
    /// Where each class's first prefill is decided in a batch's choices.
    first_slots: Vec<usize>,
    full_room: u32,
    deadline: Instant,
    max_edges: usize,
    n: Nodes,
    split: Split,
    /// Per node within a batch reached from the configuration expanded: its Pareto set.
    pareto: rustc_hash::FxHashMap<Inner, Vec<(u32, f64)>>,
    key: Vec<u16>,
    counts: Vec<u16>,
}

impl<'m, 'a> SplitBuilder<'m, 'a> {
    fn new(
        model: &'m Model<'a>,
        plain: &'m Model<'a>,
        deadline: Instant,
        max_edges: usize,
    ) -> Self {
        let mut n = Nodes {
            configs: Reached::new(model.width),
            config_node: Vec::new(),
            inner: Default::default(),
            nodes: Vec::new(),
        };
        n.config(&vec![0u16; model.width]);
        let mut first_slots = Vec::new();
        let mut slot = 0;
        for c in &model.classes {
            first_slots.push(slot);
            slot += 1 + 2 * (c.output as usize - 1);
        }
        Self {
            model,
            plain,
            supply: supply(model),
            first_slots,
            full_room: room(model, 0, 0),
            deadline,
            max_edges,
            n,
            split: Split {
                graph: Graph {
                    configurations: 0,
                    from: Vec::new(),
                    to: Vec::new(),
                    ms: Vec::new(),
                    tokens: Vec::new(),
                },
                balance: Vec::new(),
                finishes: Vec::new(),
                holding: Vec::new(),
                least_refill_ms: f64::INFINITY,
                configs: Reached::new(0),
                config_node: Vec::new(),
                config_of: Vec::new(),
            },
            pareto: Default::default(),
            key: vec![0u16; model.width],
            counts: vec![0u16; model.width],
        }
    }

    /// A configuration node: an edge per Pareto-best batch to its state within the batch,
    /// the empty batch, and (with evictions) an edge per eviction. None past the deadline
    /// or the edge cap.
    fn expand_config(&mut self, at: usize, config: u32) -> Option<()> {
        self.batch_states(config)?;
        for (state, set) in self.pareto.drain() {
            let to = self.n.inner(state);
            for (t, m) in set {
                self.split.push(at, to, m, t, 0);
            }
        }
        // The empty batch (for refills alone).
        let empty = self.n.inner(Inner {
            config,
            prompt: false,
            finishing: 0,
            finishing_kv: 0,
            room: self.full_room,
        });
        let one = self.model.theta[Feature::One as usize];
        self.split.push(at, empty, one, 0, 0);
        if !self.model.evictions {
            return Some(());
        }
        let key = &mut self.key;
        key.copy_from_slice(self.n.configs.counts(config as usize));
        for c in &self.model.classes {
            for g in 1..c.output {
                if key[c.ready(g)] > 0 {
                    key[c.ready(g)] -= 1;
                    let to = self.n.config_node(key);
                    key[c.ready(g)] += 1;
                    self.split.push(at, to, 0.0, 0, c.pool(g) as i32 + 1);
                }
            }
        }
        Some(())
    }

    /// The states within a batch that `config`'s pooled batches reach, each with its
    /// Pareto set of (tokens generated, ms), into `pareto`. None past the deadline or cap.
    fn batch_states(&mut self, config: u32) -> Option<()> {
        let Self {
            model,
            plain,
            supply,
            first_slots,
            deadline,
            max_edges,
            n,
            pareto,
            key,
            counts,
            ..
        } = self;
        let (model, plain, deadline, max_edges) = (*model, *plain, *deadline, *max_edges);
        counts.copy_from_slice(n.configs.counts(config as usize));
        for c in &model.classes {
            counts[c.pool(0)] = supply[c.pool(0)];
        }
        let have = prompts_held(model, counts);
        let mut emitted = 0usize;
        let complete = batches(plain, counts, None, &mut |next, ms, choices| {
            emitted += 1;
            if (emitted.is_multiple_of(4096) && Instant::now() > deadline)
                || n.nodes.len() > max_edges / 4
            {
                return false;
            }
            configuration(model, next, key);
            let to = n.config(key);
            let (mut tokens, mut prefill, mut finishing, mut finishing_kv) = (0, 0, 0, 0);
            for (c, &s) in model.classes.iter().zip(first_slots.iter()) {
                prefill += choices[s][0];
                tokens += choices[s][0];
                for g in 1..c.output {
                    tokens += choices[s + g as usize][0];
                }
                if c.output > 1 {
                    let last = choices[s + c.output as usize - 1][0];
                    finishing += last;
                    finishing_kv += last * c.known(c.output - 1);
                }
            }
            let state = Inner {
                config: to,
                prompt: prefill > 0,
                finishing: u32::try_from(finishing).unwrap_or(u32::MAX),
                finishing_kv,
                room: room(model, tokens, prefill),
            };
            let generated = generated(plain, &have, supply, choices);
            keep_pareto(pareto.entry(state).or_default(), generated, ms);
            true
        });
        complete.then_some(())
    }

    /// A state within a batch: the edge that closes the batch and (with evictions) an edge
    /// per refill the batch can still take.
    fn expand_inner(&mut self, at: usize, state: Inner) {
        self.key
            .copy_from_slice(self.n.configs.counts(state.config as usize));
        let close = self.n.config_node[state.config as usize] as usize;
        self.split.push(at, close, 0.0, 0, 0);
        *self.split.finishes.last_mut().expect("the close edge") =
            u16::try_from(state.finishing).unwrap_or(u16::MAX);
        if !self.model.evictions {
            return;
        }
        let model = self.model;
        let (kv, holders) = held(model, &self.key);
        let kv = kv + state.finishing_kv;
        let l = model.limits;
        for c in &model.classes {
            for g in 1..c.output {
                let j = c.pool(g) as i32 + 1;
                let known = c.known(g);
                let finishes = g + 1 == c.output;
                // To decode-ready (`k - 1` tokens, one in the batch), or through a token
                // (`k`, two in it, holding its KV in the batch).
                for (q, least, tokens) in [(known - 1, 1u32, 0u32), (known, 2, 1)] {
                    let holder = u64::from(tokens == 0 || !finishes);
                    if least > state.room
                        || l.kv_capacity.is_some_and(|m| kv + q > m)
                        || l.max_running.is_some_and(|r| holders + holder > r)
                    {
                        continue;
                    }
                    let lands = if tokens == 0 {
                        c.ready(g)
                    } else {
                        c.after(g + 1)
                    };
                    let to = self.refill_state(state, lands, c.finished(), q, least);
                    let mut ms = q as f64 * model.token_ms() + model.phase_ms(q);
                    self.split.least_refill_ms = self.split.least_refill_ms.min(ms);
                    if !state.prompt {
                        ms += model.theta[Feature::HasPrefill as usize];
                    }
                    self.split.push(at, to, ms, tokens, -j);
                }
            }
        }
    }

    /// The state within the batch after a refill of `q` tokens (at least `least` of the
    /// batch's room) that lands in position `lands` (`finished`: the request finishes).
    fn refill_state(
        &mut self,
        state: Inner,
        lands: usize,
        finished: usize,
        q: u64,
        least: u32,
    ) -> usize {
        let (config, finishing, finishing_kv) = if lands == finished {
            (state.config, state.finishing + 1, state.finishing_kv + q)
        } else {
            self.key[lands] += 1;
            let to = self.n.config(&self.key);
            self.key[lands] -= 1;
            (to, state.finishing, state.finishing_kv)
        };
        self.n.inner(Inner {
            config,
            prompt: true,
            finishing,
            finishing_kv,
            room: state.room.saturating_sub(least),
        })
    }

    /// The split graph: per node the requests it holds and its configuration.
    fn finish(self) -> Split {
        let (model, n, mut split) = (self.model, self.n, self.split);
        split.holding = n
            .nodes
            .iter()
            .map(|node| {
                let (config, finishing) = match *node {
                    Node::Config(c) => (c, 0),
                    Node::Inner(i) => (i.config, u64::from(i.finishing)),
                };
                let (_, holders) = held(model, n.configs.counts(config as usize));
                u16::try_from(holders + finishing).unwrap_or(u16::MAX)
            })
            .collect();
        split.graph.configurations = n.nodes.len();
        split.config_of = n
            .nodes
            .iter()
            .map(|node| match *node {
                Node::Config(c) => c,
                Node::Inner(i) => i.config,
            })
            .collect();
        split.configs = n.configs;
        split.config_node = n.config_node;
        split
    }
}

/// Writes each edge's duration with its price (`mu` per pool position) into `priced`.
pub(super) fn price(split: &Split, mu: &[f64], priced: &mut Graph) {
    for ((p, &ms), &b) in priced
        .ms
        .iter_mut()
        .zip(&split.graph.ms)
        .zip(&split.balance)
    {
        *p = match b {
            0 => ms,
            b if b > 0 => ms + mu[b as usize - 1],
            b => ms - mu[(-b) as usize - 1],
        };
    }
}

/// A cycle as the price search sees it: `tokens x rho - (evictions - refills) . mu <=
/// ms` (its duration without prices).
fn cut(split: &Split, cycle: &[usize]) -> Cut {
    let g = &split.graph;
    Cut {
        rhs: cycle.iter().map(|&e| g.ms[e]).sum(),
        t_coef: cycle.iter().map(|&e| f64::from(g.tokens[e])).sum(),
        coefs: minus_balance(split, cycle.iter().map(|&e| (e, 1.0))),
    }
}

/// Minus the evictions less refills per pool position of `edges`, each counted `weight`
/// times (the coefficients of the prices in a cut's row).
pub(super) fn minus_balance(
    split: &Split,
    edges: impl Iterator<Item = (usize, f64)>,
) -> Vec<(usize, f64)> {
    let mut coefs = Vec::new();
    for (e, weight) in edges {
        match split.balance[e] {
            0 => {}
            b if b > 0 => add_coef(&mut coefs, b as usize - 1, -weight),
            b => add_coef(&mut coefs, (-b) as usize - 1, weight),
        }
    }
    coefs.retain(|&(_, n)| n != 0.0);
    coefs
}

/// The prices that make the least cycle ratio largest ([`prices::best_prices`]; each
/// evaluation is Dinkelbach's method at the prices, its cut the cycle of the least
/// ratio). Stops within 4e-9 of `target_rho` (the incumbent's: proven). Returns the least
/// ratio found (before rounding), the rounds it took and its prices; None where not even
/// the first could be computed.
pub(super) fn best_ratio_prices(
    split: &Split,
    width: usize,
    target_rho: f64,
    deadline: Instant,
) -> Option<(f64, usize, Vec<f64>)> {
    let mut priced = split.graph.clone();
    let mut evaluate = |mu: &[f64], start: f64, cuts: &mut Vec<Cut>| -> Option<f64> {
        price(split, mu, &mut priced);
        match least_cycle_ratio(&priced, Some(start), deadline)? {
            Least::Ratio(rho, cycle) => {
                if let Some(c) = cycle {
                    cuts.push(cut(split, &c));
                }
                Some(rho)
            }
            Least::Unbounded(c) => {
                cuts.push(cut(split, &c));
                Some(f64::NEG_INFINITY)
            }
        }
    };
    // Prices beyond this many times the target ratio are not searched (a cycle has at
    // most a few evictions per token).
    let most = 100.0 * target_rho.max(1e-3);
    // Within a few parts per billion of the target is enough for the proof (its rounding
    // allowance is of that order too), and the method's tail crawls there.
    let enough = target_rho * (1.0 - 4e-9);
    prices::best_prices(
        &vec![0.0; width],
        -most..=most,
        target_rho,
        enough,
        // Family (a) with C = 64 proves its makespan in 19 - 26 rounds in all.
        Stall {
            rounds: 40,
            gain: 1e-9,
        },
        deadline,
        &mut evaluate,
    )
}

/// The balanced cycle-ratio bound of the model's workload (makespan, ms), starting from
/// `start_rho` (a known schedule's ms per token); None where the graph passes
/// `max_edges` or the deadline comes first, where no-mix batches are asked for (the split
/// graph does not track them), or where batches or refills may cost nothing.
pub(crate) fn balanced_cycle_ratio(
    model: &Model,
    start_rho: Option<f64>,
    deadline: Instant,
    max_edges: usize,
) -> Option<CycleRatio> {
    let least_batch_ms = model.theta[Feature::One as usize];
    if least_batch_ms <= 0.0 || model.no_mix || !model.evictions {
        return None;
    }
    let split = split_graph(model, deadline, max_edges)?;
    if split.least_refill_ms <= 0.0 {
        return None;
    }
    let g = &split.graph;
    let target_rho = g.start_ratio(start_rho);
    let (rho, rounds, _) = best_ratio_prices(&split, model.width, target_rho, deadline)?;
    // A walk of duration T has at most T / least_batch_ms batches (each with a close edge)
    // and T / least_refill_ms refills (each with its eviction).
    let edges_per_ms = 2.0 / least_batch_ms + 2.0 / split.least_refill_ms;
    let rho = rho / (1.0 + SLACK_MS * edges_per_ms);
    Some(CycleRatio {
        bound_ms: rho * model.tokens_generated(),
        configurations: g.configurations,
        edges: g.from.len(),
        price_rounds: Some(rounds),
    })
}
