//! First tokens first: a schedule for `mean-ttft` that gives every request its first token
//! as early as the machine allows and only then finishes them.
//!
//! Mean TTFT counts nothing after a request's first token, so memory held by requests that
//! already have one is memory taken from prompts still waiting. The schedule prefills one
//! request at a time, shortest prompt first among those that have arrived (prompt chunks
//! of at most `min(C, P)` tokens), evicts it at the start of the next batch (an eviction
//! frees its KV before that batch's prompt is processed), and once every request has its
//! first token, refills and decodes them one at a time. So the k-th first token comes
//! after the k shortest prompts' work alone, as in the machine relaxation's shortest-first
//! order, which is what makes it strong where memory is tight and prompts are long: there
//! every heuristic keeps the running set's KV while prompts wait (1,000 offline arXiv
//! requests, M = 32,768: README). It is a candidate of the heuristic portfolio, judged by
//! the replay like the others, and applies only in classes that allow evictions.
//!
//! It is one schedule of the *first-token problem* (every output cut to one token), whose
//! least mean latency is the least mean TTFT where evictions are allowed: any schedule of
//! that problem becomes one of the workload with the same first tokens
//! ([`finish_after_first_tokens`]). So the searches for mean latency run there too: the
//! portfolio and the priority-list search at any size ([`searched`]) and the phase
//! relaxation's plan search where it runs ([`planned`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use infersched_core::{Batch, BatchFeatures, CostModel, Entry, Limits, Schedule, Workload};

use std::time::Instant;

use infersched_cost_model::LinearCostModel;

use crate::bounds::{PhasePlan, first_tokens_only};
use crate::store::Incumbent;
use crate::{Objective, PolicyConstraints, SolveOptions};

/// The first-tokens-first schedule of `w` under `limits` (times estimated with `cost` to
/// know which requests have arrived), or None where the class forbids it (no evictions,
/// reservations) or a prompt cannot run as the class requires (whole prompts over C or P).
pub(crate) fn first_tokens_first(
    w: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    class: &PolicyConstraints,
) -> Option<Schedule> {
    if class.no_evict || class.reserve {
        return None;
    }
    let reqs = w.requests();
    let chunk_cap = prompt_chunk_cap(limits);
    // Whole prefill phases: every prompt, and every refill of I + 1 tokens, in one batch.
    if class.no_chunk
        && reqs
            .iter()
            .any(|r| u64::from(r.input_tokens) + u64::from(r.output_tokens > 1) > chunk_cap)
    {
        return None;
    }
    // The order of first tokens: arrival order under FCFS (first admissions in arrival
    // order), else the shortest prompt among the requests that have arrived.
    let order: Vec<u32> = if class.fcfs {
        w.fcfs_order()
    } else {
        let mut waiting: Vec<u32> = (0..reqs.len() as u32).collect();
        waiting.sort_by(|&a, &b| {
            reqs[a as usize]
                .arrival_s
                .total_cmp(&reqs[b as usize].arrival_s)
                .then(a.cmp(&b))
        });
        let mut order = Vec::with_capacity(reqs.len());
        let mut now = 0.0f64;
        let mut next = 0;
        // The arrived requests, shortest prompt (then lowest id) on top.
        let mut arrived: BinaryHeap<Reverse<(u32, u32)>> = BinaryHeap::new();
        while order.len() < reqs.len() {
            while next < waiting.len() && reqs[waiting[next] as usize].arrival_s <= now {
                let i = waiting[next];
                arrived.push(Reverse((reqs[i as usize].input_tokens, i)));
                next += 1;
            }
            let Some(Reverse((_, i))) = arrived.pop() else {
                now = reqs[waiting[next] as usize].arrival_s;
                continue;
            };
            let r = &reqs[i as usize];
            now = now.max(r.arrival_s) + prompt_time(cost, u64::from(r.input_tokens), chunk_cap);
            order.push(i);
        }
        order
    };
    let mut batches: Vec<Batch> = Vec::new();
    let mut evict_next: Option<u32> = None;
    // Phase one: each prompt, then its eviction at the start of the next batch.
    for &i in &order {
        let r = &reqs[i as usize];
        for (_, c) in chunks(u64::from(r.input_tokens), chunk_cap) {
            let mut entries: Vec<Entry> = evict_next.take().map(Entry::evict).into_iter().collect();
            entries.push(Entry::process(i, c));
            batches.push(Batch::new(entries));
        }
        // Requests with one output token are finished by their prompt.
        if r.output_tokens > 1 {
            evict_next = Some(i);
        }
    }
    finish_one_at_a_time(w, &order, evict_next, chunk_cap, &mut batches);
    Some(Schedule::new(batches))
}

/// Phase two, once every request has its first token: the request `holding` its KV (the
/// one prefilled last) decodes on at once; every other one (in `order`) refills its prompt
/// and first token (which generates its second) in chunks of at most `chunk_cap` and
/// decodes the rest, one request at a time.
fn finish_one_at_a_time(
    w: &Workload,
    order: &[u32],
    holding: Option<u32>,
    chunk_cap: u64,
    batches: &mut Vec<Batch>,
) {
    let reqs = w.requests();
    if let Some(i) = holding {
        for _ in 1..reqs[i as usize].output_tokens {
            batches.push(Batch::new(vec![Entry::process(i, 1)]));
        }
    }
    for &i in order {
        let r = &reqs[i as usize];
        if r.output_tokens <= 1 || holding == Some(i) {
            continue;
        }
        for (_, c) in chunks(u64::from(r.input_tokens) + 1, chunk_cap) {
            batches.push(Batch::new(vec![Entry::process(i, c)]));
        }
        for _ in 2..r.output_tokens {
            batches.push(Batch::new(vec![Entry::process(i, 1)]));
        }
    }
}

/// A schedule of `w` from `prompts`, a schedule of its first-token problem (`w` with every
/// output cut to one token, whose mean latency is `w`'s mean TTFT bound; milp.md, "The
/// phase relaxation"): its batches as they are, each followed by a batch evicting the
/// requests whose first token it gave (it takes no time, so every first token comes when
/// `prompts` finishes the request), then every request finished one at a time as first
/// tokens first does. Its mean TTFT is `prompts`' mean latency. None where evictions are
/// not allowed or `prompts` processes more than a prompt; the caller replays it.
pub(crate) fn finish_after_first_tokens(
    w: &Workload,
    limits: &Limits,
    class: &PolicyConstraints,
    prompts: &Schedule,
) -> Option<Schedule> {
    if class.no_evict || class.reserve {
        return None;
    }
    let (reqs, chunk_cap) = (w.requests(), prompt_chunk_cap(limits));
    let mut processed = vec![0u64; reqs.len()];
    let mut order = Vec::with_capacity(reqs.len());
    let mut batches = Vec::with_capacity(2 * prompts.batches.len() + reqs.len());
    for batch in &prompts.batches {
        let mut evictions = Vec::new();
        for e in &batch.entries {
            let i = e.request as usize;
            let (Some(r), infersched_core::Action::Process(c)) = (reqs.get(i), e.action) else {
                return None;
            };
            processed[i] += u64::from(c);
            if processed[i] > u64::from(r.input_tokens) {
                return None;
            }
            if processed[i] == u64::from(r.input_tokens) {
                order.push(e.request);
                if r.output_tokens > 1 {
                    evictions.push(Entry::evict(e.request));
                }
            }
        }
        batches.push(Batch::new(batch.entries.clone()));
        if !evictions.is_empty() {
            batches.push(Batch::new(evictions));
        }
    }
    if order.len() != reqs.len() {
        return None;
    }
    finish_one_at_a_time(w, &order, None, chunk_cap, &mut batches);
    Some(Schedule::new(batches))
}

/// The most prompt tokens one batch takes: `min(C, P)` (at least 1).
fn prompt_chunk_cap(limits: &Limits) -> u64 {
    limits
        .token_budget
        .unwrap_or(u64::MAX)
        .min(limits.effective_prefill_budget().unwrap_or(u64::MAX))
        .max(1)
}

/// Seconds to run a prompt of `tokens` alone, in chunks of at most `cap`.
fn prompt_time(cost: &dyn CostModel, tokens: u64, cap: u64) -> f64 {
    chunks(tokens, cap)
        .map(|(before, c)| {
            let mut f = BatchFeatures::default();
            f.add_prefill(u64::from(c), before);
            cost.batch_time_s(&f)
        })
        .sum()
}

/// `total` tokens in chunks of at most `cap` (and of at most `u32::MAX`, an entry's
/// width): each chunk with the tokens processed before it.
fn chunks(total: u64, cap: u64) -> impl Iterator<Item = (u64, u32)> {
    let cap = cap.clamp(1, u64::from(u32::MAX));
    (0..total.div_ceil(cap)).map(move |k| {
        let before = k * cap;
        (before, (total - before).min(cap) as u32)
    })
}

/// For mean TTFT, the schedule of the phase relaxation's plan of the first-token problem
/// (every output cut to one token): the plan searched as for mean latency on that problem
/// ([`crate::plan_schedule`]), its prompts then finished by
/// [`finish_after_first_tokens`] (evicted after their first token, finished
/// one at a time), so its mean TTFT is that problem's mean latency; when it is valid, in
/// the policy class and better than `warm`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn planned(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    class: &PolicyConstraints,
    plan: &PhasePlan,
    warm: Option<&Incumbent>,
    options: &SolveOptions,
    deadline: Instant,
) -> Option<Incumbent> {
    let cut = Workload::new(first_tokens_only(w)).ok()?;
    let (prompts, _, tried) = crate::plan_schedule::search_plans(
        &cut,
        limits,
        cost,
        Objective::MeanLatency,
        class,
        plan,
        options.plan_search_evaluations.max(1),
        deadline,
    )?;
    let schedule = finish_after_first_tokens(w, limits, class, &prompts)?;
    let replay = infersched_core::replay(w, limits, cost, &schedule).ok()?;
    if !class.admits(w, limits, &schedule) {
        return None;
    }
    let planned = Incumbent {
        name: format!("phase-relaxation plan of the first tokens (plans tried: {tried})"),
        schedule,
        replay,
    };
    let better = warm.is_none_or(|h| {
        planned.objective_value(Objective::MeanTtft) < h.objective_value(Objective::MeanTtft)
    });
    better.then_some(planned)
}

/// For mean TTFT, the best schedule the priority-list search reaches on the first-token
/// problem (every output cut to one token), from the portfolio's best there, finished after
/// the first tokens ([`finish_after_first_tokens`]), so its mean TTFT is
/// that problem's mean latency; when it is valid, in the class and better than `warm`.
pub(crate) fn searched(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    class: &PolicyConstraints,
    warm: Option<&Incumbent>,
    options: &SolveOptions,
    deadline: Instant,
) -> Option<Incumbent> {
    if class.no_evict || class.reserve {
        return None;
    }
    let cut = Workload::new(first_tokens_only(w)).ok()?;
    let start = crate::portfolio::best_heuristic(
        &cut,
        limits,
        cost,
        Objective::MeanLatency,
        class,
        &options.warm_start_from,
        deadline,
    )?;
    let budget = crate::list_search::SearchBudget {
        evaluations: options.list_search_evaluations,
        deadline,
    };
    let (prompts, _) = crate::list_search::improve(
        &cut,
        limits,
        cost,
        Objective::MeanLatency,
        class,
        start,
        budget,
    );
    let schedule = finish_after_first_tokens(w, limits, class, &prompts.schedule)?;
    let replay = infersched_core::replay(w, limits, cost, &schedule).ok()?;
    if !class.admits(w, limits, &schedule) {
        return None;
    }
    let searched = Incumbent {
        name: format!("{} on the first tokens", prompts.name),
        schedule,
        replay,
    };
    let better = warm.is_none_or(|h| {
        searched.objective_value(Objective::MeanTtft) < h.objective_value(Objective::MeanTtft)
    });
    better.then_some(searched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{Action, Summary, replay};
    use infersched_test_kit::workload;

    fn cost() -> infersched_cost_model::LinearCostModel {
        infersched_cost_model::preset("llama2-7b-a100").unwrap()
    }

    /// The batches, compactly (`0:4 1:evict`).
    fn text(s: &Schedule) -> Vec<String> {
        s.batches.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_first_token_schedule_is_finished_with_the_same_first_tokens() {
        // Request 0 (I = 4, O = 3) in two chunks, request 1 (I = 2, O = 1) beside the
        // second: 0 is evicted right after its first token, then refilled through its
        // first token (5 tokens) and decoded; 1 is finished by its prompt.
        let w = workload(&[(4, 3, 0.0), (2, 1, 0.0)]);
        let limits = Limits::unlimited();
        let class = PolicyConstraints::default();
        let prompts = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 2)]),
            Batch::new(vec![Entry::process(0, 2), Entry::process(1, 2)]),
        ]);
        let s = finish_after_first_tokens(&w, &limits, &class, &prompts).unwrap();
        assert_eq!(text(&s), ["0:2", "0:2 1:2", "0:evict", "0:5", "0:1"]);
        // Its mean TTFT is the first-token problem's mean latency.
        let cut = Workload::new(crate::bounds::first_tokens_only(&w)).unwrap();
        let ttft = Summary::from_replay(&replay(&w, &limits, &cost(), &s).unwrap()).mean_ttft_s;
        let latency =
            Summary::from_replay(&replay(&cut, &limits, &cost(), &prompts).unwrap()).mean_e2e_s;
        assert!((ttft - latency).abs() < 1e-12, "{ttft} {latency}");
        // Not where evictions are forbidden, nor from a schedule past a prompt.
        let no_evict = PolicyConstraints {
            no_evict: true,
            ..class
        };
        assert!(finish_after_first_tokens(&w, &limits, &no_evict, &prompts).is_none());
        let past = Schedule::new(vec![Batch::new(vec![Entry::process(1, 3)])]);
        assert!(finish_after_first_tokens(&w, &limits, &class, &past).is_none());
    }

    #[test]
    fn prompts_run_shortest_first_then_each_request_is_refilled_and_finished() {
        // Three requests at 0; M holds one of them at a time.
        let w = workload(&[(6, 3, 0.0), (2, 2, 0.0), (4, 1, 0.0)]);
        let limits = Limits {
            kv_capacity: Some(8),
            token_budget: Some(4),
            ..Limits::unlimited()
        };
        let s = first_tokens_first(&w, &limits, &cost(), &PolicyConstraints::default()).unwrap();
        assert_eq!(
            text(&s),
            [
                // Shortest prompt first; each prompt's chunks at most C = 4.
                "1:2",
                "1:evict 2:4", // request 2 (O = 1) is finished by its prompt
                "0:4",
                "0:2", // request 0 prefilled last keeps its KV and decodes on
                "0:1",
                "0:1",
                "1:3", // request 1 refills I + 1 = 3 tokens, generating its last
            ]
        );
        let r = replay(&w, &limits, &cost(), &s).unwrap();
        assert!(PolicyConstraints::default().admits(&w, &limits, &s));
        // First tokens in the order of the prompts' lengths.
        let first = |i: usize| r.requests[i].first_token_s;
        assert!(first(1) < first(2) && first(2) < first(0));
        assert_eq!(Summary::from_replay(&r).evictions, 1);
    }

    #[test]
    fn classes_that_forbid_it_get_none_and_fcfs_keeps_arrival_order() {
        let w = workload(&[(6, 3, 0.0), (2, 2, 0.001)]);
        let limits = Limits {
            kv_capacity: Some(8),
            ..Limits::unlimited()
        };
        let c = cost();
        for class in [
            PolicyConstraints {
                no_evict: true,
                ..PolicyConstraints::default()
            },
            PolicyConstraints {
                reserve: true,
                ..PolicyConstraints::default()
            },
        ] {
            assert!(first_tokens_first(&w, &limits, &c, &class).is_none());
        }
        // Whole prompts that do not fit C: none.
        let tight = Limits {
            token_budget: Some(4),
            ..limits
        };
        let no_chunk = PolicyConstraints {
            no_chunk: true,
            ..PolicyConstraints::default()
        };
        assert!(first_tokens_first(&w, &tight, &c, &no_chunk).is_none());
        // FCFS: request 0 (arrived first) starts first, and the class admits the result.
        let fcfs = PolicyConstraints {
            fcfs: true,
            no_mix: true,
            ..PolicyConstraints::default()
        };
        let s = first_tokens_first(&w, &limits, &c, &fcfs).unwrap();
        assert!(matches!(s.batches[0].entries[0].action, Action::Process(6)));
        assert!(fcfs.admits(&w, &limits, &s));
        replay(&w, &limits, &c, &s).unwrap();
    }

    #[test]
    fn the_schedule_is_valid_on_random_workloads_with_arrivals_and_budgets() {
        use rand::{Rng, SeedableRng};
        let c = cost();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..300 {
            let n = rng.random_range(1..8);
            let reqs: Vec<(u32, u32, f64)> = (0..n)
                .map(|_| {
                    (
                        rng.random_range(1..40),
                        rng.random_range(1..12),
                        f64::from(rng.random_range(0..4u32)) * 0.004,
                    )
                })
                .collect();
            let w = workload(&reqs);
            let need = infersched_test_kit::largest_kv_need(&w);
            let block = rng.random_range(1..5u32);
            let limits = Limits {
                // Enough for the largest request in whole blocks, and a little more.
                kv_capacity: Some(
                    need.div_ceil(u64::from(block)) * u64::from(block) + rng.random_range(0..8),
                ),
                token_budget: rng.random_bool(0.5).then(|| rng.random_range(1..24)),
                block_size: block,
                max_running: Some(1),
                ..Limits::unlimited()
            };
            let class = PolicyConstraints {
                fcfs: rng.random_bool(0.3),
                no_mix: rng.random_bool(0.3),
                ..PolicyConstraints::default()
            };
            let s = first_tokens_first(&w, &limits, &c, &class).unwrap();
            replay(&w, &limits, &c, &s).unwrap_or_else(|e| panic!("{reqs:?} {limits:?}: {e}"));
            assert!(class.admits(&w, &limits, &s), "{reqs:?} {limits:?}");
        }
    }

    #[test]
    fn chunks_cover_the_tokens_and_fit_an_entry() {
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), [(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks(0, 4).count(), 0);
        // An unlimited budget still makes entries of at most u32::MAX tokens.
        let big = u64::from(u32::MAX) + 1;
        assert_eq!(
            chunks(big, u64::MAX).collect::<Vec<_>>(),
            [(0, u32::MAX), (u64::from(u32::MAX), 1)]
        );
    }
    #[test]
    fn the_list_search_on_the_first_tokens_beats_first_tokens_first_on_real_requests() {
        // The second burst of README family (b) n = 128: 51 Splitwise requests (past the
        // phase relaxation's 48; I + O <= 4096, arrivals compressed 4x), C = 4096: the list search
        // on the first-token problem, finished after the first tokens, is valid, in the
        // class, and beats first tokens first (its TTFT the cut schedule's mean latency).
        let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../notebooks-data/traces/splitwise_code.csv");
        let all = infersched_workload::read_trace(&trace).unwrap();
        let w = Workload::new(
            all.requests()
                .iter()
                .skip(12)
                .take(51)
                .map(|r| infersched_core::Request {
                    input_tokens: r.input_tokens.min(4096 - r.output_tokens),
                    output_tokens: r.output_tokens,
                    arrival_s: r.arrival_s * 0.25,
                })
                .collect(),
        )
        .unwrap();
        let limits = Limits {
            token_budget: Some(4096),
            kv_capacity: Some(32_768),
            ..Limits::unlimited()
        };
        let class = PolicyConstraints::default();
        let ftf = first_tokens_first(&w, &limits, &cost(), &class).unwrap();
        let start = Incumbent {
            name: "first-tokens-first".into(),
            replay: infersched_core::replay(&w, &limits, &cost(), &ftf).unwrap(),
            schedule: ftf,
        };
        let far = Instant::now() + std::time::Duration::from_secs(600);
        let found = searched(
            &w,
            &limits,
            &cost(),
            &class,
            Some(&start),
            &SolveOptions::default(),
            far,
        )
        .expect("better than first tokens first");
        let (ttft, before) = (
            found.objective_value(Objective::MeanTtft),
            start.objective_value(Objective::MeanTtft),
        );
        assert!(ttft < before, "{ttft} {before}");
        assert!(class.admits(&w, &limits, &found.schedule));
        assert!(
            found.name.ends_with("on the first tokens"),
            "{}",
            found.name
        );
        // Not where evictions are forbidden.
        let no_evict = PolicyConstraints {
            no_evict: true,
            ..class
        };
        assert!(
            searched(
                &w,
                &limits,
                &cost(),
                &no_evict,
                None,
                &SolveOptions::default(),
                far
            )
            .is_none()
        );
    }
}
