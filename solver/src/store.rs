//! What a solve holds while its methods run: the best schedule found (the incumbent) and
//! the best lower bound proven, each with the method that produced it.
//!
//! Every method offers its schedules and bounds here ([`Store::offer`],
//! [`Store::offer_bound`]); the store replays each schedule itself, refuses one outside the
//! policy class, keeps it only when it is strictly better (a tie keeps the earlier source),
//! and tells the observer of every new incumbent, so an interrupted solve can always save
//! the best schedule held.

use crate::bounds::CombinatorialBound;
use crate::progress::Observer;
use crate::{Objective, PolicyConstraints};
use infersched_core::{Limits, Replay, Schedule, Workload, replay};
use infersched_cost_model::LinearCostModel;

/// A schedule a method found, with its replay.
#[derive(Debug, Clone)]
pub(crate) struct Incumbent {
    /// The method and its variant that produced it, e.g. `mcsf+order=tokens+max-running=24`.
    pub name: String,
    /// Its schedule.
    pub schedule: Schedule,
    /// The schedule's replay under the problem's limits.
    pub replay: Replay,
}

impl Incumbent {
    /// Its replayed objective (seconds).
    pub fn objective_value(&self, objective: Objective) -> f64 {
        objective.of_replay(&self.replay)
    }
}

/// The problem a store checks schedules against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checks<'a> {
    /// The workload.
    pub w: &'a Workload,
    /// Its limits.
    pub limits: &'a Limits,
    /// The batch-time model.
    pub cost: &'a LinearCostModel,
    /// What is minimized.
    pub objective: Objective,
    /// The policy class every schedule must be in.
    pub class: PolicyConstraints,
}

/// The incumbent and the bound of one solve.
#[derive(Debug)]
pub(crate) struct Store<'a> {
    checks: Checks<'a>,
    observer: Option<Observer>,
    incumbent: Option<Incumbent>,
    bound: CombinatorialBound,
}

impl<'a> Store<'a> {
    /// A store with no schedule yet and `bound` (the combinatorial bound) as its bound.
    pub fn new(checks: Checks<'a>, bound: CombinatorialBound, observer: Option<Observer>) -> Self {
        Self {
            checks,
            observer,
            incumbent: None,
            bound,
        }
    }

    /// The best schedule held.
    pub fn incumbent(&self) -> Option<&Incumbent> {
        self.incumbent.as_ref()
    }

    /// A copy of the best schedule held.
    pub fn incumbent_cloned(&self) -> Option<Incumbent> {
        self.incumbent.clone()
    }

    /// The best schedule held, taken out for a method that takes its start by value; it
    /// gives it back with [`Store::restore`] or offers a better one.
    pub fn take_incumbent(&mut self) -> Option<Incumbent> {
        self.incumbent.take()
    }

    /// Puts back the incumbent [`Store::take_incumbent`] took (unchecked: it was checked
    /// when it came in; the observer heard of it then).
    pub fn restore(&mut self, incumbent: Incumbent) {
        debug_assert!(self.incumbent.is_none());
        self.incumbent = Some(incumbent);
    }

    /// The best bound held.
    pub fn bound(&self) -> CombinatorialBound {
        self.bound
    }

    /// The incumbent's replayed objective (seconds).
    pub fn value(&self) -> Option<f64> {
        self.incumbent
            .as_ref()
            .map(|i| i.objective_value(self.checks.objective))
    }

    /// Offers `candidate`: replayed here (its own replay is not trusted), refused outside
    /// the class or where the replay fails, kept where strictly better than the incumbent
    /// (the observer is told). Whether it was kept.
    pub fn offer(&mut self, candidate: Incumbent) -> bool {
        // Its replay is dropped before the store's own is made.
        let Incumbent { name, schedule, .. } = candidate;
        self.offer_schedule(name, schedule)
    }

    /// Offers `schedule`, found by `name` (as [`Store::offer`]).
    pub fn offer_schedule(&mut self, name: String, schedule: Schedule) -> bool {
        let c = self.checks;
        let Ok(replayed) = replay(c.w, c.limits, c.cost, &schedule) else {
            return false;
        };
        if !c.class.admits(c.w, c.limits, &schedule) {
            return false;
        }
        let value = c.objective.of_replay(&replayed);
        if self.value().is_some_and(|best| value >= best) {
            return false;
        }
        if let Some(observer) = &self.observer {
            observer.0.incumbent(&name, &schedule);
        }
        self.incumbent = Some(Incumbent {
            name,
            schedule,
            replay: replayed,
        });
        true
    }

    /// Offers `candidate`, when there is one (a method's answer).
    pub fn offer_any(&mut self, candidate: Option<Incumbent>) -> bool {
        candidate.is_some_and(|c| self.offer(c))
    }

    /// Offers a bound: kept where strictly greater than the one held. Whether it was kept.
    pub fn offer_bound(&mut self, bound: CombinatorialBound) -> bool {
        let better = bound.value_s > self.bound.value_s;
        if better {
            self.bound = bound;
        }
        better
    }

    /// Replaces the bound, whatever it was (a method's bound that supersedes the store's,
    /// such as the independent groups' which already took the better of the two).
    pub fn set_bound(&mut self, bound: CombinatorialBound) {
        self.bound = bound;
    }

    /// Whether the incumbent meets the bound (within a relative 1e-9): then it is optimal.
    pub fn meets_bound(&self) -> bool {
        self.value()
            .is_some_and(|v| v <= self.bound.value_s * (1.0 + 1e-9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::BoundArgument;
    use crate::progress::{Progress, SolveObserver};
    use infersched_core::{Action, Batch, Entry, Request};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Heard(Mutex<Vec<String>>);
    impl SolveObserver for Heard {
        fn progress(&self, _: &Progress) {}
        fn incumbent(&self, source: &str, _: &Schedule) {
            self.0.lock().unwrap().push(source.to_string());
        }
    }

    fn workload() -> Workload {
        let r = Request {
            input_tokens: 2,
            output_tokens: 2,
            arrival_s: 0.0,
        };
        Workload::new(vec![r, r]).unwrap()
    }

    /// Both requests together (prefill, then one decode each), or one after the other.
    fn schedules() -> (Schedule, Schedule) {
        let e = |request, action| Entry {
            request,
            action,
            cached: 0,
        };
        let p = Action::Process;
        let together = Schedule::new(vec![
            Batch::new(vec![e(0, p(2)), e(1, p(2))]),
            Batch::new(vec![e(0, Action::Process(1)), e(1, Action::Process(1))]),
        ]);
        let serial = Schedule::new(vec![
            Batch::new(vec![e(0, p(2))]),
            Batch::new(vec![e(0, Action::Process(1))]),
            Batch::new(vec![e(1, p(2))]),
            Batch::new(vec![e(1, Action::Process(1))]),
        ]);
        (together, serial)
    }

    fn candidate(
        name: &str,
        schedule: &Schedule,
        w: &Workload,
        cost: &LinearCostModel,
    ) -> Incumbent {
        Incumbent {
            name: name.to_string(),
            schedule: schedule.clone(),
            replay: replay(w, &Limits::unlimited(), cost, schedule).unwrap(),
        }
    }

    #[test]
    fn the_store_keeps_strictly_better_schedules_and_ties_keep_the_earlier_source() {
        let (w, cost) = (
            workload(),
            infersched_cost_model::preset("llama2-7b-a100").unwrap(),
        );
        let limits = Limits::unlimited();
        let heard = Arc::new(Heard::default());
        let checks = Checks {
            w: &w,
            limits: &limits,
            cost: &cost,
            objective: Objective::Makespan,
            class: PolicyConstraints::default(),
        };
        let bound = CombinatorialBound {
            value_s: 0.0,
            argument: BoundArgument::BatchesAndWork,
        };
        let mut store = Store::new(checks, bound, Some(Observer(heard.clone())));
        let (together, serial) = schedules();
        assert!(store.offer(candidate("serial", &serial, &w, &cost)));
        assert!(store.offer(candidate("together", &together, &w, &cost)));
        // The same schedule again, and a worse one: the earlier source stays.
        assert!(!store.offer(candidate("again", &together, &w, &cost)));
        assert!(!store.offer(candidate("worse", &serial, &w, &cost)));
        assert_eq!(store.incumbent().unwrap().name, "together");
        assert_eq!(*heard.0.lock().unwrap(), ["serial", "together"]);
        // Bounds: only a greater one is kept.
        let b = |value_s| CombinatorialBound {
            value_s,
            argument: BoundArgument::BatchesAndWork,
        };
        assert!(store.offer_bound(b(1e-3)));
        assert!(!store.offer_bound(b(1e-3)));
        assert!(!store.offer_bound(b(1e-4)));
        assert_eq!(store.bound().value_s, 1e-3);
    }

    #[test]
    fn the_store_refuses_a_schedule_outside_the_class_or_the_limits() {
        let (w, cost) = (
            workload(),
            infersched_cost_model::preset("llama2-7b-a100").unwrap(),
        );
        let (together, serial) = schedules();
        let bound = CombinatorialBound {
            value_s: 0.0,
            argument: BoundArgument::BatchesAndWork,
        };
        // At most one request running: the joint schedule is out of the limits.
        let one = Limits {
            max_running: Some(1),
            ..Limits::unlimited()
        };
        let checks = Checks {
            w: &w,
            limits: &one,
            cost: &cost,
            objective: Objective::MeanLatency,
            class: PolicyConstraints::default(),
        };
        let mut store = Store::new(checks, bound, None);
        assert!(!store.offer(candidate("together", &together, &w, &cost)));
        assert!(store.offer(candidate("serial", &serial, &w, &cost)));
        // Unmixed batches only: a batch of prefills and decodes is refused.
        let mixed = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 2)]),
            Batch::new(vec![Entry::process(0, 1), Entry::process(1, 2)]),
            Batch::new(vec![Entry::process(1, 1)]),
        ]);
        let limits = Limits::unlimited();
        let no_mix = Checks {
            w: &w,
            limits: &limits,
            cost: &cost,
            objective: Objective::MeanLatency,
            class: PolicyConstraints {
                no_mix: true,
                ..PolicyConstraints::default()
            },
        };
        let mut store = Store::new(no_mix, bound, None);
        assert!(!store.offer(candidate("mixed", &mixed, &w, &cost)));
        assert!(store.incumbent().is_none());
    }
}
