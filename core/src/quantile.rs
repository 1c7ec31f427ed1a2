//! Quantiles as numpy computes them by default (linear interpolation between closest
//! ranks), shared by the metrics and the SLOs.

/// The `q`-quantile (0 <= q <= 1) of sorted `values` by linear interpolation.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}
