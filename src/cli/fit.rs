//! `fit`: cost-model coefficients from measured batch times.

use anyhow::{Context, Result, bail};
use clap::Args;
use infersched::cost_model::{self, LinearCostModel, Samples};
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
    let mut inputs: Vec<(&Path, bool)> = Vec::new();
    if let Some(p) = &a.samples {
        inputs.push((p, false));
    }
    if let Some(p) = &a.vidur_attention {
        inputs.push((p, true));
    }
    let mut fits = Vec::new();
    let mut theta = std::collections::BTreeMap::new();
    for (path, attention) in inputs {
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
        let report = cost_model::fit_nnls(&samples).with_context(|| format!("fitting {name}"))?;
        if !samples.ignored_columns.is_empty() {
            eprintln!(
                "note: {name}: ignored columns (not a feature name or measured_ms): {}",
                samples.ignored_columns.join(", ")
            );
        }
        if !report.collinear.is_empty() {
            eprintln!(
                "note: {name}: {} collinear with earlier features in these samples: the split of time between them is not identified",
                report
                    .collinear
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for f in &samples.features {
            if theta
                .insert(f.name().to_owned(), report.theta_ms[*f as usize])
                .is_some()
            {
                bail!(
                    "feature {} is in more than one input ({name} and an earlier one); fit each feature from one file",
                    f.name()
                );
            }
        }
        fits.push((name, samples, report));
    }
    let source = fits
        .iter()
        .map(|f| f.0.clone())
        .collect::<Vec<_>>()
        .join(" + ");
    let unidentified: Vec<&str> = fits
        .iter()
        .flat_map(|f| f.2.unidentified.iter().map(|u| u.name()))
        .filter(|u| !theta.contains_key(*u))
        .collect();
    let fit_stats = if let [(_, _, report)] = fits.as_slice() {
        serde_json::to_value(report.stats)?
    } else {
        serde_json::Value::Object(
            fits.iter()
                .map(|(name, _, report)| Ok((name.clone(), serde_json::to_value(report.stats)?)))
                .collect::<Result<_>>()?,
        )
    };
    let file = cost_model::CoefficientFile {
        format: "infersched-cost-model/1".into(),
        name: a.name.clone(),
        description: format!("NNLS fit to {source}"),
        unit: cost_model::TimeUnit::Ms,
        per_layer: a.layers.is_some(),
        layers: a.layers,
        theta: theta.into_iter().collect(),
        model: None,
        gpu: None,
        tensor_parallel: a.tp,
        provenance: cost_model::Provenance {
            method: "nnls-fit".into(),
            source: source.clone(),
            notes: {
                let collinear: Vec<&str> = fits
                    .iter()
                    .flat_map(|f| f.2.collinear.iter().map(|c| c.name()))
                    .collect();
                let mut notes = Vec::new();
                if !unidentified.is_empty() {
                    notes.push(format!(
                        "features all-zero in the samples, set to 0: {}",
                        unidentified.join(", ")
                    ));
                }
                if !collinear.is_empty() {
                    notes.push(format!(
                        "collinear with earlier features in the samples (split not identified): {}",
                        collinear.join(", ")
                    ));
                }
                (!notes.is_empty()).then(|| notes.join("; "))
            },
            fit: Some(fit_stats),
        },
    };
    // Check the file we are about to write loads back.
    let json = serde_json::to_string_pretty(&file)? + "\n";
    LinearCostModel::from_json_str(&json, &a.out)?;
    infersched::core::io::write_bytes_atomic(&a.out, json.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
    for (name, samples, report) in &fits {
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
