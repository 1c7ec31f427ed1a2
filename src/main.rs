//! The `infersched` command line.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use infersched::core::{Instance, Limits, Schedule, Summary, replay};
use infersched::cost_model::{self, LinearCostModel, Samples, TimeBreakdown};
use infersched::produce::{produce_heuristic, produce_optimal};
use infersched::schedulers::{Knobs, McsfOrder, SchedulerKind, Victim};
use infersched::solver::{Objective, PolicyConstraints, SolveOptions};
use infersched::workload::{
    self, ArrivalProcess, LengthDist, SampleSpec, Selection, SynthSpec, WorkloadStats,
};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
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

#[derive(Args)]
struct CalibrateArgs {
    /// Model: llama2-7b, llama3-8b, llama3-70b, or a model-spec JSON file.
    #[arg(long, required_unless_present = "from_samples")]
    model: Option<String>,
    /// Tensor-parallel degree (heads and MLP width per GPU divided by it).
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Largest batch in tokens to calibrate for.
    #[arg(long, default_value_t = 8192)]
    max_tokens: u32,
    /// Timed runs per measurement (the median is kept).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Warm-up runs per measurement.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Redo the fit, validation and files from a recorded run's directory (samples.csv,
    /// validation.csv, run.json) instead of measuring.
    #[arg(long)]
    from_samples: Option<PathBuf>,
    /// With --from-samples: take the attention terms from another implementation's times
    /// on the same shapes (attention-vs-pytorch.csv, written by
    /// kernels-calibration/scripts/attention_vs_pytorch.py) and the linear terms from the
    /// recorded run; the preset is named with a -fa2 suffix.
    #[arg(long, requires = "from_samples")]
    attention_times: Option<PathBuf>,
    /// Only check the attention kernels against the CPU reference on this GPU, then stop.
    #[arg(long, conflicts_with = "from_samples")]
    check_kernels: bool,
    /// Output directory.
    #[arg(long, required_unless_present = "check_kernels")]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct CompareArgs {
    /// Workload trace CSV (keep it small when optimal is included).
    #[arg(long)]
    workload: PathBuf,
    /// Comma-separated: optimal, vllm, vllm-v1, sarathi, orca, orca-max, static, mcsf.
    #[arg(long, default_value = "optimal,vllm,vllm-v1,sarathi,orca,mcsf")]
    schedulers: String,
    /// Objective the ratios refer to and the MILP minimizes: makespan, mean-latency, mean-ttft.
    #[arg(long, default_value = "makespan")]
    objective: Objective,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    cost_model: String,
    /// The heuristics' knobs, as `simulate` takes them: each heuristic runs with these and
    /// its own defaults for the rest, so its schedule is the one `simulate` gives. The
    /// optimal scheduler runs under the limits set explicitly (C, P, R_max, the block size
    /// or 1) and M, with no policy default: the best schedule the GPU and memory allow.
    #[command(flatten)]
    knobs: KnobArgs,
    /// The optimal scheduler's policy class (as `solve`'s).
    #[command(flatten)]
    class: ClassArgs,
    /// Write no plots (report.html without figures; plots/ is not written).
    #[arg(long)]
    no_plots: bool,
    /// Write no Chrome traces (trace-<scheduler>.json), the largest files on long runs.
    #[arg(long)]
    no_traces: bool,
    #[command(flatten)]
    milp: MilpArgs,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

/// The policy class the optimal scheduler searches (the best schedule such a policy can
/// reach).
#[derive(Args, Clone)]
struct ClassArgs {
    /// Best schedule without evictions.
    #[arg(long)]
    no_evict: bool,
    /// Best schedule where each prefill phase runs in one batch.
    #[arg(long)]
    no_chunk: bool,
    /// Best schedule where no batch mixes prefills and decodes.
    #[arg(long)]
    no_mix: bool,
    /// Best schedule that first admits requests in arrival order.
    #[arg(long)]
    fcfs: bool,
    /// Best schedule where a request reserves I + O - 1 KV tokens from its first step (Orca).
    #[arg(long)]
    reserve: bool,
}

impl ClassArgs {
    fn constraints(&self) -> PolicyConstraints {
        PolicyConstraints {
            no_evict: self.no_evict,
            no_chunk: self.no_chunk,
            no_mix: self.no_mix,
            fcfs: self.fcfs,
            reserve: self.reserve,
        }
    }
}

/// How HiGHS runs.
#[derive(Args, Clone)]
struct MilpArgs {
    /// Batch slots J [default: provably sufficient for makespan, else 1.5 x the warm start's].
    #[arg(long)]
    horizon: Option<usize>,
    /// Time limit for the MILP (HiGHS) in seconds.
    #[arg(long, default_value_t = 60.0)]
    time_limit: f64,
    /// HiGHS threads, 1 to 256.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Relative MIP gap at which HiGHS stops.
    #[arg(long, default_value_t = 1e-6)]
    mip_gap: f64,
    /// Always solve the MILP, even where the exact counting search applies (offline
    /// workload without C, P or FCFS).
    #[arg(long)]
    milp_only: bool,
    /// Memory (GiB) the exact models' state graphs may take, estimated before any is built;
    /// past it the best schedule found without them is returned with a combinatorial bound.
    #[arg(long, default_value_t = 4.0)]
    memory_limit: f64,
    /// Schedules the priority-list search may try (simulated and replayed) to improve the
    /// best heuristic schedule, the warm start and the answer where no exact model fits;
    /// 0 turns it off. It also stops at half the time limit. The same number bounds the
    /// plans the phase relaxation's plan search tries.
    #[arg(long, default_value_t = SolveOptions::default().list_search_evaluations)]
    list_search_tries: usize,
    /// Skip the phase relaxation, the mean-latency bound solved as a small MILP before the
    /// exact model, and the schedules from its plan (up to 48 requests; it takes up to a
    /// quarter of the time limit, or most of it where no exact model fits).
    #[arg(long)]
    no_phase_relaxation: bool,
    /// Solve the whole workload at once for mean latency and TTFT, instead of one burst at
    /// a time where the best heuristic schedule serves each burst before the next arrives.
    #[arg(long)]
    no_independent_groups: bool,
}

impl MilpArgs {
    /// Checked solver options, with the progress line on a terminal.
    fn options(&self) -> Result<SolveOptions> {
        if !self.time_limit.is_finite() || self.time_limit <= 0.0 {
            bail!("--time-limit must be > 0 seconds");
        }
        if !(0.0..1.0).contains(&self.mip_gap) {
            bail!("--mip-gap must be in [0, 1)");
        }
        if !(1..=256).contains(&self.threads) {
            bail!(
                "--threads: expected 1 to 256 HiGHS threads (this machine has {} CPUs), got {}",
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                self.threads
            );
        }
        if !self.memory_limit.is_finite() || self.memory_limit <= 0.0 || self.memory_limit > 1e6 {
            bail!("--memory-limit must be > 0 and at most 1e6 GiB");
        }
        Ok(SolveOptions {
            memory_limit_bytes: (self.memory_limit * (1u64 << 30) as f64) as u64,
            time_limit_s: self.time_limit,
            threads: self.threads,
            mip_rel_gap: self.mip_gap,
            observer: std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
                infersched::solver::progress::Observer::new(
                    infersched::solver::progress::StderrProgress::default(),
                )
            }),
            max_search_states: if self.milp_only {
                0
            } else {
                SolveOptions::default().max_search_states
            },
            list_search_evaluations: self.list_search_tries,
            phase_relaxation: !self.no_phase_relaxation,
            independent_groups: !self.no_independent_groups,
            horizon: self.horizon,
            ..SolveOptions::default()
        })
    }
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SweepArgs {
    #[command(subcommand)]
    command: Option<SweepCommand>,
    /// Sweep specification (TOML; see notebooks-data/experiments/).
    #[arg(required = true)]
    spec: Option<PathBuf>,
    /// Output directory (results.csv, plots/).
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    /// Skip runs already in DIR/results.csv.
    #[arg(long)]
    resume: bool,
    /// Run only the K-th of N disjoint slices of the grid (1-based), e.g. 2/4.
    #[arg(long)]
    shard: Option<String>,
    /// Parallel runs, 1 to 1024 [default: the number of CPUs].
    #[arg(long)]
    jobs: Option<usize>,
    /// Run grids of more than 100,000 runs.
    #[arg(long)]
    yes: bool,
}

#[derive(Subcommand)]
enum SweepCommand {
    /// Combine the results.csv of a sweep's shards (run with --shard K/N, on one machine or
    /// several) into one results.csv and its plots; checks the shards are disjoint, are of
    /// this spec's grid and together cover it.
    Merge(SweepMergeArgs),
}

#[derive(Args)]
struct SweepMergeArgs {
    /// The sweep specification the shards ran (TOML).
    spec: PathBuf,
    /// The shards' output directories (or their results.csv files).
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    /// Output directory for the merged results.csv and plots/.
    #[arg(long)]
    out: PathBuf,
    /// Merge even where some runs of the grid are in no shard (they stay out).
    #[arg(long)]
    allow_missing: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// Directory holding splitwise_code.csv and arxiv_summarization.csv.
    #[arg(long, default_value = "notebooks-data/traces")]
    traces: PathBuf,
    /// Runs per measurement (the minimum and median are reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Schedulers to measure.
    #[arg(long, default_value = "vllm,vllm-v1,sarathi,orca,orca-max,static,mcsf")]
    schedulers: String,
    /// Results CSV.
    #[arg(long, default_value = "notebooks-data/results/bench-simulate.csv")]
    out: PathBuf,
}

/// The per-batch limits of semantics.md.
#[derive(Args, Clone)]
struct LimitArgs {
    /// C: tokens per batch [default: unlimited]. vLLM: --max-num-batched-tokens.
    #[arg(long, visible_alias = "max-num-batched-tokens")]
    token_budget: Option<u64>,
    /// P: prefill tokens per batch, P <= C [default: C].
    #[arg(long)]
    prefill_budget: Option<u64>,
    /// M: KV capacity in tokens [default: from the cost model's model and GPU at --gpu-memory-utilization].
    #[arg(long, conflicts_with_all = ["num_gpu_blocks", "gpu_memory_utilization"])]
    kv_capacity: Option<u64>,
    /// vLLM's KV pool in blocks, its null block included: M = (N - 1) x --block-size.
    #[arg(long, conflicts_with = "gpu_memory_utilization")]
    num_gpu_blocks: Option<u64>,
    /// Fraction of GPU memory for weights, activations and KV when M comes from the cost model's model and GPU (vLLM's --gpu-memory-utilization).
    #[arg(long, default_value_t = cost_model::DEFAULT_GPU_MEMORY_UTILIZATION)]
    gpu_memory_utilization: f64,
    /// R_max: requests holding KV [default: unlimited]. vLLM: --max-num-seqs.
    #[arg(long, visible_alias = "max-num-seqs")]
    max_running: Option<u64>,
    /// KV block size in tokens.
    #[arg(long, default_value_t = 1)]
    block_size: u32,
    /// Fraction of M kept free at admission by watermark-aware schedulers (replay checks M only).
    #[arg(long, default_value_t = 0.0)]
    watermark: f64,
}

impl LimitArgs {
    /// The limits; M from --kv-capacity, --num-gpu-blocks, or `cost`'s model and GPU (the
    /// default every command shares).
    fn limits(&self, cost: &LinearCostModel) -> Result<Limits> {
        let flag = match self.num_gpu_blocks {
            Some(n) => Some(kv_capacity_from_num_gpu_blocks(n, self.block_size)?),
            None => self.kv_capacity,
        };
        let kv_capacity = Some(kv_capacity_for(flag, cost, self.gpu_memory_utilization)?);
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity,
            max_running: self.max_running,
            block_size: self.block_size,
            watermark: self.watermark,
        };
        l.validate()?;
        Ok(l)
    }
}

/// Knobs of the heuristic schedulers; unset ones take each policy's default.
#[derive(Args, Clone)]
struct KnobArgs {
    /// C: tokens per batch [default: per policy; vllm max(2048, max_model_len), vllm-v1 8192, sarathi 512, orca/static/mcsf unlimited]. vLLM: --max-num-batched-tokens.
    #[arg(long, visible_alias = "max-num-batched-tokens")]
    token_budget: Option<u64>,
    /// P: prefill tokens per batch, P <= C [default: C].
    #[arg(long)]
    prefill_budget: Option<u64>,
    /// M: KV capacity in tokens [default: from the cost model's model and GPU at --gpu-memory-utilization].
    #[arg(long, conflicts_with_all = ["num_gpu_blocks", "gpu_memory_utilization"])]
    kv_capacity: Option<u64>,
    /// vLLM's KV pool in blocks, its null block included: M = (N - 1) x block size.
    #[arg(long, conflicts_with = "gpu_memory_utilization")]
    num_gpu_blocks: Option<u64>,
    /// Fraction of GPU memory for weights, activations and KV when M comes from the cost model's model and GPU (vLLM's --gpu-memory-utilization).
    #[arg(long, default_value_t = cost_model::DEFAULT_GPU_MEMORY_UTILIZATION)]
    gpu_memory_utilization: f64,
    /// R_max: requests holding KV [default: per policy; 256, sarathi 128]. vLLM: --max-num-seqs.
    #[arg(long, visible_alias = "max-num-seqs")]
    max_running: Option<u64>,
    /// KV block size [default: per policy; 16, orca/static 1 (mcsf 16)].
    #[arg(long)]
    block_size: Option<u32>,
    /// Fraction of M kept free at admission [default: per policy; vllm and sarathi 0.01].
    #[arg(long)]
    watermark: Option<f64>,
    /// Admit only with a full I + O - 1 reservation (never preempt).
    #[arg(long)]
    no_preemption: bool,
    /// Victim on a memory shortfall: newest, oldest, shortest, longest (by KV held).
    #[arg(long, default_value = "newest")]
    victim: Victim,
    /// Context length reserved by orca-max and used in vllm's default budget [default: the workload's largest I + O].
    #[arg(long)]
    max_model_len: Option<u64>,
    /// MC-SF's admission order, shortest first by: output (O, the paper's rule), tokens (I + O) or kv-area (O I + O (O - 1) / 2).
    #[arg(long, default_value = "output")]
    mcsf_order: McsfOrder,
    /// vllm-v1: admit a waiting or preempted request only if blocks for all its known tokens (the prompt, or I + G on a refill) plus the watermark are free, as vLLM 0.32 does by default [default: on].
    #[arg(long, overrides_with = "no_scheduler_reserve_full_isl")]
    scheduler_reserve_full_isl: bool,
    /// vllm-v1: check only this step's chunk at admission (vLLM's --no-scheduler-reserve-full-isl).
    #[arg(long, overrides_with = "scheduler_reserve_full_isl")]
    no_scheduler_reserve_full_isl: bool,
    /// vllm-v1: at most this many tokens per request per step unless it is the only request running or waiting (vLLM's --long-prefill-token-threshold; 0 = off) [default: 0].
    #[arg(long)]
    long_prefill_token_threshold: Option<u64>,
}

impl KnobArgs {
    /// `Some(false)` for --no-scheduler-reserve-full-isl, `Some(true)` for the flag, else
    /// the policy's default.
    fn reserve_full_isl(&self) -> Option<bool> {
        if self.no_scheduler_reserve_full_isl {
            Some(false)
        } else if self.scheduler_reserve_full_isl {
            Some(true)
        } else {
            None
        }
    }

    /// The knobs these flags set (M from the flags or the cost model); refuses a
    /// --max-model-len shorter than the workload's longest request.
    fn knobs(&self, w: &infersched::core::Workload, cost: &LinearCostModel) -> Result<Knobs> {
        if let Some(len) = self.max_model_len {
            // vLLM rejects a request longer than max_model_len; so does infersched, up front.
            if let Some((i, r)) = w
                .requests()
                .iter()
                .enumerate()
                .find(|(_, r)| u64::from(r.input_tokens) + u64::from(r.output_tokens) > len)
            {
                bail!(
                    "--max-model-len {len}: request {i} has I + O = {} tokens (I = {}, O = {}); expected at least the workload's longest request",
                    u64::from(r.input_tokens) + u64::from(r.output_tokens),
                    r.input_tokens,
                    r.output_tokens
                );
            }
        }
        Ok(Knobs {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: Some(self.kv_capacity(cost)?),
            max_running: self.max_running,
            block_size: self.block_size,
            watermark: self.watermark,
            no_preemption: self.no_preemption,
            victim: self.victim,
            max_model_len: self.max_model_len,
            mcsf_order: self.mcsf_order,
            reserve_full_isl: self.reserve_full_isl(),
            long_prefill_token_threshold: self.long_prefill_token_threshold,
        })
    }

    /// The limits the flags set explicitly, for the optimal scheduler (which has no policy
    /// defaults): C, P and R_max where given, M as for the heuristics, the block size given
    /// or 1, no watermark (a policy's admission rule, not a limit of the GPU).
    fn explicit_limits(&self, knobs: &Knobs) -> Result<Limits> {
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: knobs.kv_capacity,
            max_running: self.max_running,
            block_size: self.block_size.unwrap_or(1),
            watermark: 0.0,
        };
        l.validate()?;
        Ok(l)
    }

    /// M from --kv-capacity, --num-gpu-blocks, or the cost model's model and GPU.
    fn kv_capacity(&self, cost: &LinearCostModel) -> Result<u64> {
        let flag = match self.num_gpu_blocks {
            // vLLM's default block size when none is given.
            Some(n) => Some(kv_capacity_from_num_gpu_blocks(
                n,
                self.block_size.unwrap_or(16),
            )?),
            None => self.kv_capacity,
        };
        kv_capacity_for(flag, cost, self.gpu_memory_utilization)
    }
}

/// M for vLLM's `--num-gpu-blocks N` with blocks of `block` tokens: the pool less vLLM's
/// null block, `(N - 1) x block`.
fn kv_capacity_from_num_gpu_blocks(n: u64, block: u32) -> Result<u64> {
    if n < 2 {
        bail!("--num-gpu-blocks: expected at least 2 (vLLM keeps one as its null block), got {n}");
    }
    let block = u64::from(block);
    (n - 1)
        .checked_mul(block)
        .with_context(|| format!("--num-gpu-blocks {n} x block size {block} overflows"))
}

#[derive(Args)]
struct SimulateArgs {
    /// Workload trace CSV.
    #[arg(long)]
    workload: PathBuf,
    /// Scheduler, or a comma-separated list run in parallel: vllm, vllm-v1, sarathi, orca, orca-max, static, mcsf.
    #[arg(long)]
    scheduler: String,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    cost_model: String,
    #[command(flatten)]
    knobs: KnobArgs,
    /// Memory (GiB) the simulations may hold at once, estimated before any runs; several
    /// schedulers run one at a time when together they would not fit [default: the memory
    /// available].
    #[arg(long)]
    memory_limit: Option<f64>,
    /// Output directory (with several schedulers, one subdirectory each) [default: none:
    /// print the summaries and write nothing].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write trace.json beside each schedule: a Chrome trace (Perfetto,
    /// chrome://tracing) with the batches, KV and running counters, and one track per
    /// request (the first 1,000): waiting, prefill, decode, holding KV, evicted.
    #[arg(long, requires = "out")]
    trace: bool,
}

#[derive(Args)]
struct SolveArgs {
    /// Workload trace CSV (small: the MILP grows with requests, tokens and batches).
    #[arg(long)]
    workload: PathBuf,
    /// makespan, mean-latency or mean-ttft.
    #[arg(long, default_value = "makespan")]
    objective: Objective,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    cost_model: String,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    class: ClassArgs,
    #[command(flatten)]
    milp: MilpArgs,
    /// Do not start HiGHS from the best heuristic schedule.
    #[arg(long)]
    no_warm_start: bool,
    /// Heuristics tried for the warm start, comma-separated [default: sarathi,vllm-v1,vllm,orca,mcsf].
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    warm_start_from: Vec<String>,
    /// Show HiGHS's progress log (incumbent, bound, gap, elapsed).
    #[arg(long)]
    log: bool,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ReplayArgs {
    /// Workload trace CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at).
    #[arg(long)]
    workload: PathBuf,
    /// Schedule file (infersched-schedule/1 JSON, or CSV batch,request,tokens).
    #[arg(long)]
    schedule: PathBuf,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    cost_model: String,
    #[command(flatten)]
    limits: LimitArgs,
    /// Output directory for requests.csv, batches.csv, summary.json.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Subcommand)]
enum WorkloadCommand {
    /// Generate a seeded synthetic workload.
    Generate(GenerateArgs),
    /// Sample and transform a trace.
    Sample(SampleArgs),
    /// Print statistics of a workload.
    Describe(DescribeArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// Number of requests.
    #[arg(long)]
    requests: usize,
    /// Prompt lengths: fixed:V, uniform:LO:HI, zipf:THETA:LO:HI, normal:MEAN:STD:LO:HI.
    #[arg(long)]
    input: String,
    /// Output lengths, same forms as --input.
    #[arg(long)]
    output: String,
    /// Arrivals: static, poisson:QPS, gamma:QPS:CV.
    #[arg(long, default_value = "static")]
    arrival: String,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output CSV.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct SampleArgs {
    /// Input trace CSV.
    #[arg(long)]
    trace: PathBuf,
    /// Keep the first N requests.
    #[arg(long, conflicts_with = "random")]
    first: Option<usize>,
    /// Keep N requests drawn at random (with --seed), in trace order.
    #[arg(long)]
    random: Option<usize>,
    /// Seed for --random.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Multiply prompt lengths.
    #[arg(long, default_value_t = 1.0)]
    prefill_scale: f64,
    /// Multiply output lengths.
    #[arg(long, default_value_t = 1.0)]
    decode_scale: f64,
    /// Multiply arrival times.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Cap I + O (the prompt is cut first).
    #[arg(long)]
    max_total_tokens: Option<u32>,
    /// Replace arrivals: static, poisson:QPS, gamma:QPS:CV.
    #[arg(long)]
    arrival: Option<String>,
    /// Seed for --arrival.
    #[arg(long, default_value_t = 0)]
    arrival_seed: u64,
    /// Shift times so the first kept request arrives at 0.
    #[arg(long)]
    rebase_time: bool,
    /// Output CSV.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct DescribeArgs {
    /// Workload CSV.
    workload: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum CostModelCommand {
    /// List the built-in presets.
    List,
    /// Show a preset's or file's coefficients and the KV capacity of its model and GPU.
    Show(ShowArgs),
}

#[derive(Args)]
struct ShowArgs {
    /// Preset name or coefficient JSON file.
    name: String,
    /// Fraction of GPU memory given to weights and KV (as vLLM's gpu_memory_utilization).
    #[arg(long, default_value_t = cost_model::DEFAULT_GPU_MEMORY_UTILIZATION)]
    utilization: f64,
}

#[derive(Args)]
struct FitArgs {
    /// Samples CSV: feature columns (one, tokens, ...) and measured_ms.
    #[arg(long, required_unless_present = "vidur_attention")]
    samples: Option<PathBuf>,
    /// Read the samples as Vidur's mlp.csv profile (per-layer non-attention operators).
    #[arg(long, requires = "samples")]
    vidur_mlp: bool,
    /// Also fit the attention features to Vidur's attention.csv profile (per-layer
    /// attention kernel); with --samples FILE --vidur-mlp this gives a whole cost model.
    #[arg(long, value_name = "FILE")]
    vidur_attention: Option<PathBuf>,
    /// Tensor-parallel degree to select from a Vidur profile.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Layers: when set, the samples are per layer and the model multiplies by this.
    #[arg(long)]
    layers: Option<u32>,
    /// Name written into the coefficient file.
    #[arg(long, default_value = "fitted")]
    name: String,
    /// Output coefficient JSON.
    #[arg(long)]
    out: PathBuf,
}

/// Paths for a "wrote ..." line.
fn path_list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn load_workload(path: &Path) -> Result<infersched::core::Workload> {
    Ok(workload::read_trace(path)?)
}

fn cmd_replay(a: &ReplayArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let limits = a.limits.limits(&cost)?;
    let instance = Instance::new(w, limits, cost)
        .with_context(|| format!("{} under these limits", a.workload.display()))?;
    let (w, cost) = (instance.workload(), instance.cost());
    let schedule = Schedule::read(&a.schedule)?;
    let r = instance.replay(&schedule).with_context(|| {
        format!(
            "{} is not a valid schedule for {}",
            a.schedule.display(),
            a.workload.display()
        )
    })?;
    let summary = Summary::from_replay(&r);
    let split = TimeBreakdown::of(cost, w, &schedule, &r);
    let paths = infersched::output::write_replay_outputs(&a.out, &r, &summary)
        .with_context(|| format!("writing results to {}", a.out.display()))?;
    outln!(
        "schedule {} is valid for {} under cost model {}",
        a.schedule.display(),
        a.workload.display(),
        cost.name
    );
    out!("{}", infersched::output::summary_text(&summary));
    out!("{}", infersched::output::time_split_text(&split));
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

/// M for heuristic runs: the flag, or else what the cost model's model and GPU imply with
/// `memory_fraction` of GPU memory for weights, activations and KV.
fn kv_capacity_for(flag: Option<u64>, cost: &LinearCostModel, memory_fraction: f64) -> Result<u64> {
    if let Some(m) = flag {
        return Ok(m);
    }
    let f = &cost.file;
    match (&f.model, &f.gpu) {
        (Some(model), Some(gpu)) => Ok(cost_model::kv_capacity_tokens(
            model,
            gpu,
            f.tensor_parallel,
            memory_fraction,
        )?),
        _ => bail!(
            "--kv-capacity is required: cost model {} has no model and GPU spec to derive M from",
            cost.name
        ),
    }
}

fn cmd_simulate(a: &SimulateArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let kinds: Vec<SchedulerKind> = a
        .scheduler
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<SchedulerKind>()
                .map_err(anyhow::Error::msg)
        })
        .collect::<Result<_>>()
        .context("--scheduler")?;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = kinds.iter().find(|k| !seen.insert(**k)) {
        bail!("--scheduler: {} is listed twice", dup.name());
    }
    let knobs = a.knobs.knobs(&w, &cost)?;
    let several = kinds.len() > 1;
    // Memory: each simulation holds its whole schedule; estimate before running any.
    let needs: Vec<u64> = kinds
        .iter()
        .map(|k| infersched::schedulers::estimated_peak_bytes(&w, &k.limits(&knobs, &w)))
        .collect();
    let mut jobs = kinds.len();
    let budget = match a.memory_limit {
        Some(g) if g.is_finite() && g > 0.0 && g <= 1e6 => Some((g * (1u64 << 30) as f64) as u64),
        Some(g) => bail!("--memory-limit: expected GiB > 0 and at most 1e6, got {g}"),
        None => infersched::resources::available_memory_bytes(),
    };
    if let Some(available) = budget {
        use infersched::resources::gib;
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
        if several && total > available {
            // Largest first, as many at once as fit.
            let mut sorted = needs.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let mut sum = 0;
            jobs = sorted
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
        }
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(jobs).build()?;
    type Simulated = (Summary, TimeBreakdown, Vec<PathBuf>, Limits);
    let results: Vec<Result<Simulated>> = pool.install(|| {
        kinds
            .par_iter()
            .map(|kind| -> Result<_> {
                let o = produce_heuristic(&w, &cost, *kind, &knobs)?;
                let Some(out) = &a.out else {
                    return Ok((o.summary, o.time_split, Vec::new(), o.limits));
                };
                let dir = if several {
                    out.join(kind.name())
                } else {
                    out.clone()
                };
                let schedule_path = dir.join("schedule.json");
                o.schedule.write(&schedule_path)?;
                let mut paths = vec![schedule_path];
                paths.extend(
                    infersched::output::write_replay_outputs(&dir, &o.replay, &o.summary)
                        .with_context(|| format!("writing results to {}", dir.display()))?,
                );
                if a.trace {
                    let trace_path = dir.join("trace.json");
                    let trace = infersched::report::trace::chrome_trace(
                        &w,
                        kind.name(),
                        &o.schedule,
                        &o.replay,
                    );
                    infersched::core::io::write_bytes_atomic(
                        &trace_path,
                        serde_json::to_string(&trace)?.as_bytes(),
                    )
                    .with_context(|| format!("writing {}", trace_path.display()))?;
                    paths.push(trace_path);
                }
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

fn cmd_solve(a: &SolveArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let limits = a.limits.limits(&cost)?;
    let objective = a.objective;
    let options = SolveOptions {
        warm_start: !a.no_warm_start,
        warm_start_from: a
            .warm_start_from
            .iter()
            .map(|n| n.parse::<SchedulerKind>().map_err(anyhow::Error::msg))
            .collect::<Result<_>>()
            .context("--warm-start-from")?,
        constraints: a.class.constraints(),
        log: a.log,
        ..a.milp.options()?
    };
    // An interrupt writes the best schedule the solver holds by then (not proven optimal).
    let options = infersched::interrupt::SolveInterruptSaver::observing(
        options,
        a.out.clone(),
        &w,
        limits,
        &cost,
    );
    let outcome = produce_optimal(&w, &cost, &limits, objective, &options);
    infersched::interrupt::clear();
    let outcome = outcome?;
    let (r, summary) = (&outcome.replay, &outcome.summary);
    let report = outcome
        .solve
        .as_ref()
        .context("internal error: the solver's outcome has no report")?;
    let schedule_path = a.out.join("schedule.json");
    let mut schedule = report.schedule.clone();
    schedule.meta =
        Some(serde_json::json!({"producer": "infersched-solver", "objective": objective}));
    schedule.write(&schedule_path)?;
    let mut paths = vec![schedule_path];
    paths.extend(infersched::output::write_replay_outputs(
        &a.out, r, summary,
    )?);
    let solve_path = a.out.join("solve.json");
    let json = serde_json::to_string_pretty(report)? + "\n";
    infersched::core::io::write_bytes_atomic(&solve_path, json.as_bytes())?;
    paths.push(solve_path);
    outln!(
        "{} ({} requests), objective {}, cost model {}",
        a.workload.display(),
        w.len(),
        objective.name(),
        cost.name
    );
    outln!(
        "  status                {}{}",
        report.status.name(),
        if report.horizon_proven_sufficient
            || report.method != infersched::solver::SolveMethod::Milp
        {
            ""
        } else {
            " (within J batches)"
        }
    );
    outln!(
        "  objective (replayed)  {:.6} ms",
        report.replayed_objective * 1e3
    );
    outln!(
        "  best bound            {:.6} ms ({})",
        report.best_bound * 1e3,
        report.bound_method.name()
    );
    outln!(
        "  certified gap         {:.4}%",
        report.certified_gap * 100.0
    );
    if let Some(warm) = &report.warm_start {
        let v = warm.objective;
        outln!(
            "  warm start            {}: {:.6} ms ({:.2}% above the best schedule found)",
            warm.heuristic,
            v * 1e3,
            (v / report.replayed_objective - 1.0) * 100.0
        );
    }
    if let Some(note) = &report.note {
        outln!("  note                  {note}");
    }
    match report.method {
        infersched::solver::SolveMethod::BestHeuristic => outln!(
            "  method                best schedule of the heuristics, the list search and the relaxation's plans, with a bound that needs no exact model ({}; no exact model was solved)",
            report.bound_method.name()
        ),
        infersched::solver::SolveMethod::IndependentGroups => outln!(
            "  method                independent groups: each burst of requests solved on its own, schedules concatenated, bounds averaged ({}; see the note)",
            report.bound_method.name()
        ),
        infersched::solver::SolveMethod::CountingSearch => outln!(
            "  method                counting search (offline, identical-request classes): {} states, {:.2} s; optimal over all schedules",
            report.states_expanded.unwrap_or(0),
            report.solve_s
        ),
        infersched::solver::SolveMethod::Milp => {
            let size = report.model.unwrap_or(infersched::solver::ModelSize {
                rows: 0,
                columns: 0,
                integers: 0,
            });
            outln!(
                "  horizon J             {} batches{}",
                report.horizon,
                if report.horizon_proven_sufficient {
                    " (proven sufficient)"
                } else {
                    ""
                }
            );
            outln!(
                "  model                 {} rows, {} columns, {} integers; build {:.2} s, solve {:.2} s",
                size.rows,
                size.columns,
                size.integers,
                report.build_s,
                report.solve_s
            );
        }
    }
    out!("{}", infersched::output::summary_text(summary));
    out!(
        "{}",
        infersched::output::time_split_text(&outcome.time_split)
    );
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

fn cmd_compare(a: &CompareArgs) -> Result<()> {
    use infersched::compare::{self, CompareSpec, Contender, Setting};
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let knobs = a.knobs.knobs(&w, &cost)?;
    let limits = a.knobs.explicit_limits(&knobs)?;
    let objective = a.objective;
    let contenders = Contender::parse_list(&a.schedulers)
        .map_err(anyhow::Error::msg)
        .context("--schedulers")?;
    // An interrupt writes the best schedule the solver holds by then to DIR/optimal.
    let solve = infersched::interrupt::SolveInterruptSaver::observing(
        SolveOptions {
            constraints: a.class.constraints(),
            ..a.milp.options()?
        },
        a.out.join("optimal"),
        &w,
        limits,
        &cost,
    );
    let spec = CompareSpec {
        contenders,
        objective,
        limits,
        knobs,
        solve,
    };
    let setting = Setting {
        workload: a.workload.display().to_string(),
        workload_stats: WorkloadStats::of(&w),
        cost_model: cost.name.clone(),
        objective,
        limits,
        time_limit_s: a.milp.time_limit,
    };
    outln!(
        "{} requests from {}, cost model {}, objective {}",
        w.len(),
        a.workload.display(),
        cost.name,
        objective.name()
    );
    let c = compare::run(&w, &cost, &spec);
    infersched::interrupt::clear();
    let parts = infersched::report::ReportParts {
        plots: !a.no_plots,
        traces: !a.no_traces,
    };
    infersched::report::write_comparison_parts(&a.out, &w, &setting, &c, parts)
        .with_context(|| format!("writing the comparison to {}", a.out.display()))?;
    let rows = c.rows();
    outln!(
        "\n{}",
        infersched::report::comparison_text(&rows, objective)
    );
    if let Some(r) = c.optimal().and_then(|o| o.solve.as_ref()) {
        outln!(
            "optimal: {} by {}, best bound {:.6} ms ({}), certified gap {:.4}%, solved in {:.1} s{}",
            r.status.name(),
            r.method.name(),
            r.best_bound * 1e3,
            r.bound_method.name(),
            r.certified_gap * 100.0,
            r.solve_s,
            if r.status == infersched::solver::SolveStatus::Optimal {
                ""
            } else {
                "\n  no proof of optimality: the ratios are to the best schedule found; /bound is proven"
            }
        );
    }
    let failures = c.failures();
    for (name, e) in &failures {
        eprintln!("error: {name}: {e}");
    }
    outln!(
        "report: {}  (tables: comparison.csv, comparison.json{}{})",
        a.out.join("report.html").display(),
        if a.no_plots { "" } else { "; plots/" },
        if a.no_traces {
            ""
        } else {
            "; trace-<scheduler>.json"
        }
    );
    if !failures.is_empty() {
        bail!(
            "{} of {} schedulers failed",
            failures.len(),
            c.results.len()
        );
    }
    Ok(())
}

fn calibration_model(spec: &str) -> Result<cost_model::ModelSpec> {
    if let Some(m) = cost_model::roofline::model_named(spec) {
        return Ok(m);
    }
    let path = Path::new(spec);
    if !path.is_file() {
        bail!(
            "--model: \"{spec}\" is neither a known model ({}) nor a model-spec JSON file",
            cost_model::roofline::ROOFLINE_MODELS.join(", ")
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {spec}"))?;
    serde_json::from_str(&text).with_context(|| format!("{spec}: not a model spec"))
}

fn cmd_calibrate(a: &CalibrateArgs) -> Result<()> {
    use infersched::calibration::{RunInfo, write_calibration};
    use infersched::kernels_calibration::{self as kc, samples};
    let (run, all) = if let Some(dir) = &a.from_samples {
        let read = |name: &str| -> Result<Vec<samples::Sample>> {
            let p = dir.join(name);
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            Ok(samples::read_csv(&text, &p.display().to_string())?)
        };
        let mut all = read("samples.csv")?;
        // A run without composite batches (a -fa2 refit) has no validation.csv.
        if dir.join("validation.csv").exists() {
            all.extend(read("validation.csv")?);
        }
        let p = dir.join("run.json");
        let mut run: RunInfo = serde_json::from_str(
            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("{}: not a calibration run.json", p.display()))?;
        if let Some(t) = &a.attention_times {
            let text =
                std::fs::read_to_string(t).with_context(|| format!("reading {}", t.display()))?;
            all = samples::with_attention_times(&all, &text, &t.display().to_string())?;
            run.attention_source = Some(infersched::calibration::attention_source(
                &t.file_name().unwrap_or_default().to_string_lossy(),
            ));
        }
        (run, all)
    } else {
        let model = calibration_model(a.model.as_deref().unwrap_or_default())?;
        kc::gpu::LayerShape::of(&model, a.tp)?;
        let (ctx, info) = kc::probe(a.gpu)?;
        let limits = kc::PlanLimits {
            max_tokens: a.max_tokens,
            ..kc::PlanLimits::default()
        };
        let plan = kc::plan(&limits);
        eprintln!(
            "calibrating {} (TP {}) on {} ({} measurements)",
            model.name,
            a.tp,
            info.name,
            plan.len()
        );
        let mut runner = kc::LayerRunner::new(&ctx, &model, a.tp, &limits)?;
        // The attention kernels must compute attention before their times mean anything.
        let checks = runner.check_attention()?;
        let mut check_max = 0.0f64;
        for c in &checks {
            eprintln!(
                "attention check: {}: max |error| {:.2e} against the CPU reference, KV append {}",
                c.case,
                c.max_abs_error,
                if c.kv_append_ok { "ok" } else { "WRONG" }
            );
            check_max = check_max.max(c.max_abs_error);
        }
        if !checks.iter().all(kc::gpu::AttentionCheck::passed) {
            bail!(
                "the attention kernels disagree with the CPU reference (tolerance {:e}); nothing was measured",
                kc::gpu::ATTENTION_CHECK_TOLERANCE
            );
        }
        if a.check_kernels {
            outln!(
                "attention kernels agree with the CPU reference on {}: max |error| {check_max:.2e} (tolerance {:e})",
                info.name,
                kc::gpu::ATTENTION_CHECK_TOLERANCE
            );
            return Ok(());
        }
        let bar = indicatif::ProgressBar::new(plan.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:32}] {pos}/{len} measurements, ETA {eta} {msg}",
            )?
            .progress_chars("=> "),
        );
        let mut all = Vec::with_capacity(plan.len());
        for m in &plan {
            bar.set_message(samples::describe(m));
            let ms = runner.time(m, a.warmup, a.repeats)?;
            all.push(samples::Sample::of(m, ms));
            bar.inc(1);
            if bar.is_hidden() && all.len() % 50 == 0 {
                eprintln!("measured {} of {}", all.len(), plan.len());
            }
        }
        bar.finish_and_clear();
        let run = RunInfo {
            model,
            tensor_parallel: a.tp,
            gpu_name: info.name.clone(),
            gpu_memory_bytes: info.memory_bytes,
            compute_capability: format!(
                "{}.{}",
                info.compute_capability.0, info.compute_capability.1
            ),
            driver_cuda_version: info.driver_cuda_version,
            nvrtc_version: format!("{}.{}", info.nvrtc_version.0, info.nvrtc_version.1),
            gpu_clocks: Some(infersched::calibration::GpuClocks {
                multiprocessors: info.multiprocessors,
                sm_clock_mhz: info.sm_clock_mhz,
                memory_clock_mhz: info.memory_clock_mhz,
            }),
            repeats: a.repeats,
            warmup: a.warmup,
            attention_check_max_abs_error: Some(check_max),
            attention_source: None,
        };
        (run, all)
    };
    let out = a
        .out
        .as_deref()
        .context("--out is required unless --check-kernels is given")?;
    let (c, paths) = write_calibration(out, &run, &all)
        .with_context(|| format!("writing the calibration to {}", out.display()))?;
    let s = c.fit.stats;
    outln!(
        "fit on {} samples: R^2 {:.5}, APE median {:.2}%, p95 {:.2}%",
        s.samples,
        s.r2,
        s.ape_median_pct,
        s.ape_p95_pct
    );
    if let Some(v) = c.validation {
        outln!(
            "held-out composite batches ({}): R^2 {:.5}, APE median {:.2}%, p95 {:.2}%",
            v.samples,
            v.r2,
            v.ape_median_pct,
            v.ape_p95_pct
        );
    }
    for (k, f) in infersched::core::Feature::ALL.iter().enumerate() {
        outln!("  {:<14}{:e} ms per layer", f.name(), c.fit.theta_ms[k]);
    }
    outln!("wrote {}", path_list(&paths));
    Ok(())
}

fn cmd_workload(c: &WorkloadCommand) -> Result<()> {
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
            let w = workload::generate(&spec)?;
            workload::write_trace(&w, &a.out)?;
            out!("{}", WorkloadStats::of(&w).to_text());
            outln!("wrote {}", a.out.display());
        }
        WorkloadCommand::Sample(a) => {
            let trace = load_workload(&a.trace)?;
            let selection = match (a.first, a.random) {
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

fn show_model(m: &LinearCostModel, utilization: f64) -> Result<()> {
    let f = &m.file;
    outln!("{}: {}", m.name, f.description);
    outln!(
        "  provenance: {} ({})",
        f.provenance.method,
        f.provenance.source
    );
    outln!("  theta, seconds per unit per batch (whole model):");
    for feature in infersched::core::Feature::ALL {
        outln!("    {:<14}{:e}", feature.name(), m.theta(feature));
    }
    if let (Some(model), Some(gpu)) = (&f.model, &f.gpu) {
        let m_tokens = cost_model::kv_capacity_tokens(model, gpu, f.tensor_parallel, utilization)?;
        outln!(
            "  KV capacity M = {} tokens ({} x {}, TP {}, utilization {}, {} KV bytes/token/GPU, {:.2} GiB weights/GPU)",
            m_tokens,
            model.name,
            gpu.name,
            f.tensor_parallel,
            utilization,
            model.kv_bytes_per_token(f.tensor_parallel),
            model.weight_bytes_per_gpu(f.tensor_parallel) as f64 / (1u64 << 30) as f64
        );
    }
    match cost_model::check_against_roofline(m) {
        Some(checks) => {
            outln!("  against the roofline of its model and GPU (the physical floor):");
            outln!(
                "    {:<44}{:>12}{:>12}{:>8}",
                "batch",
                "this (ms)",
                "floor (ms)",
                "ratio"
            );
            for c in &checks {
                outln!(
                    "    {:<44}{:>12.3}{:>12.3}{:>8.2}{}",
                    c.batch,
                    c.model_s * 1e3,
                    c.roofline_s * 1e3,
                    c.model_s / c.roofline_s,
                    if c.faster_than_physics() {
                        "  FASTER THAN PHYSICS"
                    } else {
                        ""
                    }
                );
            }
            let bad: Vec<&str> = checks
                .iter()
                .filter(|c| c.faster_than_physics())
                .map(|c| c.batch)
                .collect();
            if !bad.is_empty() {
                eprintln!(
                    "warning: {} predicts less time than its GPU's datasheet allows for: {}. Its times are not physically attainable on that GPU; use it to reproduce the results it was published with, and a calibrated preset for predictions.",
                    m.name,
                    bad.join("; ")
                );
            }
        }
        None => outln!(
            "  no roofline check: the file names no model, or a GPU without a known datasheet ({})",
            cost_model::roofline::ROOFLINE_GPUS.join(", ")
        ),
    }
    Ok(())
}

fn cmd_cost_model(c: &CostModelCommand) -> Result<()> {
    match c {
        CostModelCommand::List => {
            for name in cost_model::PRESET_NAMES {
                let m = cost_model::preset(name).expect("listed presets exist");
                outln!("{name:<22}{}", m.file.description);
            }
            outln!(
                "roofline:GPU:MODEL[:tpN]  datasheet roofline bound; GPU: {}; MODEL: {}",
                cost_model::roofline::ROOFLINE_GPUS.join(", "),
                cost_model::roofline::ROOFLINE_MODELS.join(", ")
            );
        }
        CostModelCommand::Show(a) => show_model(&cost_model::resolve(&a.name)?, a.utilization)?,
    }
    Ok(())
}

fn cmd_fit(a: &FitArgs) -> Result<()> {
    // Each input is fitted on its own; their features must not overlap.
    let mut inputs: Vec<(&Path, bool)> = Vec::new();
    if let Some(p) = &a.samples {
        inputs.push((p, false));
    }
    if let Some(p) = &a.vidur_attention {
        inputs.push((p, true));
    }
    let mut fits = Vec::new();
    let mut theta = std::collections::BTreeMap::new();
    for (path, attention) in inputs {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path.display().to_string();
        let samples = if attention {
            Samples::from_vidur_attention_csv(&text, &name, a.tp)?
        } else if a.vidur_mlp {
            Samples::from_vidur_mlp_csv(&text, &name, a.tp)?
        } else {
            Samples::from_csv_str(&text, &name)?
        };
        let report = cost_model::fit_nnls(&samples).with_context(|| format!("fitting {name}"))?;
        if !samples.ignored_columns.is_empty() {
            eprintln!(
                "note: {name}: ignored columns (not a feature name or measured_ms): {}",
                samples.ignored_columns.join(", ")
            );
        }
        if !report.collinear.is_empty() {
            eprintln!(
                "note: {name}: {} collinear with earlier features in these samples: the split of time between them is not identified",
                report
                    .collinear
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for f in &samples.features {
            if theta
                .insert(f.name().to_owned(), report.theta_ms[*f as usize])
                .is_some()
            {
                bail!(
                    "feature {} is in more than one input ({name} and an earlier one); fit each feature from one file",
                    f.name()
                );
            }
        }
        fits.push((name, samples, report));
    }
    let source = fits
        .iter()
        .map(|f| f.0.clone())
        .collect::<Vec<_>>()
        .join(" + ");
    let unidentified: Vec<&str> = fits
        .iter()
        .flat_map(|f| f.2.unidentified.iter().map(|u| u.name()))
        .filter(|u| !theta.contains_key(*u))
        .collect();
    let fit_stats = if let [(_, _, report)] = fits.as_slice() {
        serde_json::to_value(report.stats)?
    } else {
        serde_json::Value::Object(
            fits.iter()
                .map(|(name, _, report)| Ok((name.clone(), serde_json::to_value(report.stats)?)))
                .collect::<Result<_>>()?,
        )
    };
    let file = cost_model::CoefficientFile {
        format: "infersched-cost-model/1".into(),
        name: a.name.clone(),
        description: format!("NNLS fit to {source}"),
        unit: cost_model::TimeUnit::Ms,
        per_layer: a.layers.is_some(),
        layers: a.layers,
        theta: theta.into_iter().collect(),
        model: None,
        gpu: None,
        tensor_parallel: a.tp,
        provenance: cost_model::Provenance {
            method: "nnls-fit".into(),
            source: source.clone(),
            notes: {
                let collinear: Vec<&str> = fits
                    .iter()
                    .flat_map(|f| f.2.collinear.iter().map(|c| c.name()))
                    .collect();
                let mut notes = Vec::new();
                if !unidentified.is_empty() {
                    notes.push(format!(
                        "features all-zero in the samples, set to 0: {}",
                        unidentified.join(", ")
                    ));
                }
                if !collinear.is_empty() {
                    notes.push(format!(
                        "collinear with earlier features in the samples (split not identified): {}",
                        collinear.join(", ")
                    ));
                }
                (!notes.is_empty()).then(|| notes.join("; "))
            },
            fit: Some(fit_stats),
        },
    };
    // Check the file we are about to write loads back.
    let json = serde_json::to_string_pretty(&file)? + "\n";
    LinearCostModel::from_json_str(&json, &a.out)?;
    infersched::core::io::write_bytes_atomic(&a.out, json.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
    for (name, samples, report) in &fits {
        let s = report.stats;
        outln!("fit of {} samples from {name}:", s.samples);
        for f in &samples.features {
            outln!("  {:<14}{:e} ms", f.name(), report.theta_ms[*f as usize]);
        }
        outln!(
            "  R^2 {:.5}; absolute percentage error: median {:.2}%, p95 {:.2}%, max {:.2}%",
            s.r2,
            s.ape_median_pct,
            s.ape_p95_pct,
            s.ape_max_pct
        );
    }
    outln!("wrote {}", a.out.display());
    Ok(())
}

fn timed<T>(repeat: usize, mut f: impl FnMut() -> Result<T>) -> Result<(T, f64, f64)> {
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
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn cmd_bench(a: &BenchArgs) -> Result<()> {
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
    );
    let kinds: Vec<SchedulerKind> = a
        .schedulers
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<SchedulerKind>()
                .map_err(anyhow::Error::msg)
        })
        .collect::<Result<_>>()
        .context("--schedulers")?;
    // The InferMax authors' setting for the 70B model: M = 100,000, C = 16,384, block 1.
    let knobs = Knobs {
        token_budget: Some(16_384),
        kv_capacity: Some(100_000),
        block_size: Some(1),
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
    for (name, w) in [
        ("splitwise_code", &splitwise),
        ("arxiv_poisson1_seed0", &arxiv),
    ] {
        for kind in &kinds {
            let (sim, sim_min, sim_med) = timed(a.repeat, || Ok(kind.simulate(w, &knobs, &cost)?))?;
            let (r, rep_min, rep_med) = timed(a.repeat, || {
                Ok(replay(w, &sim.limits, &cost, &sim.schedule)?)
            })?;
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
            csv.push_str(&format!(
                "{name},{},{},{},{entries},{bytes},{sim_min},{sim_med},{rep_min},{rep_med},{},{}\n",
                w.len(),
                kind.name(),
                s.batches,
                s.makespan_s,
                s.evictions
            ));
        }
    }
    infersched::core::io::write_bytes_atomic(&a.out, csv.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(m) = peak_rss_mib() {
        outln!("peak resident memory of the whole run: {m:.0} MiB");
    }
    outln!("wrote {}", a.out.display());
    Ok(())
}

fn main() -> ExitCode {
    infersched::interrupt::install_handler();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Simulate(a) => cmd_simulate(a),
        Command::Solve(a) => cmd_solve(a),
        Command::Replay(a) => cmd_replay(a),
        Command::Workload(c) => cmd_workload(c),
        Command::CostModel(c) => cmd_cost_model(c),
        Command::Fit(a) => cmd_fit(a),
        Command::Bench(a) => cmd_bench(a),
        Command::Compare(a) => cmd_compare(a),
        Command::Calibrate(a) => cmd_calibrate(a),
        Command::Sweep(a) => match (&a.command, &a.spec, &a.out) {
            (Some(SweepCommand::Merge(m)), _, _) => {
                infersched::sweep::merge_cli(&m.spec, &m.shards, &m.out, m.allow_missing)
            }
            (None, Some(spec), Some(out)) => {
                infersched::sweep::run_cli(spec, out, a.resume, a.shard.as_deref(), a.jobs, a.yes)
            }
            _ => unreachable!("clap requires SPEC and --out without a subcommand"),
        },
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
fn describe(e: &anyhow::Error) -> String {
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
