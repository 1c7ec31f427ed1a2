//! The problem a solve answers, with the facts every method reads derived once: the
//! policy class the models search, the combinatorial bound, the estimated size of the
//! exact models' state graphs, and which counting searches apply.

use crate::bounds::{self, CombinatorialBound};
use crate::graph::StateGraph;
use crate::store::Checks;
use crate::{Objective, PolicyConstraints, SolveError, SolveOptions, classes, counting, dominance};
use infersched_core::{Limits, Workload};
use infersched_cost_model::LinearCostModel;

/// One solve's problem (limits that cannot bind already dropped) and its derived facts.
#[derive(Debug)]
pub(crate) struct Problem<'a> {
    /// The workload.
    pub w: &'a Workload,
    /// Its limits, those that cannot bind dropped (the schedules and the optimum are the
    /// same, and a huge M, C or R_max never reaches a model coefficient).
    pub limits: Limits,
    /// The batch-time model.
    pub cost: &'a LinearCostModel,
    /// What is minimized.
    pub objective: Objective,
    /// The solve's options.
    pub options: &'a SolveOptions,
    /// The policy class asked for.
    pub class: PolicyConstraints,
    /// The class the models search: offline, without C and P (and FCFS), chunked prefill
    /// never helps (see `dominance`), so its arcs are left out; the optimum is the same.
    pub model_class: PolicyConstraints,
    /// The combinatorial bound in the class.
    pub combinatorial: CombinatorialBound,
    /// The exact models' state graphs, estimated before any is built (bytes).
    pub graph_bytes: u64,
    /// Whether they are over the memory limit (no exact model is built).
    pub no_exact_model: bool,
    /// Whether the counting searches over identical-request classes apply (offline, no
    /// FCFS, no explicit horizon).
    pub counting_applies: bool,
    /// Whether the pooled search applies (it needs no state graph).
    pub pooled_applies: bool,
    /// Whether the counting search over whole prefills is exact here: chunking never helps
    /// or the class forbids it, and its state graphs fit.
    pub counting_exact: bool,
}

impl<'a> Problem<'a> {
    /// The problem of `w` under `limits` (checked: valid, feasible, numbers in range).
    pub fn new(
        w: &'a Workload,
        limits: &Limits,
        cost: &'a LinearCostModel,
        objective: Objective,
        options: &'a SolveOptions,
    ) -> Result<Self, SolveError> {
        limits.validate()?;
        limits
            .check_feasible(w)
            .map_err(|e| SolveError::Infeasible(e.to_string()))?;
        crate::check_numeric_range(w, cost)?;
        let limits = crate::binding_limits(w, limits);
        let class = options.constraints;
        let model_class = PolicyConstraints {
            no_chunk: class.no_chunk || dominance::chunking_never_helps(w, &limits, &class),
            ..class
        };
        let combinatorial = bounds::lower_bound_in_class(w, &limits, cost, objective, &class);
        let graph_bytes = graph_bytes(w, &limits, objective, &class, &model_class);
        let no_exact_model = graph_bytes > options.memory_limit_bytes;
        let counting_applies = options.max_search_states > 0
            && options.horizon.is_none()
            && dominance::offline(w)
            && !class.fcfs;
        let pooled_applies = counting_applies && counting::pooled::applies(w, &class);
        let counting_exact = counting_applies
            && !no_exact_model
            && (class.no_chunk || dominance::chunking_never_helps(w, &limits, &class));
        Ok(Self {
            w,
            limits,
            cost,
            objective,
            options,
            class,
            model_class,
            combinatorial,
            graph_bytes,
            no_exact_model,
            counting_applies,
            pooled_applies,
            counting_exact,
        })
    }

    /// What the store checks every schedule against.
    pub fn checks(&self) -> Checks<'_> {
        Checks {
            w: self.w,
            limits: &self.limits,
            cost: self.cost,
            objective: self.objective,
            class: self.class,
        }
    }
}

/// The exact models' state graphs (bytes): identical requests share one where the
/// arc-flow model aggregates them (makespan, without FCFS) and in the counting search;
/// elsewhere each request has its own.
fn graph_bytes(
    w: &Workload,
    limits: &Limits,
    objective: Objective,
    class: &PolicyConstraints,
    model_class: &PolicyConstraints,
) -> u64 {
    let reqs = w.requests();
    let shares_graphs = objective == Objective::Makespan && !class.fcfs;
    classes::request_classes(w, shares_graphs)
        .iter()
        .map(|m| {
            StateGraph::size(
                &reqs[m[0]],
                limits,
                model_class.no_evict || model_class.reserve,
                model_class.no_chunk,
            )
            .bytes()
        })
        .fold(0, u64::saturating_add)
}
