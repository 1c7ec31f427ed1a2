//! The pairwise-interference bound on the sum of completion times (milp.md, "The
//! pairwise-interference bound"): what every request's own minimum time misses is the time
//! spent on the others while it is in the system, and for any two requests one of them
//! pays for the other.
//!
//! **The span inequality.** The batches that start at or after request `j`'s arrival `T_j`
//! and end by its completion `C_j` run one after the other inside `(T_j, C_j]`, each
//! lasting its bias (at least `b = one + min(has_prefill, has_decode)`) plus all its
//! entries' costs. Those containing `j` (`J` of them) cost at least `j`'s own minimum time
//! `o_j` and at least `J b + w_j` (`w_j` its entries' least work); the others at least `b`
//! each. So
//!
//! `C_j - T_j >= max(o_j, J b + w_j) + b (batches of the span without j) + sum_{i != j}
//! (i's entries' cost in the span)`,
//!
//! a sum over the other requests but for the batches without `j`, which several requests
//! may share: their count is at least the most any one request `i` has there, hence at
//! least `sum_i θ_ij (i's entries there)` for any fixed weights `θ_ij >= 0` adding up to
//! at most 1 over `i`.
//!
//! **A pair** `k`, `l` with `T_k <= T_l` either finishes `l` first (then all of `l`'s
//! entries lie in `k`'s span: `k` pays at least `w_l`) or `k` first. Then `l`'s span holds
//! every entry of `k` in a batch starting at or after `T_l`: at least `n_k(T_l)` of them,
//! costing at least `R_k(T_l)` (what `k` cannot have done before `T_l` even alone at full
//! speed). And either `l`'s first token comes by `C_k` (so `l`'s whole prompt, at least
//! `w_pl`, lies in `k`'s span) or after it: then `l`'s `O_l` batches from its first token on
//! hold no entry of `k`, at most `J - O_l` of `l`'s batches hold one, and with `x0_l = (o_l -
//! O_l b - w_l) / b` the span inequality gives `l` at least `θ_kl b (n_k(T_l) - x0_l)^+`
//! more than `o_l` (more batches of `l` beyond `x0_l` cost `b` each, as much as they take
//! off the others'). So the pair adds at least
//!
//! `min(w_l, R_k(T_l) + min(w_pl, θ_kl b (n_k(T_l) - x0_l)^+))`
//!
//! to `sum_j (T_j + o_j)`, each term charged to one request's inequality for one other, so
//! the pairs add up: `sum_j C_j >= sum_j (T_j + o_j) + sum over pairs`. Evictions only add
//! entries and work. `θ_kl` is proportional to `l`'s bias term for `k` among the requests
//! arriving no later than `l` (ties are taken both ways, the larger kept).
//!
//! **The backlog.** Grouped by the later request `l` of each pair, the pairs' terms and
//! `l`'s own slack (its span's biases, and `x_l`, the part of a batch begun before `T_l`
//! that runs after it: `l` waits for it, and no span holds it) add up to the one sum, so
//! `l`'s group may take any bound on what the pairs' costs give it: the sum of its pairs'
//! terms above, or the backlog. For the requests `A` arriving in `[s, T_l)` (strictly
//! before `l`), `k`'s cost in `l`'s span is at least `rem_k`, what `k` has left after
//! `T_l`, so the group gets at least `sum_k min(w_l, rem_k) + x_l`. The batches starting in `[s, T_l)` end by `T_l + x_l`, each costs at least `b`
//! and there are at least as many as any one request of `A` has entries there, at least
//! `sum_k e_k / |A|`: so the work done on `A` before `T_l` is at most the most a fractional
//! knapsack fits in `T_l - s + x_l`, each entry costing its work plus `β = b / |A|` (a
//! prompt's entries at most its last chunk's work each; a request's later tokens at their
//! mean, a prefix of them never doing better, since a later token costs no less than an
//! earlier one). With `W_A` the least work of `A`, `sum_k rem_k >= W_A - knapsack(T_l - s
//! + x_l) >= W_A - knapsack(T_l - s) - x_l`. Given only that sum and `rem_k <= w_k`, the
//! least `sum_k min(w_l, rem_k)` puts the backlog on the requests of most work first
//! (`F(B)`, which grows by at most what `B` grows, so `F(B - x_l) + x_l >= F(B)`): the
//! group gets at least `max_s F(W_A - knapsack(T_l - s))`, what congestion leaves undone
//! when `l` comes, where no single earlier request need still run by its own time.
//! Evictions only add work. Windows reach back at most [`BACKLOG_WINDOW`] requests.
//!
//! What it adds: at low concurrency a request arriving during another's long decode either
//! waits for its remaining batches (whole biases, which the machine relaxation splits among
//! requests that are not there) or runs its prompt inside them and delays the other by the
//! prompt's work. A pair only counts while `k` may still run at `T_l` (`T_l < T_k + o_k`),
//! so the cost is the overlapping pairs, at most `MAX_PAIRS` (dropping pairs keeps it
//! valid).

use infersched_core::{Limits, Request};

use super::Theta;

/// The most pairs evaluated (32 MiB; every pair of a 1,000-request burst); past them the
/// rest count 0 (still a bound).
const MAX_PAIRS: usize = 1 << 20;

/// The most earlier requests a backlog window holds (each window costs a pass over its
/// requests, so the backlog costs `n` times this squared at most).
const BACKLOG_WINDOW: usize = 48;

/// What the bound needs of one request (seconds).
struct Needs {
    arrival: f64,
    /// Own minimum time `o`, least work `w`, least prompt work `w_p`.
    own: f64,
    work: f64,
    prompt_work: f64,
    /// Earliest first token, and the least time of one later-token batch.
    first_token: f64,
    step: f64,
    /// `x0`: how many more batches than its `O` the request's own time pays for.
    spare_batches: f64,
    /// The most any one of its prompt's entries can take off its least work left (a chunk
    /// of at most `min(C, P)` tokens, at the end of the prompt).
    prompt_entry_work: f64,
}

/// A lower bound on the sum of completion times (absolute seconds), or None where a
/// coefficient is negative or there is nothing to bound.
pub(super) fn sum_of_completions(t: &Theta<'_>, reqs: &[Request], limits: &Limits) -> Option<f64> {
    sum_with(t, reqs, limits, true)
}

/// [`sum_of_completions`], the backlog terms left out where `backlog` is false (for tests
/// that measure what they add).
fn sum_with(t: &Theta<'_>, reqs: &[Request], limits: &Limits, backlog: bool) -> Option<f64> {
    if reqs.is_empty() || !t.non_negative() {
        return None;
    }
    let needs: Vec<Needs> = reqs.iter().map(|r| needs_of(t, r, limits)).collect();
    let base: f64 = needs.iter().map(|q| q.arrival + q.own).sum();
    if !base.is_finite() {
        return None;
    }
    // Requests in arrival order; for each, those arriving no later that may still run.
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &c| {
        needs[a]
            .arrival
            .total_cmp(&needs[c].arrival)
            .then(a.cmp(&c))
    });
    let pairs = overlapping_pairs(t, reqs, limits, &needs, &order);
    let group = pair_groups(t.batch_bias(), &needs, &pairs);
    let backlog = if backlog {
        backlogs(t, reqs, &needs, &order)
    } else {
        vec![0.0; reqs.len()]
    };
    let extra: f64 = group.iter().zip(&backlog).map(|(g, k)| g.max(*k)).sum();
    Some(base + extra)
}

/// What a request needs on its own.
fn needs_of(t: &Theta<'_>, r: &Request, limits: &Limits) -> Needs {
    let b = t.batch_bias();
    let own = t.own_time(r, limits);
    let work = t.request_work(r);
    let later_min = if r.output_tokens > 1 {
        t.later_token_work(r, 1)
    } else {
        0.0
    };
    Needs {
        arrival: r.arrival_s,
        own,
        work,
        prompt_work: t.first_token_work(r),
        first_token: r.arrival_s + t.own_first_token_time(r, limits),
        step: b + later_min,
        spare_batches: if b > 0.0 {
            ((own - f64::from(r.output_tokens) * b - work) / b).max(0.0)
        } else {
            0.0
        },
        prompt_entry_work: t.prompt_entry_work(r, limits),
    }
}

/// What request `k` surely has left at time `at`: entries and their least work.
fn left_at(t: &Theta<'_>, r: &Request, q: &Needs, limits: &Limits, at: f64) -> (f64, f64) {
    let later = r.output_tokens.saturating_sub(1);
    if at <= q.arrival {
        let prompt = super::prompt_batches(r, limits) as f64;
        return (prompt + f64::from(later), q.work);
    }
    // Later tokens whose batch may start before `at`: the first starts no earlier than the
    // first token, each next one at least a step later.
    let done = if at <= q.first_token {
        0
    } else if q.step <= 0.0 {
        later
    } else {
        // Below `later` (a u32) whenever the cast is taken.
        let steps = ((at - q.first_token) / q.step).ceil();
        if steps >= f64::from(later) {
            later
        } else {
            steps as u32
        }
    };
    let rest = later - done;
    (
        f64::from(rest),
        t.later_tokens_work_between(r, done + 1, later),
    )
}

/// The pairs `(earlier k, later l, n_k, R_k)` with `k` possibly running at `T_l`: the
/// entries and least work `k` surely has left then (a tie is taken both ways, in a row).
fn overlapping_pairs(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    needs: &[Needs],
    order: &[usize],
) -> Vec<(usize, usize, f64, f64)> {
    let left = |k: usize, at: f64| left_at(t, &reqs[k], &needs[k], limits, at);
    let mut pairs = Vec::new();
    'outer: for (pos, &k) in order.iter().enumerate() {
        let until = needs[k].arrival + needs[k].own;
        for &l in &order[pos + 1..] {
            if needs[l].arrival >= until {
                break;
            }
            if pairs.len() >= MAX_PAIRS {
                break 'outer;
            }
            let (n, rest) = left(k, needs[l].arrival);
            pairs.push((k, l, n, rest));
            if needs[l].arrival <= needs[k].arrival {
                // A tie: l arrives no later than k either, so the pair is taken both ways.
                let (n, rest) = left(l, needs[k].arrival);
                pairs.push((l, k, n, rest));
            }
        }
    }
    pairs
}

/// Per request, what its pairs add: each unordered pair adds the larger of its (one or
/// two) orientations to the group of that orientation's later request, with θ per later
/// request proportional to its bias term for each earlier one (`b`: the batch bias).
fn pair_groups(b: f64, needs: &[Needs], pairs: &[(usize, usize, f64, f64)]) -> Vec<f64> {
    let bias_term = |l: usize, n: f64| b * (n - needs[l].spare_batches).max(0.0);
    let mut total_term = vec![0.0f64; needs.len()];
    for &(_, l, n, _) in pairs {
        total_term[l] += bias_term(l, n);
    }
    let value = |&(_, l, n, rest): &(usize, usize, f64, f64)| {
        let term = bias_term(l, n);
        let share = if total_term[l] > 0.0 {
            term * term / total_term[l]
        } else {
            0.0
        };
        needs[l]
            .work
            .min(rest + needs[l].prompt_work.min(share))
            .max(0.0)
    };
    let mut group = vec![0.0f64; needs.len()];
    let mut i = 0;
    while i < pairs.len() {
        let (mut v, mut owner) = (value(&pairs[i]), pairs[i].1);
        if i + 1 < pairs.len() && pairs[i + 1].0 == pairs[i].1 && pairs[i + 1].1 == pairs[i].0 {
            let reverse = value(&pairs[i + 1]);
            if reverse > v {
                (v, owner) = (reverse, pairs[i + 1].1);
            }
            i += 1;
        }
        group[owner] += v;
        i += 1;
    }
    group
}

/// Per request `l`, the backlog term of the module doc, over windows of
/// the (at most [`BACKLOG_WINDOW`]) requests arriving strictly before it. `order` is the
/// requests in arrival order.
fn backlogs(t: &Theta<'_>, reqs: &[Request], needs: &[Needs], order: &[usize]) -> Vec<f64> {
    let b = t.batch_bias();
    // The knapsack's items, one request's prompt or later tokens: (work per entry, work).
    let items = |k: usize| {
        let (r, q) = (&reqs[k], &needs[k]);
        let later = f64::from(r.output_tokens.saturating_sub(1));
        let prompt = (q.prompt_entry_work, q.prompt_work);
        let decodes = (q.work - q.prompt_work) / later.max(1.0);
        [prompt, (decodes, q.work - q.prompt_work)]
    };
    let mut out = vec![0.0; reqs.len()];
    let mut window: Vec<(f64, f64)> = Vec::new();
    let mut works: Vec<f64> = Vec::new();
    for (pos, &l) in order.iter().enumerate() {
        let at = needs[l].arrival;
        // Strictly earlier arrivals, nearest first.
        let earlier = order[..pos]
            .iter()
            .rev()
            .filter(|&&k| needs[k].arrival < at)
            .take(BACKLOG_WINDOW);
        window.clear();
        works.clear();
        let w_l = needs[l].work;
        let (mut least_work, mut best, mut count) = (0.0, 0.0f64, 0usize);
        for &k in earlier {
            count += 1;
            least_work += needs[k].work;
            // The window's works, largest first.
            works.insert(
                works.partition_point(|&x| x >= needs[k].work),
                needs[k].work,
            );
            for item in items(k) {
                if item.1 > 0.0 {
                    // Kept in decreasing work per entry (the knapsack's order for any β).
                    let place = window.partition_point(|x| x.0 >= item.0);
                    window.insert(place, item);
                }
            }
            let beta = b / count as f64;
            let mut time = at - needs[k].arrival;
            let mut done = 0.0;
            for &(per_entry, work) in &window {
                if time <= 0.0 {
                    break;
                }
                // Work this item can do in `time`: its share of each unit of time (items
                // with work have positive work per entry, so the share is positive).
                let ratio = per_entry / (per_entry + beta);
                let take = work.min(ratio * time);
                done += take;
                time -= take / ratio;
            }
            // F(backlog): the backlog on the requests of most work first.
            let mut backlog = least_work - done;
            let mut paid = 0.0;
            for &work in &works {
                if backlog <= 0.0 {
                    break;
                }
                let on = work.min(backlog);
                paid += w_l.min(on);
                backlog -= on;
            }
            best = best.max(paid);
        }
        out[l] = best;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_cost_model::LinearCostModel;

    fn cost() -> LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    fn req(i: u32, o: u32, at: f64) -> Request {
        Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: at,
        }
    }

    /// The sums of completions of every schedule the tests compare the bound with: four
    /// heuristics and three priority lists, replayed (those the replay accepts).
    fn replayed_sums(w: &infersched_core::Workload, limits: &Limits) -> Vec<f64> {
        use infersched_schedulers::{Knobs, SchedulerKind};
        let c = cost();
        let order = w.fcfs_order();
        let lists = [(64, 0, 2), (512, 0, 8), (2048, 2048, 1)].map(|(chunk, decode, r)| {
            let mut p = crate::list_search::PriorityList::new(&order, chunk, decode, r)
                .shortest_remaining_first(&c);
            infersched_schedulers::simulate(w, limits, &mut p, &c)
        });
        [
            SchedulerKind::Vllm,
            SchedulerKind::Sarathi,
            SchedulerKind::Orca,
            SchedulerKind::Mcsf,
        ]
        .iter()
        .map(|kind| kind.simulate(w, &Knobs::matching(limits), &c))
        .chain(lists)
        .flatten()
        .filter_map(|sim| infersched_core::replay(w, limits, &c, &sim.schedule).ok())
        .map(|rep| rep.requests.iter().map(|r| r.completion_s).sum())
        .collect()
    }

    #[test]
    fn congestion_left_when_a_request_arrives_is_paid_for() {
        // Three equal requests at 0, a short fourth arriving just after any one of them
        // could have finished alone: no pair with it counts, but the machine cannot have
        // done the three's work by then, and what is left lies on at least two of them
        // (none holds more than its own work), each of which pays the fourth's work or
        // makes it wait for the rest of its own.
        let c = cost();
        let t = Theta(&c);
        let lim = Limits::unlimited();
        let k = req(2000, 2, 0.0);
        let at = t.own_time(&k, &lim) * 1.05;
        let l = req(100, 2, at);
        let s3 = sum_of_completions(&t, &[k, k, k], &lim).unwrap();
        let s4 = sum_of_completions(&t, &[k, k, k, l], &lim).unwrap();
        let group = s4 - s3 - (at + t.own_time(&l, &lim));
        let w_l = t.request_work(&l);
        assert!((group - 2.0 * w_l).abs() < 1e-9 * s4, "{group} vs {w_l}");
        // Without the backlog nothing is added for it.
        let pairs_only = sum_with(&t, &[k, k, k, l], &lim, false).unwrap();
        assert!((pairs_only - s3 - (at + t.own_time(&l, &lim))).abs() < 1e-12);
        let w = infersched_core::Workload::new(vec![k, k, k, l]).unwrap();
        let sums = replayed_sums(&w, &lim);
        assert!(sums.len() >= 5);
        assert!(
            sums.iter().all(|&done| s4 <= done * (1.0 + 1e-12)),
            "{s4} {sums:?}"
        );
    }

    /// Random workloads of a family, 40 seeded cases (those whose limits they fit): `n`
    /// requests in `sizes`, each arriving up to `gap` seconds after the one before, with up
    /// to `prompt` and `output` tokens; M in `kv`, and every other case a token budget.
    fn random_cases(
        seed: u64,
        sizes: std::ops::Range<usize>,
        gap: f64,
        (prompt, output): (u32, u32),
        kv: std::ops::Range<u64>,
    ) -> Vec<(usize, infersched_core::Workload, Limits)> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..40)
            .filter_map(|case| {
                let n = rng.random_range(sizes.clone());
                let mut at = 0.0;
                let reqs: Vec<Request> = (0..n)
                    .map(|_| {
                        at += rng.random_range(0.0..gap);
                        req(rng.random_range(1..prompt), rng.random_range(1..output), at)
                    })
                    .collect();
                let w = infersched_core::Workload::new(reqs).unwrap();
                let limits = Limits {
                    kv_capacity: Some(rng.random_range(kv.clone())),
                    token_budget: (case % 2 == 0).then(|| rng.random_range(256..2048)),
                    ..Limits::unlimited()
                };
                limits
                    .check_feasible(&w)
                    .is_ok()
                    .then_some((case, w, limits))
            })
            .collect()
    }

    #[test]
    fn never_above_a_replayed_schedule_under_congestion() {
        // Requests arriving faster than the machine serves them: the bound, backlog terms
        // included, is at most every replayed schedule's sum of completions, and the
        // backlog raises it on many of them.
        let c = cost();
        let t = Theta(&c);
        let (mut checked, mut raised) = (0, 0);
        for (case, w, limits) in random_cases(11, 3..12, 0.08, (3000, 60), 4000..20000) {
            let sum = sum_of_completions(&t, w.requests(), &limits).unwrap();
            let without = sum_with(&t, w.requests(), &limits, false).unwrap();
            assert!(sum >= without);
            raised += usize::from(sum > without * (1.0 + 1e-9));
            for done in replayed_sums(&w, &limits) {
                assert!(
                    sum <= done * (1.0 + 1e-12),
                    "case {case}: bound {sum} above a schedule's {done}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 200, "{checked} schedules checked");
        assert!(raised >= 10, "the backlog raised {raised} of 40");
    }

    #[test]
    fn never_above_a_replayed_schedule_at_low_concurrency() {
        // Requests arriving one after another with long outputs, so that two or three are
        // in the system at once: the bound's sum of completions is at most every replayed
        // heuristic's and list schedule's, and it beats the other arguments on most.
        let c = cost();
        let t = Theta(&c);
        let (mut checked, mut strongest) = (0, 0);
        for (case, w, limits) in random_cases(5, 2..9, 0.4, (1500, 200), 2000..8000) {
            let n = w.len();
            let sum = sum_of_completions(&t, w.requests(), &limits).unwrap();
            let others = super::super::lower_bound(&w, &limits, &c, crate::Objective::MeanLatency);
            let arrivals: f64 = w.requests().iter().map(|r| r.arrival_s).sum();
            if others.argument == super::super::BoundArgument::PairwiseInterference {
                strongest += 1;
                assert!(((sum - arrivals) / n as f64 - others.value_s).abs() < 1e-9);
            }
            for done in replayed_sums(&w, &limits) {
                assert!(
                    sum <= done * (1.0 + 1e-12),
                    "case {case}: bound {sum} above a schedule's {done}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 200, "{checked} schedules checked");
        // The pairwise argument is the strongest on most of these workloads.
        assert!(strongest >= 30, "strongest on {strongest} of 40");
    }

    #[test]
    fn requests_that_cannot_overlap_add_nothing() {
        // The second arrives after the first could have finished alone: no pair counts.
        let c = cost();
        let t = Theta(&c);
        let l = Limits::unlimited();
        let a = req(100, 10, 0.0);
        let b = req(100, 10, 10.0);
        let own = t.own_time(&a, &l) + t.own_time(&b, &l);
        let sum = sum_of_completions(&t, &[a, b], &l).unwrap();
        assert!(
            (sum - (10.0 + own)).abs() < 1e-12,
            "{sum} vs {}",
            10.0 + own
        );
    }

    #[test]
    fn a_prompt_arriving_during_a_long_decode_is_paid_for() {
        // k decodes 400 tokens; l arrives with a 3,000-token prompt 10 ms in. Either l
        // goes first (k pays l's work), or l's prompt runs inside k's decodes (k pays the
        // prompt), or l waits for k's remaining batches: each costs far more than k's
        // remaining decode work, all the simpler pairwise argument would give.
        let c = cost();
        let t = Theta(&c);
        let l = Limits::unlimited();
        let k = req(100, 400, 0.0);
        let m = req(3000, 50, 0.01);
        let sum = sum_of_completions(&t, &[k, m], &l).unwrap();
        let own = 0.01 + t.own_time(&k, &l) + t.own_time(&m, &l);
        let prompt = t.first_token_work(&m);
        assert!(sum - own >= prompt * 0.999, "{} < {prompt}", sum - own);
        assert!(sum - own <= t.request_work(&m) + 1e-12);
    }
}
