//! `infersched._infersched`: the Rust side of the Python package. Every function calls the
//! same library code as the `infersched` command (no subprocess): the same settings
//! ([`infersched::settings`]), the same producers ([`infersched::produce`]) and the same
//! writers ([`infersched::output`]), so a run's files are the command's, byte for byte.
//! The Python side (`infersched/__init__.py`) adds DataFrames and keyword defaults.

use infersched::core::names::Named;
use infersched::core::{Instance, Limits, Schedule, Slo, SloReport, Summary, Workload};
use infersched::cost_model::{LinearCostModel, TimeBreakdown};
use infersched::produce::{Outcome, produce_heuristic, produce_optimal};
use infersched::schedulers::{Knobs, McsfOrder, SchedulerKind, Victim};
use infersched::solver::progress::{Observer, Progress, SolveObserver};
use infersched::solver::{Objective, PolicyConstraints, SolveOptions};
use pyo3::exceptions::{PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

pyo3::create_exception!(
    _infersched,
    InferschedError,
    PyValueError,
    "Bad input or a failed run: the message names the file, row, field or flag and what was expected."
);
pyo3::create_exception!(
    _infersched,
    SolveInterrupted,
    PyKeyboardInterrupt,
    "Ctrl-C during solve(): `.args[1]` holds the best schedule found so far, replayed (a Run, not proven optimal), or None."
);

/// Any error of the library as an `InferschedError` with its full chain of causes.
fn err(e: impl std::fmt::Display) -> PyErr {
    InferschedError::new_err(e.to_string())
}

fn named<T: Named>(what: &str, name: &str) -> PyResult<T> {
    T::from_name(name).ok_or_else(|| {
        err(format!(
            "{what}: unknown name {name:?}; expected one of {}",
            T::NAMES.join(", ")
        ))
    })
}

/// The requests: prompt and output lengths and arrival times (a trace's rows).
#[pyclass(name = "Workload", module = "infersched._infersched", frozen)]
#[derive(Clone)]
struct PyWorkload {
    inner: Workload,
    source: String,
}

#[pymethods]
impl PyWorkload {
    /// Reads a trace file (CSV, or Mooncake's JSONL) as `--workload` does.
    #[staticmethod]
    fn read(path: PathBuf) -> PyResult<Self> {
        let inner = infersched::workload::read_trace(&path).map_err(err)?;
        Ok(Self {
            inner,
            source: path.display().to_string(),
        })
    }

    /// Parses trace text (CSV) with the same columns and checks as a trace file; errors
    /// name `name`, the row and the column.
    #[staticmethod]
    fn parse(text: &str, name: &str) -> PyResult<Self> {
        let inner = infersched::workload::read_trace_str(text, Path::new(name)).map_err(err)?;
        Ok(Self {
            inner,
            source: name.to_owned(),
        })
    }

    /// Where the requests came from.
    #[getter]
    fn source(&self) -> String {
        self.source.clone()
    }

    /// `(input_tokens, output_tokens, arrival_s)` per request, in id order.
    fn rows(&self) -> Vec<(u32, u32, f64)> {
        let reqs = self.inner.requests().iter();
        reqs.map(|r| (r.input_tokens, r.output_tokens, r.arrival_s))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// A schedule: batches of entries (infersched-schedule/1).
#[pyclass(name = "Schedule", module = "infersched._infersched", frozen)]
#[derive(Clone)]
struct PySchedule {
    inner: Schedule,
}

#[pymethods]
impl PySchedule {
    /// Reads a schedule file (JSON, or CSV batch,request,tokens) as `--schedule` does.
    #[staticmethod]
    fn read(path: PathBuf) -> PyResult<Self> {
        let inner = Schedule::read(&path).map_err(err)?;
        Ok(Self { inner })
    }

    /// Parses schedule JSON text.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        let inner = Schedule::from_json_str(text, Path::new("<schedule JSON>")).map_err(err)?;
        Ok(Self { inner })
    }

    /// The JSON text `schedule.json` holds.
    fn to_json(&self) -> PyResult<String> {
        let mut buf = Vec::new();
        self.inner.write_json(&mut buf).map_err(err)?;
        String::from_utf8(buf).map_err(err)
    }

    /// Writes the schedule (JSON, or CSV where the name ends in `.csv`), atomically.
    fn write(&self, path: PathBuf) -> PyResult<()> {
        self.inner.write(&path).map_err(err)
    }

    fn __len__(&self) -> usize {
        self.inner.batches.len()
    }
}

/// A schedule, its independent replay and what is computed from it.
#[pyclass(name = "Run", module = "infersched._infersched", frozen)]
struct PyRun {
    outcome: Outcome,
    objective: Option<Objective>,
    producer: String,
}

#[pymethods]
impl PyRun {
    /// What produced the schedule (a scheduler's name, or the solver).
    #[getter]
    fn producer(&self) -> String {
        self.producer.clone()
    }

    /// The limits it ran under and was replayed against, as the command prints them.
    #[getter]
    fn limits(&self) -> String {
        self.outcome.limits.to_string()
    }

    /// The schedule.
    #[getter]
    fn schedule(&self) -> PySchedule {
        PySchedule {
            inner: self.outcome.schedule.clone(),
        }
    }

    /// `summary.json`'s text.
    fn summary_json(&self) -> PyResult<String> {
        serde_json::to_string_pretty(&self.outcome.summary).map_err(err)
    }

    /// Where the makespan goes, term by term of the cost model (JSON).
    fn time_split_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.outcome.time_split).map_err(err)
    }

    /// `requests.csv`'s text.
    fn requests_csv(&self) -> PyResult<String> {
        csv_text(|w| infersched::output::write_requests_csv(&self.outcome.replay, w))
    }

    /// `batches.csv`'s text.
    fn batches_csv(&self) -> PyResult<String> {
        csv_text(|w| infersched::output::write_batches_csv(&self.outcome.replay, w))
    }

    /// `solve.json`'s text (the solver's report), or None for a heuristic or a replay.
    fn solve_json(&self) -> PyResult<Option<String>> {
        let Some(report) = &self.outcome.solve else {
            return Ok(None);
        };
        serde_json::to_string_pretty(report).map(Some).map_err(err)
    }

    /// The solver's status, method and bound argument by name, or None for a heuristic
    /// or a replay.
    fn solve_names(&self) -> Option<(&'static str, &'static str, &'static str)> {
        let r = self.outcome.solve.as_ref()?;
        Some((r.status.name(), r.method.name(), r.bound_method.name()))
    }

    /// Writes the files the command writes with `--out DIR` (schedule.json,
    /// requests.csv, batches.csv, summary.json, and solve.json for a solve); the paths.
    fn write(&self, dir: PathBuf) -> PyResult<Vec<PathBuf>> {
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        let o = &self.outcome;
        if o.cluster.is_some() {
            return Err(err(
                "a cluster's run: its files (routing.csv, replica-K/) are in the comparison's folder",
            ));
        }
        let written = match (&o.solve, self.objective) {
            (Some(report), Some(objective)) => infersched::output::write_solve_outputs(
                &dir, report, objective, &o.replay, &o.summary,
            ),
            _ => infersched::output::write_run_outputs(&dir, &o.schedule, &o.replay, &o.summary),
        };
        written.map_err(|e| err(format!("writing results to {}: {e}", dir.display())))
    }
}

fn csv_text(
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> PyResult<String> {
    let mut buf = Vec::new();
    write(&mut buf).map_err(err)?;
    String::from_utf8(buf).map_err(err)
}

/// The producer a schedule file names in its meta, if any.
fn meta_producer(schedule: &Schedule) -> Option<String> {
    let meta = schedule.meta.as_ref()?;
    Some(meta.get("producer")?.as_str()?.to_owned())
}

/// The per-batch limits as keyword arguments (the command's flags, underscores for dashes).
#[derive(FromPyObject, Default)]
#[pyo3(from_item_all)]
struct LimitKwargs {
    token_budget: Option<u64>,
    prefill_budget: Option<u64>,
    kv_capacity: Option<u64>,
    num_gpu_blocks: Option<u64>,
    gpu_memory_utilization: f64,
    max_running: Option<u64>,
    block_size: Option<u32>,
    watermark: Option<f64>,
}

impl LimitKwargs {
    /// M as every command derives it (blocks of `block` tokens for --num-gpu-blocks).
    fn kv_capacity(&self, cost: &LinearCostModel, block: u32) -> PyResult<u64> {
        infersched::settings::kv_capacity(
            self.kv_capacity,
            self.num_gpu_blocks,
            self.gpu_memory_utilization,
            cost,
            block,
        )
        .map_err(err)
    }

    /// The limits `compare` gives the solver: those set (block size 1 and C, P, R_max
    /// unlimited where unset), M as the heuristics get it, no watermark (a policy's
    /// admission rule, not a limit of the GPU).
    fn explicit_limits(&self, cost: &LinearCostModel) -> PyResult<Limits> {
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: Some(self.kv_capacity(cost, self.block_size.unwrap_or(16))?),
            max_running: self.max_running,
            block_size: self.block_size.unwrap_or(1),
            watermark: self.watermark.unwrap_or(0.0),
        };
        l.validate().map_err(err)?;
        Ok(Limits {
            watermark: 0.0,
            ..l
        })
    }

    /// The limits as `solve` and `replay` read them: unset ones unlimited, block 1.
    fn limits(&self, cost: &LinearCostModel) -> PyResult<Limits> {
        let block = self.block_size.unwrap_or(1);
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: Some(self.kv_capacity(cost, block)?),
            max_running: self.max_running,
            block_size: block,
            watermark: self.watermark.unwrap_or(0.0),
        };
        l.validate().map_err(err)?;
        Ok(l)
    }
}

/// The heuristics' knobs as keyword arguments (unset ones take each policy's default).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct KnobKwargs {
    no_preemption: bool,
    victim: String,
    max_model_len: Option<u64>,
    mcsf_order: String,
    scheduler_reserve_full_isl: Option<bool>,
    long_prefill_token_threshold: Option<u64>,
    max_ragged_sequence_count: Option<u64>,
    max_waiting_iters: Option<u64>,
}

fn knobs(w: &Workload, cost: &LinearCostModel, l: &LimitKwargs, k: &KnobKwargs) -> PyResult<Knobs> {
    infersched::settings::check_max_model_len(w, k.max_model_len).map_err(err)?;
    if k.max_ragged_sequence_count == Some(0) {
        return Err(err("max_ragged_sequence_count: expected at least 1, got 0"));
    }
    Ok(Knobs {
        token_budget: l.token_budget,
        prefill_budget: l.prefill_budget,
        kv_capacity: Some(l.kv_capacity(cost, l.block_size.unwrap_or(16))?),
        max_running: l.max_running,
        block_size: l.block_size,
        watermark: l.watermark,
        no_preemption: k.no_preemption,
        victim: named::<Victim>("victim", &k.victim)?,
        max_model_len: k.max_model_len,
        mcsf_order: named::<McsfOrder>("mcsf_order", &k.mcsf_order)?,
        reserve_full_isl: k.scheduler_reserve_full_isl,
        long_prefill_token_threshold: k.long_prefill_token_threshold,
        max_ragged_sequence_count: k.max_ragged_sequence_count,
        max_waiting_iters: k.max_waiting_iters,
    })
}

fn cost_model(spec: &str) -> PyResult<LinearCostModel> {
    infersched::cost_models::resolve(spec).map_err(err)
}

fn slos(slo: &[String]) -> PyResult<Vec<Slo>> {
    slo.iter()
        .map(|s| s.parse::<Slo>().map_err(|e| err(format!("slo {s:?}: {e}"))))
        .collect()
}

fn with_slo(mut outcome: Outcome, slo: &[Slo]) -> Outcome {
    if !slo.is_empty() {
        outcome.summary.slo = Some(SloReport::of(&outcome.replay, slo));
    }
    outcome
}

/// Runs a heuristic scheduler on `workload`, replays its schedule and measures it
/// (`infersched simulate` for one scheduler). The simulation runs without the GIL.
#[pyfunction]
fn simulate(
    py: Python<'_>,
    workload: &PyWorkload,
    scheduler: &str,
    cost_model_spec: &str,
    limits: LimitKwargs,
    knob_kwargs: KnobKwargs,
    slo: Vec<String>,
) -> PyResult<PyRun> {
    let kind = named::<SchedulerKind>("scheduler", scheduler)?;
    let cost = cost_model(cost_model_spec)?;
    let w = &workload.inner;
    let knobs = knobs(w, &cost, &limits, &knob_kwargs)?;
    let slo = slos(&slo)?;
    let outcome = py
        .detach(|| produce_heuristic(w, &cost, kind, &knobs))
        .map_err(err)?;
    Ok(PyRun {
        outcome: with_slo(outcome, &slo),
        objective: None,
        producer: kind.name().to_owned(),
    })
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
) -> PyResult<PyRun> {
    let cost = cost_model(cost_model_spec)?;
    let limits = limits.limits(&cost)?;
    let slo = slos(&slo)?;
    let instance = Instance::new(workload.inner.clone(), limits, cost).map_err(err)?;
    let schedule = schedule.inner.clone();
    let producer = meta_producer(&schedule).unwrap_or_else(|| "schedule".to_owned());
    let replay = instance.replay(&schedule).map_err(err)?;
    let summary = Summary::from_replay(&replay);
    let time_split = TimeBreakdown::of(instance.cost(), instance.workload(), &schedule, &replay);
    let outcome = Outcome {
        schedule,
        replay,
        summary,
        limits,
        solve: None,
        time_split,
        cluster: None,
    };
    Ok(PyRun {
        outcome: with_slo(outcome, &slo),
        objective: None,
        producer,
    })
}

/// The solver's options as keyword arguments (the command's flags).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct SolveKwargs {
    time_limit: f64,
    threads: u32,
    mip_gap: f64,
    memory_limit: f64,
    horizon: Option<usize>,
    milp_only: bool,
    list_search_tries: usize,
    plan_search_tries: usize,
    no_phase_relaxation: bool,
    no_independent_groups: bool,
    no_warm_start: bool,
    warm_start_from: Vec<String>,
    no_evict: bool,
    no_chunk: bool,
    no_mix: bool,
    fcfs: bool,
    reserve: bool,
}

impl SolveKwargs {
    /// Checked options, as `solve`'s flags give them.
    fn options(&self) -> PyResult<SolveOptions> {
        if !self.time_limit.is_finite() || self.time_limit <= 0.0 {
            return Err(err("time_limit must be > 0 seconds"));
        }
        if !(0.0..1.0).contains(&self.mip_gap) {
            return Err(err("mip_gap must be in [0, 1)"));
        }
        if !(1..=256).contains(&self.threads) {
            return Err(err(format!(
                "threads: expected 1 to 256, got {}",
                self.threads
            )));
        }
        if !self.memory_limit.is_finite() || self.memory_limit <= 0.0 || self.memory_limit > 1e6 {
            return Err(err("memory_limit must be > 0 and at most 1e6 GiB"));
        }
        let defaults = SolveOptions::default();
        let warm_start_from = self.warm_start_from.iter();
        Ok(SolveOptions {
            memory_limit_bytes: (self.memory_limit * (1u64 << 30) as f64) as u64,
            time_limit_s: self.time_limit,
            threads: self.threads,
            mip_rel_gap: self.mip_gap,
            max_search_states: if self.milp_only {
                0
            } else {
                defaults.max_search_states
            },
            list_search_evaluations: self.list_search_tries,
            plan_search_evaluations: self.plan_search_tries,
            phase_relaxation: !self.no_phase_relaxation,
            independent_groups: !self.no_independent_groups,
            horizon: self.horizon,
            warm_start: !self.no_warm_start,
            warm_start_from: warm_start_from
                .map(|n| named::<SchedulerKind>("warm_start_from", n))
                .collect::<PyResult<_>>()?,
            constraints: PolicyConstraints {
                no_evict: self.no_evict,
                no_chunk: self.no_chunk,
                no_mix: self.no_mix,
                fcfs: self.fcfs,
                reserve: self.reserve,
            },
            ..defaults
        })
    }
}

/// What a solve running on its own thread has reported: progress points not yet passed
/// to Python, and the best schedule it holds.
#[derive(Default)]
struct Watch {
    progress: Mutex<Vec<Progress>>,
    incumbent: Mutex<Option<(String, Schedule)>>,
}

struct WatchObserver(Arc<Watch>);

impl SolveObserver for WatchObserver {
    fn progress(&self, p: &Progress) {
        if let Ok(mut v) = self.0.progress.lock() {
            v.push(*p);
        }
    }
    fn incumbent(&self, source: &str, schedule: &Schedule) {
        if let Ok(mut best) = self.0.incumbent.lock() {
            *best = Some((source.to_owned(), schedule.clone()));
        }
    }
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
    let producer = infersched::produce::Contender::Optimal(options.constraints).to_string();
    let (w, c) = (workload.inner.clone(), cost.clone());
    let job = move || produce_optimal(&w, &c, &limits, objective, &options);
    let outcome = match wait_watched(py, &watch, progress.as_ref(), job)? {
        Waited::Done(result) => result.map_err(err)?,
        Waited::Interrupted(e) => {
            return Err(interrupted(py, e, &watch, &workload.inner, &limits, &cost));
        }
    };
    Ok(PyRun {
        outcome: with_slo(outcome, &slo),
        objective: Some(objective),
        producer,
    })
}

/// How a watched job ended.
enum Waited<T> {
    /// It returned.
    Done(T),
    /// A signal handler raised (Ctrl-C: KeyboardInterrupt) while it ran.
    Interrupted(PyErr),
}

/// Runs `job` on its own thread without the GIL, passing progress points to `progress`
/// every 100 ms and running Python's signal handlers, until it returns or a handler
/// raises. A job abandoned on an interrupt runs on until it returns (its time limit);
/// its answer is dropped.
fn wait_watched<T: Send + 'static>(
    py: Python<'_>,
    watch: &Watch,
    progress: Option<&Py<PyAny>>,
    job: impl FnOnce() -> T + Send + 'static,
) -> PyResult<Waited<T>> {
    let (tx, mut rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("infersched-solve".into())
        .spawn(move || {
            let _ = tx.send(job());
        })
        .map_err(err)?;
    loop {
        // The receiver is Send but not Sync: it goes into the GIL-free closure and back.
        let (received, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
        rx = back;
        report_progress(py, watch, progress)?;
        match received {
            Ok(done) => return Ok(Waited::Done(done)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(err(
                    "internal error: the solver's thread ended without a result",
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(e) = py.check_signals() {
            return Ok(Waited::Interrupted(e));
        }
    }
}

/// Passes the progress points gathered since the last call to `callback`.
fn report_progress(py: Python<'_>, watch: &Watch, callback: Option<&Py<PyAny>>) -> PyResult<()> {
    let points: Vec<Progress> = match watch.progress.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(_) => Vec::new(),
    };
    let Some(callback) = callback else {
        return Ok(());
    };
    for p in points {
        let d = PyDict::new(py);
        d.set_item("bound", p.bound)?;
        d.set_item("incumbent", p.incumbent)?;
        d.set_item("gap_percent", p.gap_percent)?;
        d.set_item("elapsed_s", p.elapsed_s)?;
        callback.call1(py, (d,))?;
    }
    Ok(())
}

/// The error a Ctrl-C during a solve raises: `SolveInterrupted(message, run)`, `run` the
/// best schedule held (replayed, its producer marked interrupted) or None; any other
/// exception from the signal handlers as it is. The solver's thread cannot be stopped
/// early: it runs on, without the GIL, until its time limit, and its answer is dropped.
fn interrupted(
    py: Python<'_>,
    raised: PyErr,
    watch: &Watch,
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
) -> PyErr {
    if !raised.is_instance_of::<PyKeyboardInterrupt>(py) {
        return raised;
    }
    let held = watch.incumbent.lock().ok().and_then(|b| b.clone());
    let Some((source, mut schedule)) = held else {
        return SolveInterrupted::new_err(("interrupted before any schedule was found", py.None()));
    };
    schedule.meta = Some(serde_json::json!({
        "producer": "infersched-solver (interrupted)",
        "source": source,
        "proven_optimal": false,
    }));
    let run = match replay_outcome(w, limits, cost, schedule) {
        Ok(outcome) => outcome,
        Err(e) => return e,
    };
    let message =
        format!("interrupted; the best schedule found so far ({source}) is not proven optimal");
    match Py::new(
        py,
        PyRun {
            outcome: run,
            objective: None,
            producer: "optimal (interrupted)".to_owned(),
        },
    ) {
        Ok(run) => SolveInterrupted::new_err((message, run)),
        Err(e) => e,
    }
}

fn replay_outcome(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    schedule: Schedule,
) -> PyResult<Outcome> {
    let replay = infersched::core::replay(w, limits, cost, &schedule).map_err(err)?;
    let summary = Summary::from_replay(&replay);
    let time_split = TimeBreakdown::of(cost, w, &schedule, &replay);
    Ok(Outcome {
        schedule,
        replay,
        summary,
        limits: *limits,
        solve: None,
        time_split,
        cluster: None,
    })
}

/// Where and how a comparison runs, beside its settings.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct CompareKwargs {
    schedulers: String,
    objective: String,
    replicas: u32,
    router: String,
    out: PathBuf,
    plots: bool,
    traces: bool,
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
    let max = infersched::core::cluster::MAX_REPLICAS;
    if !(1..=max).contains(&how.replicas) {
        return Err(err(format!(
            "replicas: expected 1 to {max}, got {}",
            how.replicas
        )));
    }
    let router = how
        .router
        .parse::<infersched::schedulers::Router>()
        .map_err(|e| err(format!("router: {e}")))?;
    let contenders =
        Contender::parse_list(&how.schedulers).map_err(|e| err(format!("schedulers: {e}")))?;
    let explicit = limits.explicit_limits(&cost)?;
    let watch = Arc::new(Watch::default());
    let cluster = (how.replicas > 1).then_some((how.replicas, router));
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
        cluster,
    };
    let setting = Setting {
        workload: workload.source.clone(),
        workload_stats: infersched::workload::WorkloadStats::of(w),
        cost_model: cost.name.clone(),
        objective,
        limits: explicit,
        time_limit_s: solve_kwargs.time_limit,
        cluster: cluster.map(|(replicas, router)| ClusterSetting {
            replicas,
            router: router.name(),
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
    Ok(contended(c, objective))
}

fn contended(c: infersched::compare::Comparison, objective: Objective) -> Vec<Contended> {
    let runs = c.results.into_iter().map(|(contender, result)| {
        let name = contender.to_string();
        match result {
            Ok(outcome) => {
                let run = PyRun {
                    objective: contender.is_solver().then_some(objective),
                    producer: name.clone(),
                    outcome,
                };
                (name, Some(run), None)
            }
            Err(e) => (name, None, Some(e)),
        }
    });
    runs.collect()
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
    m.add_function(wrap_pyfunction!(scheduler_names, m)?)?;
    m.add_function(wrap_pyfunction!(is_clairvoyant, m)?)?;
    m.add_function(wrap_pyfunction!(objective_names, m)?)?;
    m.add_function(wrap_pyfunction!(cost_model_presets, m)?)?;
    m.add_function(wrap_pyfunction!(default_cost_model, m)?)?;
    Ok(())
}
