//! The optimal scheduler: the MILP of `milp.md` in its time-expanded state-network
//! ("arc flow") form, solved with HiGHS through good_lp.
//!
//! Each request's life is a path through its state graph ([`graph`]); binary `x[i, j, a]`
//! says request `i` takes arc `a` in batch slot `j`. Per batch: tokens <= C, prefill tokens
//! <= P, KV after the step <= M, requests holding KV <= R_max, all coupled to the batch's
//! activity `a_j`; flags `hp_j`, `hd_j` for the per-batch biases; batch time is exact
//! (the quadratic prefill-attention term is a constant of each arc). Time is modelled in
//! milliseconds for numerics. The schedule HiGHS returns is replayed independently; the
//! report gives the replayed objective, HiGHS's dual bound and the certified gap.
//!
//! With a token budget the MILP answers; offline without one, the exact counting search
//! does (see [`SolveMethod`]):
//!
//! ```
//! use infersched_core::{Limits, Request, Workload};
//! use infersched_solver::{Objective, SolveMethod, SolveOptions, SolveStatus, solve};
//! let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 3, arrival_s: 0.0 }; 3]).unwrap();
//! let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
//! let limits = Limits { kv_capacity: Some(12), token_budget: Some(8), ..Limits::unlimited() };
//! let report = solve(&w, &limits, &cost, Objective::Makespan, &SolveOptions::default()).unwrap();
//! println!("{:?}: {} s (bound {} s)", report.status, report.replayed_objective, report.best_bound);
//! assert_eq!((report.status, report.method), (SolveStatus::Optimal, SolveMethod::Milp));
//! assert!(report.best_bound <= report.replayed_objective);
//!
//! let offline = Limits { token_budget: None, ..limits };
//! let exact = solve(&w, &offline, &cost, Objective::MeanLatency, &SolveOptions::default()).unwrap();
//! assert_eq!(exact.method, SolveMethod::CountingSearch);
//! assert_eq!(exact.certified_gap, 0.0);
//! ```

pub mod bounds;
mod counting;
pub mod dominance;
pub mod graph;
pub mod progress;

use good_lp::{Expression, ProblemVariables, SolverModel, Variable, constraint, highs, variable};
use graph::{ArcKind, StateGraph};
use infersched_core::{
    Batch, BatchFeatures, Entry, Feature, Limits, Replay, Schedule, Summary, Workload, replay,
};
use infersched_cost_model::LinearCostModel;
use infersched_schedulers::{Knobs, McsfOrder, SchedulerKind};
use serde::Serialize;
use std::time::Instant;
use thiserror::Error;

/// What to minimize (`semantics.md`, "Objectives").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// End of the last batch.
    Makespan,
    /// Mean end-to-end latency.
    MeanLatency,
    /// Mean time to first token.
    MeanTtft,
}

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "makespan" => Ok(Self::Makespan),
            "mean-latency" => Ok(Self::MeanLatency),
            "mean-ttft" => Ok(Self::MeanTtft),
            _ => Err(format!(
                "unknown objective \"{s}\"; expected makespan, mean-latency or mean-ttft"
            )),
        }
    }
}

impl Objective {
    /// The objective's value in a replay summary (seconds).
    pub fn of(self, s: &Summary) -> f64 {
        match self {
            Self::Makespan => s.makespan_s,
            Self::MeanLatency => s.mean_e2e_s,
            Self::MeanTtft => s.mean_ttft_s,
        }
    }
}

/// Policy constraints: the best schedule a policy class can reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PolicyConstraints {
    /// No evictions.
    pub no_evict: bool,
    /// Each prefill phase runs in one batch.
    pub no_chunk: bool,
    /// No batch mixes prefill and decode entries.
    pub no_mix: bool,
    /// Requests are first admitted in arrival order (ties by id): none starts before an
    /// earlier one has.
    pub fcfs: bool,
    /// Orca's reservation: from its first step to its end a request holds `I + O - 1`
    /// KV tokens in the memory constraint, and nothing is evicted.
    pub reserve: bool,
}

impl PolicyConstraints {
    /// Whether `schedule` (already replayed as valid under `limits`) belongs to this class.
    pub fn admits(&self, w: &Workload, limits: &Limits, schedule: &Schedule) -> bool {
        let reqs = w.requests();
        let mut held = vec![0u64; reqs.len()];
        let mut generated = vec![0u32; reqs.len()];
        let mut first_batch = vec![usize::MAX; reqs.len()];
        for (j, b) in schedule.batches.iter().enumerate() {
            for e in &b.entries {
                let i = e.request as usize;
                if matches!(e.action, infersched_core::Action::Process(_))
                    && first_batch[i] == usize::MAX
                {
                    first_batch[i] = j;
                }
            }
        }
        if self.fcfs {
            let order = w.fcfs_order();
            if order
                .windows(2)
                .any(|p| first_batch[p[0] as usize] > first_batch[p[1] as usize])
            {
                return false;
            }
        }
        for (j, b) in schedule.batches.iter().enumerate() {
            let (mut prefill, mut decode) = (false, false);
            for e in &b.entries {
                let i = e.request as usize;
                let known = u64::from(reqs[i].input_tokens) + u64::from(generated[i]);
                match e.action {
                    infersched_core::Action::Evict => {
                        if self.no_evict {
                            return false;
                        }
                        held[i] = 0;
                    }
                    infersched_core::Action::Process(c) => {
                        let is_decode = generated[i] >= 1 && held[i] + 1 == known;
                        held[i] += u64::from(c);
                        if is_decode {
                            decode = true;
                        } else {
                            prefill = true;
                            if self.no_chunk && held[i] != known {
                                return false;
                            }
                        }
                        if held[i] == known {
                            generated[i] += 1;
                        }
                    }
                }
            }
            if self.no_mix && prefill && decode {
                return false;
            }
            if self.reserve
                && let Some(cap) = limits.kv_capacity
            {
                // Started by this batch and not finished before it: holds its reservation.
                let reserved: u64 = reqs
                    .iter()
                    .enumerate()
                    .filter(|&(i, r)| {
                        first_batch[i] <= j
                            && (generated[i] < r.output_tokens
                                || b.entries.iter().any(|e| e.request as usize == i))
                    })
                    .map(|(_, r)| limits.occupied(r.max_kv_tokens()))
                    .sum();
                if reserved > cap {
                    return false;
                }
            }
        }
        true
    }
}

/// Solver options.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Wall-clock limit for HiGHS (seconds).
    pub time_limit_s: f64,
    /// HiGHS threads.
    pub threads: u32,
    /// Relative MIP gap at which HiGHS stops.
    pub mip_rel_gap: f64,
    /// Number of batch slots J; default: provably sufficient for `makespan` when that is
    /// at most `max_horizon`, else the warm start's batch count times `horizon_slack`.
    pub horizon: Option<usize>,
    /// Multiplier on the warm start's batch count for the default horizon.
    pub horizon_slack: f64,
    /// Largest horizon chosen automatically.
    pub max_horizon: usize,
    /// Start HiGHS from the best heuristic schedule.
    pub warm_start: bool,
    /// The heuristics whose schedules (each with and without preemption and with capped
    /// running sets) are tried as the warm start; empty means sarathi, vllm-v1, vllm and
    /// orca. The best one in the policy class also sizes the horizon.
    pub warm_start_from: Vec<SchedulerKind>,
    /// Policy constraints.
    pub constraints: PolicyConstraints,
    /// Let HiGHS log its progress to stdout.
    pub log: bool,
    /// Show a one-line progress display (best schedule, bound, gap, elapsed) on stderr
    /// while HiGHS works (ignored with `log`).
    pub progress: bool,
    /// Build no arc-flow model with more arc variables than this (memory and build time grow
    /// with them; a model this large would not solve in useful time on one machine anyway):
    /// the best heuristic schedule with a combinatorial bound is returned instead.
    pub max_arc_columns: usize,
    /// Memory the request state graphs may take (bytes), estimated before any is built;
    /// past it the best heuristic schedule with a combinatorial bound is returned instead.
    pub memory_limit_bytes: u64,
    /// Before the MILP, try the exact counting search (module `counting`) when it applies
    /// (offline workload, no C or P, no FCFS, no explicit horizon), keeping at most this
    /// many count vectors; 0 goes straight to the MILP.
    pub max_search_states: usize,
}

impl Default for SolveOptions {
    fn default() -> Self {
        Self {
            time_limit_s: 60.0,
            threads: 2,
            mip_rel_gap: 1e-6,
            horizon: None,
            horizon_slack: 1.5,
            max_horizon: 200,
            warm_start: true,
            warm_start_from: Vec::new(),
            constraints: PolicyConstraints::default(),
            log: false,
            progress: false,
            max_arc_columns: 2_000_000,
            memory_limit_bytes: 4 << 30,
            max_search_states: 1_000_000,
        }
    }
}

/// How the solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SolveStatus {
    /// Proven optimal (within J batches, and within the MIP gap).
    Optimal,
    /// Stopped at the time limit with an incumbent.
    TimeLimit,
    /// Stopped without any schedule of its own (the report holds the best heuristic's).
    NoSolution,
    /// No exact model was solved (too large for the limits): a schedule and a bound, no
    /// proof of optimality.
    NotProven,
}

impl SolveStatus {
    /// Name in reports and CSV files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Optimal => "optimal",
            Self::TimeLimit => "time-limit",
            Self::NoSolution => "no-solution",
            Self::NotProven => "not-proven",
        }
    }
}

/// Why a problem cannot be solved.
#[derive(Debug, Error)]
pub enum SolveError {
    /// Invalid limits.
    #[error(transparent)]
    Limits(#[from] infersched_core::LimitsError),
    /// No schedule can serve the workload.
    #[error("infeasible: {0}")]
    Infeasible(String),
    /// The model would be too large to build.
    #[error(
        "the model would have more than {limit} arc variables ({requests} requests, horizon J = {horizon}): use fewer or shorter requests, or a smaller --horizon"
    )]
    TooLarge {
        /// Requests.
        requests: usize,
        /// Batch slots.
        horizon: usize,
        /// The limit.
        limit: usize,
    },
    /// HiGHS failed.
    #[error("HiGHS: {0}")]
    Highs(String),
    /// The solver's schedule failed the replay (a bug).
    #[error("internal error: the replay rejects the solver's schedule: {0}")]
    Replay(#[from] infersched_core::ReplayError),
}

/// Size of the MILP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelSize {
    /// Constraints.
    pub rows: usize,
    /// Variables.
    pub columns: usize,
    /// Integer (binary) variables.
    pub integers: usize,
}

/// Which exact method produced a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SolveMethod {
    /// The arc-flow MILP on HiGHS.
    Milp,
    /// The shortest-path search over counts of identical requests per state (module
    /// `counting`); its result is a proven optimum over all schedules.
    CountingSearch,
    /// No exact model was solved (too large for the limits, see the report's note): the
    /// best schedule of the heuristic portfolio, with a combinatorial bound.
    BestHeuristic,
}

impl SolveMethod {
    /// Name in reports and CSV files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Milp => "milp",
            Self::CountingSearch => "counting-search",
            Self::BestHeuristic => "best-heuristic",
        }
    }
}

/// What proved a report's lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BoundMethod {
    /// The schedule is proven optimal by an exact method (the bound is its value).
    Exact,
    /// HiGHS's dual bound on the arc-flow MILP.
    MilpDualBound,
    /// A combinatorial argument ([`bounds`]), better than any other bound found.
    Combinatorial(bounds::BoundArgument),
}

impl BoundMethod {
    /// Name in reports and CSV files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::MilpDualBound => "milp-dual-bound",
            Self::Combinatorial(a) => a.name(),
        }
    }
}

/// The result of a solve (milp.md, "Reading the result").
#[derive(Debug, Clone, Serialize)]
pub struct SolveReport {
    /// How it ended.
    pub status: SolveStatus,
    /// What found the schedule and its bound.
    pub method: SolveMethod,
    /// Objective.
    pub objective: Objective,
    /// Policy constraints in force.
    pub constraints: PolicyConstraints,
    /// The MILP's objective value (seconds).
    pub milp_objective: Option<f64>,
    /// The replayed exact objective of the returned schedule (seconds).
    pub replayed_objective: f64,
    /// Lower bound on the optimum over schedules of at most J batches (seconds).
    pub best_bound: f64,
    /// `(replayed - bound) / replayed`.
    pub certified_gap: f64,
    /// What proved `best_bound`.
    pub bound_method: BoundMethod,
    /// Why an exact method did not answer, when it did not.
    pub note: Option<String>,
    /// Batch slots.
    pub horizon: usize,
    /// Whether no schedule with more than J batches can be better (makespan only).
    pub horizon_proven_sufficient: bool,
    /// Model size.
    pub model: ModelSize,
    /// Seconds to build the model.
    pub build_s: f64,
    /// Seconds HiGHS ran.
    pub solve_s: f64,
    /// Branch-and-bound nodes, when HiGHS reports them.
    pub nodes: Option<i64>,
    /// The warm start used (heuristic name) and its replayed objective.
    pub warm_start: Option<(String, f64)>,
    /// The schedule (the warm start's if HiGHS found nothing better).
    #[serde(skip)]
    pub schedule: Schedule,
}

/// The best heuristic schedule in the class, with its replay.
fn best_heuristic(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    from: &[SchedulerKind],
) -> Option<(String, Schedule, Replay)> {
    let knobs = Knobs {
        watermark: Some(0.0),
        ..Knobs::matching(limits)
    };
    // A portfolio: each heuristic with and without preemption, and with its running set
    // capped below R_max (a schedule under a tighter cap is valid under the real one, and
    // limiting concurrency is often what avoids costly evictions).
    let n = w.len() as u64;
    let r_cap = limits.max_running.unwrap_or(n).min(n).max(1);
    let caps: Vec<u64> = if r_cap <= 32 {
        (1..=r_cap).collect()
    } else {
        let mut v: Vec<u64> = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
            .into_iter()
            .filter(|&c| c < r_cap)
            .collect();
        v.push(r_cap);
        v
    };
    let mut best: Option<(String, Schedule, Replay, f64)> = None;
    let kinds: &[SchedulerKind] = if from.is_empty() {
        &[
            SchedulerKind::Sarathi,
            SchedulerKind::VllmV1,
            SchedulerKind::Vllm,
            SchedulerKind::Orca,
            SchedulerKind::Mcsf,
        ]
    } else {
        from
    };
    for &kind in kinds {
        // MC-SF never preempts, so its variants are its admission orders instead.
        let variants: Vec<(bool, McsfOrder)> = if kind == SchedulerKind::Mcsf {
            McsfOrder::ALL.iter().map(|&o| (false, o)).collect()
        } else {
            vec![(false, McsfOrder::Output), (true, McsfOrder::Output)]
        };
        for ((no_preemption, mcsf_order), cap) in variants
            .into_iter()
            .flat_map(|v| caps.iter().map(move |&c| (v, c)))
        {
            let k = Knobs {
                no_preemption,
                mcsf_order,
                max_running: Some(cap),
                ..knobs
            };
            let Ok(mut sim) = kind.simulate(w, &k, cost) else {
                continue;
            };
            if class.no_chunk && dominance::chunking_never_helps(w, limits, class) {
                // The model has no chunk arcs here; the merged schedule is never worse.
                sim.schedule = dominance::merge_prefill_chunks(w, &sim.schedule);
            }
            // Replay under the problem's limits (the heuristic's are the same or tighter).
            let Ok(r) = replay(w, limits, cost, &sim.schedule) else {
                continue;
            };
            if !class.admits(w, limits, &sim.schedule) {
                continue;
            }
            let v = objective.of(&Summary::from_replay(&r));
            if best.as_ref().is_none_or(|b| v < b.3) {
                let name = format!(
                    "{}{}{}{}",
                    kind.name(),
                    if no_preemption { "+no-preemption" } else { "" },
                    if kind == SchedulerKind::Mcsf {
                        format!("+order={}", mcsf_order.name())
                    } else {
                        String::new()
                    },
                    if cap < r_cap {
                        format!("+max-running={cap}")
                    } else {
                        String::new()
                    }
                );
                best = Some((name, sim.schedule, r, v));
            }
        }
    }
    best.map(|(n, s, r, _)| (n, s, r))
}

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

/// A solve, set up step by step: the library's entry point.
///
/// ```
/// use infersched_core::{Limits, Request, Workload};
/// use infersched_solver::{Objective, SolveMethod, Solver};
/// let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 3, arrival_s: 0.0 }; 3]).unwrap();
/// let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
/// let limits = Limits { kv_capacity: Some(12), token_budget: Some(8), ..Limits::unlimited() };
/// let report = Solver::new(&w, &limits, &cost)
///     .objective(Objective::MeanLatency)
///     .time_limit(10.0)
///     .solve()
///     .unwrap();
/// assert_eq!(report.method, SolveMethod::Milp);
/// assert!(report.best_bound <= report.replayed_objective);
/// ```
#[derive(Debug, Clone)]
pub struct Solver<'a> {
    workload: &'a Workload,
    limits: &'a Limits,
    cost: &'a LinearCostModel,
    objective: Objective,
    options: SolveOptions,
}

impl<'a> Solver<'a> {
    /// A makespan solve of `workload` under `limits` and `cost` with default options.
    pub fn new(workload: &'a Workload, limits: &'a Limits, cost: &'a LinearCostModel) -> Self {
        Self {
            workload,
            limits,
            cost,
            objective: Objective::Makespan,
            options: SolveOptions::default(),
        }
    }

    /// What to minimize.
    pub fn objective(mut self, objective: Objective) -> Self {
        self.objective = objective;
        self
    }

    /// The policy class searched (the best schedule such a policy can reach).
    pub fn class(mut self, constraints: PolicyConstraints) -> Self {
        self.options.constraints = constraints;
        self
    }

    /// Wall-clock limit (seconds) for the exact methods.
    pub fn time_limit(mut self, seconds: f64) -> Self {
        self.options.time_limit_s = seconds;
        self
    }

    /// Memory the exact models' state graphs may take (bytes); see
    /// [`SolveOptions::memory_limit_bytes`].
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.options.memory_limit_bytes = bytes;
        self
    }

    /// Every other option at once (keeps the objective).
    pub fn options(mut self, options: SolveOptions) -> Self {
        self.options = options;
        self
    }

    /// Runs it: the exact methods where they fit the limits, else the best heuristic
    /// schedule with a combinatorial bound; the report says which.
    pub fn solve(&self) -> Result<SolveReport, SolveError> {
        solve(
            self.workload,
            self.limits,
            self.cost,
            self.objective,
            &self.options,
        )
    }
}

/// Solves the problem (see the crate documentation and [`Solver`]).
pub fn solve(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
) -> Result<SolveReport, SolveError> {
    let t_build = Instant::now();
    limits.validate()?;
    limits
        .check_feasible(w)
        .map_err(|e| SolveError::Infeasible(e.to_string()))?;
    let reqs = w.requests();
    let n = reqs.len();
    let class = options.constraints;
    // The class the model searches: offline, without C and P (and FCFS), chunked prefill
    // never helps (see `dominance`), so its arcs are left out; the optimum is the same.
    let model_class = PolicyConstraints {
        no_chunk: class.no_chunk || dominance::chunking_never_helps(w, limits, &class),
        ..class
    };
    let theta_ms = |f: Feature| cost.theta(f) * 1e3;
    let combinatorial = bounds::lower_bound(w, limits, cost, objective);
    // Exact models need every request's state graph: estimate them before building any.
    let graph_bytes: u64 = reqs
        .iter()
        .map(|r| {
            StateGraph::size(
                r,
                limits,
                model_class.no_evict || model_class.reserve,
                model_class.no_chunk,
            )
            .bytes()
        })
        .fold(0, u64::saturating_add);
    let warm = if options.warm_start
        || options.horizon.is_none()
        || graph_bytes > options.memory_limit_bytes
    {
        best_heuristic(
            w,
            limits,
            cost,
            objective,
            &model_class,
            &options.warm_start_from,
        )
    } else {
        None
    };
    if graph_bytes > options.memory_limit_bytes {
        let note = format!(
            "no exact model: the requests' state graphs alone would take about {} MiB, over the memory limit of {} MiB",
            graph_bytes / (1 << 20),
            options.memory_limit_bytes / (1 << 20)
        );
        return heuristic_with_bound(
            w,
            limits,
            cost,
            objective,
            class,
            warm,
            combinatorial,
            note,
            t_build,
        );
    }
    // The counting search is optimal over all schedules; an explicit horizon asks for the
    // best of at most J batches, which is the MILP's question.
    if options.max_search_states > 0
        && options.horizon.is_none()
        && dominance::chunking_never_helps(w, limits, &class)
        && let Some(report) = counting_search(w, limits, cost, objective, options, t_build)?
    {
        return Ok(report);
    }
    // Whatever the counting search used comes off the MILP's time limit.
    let time_limit_s = (options.time_limit_s - t_build.elapsed().as_secs_f64()).max(1.0);
    let t_build = Instant::now();
    let max_o = reqs
        .iter()
        .map(|r| r.output_tokens as usize)
        .max()
        .unwrap_or(1);
    // Horizon proof for makespan: every batch of the model processes tokens, so it costs
    // at least the per-batch bias, and the requests' entries cost at least their minimum
    // work (module `bounds`); at least `min_prefill_batches` batches pay the prefill flag
    // instead of the cheaper decode flag. So J batches cost at least J * bias + work_min
    // (+ that surplus), and J <= (UB - work_min - surplus) / bias.
    let bias_ms =
        theta_ms(Feature::One) + theta_ms(Feature::HasPrefill).min(theta_ms(Feature::HasDecode));
    let work_min_ms = bounds::min_total_work_s(w, cost) * 1e3;
    let (min_batches, min_prefill_batches) = bounds::min_batches(w, limits);
    let prefill_extra_ms = min_prefill_batches as f64
        * (theta_ms(Feature::HasPrefill) - theta_ms(Feature::HasDecode)).max(0.0);
    let (horizon, proven) = match (options.horizon, &warm) {
        (Some(j), _) => {
            if j < max_o {
                return Err(SolveError::Infeasible(format!(
                    "horizon J = {j} batches is shorter than the longest output ({max_o} tokens, one per batch)"
                )));
            }
            (j, false)
        }
        (None, Some((_, s, r))) => {
            let ub_ms = objective.of(&Summary::from_replay(r)) * 1e3;
            let proof = if objective == Objective::Makespan && bias_ms > 0.0 {
                // Also every batch processes at least one token (the better bound when
                // the makespan is mostly waiting for arrivals).
                let by_work = (ub_ms - work_min_ms - prefill_extra_ms).max(0.0) / bias_ms;
                let by_token = ub_ms / (bias_ms + theta_ms(Feature::Tokens));
                Some((by_work.min(by_token) + 1e-9).floor() as usize)
            } else {
                None
            };
            match proof {
                Some(p) if p <= options.max_horizon => (p.max(max_o).max(s.batches.len()), true),
                _ => (
                    ((s.batches.len() as f64 * options.horizon_slack).ceil() as usize)
                        .clamp(max_o, options.max_horizon.max(s.batches.len())),
                    false,
                ),
            }
        }
        (None, None) => {
            return Err(SolveError::Infeasible(
                "no heuristic schedule exists in this policy class to size the horizon; give --horizon".into(),
            ));
        }
    };

    // Identical requests (same I, O, T) form one class with integer flows for makespan;
    // latency objectives need each request's completion time, so one class per request.
    // FCFS orders individual requests, so it needs one class per request.
    let members = request_classes(w, objective == Objective::Makespan && !class.fcfs);
    let class_req: Vec<infersched_core::Request> = members.iter().map(|c| reqs[c[0]]).collect();
    let counts: Vec<f64> = members.iter().map(|c| c.len() as f64).collect();
    let graphs: Vec<StateGraph> = class_req
        .iter()
        .map(|r| class_graph(r, limits, &model_class))
        .collect();
    let mut m = Model {
        vars: ProblemVariables::new(),
        count: 0,
        integers: 0,
        rows: Vec::new(),
    };
    // x[k][j] = [(arc, var, column)]: how many requests of class k take the arc in slot j.
    let mut arc_columns = 0usize;
    for (g, r) in graphs.iter().zip(&class_req) {
        let left = options.max_arc_columns.saturating_sub(arc_columns);
        arc_columns += g.usable_arc_count(r.output_tokens, horizon, left);
        if arc_columns > options.max_arc_columns {
            break;
        }
    }
    if arc_columns > options.max_arc_columns {
        let note = format!(
            "no exact model: the arc-flow MILP would have more than {} arc variables ({} requests, horizon J = {horizon})",
            options.max_arc_columns,
            reqs.len()
        );
        return heuristic_with_bound(
            w,
            limits,
            cost,
            objective,
            class,
            warm,
            combinatorial,
            note,
            t_build,
        );
    }
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
    let fin: Vec<(Variable, usize)> = (0..members.len())
        .map(|_| m.add(variable().min(0.0), false))
        .collect();

    let max_arrival = reqs.iter().map(|r| r.arrival_s * 1e3).fold(0.0, f64::max);
    let arc_cost = |f: &BatchFeatures| entry_cost_ms(cost, f);
    let t_max = theta_ms(Feature::One)
        + theta_ms(Feature::HasPrefill)
        + theta_ms(Feature::HasDecode)
        + graphs
            .iter()
            .zip(&counts)
            .map(|(g, n)| {
                n * g
                    .arcs
                    .iter()
                    .map(|a| arc_cost(&a.features))
                    .fold(0.0, f64::max)
            })
            .sum::<f64>();

    for (i, g) in graphs.iter().enumerate() {
        // Flow: one unit leaves the start state in slot 0; what enters a state in slot j
        // leaves it in slot j + 1.
        let out0: Expression = x[i][0]
            .iter()
            .filter(|(a, ..)| g.arcs[*a].from == StateGraph::START)
            .map(|(_, v, _)| *v)
            .sum();
        m.rows.push(constraint!(out0 == counts[i]));
        for j in 1..horizon {
            let mut balance = vec![Expression::from(0.0); g.states.len()];
            let mut touched = vec![false; g.states.len()];
            for (a, v, _) in &x[i][j - 1] {
                balance[g.arcs[*a].to] += *v;
                touched[g.arcs[*a].to] = true;
            }
            for (a, v, _) in &x[i][j] {
                balance[g.arcs[*a].from] -= *v;
                touched[g.arcs[*a].from] = true;
            }
            for (s, e) in balance.into_iter().enumerate() {
                if touched[s] {
                    m.rows.push(constraint!(e == 0));
                }
            }
        }
    }
    if class.fcfs {
        // Not started by slot j = still on the start state's idle arc in slot j; a request
        // may wait there only while every later one (in arrival order) waits too.
        let mut class_of = vec![0usize; reqs.len()];
        for (k, mem) in members.iter().enumerate() {
            for &r in mem {
                class_of[r] = k;
            }
        }
        let waiting = |k: usize, j: usize| -> Expression {
            x[k][j]
                .iter()
                .filter(|(a, ..)| {
                    let arc = &graphs[k].arcs[*a];
                    arc.from == StateGraph::START && matches!(arc.kind, ArcKind::Idle)
                })
                .map(|(_, v, _)| *v)
                .sum()
        };
        for pair in w.fcfs_order().windows(2) {
            let (a, b) = (class_of[pair[0] as usize], class_of[pair[1] as usize]);
            for j in 0..horizon {
                m.rows.push(constraint!(waiting(b, j) >= waiting(a, j)));
            }
        }
    }
    for j in 0..horizon {
        let (mut tokens, mut prefill, mut kv, mut holding) = (
            Expression::from(0.0),
            Expression::from(0.0),
            Expression::from(0.0),
            Expression::from(0.0),
        );
        let mut time = theta_ms(Feature::One) * act[j].0
            + theta_ms(Feature::HasPrefill) * hp[j].0
            + theta_ms(Feature::HasDecode) * hd[j].0;
        // Per-slot totals over prefill and decode entries, for the flag rows below.
        let (mut pre_kv, mut dec_kv, mut pre_n, mut dec_n) = (
            Expression::from(0.0),
            Expression::from(0.0),
            Expression::from(0.0),
            Expression::from(0.0),
        );
        for (i, g) in graphs.iter().enumerate() {
            let (mut busy, mut pre, mut dec, mut arrival_gate) = (
                Expression::from(0.0),
                Expression::from(0.0),
                Expression::from(0.0),
                Expression::from(0.0),
            );
            for (a, v, _) in &x[i][j] {
                let arc = &g.arcs[*a];
                if arc.kv > 0 {
                    kv += arc.kv as f64 * *v;
                }
                if arc.holds {
                    holding += *v;
                }
                match arc.kind {
                    ArcKind::Idle => {}
                    ArcKind::Evict => busy += *v,
                    ArcKind::Process { c, decode, .. } => {
                        busy += *v;
                        arrival_gate += *v;
                        tokens += f64::from(c) * *v;
                        time += arc_cost(&arc.features) * *v;
                        if decode {
                            dec += *v;
                            dec_n += *v;
                            dec_kv += arc.kv as f64 * *v;
                        } else {
                            pre += *v;
                            pre_n += *v;
                            pre_kv += arc.kv as f64 * *v;
                            prefill += f64::from(c) * *v;
                        }
                    }
                }
            }
            let cnt = counts[i];
            m.rows.push(constraint!(busy <= cnt * act[j].0));
            m.rows.push(constraint!(pre <= cnt * hp[j].0));
            m.rows.push(constraint!(dec <= cnt * hd[j].0));
            let arrival_ms = class_req[i].arrival_s * 1e3;
            if arrival_ms > 0.0 {
                if members[i].len() == 1 {
                    m.rows
                        .push(constraint!(start[j].0 >= arrival_ms * arrival_gate));
                } else {
                    // Any member processing in slot j makes the slot wait for the arrival.
                    let (any, _) = m.add(variable().binary(), true);
                    m.rows.push(constraint!(arrival_gate <= cnt * any));
                    m.rows.push(constraint!(start[j].0 >= arrival_ms * any));
                }
            }
        }
        // The batch flags bound what prefill and decode entries together can use: valid
        // because each whole batch fits M, C and R_max, and much tighter than the per-class
        // rows above when many identical requests share one integer flow.
        if let Some(cap) = limits.kv_capacity {
            m.rows.push(constraint!(pre_kv <= cap as f64 * hp[j].0));
            m.rows.push(constraint!(dec_kv <= cap as f64 * hd[j].0));
        }
        if let Some(c) = limits.token_budget {
            m.rows
                .push(constraint!(dec_n.clone() <= c as f64 * hd[j].0));
        }
        if let Some(r) = limits.max_running {
            m.rows.push(constraint!(pre_n <= r as f64 * hp[j].0));
            m.rows.push(constraint!(dec_n <= r as f64 * hd[j].0));
        }
        if let Some(c) = limits.token_budget {
            m.rows.push(constraint!(tokens <= c as f64 * act[j].0));
        }
        if let Some(p) = limits.effective_prefill_budget() {
            m.rows.push(constraint!(prefill <= p as f64 * hp[j].0));
        }
        let kv_cap = limits.kv_capacity.map_or(1e12, |v| v as f64);
        m.rows.push(constraint!(kv <= kv_cap * act[j].0));
        if let Some(r) = limits.max_running {
            m.rows.push(constraint!(holding <= r as f64 * act[j].0));
        }
        if class.no_mix {
            m.rows.push(constraint!(hp[j].0 + hd[j].0 <= 1));
        }
        if j + 1 < horizon {
            m.rows.push(constraint!(act[j].0 >= act[j + 1].0));
        }
        if j > 0 {
            m.rows.push(constraint!(start[j].0 >= end[j - 1].0));
        }
        m.rows.push(constraint!(end[j].0 == start[j].0 + time));
    }
    // Batch-count lower bounds (module `bounds`): one token per request and batch, C, the
    // KV-time area over M, R_max; and the batches that must pay the prefill flag.
    let active: Expression = act.iter().map(|a| a.0).sum();
    m.rows.push(constraint!(active >= min_batches as f64));
    let prefill_batches: Expression = hp.iter().map(|h| h.0).sum();
    m.rows
        .push(constraint!(prefill_batches >= min_prefill_batches as f64));
    let objective_expr: Expression = match objective {
        Objective::Makespan => end[horizon - 1].0.into(),
        Objective::MeanLatency | Objective::MeanTtft => {
            // Completion (or first-token) time of i = sum over slots j of the slot's
            // duration d_j = E_j - E_{j-1} while i is not done before j:
            // p_ij >= d_j - D (done before j), p_ij >= 0, F_i = sum_j p_ij, where D bounds
            // one slot's duration (a batch plus any wait for arrivals). Much tighter than
            // a big-M over the whole horizon.
            let slot_bound = t_max + max_arrival;
            for (i, g) in graphs.iter().enumerate() {
                let mut done_before = Expression::from(0.0);
                let mut sum_p = Expression::from(0.0);
                for j in 0..horizon {
                    let (p_ij, _) = m.add(variable().min(0.0), false);
                    let duration: Expression = if j == 0 {
                        end[0].0.into()
                    } else {
                        end[j].0 - end[j - 1].0
                    };
                    m.rows.push(constraint!(
                        p_ij >= duration - slot_bound * done_before.clone()
                    ));
                    sum_p += p_ij;
                    for (a, v, _) in &x[i][j] {
                        if let ArcKind::Process {
                            finishes,
                            first_token,
                            ..
                        } = g.arcs[*a].kind
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
                m.rows.push(constraint!(fin[i].0 == sum_p));
            }
            fin.iter().map(|f| f.0).sum::<Expression>() / n as f64
        }
    };

    let Model {
        vars,
        count,
        integers,
        rows,
    } = m;
    let model_size = ModelSize {
        rows: rows.len(),
        columns: count,
        integers,
    };
    let mut problem = vars.minimise(objective_expr).using(highs);
    for r in rows {
        problem.add_constraint(r);
    }
    let mut hmodel = problem.into_inner();
    hmodel.make_quiet();
    let mut watcher = None;
    if options.log {
        hmodel.set_option("output_flag", true);
        hmodel.set_option("log_to_console", true);
    } else if options.progress {
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "infersched-highs-{}-{}.log",
            std::process::id(),
            RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        if let Some(p) = path.to_str() {
            hmodel.set_option("output_flag", true);
            hmodel.set_option("log_to_console", false);
            hmodel.set_option("log_file", p.as_bytes());
            watcher = Some(progress::ProgressWatcher::start(&path));
        }
    }
    hmodel.set_option("time_limit", time_limit_s);
    hmodel.set_option("threads", options.threads.max(1) as i32);
    hmodel.set_option("mip_rel_gap", options.mip_rel_gap);
    hmodel.set_option("mip_abs_gap", 1e-9);
    hmodel.set_option("random_seed", 0);

    // Warm start: the heuristic schedule as arc choices.
    let arcs = ArcModel {
        graphs: &graphs,
        members: &members,
        x: &x,
    };
    let slots = SlotCols {
        act: &act,
        hp: &hp,
        hd: &hd,
        start: &start,
        end: &end,
        fin: &fin,
    };
    let mut warm_report = None;
    if let Some((name, s, r)) = &warm
        && options.warm_start
        && s.batches.len() <= horizon
        && let Some(cols) = warm_columns(w, &arcs, &slots, s, r, objective, count)
    {
        let _ = hmodel.try_set_solution(Some(&cols), None, None, None);
        warm_report = Some((name.clone(), objective.of(&Summary::from_replay(r))));
    }
    let build_s = t_build.elapsed().as_secs_f64();

    let t_solve = Instant::now();
    let solved = hmodel
        .try_solve()
        .map_err(|e| SolveError::Highs(format!("{e:?}")))?;
    let solve_s = t_solve.elapsed().as_secs_f64();
    drop(watcher);
    let model_status = solved.status();
    let has_solution = solved.primal_solution_status() == highs::HighsSolutionStatus::Feasible;
    use highs::HighsModelStatus as M;
    let status = match model_status {
        M::Optimal => SolveStatus::Optimal,
        M::Infeasible => {
            return Err(SolveError::Infeasible(format!(
                "no schedule of at most J = {horizon} batches satisfies the limits and policy constraints"
            )));
        }
        _ if has_solution => SolveStatus::TimeLimit,
        _ => SolveStatus::NoSolution,
    };
    let bound_ms = solved
        .double_info_value(c"mip_dual_bound")
        .ok()
        .filter(|b| b.is_finite())
        .unwrap_or(0.0);
    let nodes = mip_node_count(&solved);
    let (schedule, milp_objective) = if has_solution {
        let sol = solved.get_solution();
        let cols = sol.columns();
        (extract(&arcs, cols), Some(solved.objective_value() / 1e3))
    } else if let Some((_, s, _)) = &warm {
        (s.clone(), None)
    } else {
        return Err(SolveError::Highs(format!(
            "no schedule found within {} s and no heuristic schedule in this class",
            options.time_limit_s
        )));
    };
    let r = replay(w, limits, cost, &schedule)?;
    let replayed = objective.of(&Summary::from_replay(&r));
    // The model minimizes the mean of absolute times F_i; latencies are F_i - T_i.
    let offset_s = if objective == Objective::Makespan {
        0.0
    } else {
        reqs.iter().map(|r| r.arrival_s).sum::<f64>() / n as f64
    };
    // HiGHS's bound holds for schedules of at most J batches; it is a bound on the optimum
    // when the horizon is proven sufficient (or asked for). The combinatorial bound always is.
    let milp_bound = bound_ms / 1e3 - offset_s;
    let (bound, bound_method) = if milp_bound >= combinatorial.value_s {
        (
            milp_bound,
            if status == SolveStatus::Optimal {
                BoundMethod::Exact
            } else {
                BoundMethod::MilpDualBound
            },
        )
    } else {
        (
            combinatorial.value_s,
            BoundMethod::Combinatorial(combinatorial.argument),
        )
    };
    let best_bound = bound.min(replayed).max(0.0);
    Ok(SolveReport {
        status,
        method: SolveMethod::Milp,
        objective,
        constraints: class,
        milp_objective: milp_objective.map(|v| v - offset_s),
        replayed_objective: replayed,
        best_bound,
        certified_gap: gap(replayed, best_bound),
        bound_method,
        note: (status == SolveStatus::NoSolution)
            .then(|| format!("HiGHS found no schedule within {time_limit_s:.0} s: the best heuristic schedule is returned")),
        horizon,
        horizon_proven_sufficient: proven,
        model: model_size,
        build_s,
        solve_s,
        nodes,
        warm_start: warm_report,
        schedule,
    })
}

/// `(replayed - bound) / replayed`, 0 for a zero objective.
fn gap(replayed: f64, bound: f64) -> f64 {
    if replayed > 0.0 {
        (replayed - bound) / replayed
    } else {
        0.0
    }
}

/// The answer when no exact model can be solved: the best heuristic schedule of the
/// portfolio (in the policy class), replayed, with the combinatorial bound; `note` says why.
#[allow(clippy::too_many_arguments)]
fn heuristic_with_bound(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: PolicyConstraints,
    warm: Option<(String, Schedule, Replay)>,
    bound: bounds::CombinatorialBound,
    note: String,
    started: Instant,
) -> Result<SolveReport, SolveError> {
    let Some((name, schedule, _)) = warm else {
        return Err(SolveError::Infeasible(format!(
            "{note}, and no heuristic schedule exists in this policy class"
        )));
    };
    let r = replay(w, limits, cost, &schedule)?;
    let replayed = objective.of(&Summary::from_replay(&r));
    let best_bound = bound.value_s.min(replayed).max(0.0);
    Ok(SolveReport {
        status: SolveStatus::NotProven,
        method: SolveMethod::BestHeuristic,
        objective,
        constraints: class,
        milp_objective: None,
        replayed_objective: replayed,
        best_bound,
        certified_gap: gap(replayed, best_bound),
        bound_method: BoundMethod::Combinatorial(bound.argument),
        note: Some(format!(
            "{note}; the best heuristic schedule ({name}) is returned with a combinatorial bound"
        )),
        horizon: schedule.batches.len(),
        horizon_proven_sufficient: false,
        model: ModelSize {
            rows: 0,
            columns: 0,
            integers: 0,
        },
        build_s: started.elapsed().as_secs_f64(),
        solve_s: 0.0,
        nodes: None,
        warm_start: Some((name, replayed)),
        schedule,
    })
}

/// The counting search (module `counting`) for an offline workload without C, P or FCFS:
/// a report with the proven optimum, or None when it gave up (too many states).
fn counting_search(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    started: Instant,
) -> Result<Option<SolveReport>, SolveError> {
    let class = options.constraints;
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
        ..class
    };
    let graphs: Vec<StateGraph> = members
        .iter()
        .map(|m| class_graph(&reqs[m[0]], limits, &unchunked))
        .collect();
    let t_solve = Instant::now();
    // Half the time limit at most; the MILP gets what is left.
    let deadline = t_solve + std::time::Duration::from_secs_f64(options.time_limit_s / 2.0);
    let Some(found) = counting::search(
        &graphs,
        &sizes,
        &members,
        limits,
        cost,
        objective,
        class.no_mix,
        options.max_search_states,
        deadline,
    ) else {
        return Ok(None);
    };
    let solve_s = t_solve.elapsed().as_secs_f64();
    let r = replay(w, limits, cost, &found.schedule)?;
    let replayed = objective.of(&Summary::from_replay(&r));
    // The search counts time from the common arrival; makespan is from 0.
    let offset_s = if objective == Objective::Makespan {
        reqs.first().map_or(0.0, |q| q.arrival_s)
    } else {
        0.0
    };
    let searched = found.objective_ms / 1e3 + offset_s;
    if (searched - replayed).abs() > 1e-9 * replayed.max(1e-3) {
        return Err(SolveError::Highs(format!(
            "internal error: the counting search's optimum {searched} s does not replay ({replayed} s)"
        )));
    }
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
        model: ModelSize {
            rows: 0,
            columns: 0,
            integers: 0,
        },
        build_s: t_solve.duration_since(started).as_secs_f64(),
        solve_s,
        nodes: Some(found.expanded as i64),
        warm_start: None,
        schedule: found.schedule,
    }))
}

/// The state graph of request `r` in policy class `class` (reservations forbid evictions).
fn class_graph(
    r: &infersched_core::Request,
    limits: &Limits,
    class: &PolicyConstraints,
) -> StateGraph {
    StateGraph::new(
        r,
        limits,
        class.no_evict || class.reserve,
        class.no_chunk,
        class.reserve,
    )
}

/// An entry's (arc's) own cost in milliseconds: every feature but the per-batch ones
/// (`one`, `has_prefill`, `has_decode`), which the batch pays once.
pub(crate) fn entry_cost_ms(cost: &LinearCostModel, f: &BatchFeatures) -> f64 {
    Feature::ALL
        .iter()
        .filter(|k| !matches!(k, Feature::One | Feature::HasPrefill | Feature::HasDecode))
        .map(|&k| cost.theta(k) * 1e3 * f.get(k))
        .sum()
}

/// HiGHS's branch-and-bound node count. It is an `int64` info item, which the `highs`
/// crate's `int_info_value` (HighsInt only) cannot read: asking it that way fails and
/// prints an error on stderr, so read it through the C API's int64 getter.
#[allow(unsafe_code)]
fn mip_node_count(solved: &highs::SolvedModel) -> Option<i64> {
    let mut value: i64 = -1;
    // SAFETY: `solved` owns a live Highs instance for the duration of the call; the name
    // is a NUL-terminated string and `value` a valid i64 the call writes into.
    let status = unsafe {
        highs_sys::Highs_getInt64InfoValue(solved.as_ptr(), c"mip_node_count".as_ptr(), &mut value)
    };
    (status == highs_sys::kHighsStatusOk && value >= 0).then_some(value)
}

/// Groups request ids into classes of identical requests (same I, O and arrival), in
/// order of first appearance, or one class per request.
fn request_classes(w: &Workload, aggregate: bool) -> Vec<Vec<usize>> {
    let mut classes: Vec<Vec<usize>> = Vec::new();
    let mut index: std::collections::HashMap<(u32, u32, u64), usize> =
        std::collections::HashMap::new();
    for (i, r) in w.requests().iter().enumerate() {
        let key = (r.input_tokens, r.output_tokens, r.arrival_s.to_bits());
        match index.get(&key) {
            Some(&k) if aggregate => classes[k].push(i),
            _ => {
                index.insert(key, classes.len());
                classes.push(vec![i]);
            }
        }
    }
    classes
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
