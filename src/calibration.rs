//! `calibrate`: measure a layer's kernels on the GPU (crate `kernels-calibration`), fit the
//! coefficients, validate them on composite batches, and write the results. The writing
//! half also runs on recorded samples (`calibrate --from-samples DIR`), so it needs no GPU.

use crate::core::io::write_bytes_atomic;
use crate::cost_model::{
    CoefficientFile, GpuSpec, LinearCostModel, ModelSpec, Provenance, TimeUnit,
};
use crate::kernels_calibration::samples::{self, Calibration, Sample};
use crate::kernels_calibration::{Group, calibrate};
use crate::report::{Plot, svg, write_plots};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// What was calibrated, on what (`run.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Model shape.
    pub model: ModelSpec,
    /// Tensor-parallel degree.
    pub tensor_parallel: u32,
    /// GPU name as the driver reports it.
    pub gpu_name: String,
    /// GPU memory in bytes.
    pub gpu_memory_bytes: u64,
    /// Compute capability, e.g. "9.0".
    pub compute_capability: String,
    /// Driver's CUDA version, e.g. 13000.
    pub driver_cuda_version: i32,
    /// NVRTC version, e.g. "13.0".
    pub nvrtc_version: String,
    /// Streaming multiprocessors, peak SM and memory clocks in MHz (absent in runs
    /// recorded before they were read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_clocks: Option<GpuClocks>,
    /// Timed repeats per measurement (median kept) and warm-up runs.
    pub repeats: usize,
    /// Warm-up runs per measurement.
    pub warmup: usize,
    /// Largest difference between the attention kernels and a CPU reference before the
    /// run (`kernels_calibration::gpu::LayerRunner::check_attention`); absent in runs
    /// recorded before the check existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_check_max_abs_error: Option<f64>,
    /// Where the attention terms come from when not from this run's kernels
    /// (`calibrate --attention-times`); the preset's name then ends in `-fa2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_source: Option<String>,
}

/// [`RunInfo::attention_source`] of a refit whose attention times come from `file`
/// (`calibrate --attention-times`).
pub fn attention_source(file: &str) -> String {
    format!(
        "attention terms fitted from {file} (PyTorch scaled_dot_product_attention, flash backend, on the same shapes); linear terms and the rest from the recorded run"
    )
}

/// What the driver reports of the GPU's size and peak clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuClocks {
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Peak SM clock (MHz).
    pub sm_clock_mhz: u32,
    /// Peak memory clock (MHz).
    pub memory_clock_mhz: u32,
}

/// A short GPU name for preset names: `h200`, `a100`, ... or the driver's name.
pub fn short_gpu_name(name: &str) -> String {
    let lower = name.to_lowercase();
    for known in ["h200", "h100", "a100", "l40s", "a10g", "l4", "b200"] {
        if lower.contains(known) {
            return known.to_string();
        }
    }
    lower.split_whitespace().last().unwrap_or("gpu").to_string()
}

/// Writes `samples.csv` (fit groups), `validation.csv` (composite batches), `run.json`,
/// `coefficients.json` and `validation.svg|png` into `dir` (no validation files without
/// composite batches); returns the fit and the paths.
pub fn write_calibration(
    dir: &Path,
    run: &RunInfo,
    all: &[Sample],
) -> io::Result<(Calibration, Vec<PathBuf>)> {
    std::fs::create_dir_all(dir)?;
    let outputs = [
        "samples.csv",
        "validation.csv",
        "run.json",
        "coefficients.json",
        "validation.svg",
        "validation.png",
    ]
    .map(|f| dir.join(f));
    crate::core::io::refuse_links(&outputs)?;
    let c = calibrate(all).map_err(io::Error::other)?;
    let (fit_rows, validation_rows): (Vec<Sample>, Vec<Sample>) = all
        .iter()
        .cloned()
        .partition(|s| s.group != Group::Composite);
    let mut paths = Vec::new();
    for (name, rows) in [
        ("samples.csv", &fit_rows),
        ("validation.csv", &validation_rows),
    ] {
        if rows.is_empty() {
            continue;
        }
        let p = dir.join(name);
        crate::core::io::write_atomic(&p, |w| samples::write_csv(rows, w))?;
        paths.push(p);
    }
    let run_path = dir.join("run.json");
    let text = serde_json::to_string_pretty(run).map_err(io::Error::other)? + "\n";
    write_bytes_atomic(&run_path, text.as_bytes())?;
    paths.push(run_path);

    let file = coefficient_file(run, &c, fit_rows.len(), validation_rows.len());
    let name = file.name.clone();
    let json = serde_json::to_string_pretty(&file).map_err(io::Error::other)? + "\n";
    let coeff_path = dir.join("coefficients.json");
    LinearCostModel::from_json_str(&json, &coeff_path).map_err(io::Error::other)?;
    write_bytes_atomic(&coeff_path, json.as_bytes())?;
    paths.push(coeff_path);
    if c.validation.is_some() {
        paths.extend(write_plots(dir, &[validation_plot(&name, &c)])?);
    }
    Ok((c, paths))
}

/// The coefficient file of a calibration: its fit per feature, the model and GPU, and how
/// it was measured (`fit` and `held_out` samples).
fn coefficient_file(
    run: &RunInfo,
    c: &Calibration,
    fit: usize,
    held_out: usize,
) -> CoefficientFile {
    let gpu = short_gpu_name(&run.gpu_name);
    let theta = crate::core::Feature::ALL
        .iter()
        .enumerate()
        .map(|(k, f)| (f.name().to_string(), c.fit.theta_ms[k]))
        .collect();
    CoefficientFile {
        format: crate::cost_model::linear::COST_MODEL_FORMAT.to_string(),
        name: preset_name(run),
        description: description(run),
        unit: TimeUnit::Ms,
        per_layer: true,
        layers: Some(run.model.layers),
        theta,
        model: Some(run.model.clone()),
        gpu: Some(GpuSpec {
            name: gpu,
            memory_bytes: run.gpu_memory_bytes,
        }),
        tensor_parallel: run.tensor_parallel,
        provenance: Provenance {
            method: "calibration".into(),
            source: measured_on(run),
            notes: Some(format!(
                "median of {} timed runs after {} warm-up runs per measurement; {fit} fit samples, {held_out} held-out composite batches{}",
                run.repeats,
                run.warmup,
                if run.attention_source.is_some() {
                    " (none: composites run this crate's attention kernels, so they validate the preset without the -fa2 suffix, not this one)"
                } else {
                    ""
                }
            )),
            fit: Some(serde_json::json!({
                "fit": c.fit.stats,
                "validation": c.validation,
                "unidentified": c.fit.unidentified.iter().map(|f| f.name()).collect::<Vec<_>>(),
            })),
        },
    }
}

/// Where a calibration ran: the GPU, its clocks, the driver and NVRTC.
fn measured_on(run: &RunInfo) -> String {
    format!(
        "infersched calibrate on {} (compute capability {}{}, driver CUDA {}, NVRTC {})",
        run.gpu_name,
        run.compute_capability,
        run.gpu_clocks
            .map(|c| format!(
                ", {} SMs, peak clocks SM {} MHz / memory {} MHz",
                c.multiprocessors, c.sm_clock_mhz, c.memory_clock_mhz
            ))
            .unwrap_or_default(),
        run.driver_cuda_version,
        run.nvrtc_version
    )
}

/// The preset's name: model, GPU, TP degree, attention source.
fn preset_name(run: &RunInfo) -> String {
    format!(
        "{}-{}{}{}",
        run.model.name,
        short_gpu_name(&run.gpu_name),
        if run.tensor_parallel > 1 {
            format!("-tp{}", run.tensor_parallel)
        } else {
            String::new()
        },
        if run.attention_source.is_some() {
            "-fa2"
        } else {
            ""
        }
    )
}

/// What the preset is, for `cost-model show`.
fn description(run: &RunInfo) -> String {
    // A shard's layers, timed on one GPU: the communication between shards is not in them.
    let shard = if run.tensor_parallel > 1 {
        "; one TP shard's compute only: the two tensor-parallel all-reduces per layer are not included"
    } else {
        ""
    };
    let what = match &run.attention_source {
        None => format!(
            "{} on {} (TP {}): calibrated by timing one layer's kernels (cuBLAS bf16 GEMMs; NVRTC kernels: FlashAttention-2-style tensor-core prefill and split-KV paged decode attention over a paged KV cache, RMSNorm, RoPE, SiLU; CUDA events)",
            run.model.name, run.gpu_name, run.tensor_parallel
        ),
        Some(source) => format!(
            "{} on {} (TP {}): calibrated by timing one layer's kernels (cuBLAS bf16 GEMMs, NVRTC element-wise kernels; CUDA events), {source}",
            run.model.name, run.gpu_name, run.tensor_parallel
        ),
    };
    what + shard
}

/// Predicted against measured per-layer time of the held-out composite batches.
pub fn validation_plot(name: &str, c: &Calibration) -> Plot {
    let title = match &c.validation {
        Some(v) => format!(
            "{name}: held-out batches, R2 {:.4}, APE median {:.1}%, p95 {:.1}%",
            v.r2, v.ape_median_pct, v.ape_p95_pct
        ),
        None => format!("{name}: no held-out batches"),
    };
    let mut plot = predicted_vs_measured(&title, "per-layer time (ms)", &c.validation_points);
    plot.stem = "validation".into();
    plot
}

/// A scatter of `(predicted, measured)` points, measured across, with the diagonal.
pub fn predicted_vs_measured(title: &str, quantity: &str, points: &[(f64, f64)]) -> Plot {
    let mut s = svg::Svg::new(640, 560);
    let all = points.iter().flat_map(|&(p, m)| [p, m]).chain([0.0]);
    let axis = svg::Axis::covering(all, true);
    let frame = svg::Frame {
        x0: 80.0,
        y0: 50.0,
        x1: 610.0,
        y1: 490.0,
        x: axis.clone(),
        y: axis.clone(),
    };
    frame.draw_axes(
        &mut s,
        title,
        &format!("measured {quantity}"),
        &format!("predicted {quantity}"),
    );
    s.line(
        frame.px(axis.lo),
        frame.py(axis.lo),
        frame.px(axis.hi),
        frame.py(axis.hi),
        "#888888",
        1.0,
        "5 4",
    );
    for &(p, m) in points {
        s.circle(frame.px(m), frame.py(p), 3.5, svg::color(0));
    }
    Plot {
        stem: "predicted-vs-measured".into(),
        caption: "predicted vs measured".into(),
        svg: s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_samples(p: &Path) -> Vec<Sample> {
        samples::read_csv(
            &std::fs::read_to_string(p).unwrap(),
            &p.display().to_string(),
        )
        .unwrap()
    }

    /// The calibrated presets regenerate byte for byte from their recorded samples, and the
    /// recorded runs meet the validation targets (median < 5%, p95 < 15%).
    #[test]
    fn committed_presets_regenerate_from_their_samples() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("notebooks-data/calibration");
        for run_dir in [
            "h100/llama2-7b",
            "h100/llama3-8b",
            "h200/llama2-7b",
            "h200/llama3-8b",
            "h100/llama3-70b-tp8",
            "h200/llama3-70b-tp8",
        ] {
            let dir = root.join(run_dir);
            let run: RunInfo =
                serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap())
                    .unwrap();
            assert!(run.attention_check_max_abs_error.unwrap() < 2e-2);
            let mut all = read_samples(&dir.join("samples.csv"));
            all.extend(read_samples(&dir.join("validation.csv")));
            let out = tempfile::tempdir().unwrap();
            let (c, _) = write_calibration(out.path(), &run, &all).unwrap();
            let v = c.validation.unwrap();
            assert!(
                v.ape_median_pct < 5.0 && v.ape_p95_pct < 15.0,
                "{run_dir}: {v:?}"
            );
            let regenerated =
                std::fs::read_to_string(out.path().join("coefficients.json")).unwrap();
            assert_eq!(
                regenerated,
                std::fs::read_to_string(dir.join("coefficients.json")).unwrap(),
                "{run_dir}"
            );
            assert_eq!(
                regenerated.contains("one TP shard's compute only"),
                run.tensor_parallel > 1,
                "{run_dir}: a shard's preset says the all-reduces are not in it"
            );
            // The -fa2 preset: the same run with PyTorch's attention times.
            let times = dir.join("attention-vs-pytorch.csv");
            if times.exists() {
                regenerates_fa2(&dir, &run, &all, &times);
            }
        }
    }

    fn regenerates_fa2(dir: &Path, run: &RunInfo, all: &[Sample], times: &Path) {
        let hybrid = samples::with_attention_times(
            all,
            &std::fs::read_to_string(times).unwrap(),
            "attention-vs-pytorch.csv",
        )
        .unwrap();
        let mut fa2_run = run.clone();
        fa2_run.attention_source = Some(attention_source("attention-vs-pytorch.csv"));
        let out = tempfile::tempdir().unwrap();
        let (c, _) = write_calibration(out.path(), &fa2_run, &hybrid).unwrap();
        assert!(c.validation.is_none());
        assert!(!out.path().join("validation.csv").exists());
        let fa2_dir = dir.with_file_name(format!(
            "{}-fa2",
            dir.file_name().unwrap().to_string_lossy()
        ));
        assert_eq!(
            std::fs::read_to_string(out.path().join("coefficients.json")).unwrap(),
            std::fs::read_to_string(fa2_dir.join("coefficients.json")).unwrap(),
            "{}",
            fa2_dir.display()
        );
    }

    #[test]
    fn gpu_names_shorten() {
        assert_eq!(short_gpu_name("NVIDIA H200"), "h200");
        assert_eq!(short_gpu_name("NVIDIA A100-SXM4-80GB"), "a100");
        assert_eq!(short_gpu_name("Tesla V100"), "v100");
    }
}

/// A GPU calibration's settings: what `infersched calibrate` measures.
#[derive(Debug, Clone)]
pub struct GpuCalibration {
    /// The model whose layer is measured.
    pub model: ModelSpec,
    /// Tensor-parallel degree (heads and MLP width per GPU divided by it).
    pub tensor_parallel: u32,
    /// GPU ordinal.
    pub gpu: usize,
    /// Largest batch in tokens to calibrate for.
    pub max_tokens: u32,
    /// Warm-up runs per measurement.
    pub warmup: usize,
    /// Timed runs per measurement (the median is kept).
    pub repeats: usize,
}

/// What a GPU calibration reports while it runs (to a progress display, a log, a test).
#[derive(Debug)]
pub enum CalibrationEvent<'a> {
    /// The GPU is open and the plan made.
    Started {
        /// The GPU's name.
        gpu: &'a str,
        /// Measurements planned.
        measurements: usize,
    },
    /// One attention kernel checked against the CPU reference.
    AttentionChecked(&'a crate::kernels_calibration::gpu::AttentionCheck),
    /// Measurement `done` of `total` is finished; `next` describes the one after it.
    Measured {
        /// Measurements done.
        done: usize,
        /// Measurements planned.
        total: usize,
        /// The next measurement, or empty after the last.
        next: String,
    },
}

/// What a GPU calibration produced.
#[derive(Debug, Clone)]
pub enum GpuCalibrationResult {
    /// Only the attention kernels were checked (they agree with the CPU reference).
    KernelsChecked {
        /// The GPU's name.
        gpu: String,
        /// Largest difference from the CPU reference.
        max_abs_error: f64,
    },
    /// The whole plan was measured: the run's provenance and its samples (fit them with
    /// [`write_calibration`]).
    Measured(Box<RunInfo>, Vec<Sample>),
}

impl GpuCalibration {
    /// Opens the GPU, checks the attention kernels against the CPU reference (nothing is
    /// measured when they disagree), and, unless `check_only`, times every batch of the
    /// measurement plan, reporting progress to `observe`.
    pub fn run(
        &self,
        check_only: bool,
        observe: &mut dyn FnMut(CalibrationEvent<'_>),
    ) -> anyhow::Result<GpuCalibrationResult> {
        use crate::kernels_calibration::{self as kc, gpu};
        gpu::LayerShape::of(&self.model, self.tensor_parallel)?;
        let (ctx, info) = kc::probe(self.gpu)?;
        let limits = kc::PlanLimits {
            max_tokens: self.max_tokens,
            ..kc::PlanLimits::default()
        };
        let plan = kc::plan(&limits);
        observe(CalibrationEvent::Started {
            gpu: &info.name,
            measurements: plan.len(),
        });
        let mut runner = kc::LayerRunner::new(&ctx, &self.model, self.tensor_parallel, &limits)?;
        // The attention kernels must compute attention before their times mean anything.
        let checks = runner.check_attention()?;
        let mut check_max = 0.0f64;
        for c in &checks {
            observe(CalibrationEvent::AttentionChecked(c));
            check_max = check_max.max(c.max_abs_error);
        }
        if !checks.iter().all(gpu::AttentionCheck::passed) {
            anyhow::bail!(
                "the attention kernels disagree with the CPU reference (tolerance {:e}); nothing was measured",
                gpu::ATTENTION_CHECK_TOLERANCE
            );
        }
        if check_only {
            return Ok(GpuCalibrationResult::KernelsChecked {
                gpu: info.name.clone(),
                max_abs_error: check_max,
            });
        }
        let mut all = Vec::with_capacity(plan.len());
        for (k, m) in plan.iter().enumerate() {
            let ms = runner.time(m, self.warmup, self.repeats)?;
            all.push(Sample::of(m, ms));
            observe(CalibrationEvent::Measured {
                done: k + 1,
                total: plan.len(),
                next: plan.get(k + 1).map(samples::describe).unwrap_or_default(),
            });
        }
        let run = RunInfo {
            model: self.model.clone(),
            tensor_parallel: self.tensor_parallel,
            gpu_name: info.name.clone(),
            gpu_memory_bytes: info.memory_bytes,
            compute_capability: format!(
                "{}.{}",
                info.compute_capability.0, info.compute_capability.1
            ),
            driver_cuda_version: info.driver_cuda_version,
            nvrtc_version: format!("{}.{}", info.nvrtc_version.0, info.nvrtc_version.1),
            gpu_clocks: Some(GpuClocks {
                multiprocessors: info.multiprocessors,
                sm_clock_mhz: info.sm_clock_mhz,
                memory_clock_mhz: info.memory_clock_mhz,
            }),
            repeats: self.repeats,
            warmup: self.warmup,
            attention_check_max_abs_error: Some(check_max),
            attention_source: None,
        };
        Ok(GpuCalibrationResult::Measured(Box::new(run), all))
    }
}

/// A recorded run read back from `dir` (`samples.csv`, `validation.csv` when the run had
/// composite batches, `run.json`), with the attention terms' times replaced by those in
/// `attention_times` (`attention-vs-pytorch.csv`) when given: what
/// `calibrate --from-samples` refits, no GPU needed.
pub fn read_recorded_run(
    dir: &Path,
    attention_times: Option<&Path>,
) -> anyhow::Result<(RunInfo, Vec<Sample>)> {
    use anyhow::Context as _;
    let read = |name: &str| -> anyhow::Result<Vec<Sample>> {
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
    // The recorded run must describe a model a layer can have, before anything is fitted.
    run.model
        .validate()
        .and_then(|()| run.model.check_tensor_parallel(run.tensor_parallel))
        .with_context(|| format!("{}: not a valid calibration run", p.display()))?;
    if let Some(t) = attention_times {
        let text =
            std::fs::read_to_string(t).with_context(|| format!("reading {}", t.display()))?;
        all = samples::with_attention_times(&all, &text, &t.display().to_string())?;
        run.attention_source = Some(attention_source(
            &t.file_name().unwrap_or_default().to_string_lossy(),
        ));
    }
    Ok((run, all))
}
