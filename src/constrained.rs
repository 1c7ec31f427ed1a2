//! Constrained objectives (`solve --objective O --subject-to SLO ...`, issue 45): the
//! objective minimized over the schedules whose replay meets every SLO given (each SLO's
//! aggregate over all requests, as the SLO report reads it).
//!
//! **Bound.** Constraints only remove schedules, so the solver's bound on the unconstrained
//! objective bounds the constrained optimum too.
//!
//! **Schedules.** The solver's best schedule where it meets the SLOs (then, if the solver
//! proved it optimal, it is the constrained optimum as well); besides it, a search over
//! schedules of the policies and of the solver's priority lists (module [`search`]) keeps
//! the best that meets them. Every candidate is simulated and replayed under the solver's
//! limits; the value and the SLO verdict are the replay's. A schedule is called optimal
//! only where its value meets the bound.

use crate::core::{Limits, Replay, Schedule, Slo, SloReport, Workload, replay};
use crate::cost_model::LinearCostModel;
use crate::schedulers::{Knobs, SchedulerKind, simulate};
use crate::solver::Objective;
use crate::solver::list_search::PriorityList;
use serde::Serialize;

/// A schedule that meets the SLOs, with its replay, its value and what produced it.
#[derive(Debug, Clone)]
pub struct Feasible {
    /// What produced it, in words.
    pub method: String,
    /// Whether the method reads the requests' true output lengths.
    pub clairvoyant: bool,
    /// The schedule.
    pub schedule: Schedule,
    /// Its replay under the limits.
    pub replay: Replay,
    /// The objective's replayed value (seconds).
    pub value: f64,
}

/// What the search tried and the best schedule meeting the SLOs among them.
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// The best schedule found that meets every SLO (None if none does).
    pub best: Option<Feasible>,
    /// Schedules simulated and replayed.
    pub tried: usize,
    /// Of those, the ones meeting every SLO.
    pub feasible: usize,
}

/// `solve.json` of a constrained solve.
#[derive(Debug, Clone, Serialize)]
pub struct ConstrainedSolve {
    /// The objective minimized.
    pub objective: Objective,
    /// The SLOs every schedule considered must meet (canonical form).
    pub subject_to: Vec<String>,
    /// `optimal` where the schedule's value meets the bound (or the solver proved its
    /// schedule, which meets the SLOs, optimal), else `not-proven`.
    pub status: &'static str,
    /// What produced the schedule.
    pub method: String,
    /// Whether that method reads the requests' true output lengths.
    pub clairvoyant: bool,
    /// The schedule's replayed objective (seconds).
    pub replayed_objective: f64,
    /// The solver's bound on the unconstrained objective (seconds), a bound here too.
    pub best_bound: f64,
    /// How the solver proved its bound.
    pub bound_method: String,
    /// `(replayed - bound) / replayed`.
    pub certified_gap: f64,
    /// Schedules the search simulated and replayed, and how many met every SLO.
    pub tried: usize,
    /// Of those, the ones meeting every SLO.
    pub feasible: usize,
}

impl ConstrainedSolve {
    /// The certificate of `best` against the solver's `bound` (named by `bound_method`);
    /// `proven` where the solver proved `best` optimal without the constraints.
    pub fn of(
        objective: Objective,
        slos: &[Slo],
        best: &Feasible,
        (bound, bound_method): (f64, String),
        proven: bool,
        found: &SearchResult,
    ) -> Self {
        let meets_bound = best.value <= bound * (1.0 + 1e-9);
        ConstrainedSolve {
            objective,
            subject_to: slos.iter().map(|s| s.to_string()).collect(),
            status: if proven || meets_bound {
                "optimal"
            } else {
                "not-proven"
            },
            method: best.method.clone(),
            clairvoyant: best.clairvoyant,
            replayed_objective: best.value,
            best_bound: bound,
            bound_method,
            certified_gap: if best.value > 0.0 {
                ((best.value - bound) / best.value).max(0.0)
            } else {
                0.0
            },
            tried: found.tried,
            feasible: found.feasible,
        }
    }
}

/// Whether `r` meets every SLO of `slos` (their aggregates over all requests).
pub fn meets(r: &Replay, slos: &[Slo]) -> bool {
    SloReport::of(r, slos).all_hold
}

struct Search<'a> {
    w: &'a Workload,
    limits: &'a Limits,
    cost: &'a LinearCostModel,
    objective: Objective,
    slos: &'a [Slo],
    result: SearchResult,
}

impl Search<'_> {
    /// Replays `schedule` and keeps it if it meets the SLOs better than the best so far.
    fn offer(&mut self, method: impl FnOnce() -> String, clairvoyant: bool, schedule: Schedule) {
        self.result.tried += 1;
        let Ok(r) = replay(self.w, self.limits, self.cost, &schedule) else {
            return;
        };
        if !meets(&r, self.slos) {
            return;
        }
        self.result.feasible += 1;
        let value = self.objective.of_replay(&r);
        if self.result.best.as_ref().is_none_or(|b| value < b.value) {
            self.result.best = Some(Feasible {
                method: method(),
                clairvoyant,
                schedule,
                replay: r,
                value,
            });
        }
    }

    /// Every policy under the limits, with its running set capped at R_max and below.
    fn policies(&mut self, caps: &[u64]) {
        for &kind in SchedulerKind::ALL {
            for &cap in caps {
                let knobs = Knobs {
                    max_running: Some(cap),
                    watermark: Some(0.0),
                    ..Knobs::matching(self.limits)
                };
                if let Ok(sim) = kind.simulate(self.w, &knobs, self.cost) {
                    let method = || format!("{}+max-running={cap}", kind.name());
                    self.offer(method, kind.clairvoyant(), sim.schedule);
                }
            }
        }
    }

    /// The solver's priority lists: requests by arrival, or shortest first by tokens,
    /// prompt or output (the last three read true output lengths or sizes), each chunk
    /// cap, short requests decoding beside long prompts or not, each running cap.
    fn priority_lists(&mut self, caps: &[u64]) {
        let reqs = self.w.requests();
        let by = |key: &dyn Fn(usize) -> (u64, u64)| {
            let mut order: Vec<u32> = (0..reqs.len() as u32).collect();
            order.sort_by_key(|&i| (key(i as usize), u64::from(i)));
            order
        };
        let arrival: Vec<u32> = {
            let mut o: Vec<u32> = (0..reqs.len() as u32).collect();
            o.sort_by(|&a, &b| {
                reqs[a as usize]
                    .arrival_s
                    .total_cmp(&reqs[b as usize].arrival_s)
                    .then(a.cmp(&b))
            });
            o
        };
        let tokens = |i: usize| u64::from(reqs[i].input_tokens) + u64::from(reqs[i].output_tokens);
        let orders = [
            ("arrival", false, arrival),
            ("tokens", true, by(&|i| (tokens(i), 0))),
            (
                "input",
                false,
                by(&|i| (u64::from(reqs[i].input_tokens), tokens(i))),
            ),
            (
                "output",
                true,
                by(&|i| (u64::from(reqs[i].output_tokens), tokens(i))),
            ),
        ];
        let chunks = crate::goodput::chunk_caps(self.w, self.limits);
        let limits = Limits {
            watermark: 0.0,
            ..*self.limits
        };
        for (name, clairvoyant, order) in &orders {
            for &chunk in &chunks {
                for decode_chunk in [chunk, 0] {
                    for &cap in caps {
                        let mut policy = PriorityList::new(order, chunk, decode_chunk, cap);
                        let Ok(sim) = simulate(self.w, &limits, &mut policy, self.cost) else {
                            continue;
                        };
                        let method = || {
                            format!(
                                "priority list: order by {name}, chunk {chunk}, decode chunk {decode_chunk}, max-running {cap}"
                            )
                        };
                        self.offer(method, *clairvoyant, sim.schedule);
                    }
                }
            }
        }
    }
}

/// The running caps tried: R_max (or every request) and 64, 16, 4 and 1 below it.
fn running_caps(w: &Workload, limits: &Limits) -> Vec<u64> {
    let top = limits
        .max_running
        .unwrap_or(w.len() as u64)
        .min(w.len() as u64)
        .max(1);
    let mut caps = vec![top];
    caps.extend([64, 16, 4, 1].into_iter().filter(|&c| c < top));
    caps
}

/// The best schedule meeting every SLO of `slos` among `start` (e.g. the solver's best,
/// offered first) and the schedules of the policies and the priority lists under
/// `limits`, by `objective`.
pub fn search(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    slos: &[Slo],
    start: Option<(String, bool, Schedule)>,
) -> SearchResult {
    let mut s = Search {
        w,
        limits,
        cost,
        objective,
        slos,
        result: SearchResult {
            best: None,
            tried: 0,
            feasible: 0,
        },
    };
    if let Some((method, clairvoyant, schedule)) = start {
        s.offer(|| method, clairvoyant, schedule);
    }
    let caps = running_caps(w, limits);
    s.policies(&caps);
    s.priority_lists(&caps);
    s.result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Request;

    #[test]
    fn the_best_kept_meets_the_slos_and_no_policy_meeting_them_beats_it() {
        let r = |i: u32, o: u32, t: f64| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        let w = Workload::new(vec![
            r(2000, 40, 0.0),
            r(300, 60, 0.0),
            r(1500, 20, 0.01),
            r(100, 80, 0.02),
            r(800, 30, 0.03),
            r(60, 50, 0.05),
        ])
        .unwrap();
        let limits = Limits {
            token_budget: Some(1024),
            kv_capacity: Some(4096),
            block_size: 16,
            ..Limits::unlimited()
        };
        let cost = crate::cost_model::preset("llama3-8b-h100-fa2").unwrap();
        let slos: Vec<Slo> = vec!["tbt-max=20ms".parse().unwrap()];
        let found = search(&w, &limits, &cost, Objective::MeanTtft, &slos, None);
        assert!(
            0 < found.feasible && found.feasible < found.tried,
            "{} of {}",
            found.feasible,
            found.tried
        );
        let best = found.best.expect("some schedule meets it");
        let again = replay(&w, &limits, &cost, &best.schedule).unwrap();
        assert!(meets(&again, &slos));
        assert_eq!(Objective::MeanTtft.of_replay(&again), best.value);
        for &kind in SchedulerKind::ALL {
            let knobs = Knobs {
                watermark: Some(0.0),
                ..Knobs::matching(&limits)
            };
            let Ok(sim) = kind.simulate(&w, &knobs, &cost) else {
                continue;
            };
            let Ok(r) = replay(&w, &limits, &cost, &sim.schedule) else {
                continue;
            };
            if meets(&r, &slos) {
                assert!(best.value <= Objective::MeanTtft.of_replay(&r), "{kind}");
            }
        }
    }
}
