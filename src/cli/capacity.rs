//! `capacity`: the highest request rate at which each scheduler meets a set of SLOs.

use super::{KnobArgs, load_workload, named};
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::capacity::{
    Arrivals, BEST_FOUND_BUDGET, Capacity, CapacityResult, CapacitySpec, RateSearch, Replicas,
    best_found_capacity, capacity, disaggregated_capacity, pipelined_capacity, trace_rate,
};
use infersched::core::disaggregated::{Disaggregation, KvLink};
use infersched::core::{Limits, Pipeline, Slo, Workload};
use infersched::cost_model::LinearCostModel;
use infersched::schedulers::{Knobs, SchedulerKind};
use rayon::prelude::*;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Args)]
pub(crate) struct CapacityArgs {
    /// Workload trace CSV (its arrivals are scaled to each probed rate).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Scheduler, or a comma-separated list searched in parallel.
    #[arg(long, required = true, value_delimiter = ',', value_parser = named::<SchedulerKind>())]
    pub(crate) scheduler: Vec<SchedulerKind>,
    /// Cost-model preset name or coefficient JSON file, or a comma-separated list (each a
    /// configuration axis, e.g. two GPUs).
    #[arg(long, default_value = infersched::cost_models::DEFAULT_COST_MODEL, value_delimiter = ',')]
    pub(crate) cost_model: Vec<String>,
    #[command(flatten)]
    pub(crate) knobs: KnobArgs,
    /// A configuration axis, KNOB=V1,V2,...: token-budget, prefill-budget or max-running
    /// (e.g. --grid token-budget=512,2048,8192 --grid max-running=64,256); every
    /// combination with every scheduler and cost model is searched, each value replacing
    /// the flag's.
    #[arg(long = "grid", value_name = "KNOB=VALUES")]
    pub(crate) grid: Vec<GridAxis>,
    /// Replicas of the model, or a comma-separated list (a configuration axis: the whole
    /// cluster's rate is searched; 1: one replica, as `simulate`).
    #[arg(long, default_value = "1", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::cluster::MAX_REPLICAS)))]
    pub(crate) replicas: Vec<u32>,
    /// Routers of the requests over the replicas, or a comma-separated list (an axis; as
    /// `simulate --router`; only for more than one replica).
    #[arg(long, default_value = "round-robin", value_delimiter = ',')]
    pub(crate) router: Vec<infersched::schedulers::Router>,
    /// Disaggregated clusters, P:D prefill and decode replicas, a comma-separated list: each
    /// a configuration beside --replicas' (as `simulate --disaggregate`: decode replicas run
    /// vllm-v1; behind each --router; no ceiling is given for them).
    #[arg(long, value_delimiter = ',', value_name = "P:D")]
    pub(crate) disaggregate: Vec<infersched::core::disaggregated::Disaggregation>,
    #[command(flatten)]
    pub(crate) kv: super::KvLinkArgs,
    /// Pipeline stages of each replica, or a comma-separated list (a configuration axis;
    /// as `simulate --pp`: vllm-v1, vllm and sarathi, the stages linked by the GPU's NVLink, M
    /// each stage GPU's, disaggregated splits' replicas too; the ceiling of a pipeline is
    /// its first stage's, a machine at 1 / P of each batch's time).
    #[arg(long, default_value = "1", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::pipeline::MAX_STAGES)))]
    pub(crate) pp: Vec<u32>,
    /// A service-level objective, METRIC-STATISTIC=TIME (e.g. ttft-p90=2s, tbt-p99=200ms);
    /// at least one; a rate is sustained when every one holds over the measured requests.
    #[arg(long = "slo", value_name = "SLO", required = true)]
    pub(crate) slo: Vec<Slo>,
    /// Share of requests, first in arrival order, not measured (the queue starts empty).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) warmup: f64,
    /// Share of requests, last in arrival order, not measured (the queue drains).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) cooldown: f64,
    /// Lowest rate probed (requests/s).
    #[arg(long, default_value_t = 0.01)]
    pub(crate) min_rate: f64,
    /// Highest rate probed (requests/s).
    #[arg(long, default_value_t = 10_000.0)]
    pub(crate) max_rate: f64,
    /// Relative precision of the rate found.
    #[arg(long, default_value_t = 0.01)]
    pub(crate) tolerance: f64,
    /// Most simulations per scheduler.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_probes: usize,
    /// How each probed rate sets the arrivals: trace (the trace's own, scaled to the
    /// rate) or poisson[:SEED] (a Poisson process at the rate, seed 0 by default, the
    /// requests in the trace's order of arrival).
    #[arg(long, default_value = "trace")]
    pub(crate) arrivals: Arrivals,
    /// Also search, per one-replica configuration, for the highest rate at which some
    /// schedule under its limits meets the SLOs: the goodput search's schedules
    /// (clairvoyant: they read true output lengths), bisected like a scheduler's; the best
    /// possible rate then lies between it and the ceiling (seconds to minutes more).
    #[arg(long)]
    pub(crate) best_found: bool,
    /// Search only the K-th of N disjoint slices of the configurations (1-based, e.g. 2/4:
    /// every N-th from the K-th, for one job of a Slurm array); its capacity.csv holds
    /// those rows, and --merge joins the shards.
    #[arg(long, conflicts_with = "merge")]
    pub(crate) shard: Option<String>,
    /// Join the capacity.csv of shards (their directories or files, run with --shard and
    /// otherwise the same arguments) into one, with its plot and Pareto front: checks that
    /// each row is one of these arguments' configurations, that none is in two shards and
    /// that together they cover all; simulates nothing.
    #[arg(long, num_args = 1.., value_name = "SHARD")]
    pub(crate) merge: Vec<PathBuf>,
    /// Output directory for capacity.csv [default: print only].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// The knobs a `--grid` axis can vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GridKnob {
    TokenBudget,
    PrefillBudget,
    MaxRunning,
}

/// One `--grid` axis: a knob and its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GridAxis {
    knob: GridKnob,
    values: Vec<u64>,
}

impl FromStr for GridAxis {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let expected = "expected KNOB=V1,V2,... with KNOB token-budget, prefill-budget or max-running and positive integer values";
        let (name, values) = text
            .split_once('=')
            .ok_or_else(|| format!("\"{text}\": no '='; {expected}"))?;
        let knob = match name {
            "token-budget" => GridKnob::TokenBudget,
            "prefill-budget" => GridKnob::PrefillBudget,
            "max-running" => GridKnob::MaxRunning,
            _ => return Err(format!("\"{text}\": unknown knob \"{name}\"; {expected}")),
        };
        let values = values
            .split(',')
            .map(|v| v.parse::<u64>().ok().filter(|v| *v > 0))
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| format!("\"{text}\": a value is not a positive integer; {expected}"))?;
        Ok(Self { knob, values })
    }
}

impl GridAxis {
    fn set(&self, knobs: &mut Knobs, value: u64) {
        match self.knob {
            GridKnob::TokenBudget => knobs.token_budget = Some(value),
            GridKnob::PrefillBudget => knobs.prefill_budget = Some(value),
            GridKnob::MaxRunning => knobs.max_running = Some(value),
        }
    }
}

/// One configuration searched: a cost model, a scheduler and its knobs, and replicas
/// (all of them, where disaggregated).
struct Configuration<'a> {
    cost: &'a LinearCostModel,
    kind: SchedulerKind,
    knobs: Knobs,
    limits: Limits,
    replicas: Replicas,
    /// Where disaggregated: how the replicas split, and the KV link.
    split: Option<(Disaggregation, KvLink)>,
    /// Each replica's pipeline.
    pipeline: Pipeline,
}

/// Every combination of cost models, grid values and schedulers, in that order.
fn configurations<'a>(
    a: &CapacityArgs,
    w: &Workload,
    costs: &'a [LinearCostModel],
) -> Result<Vec<Configuration<'a>>> {
    check_pipelines(a)?;
    let mut out = Vec::new();
    for cost in costs {
        for &pp in &a.pp {
            let pipeline = infersched::settings::pipeline(cost, pp, None, None)?;
            let base = a.knobs.knobs_on(w, cost, pp)?;
            out.extend(configurations_of(a, w, (cost, pipeline), base)?);
        }
    }
    Ok(out)
}

/// `--pp` above 1 only where modelled: pipelined schedulers.
fn check_pipelines(a: &CapacityArgs) -> Result<()> {
    if !a.pp.iter().any(|&p| p > 1) {
        return Ok(());
    }
    if let Some(k) = a.scheduler.iter().find(|k| !k.pipelines()) {
        bail!(
            "--pp: pipeline parallelism is modelled for vllm-v1, vllm and sarathi, not {}",
            k.name()
        );
    }
    Ok(())
}

/// The configurations of one cost model and pipeline from its knobs `base`: every grid
/// point, replica axis and scheduler.
fn configurations_of<'a>(
    a: &CapacityArgs,
    w: &Workload,
    (cost, pipeline): (&'a LinearCostModel, Pipeline),
    base: Knobs,
) -> Result<Vec<Configuration<'a>>> {
    let mut points = vec![base];
    for axis in &a.grid {
        points = points
            .iter()
            .flat_map(|p| {
                axis.values.iter().map(move |&v| {
                    let mut k = *p;
                    axis.set(&mut k, v);
                    k
                })
            })
            .collect();
    }
    let link = if a.disaggregate.is_empty() {
        None
    } else {
        Some(a.kv.link(cost)?)
    };
    let mut out = Vec::new();
    for knobs in points {
        for (replicas, split) in replica_axes(a, link) {
            for &kind in &a.scheduler {
                let limits = kind.limits(&knobs, w);
                out.push(Configuration {
                    cost,
                    kind,
                    knobs,
                    limits,
                    replicas,
                    split,
                    pipeline,
                });
            }
        }
    }
    Ok(out)
}

/// Every replica count with every router (one replica once: it has nothing to route),
/// then every disaggregated split with every router (over `link`).
fn replica_axes(
    a: &CapacityArgs,
    link: Option<KvLink>,
) -> Vec<(Replicas, Option<(Disaggregation, KvLink)>)> {
    let mut out = Vec::new();
    for &count in &a.replicas {
        if count == 1 {
            out.push((Replicas::ONE, None));
            continue;
        }
        out.extend(
            a.router
                .iter()
                .map(|&router| (Replicas { count, router }, None)),
        );
    }
    let Some(link) = link else { return out };
    for &d in &a.disaggregate {
        let count = d.prefill.saturating_add(d.decode);
        out.extend(
            a.router
                .iter()
                .map(|&router| (Replicas { count, router }, Some((d, link)))),
        );
    }
    out
}

/// The columns of capacity.csv.
const CSV_HEADER: &str = "cost_model,scheduler,replicas,router,disaggregate,pp,token_budget,prefill_budget,max_running,kv_capacity,result,max_rate_per_s,misses_at_per_s,binding_slos,attainment,goodput_requests_per_s,probes,ceiling_per_s,best_found_rate_per_s,configuration";

pub(crate) fn cmd_capacity(a: &CapacityArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let costs = a
        .cost_model
        .iter()
        .map(|c| infersched::cost_models::resolve(c))
        .collect::<Result<Vec<_>, _>>()?;
    super::refuse_repeated_schedulers(&a.scheduler)?;
    super::check_prefix_caching(&a.knobs, &a.scheduler)?;
    let spec = CapacitySpec {
        slos: a.slo.clone(),
        warmup: a.warmup,
        cooldown: a.cooldown,
        min_rate: a.min_rate,
        max_rate: a.max_rate,
        tolerance: a.tolerance,
        max_probes: a.max_probes,
        arrivals: a.arrivals,
    };
    let arrivals = match a.arrivals {
        Arrivals::Trace => {
            let own = trace_rate(&w).with_context(|| a.workload.display().to_string())?;
            format!("its own rate {own:.3} requests/s, arrivals scaled")
        }
        Arrivals::Poisson { seed } => format!("Poisson arrivals at each rate, seed {seed}"),
    };
    if let Some(out) = &a.out {
        infersched::core::io::refuse_links(&[out.join("capacity.csv")])?;
    }
    let configs = configurations(a, &w, &costs)?;
    if !a.merge.is_empty() {
        return merge_shards(a, &configs);
    }
    let chosen: Vec<usize> = match &a.shard {
        Some(text) => {
            let (k, n) = infersched::sweep::parse_shard(text)?;
            (0..configs.len()).filter(|i| i % n == k - 1).collect()
        }
        None => (0..configs.len()).collect(),
    };
    let results: Vec<_> = chosen
        .par_iter()
        .map(|&i| search(a, &w, &configs[i], &spec))
        .collect();
    let shard = a.shard.as_ref().map_or(String::new(), |s| {
        format!(
            "; shard {s}: {} of {} configurations",
            chosen.len(),
            configs.len()
        )
    });
    outln!(
        "{} requests from {} ({arrivals}); SLOs {}; measured: all but the first {}% and last {}% by arrival{shard}",
        w.len(),
        a.workload.display(),
        a.slo
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        a.warmup * 100.0,
        a.cooldown * 100.0
    );
    let mut rows = Vec::new();
    let mut failed = 0;
    let mut rated = Vec::new();
    for (&i, r) in chosen.iter().zip(results) {
        let c = &configs[i];
        rated.push((
            c,
            r.as_ref().ok().and_then(|(r, _, _)| rate_of(&r.capacity)),
        ));
        failed += usize::from(r.is_err());
        let (said, row) = configuration_answer(c, r);
        outln!("{said}");
        rows.push(format!("{row},{i}"));
    }
    if failed == chosen.len() && !chosen.is_empty() {
        bail!("every configuration failed (see above)");
    }
    finish(a, &rated, &rows)
}

/// One configuration's searches: its scheduler's capacity, the ceiling (colocated
/// replicas only) and with `--best-found` (one replica) the goodput search's rate.
fn search(
    a: &CapacityArgs,
    w: &Workload,
    c: &Configuration<'_>,
    spec: &CapacitySpec,
) -> Result<(CapacityResult, Option<f64>, Option<RateSearch>), infersched::capacity::CapacityError>
{
    if let Some((d, link)) = &c.split {
        let router = c.replicas.router;
        let on = (c.cost, &c.pipeline);
        let found = disaggregated_capacity(w, on, c.kind, &c.knobs, (*d, router), link, spec)?;
        return Ok((found, None, None));
    }
    if c.pipeline.is_pipelined() {
        let on = (c.cost, &c.pipeline);
        let found = pipelined_capacity(w, on, c.kind, &c.knobs, c.replicas, spec)?;
        let ceiling = infersched::ceiling::ceiling_on(w, &c.limits, on, c.replicas.count, spec)?;
        return Ok((found, ceiling, None));
    }
    let found = capacity(w, c.cost, c.kind, &c.knobs, c.replicas, spec)?;
    let ceiling = infersched::ceiling::ceiling(w, &c.limits, c.cost, c.replicas.count, spec)?;
    let best = (a.best_found && c.replicas.count == 1)
        .then(|| best_found_capacity(w, c.cost, &c.limits, spec, BEST_FOUND_BUDGET))
        .transpose()?;
    Ok((found, ceiling, best))
}

/// The Pareto front said, and with --out the plot and capacity.csv (`rows`, header apart).
fn finish(
    a: &CapacityArgs,
    rated: &[(&Configuration<'_>, Option<f64>)],
    rows: &[String],
) -> Result<()> {
    let points = capacity_points(a, rated);
    let front = infersched::capacity::pareto_front(&points);
    if !front.is_empty() {
        outln!("Pareto front (most requests/s for the GPUs):");
        for p in &front {
            outln!("  {} GPUs: {:.3} requests/s, {}", p.gpus, p.rate, p.series);
        }
    }
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        if !points.is_empty() {
            let plot = infersched::capacity::capacity_plot(&points);
            let paths = infersched::report::write_plots(out, &[plot])
                .with_context(|| format!("writing the plot to {}", out.display()))?;
            outln!("wrote {}", super::path_list(&paths));
        }
        let path = out.join("capacity.csv");
        infersched::core::io::write_atomic(&path, |f| {
            writeln!(f, "{CSV_HEADER}")?;
            for row in rows {
                writeln!(f, "{row}")?;
            }
            Ok(())
        })
        .with_context(|| format!("writing {}", path.display()))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--merge`: the shards' rows, each checked against these arguments' configurations
/// (its `configuration` index and the columns naming it), none twice, all covered; then
/// [`finish`] on them in configuration order.
fn merge_shards(a: &CapacityArgs, configs: &[Configuration<'_>]) -> Result<()> {
    let mut rows: Vec<Option<(String, PathBuf)>> = vec![None; configs.len()];
    for shard in &a.merge {
        let path = if shard.is_dir() {
            shard.join("capacity.csv")
        } else {
            shard.clone()
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the shard {}", path.display()))?;
        let mut lines = text.lines();
        if lines.next() != Some(CSV_HEADER) {
            bail!(
                "{}: line 1 is not capacity.csv's header (a shard of another version?); expected {CSV_HEADER}",
                path.display()
            );
        }
        for (n, line) in lines.enumerate() {
            let at = || format!("{} line {}", path.display(), n + 2);
            let index = line
                .rsplit(',')
                .next()
                .and_then(|x| x.parse::<usize>().ok())
                .filter(|&i| i < configs.len())
                .with_context(|| format!("{}: its configuration index (last column) is not one of the {} configurations of these arguments", at(), configs.len()))?;
            let head = csv_head(&configs[index]);
            if !line.starts_with(&format!("{head},")) {
                bail!(
                    "{}: configuration {index} of these arguments is {head}, not this row's (were the shards run with other arguments?)",
                    at()
                );
            }
            if let Some((_, other)) = &rows[index] {
                bail!(
                    "{}: configuration {index} ({head}) is in {} too",
                    at(),
                    other.display()
                );
            }
            rows[index] = Some((line.to_string(), path.clone()));
        }
    }
    let missing: Vec<usize> = (0..configs.len()).filter(|&i| rows[i].is_none()).collect();
    if let Some(&first) = missing.first() {
        bail!(
            "{} of the {} configurations are in no shard (the first: {}); merge every shard of the run",
            missing.len(),
            configs.len(),
            csv_head(&configs[first])
        );
    }
    let rows: Vec<String> = rows.into_iter().flatten().map(|(row, _)| row).collect();
    let rated: Vec<(&Configuration<'_>, Option<f64>)> = configs
        .iter()
        .zip(&rows)
        .map(|(c, row)| {
            let cells: Vec<&str> = row.split(',').collect();
            let rate = match cells.get(10) {
                Some(&"found") | Some(&"at-least") => cells.get(11).and_then(|x| x.parse().ok()),
                _ => None,
            };
            (c, rate)
        })
        .collect();
    outln!(
        "merged {} configurations from {} shards",
        rows.len(),
        a.merge.len()
    );
    finish(a, &rated, &rows)
}

/// One configuration's answer: its line for people and its row of capacity.csv (a
/// configuration that cannot serve the trace, e.g. a prompt over C without chunking, is
/// reported as an error and the others go on).
fn configuration_answer(
    c: &Configuration<'_>,
    r: Result<
        (CapacityResult, Option<f64>, Option<RateSearch>),
        infersched::capacity::CapacityError,
    >,
) -> (String, String) {
    let on = match (c.replicas.count, &c.split) {
        (_, Some((d, _))) => format!(
            " on {} prefill and {} decode replicas behind {}",
            d.prefill, d.decode, c.replicas.router
        ),
        (1, None) => String::new(),
        (n, None) => format!(" on {n} replicas behind {}", c.replicas.router),
    };
    let stages = c.pipeline.stages;
    let on = if stages > 1 {
        format!("{on}, {stages} pipeline stages each")
    } else {
        on
    };
    let head = format!("{}, {}{on} ({})", c.cost.name, c.kind.name(), c.limits);
    match r {
        Ok((r, ceiling, best)) => {
            let proof = match (ceiling, &c.split) {
                (Some(x), _) => {
                    format!("; no schedule at all meets them at {x:.3} requests/s (ceiling)")
                }
                (None, Some(_)) => {
                    "; no ceiling (its argument covers colocated replicas)".to_string()
                }
                (None, None) => String::new(),
            };
            let found = best.as_ref().map_or(String::new(), best_found_line);
            let said = format!("  {head}: {}{proof}{found}", line(&r));
            (said, csv_row(c, Some((&r, ceiling, best.as_ref()))))
        }
        Err(e) => (format!("  {head}: error: {e}"), csv_row(c, None)),
    }
}

/// The plotted configurations: those with a rate, each on the line of its scheduler, cost
/// model, swept knobs and router, at its GPUs (replicas x the cost model's TP degree).
fn capacity_points(
    a: &CapacityArgs,
    rated: &[(&Configuration<'_>, Option<f64>)],
) -> Vec<infersched::capacity::CapacityPoint> {
    let mut points = Vec::new();
    for &(c, rate) in rated {
        let Some(rate) = rate else { continue };
        // A disaggregated split leads its name, so that its line gets a style of its own
        // (a name starting with a scheduler's takes that scheduler's).
        let split = c.split.map_or(String::new(), |(d, _)| format!("{d} P:D, "));
        let mut series = format!("{split}{} {}", c.kind.name(), c.cost.name);
        if c.pipeline.is_pipelined() {
            series += &format!(" PP{}", c.pipeline.stages);
        }
        for axis in &a.grid {
            let (name, v) = match axis.knob {
                GridKnob::TokenBudget => ("C", c.limits.token_budget),
                GridKnob::PrefillBudget => ("P", c.limits.prefill_budget),
                GridKnob::MaxRunning => ("R_max", c.limits.max_running),
            };
            series += &format!(" {name}={}", v.map_or("-".into(), |v| v.to_string()));
        }
        // With several routers each has its line; one replica (nothing to route) starts
        // every one of them.
        let routers: Vec<String> = match (c.replicas.count, a.router.len()) {
            (_, 1) => vec![String::new()],
            (1, _) => a.router.iter().map(|r| format!(" {r}")).collect(),
            _ => vec![format!(" {}", c.replicas.router)],
        };
        for router in routers {
            points.push(infersched::capacity::CapacityPoint {
                series: format!("{series}{router}"),
                gpus: c.replicas.count * c.cost.file.tensor_parallel.max(1) * c.pipeline.stages,
                rate,
            });
        }
    }
    points
}

/// One scheduler's answer for people.
fn line(r: &CapacityResult) -> String {
    let probes = r.probes.len();
    match &r.capacity {
        Capacity::Found {
            rate,
            above,
            binding,
        } => format!(
            "{rate:.3} requests/s (misses at {above:.3}: {}; {probes} simulations)",
            binding.join(", ")
        ),
        Capacity::AtLeast { rate } => format!(
            "at least {rate:.3} requests/s: the SLOs hold at the highest rate probed (--max-rate)"
        ),
        Capacity::Below { rate, missed } => format!(
            "below {rate:.3} requests/s: {} missed even at the lowest rate probed (--min-rate), where requests run nearly alone",
            missed.join(", ")
        ),
    }
}

/// The rate a rate search found (the highest that holds), if any.
fn rate_of(c: &Capacity) -> Option<f64> {
    match c {
        Capacity::Found { rate, .. } | Capacity::AtLeast { rate } => Some(*rate),
        Capacity::Below { .. } => None,
    }
}

/// What `--best-found` found, for people.
fn best_found_line(r: &RateSearch) -> String {
    match &r.capacity {
        Capacity::Found { rate, .. } => format!(
            "; some schedule meets them at {rate:.3} requests/s (the goodput search, clairvoyant; {} probes)",
            r.probes.len()
        ),
        Capacity::AtLeast { rate } => {
            format!("; some schedule meets them at {rate:.3} requests/s (the goodput search)")
        }
        Capacity::Below { rate, .. } => {
            format!("; the goodput search met them at no rate probed (down to {rate})")
        }
    }
}

/// The columns of capacity.csv naming a configuration: cost model, scheduler, replicas,
/// router and the effective limits.
fn csv_head(c: &Configuration<'_>) -> String {
    let limit = |v: Option<u64>| v.map_or(String::new(), |x| x.to_string());
    let router = match (c.replicas.count, &c.split) {
        (1, None) => String::new(),
        _ => c.replicas.router.name(),
    };
    let split = c.split.map_or(String::new(), |(d, _)| d.to_string());
    let pp = match c.pipeline.stages {
        1 => String::new(),
        p => p.to_string(),
    };
    format!(
        "{},{},{},{router},{split},{pp},{},{},{},{}",
        c.cost.name,
        c.kind.name(),
        c.replicas.count,
        limit(c.limits.token_budget),
        limit(c.limits.prefill_budget),
        limit(c.limits.max_running),
        limit(c.limits.kv_capacity)
    )
}

/// One row of capacity.csv (`result` `error` where the search failed), without its
/// `configuration` index.
fn csv_row(
    c: &Configuration<'_>,
    r: Option<(&CapacityResult, Option<f64>, Option<&RateSearch>)>,
) -> String {
    let head = csv_head(c);
    let Some((r, ceiling, best)) = r else {
        return format!("{head},error,,,,,,0,,");
    };
    let (result, rate, above, binding) = match &r.capacity {
        Capacity::Found {
            rate,
            above,
            binding,
        } => (
            "found",
            rate.to_string(),
            above.to_string(),
            binding.join(" "),
        ),
        Capacity::AtLeast { rate } => ("at-least", rate.to_string(), String::new(), String::new()),
        Capacity::Below { rate, missed } => {
            ("below", String::new(), rate.to_string(), missed.join(" "))
        }
    };
    let attainment = r
        .report
        .as_ref()
        .map_or(String::new(), |s| s.attainment.to_string());
    let goodput = r
        .report
        .as_ref()
        .and_then(|s| s.goodput_requests_per_s)
        .map_or(String::new(), |g| g.to_string());
    format!(
        "{head},{result},{rate},{above},{binding},{attainment},{goodput},{},{},{}",
        r.probes.len(),
        ceiling.map_or(String::new(), |x| x.to_string()),
        best.and_then(|b| rate_of(&b.capacity))
            .map_or(String::new(), |x| x.to_string())
    )
}
