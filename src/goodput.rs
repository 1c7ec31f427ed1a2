//! The most requests meeting their SLOs that a schedule found reaches (issue 45): the
//! lower end of the interval whose upper end is [`crate::ceiling::most_requests_meeting`]
//! (no schedule at all has more).
//!
//! A goodput schedule gives up on requests it cannot serve in time and serves the others
//! by their deadlines. The search runs priority-list schedules (the solver's
//! [`PriorityList`]: requests in a fixed order, each admitted with its whole KV reserved,
//! so nothing is evicted) with the requests ordered by their deadline (arrival plus the
//! tightest TTFT or E2E threshold; earliest deadline first), under a few prompt-chunk caps;
//! then, from the best, it moves the requests that missed an SLO behind every request that
//! met them (a request that misses anyway should not take the GPU from one that can make
//! it), as long as that raises the count, and tries each missed request alone behind the
//! others. Every try is simulated and replayed under the limits, and counted by the
//! replay's SLO report: the count is the replay's, never the search's own. Deterministic
//! (a budget of simulated requests, no clock).

use crate::core::{
    Batch, Entry, Limits, Replay, Schedule, Slo, SloMetric, SloReport, Workload, meets_every,
    replay,
};
use crate::cost_model::LinearCostModel;
use crate::schedulers::simulate;
use crate::solver::list_search::PriorityList;
use serde::Serialize;

/// The best schedule the search found and how many requests meet every SLO in it.
#[derive(Debug, Clone)]
pub struct GoodputFound {
    /// Requests meeting every SLO on their own values (the replay's count).
    pub meeting: usize,
    /// The schedule.
    pub schedule: Schedule,
    /// Its replay.
    pub replay: Replay,
    /// Its replay's SLO report.
    pub report: SloReport,
    /// What produced it (the order and caps, in words).
    pub method: String,
    /// Schedules simulated and replayed.
    pub tries: usize,
}

/// How the requests are put in order and batched: one try of the search.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    /// The requests served first, in priority order.
    order: Vec<u32>,
    /// The requests held back: served, by deadline, only once all the others are done.
    held: Vec<u32>,
    chunk_cap: u64,
}

struct Search<'a> {
    w: &'a Workload,
    limits: &'a Limits,
    cost: &'a LinearCostModel,
    slos: &'a [Slo],
    deadline: Vec<f64>,
    /// How far back Moore and Hodgson's check looks ([`window`]).
    window_s: f64,
    tries: usize,
    /// Requests simulated so far, and the most the search may simulate.
    work: usize,
    budget: usize,
    best: Option<GoodputFound>,
}

/// How far back before a request's arrival Moore and Hodgson's check simulates: four
/// times the largest SLO threshold, at least 1 s (a request taken earlier than that either
/// met its TTFT or E2E deadline long before, or is decoding under a TBT or TPOT bound).
fn window(slos: &[Slo]) -> f64 {
    slos.iter().map(|s| 4.0 * s.threshold_s).fold(1.0, f64::max)
}

/// Each request's deadline for ordering: its arrival plus the tightest threshold of the
/// SLOs on TTFT or E2E (its arrival alone where there is none).
fn deadlines(w: &Workload, slos: &[Slo]) -> Vec<f64> {
    let tightest = slos
        .iter()
        .filter(|s| matches!(s.metric, SloMetric::Ttft | SloMetric::E2e))
        .map(|s| s.threshold_s)
        .fold(f64::INFINITY, f64::min);
    let slack = if tightest.is_finite() { tightest } else { 0.0 };
    w.requests().iter().map(|r| r.arrival_s + slack).collect()
}

impl Search<'_> {
    /// The requests `ids` alone (a workload of their own, request `k` being `ids[k]`) and
    /// their list schedule in the priority order `ids` gives; None if it cannot serve them.
    fn simulate_part(&self, ids: &[u32], chunk_cap: u64) -> Option<(Workload, Schedule)> {
        let part =
            Workload::new(ids.iter().map(|&i| self.w.requests()[i as usize]).collect()).ok()?;
        let local: Vec<u32> = (0..ids.len() as u32).collect();
        let limits = Limits {
            watermark: 0.0,
            ..*self.limits
        };
        let max_running = limits.max_running.unwrap_or(ids.len() as u64).max(1);
        let mut policy = PriorityList::new(&local, chunk_cap, chunk_cap, max_running);
        let sim = simulate(&part, &limits, &mut policy, self.cost).ok()?;
        Some((part, sim.schedule))
    }

    /// The list schedule of `ids` (requests of the workload) in the priority order
    /// `ids` gives, with the workload's ids; None if it cannot serve them.
    fn list_schedule(&self, ids: &[u32], chunk_cap: u64) -> Option<Schedule> {
        if ids.is_empty() {
            return Some(Schedule::new(Vec::new()));
        }
        let (_, local) = self.simulate_part(ids, chunk_cap)?;
        let batches = local.batches.iter().map(|b| {
            Batch::new(
                b.entries
                    .iter()
                    .map(|e| Entry {
                        request: ids[e.request as usize],
                        ..*e
                    })
                    .collect(),
            )
        });
        Some(Schedule::new(batches.collect()))
    }

    /// Whether every request of `ids` meets every SLO when they are served alone in the
    /// priority order `ids` gives (None: not servable so).
    fn part_meets(&mut self, ids: &[u32], chunk_cap: u64) -> Option<bool> {
        self.tries += 1;
        self.work += ids.len();
        let (part, schedule) = self.simulate_part(ids, chunk_cap)?;
        let r = replay(&part, self.limits, self.cost, &schedule).ok()?;
        Some(r.requests.iter().all(|q| meets_every(q, self.slos)))
    }

    /// Moore and Hodgson's rule for the most jobs on time (exact on one machine without
    /// release dates): take the requests by deadline; whenever the one taken makes some
    /// taken request miss, hold back the taken request with the most tokens. The check
    /// simulates the requests taken that arrived within [`window`] of the new one (an
    /// approximation: earlier ones may still hold the GPU; the whole plan is then replayed
    /// and improved on its real count), so it costs the window's requests, not all.
    fn moore_hodgson(&mut self, by_deadline: &[u32], chunk_cap: u64) -> Plan {
        let tokens = |i: u32| {
            let r = self.w.requests()[i as usize];
            u64::from(r.input_tokens) + u64::from(r.output_tokens)
        };
        let (mut order, mut held) = (Vec::new(), Vec::new());
        for (k, &i) in by_deadline.iter().enumerate() {
            if self.exhausted() {
                // Out of budget: the requests not reached are served after those taken
                // (by deadline) or held back with the rest, whichever meets more.
                let tail = &by_deadline[k..];
                let served = self.with_tail(&order, &held, tail, chunk_cap, false);
                let deferred = self.with_tail(&order, &held, tail, chunk_cap, true);
                let count =
                    |m: Option<Vec<bool>>| m.map_or(0, |m| m.iter().filter(|x| **x).count());
                let (a, b) = (self.evaluate(&served), self.evaluate(&deferred));
                return if count(a) > count(b) {
                    served
                } else {
                    deferred
                };
            }
            order.push(i);
            // Only the requests taken that arrived within the window before this one
            // are simulated for the check (the final count is the whole replay's).
            let since = self.w.requests()[i as usize].arrival_s - self.window_s;
            let part: Vec<u32> = order
                .iter()
                .copied()
                .filter(|&j| self.w.requests()[j as usize].arrival_s >= since)
                .collect();
            if self.part_meets(&part, chunk_cap) != Some(true) {
                let most = part
                    .iter()
                    .copied()
                    .max_by_key(|&j| (tokens(j), std::cmp::Reverse(j)))
                    .expect("one taken");
                order.retain(|&j| j != most);
                held.push(most);
            }
        }
        self.with_tail(&order, &held, &[], chunk_cap, true)
    }

    /// The plan serving `order` (then `tail`, unless `hold_tail`) first and holding back
    /// `held` (and `tail`, with `hold_tail`), the held-back requests by deadline.
    fn with_tail(
        &self,
        order: &[u32],
        held: &[u32],
        tail: &[u32],
        chunk_cap: u64,
        hold_tail: bool,
    ) -> Plan {
        let (mut order, mut held) = (order.to_vec(), held.to_vec());
        if hold_tail {
            held.extend_from_slice(tail);
        } else {
            order.extend_from_slice(tail);
        }
        self.by_deadline(&mut held);
        Plan {
            order,
            held,
            chunk_cap,
        }
    }

    /// Sorts `ids` by deadline (then id).
    fn by_deadline(&self, ids: &mut [u32]) {
        ids.sort_by(|&a, &b| {
            (self.deadline[a as usize], a)
                .partial_cmp(&(self.deadline[b as usize], b))
                .expect("finite deadlines")
        });
    }

    /// Simulates and replays `plan` (its first part, then the held-back requests); which
    /// requests meet every SLO (None: not a valid schedule under the limits). Keeps it if
    /// it is the best so far.
    fn evaluate(&mut self, plan: &Plan) -> Option<Vec<bool>> {
        self.tries += 1;
        self.work += self.w.len();
        let mut schedule = self.list_schedule(&plan.order, plan.chunk_cap)?;
        let rest = self.list_schedule(&plan.held, plan.chunk_cap)?;
        schedule.batches.extend(rest.batches);
        let r = replay(self.w, self.limits, self.cost, &schedule).ok()?;
        // What the SLO report's attainment counts (`SloReport::good_requests`).
        let met: Vec<bool> = r
            .requests
            .iter()
            .map(|q| meets_every(q, self.slos))
            .collect();
        let meeting = met.iter().filter(|m| **m).count();
        if self.best.as_ref().is_none_or(|b| meeting > b.meeting) {
            let method = format!(
                "priority list: earliest deadline first{}, prompt chunks of at most {} tokens",
                match plan.held.len() {
                    0 => String::new(),
                    1 => ", 1 request held back until the others are done".into(),
                    k => format!(", {k} requests held back until the others are done"),
                },
                plan.chunk_cap
            );
            self.best = Some(GoodputFound {
                meeting,
                schedule,
                report: SloReport::of(&r, self.slos),
                replay: r,
                method,
                tries: 0,
            });
        }
        Some(met)
    }

    fn exhausted(&self) -> bool {
        self.work >= self.budget
    }

    /// From `plan`, holds back requests that missed while that raises the count: first all
    /// of them at once, then each alone; then takes held-back requests back one at a time
    /// where that raises it (first improvement, until nothing gains or the budget is spent).
    fn improve(&mut self, plan: Plan) {
        let Some(met) = self.evaluate(&plan) else {
            return;
        };
        let mut current = (plan, met);
        while !self.exhausted() {
            let next = self
                .hold_all_missed(&current)
                .or_else(|| self.hold_one_missed(&current))
                .or_else(|| self.take_one_back(&current));
            match next {
                Some(better) => current = better,
                None => return,
            }
        }
    }

    /// `plan` with every first-part request that missed held back, if more meet then.
    fn hold_all_missed(&mut self, (plan, met): &(Plan, Vec<bool>)) -> Option<(Plan, Vec<bool>)> {
        let (order, late): (Vec<u32>, Vec<u32>) =
            plan.order.iter().partition(|&&i| met[i as usize]);
        if late.is_empty() || order.is_empty() {
            return None;
        }
        let mut held = plan.held.clone();
        held.extend(late);
        self.try_better(plan, order, held, met)
    }

    /// `plan` with the first first-part request that missed whose holding back makes
    /// more requests meet, held back.
    fn hold_one_missed(&mut self, (plan, met): &(Plan, Vec<bool>)) -> Option<(Plan, Vec<bool>)> {
        for &i in plan.order.iter().filter(|&&i| !met[i as usize]) {
            if self.exhausted() {
                return None;
            }
            let order: Vec<u32> = plan.order.iter().copied().filter(|&j| j != i).collect();
            let mut held = plan.held.clone();
            held.push(i);
            if let Some(better) = self.try_better(plan, order, held, met) {
                return Some(better);
            }
        }
        None
    }

    /// `plan` with the first held-back request whose return to the first part (in its
    /// deadline's place) makes more requests meet, returned.
    fn take_one_back(&mut self, (plan, met): &(Plan, Vec<bool>)) -> Option<(Plan, Vec<bool>)> {
        for &i in &plan.held {
            if self.exhausted() {
                return None;
            }
            let held: Vec<u32> = plan.held.iter().copied().filter(|&j| j != i).collect();
            let mut order = plan.order.clone();
            let place = order.partition_point(|&j| {
                (self.deadline[j as usize], j) < (self.deadline[i as usize], i)
            });
            order.insert(place, i);
            if let Some(better) = self.try_better(plan, order, held, met) {
                return Some(better);
            }
        }
        None
    }

    /// `plan` with `order` and `held`, if more requests meet than in `met`.
    fn try_better(
        &mut self,
        plan: &Plan,
        order: Vec<u32>,
        mut held: Vec<u32>,
        met: &[bool],
    ) -> Option<(Plan, Vec<bool>)> {
        self.by_deadline(&mut held);
        let next = Plan {
            order,
            held,
            chunk_cap: plan.chunk_cap,
        };
        let now = self.evaluate(&next)?;
        let count = |m: &[bool]| m.iter().filter(|x| **x).count();
        (count(&now) > count(met)).then_some((next, now))
    }
}

/// Prompt-chunk caps tried: the most prompt tokens a batch can take (C, P, the longest
/// prompt), then 2,048, 1,024, 512 and 256 tokens where smaller (short chunks let decodes
/// and short prompts through sooner).
pub fn chunk_caps(w: &Workload, limits: &Limits) -> Vec<u64> {
    let budget = crate::solver::list_search::largest_chunk(w, limits);
    let mut caps = vec![budget];
    caps.extend([2048, 1024, 512, 256].into_iter().filter(|&c| c < budget));
    caps
}

/// The best goodput schedule the search finds for `w` under `limits`, simulating about
/// `budget` requests in all (a try of the whole workload simulates `n`); None when no try
/// gives a valid schedule (e.g. a request whose whole KV does not fit M, which the list
/// schedules reserve).
///
/// Every chunk cap's deadline order is tried; from the cap that did best, Moore and
/// Hodgson's rule chooses the requests to hold back (requests it has not reached when the
/// budget runs out are held back too), and the moves of [`Search::improve`] go on from
/// there.
pub fn search(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    slos: &[Slo],
    budget: usize,
) -> Option<GoodputFound> {
    let deadline = deadlines(w, slos);
    let mut order: Vec<u32> = (0..w.len() as u32).collect();
    order.sort_by(|&a, &b| {
        deadline[a as usize]
            .total_cmp(&deadline[b as usize])
            .then(a.cmp(&b))
    });
    let mut s = Search {
        w,
        limits,
        cost,
        slos,
        deadline,
        window_s: window(slos),
        tries: 0,
        work: 0,
        budget,
        best: None,
    };
    let mut best_cap = None;
    for chunk_cap in chunk_caps(w, limits) {
        let plan = Plan {
            order: order.clone(),
            held: Vec::new(),
            chunk_cap,
        };
        let Some(met) = s.evaluate(&plan) else {
            continue;
        };
        let meeting = met.iter().filter(|m| **m).count();
        if best_cap.is_none_or(|(m, _)| meeting > m) {
            best_cap = Some((meeting, chunk_cap));
        }
    }
    let (_, chunk_cap) = best_cap?;
    let plan = s.moore_hodgson(&order, chunk_cap);
    s.improve(plan);
    let tries = s.tries;
    s.best.map(|found| GoodputFound { tries, ..found })
}

/// `solve --objective goodput`: the best schedule the search finds and the bound no
/// schedule passes, with the certified gap between them.
#[derive(Debug, Clone, Serialize)]
pub struct GoodputSolve {
    /// Always `goodput`: the most requests meeting every SLO on their own values.
    pub objective: &'static str,
    /// The SLOs, as given (canonical form).
    pub slos: Vec<String>,
    /// Requests in the workload.
    pub requests: usize,
    /// `optimal` where the schedule meets the bound, else `not-proven`.
    pub status: &'static str,
    /// What produced the schedule.
    pub method: String,
    /// Whether the method read the requests' true output lengths (it does: clairvoyant).
    pub clairvoyant: bool,
    /// Requests meeting every SLO in the schedule (the replay's count).
    pub meeting: usize,
    /// No schedule at all has more requests meeting every SLO
    /// ([`crate::ceiling::most_requests_meeting`]).
    pub bound: usize,
    /// How the bound is proven.
    pub bound_method: &'static str,
    /// `(bound - meeting) / bound` (0 where the bound is 0): at most this share of the
    /// best possible count is missing from the schedule's.
    pub certified_gap: f64,
    /// Schedules simulated and replayed by the search.
    pub tries: usize,
}

impl GoodputSolve {
    /// The certificate for a schedule `found` in which `meeting` requests meet every SLO of
    /// `slos` on `w` (the replay's count), against `bound`, the most any schedule can have
    /// ([`crate::ceiling::most_requests_meeting`] under the same limits and cost model).
    pub fn of(
        w: &Workload,
        slos: &[Slo],
        found: &GoodputFound,
        meeting: usize,
        bound: usize,
    ) -> Self {
        let certified_gap = if bound == 0 {
            0.0
        } else {
            bound.saturating_sub(meeting) as f64 / bound as f64
        };
        GoodputSolve {
            objective: "goodput",
            slos: slos.iter().map(|s| s.to_string()).collect(),
            requests: w.len(),
            status: if meeting >= bound {
                "optimal"
            } else {
                "not-proven"
            },
            method: format!("goodput search: {}", found.method),
            clairvoyant: true,
            meeting,
            bound,
            bound_method: "machine relaxation: requests late for TTFT or E2E deadlines in every schedule",
            certified_gap,
            tries: found.tries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Request, Workload};

    fn cost() -> LinearCostModel {
        crate::cost_models::resolve("llama3-8b-h100-fa2").unwrap()
    }

    fn limits() -> Limits {
        Limits {
            token_budget: Some(4096),
            kv_capacity: Some(32_768),
            block_size: 16,
            ..Limits::default()
        }
    }

    #[test]
    fn a_request_that_cannot_make_it_is_served_last_so_the_others_can() {
        // A long prompt first, then four short requests just behind it, all with a TTFT
        // SLO only the short ones can meet if the long one waits: first come first served
        // makes the short ones late; the search defers the long one.
        let mut reqs = vec![Request {
            input_tokens: 4000,
            output_tokens: 2,
            arrival_s: 0.0,
        }];
        reqs.extend((0..4).map(|k| Request {
            input_tokens: 64,
            output_tokens: 2,
            arrival_s: 0.001 * f64::from(k + 1),
        }));
        let w = Workload::new(reqs).unwrap();
        let c = cost();
        // The threshold: half the long prompt's own TTFT (alone on the GPU), far more than
        // a short request's.
        let long_alone = Workload::new(vec![w.requests()[0]]).unwrap();
        let first = search(&long_alone, &limits(), &c, &[], 1).unwrap();
        let long_prefill = first.replay.requests[0].ttft_s();
        let slo: Slo = format!("ttft-max={}ms", long_prefill * 1e3 * 0.5)
            .parse()
            .unwrap();
        let found = search(&w, &limits(), &c, &[slo], 500).unwrap();
        assert_eq!(found.meeting, 4, "{}", found.method);
        assert!(
            found.method.contains("1 request held back"),
            "{}",
            found.method
        );
        // Earliest deadline first alone (no request moved) meets none: the long prompt,
        // first by deadline, holds every batch until all are late.
        let edf_only = search(&w, &limits(), &c, &[slo], 1).unwrap();
        assert_eq!(edf_only.meeting, 0, "{}", edf_only.method);
        // The count is the replay's.
        let r = replay(&w, &limits(), &c, &found.schedule).unwrap();
        assert_eq!(crate::core::SloReport::of(&r, &[slo]).good_requests, 4);
        // Never more than the proven ceiling.
        let most = crate::ceiling::most_requests_meeting(&w, &limits(), &c, 1, &[slo]);
        assert!(found.meeting <= most);
    }

    #[test]
    fn no_schedule_found_beats_the_proven_most() {
        // Random bursts with random TTFT / E2E / TBT SLOs: the search's count (a real
        // schedule's, replayed) never exceeds the ceiling's proof, and is at least every
        // heuristic's; some SLOs are loose enough that it finds requests meeting them.
        use rand::{Rng, SeedableRng};
        let c = cost();
        let (mut positive, mut cases) = (0, 0);
        for seed in 0..24u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let n = rng.random_range(2..24);
            let mut t = 0.0;
            let reqs: Vec<Request> = (0..n)
                .map(|_| {
                    t += rng.random_range(0.0..0.05);
                    Request {
                        input_tokens: rng.random_range(1..3000),
                        output_tokens: rng.random_range(1..40),
                        arrival_s: t,
                    }
                })
                .collect();
            let w = Workload::new(reqs).unwrap();
            let metric = ["ttft", "e2e", "tbt"][rng.random_range(0..3)];
            let ms = rng.random_range(20..600);
            let slos: Vec<Slo> = vec![format!("{metric}-p90={ms}ms").parse().unwrap()];
            let l = Limits {
                max_running: Some(rng.random_range(1..8)),
                ..limits()
            };
            let Some(found) = search(&w, &l, &c, &slos, 3000) else {
                continue;
            };
            cases += 1;
            let most = crate::ceiling::most_requests_meeting(&w, &l, &c, 1, &slos);
            assert!(
                found.meeting <= most,
                "seed {seed}: found {} > proven {most}",
                found.meeting
            );
            for kind in [
                crate::schedulers::SchedulerKind::Sarathi,
                crate::schedulers::SchedulerKind::VllmV1,
            ] {
                let knobs = crate::schedulers::Knobs {
                    kv_capacity: l.kv_capacity,
                    token_budget: l.token_budget,
                    max_running: l.max_running,
                    block_size: Some(l.block_size),
                    ..Default::default()
                };
                if let Ok(o) = crate::produce::produce_heuristic(&w, &c, kind, &knobs) {
                    let theirs = crate::core::SloReport::of(&o.replay, &slos).good_requests;
                    assert!(
                        theirs <= most,
                        "seed {seed}: {kind:?} {theirs} > proven {most}"
                    );
                }
            }
            positive += usize::from(found.meeting > 0);
        }
        assert!(
            cases >= 20 && positive >= 5,
            "{cases} cases, {positive} with requests meeting"
        );
    }
}
