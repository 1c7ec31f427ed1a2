//! `sweep` and `sweep merge`: grids of settings from a TOML spec.

use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct SweepArgs {
    #[command(subcommand)]
    pub(crate) command: Option<SweepCommand>,
    /// Sweep specification (TOML; see notebooks-data/experiments/).
    #[arg(required = true)]
    pub(crate) spec: Option<PathBuf>,
    /// Output directory (results.csv, plots/).
    #[arg(long, required = true)]
    pub(crate) out: Option<PathBuf>,
    /// Skip runs already in DIR/results.csv.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Run only the K-th of N disjoint slices of the grid (1-based), e.g. 2/4.
    #[arg(long)]
    pub(crate) shard: Option<String>,
    /// Parallel runs, 1 to 1024 [default: the number of CPUs].
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
    /// Run grids of more than 100,000 runs.
    #[arg(long)]
    pub(crate) yes: bool,
}

#[derive(Subcommand)]
pub(crate) enum SweepCommand {
    /// Combine the results.csv of a sweep's shards (run with --shard K/N, on one machine or
    /// several) into one results.csv and its plots; checks the shards are disjoint, are of
    /// this spec's grid and together cover it.
    Merge(SweepMergeArgs),
}

#[derive(Args)]
pub(crate) struct SweepMergeArgs {
    /// The sweep specification the shards ran (TOML).
    pub(crate) spec: PathBuf,
    /// The shards' output directories (or their results.csv files).
    #[arg(required = true)]
    pub(crate) shards: Vec<PathBuf>,
    /// Output directory for the merged results.csv and plots/.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Merge even where some runs of the grid are in no shard (they stay out).
    #[arg(long)]
    pub(crate) allow_missing: bool,
}

/// Runs a sweep, or merges shards' results.
pub(crate) fn cmd_sweep(a: &SweepArgs) -> Result<()> {
    match (&a.command, &a.spec, &a.out) {
        (Some(SweepCommand::Merge(m)), _, _) => {
            infersched::sweep::merge_cli(&m.spec, &m.shards, &m.out, m.allow_missing)
        }
        (None, Some(spec), Some(out)) => {
            infersched::sweep::run_cli(spec, out, a.resume, a.shard.as_deref(), a.jobs, a.yes)
        }
        _ => unreachable!("clap requires SPEC and --out without a subcommand"),
    }
}
