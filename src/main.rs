//! The `infersched` command line.

use clap::{Parser, Subcommand};
use cli::bench::BenchArgs;
use cli::calibrate::CalibrateArgs;
use cli::capacity::CapacityArgs;
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
    /// The highest request rate at which each scheduler meets a set of SLOs on a trace.
    Capacity(CapacityArgs),
}

fn main() -> ExitCode {
    infersched::interrupt::install_handler();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                e.exit();
            }
            // Clap quotes the offending value whole: bound it like every other message.
            eprint!("{}", bounded(&e.render().to_string()));
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
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
        Command::Capacity(a) => cli::capacity::cmd_capacity(a),
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
            eprintln!("error: {}", bounded(&describe(&e)));
            ExitCode::FAILURE
        }
    }
}

/// The most characters of one line of a message, and of one word in it: input quoted
/// back (a name, a value, a line of a file) is cut past them, saying how much was left out.
const LINE_MAX: usize = 1000;
const WORD_MAX: usize = 80;

/// `text` with every word (a run without whitespace) cut to [`WORD_MAX`] characters and
/// then every line to [`LINE_MAX`], each cut saying how many characters it left out.
pub(crate) fn bounded(text: &str) -> String {
    let cut = |s: &str, max: usize, keep: usize| -> Option<String> {
        let n = s.chars().count();
        (n > max).then(|| {
            let head: String = s.chars().take(keep).collect();
            format!("{head}...[{} more characters]", n - keep)
        })
    };
    text.split_inclusive('\n')
        .map(|line| {
            let (body, end) = match line.strip_suffix('\n') {
                Some(b) => (b, "\n"),
                None => (line, ""),
            };
            let words: String = body
                .split_inclusive(char::is_whitespace)
                .map(|piece| {
                    let word = piece.trim_end_matches(char::is_whitespace);
                    match cut(word, WORD_MAX, WORD_MAX - 20) {
                        Some(short) => short + &piece[word.len()..],
                        None => piece.to_string(),
                    }
                })
                .collect();
            cut(&words, LINE_MAX, LINE_MAX - 40).unwrap_or(words) + end
        })
        .collect()
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
