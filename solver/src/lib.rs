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
pub mod bounds;
mod class_repair;
mod classes;
mod counting;
pub mod dominance;
mod first_tokens;
pub mod graph;
pub mod groups;
pub mod list_search;
mod options;
mod plan_schedule;
mod portfolio;
pub mod progress;
mod report;

pub use options::{MILP_BYTES_PER_ARC_COLUMN, Objective, PolicyConstraints, SolveOptions};
pub use report::{
    BoundMethod, ModelSize, SolveError, SolveMethod, SolveReport, SolveStatus, WarmStart,
    certified_gap,
};

use graph::StateGraph;
use infersched_core::{Instance, Limits, Workload};
use infersched_cost_model::LinearCostModel;
use std::time::{Duration, Instant};

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
    // FCFS admission constrains only the order of first steps, and unmixed batches are
    // mixed ones split: the best schedule found without these rules, repaired into the
    // class, often beats the class's own searches.
    if class_repair::applies(&options.constraints)
        && options.list_search_evaluations > 0
        && w.len() >= 2
    {
        return class_repair::solve_with_class_repair(
            w,
            limits,
            cost,
            objective,
            options,
            |l, o| solve_in_class(w, l, cost, objective, o),
        );
    }
    solve_in_class(w, limits, cost, objective, options)
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

/// `start` plus `seconds`, or far in the future where that is not a time (a limit too
/// large for a [`Duration`]).
fn deadline_after(start: Instant, seconds: f64) -> Instant {
    Duration::try_from_secs_f64(seconds.max(0.0))
        .ok()
        .and_then(|d| start.checked_add(d))
        .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// The share of the time limit after which the heuristic portfolio tries no further
/// variant (once it has a schedule).
const PORTFOLIO_SHARE: f64 = 0.25;

/// [`solve`] in the class `options.constraints` by its own methods.
fn solve_in_class(
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
    check_numeric_range(w, cost)?;
    // Limits that cannot bind are dropped, so a huge M, C or R_max never reaches a model
    // coefficient; the schedules and the optimum are the same.
    let limits = &binding_limits(w, limits);
    let reqs = w.requests();
    let class = options.constraints;
    // The class the model searches: offline, without C and P (and FCFS), chunked prefill
    // never helps (see `dominance`), so its arcs are left out; the optimum is the same.
    let model_class = PolicyConstraints {
        no_chunk: class.no_chunk || dominance::chunking_never_helps(w, limits, &class),
        ..class
    };
    let combinatorial = bounds::lower_bound_in_class(w, limits, cost, objective, &class);
    // Exact models need every request's state graph: estimate them before building any.
    // Identical requests share one where the arc-flow model aggregates them (makespan,
    // without FCFS) and in the counting search; elsewhere each request has its own.
    let graph_of = |r: &infersched_core::Request| {
        StateGraph::size(
            r,
            limits,
            model_class.no_evict || model_class.reserve,
            model_class.no_chunk,
        )
        .bytes()
    };
    let shares_graphs = objective == Objective::Makespan && !class.fcfs;
    let graph_bytes: u64 = classes::request_classes(w, shares_graphs)
        .iter()
        .map(|m| graph_of(&reqs[m[0]]))
        .fold(0, u64::saturating_add);
    let no_exact_model = graph_bytes > options.memory_limit_bytes;
    // The counting searches over identical-request classes (offline, no FCFS): the pooled
    // search needs no state graph, so it runs even where the exact models do not fit.
    let counting_applies = options.max_search_states > 0
        && options.horizon.is_none()
        && dominance::offline(w)
        && !class.fcfs;
    let pooled_applies = counting_applies && counting::pooled::applies(w, &class);
    let warm = if options.warm_start || options.horizon.is_none() || no_exact_model {
        portfolio::best_heuristic(
            w,
            limits,
            cost,
            objective,
            &model_class,
            &options.warm_start_from,
            deadline_after(t_build, options.time_limit_s * PORTFOLIO_SHARE),
        )
    } else {
        None
    };
    let warm = warm.map(|start| {
        if options.list_search_evaluations == 0 {
            return start;
        }
        let budget = list_search::SearchBudget {
            evaluations: options.list_search_evaluations,
            deadline: Duration::try_from_secs_f64(options.time_limit_s / 2.0)
                .ok()
                .and_then(|half| t_build.checked_add(half))
                .unwrap_or(t_build),
        };
        list_search::improve(w, limits, cost, objective, &model_class, start, budget).0
    });
    // Where the best schedule so far meets the combinatorial bound, it is optimal and
    // nothing below can do better (a request alone, as many of a trace's bursts are, is
    // served at its own minimum time by the heuristics). Not where the MILP's question is
    // asked (an explicit horizon: at most J batches) or the MILP is asked for
    // (`max_search_states` 0, `--milp-only`).
    // The best schedule found, with a bound and a note saying why no exact model answers.
    let best_with_bound = |warm, combinatorial, note: String| {
        portfolio::heuristic_with_bound(
            w,
            limits,
            cost,
            objective,
            class,
            warm,
            combinatorial,
            note,
            t_build,
        )
    };
    if options.horizon.is_none()
        && options.max_search_states > 0
        && let Some(best) = &warm
        && best.objective_value(objective) <= combinatorial.value_s * (1.0 + 1e-9)
    {
        return best_with_bound(warm, combinatorial, "no exact model needed".to_string());
    }
    // For mean TTFT, the list search on the first-token problem (its schedules finished
    // after their first tokens; module `first_tokens`), at any size.
    let warm = if objective == Objective::MeanTtft && options.list_search_evaluations > 0 {
        let deadline = t_build + Duration::from_secs_f64(options.time_limit_s * 0.6);
        first_tokens::searched(w, limits, cost, &model_class, &warm, options, deadline).or(warm)
    } else {
        warm
    };
    // For mean latency, the plan search from the best schedule's own plan (its completion
    // order and where its prompts ran), as from the phase relaxation's below: it needs no
    // relaxation, so it reaches bursts of any size. Not where the workload is solved in
    // independent groups below (each group's solve re-plans its own schedule).
    let in_groups = |best: &portfolio::BestHeuristic| {
        options.independent_groups
            && options.horizon.is_none()
            && groups::independent_groups(w, &best.replay).len() >= 2
    };
    let warm = match &warm {
        Some(best)
            if objective == Objective::MeanLatency
                && options.list_search_evaluations > 0
                && w.len() <= plan_schedule::MAX_REQUESTS
                && !in_groups(best) =>
        {
            let plan = plan_schedule::plan_of_schedule(w, &best.schedule, &best.replay);
            // Where neither the phase relaxation nor an exact model follows, nothing else
            // would use the time: the search gets it (up to its budget of tries).
            let last_method = no_exact_model
                && !pooled_applies
                && !(options.phase_relaxation && w.len() <= bounds::PHASE_RELAXATION_MAX_REQUESTS);
            let deadline = if last_method {
                t_build + Duration::from_secs_f64(options.time_limit_s * RE_PLAN_LAST_SHARE)
            } else {
                let left = (options.time_limit_s - t_build.elapsed().as_secs_f64()).max(0.0);
                (Instant::now() + Duration::from_secs_f64(left * RE_PLAN_SHARE))
                    .min(t_build + Duration::from_secs_f64(options.time_limit_s * 0.6))
            };
            let label = format!("{} re-planned", best.name);
            planned_schedule(
                w,
                limits,
                cost,
                objective,
                &model_class,
                &plan,
                &warm,
                options,
                deadline,
                &label,
            )
            .or(warm)
        }
        _ => warm,
    };
    if let (Some(observer), Some(best)) = (&options.observer, &warm) {
        observer.0.incumbent(&best.name, &best.schedule);
    }
    // Bursts the best schedule so far serves one after another are solved one at a time
    // (module `groups`; the whole workload's schedule is kept where it is better): all the
    // time left where no exact model fits the whole workload, else half of it, the whole
    // workload's exact model going on from the groups' schedule and bound unless the
    // groups prove it optimal.
    let by_groups = match &warm {
        Some(whole)
            if options.independent_groups
                && objective != Objective::Makespan
                && options.horizon.is_none() =>
        {
            let mut parts = groups::independent_groups(w, &whole.replay);
            if objective == Objective::MeanTtft
                && let Some(split) = groups::bursts_served_in_turn(w, limits, cost)
                && split.len() > parts.len()
            {
                // First tokens first finishes every request at the end, so its completions
                // show no bursts.
                parts = split;
            }
            if parts.len() >= 2 {
                let left = options.time_limit_s - t_build.elapsed().as_secs_f64();
                let share = if no_exact_model { 1.0 } else { 0.5 };
                groups::solve_by_groups(
                    w,
                    limits,
                    cost,
                    objective,
                    options,
                    &parts,
                    whole,
                    combinatorial,
                    left * share,
                    t_build,
                )?
            } else {
                None
            }
        }
        _ => None,
    };
    // Where the groups' answer is not final, the report says what it was.
    let groups_note = by_groups.as_ref().map(|report| {
        format!(
            "the workload was first solved as independent groups (independent-groups: bound {:.6} ms, schedule {:.6} ms), which the whole workload's methods then went on from",
            report.best_bound * 1e3,
            report.replayed_objective * 1e3
        )
    });
    let (warm, combinatorial) = match by_groups {
        Some(report) if no_exact_model || report.status == SolveStatus::Optimal => {
            return Ok(report);
        }
        Some(report) => {
            let bound = match report.bound_method {
                BoundMethod::Combinatorial(argument) => bounds::CombinatorialBound {
                    value_s: report.best_bound,
                    argument,
                },
                _ => combinatorial,
            };
            let better = warm
                .as_ref()
                .is_none_or(|whole| report.replayed_objective < whole.objective_value(objective));
            let warm = if better {
                let replay = infersched_core::replay(w, limits, cost, &report.schedule)?;
                Some(portfolio::BestHeuristic {
                    name: report
                        .warm_start
                        .map_or_else(|| "independent-groups".to_string(), |s| s.heuristic),
                    schedule: report.schedule,
                    replay,
                })
            } else {
                warm
            };
            (warm, bound)
        }
        None => (warm, combinatorial),
    };
    // The phase relaxation: its bound, and a schedule from its plan. All the time left where
    // no exact model follows, else a quarter of it (the exact model's own bound may do better).
    let with_phase_bound = |share: f64,
                            plan_share: f64,
                            warm: Option<portfolio::BestHeuristic>,
                            combinatorial: bounds::CombinatorialBound| {
        if !options.phase_relaxation {
            return (combinatorial, warm);
        }
        let left = options.time_limit_s - t_build.elapsed().as_secs_f64();
        let Some(relaxed) =
            bounds::phase_relaxation(w, limits, cost, objective, left * share, options.threads)
        else {
            return (combinatorial, warm);
        };
        let bound = Some(relaxed.bound)
            .filter(|b| b.value_s > combinatorial.value_s)
            .unwrap_or(combinatorial);
        // The plan search gets the next `plan_share` of the time left.
        let deadline = t_build
            + Duration::from_secs_f64(
                (options.time_limit_s - left * (1.0 - share - plan_share)).max(0.0),
            );
        let planned = relaxed.plan.and_then(|plan| match objective {
            Objective::MeanTtft => {
                first_tokens::planned(w, limits, cost, &class, &plan, &warm, options, deadline)
            }
            _ => planned_schedule(
                w,
                limits,
                cost,
                objective,
                &class,
                &plan,
                &warm,
                options,
                deadline,
                "phase-relaxation plan",
            ),
        });
        (bound, planned.or(warm))
    };
    // Where the exact models do not fit, the best schedule found with the best bound that
    // needs no state graph (the pooled search's, where it applies, then the phase
    // relaxation's).
    let without_exact_model = |warm, combinatorial| {
        let (combinatorial, warm) = with_phase_bound(0.8, 0.15, warm, combinatorial);
        let note = format!(
            "no exact model: the requests' state graphs alone would take about {}, over the memory limit of {}",
            human_bytes(graph_bytes),
            human_bytes(options.memory_limit_bytes)
        );
        best_with_bound(warm, combinatorial, note)
    };
    if no_exact_model && !pooled_applies {
        return without_exact_model(warm, combinatorial);
    }
    // The counting search over whole prefills is exact where chunking never helps
    // (optimal over all schedules) or the class forbids it; an explicit horizon asks for
    // the best of at most J batches, which is the MILP's question. It builds a state graph
    // per class, as the estimate counted.
    let counting_exact = counting_applies
        && !no_exact_model
        && (class.no_chunk || dominance::chunking_never_helps(w, limits, &class));
    if counting_exact
        && let Some(report) = counting::solve_by_counting(
            w,
            limits,
            cost,
            objective,
            options,
            warm.as_ref(),
            t_build,
        )?
    {
        return Ok(report);
    }
    // A quick pooled search first (2% of the time limit): where it proves the best
    // heuristic optimal, or follows its optimum to a schedule at its bound (mean TTFT with
    // evictions, typically in a few hundred vectors), nothing below is needed.
    let warm = if counting_applies && !counting_exact {
        let deadline = t_build + Duration::from_secs_f64(options.time_limit_s * 0.02);
        let quick = SolveOptions {
            max_search_states: options.max_search_states.min(QUICK_POOLED_STATES),
            ..options.clone()
        };
        match counting::pooled_search(w, limits, cost, objective, &quick, warm, deadline, t_build)?
        {
            counting::PooledSearch::Proven(report) => return Ok(report),
            counting::PooledSearch::Bounded { warm, .. } => warm,
        }
    } else {
        warm
    };
    // With C or P it is not exact (a chunk can fill a batch's leftover budget), but its
    // optimum over whole prefills is a schedule: the MILP starts from it when it is better
    // (unless the warm start is off or restricted to named heuristics).
    let warm = if counting_applies
        && !counting_exact
        && !no_exact_model
        && options.warm_start
        && options.warm_start_from.is_empty()
    {
        let deadline = t_build + Duration::from_secs_f64(options.time_limit_s * 0.1);
        match counting::unchunked_optimum(
            w,
            limits,
            cost,
            objective,
            &class,
            options.max_search_states,
            options.memory_limit_bytes,
            warm.as_ref().map(|best| best.objective_value(objective)),
            deadline,
        )? {
            counting::Searched::Optimum(searched)
                if warm
                    .as_ref()
                    .is_none_or(|best| searched.2 < best.objective_value(objective)) =>
            {
                let (found, replay, _) = *searched;
                Some(portfolio::BestHeuristic {
                    name: format!(
                        "counting search over whole prefills (states: {})",
                        found.expanded
                    ),
                    schedule: found.schedule,
                    replay,
                })
            }
            _ => warm,
        }
    } else {
        warm
    };
    // The arc-flow MILP's question, from the best schedule and bound found so far.
    let arc_flow_problem = |warm, combinatorial| arcflow::ArcFlowProblem {
        w,
        limits,
        cost,
        objective,
        options,
        model_class,
        warm,
        combinatorial,
        started: t_build,
    };
    // The pooled search bounds chunked schedules (every objective): it may prove the best
    // schedule so far optimal, or follow its optimal path to a schedule at its bound, else
    // its bound joins the others.
    let (combinatorial, warm) = if counting_applies && !counting_exact {
        // 35% of the time limit, or 85% where the arc-flow MILP would be refused for its
        // size anyway (family (a) with C = 64, mean latency with evictions: bound 124.8 ->
        // 126.0 ms in 60 s).
        let probe = arc_flow_problem(warm, combinatorial);
        // The probe builds a state graph per distinct request: only where they are small.
        let share = if no_exact_model
            || (graph_bytes <= PROBE_GRAPH_BYTES && arcflow::exceeds_arc_columns(&probe))
        {
            POOLED_SHARE_WITHOUT_MILP
        } else {
            POOLED_SHARE
        };
        let warm = probe.warm;
        let deadline = t_build + Duration::from_secs_f64(options.time_limit_s * share);
        match counting::pooled_search(w, limits, cost, objective, options, warm, deadline, t_build)?
        {
            counting::PooledSearch::Proven(report) => return Ok(report),
            counting::PooledSearch::Bounded { bound, warm } => (
                match bound {
                    Some((value_s, argument)) if value_s > combinatorial.value_s => {
                        bounds::CombinatorialBound { value_s, argument }
                    }
                    _ => combinatorial,
                },
                warm,
            ),
        }
    } else {
        (combinatorial, warm)
    };
    if no_exact_model {
        return without_exact_model(warm, combinatorial);
    }
    let (combinatorial, warm) = with_phase_bound(0.25, 0.05, warm, combinatorial);
    let problem = arc_flow_problem(warm, combinatorial);
    // good_lp panics where HiGHS reports an error; that must not escape to the caller.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        arcflow::solve_arc_flow(problem)
    }))
    .unwrap_or_else(|payload| {
        Err(SolveError::Highs(format!(
            "the MILP failed: {}",
            panic_message(payload.as_ref())
        )))
    })
    .map(|mut report| {
        if let Some(groups) = groups_note {
            report.note = Some(match report.note {
                Some(note) => format!("{note}; {groups}"),
                None => groups,
            });
        }
        report
    })
}

/// The plan search from the best schedule's own plan: its share of the time left (the
/// phase relaxation, whose bound gains from time, comes after it).
const RE_PLAN_SHARE: f64 = 0.1;

/// Where no later method would use the time: the share of the time limit (from the start)
/// by which the plan search from the best schedule's own plan ends, leaving the rest for
/// the bound and the answer's replay.
const RE_PLAN_LAST_SHARE: f64 = 0.9;

/// The pooled search's share of the time limit (from the start) before the MILP.
const POOLED_SHARE: f64 = 0.35;

/// The most bytes of state graphs (all requests', estimated) for which the pooled search's
/// share is decided by probing the MILP's size first.
const PROBE_GRAPH_BYTES: u64 = 64 << 20;

/// Its share where the MILP would be refused for its size: what is left goes to the phase
/// relaxation's share and the answer.
const POOLED_SHARE_WITHOUT_MILP: f64 = 0.85;

/// The most count vectors the quick pooled search before the whole-prefill search keeps:
/// enough where it reaches its goal at once (family (a) with C = 64, mean TTFT with
/// evictions: 489 expanded at n = 128, 0.4 s), little where it does not (at n = 32
/// without evictions it costs 0.1 - 0.8 s of 3.4 - 5.4 s).
const QUICK_POOLED_STATES: usize = 10_000;

/// The schedule of the phase relaxation's plan ([`plan_schedule`]) when it is valid, in
/// the policy class and better than `warm` (prefill chunks merged where chunking never
/// helps, as the exact model's warm start needs).
#[allow(clippy::too_many_arguments)]
fn planned_schedule(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: &PolicyConstraints,
    plan: &bounds::PhasePlan,
    warm: &Option<portfolio::BestHeuristic>,
    options: &SolveOptions,
    deadline: Instant,
    label: &str,
) -> Option<portfolio::BestHeuristic> {
    let (mut schedule, mut replay, tried) = plan_schedule::search_plans(
        w,
        limits,
        cost,
        objective,
        class,
        plan,
        options.plan_search_evaluations.max(1),
        deadline,
    )?;
    if dominance::chunking_never_helps(w, limits, class) {
        schedule = dominance::merge_prefill_chunks(w, &schedule);
        replay = infersched_core::replay(w, limits, cost, &schedule).ok()?;
    }
    let planned = portfolio::BestHeuristic {
        name: format!("{label} (plans tried: {tried})"),
        schedule,
        replay,
    };
    let better = warm
        .as_ref()
        .is_none_or(|h| planned.objective_value(objective) < h.objective_value(objective));
    better.then_some(planned)
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
