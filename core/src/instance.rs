//! An [`Instance`]: a workload, its limits and a cost model, validated once and shared by
//! every tool that answers a question about it (replay, simulation, the solver).

use crate::cost::CostModel;
use crate::limits::{Infeasibility, Limits, LimitsError};
use crate::replay::{Replay, ReplayError, replay};
use crate::request::Workload;
use crate::schedule::Schedule;
use thiserror::Error;

/// Why a workload, limits and cost model do not make an instance.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum InstanceError {
    /// The limits themselves are invalid (a zero budget, a watermark out of range...).
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// No schedule at all can serve the workload under these limits.
    #[error("infeasible: {0}")]
    Infeasible(#[from] Infeasibility),
}

/// A scheduling problem: what arrives ([`Workload`]), what every batch must obey
/// ([`Limits`]) and how long a batch takes (`C`, a [`CostModel`]).
///
/// Built only through [`Instance::new`], which checks the limits and that every request
/// can be served at all, so a held `Instance` is always a question with an answer.
///
/// ```
/// use infersched_core::{BatchFeatures, CostModel, Entry, Batch, Instance, Limits, Request, Schedule, Workload};
/// struct PerToken;
/// impl CostModel for PerToken {
///     fn batch_time_s(&self, f: &BatchFeatures) -> f64 { 1e-3 * f.tokens as f64 }
/// }
/// let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 2, arrival_s: 0.0 }]).unwrap();
/// let limits = Limits { kv_capacity: Some(8), ..Limits::unlimited() };
/// let instance = Instance::new(w, limits, PerToken).unwrap();
/// // Prefill the prompt (first token), then decode the second.
/// let schedule = Schedule::new(vec![
///     Batch::new(vec![Entry::process(0, 4)]),
///     Batch::new(vec![Entry::process(0, 1)]),
/// ]);
/// let replayed = instance.replay(&schedule).unwrap();
/// assert!((replayed.makespan_s() - 0.005).abs() < 1e-12);
///
/// // A capacity below I + O - 1 = 5 tokens is refused when the instance is built.
/// let tight = Limits { kv_capacity: Some(4), ..Limits::unlimited() };
/// let w = Workload::new(vec![Request { input_tokens: 4, output_tokens: 2, arrival_s: 0.0 }]).unwrap();
/// assert!(Instance::new(w, tight, PerToken).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Instance<C> {
    workload: Workload,
    limits: Limits,
    cost: C,
}

impl<C: CostModel> Instance<C> {
    /// Checks `limits` and that every request of `workload` fits them (its whole KV within
    /// M), and bundles the three.
    pub fn new(workload: Workload, limits: Limits, cost: C) -> Result<Self, InstanceError> {
        limits.validate()?;
        limits.check_feasible(&workload)?;
        Ok(Self {
            workload,
            limits,
            cost,
        })
    }

    /// The requests.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The per-batch limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The batch-time model.
    pub fn cost(&self) -> &C {
        &self.cost
    }

    /// Replays `schedule` on this instance: every state and time recomputed, or the
    /// batch, request and rule it breaks (see [`replay()`]).
    pub fn replay(&self, schedule: &Schedule) -> Result<Replay, ReplayError> {
        replay(&self.workload, &self.limits, &self.cost, schedule)
    }

    /// The same workload and cost model under other limits (checked again).
    pub fn with_limits(&self, limits: Limits) -> Result<Self, InstanceError>
    where
        C: Clone,
    {
        Self::new(self.workload.clone(), limits, self.cost.clone())
    }

    /// The workload, limits and cost model back.
    pub fn into_parts(self) -> (Workload, Limits, C) {
        (self.workload, self.limits, self.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::BatchFeatures;
    use crate::request::Request;
    use crate::schedule::{Batch, Entry};

    #[derive(Debug, Clone)]
    struct PerBatch;
    impl CostModel for PerBatch {
        fn batch_time_s(&self, _: &BatchFeatures) -> f64 {
            0.5
        }
    }

    fn one_request() -> Workload {
        Workload::new(vec![Request {
            input_tokens: 3,
            output_tokens: 2,
            arrival_s: 0.0,
        }])
        .unwrap()
    }

    #[test]
    fn invalid_limits_and_unservable_requests_are_refused_at_construction() {
        let zero = Limits {
            token_budget: Some(0),
            ..Limits::unlimited()
        };
        assert!(matches!(
            Instance::new(one_request(), zero, PerBatch),
            Err(InstanceError::Limits(_))
        ));
        // I + O - 1 = 4 tokens do not fit M = 3.
        let small = Limits {
            kv_capacity: Some(3),
            ..Limits::unlimited()
        };
        let err = Instance::new(one_request(), small, PerBatch).unwrap_err();
        assert!(matches!(err, InstanceError::Infeasible(_)));
        assert!(err.to_string().contains("request 0"), "{err}");
    }

    #[test]
    fn replay_uses_the_instance_limits_and_cost() {
        let limits = Limits {
            kv_capacity: Some(4),
            ..Limits::unlimited()
        };
        let inst = Instance::new(one_request(), limits, PerBatch).unwrap();
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 3)]),
            Batch::new(vec![Entry::process(0, 1)]),
        ]);
        assert_eq!(inst.replay(&s).unwrap().makespan_s(), 1.0);
        // Under C = 2 the 3-token prefill breaks the token budget.
        let c2 = inst
            .with_limits(Limits {
                token_budget: Some(2),
                ..limits
            })
            .unwrap();
        assert!(c2.replay(&s).is_err());
        let (w, l, _) = c2.into_parts();
        assert_eq!((w.len(), l.token_budget), (1, Some(2)));
    }
}
