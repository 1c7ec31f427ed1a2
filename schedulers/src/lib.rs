//! Heuristic batch schedulers as exact, deterministic policies inside one simulation loop
//! (`schedulers.md`): `vllm`, `vllm-v1`, `sarathi`, `orca`, `orca-max`, `static`, `mcsf`,
//! `fastgen`, `lightllm`, `fastertransformer`.
//!
//! Every policy emits a [`infersched_core::Schedule`] whose metrics are computed by the
//! independent replay, never by the simulator. Ties are broken by arrival time, then
//! request id, so runs are deterministic.

pub mod cluster;
pub mod disaggregated;
pub mod policies;
pub mod router;
pub mod sim;
pub mod virtual_engines;

pub use cluster::{ClusterSimulation, ROUTER_NAMES, Router, simulate_cluster, simulate_cluster_on};
pub use disaggregated::{DisaggregatedSimulation, simulate_disaggregated};
pub use policies::{McsfOrder, PolicyOptions, Victim};
pub use sim::{
    BatchAccount, Policy, SimError, Simulation, Simulator, simulate, simulate_instance,
    simulate_pipelined,
};

use infersched_core::{CostModel, Limits, Workload};

/// The scheduler names `--scheduler` accepts.
pub const SCHEDULER_NAMES: &[&str] = SchedulerKind::NAMES;

/// A heuristic scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// vLLM v0, no chunked prefill.
    Vllm,
    /// vLLM V1, chunked prefill.
    VllmV1,
    /// Sarathi-Serve.
    Sarathi,
    /// Orca reserving `I + O - 1`.
    Orca,
    /// Orca reserving `max_model_len`.
    OrcaMax,
    /// Static (request-level) batching.
    Static,
    /// Memory-constrained shortest-first (Jaillet et al. 2025) with the true output
    /// lengths: shortest outputs admitted first while the running set's future KV peak
    /// fits M; never preempts.
    Mcsf,
    /// DeepSpeed-FastGen's Dynamic SplitFuse (DeepSpeed-MII's ragged batching).
    Fastgen,
    /// LightLLM as Vidur simulates it: admission by the running set's future KV peak
    /// from the true output lengths (clairvoyant), prefill-only and decode-only batches.
    Lightllm,
    /// FasterTransformer as Vidur simulates it: request-level batching reserving
    /// `max_model_len` per request.
    FasterTransformer,
}

infersched_core::named_enum!(SchedulerKind, "scheduler", {
    Vllm => "vllm",
    VllmV1 => "vllm-v1",
    Sarathi => "sarathi",
    Orca => "orca",
    OrcaMax => "orca-max",
    Static => "static",
    Mcsf => "mcsf",
    Fastgen => "fastgen",
    Lightllm => "lightllm",
    FasterTransformer => "fastertransformer",
});

/// Knobs every policy accepts; `None` takes the policy's default.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Knobs {
    /// C.
    pub token_budget: Option<u64>,
    /// P.
    pub prefill_budget: Option<u64>,
    /// M (unlimited when absent).
    pub kv_capacity: Option<u64>,
    /// R_max.
    pub max_running: Option<u64>,
    /// KV block size.
    pub block_size: Option<u32>,
    /// Watermark fraction of M kept free at admission.
    pub watermark: Option<f64>,
    /// Admit only with a full `I + O - 1` reservation.
    pub no_preemption: bool,
    /// Victim rule.
    pub victim: Victim,
    /// Context length reserved by `orca-max`, and vLLM's `max_model_len` for its default
    /// budget [default: the workload's largest `I + O`].
    pub max_model_len: Option<u64>,
    /// MC-SF's admission order.
    pub mcsf_order: McsfOrder,
    /// vLLM V1's `scheduler_reserve_full_isl`: admit a waiting or preempted request only
    /// if blocks for all its known tokens (`I + G`) plus the watermark are free, although
    /// only this step's chunk is allocated [default: on, as in vLLM 0.32]. Only `vllm-v1`
    /// reads it.
    pub reserve_full_isl: Option<bool>,
    /// vLLM V1's `long_prefill_token_threshold`: at most this many tokens per request per
    /// step, unless the request is the only one running or waiting at the start of the step
    /// [default: off]. Only `vllm-v1` reads it.
    pub long_prefill_token_threshold: Option<u64>,
    /// DeepSpeed-FastGen's `max_ragged_sequence_count`: most sequences per step
    /// [default: 512]. Only `fastgen` reads it.
    pub max_ragged_sequence_count: Option<u64>,
    /// LightLLM's (Vidur's) `max_waiting_iters`: decode batches in a row before waiting
    /// requests are tried while others run [default: 10]. Only `lightllm` reads it.
    pub max_waiting_iters: Option<u64>,
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching` (vllm-v1; on by
    /// default, as in vLLM V1).
    pub prefix_caching: Option<bool>,
}

impl Knobs {
    /// Knobs that make every policy run under exactly `limits` (no policy default left:
    /// an unlimited R_max stays unlimited), with the default victim and preemption and no
    /// prefix cache (the solver's model, which these knobs serve, has none).
    pub fn matching(limits: &Limits) -> Self {
        Self {
            token_budget: limits.token_budget,
            prefill_budget: limits.prefill_budget,
            kv_capacity: limits.kv_capacity,
            max_running: Some(limits.max_running.unwrap_or(u64::MAX)),
            block_size: Some(limits.block_size),
            watermark: Some(limits.watermark),
            prefix_caching: Some(false),
            ..Self::default()
        }
    }
}

/// A policy's defaults (`schedulers.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// C (None: unlimited).
    pub token_budget: Option<u64>,
    /// R_max (None: unlimited).
    pub max_running: Option<u64>,
    /// Block size.
    pub block_size: u32,
    /// Watermark.
    pub watermark: f64,
}

impl SchedulerKind {
    /// Whether the policy reads the requests' true output lengths, which no online
    /// scheduler knows (MC-SF orders and admits by them; Vidur's LightLLM admits by them).
    pub fn clairvoyant(self) -> bool {
        matches!(self, Self::Mcsf | Self::Lightllm)
    }

    /// Defaults: vLLM C = max(2048, max_model_len), R_max 256, block 16, watermark 1%;
    /// vLLM-V1 C = 8192, R_max 256, block 16; Sarathi C = 512, R_max 128, block 16,
    /// watermark 1%; Orca and static: no token budget, R_max 256, block 1; MC-SF: no
    /// token budget, R_max 256, block 16; FastGen C = 768 (`max_ragged_batch_size`),
    /// R_max 2048 (`max_tracked_sequences`), block 64 (DeepSpeed's blocked attention for
    /// heads of 128); LightLLM C = 4096, R_max 128, block 1; FasterTransformer no token
    /// budget, R_max 128, block 16 (Vidur's defaults for both).
    pub fn defaults(self, max_model_len: u64) -> Defaults {
        match self {
            Self::Vllm => Defaults {
                token_budget: Some(max_model_len.max(2048)),
                max_running: Some(256),
                block_size: 16,
                watermark: 0.01,
            },
            Self::VllmV1 => Defaults {
                token_budget: Some(8192),
                max_running: Some(256),
                block_size: 16,
                watermark: 0.0,
            },
            Self::Sarathi => Defaults {
                token_budget: Some(512),
                max_running: Some(128),
                block_size: 16,
                watermark: 0.01,
            },
            Self::Mcsf => Defaults {
                token_budget: None,
                max_running: Some(256),
                block_size: 16,
                watermark: 0.0,
            },
            Self::Fastgen => Defaults {
                token_budget: Some(768),
                max_running: Some(2048),
                block_size: 64,
                watermark: 0.0,
            },
            Self::Lightllm => Defaults {
                token_budget: Some(4096),
                max_running: Some(128),
                block_size: 1,
                watermark: 0.0,
            },
            Self::FasterTransformer => Defaults {
                token_budget: None,
                max_running: Some(128),
                block_size: 16,
                watermark: 0.0,
            },
            Self::Orca | Self::OrcaMax | Self::Static => Defaults {
                token_budget: None,
                max_running: Some(256),
                block_size: 1,
                watermark: 0.0,
            },
        }
    }

    /// The limits this policy runs under: each knob, or else the policy's default.
    pub fn limits(self, knobs: &Knobs, workload: &Workload) -> Limits {
        let d = self.defaults(max_model_len(knobs, workload));
        Limits {
            token_budget: knobs.token_budget.or(d.token_budget),
            prefill_budget: knobs.prefill_budget,
            kv_capacity: knobs.kv_capacity,
            max_running: knobs.max_running.or(d.max_running),
            block_size: knobs.block_size.unwrap_or(d.block_size),
            watermark: knobs.watermark.unwrap_or(d.watermark),
        }
    }

    /// The policy object.
    pub fn policy(self, knobs: &Knobs, workload: &Workload) -> Box<dyn Policy> {
        let o = PolicyOptions {
            no_preemption: knobs.no_preemption,
            victim: knobs.victim,
            max_model_len: max_model_len(knobs, workload),
            mcsf_order: knobs.mcsf_order,
            reserve_full_isl: knobs.reserve_full_isl.unwrap_or(true),
            long_prefill_token_threshold: knobs.long_prefill_token_threshold.unwrap_or(0),
            max_ragged_sequence_count: knobs.max_ragged_sequence_count.unwrap_or(512),
            max_waiting_iters: knobs.max_waiting_iters.unwrap_or(10),
            // On by default in vLLM V1, off in v0; no other policy models a cache.
            prefix_caching: match self {
                Self::VllmV1 => knobs.prefix_caching.unwrap_or(true),
                Self::Vllm => knobs.prefix_caching.unwrap_or(false),
                _ => false,
            },
        };
        match self {
            Self::Vllm => Box::new(policies::Vllm(o)),
            Self::VllmV1 => Box::new(policies::VllmV1(o)),
            Self::Sarathi => Box::new(policies::Sarathi(o)),
            Self::Orca => Box::new(policies::Orca {
                options: o,
                reserve_max_model_len: false,
            }),
            Self::OrcaMax => Box::new(policies::Orca {
                options: o,
                reserve_max_model_len: true,
            }),
            Self::Static => Box::new(policies::Static(o)),
            Self::Mcsf => Box::new(policies::Mcsf::new(o)),
            Self::Fastgen => Box::new(policies::Fastgen::new(o)),
            Self::Lightllm => Box::new(policies::Lightllm::new(o)),
            Self::FasterTransformer => Box::new(policies::FasterTransformer(o)),
        }
    }

    /// Whether it runs on a pipeline of several stages (vllm-v1 as vLLM V1's batch queue
    /// does, vllm as vLLM v0's virtual engines, sarathi as Vidur simulates its
    /// micro-batches).
    pub fn pipelines(self) -> bool {
        matches!(self, Self::VllmV1 | Self::Vllm | Self::Sarathi)
    }

    /// The policies a cluster of `replicas` replicas of it runs
    /// ([`simulate_cluster_on`]): one per replica, or where it runs on `pipeline` as vLLM
    /// v0's virtual engines, one per engine (`pipeline.stages` per replica).
    pub fn cluster_policies(
        self,
        knobs: &Knobs,
        workload: &Workload,
        replicas: u32,
        pipeline: &infersched_core::Pipeline,
    ) -> Vec<Box<dyn Policy>> {
        let per_replica =
            if pipeline.is_pipelined() && self.policy(knobs, workload).virtual_engines() {
                pipeline.stages
            } else {
                1
            };
        (0..u64::from(replicas) * u64::from(per_replica))
            .map(|_| self.policy(knobs, workload))
            .collect()
    }

    /// Simulates this scheduler on `workload` with `knobs` and batch times from `cost`.
    pub fn simulate(
        self,
        workload: &Workload,
        knobs: &Knobs,
        cost: &dyn CostModel,
    ) -> Result<Simulation, SimError> {
        self.simulate_on(workload, knobs, cost, &infersched_core::Pipeline::none())
    }

    /// Simulates this scheduler on a replica of `pipeline.stages` pipeline stages
    /// ([`simulate_pipelined`]; several stages only for policies that model them).
    pub fn simulate_on(
        self,
        workload: &Workload,
        knobs: &Knobs,
        cost: &dyn CostModel,
        pipeline: &infersched_core::Pipeline,
    ) -> Result<Simulation, SimError> {
        let limits = self.limits(knobs, workload);
        let mut policy = self.policy(knobs, workload);
        if pipeline.is_pipelined() && policy.virtual_engines() {
            let mut engines: Vec<_> = (0..pipeline.stages)
                .map(|_| self.policy(knobs, workload))
                .collect();
            return virtual_engines::simulate_virtual_engines(
                workload,
                &limits,
                &mut engines,
                cost,
                pipeline,
            );
        }
        simulate_pipelined(workload, &limits, policy.as_mut(), cost, pipeline)
    }
}

/// Bytes a simulation and its replay hold at their peak per schedule entry, measured: 100,000
/// requests (I uniform 16-1,024, O uniform 16-512, ~26.5 million entries) peak at 0.89-1.14
/// GB for vllm, sarathi, orca and mcsf (`/usr/bin/time`), 34-43 bytes per entry; 48 leaves
/// a margin.
pub const PEAK_BYTES_PER_ENTRY: u64 = 48;

/// Bytes per request held besides the schedule (state, records).
pub const PEAK_BYTES_PER_REQUEST: u64 = 256;

/// The memory simulating `workload` under `limits` and replaying the schedule will take
/// at its peak, estimated before anything is allocated: every request has at least `O`
/// token-producing entries and one per prefill chunk of at most C tokens (evictions add
/// more, so this is a floor on the entries, sized with a margin per entry).
pub fn estimated_peak_bytes(workload: &Workload, limits: &Limits) -> u64 {
    let c = limits.token_budget.unwrap_or(u64::MAX).max(1);
    workload
        .requests()
        .iter()
        .map(|r| {
            let entries = u64::from(r.output_tokens) + u64::from(r.input_tokens).div_ceil(c) - 1;
            entries
                .saturating_mul(PEAK_BYTES_PER_ENTRY)
                .saturating_add(PEAK_BYTES_PER_REQUEST)
        })
        .fold(0u64, u64::saturating_add)
}

fn max_model_len(knobs: &Knobs, workload: &Workload) -> u64 {
    knobs.max_model_len.unwrap_or_else(|| {
        workload
            .requests()
            .iter()
            .map(|r| u64::from(r.input_tokens) + u64::from(r.output_tokens))
            .max()
            .unwrap_or(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;

    #[test]
    fn the_memory_estimate_counts_decodes_and_prefill_chunks() {
        let r = |i, o| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: 0.0,
        };
        let w = Workload::new(vec![r(100, 10), r(10, 1)]).unwrap();
        // C = 32: 100 tokens in 4 chunks (3 more entries than the first) + 10; 1 entry.
        let limits = Limits {
            token_budget: Some(32),
            ..Limits::unlimited()
        };
        let entries = (10 + 3) + 1;
        assert_eq!(
            estimated_peak_bytes(&w, &limits),
            entries * PEAK_BYTES_PER_ENTRY + 2 * PEAK_BYTES_PER_REQUEST
        );
        // Without C each prompt is one entry.
        assert_eq!(
            estimated_peak_bytes(&w, &Limits::unlimited()),
            11 * PEAK_BYTES_PER_ENTRY + 2 * PEAK_BYTES_PER_REQUEST
        );
    }

    #[test]
    fn an_instance_simulates_as_its_parts_do() {
        struct PerToken;
        impl infersched_core::CostModel for PerToken {
            fn batch_time_s(&self, f: &infersched_core::BatchFeatures) -> f64 {
                1e-3 + 1e-4 * f.tokens as f64
            }
        }
        let w = Workload::new(vec![
            Request {
                input_tokens: 5,
                output_tokens: 4,
                arrival_s: 0.0,
            };
            4
        ])
        .unwrap();
        let limits = Limits {
            kv_capacity: Some(20),
            ..Limits::unlimited()
        };
        let knobs = Knobs::matching(&limits);
        let kind = SchedulerKind::Vllm;
        let effective = kind.limits(&knobs, &w);
        let by_parts =
            simulate(&w, &effective, kind.policy(&knobs, &w).as_mut(), &PerToken).unwrap();
        let instance = infersched_core::Instance::new(w.clone(), effective, PerToken).unwrap();
        let by_instance =
            simulate_instance(&instance, SchedulerKind::Vllm.policy(&knobs, &w).as_mut()).unwrap();
        assert_eq!(by_parts.schedule, by_instance.schedule);
        // M = 20 holds two of these requests at their peak (8 tokens), not four: it evicts
        // or queues, so the schedule is longer than 4 steps.
        assert!(by_instance.schedule.batches.len() > 4);
        assert!(instance.replay(&by_instance.schedule).is_ok());
    }
}
