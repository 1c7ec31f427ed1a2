//! `compare`: the optimal scheduler and heuristics on one setting, with reports.

use super::{ClassArgs, KnobArgs, MilpArgs, load_workload, named};
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::cost_model;
use infersched::solver::{Objective, SolveOptions};
use infersched::workload::WorkloadStats;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct CompareArgs {
    /// Workload trace CSV (keep it small when optimal is included).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Comma-separated: optimal, vllm, vllm-v1, sarathi, orca, orca-max, static, mcsf, fastgen, lightllm, fastertransformer.
    #[arg(long, default_value = "optimal,vllm,vllm-v1,sarathi,orca,mcsf")]
    pub(crate) schedulers: String,
    /// Objective the ratios refer to and the MILP minimizes.
    #[arg(long, default_value = "makespan", value_parser = named::<Objective>())]
    pub(crate) objective: Objective,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = infersched::cost_models::DEFAULT_COST_MODEL)]
    pub(crate) cost_model: String,
    /// The heuristics' knobs, as `simulate` takes them: each heuristic runs with these and
    /// its own defaults for the rest, so its schedule is the one `simulate` gives. The
    /// optimal scheduler runs under the limits set explicitly (C, P, R_max, the block size
    /// or 1) and M, with no policy default: the best schedule the GPU and memory allow.
    #[command(flatten)]
    pub(crate) knobs: KnobArgs,
    /// The optimal scheduler's policy class (as `solve`'s).
    #[command(flatten)]
    pub(crate) class: ClassArgs,
    /// Write no plots (report.html without figures; plots/ is not written).
    #[arg(long)]
    pub(crate) no_plots: bool,
    /// Write no Chrome traces (trace-<scheduler>.json), the largest files on long runs.
    #[arg(long)]
    pub(crate) no_traces: bool,
    #[command(flatten)]
    pub(crate) milp: MilpArgs,
    /// A service-level objective, METRIC-STATISTIC=TIME (e.g. ttft-p90=2s, tbt-p99=200ms);
    /// repeat for several. Each row then gives the share of requests meeting every one,
    /// the goodput and whether each holds (table, comparison.csv, comparison.json).
    #[arg(long = "slo", value_name = "SLO")]
    pub(crate) slo: Vec<infersched::core::Slo>,
    /// Replicas of the model: each heuristic runs on every replica behind --router, and
    /// optimal is the cluster search (`solve --replicas`: the best schedule found over
    /// routings, with a bound valid for every routing). Each scheduler's folder is then a
    /// cluster's (routing.csv, replica-K/).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::cluster::MAX_REPLICAS)))]
    pub(crate) replicas: u32,
    /// How the heuristics' requests are spread over the replicas (as `simulate`'s), or a
    /// comma-separated list: every heuristic then runs behind each, its rows, folders and
    /// plot series named `SCHEDULER@ROUTER`.
    #[arg(
        long,
        default_value = "round-robin",
        value_delimiter = ',',
        requires = "replicas"
    )]
    pub(crate) router: Vec<infersched::schedulers::Router>,
    /// Output directory.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

/// The routers, comma-separated.
fn routers(a: &CompareArgs) -> String {
    let names: Vec<String> = a.router.iter().map(|r| r.name()).collect();
    names.join(",")
}

pub(crate) fn cmd_compare(a: &CompareArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = infersched::cost_models::resolve(&a.cost_model)?;
    let (spec, setting) = spec_and_setting(a, &w, &cost)?;
    outln!(
        "{} requests from {}, cost model {}, objective {}{}",
        w.len(),
        a.workload.display(),
        cost.name,
        a.objective.name(),
        if a.replicas > 1 {
            format!(", {} replicas behind {}", a.replicas, routers(a))
        } else {
            String::new()
        }
    );
    let started = std::time::Instant::now();
    let c = infersched::compare::run(&w, &cost, &spec);
    let ran_s = started.elapsed().as_secs_f64();
    infersched::interrupt::clear();
    let parts = infersched::report::ReportParts {
        plots: !a.no_plots,
        traces: !a.no_traces,
    };
    if let Err(e) = infersched::report::write_comparison_parts(&a.out, &w, &setting, &c, parts) {
        return Err(anyhow::Error::new(e).context(format!(
            "writing the comparison to {} (stopped there; {})",
            a.out.display(),
            complete_outputs(&a.out)
        )));
    }
    print_results(a, &c)?;
    outln!("all schedulers produced and replayed in {ran_s:.1} s");
    let failures = c.failures();
    for (name, e) in &failures {
        eprintln!("error: {name}: {e}");
    }
    outln!(
        "report: {}  (tables: comparison.csv, comparison.json{}{})",
        a.out.join("report.html").display(),
        if a.no_plots { "" } else { "; plots/" },
        match (a.no_traces, a.replicas > 1) {
            (true, _) => "",
            (false, false) => "; trace-<scheduler>.json",
            (false, true) => "; <scheduler>/replica-K/trace.json",
        }
    );
    if !failures.is_empty() {
        bail!(
            "{} of {} schedulers failed",
            failures.len(),
            c.results.len()
        );
    }
    Ok(())
}

/// What to compare (from the flags) and the setting the report states.
fn spec_and_setting(
    a: &CompareArgs,
    w: &infersched::core::Workload,
    cost: &cost_model::LinearCostModel,
) -> Result<(
    infersched::compare::CompareSpec,
    infersched::compare::Setting,
)> {
    use infersched::compare::{ClusterRun, ClusterSetting, CompareSpec, Contender, Setting};
    if a.replicas == 1 && a.router.len() > 1 {
        bail!(
            "--router lists {} routers: they spread requests over --replicas 2 or more",
            a.router.len()
        );
    }
    let knobs = a.knobs.knobs(w, cost)?;
    let limits = a.knobs.explicit_limits(cost)?;
    let contenders = Contender::parse_list(&a.schedulers)
        .map_err(anyhow::Error::msg)
        .context("--schedulers")?;
    let heuristics: Vec<_> = contenders
        .iter()
        .filter_map(|c| match c {
            Contender::Heuristic(k) => Some(*k),
            Contender::Optimal(_) => None,
        })
        .collect();
    super::check_prefix_caching(&a.knobs, &heuristics)?;
    // An interrupt writes the best schedule the solver holds by then to DIR/optimal.
    let solve = infersched::interrupt::SolveInterruptSaver::observing(
        SolveOptions {
            constraints: a.class.constraints(),
            ..a.milp.options()?
        },
        a.out.join("optimal"),
        w,
        limits,
        cost,
    );
    let spec = CompareSpec {
        contenders,
        objective: a.objective,
        limits,
        knobs,
        solve,
        slos: a.slo.clone(),
        cluster: (a.replicas > 1).then(|| ClusterRun {
            replicas: a.replicas,
            routers: a.router.clone(),
        }),
    };
    let setting = Setting {
        workload: a.workload.display().to_string(),
        workload_stats: WorkloadStats::of(w),
        cost_model: cost.name.clone(),
        objective: a.objective,
        limits,
        time_limit_s: a.milp.time_limit,
        cluster: (a.replicas > 1).then(|| ClusterSetting {
            replicas: a.replicas,
            router: routers(a),
        }),
    };
    Ok((spec, setting))
}

/// The comparison's tables, the solver's answer and the SLO table.
fn print_results(a: &CompareArgs, c: &infersched::compare::Comparison) -> Result<()> {
    let rows = c.rows();
    outln!(
        "\n{}",
        infersched::report::comparison_text(&rows, a.objective)
    );
    if a.replicas > 1 {
        outln!(
            "(a cluster: every metric is the whole cluster's; the makespan split sums the {} replicas' terms, GPU-seconds)",
            a.replicas
        );
    }
    if let Some(o) = c.optimal() {
        print_solver_answer(o)?;
    }
    if !a.slo.is_empty() {
        outln!("{}", slo_table(&rows));
        if let Some(most) = c.most_meeting_slos {
            outln!(
                "no schedule at all has more than {most} of the {} requests meet every SLO (proven: the machine relaxation on TTFT and E2E deadlines); \"of best\" is each scheduler's share of that, at least its share of the best possible goodput",
                c.results
                    .iter()
                    .find_map(|run| run.result.as_ref().ok())
                    .map_or(0, |o| o.summary.requests)
            );
        }
        if let (Some(most), Some((found, by))) = (c.most_meeting_slos, &c.best_found_meeting_slos) {
            outln!(
                "the best possible: between {found} (found by {by}{}) and {most} requests meeting every SLO",
                if c.goodput_search.is_some() {
                    "; the search's schedule in goodput-search/"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

/// The solver's status, method, bound and gap; never "optimal" without a proof.
fn print_solver_answer(o: &infersched::compare::Outcome) -> Result<()> {
    let (Some(status), Some((method, bound, gap))) = (o.solver_status(), o.solver_result()) else {
        return Ok(());
    };
    let proven = status == infersched::solver::SolveStatus::Optimal;
    let bound_method = match (&o.solve, o.cluster.as_ref().and_then(|p| p.search.as_ref())) {
        (Some(r), _) => r.bound_method.name().to_string(),
        (None, Some(r)) => format!("{}; valid for every routing", r.bound_argument.name()),
        (None, None) => String::new(),
    };
    outln!(
        "{}: {} by {}, best bound {:.6} ms ({}), certified gap {:.4}%{}",
        if proven { "optimal" } else { "best-found" },
        status.name(),
        method,
        bound * 1e3,
        bound_method,
        gap * 100.0,
        if proven {
            ""
        } else {
            "\n  no proof of optimality: the ratios are to the best schedule found; /bound is proven"
        }
    );
    Ok(())
}

/// What a comparison that stopped writing left complete in `dir`: every file is written
/// whole to a temporary name and renamed, so the files there with their own names are the
/// complete ones (the report, written last, says whether everything was).
fn complete_outputs(dir: &std::path::Path) -> String {
    let mut names: Vec<String> = Vec::new();
    let entries = |d: &std::path::Path| -> Vec<std::fs::DirEntry> {
        std::fs::read_dir(d)
            .map(|r| r.flatten().collect())
            .unwrap_or_default()
    };
    for e in entries(dir) {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            let files = entries(&e.path())
                .iter()
                .filter(|f| !f.file_name().to_string_lossy().ends_with(".tmp"))
                .count();
            names.push(format!("{name}/ ({files} files)"));
        } else if !name.ends_with(".tmp") {
            names.push(name);
        }
    }
    names.sort();
    if names.is_empty() {
        "nothing was written".into()
    } else {
        format!(
            "complete, each file whole: {}; report.html is written last, so without it the rest is missing",
            names.join(", ")
        )
    }
}

/// Each row's SLO attainment, goodput and whether every SLO holds (`--slo`).
fn slo_table(rows: &[infersched::compare::ComparisonRow]) -> String {
    use infersched::output::{Cell, text_table};
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| {
            vec![
                Cell::Text(r.display_name()),
                Cell::Text(
                    r.slo_attainment
                        .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
                ),
                Cell::Text(
                    r.goodput_requests_per_s
                        .map_or("-".into(), |g| format!("{g:.3}")),
                ),
                Cell::Text(
                    r.slos_hold
                        .map_or("-".into(), |h| if h { "yes" } else { "no" }.into()),
                ),
                Cell::Text(
                    r.goodput_of_best_possible
                        .map_or("-".into(), |g| format!("{:.1}%", g * 100.0)),
                ),
            ]
        })
        .collect();
    format!(
        "SLOs (attainment: requests meeting every SLO; goodput: those per second)\n{}",
        text_table(
            &[
                "scheduler",
                "attainment",
                "goodput (req/s)",
                "all hold",
                "of best"
            ],
            &cells
        )
    )
}
