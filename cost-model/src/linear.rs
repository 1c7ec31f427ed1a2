//! The linear cost model and its coefficient file (`infersched-cost-model/1`).
//!
//! ```json
//! {"format": "infersched-cost-model/1", "name": "llama2-7b-a100",
//!  "unit": "ms", "per_layer": true, "layers": 32,
//!  "theta": {"one": 0.06486, "tokens": 0.00191, "...": 0},
//!  "provenance": {"method": "published", "source": "..."}}
//! ```
//! Batch time in seconds = `sum_k theta_k * phi_k * (layers if per_layer) * unit`.
//! Features missing from `theta` have coefficient 0; unknown feature names are an error.

use crate::hardware::{GpuSpec, ModelSpec};
use infersched_core::{BatchFeatures, CostModel, FEATURE_NAMES, Feature};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The `format` value of coefficient files.
pub const COST_MODEL_FORMAT: &str = "infersched-cost-model/1";

/// The unit of the theta values in a coefficient file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeUnit {
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
}

impl TimeUnit {
    /// Seconds per unit.
    pub fn seconds(self) -> f64 {
        match self {
            TimeUnit::S => 1.0,
            TimeUnit::Ms => 1e-3,
            TimeUnit::Us => 1e-6,
        }
    }
}

/// Where coefficients come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// `published`, `nnls-fit`, `calibration`, `roofline`, or `manual`.
    pub method: String,
    /// What they were taken or fitted from.
    pub source: String,
    /// Anything else worth knowing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// Fit statistics, for fitted coefficients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<serde_json::Value>,
}

/// A coefficient file, as stored on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoefficientFile {
    /// Always [`COST_MODEL_FORMAT`].
    pub format: String,
    /// Short name, e.g. `llama2-7b-a100`.
    pub name: String,
    /// One line for people.
    #[serde(default)]
    pub description: String,
    /// Unit of the theta values.
    pub unit: TimeUnit,
    /// Whether theta is per transformer layer (then multiplied by `layers`).
    pub per_layer: bool,
    /// Number of layers (required when `per_layer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// Coefficient per feature name.
    pub theta: BTreeMap<String, f64>,
    /// The model shape the coefficients are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// The GPU they are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// Tensor-parallel degree.
    #[serde(default = "one_u32")]
    pub tensor_parallel: u32,
    /// Where they come from.
    pub provenance: Provenance,
}

fn one_u32() -> u32 {
    1
}

/// Why a cost model could not be loaded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CostModelError {
    /// Neither a preset nor a readable file.
    #[error(
        "unknown cost model \"{spec}\": not a preset ({presets}), not roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]], and no such file"
    )]
    Unknown {
        /// What was asked for.
        spec: String,
        /// The preset names, comma-separated (the file format knows nothing of presets).
        presets: String,
    },
    /// A `roofline:` spec that does not parse.
    #[error("cost model {0}")]
    Roofline(String),
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The JSON is malformed.
    #[error("{path}: line {line} column {column}: {message}")]
    Json {
        /// File.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What serde said.
        message: String,
    },
    /// A field has a value that is not allowed.
    #[error("{path}: {field}: {reason}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// Field path, e.g. `theta.tokens`.
        field: String,
        /// What was expected.
        reason: String,
    },
}

/// `t(batch) = sum_k theta_k * phi_k(batch)`, theta in seconds per feature unit per batch.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearCostModel {
    /// Name (from the file or preset).
    pub name: String,
    /// Seconds per unit of each feature, in [`Feature::ALL`] order.
    pub theta_s: [f64; 9],
    /// The file it was loaded from (or built into), for reports.
    pub file: CoefficientFile,
}

impl LinearCostModel {
    /// Builds the model from a parsed coefficient file; `path` names it in errors.
    pub fn from_file(file: CoefficientFile, path: &Path) -> Result<Self, CostModelError> {
        let invalid = |field: String, reason: String| CostModelError::Invalid {
            path: path.to_owned(),
            field,
            reason,
        };
        if file.format != COST_MODEL_FORMAT {
            return Err(invalid(
                "format".into(),
                format!("expected \"{COST_MODEL_FORMAT}\", got \"{}\"", file.format),
            ));
        }
        let layers = match (file.per_layer, file.layers) {
            (true, Some(l)) if l >= 1 => f64::from(l),
            (true, _) => {
                return Err(invalid(
                    "layers".into(),
                    "per_layer is true, so layers must be given and >= 1".into(),
                ));
            }
            (false, _) => 1.0,
        };
        if file.tensor_parallel == 0 {
            return Err(invalid("tensor_parallel".into(), "must be >= 1".into()));
        }
        if let Some(model) = &file.model {
            if let (true, Some(l)) = (file.per_layer, file.layers)
                && l != model.layers
            {
                return Err(invalid(
                    "layers".into(),
                    format!(
                        "{l} differs from model.layers = {}; per-layer coefficients need the model's layer count",
                        model.layers
                    ),
                ));
            }
            model
                .check_tensor_parallel(file.tensor_parallel)
                .map_err(|e| invalid("tensor_parallel".into(), e.to_string()))?;
        }
        let scale = layers * file.unit.seconds();
        let mut theta_s = [0.0; 9];
        for (name, &v) in &file.theta {
            let Some(feature) = Feature::from_name(name) else {
                return Err(invalid(
                    format!("theta.{name}"),
                    format!(
                        "unknown feature; expected one of {}",
                        FEATURE_NAMES.join(", ")
                    ),
                ));
            };
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(
                    format!("theta.{name}"),
                    format!("must be a finite number >= 0, got {v}"),
                ));
            }
            let scaled = v * scale;
            if !scaled.is_finite() {
                return Err(invalid(
                    format!("theta.{name}"),
                    format!("{v} x {scale} (layers x unit) overflows to infinity seconds"),
                ));
            }
            theta_s[feature as usize] = scaled;
        }
        Ok(Self {
            name: file.name.clone(),
            theta_s,
            file,
        })
    }

    /// Parses coefficient JSON; `path` names it in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, CostModelError> {
        let file: CoefficientFile =
            serde_json::from_str(text).map_err(|e| CostModelError::Json {
                path: path.to_owned(),
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })?;
        Self::from_file(file, path)
    }

    /// Reads a coefficient file.
    pub fn read(path: &Path) -> Result<Self, CostModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| CostModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    /// Seconds per unit of `feature`.
    pub fn theta(&self, feature: Feature) -> f64 {
        self.theta_s[feature as usize]
    }

    /// One stage of a pipeline of `stages` stages: every coefficient divided by `stages`,
    /// so a batch takes `1 / stages` of its time (semantics.md, "Pipeline parallelism").
    /// Every pipelined schedule's stage 0 is a schedule of one machine at this speed,
    /// each token out no later than on the pipeline: bounds computed with it hold there.
    pub fn stage_of(&self, stages: u32) -> LinearCostModel {
        let p = f64::from(stages.max(1));
        LinearCostModel {
            name: format!("{} (1 of {stages} pipeline stages)", self.name),
            theta_s: self.theta_s.map(|t| t / p),
            file: self.file.clone(),
        }
    }
}

impl CostModel for LinearCostModel {
    fn batch_time_s(&self, f: &BatchFeatures) -> f64 {
        if f.tokens == 0 {
            return 0.0;
        }
        let x = f.to_array();
        self.theta_s.iter().zip(x).map(|(t, v)| t * v).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("c.json")
    }

    #[test]
    fn units_and_layers_scale() {
        let m = LinearCostModel::from_json_str(
            r#"{"format": "infersched-cost-model/1", "name": "t", "unit": "ms", "per_layer": true,
                "layers": 10, "theta": {"one": 1.0, "tokens": 0.5},
                "provenance": {"method": "manual", "source": "test"}}"#,
            p(),
        )
        .unwrap();
        let mut f = BatchFeatures::default();
        assert_eq!(m.batch_time_s(&f), 0.0);
        f.add_prefill(4, 0);
        // 10 layers * (1 + 0.5 * 4) ms = 30 ms.
        assert!((m.batch_time_s(&f) - 0.030).abs() < 1e-15);
    }

    #[test]
    fn inconsistent_or_overflowing_files_are_refused_at_load() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../notebooks-data/cost-models/llama3-70b-tp4-a100.json"
        ))
        .unwrap();
        assert!(LinearCostModel::from_json_str(&text, p()).is_ok());
        let edit = |from: &str, to: &str| {
            assert!(text.contains(from), "{from}");
            LinearCostModel::from_json_str(&text.replacen(from, to, 1), p())
                .unwrap_err()
                .to_string()
        };
        let e = edit("\"layers\": 80", "\"layers\": 79");
        assert!(
            e.contains("layers") && e.contains("model.layers = 80"),
            "{e}"
        );
        let e = edit("\"tensor_parallel\": 4", "\"tensor_parallel\": 3");
        assert!(
            e.contains("tensor_parallel") && e.contains("does not divide"),
            "{e}"
        );
        // 1e307 s per layer x 80 layers overflows f64: refused here, not reported later as
        // an internal error.
        let e = LinearCostModel::from_json_str(
            r#"{"format": "infersched-cost-model/1", "name": "t", "unit": "s", "per_layer": true,
                "layers": 80, "theta": {"one": 1e307},
                "provenance": {"method": "m", "source": "s"}}"#,
            p(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("theta.one") && e.contains("infinity"), "{e}");
    }

    #[test]
    fn bad_files_name_the_field() {
        let base = |theta: &str, extra: &str| {
            format!(
                r#"{{"format": "infersched-cost-model/1", "name": "t", "unit": "s", "per_layer": false,
                    "theta": {theta}, "provenance": {{"method": "m", "source": "s"}}{extra}}}"#
            )
        };
        let e = LinearCostModel::from_json_str(&base(r#"{"tokenz": 1}"#, ""), p()).unwrap_err();
        assert!(
            e.to_string().contains("theta.tokenz: unknown feature"),
            "{e}"
        );
        let e = LinearCostModel::from_json_str(&base(r#"{"tokens": -1}"#, ""), p()).unwrap_err();
        assert!(e.to_string().contains("theta.tokens: must be"), "{e}");
        let e = LinearCostModel::from_json_str(&base("{}", r#", "colour": 1"#), p()).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = LinearCostModel::from_json_str("{", p()).unwrap_err();
        assert!(e.to_string().starts_with("c.json: line 1"), "{e}");
        let e = LinearCostModel::from_json_str(
            r#"{"format": "infersched-cost-model/1", "name": "t", "unit": "s", "per_layer": true,
                "theta": {}, "provenance": {"method": "m", "source": "s"}}"#,
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("layers"), "{e}");
    }
}
