//! What every front end (the command line, the Python package) turns its settings into
//! the same way, so that both give the same answers: M from an explicit value, vLLM's
//! block count or the cost model's model and GPU, and the `max_model_len` check. Errors
//! name the command line's flags (the Python package's keyword arguments have the same
//! names with underscores).

use crate::core::Workload;
use crate::cost_model::{HardwareError, LinearCostModel};
use thiserror::Error;

/// Why a setting is refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// `--num-gpu-blocks` below 2.
    #[error("--num-gpu-blocks: expected at least 2 (vLLM keeps one as its null block), got {0}")]
    TooFewGpuBlocks(u64),
    /// `--num-gpu-blocks` x the block size does not fit 64 bits.
    #[error("--num-gpu-blocks {blocks} x block size {block} overflows")]
    GpuBlocksOverflow {
        /// The blocks asked for.
        blocks: u64,
        /// The block size.
        block: u64,
    },
    /// No M given and the cost model names no model and GPU.
    #[error("--kv-capacity is required: cost model {0} has no model and GPU spec to derive M from")]
    NoKvCapacity(String),
    /// M from the model and GPU failed (weights larger than the memory, a bad fraction...).
    #[error(transparent)]
    Hardware(#[from] HardwareError),
    /// `--max-model-len` shorter than a request.
    #[error(
        "--max-model-len {len}: request {index} has I + O = {tokens} tokens (I = {input}, O = {output}); expected at least the workload's longest request"
    )]
    MaxModelLen {
        /// The length given.
        len: u64,
        /// The first request longer than it.
        index: usize,
        /// Its I + O.
        tokens: u64,
        /// Its I.
        input: u32,
        /// Its O.
        output: u32,
    },
    /// `--disaggregate` with a cost model that names no model (the KV bytes to move).
    #[error(
        "--disaggregate: the cost model {0} names no model, so the KV bytes per token to move are unknown (use a preset or roofline model that names one)"
    )]
    NoKvModel(String),
    /// `--disaggregate` without a bandwidth, and no GPU datasheet to take NVLink's from.
    #[error(
        "--disaggregate: the cost model {0} names no GPU with a datasheet; give the link's bandwidth with --kv-bandwidth GB/S"
    )]
    NoKvBandwidth(String),
    /// `--pp` above 1 with a cost model that names no model (its layers, what a stage
    /// sends).
    #[error(
        "--pp: the cost model {0} names no model, so its layers and the activations a stage sends are unknown (use a preset or roofline model that names one)"
    )]
    NoPipelineModel(String),
    /// `--pp` without `--pp-bandwidth`, and no GPU datasheet to take NVLink's from.
    #[error(
        "--pp: the cost model {0} names no GPU with a datasheet; give the link's bandwidth with --pp-bandwidth GB/S"
    )]
    NoPipelineBandwidth(String),
    /// `--pp-bandwidth` or `--pp-latency-us` without pipeline stages.
    #[error(
        "--pp-bandwidth and --pp-latency-us describe the link between pipeline stages: give --pp 2 or more"
    )]
    PipelineLinkWithoutStages,
    /// `--pp-bandwidth` not a positive number.
    #[error("--pp-bandwidth: expected GB/s > 0, got {0}")]
    PipelineBandwidth(f64),
    /// A pipeline figure out of range.
    #[error(transparent)]
    Pipeline(#[from] crate::core::PipelineError),
    /// A KV link figure out of range.
    #[error("--kv-bandwidth / --kv-latency-us: {0}")]
    KvLink(#[from] crate::core::disaggregated::DisaggregationError),
}

/// The KV link of a disaggregated cluster (`--disaggregate`): each GPU's KV bytes per
/// token from `cost`'s model and tensor-parallel degree, `bandwidth_gbps` GB/s per GPU in
/// one direction (default: the NVLink of `cost`'s GPU per its datasheet) and
/// `latency_us` per transfer.
pub fn kv_link(
    cost: &LinearCostModel,
    bandwidth_gbps: Option<f64>,
    latency_us: f64,
) -> Result<crate::core::disaggregated::KvLink, SettingsError> {
    let f = &cost.file;
    let model = f
        .model
        .as_ref()
        .ok_or_else(|| SettingsError::NoKvModel(cost.name.clone()))?;
    let gbps = match bandwidth_gbps {
        Some(g) => g,
        None => f
            .gpu
            .as_ref()
            .and_then(crate::cost_model::roofline::datasheet_of)
            .map(|s| s.nvlink / 1e9)
            .ok_or_else(|| SettingsError::NoKvBandwidth(cost.name.clone()))?,
    };
    let link = crate::core::disaggregated::KvLink {
        bytes_per_token: model.kv_bytes_per_token(f.tensor_parallel) as f64,
        bandwidth_bytes_per_s: gbps * 1e9,
        latency_s: latency_us * 1e-6,
        connector: crate::core::disaggregated::KvConnector::default(),
    };
    link.validate()?;
    Ok(link)
}

/// M for vLLM's `--num-gpu-blocks N` with blocks of `block` tokens: the pool less vLLM's
/// null block, `(N - 1) x block`.
pub fn kv_capacity_from_num_gpu_blocks(blocks: u64, block: u32) -> Result<u64, SettingsError> {
    if blocks < 2 {
        return Err(SettingsError::TooFewGpuBlocks(blocks));
    }
    let block = u64::from(block);
    (blocks - 1)
        .checked_mul(block)
        .ok_or(SettingsError::GpuBlocksOverflow { blocks, block })
}

/// M: `explicit` if given, else what `cost`'s model and GPU leave for KV with
/// `memory_fraction` of the GPU's memory for weights, activations and KV (vLLM's
/// `--gpu-memory-utilization`), on each GPU of `stages` pipeline stages (the largest
/// stage's layers; 1: the whole model).
pub fn kv_capacity_for(
    explicit: Option<u64>,
    cost: &LinearCostModel,
    memory_fraction: f64,
    stages: u32,
) -> Result<u64, SettingsError> {
    if let Some(m) = explicit {
        return Ok(m);
    }
    let f = &cost.file;
    match (&f.model, &f.gpu) {
        (Some(model), Some(gpu)) => Ok(crate::cost_model::kv_capacity_tokens(
            &model.pipeline_stage(stages)?,
            gpu,
            f.tensor_parallel,
            memory_fraction,
        )?),
        _ => Err(SettingsError::NoKvCapacity(cost.name.clone())),
    }
}

/// M from `--kv-capacity`, else `--num-gpu-blocks` (blocks of `block` tokens), else the
/// cost model's model and GPU at `--gpu-memory-utilization` on each of `stages` pipeline
/// stages.
pub fn kv_capacity(
    kv_capacity: Option<u64>,
    num_gpu_blocks: Option<u64>,
    gpu_memory_utilization: f64,
    cost: &LinearCostModel,
    block: u32,
    stages: u32,
) -> Result<u64, SettingsError> {
    let explicit = match num_gpu_blocks {
        Some(n) => Some(kv_capacity_from_num_gpu_blocks(n, block)?),
        None => kv_capacity,
    };
    kv_capacity_for(explicit, cost, gpu_memory_utilization, stages)
}

/// The pipeline of `--pp stages` (semantics.md, "Pipeline parallelism"): what a stage
/// sends per token from `cost`'s model ([`crate::cost_model::ModelSpec::
/// pipeline_bytes_per_token`]) over `bandwidth_gbps` GB/s (default: the NVLink of `cost`'s
/// GPU per its datasheet), `latency_us` per send (default: NCCL's tuning model's,
/// [`crate::cost_model::roofline::send_recv_latency_s`]). One stage needs nothing of the
/// cost model.
pub fn pipeline(
    cost: &LinearCostModel,
    stages: u32,
    bandwidth_gbps: Option<f64>,
    latency_us: Option<f64>,
) -> Result<crate::core::Pipeline, SettingsError> {
    use crate::cost_model::roofline;
    let none = crate::core::Pipeline::none();
    if stages == 1 && (bandwidth_gbps.is_some() || latency_us.is_some()) {
        return Err(SettingsError::PipelineLinkWithoutStages);
    }
    if stages == 1 {
        return Ok(none);
    }
    let f = &cost.file;
    let model = f
        .model
        .as_ref()
        .ok_or_else(|| SettingsError::NoPipelineModel(cost.name.clone()))?;
    model.pipeline_stage(stages)?;
    let gbps = match bandwidth_gbps {
        Some(g) => g,
        None => f
            .gpu
            .as_ref()
            .and_then(roofline::datasheet_of)
            .map(|s| s.nvlink / 1e9)
            .ok_or_else(|| SettingsError::NoPipelineBandwidth(cost.name.clone()))?,
    };
    if !(gbps.is_finite() && gbps > 0.0) {
        return Err(SettingsError::PipelineBandwidth(gbps));
    }
    let p = crate::core::Pipeline {
        stages,
        send_latency_s: latency_us
            .map_or(roofline::send_recv_latency_s(roofline::Link::NvLink), |u| {
                u * 1e-6
            }),
        send_s_per_token: model.pipeline_bytes_per_token() as f64 / (gbps * 1e9),
    };
    p.validate()?;
    Ok(p)
}

/// Refuses a `--max-model-len` shorter than one of `w`'s requests (vLLM rejects such a
/// request; infersched says so up front).
pub fn check_max_model_len(w: &Workload, len: Option<u64>) -> Result<(), SettingsError> {
    let Some(len) = len else { return Ok(()) };
    let longer = w
        .requests()
        .iter()
        .enumerate()
        .find(|(_, r)| u64::from(r.input_tokens) + u64::from(r.output_tokens) > len);
    match longer {
        Some((index, r)) => Err(SettingsError::MaxModelLen {
            len,
            index,
            tokens: u64::from(r.input_tokens) + u64::from(r.output_tokens),
            input: r.input_tokens,
            output: r.output_tokens,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Request;

    #[test]
    fn gpu_blocks_leave_out_the_null_block_and_refuse_fewer_than_two() {
        assert_eq!(kv_capacity_from_num_gpu_blocks(3, 16).unwrap(), 32);
        assert!(matches!(
            kv_capacity_from_num_gpu_blocks(1, 16),
            Err(SettingsError::TooFewGpuBlocks(1))
        ));
        assert!(kv_capacity_from_num_gpu_blocks(u64::MAX, 16).is_err());
    }

    #[test]
    fn explicit_m_wins_and_a_bare_preset_without_hardware_is_refused() {
        let cost = crate::cost_model::preset("llama2-7b-a100").unwrap();
        assert_eq!(
            kv_capacity(Some(100), None, 0.9, &cost, 16, 1).unwrap(),
            100
        );
        assert_eq!(
            kv_capacity(Some(100), Some(5), 0.9, &cost, 16, 1).unwrap(),
            64
        );
        let mut bare = cost.clone();
        bare.file.model = None;
        let e = kv_capacity(None, None, 0.9, &bare, 16, 1).unwrap_err();
        assert!(e.to_string().contains("--kv-capacity is required"), "{e}");
    }

    #[test]
    fn a_pipeline_sends_the_models_activations_over_nvlink_and_holds_more_kv() {
        let cost = crate::cost_model::preset("llama3-8b-h100").unwrap();
        assert_eq!(
            pipeline(&cost, 1, None, None).unwrap(),
            crate::core::Pipeline::none()
        );
        let e = pipeline(&cost, 1, Some(100.0), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("give --pp 2 or more"), "{e}");
        let p = pipeline(&cost, 4, None, None).unwrap();
        // 2 x 4096 x 2 bytes per token over the H100's 450 GB/s; 7.2 us per send.
        assert!(
            (p.send_s_per_token - 16384.0 / 450e9).abs() < 1e-18,
            "{p:?}"
        );
        assert!((p.send_latency_s - 7.2e-6).abs() < 1e-15);
        let slow = pipeline(&cost, 2, Some(64.0), Some(20.0)).unwrap();
        assert!((slow.send_s_per_token - 16384.0 / 64e9).abs() < 1e-18);
        assert!((slow.send_latency_s - 2e-5).abs() < 1e-15);
        for (stages, bw, needle) in [
            (33, None, "32 layers"),
            (2, Some(0.0), "--pp-bandwidth"),
            (2, Some(f64::NAN), "--pp-bandwidth"),
        ] {
            let e = pipeline(&cost, stages, bw, None).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let mut bare = cost.clone();
        bare.file.model = None;
        assert!(
            pipeline(&bare, 2, None, None)
                .unwrap_err()
                .to_string()
                .contains("--pp")
        );
        let one = kv_capacity(None, None, 0.9, &cost, 16, 1).unwrap();
        let two = kv_capacity(None, None, 0.9, &cost, 16, 2).unwrap();
        assert!(two > 2 * one, "{one} -> {two}");
    }

    #[test]
    fn max_model_len_names_the_first_longer_request() {
        let r = |i, o| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: 0.0,
        };
        let w = Workload::new(vec![r(4, 2), r(10, 3)]).unwrap();
        assert!(check_max_model_len(&w, Some(13)).is_ok());
        let e = check_max_model_len(&w, Some(12)).unwrap_err().to_string();
        assert!(e.contains("request 1 has I + O = 13"), "{e}");
    }
}
