//! `fit`: cost-model coefficients from measured batch times.

use anyhow::{Context, Result};
use clap::Args;
use infersched::cost_model::{FitInput, InputFit, LinearCostModel, Samples, fit_coefficient_file};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct FitArgs {
    /// Samples CSV: feature columns (one, tokens, ...) and measured_ms.
    #[arg(long, required_unless_present = "vidur_attention")]
    pub(crate) samples: Option<PathBuf>,
    /// Read the samples as Vidur's mlp.csv profile (per-layer non-attention operators).
    #[arg(long, requires = "samples")]
    pub(crate) vidur_mlp: bool,
    /// Also fit the attention features to Vidur's attention.csv profile (per-layer
    /// attention kernel); with --samples FILE --vidur-mlp this gives a whole cost model.
    #[arg(long, value_name = "FILE")]
    pub(crate) vidur_attention: Option<PathBuf>,
    /// Tensor-parallel degree to select from a Vidur profile.
    #[arg(long, default_value_t = 1)]
    pub(crate) tp: u32,
    /// Layers: when set, the samples are per layer and the model multiplies by this.
    #[arg(long)]
    pub(crate) layers: Option<u32>,
    /// Name written into the coefficient file.
    #[arg(long, default_value = "fitted")]
    pub(crate) name: String,
    /// Output coefficient JSON.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

pub(crate) fn cmd_fit(a: &FitArgs) -> Result<()> {
    // Each input is fitted on its own; their features must not overlap.
    let mut paths: Vec<(&Path, bool)> = Vec::new();
    if let Some(p) = &a.samples {
        paths.push((p, false));
    }
    if let Some(p) = &a.vidur_attention {
        paths.push((p, true));
    }
    let mut inputs = Vec::new();
    for (path, attention) in paths {
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
        inputs.push(FitInput { name, samples });
    }
    let (file, fits) = fit_coefficient_file(inputs, &a.name, a.layers, a.tp)?;
    for f in &fits {
        if !f.samples.ignored_columns.is_empty() {
            eprintln!(
                "note: {}: ignored columns (not a feature name or measured_ms): {}",
                f.name,
                f.samples.ignored_columns.join(", ")
            );
        }
        if !f.report.collinear.is_empty() {
            eprintln!(
                "note: {}: {} collinear with earlier features in these samples: the split of time between them is not identified",
                f.name,
                f.report
                    .collinear
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    // Check the file we are about to write loads back.
    let json = serde_json::to_string_pretty(&file)? + "\n";
    LinearCostModel::from_json_str(&json, &a.out)?;
    infersched::core::io::write_bytes_atomic(&a.out, json.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
    for InputFit {
        name,
        samples,
        report,
    } in &fits
    {
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
