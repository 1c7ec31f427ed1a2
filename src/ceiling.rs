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
    let late = late_in_every_schedule(
        w,
        limits,
        cost,
        replicas,
        (first_token, slo.threshold_s),
        measured,
        need,
    );
    late >= need
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

/// How many requests of `w` with `measured[i]`, at least, have their first token
/// (`first_token`) or their last token more than `x` seconds after their arrival in every
/// schedule on `replicas` replicas: the larger of two counts on the machine relaxation.
/// At every arrival time `T`, those arrived by `T` less the most any schedule has done by
/// `T + x`, less the unmeasured ones; and [`late_by_windows`] on each machine's measured
/// jobs.
fn late_in_every_schedule(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    replicas: u32,
    (first_token, x): (bool, f64),
    measured: &[bool],
    enough: usize,
) -> usize {
    let unmeasured = measured.iter().filter(|m| !**m).count();
    let by_time =
        late_by_arrival_time(w, limits, cost, replicas, first_token, x).saturating_sub(unmeasured);
    if by_time >= enough {
        return by_time;
    }
    let mut late = by_time;
    for jobs in crate::solver::bounds::machine_jobs(w, limits, cost, first_token, replicas) {
        let mut jobs: Vec<(f64, f64)> = jobs
            .into_iter()
            .zip(measured)
            .filter(|(_, m)| **m)
            .map(|(j, _)| j)
            .collect();
        jobs.sort_by(|a, b| a.0.total_cmp(&b.0));
        late = late.max(late_by_windows(&jobs, x, enough));
        if late >= enough {
            break;
        }
    }
    late
}

/// The most window starts of [`late_by_windows`].
const WINDOW_STARTS: usize = 128;

/// The most memory the window starts' trees of [`late_by_windows`] take together (fewer
/// starts on very long traces: a smaller count, never a wrong one).
const WINDOW_MEMORY_BYTES: usize = 64 << 20;

/// At every arrival time `T`, the requests arrived by `T` less the most any schedule has
/// done by `T + x` (the machine relaxation's shortest-remaining-first counts): that many
/// requests are late by more than `x` in every schedule.
fn late_by_arrival_time(
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

/// The fewest jobs late in every preemptive schedule of one machine, for jobs `(release,
/// processing)` sorted by release, each due `x` after its release. The jobs of a window
/// `i..=j` (consecutive in that order) that are on time all run inside `[r_i, r_j + x]`,
/// so at most as many of them as their smallest processings fit in `r_j + x - r_i`; the
/// others are late. Windows sharing no job add up, so the most late over partitions into
/// consecutive windows is late in every schedule (a dynamic program over windows that
/// start at one of at most [`WINDOW_STARTS`] evenly spaced jobs (fewer where their trees
/// would pass [`WINDOW_MEMORY_BYTES`]), each start's smallest
/// processings kept in a Fenwick tree: `O(n WINDOW_STARTS log n)`; fewer windows give a
/// smaller count, never a wrong one). With the rounding margin a fit counts as a fit. It
/// stops once `enough` are late.
fn late_by_windows(jobs: &[(f64, f64)], x: f64, enough: usize) -> usize {
    let n = jobs.len();
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by(|&a, &b| jobs[a].1.total_cmp(&jobs[b].1).then(a.cmp(&b)));
    let mut rank = vec![0; n];
    for (r, &j) in by_size.iter().enumerate() {
        rank[j] = r;
    }
    // Each start keeps a tree of `n + 1` counts and sums: at most WINDOW_MEMORY_BYTES in all.
    let per_start = (n + 1) * (std::mem::size_of::<usize>() + std::mem::size_of::<f64>());
    let starts = WINDOW_STARTS.min(WINDOW_MEMORY_BYTES / per_start).max(1);
    let stride = n.div_ceil(starts).max(1);
    let mut starts: Vec<(usize, SmallestFit)> = Vec::new();
    // best[j]: the most late among the first j jobs.
    let mut best = vec![0usize; n + 1];
    for j in 0..n {
        if j % stride == 0 {
            starts.push((j, SmallestFit::new(n)));
        }
        best[j + 1] = best[j];
        let p = jobs[j].1.max(0.0);
        for (i, fits) in &mut starts {
            fits.insert(rank[j], p);
            let room = jobs[j].0 + x - jobs[*i].0;
            let room = room + 1e-9 * room.abs().max(1.0);
            let late = (j + 1 - *i) - fits.most_within(room);
            best[j + 1] = best[j + 1].max(best[*i] + late);
        }
        if best[j + 1] >= enough {
            return best[j + 1];
        }
    }
    best[n]
}

/// A multiset of processings by rank (a Fenwick tree of counts and sums): how many of the
/// smallest fit in a given room.
struct SmallestFit {
    count: Vec<usize>,
    sum: Vec<f64>,
}

impl SmallestFit {
    fn new(n: usize) -> Self {
        SmallestFit {
            count: vec![0; n + 1],
            sum: vec![0.0; n + 1],
        }
    }

    fn add(&mut self, rank: usize, value: f64) {
        let mut k = rank + 1;
        while k < self.count.len() {
            self.count[k] += 1;
            self.sum[k] += value;
            k += k & k.wrapping_neg();
        }
    }

    fn insert(&mut self, rank: usize, value: f64) {
        self.add(rank, value);
    }

    /// The most elements, smallest first, whose sum is at most `room`.
    fn most_within(&self, room: f64) -> usize {
        let n = self.count.len() - 1;
        let (mut pos, mut left, mut taken) = (0usize, room, 0usize);
        let mut step = n.next_power_of_two();
        while step > 0 {
            let next = pos + step;
            if next <= n && self.sum[next] <= left {
                pos = next;
                left -= self.sum[next];
                taken += self.count[next];
            }
            step /= 2;
        }
        taken
    }
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
    let all = vec![true; w.len()];
    let late = slos
        .iter()
        .filter_map(|slo| {
            let first_token = deadline_on_first_token(slo)?;
            Some(late_in_every_schedule(
                w,
                limits,
                cost,
                replicas,
                (first_token, slo.threshold_s),
                &all,
                usize::MAX,
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
        let at = at_rate(w, rate, spec.arrivals)?;
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

/// [`ceiling`] for replicas of `pipeline.stages` pipeline stages: the first stage's.
/// Every pipelined schedule's stage 0 is a schedule of one machine taking `1 / P` of each
/// batch's time ([`LinearCostModel::stage_of`]), each token out no later than on the
/// pipeline, so a rate no schedule of that machine sustains no pipelined one does.
pub fn ceiling_on(
    w: &Workload,
    limits: &Limits,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    replicas: u32,
    spec: &CapacitySpec,
) -> Result<Option<f64>, CapacityError> {
    ceiling(w, limits, &cost.stage_of(pipeline.stages), replicas, spec)
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
            let at = at_rate(&w, rate, crate::capacity::Arrivals::Trace).unwrap();
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
    fn no_pipelined_schedule_meets_an_slo_its_first_stage_certificate_says_is_missed() {
        // On two and four stages, the certificate of one machine at 1 / P of each batch's
        // time: where it says missed, every pipelined heuristic misses; it certifies some.
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let w = splitwise_200();
        let all = vec![true; w.len()];
        let knobs = crate::schedulers::Knobs::default();
        let mut certified = 0;
        for stages in [2, 4] {
            let pipeline = crate::core::Pipeline {
                stages,
                send_latency_s: 7.2e-6,
                send_s_per_token: 3.6e-8,
            };
            let stage = cost.stage_of(stages);
            for rate in [8.0, 32.0, 128.0, 512.0] {
                let at = at_rate(&w, rate, crate::capacity::Arrivals::Trace).unwrap();
                for kind in [
                    crate::schedulers::SchedulerKind::VllmV1,
                    crate::schedulers::SchedulerKind::Sarathi,
                ] {
                    let o = crate::produce::produce_heuristic_pipelined(
                        &at, &cost, kind, &knobs, &pipeline,
                    )
                    .unwrap();
                    for text in ["ttft-p90=200ms", "e2e-p50=1s", "ttft-max=500ms"] {
                        let s = slo(text);
                        if missed_by_every_schedule(&at, &o.limits, &stage, 1, &s, &all) {
                            certified += 1;
                            let report =
                                crate::core::SloReport::of(&o.replay, std::slice::from_ref(&s));
                            assert!(
                                !report.all_hold,
                                "{kind:?} x{stages} at {rate}/s meets {text}"
                            );
                        }
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
    fn a_pipeline_meets_what_one_machine_at_its_whole_time_cannot() {
        // 200 prompts of 512 tokens (one output token) at 400/s, C = 512: one stage
        // serves them in about 3 s, four in about 0.8 s with TTFT p90 near 0.3 s. The
        // certificate at the whole model's time per batch says TTFT p90 <= 500 ms is
        // missed; the pipeline meets it, and the first stage's certificate does not claim.
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let reqs = (0..200)
            .map(|i| crate::core::Request {
                input_tokens: 512,
                output_tokens: 1,
                arrival_s: f64::from(i) / 400.0,
            })
            .collect();
        let w = Workload::new(reqs).unwrap();
        let knobs = crate::schedulers::Knobs {
            token_budget: Some(512),
            ..crate::schedulers::Knobs::default()
        };
        let pipeline = crate::core::Pipeline {
            stages: 4,
            send_latency_s: 7.2e-6,
            send_s_per_token: 3.6e-8,
        };
        let kind = crate::schedulers::SchedulerKind::VllmV1;
        let o = crate::produce::produce_heuristic_pipelined(&w, &cost, kind, &knobs, &pipeline)
            .unwrap();
        let s = slo("ttft-p90=500ms");
        let report = crate::core::SloReport::of(&o.replay, std::slice::from_ref(&s));
        assert!(report.all_hold, "{report:?}");
        let all = vec![true; w.len()];
        assert!(missed_by_every_schedule(&w, &o.limits, &cost, 1, &s, &all));
        let stage = cost.stage_of(4);
        assert!(!missed_by_every_schedule(
            &w, &o.limits, &stage, 1, &s, &all
        ));
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
            let at = at_rate(&w, rate, crate::capacity::Arrivals::Trace).unwrap();
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

    /// The most jobs on time in a preemptive schedule, by trying every subset: with a
    /// common allowance `x`, earliest deadline first is first come first served, so a
    /// subset is on time iff served in release order each job ends by its deadline.
    fn most_on_time(jobs: &[(f64, f64)], x: f64) -> usize {
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by(|&a, &b| jobs[a].0.total_cmp(&jobs[b].0));
        (0u32..1 << jobs.len())
            .filter(|set| {
                let mut now = f64::NEG_INFINITY;
                order.iter().filter(|&&j| set >> j & 1 == 1).all(|&j| {
                    now = now.max(jobs[j].0) + jobs[j].1;
                    now <= jobs[j].0 + x + 1e-9
                })
            })
            .map(u32::count_ones)
            .max()
            .unwrap_or(0) as usize
    }

    #[test]
    fn late_windows_add_up_over_separate_bursts() {
        // Two bursts of three unit jobs, each due 2 after release: one late in each.
        let burst = |t: f64| [(t, 1.0), (t, 1.0), (t, 1.0)];
        let jobs: Vec<(f64, f64)> = burst(0.0).into_iter().chain(burst(100.0)).collect();
        assert_eq!(late_by_windows(&jobs, 2.0, usize::MAX), 2);
        assert_eq!(most_on_time(&jobs, 2.0), 4);
        // It stops once enough are late.
        assert_eq!(late_by_windows(&jobs, 2.0, 1), 1);
        // Due 3 after release, everything fits.
        assert_eq!(late_by_windows(&jobs, 3.0, usize::MAX), 0);
    }

    proptest::proptest! {
        #[test]
        fn late_windows_never_exceed_the_fewest_late_of_any_schedule(
            jobs in proptest::collection::vec((0u32..40, 1u32..20), 1..10),
            x in 1u32..40,
        ) {
            let mut jobs: Vec<(f64, f64)> =
                jobs.iter().map(|&(r, p)| (f64::from(r) / 4.0, f64::from(p) / 4.0)).collect();
            jobs.sort_by(|a, b| a.0.total_cmp(&b.0));
            let x = f64::from(x) / 4.0;
            let late = late_by_windows(&jobs, x, usize::MAX);
            proptest::prop_assert!(late <= jobs.len() - most_on_time(&jobs, x));
        }
    }
}
