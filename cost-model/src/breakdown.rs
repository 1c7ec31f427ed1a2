//! Where a schedule's time goes: its makespan split into the linear cost model's terms.
//!
//! A batch lasts `sum_f theta_f x_f` (the linear model), so the sum of the batch durations
//! splits exactly into the terms' contributions, and the makespan is that sum plus the time
//! the GPU waits for arrivals. The terms are grouped as a reader asks "why":
//!
//! * **batch bias**: `one`, `has_prefill`, `has_decode`, paid once per batch (launches,
//!   weight reads): many small batches make it large;
//! * **entry overhead**: `n_prefill`, `n_decode`, paid once per entry;
//! * **linear tokens**: `tokens`, the linear layers' work per token processed;
//! * **attention**: `decode_kv`, `prefill_attn`, `prefill_ctx`, growing with context;
//! * **recomputation**: what re-processing evicted tokens costs (their `tokens` and
//!   `prefill_attn` terms, and the entry's `n_prefill` and `prefill_ctx` when the whole
//!   entry is a refill), taken out of the three terms above so that nothing counts twice;
//! * **idle**: the makespan minus the batches' durations (no batch can start: nothing has
//!   arrived).
//!
//! The recomputed tokens are the replay's: a request evicted while holding `k` tokens owes
//! `k`, and its next prefill entries pay them back first (tokens it takes back from the
//! prefix cache cost nothing and pay back as much).

use infersched_core::{Action, EntryKind, Feature, Replay, Schedule, Workload, classify_entries};
use serde::Serialize;

use crate::LinearCostModel;

/// A makespan split into the cost model's terms (seconds); see the module documentation.
/// The terms add up to the replay's makespan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TimeBreakdown {
    /// `one`, `has_prefill` and `has_decode`: once per batch.
    pub batch_bias_s: f64,
    /// `n_prefill` and `n_decode`: once per entry (refill entries aside).
    pub entry_overhead_s: f64,
    /// `tokens`: per token processed (recomputed tokens aside).
    pub linear_tokens_s: f64,
    /// `decode_kv`, `prefill_attn`, `prefill_ctx` (recomputed tokens aside).
    pub attention_s: f64,
    /// Re-processing tokens whose KV an eviction dropped.
    pub recomputation_s: f64,
    /// Time with no batch running (waiting for arrivals).
    pub idle_s: f64,
}

/// The terms' names, in [`TimeBreakdown::terms`] order (as written in CSV headers and
/// tables).
pub const TERM_NAMES: [&str; 6] = [
    "batch_bias",
    "entry_overhead",
    "linear_tokens",
    "attention",
    "recomputation",
    "idle",
];

impl TimeBreakdown {
    /// The breakdown of `schedule`, whose replay under `cost` is `replay` (the schedule
    /// must be the one replayed: entries are matched to the replay's batches in order).
    pub fn of(
        cost: &LinearCostModel,
        workload: &Workload,
        schedule: &Schedule,
        replay: &Replay,
    ) -> Self {
        let theta = |f: Feature| cost.theta(f);
        let reqs = workload.requests();
        let mut held = vec![0u64; reqs.len()];
        let mut owed = vec![0u64; reqs.len()];
        let mut b = TimeBreakdown::default();
        let classified = classify_entries(workload, schedule);
        for (batch, entries) in schedule.batches.iter().zip(&classified) {
            let mut processed = false;
            // Entries in schedule order; classify_entries skips nothing for a replayed
            // schedule, so the two lists align.
            for (entry, c) in batch.entries.iter().zip(entries) {
                let i = c.request as usize;
                if entry.cached > 0 && held[i] == 0 {
                    let hit = u64::from(entry.cached);
                    held[i] = hit;
                    owed[i] -= owed[i].min(hit);
                }
                match (entry.action, c.kind) {
                    (Action::Receive, _) | (_, EntryKind::Receive) => {
                        held[i] = u64::from(entry.cached);
                    }
                    (Action::Evict, _) | (_, EntryKind::Evict) => {
                        owed[i] += held[i];
                        held[i] = 0;
                    }
                    (Action::Process(_), EntryKind::Decode) => {
                        processed = true;
                        held[i] += 1;
                        b.entry_overhead_s += theta(Feature::NDecode);
                        b.linear_tokens_s += theta(Feature::Tokens);
                        b.attention_s += theta(Feature::DecodeKv) * held[i] as f64;
                    }
                    (Action::Process(_), EntryKind::Prefill) => {
                        processed = true;
                        let (m, k) = (held[i] as f64, u64::from(c.tokens));
                        let r = owed[i].min(k);
                        owed[i] -= r;
                        let (rf, kf) = (r as f64, k as f64);
                        let attn = |from: f64, to: f64| {
                            theta(Feature::PrefillAttn) * (to * to - from * from)
                        };
                        let whole_refill = r == k;
                        let fixed = theta(Feature::NPrefill) + theta(Feature::PrefillCtx) * m;
                        b.recomputation_s += theta(Feature::Tokens) * rf
                            + attn(m, m + rf)
                            + if whole_refill { fixed } else { 0.0 };
                        b.linear_tokens_s += theta(Feature::Tokens) * (kf - rf);
                        b.attention_s += attn(m + rf, m + kf);
                        if !whole_refill {
                            b.entry_overhead_s += theta(Feature::NPrefill);
                            b.attention_s += theta(Feature::PrefillCtx) * m;
                        }
                        held[i] += k;
                    }
                }
            }
            if processed {
                let has = |kind| entries.iter().any(|e| e.kind == kind);
                b.batch_bias_s += theta(Feature::One)
                    + if has(EntryKind::Prefill) {
                        theta(Feature::HasPrefill)
                    } else {
                        0.0
                    }
                    + if has(EntryKind::Decode) {
                        theta(Feature::HasDecode)
                    } else {
                        0.0
                    };
            }
        }
        let busy: f64 = replay.batches.iter().map(|r| r.duration_s()).sum();
        b.idle_s = (replay.makespan_s() - busy).max(0.0);
        b
    }

    /// The terms in [`TERM_NAMES`] order.
    pub fn terms(&self) -> [f64; 6] {
        [
            self.batch_bias_s,
            self.entry_overhead_s,
            self.linear_tokens_s,
            self.attention_s,
            self.recomputation_s,
            self.idle_s,
        ]
    }

    /// The sum of the terms: the makespan.
    pub fn total_s(&self) -> f64 {
        self.terms().iter().sum()
    }

    /// Term by term, `self` plus `other` (replicas' splits summed: GPU-seconds).
    pub fn plus(&self, other: &TimeBreakdown) -> TimeBreakdown {
        TimeBreakdown {
            batch_bias_s: self.batch_bias_s + other.batch_bias_s,
            entry_overhead_s: self.entry_overhead_s + other.entry_overhead_s,
            linear_tokens_s: self.linear_tokens_s + other.linear_tokens_s,
            attention_s: self.attention_s + other.attention_s,
            recomputation_s: self.recomputation_s + other.recomputation_s,
            idle_s: self.idle_s + other.idle_s,
        }
    }

    /// Term by term, `self` minus `other` (what a schedule spends more than another);
    /// differences under 1e-12 s (rounding) are 0.
    pub fn minus(&self, other: &TimeBreakdown) -> [f64; 6] {
        let (a, b) = (self.terms(), other.terms());
        std::array::from_fn(|k| {
            let d = a[k] - b[k];
            if d.abs() < 1e-12 { 0.0 } else { d }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{Batch, Entry, Limits, Request, replay};

    fn cost() -> LinearCostModel {
        crate::preset("llama2-7b-a100").expect("bundled preset")
    }

    fn workload() -> Workload {
        let r = |i, o, t| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        };
        Workload::new(vec![r(8, 3, 0.0), r(4, 2, 0.5)]).expect("valid workload")
    }

    #[test]
    fn the_terms_add_up_to_the_makespan_and_refills_count_as_recomputation() {
        let w = workload();
        let c = cost();
        // Request 0 prefills in two chunks, decodes, is evicted, refills its 9 tokens and
        // finishes; request 1 arrives later (the GPU idles until then) and runs alone.
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 5)]),
            Batch::new(vec![Entry::process(0, 3)]),
            Batch::new(vec![Entry::process(0, 1)]),
            Batch::new(vec![Entry::evict(0)]),
            Batch::new(vec![Entry::process(0, 10)]),
            Batch::new(vec![Entry::process(1, 4)]),
            Batch::new(vec![Entry::process(1, 1)]),
        ]);
        let limits = Limits::unlimited();
        let r = replay(&w, &limits, &c, &s).expect("valid schedule");
        let b = TimeBreakdown::of(&c, &w, &s, &r);
        let makespan = r.makespan_s();
        assert!((b.total_s() - makespan).abs() < 1e-12 * makespan.max(1.0));
        // Request 1 arrives at 0.5 s, after request 0 is done: idle is that gap.
        let first_end = r.batches[4].end_s;
        assert!((b.idle_s - (0.5 - first_end)).abs() < 1e-12, "{b:?}");
        // The refill re-processes the 9 evicted tokens out of 10 (not the whole entry):
        // 9 tokens and the attention pairs of positions 0..9.
        let t = |f| c.theta(f);
        let expected = 9.0 * t(Feature::Tokens) + 81.0 * t(Feature::PrefillAttn);
        assert!((b.recomputation_s - expected).abs() < 1e-15, "{b:?}");
        assert_eq!(r.requests[0].recomputed_tokens, 9);
        // Six batches process tokens: one bias each, prefill or decode flag as the kind.
        let bias =
            6.0 * t(Feature::One) + 4.0 * t(Feature::HasPrefill) + 2.0 * t(Feature::HasDecode);
        assert!((b.batch_bias_s - bias).abs() < 1e-15, "{b:?}");
    }

    #[test]
    fn a_refill_in_whole_entries_takes_their_fixed_costs_too() {
        let w = workload();
        let c = cost();
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 8)]),
            Batch::new(vec![Entry::evict(0)]),
            Batch::new(vec![Entry::process(0, 4)]),
            Batch::new(vec![Entry::process(0, 5)]),
            Batch::new(vec![Entry::process(0, 1)]),
            Batch::new(vec![Entry::process(1, 4)]),
            Batch::new(vec![Entry::process(1, 1)]),
        ]);
        let r = replay(&w, &Limits::unlimited(), &c, &s).expect("valid schedule");
        let b = TimeBreakdown::of(&c, &w, &s, &r);
        let t = |f| c.theta(f);
        // 8 tokens owed: the 4-token entry is all refill (its n_prefill, context 0), the
        // 5-token one refills 4 from context 4 and adds the first token's position.
        let expected =
            8.0 * t(Feature::Tokens) + 64.0 * t(Feature::PrefillAttn) + t(Feature::NPrefill);
        assert!((b.recomputation_s - expected).abs() < 1e-15, "{b:?}");
        assert!((b.total_s() - r.makespan_s()).abs() < 1e-12);
    }
}
