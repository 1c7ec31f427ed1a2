//! The command line's modules: one per command, and the flag groups they share.

use anyhow::{Result, bail};
use clap::Args;
use infersched::core::Limits;
use infersched::core::names::Named;
use infersched::cost_model::LinearCostModel;
use infersched::schedulers::{Knobs, McsfOrder, Victim};
use infersched::solver::{PolicyConstraints, SolveOptions};
use std::path::{Path, PathBuf};

pub(crate) mod bench;
pub(crate) mod calibrate;
pub(crate) mod capacity;
pub(crate) mod compare;
pub(crate) mod cost_model;
pub(crate) mod fit;
pub(crate) mod replay;
pub(crate) mod simulate;
pub(crate) mod solve;
pub(crate) mod sweep;
pub(crate) mod workload;

/// The policy class the optimal scheduler searches (the best schedule such a policy can
/// reach).
#[derive(Args, Clone)]
pub(crate) struct ClassArgs {
    /// Best schedule without evictions.
    #[arg(long)]
    pub(crate) no_evict: bool,
    /// Best schedule where each prefill phase runs in one batch.
    #[arg(long)]
    pub(crate) no_chunk: bool,
    /// Best schedule where no batch mixes prefills and decodes.
    #[arg(long)]
    pub(crate) no_mix: bool,
    /// Best schedule that first admits requests in arrival order.
    #[arg(long)]
    pub(crate) fcfs: bool,
    /// Best schedule where a request reserves I + O - 1 KV tokens from its first step (Orca).
    #[arg(long)]
    pub(crate) reserve: bool,
}

impl ClassArgs {
    pub(crate) fn constraints(&self) -> PolicyConstraints {
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
pub(crate) struct MilpArgs {
    /// Batch slots J [default: provably sufficient for makespan, else 1.5 x the warm start's].
    #[arg(long)]
    pub(crate) horizon: Option<usize>,
    /// Time limit for the MILP (HiGHS) in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub(crate) time_limit: f64,
    /// Threads for HiGHS and for the batch-index bound's sweeps, 1 to 256.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: u32,
    /// Relative MIP gap at which HiGHS stops.
    #[arg(long, default_value_t = 1e-6)]
    pub(crate) mip_gap: f64,
    /// Always solve the MILP, even where the exact counting search applies (offline
    /// workload without C, P or FCFS) or the best heuristic schedule already meets the
    /// combinatorial bound.
    #[arg(long)]
    pub(crate) milp_only: bool,
    /// Memory (GiB) the exact models may take (the state graphs, the searches' stores, the
    /// MILP at about 3.6 kB per arc variable), estimated before any is built; past it the
    /// best schedule found without them is returned with a combinatorial bound.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) memory_limit: f64,
    /// Schedules the priority-list search may try (simulated and replayed) to improve the
    /// best heuristic schedule, the warm start and the answer where no exact model fits;
    /// 0 turns it off. It also stops at half the time limit.
    #[arg(long, default_value_t = SolveOptions::default().list_search_evaluations)]
    pub(crate) list_search_tries: usize,
    /// Plans each plan search may turn into schedules and replay (from the phase
    /// relaxation's plan, or re-planning the best schedule, for mean latency and TTFT; at
    /// least one). It also stops at the end of its share of the time limit.
    #[arg(long, default_value_t = SolveOptions::default().plan_search_evaluations)]
    pub(crate) plan_search_tries: usize,
    /// Skip the phase relaxation, the mean-latency bound solved as a small MILP before the
    /// exact model, and the schedules from its plan (up to 48 requests; it takes up to a
    /// quarter of the time limit, or most of it where no exact model fits).
    #[arg(long)]
    pub(crate) no_phase_relaxation: bool,
    /// Solve the whole workload at once for mean latency and TTFT, instead of one burst at
    /// a time where the best heuristic schedule serves each burst before the next arrives.
    #[arg(long)]
    pub(crate) no_independent_groups: bool,
}

impl MilpArgs {
    /// Checked solver options, with the progress line on a terminal.
    pub(crate) fn options(&self) -> Result<SolveOptions> {
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
            plan_search_evaluations: self.plan_search_tries,
            phase_relaxation: !self.no_phase_relaxation,
            independent_groups: !self.no_independent_groups,
            horizon: self.horizon,
            ..SolveOptions::default()
        })
    }
}

/// Where M comes from: the flag, vLLM's block count, or the cost model's model and GPU.
/// One group shared by every command that takes limits.
#[derive(Args, Clone)]
pub(crate) struct KvCapacityArgs {
    /// M: KV capacity in tokens [default: from the cost model's model and GPU at --gpu-memory-utilization].
    #[arg(long, conflicts_with_all = ["num_gpu_blocks", "gpu_memory_utilization"])]
    pub(crate) kv_capacity: Option<u64>,
    /// vLLM's KV pool in blocks, its null block included: M = (N - 1) x the block size.
    #[arg(long, conflicts_with = "gpu_memory_utilization")]
    pub(crate) num_gpu_blocks: Option<u64>,
    /// Fraction of GPU memory for weights, activations and KV when M comes from the cost model's model and GPU (vLLM's --gpu-memory-utilization).
    #[arg(long, default_value_t = infersched::cost_model::DEFAULT_GPU_MEMORY_UTILIZATION)]
    pub(crate) gpu_memory_utilization: f64,
}

impl KvCapacityArgs {
    /// M from --kv-capacity, --num-gpu-blocks (blocks of `block` tokens), or `cost`'s model
    /// and GPU at --gpu-memory-utilization.
    pub(crate) fn kv_capacity(&self, cost: &LinearCostModel, block: u32) -> Result<u64> {
        self.kv_capacity_on(cost, block, 1)
    }

    /// M as [`Self::kv_capacity`], on each GPU of `stages` pipeline stages.
    pub(crate) fn kv_capacity_on(
        &self,
        cost: &LinearCostModel,
        block: u32,
        stages: u32,
    ) -> Result<u64> {
        Ok(infersched::settings::kv_capacity(
            self.kv_capacity,
            self.num_gpu_blocks,
            self.gpu_memory_utilization,
            cost,
            block,
            stages,
        )?)
    }
}

/// A clap parser for an enum with one name table ([`infersched::core::names::Named`]):
/// `--help` lists the names, and a wrong one is answered with them.
pub(crate) fn named<T: Named>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(T::NAMES).map(|s: String| {
        T::from_name(&s).expect("PossibleValuesParser admits only the table's names")
    })
}

/// Declares a flag group of the per-batch limits of semantics.md (C, P, M, R_max, block
/// size, watermark). The flags are the same everywhere; only what an unset one means
/// differs: unlimited where the limits are the question (`solve`, `replay`), each policy's
/// own default where a heuristic runs (`simulate`, `compare`). So the group is written
/// once and declared twice, with the defaults its help states.
macro_rules! batch_limit_flags {
    ($(#[$meta:meta])* $name:ident, C: $c:literal, R_max: $r:literal, block: $b:literal, watermark: $wm:literal) => {
        $(#[$meta])*
        #[derive(Args, Clone)]
        pub(crate) struct $name {
            #[arg(
                long,
                visible_alias = "max-num-batched-tokens",
                help = concat!("C: tokens per batch [default: ", $c, "]. vLLM: --max-num-batched-tokens")
            )]
            pub(crate) token_budget: Option<u64>,
            /// P: prefill tokens per batch, P <= C [default: C].
            #[arg(long)]
            pub(crate) prefill_budget: Option<u64>,
            #[command(flatten)]
            pub(crate) memory: KvCapacityArgs,
            #[arg(
                long,
                visible_alias = "max-num-seqs",
                help = concat!("R_max: requests holding KV [default: ", $r, "]. vLLM: --max-num-seqs")
            )]
            pub(crate) max_running: Option<u64>,
            #[arg(long, help = concat!("KV block size in tokens [default: ", $b, "]"))]
            pub(crate) block_size: Option<u32>,
            #[arg(long, help = concat!("Fraction of M kept free at admission [default: ", $wm, "]"))]
            pub(crate) watermark: Option<f64>,
        }

        impl $name {
            /// The limits these flags give alone, with M = `kv_capacity`: C, P and R_max
            /// where given (else unlimited), the block size given or 1, the watermark given
            /// or 0; validated.
            pub(crate) fn given_limits(&self, kv_capacity: u64) -> Result<Limits> {
                let l = Limits {
                    token_budget: self.token_budget,
                    prefill_budget: self.prefill_budget,
                    kv_capacity: Some(kv_capacity),
                    max_running: self.max_running,
                    block_size: self.block_size.unwrap_or(1),
                    watermark: self.watermark.unwrap_or(0.0),
                };
                l.validate()?;
                Ok(l)
            }
        }
    };
}

batch_limit_flags!(
    /// The per-batch limits as the question (`solve`, `replay`): unset ones are unlimited.
    LimitArgs,
    C: "unlimited",
    R_max: "unlimited",
    block: "1",
    watermark: "0; carried with the limits, the replay checks M only"
);

batch_limit_flags!(
    /// The per-batch limits where heuristics run (`simulate`, `compare`): unset ones take
    /// each policy's default.
    PolicyLimitArgs,
    C: "per policy; vllm max(2048, max_model_len), vllm-v1 8192, sarathi 512, fastgen 768, lightllm 4096, orca/static/mcsf/fastertransformer unlimited",
    R_max: "per policy; 256, sarathi/lightllm/fastertransformer 128, fastgen 2048",
    block: "per policy; 16, fastgen 64, orca/static/lightllm 1 (mcsf 16)",
    watermark: "per policy; vllm and sarathi 0.01"
);

impl LimitArgs {
    /// The limits; M from --kv-capacity, --num-gpu-blocks, or `cost`'s model and GPU (the
    /// default every command shares).
    pub(crate) fn limits(&self, cost: &LinearCostModel) -> Result<Limits> {
        self.limits_on(cost, 1)
    }

    /// The limits as [`Self::limits`], M on each GPU of `stages` pipeline stages.
    pub(crate) fn limits_on(&self, cost: &LinearCostModel, stages: u32) -> Result<Limits> {
        let block = self.block_size.unwrap_or(1);
        self.given_limits(self.memory.kv_capacity_on(cost, block, stages)?)
    }
}

/// Knobs of the heuristic schedulers; unset ones take each policy's default.
#[derive(Args, Clone)]
pub(crate) struct KnobArgs {
    #[command(flatten)]
    pub(crate) limits: PolicyLimitArgs,
    /// Admit only with a full I + O - 1 reservation (never preempt).
    #[arg(long)]
    pub(crate) no_preemption: bool,
    /// Victim on a memory shortfall, by arrival (newest, oldest) or by KV held (shortest, longest).
    #[arg(long, default_value = "newest", value_parser = named::<Victim>())]
    pub(crate) victim: Victim,
    /// Context length reserved by orca-max and used in vllm's default budget [default: the workload's largest I + O].
    #[arg(long)]
    pub(crate) max_model_len: Option<u64>,
    /// MC-SF's admission order, shortest first by: output (O, the paper's rule), tokens (I + O) or kv-area (O I + O (O - 1) / 2).
    #[arg(long, default_value = "output", value_parser = named::<McsfOrder>())]
    pub(crate) mcsf_order: McsfOrder,
    /// vllm-v1: admit a waiting or preempted request only if blocks for all its known tokens (the prompt, or I + G on a refill) plus the watermark are free, as vLLM 0.32 does by default [default: on].
    #[arg(long, overrides_with = "no_scheduler_reserve_full_isl")]
    pub(crate) scheduler_reserve_full_isl: bool,
    /// vllm-v1: check only this step's chunk at admission (vLLM's --no-scheduler-reserve-full-isl).
    #[arg(long, overrides_with = "scheduler_reserve_full_isl")]
    pub(crate) no_scheduler_reserve_full_isl: bool,
    /// vllm-v1: at most this many tokens per request per step unless it is the only request running or waiting (vLLM's --long-prefill-token-threshold; 0 = off) [default: 0].
    #[arg(long)]
    pub(crate) long_prefill_token_threshold: Option<u64>,
    /// fastgen: most sequences per step (DeepSpeed's max_ragged_sequence_count) [default: 512].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_ragged_sequence_count: Option<u64>,
    /// lightllm: decode batches in a row before waiting requests are tried while others run (Vidur's max_waiting_iters; LightLLM's router_max_wait_tokens) [default: 10].
    #[arg(long)]
    pub(crate) max_waiting_iters: Option<u64>,
    /// vllm-v1 and vllm: automatic prefix caching: a request takes the leading KV blocks of its prompt already in the cache (equal prompt block ids, or its own blocks after a preemption) instead of computing them, by vLLM V1's rule (vllm-v1) or vLLM v0's (vllm: blocks shared within a step are computed by each prompt, the budget counts cached tokens, LRU eviction) [default: on for vllm-v1, off for vllm, as in vLLM].
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub(crate) enable_prefix_caching: bool,
    /// vllm-v1 and vllm: no prefix caching (vLLM's --no-enable-prefix-caching).
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub(crate) no_enable_prefix_caching: bool,
}

impl KnobArgs {
    /// `Some(false)` for --no-scheduler-reserve-full-isl, `Some(true)` for the flag, else
    /// the policy's default.
    pub(crate) fn reserve_full_isl(&self) -> Option<bool> {
        if self.no_scheduler_reserve_full_isl {
            Some(false)
        } else if self.scheduler_reserve_full_isl {
            Some(true)
        } else {
            None
        }
    }

    /// `Some(false)` for --no-enable-prefix-caching, `Some(true)` for the flag, else the
    /// policy's default.
    pub(crate) fn prefix_caching(&self) -> Option<bool> {
        if self.no_enable_prefix_caching {
            Some(false)
        } else if self.enable_prefix_caching {
            Some(true)
        } else {
            None
        }
    }

    /// The knobs these flags set (M from the flags or the cost model); refuses a
    /// --max-model-len shorter than the workload's longest request.
    pub(crate) fn knobs(
        &self,
        w: &infersched::core::Workload,
        cost: &LinearCostModel,
    ) -> Result<Knobs> {
        self.knobs_on(w, cost, 1)
    }

    /// The knobs as [`Self::knobs`], M on each GPU of `stages` pipeline stages.
    pub(crate) fn knobs_on(
        &self,
        w: &infersched::core::Workload,
        cost: &LinearCostModel,
        stages: u32,
    ) -> Result<Knobs> {
        infersched::settings::check_max_model_len(w, self.max_model_len)?;
        let l = &self.limits;
        let block = l.block_size.unwrap_or(16);
        Ok(Knobs {
            token_budget: l.token_budget,
            prefill_budget: l.prefill_budget,
            kv_capacity: Some(l.memory.kv_capacity_on(cost, block, stages)?),
            max_running: l.max_running,
            block_size: l.block_size,
            watermark: l.watermark,
            no_preemption: self.no_preemption,
            victim: self.victim,
            max_model_len: self.max_model_len,
            mcsf_order: self.mcsf_order,
            reserve_full_isl: self.reserve_full_isl(),
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_ragged_sequence_count: self.max_ragged_sequence_count,
            max_waiting_iters: self.max_waiting_iters,
            prefix_caching: self.prefix_caching(),
        })
    }

    /// The limits the flags set explicitly, for the optimal scheduler (which has no policy
    /// defaults): C, P and R_max where given, M as for the heuristics, the block size given
    /// or 1, no watermark (a policy's admission rule, not a limit of the GPU).
    pub(crate) fn explicit_limits(&self, cost: &LinearCostModel) -> Result<Limits> {
        Ok(Limits {
            watermark: 0.0,
            ..self.limits.given_limits(self.kv_capacity(cost)?)?
        })
    }

    /// M from --kv-capacity, --num-gpu-blocks, or the cost model's model and GPU.
    pub(crate) fn kv_capacity(&self, cost: &LinearCostModel) -> Result<u64> {
        // vLLM's default block size when none is given.
        let l = &self.limits;
        l.memory.kv_capacity(cost, l.block_size.unwrap_or(16))
    }
}

/// Paths for a "wrote ..." line.
/// Refuses a `--scheduler` list naming one scheduler twice.
pub(crate) fn refuse_repeated_schedulers(
    kinds: &[infersched::schedulers::SchedulerKind],
) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = kinds.iter().find(|k| !seen.insert(**k)) {
        bail!("--scheduler: {} is listed twice", dup.name());
    }
    Ok(())
}

/// `--enable-prefix-caching` asked for where only some (or none) of `kinds` model a
/// prefix cache: refused when none does (the run would silently have no cache), a note
/// naming the others when some do.
pub(crate) fn check_prefix_caching(
    knobs: &KnobArgs,
    kinds: &[infersched::schedulers::SchedulerKind],
) -> Result<()> {
    use infersched::schedulers::SchedulerKind;
    if !knobs.enable_prefix_caching || knobs.no_enable_prefix_caching {
        return Ok(());
    }
    let without: Vec<&str> = kinds
        .iter()
        .filter(|k| !matches!(k, SchedulerKind::VllmV1 | SchedulerKind::Vllm))
        .map(|k| k.name())
        .collect();
    if without.is_empty() {
        return Ok(());
    }
    let why = "only vllm-v1 and vllm (vLLM v0) model prefix caching \
               (docs/design/schedulers.md)";
    if without.len() == kinds.len() {
        bail!(
            "--enable-prefix-caching: {why}; {} would run without a cache",
            without.join(", ")
        );
    }
    eprintln!(
        "note: --enable-prefix-caching: {why}; {} run without a cache",
        without.join(", ")
    );
    Ok(())
}

pub(crate) fn path_list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn load_workload(path: &Path) -> Result<infersched::core::Workload> {
    Ok(infersched::workload::read_trace(path)?)
}

/// Pipeline parallelism (`simulate`, `replay`).
#[derive(clap::Args)]
pub(crate) struct PipelineArgs {
    /// Pipeline-parallel stages per replica (vLLM's --pipeline-parallel-size): the layers
    /// split over P GPUs, each batch flowing through them, up to P batches in flight
    /// (vLLM V1's batch queue, Vidur's micro-batches for sarathi); M is then each stage
    /// GPU's (from the model and GPU, when not given). vllm-v1, vllm and sarathi.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(infersched::core::pipeline::MAX_STAGES)))]
    pub(crate) pp: u32,
    /// With --pp: the bandwidth between consecutive stages, GB/s per GPU, one direction
    /// [default: the NVLink of the cost model's GPU, from its datasheet].
    #[arg(long, value_name = "GB/S")]
    pub(crate) pp_bandwidth: Option<f64>,
    /// With --pp: a fixed time per send between stages, in microseconds [default: 7.2,
    /// NCCL's tuning model over NVLink].
    #[arg(long, value_name = "US")]
    pub(crate) pp_latency_us: Option<f64>,
}

impl PipelineArgs {
    /// The pipeline for `cost`'s model and GPU ([`infersched::settings::pipeline`]).
    pub(crate) fn pipeline(
        &self,
        cost: &LinearCostModel,
    ) -> anyhow::Result<infersched::core::Pipeline> {
        Ok(infersched::settings::pipeline(
            cost,
            self.pp,
            self.pp_bandwidth,
            self.pp_latency_us,
        )?)
    }
}

/// The KV link of `--disaggregate` (`simulate`, `capacity`).
#[derive(clap::Args)]
pub(crate) struct KvLinkArgs {
    /// With --disaggregate: the KV link's bandwidth per GPU, one direction, in GB/s
    /// [default: the NVLink of the cost model's GPU, from its datasheet].
    #[arg(long, requires = "disaggregate", value_name = "GB/S")]
    pub(crate) kv_bandwidth: Option<f64>,
    /// With --disaggregate: a fixed time per KV transfer, in microseconds.
    #[arg(
        long,
        requires = "disaggregate",
        default_value_t = 0.0,
        value_name = "US"
    )]
    pub(crate) kv_latency_us: f64,
    /// With --disaggregate: how the KV moves, as vLLM's KV connectors move it: nixl
    /// (pulled: the decode replica admits the request, allocating its blocks, then reads
    /// the KV; the prefill replica keeps it until then) or p2p-nccl (pushed at the first
    /// token into the decode instance's own buffer, taken at admission: vLLM's
    /// P2pNcclConnector, removed from vLLM before 0.32).
    #[arg(
        long,
        requires = "disaggregate",
        default_value = "nixl",
        value_name = "CONNECTOR"
    )]
    pub(crate) kv_connector: infersched::core::disaggregated::KvConnector,
}

impl KvLinkArgs {
    /// The link for `cost`'s model and GPU ([`infersched::settings::kv_link`]).
    pub(crate) fn link(
        &self,
        cost: &infersched::cost_model::LinearCostModel,
    ) -> anyhow::Result<infersched::core::disaggregated::KvLink> {
        let link = infersched::settings::kv_link(cost, self.kv_bandwidth, self.kv_latency_us)?;
        Ok(infersched::core::disaggregated::KvLink {
            connector: self.kv_connector,
            ..link
        })
    }
}
