//! `infersched._infersched`: the Rust side of the Python package. Every function calls the
//! same library code as the `infersched` command (no subprocess): the same settings
//! ([`infersched::settings`]), the same producers ([`infersched::produce`]) and the same
//! writers ([`infersched::output`]), so a run's files are the command's, byte for byte.
//! The Python side (`infersched/__init__.py`) adds DataFrames and keyword defaults.

use crate::errors::{InferschedError, SolveInterrupted, err, guarded, named};
use crate::kwargs::{
    CapacityKwargs, ClusterKwargs, CompareKwargs, KnobKwargs, LimitKwargs, PipelineKwargs,
    SolveKwargs, SplitKwargs, cost_model, knobs, knobs_on, slos, with_slo,
};
use crate::objects::{PyRun, PySchedule, PyWorkload, meta_producer};
use crate::watch::{Waited, Watch, WatchObserver, interrupted, wait_watched};
use infersched::core::{Instance, Workload};
use infersched::produce::{
    Outcome, produce_heuristic_on_pipelined_cluster, produce_heuristic_pipelined, produce_optimal,
};
use infersched::schedulers::{Knobs, SchedulerKind};
use infersched::solver::progress::Observer;
use infersched::solver::{Objective, SolveOptions};
use pyo3::prelude::*;
use std::sync::Arc;

mod errors;
mod kwargs;
mod objects;
mod watch;

/// Runs a heuristic scheduler on `workload`, replays its schedule and measures it
/// (`infersched simulate` for one scheduler). The simulation runs without the GIL.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // the Python wrapper's groups of keyword arguments
fn simulate(
    py: Python<'_>,
    workload: &PyWorkload,
    scheduler: &str,
    cost_model_spec: &str,
    limits: LimitKwargs,
    knob_kwargs: KnobKwargs,
    slo: Vec<String>,
    cluster: ClusterKwargs,
    pipeline: PipelineKwargs,
    split: SplitKwargs,
) -> PyResult<PyRun> {
    let kind = named::<SchedulerKind>("scheduler", scheduler)?;
    let cost = cost_model(cost_model_spec)?;
    let w = &workload.inner;
    let pipeline = pipeline.pipeline(&cost)?;
    let replicas = cluster
        .cluster()?
        .map_or(infersched::capacity::Replicas::ONE, |(count, router)| {
            infersched::capacity::Replicas { count, router }
        });
    check_pipelined(&pipeline, kind)?;
    if let Some(split) = disaggregation(&split, &cost, &cluster, replicas)? {
        let knobs = knobs_on(w, &cost, &limits, &knob_kwargs, pipeline.stages)?;
        let slo = slos(&slo)?;
        return simulate_disaggregated(py, w, (&cost, &pipeline, kind, &knobs), split, &slo);
    }
    let knobs = knobs_on(w, &cost, &limits, &knob_kwargs, pipeline.stages)?;
    let slo = slos(&slo)?;
    let cluster = cluster.cluster()?;
    let outcome = py.detach(|| {
        guarded(|| {
            match cluster {
                Some(c) => {
                    produce_heuristic_on_pipelined_cluster(w, (&cost, &pipeline), kind, &knobs, c)
                }
                None => produce_heuristic_pipelined(w, &cost, kind, &knobs, &pipeline),
            }
            .map_err(err)
        })
    })?;
    Ok(PyRun::new(with_slo(outcome, &slo), None, kind.name(), w))
}

/// `pp` above 1 only where modelled: pipelined schedulers.
fn check_pipelined(pipeline: &infersched::core::Pipeline, kind: SchedulerKind) -> PyResult<()> {
    if !pipeline.is_pipelined() {
        return Ok(());
    }
    if !kind.pipelines() {
        return Err(err(format!(
            "pp = {}: pipeline parallelism is modelled for vllm-v1, vllm and sarathi, not {}",
            pipeline.stages,
            kind.name()
        )));
    }
    Ok(())
}

/// `simulate --disaggregate P:D` for one scheduler, without the GIL.
fn simulate_disaggregated(
    py: Python<'_>,
    w: &Workload,
    (cost, pipeline, kind, knobs): (
        &infersched::cost_model::LinearCostModel,
        &infersched::core::Pipeline,
        SchedulerKind,
        &Knobs,
    ),
    (d, router, link): (
        infersched::core::disaggregated::Disaggregation,
        infersched::schedulers::Router,
        infersched::core::disaggregated::KvLink,
    ),
    slo: &[infersched::core::Slo],
) -> PyResult<PyRun> {
    let mut o = py.detach(|| {
        guarded(|| {
            let on = (cost, pipeline);
            infersched::produce::produce_disaggregated_on(w, on, kind, knobs, (d, router), &link)
                .map_err(err)
        })
    })?;
    if !slo.is_empty() {
        o.summary.slo = Some(infersched::core::SloReport::of(
            &o.replay.cluster.merged,
            slo,
        ));
    }
    Ok(PyRun::of_disaggregated(o, kind.name(), w))
}

/// Replays `schedule` on `workload` under the limits and measures it (`infersched
/// replay`): an error names the first rule the schedule breaks.
#[pyfunction]
fn replay(
    workload: &PyWorkload,
    schedule: &PySchedule,
    cost_model_spec: &str,
    limits: LimitKwargs,
    slo: Vec<String>,
    pipeline: PipelineKwargs,
) -> PyResult<PyRun> {
    let cost = cost_model(cost_model_spec)?;
    let pipeline = pipeline.pipeline(&cost)?;
    let limits = limits.limits_on(&cost, pipeline.stages)?;
    let slo = slos(&slo)?;
    let instance = Instance::new(workload.inner.clone(), limits, cost).map_err(err)?;
    let schedule = schedule.inner.clone();
    let producer = meta_producer(&schedule).unwrap_or_else(|| "schedule".to_owned());
    let (w, cost) = (instance.workload(), instance.cost());
    let replay = guarded(|| {
        infersched::core::replay_pipelined(w, instance.limits(), cost, &pipeline, &schedule)
            .map_err(err)
    })?;
    let (summary, time_split) =
        infersched::produce::summarize_on(w, cost, &schedule, &replay, &pipeline);
    let outcome = Outcome {
        schedule,
        replay,
        summary,
        limits,
        solve: None,
        time_split,
        cluster: None,
    };
    Ok(PyRun::new(
        with_slo(outcome, &slo),
        None,
        producer,
        &workload.inner,
    ))
}

/// Finds an optimal schedule for `objective` (or the best found with a bound and the
/// certified gap) and replays it (`infersched solve`). The solve runs on its own thread
/// without the GIL; `progress`, if given, is called with each progress point (a dict of
/// bound, incumbent, gap_percent, elapsed_s); Ctrl-C raises `SolveInterrupted` holding the
/// best schedule found so far.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn solve(
    py: Python<'_>,
    workload: &PyWorkload,
    objective: &str,
    cost_model_spec: &str,
    limits: LimitKwargs,
    solve_kwargs: SolveKwargs,
    slo: Vec<String>,
    progress: Option<Py<PyAny>>,
    replicas: u32,
) -> PyResult<PyRun> {
    let objective = named::<Objective>("objective", objective)?;
    let cost = cost_model(cost_model_spec)?;
    let limits = limits.limits(&cost)?;
    let slo = slos(&slo)?;
    let watch = Arc::new(Watch::default());
    let options = SolveOptions {
        observer: Some(Observer::new(WatchObserver(watch.clone()))),
        ..solve_kwargs.options()?
    };
    let contender = infersched::produce::Contender::Optimal(options.constraints);
    let producer = contender.to_string();
    let cluster = ClusterKwargs {
        replicas,
        router: "round-robin".into(),
    }
    .cluster()?;
    let (w, c) = (workload.inner.clone(), cost.clone());
    let job = move || match cluster {
        // The cluster search tries every router itself; the one named here is unused.
        Some(cluster) => {
            let knobs = infersched::schedulers::Knobs::default();
            let with = infersched::produce::ProduceWith {
                knobs: &knobs,
                limits: &limits,
                objective,
                solve: &options,
            };
            infersched::produce::produce_on_cluster(&w, &c, contender, &with, cluster)
        }
        None => produce_optimal(&w, &c, &limits, objective, &options),
    };
    let outcome = match wait_watched(py, &watch, progress.as_ref(), job)? {
        Waited::Done(result) => result.map_err(err)?,
        Waited::Interrupted(e) => {
            return Err(interrupted(py, e, &watch, &workload.inner, &limits, &cost));
        }
    };
    let outcome = with_slo(outcome, &slo);
    Ok(PyRun::new(
        outcome,
        Some(objective),
        producer,
        &workload.inner,
    ))
}

/// One contender of a comparison: its name, and its run or why it failed.
type Contended = (String, Option<PyRun>, Option<String>);

/// The optimal scheduler and heuristics on one setting (`infersched compare`): writes the
/// command's folder (comparison.csv and .json, a folder per scheduler, plots,
/// report.html) under `out` and returns each contender's run or error.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    workload: &PyWorkload,
    cost_model_spec: &str,
    limits: LimitKwargs,
    knob_kwargs: KnobKwargs,
    solve_kwargs: SolveKwargs,
    slo: Vec<String>,
    how: CompareKwargs,
    progress: Option<Py<PyAny>>,
) -> PyResult<Vec<Contended>> {
    use infersched::compare::{ClusterSetting, CompareSpec, Contender, Setting};
    let w = &workload.inner;
    let cost = cost_model(cost_model_spec)?;
    let objective = named::<Objective>("objective", &how.objective)?;
    let contenders =
        Contender::parse_list(&how.schedulers).map_err(|e| err(format!("schedulers: {e}")))?;
    let explicit = limits.explicit_limits(&cost)?;
    let watch = Arc::new(Watch::default());
    let cluster = how.cluster.cluster_of_routers()?;
    let spec = CompareSpec {
        contenders,
        objective,
        limits: explicit,
        knobs: knobs(w, &cost, &limits, &knob_kwargs)?,
        solve: SolveOptions {
            observer: Some(Observer::new(WatchObserver(watch.clone()))),
            ..solve_kwargs.options()?
        },
        slos: slos(&slo)?,
        cluster: cluster.clone(),
    };
    let setting = Setting {
        workload: workload.source.clone(),
        workload_stats: infersched::workload::WorkloadStats::of(w),
        cost_model: cost.name.clone(),
        objective,
        limits: explicit,
        time_limit_s: solve_kwargs.time_limit,
        cluster: cluster.as_ref().map(|c| ClusterSetting {
            replicas: c.replicas,
            router: how.cluster.router.clone(),
        }),
    };
    let (w2, c2) = (w.clone(), cost.clone());
    let job = move || infersched::compare::run(&w2, &c2, &spec);
    let c = match wait_watched(py, &watch, progress.as_ref(), job)? {
        Waited::Done(c) => c,
        Waited::Interrupted(e) => return Err(interrupted(py, e, &watch, w, &explicit, &cost)),
    };
    let parts = infersched::report::ReportParts {
        plots: how.plots,
        traces: how.traces,
    };
    infersched::report::write_comparison_parts(&how.out, w, &setting, &c, parts).map_err(|e| {
        err(format!(
            "writing the comparison to {}: {e}",
            how.out.display()
        ))
    })?;
    Ok(contended(c, objective, w))
}

fn contended(
    c: infersched::compare::Comparison,
    objective: Objective,
    w: &Workload,
) -> Vec<Contended> {
    let runs = c.results.into_iter().map(|run| {
        let name = match run.router {
            Some(r) => format!("{}@{r}", run.contender),
            None => run.contender.to_string(),
        };
        match run.result {
            Ok(outcome) => {
                let objective = run.contender.is_solver().then_some(objective);
                let run = PyRun::new(outcome, objective, name.clone(), w);
                (name, Some(run), None)
            }
            Err(e) => (name, None, Some(e)),
        }
    });
    runs.collect()
}

/// The highest request rate at which `scheduler` meets every SLO on the trace, its
/// arrivals scaled (`infersched capacity` for one configuration), and the ceiling no
/// schedule passes; JSON text (the Python side parses it). Runs without the GIL.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn capacity(
    py: Python<'_>,
    workload: &PyWorkload,
    scheduler: &str,
    cost_model_spec: &str,
    limits: LimitKwargs,
    knob_kwargs: KnobKwargs,
    slo: Vec<String>,
    cluster: ClusterKwargs,
    search: CapacityKwargs,
) -> PyResult<String> {
    use infersched::capacity::{Capacity, Replicas};
    let kind = named::<SchedulerKind>("scheduler", scheduler)?;
    let cost = cost_model(cost_model_spec)?;
    let w = &workload.inner;
    let pipeline = infersched::settings::pipeline(&cost, search.pp, None, None).map_err(err)?;
    check_pipelined(&pipeline, kind)?;
    let knobs = knobs_on(w, &cost, &limits, &knob_kwargs, pipeline.stages)?;
    let spec = search.spec(slos(&slo)?)?;
    let replicas = cluster
        .cluster()?
        .map_or(Replicas::ONE, |(count, router)| Replicas { count, router });
    let lim = kind.limits(&knobs, w);
    let split = disaggregation(&search.split(), &cost, &cluster, replicas)?;
    let (found, ceiling, best) = py.detach(|| {
        guarded(|| {
            if let Some((d, router, link)) = &split {
                let on = (&cost, &pipeline);
                let found = infersched::capacity::disaggregated_capacity(
                    w,
                    on,
                    kind,
                    &knobs,
                    (*d, *router),
                    link,
                    &spec,
                )
                .map_err(err)?;
                return Ok((found, None, None));
            }
            if pipeline.is_pipelined() {
                let on = (&cost, &pipeline);
                let found =
                    infersched::capacity::pipelined_capacity(w, on, kind, &knobs, replicas, &spec)
                        .map_err(err)?;
                let ceiling = infersched::ceiling::ceiling_on(w, &lim, on, replicas.count, &spec)
                    .map_err(err)?;
                return Ok((found, ceiling, None));
            }
            let found = infersched::capacity::capacity(w, &cost, kind, &knobs, replicas, &spec)
                .map_err(err)?;
            let ceiling =
                infersched::ceiling::ceiling(w, &lim, &cost, replicas.count, &spec).map_err(err)?;
            let best = (search.best_found && replicas.count == 1)
                .then(|| {
                    infersched::capacity::best_found_capacity(
                        w,
                        &cost,
                        &lim,
                        &spec,
                        infersched::capacity::BEST_FOUND_BUDGET,
                    )
                })
                .transpose()
                .map_err(err)?;
            Ok((found, ceiling, best))
        })
    })?;
    let best_rate = best.as_ref().and_then(|b| match b.capacity {
        Capacity::Found { rate, .. } | Capacity::AtLeast { rate } => Some(rate),
        Capacity::Below { .. } => None,
    });
    let (result, rate, above, slos) = match &found.capacity {
        Capacity::Found {
            rate,
            above,
            binding,
        } => ("found", Some(*rate), Some(*above), binding),
        Capacity::AtLeast { rate } => ("at-least", Some(*rate), None, &Vec::new()),
        Capacity::Below { rate, missed } => ("below", None, Some(*rate), missed),
    };
    let doc = serde_json::json!({
        "scheduler": kind.name(),
        "limits": lim.to_string(),
        "result": result,
        "max_rate_per_s": rate,
        "misses_at_per_s": above,
        "binding_slos": slos,
        "report": found.report,
        "probes": found.probes,
        "ceiling_per_s": ceiling,
        "best_found_rate_per_s": best_rate,
        "disaggregate": split.map(|(d, _, _)| d.to_string()),
    });
    Ok(doc.to_string())
}

/// `disaggregate` (of a capacity search or a simulation), checked: the split, the router
/// of both sides and the KV link, or None; not with more than one replica (a cluster is
/// one or the other).
fn disaggregation(
    split: &SplitKwargs,
    cost: &infersched::cost_model::LinearCostModel,
    cluster: &ClusterKwargs,
    replicas: infersched::capacity::Replicas,
) -> PyResult<
    Option<(
        infersched::core::disaggregated::Disaggregation,
        infersched::schedulers::Router,
        infersched::core::disaggregated::KvLink,
    )>,
> {
    let Some(text) = &split.disaggregate else {
        return Ok(None);
    };
    if replicas.count > 1 {
        return Err(err(
            "disaggregate and replicas > 1: a cluster is either replicas or a prefill:decode split",
        ));
    }
    let d = text
        .parse::<infersched::core::disaggregated::Disaggregation>()
        .map_err(|e| err(format!("disaggregate: {e}")))?;
    let router = cluster
        .router
        .parse()
        .map_err(|e| err(format!("router: {e}")))?;
    let link = infersched::settings::kv_link(cost, split.kv_bandwidth, split.kv_latency_us)
        .map_err(err)?;
    let connector = split
        .kv_connector
        .parse()
        .map_err(|e| err(format!("kv_connector: {e}")))?;
    let link = infersched::core::disaggregated::KvLink { connector, ..link };
    Ok(Some((d, router, link)))
}

/// The names `scheduler` accepts, in the command's order.
#[pyfunction]
fn scheduler_names() -> Vec<&'static str> {
    SchedulerKind::NAMES.to_vec()
}

/// Whether the scheduler reads the true output lengths (clairvoyant: no online system can).
#[pyfunction]
fn is_clairvoyant(scheduler: &str) -> PyResult<bool> {
    Ok(named::<SchedulerKind>("scheduler", scheduler)?.clairvoyant())
}

/// The names `objective` accepts.
#[pyfunction]
fn objective_names() -> Vec<&'static str> {
    Objective::NAMES.to_vec()
}

/// The cost-model presets by name (roofline specs and coefficient files are accepted too).
#[pyfunction]
fn cost_model_presets() -> Vec<&'static str> {
    infersched::cost_model::PRESET_NAMES.to_vec()
}

/// The cost model used when none is named.
#[pyfunction]
fn default_cost_model() -> &'static str {
    infersched::cost_models::DEFAULT_COST_MODEL
}

/// The module.
#[pymodule]
fn _infersched(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorkload>()?;
    m.add_class::<PySchedule>()?;
    m.add_class::<PyRun>()?;
    m.add("InferschedError", m.py().get_type::<InferschedError>())?;
    m.add("SolveInterrupted", m.py().get_type::<SolveInterrupted>())?;
    m.add(
        "DEFAULT_GPU_MEMORY_UTILIZATION",
        infersched::cost_model::DEFAULT_GPU_MEMORY_UTILIZATION,
    )?;
    let defaults = SolveOptions::default();
    m.add(
        "DEFAULT_LIST_SEARCH_TRIES",
        defaults.list_search_evaluations,
    )?;
    m.add(
        "DEFAULT_PLAN_SEARCH_TRIES",
        defaults.plan_search_evaluations,
    )?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(solve, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(capacity, m)?)?;
    m.add_function(wrap_pyfunction!(scheduler_names, m)?)?;
    m.add_function(wrap_pyfunction!(is_clairvoyant, m)?)?;
    m.add_function(wrap_pyfunction!(objective_names, m)?)?;
    m.add_function(wrap_pyfunction!(cost_model_presets, m)?)?;
    m.add_function(wrap_pyfunction!(default_cost_model, m)?)?;
    Ok(())
}
