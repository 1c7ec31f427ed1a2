//! `workload generate | sample | describe`.

use super::load_workload;
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use infersched::workload::{
    self, ArrivalProcess, LengthDist, SampleSpec, Selection, SynthSpec, WorkloadStats,
};
use std::path::PathBuf;

#[derive(Subcommand)]
pub(crate) enum WorkloadCommand {
    /// Generate a seeded synthetic workload.
    Generate(GenerateArgs),
    /// Sample and transform a trace.
    Sample(SampleArgs),
    /// Print statistics of a workload.
    Describe(DescribeArgs),
}

#[derive(Args)]
pub(crate) struct GenerateArgs {
    /// Number of requests.
    #[arg(long)]
    pub(crate) requests: usize,
    /// Prompt lengths: fixed:V, uniform:LO:HI, zipf:THETA:LO:HI, normal:MEAN:STD:LO:HI.
    #[arg(long)]
    pub(crate) input: String,
    /// Output lengths, same forms as --input.
    #[arg(long)]
    pub(crate) output: String,
    /// Arrivals: static, poisson:QPS, gamma:QPS:CV.
    #[arg(long, default_value = "static")]
    pub(crate) arrival: String,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Output CSV.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

#[derive(Args)]
pub(crate) struct SampleArgs {
    /// Input trace CSV.
    #[arg(long)]
    pub(crate) trace: PathBuf,
    /// Keep the first N requests (after --skip).
    #[arg(long, conflicts_with = "random")]
    pub(crate) first: Option<usize>,
    /// With --first: skip this many requests first, so consecutive windows of a trace are
    /// `--skip 0 --first N`, `--skip N --first N`, ...
    #[arg(long, requires = "first")]
    pub(crate) skip: Option<usize>,
    /// Keep N requests drawn at random (with --seed), in trace order.
    #[arg(long)]
    pub(crate) random: Option<usize>,
    /// Seed for --random.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Multiply prompt lengths.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) prefill_scale: f64,
    /// Multiply output lengths.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) decode_scale: f64,
    /// Multiply arrival times.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) time_scale: f64,
    /// Cap I + O (the prompt is cut first).
    #[arg(long)]
    pub(crate) max_total_tokens: Option<u32>,
    /// Replace arrivals: static, poisson:QPS, gamma:QPS:CV.
    #[arg(long)]
    pub(crate) arrival: Option<String>,
    /// Seed for --arrival.
    #[arg(long, default_value_t = 0)]
    pub(crate) arrival_seed: u64,
    /// Shift times so the first kept request arrives at 0.
    #[arg(long)]
    pub(crate) rebase_time: bool,
    /// Output CSV.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

#[derive(Args)]
pub(crate) struct DescribeArgs {
    /// Workload CSV.
    pub(crate) workload: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn cmd_workload(c: &WorkloadCommand) -> Result<()> {
    match c {
        WorkloadCommand::Generate(a) => {
            if a.requests == 0 {
                bail!("--requests must be >= 1");
            }
            let spec = SynthSpec {
                requests: a.requests,
                input: a.input.parse::<LengthDist>().context("--input")?,
                output: a.output.parse::<LengthDist>().context("--output")?,
                arrival: a.arrival.parse::<ArrivalProcess>().context("--arrival")?,
                seed: a.seed,
            };
            let w = workload::generate(&spec)
                .with_context(|| format!("generating the workload (--arrival {})", a.arrival))?;
            workload::write_trace(&w, &a.out)?;
            out!("{}", WorkloadStats::of(&w).to_text());
            outln!("wrote {}", a.out.display());
        }
        WorkloadCommand::Sample(a) => {
            let trace = load_workload(&a.trace)?;
            let selection = match (a.first, a.random) {
                (Some(n), _) if a.skip.is_some_and(|k| k > 0) => {
                    Selection::Window(a.skip.unwrap_or(0), n)
                }
                (Some(n), _) => Selection::First(n),
                (None, Some(n)) => Selection::Random(n, a.seed),
                (None, None) => Selection::All,
            };
            let spec = SampleSpec {
                selection,
                prefill_scale: a.prefill_scale,
                decode_scale: a.decode_scale,
                time_scale: a.time_scale,
                max_total_tokens: a.max_total_tokens,
                arrival: a
                    .arrival
                    .as_deref()
                    .map(str::parse::<ArrivalProcess>)
                    .transpose()
                    .context("--arrival")?,
                arrival_seed: a.arrival_seed,
                rebase_time: a.rebase_time,
            };
            let w = workload::sample(&trace, &spec)?;
            workload::write_trace(&w, &a.out)?;
            out!("{}", WorkloadStats::of(&w).to_text());
            outln!("wrote {}", a.out.display());
        }
        WorkloadCommand::Describe(a) => {
            let w = load_workload(&a.workload)?;
            let s = WorkloadStats::of(&w);
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                outln!("{}", a.workload.display());
                out!("{}", s.to_text());
            }
        }
    }
    Ok(())
}
