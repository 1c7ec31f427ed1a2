//! Fitting theta by non-negative least squares (Lawson-Hanson), with fit statistics.
//!
//! Samples come from a samples CSV (columns named by features, plus `measured_ms`) or
//! from Vidur's profiles: `mlp.csv` ([`Samples::from_vidur_mlp_csv`]) and `attention.csv`
//! ([`Samples::from_vidur_attention_csv`]).

use infersched_core::{FEATURE_NAMES, Feature};
use ndarray::{Array1, Array2, ArrayView1, Axis};
use serde::Serialize;
use thiserror::Error;

/// Why samples could not be read or fitted.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum FitError {
    /// The file could not be read.
    #[error("{path}: {reason}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        reason: String,
    },
    /// A header or value is wrong.
    #[error("{path}: {location}: {reason}")]
    Invalid {
        /// File.
        path: String,
        /// `line N, column X` or `header`.
        location: String,
        /// What was expected.
        reason: String,
    },
    /// Fewer samples than features with data.
    #[error("{samples} samples cannot determine {features} coefficients")]
    TooFewSamples {
        /// Samples.
        samples: usize,
        /// Features with nonzero data.
        features: usize,
    },
    /// The active-set iteration did not converge.
    #[error("NNLS did not converge in {0} iterations")]
    NoConvergence(usize),
    /// The fit's coefficients or statistics are not finite numbers (values too large for
    /// f64 arithmetic); nothing is written.
    #[error("the fit is not a finite number: {0}")]
    NotFinite(String),
    /// Fitting one sample set of several failed.
    #[error("fitting {input}: {source}")]
    Input {
        /// The set's name.
        input: String,
        /// Why.
        source: Box<FitError>,
    },
    /// Two sample sets carry the same feature: which coefficient to keep is undefined.
    #[error(
        "feature {feature} is in more than one input ({input} and an earlier one); fit each feature from one file"
    )]
    FeatureInTwoInputs {
        /// The feature.
        feature: String,
        /// The later set that has it.
        input: String,
    },
}

/// Measured batch times and their features.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    /// Which features the samples carry (others are taken as 0 and get theta 0).
    pub features: Vec<Feature>,
    /// Rows of feature values, one per sample, in `features` order.
    pub x: Array2<f64>,
    /// Measured times in milliseconds.
    pub measured_ms: Array1<f64>,
    /// Columns of the file that are neither a feature nor the measured time (not used).
    pub ignored_columns: Vec<String>,
}

/// Shared parsing of the two sample CSV formats: errors name the file, line and column.
struct CsvInput<'a> {
    path: &'a str,
}

impl CsvInput<'_> {
    fn invalid(&self, location: String, reason: String) -> FitError {
        FitError::Invalid {
            path: self.path.to_owned(),
            location,
            reason,
        }
    }

    fn open<'t>(
        &self,
        text: &'t str,
    ) -> Result<(csv::Reader<&'t [u8]>, csv::StringRecord), FitError> {
        let mut rdr = csv::ReaderBuilder::new().from_reader(text.as_bytes());
        let header = rdr
            .headers()
            .map_err(|e| self.invalid("header".into(), e.to_string()))?
            .clone();
        Ok((rdr, header))
    }

    /// The index of column `name` in `header`, or an error naming the expected `format`.
    fn column(
        &self,
        header: &csv::StringRecord,
        name: &str,
        format: &str,
    ) -> Result<usize, FitError> {
        header.iter().position(|h| h.trim() == name).ok_or_else(|| {
            self.invalid(
                "header".into(),
                format!("expected a column \"{name}\" ({format} format)"),
            )
        })
    }

    /// The records (with their line numbers) whose tensor-parallel degree, in column
    /// `tp_col` (`num_tensor_parallel_workers`), is `tp`; an error if there are none.
    fn records_at_tp(
        &self,
        rdr: &mut csv::Reader<&[u8]>,
        tp_col: usize,
        tp: u32,
    ) -> Result<Vec<(usize, csv::StringRecord)>, FitError> {
        let mut out = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let line = i + 2;
            let rec = rec.map_err(|e| self.invalid(format!("line {line}"), e.to_string()))?;
            if self.nonneg(&rec, tp_col, "num_tensor_parallel_workers", line)? == f64::from(tp) {
                out.push((line, rec));
            }
        }
        if out.is_empty() {
            return Err(self.invalid(
                "num_tensor_parallel_workers".into(),
                format!("no rows with tensor-parallel degree {tp}"),
            ));
        }
        Ok(out)
    }

    /// Field `k` (column `name`) of a record on `line`, a finite number >= 0.
    fn nonneg(
        &self,
        rec: &csv::StringRecord,
        k: usize,
        name: &str,
        line: usize,
    ) -> Result<f64, FitError> {
        let s = rec.get(k).unwrap_or("").trim();
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                self.invalid(
                    format!("line {line}, column {name}"),
                    format!(
                        "expected a finite number >= 0, got \"{}\"",
                        infersched_core::io::excerpt(s)
                    ),
                )
            })
    }
}

impl Samples {
    /// Reads a samples CSV: a header with some feature names (`one`, `tokens`, ...) and
    /// `measured_ms`; other columns are ignored. `path` names the file in errors.
    pub fn from_csv_str(text: &str, path: &str) -> Result<Self, FitError> {
        let input = CsvInput { path };
        let invalid = |location: String, reason: String| input.invalid(location, reason);
        let (mut rdr, header) = input.open(text)?;
        let mut cols: Vec<(usize, Feature)> = Vec::new();
        let mut target = None;
        let mut ignored_columns = Vec::new();
        for (k, name) in header.iter().enumerate() {
            let name = name.trim();
            let repeated = (name == "measured_ms" && target.is_some())
                || Feature::from_name(name).is_some_and(|f| cols.iter().any(|c| c.1 == f));
            if repeated {
                return Err(invalid(
                    "header".into(),
                    format!("the column \"{name}\" appears more than once"),
                ));
            }
            if name == "measured_ms" {
                target = Some(k);
            } else if let Some(f) = Feature::from_name(name) {
                cols.push((k, f));
            } else {
                ignored_columns.push(name.to_owned());
            }
        }
        let target = target
            .ok_or_else(|| invalid("header".into(), "expected a column \"measured_ms\"".into()))?;
        if cols.is_empty() {
            return Err(invalid(
                "header".into(),
                format!(
                    "expected at least one feature column ({})",
                    FEATURE_NAMES.join(", ")
                ),
            ));
        }
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let line = i + 2;
            let rec = rec.map_err(|e| invalid(format!("line {line}"), e.to_string()))?;
            for &(k, f) in &cols {
                rows.push(input.nonneg(&rec, k, f.name(), line)?);
            }
            y.push(input.nonneg(&rec, target, "measured_ms", line)?);
        }
        let n = y.len();
        if n == 0 {
            return Err(invalid(
                "line 2".into(),
                "no samples after the header".into(),
            ));
        }
        Ok(Self {
            features: cols.iter().map(|c| c.1).collect(),
            x: Array2::from_shape_vec((n, cols.len()), rows).expect("row-major by construction"),
            measured_ms: Array1::from(y),
            ignored_columns,
        })
    }

    /// Reads Vidur's `mlp.csv` (non-attention operators per layer versus `num_tokens`) at
    /// tensor-parallel degree `tp`: the measured per-layer time is the sum of the operator
    /// medians `input_layernorm`, `attn_pre_proj`, `attn_rope`, `attn_post_proj`,
    /// `post_attention_layernorm`, `mlp_up_proj`, `mlp_act`, `mlp_down_proj` and `add`
    /// (once, as Vidur composes a block; `emb` runs once per model, not per layer).
    /// Features: `one` = 1, `tokens` = num_tokens.
    pub fn from_vidur_mlp_csv(text: &str, path: &str, tp: u32) -> Result<Self, FitError> {
        const OPS: [&str; 9] = [
            "input_layernorm",
            "attn_pre_proj",
            "attn_rope",
            "attn_post_proj",
            "post_attention_layernorm",
            "mlp_up_proj",
            "mlp_act",
            "mlp_down_proj",
            "add",
        ];
        let input = CsvInput { path };
        let (mut rdr, header) = input.open(text)?;
        let col = |name: &str| input.column(&header, name, "Vidur mlp.csv");
        let op_cols: Vec<(usize, String)> = OPS
            .iter()
            .map(|op| {
                let name = format!("time_stats.{op}.median");
                col(&name).map(|k| (k, name))
            })
            .collect::<Result<_, _>>()?;
        let tokens_col = col("num_tokens")?;
        let tp_col = col("num_tensor_parallel_workers")?;
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for (line, rec) in input.records_at_tp(&mut rdr, tp_col, tp)? {
            let num = |k: usize, name: &str| input.nonneg(&rec, k, name, line);
            let mut t = 0.0;
            for (k, name) in &op_cols {
                t += num(*k, name)?;
            }
            rows.push(1.0);
            rows.push(num(tokens_col, "num_tokens")?);
            y.push(t);
        }
        let n = y.len();
        Ok(Self {
            features: vec![Feature::One, Feature::Tokens],
            x: Array2::from_shape_vec((n, 2), rows).expect("row-major by construction"),
            measured_ms: Array1::from(y),
            ignored_columns: Vec::new(),
        })
    }
}

impl Samples {
    /// Reads Vidur's `attention.csv` (the attention kernel per layer, one row per profiled
    /// shape) at tensor-parallel degree `tp`. A prefill row (`is_prefill` true) is
    /// `batch_size` sequences each processing `prefill_chunk_size` tokens over
    /// `kv_cache_size` cached ones, timed by `time_stats.attn_prefill.median`; a decode row
    /// is `batch_size` sequences each decoding one token over `kv_cache_size` cached ones,
    /// timed by `time_stats.attn_decode.median`. Features, as the replay counts them:
    /// prefill `has_prefill` = 1, `n_prefill` = b, `prefill_attn` = b (c^2 + 2 c m),
    /// `prefill_ctx` = b m; decode `has_decode` = 1, `n_decode` = b, `decode_kv` = b (m + 1).
    /// The other operators Vidur times around the kernel (KV-cache save, reshapes) scale with
    /// tokens and belong to the `mlp.csv` side of a fit. A feature column identical to an
    /// earlier one (e.g. `n_prefill` when every prefill row has batch size 1, as Vidur
    /// profiles them) cannot be told apart from it and is left out.
    pub fn from_vidur_attention_csv(text: &str, path: &str, tp: u32) -> Result<Self, FitError> {
        let input = CsvInput { path };
        let invalid = |location: String, reason: String| input.invalid(location, reason);
        let (mut rdr, header) = input.open(text)?;
        let col = |name: &str| input.column(&header, name, "Vidur attention.csv");
        let prefill_col = col("is_prefill")?;
        let batch_col = col("batch_size")?;
        let chunk_col = col("prefill_chunk_size")?;
        let kv_col = col("kv_cache_size")?;
        let tp_col = col("num_tensor_parallel_workers")?;
        let t_prefill = col("time_stats.attn_prefill.median")?;
        let t_decode = col("time_stats.attn_decode.median")?;
        const FEATURES: [Feature; 7] = [
            Feature::HasPrefill,
            Feature::NPrefill,
            Feature::PrefillAttn,
            Feature::PrefillCtx,
            Feature::HasDecode,
            Feature::NDecode,
            Feature::DecodeKv,
        ];
        let mut rows: Vec<[f64; 7]> = Vec::new();
        let mut y = Vec::new();
        for (line, rec) in input.records_at_tp(&mut rdr, tp_col, tp)? {
            let num = |k: usize, name: &str| input.nonneg(&rec, k, name, line);
            let flag = rec.get(prefill_col).unwrap_or("").trim();
            let is_prefill = match flag.to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => {
                    return Err(invalid(
                        format!("line {line}, column is_prefill"),
                        format!(
                            "expected True or False, got \"{}\"",
                            infersched_core::io::excerpt(flag)
                        ),
                    ));
                }
            };
            let b = num(batch_col, "batch_size")?;
            let m = num(kv_col, "kv_cache_size")?;
            if is_prefill {
                let c = num(chunk_col, "prefill_chunk_size")?;
                rows.push([1.0, b, b * (c * c + 2.0 * c * m), b * m, 0.0, 0.0, 0.0]);
                y.push(num(t_prefill, "time_stats.attn_prefill.median")?);
            } else {
                rows.push([0.0, 0.0, 0.0, 0.0, 1.0, b, b * (m + 1.0)]);
                y.push(num(t_decode, "time_stats.attn_decode.median")?);
            }
        }
        // Keep a feature only if its column differs from every kept one.
        let mut keep: Vec<usize> = Vec::new();
        for f in 0..FEATURES.len() {
            if !keep.iter().any(|&k| rows.iter().all(|r| r[k] == r[f])) {
                keep.push(f);
            }
        }
        let n = y.len();
        let x: Vec<f64> = rows
            .iter()
            .flat_map(|r| keep.iter().map(move |&k| r[k]))
            .collect();
        Ok(Self {
            features: keep.iter().map(|&k| FEATURES[k]).collect(),
            x: Array2::from_shape_vec((n, keep.len()), x).expect("row-major by construction"),
            measured_ms: Array1::from(y),
            ignored_columns: Vec::new(),
        })
    }
}

/// Goodness of fit of predictions against measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FitStats {
    /// Number of samples.
    pub samples: usize,
    /// Coefficient of determination.
    pub r2: f64,
    /// Mean absolute percentage error (%), over samples with a nonzero measurement.
    pub mape_mean_pct: f64,
    /// Median absolute percentage error (%).
    pub ape_median_pct: f64,
    /// 95th percentile absolute percentage error (%).
    pub ape_p95_pct: f64,
    /// Largest absolute percentage error (%).
    pub ape_max_pct: f64,
}

impl FitStats {
    /// Statistics of `predicted` against `measured`.
    pub fn compute(predicted: ArrayView1<f64>, measured: ArrayView1<f64>) -> Self {
        let n = measured.len();
        let mean = measured.mean().unwrap_or(0.0);
        let ss_tot: f64 = measured.iter().map(|y| (y - mean).powi(2)).sum();
        let ss_res: f64 = predicted
            .iter()
            .zip(measured)
            .map(|(p, y)| (p - y).powi(2))
            .sum();
        let mut ape: Vec<f64> = predicted
            .iter()
            .zip(measured)
            .filter(|(_, y)| **y > 0.0)
            .map(|(p, y)| 100.0 * (p - y).abs() / y)
            .collect();
        ape.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if ape.is_empty() {
                0.0
            } else {
                infersched_core::metrics::quantile_sorted(&ape, p)
            }
        };
        Self {
            samples: n,
            r2: if ss_tot > 0.0 {
                1.0 - ss_res / ss_tot
            } else {
                1.0
            },
            mape_mean_pct: if ape.is_empty() {
                0.0
            } else {
                ape.iter().sum::<f64>() / ape.len() as f64
            },
            ape_median_pct: q(0.5),
            ape_p95_pct: q(0.95),
            ape_max_pct: ape.last().copied().unwrap_or(0.0),
        }
    }
}

/// The result of a fit: theta per feature (in the samples' unit, ms) and statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct FitReport {
    /// Coefficient per feature, in [`Feature::ALL`] order (0 for features without data).
    pub theta_ms: [f64; 9],
    /// Statistics on the fitted samples.
    pub stats: FitStats,
    /// Features present in the samples but all-zero there, so not identifiable (theta 0).
    pub unidentified: Vec<Feature>,
    /// Features whose column is (numerically) a linear combination of earlier ones in these
    /// samples: how the time is split between them is not identified by the data.
    pub collinear: Vec<Feature>,
}

/// Solves `min ||A x - b||` subject to `x >= 0` (Lawson-Hanson active set).
pub fn nnls(a: &Array2<f64>, b: &Array1<f64>) -> Result<Array1<f64>, FitError> {
    let (m, n) = a.dim();
    let mut x = Array1::<f64>::zeros(n);
    let mut passive = vec![false; n];
    let norm1 = a
        .axis_iter(Axis(1))
        .map(|c| c.iter().map(|v| v.abs()).sum::<f64>())
        .fold(0.0, f64::max);
    let tol = 10.0 * f64::EPSILON * norm1 * m.max(n) as f64;
    let max_iter = 3 * n.max(1) * 10;
    let mut iterations = 0;
    loop {
        let w = a.t().dot(&(b - &a.dot(&x)));
        let candidate = (0..n)
            .filter(|&j| !passive[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(t) = candidate else { break };
        passive[t] = true;
        loop {
            iterations += 1;
            if iterations > max_iter {
                return Err(FitError::NoConvergence(max_iter));
            }
            let idx: Vec<usize> = (0..n).filter(|&j| passive[j]).collect();
            let sub = a.select(Axis(1), &idx);
            let zs = least_squares(&sub, b);
            let mut z = Array1::<f64>::zeros(n);
            for (k, &j) in idx.iter().enumerate() {
                z[j] = zs[k];
            }
            if idx.iter().all(|&j| z[j] > tol) {
                x = z;
                break;
            }
            let alpha = idx
                .iter()
                .filter(|&&j| z[j] <= tol)
                .map(|&j| x[j] / (x[j] - z[j]))
                .fold(f64::INFINITY, f64::min);
            x = &x + &((&z - &x) * alpha);
            for &j in &idx {
                if x[j] <= tol {
                    x[j] = 0.0;
                    passive[j] = false;
                }
            }
        }
    }
    Ok(x)
}

/// Unconstrained least squares by Householder QR (A has full column rank).
fn least_squares(a: &Array2<f64>, b: &Array1<f64>) -> Array1<f64> {
    let (m, n) = a.dim();
    let mut r = a.clone();
    let mut qtb = b.clone();
    for k in 0..n.min(m) {
        let norm = r
            .slice(ndarray::s![k.., k])
            .dot(&r.slice(ndarray::s![k.., k]))
            .sqrt();
        if norm == 0.0 {
            continue;
        }
        let alpha = if r[[k, k]] > 0.0 { -norm } else { norm };
        let mut v = r.slice(ndarray::s![k.., k]).to_owned();
        v[0] -= alpha;
        let vnorm2 = v.dot(&v);
        if vnorm2 == 0.0 {
            continue;
        }
        for j in k..n {
            let s = v.dot(&r.slice(ndarray::s![k.., j])) * 2.0 / vnorm2;
            for i in k..m {
                r[[i, j]] -= s * v[i - k];
            }
        }
        let s = v.dot(&qtb.slice(ndarray::s![k..])) * 2.0 / vnorm2;
        for i in k..m {
            qtb[i] -= s * v[i - k];
        }
    }
    let mut x = Array1::<f64>::zeros(n);
    for k in (0..n.min(m)).rev() {
        let mut s = qtb[k];
        for j in k + 1..n {
            s -= r[[k, j]] * x[j];
        }
        x[k] = if r[[k, k]].abs() > 0.0 {
            s / r[[k, k]]
        } else {
            0.0
        };
    }
    x
}

/// Fits theta >= 0 to the samples. Columns are scaled to unit norm first (NNLS is
/// invariant to positive column scaling), which keeps features of very different
/// magnitudes (`one` vs `prefill_attn`) well conditioned.
pub fn fit_nnls(samples: &Samples) -> Result<FitReport, FitError> {
    let (m, _) = samples.x.dim();
    let mut used = Vec::new();
    let mut unidentified = Vec::new();
    let mut norms = Vec::new();
    for (k, &f) in samples.features.iter().enumerate() {
        let c = samples.x.column(k);
        let norm = c.dot(&c).sqrt();
        if norm > 0.0 {
            used.push(k);
            norms.push(norm);
        } else {
            unidentified.push(f);
        }
    }
    if m < used.len() || m == 0 {
        return Err(FitError::TooFewSamples {
            samples: m,
            features: used.len(),
        });
    }
    let mut a = samples.x.select(Axis(1), &used);
    for (k, norm) in norms.iter().enumerate() {
        a.column_mut(k).mapv_inplace(|v| v / norm);
    }
    let xs = nnls(&a, &samples.measured_ms)?;
    let mut theta_ms = [0.0; 9];
    for (k, &col) in used.iter().enumerate() {
        theta_ms[samples.features[col] as usize] = xs[k] / norms[k];
    }
    let theta_cols = Array1::from(
        samples
            .features
            .iter()
            .map(|f| theta_ms[*f as usize])
            .collect::<Vec<_>>(),
    );
    let predicted = samples.x.dot(&theta_cols);
    let stats = FitStats::compute(predicted.view(), samples.measured_ms.view());
    if let Some(f) = samples
        .features
        .iter()
        .find(|f| !theta_ms[**f as usize].is_finite())
    {
        return Err(FitError::NotFinite(format!(
            "theta {} = {}",
            f.name(),
            theta_ms[*f as usize]
        )));
    }
    if !stats.r2.is_finite() {
        return Err(FitError::NotFinite(format!("R^2 = {}", stats.r2)));
    }
    // Gram-Schmidt on the normalised columns: a column with (almost) nothing left after
    // projecting out the earlier ones is a combination of them.
    let mut basis: Vec<Array1<f64>> = Vec::new();
    let mut collinear = Vec::new();
    for (k, &col) in used.iter().enumerate() {
        let mut v = a.column(k).to_owned();
        for b in &basis {
            let proj = v.dot(b);
            v.scaled_add(-proj, b);
        }
        let rest = v.dot(&v).sqrt();
        if rest < 1e-9 {
            collinear.push(samples.features[col]);
        } else {
            basis.push(v / rest);
        }
    }
    Ok(FitReport {
        theta_ms,
        stats,
        unidentified,
        collinear,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn what_a_fit_cannot_use_or_identify_is_said_and_non_finite_fits_refused() {
        let s = Samples::from_csv_str(
            "one,tokens,bogus,decode_kv,measured_ms\n1,10,5,20,2\n1,20,5,40,3\n1,30,5,60,4\n",
            "s.csv",
        )
        .unwrap();
        assert_eq!(s.ignored_columns, ["bogus"]);
        let r = fit_nnls(&s).unwrap();
        assert_eq!(r.collinear, [Feature::DecodeKv]);
        // Independent columns are not flagged.
        let s = Samples::from_csv_str("one,tokens,measured_ms\n1,10,2\n1,20,3\n1,30,4\n", "s.csv")
            .unwrap();
        assert!(fit_nnls(&s).unwrap().collinear.is_empty());
        let e = Samples::from_csv_str("one,tokens,measured_ms\n", "h.csv").unwrap_err();
        assert!(
            e.to_string().starts_with("h.csv: line 2: no samples"),
            "{e}"
        );
        let e = Samples::from_csv_str("one,one,measured_ms\n1,1,2\n", "d.csv").unwrap_err();
        assert!(
            e.to_string().contains("\"one\" appears more than once"),
            "{e}"
        );
        let s = Samples::from_csv_str(
            "one,tokens,measured_ms\n1,1e300,1e300\n1,2e300,1.7e308\n1,3,4\n",
            "n.csv",
        )
        .unwrap();
        assert!(matches!(fit_nnls(&s), Err(FitError::NotFinite(_))));
    }

    #[test]
    fn nnls_matches_a_known_solution() {
        // Unconstrained solution has a negative second coefficient; NNLS clamps it to 0
        // and refits the first: min ||[1 0; 1 1; 1 2] x - [2, 1, 0]|| with x >= 0 -> (1, 0).
        let a = array![[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]];
        let b = array![2.0, 1.0, 0.0];
        let x = nnls(&a, &b).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-12 && x[1] == 0.0, "{x}");
        // Exact nonnegative data is recovered.
        let b = array![1.0, 3.0, 5.0];
        let x = nnls(&a, &b).unwrap();
        assert!(
            (x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12,
            "{x}"
        );
    }

    #[test]
    fn fit_recovers_theta_of_widely_scaled_features() {
        let mut text = String::from("one,tokens,prefill_attn,decode_kv,measured_ms\n");
        for c in [1u64, 7, 64, 300, 1000, 4096] {
            for kv in [0u64, 5000, 90_000] {
                let t = 0.5 + 0.002 * c as f64 + 1.7e-7 * (c * c) as f64 + 8.5e-6 * kv as f64;
                text.push_str(&format!("1,{c},{},{kv},{t}\n", c * c));
            }
        }
        let s = Samples::from_csv_str(&text, "s.csv").unwrap();
        let r = fit_nnls(&s).unwrap();
        assert!((r.theta_ms[0] - 0.5).abs() < 1e-9);
        assert!((r.theta_ms[1] - 0.002).abs() < 1e-12);
        assert!((r.theta_ms[3] - 1.7e-7).abs() < 1e-15);
        assert!((r.theta_ms[2] - 8.5e-6).abs() < 1e-14);
        assert!(r.stats.r2 > 0.999_999_999 && r.stats.ape_max_pct < 1e-6);
    }

    #[test]
    fn sample_errors_name_line_and_column() {
        let e = Samples::from_csv_str("one,tokens\n1,2\n", "s.csv").unwrap_err();
        assert!(e.to_string().contains("measured_ms"), "{e}");
        let e =
            Samples::from_csv_str("one,tokens,measured_ms\n1,2,3\n1,x,3\n", "s.csv").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.csv: line 3, column tokens: expected a finite number >= 0, got \"x\""
        );
        let s = Samples::from_csv_str("one,measured_ms\n1,3\n", "s.csv").unwrap();
        assert!(fit_nnls(&s).is_ok());
        // Fewer samples than features with data.
        let s = Samples::from_csv_str("one,tokens,measured_ms\n1,2,3\n", "s.csv").unwrap();
        assert!(matches!(fit_nnls(&s), Err(FitError::TooFewSamples { .. })));
    }

    /// A Vidur-format attention profile whose times follow known per-feature costs.
    fn attention_profile() -> String {
        let mut text = String::from(
            "n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,\
             batch_size,prefill_chunk_size,kv_cache_size,is_prefill,attention_backend,\
             time_stats.attn_prefill.median,time_stats.attn_decode.median\n",
        );
        for tp in [1, 2] {
            let scale = 1.0 / f64::from(tp);
            for c in [16u64, 64, 256, 1024] {
                for m in [0u64, 512, 2048] {
                    let t = 0.02 + scale * (3e-8 * (c * c + 2 * c * m) as f64 + 4e-6 * m as f64);
                    text.push_str(&format!(
                        "4096,32,32,16,{tp},4096,1,{c},{m},True,FLASHINFER,{t},\n"
                    ));
                }
            }
            for b in [1u64, 8, 64] {
                for m in [128u64, 1024, 4096] {
                    let t = 0.01 + scale * (1e-4 * b as f64 + 2e-7 * (b * (m + 1)) as f64);
                    text.push_str(&format!(
                        "4096,32,32,16,{tp},4096,{b},0,{m},False,FLASHINFER,,{t}\n"
                    ));
                }
            }
        }
        text
    }

    #[test]
    fn vidur_attention_rows_become_replay_features_and_fit_back() {
        let text = attention_profile();
        let s = Samples::from_vidur_attention_csv(&text, "attention.csv", 1).unwrap();
        assert_eq!(s.measured_ms.len(), 21);
        // n_prefill equals has_prefill on every row (prefill batch size 1): left out.
        assert_eq!(
            s.features,
            vec![
                Feature::HasPrefill,
                Feature::PrefillAttn,
                Feature::PrefillCtx,
                Feature::HasDecode,
                Feature::NDecode,
                Feature::DecodeKv,
            ]
        );
        let r = fit_nnls(&s).unwrap();
        let theta = |f: Feature| r.theta_ms[f as usize];
        assert!((theta(Feature::HasPrefill) - 0.02).abs() < 1e-9);
        assert!((theta(Feature::PrefillAttn) - 3e-8).abs() < 1e-15);
        assert!((theta(Feature::PrefillCtx) - 4e-6).abs() < 1e-12);
        assert!((theta(Feature::HasDecode) - 0.01).abs() < 1e-9);
        assert!((theta(Feature::NDecode) - 1e-4).abs() < 1e-11);
        assert!((theta(Feature::DecodeKv) - 2e-7).abs() < 1e-14);
        let tp2 = Samples::from_vidur_attention_csv(&text, "attention.csv", 2).unwrap();
        let r2 = fit_nnls(&tp2).unwrap();
        assert!((r2.theta_ms[Feature::DecodeKv as usize] - 1e-7).abs() < 1e-14);
    }

    #[test]
    fn vidur_attention_errors_name_line_and_column() {
        let text = attention_profile().replacen(",True,", ",maybe,", 1);
        let e = Samples::from_vidur_attention_csv(&text, "attention.csv", 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "attention.csv: line 2, column is_prefill: expected True or False, got \"maybe\""
        );
        // A prefill row without its time.
        let mut lines: Vec<String> = attention_profile().lines().map(String::from).collect();
        let mut fields: Vec<&str> = lines[1].split(',').collect();
        fields[11] = "";
        lines[1] = fields.join(",");
        let text = lines.join("\n");
        let e = Samples::from_vidur_attention_csv(&text, "attention.csv", 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 2, column time_stats.attn_prefill.median"),
            "{e}"
        );
        let e =
            Samples::from_vidur_attention_csv("batch_size\n1\n", "attention.csv", 1).unwrap_err();
        assert!(e.to_string().contains("\"is_prefill\""), "{e}");
        let e = Samples::from_vidur_attention_csv(&attention_profile(), "attention.csv", 4)
            .unwrap_err();
        assert!(e.to_string().contains("tensor-parallel degree 4"), "{e}");
    }

    #[test]
    fn stats_are_hand_checkable() {
        let s = FitStats::compute(array![1.1, 1.8].view(), array![1.0, 2.0].view());
        assert!((s.ape_median_pct - 10.0).abs() < 1e-9);
        assert!((s.ape_max_pct - 10.0).abs() < 1e-9);
        // ss_res = 0.01 + 0.04, ss_tot = 0.5.
        assert!((s.r2 - 0.9).abs() < 1e-12);
    }
}

#[cfg(test)]
mod vidur_profile_tests {
    use super::*;

    fn profile() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../notebooks-data/profiling/a100/llama-2-7b/mlp.csv"
        );
        std::fs::read_to_string(path).expect("bundled Vidur profile")
    }

    #[test]
    fn fit_on_vidur_a100_profile_is_close_to_the_published_coefficients() {
        let text = profile();
        let s = Samples::from_vidur_mlp_csv(&text, "mlp.csv", 1).unwrap();
        let r = fit_nnls(&s).unwrap();
        let (b_o, a_o) = (r.theta_ms[0], r.theta_ms[1]);
        eprintln!(
            "TP1: n={} b_o={b_o} a_o={a_o} stats={:?}",
            s.measured_ms.len(),
            r.stats
        );
        // Published (InferMax, same Vidur profiles): b_o = 0.06486 ms, a_o = 0.00191 ms/token.
        assert!((a_o - 0.00191).abs() / 0.00191 < 0.15, "a_o = {a_o}");
        assert!(r.stats.r2 > 0.99, "{:?}", r.stats);
        for tp in [2, 4, 8] {
            let s = Samples::from_vidur_mlp_csv(&text, "mlp.csv", tp).unwrap();
            let r2 = fit_nnls(&s).unwrap();
            eprintln!(
                "TP{tp}: n={} theta={:?} stats={:?}",
                s.measured_ms.len(),
                &r2.theta_ms[..2],
                r2.stats
            );
            // Tensor parallelism splits the linear layers: less time per token.
            assert!(r2.theta_ms[1] < a_o);
        }
        let e = Samples::from_vidur_mlp_csv(&text, "mlp.csv", 3).unwrap_err();
        assert!(
            e.to_string()
                .contains("no rows with tensor-parallel degree 3"),
            "{e}"
        );
    }
}
