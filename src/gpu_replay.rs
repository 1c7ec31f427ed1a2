//! Whole schedules timed on a GPU (`replay --on-gpu MODEL`): every batch of a schedule run
//! once, in order, through all the model's layers, over one paged KV cache that persists
//! from batch to batch (`kernels_calibration::schedule`); then the schedule replayed with
//! those measured times ([`crate::core::replay_measured`]), so the predicted and the measured
//! metrics come from the same replay and differ only in the batch times.

use crate::core::io::write_atomic;
use crate::core::{Distribution, Replay, Slo, SloReport, Summary, meets_every};
use crate::cost_model::ModelSpec;
use crate::kernels_calibration::gpu::BatchTiming;
use crate::kernels_calibration::schedule::Launch;
use crate::kernels_calibration::{self as kc, gpu, schedule};
use crate::report::write_plots;
use serde::Serialize;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Batches run untimed before the timed pass, to bring the GPU's clocks up.
pub const WARMUP_BATCHES: usize = 20;

/// A schedule's batches as timed on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTiming {
    /// The GPU's name as the driver reports it.
    pub gpu: String,
    /// The model whose layers ran.
    pub model: String,
    /// Tensor-parallel degree (one GPU runs one shard's layers).
    pub tensor_parallel: u32,
    /// Layers each batch ran through.
    pub layers: u32,
    /// Largest difference of the attention kernels from the CPU reference, checked first.
    pub attention_check_max_abs_error: f64,
    /// How each batch started.
    pub launch: Launch,
    /// Each batch's times, in order.
    pub batches: Vec<BatchTiming>,
}

impl GpuTiming {
    /// Each batch's measured seconds (the CUDA events around its layers).
    pub fn times_s(&self) -> Vec<f64> {
        self.batches.iter().map(|b| b.gpu_ms * 1e-3).collect()
    }
}

/// Times every batch of `schedule` (one `replay` accepted for `workload`) on GPU `ordinal`
/// with `model`'s layer shape, each batch started as `launch` says; `observe(done, total)`
/// hears progress. The attention kernels are checked against the CPU reference first;
/// nothing is timed when they disagree.
pub fn time_on_gpu(
    model: &ModelSpec,
    tensor_parallel: u32,
    ordinal: usize,
    launch: Launch,
    workload: &crate::core::Workload,
    schedule: &crate::core::Schedule,
    observe: &mut dyn FnMut(usize, usize),
) -> anyhow::Result<GpuTiming> {
    gpu::LayerShape::of(model, tensor_parallel)?;
    let work = schedule::batch_work(workload, schedule);
    let mut limits = schedule::limits_for(&work);
    // At least what the attention check before the timing needs.
    limits.max_tokens = limits.max_tokens.max(256);
    limits.max_context = limits.max_context.max(2048);
    limits.max_kv_tokens = limits.max_kv_tokens.max(4096);
    let (ctx, info) = kc::probe(ordinal)?;
    let mut runner = kc::LayerRunner::new(&ctx, model, tensor_parallel, &limits)?;
    let checks = runner.check_attention()?;
    if !checks.iter().all(gpu::AttentionCheck::passed) {
        anyhow::bail!(
            "the attention kernels disagree with the CPU reference (tolerance {:e}); nothing was timed",
            gpu::ATTENTION_CHECK_TOLERANCE
        );
    }
    let layers = model.layers as usize;
    let clock = info.sm_clock_mhz;
    let batches = schedule::time_schedule(
        &mut runner,
        &work,
        layers,
        WARMUP_BATCHES,
        launch,
        clock,
        observe,
    )?;
    Ok(GpuTiming {
        gpu: info.name,
        model: model.name.clone(),
        tensor_parallel,
        layers: model.layers,
        attention_check_max_abs_error: checks.iter().map(|c| c.max_abs_error).fold(0.0, f64::max),
        launch,
        batches,
    })
}

/// The metrics compared, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Headline {
    /// End of the last batch.
    pub makespan_s: f64,
    /// Mean time to first token.
    pub mean_ttft_s: f64,
    /// Mean end-to-end latency.
    pub mean_e2e_s: f64,
    /// Sum of batch times.
    pub busy_s: f64,
}

impl Headline {
    fn of(r: &Replay) -> Self {
        let s = Summary::from_replay(r);
        Self {
            makespan_s: s.makespan_s,
            mean_ttft_s: s.mean_ttft_s,
            mean_e2e_s: s.mean_e2e_s,
            busy_s: r.batches.iter().map(|b| b.duration_s()).sum(),
        }
    }

    /// `(self - measured) / measured` in percent, per metric.
    fn error_pct(&self, measured: &Headline) -> Headline {
        let e = |p: f64, m: f64| 100.0 * (p - m) / m;
        Headline {
            makespan_s: e(self.makespan_s, measured.makespan_s),
            mean_ttft_s: e(self.mean_ttft_s, measured.mean_ttft_s),
            mean_e2e_s: e(self.mean_e2e_s, measured.mean_e2e_s),
            busy_s: e(self.busy_s, measured.busy_s),
        }
    }
}

/// Predicted against measured for one schedule (`gpu-summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuComparison {
    /// The GPU.
    pub gpu: String,
    /// The model, its tensor-parallel degree and layers.
    pub model: String,
    /// Tensor-parallel degree.
    pub tensor_parallel: u32,
    /// Layers each batch ran through.
    pub layers: u32,
    /// The cost model that predicted.
    pub cost_model: String,
    /// Batches timed.
    pub batches: usize,
    /// Largest difference of the attention kernels from the CPU reference.
    pub attention_check_max_abs_error: f64,
    /// How each batch started: `queued` (the GPU's work alone) or `idle` (as launched).
    pub launch: &'static str,
    /// Seconds the host took to enqueue all the batches' kernels.
    pub host_issue_s: f64,
    /// Queued batches whose enqueueing outlasted the GPU's wait (their time may include
    /// the host's).
    pub host_outran_wait: usize,
    /// The replay with the cost model's times.
    pub predicted: Headline,
    /// The replay with the measured times.
    pub measured: Headline,
    /// `(predicted - measured) / measured`, percent, per metric (the fields are percents).
    pub error_pct: Headline,
    /// Per batch, `|predicted - measured| / measured` in percent (none without batches).
    pub batch_abs_error_pct: Option<Distribution>,
    /// Per batch, the mean of `(predicted - measured) / measured` in percent (bias).
    pub batch_mean_signed_error_pct: f64,
    /// The SLOs asked for, read on both replays (none when no SLO was given).
    pub slo: Option<SloComparison>,
}

/// A set of SLOs read on the predicted and on the measured replay: does the goodput the
/// cost model promises hold with the GPU's own batch times?
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloComparison {
    /// With the cost model's batch times.
    pub predicted: SloReport,
    /// With the measured batch times.
    pub measured: SloReport,
    /// Requests that meet every SLO on one replay and not on the other, in index order:
    /// met as predicted but missed as measured, then the reverse.
    pub lost: Vec<usize>,
    /// Requests missed as predicted that meet every SLO as measured.
    pub gained: Vec<usize>,
}

impl SloComparison {
    /// `slos` read on both replays of one schedule.
    pub fn of(predicted: &Replay, measured: &Replay, slos: &[Slo]) -> Self {
        let mut lost = Vec::new();
        let mut gained = Vec::new();
        for (i, (p, m)) in predicted
            .requests
            .iter()
            .zip(&measured.requests)
            .enumerate()
        {
            match (meets_every(p, slos), meets_every(m, slos)) {
                (true, false) => lost.push(i),
                (false, true) => gained.push(i),
                _ => {}
            }
        }
        SloComparison {
            predicted: SloReport::of(predicted, slos),
            measured: SloReport::of(measured, slos),
            lost,
            gained,
        }
    }
}

/// The name of a launch mode in files.
pub fn launch_name(launch: Launch) -> &'static str {
    match launch {
        Launch::Queued => "queued",
        Launch::Idle => "idle",
    }
}

/// Compares the replay with the cost model's times (`predicted`) and the one with the
/// measured times (`measured`) of the same schedule.
pub fn compare(
    timing: &GpuTiming,
    cost_model: &str,
    predicted: &Replay,
    measured: &Replay,
    slos: &[Slo],
) -> GpuComparison {
    let errors: Vec<f64> = predicted
        .batches
        .iter()
        .zip(&measured.batches)
        .map(|(p, m)| 100.0 * (p.duration_s() - m.duration_s()) / m.duration_s())
        .collect();
    let (p, m) = (Headline::of(predicted), Headline::of(measured));
    GpuComparison {
        gpu: timing.gpu.clone(),
        model: timing.model.clone(),
        tensor_parallel: timing.tensor_parallel,
        layers: timing.layers,
        cost_model: cost_model.to_string(),
        batches: errors.len(),
        attention_check_max_abs_error: timing.attention_check_max_abs_error,
        launch: launch_name(timing.launch),
        host_issue_s: timing.batches.iter().map(|b| b.issue_ms).sum::<f64>() * 1e-3,
        host_outran_wait: timing
            .batches
            .iter()
            .filter(|b| timing.launch == Launch::Queued && b.issue_ms >= b.ahead_ms)
            .count(),
        predicted: p,
        measured: m,
        error_pct: p.error_pct(&m),
        batch_abs_error_pct: Distribution::of(errors.iter().map(|e| e.abs()).collect()),
        batch_mean_signed_error_pct: errors.iter().sum::<f64>() / errors.len().max(1) as f64,
        slo: (!slos.is_empty()).then(|| SloComparison::of(predicted, measured, slos)),
    }
}

fn write_batches(
    predicted: &Replay,
    measured: &Replay,
    timing: &GpuTiming,
    w: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        w,
        "batch,tokens,prefill_tokens,n_prefill,n_decode,decode_kv,predicted_ms,measured_ms,error_pct,host_issue_ms,gpu_wait_ms"
    )?;
    let rows = predicted.batches.iter().zip(&measured.batches);
    for ((p, m), t) in rows.zip(&timing.batches) {
        let f = &p.features;
        let (pm, mm) = (p.duration_s() * 1e3, m.duration_s() * 1e3);
        writeln!(
            w,
            "{},{},{},{},{},{},{pm:.6},{mm:.6},{:.4},{:.4},{:.4}",
            p.index,
            f.tokens,
            p.prefill_tokens,
            f.n_prefill,
            f.n_decode,
            f.decode_kv,
            100.0 * (pm - mm) / mm,
            t.issue_ms,
            t.ahead_ms
        )?;
    }
    Ok(())
}

/// Writes `gpu-batches.csv` (per batch: features, predicted and measured milliseconds),
/// `gpu-summary.json` (the comparison), `measured/` (the measured replay's `requests.csv`,
/// `batches.csv`, `summary.json`) and `gpu-batches.svg|png` (predicted against measured
/// batch times) into `dir`; returns their paths.
pub fn write_outputs(
    dir: &Path,
    timing: &GpuTiming,
    predicted: &Replay,
    measured: &Replay,
    comparison: &GpuComparison,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let batches = dir.join("gpu-batches.csv");
    write_atomic(&batches, |w| write_batches(predicted, measured, timing, w))?;
    let summary = dir.join("gpu-summary.json");
    write_atomic(&summary, |w| {
        serde_json::to_writer_pretty(&mut *w, comparison)?;
        w.write_all(b"\n")
    })?;
    let mut paths = vec![batches, summary];
    let mut summary = Summary::from_replay(measured);
    summary.slo = comparison.slo.as_ref().map(|c| c.measured.clone());
    paths.extend(crate::output::write_replay_outputs(
        &dir.join("measured"),
        measured,
        &summary,
    )?);
    let points: Vec<(f64, f64)> = predicted
        .batches
        .iter()
        .zip(&measured.batches)
        .map(|(p, m)| (p.duration_s() * 1e3, m.duration_s() * 1e3))
        .collect();
    let d = comparison.batch_abs_error_pct;
    let title = format!(
        "{}: {} batches, |error| median {:.1}%, p90 {:.1}%",
        comparison.cost_model,
        comparison.batches,
        d.map_or(0.0, |d| d.p50),
        d.map_or(0.0, |d| d.p90)
    );
    let mut plot = crate::calibration::predicted_vs_measured(&title, "batch time (ms)", &points);
    plot.stem = "gpu-batches".into();
    paths.extend(write_plots(dir, &[plot])?);
    Ok(paths)
}

/// The comparison as lines for people.
pub fn comparison_text(c: &GpuComparison) -> String {
    let row = |name: &str, p: f64, m: f64, e: f64| {
        format!("  {name:<14}{:>12.3} s{:>12.3} s{:>+10.2}%\n", p, m, e)
    };
    let mut s = format!(
        "{} batches of {} (TP {}, {} layers) timed on {} ({} launch); predicted by {}\n  {:<14}{:>14}{:>14}{:>11}\n",
        c.batches,
        c.model,
        c.tensor_parallel,
        c.layers,
        c.gpu,
        c.launch,
        c.cost_model,
        "",
        "predicted",
        "measured",
        "error"
    );
    let (p, m, e) = (&c.predicted, &c.measured, &c.error_pct);
    s += &row("makespan", p.makespan_s, m.makespan_s, e.makespan_s);
    s += &row("mean TTFT", p.mean_ttft_s, m.mean_ttft_s, e.mean_ttft_s);
    s += &row("mean E2E", p.mean_e2e_s, m.mean_e2e_s, e.mean_e2e_s);
    s += &row("busy time", p.busy_s, m.busy_s, e.busy_s);
    if let Some(d) = &c.batch_abs_error_pct {
        s += &format!(
            "  per batch |error|: median {:.2}%, p90 {:.2}%, p99 {:.2}%, max {:.2}%; mean signed {:+.2}%\n",
            d.p50, d.p90, d.p99, d.max, c.batch_mean_signed_error_pct
        );
    }
    s += &format!(
        "  host: {:.3} s enqueueing kernels; {} queued batches outran the GPU's wait\n",
        c.host_issue_s, c.host_outran_wait
    );
    if let Some(slo) = &c.slo {
        s += &slo_text(slo);
    }
    s
}

/// The SLO lines of [`comparison_text`]: attainment, goodput and each aggregate, predicted
/// beside measured.
fn slo_text(c: &SloComparison) -> String {
    let (p, m) = (&c.predicted, &c.measured);
    let per_s = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{x:.3}/s"));
    let mut s = format!(
        "  SLO attainment{:>13.1}%{:>13.1}%   ({} vs {} requests; {} lost, {} gained on the GPU)\n",
        p.attainment * 100.0,
        m.attainment * 100.0,
        p.good_requests,
        m.good_requests,
        c.lost.len(),
        c.gained.len()
    );
    s += &format!(
        "  goodput{:>20}{:>14}\n",
        per_s(p.goodput_requests_per_s),
        per_s(m.goodput_requests_per_s)
    );
    let reading = |r: &crate::core::SloResult| match (r.value_s, r.holds) {
        (None, _) => "no values".to_string(),
        (Some(v), h) => format!("{:.1} ms {}", v * 1e3, if h { "holds" } else { "MISSED" }),
    };
    for (a, b) in p.slos.iter().zip(&m.slos) {
        s += &format!("  {:<14}{:>14}{:>20}\n", a.slo, reading(a), reading(b));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Batch, Entry, Limits, Request, Schedule, Workload, replay, replay_measured};

    struct PerToken;
    impl crate::core::CostModel for PerToken {
        fn batch_time_s(&self, f: &crate::core::BatchFeatures) -> f64 {
            1e-3 * f.tokens as f64
        }
    }

    #[test]
    fn the_comparison_reads_both_replays_and_the_files_agree() {
        let r = |i, o, t| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        let w = Workload::new(vec![r(100, 2, 0.0), r(50, 1, 0.0)]).unwrap();
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 100), Entry::process(1, 50)]),
            Batch::new(vec![Entry::process(0, 1)]),
        ]);
        let limits = Limits::unlimited();
        let predicted = replay(&w, &limits, &PerToken, &s).unwrap();
        // Predicted 150 ms and 1 ms; measured 100 ms and 2 ms.
        let measured = replay_measured(&w, &limits, &[0.1, 0.002], &s).unwrap();
        let timing = GpuTiming {
            gpu: "GPU".into(),
            model: "m".into(),
            tensor_parallel: 1,
            layers: 2,
            attention_check_max_abs_error: 0.0,
            launch: Launch::Queued,
            batches: [(100.0, 1.0), (2.0, 3.0)]
                .map(|(gpu_ms, issue_ms)| BatchTiming {
                    gpu_ms,
                    issue_ms,
                    ahead_ms: 2.0,
                })
                .to_vec(),
        };
        assert_eq!(timing.times_s(), vec![0.1, 0.002]);
        // TTFT 150 ms predicted for both, 100 ms measured; E2E 151 / 150 and 102 / 100 ms.
        let slos: Vec<Slo> = vec![
            "ttft-p90=120ms".parse().unwrap(),
            "e2e-max=101ms".parse().unwrap(),
        ];
        let c = compare(&timing, "cm", &predicted, &measured, &slos);
        assert!((c.measured.makespan_s - 0.102).abs() < 1e-12);
        assert!((c.predicted.makespan_s - 0.151).abs() < 1e-12);
        assert!((c.error_pct.makespan_s - 100.0 * (0.151 - 0.102) / 0.102).abs() < 1e-9);
        // Both requests emit their first token at the end of batch 0.
        assert!((c.measured.mean_ttft_s - 0.1).abs() < 1e-12);
        // Batch errors: +50% and -50%.
        assert!((c.batch_abs_error_pct.unwrap().p50 - 50.0).abs() < 1e-9);
        assert!(c.batch_mean_signed_error_pct.abs() < 1e-9);
        assert_eq!(
            c.host_outran_wait, 1,
            "batch 1 took 3 ms to enqueue, its wait 2 ms"
        );
        let slo = c.slo.as_ref().unwrap();
        assert_eq!(
            (slo.predicted.good_requests, slo.measured.good_requests),
            (0, 1)
        );
        assert_eq!((slo.lost.clone(), slo.gained.clone()), (vec![], vec![1]));
        assert!(!slo.predicted.slos[0].holds && slo.measured.slos[0].holds);
        assert!(!slo.measured.slos[1].holds, "request 0 ends at 102 ms");
        let dir = tempfile::tempdir().unwrap();
        write_outputs(dir.path(), &timing, &predicted, &measured, &c).unwrap();
        let summary = std::fs::read_to_string(dir.path().join("measured/summary.json")).unwrap();
        assert!(summary.contains("\"good_requests\": 1"), "{summary}");
        let csv = std::fs::read_to_string(dir.path().join("gpu-batches.csv")).unwrap();
        assert_eq!(
            csv.lines().nth(1).unwrap(),
            "0,150,150,2,0,0,150.000000,100.000000,50.0000,1.0000,2.0000"
        );
        assert!(dir.path().join("measured/requests.csv").is_file());
        let text = comparison_text(&c);
        assert!(text.contains("makespan"));
        assert!(text.contains("0 lost, 1 gained"), "{text}");
        assert!(
            compare(&timing, "cm", &predicted, &measured, &[])
                .slo
                .is_none()
        );
    }
}
