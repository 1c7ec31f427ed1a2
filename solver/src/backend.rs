//! The HiGHS backend: the one place that configures HiGHS, runs a model on its own thread
//! within a time limit and its grace, and reads its answer (dual bound, node count).
//! The exact methods build their models with good_lp and hand them here; nothing else in
//! the crate sets a HiGHS option.

use std::path::Path;

/// How HiGHS logs a run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Log<'a> {
    /// Nothing.
    Quiet,
    /// To stdout (`--log`).
    Console,
    /// To this file, which a progress watcher reads.
    File(&'a Path),
}

/// The settings of one HiGHS run. Every run is seeded (seed 0), so its answer does not
/// change from run to run on the same thread count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings<'a> {
    /// Seconds HiGHS may run (it checks its clock between phases; see [`grace_s`]).
    pub time_limit_s: f64,
    /// Threads.
    pub threads: u32,
    /// The relative MIP gap at which it stops.
    pub mip_rel_gap: f64,
    /// The absolute MIP gap at which it stops (HiGHS's default where None).
    pub mip_abs_gap: Option<f64>,
    /// Whether the feasibility-jump heuristic runs: it does not check the clock (on
    /// family (a) with C, 267,719 columns, it ran 16 s into a 5 s limit).
    pub feasibility_jump: bool,
    /// Branch on pseudo-costs once this many observations make them reliable (HiGHS's
    /// default, strong branching until then, where None).
    pub pscost_min_reliable: Option<i32>,
    /// Whether presolve runs (HiGHS's presolve checks the clock rarely on large models).
    pub presolve: bool,
    /// Where it logs.
    pub log: Log<'a>,
}

/// Applies `settings` to `model`.
pub(crate) fn configure(model: &mut highs::Model, settings: &Settings<'_>) {
    model.make_quiet();
    match settings.log {
        Log::Quiet => {}
        Log::Console => {
            model.set_option("output_flag", true);
            model.set_option("log_to_console", true);
        }
        Log::File(path) => {
            if let Some(p) = path.to_str() {
                model.set_option("output_flag", true);
                model.set_option("log_to_console", false);
                model.set_option("log_file", p.as_bytes());
            }
        }
    }
    model.set_option("time_limit", settings.time_limit_s);
    model.set_option("threads", settings.threads.max(1) as i32);
    model.set_option("mip_rel_gap", settings.mip_rel_gap);
    if let Some(gap) = settings.mip_abs_gap {
        model.set_option("mip_abs_gap", gap);
    }
    model.set_option("random_seed", 0);
    if !settings.feasibility_jump {
        model.set_option("mip_heuristic_run_feasibility_jump", false);
    }
    if let Some(n) = settings.pscost_min_reliable {
        model.set_option("mip_pscost_minreliable", n);
    }
    if !settings.presolve {
        model.set_option("presolve", "off");
    }
}

/// Runs `model` for its time limit `time_limit_s` and the grace after it ([`grace_s`]):
/// HiGHS's answer, or None when it is still running then.
pub(crate) fn run(
    model: highs::Model,
    time_limit_s: f64,
) -> Option<Result<highs::SolvedModel, highs::HighsStatus>> {
    solve_within(model, time_limit_s + grace_s(time_limit_s))
}

/// HiGHS's dual bound on a solved MIP, where it has a finite one (in the model's units).
pub(crate) fn dual_bound(solved: &highs::SolvedModel) -> Option<f64> {
    solved
        .double_info_value(c"mip_dual_bound")
        .ok()
        .filter(|b| b.is_finite())
}

/// How long past its time limit HiGHS may run before its run is abandoned: 10% of the
/// limit, at least 5 s. HiGHS checks its clock between phases, but some root-node
/// heuristics run without looking: on family (a) with C = 64 (267,719 columns), the
/// central rounding's line search (a domain propagation per step) ran more than 8 minutes
/// past a 200 s limit.
pub(crate) fn grace_s(time_limit_s: f64) -> f64 {
    (0.1 * time_limit_s).max(5.0)
}

/// A HiGHS model moved to the thread that solves it.
struct OnSolverThread<T>(T);

// SAFETY: a HiGHS instance has no thread affinity. The model (and the solved model it
// becomes) is moved whole to one thread and back, never shared or used by two threads.
#[allow(unsafe_code)]
unsafe impl<T> Send for OnSolverThread<T> {}

/// Solves `model` on its own thread, waiting at most `wait_s` seconds: HiGHS's answer, or
/// None when it is still running then (its thread is left to finish on its own; the
/// process exits without waiting for it). The model's only links to this thread are
/// owned: no callback refers to anything here.
pub(crate) fn solve_within(
    model: highs::Model,
    wait_s: f64,
) -> Option<Result<highs::SolvedModel, highs::HighsStatus>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let job = OnSolverThread(model);
    let spawned = std::thread::Builder::new()
        .name("highs".into())
        .spawn(move || {
            let job = job;
            let solved = job.0.try_solve().map(OnSolverThread);
            let _ = tx.send(solved);
        });
    if spawned.is_err() {
        return Some(Err(highs::HighsStatus::Error));
    }
    let wait =
        std::time::Duration::try_from_secs_f64(wait_s.max(0.0)).unwrap_or(std::time::Duration::MAX);
    match rx.recv_timeout(wait) {
        Ok(solved) => Some(solved.map(|s| s.0)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        // The thread ended without an answer (it panicked): HiGHS failed.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Some(Err(highs::HighsStatus::Error))
        }
    }
}

/// HiGHS's branch-and-bound node count. It is an `int64` info item, which the `highs`
/// crate's `int_info_value` (HighsInt only) cannot read: asking it that way fails and
/// prints an error on stderr, so read it through the C API's int64 getter.
#[allow(unsafe_code)]
pub(crate) fn mip_node_count(solved: &highs::SolvedModel) -> Option<i64> {
    let mut value: i64 = -1;
    // SAFETY: `solved` owns a live Highs instance for the duration of the call; the name
    // is a NUL-terminated string and `value` a valid i64 the call writes into.
    let status = unsafe {
        highs_sys::Highs_getInt64InfoValue(solved.as_ptr(), c"mip_node_count".as_ptr(), &mut value)
    };
    (status == highs_sys::kHighsStatusOk && value >= 0).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use good_lp::{ProblemVariables, SolverModel, constraint, variable};
    use std::time::Instant;

    /// A small knapsack: maximise sum v_i x_i with sum w_i x_i <= cap, as a HiGHS model.
    fn knapsack(items: usize) -> highs::Model {
        let mut vars = ProblemVariables::new();
        let x: Vec<_> = (0..items).map(|_| vars.add(variable().binary())).collect();
        let value = |i: usize| ((i * 37) % 23 + 1) as f64;
        let weight = |i: usize| ((i * 53) % 19 + 2) as f64;
        let objective: good_lp::Expression = x.iter().enumerate().map(|(i, &v)| value(i) * v).sum();
        let load: good_lp::Expression = x.iter().enumerate().map(|(i, &v)| weight(i) * v).sum();
        let mut problem = vars.maximise(objective).using(good_lp::highs);
        problem.add_constraint(constraint!(load <= (items as f64) * 2.5));
        let mut model = problem.into_inner();
        model.make_quiet();
        model.set_option("threads", 1);
        model
    }

    #[test]
    fn a_solve_within_its_wait_returns_highs_answer() {
        let solved = solve_within(knapsack(3), 60.0).unwrap().unwrap();
        // Capacity 7.5: items of weight 2 (value 1), 17 (15), 13 (6): only the first fits.
        assert_eq!(solved.status(), highs::HighsModelStatus::Optimal);
        assert!((solved.objective_value() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_configured_run_answers_and_reads_its_dual_bound() {
        let mut model = knapsack(3);
        let settings = Settings {
            time_limit_s: 60.0,
            threads: 1,
            mip_rel_gap: 1e-6,
            mip_abs_gap: Some(1e-9),
            feasibility_jump: false,
            pscost_min_reliable: Some(0),
            presolve: false,
            log: Log::Quiet,
        };
        configure(&mut model, &settings);
        let solved = run(model, settings.time_limit_s).unwrap().unwrap();
        assert_eq!(solved.status(), highs::HighsModelStatus::Optimal);
        // Maximising 1: the dual bound closes on it.
        let bound = dual_bound(&solved).unwrap();
        assert!((bound - 1.0).abs() < 1e-6, "{bound}");
    }

    #[test]
    fn a_solve_past_its_wait_is_abandoned() {
        // No time at all to answer: the caller gets None at once, whatever HiGHS does.
        let t = Instant::now();
        assert!(solve_within(knapsack(400), 0.0).is_none());
        assert!(t.elapsed().as_secs_f64() < 5.0);
    }

    #[test]
    fn the_grace_is_a_tenth_of_the_limit_and_at_least_five_seconds() {
        assert_eq!(grace_s(10.0), 5.0);
        assert_eq!(grace_s(200.0), 20.0);
    }
}
