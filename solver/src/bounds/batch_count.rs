//! The batch-count position bound: the machine relaxation lets a request's batches share
//! their bias with up to `R` others, which under a burst hides most of the bias a request
//! decoding (nearly) alone pays. This argument pays every batch's whole bias instead, and
//! counts batches rather than sharing them.
//!
//! Take any schedule, a time `τ`, and the first `m` requests to complete (or to get their
//! first token), `S`. At most `before(τ)` of them arrived before `τ`, so at least
//! `k = m - before(τ)` arrived at or after it; each of those, `i`, takes part in at least
//! `nb_i` batches after its arrival (`ceil(I / min(C, P))` for its prompt, then one per
//! later token), and their entries cost at least their least work `w_i`. All of that lies
//! between `τ` and the `m`-th completion, and batches run one after another, each costing
//! its bias `b` besides its entries, so
//!
//! `C_(m) >= τ + min over sets K of k requests arriving at or after τ of
//!            (b max_{i in K} nb_i + sum_{i in K} w_i)`,
//!
//! where `b` is the least bias `one + min(has_prefill, has_decode)`. For the last token, a
//! batch holding prompt tokens pays `s = max(has_prefill - has_decode, 0)` more and holds
//! at most `min(C, P)` of them, so `K`'s prompts take at least `sum_{i in K} I_i / min(C,
//! P)` such batches: `w_i` carries `s I_i / min(C, P)` besides the least work (linear in
//! the set, so the minimum below stays exact).
//!
//! and the inner minimum is exact by trying each value `o` of the largest `nb` and taking
//! the `k` least `w` among the requests with `nb <= o`. Over the arrival times as `τ`, the
//! per-position maximum joins the machine's position bounds.

use super::Theta;
use super::machine::JobEnd;
use infersched_core::{Feature, Limits, Request};

/// Most release times tried as `τ` (evenly spread over the distinct arrivals; any subset
/// gives a valid bound).
const MAX_RELEASES: usize = 64;

/// Most thresholds on the largest batch count per release (batch counts are bucketed
/// beyond it: a set whose largest count falls in a bucket pays the bucket's least).
const MAX_THRESHOLDS: usize = 256;

/// Per position `k` (0-based), a bound on any schedule's `(k + 1)`-th smallest completion
/// of the last (or first) token, in absolute seconds; `-inf` where the argument says
/// nothing.
pub(super) fn batch_count_positions(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    end: JobEnd,
) -> Vec<f64> {
    let n = reqs.len();
    let mut best = vec![f64::NEG_INFINITY; n];
    if n == 0 {
        return best;
    }
    let chunk = limits
        .token_budget
        .unwrap_or(u64::MAX)
        .min(limits.prefill_budget.unwrap_or(u64::MAX))
        .max(1);
    let (bias, needs) = bias_and_needs(t, reqs, chunk, end);
    if bias <= 0.0 && needs.iter().all(|&(_, w)| w <= 0.0) {
        return best;
    }
    for tau in sampled_releases(reqs) {
        let after: Vec<(u64, f64)> = reqs
            .iter()
            .zip(&needs)
            .filter(|(r, _)| r.arrival_s >= tau)
            .map(|(_, &need)| need)
            .collect();
        let before = n - after.len();
        for (k, value) in least_sets(after, bias).into_iter().enumerate() {
            let position = before + k;
            best[position] = best[position].max(tau + value);
        }
    }
    best
}

/// The least bias any batch pays, and per request the batches it takes part in and the
/// least work of its entries, through its first token or its last.
fn bias_and_needs(
    t: &Theta<'_>,
    reqs: &[Request],
    chunk: u64,
    end: JobEnd,
) -> (f64, Vec<(u64, f64)>) {
    match end {
        // Every batch of a prompt has a prefill entry.
        JobEnd::FirstToken => (
            t.get(Feature::One) + t.get(Feature::HasPrefill),
            reqs.iter()
                .map(|r| {
                    (
                        u64::from(r.input_tokens).div_ceil(chunk),
                        t.first_token_work(r),
                    )
                })
                .collect(),
        ),
        // Besides the bias of every batch, the batches with prompt tokens pay the prefill
        // flag's surplus over it, and hold at most `min(C, P)` prompt tokens each: at least
        // `sum I / min(C, P)` of them, so each prompt token carries `surplus / min(C, P)`.
        JobEnd::LastToken => {
            let surplus = (t.get(Feature::HasPrefill) - t.get(Feature::HasDecode)).max(0.0);
            let per_prompt_token = surplus / chunk as f64;
            (
                t.batch_bias(),
                reqs.iter()
                    .map(|r| {
                        (
                            u64::from(r.input_tokens).div_ceil(chunk) + u64::from(r.output_tokens)
                                - 1,
                            t.request_work(r) + per_prompt_token * f64::from(r.input_tokens),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// The release times tried as `τ`: the distinct arrivals, at most [`MAX_RELEASES`] of them
/// evenly spread.
fn sampled_releases(reqs: &[Request]) -> Vec<f64> {
    let mut releases: Vec<f64> = reqs.iter().map(|r| r.arrival_s).collect();
    releases.sort_by(f64::total_cmp);
    releases.dedup();
    if releases.len() <= MAX_RELEASES {
        return releases;
    }
    (0..MAX_RELEASES)
        .map(|j| releases[j * (releases.len() - 1) / (MAX_RELEASES - 1)])
        .collect()
}

/// For the requests `after` (batch count, least work) arriving at or after `τ`: per `k`,
/// the least over sets of `k + 1` of them of `bias x (their largest count) + their works`
/// (the time from `τ` their last completion takes at least).
fn least_sets(mut after: Vec<(u64, f64)>, bias: f64) -> Vec<f64> {
    // Bucket boundaries on the batch counts: each bucket is the range (lo, hi]; a set whose
    // largest count is in it pays at least the bias times its least count and has its
    // members among the requests with counts up to hi.
    let mut counts: Vec<u64> = after.iter().map(|a| a.0).collect();
    counts.sort_unstable();
    counts.dedup();
    let his: Vec<u64> = if counts.len() <= MAX_THRESHOLDS {
        counts.clone()
    } else {
        let mut v: Vec<u64> = (1..=MAX_THRESHOLDS)
            .map(|j| counts[j * counts.len() / MAX_THRESHOLDS - 1])
            .collect();
        v.dedup();
        v
    };
    // In order of work, a bucket's k least works are its first k members.
    after.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut least = vec![f64::INFINITY; after.len()];
    let mut lo = 0u64;
    for hi in his {
        // The least count in (lo, hi] (hi is a count, so there is one).
        let pay = counts[counts.partition_point(|&c| c <= lo)];
        let mut sum = 0.0;
        for (k, &(_, w)) in after.iter().filter(|a| a.0 <= hi).enumerate() {
            sum += w;
            least[k] = least[k].min(bias * pay as f64 + sum);
        }
        lo = hi;
    }
    least
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_cost_model::LinearCostModel;

    fn cost() -> LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    #[test]
    fn one_request_needs_its_batches_and_work() {
        let c = cost();
        let t = Theta(&c);
        let r = Request {
            input_tokens: 100,
            output_tokens: 5,
            arrival_s: 2.0,
        };
        let limits = Limits {
            token_budget: Some(40),
            ..Limits::unlimited()
        };
        let b = batch_count_positions(&t, &[r], &limits, JobEnd::LastToken);
        // 3 prompt chunks of at most 40, then 4 later tokens: 7 batches; at least 100 / 40
        // of them pay the prefill flag's surplus.
        let surplus = t.get(Feature::HasPrefill) - t.get(Feature::HasDecode);
        assert!(surplus > 0.0);
        let expect = 2.0 + 7.0 * t.batch_bias() + surplus * 100.0 / 40.0 + t.request_work(&r);
        assert!((b[0] - expect).abs() < 1e-12, "{b:?} vs {expect}");
        let f = batch_count_positions(&t, &[r], &limits, JobEnd::FirstToken);
        let expect =
            2.0 + 3.0 * (t.get(Feature::One) + t.get(Feature::HasPrefill)) + t.first_token_work(&r);
        assert!((f[0] - expect).abs() < 1e-12);
    }

    #[test]
    fn positions_take_the_cheapest_sets_after_each_release() {
        let c = cost();
        let t = Theta(&c);
        // Two long-decoding requests at 0 and a short one at 1: the first completion is
        // at least the cheapest single request from 0, the second pays the larger batch
        // count of the cheapest pair; from τ = 1 only the short one counts, at position 3.
        let reqs = [
            Request {
                input_tokens: 8,
                output_tokens: 50,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 8,
                output_tokens: 40,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 8,
                output_tokens: 2,
                arrival_s: 1.0,
            },
        ];
        let b = batch_count_positions(&t, &reqs, &Limits::unlimited(), JobEnd::LastToken);
        let own = |r: &Request| f64::from(r.output_tokens) * t.batch_bias() + t.request_work(r);
        // Position 1 (from τ = 0): the short request alone, its 2 batches and work.
        assert!((b[0] - own(&reqs[2])).abs() < 1e-12, "{b:?}");
        // Position 2 (from τ = 0; from τ = 1 only the third position is reached): the two
        // cheapest are the short one and the 40-output one, 40 batches and both works.
        let pair = 40.0 * t.batch_bias() + t.request_work(&reqs[1]) + t.request_work(&reqs[2]);
        assert!((b[1] - pair).abs() < 1e-12, "{b:?}");
        // Position 3: all three from 0.
        let all = 50.0 * t.batch_bias() + reqs.iter().map(|r| t.request_work(r)).sum::<f64>();
        assert!((b[2] - all.max(1.0 + own(&reqs[2]))).abs() < 1e-12, "{b:?}");
    }
}
