//! `compare`: the optimal scheduler and heuristics on one workload and one cost model, each
//! schedule measured by the independent replay under the limits it ran under.
//!
//! Each heuristic runs with [`CompareSpec::knobs`] and its own defaults for the knobs left
//! unset, exactly as `simulate` runs it (same flags, same schedule); the optimal scheduler
//! runs under [`CompareSpec::limits`], the limits set explicitly. A heuristic's effective
//! limits are never looser than those (its knobs include them), so the optimum is the best
//! schedule under the GPU's and the user's limits, and a ratio to it includes the cost of
//! the policy's own defaults (its token budget, running-set cap, block size, watermark).
//! [`Knobs::matching`] runs every heuristic under exactly `limits` instead.

use crate::core::io::write_bytes_atomic;
use crate::core::{Limits, Workload};
use crate::cost_model::{LinearCostModel, TimeBreakdown};
pub use crate::produce::{Contender, Outcome};
use crate::produce::{ProduceWith, RunStatus, produce};
use crate::schedulers::Knobs;
use crate::solver::{Objective, SolveOptions};
use rayon::prelude::*;
use serde::Serialize;
use std::io::{self, Write};
use std::path::Path;

/// What to compare and how.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    /// The schedulers, in output order.
    pub contenders: Vec<Contender>,
    /// The objective ratios refer to (and the MILP minimizes).
    pub objective: Objective,
    /// The limits the optimal scheduler runs under (the MILP has no policy defaults).
    pub limits: Limits,
    /// The heuristics' knobs: each runs under [`SchedulerKind::limits`] of them (these
    /// where set, its defaults elsewhere). Must set at least what `limits` sets.
    pub knobs: Knobs,
    /// Options for the MILP.
    pub solve: SolveOptions,
    /// Service-level objectives each row's attainment and goodput are measured against
    /// (none: no SLO columns are filled).
    pub slos: Vec<crate::core::Slo>,
    /// Replicas and routers (`--replicas N`, N > 1): every heuristic runs on each
    /// replica behind each router, the solver is the cluster search (`solve --replicas`,
    /// once: it searches routings). None: one replica.
    pub cluster: Option<ClusterRun>,
}

/// The cluster a comparison runs its contenders on.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterRun {
    /// Replicas (more than one).
    pub replicas: u32,
    /// The routers every heuristic runs behind, in output order (at least one).
    pub routers: Vec<crate::schedulers::Router>,
}

/// One contender's run: behind which router (where several are compared) and what it
/// gave.
#[derive(Debug, Clone)]
pub struct ContenderRun {
    /// What ran.
    pub contender: Contender,
    /// The router it ran behind, where the comparison has several (None otherwise, and
    /// for the solver, which searches routings).
    pub router: Option<crate::schedulers::Router>,
    /// Its outcome, or why it failed.
    pub result: Result<Outcome, String>,
}

impl ContenderRun {
    /// Its name in files and folders: the contender's, `@router` where it has one
    /// (`vllm-v1@least-outstanding`).
    pub fn name(&self) -> String {
        match self.router {
            Some(r) => format!("{}@{r}", self.contender.name()),
            None => self.contender.name().to_string(),
        }
    }
}

/// The result of a comparison: per contender an outcome or the reason it failed.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Objective compared.
    pub objective: Objective,
    /// The optimal scheduler's limits (each outcome has its own).
    pub limits: Limits,
    /// In the order of [`CompareSpec::contenders`], each heuristic behind each router in
    /// turn.
    pub results: Vec<ContenderRun>,
    /// With SLOs: the most requests any schedule can have meet every SLO on their own
    /// values (`ceiling::most_requests_meeting`, under the solver's limits, which no
    /// heuristic's loosen), so the best possible goodput is at most this many.
    pub most_meeting_slos: Option<usize>,
    /// With SLOs: the most requests meeting every SLO in a schedule found, and what found
    /// it (a contender, or the goodput search), so the best possible goodput is at least
    /// this many.
    pub best_found_meeting_slos: Option<(usize, String)>,
    /// With SLOs on one replica: the goodput search's best schedule ([`crate::goodput`]).
    pub goodput_search: Option<crate::goodput::GoodputFound>,
}

/// Requests the goodput search of `compare` simulates in all (about 3 microseconds each
/// with its replay on this project's 2-core machine: at most about 12 s).
pub const GOODPUT_SEARCH_BUDGET: usize = 4_000_000;

/// Runs every contender and replays each schedule: the heuristics first (in parallel),
/// then the solver (and any solver of a class), seeded with the heuristics' schedules: one
/// run under its own defaults that is better and in the solver's class is the solver's
/// answer, named as such, with the solver's bound.
pub fn run(w: &Workload, cost: &LinearCostModel, spec: &CompareSpec) -> Comparison {
    // Each heuristic behind each router (named by it where there are several).
    let routers: Vec<Option<crate::schedulers::Router>> = match &spec.cluster {
        Some(c) if c.routers.len() > 1 => c.routers.iter().copied().map(Some).collect(),
        _ => vec![None],
    };
    let jobs: Vec<(Contender, Option<crate::schedulers::Router>)> = spec
        .contenders
        .iter()
        .filter(|c| !c.is_solver())
        .flat_map(|&c| routers.iter().map(move |&r| (c, r)))
        .collect();
    let heuristics: Vec<ContenderRun> = jobs
        .into_par_iter()
        .map(|(contender, router)| ContenderRun {
            contender,
            router,
            result: run_one(w, cost, spec, (&spec.solve, router), contender),
        })
        .collect();
    // The heuristics' schedules seed the single-replica solver (a cluster's are per
    // replica; the cluster search runs every heuristic itself).
    let seeds: Vec<(String, crate::core::Schedule)> = heuristics
        .iter()
        .filter(|_| spec.cluster.is_none())
        .filter_map(|run| {
            let o = run.result.as_ref().ok()?;
            let name = format!(
                "{} (its own schedule, replayed under these limits)",
                run.contender
            );
            Some((name, o.schedule.clone()))
        })
        .collect();
    let seeded = SolveOptions {
        seeds,
        ..spec.solve.clone()
    };
    let solvers: Vec<ContenderRun> = spec
        .contenders
        .par_iter()
        .filter(|c| c.is_solver())
        .map(|&contender| ContenderRun {
            contender,
            router: None,
            result: run_one(w, cost, spec, (&seeded, None), contender),
        })
        .collect();
    // In the order of the contenders (each heuristic's routers in turn).
    let mut all: Vec<_> = heuristics.into_iter().chain(solvers).collect();
    all.sort_by_key(|run| {
        let c = spec.contenders.iter().position(|x| *x == run.contender);
        (c, routers.iter().position(|r| *r == run.router))
    });
    let replicas = spec.cluster.as_ref().map_or(1, |c| c.replicas);
    let most_meeting_slos = (!spec.slos.is_empty()).then(|| {
        crate::ceiling::most_requests_meeting(w, &spec.limits, cost, replicas, &spec.slos)
    });
    let goodput_search = (!spec.slos.is_empty() && spec.cluster.is_none())
        .then(|| crate::goodput::search(w, &spec.limits, cost, &spec.slos, GOODPUT_SEARCH_BUDGET))
        .flatten();
    let best_found_meeting_slos = best_found_meeting(&all, goodput_search.as_ref());
    Comparison {
        objective: spec.objective,
        limits: spec.limits,
        results: all,
        most_meeting_slos,
        best_found_meeting_slos,
        goodput_search,
    }
}

/// The most requests meeting every SLO in any contender's schedule or the search's (ties
/// to the first contender), with what found it.
fn best_found_meeting(
    results: &[ContenderRun],
    search: Option<&crate::goodput::GoodputFound>,
) -> Option<(usize, String)> {
    let contenders = results.iter().filter_map(|run| {
        let good = run
            .result
            .as_ref()
            .ok()?
            .summary
            .slo
            .as_ref()?
            .good_requests;
        let by = match run.router {
            Some(r) => format!("{}@{r}", run.contender),
            None => run.contender.to_string(),
        };
        Some((good, by))
    });
    let searched = search.map(|f| (f.meeting, format!("goodput search ({})", f.method)));
    contenders
        .chain(searched)
        .fold(None, |best: Option<(usize, String)>, (k, by)| match best {
            Some(b) if b.0 >= k => Some(b),
            _ => Some((k, by)),
        })
}

/// Runs contender `c`; on a cluster behind `router` (the first of the spec's where None).
fn run_one(
    w: &Workload,
    cost: &LinearCostModel,
    spec: &CompareSpec,
    (solve, router): (&SolveOptions, Option<crate::schedulers::Router>),
    c: Contender,
) -> Result<Outcome, String> {
    let with = ProduceWith {
        knobs: &spec.knobs,
        limits: &spec.limits,
        objective: spec.objective,
        solve,
    };
    let mut o = match &spec.cluster {
        Some(cluster) => {
            let router = router.unwrap_or(cluster.routers[0]);
            crate::produce::produce_on_cluster(w, cost, c, &with, (cluster.replicas, router))
        }
        None => produce(w, cost, c, &with),
    }
    .map_err(|e| e.to_string())?;
    if !spec.slos.is_empty() {
        o.summary.slo = Some(crate::core::SloReport::of(&o.replay, &spec.slos));
    }
    Ok(o)
}

/// A scalar distribution in the comparison table.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Quantiles {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl From<&crate::core::Distribution> for Quantiles {
    fn from(d: &crate::core::Distribution) -> Self {
        Self {
            mean: d.mean,
            p50: d.p50,
            p90: d.p90,
            p99: d.p99,
        }
    }
}

/// One row of `comparison.csv` / `comparison.json`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ComparisonRow {
    /// The contender that ran (`contender` in files).
    #[serde(rename = "contender")]
    pub scheduler: Contender,
    /// What the row is called in tables, plots and files (`scheduler` there): the
    /// contender's name, except that the solver's schedule without a proof is
    /// `best-found` (never `optimal`), and `@router` where several routers are compared.
    #[serde(rename = "scheduler")]
    pub label: String,
    /// The router it ran behind, where several are compared.
    pub router: Option<String>,
    /// The solver's method that produced the schedule (none for a heuristic).
    pub method: Option<String>,
    /// Whether the contender reads the true output lengths (the solver, MC-SF).
    pub clairvoyant: bool,
    /// `heuristic`, or the solver's status (`optimal`, `time-limit`, `no-solution`,
    /// `not-proven`).
    pub status: RunStatus,
    /// The objective's value in the replay (s).
    pub objective_s: f64,
    /// objective / the optimal scheduler's objective (when it ran): a ratio to the
    /// optimum only when that row's status is `optimal`, else to the best schedule found
    /// (see [`optimum_proven`]).
    pub ratio_to_optimum: Option<f64>,
    /// objective / the MILP's best bound (when it ran): an upper bound on the true ratio.
    pub ratio_to_bound: Option<f64>,
    /// Makespan (s).
    pub makespan_s: f64,
    /// Output tokens per second.
    pub throughput_tok_s: Option<f64>,
    /// TTFT (s).
    pub ttft_s: Quantiles,
    /// TPOT (s), when some O > 1.
    pub tpot_s: Option<Quantiles>,
    /// End-to-end latency (s).
    pub e2e_s: Quantiles,
    /// Evictions.
    pub evictions: u64,
    /// Tokens processed again after evictions.
    pub recomputed_tokens: u64,
    /// Tokens taken from the prefix cache (vllm-v1's or vllm's prefix caching). The
    /// solver's schedules and bounds take nothing from a cache, so a row with cached tokens
    /// has no ratio to them.
    pub cached_tokens: u64,
    /// Whether it ran under vLLM v0's cache rule, which shares the KV blocks of prompts
    /// with a common prefix even where none takes them from the cache (less memory than
    /// the solver's model counts): no ratio to the solver's optimum and bound either.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shares_kv_blocks: bool,
    /// Batches.
    pub batches: usize,
    /// Mean processing entries per busy batch.
    pub mean_batch_size: f64,
    /// Peak KV tokens.
    pub peak_kv_tokens: u64,
    /// Peak KV / M.
    pub peak_kv_utilization: Option<f64>,
    /// Mean KV / M over busy batches.
    pub mean_kv_utilization: Option<f64>,
    /// MILP: its certified gap.
    pub certified_gap: Option<f64>,
    /// MILP: its best bound (s).
    pub best_bound_s: Option<f64>,
    /// The limits it ran under.
    pub limits: Limits,
    /// Where its makespan goes (the cost model's terms and idle time).
    pub time_split: TimeBreakdown,
    /// With `--slo`: the share of requests meeting every SLO.
    pub slo_attainment: Option<f64>,
    /// With `--slo`: requests meeting every SLO per second of makespan.
    pub goodput_requests_per_s: Option<f64>,
    /// With `--slo`: whether every SLO holds over all requests.
    pub slos_hold: Option<bool>,
    /// With `--slo`: the requests meeting every SLO over the most any schedule can have
    /// ([`Comparison::most_meeting_slos`]): at least this share of the best possible
    /// goodput.
    pub goodput_of_best_possible: Option<f64>,
}

impl ComparisonRow {
    /// The row's name for people: its label, with `*` where it is clairvoyant and `^`
    /// where it took tokens from the prefix cache.
    pub fn display_name(&self) -> String {
        let star = if self.clairvoyant { "*" } else { "" };
        let hat = if self.uses_prefix_cache() { "^" } else { "" };
        format!("{}{star}{hat}", self.label)
    }

    /// Whether a prefix cache saved it work or memory (then the solver's optimum and bound,
    /// which have none, do not cover it).
    pub fn uses_prefix_cache(&self) -> bool {
        self.cached_tokens > 0 || self.shares_kv_blocks
    }
}

/// Whether `o`'s schedule (or a replica's) follows vLLM v0's prefix-cache rule.
fn follows_v0_cache(o: &Outcome) -> bool {
    let v0 = |s: &crate::core::Schedule| s.prefix_cache == Some(crate::core::CacheRule::VllmV0);
    v0(&o.schedule)
        || o.cluster
            .as_ref()
            .is_some_and(|c| c.schedules.iter().any(v0))
}

/// The name a row goes by: the contender's, except that the solver's schedule without a
/// proof is `best-found` (with its class: `best-found+no-evict`).
pub fn row_label(c: Contender, status: RunStatus) -> String {
    let name = c.to_string();
    match name.strip_prefix(crate::produce::OPTIMAL) {
        Some(class) if c.is_solver() && !status.proven_optimal() => format!("best-found{class}"),
        _ => name,
    }
}

/// Whether the rows hold a proven optimum (the `optimal` row with status `optimal`);
/// without one, ratios to the `optimal` row are ratios to the best schedule found and
/// only the ratios to the bound are proven.
pub fn optimum_proven(rows: &[ComparisonRow]) -> bool {
    rows.iter()
        .any(|r| r.scheduler.is_solver() && r.status.proven_optimal())
}

/// What the ratios divide by, for headers and titles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// The `optimal` row, proven optimal.
    Optimum,
    /// The `optimal` row without a proof: the best schedule the solver found.
    BestFound,
    /// No solver ran.
    NoSolver,
}

/// The reference of `rows`' ratios (see [`optimum_proven`]).
pub fn reference(rows: &[ComparisonRow]) -> Reference {
    if optimum_proven(rows) {
        Reference::Optimum
    } else if rows.iter().any(|r| r.scheduler.is_solver()) {
        Reference::BestFound
    } else {
        Reference::NoSolver
    }
}

impl Comparison {
    /// The MILP's outcome, if it ran and succeeded.
    pub fn optimal(&self) -> Option<&Outcome> {
        self.results
            .iter()
            .find_map(|run| match (run.contender, &run.result) {
                (Contender::Optimal(_), Ok(o)) => Some(o),
                _ => None,
            })
    }

    /// Successful outcomes with their names ([`ContenderRun::name`]), in order.
    pub fn succeeded(&self) -> Vec<(String, &Outcome)> {
        self.results
            .iter()
            .filter_map(|run| run.result.as_ref().ok().map(|o| (run.name(), o)))
            .collect()
    }

    /// Failed contenders with their errors.
    pub fn failures(&self) -> Vec<(String, &str)> {
        self.results
            .iter()
            .filter_map(|run| run.result.as_ref().err().map(|e| (run.name(), e.as_str())))
            .collect()
    }

    /// The table rows, one per successful contender.
    pub fn rows(&self) -> Vec<ComparisonRow> {
        let opt = self.optimal();
        let opt_value = opt.map(|o| self.objective.of(&o.summary));
        let bound = opt.and_then(Outcome::solver_result).map(|r| r.1);
        self.results
            .iter()
            .filter_map(|run| run.result.as_ref().ok().map(|o| (run, o)))
            .map(|(run, o)| {
                let contender = run.contender;
                let s = &o.summary;
                let v = self.objective.of(s);
                // A schedule that took tokens from the prefix cache is outside what the
                // solver's optimum and bound cover: no ratio to them.
                let shares_kv_blocks = follows_v0_cache(o);
                let comparable = s.cached_tokens == 0 && !shares_kv_blocks;
                let ratio = |d: Option<f64>| d.filter(|d| *d > 0.0 && comparable).map(|d| v / d);
                let status = RunStatus::of(o);
                let label = row_label(contender, status);
                ComparisonRow {
                    scheduler: contender,
                    label: match run.router {
                        Some(r) => format!("{label}@{r}"),
                        None => label,
                    },
                    router: run.router.map(|r| r.name()),
                    method: o.solver_result().map(|r| r.0),
                    clairvoyant: contender.clairvoyant(),
                    status,
                    objective_s: v,
                    ratio_to_optimum: ratio(opt_value),
                    ratio_to_bound: ratio(bound),
                    makespan_s: s.makespan_s,
                    throughput_tok_s: s.throughput_tok_s,
                    ttft_s: (&s.ttft_s).into(),
                    tpot_s: s.tpot_s.as_ref().map(Into::into),
                    e2e_s: (&s.e2e_s).into(),
                    evictions: s.evictions,
                    recomputed_tokens: s.recomputed_tokens,
                    cached_tokens: s.cached_tokens,
                    shares_kv_blocks,
                    batches: s.batches,
                    mean_batch_size: s.mean_batch_size,
                    peak_kv_tokens: s.peak_kv_tokens,
                    peak_kv_utilization: s.peak_kv_utilization,
                    mean_kv_utilization: s.mean_kv_utilization,
                    certified_gap: o.solver_result().map(|r| r.2),
                    best_bound_s: o.solver_result().map(|r| r.1),
                    limits: o.limits,
                    time_split: o.time_split,
                    slo_attainment: s.slo.as_ref().map(|r| r.attainment),
                    goodput_requests_per_s: s.slo.as_ref().and_then(|r| r.goodput_requests_per_s),
                    slos_hold: s.slo.as_ref().map(|r| r.all_hold),
                    goodput_of_best_possible: s.slo.as_ref().and_then(|r| {
                        let most = self.most_meeting_slos.filter(|m| *m > 0)?;
                        Some(r.good_requests as f64 / most as f64)
                    }),
                }
            })
            .collect()
    }
}

/// The header of `comparison.csv`.
pub const CSV_COLUMNS: &[&str] = &[
    "scheduler",
    "status",
    "objective",
    "objective_s",
    "ratio_to_optimum",
    "ratio_to_bound",
    "makespan_s",
    "throughput_tok_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "e2e_p50_s",
    "e2e_p90_s",
    "e2e_p99_s",
    "evictions",
    "recomputed_tokens",
    "batches",
    "mean_batch_size",
    "peak_kv_tokens",
    "peak_kv_utilization",
    "mean_kv_utilization",
    "certified_gap",
    "best_bound_s",
    "C",
    "P",
    "M",
    "R_max",
    "block_size",
    "watermark",
    "split_batch_bias_s",
    "split_entry_overhead_s",
    "split_linear_tokens_s",
    "split_attention_s",
    "split_recomputation_s",
    "split_idle_s",
    "contender",
    "method",
    "clairvoyant",
    "slo_attainment",
    "goodput_requests_per_s",
    "slos_hold",
    "goodput_of_best_possible",
    "cached_tokens",
    "router",
];

/// A limit in the CSV: empty when unlimited.
fn limit(v: Option<u64>) -> String {
    v.map_or(String::new(), |x| x.to_string())
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| x.to_string())
}

/// Writes `comparison.csv`.
pub fn write_csv(
    rows: &[ComparisonRow],
    objective: Objective,
    w: &mut dyn Write,
) -> io::Result<()> {
    writeln!(w, "{}", CSV_COLUMNS.join(","))?;
    for r in rows {
        let q = |q: &Quantiles| format!("{},{},{},{}", q.mean, q.p50, q.p90, q.p99);
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.label,
            r.status,
            objective.name(),
            r.objective_s,
            opt(r.ratio_to_optimum),
            opt(r.ratio_to_bound),
            r.makespan_s,
            opt(r.throughput_tok_s),
            q(&r.ttft_s),
            r.tpot_s.as_ref().map_or(",,,".into(), q),
            q(&r.e2e_s),
            r.evictions,
            r.recomputed_tokens,
            r.batches,
            r.mean_batch_size,
            r.peak_kv_tokens,
            opt(r.peak_kv_utilization),
            opt(r.mean_kv_utilization),
            opt(r.certified_gap),
            opt(r.best_bound_s),
            limit(r.limits.token_budget),
            limit(r.limits.effective_prefill_budget()),
            limit(r.limits.kv_capacity),
            limit(r.limits.max_running),
            r.limits.block_size,
            r.limits.watermark,
            r.time_split
                .terms()
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            r.scheduler,
            r.method.as_deref().unwrap_or_default(),
            r.clairvoyant,
            opt(r.slo_attainment),
            opt(r.goodput_requests_per_s),
            r.slos_hold.map_or(String::new(), |h| h.to_string()),
            opt(r.goodput_of_best_possible),
            r.cached_tokens,
            r.router.as_deref().unwrap_or_default(),
        )?;
    }
    Ok(())
}

/// The setting a comparison ran in, for `comparison.json` and the report.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    /// Workload file.
    pub workload: String,
    /// Workload statistics.
    pub workload_stats: crate::workload::WorkloadStats,
    /// Cost model name.
    pub cost_model: String,
    /// Objective.
    pub objective: Objective,
    /// The limits set explicitly (the optimal scheduler's; each row has its own).
    pub limits: Limits,
    /// MILP time limit (s).
    pub time_limit_s: f64,
    /// Replicas and router, where every contender ran on a cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSetting>,
}

/// The cluster a comparison ran on.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSetting {
    /// Replicas (each under the same limits and cost model).
    pub replicas: u32,
    /// The router the heuristics ran behind (the solver searches routings); several,
    /// comma-separated, where the comparison has several.
    pub router: String,
}

/// Writes `comparison.json`: the setting, the rows and any failures.
pub fn write_json(path: &Path, setting: &Setting, c: &Comparison) -> io::Result<()> {
    let failures: Vec<_> = c
        .failures()
        .into_iter()
        .map(|(n, e)| serde_json::json!({"scheduler": n, "error": e}))
        .collect();
    let doc = serde_json::json!({
        "format": "infersched-comparison/1",
        "setting": setting,
        "rows": c.rows(),
        "failures": failures,
        "most_requests_meeting_slos": c.most_meeting_slos,
        "best_found_meeting_slos": c.best_found_meeting_slos.as_ref().map(|b| b.0),
        "best_found_meeting_slos_by": c.best_found_meeting_slos.as_ref().map(|b| &b.1),
        "solve": c.optimal().and_then(|o| match &o.cluster {
            Some(parts) => parts.search.as_ref().and_then(|r| serde_json::to_value(r).ok()),
            None => o.solve.as_ref().and_then(|r| serde_json::to_value(r).ok()),
        }),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(io::Error::other)? + "\n";
    write_bytes_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::solver::{PolicyConstraints, SolveStatus};

    #[test]
    fn an_unproven_solver_row_is_never_called_optimal() {
        let no_evict = Contender::Optimal(PolicyConstraints {
            no_evict: true,
            ..PolicyConstraints::default()
        });
        let solver = |s| RunStatus::Solver(s);
        assert_eq!(
            row_label(Contender::OPTIMAL, solver(SolveStatus::Optimal)),
            "optimal"
        );
        for status in [
            SolveStatus::NotProven,
            SolveStatus::TimeLimit,
            SolveStatus::NoSolution,
        ] {
            assert_eq!(row_label(Contender::OPTIMAL, solver(status)), "best-found");
            assert_eq!(row_label(no_evict, solver(status)), "best-found+no-evict");
        }
        let vllm = Contender::Heuristic(crate::schedulers::SchedulerKind::Vllm);
        assert_eq!(row_label(vllm, RunStatus::Heuristic), "vllm");
        let mcsf = Contender::Heuristic(crate::schedulers::SchedulerKind::Mcsf);
        assert!(mcsf.clairvoyant() && Contender::OPTIMAL.clairvoyant() && !vllm.clairvoyant());
    }
}
