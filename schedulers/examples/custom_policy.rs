//! A scheduling policy of your own, plugged into the simulation loop, and a hand-made
//! schedule checked by the independent replay.
//!
//!     cargo run --release -p infersched-schedulers --example custom_policy
//!
//! The policy, "shortest prompt first", decodes every running request each step, then
//! admits waiting requests with the shortest prompt first, each with its whole prompt in
//! the batch and its whole `I + O - 1` KV reserved, so it never has to evict. The
//! simulator emits a schedule; the replay (not the policy) validates it and computes the
//! metrics, exactly as for the built-in policies.

use infersched_core::{Batch, Entry, Limits, Request, Schedule, Summary, Workload, replay};
use infersched_schedulers::{Knobs, Policy, SchedulerKind, SimError, Simulator, simulate};

/// Shortest prompt first, whole prompts, full reservation, no preemption.
struct ShortestPromptFirst;

impl Policy for ShortestPromptFirst {
    fn name(&self) -> String {
        "shortest-prompt-first".into()
    }

    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        // Every request must fit alone: its reservation in M, its prompt in one batch.
        let c = sim.limits().token_budget.unwrap_or(u64::MAX);
        for i in 0..sim.requests().len() as u32 {
            let r = sim.request(i);
            if sim.blocks_for(r.max_kv_tokens()) > sim.total_blocks()
                || u64::from(r.input_tokens) > c
            {
                return Err(SimError::Unservable {
                    policy: self.name(),
                    request: i,
                    reason: "its prompt or its reservation does not fit alone".into(),
                });
            }
        }
        Ok(())
    }

    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        // 1. Every running request that is ready decodes one token (its reservation
        //    already covers the growth).
        for i in sim.running().to_vec() {
            if sim.token_room() > 0 && sim.is_decode_ready(i) {
                sim.process(i, 1, sim.held(i) + 1);
            }
        }
        // 2. Waiting requests, shortest prompt first (ties: arrival order), while their
        //    whole prompt fits the batch and their reservation fits the free KV.
        let mut waiting: Vec<u32> = sim.waiting().iter().copied().collect();
        waiting.sort_by_key(|&i| sim.request(i).input_tokens);
        for i in waiting {
            let prompt = sim.remaining(i);
            let reservation = sim.request(i).max_kv_tokens();
            if !sim.running_room()
                || prompt > sim.token_room()
                || sim.extra_blocks(i, reservation) > sim.free_blocks()
            {
                break;
            }
            sim.admit(i);
            sim.process(i, prompt, reservation);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cost = infersched_cost_model::preset("llama2-7b-a100").ok_or("no such preset")?;
    let r = |input_tokens, output_tokens, arrival_s| Request {
        input_tokens,
        output_tokens,
        arrival_s,
    };
    let w = Workload::new(vec![
        r(900, 20, 0.0),
        r(40, 30, 0.0),
        r(300, 10, 0.01),
        r(20, 5, 0.02),
        r(600, 40, 0.03),
    ])?;
    let limits = Limits {
        kv_capacity: Some(2048),
        token_budget: Some(1024),
        block_size: 16,
        ..Limits::unlimited()
    };

    // The custom policy and a built-in one, each replayed independently.
    let mine = simulate(&w, &limits, &mut ShortestPromptFirst, &cost)?;
    let theirs = SchedulerKind::Vllm.simulate(&w, &Knobs::matching(&limits), &cost)?;
    for (name, schedule) in [
        ("shortest-prompt-first", &mine.schedule),
        ("vllm", &theirs.schedule),
    ] {
        let s = Summary::from_replay(&replay(&w, &limits, &cost, schedule)?);
        println!(
            "{name:<22} makespan {:7.2} ms  mean E2E {:7.2} ms  mean TTFT {:7.2} ms  evictions {}",
            s.makespan_s * 1e3,
            s.mean_e2e_s * 1e3,
            s.mean_ttft_s * 1e3,
            s.evictions
        );
    }

    // A schedule written by hand: two requests, prompts of 4 and 3 tokens, 2 outputs each.
    let pair = Workload::new(vec![r(4, 2, 0.0), r(3, 2, 0.0)])?;
    let by_hand = Schedule::new(vec![
        Batch::new(vec![Entry::process(0, 4), Entry::process(1, 3)]),
        Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
    ]);
    let ok = replay(&pair, &Limits::unlimited(), &cost, &by_hand)?;
    println!(
        "hand-made schedule: valid, makespan {:.3} ms",
        ok.makespan_s() * 1e3
    );
    // The same schedule with M = 8 KV tokens: after the second batch the two requests hold
    // 5 + 4 = 9 tokens, and the replay says which batch, request and rule.
    let tight = Limits {
        kv_capacity: Some(8),
        ..Limits::unlimited()
    };
    match replay(&pair, &tight, &cost, &by_hand) {
        Ok(_) => println!("unexpected: the replay accepted a schedule over M"),
        Err(e) => println!("hand-made schedule under M = 8: rejected: {e}"),
    }
    Ok(())
}
