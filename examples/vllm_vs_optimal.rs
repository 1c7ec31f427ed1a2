//! The question infersched answers, through the library: how far is vLLM's schedule from
//! the best possible one on this workload, GPU and memory budget, and why?
//!
//!     cargo run --release --example vllm_vs_optimal
//!
//! Eight requests with real Splitwise lengths (the bundled trace, prompts cut so that
//! I + O <= 1,024), a 4,096-token KV budget and Llama-2-7B on an A100. Every schedule goes
//! through the same independent replay ([`infersched::produce`]); the solver's answer
//! carries a proven lower bound, so the ratio is certified even when optimality is not.

use infersched::core::{Instance, Limits};
use infersched::produce::{produce_heuristic, produce_optimal};
use infersched::schedulers::{Knobs, SchedulerKind};
use infersched::solver::{Objective, SolveOptions};
use infersched::workload::{SampleSpec, Selection, read_trace, sample};

fn main() -> anyhow::Result<()> {
    let trace = read_trace(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/notebooks-data/traces/splitwise_code.csv"
    )))?;
    let workload = sample(
        &trace,
        &SampleSpec {
            selection: Selection::First(8),
            max_total_tokens: Some(1024),
            rebase_time: true,
            ..SampleSpec::default()
        },
    )?;
    let cost = infersched::cost_model::resolve("llama2-7b-a100")?;
    let limits = Limits {
        kv_capacity: Some(4096),
        block_size: 16,
        ..Limits::unlimited()
    };
    // One validated question: the workload fits these limits at all.
    let instance = Instance::new(workload, limits, cost)?;
    let (w, cost) = (instance.workload(), instance.cost());

    // vLLM as it runs by default, but under the same KV capacity and block size.
    let knobs = Knobs {
        kv_capacity: limits.kv_capacity,
        block_size: Some(limits.block_size),
        ..Knobs::default()
    };
    let vllm = produce_heuristic(w, cost, SchedulerKind::Vllm, &knobs)?;
    let options = SolveOptions {
        time_limit_s: 20.0,
        ..SolveOptions::default()
    };
    let best = produce_optimal(w, cost, &limits, Objective::MeanLatency, &options)?;
    let report = best
        .solve
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the solver's outcome has no report"))?;

    let (v, o) = (vllm.summary.mean_e2e_s, best.summary.mean_e2e_s);
    println!("mean E2E latency, {} requests:", w.len());
    println!("  vllm       {:8.2} ms", v * 1e3);
    println!(
        "  best found {:8.2} ms ({}, by {})",
        o * 1e3,
        report.status,
        report.method
    );
    println!(
        "  lower bound {:7.2} ms ({}): vllm is at most {:.1}% above the optimum, at least {:.1}%",
        report.best_bound * 1e3,
        report.bound_method.name(),
        (v / report.best_bound - 1.0) * 100.0,
        (v / o - 1.0) * 100.0
    );
    // Why: the makespan split into the cost model's terms, for both schedules.
    for (name, outcome) in [("vllm", &vllm), ("best", &best)] {
        let t = &outcome.time_split;
        println!(
            "  {name:<5} makespan {:.2} ms: batch bias {:.2}, tokens {:.2}, recompute {:.2}, idle {:.2} ms; {} evictions",
            t.total_s() * 1e3,
            t.batch_bias_s * 1e3,
            t.linear_tokens_s * 1e3,
            t.recomputation_s * 1e3,
            t.idle_s * 1e3,
            outcome.summary.evictions
        );
    }
    Ok(())
}
