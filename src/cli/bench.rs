//! `bench`: the simulator's speed on the bundled traces.

use super::{load_workload, named};
use anyhow::{Context, Result};
use clap::Args;
use infersched::core::{Summary, Workload, replay};
use infersched::cost_model;
use infersched::cost_model::LinearCostModel;
use infersched::schedulers::{Knobs, SchedulerKind};
use infersched::workload::{self, ArrivalProcess};
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Directory holding splitwise_code.csv, arxiv_summarization.csv and
    /// mooncake/conversation_trace.jsonl (measured with vllm-v1's prefix caching on and off).
    #[arg(long, default_value = "notebooks-data/traces")]
    pub(crate) traces: PathBuf,
    /// Runs per measurement (the minimum and median are reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) repeat: usize,
    /// Schedulers to measure.
    #[arg(
        long,
        default_value = "vllm,vllm-v1,sarathi,orca,orca-max,static,mcsf,fastgen,lightllm,fastertransformer",
        value_delimiter = ',',
        value_parser = named::<SchedulerKind>()
    )]
    pub(crate) schedulers: Vec<SchedulerKind>,
    /// Results CSV.
    #[arg(long, default_value = "notebooks-data/results/bench-simulate.csv")]
    pub(crate) out: PathBuf,
}

pub(crate) fn timed<T>(repeat: usize, mut f: impl FnMut() -> Result<T>) -> Result<(T, f64, f64)> {
    let mut times = Vec::with_capacity(repeat);
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let t0 = std::time::Instant::now();
        last = Some(f()?);
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok((
        last.expect("at least one run"),
        times[0],
        times[times.len() / 2],
    ))
}

/// Peak resident memory of this process so far (Linux), in MiB.
pub(crate) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// One benchmark run: a workload by name, a scheduler, its knobs and cost model.
type BenchRun<'a> = (
    &'a str,
    &'a Workload,
    SchedulerKind,
    Knobs,
    &'a LinearCostModel,
);

/// Simulates and replays one run `repeat` times each, prints its line and returns its
/// CSV row.
fn bench_one((name, w, kind, knobs, cost): BenchRun<'_>, repeat: usize) -> Result<String> {
    let (sim, sim_min, sim_med) = timed(repeat, || Ok(kind.simulate(w, &knobs, cost)?))?;
    let (r, rep_min, rep_med) = timed(repeat, || Ok(replay(w, &sim.limits, cost, &sim.schedule)?))?;
    let s = Summary::from_replay(&r);
    let entries = sim.schedule.entry_count();
    let bytes = entries * std::mem::size_of::<infersched::core::Entry>()
        + sim.schedule.batches.len() * std::mem::size_of::<infersched::core::Batch>();
    outln!(
        "{:<22} {:<9} {:>8} {:>9} {:>10.4} s {:>10.4} s {:>8.0} s {:>9}",
        name,
        kind.name(),
        s.batches,
        entries,
        sim_min,
        rep_min,
        s.makespan_s,
        s.evictions
    );
    Ok(format!(
        "{name},{},{},{},{entries},{bytes},{sim_min},{sim_med},{rep_min},{rep_med},{},{}\n",
        w.len(),
        kind.name(),
        s.batches,
        s.makespan_s,
        s.evictions
    ))
}

pub(crate) fn cmd_bench(a: &BenchArgs) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: this is a debug build; run `cargo run --release -- bench` for real numbers"
        );
    }
    let cost = cost_model::resolve("llama3-70b-tp4-a100")?;
    let splitwise = load_workload(&a.traces.join("splitwise_code.csv"))?;
    let arxiv = workload::assign_arrivals(
        &load_workload(&a.traces.join("arxiv_summarization.csv"))?,
        ArrivalProcess::Poisson(1.0),
        0,
    )?;
    let kinds = a.schedulers.as_slice();
    // The InferMax authors' setting for the 70B model: M = 100,000, C = 16,384, block 1,
    // no prefix cache (vllm-v1's is measured on the Mooncake trace below).
    let knobs = Knobs {
        token_budget: Some(16_384),
        kv_capacity: Some(100_000),
        block_size: Some(1),
        prefix_caching: Some(false),
        ..Knobs::default()
    };
    let mut csv = String::from(
        "workload,requests,scheduler,batches,entries,schedule_bytes,simulate_s_min,simulate_s_median,replay_s_min,replay_s_median,makespan_s,evictions\n",
    );
    outln!(
        "{:<22} {:<9} {:>8} {:>9} {:>12} {:>12} {:>10} {:>9}",
        "workload",
        "scheduler",
        "batches",
        "entries",
        "simulate min",
        "replay min",
        "makespan",
        "evictions"
    );
    let mut runs: Vec<BenchRun<'_>> = Vec::new();
    for (name, w) in [
        ("splitwise_code", &splitwise),
        ("arxiv_poisson1_seed0", &arxiv),
    ] {
        for kind in kinds {
            runs.push((name, w, *kind, knobs, &cost));
        }
    }
    // The Mooncake conversation trace (12,031 requests with prompt block ids) on an H100
    // with Llama-3-8B at vLLM V1's defaults (C = 8192, block 16, M from the model and GPU).
    let mooncake_cost = cost_model::resolve("llama3-8b-h100")?;
    let mooncake = load_workload(&a.traces.join("mooncake/conversation_trace.jsonl"))?;
    let m = infersched::settings::kv_capacity_for(None, &mooncake_cost, 0.9, 1)?;
    if kinds.contains(&SchedulerKind::VllmV1) {
        for (name, on) in [
            ("mooncake_conv_cache", true),
            ("mooncake_conv_nocache", false),
        ] {
            let k = Knobs {
                kv_capacity: Some(m),
                prefix_caching: Some(on),
                ..Knobs::default()
            };
            runs.push((name, &mooncake, SchedulerKind::VllmV1, k, &mooncake_cost));
        }
    }
    for run in runs {
        csv.push_str(&bench_one(run, a.repeat)?);
    }
    infersched::core::io::write_bytes_atomic(&a.out, csv.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(m) = peak_rss_mib() {
        outln!("peak resident memory of the whole run: {m:.0} MiB");
    }
    outln!("wrote {}", a.out.display());
    Ok(())
}
