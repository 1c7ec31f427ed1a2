//! Chunk merging: when neither a token budget C nor a prefill budget P binds and all
//! requests arrive together, chunked prefill never helps, so the model may leave out
//! every arc of a partial prefill.
//!
//! **Claim.** Without C and P, without the FCFS constraint, and with every request arriving
//! at the same time (an offline workload), for every valid schedule
//! there is one whose prefill phases each run in a single batch (the `no-chunk` class)
//! that is at least as good for `makespan`, `mean-latency` and `mean-ttft`, under every
//! cost model with non-negative coefficients (which [`infersched_cost_model`] enforces).
//!
//! **Proof (constructive, [`merge_prefill_chunks`]).** Take a prefill phase of request `r`
//! that runs as chunks `c_1, ..., c_k` in batches `j_1 < ... < j_k`, the last one
//! completing it (`m` reaches `I + G`). Drop the first `k - 1` chunks and let `j_k` process
//! all the phase's tokens from where the phase started (`m_0`). Then:
//! - in `j_1 .. j_{k-1}`, `r` holds `m_0` instead of more: KV (block-rounded occupancy is
//!   monotone), the running count and the budgets of those batches can only go down;
//! - `j_k` ends in the same state; its extra tokens are allowed because C and P are
//!   unbounded; the phase's prefill-attention pairs are the same
//!   (`sum (c_i^2 + 2 c_i m_i) = (I + G)^2 - m_0^2` whatever the split), its tokens are the
//!   same, its entries (`n_prefill`) and context (`prefill_ctx`, the sum of `m_i`) can only
//!   drop, and so can the `has_prefill` flags of the earlier batches;
//! - a phase cut short by an eviction is dropped with the eviction (when nothing else was
//!   held), which only removes work; batches left empty are removed.
//!
//! Batch `j_k` gets longer, but only by work taken from earlier batches, so the end of
//! every batch (the sum of the durations up to it, since no batch of an offline workload
//! waits) weakly decreases, and so does every request's first-token and completion time.
//! With staggered arrivals this fails: if `j_k` waited for an arrival, the time saved
//! before it is absorbed by the wait and `j_k` ends later (the property test found such a
//! case), so the chunk arcs stay in the model then. Evictions are only removed (`no-evict` is kept),
//! no batch gains a prefill entry (`no-mix` is kept), and reservations start no earlier
//! (`reserve` is kept). FCFS is not kept (a request's first admission can move after a
//! later request's), hence that exception. The exhaustive-search tests check the claim:
//! the model with chunk arcs dropped matches the search with chunking allowed.

use infersched_core::{Action, Batch, Entry, Limits, RequestState, Schedule, Workload};

use crate::PolicyConstraints;

/// Whether every request of `w` arrives at the same time.
pub fn offline(w: &Workload) -> bool {
    w.requests()
        .windows(2)
        .all(|p| p[0].arrival_s == p[1].arrival_s)
}

/// Whether, for `w` under `limits` and `class`, the model may drop partial-prefill arcs
/// without losing optimality (see the module documentation).
pub fn chunking_never_helps(w: &Workload, limits: &Limits, class: &PolicyConstraints) -> bool {
    offline(w)
        && limits.token_budget.is_none()
        && limits.effective_prefill_budget().is_none()
        && !class.fcfs
}

/// The schedule with each prefill phase merged into the batch that completes it, phases
/// abandoned by an eviction dropped, and empty batches removed; claimed batch times are
/// cleared (the replay recomputes them). Valid and at least as good as `schedule` when
/// [`chunking_never_helps`] (module documentation), assuming `schedule` is valid.
pub fn merge_prefill_chunks(w: &Workload, schedule: &Schedule) -> Schedule {
    let reqs = w.requests();
    // Per request: KV held in the original and in the merged schedule, tokens generated.
    let mut state = vec![RequestState::default(); reqs.len()];
    let mut merged_held = vec![0u64; reqs.len()];
    let mut batches = Vec::with_capacity(schedule.batches.len());
    for b in &schedule.batches {
        let mut entries = Vec::with_capacity(b.entries.len());
        for e in &b.entries {
            let i = e.request as usize;
            match e.action {
                Action::Receive => entries.push(*e),
                Action::Evict => {
                    state[i].evict();
                    if merged_held[i] > 0 {
                        merged_held[i] = 0;
                        entries.push(*e);
                    }
                }
                Action::Process(c) => {
                    let step = state[i].process(&reqs[i], u64::from(c));
                    if step.generates {
                        // Completes the phase (or is a decode): everything not yet
                        // processed in the merged schedule runs here.
                        let tokens = step.after - merged_held[i];
                        entries.push(Entry::process(
                            e.request,
                            u32::try_from(tokens).expect("at most I + O tokens"),
                        ));
                        merged_held[i] = step.after;
                    }
                }
            }
        }
        if !entries.is_empty() {
            batches.push(Batch::new(entries));
        }
    }
    Schedule {
        batches,
        meta: schedule.meta.clone(),
        prefix_cache: schedule.prefix_cache,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{Request, replay};

    fn entries(s: &Schedule) -> Vec<Vec<Entry>> {
        s.batches.iter().map(|b| b.entries.clone()).collect()
    }

    fn workload() -> Workload {
        Workload::new(vec![
            Request {
                input_tokens: 6,
                output_tokens: 2,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 4,
                output_tokens: 2,
                arrival_s: 0.0,
            },
        ])
        .unwrap()
    }

    #[test]
    fn chunks_merge_into_the_completing_batch_and_empty_batches_go() {
        let w = workload();
        let s = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(0, 2)]),
                Batch::new(vec![Entry::process(0, 3), Entry::process(1, 4)]),
                Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
                Batch::new(vec![Entry::process(0, 1)]),
            ],
            meta: None,
            prefix_cache: None,
        };
        let merged = merge_prefill_chunks(&w, &s);
        assert_eq!(
            entries(&merged),
            vec![
                vec![Entry::process(1, 4)],
                vec![Entry::process(0, 6), Entry::process(1, 1)],
                vec![Entry::process(0, 1)],
            ]
        );
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let limits = Limits {
            kv_capacity: Some(12),
            ..Limits::unlimited()
        };
        let before = replay(&w, &limits, &cost, &s).unwrap();
        let after = replay(&w, &limits, &cost, &merged).unwrap();
        assert!(after.makespan_s() < before.makespan_s());
    }

    #[test]
    fn a_phase_cut_short_by_an_eviction_is_dropped_with_it() {
        let w = workload();
        let s = Schedule {
            batches: vec![
                Batch::new(vec![Entry::process(0, 3)]),
                Batch::new(vec![Entry::evict(0), Entry::process(1, 4)]),
                Batch::new(vec![Entry::process(0, 6), Entry::process(1, 1)]),
                Batch::new(vec![Entry::process(0, 1)]),
            ],
            meta: None,
            prefix_cache: None,
        };
        let merged = merge_prefill_chunks(&w, &s);
        assert_eq!(
            entries(&merged),
            vec![
                vec![Entry::process(1, 4)],
                vec![Entry::process(0, 6), Entry::process(1, 1)],
                vec![Entry::process(0, 1)],
            ]
        );
    }

    #[test]
    fn budgets_fcfs_or_arrivals_keep_the_chunk_arcs() {
        let w = workload();
        let free = Limits::unlimited();
        assert!(chunking_never_helps(
            &w,
            &free,
            &PolicyConstraints::default()
        ));
        let c = Limits {
            token_budget: Some(8),
            ..free
        };
        assert!(!chunking_never_helps(&w, &c, &PolicyConstraints::default()));
        let p = Limits {
            prefill_budget: Some(8),
            ..free
        };
        assert!(!chunking_never_helps(&w, &p, &PolicyConstraints::default()));
        let fcfs = PolicyConstraints {
            fcfs: true,
            ..PolicyConstraints::default()
        };
        assert!(!chunking_never_helps(&w, &free, &fcfs));
        let mut reqs = w.requests().to_vec();
        reqs[1].arrival_s = 0.5;
        let online = Workload::new(reqs).unwrap();
        assert!(!chunking_never_helps(
            &online,
            &free,
            &PolicyConstraints::default()
        ));
    }
}
