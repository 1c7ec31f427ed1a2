//! The mean-busy-time bound on the sum of completion times (milp.md, "The mean-busy-time
//! bound"): the single-machine relaxation of module `bounds::machine`, kept with *where in
//! time* each request's share is processed.
//!
//! Lay every batch's entries' shares one after the other inside the batch, as the machine
//! relaxation does (a share is the entry's cost plus its part of the bias by the KV,
//! running-set and token limits it uses, weights `λ`). Request `j` then has these *pieces*
//! on the one machine:
//!
//! * its prompt's entries, at least the machine relaxation's first-token job (the prompt's
//!   work, `b (λ_M I / M + λ_R / R + λ_C I / C)` and the prefill flag's surplus), all
//!   processed after its arrival and before its first token;
//! * for each later token `k = 1 .. O - 1`, the entry generating it (a decode, a chunk or a
//!   refill), at least `s_k = w_k + b (λ_M (I + k) / M + λ_R / R + λ_C / C)`, inside its own
//!   batch `B_k`; the batches `B_1 .. B_{O-1}` come one after the other, each lasting at
//!   least `d_l = b + w_l` (its bias and that entry).
//!
//! So piece `k` is processed no earlier than `T_j + own first-token time + d_1 + .. +
//! d_{k-1}` (its release) and, being contiguous and inside `B_k`, its mean busy time `M_k`
//! is at most `end(B_k) - s_k / 2`, while `C_j >= end(B_k) + d_{k+1} + .. + d_{O-1}`
//! (`tail_k`). The prompt's pieces, `m_0` in all, are processed at rate at most 1 and end
//! by the first token, so their mean busy time is at most `C_j - tail_0 - m_0 / 2`.
//! Averaging these with weights `mass / p_j` (`p_j` the sum of `j`'s pieces):
//! `C_j >= sum_k (s_k / p_j) (M_k + s_k / 2 + tail_k)` (the prompt with `m_0 / 2 + tail_0`).
//!
//! The pieces are jobs of one machine with release dates; `sum_k (s_k / p_j) M_k` is a
//! weighted sum of mean busy times whose weight-to-processing ratio is `1 / p_j` for all of
//! `j`'s pieces, and the preemptive schedule that always processes the released piece of
//! the highest ratio (the request of least `p_j`) minimizes such a sum over every
//! preemptive schedule (Goemans, Queyranne, Schulz, Skutella and Wang, "Single machine
//! scheduling with release dates", 2002). So its sum is a lower bound, and so is the sum of
//! completions it implies.
//!
//! What it adds to the machine bound: a request's share is spread over its `O` batches
//! rather than done at once, so a request that holds half the memory for a long decode
//! delays the others by that whole decode, not by its share; under memory-bound bursts of
//! long outputs this is most of the queueing the machine bound misses.
//!
//! Long outputs are cut into at most `MAX_PIECES / n` groups of consecutive tokens per
//! request, which keeps the bound valid and its cost bounded whatever the lengths: a
//! group's release is its first token's, and its offset the larger of half its mass (its
//! pieces end by its last batch, at rate at most 1) and what its first token's piece and
//! batch guarantee (every later piece is at least as large, every later batch as long).
//!
//! Measured (`solve`, 60 s, 2 threads): offline arXiv n = 128 (README family (c)), mean
//! latency, bound 20.955 -> 21.190 s (certified gap 14.1% -> 13.1%); 64 arXiv requests at
//! 2 QPS with M = 20,000 (10 s), 50.2% -> 46.2%. Where prompts dominate (Splitwise) the
//! shortest-remaining-first positions stay stronger.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use infersched_core::{Limits, Request};

use super::Theta;
use super::machine::{
    JobEnd, JobNeeds, Remaining, bias_fraction, block_area_prefix, entries_per_batch, in_blocks,
    machine_weights,
};

/// The most pieces the bound lays out in all (so at most `MAX_PIECES / n` groups of later
/// tokens per request).
const MAX_PIECES: usize = 1 << 19;

/// Consecutive later tokens `a ..= z` of one request: what their pieces need, before the
/// weights apply.
#[derive(Debug, Clone, Copy)]
struct TokenGroup {
    /// Tokens in the group.
    count: f64,
    /// Their entries' least work.
    work: f64,
    /// KV tokens their entries hold, summed.
    kv: f64,
    /// The first token's entry's least work and KV tokens.
    first_work: f64,
    first_kv: f64,
    /// When the first token's entry can start at the earliest (absolute seconds).
    release: f64,
    /// The least time from the last token's batch to the request's completion.
    tail: f64,
}

/// One request's pieces, before the weights apply.
#[derive(Debug, Clone)]
struct RequestPieces {
    arrival: f64,
    /// Its prompt's entries, as the machine relaxation's first-token job.
    prompt: JobNeeds,
    /// The least time from the first token to the completion (`tail_0`).
    later_time: f64,
    groups: Vec<TokenGroup>,
}

impl RequestPieces {
    fn of(t: &Theta<'_>, r: &Request, limits: &Limits, max_groups: u32) -> Self {
        let (i, o) = (u64::from(r.input_tokens), r.output_tokens);
        let b = t.batch_bias();
        let block = u64::from(limits.block_size.max(1));
        let first_token = r.arrival_s + t.own_first_token_time(r, limits);
        // The least time of the batches generating tokens from..=to.
        let batches_time = |from: u32, to: u32| {
            f64::from(to.saturating_sub(from) + u32::from(to >= from)) * b
                + t.later_tokens_work_between(r, from, to)
        };
        let later = o.saturating_sub(1);
        let n_groups = later.min(max_groups.max(1));
        let groups = (0..n_groups)
            .map(|g| {
                // Tokens a..=z, the `g`-th of `n_groups` near-equal ranges of 1..=later.
                let a = 1 + (u64::from(later) * u64::from(g) / u64::from(n_groups)) as u32;
                let z = (u64::from(later) * u64::from(g + 1) / u64::from(n_groups)) as u32;
                TokenGroup {
                    count: f64::from(z - a + 1),
                    work: t.later_tokens_work_between(r, a, z),
                    kv: (block_area_prefix(i + u64::from(z), block)
                        - block_area_prefix(i + u64::from(a) - 1, block))
                        as f64,
                    first_work: t.later_token_work(r, a),
                    first_kv: in_blocks(i + u64::from(a), limits) as f64,
                    release: first_token + batches_time(1, a - 1),
                    tail: batches_time(z + 1, later),
                }
            })
            .collect();
        Self {
            arrival: r.arrival_s,
            prompt: JobNeeds::of(t, r, limits, JobEnd::FirstToken),
            later_time: batches_time(1, later),
            groups,
        }
    }
}

/// A piece on the machine: released at `release`, `mass` of processing, and the least time
/// from its mean busy time to its request's completion (`offset`); `weight` is its share
/// of its request's convex combination.
#[derive(Debug, Clone, Copy)]
struct Piece {
    release: f64,
    mass: f64,
    offset: f64,
    weight: f64,
}

/// A lower bound on any valid schedule's sum of completion times (of the last tokens,
/// absolute seconds), the best over the machine relaxation's weights; None where a cost
/// coefficient is negative or not finite (the pieces' order arguments need costs growing
/// with the tokens known).
pub(super) fn sum_of_completions(t: &Theta<'_>, reqs: &[Request], limits: &Limits) -> Option<f64> {
    if reqs.is_empty() || !t.non_negative() {
        return None;
    }
    let max_groups = u32::try_from((MAX_PIECES / reqs.len()).max(1)).unwrap_or(u32::MAX);
    let requests: Vec<RequestPieces> = reqs
        .iter()
        .map(|r| RequestPieces::of(t, r, limits, max_groups))
        .collect();
    let entries_per_batch = entries_per_batch(limits, reqs.len());
    let b = t.batch_bias();
    let mut best: Option<f64> = None;
    for (lambda, split) in machine_weights(limits) {
        let share = |kv: f64, tokens: f64, entries: f64| {
            b * bias_fraction(limits, lambda, entries_per_batch, kv, entries, tokens)
        };
        let mut pieces = Vec::new();
        for q in &requests {
            let start = pieces.len();
            let prompt_mass = q
                .prompt
                .processing(t, limits, lambda, entries_per_batch, split);
            pieces.push(Piece {
                release: q.arrival,
                mass: prompt_mass,
                offset: q.later_time + prompt_mass / 2.0,
                weight: 0.0,
            });
            pieces.extend(q.groups.iter().map(|g| {
                let mass = g.work + share(g.kv, g.count, g.count);
                // Each token's piece is at least the first's, and the batches after it in
                // the group each last at least the first's batch.
                let first = g.first_work + share(g.first_kv, 1.0, 1.0);
                let spread = if mass > 0.0 {
                    first * (b + g.first_work) * g.count * (g.count - 1.0) / (2.0 * mass)
                } else {
                    0.0
                };
                Piece {
                    release: g.release,
                    mass,
                    offset: g.tail + (first / 2.0 + spread).max(mass / 2.0),
                    weight: 0.0,
                }
            }));
            weigh(&mut pieces[start..]);
        }
        let bound = weighted_busy_time_bound(&pieces);
        best = Some(best.map_or(bound, |b: f64| b.max(bound)));
    }
    best
}

/// Sets one request's pieces' weights: each its share of the request's mass (every unit of
/// processing weighs alike, so all its pieces have the same ratio `1 / p_j`); all on the
/// last piece where there is no mass.
fn weigh(pieces: &mut [Piece]) {
    let total: f64 = pieces.iter().map(|p| p.mass.max(0.0)).sum();
    let last = pieces.len() - 1;
    for (k, p) in pieces.iter_mut().enumerate() {
        p.weight = if total > 0.0 {
            p.mass.max(0.0) / total
        } else {
            f64::from(u8::from(k == last))
        };
    }
}

/// `sum_k weight_k (M_k + offset_k)` with `M_k` the mean busy times of the preemptive
/// schedule that always runs the released piece of the largest `weight / mass` (ties by
/// index): the least `sum_k weight_k M_k` over every preemptive schedule of the pieces on
/// one machine (see the module documentation). A piece of no mass counts from its release.
fn weighted_busy_time_bound(pieces: &[Piece]) -> f64 {
    let mut bound = 0.0;
    let mut order: Vec<usize> = Vec::with_capacity(pieces.len());
    for (k, p) in pieces.iter().enumerate() {
        if p.mass > 0.0 {
            bound += p.weight * p.offset;
            order.push(k);
        } else {
            bound += p.weight * (p.release + p.offset);
        }
    }
    order.sort_by(|&a, &b| {
        pieces[a]
            .release
            .total_cmp(&pieces[b].release)
            .then(a.cmp(&b))
    });
    let mut left: Vec<f64> = pieces.iter().map(|p| p.mass).collect();
    // Largest ratio first: the least negated ratio.
    let mut ready: BinaryHeap<Reverse<Remaining>> = BinaryHeap::new();
    let (mut now, mut next) = (f64::NEG_INFINITY, 0);
    loop {
        if ready.is_empty() {
            let Some(&k) = order.get(next) else {
                break;
            };
            now = now.max(pieces[k].release);
        }
        while let Some(&k) = order.get(next) {
            if pieces[k].release > now {
                break;
            }
            ready.push(Reverse(Remaining(-pieces[k].weight / pieces[k].mass, k)));
            next += 1;
        }
        let Some(&Reverse(Remaining(_, k))) = ready.peek() else {
            continue;
        };
        let next_release = order
            .get(next)
            .map_or(f64::INFINITY, |&n| pieces[n].release);
        let run = left[k].min(next_release - now);
        bound += pieces[k].weight / pieces[k].mass * run * (now + run / 2.0);
        now += run;
        left[k] -= run;
        if left[k] <= 0.0 {
            ready.pop();
        }
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn piece(release: f64, mass: f64, offset: f64, weight: f64) -> Piece {
        Piece {
            release,
            mass,
            offset,
            weight,
        }
    }

    #[test]
    fn pieces_by_hand() {
        // One request, two pieces of 1 at 0 and 5, offsets 2 and 0, half the weight each:
        // processed at [0, 1] and [5, 6], busy times 0.5 and 5.5, bound
        // (0.5 + 2 + 5.5 + 0) / 2 = 4.
        let one = [piece(0.0, 1.0, 2.0, 0.5), piece(5.0, 1.0, 0.0, 0.5)];
        assert!((weighted_busy_time_bound(&one) - 4.0).abs() < 1e-12);
        // Two requests of one piece each at 0: the larger ratio (mass 1) first at [0, 1],
        // the other (3) at [1, 4]: 0.5 + 2.5 = 3.
        let two = [piece(0.0, 3.0, 0.0, 1.0), piece(0.0, 1.0, 0.0, 1.0)];
        assert!((weighted_busy_time_bound(&two) - 3.0).abs() < 1e-12);
        // The shorter arrives at 1 and preempts: the long one runs [0, 1] and [2, 4], mean
        // busy time (1 * 0.5 + 2 * 3) / 3; the short one [1, 2], 1.5.
        let preempt = [piece(0.0, 3.0, 0.0, 1.0), piece(1.0, 1.0, 0.0, 1.0)];
        let expect = (0.5 + 6.0) / 3.0 + 1.5;
        assert!((weighted_busy_time_bound(&preempt) - expect).abs() < 1e-12);
        // A piece with nothing to process counts from its release.
        let empty = [piece(2.0, 0.0, 1.0, 1.0)];
        assert!((weighted_busy_time_bound(&empty) - 3.0).abs() < 1e-12);
        assert_eq!(weighted_busy_time_bound(&[]), 0.0);
    }

    #[test]
    fn weights_follow_the_mass_and_sum_to_one() {
        let mut p = [
            piece(0.0, 2.0, 0.0, 0.0),
            piece(1.0, 1.0, 0.0, 0.0),
            piece(2.0, 1.0, 0.0, 0.0),
        ];
        weigh(&mut p);
        let w: Vec<f64> = p.iter().map(|p| p.weight).collect();
        assert_eq!(w, vec![0.5, 0.25, 0.25]);
        let mut nothing = [piece(0.0, 0.0, 0.0, 0.0), piece(1.0, 0.0, 0.0, 0.0)];
        weigh(&mut nothing);
        assert_eq!([nothing[0].weight, nothing[1].weight], [0.0, 1.0]);
    }

    /// `sum_k weight_k (M_k + offset_k)` of a fixed preemptive priority order of the
    /// pieces, simulated on a fine time grid.
    fn priority_order_sum(pieces: &[Piece], order: &[usize]) -> f64 {
        let mut left: Vec<f64> = pieces.iter().map(|p| p.mass).collect();
        let mut sum: f64 = pieces.iter().map(|p| p.weight * p.offset).sum();
        let dt = 1e-3;
        let mut now = 0.0;
        while left.iter().any(|&l| l > 1e-12) {
            let run = order
                .iter()
                .copied()
                .find(|&k| left[k] > 1e-12 && pieces[k].release <= now + 1e-9);
            if let Some(k) = run {
                let step = left[k].min(dt);
                sum += pieces[k].weight / pieces[k].mass * step * (now + step / 2.0);
                left[k] -= step;
                now += step;
            } else {
                now += dt;
            }
        }
        sum
    }

    /// Every permutation of `0..n` (n small).
    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        permutations(n - 1)
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |at| {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    q
                })
            })
            .collect()
    }

    #[test]
    fn the_largest_ratio_first_is_no_worse_than_any_priority_order() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..40 {
            let n = rng.random_range(1..5);
            let pieces: Vec<Piece> = (0..n)
                .map(|_| {
                    piece(
                        f64::from(rng.random_range(0..8u32)) * 0.25,
                        f64::from(rng.random_range(1..5u32)) * 0.125,
                        f64::from(rng.random_range(0..3u32)),
                        f64::from(rng.random_range(1..5u32)) * 0.25,
                    )
                })
                .collect();
            let greedy = weighted_busy_time_bound(&pieces);
            for order in permutations(n) {
                let other = priority_order_sum(&pieces, &order);
                assert!(
                    greedy <= other + 1e-6,
                    "{pieces:?} {order:?}: {greedy} vs {other}"
                );
            }
        }
    }
}
