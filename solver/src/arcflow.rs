//! The arc-flow MILP (milp.md, "The arc-flow model as built"): each request class's life
//! is a path through its state graph ([`crate::graph`]); integer `x[k, j, a]` counts the
//! requests of class `k` taking arc `a` in batch slot `j`. The constraint families are one
//! function each, named as in milp.md: [`ArcFlow::flow_conservation`],
//! [`ArcFlow::fcfs_admission`], and per slot [`ArcFlow::activity_and_flags`],
//! [`ArcFlow::release_dates`], [`ArcFlow::flag_capacities`], [`ArcFlow::slot_capacities`],
//! [`ArcFlow::slot_timing`]; then [`ArcFlow::batch_counts`] and the objective
//! ([`ArcFlow::objective_expression`]). Time is in milliseconds for numerics. HiGHS solves
//! it from the best heuristic schedule; its schedule is replayed independently.

use crate::backend;
use crate::bounds::CombinatorialBound;
use crate::classes::{class_graph, entry_cost_ms, request_classes};
use crate::graph::{ArcKind, StateGraph};
use crate::report::{self, Answer};
use crate::store::Incumbent;
use crate::{
    BoundMethod, ModelSize, Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions,
    SolveReport, SolveStatus, WarmStart, bounds, progress,
};
use good_lp::{Expression, ProblemVariables, SolverModel, Variable, constraint, highs, variable};
use infersched_core::{Batch, Entry, Feature, Limits, Replay, Request, Schedule, Workload, replay};
use infersched_cost_model::LinearCostModel;
use std::time::Instant;

/// An arc variable: (arc index in the request's graph, variable, column).
type ArcVar = (usize, Variable, usize);
/// One request's arc variables, per batch slot.
type SlotArcs = Vec<Vec<ArcVar>>;
/// A continuous or binary variable and its column.
type Col = (Variable, usize);

/// The arc side of the model: request classes, their state graphs and arc variables.
struct ArcModel<'a> {
    graphs: &'a [StateGraph],
    members: &'a [Vec<usize>],
    x: &'a [SlotArcs],
}

/// The per-slot and per-class columns a warm start must fill besides the arcs.
struct SlotCols<'a> {
    act: &'a [Col],
    hp: &'a [Col],
    hd: &'a [Col],
    start: &'a [Col],
    end: &'a [Col],
    fin: &'a [Col],
}

/// Variables and rows under construction.
struct Model {
    vars: ProblemVariables,
    count: usize,
    integers: usize,
    rows: Vec<good_lp::Constraint>,
}

impl Model {
    fn add(&mut self, v: good_lp::VariableDefinition, integer: bool) -> (Variable, usize) {
        let idx = self.count;
        self.count += 1;
        self.integers += usize::from(integer);
        (self.vars.add(v), idx)
    }
}

/// What one slot's arcs add up to, gathered in one pass over its arc variables.
struct SlotSums {
    /// Tokens processed.
    tokens: Expression,
    /// Prefill tokens processed.
    prefill: Expression,
    /// KV tokens held after the step.
    kv: Expression,
    /// Requests holding KV after the step.
    holding: Expression,
    /// The batch's time (ms): biases times flags plus every processing arc's own cost.
    time: Expression,
    /// KV after the step of prefill entries, and of decode entries.
    prefill_kv: Expression,
    decode_kv: Expression,
    /// Prefill entries, and decode entries.
    prefill_n: Expression,
    decode_n: Expression,
    /// Per class: arcs that evict or process, prefill arcs, decode arcs, processing arcs.
    busy: Vec<Expression>,
    pre: Vec<Expression>,
    dec: Vec<Expression>,
    processing: Vec<Expression>,
}

/// The arc-flow model of one solve.
struct ArcFlow<'a> {
    limits: &'a Limits,
    class: PolicyConstraints,
    /// One representative request per class, its members and their count.
    class_req: Vec<Request>,
    members: Vec<Vec<usize>>,
    counts: Vec<f64>,
    graphs: Vec<StateGraph>,
    horizon: usize,
    m: Model,
    x: Vec<SlotArcs>,
    act: Vec<Col>,
    hp: Vec<Col>,
    hd: Vec<Col>,
    start: Vec<Col>,
    end: Vec<Col>,
    fin: Vec<Col>,
    cost: &'a LinearCostModel,
}

impl<'a> ArcFlow<'a> {
    /// A feature's coefficient in milliseconds.
    fn theta_ms(&self, f: Feature) -> f64 {
        self.cost.theta(f) * 1e3
    }

    /// The variables: arc counts per class and slot, and per slot the activity `a_j`, the
    /// prefill and decode flags `hp_j`, `hd_j`, the start and end times; per class a
    /// completion time for latency objectives.
    fn new(
        limits: &'a Limits,
        cost: &'a LinearCostModel,
        class: PolicyConstraints,
        members: Vec<Vec<usize>>,
        class_req: Vec<Request>,
        graphs: Vec<StateGraph>,
        horizon: usize,
    ) -> Self {
        let counts: Vec<f64> = members.iter().map(|c| c.len() as f64).collect();
        let mut m = Model {
            vars: ProblemVariables::new(),
            count: 0,
            integers: 0,
            rows: Vec::new(),
        };
        let mut x: Vec<SlotArcs> = Vec::with_capacity(members.len());
        for (k, g) in graphs.iter().enumerate() {
            let layers = g.usable_arcs(class_req[k].output_tokens, horizon);
            let def = if members[k].len() == 1 {
                variable().binary()
            } else {
                variable().integer().min(0.0).max(counts[k])
            };
            x.push(
                layers
                    .into_iter()
                    .map(|layer| {
                        layer
                            .into_iter()
                            .map(|a| {
                                let (v, c) = m.add(def.clone(), true);
                                (a, v, c)
                            })
                            .collect()
                    })
                    .collect(),
            );
        }
        let batch_var = |m: &mut Model, integer: bool| {
            let def = if integer {
                variable().binary()
            } else {
                variable().min(0.0)
            };
            (0..horizon)
                .map(|_| m.add(def.clone(), integer))
                .collect::<Vec<_>>()
        };
        let act = batch_var(&mut m, true);
        let hp = batch_var(&mut m, true);
        let hd = batch_var(&mut m, true);
        let start = batch_var(&mut m, false);
        let end = batch_var(&mut m, false);
        let fin: Vec<Col> = (0..members.len())
            .map(|_| m.add(variable().min(0.0), false))
            .collect();
        Self {
            limits,
            class,
            class_req,
            members,
            counts,
            graphs,
            horizon,
            m,
            x,
            act,
            hp,
            hd,
            start,
            end,
            fin,
            cost,
        }
    }

    /// Flow conservation: one unit per request leaves the start state in slot 0; what
    /// enters a state in slot j leaves it in slot j + 1.
    fn flow_conservation(&mut self) {
        for (i, g) in self.graphs.iter().enumerate() {
            let x = &self.x[i];
            let out0: Expression = x[0]
                .iter()
                .filter(|(a, ..)| g.arcs[*a].from == StateGraph::START)
                .map(|(_, v, _)| *v)
                .sum();
            let count = self.counts[i];
            self.m.rows.push(constraint!(out0 == count));
            // One balance per state some arc of the two slots touches, in state order. Only
            // those are allocated: a graph of hundreds of thousands of states, fresh per
            // slot, took 10 s for 6 arXiv requests over 430 slots.
            let mut balance: Vec<Option<Expression>> = vec![None; g.states.len()];
            let mut touched: Vec<usize> = Vec::new();
            for j in 1..self.horizon {
                for (a, v, _) in &x[j - 1] {
                    let s = g.arcs[*a].to;
                    *balance[s].get_or_insert_with(|| {
                        touched.push(s);
                        Expression::from(0.0)
                    }) += *v;
                }
                for (a, v, _) in &x[j] {
                    let s = g.arcs[*a].from;
                    *balance[s].get_or_insert_with(|| {
                        touched.push(s);
                        Expression::from(0.0)
                    }) -= *v;
                }
                touched.sort_unstable();
                for s in touched.drain(..) {
                    if let Some(e) = balance[s].take() {
                        self.m.rows.push(constraint!(e == 0));
                    }
                }
            }
        }
    }

    /// FCFS admission (policy constraint): not started by slot j = still on the start
    /// state's idle arc in slot j; a request may wait there only while every later one (in
    /// arrival order) waits too.
    fn fcfs_admission(&mut self, w: &Workload) {
        let mut class_of = vec![0usize; w.len()];
        for (k, mem) in self.members.iter().enumerate() {
            for &r in mem {
                class_of[r] = k;
            }
        }
        let waiting = |k: usize, j: usize| -> Expression {
            self.x[k][j]
                .iter()
                .filter(|(a, ..)| {
                    let arc = &self.graphs[k].arcs[*a];
                    arc.from == StateGraph::START && matches!(arc.kind, ArcKind::Idle)
                })
                .map(|(_, v, _)| *v)
                .sum()
        };
        let mut rows = Vec::new();
        for pair in w.fcfs_order().windows(2) {
            let (a, b) = (class_of[pair[0] as usize], class_of[pair[1] as usize]);
            for j in 0..self.horizon {
                rows.push(constraint!(waiting(b, j) >= waiting(a, j)));
            }
        }
        self.m.rows.extend(rows);
    }

    /// Slot j's sums over its arcs (one pass; the quadratic prefill-attention term is a
    /// constant of each arc, so the batch time is exact and linear).
    fn slot_sums(&self, j: usize) -> SlotSums {
        let zero = || Expression::from(0.0);
        let mut s = SlotSums {
            tokens: zero(),
            prefill: zero(),
            kv: zero(),
            holding: zero(),
            time: self.theta_ms(Feature::One) * self.act[j].0
                + self.theta_ms(Feature::HasPrefill) * self.hp[j].0
                + self.theta_ms(Feature::HasDecode) * self.hd[j].0,
            prefill_kv: zero(),
            decode_kv: zero(),
            prefill_n: zero(),
            decode_n: zero(),
            busy: Vec::with_capacity(self.graphs.len()),
            pre: Vec::with_capacity(self.graphs.len()),
            dec: Vec::with_capacity(self.graphs.len()),
            processing: Vec::with_capacity(self.graphs.len()),
        };
        for (i, g) in self.graphs.iter().enumerate() {
            let (mut busy, mut pre, mut dec, mut processing) = (zero(), zero(), zero(), zero());
            for (a, v, _) in &self.x[i][j] {
                let arc = &g.arcs[*a];
                if arc.kv > 0 {
                    s.kv += arc.kv as f64 * *v;
                }
                if arc.holds {
                    s.holding += *v;
                }
                match arc.kind {
                    ArcKind::Idle => {}
                    ArcKind::Evict => busy += *v,
                    ArcKind::Process { c, decode, .. } => {
                        busy += *v;
                        processing += *v;
                        s.tokens += f64::from(c) * *v;
                        s.time += entry_cost_ms(self.cost, &arc.features) * *v;
                        if decode {
                            dec += *v;
                            s.decode_n += *v;
                            s.decode_kv += arc.kv as f64 * *v;
                        } else {
                            pre += *v;
                            s.prefill_n += *v;
                            s.prefill_kv += arc.kv as f64 * *v;
                            s.prefill += f64::from(c) * *v;
                        }
                    }
                }
            }
            s.busy.push(busy);
            s.pre.push(pre);
            s.dec.push(dec);
            s.processing.push(processing);
        }
        s
    }

    /// Activity and flags: a class's arcs that evict or process need `a_j`, its prefill
    /// arcs `hp_j`, its decode arcs `hd_j` (times the class's size); empty slots come last
    /// (`a_j >= a_{j+1}`); `--no-mix`: `hp_j + hd_j <= 1`.
    fn activity_and_flags(&mut self, j: usize, s: &SlotSums) {
        for k in 0..self.graphs.len() {
            let cnt = self.counts[k];
            let (busy, pre, dec) = (s.busy[k].clone(), s.pre[k].clone(), s.dec[k].clone());
            let (a, hp, hd) = (self.act[j].0, self.hp[j].0, self.hd[j].0);
            self.m.rows.push(constraint!(busy <= cnt * a));
            self.m.rows.push(constraint!(pre <= cnt * hp));
            self.m.rows.push(constraint!(dec <= cnt * hd));
        }
        if self.class.no_mix {
            let (hp, hd) = (self.hp[j].0, self.hd[j].0);
            self.m.rows.push(constraint!(hp + hd <= 1));
        }
        if j + 1 < self.horizon {
            let (a, next) = (self.act[j].0, self.act[j + 1].0);
            self.m.rows.push(constraint!(a >= next));
        }
    }

    /// Release dates: a slot in which a request processes starts after its arrival (for a
    /// class of several requests, through a binary "any member processes here").
    fn release_dates(&mut self, j: usize, s: &SlotSums) {
        for k in 0..self.graphs.len() {
            let arrival_ms = self.class_req[k].arrival_s * 1e3;
            if arrival_ms <= 0.0 {
                continue;
            }
            let gate = s.processing[k].clone();
            let start = self.start[j].0;
            if self.members[k].len() == 1 {
                self.m.rows.push(constraint!(start >= arrival_ms * gate));
            } else {
                let cnt = self.counts[k];
                let (any, _) = self.m.add(variable().binary(), true);
                self.m.rows.push(constraint!(gate <= cnt * any));
                self.m.rows.push(constraint!(start >= arrival_ms * any));
            }
        }
    }

    /// Flag capacities: the slot's prefill entries together fit M and R_max under `hp_j`,
    /// its decode entries M, C and R_max under `hd_j`. Valid because the whole
    /// batch fits them, and much tighter than the per-class flag rows when many identical
    /// requests share one integer flow.
    fn flag_capacities(&mut self, j: usize, s: &SlotSums) {
        let (hp, hd) = (self.hp[j].0, self.hd[j].0);
        if let Some(cap) = self.limits.kv_capacity {
            let (pre, dec) = (s.prefill_kv.clone(), s.decode_kv.clone());
            self.m.rows.push(constraint!(pre <= cap as f64 * hp));
            self.m.rows.push(constraint!(dec <= cap as f64 * hd));
        }
        if let Some(c) = self.limits.token_budget {
            let dec = s.decode_n.clone();
            self.m.rows.push(constraint!(dec <= c as f64 * hd));
        }
        if let Some(r) = self.limits.max_running {
            let (pre, dec) = (s.prefill_n.clone(), s.decode_n.clone());
            self.m.rows.push(constraint!(pre <= r as f64 * hp));
            self.m.rows.push(constraint!(dec <= r as f64 * hd));
        }
    }

    /// Slot capacities, coupled to the slot's activity: tokens <= C a_j, prefill tokens
    /// <= P hp_j, KV after the step <= M a_j, requests holding KV <= R_max a_j.
    fn slot_capacities(&mut self, j: usize, s: &SlotSums) {
        let (a, hp) = (self.act[j].0, self.hp[j].0);
        if let Some(c) = self.limits.token_budget {
            let tokens = s.tokens.clone();
            self.m.rows.push(constraint!(tokens <= c as f64 * a));
        }
        if let Some(p) = self.limits.effective_prefill_budget() {
            let prefill = s.prefill.clone();
            self.m.rows.push(constraint!(prefill <= p as f64 * hp));
        }
        let kv_cap = self.limits.kv_capacity.map_or(1e12, |v| v as f64);
        let kv = s.kv.clone();
        self.m.rows.push(constraint!(kv <= kv_cap * a));
        if let Some(r) = self.limits.max_running {
            let holding = s.holding.clone();
            self.m.rows.push(constraint!(holding <= r as f64 * a));
        }
    }

    /// Slot timing: a slot starts after the previous one ends and lasts its batch time.
    fn slot_timing(&mut self, j: usize, s: SlotSums) {
        let (start, end) = (self.start[j].0, self.end[j].0);
        if j > 0 {
            let prev = self.end[j - 1].0;
            self.m.rows.push(constraint!(start >= prev));
        }
        let time = s.time;
        self.m.rows.push(constraint!(end == start + time));
    }

    /// Batch counts (module `bounds`): at least `min_batches` active slots, of which at
    /// least `min_prefill` carry a prefill entry.
    fn batch_counts(&mut self, min_batches: u64, min_prefill: u64) {
        let active: Expression = self.act.iter().map(|a| a.0).sum();
        self.m.rows.push(constraint!(active >= min_batches as f64));
        let prefill: Expression = self.hp.iter().map(|h| h.0).sum();
        self.m.rows.push(constraint!(prefill >= min_prefill as f64));
    }

    /// The objective (ms). Makespan: the last slot's end. Mean latency (TTFT): the mean
    /// of absolute completion (first-token) times F_i = sum over slots j of p_ij, where
    /// p_ij >= d_j - D (done before j), p_ij >= 0, d_j = E_j - E_{j-1} is slot j's duration
    /// and D bounds one slot's duration (a batch plus any wait for arrivals): much tighter
    /// than a big-M over the whole horizon.
    fn objective_expression(&mut self, objective: Objective, n: usize) -> Expression {
        let horizon = self.horizon;
        match objective {
            Objective::Makespan => self.end[horizon - 1].0.into(),
            Objective::MeanLatency | Objective::MeanTtft => {
                let max_arrival = self
                    .class_req
                    .iter()
                    .map(|r| r.arrival_s * 1e3)
                    .fold(0.0, f64::max);
                let t_max = self.theta_ms(Feature::One)
                    + self.theta_ms(Feature::HasPrefill)
                    + self.theta_ms(Feature::HasDecode)
                    + self
                        .graphs
                        .iter()
                        .zip(&self.counts)
                        .map(|(g, n)| {
                            n * g
                                .arcs
                                .iter()
                                .map(|a| entry_cost_ms(self.cost, &a.features))
                                .fold(0.0, f64::max)
                        })
                        .sum::<f64>();
                let slot_bound = t_max + max_arrival;
                for i in 0..self.graphs.len() {
                    let mut done_before = Expression::from(0.0);
                    let mut sum_p = Expression::from(0.0);
                    for j in 0..horizon {
                        let (p_ij, _) = self.m.add(variable().min(0.0), false);
                        let duration: Expression = if j == 0 {
                            self.end[0].0.into()
                        } else {
                            self.end[j].0 - self.end[j - 1].0
                        };
                        self.m.rows.push(constraint!(
                            p_ij >= duration - slot_bound * done_before.clone()
                        ));
                        sum_p += p_ij;
                        for (a, v, _) in &self.x[i][j] {
                            if let ArcKind::Process {
                                finishes,
                                first_token,
                                ..
                            } = self.graphs[i].arcs[*a].kind
                            {
                                let mark = if objective == Objective::MeanLatency {
                                    finishes
                                } else {
                                    first_token
                                };
                                if mark {
                                    done_before += *v;
                                }
                            }
                        }
                    }
                    let f = self.fin[i].0;
                    self.m.rows.push(constraint!(f == sum_p));
                }
                self.fin.iter().map(|f| f.0).sum::<Expression>() / n as f64
            }
        }
    }
}

/// What the arc-flow solve starts from: the problem, the class the model searches (chunk
/// arcs left out where chunking never helps), the portfolio's best schedule and the
/// combinatorial bound.
pub(crate) struct ArcFlowProblem<'a> {
    pub w: &'a Workload,
    pub limits: &'a Limits,
    pub cost: &'a LinearCostModel,
    pub objective: Objective,
    pub options: &'a SolveOptions,
    pub model_class: PolicyConstraints,
    pub warm: Option<&'a Incumbent>,
    pub combinatorial: CombinatorialBound,
    /// When the solve began (what came before comes off the time limit).
    pub started: Instant,
}

/// The most distinct requests [`exceeds_arc_columns`] builds a state graph for; past it
/// the answer is "no" (unknown), and the MILP's own check stands.
const MAX_PREDICTED_CLASSES: usize = 16;

/// Whether [`solve_arc_flow`] would refuse `p`'s model for having more than
/// [`SolveOptions::arc_column_cap`] arc columns, known before anything else runs: the same horizon and
/// count, on one state graph per distinct request (identical requests have identical
/// graphs). False where that is not known cheaply (more than a few distinct requests, or
/// the horizon is refused), so a caller giving other methods more time when the MILP will
/// not run never takes time from a MILP that would.
pub(crate) fn exceeds_arc_columns(p: &ArcFlowProblem<'_>) -> bool {
    let distinct = request_classes(p.w, true);
    if distinct.len() > MAX_PREDICTED_CLASSES {
        return false;
    }
    let (_, min_prefill_batches) = bounds::min_batches(p.w, p.limits);
    let Ok((horizon, _)) = horizon(p, min_prefill_batches) else {
        return false;
    };
    let aggregated = aggregates_identical_requests(p);
    let requests: Vec<Request> = distinct.iter().map(|m| p.w.requests()[m[0]]).collect();
    let graphs: Vec<StateGraph> = requests
        .iter()
        .map(|r| class_graph(r, p.limits, &p.model_class))
        .collect();
    let classes = graphs
        .iter()
        .zip(&requests)
        .zip(&distinct)
        .map(|((g, r), m)| {
            let copies = if aggregated { 1 } else { m.len() };
            (g, r, copies)
        });
    exceeds_columns(classes, horizon, p.options.arc_column_cap())
}

/// Whether the model makes identical requests (same I, O, T) one class with integer flows:
/// for makespan only, since latency objectives need each request's completion time, and
/// not under FCFS, which orders individual requests.
fn aggregates_identical_requests(p: &ArcFlowProblem<'_>) -> bool {
    p.objective == Objective::Makespan && !p.options.constraints.fcfs
}

/// Whether classes `(graph, request, copies)` have more than `most` arc columns over
/// `horizon` batches together; counts each graph's usable arcs only up to what is left, so
/// a huge model is rejected without being counted whole.
fn exceeds_columns<'a>(
    classes: impl Iterator<Item = (&'a StateGraph, &'a Request, usize)>,
    horizon: usize,
    most: usize,
) -> bool {
    let mut columns = 0usize;
    for (graph, r, copies) in classes {
        let left = most.saturating_sub(columns) / copies.max(1);
        columns = columns.saturating_add(
            graph
                .usable_arc_count(r.output_tokens, horizon, left)
                .saturating_mul(copies),
        );
        if columns > most {
            return true;
        }
    }
    false
}

/// The horizon J and whether it is proven sufficient (makespan): every batch of the
/// model processes tokens, so it costs at least the per-batch bias, and the requests'
/// entries cost at least their minimum work (module `bounds`); at least
/// `min_prefill_batches` batches pay the prefill flag instead of the cheaper decode flag.
/// So J batches cost at least J * bias + work_min (+ that surplus), and
/// J <= (UB - work_min - surplus) / bias.
fn horizon(p: &ArcFlowProblem<'_>, min_prefill_batches: u64) -> Result<(usize, bool), SolveError> {
    let theta_ms = |f: Feature| p.cost.theta(f) * 1e3;
    let max_o =
        p.w.requests()
            .iter()
            .map(|r| r.output_tokens as usize)
            .max()
            .unwrap_or(1);
    let bias_ms =
        theta_ms(Feature::One) + theta_ms(Feature::HasPrefill).min(theta_ms(Feature::HasDecode));
    let work_min_ms = bounds::min_total_work_s(p.w, p.cost) * 1e3;
    let prefill_extra_ms = min_prefill_batches as f64
        * (theta_ms(Feature::HasPrefill) - theta_ms(Feature::HasDecode)).max(0.0);
    let options = p.options;
    match (options.horizon, &p.warm) {
        (Some(j), _) => {
            if j < max_o {
                return Err(SolveError::Infeasible(format!(
                    "horizon J = {j} batches is shorter than the longest output ({max_o} tokens, one per batch)"
                )));
            }
            Ok((j, false))
        }
        (None, Some(best)) => {
            let ub_ms = best.objective_value(p.objective) * 1e3;
            let batches = best.schedule.batches.len();
            let proof = if p.objective == Objective::Makespan && bias_ms > 0.0 {
                // Also every batch processes at least one token (the better bound when
                // the makespan is mostly waiting for arrivals).
                let by_work = (ub_ms - work_min_ms - prefill_extra_ms).max(0.0) / bias_ms;
                let by_token = ub_ms / (bias_ms + theta_ms(Feature::Tokens));
                Some((by_work.min(by_token) + 1e-9).floor() as usize)
            } else {
                None
            };
            Ok(match proof {
                Some(j) if j <= options.max_horizon => (j.max(max_o).max(batches), true),
                _ => (
                    ((batches as f64 * options.horizon_slack).ceil() as usize)
                        .clamp(max_o, options.max_horizon.max(batches)),
                    false,
                ),
            })
        }
        (None, None) => Err(SolveError::Infeasible(
            "no heuristic schedule exists in this policy class to size the horizon; give --horizon"
                .into(),
        )),
    }
}

/// Configures HiGHS for the arc-flow MILP from `options` (threads, gap, logging: to a
/// file a progress watcher reads where an observer listens); returns the watcher.
fn configure_highs(
    hmodel: &mut highs::Model,
    options: &SolveOptions,
    time_limit_s: f64,
    presolve: bool,
) -> Option<progress::ProgressWatcher> {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let log_file = std::env::temp_dir().join(format!(
        "infersched-highs-{}-{}.log",
        std::process::id(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let (log, watcher) = match &options.observer {
        _ if options.log => (backend::Log::Console, None),
        Some(observer) if log_file.to_str().is_some() => {
            (backend::Log::File(&log_file), Some(observer.clone()))
        }
        _ => (backend::Log::Quiet, None),
    };
    backend::configure(
        hmodel,
        &backend::Settings {
            time_limit_s,
            threads: options.threads,
            mip_rel_gap: options.mip_rel_gap,
            mip_abs_gap: Some(1e-9),
            // The warm start gives the first incumbent anyway.
            feasibility_jump: false,
            pscost_min_reliable: None,
            presolve,
            log,
        },
    );
    watcher.map(|observer| progress::ProgressWatcher::start(&log_file, observer))
}

/// Builds the arc-flow MILP, solves it with HiGHS from the warm start, replays its
/// schedule and reports it with the better of HiGHS's and the combinatorial bound. Past
/// the arc-variable limit, the best heuristic schedule with the combinatorial bound.
/// Models with more columns than this are solved without HiGHS's presolve (see its use).
const PRESOLVE_MAX_COLUMNS: usize = 250_000;

/// The least time worth giving HiGHS, in seconds: with less left the MILP is not run.
const MIN_HIGHS_S: f64 = 0.5;

pub(crate) fn solve_arc_flow(p: ArcFlowProblem<'_>) -> Result<SolveReport, SolveError> {
    let run = ArcFlowRun {
        p: &p,
        t_build: Instant::now(),
    };
    let (min_batches, min_prefill_batches) = bounds::min_batches(p.w, p.limits);
    let (horizon, proven) = horizon(&p, min_prefill_batches)?;
    let model = match run.build(horizon, min_batches, min_prefill_batches) {
        Ok(model) => model,
        Err(answer) => return *answer,
    };
    let (mut hmodel, size, cols) = to_highs(model);
    if let Some(answer) = run.out_of_time("building the model") {
        return answer;
    }
    let time_limit_s = p.options.time_limit_s - p.started.elapsed().as_secs_f64();
    // HiGHS's presolve checks the clock rarely: on family (b) n = 32 (1.46M columns) it ran
    // 88.5 s into a 60 s limit (probing), and 77 s without probing, for a 1% reduction.
    // Past this size the MILP goes without presolve.
    let presolve = size.columns <= PRESOLVE_MAX_COLUMNS;
    let watcher = configure_highs(&mut hmodel, p.options, time_limit_s, presolve);
    let warm_report = run.warm_start(&mut hmodel, &cols, horizon, size.columns);
    let build_s = run.t_build.elapsed().as_secs_f64();
    let t_solve = Instant::now();
    let Some(solved) = backend::run(hmodel, time_limit_s) else {
        drop(watcher);
        return run.without_milp(format!(
            "HiGHS did not stop within {:.0} s of its {time_limit_s:.0} s limit (some of its root-node heuristics do not check the clock), so its run was abandoned",
            backend::grace_s(time_limit_s)
        ));
    };
    let solved = solved.map_err(|e| SolveError::Highs(format!("{e:?}")))?;
    let solve_s = t_solve.elapsed().as_secs_f64();
    drop(watcher);
    let mut report = run.interpret(&solved, &cols, horizon, time_limit_s)?;
    report.horizon_proven_sufficient = proven;
    report.model = Some(size);
    (report.build_s, report.solve_s) = (build_s, solve_s);
    report.warm_start = warm_report;
    Ok(report)
}

/// The answer of the arc-flow solve.
type ArcAnswer = Result<SolveReport, SolveError>;

/// The answer of a stage that ends the solve early (boxed: it is large).
type Early = Box<ArcAnswer>;

/// Classes of identical requests: their members, one representative each, and its graph.
struct Classes {
    members: Vec<Vec<usize>>,
    class_req: Vec<Request>,
    graphs: Vec<StateGraph>,
}

/// The model's columns, once the model has gone to HiGHS.
struct Columns {
    graphs: Vec<StateGraph>,
    members: Vec<Vec<usize>>,
    x: Vec<SlotArcs>,
    act: Vec<Col>,
    hp: Vec<Col>,
    hd: Vec<Col>,
    start: Vec<Col>,
    end: Vec<Col>,
    fin: Vec<Col>,
}

impl Columns {
    fn arcs(&self) -> ArcModel<'_> {
        ArcModel {
            graphs: &self.graphs,
            members: &self.members,
            x: &self.x,
        }
    }

    fn slots(&self) -> SlotCols<'_> {
        SlotCols {
            act: &self.act,
            hp: &self.hp,
            hd: &self.hd,
            start: &self.start,
            end: &self.end,
            fin: &self.fin,
        }
    }
}

/// The model handed to HiGHS, its size, and the columns a warm start and the solution
/// are read through.
fn to_highs((model, objective): (ArcFlow<'_>, Expression)) -> (highs::Model, ModelSize, Columns) {
    let ArcFlow {
        m:
            Model {
                vars,
                count,
                integers,
                rows,
            },
        graphs,
        members,
        x,
        act,
        hp,
        hd,
        start,
        end,
        fin,
        ..
    } = model;
    let size = ModelSize {
        rows: rows.len(),
        columns: count,
        integers,
    };
    let mut problem = vars.minimise(objective).using(highs);
    for r in rows {
        problem.add_constraint(r);
    }
    let cols = Columns {
        graphs,
        members,
        x,
        act,
        hp,
        hd,
        start,
        end,
        fin,
    };
    (problem.into_inner(), size, cols)
}

/// One arc-flow solve: the problem and when building began.
struct ArcFlowRun<'a> {
    p: &'a ArcFlowProblem<'a>,
    t_build: Instant,
}

impl ArcFlowRun<'_> {
    /// The best schedule found before the MILP, with the combinatorial bound and `note`.
    fn without_milp(&self, note: String) -> ArcAnswer {
        let p = self.p;
        report::best_found(
            p.w,
            p.limits,
            p.cost,
            p.objective,
            p.options.constraints,
            p.warm.cloned(),
            p.combinatorial,
            note,
            self.t_build,
        )
    }

    /// Whatever came before (the portfolio, the counting search) and the model's build come
    /// off the time limit: past it the best heuristic is returned with the bound.
    fn out_of_time(&self, stage: &str) -> Option<ArcAnswer> {
        let options = self.p.options;
        let used = self.p.started.elapsed().as_secs_f64();
        (used + MIN_HIGHS_S > options.time_limit_s).then(|| {
            self.without_milp(format!(
                "no MILP run: {stage} used {used:.2} s of the {:.2} s time limit",
                options.time_limit_s
            ))
        })
    }

    fn too_many_columns(&self, horizon: usize) -> String {
        let (options, n) = (self.p.options, self.p.w.requests().len());
        let cap = options.arc_column_cap();
        if cap < options.max_arc_columns {
            format!(
                "no exact model: the arc-flow MILP would have more than {cap} arc variables ({n} requests, horizon J = {horizon}), what the memory limit of {} holds at about {} bytes each",
                crate::human_bytes(options.memory_limit_bytes),
                crate::options::MILP_BYTES_PER_ARC_COLUMN
            )
        } else {
            format!(
                "no exact model: the arc-flow MILP would have more than {cap} arc variables ({n} requests, horizon J = {horizon})"
            )
        }
    }

    /// The request classes and their state graphs, or the answer without a MILP when time
    /// is out or the model would exceed the column cap.
    fn graphs(&self, horizon: usize) -> Result<Classes, Early> {
        let p = self.p;
        let reqs = p.w.requests();
        let members = request_classes(p.w, aggregates_identical_requests(p));
        let class_req: Vec<Request> = members.iter().map(|c| reqs[c[0]]).collect();
        // Before any state graph is built (they may take gigabytes, and seconds, for a
        // model refused after): no time left, or more columns than allowed from the
        // prompts alone.
        if let Some(answer) = self.out_of_time("the schedules and bounds before it") {
            return Err(Box::new(answer));
        }
        let cap = p.options.arc_column_cap();
        let no_chunk = p.model_class.no_chunk;
        let least_columns = class_req
            .iter()
            .map(|r| StateGraph::min_usable_arc_count(r, p.limits, no_chunk, horizon))
            .fold(0u128, u128::saturating_add);
        if least_columns > cap as u128 {
            return Err(Box::new(self.without_milp(self.too_many_columns(horizon))));
        }
        let graphs: Vec<StateGraph> = class_req
            .iter()
            .map(|r| class_graph(r, p.limits, &p.model_class))
            .collect();
        let classes = graphs.iter().zip(&class_req).map(|(g, r)| (g, r, 1));
        if exceeds_columns(classes, horizon, cap) {
            return Err(Box::new(self.without_milp(self.too_many_columns(horizon))));
        }
        Ok(Classes {
            members,
            class_req,
            graphs,
        })
    }

    /// The arc-flow model over `horizon` batch slots with its objective, or the answer
    /// without a MILP.
    fn build(
        &self,
        horizon: usize,
        min_batches: u64,
        min_prefill_batches: u64,
    ) -> Result<(ArcFlow<'_>, Expression), Early> {
        let p = self.p;
        let class = p.options.constraints;
        let Classes {
            members,
            class_req,
            graphs,
        } = self.graphs(horizon)?;
        let mut model = ArcFlow::new(p.limits, p.cost, class, members, class_req, graphs, horizon);
        model.flow_conservation();
        if class.fcfs {
            model.fcfs_admission(p.w);
        }
        for j in 0..horizon {
            if j % 16 == 0
                && let Some(answer) = self.out_of_time("building the model")
            {
                return Err(Box::new(answer));
            }
            let sums = model.slot_sums(j);
            model.activity_and_flags(j, &sums);
            model.release_dates(j, &sums);
            model.flag_capacities(j, &sums);
            model.slot_capacities(j, &sums);
            model.slot_timing(j, sums);
        }
        model.batch_counts(min_batches, min_prefill_batches);
        let objective = model.objective_expression(p.objective, p.w.requests().len());
        Ok((model, objective))
    }

    /// Warm start: the best heuristic schedule as arc choices, when it fits the horizon.
    fn warm_start(
        &self,
        hmodel: &mut highs::Model,
        cols: &Columns,
        horizon: usize,
        count: usize,
    ) -> Option<WarmStart> {
        let p = self.p;
        let best = p
            .warm
            .filter(|b| p.options.warm_start && b.schedule.batches.len() <= horizon)?;
        let (arcs, slots) = (cols.arcs(), cols.slots());
        let values = warm_columns(
            p.w,
            &arcs,
            &slots,
            &best.schedule,
            &best.replay,
            p.objective,
            count,
        )?;
        let _ = hmodel.try_set_solution(Some(&values), None, None, None);
        Some(WarmStart {
            heuristic: best.name.clone(),
            objective: best.objective_value(p.objective),
        })
    }

    /// HiGHS's answer as a report: its schedule (or the warm start's), replayed, and the
    /// better of its dual bound and the combinatorial bound.
    fn interpret(
        &self,
        solved: &highs::SolvedModel,
        cols: &Columns,
        horizon: usize,
        time_limit_s: f64,
    ) -> Result<SolveReport, SolveError> {
        let p = self.p;
        let (w, objective) = (p.w, p.objective);
        let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
        use highs::HighsModelStatus as M;
        let status = match solved.status() {
            M::Optimal => SolveStatus::Optimal,
            M::Infeasible => {
                return Err(SolveError::Infeasible(format!(
                    "no schedule of at most J = {horizon} batches satisfies the limits and policy constraints"
                )));
            }
            _ if has_solution => SolveStatus::TimeLimit,
            _ => SolveStatus::NoSolution,
        };
        let bound_ms = backend::dual_bound(solved).unwrap_or(0.0);
        let nodes = backend::mip_node_count(solved);
        let (schedule, milp_objective) = if has_solution {
            let sol = solved.get_solution();
            (
                extract(&cols.arcs(), sol.columns()),
                Some(solved.objective_value() / 1e3),
            )
        } else if let Some(best) = &p.warm {
            (best.schedule.clone(), None)
        } else {
            return Err(SolveError::Highs(format!(
                "no schedule found within {} s and no heuristic schedule in this class",
                p.options.time_limit_s
            )));
        };
        let r = replay(w, p.limits, p.cost, &schedule)?;
        let replayed = objective.of_replay(&r);
        // The model minimizes the mean of absolute times F_i; latencies are F_i - T_i.
        let reqs = w.requests();
        let offset_s = if objective == Objective::Makespan {
            0.0
        } else {
            reqs.iter().map(|r| r.arrival_s).sum::<f64>() / reqs.len() as f64
        };
        // HiGHS's bound holds for schedules of at most J batches; it is a bound on the
        // optimum when the horizon is proven sufficient (or asked for). The combinatorial
        // bound always is.
        let milp_bound = bound_ms / 1e3 - offset_s;
        let combinatorial = p.combinatorial;
        let (bound, bound_method) = if milp_bound >= combinatorial.value_s {
            let exact = status == SolveStatus::Optimal;
            let method = if exact {
                BoundMethod::Exact
            } else {
                BoundMethod::MilpDualBound
            };
            (milp_bound, method)
        } else {
            (
                combinatorial.value_s,
                BoundMethod::Combinatorial(combinatorial.argument),
            )
        };
        Ok(SolveReport {
            milp_objective: milp_objective.map(|v| v - offset_s),
            note: (status == SolveStatus::NoSolution).then(|| {
                format!("HiGHS found no schedule within {time_limit_s:.0} s: the best heuristic schedule is returned")
            }),
            nodes,
            horizon,
            ..SolveReport::from_answer(Answer {
                status,
                method: SolveMethod::Milp,
                objective,
                constraints: p.options.constraints,
                schedule,
                replayed,
                bound,
                bound_method,
            })
        })
    }
}

/// The batches chosen by a solution: each class's flows are split among its members,
/// lowest request id first, following each member's own state.
#[allow(clippy::needless_range_loop)] // slot j indexes every class's x[k][j]
fn extract(arcs: &ArcModel<'_>, cols: &[f64]) -> Schedule {
    let ArcModel { graphs, members, x } = *arcs;
    let horizon = x.first().map_or(0, Vec::len);
    let mut state: Vec<Vec<usize>> = members
        .iter()
        .map(|m| vec![StateGraph::START; m.len()])
        .collect();
    let mut batches = Vec::new();
    for j in 0..horizon {
        let mut evictions_first = Vec::new();
        let mut entries = Vec::new();
        for (k, g) in graphs.iter().enumerate() {
            let mut moved = vec![false; members[k].len()];
            let mut next = state[k].clone();
            for (a, _, col) in &x[k][j] {
                let mut flow = cols[*col].round() as usize;
                let arc = &g.arcs[*a];
                for (slot, &id) in members[k].iter().enumerate() {
                    if flow == 0 {
                        break;
                    }
                    if moved[slot] || state[k][slot] != arc.from {
                        continue;
                    }
                    moved[slot] = true;
                    flow -= 1;
                    next[slot] = arc.to;
                    match arc.kind {
                        ArcKind::Idle => {}
                        ArcKind::Evict => entries.push(Entry::evict(id as u32)),
                        ArcKind::Process { c, evict_first, .. } => {
                            if evict_first {
                                evictions_first.push(Entry::evict(id as u32));
                            }
                            entries.push(Entry::process(id as u32, c));
                        }
                    }
                }
            }
            state[k] = next;
        }
        evictions_first.sort_by_key(|e| e.request);
        entries.sort_by_key(|e| e.request);
        if !evictions_first.is_empty() {
            batches.push(Batch::new(evictions_first));
        }
        if !entries.is_empty() {
            batches.push(Batch::new(entries));
        }
    }
    Schedule::new(batches)
}

/// Column values of a heuristic schedule, or None if it does not map onto the model
/// (e.g. a batch that only evicts).
fn warm_columns(
    w: &Workload,
    arcs: &ArcModel<'_>,
    slots: &SlotCols<'_>,
    s: &Schedule,
    r: &Replay,
    objective: Objective,
    count: usize,
) -> Option<Vec<f64>> {
    let ArcModel { graphs, members, x } = *arcs;
    let horizon = slots.act.len();
    let reqs = w.requests();
    let mut cols = vec![0.0; count];
    let mut class_of = vec![0usize; reqs.len()];
    for (k, m) in members.iter().enumerate() {
        for &i in m {
            class_of[i] = k;
        }
    }
    let mut state = vec![StateGraph::START; reqs.len()];
    let last_end = r.batches.last().map_or(0.0, |b| b.end_s * 1e3);
    for j in 0..horizon {
        let batch = s.batches.get(j);
        // A batch without processing (only evictions) has no slot of its own in the model.
        let processes = |b: &Batch| {
            b.entries
                .iter()
                .any(|e| matches!(e.action, infersched_core::Action::Process(_)))
        };
        if batch.is_some_and(|b| !processes(b)) {
            return None;
        }
        let (mut any, mut pre, mut dec) = (false, false, false);
        for i in 0..reqs.len() {
            let k = class_of[i];
            let g = &graphs[k];
            let entry = batch.and_then(|b| b.entries.iter().find(|e| e.request == i as u32));
            let want = |kind: &ArcKind| match (entry.map(|e| e.action), kind) {
                (None, ArcKind::Idle) => true,
                (Some(infersched_core::Action::Evict), ArcKind::Evict) => true,
                (
                    Some(infersched_core::Action::Process(c)),
                    ArcKind::Process {
                        c: ac,
                        evict_first: false,
                        ..
                    },
                ) => c == *ac,
                _ => false,
            };
            let (a, _, col) = x[k][j]
                .iter()
                .find(|(a, ..)| g.arcs[*a].from == state[i] && want(&g.arcs[*a].kind))?;
            cols[*col] += 1.0;
            match g.arcs[*a].kind {
                ArcKind::Process { decode, .. } => {
                    any = true;
                    if decode { dec = true } else { pre = true }
                }
                ArcKind::Evict => any = true,
                ArcKind::Idle => {}
            }
            state[i] = g.arcs[*a].to;
        }
        let (st, en) = match r.batches.get(j) {
            Some(b) => (b.start_s * 1e3, b.end_s * 1e3),
            None => (last_end, last_end),
        };
        cols[slots.act[j].1] = f64::from(u8::from(any));
        cols[slots.hp[j].1] = f64::from(u8::from(pre));
        cols[slots.hd[j].1] = f64::from(u8::from(dec));
        cols[slots.start[j].1] = st;
        cols[slots.end[j].1] = en;
    }
    // F is per class; latency objectives use one class per request.
    for (f, class) in slots.fin.iter().zip(members) {
        let rec = &r.requests[class[0]];
        cols[f.1] = match objective {
            Objective::Makespan => 0.0,
            Objective::MeanLatency => rec.completion_s * 1e3,
            Objective::MeanTtft => rec.first_token_s * 1e3,
        };
    }
    Some(cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_too_big_for_its_arc_columns_is_known_before_it_is_built() {
        // README family (a) with C = 64: 32 identical requests, mean latency (one class per
        // request) from Sarathi capped at 4, horizon 96: over 2,000,000 arc columns, which
        // solve_arc_flow refuses by the same count; the model of 4 of them is built.
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let limits = Limits {
            kv_capacity: Some(92),
            token_budget: Some(64),
            ..Limits::unlimited()
        };
        let options = SolveOptions {
            time_limit_s: 2.0,
            ..SolveOptions::default()
        };
        let check = |n: usize| {
            let w = infersched_test_kit::workload(&vec![(16, 8, 0.0); n]);
            let knobs = infersched_schedulers::Knobs {
                max_running: Some(4),
                ..infersched_schedulers::Knobs::matching(&limits)
            };
            let sim = infersched_schedulers::SchedulerKind::Sarathi
                .simulate(&w, &knobs, &cost)
                .unwrap();
            let replay = replay(&w, &limits, &cost, &sim.schedule).unwrap();
            let warm = Incumbent {
                name: "sarathi".into(),
                schedule: sim.schedule,
                replay,
            };
            let p = ArcFlowProblem {
                w: &w,
                limits: &limits,
                cost: &cost,
                objective: Objective::MeanLatency,
                options: &options,
                model_class: PolicyConstraints::default(),
                warm: Some(&warm),
                combinatorial: CombinatorialBound {
                    value_s: 0.001,
                    argument: crate::bounds::BoundArgument::OwnMinimumTime,
                },
                started: Instant::now(),
            };
            let predicted = exceeds_arc_columns(&p);
            let report = solve_arc_flow(p).unwrap();
            let refused = report
                .note
                .as_deref()
                .is_some_and(|n| n.contains("arc variables"));
            (predicted, refused, report.model.is_some())
        };
        assert_eq!(check(32), (true, true, false));
        assert_eq!(check(4), (false, false, true));
    }
}
