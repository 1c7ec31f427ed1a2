//! `capacity`: the highest request rate at which each scheduler meets a set of SLOs.

use super::{KnobArgs, load_workload, named};
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::capacity::{Capacity, CapacityResult, CapacitySpec, capacities, trace_rate};
use infersched::core::Slo;
use infersched::cost_model;
use infersched::schedulers::SchedulerKind;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct CapacityArgs {
    /// Workload trace CSV (its arrivals are scaled to each probed rate).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Scheduler, or a comma-separated list searched in parallel.
    #[arg(long, required = true, value_delimiter = ',', value_parser = named::<SchedulerKind>())]
    pub(crate) scheduler: Vec<SchedulerKind>,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    pub(crate) cost_model: String,
    #[command(flatten)]
    pub(crate) knobs: KnobArgs,
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
    /// Output directory for capacity.csv [default: print only].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// The columns of capacity.csv.
const CSV_HEADER: &str = "scheduler,result,max_rate_per_s,misses_at_per_s,binding_slos,attainment,goodput_requests_per_s,probes";

pub(crate) fn cmd_capacity(a: &CapacityArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = a.scheduler.iter().find(|k| !seen.insert(**k)) {
        bail!("--scheduler: {} is listed twice", dup.name());
    }
    let knobs = a.knobs.knobs(&w, &cost)?;
    let spec = CapacitySpec {
        slos: a.slo.clone(),
        warmup: a.warmup,
        cooldown: a.cooldown,
        min_rate: a.min_rate,
        max_rate: a.max_rate,
        tolerance: a.tolerance,
        max_probes: a.max_probes,
    };
    let own = trace_rate(&w).with_context(|| a.workload.display().to_string())?;
    if let Some(out) = &a.out {
        infersched::core::io::refuse_links(&[out.join("capacity.csv")])?;
    }
    let results = capacities(&w, &cost, &a.scheduler, &knobs, &spec);
    outln!(
        "{} requests from {} (its own rate {own:.3} requests/s), cost model {}; SLOs {}; measured: all but the first {}% and last {}% by arrival",
        w.len(),
        a.workload.display(),
        cost.name,
        a.slo
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        a.warmup * 100.0,
        a.cooldown * 100.0
    );
    let mut rows = Vec::new();
    for (kind, r) in a.scheduler.iter().zip(results) {
        let r = r.with_context(|| kind.name().to_string())?;
        outln!("  {}", line(&r));
        rows.push(csv_row(&r));
    }
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("capacity.csv");
        infersched::core::io::write_atomic(&path, |f| {
            writeln!(f, "{CSV_HEADER}")?;
            for row in &rows {
                writeln!(f, "{row}")?;
            }
            Ok(())
        })
        .with_context(|| format!("writing {}", path.display()))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
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
            "{:<10} {rate:.3} requests/s (misses at {above:.3}: {}; {probes} simulations)",
            r.scheduler.name(),
            binding.join(", ")
        ),
        Capacity::AtLeast { rate } => format!(
            "{:<10} at least {rate:.3} requests/s: the SLOs hold at the highest rate probed (--max-rate)",
            r.scheduler.name()
        ),
        Capacity::Below { rate, missed } => format!(
            "{:<10} below {rate:.3} requests/s: {} missed even at the lowest rate probed (--min-rate)",
            r.scheduler.name(),
            missed.join(", ")
        ),
    }
}

/// One row of capacity.csv.
fn csv_row(r: &CapacityResult) -> String {
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
        "{},{result},{rate},{above},{binding},{attainment},{goodput},{}",
        r.scheduler.name(),
        r.probes.len()
    )
}
