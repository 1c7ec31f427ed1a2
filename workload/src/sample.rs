//! Sampling and transforming a trace (Vidur's trace request generator knobs).

use crate::synth::{ArrivalProcess, assign_arrivals};
use infersched_core::{PrefixIds, Request, Workload, WorkloadError};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Which requests of a trace to keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    /// All of them.
    All,
    /// The first N rows.
    First(usize),
    /// N consecutive rows after skipping the first K: `Window(K, N)` (rows K..K + N).
    Window(usize, usize),
    /// N distinct rows drawn uniformly with this seed, kept in trace order.
    Random(usize, u64),
}

/// A sampling and transformation of a trace. Applied in this order: select, scale
/// lengths, trim, scale time, replace arrivals, shift time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    /// Which rows.
    pub selection: Selection,
    /// Multiplies I (rounded to nearest, at least 1). Vidur's `prefill_scale_factor`.
    pub prefill_scale: f64,
    /// Multiplies O (rounded to nearest, at least 1). Vidur's `decode_scale_factor`.
    pub decode_scale: f64,
    /// Multiplies arrival times. Vidur's `time_scale_factor`.
    pub time_scale: f64,
    /// Cap on I + O: the prompt is cut first (as Vidur does); if O alone reaches the cap,
    /// O becomes cap - 1 and I becomes 1.
    pub max_total_tokens: Option<u32>,
    /// Replace arrival times with draws from this process (with `arrival_seed`).
    pub arrival: Option<ArrivalProcess>,
    /// Seed of the arrival draws.
    pub arrival_seed: u64,
    /// Shift times so the earliest kept request arrives at 0.
    pub rebase_time: bool,
}

impl Default for SampleSpec {
    fn default() -> Self {
        Self {
            selection: Selection::All,
            prefill_scale: 1.0,
            decode_scale: 1.0,
            time_scale: 1.0,
            max_total_tokens: None,
            arrival: None,
            arrival_seed: 0,
            rebase_time: false,
        }
    }
}

/// Why a sample cannot be taken.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SampleError {
    /// A knob is out of range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The knob.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The result is not a valid workload.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
}

fn scale(v: u32, f: f64) -> u32 {
    ((f64::from(v) * f).round().max(1.0)).min(f64::from(u32::MAX)) as u32
}

/// Applies `spec` to `trace`.
pub fn sample(trace: &Workload, spec: &SampleSpec) -> Result<Workload, SampleError> {
    check_spec(spec)?;
    let all = trace.requests();
    let picked = pick(all.len(), spec.selection)?;
    let transformed: Vec<Request> = picked.iter().map(|&k| transform(all[k], spec)).collect();
    let mut w = Workload::new(transformed)?;
    if let Some(a) = spec.arrival {
        w = assign_arrivals(&w, a, spec.arrival_seed).map_err(|e| SampleError::Invalid {
            field: "arrival",
            reason: e.to_string(),
        })?;
    }
    if spec.rebase_time {
        let t0 = w
            .requests()
            .iter()
            .map(|r| r.arrival_s)
            .fold(f64::INFINITY, f64::min);
        w = Workload::new(
            w.requests()
                .iter()
                .map(|r| Request {
                    arrival_s: r.arrival_s - t0,
                    ..*r
                })
                .collect(),
        )?;
    }
    carry_prefix(trace, w, &picked, spec)
}

/// The scales positive and finite, `max_total_tokens` at least 2.
fn check_spec(spec: &SampleSpec) -> Result<(), SampleError> {
    let invalid = |field, reason: String| SampleError::Invalid { field, reason };
    for (field, v) in [
        ("prefill-scale", spec.prefill_scale),
        ("decode-scale", spec.decode_scale),
        ("time-scale", spec.time_scale),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(field, format!("must be > 0, got {v}")));
        }
    }
    if let Some(m) = spec.max_total_tokens
        && m < 2
    {
        return Err(invalid(
            "max-total-tokens",
            format!("must be >= 2 (I >= 1 and O >= 1), got {m}"),
        ));
    }
    Ok(())
}

/// The indices of the requests `selection` picks from a trace of `len`, in trace order.
fn pick(len: usize, selection: Selection) -> Result<Vec<usize>, SampleError> {
    let invalid = |reason: String| SampleError::Invalid {
        field: "requests",
        reason,
    };
    Ok(match selection {
        Selection::All => (0..len).collect(),
        Selection::First(n) | Selection::Random(n, _) if n == 0 || n > len => {
            return Err(invalid(format!(
                "asked for {n} requests; the trace has {len} (need 1..={len})"
            )));
        }
        Selection::First(n) => (0..n).collect(),
        Selection::Window(skip, n) => {
            let end = skip.checked_add(n).filter(|&e| n > 0 && e <= len);
            let Some(end) = end else {
                return Err(invalid(format!(
                    "asked for {n} requests after skipping {skip}; the trace has {len} (need 1 to {} after the skip)",
                    len.saturating_sub(skip)
                )));
            };
            (skip..end).collect()
        }
        Selection::Random(n, seed) => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut idx = rand::seq::index::sample(&mut rng, len, n).into_vec();
            idx.sort_unstable();
            idx
        }
    })
}

/// Request `r` with its lengths scaled and cut to `max_total_tokens` (the output kept
/// where it fits, else `O = max - 1`, `I = 1`), its arrival scaled.
fn transform(r: Request, spec: &SampleSpec) -> Request {
    let mut i = scale(r.input_tokens, spec.prefill_scale);
    let mut o = scale(r.output_tokens, spec.decode_scale);
    if let Some(max) = spec.max_total_tokens
        && i + o > max
    {
        if o >= max {
            o = max - 1;
            i = 1;
        } else {
            i = max - o;
        }
    }
    Request {
        input_tokens: i,
        output_tokens: o,
        arrival_s: r.arrival_s * spec.time_scale,
    }
}

/// `w` (the requests `picked` from `trace`, transformed) with their prompts' block ids,
/// each cut to the prompt's new length: kept where prompts were not scaled (a scaled
/// prompt's blocks are other tokens), dropped otherwise.
fn carry_prefix(
    trace: &Workload,
    w: Workload,
    picked: &[usize],
    spec: &SampleSpec,
) -> Result<Workload, SampleError> {
    let Some(p) = trace.prefix().filter(|_| spec.prefill_scale == 1.0) else {
        return Ok(w);
    };
    let ids = picked
        .iter()
        .zip(w.requests())
        .map(|(&k, r)| PrefixIds::truncated(&p.ids[k], r.input_tokens, p.block_tokens))
        .collect();
    Ok(w.with_prefix(PrefixIds {
        block_tokens: p.block_tokens,
        ids,
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn trace(n: u32) -> Workload {
        Workload::new(
            (1..=n)
                .map(|k| Request {
                    input_tokens: 10 * k,
                    output_tokens: k,
                    arrival_s: f64::from(k),
                })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn windows_are_consecutive_rows_after_the_skip() {
        let pick = |skip, n| {
            sample(
                &trace(5),
                &SampleSpec {
                    selection: Selection::Window(skip, n),
                    ..SampleSpec::default()
                },
            )
        };
        let ids =
            |w: Workload| -> Vec<u32> { w.requests().iter().map(|r| r.input_tokens).collect() };
        // The trace's prompts are 10, 20, 30, 40, 50.
        assert_eq!(ids(pick(1, 2).unwrap()), [20, 30]);
        assert_eq!(ids(pick(3, 2).unwrap()), [40, 50]);
        let e = pick(4, 2).unwrap_err().to_string();
        assert!(
            e.contains("asked for 2 requests after skipping 4; the trace has 5"),
            "{e}"
        );
        assert!(pick(usize::MAX, 2).is_err());
        assert!(pick(1, 0).is_err());
    }

    #[test]
    fn first_scale_trim_and_rebase() {
        let spec = SampleSpec {
            selection: Selection::First(3),
            prefill_scale: 0.5,
            decode_scale: 2.0,
            time_scale: 10.0,
            max_total_tokens: Some(14),
            rebase_time: true,
            ..SampleSpec::default()
        };
        let w = sample(&trace(5), &spec).unwrap();
        let got: Vec<(u32, u32, f64)> = w
            .requests()
            .iter()
            .map(|r| (r.input_tokens, r.output_tokens, r.arrival_s))
            .collect();
        // (5, 2) fits; (10, 4) is trimmed to (10, 4) = 14 fits; (15, 6) -> prompt cut to 8.
        assert_eq!(got, vec![(5, 2, 0.0), (10, 4, 10.0), (8, 6, 20.0)]);
        // Output alone over the cap.
        let spec = SampleSpec {
            selection: Selection::First(1),
            decode_scale: 100.0,
            max_total_tokens: Some(50),
            ..SampleSpec::default()
        };
        let r = sample(&trace(1), &spec).unwrap().requests()[0];
        assert_eq!((r.input_tokens, r.output_tokens), (1, 49));
    }

    #[test]
    fn bad_requests_count_is_an_error() {
        let e = sample(
            &trace(3),
            &SampleSpec {
                selection: Selection::First(4),
                ..SampleSpec::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("the trace has 3"), "{e}");
        let e = sample(
            &trace(3),
            &SampleSpec {
                time_scale: 0.0,
                ..SampleSpec::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("time-scale"), "{e}");
    }

    proptest! {
        #[test]
        fn random_sample_is_a_seeded_ordered_subset(n in 1usize..40, seed in any::<u64>()) {
            let t = trace(40);
            let spec = SampleSpec { selection: Selection::Random(n, seed), ..SampleSpec::default() };
            let w = sample(&t, &spec).unwrap();
            prop_assert_eq!(w.len(), n);
            prop_assert_eq!(&w, &sample(&t, &spec).unwrap());
            // Distinct rows of the trace, in trace order.
            let ks: Vec<u32> = w.requests().iter().map(|r| r.output_tokens).collect();
            prop_assert!(ks.windows(2).all(|p| p[0] < p[1]));
        }

        #[test]
        fn trimming_respects_the_cap(cap in 2u32..500, scale_i in 0.1f64..20.0, scale_o in 0.1f64..20.0) {
            let spec = SampleSpec { prefill_scale: scale_i, decode_scale: scale_o, max_total_tokens: Some(cap), ..SampleSpec::default() };
            let w = sample(&trace(20), &spec).unwrap();
            for r in w.requests() {
                prop_assert!(r.input_tokens >= 1 && r.output_tokens >= 1);
                prop_assert!(r.input_tokens + r.output_tokens <= cap);
            }
        }
    }
}
