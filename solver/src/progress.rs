//! Progress of long solves, reported to a [`SolveObserver`]: HiGHS writes its log to a
//! file, a thread reads the latest branch-and-bound row and passes incumbent, bound, gap
//! and elapsed time to the observer whenever they change. [`StderrProgress`] is the
//! command line's observer (a one-line display on standard error).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// One progress point of the branch and bound (objective values in the model's unit, ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Best bound.
    pub bound: f64,
    /// Best schedule found so far, if any.
    pub incumbent: Option<f64>,
    /// Relative gap, if reported.
    pub gap_percent: Option<f64>,
    /// Seconds since HiGHS started.
    pub elapsed_s: f64,
}

/// Parses a row of HiGHS's MIP progress table, e.g.
/// ` L       0       0         0   0.00%   27.94289564     36.33488432       23.10%      174     51     64     11938    30.0s`.
pub fn parse_progress_line(line: &str) -> Option<Progress> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let elapsed_s = tokens.last()?.strip_suffix('s')?.parse::<f64>().ok()?;
    let first_pct = tokens.iter().position(|t| t.ends_with('%'))?;
    let bound = tokens.get(first_pct + 1)?.parse::<f64>().ok()?;
    let incumbent = tokens
        .get(first_pct + 2)?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite());
    let gap_percent = tokens
        .get(first_pct + 3)
        .and_then(|t| t.strip_suffix('%'))
        .and_then(|t| t.parse::<f64>().ok());
    Some(Progress {
        bound,
        incumbent,
        gap_percent,
        elapsed_s,
    })
}

/// The text shown for a progress point.
pub fn progress_text(p: &Progress) -> String {
    let inc = p
        .incumbent
        .map_or("none yet".to_string(), |v| format!("{v:.4} ms"));
    let gap = p
        .gap_percent
        .map_or("-".to_string(), |g| format!("{g:.2}%"));
    format!(
        "HiGHS: best schedule {inc}, bound {:.4} ms, gap {gap}, {:.1} s",
        p.bound, p.elapsed_s
    )
}

/// The latest progress point in a log's text.
pub fn latest_progress(log: &str) -> Option<Progress> {
    log.lines().rev().find_map(parse_progress_line)
}

/// Receives a solve's progress (from another thread).
///
/// ```
/// use infersched_solver::progress::{Progress, SolveObserver};
/// struct Count(std::sync::atomic::AtomicUsize);
/// impl SolveObserver for Count {
///     fn progress(&self, _: &Progress) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
/// }
/// ```
pub trait SolveObserver: Send + Sync {
    /// A new progress point (different from the previous one).
    fn progress(&self, p: &Progress);
    /// The solver stopped (called once, after the last `progress`).
    fn finished(&self) {}
    /// A valid schedule the solver holds before its exact methods run (the best of the
    /// heuristic portfolio, by `source`): what an interrupted solve can still deliver.
    fn incumbent(&self, _source: &str, _schedule: &infersched_core::Schedule) {}
}

/// A shared observer, as [`crate::SolveOptions`] holds it (equal when it is the same one).
#[derive(Clone)]
pub struct Observer(pub Arc<dyn SolveObserver>);

impl Observer {
    /// Wraps `observer`.
    pub fn new(observer: impl SolveObserver + 'static) -> Self {
        Self(Arc::new(observer))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl PartialEq for Observer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The command line's observer: redraws one line on standard error and clears it at the
/// end.
#[derive(Debug, Default)]
pub struct StderrProgress {
    shown: std::sync::Mutex<bool>,
}

impl SolveObserver for StderrProgress {
    fn progress(&self, p: &Progress) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{}", progress_text(p));
        let _ = err.flush();
        if let Ok(mut shown) = self.shown.lock() {
            *shown = true;
        }
    }
    fn finished(&self) {
        if self.shown.lock().is_ok_and(|s| *s) {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
        }
    }
}

/// Watches a HiGHS log file and reports new progress points until dropped.
pub(crate) struct ProgressWatcher {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl ProgressWatcher {
    /// Starts watching `path` (created by HiGHS once it logs) for `observer`.
    pub(crate) fn start(path: &Path, observer: Observer) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let watched = path.to_path_buf();
        let handle = std::thread::spawn(move || {
            let mut last: Option<Progress> = None;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                if let Ok(text) = std::fs::read_to_string(&watched)
                    && let Some(p) = latest_progress(&text)
                    && last != Some(p)
                {
                    observer.0.progress(&p);
                    last = Some(p);
                }
            }
            observer.0.finished();
        });
        Self {
            stop,
            handle: Some(handle),
            path: path.to_path_buf(),
        }
    }
}

impl Drop for ProgressWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        seen: std::sync::Mutex<Vec<Progress>>,
        finished: AtomicBool,
    }

    impl SolveObserver for Recorder {
        fn progress(&self, p: &Progress) {
            self.seen.lock().unwrap().push(*p);
        }
        fn finished(&self) {
            self.finished.store(true, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_watcher_reports_each_new_row_once_then_finishes() {
        let dir = std::env::temp_dir().join(format!("infersched-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("highs.log");
        let row = |t: f64| format!(" L 0 0 0 0.00% 27.5 36.25 24.14% 1 1 1 10 {t:.1}s\n");
        std::fs::write(&path, row(1.0)).unwrap();
        let recorder = Arc::new(Recorder::default());
        let watcher = ProgressWatcher::start(&path, Observer(recorder.clone()));
        std::thread::sleep(Duration::from_millis(1200));
        std::fs::write(&path, row(1.0) + &row(2.0)).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        drop(watcher);
        let seen = recorder.seen.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|p| p.elapsed_s).collect::<Vec<_>>(),
            [1.0, 2.0]
        );
        assert_eq!(seen[0].incumbent, Some(36.25));
        assert!(recorder.finished.load(Ordering::Relaxed));
        // The watcher removes the log file it watched.
        assert!(!path.exists());
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn progress_rows_parse_and_other_lines_do_not() {
        let log = "\
Presolving model
        Nodes      |    B&B Tree     |            Objective Bounds              |  Dynamic Constraints |       Work
Src  Proc. InQueue |  Leaves   Expl. | BestBound       BestSol              Gap |   Cuts   InLp Confl. | LpIters     Time
         0       0         0   0.00%   16.60416        inf                  inf        0      0      0         0     5.2s
 L       0       0         0   0.00%   27.94289564     36.33488432       23.10%      174     51     64     11938    30.0s
Solving report
";
        let p = latest_progress(log).unwrap();
        assert_eq!(p.bound, 27.94289564);
        assert_eq!(p.incumbent, Some(36.33488432));
        assert_eq!(p.gap_percent, Some(23.10));
        assert_eq!(p.elapsed_s, 30.0);
        let first = parse_progress_line(log.lines().nth(3).unwrap()).unwrap();
        assert_eq!(first.incumbent, None);
        assert!(parse_progress_line("Presolving model").is_none());
        assert!(parse_progress_line("  Timing            30.04").is_none());
        assert!(progress_text(&p).contains("gap 23.10%"));
    }
}
