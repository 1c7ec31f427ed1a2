//! Test support shared by infersched's crates (a dev-dependency only, never published):
//! tiny workloads from tuples and the exhaustive-search oracle ([`exhaustive`]), written
//! from the spec alone so that the solver's and the schedulers' tests can check against
//! code that shares nothing with them.
//!
//! ```
//! let w = infersched_test_kit::workload(&[(4, 2, 0.0), (3, 3, 0.5)]);
//! assert_eq!(w.len(), 2);
//! // The largest I + O - 1: the smallest KV capacity that serves every request.
//! assert_eq!(infersched_test_kit::largest_kv_need(&w), 5);
//! ```

pub mod exhaustive;

use std::ops::RangeInclusive;

use infersched_core::{BatchFeatures, CostModel, Request, Workload};

/// A cost model under which every batch takes one second: schedules' times by hand.
#[derive(Debug, Clone, Copy)]
pub struct EverySecond;

impl CostModel for EverySecond {
    fn batch_time_s(&self, _: &BatchFeatures) -> f64 {
        1.0
    }
}

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
    .expect("test workload")
}

/// The most KV any single request of `w` needs (`max(I + O - 1)`): the smallest M that
/// can serve it.
pub fn largest_kv_need(w: &Workload) -> u64 {
    w.requests()
        .iter()
        .map(|r| r.max_kv_tokens())
        .max()
        .unwrap_or(0)
}

/// One or two classes of identical requests, all at t = 0, drawn from `rng`: each class's
/// prompt and output lengths from `input` and `output`, its copies from `copies`.
pub fn identical_classes(
    rng: &mut impl rand::Rng,
    input: RangeInclusive<u32>,
    output: RangeInclusive<u32>,
    copies: RangeInclusive<u32>,
) -> Workload {
    let mut reqs = Vec::new();
    for _ in 0..rng.random_range(1..=2) {
        let r = Request {
            input_tokens: rng.random_range(input.clone()),
            output_tokens: rng.random_range(output.clone()),
            arrival_s: 0.0,
        };
        for _ in 0..rng.random_range(copies.clone()) {
            reqs.push(r);
        }
    }
    Workload::new(reqs).expect("test workload")
}

/// A batch in a form where entry order inside the batch does not matter: its evictions,
/// then its `(request, tokens, tokens from the prefix cache)` triples, each sorted (how the
/// parity tests compare a simulated batch with a recorded one).
pub fn normalized_batch(b: &infersched_core::Batch) -> (Vec<u32>, Vec<(u32, u32, u32)>) {
    let mut evicted = Vec::new();
    let mut processed = Vec::new();
    for e in &b.entries {
        match e.action {
            infersched_core::Action::Evict => evicted.push(e.request),
            infersched_core::Action::Process(t) => processed.push((e.request, t, e.cached)),
            infersched_core::Action::Receive => processed.push((e.request, 0, e.cached)),
        }
    }
    evicted.sort_unstable();
    processed.sort_unstable();
    (evicted, processed)
}

/// Fails on the first batch where `ours` (produced by `policy`) and the recorded `theirs`
/// (by `system`) differ, entries in any order, or on their counts; `name` names the case.
pub fn assert_same_batches(
    name: &str,
    (policy, ours): (&str, &[infersched_core::Batch]),
    (system, theirs): (&str, &[infersched_core::Batch]),
) {
    for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let (a, b) = (normalized_batch(a), normalized_batch(b));
        assert!(
            a == b,
            "{name}: batch {k} differs from {system}'s:\n  {policy}: evict {:?}, process {:?}\n  {system}: evict {:?}, process {:?}",
            a.0,
            a.1,
            b.0,
            b.1
        );
    }
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{name}: {policy} ran {} batches, {system} {}",
        ours.len(),
        theirs.len()
    );
}

/// The recorded cases under `dir` (each a folder with a `config.json`), sorted (the
/// parity tests' fixtures).
pub fn fixture_cases(dir: &str) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    dirs
}
