//! Test support shared by the cross-crate tests (each test crate uses part of it).
#![allow(dead_code)]

pub mod exhaustive;

use infersched::core::{Request, Workload};

/// A workload from `(I, O, arrival)` tuples (panics on invalid ones: test data).
pub fn workload(reqs: &[(u32, u32, f64)]) -> Workload {
    Workload::new(
        reqs.iter()
            .map(|&(i, o, t)| Request {
                input_tokens: i,
                output_tokens: o,
                arrival_s: t,
            })
            .collect(),
    )
    .unwrap()
}

/// The most KV any single request of `w` needs (`max(I + O - 1)`): the smallest M that
/// can serve it.
pub fn largest_kv_need(w: &Workload) -> u64 {
    w.requests()
        .iter()
        .map(|r| r.max_kv_tokens())
        .max()
        .unwrap()
}
