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
}

/// A lower bound on the sum of completion times (absolute seconds), or None where a
/// coefficient is negative or there is nothing to bound.
pub(super) fn sum_of_completions(t: &Theta<'_>, reqs: &[Request], limits: &Limits) -> Option<f64> {
    if reqs.is_empty() || !t.non_negative() {
        return None;
    }
    let b = t.batch_bias();
    let needs: Vec<Needs> = reqs
        .iter()
        .map(|r| {
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
            }
        })
        .collect();
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
    // What k surely has left at time `at`: entries and their least work.
    let left = |k: usize, at: f64| -> (f64, f64) {
        let (r, q) = (&reqs[k], &needs[k]);
        let later = r.output_tokens.saturating_sub(1);
        if at <= q.arrival {
            let prompt = super::prompt_batches(r, limits) as f64;
            return (prompt + f64::from(later), q.work);
        }
        // Later tokens whose batch may start before `at`: the first starts no earlier
        // than the first token, each next one at least a step later.
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
    };
    // The pairs: (earlier k, later l) with k possibly running at T_l.
    let mut pairs: Vec<(usize, usize, f64, f64)> = Vec::new(); // k, l, n_k, R_k
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
    // θ: per later request, proportional to its bias term for each earlier one.
    let bias_term = |l: usize, n: f64| b * (n - needs[l].spare_batches).max(0.0);
    let mut total_term = vec![0.0f64; reqs.len()];
    for &(_, l, n, _) in &pairs {
        total_term[l] += bias_term(l, n);
    }
    // Each unordered pair adds the larger of its (one or two) orientations.
    let mut extra = 0.0;
    let mut i = 0;
    while i < pairs.len() {
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
        let mut v = value(&pairs[i]);
        if i + 1 < pairs.len() && pairs[i + 1].0 == pairs[i].1 && pairs[i + 1].1 == pairs[i].0 {
            v = v.max(value(&pairs[i + 1]));
            i += 1;
        }
        extra += v;
        i += 1;
    }
    Some(base + extra)
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

    #[test]
    fn never_above_a_replayed_schedule_at_low_concurrency() {
        // Requests arriving one after another with long outputs, so that two or three are
        // in the system at once: the bound's sum of completions is at most every replayed
        // heuristic's and list schedule's, and it beats the other arguments on most.
        use infersched_core::{Workload, replay};
        use infersched_schedulers::{Knobs, SchedulerKind};
        use rand::{Rng, SeedableRng};
        use rand_chacha::ChaCha8Rng;
        let c = cost();
        let t = Theta(&c);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (mut checked, mut strongest) = (0, 0);
        for case in 0..40 {
            let n = rng.random_range(2..9);
            let mut at = 0.0;
            let reqs: Vec<Request> = (0..n)
                .map(|_| {
                    at += rng.random_range(0.0..0.4);
                    req(rng.random_range(1..1500), rng.random_range(1..200), at)
                })
                .collect();
            let w = Workload::new(reqs).unwrap();
            let limits = Limits {
                kv_capacity: Some(rng.random_range(2000..8000)),
                token_budget: (case % 2 == 0).then(|| rng.random_range(256..2048)),
                ..Limits::unlimited()
            };
            if limits.check_feasible(&w).is_err() {
                continue;
            }
            let sum = sum_of_completions(&t, w.requests(), &limits).unwrap();
            let others = super::super::lower_bound(&w, &limits, &c, crate::Objective::MeanLatency);
            let arrivals: f64 = w.requests().iter().map(|r| r.arrival_s).sum();
            if others.argument == super::super::BoundArgument::PairwiseInterference {
                strongest += 1;
                assert!(((sum - arrivals) / n as f64 - others.value_s).abs() < 1e-9);
            }
            let order = w.fcfs_order();
            let lists = [(64, 0, 2), (512, 0, 8), (2048, 2048, 1)].map(|(chunk, decode, r)| {
                let mut p = crate::list_search::PriorityList::new(&order, chunk, decode, r)
                    .shortest_remaining_first(&c);
                infersched_schedulers::simulate(&w, &limits, &mut p, &c)
            });
            let sims = [
                SchedulerKind::Vllm,
                SchedulerKind::Sarathi,
                SchedulerKind::Orca,
                SchedulerKind::Mcsf,
            ]
            .iter()
            .map(|kind| kind.simulate(&w, &Knobs::matching(&limits), &c))
            .chain(lists);
            for sim in sims.flatten() {
                let Ok(rep) = replay(&w, &limits, &c, &sim.schedule) else {
                    continue;
                };
                let done: f64 = rep.requests.iter().map(|r| r.completion_s).sum();
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
