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
//! Offline without a token budget the exact counting search answers; with one, the MILP,
//! unless the pooled search (a relaxation over chunked schedules) already proves the best
//! schedule found optimal, or its own optimal path, followed request by request, replays
//! at its bound (see [`SolveMethod`]). For mean TTFT the searches also run on the
//! first-token problem (every output cut to one token), whose schedules are finished after
//! the first tokens:
//!
//! ```
//! use infersched_core::{Limits, Request, Workload};
//! use infersched_solver::{Objective, SolveMethod, SolveOptions, SolveStatus, solve};
//! let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 3, arrival_s: 0.0 }; 3]).unwrap();
//! let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
//! let limits = Limits { kv_capacity: Some(12), token_budget: Some(8), ..Limits::unlimited() };
//! let report = solve(&w, &limits, &cost, Objective::Makespan, &SolveOptions::default()).unwrap();
//! println!("{:?}: {} s (bound {} s)", report.status, report.replayed_objective, report.best_bound);
//! assert_eq!(report.status, SolveStatus::Optimal);
//! assert!(report.best_bound <= report.replayed_objective);
//!
//! let offline = Limits { token_budget: None, ..limits };
//! let exact = solve(&w, &offline, &cost, Objective::MeanLatency, &SolveOptions::default()).unwrap();
//! assert_eq!(exact.method, SolveMethod::CountingSearch);
//! assert_eq!(exact.certified_gap, 0.0);
//! ```

mod arcflow;
mod backend;
pub mod bounds;
mod budget;
mod class_repair;
mod classes;
pub mod cluster;
mod counting;
mod dispatch;
pub mod dominance;
mod first_tokens;
pub mod graph;
pub mod groups;
pub mod list_search;
mod options;
mod plan_schedule;
mod portfolio;
mod problem;
pub mod progress;
mod report;
mod store;

pub use options::{MILP_BYTES_PER_ARC_COLUMN, Objective, PolicyConstraints, SolveOptions};
pub use report::{
    BoundMethod, ModelSize, SolveError, SolveMethod, SolveReport, SolveStatus, WarmStart,
    certified_gap,
};

use dispatch::solve_in_class;
use infersched_core::{Instance, Limits, Workload};
use infersched_cost_model::LinearCostModel;

/// A solve, set up step by step: the library's entry point.
///
/// ```
/// use infersched_core::{Limits, Request, Workload};
/// use infersched_solver::{Objective, SolveStatus, Solver};
/// let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 3, arrival_s: 0.0 }; 3]).unwrap();
/// let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
/// let limits = Limits { kv_capacity: Some(12), token_budget: Some(8), ..Limits::unlimited() };
/// let report = Solver::new(&w, &limits, &cost)
///     .objective(Objective::MeanLatency)
///     .time_limit(10.0)
///     .solve()
///     .unwrap();
/// // Proven optimal (here by the pooled search over chunked schedules; `report.method`
/// // says which method answered), so the bound meets the schedule's replayed objective.
/// assert_eq!(report.status, SolveStatus::Optimal);
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

    /// A makespan solve of a validated [`Instance`] with default options.
    ///
    /// ```
    /// use infersched_core::{Instance, Limits, Request, Workload};
    /// use infersched_solver::{Objective, Solver};
    /// let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 3, arrival_s: 0.0 }; 2]).unwrap();
    /// let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
    /// let limits = Limits { kv_capacity: Some(12), token_budget: Some(8), ..Limits::unlimited() };
    /// let instance = Instance::new(w, limits, cost).unwrap();
    /// let report = Solver::for_instance(&instance).objective(Objective::MeanLatency).solve().unwrap();
    /// // The instance replays the solver's schedule to the same objective.
    /// let replayed = instance.replay(&report.schedule).unwrap();
    /// assert!(report.best_bound <= report.replayed_objective);
    /// assert!(replayed.makespan_s() > 0.0);
    /// ```
    pub fn for_instance(instance: &'a Instance<LinearCostModel>) -> Self {
        Self::new(instance.workload(), instance.limits(), instance.cost())
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
    let started = std::time::Instant::now();
    // FCFS admission constrains only the order of first steps, and unmixed batches are
    // mixed ones split: the best schedule found without these rules, repaired into the
    // class, often beats the class's own searches.
    let mut report = if class_repair::applies(&options.constraints)
        && options.list_search_evaluations > 0
        && w.len() >= 2
    {
        class_repair::solve_with_class_repair(w, limits, cost, objective, options, |l, o| {
            solve_in_class(w, l, cost, objective, o)
        })?
    } else {
        solve_in_class(w, limits, cost, objective, options)?
    };
    // The times the solve actually took: the final method's, and all before it.
    let total_s = started.elapsed().as_secs_f64();
    report.solve_s = report.solve_s.clamp(0.0, total_s);
    report.build_s = total_s - report.solve_s;
    Ok(report)
}

/// Bytes for a message: in MiB from 1 MiB up, else in KiB or bytes (`"6821647 MiB"`,
/// `"104 KiB"`).
fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The message of a caught panic (`std::panic::catch_unwind`'s payload).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}

/// The largest arrival time, in seconds, the solver takes (about 31.7 years): beyond it the
/// batch times added to it lose the cost model's resolution in f64.
pub const MAX_ARRIVAL_S: f64 = 1e9;

/// The largest batch time, in seconds, any coefficient of the cost model may give one unit.
pub const MAX_COEFFICIENT_S: f64 = 1e6;

/// Refuses numbers that would make the models' coefficients meaningless.
fn check_numeric_range(w: &Workload, cost: &LinearCostModel) -> Result<(), SolveError> {
    if let Some((i, r)) = w
        .requests()
        .iter()
        .enumerate()
        .find(|(_, r)| r.arrival_s > MAX_ARRIVAL_S)
    {
        return Err(SolveError::OutOfRange(format!(
            "request {i} arrives at {} s; the solver takes arrivals up to {MAX_ARRIVAL_S:e} s (shift the trace to start near 0)",
            r.arrival_s
        )));
    }
    for feature in infersched_core::Feature::ALL {
        let (name, theta) = (feature.name(), cost.theta(feature));
        if !theta.is_finite() || theta.abs() > MAX_COEFFICIENT_S {
            return Err(SolveError::OutOfRange(format!(
                "cost model {}: coefficient {name} is {theta} s per unit; the solver takes at most {MAX_COEFFICIENT_S:e} s",
                cost.name
            )));
        }
    }
    Ok(())
}

/// `limits` without the limits that cannot bind on `w`: M at least the block-rounded KV of
/// every request's peak at once, C and P at least every request's largest step (I + O - 1
/// tokens, a full refill) at once, R_max at least the number of requests.
pub fn binding_limits(w: &Workload, limits: &Limits) -> Limits {
    let reqs = w.requests();
    let peak_kv = reqs
        .iter()
        .map(|r| limits.occupied(r.max_kv_tokens()))
        .fold(0u64, u64::saturating_add);
    let largest_steps = reqs
        .iter()
        .map(|r| r.max_kv_tokens())
        .fold(0u64, u64::saturating_add);
    let n = reqs.len() as u64;
    Limits {
        kv_capacity: limits.kv_capacity.filter(|&m| m < peak_kv),
        token_budget: limits.token_budget.filter(|&c| c < largest_steps),
        prefill_budget: limits.prefill_budget.filter(|&p| p < largest_steps),
        max_running: limits.max_running.filter(|&r| r < n),
        ..*limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;

    fn cost() -> LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    fn workload(arrival_s: f64) -> Workload {
        let r = |i, o, t| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        Workload::new(vec![r(6, 2, 0.0), r(4, 3, arrival_s)]).unwrap()
    }

    fn quick() -> SolveOptions {
        SolveOptions {
            time_limit_s: 10.0,
            threads: 1,
            ..SolveOptions::default()
        }
    }

    #[test]
    fn a_reports_times_add_up_to_the_solves_wall_time() {
        let w = workload(0.0);
        for objective in [Objective::Makespan, Objective::MeanLatency] {
            let before = std::time::Instant::now();
            let r = solve(&w, &Limits::unlimited(), &cost(), objective, &quick()).unwrap();
            let wall = before.elapsed().as_secs_f64();
            assert!(r.build_s >= 0.0 && r.solve_s >= 0.0, "{r:?}");
            let spent = r.build_s + r.solve_s;
            assert!(spent > 0.0 && spent <= wall, "{spent} of {wall}");
        }
    }

    #[test]
    fn limits_that_cannot_bind_are_dropped_and_huge_ones_solve_like_none() {
        let w = workload(0.0);
        // Peaks: 7 and 6 KV tokens (13 together), steps up to 7 and 6 tokens, 2 requests.
        let l = Limits {
            kv_capacity: Some(13),
            token_budget: Some(13),
            max_running: Some(2),
            ..Limits::unlimited()
        };
        let b = binding_limits(&w, &l);
        assert_eq!(
            (b.kv_capacity, b.token_budget, b.max_running),
            (None, None, None)
        );
        let tight = Limits {
            kv_capacity: Some(12),
            token_budget: Some(12),
            max_running: Some(1),
            ..Limits::unlimited()
        };
        assert_eq!(binding_limits(&w, &tight), tight);
        // The numbers that used to make good_lp panic ("HiGHS error: invalid problem").
        let huge = Limits {
            kv_capacity: Some(u64::MAX),
            token_budget: Some(1_000_000_000_000_000),
            max_running: Some(u64::MAX),
            ..Limits::unlimited()
        };
        let options = SolveOptions {
            max_search_states: 0,
            ..quick()
        };
        let a = solve(&w, &huge, &cost(), Objective::Makespan, &options).unwrap();
        let b = solve(
            &w,
            &Limits::unlimited(),
            &cost(),
            Objective::Makespan,
            &options,
        )
        .unwrap();
        assert_eq!(a.status, SolveStatus::Optimal);
        assert!((a.replayed_objective - b.replayed_objective).abs() < 1e-12);
    }

    #[test]
    fn numbers_out_of_range_are_refused_by_name() {
        let e = solve(
            &workload(5e9),
            &Limits::unlimited(),
            &cost(),
            Objective::Makespan,
            &quick(),
        )
        .unwrap_err();
        assert!(matches!(e, SolveError::OutOfRange(_)), "{e}");
        assert!(
            e.to_string().contains("request 1 arrives at 5000000000 s"),
            "{e}"
        );
        let mut c = cost();
        c.theta_s[infersched_core::Feature::Tokens as usize] = 1e16;
        let e = solve(
            &workload(0.0),
            &Limits::unlimited(),
            &c,
            Objective::Makespan,
            &quick(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("coefficient tokens"), "{e}");
    }
}
