//! The Python classes: `Workload`, `Schedule` and `Run` (a schedule, its replay and what is
//! computed from it).

use crate::errors::err;
use infersched::core::{Schedule, Workload};
use infersched::produce::Outcome;
use infersched::solver::Objective;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};

/// The requests: prompt and output lengths and arrival times (a trace's rows).
#[pyclass(name = "Workload", module = "infersched._infersched", frozen)]
#[derive(Clone)]
pub(crate) struct PyWorkload {
    pub(crate) inner: Workload,
    pub(crate) source: String,
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
pub(crate) struct PySchedule {
    pub(crate) inner: Schedule,
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
pub(crate) struct PyRun {
    pub(crate) outcome: Outcome,
    pub(crate) objective: Option<Objective>,
    pub(crate) producer: String,
    /// The requests, kept for a cluster's run (its files name each replica's requests).
    pub(crate) cluster_workload: Option<Workload>,
    /// A disaggregated cluster's sides (`outcome` then holds the whole cluster's replay
    /// and summary).
    pub(crate) disaggregated: Option<Box<infersched::produce::DisaggregatedOutcome>>,
}

impl PyRun {
    /// The cluster search's report, where the solver ran on replicas.
    fn cluster_search(&self) -> Option<&infersched::solver::cluster::ClusterSolveReport> {
        self.outcome.cluster.as_ref()?.search.as_ref()
    }

    /// A run of `w`: `objective` for the solver's (its files then include solve.json).
    pub(crate) fn new(
        outcome: Outcome,
        objective: Option<Objective>,
        producer: impl Into<String>,
        w: &Workload,
    ) -> Self {
        let cluster_workload = outcome.cluster.is_some().then(|| w.clone());
        Self {
            outcome,
            objective,
            producer: producer.into(),
            cluster_workload,
            disaggregated: None,
        }
    }

    /// The run of a disaggregated cluster `o` of `w` (its summary already measured
    /// against any SLOs): the whole cluster's replay and summary, no time split.
    pub(crate) fn of_disaggregated(
        o: infersched::produce::DisaggregatedOutcome,
        producer: impl Into<String>,
        w: &Workload,
    ) -> Self {
        let outcome = Outcome {
            schedule: Schedule::new(Vec::new()),
            replay: o.replay.cluster.merged.clone(),
            summary: o.summary.clone(),
            limits: o.limits,
            solve: None,
            time_split: Default::default(),
            cluster: None,
        };
        Self {
            outcome,
            objective: None,
            producer: producer.into(),
            cluster_workload: Some(w.clone()),
            disaggregated: Some(Box::new(o)),
        }
    }
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

    /// Where the makespan goes, term by term of the cost model (JSON; `null` for a
    /// disaggregated cluster, which the command does not split either).
    fn time_split_json(&self) -> PyResult<String> {
        if self.disaggregated.is_some() {
            return Ok("null".into());
        }
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
        if let Some(report) = self.cluster_search() {
            return serde_json::to_string_pretty(report).map(Some).map_err(err);
        }
        let Some(report) = &self.outcome.solve else {
            return Ok(None);
        };
        serde_json::to_string_pretty(report).map(Some).map_err(err)
    }

    /// The solver's status, method and bound argument by name, or None for a heuristic
    /// or a replay.
    fn solve_names(&self) -> Option<(&'static str, &'static str, &'static str)> {
        if let Some(r) = self.cluster_search() {
            return Some((r.status.name(), r.method.name(), r.bound_argument.name()));
        }
        let r = self.outcome.solve.as_ref()?;
        Some((r.status.name(), r.method.name(), r.bound_method.name()))
    }

    /// Writes the files the command writes with `--out DIR` (schedule.json,
    /// requests.csv, batches.csv, summary.json, and solve.json for a solve); the paths.
    fn write(&self, dir: PathBuf) -> PyResult<Vec<PathBuf>> {
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        if let (Some(d), Some(w)) = (&self.disaggregated, &self.cluster_workload) {
            return infersched::cluster::write_disaggregated_outputs(&dir, w, d, None)
                .map_err(|e| err(format!("writing results to {}: {e}", dir.display())));
        }
        let o = &self.outcome;
        let written = match (&o.cluster, &self.cluster_workload, &o.solve, self.objective) {
            (Some(parts), Some(w), _, _) => write_cluster_run(&dir, w, parts, &o.summary),
            (Some(_), None, _, _) => {
                return Err(err("internal error: a cluster's run without its workload"));
            }
            (None, _, Some(report), Some(objective)) => infersched::output::write_solve_outputs(
                &dir, report, objective, &o.replay, &o.summary,
            ),
            _ => infersched::output::write_run_outputs(&dir, &o.schedule, &o.replay, &o.summary),
        };
        written.map_err(|e| err(format!("writing results to {}: {e}", dir.display())))
    }

    /// Replicas the run had (1 for one GPU).
    #[getter]
    fn replicas(&self) -> usize {
        if let Some(d) = &self.disaggregated {
            return d.prefill_schedules.len() + d.decode_schedules.len();
        }
        self.outcome
            .cluster
            .as_ref()
            .map_or(1, |c| c.schedules.len())
    }
}

pub(crate) fn csv_text(
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> PyResult<String> {
    let mut buf = Vec::new();
    write(&mut buf).map_err(err)?;
    String::from_utf8(buf).map_err(err)
}

/// The producer a schedule file names in its meta, if any.
pub(crate) fn meta_producer(schedule: &Schedule) -> Option<String> {
    let meta = schedule.meta.as_ref()?;
    Some(meta.get("producer")?.as_str()?.to_owned())
}

/// What `simulate --replicas` (or, with the search's report, `solve --replicas`) writes:
/// the cluster's files and solve.json.
fn write_cluster_run(
    dir: &Path,
    w: &Workload,
    parts: &infersched::produce::ClusterParts,
    summary: &infersched::core::Summary,
) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = infersched::cluster::write_cluster_outputs(
        dir,
        w,
        &parts.routing,
        &parts.schedules,
        &parts.replay,
        summary,
        None,
    )?;
    if let Some(report) = &parts.search {
        let path = dir.join("solve.json");
        let json = serde_json::to_string_pretty(report)? + "\n";
        infersched::core::io::write_bytes_atomic(&path, json.as_bytes())?;
        paths.push(path);
    }
    Ok(paths)
}
