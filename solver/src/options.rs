//! What a solve asks: the objective, the policy class searched, and the knobs of the
//! methods (time and memory limits, HiGHS settings, the warm start).

use infersched_core::{Limits, RequestState, Schedule, Summary, Workload};
use infersched_schedulers::SchedulerKind;
use serde::Serialize;

/// What to minimize (`semantics.md`, "Objectives").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// End of the last batch.
    Makespan,
    /// Mean end-to-end latency.
    MeanLatency,
    /// Mean time to first token.
    MeanTtft,
}

infersched_core::named_enum!(Objective, "objective", {
    Makespan => "makespan",
    MeanLatency => "mean-latency",
    MeanTtft => "mean-ttft",
});

impl Objective {
    /// The objective's value in a replay summary (seconds).
    pub fn of(self, s: &Summary) -> f64 {
        match self {
            Self::Makespan => s.makespan_s,
            Self::MeanLatency => s.mean_e2e_s,
            Self::MeanTtft => s.mean_ttft_s,
        }
    }

    /// The objective's value in a replay (seconds): the same number as
    /// `self.of(&Summary::from_replay(r))`, without computing the rest of the summary
    /// (searches that judge thousands of schedules need only this).
    pub fn of_replay(self, r: &infersched_core::Replay) -> f64 {
        let o = infersched_core::Objectives::from_replay(r);
        match self {
            Self::Makespan => o.makespan_s,
            Self::MeanLatency => o.mean_latency_s,
            Self::MeanTtft => o.mean_ttft_s,
        }
    }
}

/// Policy constraints: the best schedule a policy class can reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct PolicyConstraints {
    /// No evictions.
    pub no_evict: bool,
    /// Each prefill phase runs in one batch.
    pub no_chunk: bool,
    /// No batch mixes prefill and decode entries.
    pub no_mix: bool,
    /// Requests are first admitted in arrival order (ties by id): none starts before an
    /// earlier one has.
    pub fcfs: bool,
    /// Orca's reservation: from its first step to its end a request holds `I + O - 1`
    /// KV tokens in the memory constraint, and nothing is evicted.
    pub reserve: bool,
}

impl PolicyConstraints {
    /// Whether `schedule` (already replayed as valid under `limits`) belongs to this class.
    pub fn admits(&self, w: &Workload, limits: &Limits, schedule: &Schedule) -> bool {
        let reqs = w.requests();
        let mut state = vec![RequestState::default(); reqs.len()];
        let mut first_batch = vec![usize::MAX; reqs.len()];
        for (j, b) in schedule.batches.iter().enumerate() {
            for e in &b.entries {
                let i = e.request as usize;
                if matches!(e.action, infersched_core::Action::Process(_))
                    && first_batch[i] == usize::MAX
                {
                    first_batch[i] = j;
                }
            }
        }
        if self.fcfs {
            let order = w.fcfs_order();
            if order
                .windows(2)
                .any(|p| first_batch[p[0] as usize] > first_batch[p[1] as usize])
            {
                return false;
            }
        }
        for (j, b) in schedule.batches.iter().enumerate() {
            let (mut prefill, mut decode) = (false, false);
            for e in &b.entries {
                let i = e.request as usize;
                match e.action {
                    // No policy class covers a disaggregated replica's receives.
                    infersched_core::Action::Receive => return false,
                    infersched_core::Action::Evict => {
                        if self.no_evict {
                            return false;
                        }
                        state[i].evict();
                    }
                    infersched_core::Action::Process(c) => {
                        let step = state[i].process(&reqs[i], u64::from(c));
                        if step.decode {
                            decode = true;
                        } else {
                            prefill = true;
                            // A chunk that does not complete its phase.
                            if self.no_chunk && !step.generates {
                                return false;
                            }
                        }
                    }
                }
            }
            if self.no_mix && prefill && decode {
                return false;
            }
            if self.reserve
                && let Some(cap) = limits.kv_capacity
            {
                // Started by this batch and not finished before it: holds its reservation.
                let reserved: u64 = reqs
                    .iter()
                    .enumerate()
                    .filter(|&(i, r)| {
                        first_batch[i] <= j
                            && (!state[i].finished(r)
                                || b.entries.iter().any(|e| e.request as usize == i))
                    })
                    .map(|(_, r)| limits.occupied(r.max_kv_tokens()))
                    .sum();
                if reserved > cap {
                    return false;
                }
            }
        }
        true
    }
}

/// Solver options.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Wall-clock limit for HiGHS (seconds).
    pub time_limit_s: f64,
    /// Threads: HiGHS's, and the batch-index bound's sweeps (its rounds of pairs shared).
    pub threads: u32,
    /// Relative MIP gap at which HiGHS stops.
    pub mip_rel_gap: f64,
    /// Number of batch slots J; default: provably sufficient for `makespan` when that is
    /// at most `max_horizon`, else the warm start's batch count times `horizon_slack`.
    pub horizon: Option<usize>,
    /// Multiplier on the warm start's batch count for the default horizon.
    pub horizon_slack: f64,
    /// Largest horizon chosen automatically.
    pub max_horizon: usize,
    /// Start HiGHS from the best heuristic schedule.
    pub warm_start: bool,
    /// The heuristics whose schedules (each with and without preemption and with capped
    /// running sets) are tried as the warm start; empty means sarathi, vllm-v1, vllm,
    /// orca and mcsf, and, on offline identical-request classes with C or P, the counting
    /// search's best whole-prefill schedule. The best one in the policy class also sizes
    /// the horizon.
    pub warm_start_from: Vec<SchedulerKind>,
    /// Policy constraints.
    pub constraints: PolicyConstraints,
    /// Let HiGHS log its progress to stdout.
    pub log: bool,
    /// Receives HiGHS's progress (best schedule, bound, gap, elapsed) while it works
    /// (ignored with `log`); the command line draws it on stderr ([`StderrProgress`]).
    ///
    /// [`StderrProgress`]: crate::progress::StderrProgress
    pub observer: Option<crate::progress::Observer>,
    /// Build no arc-flow model with more arc variables than this (memory and build time grow
    /// with them; a model this large would not solve in useful time on one machine anyway):
    /// the best heuristic schedule with a combinatorial bound is returned instead.
    pub max_arc_columns: usize,
    /// Memory the exact models may take (bytes), estimated before any is built: the
    /// request state graphs, and the arc-flow MILP at [`MILP_BYTES_PER_ARC_COLUMN`] per arc
    /// variable (so it also caps [`Self::max_arc_columns`]); past it the best heuristic
    /// schedule with a combinatorial bound is returned instead.
    pub memory_limit_bytes: u64,
    /// Before the MILP, try the exact counting search (module `counting`) when it applies
    /// (offline workload, no C or P, no FCFS, no explicit horizon), keeping at most this
    /// many count vectors (and no more than a quarter of [`Self::memory_limit_bytes`] holds); 0 goes
    /// straight to the MILP, even where the best heuristic schedule already meets the
    /// combinatorial bound (which otherwise is returned as proven at once).
    pub max_search_states: usize,
    /// Schedules the priority-list local search (module `list_search`) may simulate and
    /// replay to improve the best heuristic schedule (it also stops at half the time
    /// limit); 0 turns it off.
    pub list_search_evaluations: usize,
    /// The most plans each plan search (module `plan_schedule`: from the phase
    /// relaxation's plan, or re-planning the best schedule) turns into schedules and
    /// replays (at least its first; it also stops at the end of its time share). A plan's
    /// schedule takes tens of microseconds to build and replay at a few dozen requests.
    pub plan_search_evaluations: usize,
    /// For `mean-latency` with at most [`PHASE_RELAXATION_MAX_REQUESTS`] requests, solve
    /// the phase relaxation (module `bounds::phases`) for a stronger bound, and turn its
    /// incumbent's plan into schedules (module `plan_schedule`): with 0.8 and 0.15 of the
    /// time left where no exact model follows, else 0.25 and 0.05.
    ///
    /// [`PHASE_RELAXATION_MAX_REQUESTS`]: crate::bounds::PHASE_RELAXATION_MAX_REQUESTS
    pub phase_relaxation: bool,
    /// For mean latency and mean TTFT where no exact model fits the whole workload, split
    /// it where the best heuristic schedule has served every earlier request before the
    /// next arrives, and solve each group on its own (module `groups`).
    pub independent_groups: bool,
    /// Schedules the caller already has (e.g. `compare`'s heuristics, run under their own
    /// defaults), each with its name: offered to the store before any method runs, so
    /// each is replayed under these limits, kept only inside the class and when strictly
    /// better, and the answer names the one it returns.
    pub seeds: Vec<(String, Schedule)>,
}

/// What the arc-flow MILP takes per arc variable while HiGHS solves it (bytes of peak
/// resident memory, the model as good_lp builds it and HiGHS's copies and search): family
/// (a) with C = 64, mean latency, n = 9 .. 12 (1.18 - 1.58 million columns, 8.75 nonzeros
/// each) peaked at 2,400 - 3,460 bytes per column.
pub const MILP_BYTES_PER_ARC_COLUMN: u64 = 3_600;

impl SolveOptions {
    /// The most arc variables of a model: [`Self::max_arc_columns`], and what
    /// [`Self::memory_limit_bytes`] holds at [`MILP_BYTES_PER_ARC_COLUMN`] each.
    pub fn arc_column_cap(&self) -> usize {
        let by_memory = self.memory_limit_bytes / MILP_BYTES_PER_ARC_COLUMN;
        self.max_arc_columns
            .min(usize::try_from(by_memory).unwrap_or(usize::MAX))
    }
}

impl Default for SolveOptions {
    fn default() -> Self {
        Self {
            time_limit_s: 60.0,
            threads: 2,
            mip_rel_gap: 1e-6,
            horizon: None,
            horizon_slack: 1.5,
            max_horizon: 200,
            warm_start: true,
            warm_start_from: Vec::new(),
            constraints: PolicyConstraints::default(),
            log: false,
            observer: None,
            max_arc_columns: 2_000_000,
            memory_limit_bytes: 4 << 30,
            max_search_states: 5_000_000,
            list_search_evaluations: 2_000,
            plan_search_evaluations: 100_000,
            phase_relaxation: true,
            independent_groups: true,
            seeds: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arc_column_cap_is_what_the_memory_limit_holds_where_that_is_less() {
        let mut o = SolveOptions::default();
        // 4 GiB hold 1,193,046 arc variables at 3.6 kB: under the 2 million allowed.
        assert_eq!(o.arc_column_cap(), (4u64 << 30) as usize / 3_600);
        o.memory_limit_bytes = 64 << 30;
        assert_eq!(o.arc_column_cap(), 2_000_000);
        o.memory_limit_bytes = 0;
        assert_eq!(o.arc_column_cap(), 0);
    }
}
