//! Requests grouped into classes of identical requests, each class's state graph in a
//! policy class, and an arc's own cost: what both exact methods build on.

use crate::PolicyConstraints;
use crate::graph::StateGraph;
use infersched_core::{BatchFeatures, Feature, Limits, Workload};
use infersched_cost_model::LinearCostModel;

/// The state graph of request `r` in policy class `class` (reservations forbid evictions).
pub(crate) fn class_graph(
    r: &infersched_core::Request,
    limits: &Limits,
    class: &PolicyConstraints,
) -> StateGraph {
    StateGraph::new(
        r,
        limits,
        class.no_evict || class.reserve,
        class.no_chunk,
        class.reserve,
    )
}

/// An entry's (arc's) own cost in milliseconds: every feature but the per-batch ones
/// (`one`, `has_prefill`, `has_decode`), which the batch pays once.
pub(crate) fn entry_cost_ms(cost: &LinearCostModel, f: &BatchFeatures) -> f64 {
    Feature::ALL
        .iter()
        .filter(|k| !matches!(k, Feature::One | Feature::HasPrefill | Feature::HasDecode))
        .map(|&k| cost.theta(k) * 1e3 * f.get(k))
        .sum()
}

/// Groups request ids into classes of identical requests (same I, O and arrival), in
/// order of first appearance, or one class per request.
pub(crate) fn request_classes(w: &Workload, aggregate: bool) -> Vec<Vec<usize>> {
    let mut classes: Vec<Vec<usize>> = Vec::new();
    let mut index: std::collections::HashMap<(u32, u32, u64), usize> =
        std::collections::HashMap::new();
    for (i, r) in w.requests().iter().enumerate() {
        let key = (r.input_tokens, r.output_tokens, r.arrival_s.to_bits());
        match index.get(&key) {
            Some(&k) if aggregate => classes[k].push(i),
            _ => {
                index.insert(key, classes.len());
                classes.push(vec![i]);
            }
        }
    }
    classes
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;

    #[test]
    fn identical_requests_share_a_class_in_order_of_first_appearance() {
        let r = |i, o, t| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        let w = Workload::new(vec![
            r(4, 2, 0.0),
            r(3, 2, 0.0),
            r(4, 2, 0.0),
            r(4, 2, 0.5),
            r(3, 2, 0.0),
        ])
        .unwrap();
        assert_eq!(
            request_classes(&w, true),
            vec![vec![0, 2], vec![1, 4], vec![3]]
        );
        assert_eq!(request_classes(&w, false).len(), 5);
    }

    #[test]
    fn an_entry_cost_leaves_the_per_batch_features_to_the_batch() {
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let mut f = BatchFeatures::default();
        f.add_decode(100);
        let with_batch = cost.theta(Feature::One) + cost.theta(Feature::HasDecode);
        let whole_ms = infersched_core::CostModel::batch_time_s(&cost, &f) * 1e3;
        assert!((entry_cost_ms(&cost, &f) - (whole_ms - with_batch * 1e3)).abs() < 1e-9);
    }
}
