//! Seeded synthetic workloads.
//!
//! Length distributions (written as on the command line):
//! `fixed:V`, `uniform:LO:HI`, `zipf:THETA:LO:HI` (value LO + k - 1 with
//! P(k) ~ 1/k^THETA over k = 1..=HI-LO+1), `normal:MEAN:STD:LO:HI` (rounded, clamped).
//! Arrivals: `static` (all at 0), `poisson:QPS`, `gamma:QPS:CV` (inter-arrival gaps with
//! mean 1/QPS and coefficient of variation CV). As in Vidur, the first request arrives
//! after the first gap. Every draw comes from one ChaCha8 stream seeded with the seed,
//! so the same spec and seed give the same workload on every machine.

use infersched_core::{Request, Workload};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma, Normal, Zipf};
use std::str::FromStr;
use thiserror::Error;

/// A malformed distribution or arrival spec.
#[derive(Debug, Error, PartialEq)]
#[error("invalid {what} \"{spec}\": {reason}")]
pub struct SpecError {
    /// `length distribution` or `arrival process`.
    pub what: &'static str,
    /// The spec as given.
    pub spec: String,
    /// What was expected.
    pub reason: String,
}

/// A distribution of token counts (all values >= 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    /// Always V.
    Fixed(u32),
    /// Uniform on LO..=HI.
    Uniform(u32, u32),
    /// Zipf with exponent THETA on LO..=HI, small values most likely.
    Zipf(f64, u32, u32),
    /// Normal(MEAN, STD) rounded and clamped to LO..=HI.
    Normal(f64, f64, u32, u32),
}

fn parts<'a>(
    what: &'static str,
    s: &'a str,
    n: usize,
    form: &str,
) -> Result<Vec<&'a str>, SpecError> {
    let p: Vec<&str> = s.split(':').collect();
    if p.len() != n {
        return Err(SpecError {
            what,
            spec: s.into(),
            reason: format!("expected {form}"),
        });
    }
    Ok(p)
}

fn num<T: FromStr>(what: &'static str, spec: &str, v: &str, name: &str) -> Result<T, SpecError> {
    v.parse().map_err(|_| SpecError {
        what,
        spec: spec.into(),
        reason: format!("{name} \"{v}\" is not a valid number"),
    })
}

impl FromStr for LengthDist {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        const W: &str = "length distribution";
        let err = |reason: String| SpecError {
            what: W,
            spec: s.into(),
            reason,
        };
        let kind = s.split(':').next().unwrap_or("");
        let range = |lo: u32, hi: u32| {
            if lo == 0 || hi < lo {
                Err(err(format!("need 1 <= LO <= HI, got LO = {lo}, HI = {hi}")))
            } else {
                Ok(())
            }
        };
        let d = match kind {
            "fixed" => {
                let p = parts(W, s, 2, "fixed:V")?;
                let v: u32 = num(W, s, p[1], "V")?;
                range(v, v)?;
                LengthDist::Fixed(v)
            }
            "uniform" => {
                let p = parts(W, s, 3, "uniform:LO:HI")?;
                let (lo, hi) = (num(W, s, p[1], "LO")?, num(W, s, p[2], "HI")?);
                range(lo, hi)?;
                LengthDist::Uniform(lo, hi)
            }
            "zipf" => {
                let p = parts(W, s, 4, "zipf:THETA:LO:HI")?;
                let theta: f64 = num(W, s, p[1], "THETA")?;
                let (lo, hi) = (num(W, s, p[2], "LO")?, num(W, s, p[3], "HI")?);
                range(lo, hi)?;
                if !(theta.is_finite() && theta > 0.0) {
                    return Err(err(format!("THETA must be > 0, got {theta}")));
                }
                LengthDist::Zipf(theta, lo, hi)
            }
            "normal" => {
                let p = parts(W, s, 5, "normal:MEAN:STD:LO:HI")?;
                let mean: f64 = num(W, s, p[1], "MEAN")?;
                let std: f64 = num(W, s, p[2], "STD")?;
                let (lo, hi) = (num(W, s, p[3], "LO")?, num(W, s, p[4], "HI")?);
                range(lo, hi)?;
                if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
                    return Err(err("MEAN must be finite and STD >= 0".into()));
                }
                LengthDist::Normal(mean, std, lo, hi)
            }
            _ => {
                return Err(err(
                    "expected fixed:V, uniform:LO:HI, zipf:THETA:LO:HI or normal:MEAN:STD:LO:HI"
                        .into(),
                ));
            }
        };
        Ok(d)
    }
}

impl LengthDist {
    /// Draws one length.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u32 {
        match *self {
            LengthDist::Fixed(v) => v,
            LengthDist::Uniform(lo, hi) => rng.random_range(lo..=hi),
            LengthDist::Zipf(theta, lo, hi) => {
                let n = f64::from(hi - lo) + 1.0;
                let k = Zipf::new(n, theta).expect("validated").sample(rng);
                lo + (k as u32).saturating_sub(1).min(hi - lo)
            }
            LengthDist::Normal(mean, std, lo, hi) => {
                let v = if std == 0.0 {
                    mean
                } else {
                    Normal::new(mean, std).expect("validated").sample(rng)
                };
                v.round().clamp(f64::from(lo), f64::from(hi)) as u32
            }
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArrivalProcess {
    /// All at t = 0 (offline).
    Static,
    /// Poisson process with this rate (requests per second).
    Poisson(f64),
    /// Gamma-distributed gaps with this rate and coefficient of variation.
    Gamma(f64, f64),
}

impl FromStr for ArrivalProcess {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        const W: &str = "arrival process";
        let positive = |v: f64, name: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(SpecError {
                    what: W,
                    spec: s.into(),
                    reason: format!("{name} must be > 0, got {v}"),
                })
            }
        };
        match s.split(':').next().unwrap_or("") {
            "static" => {
                parts(W, s, 1, "static")?;
                Ok(ArrivalProcess::Static)
            }
            "poisson" => {
                let p = parts(W, s, 2, "poisson:QPS")?;
                Ok(ArrivalProcess::Poisson(positive(
                    num(W, s, p[1], "QPS")?,
                    "QPS",
                )?))
            }
            "gamma" => {
                let p = parts(W, s, 3, "gamma:QPS:CV")?;
                Ok(ArrivalProcess::Gamma(
                    positive(num(W, s, p[1], "QPS")?, "QPS")?,
                    positive(num(W, s, p[2], "CV")?, "CV")?,
                ))
            }
            _ => Err(SpecError {
                what: W,
                spec: s.into(),
                reason: "expected static, poisson:QPS or gamma:QPS:CV".into(),
            }),
        }
    }
}

impl ArrivalProcess {
    /// `n` arrival times, nondecreasing.
    pub fn times(&self, n: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
        let mut t = 0.0;
        let mut gap: Box<dyn FnMut(&mut ChaCha8Rng) -> f64> = match *self {
            ArrivalProcess::Static => Box::new(|_| 0.0),
            ArrivalProcess::Poisson(qps) => {
                let d = Exp::new(qps).expect("validated");
                Box::new(move |r| d.sample(r))
            }
            ArrivalProcess::Gamma(qps, cv) => {
                let shape = 1.0 / (cv * cv);
                let d = Gamma::new(shape, 1.0 / (qps * shape)).expect("validated");
                Box::new(move |r| d.sample(r))
            }
        };
        (0..n)
            .map(|_| {
                t += gap(rng);
                t
            })
            .collect()
    }
}

/// A synthetic workload: n requests with these distributions, arrivals and seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthSpec {
    /// Number of requests (>= 1).
    pub requests: usize,
    /// Prompt lengths I.
    pub input: LengthDist,
    /// Output lengths O.
    pub output: LengthDist,
    /// Arrival process.
    pub arrival: ArrivalProcess,
    /// Seed of the random stream.
    pub seed: u64,
}

/// The most requests [`generate`] makes at once (about 1.6 GB while generating; a
/// simulation needs several times more).
pub const MAX_GENERATED_REQUESTS: usize = 50_000_000;

/// Generates the workload of `spec`. Lengths are drawn first (I then O per request),
/// then arrivals, all from one stream. More than [`MAX_GENERATED_REQUESTS`] is an error,
/// before anything is allocated.
pub fn generate(spec: &SynthSpec) -> Result<Workload, infersched_core::WorkloadError> {
    if spec.requests > MAX_GENERATED_REQUESTS {
        return Err(infersched_core::WorkloadError::TooManyToGenerate {
            requests: spec.requests,
            max: MAX_GENERATED_REQUESTS,
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let lengths: Vec<(u32, u32)> = (0..spec.requests)
        .map(|_| (spec.input.sample(&mut rng), spec.output.sample(&mut rng)))
        .collect();
    let times = spec.arrival.times(spec.requests, &mut rng);
    Workload::new(
        lengths
            .into_iter()
            .zip(times)
            .map(|((i, o), t)| Request {
                input_tokens: i,
                output_tokens: o,
                arrival_s: t,
            })
            .collect(),
    )
}

/// Replaces the arrival times of `workload` by draws of `arrival` with `seed`, in request
/// order; an error when the draws leave the valid range (a rate so low that arrivals pass
/// 1e10 s).
pub fn assign_arrivals(
    workload: &Workload,
    arrival: ArrivalProcess,
    seed: u64,
) -> Result<Workload, infersched_core::WorkloadError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let times = arrival.times(workload.len(), &mut rng);
    Workload::new(
        workload
            .requests()
            .iter()
            .zip(times)
            .map(|(r, t)| Request { arrival_s: t, ..*r })
            .collect(),
    )
}

/// Like [`assign_arrivals`], but the draws go to the requests in their current arrival
/// order (ties by index), so the order of arrival is kept: the `k`-th request to arrive
/// gets the `k`-th time.
pub fn reassign_arrivals_in_order(
    workload: &Workload,
    arrival: ArrivalProcess,
    seed: u64,
) -> Result<Workload, infersched_core::WorkloadError> {
    let reqs = workload.requests();
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| {
        reqs[a]
            .arrival_s
            .total_cmp(&reqs[b].arrival_s)
            .then(a.cmp(&b))
    });
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let times = arrival.times(reqs.len(), &mut rng);
    let mut requests = reqs.to_vec();
    for (&i, t) in order.iter().zip(times) {
        requests[i].arrival_s = t;
    }
    Workload::new(requests)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_huge_request_count_is_refused_before_allocating() {
        let spec = SynthSpec {
            requests: 1_000_000_000_000,
            input: "fixed:4".parse().unwrap(),
            output: "fixed:2".parse().unwrap(),
            arrival: ArrivalProcess::Static,
            seed: 0,
        };
        let e = generate(&spec).unwrap_err().to_string();
        assert!(
            e.contains("generating 1000000000000 requests") && e.contains("at most 50000000"),
            "{e}"
        );
    }

    #[test]
    fn specs_parse_and_reject() {
        assert_eq!("fixed:512".parse(), Ok(LengthDist::Fixed(512)));
        assert_eq!("uniform:1:8".parse(), Ok(LengthDist::Uniform(1, 8)));
        assert_eq!("zipf:1.2:1:100".parse(), Ok(LengthDist::Zipf(1.2, 1, 100)));
        assert!("fixed:0".parse::<LengthDist>().is_err());
        assert!("uniform:9:8".parse::<LengthDist>().is_err());
        let e = "normal:5:1".parse::<LengthDist>().unwrap_err();
        assert!(e.to_string().contains("normal:MEAN:STD:LO:HI"), "{e}");
        assert!("gauss:1".parse::<LengthDist>().is_err());
        assert_eq!("poisson:2.5".parse(), Ok(ArrivalProcess::Poisson(2.5)));
        assert_eq!("static".parse(), Ok(ArrivalProcess::Static));
        assert!("poisson:0".parse::<ArrivalProcess>().is_err());
        assert!("gamma:1".parse::<ArrivalProcess>().is_err());
    }

    #[test]
    fn poisson_and_gamma_have_the_requested_rate() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for a in [
            ArrivalProcess::Poisson(4.0),
            ArrivalProcess::Gamma(4.0, 2.0),
        ] {
            let t = a.times(20_000, &mut rng);
            let rate = t.len() as f64 / t[t.len() - 1];
            assert!((rate - 4.0).abs() < 0.25, "{a:?}: {rate}");
            assert!(t.windows(2).all(|w| w[0] <= w[1]));
        }
        // CV of gamma gaps is what was asked for.
        let t = ArrivalProcess::Gamma(1.0, 2.0).times(50_000, &mut rng);
        let gaps: Vec<f64> = std::iter::once(t[0])
            .chain(t.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 2.0).abs() < 0.15, "{}", sd / mean);
    }

    #[test]
    fn zipf_prefers_small_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let d = LengthDist::Zipf(1.5, 10, 1000);
        let v: Vec<u32> = (0..5000).map(|_| d.sample(&mut rng)).collect();
        let at_lo = v.iter().filter(|&&x| x == 10).count();
        assert!(at_lo > 1500, "{at_lo}");
        assert!(v.iter().all(|&x| (10..=1000).contains(&x)));
    }

    proptest! {
        #[test]
        fn same_seed_same_workload_within_bounds(seed in any::<u64>(), n in 1usize..50, lo in 1u32..100, span in 0u32..100) {
            let spec = SynthSpec {
                requests: n,
                input: LengthDist::Uniform(lo, lo + span),
                output: LengthDist::Normal(f64::from(lo), 10.0, lo, lo + span),
                arrival: ArrivalProcess::Poisson(3.0),
                seed,
            };
            let a = generate(&spec).unwrap();
            prop_assert_eq!(&a, &generate(&spec).unwrap());
            for r in a.requests() {
                prop_assert!((lo..=lo + span).contains(&r.input_tokens));
                prop_assert!((lo..=lo + span).contains(&r.output_tokens));
            }
        }
    }

    #[test]
    fn reassigned_arrivals_keep_the_order_of_arrival() {
        let r = |t: f64| Request {
            input_tokens: 4,
            output_tokens: 2,
            arrival_s: t,
        };
        // Requests listed out of arrival order, two at the same instant.
        let w = Workload::new(vec![r(5.0), r(1.0), r(3.0), r(1.0)]).unwrap();
        let p = ArrivalProcess::Poisson(2.0);
        let new = reassign_arrivals_in_order(&w, p, 7).unwrap();
        let times = p.times(4, &mut ChaCha8Rng::seed_from_u64(7));
        let got: Vec<f64> = new.requests().iter().map(|q| q.arrival_s).collect();
        // Arrival order: 1 (t = 1, first index), 3 (t = 1), 2 (t = 3), 0 (t = 5).
        assert_eq!(got, vec![times[3], times[0], times[2], times[1]]);
        assert!(
            new.requests()
                .iter()
                .zip(w.requests())
                .all(|(a, b)| a.input_tokens == b.input_tokens)
        );
    }
}
