//! `solve`: an optimal schedule (or the best found, with a bound) and its replay.

use super::{ClassArgs, LimitArgs, MilpArgs, load_workload, named, path_list};
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::cost_model;
use infersched::produce::produce_optimal;
use infersched::schedulers::SchedulerKind;
use infersched::solver::{Objective, PolicyConstraints, SolveOptions};
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct SolveArgs {
    /// Workload trace CSV (small: the MILP grows with requests, tokens and batches).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// What to optimize: makespan, mean-latency or mean-ttft (minimized), or goodput (the
    /// most requests meeting every --slo: the goodput search's schedule, clairvoyant, with
    /// the bound no schedule passes; one replica).
    #[arg(long, default_value = "makespan", value_parser = solve_objective())]
    pub(crate) objective: SolveObjective,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = infersched::cost_models::DEFAULT_COST_MODEL)]
    pub(crate) cost_model: String,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    #[command(flatten)]
    pub(crate) class: ClassArgs,
    #[command(flatten)]
    pub(crate) milp: MilpArgs,
    /// Do not start HiGHS from the best heuristic schedule.
    #[arg(long)]
    pub(crate) no_warm_start: bool,
    /// Heuristics tried for the warm start, comma-separated [default: sarathi,vllm-v1,vllm,orca,mcsf].
    #[arg(long, value_delimiter = ',', value_name = "NAMES", value_parser = named::<SchedulerKind>())]
    pub(crate) warm_start_from: Vec<SchedulerKind>,
    /// Replicas (a cluster): the best schedule found over every heuristic behind every
    /// router, each replica's part then re-solved on its own, with a bound valid for any
    /// routing; writes the cluster's folder (routing.csv, replica-K/) and solve.json.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::cluster::MAX_REPLICAS)))]
    pub(crate) replicas: u32,
    /// A service-level objective, METRIC-STATISTIC=TIME (e.g. ttft-p90=2s); repeat for
    /// several: the summary then gives the schedule's attainment, goodput and whether each
    /// holds (the solver still minimizes --objective).
    #[arg(long = "slo", value_name = "SLO")]
    pub(crate) slo: Vec<infersched::core::Slo>,
    /// A constraint, METRIC-STATISTIC=TIME as --slo (repeatable): the objective is then
    /// minimized over the schedules whose replay meets every one (the solver's best where
    /// it does, else the best of a search over the policies and priority lists), with the
    /// solver's bound; one replica.
    #[arg(long = "subject-to", value_name = "SLO")]
    pub(crate) subject_to: Vec<infersched::core::Slo>,
    /// Show HiGHS's progress log (incumbent, bound, gap, elapsed).
    #[arg(long)]
    pub(crate) log: bool,
    /// Output directory.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

/// What `solve` optimizes: one of the solver's objectives, or goodput.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SolveObjective {
    /// Minimized by the solver's portfolio.
    Solver(Objective),
    /// The most requests meeting every SLO (module `goodput`).
    Goodput,
}

/// `--objective`: a solver objective's name, or `goodput` (clap lists them all).
fn solve_objective() -> impl clap::builder::TypedValueParser<Value = SolveObjective> {
    use clap::builder::TypedValueParser;
    use infersched::core::names::Named;
    let names: Vec<&'static str> = Objective::NAMES
        .iter()
        .copied()
        .chain(["goodput"])
        .collect();
    clap::builder::PossibleValuesParser::new(names).map(|s: String| {
        Objective::from_name(&s).map_or(SolveObjective::Goodput, SolveObjective::Solver)
    })
}

pub(crate) fn cmd_solve(a: &SolveArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = infersched::cost_models::resolve(&a.cost_model)?;
    let limits = a.limits.limits(&cost)?;
    let objective = match a.objective {
        SolveObjective::Solver(o) => o,
        SolveObjective::Goodput => return solve_goodput(a, &w, &cost, &limits),
    };
    let options = SolveOptions {
        warm_start: !a.no_warm_start,
        warm_start_from: a.warm_start_from.clone(),
        constraints: a.class.constraints(),
        log: a.log,
        ..a.milp.options()?
    };
    if a.replicas > 1 {
        if !a.subject_to.is_empty() {
            bail!(
                "--subject-to is solved on one replica (--replicas 1); --slo reports the cluster's SLOs"
            );
        }
        return solve_cluster(a, objective, &w, &cost, &limits, &options);
    }
    // An interrupt writes the best schedule the solver holds by then (not proven optimal).
    let options = infersched::interrupt::SolveInterruptSaver::observing(
        options,
        a.out.clone(),
        &w,
        limits,
        &cost,
    );
    let outcome = produce_optimal(&w, &cost, &limits, objective, &options);
    infersched::interrupt::clear();
    let mut outcome = outcome?;
    if !a.subject_to.is_empty() {
        return solve_constrained(a, (&w, &cost, &limits), objective, &outcome);
    }
    if !a.slo.is_empty() {
        outcome.summary.slo = Some(infersched::core::SloReport::of(&outcome.replay, &a.slo));
    }
    let (r, summary) = (&outcome.replay, &outcome.summary);
    let report = outcome
        .solve
        .as_ref()
        .context("internal error: the solver's outcome has no report")?;
    let paths = infersched::output::write_solve_outputs(&a.out, report, objective, r, summary)?;
    outln!(
        "{} ({} requests), objective {}, cost model {}",
        a.workload.display(),
        w.len(),
        objective.name(),
        cost.name
    );
    print_report(report)?;
    if w.prefix().is_some() {
        outln!(
            "  note: the workload names prompt blocks; these schedules and this bound are for schedules without a prefix cache (vllm-v1's cache may do better)"
        );
    }
    out!("{}", infersched::output::summary_text(summary));
    out!(
        "{}",
        infersched::output::time_split_text(&outcome.time_split)
    );
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

/// Prints the report: status, objective, bound and gap, warm start, note and the method's
/// own figures.
fn print_report(report: &infersched::solver::SolveReport) -> Result<()> {
    outln!(
        "  status                {}{}",
        report.status.name(),
        if report.horizon_proven_sufficient
            || report.method != infersched::solver::SolveMethod::Milp
        {
            ""
        } else {
            " (within J batches)"
        }
    );
    outln!(
        "  objective (replayed)  {:.6} ms",
        report.replayed_objective * 1e3
    );
    outln!(
        "  best bound            {:.6} ms ({})",
        report.best_bound * 1e3,
        report.bound_method.name()
    );
    outln!(
        "  certified gap         {:.4}%",
        report.certified_gap * 100.0
    );
    if let Some(warm) = &report.warm_start {
        let v = warm.objective;
        outln!(
            "  warm start            {}: {:.6} ms ({:.2}% above the best schedule found)",
            warm.heuristic,
            v * 1e3,
            (v / report.replayed_objective - 1.0) * 100.0
        );
    }
    if let Some(note) = &report.note {
        outln!("  note                  {note}");
    }
    print_method(report)
}

/// The line (or lines) on the method that answered.
fn print_method(report: &infersched::solver::SolveReport) -> Result<()> {
    match report.method {
        infersched::solver::SolveMethod::BestHeuristic => outln!(
            "  method                best schedule of the heuristics, the list search and the relaxation's plans, with a bound that needs no exact model ({}; no exact model was solved)",
            report.bound_method.name()
        ),
        infersched::solver::SolveMethod::IndependentGroups => outln!(
            "  method                independent groups: each burst of requests solved on its own, schedules concatenated, bounds averaged ({}; see the note)",
            report.bound_method.name()
        ),
        infersched::solver::SolveMethod::CountingSearch => outln!(
            "  method                counting search (offline, identical-request classes): {} states, {:.2} s; optimal over {}",
            report.states_expanded.unwrap_or(0),
            report.solve_s,
            if report.constraints == PolicyConstraints::default() {
                "all schedules"
            } else {
                "the policy class"
            }
        ),
        infersched::solver::SolveMethod::Milp => {
            let size = report.model.unwrap_or(infersched::solver::ModelSize {
                rows: 0,
                columns: 0,
                integers: 0,
            });
            outln!(
                "  horizon J             {} batches{}",
                report.horizon,
                if report.horizon_proven_sufficient {
                    " (proven sufficient)"
                } else {
                    ""
                }
            );
            outln!(
                "  model                 {} rows, {} columns, {} integers; build {:.2} s, solve {:.2} s",
                size.rows,
                size.columns,
                size.integers,
                report.build_s,
                report.solve_s
            );
        }
    }
    Ok(())
}

/// `solve --objective goodput`: the goodput search's schedule (replayed here; its count is
/// the replay's), the bound no schedule passes and the certified gap; DIR gets the
/// schedule, its replay's files and solve.json.
fn solve_goodput(
    a: &SolveArgs,
    w: &infersched::core::Workload,
    cost: &cost_model::LinearCostModel,
    limits: &infersched::core::Limits,
) -> Result<()> {
    use infersched::goodput::{GoodputSolve, search};
    if a.slo.is_empty() {
        bail!(
            "--objective goodput counts the requests meeting every SLO: give at least one --slo (e.g. --slo ttft-p90=2s)"
        );
    }
    if !a.subject_to.is_empty() {
        bail!(
            "--subject-to constrains makespan, mean-latency or mean-ttft; with --objective goodput the SLOs are --slo"
        );
    }
    if a.replicas > 1 {
        bail!(
            "--objective goodput is solved on one replica; for {} replicas, compare --slo --replicas {} bounds the cluster's",
            a.replicas,
            a.replicas
        );
    }
    let budget = infersched::compare::GOODPUT_SEARCH_BUDGET;
    let found = search(w, limits, cost, &a.slo, budget).context(
        "the goodput search found no schedule under these limits (it reserves each request's whole KV, I + O - 1 tokens, which must fit M)",
    )?;
    let class = a.class.constraints();
    if !class.admits(w, limits, &found.schedule) {
        bail!(
            "the goodput search's schedule is not in the policy class asked for; --objective goodput takes no class flags but --no-evict and --reserve"
        );
    }
    let r = infersched::core::replay(w, limits, cost, &found.schedule)
        .context("internal error: the replay rejects the goodput search's schedule")?;
    let report = infersched::core::SloReport::of(&r, &a.slo);
    let bound = infersched::ceiling::most_requests_meeting(w, limits, cost, 1, &a.slo);
    let certificate = GoodputSolve::of(w, &a.slo, &found, report.good_requests, bound);
    let mut paths = infersched::report::write_goodput_search(&a.out, &found)
        .with_context(|| format!("writing results to {}", a.out.display()))?;
    let solve_path = a.out.join("solve.json");
    let json = serde_json::to_string_pretty(&certificate)? + "\n";
    infersched::core::io::write_bytes_atomic(&solve_path, json.as_bytes())?;
    paths.push(solve_path);
    let c = &certificate;
    outln!(
        "{} ({} requests), objective goodput ({}), cost model {}",
        a.workload.display(),
        w.len(),
        c.slos.join(", "),
        cost.name
    );
    outln!("  status                {}", c.status);
    outln!(
        "  method                {} (clairvoyant: it reads true output lengths)",
        c.method
    );
    outln!(
        "  meeting every SLO     {} of {} requests (replayed)",
        c.meeting,
        c.requests
    );
    outln!("  bound                 {} ({})", c.bound, c.bound_method);
    outln!(
        "  certified gap         {:.4}% (the best possible count lies between {} and {})",
        c.certified_gap * 100.0,
        c.meeting,
        c.bound
    );
    let mut summary = infersched::core::Summary::from_replay(&r);
    summary.slo = Some(report);
    out!("{}", infersched::output::summary_text(&summary));
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

/// `solve --subject-to SLO ...`: the best schedule meeting every SLO among the solver's
/// and the constrained search's (`infersched::constrained`), the solver's bound, the
/// certified gap; DIR gets the schedule, its replay's files and solve.json. None meeting
/// them: an error, nothing written.
fn solve_constrained(
    a: &SolveArgs,
    (w, cost, limits): (
        &infersched::core::Workload,
        &cost_model::LinearCostModel,
        &infersched::core::Limits,
    ),
    objective: Objective,
    outcome: &infersched::produce::Outcome,
) -> Result<()> {
    use infersched::constrained::{ConstrainedSolve, search};
    let report = outcome
        .solve
        .as_ref()
        .context("internal error: the solver's outcome has no report")?;
    let solver = format!("the solver ({})", report.method.name());
    let start = Some((solver, false, outcome.schedule.clone()));
    let found = search(w, limits, cost, objective, &a.subject_to, start);
    let Some(best) = &found.best else {
        let missed = infersched::core::SloReport::of(&outcome.replay, &a.subject_to);
        bail!(
            "none of the {} schedules tried (the solver's, every policy's and the priority lists') meets every --subject-to; the solver's misses {}",
            found.tried,
            missed
                .slos
                .iter()
                .filter(|s| !s.holds)
                .map(|s| s.slo.clone())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let solver_kept = best.schedule == outcome.schedule;
    let proven = solver_kept && report.status == infersched::solver::SolveStatus::Optimal;
    let bound = (report.best_bound, report.bound_method.name().to_string());
    let c = ConstrainedSolve::of(objective, &a.subject_to, best, bound, proven, &found);
    let mut summary = infersched::core::Summary::from_replay(&best.replay);
    let slos: Vec<_> = a.subject_to.iter().chain(&a.slo).cloned().collect();
    summary.slo = Some(infersched::core::SloReport::of(&best.replay, &slos));
    let mut schedule = best.schedule.clone();
    schedule.meta = Some(serde_json::json!({"producer": best.method, "objective": objective}));
    let mut paths =
        infersched::output::write_run_outputs(&a.out, &schedule, &best.replay, &summary)?;
    let solve_path = a.out.join("solve.json");
    let json = serde_json::to_string_pretty(&c)? + "\n";
    infersched::core::io::write_bytes_atomic(&solve_path, json.as_bytes())?;
    paths.push(solve_path);
    print_constrained(a, w.len(), &cost.name, &c, solver_kept)?;
    out!("{}", infersched::output::summary_text(&summary));
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

/// The answer of [`solve_constrained`] for people.
fn print_constrained(
    a: &SolveArgs,
    requests: usize,
    cost: &str,
    c: &infersched::constrained::ConstrainedSolve,
    solver_kept: bool,
) -> Result<()> {
    outln!(
        "{} ({} requests), objective {} subject to {}, cost model {}",
        a.workload.display(),
        requests,
        c.objective.name(),
        c.subject_to.join(", "),
        cost
    );
    outln!("  status                {}", c.status);
    outln!(
        "  method                {}{}",
        c.method,
        if c.clairvoyant {
            " (clairvoyant: it reads true output lengths)"
        } else {
            ""
        }
    );
    outln!(
        "  objective (replayed)  {:.6} ms",
        c.replayed_objective * 1e3
    );
    outln!(
        "  best bound            {:.6} ms ({}; without the constraints, so valid with them)",
        c.best_bound * 1e3,
        c.bound_method
    );
    outln!("  certified gap         {:.4}%", c.certified_gap * 100.0);
    outln!(
        "  tried                 {} schedules, {} meeting every constraint{}",
        c.tried,
        c.feasible,
        if solver_kept {
            "; the solver's own meets them"
        } else {
            ""
        }
    );
    Ok(())
}

/// `solve --replicas N` (N > 1): the cluster search and its bound.
fn solve_cluster(
    a: &SolveArgs,
    objective: Objective,
    w: &infersched::core::Workload,
    cost: &cost_model::LinearCostModel,
    limits: &infersched::core::Limits,
    options: &SolveOptions,
) -> Result<()> {
    use infersched::core::{Summary, replay_cluster};
    let report = infersched::solver::cluster::solve_cluster(
        w, limits, cost, objective, a.replicas, options,
    )?;
    let r = replay_cluster(w, limits, cost, &report.routing, &report.schedules)
        .context("internal error: the replay rejects the cluster search's schedules")?;
    let mut summary = Summary::of_cluster(&r, &report.router);
    if !a.slo.is_empty() {
        summary.slo = Some(infersched::core::SloReport::of(&r.merged, &a.slo));
    }
    let mut paths = infersched::cluster::write_cluster_outputs(
        &a.out,
        w,
        &report.routing,
        &report.schedules,
        &r,
        &summary,
        None,
    )
    .with_context(|| format!("writing results to {}", a.out.display()))?;
    let solve_path = a.out.join("solve.json");
    let json = serde_json::to_string_pretty(&report)? + "\n";
    infersched::core::io::write_bytes_atomic(&solve_path, json.as_bytes())?;
    paths.push(solve_path);
    outln!(
        "{} ({} requests), objective {}, cost model {}, {} replicas",
        a.workload.display(),
        w.len(),
        objective.name(),
        cost.name,
        a.replicas
    );
    outln!("  status                {}", report.status.name());
    outln!(
        "  objective (replayed)  {:.6} ms",
        report.replayed_objective * 1e3
    );
    outln!(
        "  best bound            {:.6} ms ({}; valid for every routing)",
        report.best_bound * 1e3,
        report.bound_argument.name()
    );
    outln!(
        "  certified gap         {:.4}%",
        report.certified_gap * 100.0
    );
    let tried = report
        .candidates
        .iter()
        .filter(|c| c.objective_s.is_some())
        .count();
    outln!(
        "  method                {} behind {} (best of {tried} heuristic and router pairs){}",
        report.scheduler,
        report.router,
        match (report.requests_moved, report.replicas_improved) {
            (0, 0) => String::new(),
            (m, k) => format!(
                ", then {m} requests moved to another replica and {k} replicas' parts re-solved on their own"
            ),
        }
    );
    outln!("{}", candidate_table(&report));
    out!("{}", infersched::output::summary_text(&summary));
    out!("{}", infersched::cluster::load_table(&summary));
    outln!("wrote {} files under {}", paths.len(), a.out.display());
    Ok(())
}

/// Every heuristic (rows) behind every router (columns): its objective over the best
/// schedule found, and the upper end of its ratio to the optimum (over the bound).
fn candidate_table(report: &infersched::solver::cluster::ClusterSolveReport) -> String {
    use infersched::output::{Cell, text_table};
    let routers: Vec<&str> = infersched::solver::cluster::SEARCHED_ROUTERS
        .iter()
        .map(|r| {
            let name = r.name();
            report
                .candidates
                .iter()
                .find(|c| c.router == name)
                .map_or("", |c| c.router.as_str())
        })
        .collect();
    let (best, bound) = (report.replayed_objective, report.best_bound);
    let mut rows = Vec::new();
    for chunk in report.candidates.chunks(routers.len()) {
        let mut row = vec![Cell::Text(chunk[0].scheduler.clone())];
        row.extend(chunk.iter().map(|c| {
            Cell::Text(c.objective_s.map_or("-".into(), |v| {
                format!(
                    "{:.3}-{:.3}",
                    v / best,
                    if bound > 0.0 {
                        v / bound
                    } else {
                        f64::INFINITY
                    }
                )
            }))
        }));
        rows.push(row);
    }
    let mut headers = vec!["scheduler"];
    headers.extend(routers);
    format!(
        "  each heuristic behind each router: its {} over the best schedule found and over the bound (the optimum lies between)\n{}",
        report.objective.name(),
        text_table(&headers, &rows)
    )
}
