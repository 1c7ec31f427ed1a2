//! `cost-model list | show`: presets beside the roofline of their model and GPU.

use anyhow::Result;
use clap::{Args, Subcommand};
use infersched::cost_model::{self, LinearCostModel};

#[derive(Subcommand)]
pub(crate) enum CostModelCommand {
    /// List the built-in presets.
    List,
    /// Show a preset's or file's coefficients and the KV capacity of its model and GPU.
    Show(ShowArgs),
}

#[derive(Args)]
pub(crate) struct ShowArgs {
    /// Preset name or coefficient JSON file.
    pub(crate) name: String,
    /// Fraction of GPU memory given to weights and KV (as vLLM's gpu_memory_utilization).
    #[arg(long, default_value_t = cost_model::DEFAULT_GPU_MEMORY_UTILIZATION)]
    pub(crate) utilization: f64,
}

/// Tensor parallelism's all-reduces for the model, GPU and degree of `m`, at the link
/// bandwidths of the GPU's datasheet (nothing at TP 1 or without a known model and GPU).
fn show_communication(m: &LinearCostModel) -> Result<()> {
    let f = &m.file;
    let (Some(model), Some(gpu)) = (&f.model, &f.gpu) else {
        return Ok(());
    };
    let Some(sheet) = cost_model::roofline::datasheet_of(gpu) else {
        return Ok(());
    };
    show_pipeline_sends(model, &sheet)?;
    if f.tensor_parallel <= 1 {
        return Ok(());
    }
    use cost_model::roofline::{Link, all_reduce_s_per_token};
    outln!(
        "  tensor parallel {}: two all-reduces per layer of hidden {} x {} bytes per token, a ring sending 2 (T - 1) / T of them per GPU:",
        f.tensor_parallel,
        model.hidden,
        model.dtype_bytes
    );
    let latency_in_model = f.provenance.method == "roofline" && f.name.ends_with(":nccl");
    for link in [Link::NvLink, Link::Pcie] {
        let each = cost_model::roofline::all_reduce_latency_s(f.tensor_parallel, link);
        outln!(
            "    NCCL latency over {:<7}{:.1} us per all-reduce, {:e} s per batch (whole model){}",
            link.name(),
            each * 1e6,
            2.0 * each * f64::from(model.layers),
            if latency_in_model && f.name.contains(":pcie") == (link == Link::Pcie) {
                "  (in this model's one term)"
            } else {
                ""
            }
        );
    }
    for link in [Link::NvLink, Link::Pcie] {
        let per_token =
            all_reduce_s_per_token(model, f.tensor_parallel, sheet.link_bandwidth(link))
                * f64::from(model.layers);
        outln!(
            "    over {:<7}({:>4.0} GB/s per direction) {:e} s per token (whole model){}",
            link.name(),
            sheet.link_bandwidth(link) / 1e9,
            per_token,
            if f.provenance.method == "roofline" && f.name.contains(":pcie") == (link == Link::Pcie)
            {
                "  (in this model's tokens term)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// What `--pp` sends between consecutive stages for `model`, over each link of `sheet`.
fn show_pipeline_sends(
    model: &cost_model::ModelSpec,
    sheet: &cost_model::roofline::Datasheet,
) -> Result<()> {
    use cost_model::roofline::{Link, send_recv_latency_s};
    let bytes = model.pipeline_bytes_per_token();
    outln!(
        "  pipeline stages (--pp P, up to {} for {} layers): each batch's hidden states and residual, 2 x {} x {} = {bytes} bytes per token, sent P - 1 times:",
        model.layers.min(infersched::core::pipeline::MAX_STAGES),
        model.layers,
        model.hidden,
        model.dtype_bytes
    );
    for link in [Link::NvLink, Link::Pcie] {
        outln!(
            "    sends over {:<7}({:>4.0} GB/s per direction) {:.2} ns per token + {:.1} us each",
            link.name(),
            sheet.link_bandwidth(link) / 1e9,
            bytes as f64 / sheet.link_bandwidth(link) * 1e9,
            send_recv_latency_s(link) * 1e6
        );
    }
    Ok(())
}

pub(crate) fn show_model(m: &LinearCostModel, utilization: f64) -> Result<()> {
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
    show_communication(m)?;
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
            infersched::cost_models::warn_if_unphysical(m);
        }
        None => outln!(
            "  no roofline check: the file names no model, or a GPU without a known datasheet ({})",
            cost_model::roofline::ROOFLINE_GPUS.join(", ")
        ),
    }
    Ok(())
}

pub(crate) fn cmd_cost_model(c: &CostModelCommand) -> Result<()> {
    match c {
        CostModelCommand::List => {
            for name in cost_model::PRESET_NAMES {
                let m = cost_model::preset(name).expect("listed presets exist");
                outln!("{name:<22}{}", m.file.description);
            }
            outln!(
                "roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]]  datasheet roofline bound; GPU: {}; MODEL: {}",
                cost_model::roofline::ROOFLINE_GPUS.join(", "),
                cost_model::roofline::ROOFLINE_MODELS.join(", ")
            );
        }
        CostModelCommand::Show(a) => show_model(&cost_model::resolve(&a.name)?, a.utilization)?,
    }
    Ok(())
}
