//! `capacity`: the highest request rate at which a scheduler meets a set of SLOs on a trace
//! (docs/commands.md, "capacity").
//!
//! **Rate.** A trace of `n` requests whose arrivals span `D` seconds runs at `(n - 1) / D`
//! requests per second; at rate `r` its arrivals are compressed (or stretched) by the same
//! factor, the first at 0, so bursts and gaps keep their shape. With `--arrivals poisson`
//! the requests arrive instead as a Poisson process at the rate (seeded; the same draws
//! scaled at every rate), in the trace's order of arrival. Token counts are the trace's.
//!
//! **The rule.** At each probed rate the scheduler is simulated on every request and the
//! replay judged on the *measured* requests: all but the first `warmup` and the last
//! `cooldown` shares of them in arrival order (the queue starts empty and drains at the
//! end). The SLOs *hold* when every SLO's aggregate over the measured requests is within its
//! threshold (`core::slo`).
//!
//! **The search.** A rate that holds at `max_rate` is reported as at least that; one that
//! misses at `min_rate` as below it; otherwise a geometric bisection keeps a rate that holds
//! and one above it that misses until they are within `tolerance` of each other (at most
//! `max_probes` simulations), and reports both with the SLOs missed at the upper one (the
//! binding ones). It assumes that SLOs missed at a rate are missed at every higher one, as
//! queueing makes them for the policies here; the result says which rates were probed.

use thiserror::Error;

use crate::core::{Limits, Replay, Slo, SloReport, Workload, WorkloadError};
use crate::cost_model::LinearCostModel;
use crate::produce::{ProduceError, produce_cluster_on, produce_heuristic_pipelined};
use crate::schedulers::Router;
use crate::schedulers::{Knobs, SchedulerKind};

/// What is asked: the SLOs, the measured requests, the rates and the precision.
#[derive(Debug, Clone)]
pub struct CapacitySpec {
    /// The SLOs (at least one).
    pub slos: Vec<Slo>,
    /// Share of requests, first in arrival order, left out of the SLOs (in [0, 1)).
    pub warmup: f64,
    /// Share of requests, last in arrival order, left out likewise.
    pub cooldown: f64,
    /// Lowest rate probed (requests/s, > 0).
    pub min_rate: f64,
    /// Highest rate probed (requests/s, > `min_rate`).
    pub max_rate: f64,
    /// Relative precision: the bisection stops when `above / rate <= 1 + tolerance`.
    pub tolerance: f64,
    /// Most simulations per scheduler.
    pub max_probes: usize,
    /// How a probed rate sets the arrivals.
    pub arrivals: Arrivals,
}

/// How a probed rate sets the requests' arrival times (their token counts are the
/// trace's either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// The trace's own arrivals, compressed or stretched to the rate (bursts keep their
    /// shape).
    Trace,
    /// A Poisson process at the rate, drawn with this seed, given to the requests in their
    /// arrival order; the same draws scaled at every rate.
    Poisson {
        /// The seed (ChaCha8).
        seed: u64,
    },
}

impl std::str::FromStr for Arrivals {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}': expected trace, poisson or poisson:SEED");
        match s.split_once(':') {
            None if s == "trace" => Ok(Arrivals::Trace),
            None if s == "poisson" => Ok(Arrivals::Poisson { seed: 0 }),
            Some(("poisson", seed)) => seed
                .parse()
                .map(|seed| Arrivals::Poisson { seed })
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arrivals::Trace => f.write_str("trace"),
            Arrivals::Poisson { seed } => write!(f, "poisson:{seed}"),
        }
    }
}

/// Why a capacity search cannot run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// A setting out of its range.
    #[error("{0}")]
    Spec(String),
    /// The workload has no rate to scale.
    #[error(
        "the workload's {n} requests arrive at one instant ({at} s): capacity scales the trace's arrival rate, so it needs arrivals spread in time (e.g. workload sample of a trace, or workload generate --arrival poisson:QPS)"
    )]
    NoArrivalSpan {
        /// Requests.
        n: usize,
        /// Their common arrival.
        at: f64,
    },
    /// Scaled arrivals left the range of times.
    #[error("at {rate} requests/s: {source}")]
    Scaled {
        /// The rate.
        rate: f64,
        /// Why the workload was refused.
        source: WorkloadError,
    },
    /// A simulation failed.
    #[error("{0}")]
    Produce(#[from] ProduceError),
}

/// Where the SLOs stop holding.
#[derive(Debug, Clone, PartialEq)]
pub enum Capacity {
    /// They hold at `rate` and miss at `above` (within the tolerance, or the probes ran out).
    Found {
        /// Highest rate probed that holds.
        rate: f64,
        /// Lowest rate probed that misses.
        above: f64,
        /// The SLOs missed at `above`.
        binding: Vec<String>,
    },
    /// They hold at the highest rate probed.
    AtLeast {
        /// That rate.
        rate: f64,
    },
    /// They miss at the lowest rate probed.
    Below {
        /// That rate.
        rate: f64,
        /// The SLOs missed there, each with its value there (`ttft-max=0.5s (is 0.71 s)`).
        missed: Vec<String>,
    },
}

/// One scheduler's answer.
#[derive(Debug, Clone)]
pub struct CapacityResult {
    /// The scheduler.
    pub scheduler: SchedulerKind,
    /// Where its SLOs stop holding.
    pub capacity: Capacity,
    /// The SLO report at the highest rate that holds (None if none did).
    pub report: Option<SloReport>,
    /// Rates probed, in order, with whether the SLOs held.
    pub probes: Vec<(f64, bool)>,
}

impl CapacitySpec {
    fn check(&self) -> Result<(), CapacityError> {
        let bad = |m: String| Err(CapacityError::Spec(m));
        if self.slos.is_empty() {
            return bad("capacity needs at least one SLO (--slo)".into());
        }
        if !(0.0..1.0).contains(&self.warmup) || !(0.0..1.0).contains(&self.cooldown) {
            return bad(format!(
                "--warmup and --cooldown are shares of the requests in [0, 1), got {} and {}",
                self.warmup, self.cooldown
            ));
        }
        let rates_ok = self.min_rate > 0.0
            && self.min_rate.is_finite()
            && self.max_rate > self.min_rate
            && self.max_rate.is_finite();
        if !rates_ok {
            return bad(format!(
                "rates: expected 0 < --min-rate < --max-rate, finite, got {} and {}",
                self.min_rate, self.max_rate
            ));
        }
        if !(self.tolerance > 0.0 && self.tolerance.is_finite()) {
            return bad(format!("--tolerance: expected > 0, got {}", self.tolerance));
        }
        if self.max_probes < 2 {
            return bad("at least 2 probes (the lowest and the highest rate)".into());
        }
        Ok(())
    }
}

/// The trace's own rate: `(n - 1)` arrivals after the first over the span of arrivals.
pub fn trace_rate(w: &Workload) -> Result<f64, CapacityError> {
    let reqs = w.requests();
    let first = reqs
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let last = reqs.iter().map(|r| r.arrival_s).fold(0.0, f64::max);
    if reqs.len() < 2 || last <= first {
        return Err(CapacityError::NoArrivalSpan {
            n: reqs.len(),
            at: first,
        });
    }
    Ok((reqs.len() - 1) as f64 / (last - first))
}

/// `w` at `rate` requests/s: its arrivals scaled, the first at 0 ([`Arrivals::Trace`]), or
/// drawn from a Poisson process at the rate in their arrival order.
pub fn at_rate(w: &Workload, rate: f64, arrivals: Arrivals) -> Result<Workload, CapacityError> {
    if let Arrivals::Poisson { seed } = arrivals {
        let process = crate::workload::ArrivalProcess::Poisson(rate);
        return crate::workload::reassign_arrivals_in_order(w, process, seed)
            .map_err(|source| CapacityError::Scaled { rate, source });
    }
    let factor = trace_rate(w)? / rate;
    let first = w
        .requests()
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let requests = w
        .requests()
        .iter()
        .map(|r| crate::core::Request {
            arrival_s: (r.arrival_s - first) * factor,
            ..*r
        })
        .collect();
    Workload::new(requests).map_err(|source| CapacityError::Scaled { rate, source })
}

/// Which requests the SLOs are judged on: all but the first `warmup` and last `cooldown`
/// shares in arrival order (ties by index); at least one.
pub fn measured(w: &Workload, warmup: f64, cooldown: f64) -> Result<Vec<bool>, CapacityError> {
    let n = w.len();
    let mut order: Vec<usize> = (0..n).collect();
    let reqs = w.requests();
    order.sort_by(|&a, &b| {
        reqs[a]
            .arrival_s
            .total_cmp(&reqs[b].arrival_s)
            .then(a.cmp(&b))
    });
    let skip_first = (warmup * n as f64).floor() as usize;
    let skip_last = (cooldown * n as f64).floor() as usize;
    if skip_first + skip_last >= n {
        return Err(CapacityError::Spec(format!(
            "--warmup {warmup} and --cooldown {cooldown} leave none of the {n} requests to measure"
        )));
    }
    let mut mask = vec![false; n];
    for &i in &order[skip_first..n - skip_last] {
        mask[i] = true;
    }
    Ok(mask)
}

/// Replicas and their router (`simulate --replicas N --router R`); one replica is the
/// single-replica simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas, each running the scheduler.
    pub count: u32,
    /// How requests are spread over them.
    pub router: Router,
}

impl Replicas {
    /// One replica.
    pub const ONE: Replicas = Replicas {
        count: 1,
        router: Router::RoundRobin,
    };
}

/// The capacity of one scheduler on `replicas` (see the module's rule and search).
pub fn capacity(
    w: &Workload,
    cost: &LinearCostModel,
    scheduler: SchedulerKind,
    knobs: &Knobs,
    replicas: Replicas,
    spec: &CapacitySpec,
) -> Result<CapacityResult, CapacityError> {
    let none = crate::core::Pipeline::none();
    pipelined_capacity(w, (cost, &none), scheduler, knobs, replicas, spec)
}

/// [`capacity`] with every replica a pipeline of `pipeline.stages` stages (semantics.md,
/// "Pipeline parallelism").
pub fn pipelined_capacity(
    w: &Workload,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    scheduler: SchedulerKind,
    knobs: &Knobs,
    replicas: Replicas,
    spec: &CapacitySpec,
) -> Result<CapacityResult, CapacityError> {
    let found = bisect(w, spec, |at| {
        Ok(if replicas.count > 1 {
            let cluster = (replicas.count, replicas.router);
            produce_cluster_on(at, (cost, pipeline), scheduler, knobs, cluster)?
                .replay
                .merged
        } else {
            produce_heuristic_pipelined(at, cost, scheduler, knobs, pipeline)?.replay
        })
    })?;
    Ok(CapacityResult::of(scheduler, found))
}

/// The capacity of one scheduler on a disaggregated cluster: `split` prefill and decode
/// replicas behind `router`, KV moved over `link` (semantics.md, "Disaggregated prefill
/// and decode"), found as [`capacity`] finds a colocated one's.
#[allow(clippy::too_many_arguments)]
pub fn disaggregated_capacity(
    w: &Workload,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    scheduler: SchedulerKind,
    knobs: &Knobs,
    (split, router): (crate::core::disaggregated::Disaggregation, Router),
    link: &crate::core::disaggregated::KvLink,
    spec: &CapacitySpec,
) -> Result<CapacityResult, CapacityError> {
    let found = bisect(w, spec, |at| {
        let on = (cost, pipeline);
        let sides = (split, router);
        Ok(
            crate::produce::produce_disaggregated_on(at, on, scheduler, knobs, sides, link)?
                .replay
                .cluster
                .merged,
        )
    })?;
    Ok(CapacityResult::of(scheduler, found))
}

impl CapacityResult {
    /// `scheduler`'s answer: what the rate search found.
    fn of(scheduler: SchedulerKind, found: RateSearch) -> Self {
        Self {
            scheduler,
            capacity: found.capacity,
            report: found.report,
            probes: found.probes,
        }
    }
}

/// Requests the goodput search may simulate per probed rate of [`best_found_capacity`]
/// (a quarter of `compare`'s budget: a capacity search probes a dozen rates).
pub const BEST_FOUND_BUDGET: usize = 1_000_000;

/// The highest rate at which some schedule under `limits` meets the SLOs, as far as the
/// goodput search (`crate::goodput`, about `budget` requests simulated per rate) finds
/// one: at each probed rate the search's schedule (the most requests meeting every SLO
/// that it found) is replayed and judged as a scheduler's would be. A rate it finds is
/// sustained by that schedule, so the best possible capacity under these limits is at
/// least that high (and below the ceiling, `crate::ceiling`). The search reads the
/// requests' true output lengths: clairvoyant.
pub fn best_found_capacity(
    w: &Workload,
    cost: &LinearCostModel,
    limits: &Limits,
    spec: &CapacitySpec,
    budget: usize,
) -> Result<RateSearch, CapacityError> {
    bisect(w, spec, |at| {
        crate::goodput::search(at, limits, cost, &spec.slos, budget)
            .map(|found| found.replay)
            .ok_or_else(|| {
                CapacityError::Spec(format!(
                    "the goodput search found no schedule under {limits} (a request's whole KV, I + O - 1 tokens, must fit M)"
                ))
            })
    })
}

/// Where a rate search ended, with the probes that led there.
#[derive(Debug, Clone)]
pub struct RateSearch {
    /// Where the SLOs stop holding.
    pub capacity: Capacity,
    /// The SLO report at the highest rate that holds (None if none did).
    pub report: Option<SloReport>,
    /// Rates probed, in order, with whether the SLOs held.
    pub probes: Vec<(f64, bool)>,
}

/// The module's search with `replay_at` giving the replay of a schedule of the workload
/// at each probed rate.
fn bisect(
    w: &Workload,
    spec: &CapacitySpec,
    mut replay_at: impl FnMut(&Workload) -> Result<Replay, CapacityError>,
) -> Result<RateSearch, CapacityError> {
    spec.check()?;
    if spec.arrivals == Arrivals::Trace {
        trace_rate(w)?;
    }
    let mask = measured(w, spec.warmup, spec.cooldown)?;
    let mut probes = Vec::new();
    let mut probe = |rate: f64| -> Result<SloReport, CapacityError> {
        let replay = replay_at(&at_rate(w, rate, spec.arrivals)?)?;
        let report = SloReport::of_requests(&replay, &spec.slos, &mask);
        probes.push((rate, report.all_hold));
        Ok(report)
    };
    let missed = |r: &SloReport| -> Vec<String> {
        r.slos
            .iter()
            .filter(|s| !s.holds)
            .map(|s| s.slo.clone())
            .collect()
    };
    let top = probe(spec.max_rate)?;
    if top.all_hold {
        let capacity = Capacity::AtLeast {
            rate: spec.max_rate,
        };
        return Ok(RateSearch {
            capacity,
            report: Some(top),
            probes,
        });
    }
    let bottom = probe(spec.min_rate)?;
    if !bottom.all_hold {
        // At the lowest rate the requests run nearly alone: say what the SLOs measure there.
        let missed = bottom
            .slos
            .iter()
            .filter(|s| !s.holds)
            .map(|s| match s.value_s {
                Some(v) => format!("{} (is {v} s)", s.slo),
                None => s.slo.clone(),
            })
            .collect();
        let capacity = Capacity::Below {
            rate: spec.min_rate,
            missed,
        };
        return Ok(RateSearch {
            capacity,
            report: None,
            probes,
        });
    }
    let (mut lo, mut hi) = ((spec.min_rate, bottom), (spec.max_rate, top));
    let mut left = spec.max_probes - 2;
    while hi.0 / lo.0 > 1.0 + spec.tolerance && left > 0 {
        let mid = (lo.0 * hi.0).sqrt();
        let r = probe(mid)?;
        left -= 1;
        if r.all_hold {
            lo = (mid, r);
        } else {
            hi = (mid, r);
        }
    }
    let capacity = Capacity::Found {
        rate: lo.0,
        above: hi.0,
        binding: missed(&hi.1),
    };
    Ok(RateSearch {
        capacity,
        report: Some(lo.1),
        probes,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_front_keeps_what_no_configuration_beats_with_fewer_gpus() {
        let p = |series: &str, gpus, rate| CapacityPoint {
            series: series.into(),
            gpus,
            rate,
        };
        let points = [
            p("a", 1, 3.0),
            p("b", 1, 2.0),
            p("a", 2, 10.0),
            p("b", 2, 9.0),
            p("b", 4, 9.5),
            p("a", 4, 33.0),
        ];
        let front: Vec<(u32, f64)> = pareto_front(&points)
            .iter()
            .map(|q| (q.gpus, q.rate))
            .collect();
        assert_eq!(front, [(1, 3.0), (2, 10.0), (4, 33.0)]);
        // A configuration with more GPUs and no more rate is off the front.
        let points = [p("a", 1, 5.0), p("b", 2, 5.0), p("c", 4, 4.0)];
        assert_eq!(pareto_front(&points).len(), 1);
        let plot = capacity_plot(&points);
        assert!(plot.svg.finish().contains("Pareto front"));
    }

    use super::*;
    use crate::core::Request;

    fn trace(n: usize, gap_s: f64) -> Workload {
        Workload::new(
            (0..n)
                .map(|i| Request {
                    input_tokens: 512,
                    output_tokens: 32,
                    arrival_s: 5.0 + i as f64 * gap_s,
                })
                .collect(),
        )
        .unwrap()
    }

    fn spec(slos: &[&str]) -> CapacitySpec {
        CapacitySpec {
            slos: slos.iter().map(|s| s.parse().unwrap()).collect(),
            warmup: 0.1,
            cooldown: 0.1,
            min_rate: 0.01,
            max_rate: 10_000.0,
            tolerance: 0.01,
            max_probes: 60,
            arrivals: Arrivals::Trace,
        }
    }

    #[test]
    fn poisson_arrivals_are_the_same_draws_scaled_and_serve_a_trace_without_a_span() {
        let w = trace(50, 0.1);
        let poisson = Arrivals::Poisson { seed: 3 };
        let at = |rate| at_rate(&w, rate, poisson).unwrap();
        let (slow, fast) = (at(1.0), at(4.0));
        for (a, b) in slow.requests().iter().zip(fast.requests()) {
            assert!((a.arrival_s / 4.0 - b.arrival_s).abs() <= 1e-12 * a.arrival_s.max(1.0));
        }
        // About 4 per second: 49 gaps within a few standard deviations of 49 / 4 s.
        let span = fast.requests()[49].arrival_s - fast.requests()[0].arrival_s;
        assert!((6.0..20.0).contains(&span), "{span}");
        assert_ne!(
            at_rate(&w, 4.0, Arrivals::Poisson { seed: 4 }).unwrap(),
            fast
        );
        // A workload arriving at one instant has no rate of its own, but Poisson arrivals
        // give it any.
        let offline = Workload::new(vec![w.requests()[0]; 20]).unwrap();
        let s = CapacitySpec {
            arrivals: poisson,
            ..spec(&["ttft-p90=60ms"])
        };
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let knobs = Knobs::default();
        let found = capacity(
            &offline,
            &cost,
            SchedulerKind::VllmV1,
            &knobs,
            Replicas::ONE,
            &s,
        );
        let found = found.unwrap().capacity;
        assert!(matches!(found, Capacity::Found { .. }), "{found:?}");
        let trace_spec = spec(&["ttft-p90=60ms"]);
        let refused = capacity(
            &offline,
            &cost,
            SchedulerKind::VllmV1,
            &knobs,
            Replicas::ONE,
            &trace_spec,
        );
        assert!(matches!(refused, Err(CapacityError::NoArrivalSpan { .. })));
        assert_eq!("poisson:7".parse(), Ok(Arrivals::Poisson { seed: 7 }));
        assert_eq!("poisson".parse(), Ok(Arrivals::Poisson { seed: 0 }));
        assert_eq!("trace".parse(), Ok(Arrivals::Trace));
        assert!("poisson:x".parse::<Arrivals>().is_err() && "uniform".parse::<Arrivals>().is_err());
    }

    #[test]
    fn a_rate_the_goodput_search_finds_holds_when_replayed_and_stays_below_the_ceiling() {
        let w = trace(60, 0.05);
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let limits = Limits {
            token_budget: Some(2048),
            kv_capacity: Some(200_000),
            block_size: 16,
            ..Limits::unlimited()
        };
        let spec = spec(&["ttft-p90=200ms"]);
        let found = best_found_capacity(&w, &cost, &limits, &spec, 200_000).unwrap();
        let Capacity::Found { rate, above, .. } = found.capacity else {
            panic!("{:?}", found.capacity);
        };
        assert!(rate < above && found.report.unwrap().all_hold);
        // At the rate found the search's schedule, replayed on its own, meets the SLO over
        // the measured requests.
        let at = at_rate(&w, rate, Arrivals::Trace).unwrap();
        let mask = measured(&at, spec.warmup, spec.cooldown).unwrap();
        let schedule = crate::goodput::search(&at, &limits, &cost, &spec.slos, 200_000)
            .unwrap()
            .schedule;
        let replay = crate::core::replay(&at, &limits, &cost, &schedule).unwrap();
        assert!(SloReport::of_requests(&replay, &spec.slos, &mask).all_hold);
        let ceiling = crate::ceiling::ceiling(&w, &limits, &cost, 1, &spec)
            .unwrap()
            .unwrap();
        assert!(rate < ceiling, "{rate} vs the ceiling {ceiling}");
    }

    #[test]
    fn rates_scale_arrivals_from_zero_keeping_their_shape() {
        let w = trace(5, 0.5);
        assert!((trace_rate(&w).unwrap() - 2.0).abs() < 1e-12);
        let fast = at_rate(&w, 8.0, Arrivals::Trace).unwrap();
        let times: Vec<f64> = fast.requests().iter().map(|r| r.arrival_s).collect();
        assert_eq!(times, vec![0.0, 0.125, 0.25, 0.375, 0.5]);
        assert!((trace_rate(&fast).unwrap() - 8.0).abs() < 1e-9);
        let at_once = Workload::new(vec![w.requests()[0]; 3]).unwrap();
        let e = trace_rate(&at_once).unwrap_err().to_string();
        assert!(e.contains("arrive at one instant"), "{e}");
        // The warm-up and cool-down leave the middle requests.
        assert_eq!(
            measured(&trace(10, 1.0), 0.2, 0.1).unwrap(),
            [vec![false; 2], vec![true; 7], vec![false]].concat()
        );
        assert!(measured(&trace(3, 1.0), 0.7, 0.34).is_err());
        assert_eq!(
            measured(&trace(3, 1.0), 0.5, 0.5).unwrap(),
            vec![false, true, false]
        );
    }

    #[test]
    fn the_reported_rate_holds_and_the_rate_just_above_misses() {
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let w = trace(60, 0.1);
        let knobs = Knobs::default();
        let s = spec(&["ttft-p90=500ms", "tbt-p99=100ms"]);
        for kind in [SchedulerKind::VllmV1, SchedulerKind::Sarathi] {
            let r = capacity(&w, &cost, kind, &knobs, Replicas::ONE, &s).unwrap();
            let Capacity::Found {
                rate,
                above,
                binding,
            } = r.capacity.clone()
            else {
                panic!("{kind:?}: {:?}", r.capacity);
            };
            assert!(above / rate <= 1.0 + s.tolerance + 1e-12, "{rate} {above}");
            assert!(!binding.is_empty());
            // Checked from outside: simulate at the rate (holds) and 5% above (misses).
            let mask = measured(&w, s.warmup, s.cooldown).unwrap();
            let judge = |x: f64| {
                let o = crate::produce::produce_heuristic(
                    &at_rate(&w, x, Arrivals::Trace).unwrap(),
                    &cost,
                    kind,
                    &knobs,
                )
                .unwrap();
                SloReport::of_requests(&o.replay, &s.slos, &mask).all_hold
            };
            assert!(judge(rate), "{kind:?} at {rate}");
            assert!(!judge(rate * 1.05), "{kind:?} 5% above {rate}");
            assert!(r.probes.len() <= s.max_probes);
            assert!(r.report.unwrap().all_hold);
        }
    }

    #[test]
    fn out_of_range_answers_and_settings_say_so() {
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let w = trace(20, 0.1);
        let knobs = Knobs::default();
        let run =
            |s: &CapacitySpec| capacity(&w, &cost, SchedulerKind::VllmV1, &knobs, Replicas::ONE, s);
        // A TTFT no request can have, even alone: below the lowest rate.
        let r = run(&spec(&["ttft-max=1us"])).unwrap();
        let Capacity::Below { missed, .. } = &r.capacity else {
            panic!("{:?}", r.capacity);
        };
        // Alone, a 512-token prompt's first token takes milliseconds.
        let value: f64 = missed[0]
            .strip_prefix("ttft-max=0.000001s (is ")
            .and_then(|v| v.strip_suffix(" s)"))
            .unwrap()
            .parse()
            .unwrap();
        assert!(value > 1e-3 && value < 0.1, "{missed:?}");
        // A TTFT any rate meets: at least the highest rate, one probe.
        let r = run(&spec(&["ttft-max=1000s"])).unwrap();
        assert_eq!(r.capacity, Capacity::AtLeast { rate: 10_000.0 });
        assert_eq!(r.probes.len(), 1);
        let mut bad = spec(&["ttft-max=1s"]);
        bad.min_rate = 0.0;
        assert!(run(&bad).unwrap_err().to_string().contains("--min-rate"));
        let mut none = spec(&[]);
        none.slos.clear();
        assert!(
            run(&none)
                .unwrap_err()
                .to_string()
                .contains("at least one SLO")
        );
    }
}

/// One configuration on the capacity plot: its name, the GPUs it uses (replicas times the
/// cost model's tensor-parallel degree) and the highest rate it sustains.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityPoint {
    /// The line it belongs to (scheduler, cost model, knobs, router).
    pub series: String,
    /// GPUs.
    pub gpus: u32,
    /// Requests/s sustained.
    pub rate: f64,
}

/// The configurations on the Pareto front of GPUs against rate: those no other
/// configuration beats with as many GPUs or fewer (ties: the first listed), by GPUs.
pub fn pareto_front(points: &[CapacityPoint]) -> Vec<&CapacityPoint> {
    let mut sorted: Vec<&CapacityPoint> = points.iter().collect();
    sorted.sort_by(|a, b| a.gpus.cmp(&b.gpus).then(b.rate.total_cmp(&a.rate)));
    let mut front: Vec<&CapacityPoint> = Vec::new();
    for p in sorted {
        if front.last().is_none_or(|f| p.rate > f.rate) {
            front.push(p);
        }
    }
    front
}

/// The plot `capacity.svg`: each configuration's rate against its GPUs (a line per
/// scheduler and setting through its replica counts), the Pareto front marked.
pub fn capacity_plot(points: &[CapacityPoint]) -> crate::report::Plot {
    use crate::report::svg;
    let mut names: Vec<&str> = Vec::new();
    for p in points {
        if !names.contains(&p.series.as_str()) {
            names.push(&p.series);
        }
    }
    let line = |name: String, mut pts: Vec<(f64, f64)>| {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        svg::Series {
            name,
            points: pts,
            step: false,
            markers: true,
            unproven: Vec::new(),
            bars: Vec::new(),
            failed: Vec::new(),
            spread: Vec::new(),
        }
    };
    let mut series: Vec<svg::Series> = names
        .iter()
        .map(|n| {
            let pts = points
                .iter()
                .filter(|p| p.series == *n)
                .map(|p| (f64::from(p.gpus), p.rate))
                .collect();
            line(n.to_string(), pts)
        })
        .collect();
    let front = pareto_front(points)
        .iter()
        .map(|p| (f64::from(p.gpus), p.rate))
        .collect();
    series.push(line(
        "Pareto front (most requests/s for the GPUs)".into(),
        front,
    ));
    let mut s = svg::Svg::new(960, 420);
    svg::line_chart(
        &mut s,
        (0.0, 0.0, 960.0, 420.0),
        "highest rate meeting the SLOs against GPUs",
        "GPUs (replicas x tensor-parallel degree)",
        "requests/s",
        &series,
        &[],
        true,
    );
    crate::report::Plot {
        stem: "capacity".into(),
        caption: "each configuration's capacity against the GPUs it uses, the Pareto front marked"
            .into(),
        svg: s,
    }
}
