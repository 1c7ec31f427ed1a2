//! Long runs (solve, compare) on a thread of their own without the GIL: progress passed
//! to a Python callback, Ctrl-C answered with the best schedule found so far.

use crate::errors::{SolveInterrupted, err};
use crate::objects::PyRun;
use infersched::core::{Limits, Schedule, Summary, Workload};
use infersched::cost_model::{LinearCostModel, TimeBreakdown};
use infersched::produce::Outcome;
use infersched::solver::progress::{Progress, SolveObserver};
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// What a solve running on its own thread has reported: progress points not yet passed
/// to Python, and the best schedule it holds.
#[derive(Default)]
pub(crate) struct Watch {
    pub(crate) progress: Mutex<Vec<Progress>>,
    pub(crate) incumbent: Mutex<Option<(String, Schedule)>>,
}

pub(crate) struct WatchObserver(pub(crate) Arc<Watch>);

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

/// How a watched job ended.
pub(crate) enum Waited<T> {
    /// It returned.
    Done(T),
    /// A signal handler raised (Ctrl-C: KeyboardInterrupt) while it ran.
    Interrupted(PyErr),
}

/// Runs `job` on its own thread without the GIL, passing progress points to `progress`
/// every 100 ms and running Python's signal handlers, until it returns or a handler
/// raises. A job abandoned on an interrupt runs on until it returns (its time limit);
/// its answer is dropped.
pub(crate) fn wait_watched<T: Send + 'static>(
    py: Python<'_>,
    watch: &Watch,
    progress: Option<&Py<PyAny>>,
    job: impl FnOnce() -> T + Send + 'static,
) -> PyResult<Waited<T>> {
    let (tx, mut rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("infersched-solve".into())
        .spawn(move || {
            // A panic in the job drops the sender: the caller reports it as an error.
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
pub(crate) fn report_progress(
    py: Python<'_>,
    watch: &Watch,
    callback: Option<&Py<PyAny>>,
) -> PyResult<()> {
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
pub(crate) fn interrupted(
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
    match Py::new(py, PyRun::new(run, None, "optimal (interrupted)", w)) {
        Ok(run) => SolveInterrupted::new_err((message, run)),
        Err(e) => e,
    }
}

pub(crate) fn replay_outcome(
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
