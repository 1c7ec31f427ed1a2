//! `calibrate`: measure a layer's kernels on an NVIDIA GPU and fit the cost model.

use super::path_list;
use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::cost_model;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct CalibrateArgs {
    /// Model: llama2-7b, llama3-8b, llama3-70b, or a model-spec JSON file.
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

pub(crate) fn cmd_calibrate(a: &CalibrateArgs) -> Result<()> {
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
