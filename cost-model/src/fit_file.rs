//! A coefficient file from one or more sample sets (`infersched fit`): each set fitted on
//! its own by NNLS (a Vidur MLP profile for the linear terms, an attention profile for the
//! attention terms, or any samples CSV), the coefficients combined, and the provenance
//! saying what each came from and what the data could not identify.

use crate::fit::{FitError, FitReport, Samples, fit_nnls};
use crate::linear::{COST_MODEL_FORMAT, CoefficientFile, Provenance, TimeUnit};
use std::collections::BTreeMap;

/// One sample set of a fit, named for messages and the provenance (usually its path).
#[derive(Debug, Clone)]
pub struct FitInput {
    /// The set's name.
    pub name: String,
    /// Its samples.
    pub samples: Samples,
}

/// One sample set's fit.
#[derive(Debug, Clone)]
pub struct InputFit {
    /// The set's name.
    pub name: String,
    /// Its samples.
    pub samples: Samples,
    /// Its NNLS fit.
    pub report: FitReport,
}

/// Fits each input on its own and assembles one coefficient file named `name`: per-layer
/// coefficients times `layers` when given, for tensor-parallel degree `tensor_parallel`.
/// The inputs' features must not overlap (each coefficient comes from one set).
///
/// ```
/// use infersched_cost_model::{Samples, fit_file::{FitInput, fit_coefficient_file}};
/// let csv = "one,tokens,measured_ms\n1,10,2.0\n1,20,3.0\n1,40,5.0\n";
/// let samples = Samples::from_csv_str(csv, "batches.csv").unwrap();
/// let inputs = vec![FitInput { name: "batches.csv".into(), samples }];
/// let (file, fits) = fit_coefficient_file(inputs, "my-gpu", None, 1).unwrap();
/// assert!((file.theta["one"] - 1.0).abs() < 1e-9 && (file.theta["tokens"] - 0.1).abs() < 1e-9);
/// assert_eq!(fits[0].report.stats.samples, 3);
/// ```
pub fn fit_coefficient_file(
    inputs: Vec<FitInput>,
    name: &str,
    layers: Option<u32>,
    tensor_parallel: u32,
) -> Result<(CoefficientFile, Vec<InputFit>), FitError> {
    let mut theta = BTreeMap::new();
    let mut fits = Vec::with_capacity(inputs.len());
    for FitInput {
        name: input,
        samples,
    } in inputs
    {
        let report = fit_nnls(&samples).map_err(|e| FitError::Input {
            input: input.clone(),
            source: Box::new(e),
        })?;
        for f in &samples.features {
            if theta
                .insert(f.name().to_owned(), report.theta_ms[*f as usize])
                .is_some()
            {
                return Err(FitError::FeatureInTwoInputs {
                    feature: f.name().to_owned(),
                    input,
                });
            }
        }
        fits.push(InputFit {
            name: input,
            samples,
            report,
        });
    }
    let source = fits
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(" + ");
    let unidentified: Vec<&str> = fits
        .iter()
        .flat_map(|f| f.report.unidentified.iter().map(|u| u.name()))
        .filter(|u| !theta.contains_key(*u))
        .collect();
    let collinear: Vec<&str> = fits
        .iter()
        .flat_map(|f| f.report.collinear.iter().map(|c| c.name()))
        .collect();
    let stats = |f: &InputFit| {
        serde_json::to_value(f.report.stats).map_err(|e| FitError::NotFinite(e.to_string()))
    };
    let fit_stats = if let [only] = fits.as_slice() {
        stats(only)?
    } else {
        serde_json::Value::Object(
            fits.iter()
                .map(|f| Ok((f.name.clone(), stats(f)?)))
                .collect::<Result<_, FitError>>()?,
        )
    };
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
    let file = CoefficientFile {
        format: COST_MODEL_FORMAT.into(),
        name: name.to_owned(),
        description: format!("NNLS fit to {source}"),
        unit: TimeUnit::Ms,
        per_layer: layers.is_some(),
        layers,
        theta: theta.into_iter().collect(),
        model: None,
        gpu: None,
        tensor_parallel,
        provenance: Provenance {
            method: "nnls-fit".into(),
            source,
            notes: (!notes.is_empty()).then(|| notes.join("; ")),
            fit: Some(fit_stats),
        },
    };
    Ok((file, fits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, csv: &str) -> FitInput {
        FitInput {
            name: name.into(),
            samples: Samples::from_csv_str(csv, name).unwrap(),
        }
    }

    #[test]
    fn two_sets_give_one_file_and_a_shared_feature_is_refused() {
        let linear = input(
            "mlp.csv",
            "one,tokens,measured_ms\n1,10,2.0\n1,20,3.0\n1,40,5.0\n",
        );
        let attention = input(
            "attn.csv",
            "decode_kv,measured_ms\n100,0.5\n200,1.0\n400,2.0\n",
        );
        let (file, fits) =
            fit_coefficient_file(vec![linear.clone(), attention], "combined", Some(32), 2).unwrap();
        assert_eq!(fits.len(), 2);
        assert!((file.theta["decode_kv"] - 0.005).abs() < 1e-12);
        assert_eq!(file.provenance.source, "mlp.csv + attn.csv");
        assert_eq!(
            (file.layers, file.per_layer, file.tensor_parallel),
            (Some(32), true, 2)
        );
        // Per-set statistics, keyed by set.
        let stats = file.provenance.fit.unwrap();
        assert!(stats.get("mlp.csv").is_some() && stats.get("attn.csv").is_some());
        // The same feature from two sets: which coefficient would win is refused.
        let e = fit_coefficient_file(vec![linear.clone(), linear], "x", None, 1).unwrap_err();
        assert!(
            matches!(&e, FitError::FeatureInTwoInputs { feature, .. } if feature == "one"),
            "{e}"
        );
    }
}
