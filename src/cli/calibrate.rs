//! `calibrate`: measure a layer's kernels on an NVIDIA GPU and fit the cost model.

use super::path_list;
use anyhow::{Context, Result};
use clap::Args;
use infersched::cost_model;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct CalibrateArgs {
    /// Model: llama2-7b, llama3-8b, llama3-70b, a Hugging Face config.json, or a model-spec JSON file.
    #[arg(long, required_unless_present = "from_samples")]
    pub(crate) model: Option<String>,
    /// Tensor-parallel degree (heads and MLP width per GPU divided by it).
    #[arg(long, default_value_t = 1)]
    pub(crate) tp: u32,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub(crate) gpu: usize,
    /// Largest batch in tokens to calibrate for.
    #[arg(long, default_value_t = 8192)]
    pub(crate) max_tokens: u32,
    /// Timed runs per measurement (the median is kept).
    #[arg(long, default_value_t = 10)]
    pub(crate) repeats: usize,
    /// Warm-up runs per measurement.
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: usize,
    /// Redo the fit, validation and files from a recorded run's directory (samples.csv,
    /// validation.csv, run.json) instead of measuring.
    #[arg(long)]
    pub(crate) from_samples: Option<PathBuf>,
    /// With --from-samples: take the attention terms from another implementation's times
    /// on the same shapes (attention-vs-pytorch.csv, written by
    /// kernels-calibration/scripts/attention_vs_pytorch.py) and the linear terms from the
    /// recorded run; the preset is named with a -fa2 suffix.
    #[arg(long, requires = "from_samples")]
    pub(crate) attention_times: Option<PathBuf>,
    /// Only check the attention kernels against the CPU reference on this GPU, then stop.
    #[arg(long, conflicts_with = "from_samples")]
    pub(crate) check_kernels: bool,
    /// Output directory.
    #[arg(long, required_unless_present = "check_kernels")]
    pub(crate) out: Option<PathBuf>,
}

pub(crate) fn calibration_model(spec: &str) -> Result<cost_model::ModelSpec> {
    cost_model::roofline::resolve_model(spec).map_err(|e| anyhow::anyhow!("--model: {e}"))
}

pub(crate) fn cmd_calibrate(a: &CalibrateArgs) -> Result<()> {
    use infersched::calibration::{
        CalibrationEvent, GpuCalibration, GpuCalibrationResult, read_recorded_run,
        write_calibration,
    };
    let (run, all) = if let Some(dir) = &a.from_samples {
        read_recorded_run(dir, a.attention_times.as_deref())?
    } else {
        let calibration = GpuCalibration {
            model: calibration_model(a.model.as_deref().unwrap_or_default())?,
            tensor_parallel: a.tp,
            gpu: a.gpu,
            max_tokens: a.max_tokens,
            warmup: a.warmup,
            repeats: a.repeats,
        };
        let bar = indicatif::ProgressBar::hidden();
        let mut observe = |event: CalibrationEvent<'_>| match event {
            CalibrationEvent::Started { gpu, measurements } => {
                eprintln!(
                    "calibrating {} (TP {}) on {gpu} ({measurements} measurements)",
                    calibration.model.name, a.tp
                );
            }
            CalibrationEvent::AttentionChecked(c) => eprintln!(
                "attention check: {}: max |error| {:.2e} against the CPU reference, KV append {}",
                c.case,
                c.max_abs_error,
                if c.kv_append_ok { "ok" } else { "WRONG" }
            ),
            CalibrationEvent::Measured { done, total, next } => {
                if bar.length().is_none() {
                    bar.set_length(total as u64);
                    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                    if let Ok(style) = indicatif::ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:32}] {pos}/{len} measurements, ETA {eta} {msg}",
                    ) {
                        bar.set_style(style.progress_chars("=> "));
                    }
                }
                bar.set_position(done as u64);
                bar.set_message(next);
                if bar.is_hidden() && done % 50 == 0 {
                    eprintln!("measured {done} of {total}");
                }
            }
        };
        let result = calibration.run(a.check_kernels, &mut observe);
        bar.finish_and_clear();
        match result? {
            GpuCalibrationResult::KernelsChecked { gpu, max_abs_error } => {
                outln!(
                    "attention kernels agree with the CPU reference on {gpu}: max |error| {max_abs_error:.2e} (tolerance {:e})",
                    infersched::kernels_calibration::gpu::ATTENTION_CHECK_TOLERANCE
                );
                return Ok(());
            }
            GpuCalibrationResult::Measured(run, all) => (*run, all),
        }
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
