//! Solves two workloads through the library: a small one that the exact methods prove
//! optimal, and real Splitwise request lengths under a token budget, where the exact model
//! would not fit the memory limit and the best heuristic schedule comes back with a
//! combinatorial lower bound and a certified gap.
//!
//!     cargo run --release -p infersched-solver --example solve_workload

use infersched_core::{Limits, Request, Workload};
use infersched_solver::{Objective, Solver};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cost = infersched_cost_model::preset("llama2-7b-a100").ok_or("no such preset")?;
    let small = Workload::new(vec![
        Request {
            input_tokens: 6,
            output_tokens: 3,
            arrival_s: 0.0,
        },
        Request {
            input_tokens: 4,
            output_tokens: 5,
            arrival_s: 0.0,
        },
        Request {
            input_tokens: 9,
            output_tokens: 2,
            arrival_s: 0.01,
        },
    ])?;
    let limits = Limits {
        kv_capacity: Some(20),
        token_budget: Some(8),
        ..Limits::unlimited()
    };
    // The first six rows of notebooks-data/traces/splitwise_code.csv: real prompt and
    // output lengths, and their arrivals.
    let real = Workload::new(
        [
            (4808u32, 10u32, 0.0),
            (3180, 8, 0.052),
            (110, 27, 0.098189),
            (7433, 14, 0.140684),
            (34, 12, 0.444994),
            (374, 14, 0.539187),
        ]
        .into_iter()
        .map(|(i, o, t)| Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        })
        .collect(),
    )?;
    let real_limits = Limits {
        kv_capacity: Some(32_768),
        token_budget: Some(2048),
        block_size: 16,
        ..Limits::unlimited()
    };
    for (name, w, limits) in [
        ("small", &small, &limits),
        ("splitwise", &real, &real_limits),
    ] {
        for objective in [Objective::Makespan, Objective::MeanLatency] {
            let report = Solver::new(w, limits, &cost)
                .objective(objective)
                .time_limit(20.0)
                .solve()?;
            println!(
                "{name} {objective:?}: {:.3} ms by {}, bound {:.3} ms ({}), gap {:.2}%, {}",
                report.replayed_objective * 1e3,
                report.method.name(),
                report.best_bound * 1e3,
                report.bound_method.name(),
                report.certified_gap * 100.0,
                report.status.name()
            );
            if let Some(note) = &report.note {
                println!("  {note}");
            }
        }
    }
    Ok(())
}
