//! `simulate`: heuristic schedulers on a workload, measured by the replay.

use super::{KnobArgs, load_workload, named, path_list};
use crate::describe;
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::core::{Limits, Summary, Workload};
use infersched::cost_model::{self, TimeBreakdown};
use infersched::produce::produce_heuristic_pipelined;
use infersched::schedulers::{Knobs, SchedulerKind};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct SimulateArgs {
    /// Workload trace CSV.
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Scheduler, or a comma-separated list run in parallel.
    #[arg(long, required = true, value_delimiter = ',', value_parser = named::<SchedulerKind>())]
    pub(crate) scheduler: Vec<SchedulerKind>,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = infersched::cost_models::DEFAULT_COST_MODEL)]
    pub(crate) cost_model: String,
    #[command(flatten)]
    pub(crate) knobs: KnobArgs,
    /// A service-level objective, METRIC-STATISTIC=TIME (e.g. ttft-p90=2s, tbt-p99=200ms,
    /// tpot-mean=50ms; METRIC ttft, tbt, tpot or e2e; STATISTIC mean, max or pN); repeat
    /// for several. Each summary then gives the share of requests meeting every one on
    /// their own values, the goodput, and whether each holds over all requests.
    #[arg(long = "slo", value_name = "SLO")]
    pub(crate) slo: Vec<infersched::core::Slo>,
    /// Replicas of the model, each running the scheduler on the requests routed to it
    /// (a cluster: `--out` then writes routing.csv, the cluster's requests.csv and
    /// summary.json, and replica-K/ with each replica's schedule and replay).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::cluster::MAX_REPLICAS)))]
    pub(crate) replicas: u32,
    /// How arriving requests are spread over the replicas: round-robin,
    /// least-outstanding (fewest unfinished), least-waiting (fewest waiting: Vidur's LOR),
    /// least-kv (fewest KV blocks allocated), vllm-dp (vLLM V1's data-parallel balancer:
    /// least 4 x waiting + running), power-of-two[:SEED] or random[:SEED]
    /// [default: round-robin]. Needs --replicas or --disaggregate.
    #[arg(long)]
    pub(crate) router: Option<infersched::schedulers::Router>,
    /// Disaggregated prefill and decode, P:D (e.g. 1:3): P prefill replicas serve every
    /// prompt and its first token, then the KV moves to one of D decode replicas, which
    /// take it (all but the last prompt token, computed again for the first token the
    /// client sees) and decode the rest, as vLLM's KV connectors behind its proxy do;
    /// requests routed by --router on each side. Decode replicas run vllm-v1.
    #[arg(long, conflicts_with = "replicas", value_name = "P:D")]
    pub(crate) disaggregate: Option<infersched::core::disaggregated::Disaggregation>,
    #[command(flatten)]
    pub(crate) kv: super::KvLinkArgs,
    #[command(flatten)]
    pub(crate) pipeline: super::PipelineArgs,
    /// Memory (GiB) the simulations may hold at once, estimated before any runs; several
    /// schedulers run one at a time when together they would not fit [default: the memory
    /// available].
    #[arg(long)]
    pub(crate) memory_limit: Option<f64>,
    /// Output directory: one subdirectory per scheduler, named after it, however many
    /// schedulers run [default: none:
    /// print the summaries and write nothing].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Also write trace.json beside each schedule: a Chrome trace (Perfetto,
    /// chrome://tracing) with the batches, KV and running counters, and one track per
    /// request (the first 1,000): waiting, prefill, decode, holding KV, evicted.
    #[arg(long, requires = "out")]
    pub(crate) trace: bool,
}

impl SimulateArgs {
    /// `--router`, round-robin when not given.
    fn router(&self) -> infersched::schedulers::Router {
        self.router
            .unwrap_or(infersched::schedulers::Router::RoundRobin)
    }
}

pub(crate) fn cmd_simulate(a: &SimulateArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = infersched::cost_models::resolve(&a.cost_model)?;
    let kinds = &a.scheduler;
    super::refuse_repeated_schedulers(kinds)?;
    super::check_prefix_caching(&a.knobs, kinds)?;
    let pipeline = a.pipeline.pipeline(&cost)?;
    check_pipelined(kinds, &pipeline)?;
    let knobs = a.knobs.knobs_on(&w, &cost, pipeline.stages)?;
    let jobs = parallel_jobs(a, &w, kinds, &knobs)?;
    if a.router.is_some() && a.replicas == 1 && a.disaggregate.is_none() {
        bail!("--router spreads requests over replicas: give --replicas N or --disaggregate P:D");
    }
    if let Some(split) = a.disaggregate {
        let link = a.kv.link(&cost)?;
        return simulate_disaggregated(a, &w, (&cost, &pipeline), &knobs, (split, link));
    }
    if a.replicas > 1 {
        return simulate_cluster(a, &w, (&cost, &pipeline), &knobs, jobs);
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(jobs).build()?;
    type Simulated = (Summary, TimeBreakdown, Vec<PathBuf>, Limits);
    let results: Vec<Result<Simulated>> = pool.install(|| {
        kinds
            .par_iter()
            .map(|kind| -> Result<_> {
                let mut o = produce_heuristic_pipelined(&w, &cost, *kind, &knobs, &pipeline)?;
                if !a.slo.is_empty() {
                    o.summary.slo = Some(infersched::core::SloReport::of(&o.replay, &a.slo));
                }
                let Some(out) = &a.out else {
                    return Ok((o.summary, o.time_split, Vec::new(), o.limits));
                };
                let dir = out.join(kind.name());
                let paths = write_outputs(&dir, &w, *kind, &o, a.trace)?;
                Ok((o.summary, o.time_split, paths, o.limits))
            })
            .collect()
    });
    outln!(
        "{} requests from {}, cost model {}",
        w.len(),
        a.workload.display(),
        cost.name
    );
    let mut failed = 0;
    let mut rows = Vec::new();
    let mut splits = Vec::new();
    for (kind, result) in kinds.iter().zip(results) {
        match result {
            Ok((summary, split, paths, limits)) => {
                outln!("\n{} ({limits})", kind.name());
                if kind.clairvoyant() {
                    outln!(
                        "  clairvoyant: it reads the true output lengths, which no online scheduler knows"
                    );
                }
                out!("{}", infersched::output::summary_text(&summary));
                out!("{}", infersched::output::time_split_text(&split));
                if !paths.is_empty() {
                    outln!("  wrote {}", path_list(&paths));
                }
                rows.push((kind.name(), summary));
                splits.push((kind.name(), split));
            }
            Err(e) => {
                failed += 1;
                eprintln!("\nerror: {}: {}", kind.name(), describe(&e));
            }
        }
    }
    if rows.len() > 1 {
        outln!("\n{}", infersched::output::comparison_table(&rows));
        outln!(
            "where the makespan goes\n{}",
            infersched::output::time_split_table(&splits, None)
        );
    }
    if failed > 0 {
        bail!("{failed} of {} schedulers failed", kinds.len());
    }
    Ok(())
}

/// Refuses `--pp` above 1 where it is not modelled: schedulers that do not pipeline.
fn check_pipelined(kinds: &[SchedulerKind], pipeline: &infersched::core::Pipeline) -> Result<()> {
    if !pipeline.is_pipelined() {
        return Ok(());
    }
    if let Some(k) = kinds.iter().find(|k| !k.pipelines()) {
        bail!(
            "--pp {}: pipeline parallelism is modelled for vllm-v1 (vLLM V1's batch queue), vllm (vLLM v0's virtual engines) and sarathi (Vidur's micro-batches), not {}",
            pipeline.stages,
            k.name()
        );
    }
    Ok(())
}

/// How many simulations run at once: all, unless their estimated memory (each holds its
/// whole schedule and replay) passes `--memory-limit` or what is available, then as many
/// as fit, largest first; refuses one that fits alone in none.
fn parallel_jobs(
    a: &SimulateArgs,
    w: &Workload,
    kinds: &[SchedulerKind],
    knobs: &Knobs,
) -> Result<usize> {
    use infersched::resources::gib;
    let needs: Vec<u64> = kinds
        .iter()
        .map(|k| infersched::schedulers::estimated_peak_bytes(w, &k.limits(knobs, w)))
        .collect();
    let budget = match a.memory_limit {
        Some(g) if g.is_finite() && g > 0.0 && g <= 1e6 => Some((g * (1u64 << 30) as f64) as u64),
        Some(g) => bail!("--memory-limit: expected GiB > 0 and at most 1e6, got {g}"),
        None => infersched::resources::available_memory_bytes(),
    };
    let Some(available) = budget else {
        return Ok(kinds.len());
    };
    if let Some((k, need)) = kinds.iter().zip(&needs).find(|(_, n)| **n > available) {
        bail!(
            "simulating {} on {} requests needs about {:.3} GiB (its schedule and replay) and {:.3} GiB is available; simulate a sample (workload sample) or raise --memory-limit",
            k.name(),
            w.len(),
            gib(*need),
            gib(available)
        );
    }
    let total: u64 = needs.iter().sum();
    if kinds.len() <= 1 || total <= available {
        return Ok(kinds.len());
    }
    // Largest first, as many at once as fit.
    let mut sorted = needs.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0;
    let jobs = sorted
        .iter()
        .take_while(|n| {
            sum += **n;
            sum <= available
        })
        .count()
        .max(1);
    eprintln!(
        "note: the {} schedulers together need about {:.3} GiB and {:.3} GiB is available: running {jobs} at a time",
        kinds.len(),
        gib(total),
        gib(available)
    );
    Ok(jobs)
}

/// Writes one simulation's schedule, replay outputs and (with `trace`) its Chrome trace
/// under `dir`; the paths written.
fn write_outputs(
    dir: &Path,
    w: &Workload,
    kind: SchedulerKind,
    o: &infersched::produce::Outcome,
    trace: bool,
) -> Result<Vec<PathBuf>> {
    let mut paths = infersched::output::write_run_outputs(dir, &o.schedule, &o.replay, &o.summary)
        .with_context(|| format!("writing results to {}", dir.display()))?;
    if trace {
        let trace_path = dir.join("trace.json");
        let trace = infersched::report::trace::chrome_trace(w, kind.name(), &o.schedule, &o.replay);
        infersched::core::io::write_bytes_atomic(
            &trace_path,
            serde_json::to_string(&trace)?.as_bytes(),
        )
        .with_context(|| format!("writing {}", trace_path.display()))?;
        paths.push(trace_path);
    }
    Ok(paths)
}

/// `simulate --replicas N` (N > 1): each scheduler on a cluster of N replicas.
fn simulate_cluster(
    a: &SimulateArgs,
    w: &Workload,
    (cost, pipeline): (&cost_model::LinearCostModel, &infersched::core::Pipeline),
    knobs: &Knobs,
    jobs: usize,
) -> Result<()> {
    let kinds = &a.scheduler;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(jobs).build()?;
    let results: Vec<Result<(Summary, Vec<PathBuf>)>> = pool.install(|| {
        kinds
            .par_iter()
            .map(|kind| -> Result<_> {
                let o = infersched::produce::produce_cluster_on(
                    w,
                    (cost, pipeline),
                    *kind,
                    knobs,
                    (a.replicas, a.router()),
                )?;
                let mut summary = o.summary;
                if !a.slo.is_empty() {
                    summary.slo = Some(infersched::core::SloReport::of(&o.replay.merged, &a.slo));
                }
                let Some(out) = &a.out else {
                    return Ok((summary, Vec::new()));
                };
                let dir = out.join(kind.name());
                let trace = a.trace.then_some(kind.name());
                let paths = infersched::cluster::write_cluster_outputs(
                    &dir,
                    w,
                    &o.routing,
                    &o.schedules,
                    &o.replay,
                    &summary,
                    trace,
                )
                .with_context(|| format!("writing results to {}", dir.display()))?;
                Ok((summary, paths))
            })
            .collect()
    });
    outln!(
        "{} requests from {}, cost model {}, {} replicas behind {}",
        w.len(),
        a.workload.display(),
        cost.name,
        a.replicas,
        a.router()
    );
    let mut failed = 0;
    let mut rows = Vec::new();
    for (kind, result) in kinds.iter().zip(results) {
        match result {
            Ok((summary, paths)) => {
                outln!("\n{} on each replica", kind.name());
                out!("{}", infersched::output::summary_text(&summary));
                out!("{}", infersched::cluster::load_table(&summary));
                if !paths.is_empty() {
                    outln!(
                        "  wrote {} files under {}",
                        paths.len(),
                        a.out.as_deref().unwrap_or(Path::new(".")).display()
                    );
                }
                rows.push((kind.name(), summary));
            }
            Err(e) => {
                failed += 1;
                eprintln!("\nerror: {}: {}", kind.name(), describe(&e));
            }
        }
    }
    if rows.len() > 1 {
        outln!("\n{}", infersched::output::comparison_table(&rows));
    }
    if failed > 0 {
        bail!("{failed} of {} schedulers failed", kinds.len());
    }
    Ok(())
}

/// `simulate --disaggregate P:D`: each scheduler on P prefill and D decode replicas, one
/// scheduler at a time.
fn simulate_disaggregated(
    a: &SimulateArgs,
    w: &Workload,
    (cost, pipeline): (&cost_model::LinearCostModel, &infersched::core::Pipeline),
    knobs: &Knobs,
    (split, link): (
        infersched::core::disaggregated::Disaggregation,
        infersched::core::disaggregated::KvLink,
    ),
) -> Result<()> {
    outln!(
        "{} requests from {}, cost model {}, {} prefill and {} decode replicas behind {}",
        w.len(),
        a.workload.display(),
        cost.name,
        split.prefill,
        split.decode,
        a.router()
    );
    let mut rows = Vec::new();
    for kind in &a.scheduler {
        let o = infersched::produce::produce_disaggregated_on(
            w,
            (cost, pipeline),
            *kind,
            knobs,
            (split, a.router()),
            &link,
        )?;
        let mut summary = o.summary.clone();
        if !a.slo.is_empty() {
            summary.slo = Some(infersched::core::SloReport::of(
                &o.replay.cluster.merged,
                &a.slo,
            ));
        }
        outln!("\n{} on each replica", kind.name());
        out!("{}", infersched::output::summary_text(&summary));
        out!("{}", infersched::cluster::load_table(&summary));
        if let Some(out) = &a.out {
            let dir = out.join(kind.name());
            let o = infersched::produce::DisaggregatedOutcome {
                summary: summary.clone(),
                ..o
            };
            let trace = a.trace.then_some(kind.name());
            let paths = infersched::cluster::write_disaggregated_outputs(&dir, w, &o, trace)
                .with_context(|| format!("writing results to {}", dir.display()))?;
            outln!("  wrote {} files under {}", paths.len(), dir.display());
        }
        rows.push((kind.name(), summary));
    }
    if rows.len() > 1 {
        outln!("\n{}", infersched::output::comparison_table(&rows));
    }
    Ok(())
}
