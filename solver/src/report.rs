//! What a solve answers: the schedule, its replayed objective, a proven lower bound and
//! the certified gap, which method produced each, and the errors.

use crate::bounds::CombinatorialBound;
use crate::store::Incumbent;
use crate::{Objective, PolicyConstraints, bounds};
use infersched_core::Schedule;
use infersched_core::{Limits, Workload, replay};
use infersched_cost_model::LinearCostModel;
use serde::Serialize;
use std::time::Instant;
use thiserror::Error;

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

infersched_core::named_enum!(SolveStatus, "solve status", {
    Optimal => "optimal",
    TimeLimit => "time-limit",
    NoSolution => "no-solution",
    NotProven => "not-proven",
});

/// Why a problem cannot be solved.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SolveError {
    /// Invalid limits.
    #[error(transparent)]
    Limits(#[from] infersched_core::LimitsError),
    /// No schedule can serve the workload.
    #[error("infeasible: {0}")]
    Infeasible(String),
    /// HiGHS failed, or stopped with no schedule while no heuristic schedule exists.
    #[error("HiGHS: {0}")]
    Highs(String),
    /// A number of the problem is outside what the solver computes with exactly (arrival
    /// times, batch-time coefficients); the message names it and the range.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// An exact method's result disagrees with the replay (a bug).
    #[error("internal error: {0}")]
    Internal(String),
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
    /// best schedule of the heuristic portfolio, the priority-list search and the phase
    /// relaxation's plans, with a combinatorial bound.
    BestHeuristic,
    /// The workload split into bursts the best heuristic schedule serves one after another;
    /// each solved on its own (module `groups`), the schedules concatenated and the
    /// bounds' size-weighted mean taken.
    IndependentGroups,
}

infersched_core::named_enum!(SolveMethod, "solve method", {
    Milp => "milp",
    CountingSearch => "counting-search",
    BestHeuristic => "best-heuristic",
    IndependentGroups => "independent-groups",
});

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

/// A heuristic schedule a solve started from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmStart {
    /// The heuristic and its variant, e.g. `mcsf+order=tokens+max-running=24`.
    pub heuristic: String,
    /// Its replayed objective (seconds).
    pub objective: f64,
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
    /// The MILP's size (None when no MILP was built).
    pub model: Option<ModelSize>,
    /// Seconds before the answering method: heuristics, bounds, searches and the model's
    /// build (`build_s + solve_s` is the solve's wall time, as [`crate::solve`] measures it).
    pub build_s: f64,
    /// Seconds of the answering method (HiGHS for the MILP, the search that proved it).
    pub solve_s: f64,
    /// HiGHS's branch-and-bound nodes, when it reports them.
    pub nodes: Option<i64>,
    /// States the counting search expanded, when it answered.
    pub states_expanded: Option<u64>,
    /// The heuristic schedule the MILP started from (or that is returned).
    pub warm_start: Option<WarmStart>,
    /// The schedule (the warm start's if HiGHS found nothing better).
    #[serde(skip)]
    pub schedule: Schedule,
}

/// What every answer states: its schedule, how it was found, its replayed value and the
/// bound proven beside it.
pub(crate) struct Answer {
    /// How the solve ended.
    pub status: SolveStatus,
    /// The method that produced the schedule.
    pub method: SolveMethod,
    /// The objective and policy class solved.
    pub objective: Objective,
    /// The policy class.
    pub constraints: PolicyConstraints,
    /// The schedule and its replayed objective (seconds).
    pub schedule: Schedule,
    /// The replayed objective (seconds).
    pub replayed: f64,
    /// A lower bound (seconds) and what proves it.
    pub bound: f64,
    /// What proves the bound.
    pub bound_method: BoundMethod,
}

impl SolveReport {
    /// The one builder of a report: the best bound is `bound` capped at the schedule's
    /// value (and at 0), the certified gap follows from them; the method's own details
    /// (note, horizon, model size, times, warm start) start empty for it to fill.
    pub(crate) fn from_answer(a: Answer) -> Self {
        let best_bound = a.bound.min(a.replayed).max(0.0);
        SolveReport {
            status: a.status,
            method: a.method,
            objective: a.objective,
            constraints: a.constraints,
            milp_objective: None,
            replayed_objective: a.replayed,
            best_bound,
            certified_gap: certified_gap(a.replayed, best_bound),
            bound_method: a.bound_method,
            note: None,
            horizon: a.schedule.batches.len(),
            horizon_proven_sufficient: false,
            model: None,
            build_s: 0.0,
            solve_s: 0.0,
            nodes: None,
            states_expanded: None,
            warm_start: None,
            schedule: a.schedule,
        }
    }
}

/// The certified gap of a schedule whose replayed objective is `replayed` against a lower
/// bound `bound`: `(replayed - bound) / replayed`, 0 for a zero objective.
pub fn certified_gap(replayed: f64, bound: f64) -> f64 {
    if replayed > 0.0 {
        (replayed - bound) / replayed
    } else {
        0.0
    }
}

/// The answer when no exact model can be solved: the best heuristic schedule of the
/// portfolio (in the policy class), replayed, with the combinatorial bound; `note` says why.
#[allow(clippy::too_many_arguments)]
pub(crate) fn best_found(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    class: PolicyConstraints,
    warm: Option<Incumbent>,
    bound: CombinatorialBound,
    note: String,
    started: Instant,
) -> Result<SolveReport, SolveError> {
    let Some(Incumbent { name, schedule, .. }) = warm else {
        return Err(SolveError::Infeasible(format!(
            "{note}, and no heuristic schedule exists in this policy class"
        )));
    };
    let r = replay(w, limits, cost, &schedule)?;
    let replayed = objective.of_replay(&r);
    // Where the bound meets the schedule, the schedule is optimal: said so.
    let proven = replayed <= bound.value_s * (1.0 + 1e-9);
    let answer = if proven {
        format!(
            "the best schedule found ({name}) meets the {} bound, so it is optimal",
            bound.argument.name()
        )
    } else {
        format!(
            "the best schedule found without it ({name}) is returned with the {} bound",
            bound.argument.name()
        )
    };
    let status = if proven {
        SolveStatus::Optimal
    } else {
        SolveStatus::NotProven
    };
    Ok(SolveReport {
        note: Some(format!("{note}; {answer}")),
        build_s: started.elapsed().as_secs_f64(),
        warm_start: Some(WarmStart {
            heuristic: name,
            objective: replayed,
        }),
        ..SolveReport::from_answer(Answer {
            status,
            method: SolveMethod::BestHeuristic,
            objective,
            constraints: class,
            schedule,
            replayed,
            bound: bound.value_s,
            bound_method: BoundMethod::Combinatorial(bound.argument),
        })
    })
}
