//! Service-level objectives (`semantics.md`, "Metrics"): `ttft-p90=2s`, `tbt-p99=200ms`,
//! `tpot-mean=50ms`, `e2e-max=30s`, and what a replay attains of them.
//!
//! Each SLO is read two ways:
//! * **per request**: the request's own value is at most the threshold (TTFT, TPOT and E2E
//!   its own; TBT its largest gap between consecutive tokens; a request with one output
//!   token has no TPOT or TBT and meets those). *Attainment* is the share of requests
//!   meeting every SLO; *goodput* is those requests (and their output tokens) per second of
//!   makespan, as `requests_per_s` counts all;
//! * **in aggregate**: the statistic (mean, a percentile, the max) of the metric over the
//!   requests (TBT: over all gaps, as `Summary::tbt_s`) is at most the threshold.
//!
//! Percentiles interpolate linearly between closest ranks, as every other in the summary.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use thiserror::Error;

use crate::quantile::quantile_sorted;
use crate::replay::{Replay, RequestRecord};

/// The latency an SLO is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time between consecutive tokens of a request.
    Tbt,
    /// Time per output token after the first.
    Tpot,
    /// End-to-end latency.
    E2e,
}

impl SloMetric {
    const ALL: [Self; 4] = [Self::Ttft, Self::Tbt, Self::Tpot, Self::E2e];

    /// Name in SLO strings and outputs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ttft => "ttft",
            Self::Tbt => "tbt",
            Self::Tpot => "tpot",
            Self::E2e => "e2e",
        }
    }

    /// One request's value (seconds); None where it has none (TPOT and TBT of a request
    /// with one output token).
    fn of_request(self, r: &RequestRecord) -> Option<f64> {
        match self {
            Self::Ttft => Some(r.ttft_s()),
            Self::E2e => Some(r.e2e_s()),
            Self::Tpot => r.tpot_s(),
            Self::Tbt => (r.output_tokens > 1).then_some(r.max_tbt_s),
        }
    }

    /// The values the aggregate statistic is taken over, of the requests `measured`.
    fn values(self, replay: &Replay, measured: &[bool]) -> Vec<f64> {
        match self {
            Self::Tbt => replay
                .tbt_gaps_s
                .iter()
                .zip(&replay.tbt_gap_requests)
                .filter(|(_, r)| measured[**r as usize])
                .map(|(g, _)| *g)
                .collect(),
            _ => replay
                .requests
                .iter()
                .zip(measured)
                .filter(|(_, m)| **m)
                .filter_map(|(r, _)| self.of_request(r))
                .collect(),
        }
    }
}

/// Which statistic of the metric's values the aggregate SLO bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SloStatistic {
    /// The mean.
    Mean,
    /// The largest value.
    Max,
    /// The given percentile, in (0, 100].
    Percentile(f64),
}

impl SloStatistic {
    fn of(self, mut values: Vec<f64>) -> Option<f64> {
        if values.is_empty() {
            return None;
        }
        Some(match self {
            Self::Mean => values.iter().sum::<f64>() / values.len() as f64,
            Self::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Self::Percentile(p) => {
                values.sort_by(f64::total_cmp);
                quantile_sorted(&values, p / 100.0)
            }
        })
    }
}

impl fmt::Display for SloStatistic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mean => f.write_str("mean"),
            Self::Max => f.write_str("max"),
            Self::Percentile(p) => write!(f, "p{p}"),
        }
    }
}

/// One SLO: a statistic of a latency metric at most a threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// The latency.
    pub metric: SloMetric,
    /// The statistic the aggregate reading bounds.
    pub statistic: SloStatistic,
    /// The threshold (seconds, > 0).
    pub threshold_s: f64,
}

impl Slo {
    /// Whether request `r`'s own value meets it (a request without a value, e.g. TBT of a
    /// one-token output, meets it).
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        self.metric
            .of_request(r)
            .is_none_or(|v| v <= self.threshold_s)
    }
}

/// Whether request `r` meets every SLO of `slos` on its own values (what attainment and
/// goodput count).
pub fn meets_every(r: &RequestRecord, slos: &[Slo]) -> bool {
    slos.iter().all(|s| s.met_by(r))
}

/// Why an SLO string was refused.
#[derive(Debug, Clone, PartialEq, Error)]
#[error(
    "SLO \"{text}\": {reason}; expected METRIC-STATISTIC=TIME, e.g. ttft-p90=2s, tbt-p99=200ms, tpot-mean=50ms (METRIC ttft, tbt, tpot or e2e; STATISTIC mean, max or pN with 0 < N <= 100; TIME a positive number with s, ms or us)"
)]
pub struct SloParseError {
    text: String,
    reason: String,
}

impl FromStr for Slo {
    type Err = SloParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| SloParseError {
            text: text.to_string(),
            reason,
        };
        let (name, time) = text.split_once('=').ok_or_else(|| fail("no '='".into()))?;
        let (metric, statistic) = name.split_once('-').ok_or_else(|| {
            fail(format!(
                "\"{name}\" has no '-' between metric and statistic"
            ))
        })?;
        let metric = SloMetric::ALL
            .into_iter()
            .find(|m| m.name() == metric)
            .ok_or_else(|| fail(format!("unknown metric \"{metric}\"")))?;
        let statistic = match statistic {
            "mean" => SloStatistic::Mean,
            "max" => SloStatistic::Max,
            p => {
                let n = p
                    .strip_prefix('p')
                    .and_then(|n| n.parse::<f64>().ok())
                    .ok_or_else(|| fail(format!("unknown statistic \"{p}\"")))?;
                if !(n > 0.0 && n <= 100.0) {
                    return Err(fail(format!("percentile {n} is outside (0, 100]")));
                }
                SloStatistic::Percentile(n)
            }
        };
        let threshold_s = parse_time(time).map_err(fail)?;
        Ok(Self {
            metric,
            statistic,
            threshold_s,
        })
    }
}

/// `2s`, `200ms`, `50us` in seconds (positive and finite).
fn parse_time(text: &str) -> Result<f64, String> {
    let (number, per_second) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1e6)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("time \"{text}\" has no unit (s, ms or us)"));
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v / per_second > 0.0 => Ok(v / per_second),
        _ => Err(format!("time \"{text}\" is not a positive number")),
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}={}s",
            self.metric.name(),
            self.statistic,
            self.threshold_s
        )
    }
}

/// One SLO's aggregate reading.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloResult {
    /// The SLO, as given (canonical form, threshold in seconds).
    pub slo: String,
    /// The statistic's value (seconds); None where the metric has no values.
    pub value_s: Option<f64>,
    /// Whether the value is at most the threshold (true where there is none).
    pub holds: bool,
    /// Share of requests whose own value meets the threshold.
    pub met_by: f64,
}

/// What a schedule attains of a set of SLOs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloReport {
    /// Share of requests meeting every SLO on their own values.
    pub attainment: f64,
    /// Requests meeting every SLO.
    pub good_requests: usize,
    /// Those requests per second of makespan; None if the makespan is 0.
    pub goodput_requests_per_s: Option<f64>,
    /// Their output tokens per second of makespan; None if the makespan is 0.
    pub goodput_tokens_per_s: Option<f64>,
    /// Whether every aggregate reading holds.
    pub all_hold: bool,
    /// Each SLO's aggregate reading.
    pub slos: Vec<SloResult>,
}

impl SloReport {
    /// Evaluates `slos` on a replay, every request measured.
    pub fn of(replay: &Replay, slos: &[Slo]) -> Self {
        Self::of_requests(replay, slos, &vec![true; replay.requests.len()])
    }

    /// Evaluates `slos` on the requests of a replay with `measured[i]` (the others, e.g. a
    /// warm-up, count nowhere: not in attainment, goodput or the aggregates).
    ///
    /// # Panics
    /// If `measured` is not one flag per request.
    pub fn of_requests(replay: &Replay, slos: &[Slo], measured: &[bool]) -> Self {
        assert_eq!(
            measured.len(),
            replay.requests.len(),
            "one flag per request"
        );
        let reqs: Vec<&RequestRecord> = replay
            .requests
            .iter()
            .zip(measured)
            .filter(|(_, m)| **m)
            .map(|(r, _)| r)
            .collect();
        let meets = |r: &RequestRecord, s: &Slo| s.met_by(r);
        let good: Vec<&RequestRecord> = reqs
            .iter()
            .copied()
            .filter(|r| meets_every(r, slos))
            .collect();
        let share = |k: usize| {
            if reqs.is_empty() {
                1.0
            } else {
                k as f64 / reqs.len() as f64
            }
        };
        let makespan = replay.makespan_s();
        let per_second = |x: f64| (makespan > 0.0).then(|| x / makespan);
        let results: Vec<SloResult> = slos
            .iter()
            .map(|s| {
                let value_s = s.statistic.of(s.metric.values(replay, measured));
                SloResult {
                    slo: s.to_string(),
                    value_s,
                    holds: value_s.is_none_or(|v| v <= s.threshold_s),
                    met_by: share(reqs.iter().filter(|r| meets(r, s)).count()),
                }
            })
            .collect();
        Self {
            attainment: share(good.len()),
            good_requests: good.len(),
            goodput_requests_per_s: per_second(good.len() as f64),
            goodput_tokens_per_s: per_second(good.iter().map(|r| f64::from(r.output_tokens)).sum()),
            all_hold: results.iter().all(|r| r.holds),
            slos: results,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Entry, Limits, Request, Schedule, Workload, replay};

    fn parse(s: &str) -> Slo {
        s.parse().unwrap()
    }

    #[test]
    fn slo_strings_parse_to_seconds_and_print_canonically() {
        let s = parse("ttft-p90=2s");
        assert_eq!(s.metric, SloMetric::Ttft);
        assert_eq!(s.statistic, SloStatistic::Percentile(90.0));
        assert_eq!(s.threshold_s, 2.0);
        assert_eq!(parse("tbt-p99.9=200ms").threshold_s, 0.2);
        assert_eq!(parse("tpot-mean=50us").threshold_s, 50e-6);
        assert_eq!(parse("e2e-max=1.5s").to_string(), "e2e-max=1.5s");
        assert_eq!(parse("tbt-p99=200ms").to_string(), "tbt-p99=0.2s");
    }

    #[test]
    fn bad_slo_strings_say_what_is_wrong_and_what_is_expected() {
        for (text, reason) in [
            ("ttft-p90", "no '='"),
            ("ttft=2s", "no '-'"),
            ("latency-p90=2s", "unknown metric \"latency\""),
            ("ttft-median=2s", "unknown statistic \"median\""),
            ("ttft-p0=2s", "outside (0, 100]"),
            ("ttft-p100.5=2s", "outside (0, 100]"),
            ("ttft-p90=2", "no unit"),
            ("ttft-p90=-2s", "not a positive number"),
            ("ttft-p90=0ms", "not a positive number"),
            ("ttft-p90=1e400s", "not a positive number"),
        ] {
            let e = text.parse::<Slo>().unwrap_err().to_string();
            assert!(e.contains(reason), "{text}: {e}");
            assert!(
                e.contains(text) && e.contains("expected METRIC-STATISTIC=TIME"),
                "{e}"
            );
        }
    }

    #[test]
    fn attainment_goodput_and_aggregates_follow_the_replay() {
        struct Cost;
        impl crate::CostModel for Cost {
            fn batch_time_s(&self, f: &crate::BatchFeatures) -> f64 {
                0.01 + 0.001 * f.tokens as f64
            }
        }
        // Request 0 (I 10, O 3) alone: TTFT 0.02, then two decodes of 0.011 s. Request 1
        // (I 5, O 1) waits: TTFT = E2E = 0.02 + 0.022 + 0.015 = 0.057 s.
        let w = Workload::new(vec![
            Request {
                input_tokens: 10,
                output_tokens: 3,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 5,
                output_tokens: 1,
                arrival_s: 0.0,
            },
        ])
        .unwrap();
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 10)]),
            Batch::new(vec![Entry::process(0, 1)]),
            Batch::new(vec![Entry::process(0, 1)]),
            Batch::new(vec![Entry::process(1, 5)]),
        ]);
        let r = replay(&w, &Limits::unlimited(), &Cost, &s).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        let report = SloReport::of(&r, &[parse("ttft-max=50ms"), parse("tbt-p50=12ms")]);
        // Request 1's TTFT (57 ms) misses; request 0's (20 ms) meets and its gaps (11 ms)
        // meet; request 1 has no gaps.
        assert_eq!(report.good_requests, 1);
        assert!(close(report.attainment, 0.5));
        let makespan = r.makespan_s();
        assert!(close(makespan, 0.057));
        assert!(close(
            report.goodput_requests_per_s.unwrap(),
            1.0 / makespan
        ));
        assert!(close(report.goodput_tokens_per_s.unwrap(), 3.0 / makespan));
        assert!(!report.slos[0].holds && close(report.slos[0].value_s.unwrap(), 0.057));
        assert!(close(report.slos[0].met_by, 0.5));
        assert!(report.slos[1].holds && close(report.slos[1].value_s.unwrap(), 0.011));
        assert!(close(report.slos[1].met_by, 1.0));
        assert!(!report.all_hold);
        // Looser: everyone meets everything.
        let loose = SloReport::of(&r, &[parse("ttft-mean=60ms"), parse("tpot-max=11.5ms")]);
        assert_eq!(loose.good_requests, 2);
        assert!(loose.all_hold);
        // A TPOT just under request 0's fails it alone (request 1 has no TPOT and meets it).
        let tight = SloReport::of(&r, &[parse("tpot-p50=10.9ms")]);
        assert_eq!(tight.good_requests, 1);
        assert!(!tight.slos[0].holds);
        // Measuring request 1 alone: its TTFT misses, it has no gaps, nothing of 0 counts.
        let one = SloReport::of_requests(
            &r,
            &[parse("ttft-max=50ms"), parse("tbt-max=1ms")],
            &[false, true],
        );
        assert_eq!(one.good_requests, 0);
        assert!(close(one.slos[0].value_s.unwrap(), 0.057));
        assert_eq!(one.slos[1].value_s, None);
        assert!(one.slos[1].holds && close(one.slos[1].met_by, 1.0));
        // Request 0 alone meets both: its TTFT 20 ms and its gaps are under tbt-max=12ms.
        let zero = SloReport::of_requests(
            &r,
            &[parse("ttft-max=50ms"), parse("tbt-max=12ms")],
            &[true, false],
        );
        assert!(zero.all_hold && close(zero.attainment, 1.0));
        assert!(close(zero.slos[1].value_s.unwrap(), 0.011));
    }
}
