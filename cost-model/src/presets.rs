//! Built-in coefficient sets, embedded from `notebooks-data/cost-models/`.

use crate::linear::{CostModelError, LinearCostModel};
use std::path::Path;

/// Names of the built-in presets: the InferMax authors' published A100 coefficients (to
/// reproduce InferMax's findings) and H100 and H200 calibrations measured with `infersched
/// calibrate` (for predictions; `-fa2`: attention terms from FlashAttention-2 timings;
/// `-tp8`: one tensor-parallel shard's compute, the all-reduces between shards not included).
pub const PRESET_NAMES: [&str; 12] = [
    "llama2-7b-a100",
    "llama3-70b-tp4-a100",
    "llama2-7b-h100",
    "llama3-8b-h100",
    "llama2-7b-h100-fa2",
    "llama3-8b-h100-fa2",
    "llama2-7b-h200",
    "llama3-8b-h200",
    "llama2-7b-h200-fa2",
    "llama3-8b-h200-fa2",
    "llama3-70b-h100-tp8",
    "llama3-70b-h200-tp8",
];

const PRESET_FILES: [&str; 12] = [
    include_str!("../../notebooks-data/cost-models/llama2-7b-a100.json"),
    include_str!("../../notebooks-data/cost-models/llama3-70b-tp4-a100.json"),
    include_str!("../../notebooks-data/calibration/h100/llama2-7b/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h100/llama3-8b/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h100/llama2-7b-fa2/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h100/llama3-8b-fa2/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h200/llama2-7b/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h200/llama3-8b/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h200/llama2-7b-fa2/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h200/llama3-8b-fa2/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h100/llama3-70b-tp8/coefficients.json"),
    include_str!("../../notebooks-data/calibration/h200/llama3-70b-tp8/coefficients.json"),
];

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<LinearCostModel> {
    let i = PRESET_NAMES.iter().position(|n| *n == name)?;
    let path = format!("<preset {name}>");
    Some(
        LinearCostModel::from_json_str(PRESET_FILES[i], Path::new(&path))
            .expect("built-in presets are valid (checked by tests)"),
    )
}

/// A preset by name, a `roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]]` spec, or else a coefficient file by path.
pub fn resolve(spec: &str) -> Result<LinearCostModel, CostModelError> {
    if let Some(m) = crate::roofline::parse_roofline(spec).map_err(CostModelError::Roofline)? {
        return Ok(m);
    }
    if let Some(m) = preset(spec) {
        return Ok(m);
    }
    let path = Path::new(spec);
    if path.is_file() {
        LinearCostModel::read(path)
    } else {
        Err(CostModelError::Unknown {
            spec: spec.to_owned(),
            presets: PRESET_NAMES.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{BatchFeatures, CostModel};

    #[test]
    fn presets_load_and_match_the_sanity_check() {
        for name in PRESET_NAMES {
            let m = preset(name).unwrap();
            assert_eq!(m.name, name);
        }
        let m = preset("llama2-7b-a100").unwrap();
        // cost-model-presets.md: a 512-token prefill is about 38 ms on the 7B preset.
        let mut f = BatchFeatures::default();
        f.add_prefill(512, 0);
        let t = m.batch_time_s(&f);
        let expected = 32.0
            * (0.06486 + 0.00191 * 512.0 + 0.0926 + 1.6773e-7 * 512.0 * 512.0 + 0.001534)
            * 1e-3;
        assert!((t - expected).abs() < 1e-12, "{t} vs {expected}");
        assert!((t - 0.038).abs() < 0.001, "{t}");
        // A decode batch of 32 requests at 1,000 tokens of context: about 14 ms.
        let mut f = BatchFeatures::default();
        for _ in 0..32 {
            f.add_decode(1000);
        }
        let t = m.batch_time_s(&f);
        let expected = 32.0
            * (0.06486 + 0.00191 * 32.0 + 0.01921 + 8.513e-6 * 32_000.0 + 0.00074 * 32.0)
            * 1e-3;
        assert!((t - expected).abs() < 1e-12, "{t} vs {expected}");
        assert!((t - 0.01412).abs() < 1e-4, "{t}");
    }

    #[test]
    fn resolve_reports_unknown_names() {
        let e = resolve("llama9-a100").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("llama9-a100") && s.contains("llama2-7b-a100"),
            "{s}"
        );
    }
}
