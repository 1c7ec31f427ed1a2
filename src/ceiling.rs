//! The capacity ceiling: a request rate at which no schedule at all (any policy, the
//! optimum included) meets the SLOs, under the same limits, cost model and replicas.
//!
//! The certificate (per SLO on TTFT or E2E with a percentile or the maximum): the machine
//! relaxation bounds how many requests any schedule can have given their first (or last)
//! token by each time `t` (`solver::bounds::done_by_bounds`, on one machine as fast as the
//! replicas together). A request that arrived by `T` and is not done by `T + X` has its
//! latency above `X`; so for every arrival time `T_i`, at least `arrived(T_i) - done(T_i +
//! X)` requests miss `X`, of which at most the unmeasured ones are outside the measured
//! set. When that many measured requests miss, the percentile (linear interpolation, as
//! the SLO report computes it) is above `X` whatever the schedule. SLOs on TBT, TPOT or a
//! mean give no certificate here (they never prove a miss).
//!
//! With prompt block ids, the bounds run on the workload with each prompt shortened by
//! what another request's prompt could give it from a prefix cache
//! (`core::without_shared_prompts`), so they hold for schedulers with a cache as well.

use crate::capacity::{CapacityError, CapacitySpec, at_rate, measured};
use crate::core::{Limits, Slo, SloMetric, SloStatistic, Workload};
use crate::cost_model::LinearCostModel;

/// Whether `slo` is missed, over the requests `measured`, by every schedule of `w` on
/// `replicas` replicas under `limits` and `cost`.
pub fn missed_by_every_schedule(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    replicas: u32,
    slo: &Slo,
    measured: &[bool],
) -> bool {
    let Some(first_token) = deadline_on_first_token(slo) else {
        return false;
    };
    let m = measured.iter().filter(|x| **x).count();
    if m == 0 {
        return false;
    }
    // The measured values above the threshold that put the statistic above it.
    let need = match slo.statistic {
        SloStatistic::Mean => return false,
        SloStatistic::Max => 1,
        SloStatistic::Percentile(p) => m - ((p / 100.0) * (m - 1) as f64).floor() as usize,
    };
    let late = late_in_every_schedule(w, limits, cost, replicas, first_token, slo.threshold_s);
    late.saturating_sub(w.len() - m) >= need
}

/// Whether `slo` is a deadline on each request's first token (TTFT: true) or last token
/// (E2E: false); None for TBT and TPOT, which the machine relaxation cannot bound.
fn deadline_on_first_token(slo: &Slo) -> Option<bool> {
    match slo.metric {
        SloMetric::Ttft => Some(true),
        SloMetric::E2e => Some(false),
        SloMetric::Tbt | SloMetric::Tpot => None,
    }
}

/// How many requests of `w`, at least, have their first token (`first_token`) or their
/// last token more than `x` seconds after their arrival in every schedule on `replicas`
/// replicas: at every arrival time `T`, those arrived by `T` less the most any schedule
/// has done by `T + x` (the machine relaxation).
fn late_in_every_schedule(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    replicas: u32,
    first_token: bool,
    x: f64,
) -> usize {
    let machines = crate::solver::bounds::done_by_bounds(w, limits, cost, first_token, replicas);
    let mut arrivals: Vec<f64> = w.requests().iter().map(|r| r.arrival_s).collect();
    arrivals.sort_by(f64::total_cmp);
    // Completions at t count as done, with a margin for the relaxation's rounding (more
    // done: a weaker certificate).
    let done_by = |t: f64| {
        let t = t + 1e-9 * t.abs().max(1.0);
        machines
            .iter()
            .map(|c| c.partition_point(|&d| d <= t))
            .min()
            .unwrap_or(usize::MAX)
    };
    arrivals
        .iter()
        .enumerate()
        .map(|(k, &at)| {
            let arrived = arrivals[k..].partition_point(|&a| a <= at) + k;
            arrived.saturating_sub(done_by(at + x))
        })
        .max()
        .unwrap_or(0)
}

/// The most requests of `w` any schedule on `replicas` replicas under `limits` and `cost`
/// can have meet every SLO of `slos` on their own values (what the SLO report's
/// attainment counts): each SLO on TTFT or E2E misses at least
/// [`late_in_every_schedule`] of them; TBT and TPOT prove no miss here. The optimum's
/// goodput is at most this many requests.
pub fn most_requests_meeting(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    replicas: u32,
    slos: &[Slo],
) -> usize {
    let w = &crate::core::without_shared_prompts(w, limits.block_size);
    let late = slos
        .iter()
        .filter_map(|slo| {
            let first_token = deadline_on_first_token(slo)?;
            Some(late_in_every_schedule(
                w,
                limits,
                cost,
                replicas,
                first_token,
                slo.threshold_s,
            ))
        })
        .max()
        .unwrap_or(0);
    w.len().saturating_sub(late)
}

/// The lowest rate (a geometric bisection between `spec`'s rates, to its tolerance) at
/// which some SLO is missed by every schedule; None when none is proven even at the
/// highest rate. The search assumes a miss proven at a rate is proven above it, as
/// congestion makes it; the rate returned is certified itself.
pub fn ceiling(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    replicas: u32,
    spec: &CapacitySpec,
) -> Result<Option<f64>, CapacityError> {
    let w = &crate::core::without_shared_prompts(w, limits.block_size);
    let mask = measured(w, spec.warmup, spec.cooldown)?;
    let proven = |rate: f64| -> Result<bool, CapacityError> {
        let at = at_rate(w, rate)?;
        Ok(spec
            .slos
            .iter()
            .any(|s| missed_by_every_schedule(&at, limits, cost, replicas, s, &mask)))
    };
    if !proven(spec.max_rate)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (spec.min_rate, spec.max_rate);
    if proven(lo)? {
        return Ok(Some(lo));
    }
    for _ in 0..spec.max_probes {
        if hi / lo <= 1.0 + spec.tolerance {
            break;
        }
        let mid = (lo * hi).sqrt();
        if proven(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Request;

    fn slo(text: &str) -> Slo {
        text.parse().unwrap()
    }

    /// The first 200 requests of the bundled Splitwise code trace.
    fn splitwise_200() -> Workload {
        let trace = crate::workload::read_trace(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/notebooks-data/traces/splitwise_code.csv"
        )))
        .unwrap();
        Workload::new(trace.requests()[..200].to_vec()).unwrap()
    }

    #[test]
    fn a_burst_too_large_to_serve_in_time_is_certified_and_a_light_one_is_not() {
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let limits = Limits {
            token_budget: Some(4096),
            ..Limits::unlimited()
        };
        // 100 requests of 2,000 prompt tokens at once: the last first tokens come long
        // after 50 ms (each prompt alone takes longer than 50 ms / 100).
        let r = Request {
            input_tokens: 2000,
            output_tokens: 4,
            arrival_s: 0.0,
        };
        let w = Workload::new(vec![r; 100]).unwrap();
        let all = vec![true; 100];
        assert!(missed_by_every_schedule(
            &w,
            &limits,
            &cost,
            1,
            &slo("ttft-p50=50ms"),
            &all
        ));
        // ... but not a 1-hour TTFT, nor TPOT (no certificate for it).
        assert!(!missed_by_every_schedule(
            &w,
            &limits,
            &cost,
            1,
            &slo("ttft-p50=3600s"),
            &all
        ));
        assert!(!missed_by_every_schedule(
            &w,
            &limits,
            &cost,
            1,
            &slo("tpot-p50=1us"),
            &all
        ));
        // Many replicas serve it: one per request, each prompt alone within 50 ms.
        let alone = crate::solver::bounds::lower_bound(
            &Workload::new(vec![r]).unwrap(),
            &limits,
            &cost,
            crate::solver::Objective::MeanTtft,
        );
        assert!(alone.value_s < 0.05, "{alone:?}");
        assert!(!missed_by_every_schedule(
            &w,
            &limits,
            &cost,
            100,
            &slo("ttft-p50=50ms"),
            &all
        ));
        // Unmeasured requests may be the late ones: with all but one unmeasured, none.
        let mut one = vec![false; 100];
        one[0] = true;
        assert!(!missed_by_every_schedule(
            &w,
            &limits,
            &cost,
            1,
            &slo("ttft-max=50ms"),
            &one
        ));
    }

    #[test]
    fn no_schedule_simulated_meets_an_slo_the_certificate_says_is_missed() {
        // Heuristics never beat the certificate: where it says missed, each misses.
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let w = splitwise_200();
        let all = vec![true; w.len()];
        let knobs = crate::schedulers::Knobs::default();
        let mut certified = 0;
        for rate in [2.0, 8.0, 32.0, 128.0] {
            let at = at_rate(&w, rate).unwrap();
            for kind in [
                crate::schedulers::SchedulerKind::VllmV1,
                crate::schedulers::SchedulerKind::Sarathi,
            ] {
                let o = crate::produce::produce_heuristic(&at, &cost, kind, &knobs).unwrap();
                for text in ["ttft-p90=500ms", "e2e-p50=2s", "ttft-max=1s"] {
                    let s = slo(text);
                    if missed_by_every_schedule(&at, &o.limits, &cost, 1, &s, &all) {
                        certified += 1;
                        let report =
                            crate::core::SloReport::of(&o.replay, std::slice::from_ref(&s));
                        assert!(!report.all_hold, "{kind:?} at {rate}/s meets {text}");
                    }
                }
            }
        }
        assert!(
            certified >= 4,
            "only {certified} certificates: the test checks nothing"
        );
    }

    #[test]
    fn no_simulated_schedule_has_more_requests_meeting_the_slos_than_the_bound() {
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let w = splitwise_200();
        let knobs = crate::schedulers::Knobs::default();
        let slos = vec![
            slo("ttft-p90=300ms"),
            slo("e2e-max=3s"),
            slo("tbt-p99=50ms"),
        ];
        let mut below_all = 0;
        for rate in [2.0, 16.0, 128.0] {
            let at = at_rate(&w, rate).unwrap();
            for kind in crate::schedulers::SchedulerKind::ALL {
                let Ok(o) = crate::produce::produce_heuristic(&at, &cost, *kind, &knobs) else {
                    continue;
                };
                let most = most_requests_meeting(&at, &o.limits, &cost, 1, &slos);
                let good = crate::core::SloReport::of(&o.replay, &slos).good_requests;
                assert!(good <= most, "{kind:?} at {rate}/s: {good} > {most}");
                below_all += usize::from(most < at.len());
            }
        }
        assert!(
            below_all > 0,
            "the bound never proved a miss: the test checks nothing"
        );
    }

    #[test]
    fn the_bound_holds_for_vllm_v1_with_its_prefix_cache() {
        // 100 requests with the same 2,000-token prompt (ids in blocks of 512) at once:
        // with the cache, vllm-v1 computes the prompt once and the rest take 1,984 tokens
        // from it, so far more first tokens come early than a cache-free bound allows.
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let r = Request {
            input_tokens: 2000,
            output_tokens: 4,
            arrival_s: 0.0,
        };
        let w = Workload::new(vec![r; 100])
            .unwrap()
            .with_prefix(crate::core::PrefixIds {
                block_tokens: 512,
                ids: vec![vec![1, 2, 3, 4]; 100],
            })
            .unwrap();
        let knobs = crate::schedulers::Knobs::default();
        let kind = crate::schedulers::SchedulerKind::VllmV1;
        let o = crate::produce::produce_heuristic(&w, &cost, kind, &knobs).unwrap();
        assert!(o.summary.cached_tokens > 0);
        let slos = [slo("ttft-max=400ms")];
        let good = crate::core::SloReport::of(&o.replay, &slos).good_requests;
        let most = most_requests_meeting(&w, &o.limits, &cost, 1, &slos);
        assert!(good <= most, "{good} > {most}");
        // The bound of the same workload without its ids (every prompt computed whole)
        // is below what the cache achieves: without the shortened prompts it would be
        // wrong.
        let plain = Workload::new(vec![r; 100]).unwrap();
        let cache_free = most_requests_meeting(&plain, &o.limits, &cost, 1, &slos);
        assert!(
            cache_free < good,
            "{cache_free} >= {good}: the case tests nothing"
        );
    }

    #[test]
    fn a_burst_bounds_the_requests_meeting_a_first_token_deadline() {
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let r = Request {
            input_tokens: 2000,
            output_tokens: 4,
            arrival_s: 0.0,
        };
        let w = Workload::new(vec![r; 100]).unwrap();
        let limits = Limits::unlimited();
        let tight = most_requests_meeting(&w, &limits, &cost, 1, &[slo("ttft-max=50ms")]);
        assert!(tight < 100, "{tight}");
        // Four replicas serve more of them in time; TBT proves nothing.
        let four = most_requests_meeting(&w, &limits, &cost, 4, &[slo("ttft-max=50ms")]);
        assert!(four > tight, "{four} vs {tight}");
        assert_eq!(
            most_requests_meeting(&w, &limits, &cost, 1, &[slo("tbt-max=1us")]),
            100
        );
    }
}
