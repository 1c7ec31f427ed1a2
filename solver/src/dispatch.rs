//! The portfolio of methods a solve runs in one policy class: a table of stages, each a
//! method with the rule that says when it applies and when it stops (milp.md, "The
//! portfolio"). Every stage offers what it finds to one [`Store`] (the incumbent and the
//! bound, with their sources); a stage that proves the answer ends the solve.
//!
//! The order: the heuristic portfolio, the priority-list search, a proof by the
//! combinatorial bound; for mean TTFT the search on the first-token problem, for mean
//! latency the plan search from the best schedule's plan; the independent groups; then,
//! where no exact model fits, the batch-index bound (mean latency, offline), the phase
//! relaxation and the best schedule found; else the
//! counting search where it is exact, the pooled searches where it is not, the phase
//! relaxation and the arc-flow MILP.

use crate::budget::Budget;
use crate::problem::Problem;
use crate::store::{Incumbent, Store};
use crate::{
    BoundMethod, Objective, SolveError, SolveOptions, SolveReport, SolveStatus, arcflow, bounds,
    counting, first_tokens, groups, list_search, plan_schedule, portfolio, report,
};
use infersched_core::{Limits, Workload};
use infersched_cost_model::LinearCostModel;

/// A stage of the portfolio (in the order of [`STAGES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The heuristic portfolio (and first tokens first, for mean TTFT), until
    /// [`PORTFOLIO_SHARE`] of the limit once it has a schedule.
    Portfolio,
    /// The priority-list search from the best schedule, until half the limit or its tries.
    ListSearch,
    /// The best schedule meets the combinatorial bound: optimal, nothing else runs.
    ProvenByBound,
    /// Mean TTFT: the priority-list search on the first-token problem, until 60% of the
    /// limit.
    FirstTokensSearch,
    /// Mean latency: the plan search from the best schedule's own plan.
    RePlan,
    /// Bursts the best schedule serves one after another, each solved on its own.
    IndependentGroups,
    /// No exact model fits and no pooled search applies: the phase relaxation, then the
    /// best schedule with the best bound.
    NoExactModel,
    /// The counting search where it is exact (whole prefills suffice), half the limit.
    CountingSearch,
    /// A quick pooled search (2% of the limit) that may prove the best schedule optimal.
    QuickPooledSearch,
    /// The counting search's optimum over whole prefills as a schedule (10% of the limit).
    WholePrefillSearch,
    /// The pooled search's bound over chunked schedules (35% of the limit, or
    /// [`POOLED_SHARE_WITHOUT_MILP`] where the MILP would be refused for its size).
    PooledSearch,
    /// No exact model fits (after the pooled search): as [`Stage::NoExactModel`].
    NoExactModelAfterPooled,
    /// The phase relaxation's bound and plan, a quarter and a twentieth of the time left.
    PhaseRelaxation,
    /// The arc-flow MILP on HiGHS, from the best schedule and bound, with what is left.
    Milp,
}

/// The stages, in order.
const STAGES: [Stage; 14] = [
    Stage::Portfolio,
    Stage::ListSearch,
    Stage::ProvenByBound,
    Stage::FirstTokensSearch,
    Stage::RePlan,
    Stage::IndependentGroups,
    Stage::NoExactModel,
    Stage::CountingSearch,
    Stage::QuickPooledSearch,
    Stage::WholePrefillSearch,
    Stage::PooledSearch,
    Stage::NoExactModelAfterPooled,
    Stage::PhaseRelaxation,
    Stage::Milp,
];

/// The share of the time limit after which the heuristic portfolio tries no further
/// variant (once it has a schedule).
const PORTFOLIO_SHARE: f64 = 0.25;

/// The plan search from the best schedule's own plan: its share of the time left (the
/// phase relaxation, whose bound gains from time, comes after it).
const RE_PLAN_SHARE: f64 = 0.1;

/// Where no later method would use the time: the share of the time limit (from the start)
/// by which the plan search from the best schedule's own plan ends, leaving the rest for
/// the bound and the answer's replay.
const RE_PLAN_LAST_SHARE: f64 = 0.9;

/// Where no exact model fits, the batch-index bound's share of the time left (the phase
/// relaxation and its plan have most of the rest).
const BATCH_INDEX_SHARE: f64 = 0.35;

/// The most requests for the batch-index bound: on README family (c) n = 128 its bound
/// stays under the machine relaxation's in a 60 s solve (20.87 s against 21.19 s at 30 s),
/// and the time it takes from the plan search costs the schedule (docs/benchmarks.md).
const BATCH_INDEX_MAX_REQUESTS: usize = 64;

/// The search for a low point of the batch-index bound's pairwise problem: its share.
const BATCH_INDEX_DESCENT_SHARE: f64 = 0.1;

/// The plan search from that point: its share of the time left.
const BATCH_INDEX_PLAN_SHARE: f64 = 0.25;

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

/// What a stage leaves: go on, or the answer.
enum Flow {
    Next,
    Answer(Box<SolveReport>),
}

/// What one stage tells a later one.
#[derive(Default)]
struct Context {
    /// The independent groups' answer, where the whole workload's methods went on from it.
    groups_note: Option<String>,
}

/// The solve in the class `options.constraints` by its own methods: the stages in order.
pub(crate) fn solve_in_class(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
) -> Result<SolveReport, SolveError> {
    let budget = Budget::start(options.time_limit_s);
    let p = Problem::new(w, limits, cost, objective, options)?;
    let mut store = Store::new(p.checks(), p.combinatorial, options.observer.clone());
    let mut context = Context::default();
    for stage in STAGES {
        // The caller's schedules come after the solver's own portfolio: a tie keeps the
        // solver's schedule, a strictly better one is taken (and named by the answer).
        if stage == Stage::ListSearch {
            for (name, schedule) in &options.seeds {
                store.offer_schedule(name.clone(), schedule.clone());
            }
        }
        if !applies(stage, &p, &store) {
            continue;
        }
        if let Flow::Answer(report) = run(stage, &p, &budget, &mut store, &mut context)? {
            // The observer hears the answer too, where it is better than what it heard.
            let source = report
                .warm_start
                .as_ref()
                .map_or_else(|| report.method.name().to_string(), |s| s.heuristic.clone());
            store.offer_schedule(source, report.schedule.clone());
            return Ok(*report);
        }
    }
    Err(SolveError::Internal(
        "the solver's stages ended without an answer".into(),
    ))
}

/// Whether `stage` runs on `p` with what `store` holds.
fn applies(stage: Stage, p: &Problem<'_>, store: &Store<'_>) -> bool {
    let o = p.options;
    let searches = o.list_search_evaluations > 0;
    let inexact_counting = p.counting_applies && !p.counting_exact;
    match stage {
        Stage::Portfolio => o.warm_start || o.horizon.is_none() || p.no_exact_model,
        Stage::ListSearch => searches && store.incumbent().is_some(),
        // Not where the MILP's question is asked (an explicit horizon: at most J batches)
        // or the MILP is asked for (`max_search_states` 0, `--milp-only`).
        Stage::ProvenByBound => {
            o.horizon.is_none() && o.max_search_states > 0 && store.meets_bound()
        }
        Stage::FirstTokensSearch => p.objective == Objective::MeanTtft && searches,
        Stage::RePlan => store.incumbent().is_some_and(|best| {
            p.objective == Objective::MeanLatency
                && searches
                && p.w.len() <= plan_schedule::MAX_REQUESTS
                && !in_groups(p, best)
        }),
        Stage::IndependentGroups => {
            o.independent_groups
                && p.objective != Objective::Makespan
                && o.horizon.is_none()
                && store.incumbent().is_some()
        }
        Stage::NoExactModel => p.no_exact_model && !p.pooled_applies,
        Stage::CountingSearch => p.counting_exact,
        Stage::QuickPooledSearch | Stage::PooledSearch => inexact_counting,
        Stage::WholePrefillSearch => {
            inexact_counting && !p.no_exact_model && o.warm_start && o.warm_start_from.is_empty()
        }
        Stage::NoExactModelAfterPooled => p.no_exact_model,
        Stage::PhaseRelaxation | Stage::Milp => true,
    }
}

/// Runs `stage`.
fn run(
    stage: Stage,
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
    context: &mut Context,
) -> Result<Flow, SolveError> {
    match stage {
        Stage::Portfolio => run_portfolio(p, budget, store),
        Stage::ListSearch => run_list_search(p, budget, store),
        Stage::ProvenByBound => answer(p, budget, store, "no exact model needed".into()),
        Stage::FirstTokensSearch => {
            let deadline = budget.by_share(0.6);
            let found = first_tokens::searched(
                p.w,
                &p.limits,
                p.cost,
                &p.model_class,
                store.incumbent(),
                p.options,
                deadline,
            );
            store.offer_any(found);
            Ok(Flow::Next)
        }
        Stage::RePlan => run_re_plan(p, budget, store),
        Stage::IndependentGroups => run_groups(p, budget, store, context),
        Stage::NoExactModel | Stage::NoExactModelAfterPooled => {
            if batch_index_applies(p) {
                // Its bound and plan, the phase relaxation's (whose bound it passes on
                // every workload measured, docs/benchmarks.md) in less time, then the plan
                // search from the best schedule with what is left.
                batch_index(p, budget, store);
                phase_relaxation(p, budget, store, 0.3, 0.1);
                re_plan_until(p, store, budget.by_share(RE_PLAN_LAST_SHARE));
            } else {
                phase_relaxation(p, budget, store, 0.8, 0.15);
            }
            let note = format!(
                "no exact model: the requests' state graphs alone would take about {}, over the memory limit of {}",
                crate::human_bytes(p.graph_bytes),
                crate::human_bytes(p.options.memory_limit_bytes)
            );
            answer(p, budget, store, note)
        }
        Stage::CountingSearch => Ok(counting::solve_by_counting(
            p.w,
            &p.limits,
            p.cost,
            p.objective,
            p.options,
            store.incumbent(),
            budget.started(),
        )?
        .map_or(Flow::Next, |r| Flow::Answer(Box::new(r)))),
        Stage::QuickPooledSearch => run_quick_pooled(p, budget, store),
        Stage::WholePrefillSearch => run_whole_prefills(p, budget, store),
        Stage::PooledSearch => run_pooled(p, budget, store),
        Stage::PhaseRelaxation => {
            phase_relaxation(p, budget, store, 0.25, 0.05);
            Ok(Flow::Next)
        }
        Stage::Milp => run_milp(p, budget, store, context),
    }
}

/// The answer without an exact method: the best schedule held with the best bound, `note`
/// saying why.
fn answer(
    p: &Problem<'_>,
    budget: &Budget,
    store: &Store<'_>,
    note: String,
) -> Result<Flow, SolveError> {
    report::best_found(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        p.class,
        store.incumbent_cloned(),
        store.bound(),
        note,
        budget.started(),
    )
    .map(|r| Flow::Answer(Box::new(r)))
}

/// The heuristic portfolio in the model's class; for mean TTFT also first tokens first
/// (module `first_tokens`), kept where it is better and in the model's class.
fn run_portfolio(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
) -> Result<Flow, SolveError> {
    let found = portfolio::best_heuristic(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        &p.model_class,
        &p.options.warm_start_from,
        budget.by_share(PORTFOLIO_SHARE),
    );
    store.offer_any(found);
    if p.objective == Objective::MeanTtft
        && let Some(schedule) =
            first_tokens::first_tokens_first(p.w, &p.limits, p.cost, &p.model_class)
        && p.model_class.admits(p.w, &p.limits, &schedule)
    {
        // The store replays it (and refuses it where the replay fails).
        store.offer_schedule("first-tokens-first".to_string(), schedule);
    }
    Ok(Flow::Next)
}

/// The priority-list search from the best schedule, until half the limit or its tries.
fn run_list_search(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
) -> Result<Flow, SolveError> {
    // The search takes the schedule it starts from and gives it back where it finds
    // nothing better (no second copy is held meanwhile).
    let Some(start) = store.take_incumbent() else {
        return Ok(Flow::Next);
    };
    let before = start.objective_value(p.objective);
    let search = list_search::SearchBudget {
        evaluations: p.options.list_search_evaluations,
        deadline: budget.by_share(0.5),
    };
    let (found, _) = list_search::improve(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        &p.model_class,
        start,
        search,
    );
    if found.objective_value(p.objective) < before {
        store.offer(found);
    } else {
        store.restore(found);
    }
    Ok(Flow::Next)
}

/// Whether the workload is solved in independent groups later (each group's solve
/// re-plans its own schedule).
fn in_groups(p: &Problem<'_>, best: &Incumbent) -> bool {
    p.options.independent_groups
        && p.options.horizon.is_none()
        && groups::independent_groups(p.w, &best.replay).len() >= 2
}

/// The plan search from the best schedule's own plan (its completion order and where its
/// prompts ran): it needs no relaxation, so it reaches bursts of any size.
fn run_re_plan(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
) -> Result<Flow, SolveError> {
    // Where neither the phase relaxation nor an exact model follows, nothing else would
    // use the time: the search gets it (up to its budget of tries).
    let relaxed_later = (p.options.phase_relaxation
        && p.w.len() <= bounds::PHASE_RELAXATION_MAX_REQUESTS)
        || batch_index_applies(p);
    let last_method = p.no_exact_model && !p.pooled_applies && !relaxed_later;
    let deadline = if last_method {
        budget.by_share(RE_PLAN_LAST_SHARE)
    } else {
        budget
            .left()
            .deadline(RE_PLAN_SHARE)
            .min(budget.by_share(0.6))
    };
    re_plan_until(p, store, deadline);
    Ok(Flow::Next)
}

/// The plan search from the best schedule's own plan until `deadline`.
fn re_plan_until(p: &Problem<'_>, store: &mut Store<'_>, deadline: std::time::Instant) {
    let Some(best) = store.incumbent() else {
        return;
    };
    let plan = plan_schedule::plan_of_schedule(p.w, &best.schedule, &best.replay);
    let label = format!("{} re-planned", best.name);
    let planned = planned_schedule(
        p,
        &p.model_class,
        &plan,
        store.incumbent(),
        deadline,
        &label,
    );
    store.offer_any(planned);
}

/// The independent groups (module `groups`): all the time left where no exact model fits
/// the whole workload, else half of it, the whole workload's methods going on from the
/// groups' schedule and bound unless the groups prove it optimal.
fn run_groups(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
    context: &mut Context,
) -> Result<Flow, SolveError> {
    let Some(whole) = store.incumbent() else {
        return Ok(Flow::Next);
    };
    let mut parts = groups::independent_groups(p.w, &whole.replay);
    if p.objective == Objective::MeanTtft
        && let Some(split) = groups::bursts_served_in_turn(p.w, &p.limits, p.cost)
        && split.len() > parts.len()
    {
        // First tokens first finishes every request at the end, so its completions show
        // no bursts.
        parts = split;
    }
    if parts.len() < 2 {
        return Ok(Flow::Next);
    }
    let share = if p.no_exact_model { 1.0 } else { 0.5 };
    let Some(report) = groups::solve_by_groups(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        p.options,
        &parts,
        whole,
        store.bound(),
        budget.left().share_s(share),
        budget.started(),
    )?
    else {
        return Ok(Flow::Next);
    };
    if p.no_exact_model || report.status == SolveStatus::Optimal {
        return Ok(Flow::Answer(Box::new(report)));
    }
    context.groups_note = Some(format!(
        "the workload was first solved as independent groups (independent-groups: bound {:.6} ms, schedule {:.6} ms), which the whole workload's methods then went on from",
        report.best_bound * 1e3,
        report.replayed_objective * 1e3
    ));
    if let BoundMethod::Combinatorial(argument) = report.bound_method {
        // The groups' bound already is the better of theirs and the store's.
        store.set_bound(bounds::CombinatorialBound {
            value_s: report.best_bound,
            argument,
        });
    }
    let name = report
        .warm_start
        .map_or_else(|| "independent-groups".to_string(), |s| s.heuristic);
    store.offer_schedule(name, report.schedule);
    Ok(Flow::Next)
}

/// Mean latency of an offline workload: the batch-index bound ([`BATCH_INDEX_SHARE`] of
/// the time left), and a schedule from the plan of its low point (the next
/// [`BATCH_INDEX_DESCENT_SHARE`] to find it, [`BATCH_INDEX_PLAN_SHARE`] to follow it). With arrivals it is weaker than the machine bounds (each
/// earlier request's progress before a later one's window is bounded on its own, not with
/// the others'), so it is not run.
fn batch_index(p: &Problem<'_>, budget: &Budget, store: &mut Store<'_>) {
    let left = budget.left();
    let Some(relaxed) = bounds::batch_index_relaxation(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        left.share_s(BATCH_INDEX_SHARE),
        left.share_s(BATCH_INDEX_DESCENT_SHARE),
        p.options.threads,
    ) else {
        return;
    };
    store.offer_bound(relaxed.bound);
    let shares = BATCH_INDEX_SHARE + BATCH_INDEX_DESCENT_SHARE + BATCH_INDEX_PLAN_SHARE;
    let deadline = left.deadline(shares);
    let planned = relaxed.plan.and_then(|plan| {
        planned_schedule(
            p,
            &p.class,
            &plan,
            store.incumbent(),
            deadline,
            "batch-index plan",
        )
    });
    store.offer_any(planned);
}

/// Whether the batch-index bound runs: mean latency of requests arriving together, at most
/// [`BATCH_INDEX_MAX_REQUESTS`] of them.
fn batch_index_applies(p: &Problem<'_>) -> bool {
    let reqs = p.w.requests();
    p.objective == Objective::MeanLatency
        && (2..=BATCH_INDEX_MAX_REQUESTS).contains(&reqs.len())
        && reqs.iter().all(|r| r.arrival_s == reqs[0].arrival_s)
}

/// The phase relaxation: its bound (`share` of the time left), and a schedule from its
/// plan (the next `plan_share`).
fn phase_relaxation(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
    share: f64,
    plan_share: f64,
) {
    if !p.options.phase_relaxation {
        return;
    }
    let left = budget.left();
    let Some(relaxed) = bounds::phase_relaxation(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        left.share_s(share),
        p.options.threads,
    ) else {
        return;
    };
    store.offer_bound(relaxed.bound);
    let deadline = left.deadline(share + plan_share);
    let planned = relaxed.plan.and_then(|plan| match p.objective {
        Objective::MeanTtft => first_tokens::planned(
            p.w,
            &p.limits,
            p.cost,
            &p.class,
            &plan,
            store.incumbent(),
            p.options,
            deadline,
        ),
        _ => planned_schedule(
            p,
            &p.class,
            &plan,
            store.incumbent(),
            deadline,
            "phase-relaxation plan",
        ),
    });
    store.offer_any(planned);
}

/// A quick pooled search first (2% of the time limit): where it proves the best heuristic
/// optimal, or follows its optimum to a schedule at its bound (mean TTFT with evictions,
/// typically in a few hundred vectors), nothing below is needed.
fn run_quick_pooled(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
) -> Result<Flow, SolveError> {
    let quick = SolveOptions {
        max_search_states: p.options.max_search_states.min(QUICK_POOLED_STATES),
        ..p.options.clone()
    };
    match counting::pooled_search(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        &quick,
        store.incumbent(),
        budget.by_share(0.02),
        budget.started(),
    )? {
        counting::PooledSearch::Proven(report) => Ok(Flow::Answer(Box::new(report))),
        counting::PooledSearch::Bounded { improved, .. } => {
            store.offer_any(improved);
            Ok(Flow::Next)
        }
    }
}

/// With C or P the counting search is not exact (a chunk can fill a batch's leftover
/// budget), but its optimum over whole prefills is a schedule: the MILP starts from it when
/// it is better.
fn run_whole_prefills(
    p: &Problem<'_>,
    budget: &Budget,
    store: &mut Store<'_>,
) -> Result<Flow, SolveError> {
    let searched = counting::unchunked_optimum(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        &p.class,
        p.options.max_search_states,
        p.options.memory_limit_bytes,
        store.value(),
        budget.by_share(0.1),
    )?;
    if let counting::Searched::Optimum(searched) = searched {
        let (found, replay, _) = *searched;
        store.offer(Incumbent {
            name: format!(
                "counting search over whole prefills (states: {})",
                found.expanded
            ),
            schedule: found.schedule,
            replay,
        });
    }
    Ok(Flow::Next)
}

/// The pooled search bounds chunked schedules (every objective): it may prove the best
/// schedule so far optimal, or follow its optimal path to a schedule at its bound, else its
/// bound joins the others.
fn run_pooled(p: &Problem<'_>, budget: &Budget, store: &mut Store<'_>) -> Result<Flow, SolveError> {
    // 35% of the time limit, or 85% where the arc-flow MILP would be refused for its size
    // anyway (family (a) with C = 64, mean latency with evictions: bound 124.8 -> 126.0 ms
    // in 60 s). The probe builds a state graph per distinct request: only where they are
    // small.
    let share = if p.no_exact_model
        || (p.graph_bytes <= PROBE_GRAPH_BYTES
            && arcflow::exceeds_arc_columns(&arc_flow_problem(p, budget, store)))
    {
        POOLED_SHARE_WITHOUT_MILP
    } else {
        POOLED_SHARE
    };
    match counting::pooled_search(
        p.w,
        &p.limits,
        p.cost,
        p.objective,
        p.options,
        store.incumbent(),
        budget.by_share(share),
        budget.started(),
    )? {
        counting::PooledSearch::Proven(report) => Ok(Flow::Answer(Box::new(report))),
        counting::PooledSearch::Bounded { bound, improved } => {
            if let Some((value_s, argument)) = bound {
                store.offer_bound(bounds::CombinatorialBound { value_s, argument });
            }
            store.offer_any(improved);
            Ok(Flow::Next)
        }
    }
}

/// The arc-flow MILP's question, from the best schedule and bound held.
fn arc_flow_problem<'a>(
    p: &'a Problem<'a>,
    budget: &Budget,
    store: &'a Store<'_>,
) -> arcflow::ArcFlowProblem<'a> {
    arcflow::ArcFlowProblem {
        w: p.w,
        limits: &p.limits,
        cost: p.cost,
        objective: p.objective,
        options: p.options,
        model_class: p.model_class,
        warm: store.incumbent(),
        combinatorial: store.bound(),
        started: budget.started(),
    }
}

/// The arc-flow MILP, with the time left; a panic of good_lp (where HiGHS reports an
/// error) becomes an error, never the caller's panic.
fn run_milp(
    p: &Problem<'_>,
    budget: &Budget,
    store: &Store<'_>,
    context: &mut Context,
) -> Result<Flow, SolveError> {
    let problem = arc_flow_problem(p, budget, store);
    let mut report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        arcflow::solve_arc_flow(problem)
    }))
    .unwrap_or_else(|payload| {
        Err(SolveError::Highs(format!(
            "the MILP failed: {}",
            crate::panic_message(payload.as_ref())
        )))
    })?;
    if let Some(groups) = context.groups_note.take() {
        report.note = Some(match report.note {
            Some(note) => format!("{note}; {groups}"),
            None => groups,
        });
    }
    Ok(Flow::Answer(Box::new(report)))
}

/// The schedule of a plan ([`plan_schedule`]) when it is valid, in `class` and better than
/// `warm` (prefill chunks merged where chunking never helps, as the exact model's warm
/// start needs).
fn planned_schedule(
    p: &Problem<'_>,
    class: &crate::PolicyConstraints,
    plan: &bounds::PhasePlan,
    warm: Option<&Incumbent>,
    deadline: std::time::Instant,
    label: &str,
) -> Option<Incumbent> {
    let (w, limits, cost) = (p.w, &p.limits, p.cost);
    let (mut schedule, mut replay, tried) = plan_schedule::search_plans(
        w,
        limits,
        cost,
        p.objective,
        class,
        plan,
        p.options.plan_search_evaluations.max(1),
        deadline,
    )?;
    if crate::dominance::chunking_never_helps(w, limits, class) {
        schedule = crate::dominance::merge_prefill_chunks(w, &schedule);
        replay = infersched_core::replay(w, limits, cost, &schedule).ok()?;
    }
    let planned = Incumbent {
        name: format!("{label} (plans tried: {tried})"),
        schedule,
        replay,
    };
    let better =
        warm.is_none_or(|h| planned.objective_value(p.objective) < h.objective_value(p.objective));
    better.then_some(planned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{Observer, Progress, SolveObserver};
    use infersched_core::{Request, Schedule, replay};
    use std::sync::{Arc, Mutex};

    /// Every incumbent the solve announces, in order.
    #[derive(Default)]
    struct Heard(Mutex<Vec<(String, Schedule)>>);
    impl SolveObserver for Heard {
        fn progress(&self, _: &Progress) {}
        fn incumbent(&self, source: &str, schedule: &Schedule) {
            self.0
                .lock()
                .unwrap()
                .push((source.to_string(), schedule.clone()));
        }
    }

    /// Solves `w` under `limits` for mean latency, listening; the report and what was heard.
    fn solve_heard(w: &Workload, limits: &Limits) -> (SolveReport, Vec<(String, Schedule)>) {
        let heard = Arc::new(Heard::default());
        let options = SolveOptions {
            time_limit_s: 60.0,
            threads: 1,
            plan_search_evaluations: 1_000,
            observer: Some(Observer(heard.clone())),
            ..SolveOptions::default()
        };
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let report = solve_in_class(w, limits, &cost, Objective::MeanLatency, &options).unwrap();
        let heard = heard.0.lock().unwrap().clone();
        (report, heard)
    }

    #[test]
    fn every_better_schedule_of_any_stage_is_announced_and_the_answer_is_the_last() {
        let r = |i, o, t| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        // Two bursts: the independent groups answer, with a better schedule than any stage
        // before them found (without announcing the answer, the last heard is worse).
        let bursts = Workload::new(vec![
            r(3, 2, 0.0),
            r(2, 2, 0.0),
            r(4, 2, 0.05),
            r(2, 3, 0.05),
        ])
        .unwrap();
        let limits = Limits {
            kv_capacity: Some(6),
            ..Limits::unlimited()
        };
        let (report, heard) = solve_heard(&bursts, &limits);
        assert!(!heard.is_empty());
        // Each announcement is strictly better than the one before.
        let value = |s: &Schedule| {
            Objective::MeanLatency.of_replay(&replay(&bursts, &limits, &cost, s).unwrap())
        };
        for pair in heard.windows(2) {
            assert!(
                value(&pair[1].1) < value(&pair[0].1),
                "{} then {}",
                pair[0].0,
                pair[1].0
            );
        }
        // An interrupt at the end would save a schedule as good as the answer's, whichever
        // stage found it (the answer of a method that ends the solve is its own).
        let last = value(&heard.last().unwrap().1);
        assert!(
            last <= report.replayed_objective * (1.0 + 1e-12),
            "last announced {last} s, answer {} s ({:?})",
            report.replayed_objective,
            report.method
        );
    }

    #[test]
    fn without_an_exact_model_an_offline_burst_gets_the_batch_index_bound() {
        // An offline burst, the memory limit too small for any exact model: the
        // batch-index bound is the strongest, and the answer is no better than it.
        let (w, limits) = bounds::arxiv_like_burst();
        let options = SolveOptions {
            time_limit_s: 8.0,
            threads: 1,
            memory_limit_bytes: 1,
            ..SolveOptions::default()
        };
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let report = crate::solve(&w, &limits, &cost, Objective::MeanLatency, &options).unwrap();
        assert_eq!(
            report.bound_method,
            BoundMethod::Combinatorial(bounds::BoundArgument::BatchIndex),
            "{report:?}"
        );
        assert!(report.best_bound <= report.replayed_objective);
        let others = bounds::lower_bound(&w, &limits, &cost, Objective::MeanLatency);
        assert!(report.best_bound > others.value_s);
    }
}
