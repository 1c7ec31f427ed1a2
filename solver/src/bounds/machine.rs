//! The single-machine relaxation (milp.md, "The machine relaxation").
//!
//! Split every batch's time among its entries: a batch lasts at least its bias `b` plus
//! its entries' costs, and its entries together hold at most `M` KV tokens, number at
//! most `R = min(R_max, n)` (one entry per request) and process at most `C` tokens. So for
//! any weights `λ_M + λ_R + λ_C = 1`, `b >= b (λ_M kv_e / M + λ_R / R + λ_C c_e / C)`
//! summed over the entries `e`, and the batch's time covers each entry's *share*
//! `cost_e + b (λ_M kv_e / M + λ_R / R + λ_C c_e / C)` (plus, for batches completing
//! prompts, the prefill flag's surplus over `b` split among the prompts by the same mix of
//! their KV over `M` and `1 / R`; or, where `C` is set, split by `λ` itself with `λ_C` on
//! the prompt tokens of every prompt chunk over `min(C, P)`, each its own machine). Laying each batch's shares one after the other
//! inside the batch gives a preemptive schedule of one machine where request `i` is a job
//! released at its arrival `T_i` whose processing is at least `p_i`, the least total
//! share of its entries, and which completes no later than the request does.
//!
//! On one machine with release dates, shortest remaining processing first (SRPT) has, at
//! every instant, completed at least as many jobs as any other schedule (Schrage 1968), so
//! its k-th smallest completion time bounds every schedule's k-th smallest completion;
//! each request's own minimum time bounds its completion too, so the k-th smallest
//! completion is at least the larger of SRPT's k-th and the k-th smallest of
//! `T_i + own_i`. Summing gives the mean bounds; the last SRPT completion (all work done
//! after the release dates, in any order) gives the makespan bound.

use super::Theta;
use infersched_core::{Feature, Limits, Request};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Which token's completion a job ends at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobEnd {
    /// The request's last token (latency, makespan).
    LastToken,
    /// Its first token (TTFT).
    FirstToken,
}

/// Weights `(λ_M, λ_R, λ_C)` on the limits that are set, on a grid of quarters. The
/// running-set limit is always set: a batch holds at most one entry per request, so at
/// most `min(R_max, n)` entries.
fn weight_grid(limits: &Limits) -> Vec<[f64; 3]> {
    let present = [
        limits.kv_capacity.is_some(),
        true,
        limits.token_budget.is_some(),
    ];
    let mut grid = Vec::new();
    for a in 0..=4u32 {
        for r in 0..=4 - a {
            let c = 4 - a - r;
            let w = [f64::from(a) / 4.0, f64::from(r) / 4.0, f64::from(c) / 4.0];
            if w.iter().zip(present).all(|(&x, p)| p || x == 0.0) {
                grid.push(w);
            }
        }
    }
    grid
}

/// KV tokens a request holding `tokens` occupies (whole blocks).
pub(super) fn in_blocks(tokens: u64, limits: &Limits) -> u64 {
    let b = u64::from(limits.block_size.max(1));
    tokens.div_ceil(b) * b
}

/// `sum_{m=1}^{n} b * ceil(m / b)` in closed form (no loop over a hostile length).
pub(super) fn block_area_prefix(n: u64, block: u64) -> u128 {
    let (b, q, r) = (
        u128::from(block),
        u128::from(n / block),
        u128::from(n % block),
    );
    b * b * q * (q + 1) / 2 + r * (q + 1) * b
}

/// What a request's job needs at least, before the weights apply.
#[derive(Debug, Clone, Copy)]
pub(super) struct JobNeeds {
    /// Its entries' least total cost (seconds).
    pub(super) work: f64,
    /// Entries (at least one per generated token).
    entries: f64,
    /// Tokens processed.
    tokens: f64,
    /// KV tokens held after its entries, summed (the KV-time area).
    area: f64,
    /// KV tokens held by the entry completing its prompt.
    prompt_kv: f64,
    /// Its prompt's tokens.
    prompt_tokens: f64,
}

/// How a machine splits the prefill flag's surplus over the bias among the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SurplusSplit {
    /// Among the prompts a batch completes, by their KV over `M` and by `1 / R` in the
    /// proportion `λ_M : λ_R` (by KV alone where both are 0).
    PromptsCompleted,
    /// By `λ` itself: KV over `M` and `1 / R` among the prompts a batch completes, and
    /// prompt tokens over `min(C, P)` among all its prompt chunks (where `λ_C > 0`).
    Lambda,
}

impl JobNeeds {
    /// The least `r` needs up to its last (or first) token.
    pub(super) fn of(t: &Theta<'_>, r: &Request, limits: &Limits, end: JobEnd) -> Self {
        let (i, o) = (u64::from(r.input_tokens), u64::from(r.output_tokens));
        let block = u64::from(limits.block_size.max(1));
        let prompt_kv = in_blocks(i, limits) as f64;
        match end {
            // The entry completing the prompt holds I tokens.
            JobEnd::FirstToken => Self {
                work: t.first_token_work(r),
                entries: 1.0,
                tokens: i as f64,
                area: prompt_kv,
                prompt_kv,
                prompt_tokens: i as f64,
            },
            // The entry generating token k (0-based) holds I + k.
            JobEnd::LastToken => Self {
                work: t.request_work(r),
                entries: o as f64,
                tokens: r.max_kv_tokens() as f64,
                area: (block_area_prefix((i + o).saturating_sub(1), block)
                    - block_area_prefix(i.saturating_sub(1), block)) as f64,
                prompt_kv,
                prompt_tokens: i as f64,
            },
        }
    }

    /// The job's least processing under weights `lambda = (λ_M, λ_R, λ_C)`, with at most
    /// `entries_per_batch` entries in a batch.
    ///
    /// The prefill flag's surplus is paid once by a batch with prompt entries, which hold
    /// at most M KV tokens and number at most `entries_per_batch`: it is split by the same
    /// convex combination of those two packings as the bias (by KV alone where λ puts no
    /// weight on either).
    ///
    /// Where `C` is set, the surplus may instead be split by `λ` itself, with `λ_C` on the
    /// prompt's tokens: a batch with prompt tokens holds at most `min(C, P)` of them, so
    /// each prompt token carries `surplus / min(C, P)` of it ([`SurplusSplit::Lambda`]).
    pub(super) fn processing(
        &self,
        t: &Theta<'_>,
        limits: &Limits,
        lambda: [f64; 3],
        entries_per_batch: u64,
        split: SurplusSplit,
    ) -> f64 {
        let share = |cap: Option<u64>, used: f64| cap.map_or(0.0, |c| used / c.max(1) as f64);
        let per_batch = Some(entries_per_batch);
        let surplus = (t.get(Feature::HasPrefill) - t.get(Feature::HasDecode)).max(0.0);
        let surplus_share = match split {
            SurplusSplit::PromptsCompleted => {
                let kv_weight = match (limits.kv_capacity, lambda[0] + lambda[1]) {
                    (None, _) => 0.0,
                    (Some(_), w) if w <= 0.0 => 1.0,
                    (Some(_), w) => lambda[0] / w,
                };
                kv_weight * share(limits.kv_capacity, self.prompt_kv)
                    + (1.0 - kv_weight) * share(per_batch, 1.0)
            }
            SurplusSplit::Lambda => {
                let prompt_tokens_per_batch = limits
                    .token_budget
                    .map(|c| c.min(limits.prefill_budget.unwrap_or(u64::MAX)));
                lambda[0] * share(limits.kv_capacity, self.prompt_kv)
                    + lambda[1] * share(per_batch, 1.0)
                    + lambda[2] * share(prompt_tokens_per_batch, self.prompt_tokens)
            }
        };
        self.work
            + t.batch_bias()
                * bias_fraction(
                    limits,
                    lambda,
                    entries_per_batch,
                    self.area,
                    self.entries,
                    self.tokens,
                )
            + surplus * surplus_share
    }
}

/// The fraction of a batch's bias that entries holding `kv` KV tokens (summed over them),
/// `entries` of them, processing `tokens`, carry under weights `lambda = (λ_M, λ_R, λ_C)`:
/// `λ_M kv / M + λ_R entries / R + λ_C tokens / C` (a limit that is not set carries none).
pub(super) fn bias_fraction(
    limits: &Limits,
    lambda: [f64; 3],
    entries_per_batch: u64,
    kv: f64,
    entries: f64,
    tokens: f64,
) -> f64 {
    let share = |cap: Option<u64>, used: f64| cap.map_or(0.0, |c| used / c.max(1) as f64);
    lambda[0] * share(limits.kv_capacity, kv)
        + lambda[1] * share(Some(entries_per_batch), entries)
        + lambda[2] * share(limits.token_budget, tokens)
}

/// A job's key (here its remaining processing), ordered for a min-heap (ties by index,
/// for determinism).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Remaining(pub(super) f64, pub(super) usize);

impl Eq for Remaining {}

impl PartialOrd for Remaining {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Remaining {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// Completion times (sorted) of shortest-remaining-processing-first on one machine for
/// jobs `(release, processing)`.
pub(super) fn srpt_completions(jobs: &[(f64, f64)]) -> Vec<f64> {
    srpt_first_completions(jobs, jobs.len())
}

/// The first `count` completion times (sorted) of shortest-remaining-processing-first on
/// one machine for jobs `(release, processing)`; it stops there.
fn srpt_first_completions(jobs: &[(f64, f64)], count: usize) -> Vec<f64> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| jobs[a].0.total_cmp(&jobs[b].0).then(a.cmp(&b)));
    let mut heap: BinaryHeap<Reverse<Remaining>> = BinaryHeap::new();
    let count = count.min(jobs.len());
    let mut done = Vec::with_capacity(count);
    let mut now = f64::NEG_INFINITY;
    let mut next = 0;
    while done.len() < count {
        if heap.is_empty() {
            now = now.max(jobs[order[next]].0);
        }
        while next < order.len() && jobs[order[next]].0 <= now {
            let j = order[next];
            heap.push(Reverse(Remaining(jobs[j].1.max(0.0), j)));
            next += 1;
        }
        let Some(Reverse(Remaining(left, j))) = heap.pop() else {
            continue;
        };
        let release = order.get(next).map_or(f64::INFINITY, |&k| jobs[k].0);
        if now + left <= release {
            now += left;
            done.push(now);
        } else {
            heap.push(Reverse(Remaining(left - (release - now), j)));
            now = release;
        }
    }
    done.sort_by(f64::total_cmp);
    done
}

/// The most entries a batch of `n` requests holds: one per request, at most `R_max`.
pub(super) fn entries_per_batch(limits: &Limits, n: usize) -> u64 {
    limits.max_running.unwrap_or(u64::MAX).min(n as u64).max(1)
}

/// The machines of the relaxation: each weight of the grid with each way of splitting the
/// prefill flag's surplus that differs for it.
pub(super) fn machine_weights(limits: &Limits) -> Vec<([f64; 3], SurplusSplit)> {
    weight_grid(limits)
        .into_iter()
        .flat_map(|lambda| {
            let splits: &[SurplusSplit] = if lambda[2] > 0.0 {
                &[SurplusSplit::PromptsCompleted, SurplusSplit::Lambda]
            } else {
                &[SurplusSplit::PromptsCompleted]
            };
            splits.iter().map(move |&split| (lambda, split))
        })
        .collect()
}

/// Per weight of the grid, the shortest-remaining-first machine's completions, sorted; and
/// last the batch-count position bounds (module `batch_count`), valid per position too.
fn machine_completions(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    end: JobEnd,
) -> Vec<Vec<f64>> {
    let mut machines = fast_machine_completions(t, reqs, limits, end, 1);
    machines.push(super::batch_count::batch_count_positions(
        t, reqs, limits, end,
    ));
    machines
}

/// The entry caps of the small-set machines below `cap` (the whole workload's entries per
/// batch): every cap up to 16, then each a quarter above the one before.
fn small_set_caps(cap: u64) -> Vec<u64> {
    let mut caps = Vec::new();
    let mut r = 1u64;
    while r < cap {
        caps.push(r);
        r = if r < 16 { r + 1 } else { r + r.div_ceil(4) };
    }
    caps
}

/// The small-set machines (milp.md, "The machine relaxation"): the first `k` requests to
/// complete in a schedule, alone (every other request's entries dropped: no batch gets
/// longer or starts later), are served by batches of at most `k` entries, so the machine
/// whose shares split the bias among at most `r >= k` entries bounds their last
/// completion, and its shortest-remaining-first `k`-th completion bounds the schedule's
/// `k`-th. Per cap `r` below the workload's own and weight of the grid, its first `r`
/// completions (sorted), `replicas` times as fast (a cluster's first `k` are served by
/// batches of at most `k` entries on every replica too).
pub(super) fn small_set_machine_completions(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    end: JobEnd,
    replicas: u32,
) -> Vec<Vec<f64>> {
    let speed = f64::from(replicas.max(1));
    let needs: Vec<JobNeeds> = reqs
        .iter()
        .map(|r| JobNeeds::of(t, r, limits, end))
        .collect();
    let weights = machine_weights(limits);
    small_set_caps(entries_per_batch(limits, reqs.len()))
        .into_iter()
        .flat_map(|cap| weights.iter().map(move |&w| (cap, w)))
        .map(|(cap, (lambda, split))| {
            let jobs: Vec<(f64, f64)> = reqs
                .iter()
                .zip(&needs)
                .map(|(r, need)| {
                    let p = need.processing(t, limits, lambda, cap, split);
                    (r.arrival_s, p / speed)
                })
                .collect();
            srpt_first_completions(&jobs, usize::try_from(cap).unwrap_or(usize::MAX))
        })
        .collect()
}

/// Per weight of the grid, the completions (sorted) of shortest remaining processing first
/// on one machine `replicas` times as fast (each job's processing over `replicas`).
///
/// Each replica's batches give a preemptive schedule of one machine (the module's
/// argument), so a cluster gives one of `replicas` machines, each request on one of them.
/// One machine that fast can do in every interval what those do together, so it has a
/// schedule whose every completion is no later; and on it SRPT completes, at every
/// instant, at least as many jobs as any schedule (Chekuri, Motwani, Natarajan and Stein
/// 2001 use this fast-machine relaxation for parallel machines). So its `k`-th completion
/// bounds any cluster schedule's `k`-th smallest completion.
pub(super) fn fast_machine_completions(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    end: JobEnd,
    replicas: u32,
) -> Vec<Vec<f64>> {
    fast_machine_jobs(t, reqs, limits, end, replicas)
        .iter()
        .map(|jobs| srpt_completions(jobs))
        .collect()
}

/// Per weight of the grid, the jobs `(release, processing)` of the machine `replicas`
/// times as fast, one per request in `reqs`' order (each job's processing over
/// `replicas`): every schedule gives a preemptive schedule of each of these machines in
/// which each request's job runs between its arrival and its first (or last) token
/// ([`fast_machine_completions`]' argument).
pub(super) fn fast_machine_jobs(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    end: JobEnd,
    replicas: u32,
) -> Vec<Vec<(f64, f64)>> {
    let speed = f64::from(replicas.max(1));
    let needs: Vec<JobNeeds> = reqs
        .iter()
        .map(|r| JobNeeds::of(t, r, limits, end))
        .collect();
    let entries_per_batch = entries_per_batch(limits, reqs.len());
    machine_weights(limits)
        .into_iter()
        .map(|(lambda, split)| {
            reqs.iter()
                .zip(&needs)
                .map(|(r, need)| {
                    (
                        r.arrival_s,
                        need.processing(t, limits, lambda, entries_per_batch, split) / speed,
                    )
                })
                .collect()
        })
        .collect()
}

/// Per position `k`, a bound on any schedule's `k`-th smallest completion (of the last or
/// first token): the larger of the `k`-th smallest `own[i] = T_i + own time` and, over the
/// weight grid, the largest shortest-remaining-first machine's `k`-th completion (each
/// weight gives a valid machine, so the largest per position is valid).
pub(super) fn position_bounds(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    own: &[f64],
    end: JobEnd,
) -> Vec<f64> {
    let mut machines = machine_completions(t, reqs, limits, end);
    machines.extend(small_set_machine_completions(t, reqs, limits, end, 1));
    positions(own, &machines)
}

/// [`completion_bounds`] for a cluster of `replicas` (module `bounds`'s
/// `cluster_lower_bound`): the fast machine's positions, each at least the `k`-th smallest
/// `own[i]`; and its last completion (a makespan bound).
pub(super) fn cluster_completion_bounds(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    own: &[f64],
    end: JobEnd,
    replicas: u32,
) -> (f64, f64) {
    let mut machines = fast_machine_completions(t, reqs, limits, end, replicas);
    let last = machines
        .iter()
        .filter_map(|srpt| srpt.last().copied())
        .fold(0.0, f64::max);
    machines.extend(small_set_machine_completions(
        t, reqs, limits, end, replicas,
    ));
    (positions(own, &machines).iter().sum(), last)
}

/// [`position_bounds`] from the machines' sorted completions.
fn positions(own: &[f64], machines: &[Vec<f64>]) -> Vec<f64> {
    let mut best = own.to_vec();
    best.sort_by(f64::total_cmp);
    for srpt in machines {
        for (b, s) in best.iter_mut().zip(srpt) {
            *b = b.max(*s);
        }
    }
    best
}

/// The machine bound on the sum of completion times (of the last or first token): the sum
/// of [`position_bounds`]. Also returns the machines' latest last completion (a makespan
/// bound for `JobEnd::LastToken`).
pub(super) fn completion_bounds(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    own: &[f64],
    end: JobEnd,
) -> (f64, f64) {
    let mut machines = machine_completions(t, reqs, limits, end);
    let last = machines
        .iter()
        .filter_map(|srpt| srpt.last().copied())
        .fold(0.0, f64::max);
    machines.extend(small_set_machine_completions(t, reqs, limits, end, 1));
    (positions(own, &machines).iter().sum(), last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every schedule of one machine with the jobs in a fixed priority order (preemptive,
    /// highest priority available first): their sorted completions.
    fn priority_completions(jobs: &[(f64, f64)], priority: &[usize]) -> Vec<f64> {
        let mut left: Vec<f64> = jobs.iter().map(|j| j.1).collect();
        let mut done = vec![f64::NAN; jobs.len()];
        let mut now = jobs.iter().map(|j| j.0).fold(f64::INFINITY, f64::min);
        while done.iter().any(|d| d.is_nan()) {
            let avail = priority
                .iter()
                .copied()
                .find(|&j| done[j].is_nan() && jobs[j].0 <= now);
            let next_release = jobs
                .iter()
                .filter(|j| j.0 > now)
                .map(|j| j.0)
                .fold(f64::INFINITY, f64::min);
            match avail {
                None => now = next_release,
                Some(j) => {
                    let run = left[j].min(next_release - now);
                    now += run;
                    left[j] -= run;
                    if left[j] <= 1e-12 {
                        done[j] = now;
                    }
                }
            }
        }
        done.sort_by(f64::total_cmp);
        done
    }

    #[test]
    fn srpt_by_hand() {
        // A (0, 10) runs until B (1, 1) arrives with less left, B ends at 2, A at 11.
        assert_eq!(
            srpt_completions(&[(0.0, 10.0), (1.0, 1.0)]),
            vec![2.0, 11.0]
        );
        // Idle until the first release; ties are broken by index.
        assert_eq!(srpt_completions(&[(5.0, 1.0), (5.0, 1.0)]), vec![6.0, 7.0]);
        assert!(srpt_completions(&[]).is_empty());
    }

    #[test]
    fn srpt_completes_the_kth_job_no_later_than_any_priority_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..200 {
            let n = rng.random_range(1..6);
            let jobs: Vec<(f64, f64)> = (0..n)
                .map(|_| {
                    (
                        f64::from(rng.random_range(0..6u32)),
                        f64::from(rng.random_range(1..6u32)),
                    )
                })
                .collect();
            let srpt = srpt_completions(&jobs);
            let mut perm: Vec<usize> = (0..n).collect();
            // Every priority order of up to 5 jobs (Heap's algorithm would do; shuffles
            // cover them with high probability).
            for _ in 0..60 {
                for k in (1..n).rev() {
                    perm.swap(k, rng.random_range(0..=k));
                }
                let other = priority_completions(&jobs, &perm);
                for (s, o) in srpt.iter().zip(&other) {
                    assert!(s <= &(o + 1e-9), "{jobs:?} {perm:?}: {srpt:?} vs {other:?}");
                }
            }
        }
    }

    #[test]
    fn the_first_two_of_three_pay_half_the_bias_each() {
        // Three identical requests at 0, no limits: the whole-workload machine splits each
        // batch's bias three ways, but the first two to complete are served, alone, by
        // batches of at most two entries, so the second completion is at least twice the
        // share with the bias split two ways; serving two of them side by side meets it.
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let r = Request {
            input_tokens: 8,
            output_tokens: 20,
            arrival_s: 0.0,
        };
        let reqs = [r; 3];
        let limits = Limits::unlimited();
        let own = vec![t.own_time(&r, &limits); 3];
        let need = JobNeeds::of(&t, &r, &limits, JobEnd::LastToken);
        let split = SurplusSplit::PromptsCompleted;
        let share = |cap| need.processing(&t, &limits, [0.0, 1.0, 0.0], cap, split);
        let b = position_bounds(&t, &reqs, &limits, &own, JobEnd::LastToken);
        assert!(
            (b[1] - 2.0 * share(2)).abs() < 1e-12,
            "{b:?} vs {}",
            2.0 * share(2)
        );
        assert!(b[1] > 2.0 * share(3) + 1e-4, "{b:?}");
        assert_eq!(small_set_caps(3), vec![1, 2]);
        assert_eq!(small_set_caps(1), Vec::<u64>::new());
        assert_eq!(small_set_caps(40)[15..], [16, 20, 25, 32]);
    }

    #[test]
    fn block_area_in_closed_form_matches_the_sum() {
        for block in [1u64, 2, 3, 16] {
            for n in 0..100u64 {
                let direct: u64 = (1..=n).map(|m| m.div_ceil(block) * block).sum();
                assert_eq!(
                    block_area_prefix(n, block),
                    u128::from(direct),
                    "n {n} b {block}"
                );
            }
        }
    }

    #[test]
    fn weights_only_on_limits_that_are_set() {
        // The running set is always limited (by the number of requests).
        assert_eq!(weight_grid(&Limits::unlimited()), vec![[0.0, 1.0, 0.0]]);
        let m = Limits {
            kv_capacity: Some(100),
            ..Limits::unlimited()
        };
        assert_eq!(
            weight_grid(&m),
            vec![
                [0.0, 1.0, 0.0],
                [0.25, 0.75, 0.0],
                [0.5, 0.5, 0.0],
                [0.75, 0.25, 0.0],
                [1.0, 0.0, 0.0]
            ]
        );
        let all = Limits {
            kv_capacity: Some(100),
            max_running: Some(4),
            token_budget: Some(64),
            ..Limits::unlimited()
        };
        let g = weight_grid(&all);
        assert_eq!(g.len(), 15);
        assert!(
            g.iter()
                .all(|w| (w.iter().sum::<f64>() - 1.0).abs() < 1e-12)
        );
    }

    #[test]
    fn full_prompts_each_pay_the_whole_prefill_bias() {
        // Four prompts of exactly C tokens at 0: no two share a batch, so the k-th first
        // token comes no earlier than k prompt batches, each its bias, the prefill flag and
        // the prompt's work; serving them one at a time meets that. Splitting the flag's
        // surplus by prompt tokens over C (λ_C = 1) gives exactly that, where splitting it
        // among completed prompts by 1 / R gives each only a quarter of it.
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let r = Request {
            input_tokens: 1000,
            output_tokens: 4,
            arrival_s: 0.0,
        };
        let reqs = [r; 4];
        let limits = Limits {
            token_budget: Some(1000),
            ..Limits::unlimited()
        };
        let own: Vec<f64> = reqs
            .iter()
            .map(|r| t.own_first_token_time(r, &limits))
            .collect();
        let b = position_bounds(&t, &reqs, &limits, &own, JobEnd::FirstToken);
        let batch = t.get(Feature::One) + t.get(Feature::HasPrefill) + t.first_token_work(&r);
        for (k, bound) in b.iter().enumerate() {
            let expect = (k + 1) as f64 * batch;
            assert!(
                (bound - expect).abs() < 1e-12,
                "position {k}: {bound} vs {expect}"
            );
        }
    }
}
