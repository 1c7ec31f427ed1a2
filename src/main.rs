//! The `infersched` command line.

use clap::{Parser, Subcommand};
use cli::bench::BenchArgs;
use cli::calibrate::CalibrateArgs;
use cli::compare::CompareArgs;
use cli::cost_model::CostModelCommand;
use cli::fit::FitArgs;
use cli::replay::ReplayArgs;
use cli::simulate::SimulateArgs;
use cli::solve::SolveArgs;
use cli::sweep::SweepArgs;
use cli::workload::WorkloadCommand;
use std::process::ExitCode;

/// Writes to stdout, returning an error instead of panicking (e.g. on a closed pipe).
macro_rules! out {
    ($($arg:tt)*) => {
        std::io::Write::write_fmt(&mut std::io::stdout().lock(), format_args!($($arg)*))?
    };
}

/// [`out!`] with a newline.
macro_rules! outln {
    () => { out!("\n") };
    ($($arg:tt)*) => {{
        out!($($arg)*);
        out!("\n");
    }};
}

mod cli;

#[derive(Parser)]
#[command(
    name = "infersched",
    version,
    about = "Optimal and heuristic batch schedules for LLM inference serving, measured by one independent replay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run heuristic schedulers on a workload; the replay computes their metrics.
    Simulate(SimulateArgs),
    /// Compute an optimal schedule with the MILP (HiGHS) and replay it.
    Solve(SolveArgs),
    /// Validate a schedule and compute every time and metric from it.
    Replay(ReplayArgs),
    /// Generate, sample and describe workloads.
    #[command(subcommand)]
    Workload(WorkloadCommand),
    /// Show cost-model presets and the KV capacity they imply.
    #[command(subcommand, name = "cost-model")]
    CostModel(CostModelCommand),
    /// Fit cost-model coefficients by non-negative least squares.
    Fit(FitArgs),
    /// Benchmark the simulator on the bundled traces (build with --release).
    Bench(BenchArgs),
    /// Run the optimal scheduler and heuristics on one setting: table, plots, traces, report.html.
    Compare(CompareArgs),
    /// Run a grid of settings from a TOML spec, appending each run to results.csv.
    Sweep(SweepArgs),
    /// Measure a layer's kernels on an NVIDIA GPU and fit the cost-model coefficients.
    Calibrate(CalibrateArgs),
}

fn main() -> ExitCode {
    infersched::interrupt::install_handler();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Simulate(a) => cli::simulate::cmd_simulate(a),
        Command::Solve(a) => cli::solve::cmd_solve(a),
        Command::Replay(a) => cli::replay::cmd_replay(a),
        Command::Workload(c) => cli::workload::cmd_workload(c),
        Command::CostModel(c) => cli::cost_model::cmd_cost_model(c),
        Command::Fit(a) => cli::fit::cmd_fit(a),
        Command::Bench(a) => cli::bench::cmd_bench(a),
        Command::Compare(a) => cli::compare::cmd_compare(a),
        Command::Calibrate(a) => cli::calibrate::cmd_calibrate(a),
        Command::Sweep(a) => cli::sweep::cmd_sweep(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (e.g. `| head`): nothing more to say.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, outermost first, joined by ": ", leaving out a cause whose text
/// the message so far already ends with (a library error that shows its source).
pub(crate) fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if text.ends_with(&c) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&c);
    }
    text
}
