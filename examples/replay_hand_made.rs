//! A schedule written by hand, judged by the independent replay: the replay checks every
//! rule of the execution model (docs/design/semantics.md), times each batch with the cost
//! model and computes every metric, so any producer (a notebook, another simulator, a
//! schedule logged from a real server) is measured the same way as infersched's own.
//!
//!     cargo run --release --example replay_hand_made
//!
//! Two requests, KV capacity M = 12 tokens: request 0 (I = 6, O = 3) and request 1
//! (I = 4, O = 2). One schedule serves them one after the other (5 batches), one batches
//! them together (3 batches, 12 tokens of KV at the peak); with M = 11 the replay rejects
//! the second, naming the batch, the request and the rule it breaks. Measured with
//! `llama2-7b-a100`: 19.118 ms against 11.389 ms makespan.

use infersched::core::{Batch, Entry, Instance, Limits, Request, Schedule, Summary, Workload};

fn main() -> anyhow::Result<()> {
    let workload = Workload::new(vec![
        Request {
            input_tokens: 6,
            output_tokens: 3,
            arrival_s: 0.0,
        },
        Request {
            input_tokens: 4,
            output_tokens: 2,
            arrival_s: 0.0,
        },
    ])?;
    let limits = Limits {
        kv_capacity: Some(12),
        ..Limits::unlimited()
    };
    let cost = infersched::cost_model::resolve("llama2-7b-a100")?;
    // Checked once: the limits are valid and every request fits M on its own.
    let instance = Instance::new(workload, limits, cost)?;

    // Request 1 first, whole; request 0 once request 1 has finished and freed its KV.
    // A prefill batch generates the first token, so O = 2 needs one decode after it.
    let serial = Schedule::new(vec![
        Batch::new(vec![Entry::process(1, 4)]),
        Batch::new(vec![Entry::process(1, 1)]),
        Batch::new(vec![Entry::process(0, 6)]),
        Batch::new(vec![Entry::process(0, 1)]),
        Batch::new(vec![Entry::process(0, 1)]),
    ]);
    let replay = instance.replay(&serial)?;
    let summary = Summary::from_replay(&replay);
    println!(
        "serial: {} batches, makespan {:.3} ms, mean E2E latency {:.3} ms",
        summary.batches,
        summary.makespan_s * 1e3,
        summary.mean_e2e_s * 1e3
    );
    for b in &replay.batches {
        println!(
            "  batch {}: {:.3}-{:.3} ms, {} tokens, KV {} after it",
            b.index,
            b.start_s * 1e3,
            b.end_s * 1e3,
            b.features.tokens,
            b.kv_tokens
        );
    }

    // Both prompts in one batch (6 + 4 = 10 tokens of KV), then both decode: after the
    // decode KV would be 7 + 5 = 12, still within M; the next decode of request 0 needs
    // 8 + 5 = 13 > 12 unless request 1 has finished, which it has (O = 2).
    let together = Schedule::new(vec![
        Batch::new(vec![Entry::process(0, 6), Entry::process(1, 4)]),
        Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
        Batch::new(vec![Entry::process(0, 1)]),
    ]);
    let replay = instance.replay(&together)?;
    let summary = Summary::from_replay(&replay);
    println!(
        "together: {} batches, makespan {:.3} ms, mean E2E latency {:.3} ms",
        summary.batches,
        summary.makespan_s * 1e3,
        summary.mean_e2e_s * 1e3
    );

    // Over the capacity: with M = 11 the shared decode batch needs 12 tokens of KV.
    let tight = instance.with_limits(Limits {
        kv_capacity: Some(11),
        ..Limits::unlimited()
    })?;
    match tight.replay(&together) {
        Ok(_) => anyhow::bail!("the replay accepted a schedule over M"),
        Err(e) => println!("with M = 11 the replay rejects it: {e}"),
    }
    Ok(())
}
