//! The keyword arguments (the command's flags, underscores for dashes) and what they
//! become: limits, knobs, solver options, SLOs.

use crate::errors::{err, named};
use infersched::capacity::CapacitySpec;
use infersched::core::{Limits, Slo, SloReport, Workload};
use infersched::cost_model::LinearCostModel;
use infersched::produce::Outcome;
use infersched::schedulers::{Knobs, McsfOrder, Router, SchedulerKind, Victim};
use infersched::solver::{PolicyConstraints, SolveOptions};
use pyo3::prelude::*;
use std::path::PathBuf;

/// The per-batch limits as keyword arguments (the command's flags, underscores for dashes).
#[derive(FromPyObject, Default)]
#[pyo3(from_item_all)]
pub(crate) struct LimitKwargs {
    pub(crate) token_budget: Option<u64>,
    pub(crate) prefill_budget: Option<u64>,
    pub(crate) kv_capacity: Option<u64>,
    pub(crate) num_gpu_blocks: Option<u64>,
    pub(crate) gpu_memory_utilization: f64,
    pub(crate) max_running: Option<u64>,
    pub(crate) block_size: Option<u32>,
    pub(crate) watermark: Option<f64>,
}

impl LimitKwargs {
    /// M as every command derives it (blocks of `block` tokens for --num-gpu-blocks).
    pub(crate) fn kv_capacity(&self, cost: &LinearCostModel, block: u32) -> PyResult<u64> {
        self.kv_capacity_on(cost, block, 1)
    }

    /// M as [`Self::kv_capacity`], on each GPU of `stages` pipeline stages.
    pub(crate) fn kv_capacity_on(
        &self,
        cost: &LinearCostModel,
        block: u32,
        stages: u32,
    ) -> PyResult<u64> {
        infersched::settings::kv_capacity(
            self.kv_capacity,
            self.num_gpu_blocks,
            self.gpu_memory_utilization,
            cost,
            block,
            stages,
        )
        .map_err(err)
    }

    /// The limits `compare` gives the solver: those set (block size 1 and C, P, R_max
    /// unlimited where unset), M as the heuristics get it, no watermark (a policy's
    /// admission rule, not a limit of the GPU).
    pub(crate) fn explicit_limits(&self, cost: &LinearCostModel) -> PyResult<Limits> {
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: Some(self.kv_capacity(cost, self.block_size.unwrap_or(16))?),
            max_running: self.max_running,
            block_size: self.block_size.unwrap_or(1),
            watermark: self.watermark.unwrap_or(0.0),
        };
        l.validate().map_err(err)?;
        Ok(Limits {
            watermark: 0.0,
            ..l
        })
    }

    /// The limits as `solve` and `replay` read them: unset ones unlimited, block 1.
    pub(crate) fn limits(&self, cost: &LinearCostModel) -> PyResult<Limits> {
        self.limits_on(cost, 1)
    }

    /// The limits as [`Self::limits`], M on each GPU of `stages` pipeline stages.
    pub(crate) fn limits_on(&self, cost: &LinearCostModel, stages: u32) -> PyResult<Limits> {
        let block = self.block_size.unwrap_or(1);
        let l = Limits {
            token_budget: self.token_budget,
            prefill_budget: self.prefill_budget,
            kv_capacity: Some(self.kv_capacity_on(cost, block, stages)?),
            max_running: self.max_running,
            block_size: block,
            watermark: self.watermark.unwrap_or(0.0),
        };
        l.validate().map_err(err)?;
        Ok(l)
    }
}

/// The heuristics' knobs as keyword arguments (unset ones take each policy's default).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct KnobKwargs {
    pub(crate) no_preemption: bool,
    pub(crate) victim: String,
    pub(crate) max_model_len: Option<u64>,
    pub(crate) mcsf_order: String,
    pub(crate) scheduler_reserve_full_isl: Option<bool>,
    pub(crate) long_prefill_token_threshold: Option<u64>,
    pub(crate) max_ragged_sequence_count: Option<u64>,
    pub(crate) max_waiting_iters: Option<u64>,
    pub(crate) enable_prefix_caching: Option<bool>,
}

pub(crate) fn knobs(
    w: &Workload,
    cost: &LinearCostModel,
    l: &LimitKwargs,
    k: &KnobKwargs,
) -> PyResult<Knobs> {
    knobs_on(w, cost, l, k, 1)
}

/// The knobs as [`knobs`], M on each GPU of `stages` pipeline stages.
pub(crate) fn knobs_on(
    w: &Workload,
    cost: &LinearCostModel,
    l: &LimitKwargs,
    k: &KnobKwargs,
    stages: u32,
) -> PyResult<Knobs> {
    infersched::settings::check_max_model_len(w, k.max_model_len).map_err(err)?;
    if k.max_ragged_sequence_count == Some(0) {
        return Err(err("max_ragged_sequence_count: expected at least 1, got 0"));
    }
    Ok(Knobs {
        token_budget: l.token_budget,
        prefill_budget: l.prefill_budget,
        kv_capacity: Some(l.kv_capacity_on(cost, l.block_size.unwrap_or(16), stages)?),
        max_running: l.max_running,
        block_size: l.block_size,
        watermark: l.watermark,
        no_preemption: k.no_preemption,
        victim: named::<Victim>("victim", &k.victim)?,
        max_model_len: k.max_model_len,
        mcsf_order: named::<McsfOrder>("mcsf_order", &k.mcsf_order)?,
        reserve_full_isl: k.scheduler_reserve_full_isl,
        long_prefill_token_threshold: k.long_prefill_token_threshold,
        max_ragged_sequence_count: k.max_ragged_sequence_count,
        max_waiting_iters: k.max_waiting_iters,
        prefix_caching: k.enable_prefix_caching,
    })
}

pub(crate) fn cost_model(spec: &str) -> PyResult<LinearCostModel> {
    infersched::cost_models::resolve(spec).map_err(err)
}

pub(crate) fn slos(slo: &[String]) -> PyResult<Vec<Slo>> {
    slo.iter()
        .map(|s| s.parse::<Slo>().map_err(|e| err(format!("slo {s:?}: {e}"))))
        .collect()
}

pub(crate) fn with_slo(mut outcome: Outcome, slo: &[Slo]) -> Outcome {
    if !slo.is_empty() {
        outcome.summary.slo = Some(SloReport::of(&outcome.replay, slo));
    }
    outcome
}

/// The solver's options as keyword arguments (the command's flags).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct SolveKwargs {
    pub(crate) time_limit: f64,
    pub(crate) threads: u32,
    pub(crate) mip_gap: f64,
    pub(crate) memory_limit: f64,
    pub(crate) horizon: Option<usize>,
    pub(crate) milp_only: bool,
    pub(crate) list_search_tries: usize,
    pub(crate) plan_search_tries: usize,
    pub(crate) no_phase_relaxation: bool,
    pub(crate) no_independent_groups: bool,
    pub(crate) no_warm_start: bool,
    pub(crate) warm_start_from: Vec<String>,
    pub(crate) no_evict: bool,
    pub(crate) no_chunk: bool,
    pub(crate) no_mix: bool,
    pub(crate) fcfs: bool,
    pub(crate) reserve: bool,
}

impl SolveKwargs {
    /// Checked options, as `solve`'s flags give them.
    pub(crate) fn options(&self) -> PyResult<SolveOptions> {
        if !self.time_limit.is_finite() || self.time_limit <= 0.0 {
            return Err(err("time_limit must be > 0 seconds"));
        }
        if !(0.0..1.0).contains(&self.mip_gap) {
            return Err(err("mip_gap must be in [0, 1)"));
        }
        if !(1..=256).contains(&self.threads) {
            return Err(err(format!(
                "threads: expected 1 to 256, got {}",
                self.threads
            )));
        }
        if !self.memory_limit.is_finite() || self.memory_limit <= 0.0 || self.memory_limit > 1e6 {
            return Err(err("memory_limit must be > 0 and at most 1e6 GiB"));
        }
        let defaults = SolveOptions::default();
        let warm_start_from = self.warm_start_from.iter();
        Ok(SolveOptions {
            memory_limit_bytes: (self.memory_limit * (1u64 << 30) as f64) as u64,
            time_limit_s: self.time_limit,
            threads: self.threads,
            mip_rel_gap: self.mip_gap,
            max_search_states: if self.milp_only {
                0
            } else {
                defaults.max_search_states
            },
            list_search_evaluations: self.list_search_tries,
            plan_search_evaluations: self.plan_search_tries,
            phase_relaxation: !self.no_phase_relaxation,
            independent_groups: !self.no_independent_groups,
            horizon: self.horizon,
            warm_start: !self.no_warm_start,
            warm_start_from: warm_start_from
                .map(|n| named::<SchedulerKind>("warm_start_from", n))
                .collect::<PyResult<_>>()?,
            constraints: PolicyConstraints {
                no_evict: self.no_evict,
                no_chunk: self.no_chunk,
                no_mix: self.no_mix,
                fcfs: self.fcfs,
                reserve: self.reserve,
            },
            ..defaults
        })
    }
}

/// Replicas and their router (`--replicas`, `--router`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct ClusterKwargs {
    pub(crate) replicas: u32,
    pub(crate) router: String,
}

/// A disaggregated cluster's split and KV link (`simulate`'s `disaggregate`,
/// `kv_bandwidth`, `kv_latency_us`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct SplitKwargs {
    /// `P:D`, or None for colocated replicas.
    pub(crate) disaggregate: Option<String>,
    /// The KV link's bandwidth per GPU in GB/s (None: the GPU's NVLink).
    pub(crate) kv_bandwidth: Option<f64>,
    /// A fixed time per KV transfer in microseconds.
    pub(crate) kv_latency_us: f64,
    /// How the KV moves: `nixl` (pulled) or `p2p-nccl` (pushed).
    pub(crate) kv_connector: String,
}

/// Each replica's pipeline (`simulate`'s `pp`, `pp_bandwidth`, `pp_latency_us`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct PipelineKwargs {
    pub(crate) pp: u32,
    pub(crate) pp_bandwidth: Option<f64>,
    pub(crate) pp_latency_us: Option<f64>,
}

impl PipelineKwargs {
    /// The pipeline for `cost`'s model and GPU, as `--pp` makes it.
    pub(crate) fn pipeline(&self, cost: &LinearCostModel) -> PyResult<infersched::core::Pipeline> {
        infersched::settings::pipeline(cost, self.pp, self.pp_bandwidth, self.pp_latency_us)
            .map_err(err)
    }
}

impl ClusterKwargs {
    /// None for one replica, else the replicas and the router; checked.
    pub(crate) fn cluster(&self) -> PyResult<Option<(u32, Router)>> {
        let max = infersched::core::cluster::MAX_REPLICAS;
        if !(1..=max).contains(&self.replicas) {
            return Err(err(format!(
                "replicas: expected 1 to {max}, got {}",
                self.replicas
            )));
        }
        let router = self
            .router
            .parse::<Router>()
            .map_err(|e| err(format!("router: {e}")))?;
        Ok((self.replicas > 1).then_some((self.replicas, router)))
    }

    /// `compare`'s cluster: `router` may list several, comma-separated (every heuristic
    /// runs behind each); None with one replica.
    pub(crate) fn cluster_of_routers(&self) -> PyResult<Option<infersched::compare::ClusterRun>> {
        let routers = self
            .router
            .split(',')
            .map(|r| {
                r.trim()
                    .parse::<Router>()
                    .map_err(|e| err(format!("router: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let one = ClusterKwargs {
            replicas: self.replicas,
            router: self
                .router
                .split(',')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        if one.cluster()?.is_none() && routers.len() > 1 {
            return Err(err(format!(
                "router lists {} routers: they spread requests over replicas=2 or more",
                routers.len()
            )));
        }
        Ok(one
            .cluster()?
            .map(|(replicas, _)| infersched::compare::ClusterRun { replicas, routers }))
    }
}

/// Where and how a comparison runs, beside its settings.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct CompareKwargs {
    pub(crate) schedulers: String,
    pub(crate) objective: String,
    pub(crate) cluster: ClusterKwargs,
    pub(crate) out: PathBuf,
    pub(crate) plots: bool,
    pub(crate) traces: bool,
}

/// The capacity search's rule and precision (`capacity`'s flags).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct CapacityKwargs {
    pub(crate) warmup: f64,
    pub(crate) cooldown: f64,
    pub(crate) min_rate: f64,
    pub(crate) max_rate: f64,
    pub(crate) tolerance: f64,
    pub(crate) max_probes: usize,
    /// `trace` or `poisson[:SEED]` (`capacity --arrivals`).
    pub(crate) arrivals: String,
    /// Also bisect the goodput search's schedules (`capacity --best-found`).
    pub(crate) best_found: bool,
    /// `P:D`: a disaggregated cluster instead of replicas (`capacity --disaggregate`).
    pub(crate) disaggregate: Option<String>,
    /// The KV link's bandwidth per GPU in GB/s (`--kv-bandwidth`; None: the GPU's NVLink).
    pub(crate) kv_bandwidth: Option<f64>,
    /// A fixed time per KV transfer in microseconds (`--kv-latency-us`).
    pub(crate) kv_latency_us: f64,
    /// `nixl` or `p2p-nccl` (`--kv-connector`).
    pub(crate) kv_connector: String,
    /// Pipeline stages of each replica (`--pp`).
    pub(crate) pp: u32,
}

impl CapacityKwargs {
    /// Its disaggregated split and KV link.
    pub(crate) fn split(&self) -> SplitKwargs {
        SplitKwargs {
            disaggregate: self.disaggregate.clone(),
            kv_bandwidth: self.kv_bandwidth,
            kv_latency_us: self.kv_latency_us,
            kv_connector: self.kv_connector.clone(),
        }
    }

    /// The search for `slos` (checked by the search itself).
    pub(crate) fn spec(&self, slos: Vec<Slo>) -> PyResult<CapacitySpec> {
        let arrivals = self
            .arrivals
            .parse()
            .map_err(|e| err(format!("arrivals: {e}")))?;
        Ok(CapacitySpec {
            slos,
            warmup: self.warmup,
            cooldown: self.cooldown,
            min_rate: self.min_rate,
            max_rate: self.max_rate,
            tolerance: self.tolerance,
            max_probes: self.max_probes,
            arrivals,
        })
    }
}
