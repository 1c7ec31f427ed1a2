//! Calibration samples: `samples.csv` (fit) and `validation.csv` (composite batches), the
//! NNLS fit of the coefficients and its validation on batches the fit never saw.

use crate::plan::{Group, Measurement};
use infersched_core::{FEATURE_NAMES, Feature};
use infersched_cost_model::{FitError, FitReport, FitStats, Samples, fit_nnls};
use ndarray::{Array1, Array2};
use std::io::{self, Write};

/// One timed measurement: its group, batch features and per-layer milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Operator group.
    pub group: Group,
    /// Feature values in [`Feature::ALL`] order.
    pub features: [f64; 9],
    /// Median per-layer time (ms).
    pub measured_ms: f64,
    /// What was run, for people.
    pub config: String,
}

impl Sample {
    /// The sample of a measurement that took `measured_ms`.
    pub fn of(m: &Measurement, measured_ms: f64) -> Self {
        let f = m.features();
        let mut features = [0.0; 9];
        for (k, &feat) in Feature::ALL.iter().enumerate() {
            features[k] = f.get(feat);
        }
        Self {
            group: m.group(),
            features,
            measured_ms,
            config: describe(m),
        }
    }
}

/// Why a samples file cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {location}: {reason}")]
pub struct SamplesError {
    /// File.
    pub path: String,
    /// Line or header.
    pub location: String,
    /// What was expected.
    pub reason: String,
}

/// Writes samples as CSV: `group`, the 9 features of `semantics.md`, `measured_ms`, and a
/// `config` column describing the measurement. `infersched fit --samples` reads it.
pub fn write_csv(samples: &[Sample], w: &mut dyn Write) -> io::Result<()> {
    let mut cw = csv::Writer::from_writer(w);
    let mut header = vec!["group"];
    header.extend(FEATURE_NAMES);
    header.extend(["measured_ms", "config"]);
    cw.write_record(&header)?;
    for s in samples {
        let mut rec = vec![s.group.name().to_string()];
        rec.extend(s.features.iter().map(f64::to_string));
        rec.push(s.measured_ms.to_string());
        rec.push(s.config.clone());
        cw.write_record(&rec)?;
    }
    cw.flush()
}

/// The header of a CSV file; `path` names the file in errors.
fn header_of(rdr: &mut csv::Reader<&[u8]>, path: &str) -> Result<Vec<String>, SamplesError> {
    Ok(rdr
        .headers()
        .map_err(|e| SamplesError {
            path: path.to_string(),
            location: "header".into(),
            reason: e.to_string(),
        })?
        .iter()
        .map(String::from)
        .collect())
}

/// The index of column `name` in `header`, or an error naming the file and the column.
fn column(header: &[String], name: &str, path: &str) -> Result<usize, SamplesError> {
    header
        .iter()
        .position(|h| h == name)
        .ok_or_else(|| SamplesError {
            path: path.to_string(),
            location: "header".into(),
            reason: format!("expected a column \"{name}\""),
        })
}

/// Reads what [`write_csv`] wrote; `path` names the file in errors.
pub fn read_csv(text: &str, path: &str) -> Result<Vec<Sample>, SamplesError> {
    let err = |location: String, reason: String| SamplesError {
        path: path.to_string(),
        location,
        reason,
    };
    let mut rdr =
        csv::ReaderBuilder::new().from_reader(text.trim_start_matches('\u{feff}').as_bytes());
    let header = header_of(&mut rdr, path)?;
    let col = |name: &str| column(&header, name, path);
    let group_col = col("group")?;
    let measured_col = col("measured_ms")?;
    let feature_cols: Vec<usize> = FEATURE_NAMES
        .iter()
        .map(|n| col(n))
        .collect::<Result<_, _>>()?;
    let config_col = header.iter().position(|h| h == "config");
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| err(format!("line {line}"), e.to_string()))?;
        let num = |k: usize, name: &str| -> Result<f64, SamplesError> {
            let v = rec.get(k).unwrap_or("").trim();
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| {
                    err(
                        format!("line {line}, column {name}"),
                        format!("expected a number >= 0, got \"{v}\""),
                    )
                })
        };
        let g = rec.get(group_col).unwrap_or("").trim();
        let group = Group::from_name(g).ok_or_else(|| {
            err(
                format!("line {line}, column group"),
                format!(
                    "expected linear, decode_attention, prefill_attention or composite, got \"{g}\""
                ),
            )
        })?;
        let mut features = [0.0; 9];
        for (k, &c) in feature_cols.iter().enumerate() {
            features[k] = num(c, FEATURE_NAMES[k])?;
        }
        out.push(Sample {
            group,
            features,
            measured_ms: num(measured_col, "measured_ms")?,
            config: config_col
                .and_then(|c| rec.get(c))
                .unwrap_or("")
                .to_string(),
        });
    }
    if out.is_empty() {
        return Err(err("data".into(), "no samples".into()));
    }
    Ok(out)
}

/// Replaces the measured time of every attention sample (decode and prefill attention)
/// with the time of the same shape in `attention-vs-pytorch.csv` (columns `group`,
/// `config`, `pytorch_ms`; written by `kernels-calibration/scripts/attention_vs_pytorch.py`),
/// so a fit takes its attention terms from another attention implementation and its linear
/// terms from these measurements. Composite batches are dropped: they were measured with
/// this crate's kernels and cannot validate the result. `path` names the file in errors;
/// every attention sample must have a row.
pub fn with_attention_times(
    samples: &[Sample],
    text: &str,
    path: &str,
) -> Result<Vec<Sample>, SamplesError> {
    let err = |location: String, reason: String| SamplesError {
        path: path.to_string(),
        location,
        reason,
    };
    let mut rdr = csv::ReaderBuilder::new().from_reader(text.as_bytes());
    let header = header_of(&mut rdr, path)?;
    let col = |name: &str| column(&header, name, path);
    let (g, c, t) = (col("group")?, col("config")?, col("pytorch_ms")?);
    let mut times = std::collections::HashMap::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.map_err(|e| err(format!("line {line}"), e.to_string()))?;
        let v = rec.get(t).unwrap_or("").trim();
        let ms = v
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| {
                err(
                    format!("line {line}, column pytorch_ms"),
                    format!("expected a time > 0, got \"{v}\""),
                )
            })?;
        let key = (
            rec.get(g).unwrap_or("").to_string(),
            rec.get(c).unwrap_or("").to_string(),
        );
        if times.insert(key.clone(), ms).is_some() {
            return Err(err(
                format!("line {line}"),
                format!("a second row for {} \"{}\"", key.0, key.1),
            ));
        }
    }
    let mut out = Vec::with_capacity(samples.len());
    for s in samples {
        match s.group {
            Group::Composite => continue,
            Group::Linear => out.push(s.clone()),
            Group::DecodeAttention | Group::PrefillAttention => {
                let key = (s.group.name().to_string(), s.config.clone());
                let ms = times.get(&key).ok_or_else(|| {
                    err("data".into(), format!("no row for {} \"{}\"", key.0, key.1))
                })?;
                out.push(Sample {
                    measured_ms: *ms,
                    ..s.clone()
                });
            }
        }
    }
    Ok(out)
}

/// A short description of a measurement.
pub fn describe(m: &Measurement) -> String {
    match m {
        Measurement::Linear { tokens } => format!("{tokens} tokens"),
        Measurement::DecodeAttention { contexts } => {
            let max = contexts.iter().max().copied().unwrap_or(0);
            format!("{} decodes, context up to {max}", contexts.len())
        }
        Measurement::PrefillAttention { chunks } => {
            let (c, m) = chunks.first().copied().unwrap_or((0, 0));
            format!("{} chunks of {c} over {m}", chunks.len())
        }
        Measurement::Composite { prefills, decodes } => format!(
            "{} prefill chunks ({} tokens), {} decodes",
            prefills.len(),
            prefills.iter().map(|p| p.0).sum::<u32>(),
            decodes.len()
        ),
    }
}

/// The fit samples (every group but composites) as the cost model's fitting input.
pub fn fit_samples(samples: &[Sample]) -> Samples {
    let rows: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.group != Group::Composite)
        .collect();
    let mut x = Array2::zeros((rows.len(), Feature::ALL.len()));
    for (i, s) in rows.iter().enumerate() {
        for k in 0..Feature::ALL.len() {
            x[(i, k)] = s.features[k];
        }
    }
    Samples {
        features: Feature::ALL.to_vec(),
        x,
        measured_ms: Array1::from_iter(rows.iter().map(|s| s.measured_ms)),
        ignored_columns: Vec::new(),
    }
}

/// A fit and its validation.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// The NNLS fit on the group samples.
    pub fit: FitReport,
    /// Predicted vs measured on the composite batches (None without composites).
    pub validation: Option<FitStats>,
    /// `(predicted_ms, measured_ms)` per composite batch.
    pub validation_points: Vec<(f64, f64)>,
}

/// Per-layer time the coefficients predict for a sample's features.
pub fn predict_ms(theta_ms: &[f64; 9], features: &[f64; 9]) -> f64 {
    theta_ms.iter().zip(features).map(|(t, f)| t * f).sum()
}

/// Fits the coefficients on the group samples and validates them on the composites.
pub fn calibrate(samples: &[Sample]) -> Result<Calibration, FitError> {
    let fit = fit_nnls(&fit_samples(samples))?;
    let validation_points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.group == Group::Composite)
        .map(|s| (predict_ms(&fit.theta_ms, &s.features), s.measured_ms))
        .collect();
    let validation = (!validation_points.is_empty()).then(|| {
        let p = Array1::from_iter(validation_points.iter().map(|v| v.0));
        let m = Array1::from_iter(validation_points.iter().map(|v| v.1));
        FitStats::compute(p.view(), m.view())
    });
    Ok(Calibration {
        fit,
        validation,
        validation_points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanLimits, plan};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Samples from known per-layer coefficients with 2% multiplicative noise: what a
    /// recorded GPU run looks like to the fitting code.
    fn recorded(theta: &[f64; 9], noise: f64) -> Vec<Sample> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        plan(&PlanLimits::default())
            .into_iter()
            .map(|m| {
                let exact = predict_ms(theta, &Sample::of(&m, 0.0).features);
                Sample::of(
                    &m,
                    exact * (1.0 + noise * (rng.random::<f64>() * 2.0 - 1.0)),
                )
            })
            .collect()
    }

    // one, tokens, decode_kv, prefill_attn, prefill_ctx, n_prefill, n_decode, has_prefill, has_decode
    const THETA: [f64; 9] = [
        0.05, 0.0019, 8.5e-6, 1.7e-7, 9.2e-6, 0.0015, 0.00074, 0.09, 0.019,
    ];

    #[test]
    fn attention_times_replace_attention_samples_and_drop_composites() {
        let samples = recorded(&THETA, 0.0);
        let attention: Vec<&Sample> = samples
            .iter()
            .filter(|s| matches!(s.group, Group::DecodeAttention | Group::PrefillAttention))
            .collect();
        // Another implementation, exactly half as fast on every attention shape.
        let mut text = String::from("group,config,ours_ms,pytorch_ms,ratio\n");
        for s in &attention {
            text += &format!(
                "{},\"{}\",{},{},0.5\n",
                s.group.name(),
                s.config,
                s.measured_ms,
                2.0 * s.measured_ms
            );
        }
        let hybrid = with_attention_times(&samples, &text, "a.csv").unwrap();
        assert!(hybrid.iter().all(|s| s.group != Group::Composite));
        assert_eq!(hybrid.len(), samples.len() - 40);
        let c = calibrate(&hybrid).unwrap();
        // Attention terms doubled, linear terms unchanged.
        let feature = |f: Feature| Feature::ALL.iter().position(|&x| x == f).unwrap();
        for (f, factor) in [
            (Feature::Tokens, 1.0),
            (Feature::DecodeKv, 2.0),
            (Feature::PrefillAttn, 2.0),
        ] {
            let k = feature(f);
            let want = THETA[k] * factor;
            assert!(
                (c.fit.theta_ms[k] - want).abs() <= 1e-3 * want,
                "{}: {} vs {want}",
                f.name(),
                c.fit.theta_ms[k]
            );
        }
        assert!(c.validation.is_none());
        // A shape without a row, a bad time and a repeated row are errors naming the file.
        let missing: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
        let e = with_attention_times(&samples, &missing, "a.csv").unwrap_err();
        assert!(e.to_string().starts_with("a.csv: data: no row for"), "{e}");
        let bad = format!(
            "group,config,pytorch_ms\n{},\"{}\",-1\n",
            attention[0].group.name(),
            attention[0].config
        );
        let e = with_attention_times(&samples, &bad, "a.csv").unwrap_err();
        assert!(e.to_string().contains("line 2, column pytorch_ms"), "{e}");
        let twice = format!("{text}{}\n", text.lines().nth(1).unwrap());
        let e = with_attention_times(&samples, &twice, "a.csv").unwrap_err();
        assert!(e.to_string().contains("a second row"), "{e}");
    }

    #[test]
    fn the_fit_recovers_known_coefficients_and_validates_on_composites() {
        assert_eq!(Feature::ALL[0], Feature::One);
        let samples = recorded(&THETA, 0.02);
        let c = calibrate(&samples).unwrap();
        // The terms that carry the time (per batch, per token, KV reads, attention) are
        // recovered closely; the small per-entry biases drown in 2% noise, which the
        // validation below shows does not matter for batch times.
        for (k, (&got, &want)) in c.fit.theta_ms.iter().zip(&THETA).enumerate().take(4) {
            assert!(
                (got - want).abs() <= 0.05 * want,
                "{}: fitted {got}, true {want}",
                Feature::ALL[k].name()
            );
        }
        let v = c.validation.unwrap();
        assert_eq!(v.samples, 40);
        assert!(v.ape_median_pct < 3.0, "{v:?}");
        assert!(v.r2 > 0.99, "{v:?}");
    }

    #[test]
    fn the_csv_round_trips_and_is_what_fit_reads() {
        let samples = recorded(&THETA, 0.0);
        let mut buf = Vec::new();
        write_csv(&samples, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with("group,one,tokens,"));
        assert_eq!(read_csv(&text, "samples.csv").unwrap(), samples);
        let bad = text.replacen("linear", "linr", 1);
        let e = read_csv(&bad, "samples.csv").unwrap_err().to_string();
        assert!(e.contains("samples.csv: line 2, column group"), "{e}");
        // Composites are validation data: the fit reader gets only the group samples.
        let fit_rows: String = text
            .lines()
            .filter(|l| !l.starts_with("composite"))
            .map(|l| format!("{l}\n"))
            .collect();
        let parsed = Samples::from_csv_str(&fit_rows, "samples.csv").unwrap();
        let direct = fit_samples(&samples);
        assert_eq!(parsed.x.dim(), direct.x.dim());
        assert_eq!(parsed.measured_ms, direct.measured_ms);
        let r = fit_nnls(&parsed).unwrap();
        for (got, want) in r.theta_ms.iter().zip(&THETA) {
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1e-3),
                "{got} vs {want}"
            );
        }
    }
}
