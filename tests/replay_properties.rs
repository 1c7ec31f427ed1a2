//! Property tests of the replay over random workloads, limits and valid schedules.
//!
//! The schedules come from a randomized producer written here (it is not one of the
//! product's schedulers): it keeps its own account of every request's KV and of the
//! memory in use, and the replay's independent accounting must agree with it batch by
//! batch.

use infersched::core::{
    Action, Batch, Entry, Limits, Replay, ReplayError, Schedule, Summary, Workload, replay,
};
use infersched::cost_model::{TimeBreakdown, preset};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A random valid schedule, and the producer's own per-batch (KV occupied, running) account.
fn random_schedule(w: &Workload, l: &Limits, seed: u64) -> (Schedule, Vec<(u64, u64)>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let reqs = w.requests();
    let n = reqs.len();
    let mut m = vec![0u64; n];
    let mut g = vec![0u32; n];
    let mut batches = Vec::new();
    let mut account = Vec::new();
    let done = |g: &[u32]| (0..n).all(|i| g[i] == reqs[i].output_tokens);
    let kv = |m: &[u64]| m.iter().map(|&x| l.occupied(x)).sum::<u64>();
    let running = |m: &[u64]| m.iter().filter(|&&x| x > 0).count() as u64;
    let c_max = l.token_budget.unwrap_or(u64::MAX);
    let p_max = l.effective_prefill_budget().unwrap_or(u64::MAX);
    let m_max = l.kv_capacity.unwrap_or(u64::MAX);
    let r_max = l.max_running.unwrap_or(u64::MAX);
    let mut rounds = 0;
    while !done(&g) {
        rounds += 1;
        let mut entries = Vec::new();
        let mut finishing = Vec::new();
        if rounds > 60 {
            // Fallback that always completes: serve the first unfinished request alone,
            // evicting every other holder in the same batch.
            let i = (0..n).find(|&i| g[i] < reqs[i].output_tokens).unwrap();
            for (j, held) in m.iter_mut().enumerate() {
                if j != i && *held > 0 {
                    entries.push(Entry::evict(j as u32));
                    *held = 0;
                }
            }
            let known = u64::from(reqs[i].input_tokens + g[i]);
            let decode = g[i] >= 1 && m[i] + 1 == known;
            let cap = if decode { c_max } else { c_max.min(p_max) };
            let c = (known - m[i]).min(cap);
            m[i] += c;
            entries.push(Entry::process(i as u32, c as u32));
            if m[i] == known {
                g[i] += 1;
                if g[i] == reqs[i].output_tokens {
                    finishing.push(i);
                }
            }
        } else {
            let mut order: Vec<usize> = (0..n).collect();
            for k in (1..n).rev() {
                order.swap(k, rng.random_range(0..=k));
            }
            let (mut tokens, mut prefill) = (0u64, 0u64);
            for i in order {
                if g[i] == reqs[i].output_tokens || rng.random_bool(0.2) {
                    continue;
                }
                if m[i] > 0 && rng.random_bool(0.05) {
                    entries.push(Entry::evict(i as u32));
                    m[i] = 0;
                    continue;
                }
                let known = u64::from(reqs[i].input_tokens + g[i]);
                let decode = g[i] >= 1 && m[i] + 1 == known;
                let mut room = (known - m[i]).min(c_max - tokens);
                if !decode {
                    room = room.min(p_max - prefill);
                }
                if room == 0 {
                    continue;
                }
                let c = if rng.random_bool(0.7) {
                    room
                } else {
                    rng.random_range(1..=room)
                };
                let new_kv = kv(&m) - l.occupied(m[i]) + l.occupied(m[i] + c);
                let new_running = running(&m) + u64::from(m[i] == 0);
                if new_kv > m_max || new_running > r_max {
                    continue;
                }
                m[i] += c;
                tokens += c;
                if !decode {
                    prefill += c;
                }
                entries.push(Entry::process(i as u32, c as u32));
                if m[i] == known {
                    g[i] += 1;
                    if g[i] == reqs[i].output_tokens {
                        finishing.push(i);
                    }
                }
            }
        }
        account.push((kv(&m), running(&m)));
        for i in finishing {
            m[i] = 0;
        }
        batches.push(Batch::new(entries));
    }
    (Schedule::new(batches), account)
}

fn arb_case() -> impl Strategy<Value = (Workload, Limits, u64)> {
    let request = (1u32..12, 1u32..6, prop_oneof![Just(0.0), 0.0f64..0.5]);
    (
        prop::collection::vec(request, 1..6),
        prop::option::of(1u64..24),
        prop::option::of(1u64..3),
        prop::option::of(1u64..4),
        1u32..4,
        any::<u64>(),
    )
        .prop_map(|(rs, c, p_frac, r_max, block, seed)| {
            let w = infersched_test_kit::workload(&rs);
            let need = infersched_test_kit::largest_kv_need(&w);
            let l0 = Limits {
                block_size: block,
                ..Limits::unlimited()
            };
            let m = l0.occupied(need) + u64::from(block) * (seed % 5);
            let limits = Limits {
                token_budget: c,
                prefill_budget: c.zip(p_frac).map(|(c, f)| (c / f).max(1)),
                kv_capacity: Some(m),
                max_running: r_max,
                block_size: block,
                watermark: 0.0,
            };
            (w, limits, seed)
        })
}

fn write_all(r: &Replay, s: &Summary) -> (Vec<u8>, Vec<u8>, String) {
    let mut a = Vec::new();
    let mut b = Vec::new();
    infersched::output::write_requests_csv(r, &mut a).unwrap();
    infersched::output::write_batches_csv(r, &mut b).unwrap();
    (a, b, serde_json::to_string(s).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn replay_agrees_with_the_producers_accounting((w, limits, seed) in arb_case()) {
        let cost = preset("llama2-7b-a100").unwrap();
        let (schedule, account) = random_schedule(&w, &limits, seed);
        let r = replay(&w, &limits, &cost, &schedule).unwrap();
        prop_assert_eq!(r.batches.len(), account.len());
        for (b, &(kv, running)) in r.batches.iter().zip(&account) {
            prop_assert_eq!(b.kv_tokens, kv, "batch {}", b.index);
            prop_assert_eq!(b.running, running, "batch {}", b.index);
            prop_assert!(b.kv_tokens <= limits.kv_capacity.unwrap());
            prop_assert!(b.running <= limits.max_running.unwrap_or(u64::MAX));
            prop_assert!(b.features.tokens <= limits.token_budget.unwrap_or(u64::MAX));
            prop_assert!(b.prefill_tokens <= limits.effective_prefill_budget().unwrap_or(u64::MAX));
            prop_assert!(b.end_s >= b.start_s);
        }
        for pair in r.batches.windows(2) {
            prop_assert!(pair[1].start_s >= pair[0].end_s);
        }
        let mut generated_total = 0u64;
        for (rec, req) in r.requests.iter().zip(w.requests()) {
            // Tokens processed = I + O - 1 + recomputed.
            prop_assert_eq!(rec.processed_tokens, req.max_kv_tokens() + rec.recomputed_tokens);
            prop_assert!(rec.first_scheduled_s >= req.arrival_s);
            prop_assert!(rec.first_token_s > rec.first_scheduled_s);
            prop_assert!(rec.completion_s >= rec.first_token_s);
            generated_total += u64::from(req.output_tokens);
        }
        // Every request generates exactly O tokens, each in some batch.
        prop_assert_eq!(r.batches.iter().map(|b| u64::from(b.generated)).sum::<u64>(), generated_total);
        let processed: u64 = r.requests.iter().map(|x| x.processed_tokens).sum();
        prop_assert_eq!(r.batches.iter().map(|b| b.features.tokens).sum::<u64>(), processed);
        let s = Summary::from_replay(&r);
        prop_assert!((s.busy_s + s.idle_s - s.makespan_s).abs() < 1e-9);
        // The time breakdown splits the makespan exactly; refills are its recomputation.
        let parts = TimeBreakdown::of(&cost, &w, &schedule, &r);
        prop_assert!((parts.total_s() - s.makespan_s).abs() < 1e-9 * s.makespan_s.max(1.0), "{:?}", parts);
        prop_assert!((parts.idle_s - s.idle_s).abs() < 1e-9, "{:?}", parts);
        prop_assert!(parts.terms().iter().all(|&x| x >= 0.0), "{:?}", parts);
        prop_assert_eq!(parts.recomputation_s > 0.0, s.recomputed_tokens > 0);
        prop_assert!(s.ttft_s.p50 <= s.ttft_s.p99 && s.ttft_s.p99 <= s.ttft_s.max);
        // Identical input, identical bytes.
        let r2 = replay(&w, &limits, &cost, &schedule).unwrap();
        prop_assert_eq!(write_all(&r, &s), write_all(&r2, &Summary::from_replay(&r2)));
    }

    #[test]
    fn broken_schedules_are_rejected_never_panic((w, limits, seed) in arb_case(), pick in any::<prop::sample::Index>()) {
        let cost = preset("llama2-7b-a100").unwrap();
        let (schedule, _) = random_schedule(&w, &limits, seed);
        // Dropping the last batch leaves a request unfinished.
        let mut cut = schedule.clone();
        cut.batches.pop();
        prop_assert!(
            matches!(replay(&w, &limits, &cost, &cut), Err(ReplayError::NeverFinished { .. })),
            "a schedule without its last batch must leave a request unfinished"
        );
        // One more token for some processing entry breaks the known-token rule there or later,
        // or leaves the request over-processed: the schedule is no longer valid as a whole,
        // unless the extra token only merged two chunks of a prefill (then it is still valid
        // but finishes the prompt earlier, which the replay must then accept).
        let positions: Vec<(usize, usize)> = schedule.batches.iter().enumerate()
            .flat_map(|(j, b)| b.entries.iter().enumerate().filter(|(_, e)| matches!(e.action, Action::Process(_))).map(move |(k, _)| (j, k)))
            .collect();
        let (j, k) = positions[pick.index(positions.len())];
        let mut bumped = schedule.clone();
        if let Action::Process(c) = bumped.batches[j].entries[k].action {
            bumped.batches[j].entries[k].action = Action::Process(c + 1);
        }
        let _ = replay(&w, &limits, &cost, &bumped); // must not panic
        // Scheduling a finished request again is rejected with that rule.
        let mut again = schedule.clone();
        again.batches.push(Batch::new(vec![Entry::process(0, 1)]));
        let rejected_as_finished = matches!(
            replay(&w, &limits, &cost, &again),
            Err(ReplayError::FinishedRequestScheduled { request: 0, .. })
        );
        prop_assert!(rejected_as_finished);
    }
}
