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

mod arcflow;
pub mod bounds;
mod classes;
mod counting;
pub mod dominance;
pub mod graph;
mod options;
mod portfolio;
pub mod progress;
mod report;

pub use options::{Objective, PolicyConstraints, SolveOptions};
pub use report::{
    BoundMethod, ModelSize, SolveError, SolveMethod, SolveReport, SolveStatus, WarmStart,
};

use graph::StateGraph;
use infersched_core::{Limits, Workload};
use infersched_cost_model::LinearCostModel;
use std::time::Instant;

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

    /// Reports HiGHS's progress to `observer` while the MILP runs.
    pub fn observe(mut self, observer: impl progress::SolveObserver + 'static) -> Self {
        self.options.observer = Some(progress::Observer::new(observer));
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
    let class = options.constraints;
    // The class the model searches: offline, without C and P (and FCFS), chunked prefill
    // never helps (see `dominance`), so its arcs are left out; the optimum is the same.
    let model_class = PolicyConstraints {
        no_chunk: class.no_chunk || dominance::chunking_never_helps(w, limits, &class),
        ..class
    };
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
        portfolio::best_heuristic(
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
        return portfolio::heuristic_with_bound(
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
        && let Some(report) =
            counting::solve_by_counting(w, limits, cost, objective, options, t_build)?
    {
        return Ok(report);
    }
    arcflow::solve_arc_flow(arcflow::ArcFlowProblem {
        w,
        limits,
        cost,
        objective,
        options,
        model_class,
        warm,
        combinatorial,
        started: t_build,
    })
}
