//! What an interrupted command (SIGINT or Ctrl-C, SIGTERM as Slurm, systemd and `timeout`
//! send, SIGHUP) leaves behind: none of its temporary
//! files, and, where a command registered one, what it can still deliver (for `solve`, the
//! best schedule found so far, replayed and written like a finished run's).
//!
//! The handler runs on its own thread: it removes the temporary files this process is
//! writing ([`crate::core::io::remove_in_flight_temp_files`]), runs the registered
//! delivery, says what it did on standard error and exits with status 130.

use crate::core::{Limits, Schedule, Summary, Workload, replay};
use crate::cost_model::LinearCostModel;
use crate::solver::progress::{Progress, SolveObserver, StderrProgress};
use anyhow::Result;
use std::path::PathBuf;
use std::sync::Mutex;

type Delivery = Box<dyn FnOnce() -> Result<String> + Send>;

/// What to deliver on an interrupt, if anything.
static DELIVERY: Mutex<Option<Delivery>> = Mutex::new(None);

/// Installs the interrupt handler (once per process; later calls do nothing).
pub fn install_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // Without a handler the default (exit, leaving temporary files) still applies.
        let _ = ctrlc::set_handler(|| {
            let removed = crate::core::io::remove_in_flight_temp_files();
            let delivery = DELIVERY.lock().ok().and_then(|mut d| d.take());
            let said = match delivery.map(|d| d()) {
                Some(Ok(msg)) => format!("; {msg}"),
                Some(Err(e)) => format!("; could not write the best schedule found: {e:#}"),
                None => String::new(),
            };
            let files = if removed > 0 {
                format!(" ({removed} partial output files removed)")
            } else {
                String::new()
            };
            eprintln!("\ninterrupted{files}{said}");
            std::process::exit(130);
        });
    });
}

/// Registers what an interrupt should still deliver, replacing an earlier registration.
pub fn on_interrupt(delivery: impl FnOnce() -> Result<String> + Send + 'static) {
    if let Ok(mut d) = DELIVERY.lock() {
        *d = Some(Box::new(delivery));
    }
}

/// Forgets the registered delivery (the command finished on its own).
pub fn clear() {
    if let Ok(mut d) = DELIVERY.lock() {
        *d = None;
    }
}

/// The `solve` command's observer: shows progress on a terminal (when given one) and keeps
/// the best schedule the solver holds so that an interrupt writes it to `out`, replayed,
/// with its outputs, as not proven optimal.
pub struct SolveInterruptSaver {
    /// Output directory of the solve.
    pub out: PathBuf,
    /// The problem, for the replay.
    pub workload: Workload,
    /// Its limits.
    pub limits: Limits,
    /// Its cost model.
    pub cost: LinearCostModel,
    /// The progress line, on a terminal.
    pub progress: Option<StderrProgress>,
}

impl SolveInterruptSaver {
    /// `options` with this saver as its observer, keeping the progress line when
    /// `options` had an observer (a terminal).
    pub fn observing(
        options: crate::solver::SolveOptions,
        out: PathBuf,
        workload: &Workload,
        limits: Limits,
        cost: &LinearCostModel,
    ) -> crate::solver::SolveOptions {
        let saver = Self {
            out,
            workload: workload.clone(),
            limits,
            cost: cost.clone(),
            progress: options.observer.is_some().then(StderrProgress::default),
        };
        crate::solver::SolveOptions {
            observer: Some(crate::solver::progress::Observer::new(saver)),
            ..options
        }
    }
}

impl SolveObserver for SolveInterruptSaver {
    fn progress(&self, p: &Progress) {
        if let Some(show) = &self.progress {
            show.progress(p);
        }
    }

    fn finished(&self) {
        if let Some(show) = &self.progress {
            show.finished();
        }
    }

    fn incumbent(&self, source: &str, schedule: &Schedule) {
        let (out, w, limits, cost) = (
            self.out.clone(),
            self.workload.clone(),
            self.limits,
            self.cost.clone(),
        );
        let (source, mut schedule) = (source.to_owned(), schedule.clone());
        on_interrupt(move || {
            let r = replay(&w, &limits, &cost, &schedule)?;
            let summary = Summary::from_replay(&r);
            schedule.meta = Some(serde_json::json!({
                "producer": "infersched-solver (interrupted)",
                "source": source,
                "proven_optimal": false,
            }));
            schedule.write(&out.join("schedule.json"))?;
            crate::output::write_replay_outputs(&out, &r, &summary)?;
            Ok(format!(
                "wrote the best schedule found so far ({source}: makespan {:.3} ms, mean latency {:.3} ms; not proven optimal) to {}",
                summary.makespan_s * 1e3,
                summary.mean_e2e_s * 1e3,
                out.display()
            ))
        });
    }
}
