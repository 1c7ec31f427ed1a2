//! First tokens in classes without evictions (milp.md, "Memory held to completion"):
//! a started request keeps its KV until it completes, so first tokens wait for
//! completions.
//!
//! Without evictions (`--no-evict`, and Orca's reservations) a request whose first token
//! has come holds at least its prompt's KV (in blocks; under reservations its whole
//! `I + O - 1` from its first step) until its last token. After the batch giving the k-th
//! first token, every one of those k requests that has not completed holds that much, and
//! together at most `M` and at most `R_max` of them: at most `K` requests, `K` the most
//! whose least holdings fit (the smallest first). So at least `k - K` of them have
//! completed by then: the k-th smallest first-token time is at least the `(k - K)`-th
//! smallest completion time, which the machine relaxation's position bounds for the last
//! tokens bound. With evictions a request can free its memory after its first token and
//! come back later, so none of this holds there.

use infersched_core::{Limits, Request};

use super::Theta;
use super::machine::{JobEnd, JobNeeds, entries_per_batch, machine_weights};

/// How many requests can hold memory at once after their first tokens: the most whose
/// least holdings (the prompt's blocks, or the reservation `I + O - 1`) fit in `M`, and at
/// most `R_max`; `n` where neither is set.
pub(super) fn most_holding_at_once(reqs: &[Request], limits: &Limits, reserve: bool) -> usize {
    let mut held: Vec<u64> = reqs
        .iter()
        .map(|r| {
            limits.occupied(if reserve {
                r.max_kv_tokens()
            } else {
                u64::from(r.input_tokens)
            })
        })
        .collect();
    held.sort_unstable();
    let by_memory = limits.kv_capacity.map_or(reqs.len(), |m| {
        let mut total = 0u64;
        held.iter()
            .take_while(|&&h| {
                total = total.saturating_add(h);
                total <= m
            })
            .count()
    });
    let by_running = limits
        .max_running
        .map_or(reqs.len(), |r| usize::try_from(r).unwrap_or(usize::MAX));
    by_memory.min(by_running)
}

/// Raises the first-token position bounds (`first[k]`: the `(k + 1)`-th smallest first-token
/// time) by the completions they wait for: `first[k] >= last[k - held]` where `last[k]`
/// bounds the `(k + 1)`-th smallest completion and at most `held` requests hold memory at
/// once after their first tokens.
pub(super) fn first_tokens_after_completions(first: &mut [f64], last: &[f64], held: usize) {
    for (k, f) in first.iter_mut().enumerate().skip(held) {
        if let Some(&c) = last.get(k - held) {
            *f = f.max(c);
        }
    }
}

/// Per position `k`, a bound on the `(k + 1)`-th smallest first-token time from the work
/// done by then on the machine relaxation: the prompts of `k + 1` requests and everything
/// after the first tokens of at least `k + 1 - held` of them (those completed), all after
/// the first arrival. Each part is at least its least sum over any such set (the smallest
/// masses), whatever the set; the best over the machine's weights per position.
pub(super) fn first_tokens_after_completed_work(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    held: usize,
) -> Vec<f64> {
    let n = reqs.len();
    let first_arrival = reqs
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let entries_per_batch = entries_per_batch(limits, n);
    let needs: Vec<(JobNeeds, JobNeeds)> = reqs
        .iter()
        .map(|r| {
            (
                JobNeeds::of(t, r, limits, JobEnd::FirstToken),
                JobNeeds::of(t, r, limits, JobEnd::LastToken),
            )
        })
        .collect();
    let mut best = vec![f64::NEG_INFINITY; n];
    for (lambda, split) in machine_weights(limits) {
        let mut prompts = Vec::with_capacity(n);
        let mut later = Vec::with_capacity(n);
        for (first, last) in &needs {
            let p = first.processing(t, limits, lambda, entries_per_batch, split);
            let whole = last.processing(t, limits, lambda, entries_per_batch, split);
            prompts.push(p);
            later.push((whole - p).max(0.0));
        }
        prompts.sort_by(f64::total_cmp);
        later.sort_by(f64::total_cmp);
        let (mut prompt_sum, mut later_sum) = (0.0, 0.0);
        for k in 0..n {
            prompt_sum += prompts[k];
            if k >= held {
                later_sum += later[k - held];
            }
            best[k] = best[k].max(first_arrival + prompt_sum + later_sum);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(i: u32, o: u32) -> Request {
        Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: 0.0,
        }
    }

    #[test]
    fn the_smallest_holdings_fill_memory_first() {
        let reqs = [r(100, 50), r(30, 10), r(60, 200), r(200, 1)];
        let limits = Limits {
            kv_capacity: Some(200),
            block_size: 16,
            ..Limits::unlimited()
        };
        // Prompts in blocks: 32, 64, 112, 208: 32 + 64 + 112 = 208 > 200, so two.
        assert_eq!(most_holding_at_once(&reqs, &limits, false), 2);
        // Reservations I + O - 1 in blocks: 48, 160, 272, 208: only 48 + 160 = 208 > 200.
        assert_eq!(most_holding_at_once(&reqs, &limits, true), 1);
        let capped = Limits {
            max_running: Some(1),
            kv_capacity: None,
            ..limits
        };
        assert_eq!(most_holding_at_once(&reqs, &capped, false), 1);
        assert_eq!(most_holding_at_once(&reqs, &Limits::unlimited(), false), 4);
    }

    #[test]
    fn first_tokens_come_after_the_work_of_the_completed() {
        // Three identical requests at 0.5 with no limits but R = n: one machine weight, each
        // prompt's job p and the rest l; holding one at a time, the k-th first token needs
        // k prompts and k - 1 whole requests' later work.
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let req = Request {
            arrival_s: 0.5,
            ..r(100, 20)
        };
        let limits = Limits::unlimited();
        let lambda = [0.0, 1.0, 0.0];
        let split = super::super::machine::SurplusSplit::PromptsCompleted;
        let p = JobNeeds::of(&t, &req, &limits, JobEnd::FirstToken)
            .processing(&t, &limits, lambda, 3, split);
        let l = JobNeeds::of(&t, &req, &limits, JobEnd::LastToken)
            .processing(&t, &limits, lambda, 3, split)
            - p;
        let got = first_tokens_after_completed_work(&t, &[req; 3], &limits, 1);
        let expect = [0.5 + p, 0.5 + 2.0 * p + l, 0.5 + 3.0 * p + 2.0 * l];
        for (g, e) in got.iter().zip(expect) {
            assert!((g - e).abs() < 1e-12, "{got:?} vs {expect:?}");
        }
        // Holding all three: prompts alone.
        let all = first_tokens_after_completed_work(&t, &[req; 3], &limits, 3);
        assert!((all[2] - (0.5 + 3.0 * p)).abs() < 1e-12);
    }

    #[test]
    fn first_tokens_wait_for_the_completions_before_them() {
        let mut first = vec![1.0, 2.0, 3.0, 4.0];
        let last = [2.5, 5.0, 6.0, 7.0];
        first_tokens_after_completions(&mut first, &last, 2);
        // The third first token waits for the first completion, the fourth for the second.
        assert_eq!(first, vec![1.0, 2.0, 3.0, 5.0]);
        let mut all_held = vec![1.0, 2.0];
        first_tokens_after_completions(&mut all_held, &last, 2);
        assert_eq!(all_held, vec![1.0, 2.0]);
    }
}
