//! Running a sweep: one point, a shard of the grid, and the `sweep` command.

use super::lock::lock_output_dir;
use super::plots::sweep_plots;
use super::results::{ResultRow, header_line, read_results, row_line, write_results};
use super::spec::{CONFIRM_GRID_RUNS, Point, Sweep};
use crate::core::Summary;
use crate::produce::{Contender, ProduceWith, RunStatus, produce, produce_cluster_on};
use crate::schedulers::Knobs;
use crate::solver::{Objective, SolveOptions};
use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

impl Sweep {
    /// Runs one point and returns its `results.csv` row.
    pub fn run_point(&self, p: &Point) -> ResultRow {
        let mut row = ResultRow {
            run: p.index,
            key: p.key(),
            m: p.m,
            c: p.c,
            p: p.p,
            r_max: p.r_max,
            input: p.input.clone(),
            output: p.output.clone(),
            n: p.n,
            qps: p.qps,
            time_scale: p.time_scale,
            seed: p.seed,
            cost_model: p.cluster.as_ref().and_then(|c| c.cost_model.clone()),
            replicas: p.cluster.as_ref().map(|c| c.replicas),
            disaggregate: p.split().map(|d| d.to_string()),
            pp: Some(p.pp()).filter(|&pp| pp > 1),
            router: p.cluster.as_ref().map(|c| c.router.name()),
            objective: p.objective.clone(),
            scheduler: p.scheduler,
            status: RunStatus::Error,
            objective_s: None,
            makespan_s: None,
            mean_e2e_s: None,
            mean_ttft_s: None,
            p99_ttft_s: None,
            mean_tpot_s: None,
            throughput_tok_s: None,
            evictions: None,
            recomputed_tokens: None,
            batches: None,
            peak_kv_utilization: None,
            p50_ttft_s: None,
            p90_ttft_s: None,
            p50_tpot_s: None,
            p90_tpot_s: None,
            p99_tpot_s: None,
            p50_e2e_s: None,
            p90_e2e_s: None,
            p99_e2e_s: None,
            p50_tbt_s: None,
            p90_tbt_s: None,
            p99_tbt_s: None,
            slo_attainment: None,
            goodput_requests_per_s: None,
            best_bound_s: None,
            certified_gap: None,
            solve_s: None,
            milp_rows: None,
            milp_columns: None,
            milp_integers: None,
            solve_method: None,
            error: None,
        };
        // A panic in one run (a dependency's included) is that run's error row, so the
        // sweep goes on and `--resume` does not repeat it.
        let measured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.measure(p)))
            .unwrap_or_else(|payload| {
                Err(anyhow::anyhow!(
                    "internal error: this run panicked: {}",
                    crate::solver::panic_message(payload.as_ref())
                ))
            });
        match measured {
            Ok((status, objective, s, solve)) => row.set_measured(status, objective, &s, solve),
            Err(e) => row.error = Some(format!("{e:#}").replace('\n', " ")),
        }
        row
    }

    fn measure(&self, p: &Point) -> Result<(RunStatus, f64, Summary, Option<SolveFacts>)> {
        let w = self.workload(p)?;
        let limits = self.limits(p)?;
        let objective: Objective = p.objective.parse().map_err(anyhow::Error::msg)?;
        let contender = p.scheduler;
        let default = SolveOptions::default();
        let options = SolveOptions {
            time_limit_s: self.spec.time_limit.unwrap_or(default.time_limit_s),
            threads: self.spec.threads.unwrap_or(1),
            mip_rel_gap: self.spec.mip_gap.unwrap_or(1e-6),
            max_search_states: if self.spec.milp_only.unwrap_or(false) {
                0
            } else {
                default.max_search_states
            },
            ..default
        };
        // Heuristics run under exactly the grid point's limits, like the solver.
        let knobs = Knobs::matching(&limits);
        let with = ProduceWith {
            knobs: &knobs,
            limits: &limits,
            objective,
            solve: &options,
        };
        let cost = self.cost_of(p);
        let slos = &self.slos;
        let measure_slos = |summary: &mut Summary, replay: &crate::core::Replay| {
            if !slos.is_empty() {
                summary.slo = Some(crate::core::SloReport::of(replay, slos));
            }
        };
        if let (Some(c), Contender::Heuristic(kind)) = (&p.cluster, contender)
            && let Some(split) = c.disaggregate
        {
            let link = crate::settings::kv_link(cost, None, 0.0)?;
            let pipeline = crate::settings::pipeline(cost, c.pp, None, None)?;
            let on = (cost, &pipeline);
            let mut o = crate::produce::produce_disaggregated_on(
                &w,
                on,
                kind,
                &knobs,
                (split, c.router),
                &link,
            )?;
            measure_slos(&mut o.summary, &o.replay.cluster.merged);
            let value = objective.of(&o.summary);
            return Ok((RunStatus::Heuristic, value, o.summary, None));
        }
        if let (Some(c), Contender::Heuristic(kind)) = (&p.cluster, contender) {
            let pipeline = crate::settings::pipeline(cost, c.pp, None, None)?;
            let cluster = (c.replicas, c.router);
            let mut o = produce_cluster_on(&w, (cost, &pipeline), kind, &knobs, cluster)?;
            measure_slos(&mut o.summary, &o.replay.merged);
            let value = objective.of(&o.summary);
            return Ok((RunStatus::Heuristic, value, o.summary, None));
        }
        let mut outcome = produce(&w, cost, contender, &with)?;
        measure_slos(&mut outcome.summary, &outcome.replay);
        let (status, solve) = match &outcome.solve {
            None => (RunStatus::Heuristic, None),
            Some(r) => (
                RunStatus::Solver(r.status),
                Some(SolveFacts {
                    method: r.method,
                    best_bound: r.best_bound,
                    certified_gap: r.certified_gap,
                    solve_s: r.solve_s,
                    model: r.model,
                }),
            ),
        };
        let s = outcome.summary;
        Ok((status, objective.of(&s), s, solve))
    }
}

impl ResultRow {
    /// Fills the row's status, objective, metrics (from `s`) and, for a solve, its facts.
    fn set_measured(
        &mut self,
        status: RunStatus,
        objective: f64,
        s: &Summary,
        solve: Option<SolveFacts>,
    ) {
        self.status = status;
        self.objective_s = Some(objective);
        self.makespan_s = Some(s.makespan_s);
        self.mean_e2e_s = Some(s.mean_e2e_s);
        self.mean_ttft_s = Some(s.mean_ttft_s);
        self.p99_ttft_s = Some(s.ttft_s.p99);
        self.mean_tpot_s = s.mean_tpot_s;
        self.throughput_tok_s = s.throughput_tok_s;
        self.evictions = Some(s.evictions);
        self.recomputed_tokens = Some(s.recomputed_tokens);
        self.batches = Some(s.batches as u64);
        self.peak_kv_utilization = s.peak_kv_utilization;
        (self.p50_ttft_s, self.p90_ttft_s) = (Some(s.ttft_s.p50), Some(s.ttft_s.p90));
        let tpot = s.tpot_s.as_ref();
        self.p50_tpot_s = tpot.map(|d| d.p50);
        self.p90_tpot_s = tpot.map(|d| d.p90);
        self.p99_tpot_s = tpot.map(|d| d.p99);
        (self.p50_e2e_s, self.p90_e2e_s) = (Some(s.e2e_s.p50), Some(s.e2e_s.p90));
        self.p99_e2e_s = Some(s.e2e_s.p99);
        let tbt = s.tbt_s.as_ref();
        (self.p50_tbt_s, self.p90_tbt_s) = (tbt.map(|d| d.p50), tbt.map(|d| d.p90));
        self.p99_tbt_s = s.p99_tbt_s;
        self.slo_attainment = s.slo.as_ref().map(|r| r.attainment);
        self.goodput_requests_per_s = s.slo.as_ref().and_then(|r| r.goodput_requests_per_s);
        if let Some(x) = solve {
            self.best_bound_s = Some(x.best_bound);
            self.certified_gap = Some(x.certified_gap);
            self.solve_s = Some(x.solve_s);
            self.milp_rows = x.model.map(|m| m.rows);
            self.milp_columns = x.model.map(|m| m.columns);
            self.milp_integers = x.model.map(|m| m.integers);
            self.solve_method = Some(x.method.name().to_string());
        }
    }
}

/// What a sweep row records of a MILP solve.
#[derive(Debug, Clone, Copy)]
struct SolveFacts {
    method: crate::solver::SolveMethod,
    best_bound: f64,
    certified_gap: f64,
    solve_s: f64,
    model: Option<crate::solver::ModelSize>,
}

/// Parses `K/N` (1 <= K <= N).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let err = || anyhow::anyhow!("--shard: expected K/N with 1 <= K <= N, e.g. 2/4; got \"{s}\"");
    let (k, n) = s.split_once('/').ok_or_else(err)?;
    let (k, n): (usize, usize) = (
        k.trim().parse().map_err(|_| err())?,
        n.trim().parse().map_err(|_| err())?,
    );
    if k == 0 || n == 0 || k > n {
        return Err(err());
    }
    Ok((k, n))
}

/// The points of shard `k` of `n` (1-based): every n-th point starting at k - 1.
pub fn shard(points: &[Point], k: usize, n: usize) -> Vec<Point> {
    points
        .iter()
        .filter(|p| p.index % n == k - 1)
        .cloned()
        .collect()
}

/// What a sweep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Runs in this shard.
    pub planned: usize,
    /// Runs skipped because results.csv had them.
    pub skipped: usize,
    /// Runs done now.
    pub ran: usize,
    /// Of those, runs that failed (status `error`).
    pub failed: usize,
    /// Plots written.
    pub plots: Vec<PathBuf>,
}

/// The keys of the rows a resumed sweep keeps in `results_path`: the first row of each
/// key of this grid; duplicates (from an older version without the lock) and rows of
/// another grid are dropped, and said so; a file of an earlier version (fewer columns)
/// is rewritten in this version's columns before rows of them are appended.
fn resumed_keys(sweep: &Sweep, results_path: &Path) -> Result<HashSet<String>> {
    let grid: HashSet<String> = sweep.points.iter().map(Point::key).collect();
    let recs = read_results(results_path)?;
    let total = recs.len();
    let mut done = HashSet::new();
    let mut kept = Vec::with_capacity(total);
    let (mut duplicates, mut foreign) = (0, 0);
    for rec in recs {
        if !grid.contains(&rec.key) {
            foreign += 1;
        } else if done.insert(rec.key.clone()) {
            kept.push(rec);
        } else {
            duplicates += 1;
        }
    }
    if kept.len() < total {
        eprintln!(
            "{}: dropped {duplicates} duplicate rows and {foreign} rows not in this grid",
            results_path.display()
        );
        write_results(results_path, &kept)?;
    } else if !std::fs::read(results_path)?.starts_with(&header_line()?) {
        write_results(results_path, &kept)?;
    }
    Ok(done)
}

/// Runs `sweep` (or one shard of it) into `out`; see the module docs.
pub fn run(
    sweep: &Sweep,
    out: &Path,
    resume: bool,
    shard_of: Option<(usize, usize)>,
    jobs: Option<usize>,
    progress: bool,
) -> Result<SweepOutcome> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Held until this function returns: one sweep per output directory at a time.
    let _lock = lock_output_dir(out)?;
    let results_path = out.join("results.csv");
    crate::core::io::refuse_links(&[&results_path])?;
    crate::core::io::refuse_links(&super::plots::plot_paths(sweep, &out.join("plots")))?;
    let points = match shard_of {
        Some((k, n)) => shard(&sweep.points, k, n),
        None => sweep.points.clone(),
    };
    let done = if results_path.exists() {
        if !resume {
            bail!(
                "{} exists; pass --resume to continue that sweep, or choose another --out",
                results_path.display()
            );
        }
        resumed_keys(sweep, &results_path)?
    } else {
        crate::core::io::write_bytes_atomic(&results_path, &header_line()?)?;
        HashSet::new()
    };
    let todo: Vec<&Point> = points.iter().filter(|p| !done.contains(&p.key())).collect();
    let skipped = points.len() - todo.len();
    let file = Mutex::new(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&results_path)
            .with_context(|| format!("opening {}", results_path.display()))?,
    );
    let bar = if progress {
        indicatif::ProgressBar::new(todo.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {pos}/{len} runs, ETA {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.unwrap_or(0))
        .build()?;
    let write_result: Result<()> = pool.install(|| {
        todo.par_iter().try_for_each(|p| -> Result<()> {
            let row = sweep.run_point(p);
            if row.failed() {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                bar.println(format!(
                    "run {} ({}): {}",
                    p.index,
                    p.key(),
                    row.error.as_deref().unwrap_or_default()
                ));
            }
            let line = row_line(&row)?;
            let mut f = file.lock().expect("no panics while holding the lock");
            f.write_all(&line)?;
            f.flush()?;
            drop(f);
            bar.inc(1);
            Ok(())
        })
    });
    bar.finish_and_clear();
    write_result.with_context(|| format!("appending to {}", results_path.display()))?;
    // Deterministic final file: the records sorted by run index.
    let mut recs = read_results(&results_path)?;
    recs.sort_by_key(|r| r.run);
    write_results(&results_path, &recs)?;
    let plots = sweep_plots(sweep, &recs);
    let plot_paths = crate::report::write_plots(&out.join("plots"), &plots)?;
    Ok(SweepOutcome {
        planned: points.len(),
        skipped,
        ran: todo.len(),
        failed: failed.into_inner(),
        plots: plot_paths,
    })
}

/// The most parallel runs `--jobs` accepts.
pub const MAX_JOBS: usize = 1024;

/// The `sweep` command.
pub fn run_cli(
    spec: &Path,
    out: &Path,
    resume: bool,
    shard_arg: Option<&str>,
    jobs: Option<usize>,
    yes: bool,
) -> Result<()> {
    if let Some(j) = jobs
        && (j == 0 || j > MAX_JOBS)
    {
        bail!(
            "--jobs: expected 1 to {MAX_JOBS} parallel runs (this machine has {} CPUs), got {j}",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
    }
    let sweep = Sweep::load(spec)?;
    let shard_of = shard_arg.map(parse_shard).transpose()?;
    if sweep.points.len() > CONFIRM_GRID_RUNS && !yes {
        bail!(
            "{}: the grid has {} runs; pass --yes to run more than {CONFIRM_GRID_RUNS}",
            spec.display(),
            sweep.points.len()
        );
    }
    let started = Instant::now();
    eprintln!(
        "sweep {}: {} runs in the grid{}; swept: {}",
        spec.display(),
        sweep.points.len(),
        shard_of.map_or(String::new(), |(k, n)| format!(", shard {k}/{n}")),
        if sweep.swept.is_empty() {
            "nothing (one setting)".to_string()
        } else {
            sweep.swept.join(", ")
        }
    );
    let o = run(&sweep, out, resume, shard_of, jobs, true)?;
    println!(
        "{} runs: {} ran now ({} failed), {} already in results.csv; {:.1} s",
        o.planned,
        o.ran,
        o.failed,
        o.skipped,
        started.elapsed().as_secs_f64()
    );
    println!("results: {}", out.join("results.csv").display());
    println!(
        "plots:   {} files in {}",
        o.plots.len(),
        out.join("plots").display()
    );
    if o.failed > 0 {
        bail!("{} runs failed (their rows say why)", o.failed);
    }
    Ok(())
}
