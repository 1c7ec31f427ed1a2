//! The batch-index bound on the mean latency of a workload, alone (no schedule, no other
//! bound): how it moves with the time it is given.
//!
//!     cargo run --release -p infersched-solver --example batch_index_bound -- \
//!         WORKLOAD.csv [TIME_LIMIT_S [TOKEN_BUDGET [KV_CAPACITY [BLOCK [THREADS]]]]]
//!
//! The workload is a CSV file as `infersched workload` writes it; the cost model is
//! `llama2-7b-a100` (defaults: 60 s, C = 2,048, M = 32,768, blocks of 16, 2 threads).

use std::path::Path;
use std::time::Instant;

use infersched_core::Limits;
use infersched_solver::{Objective, bounds};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: batch_index_bound WORKLOAD.csv [TIME_S [C [M [BLOCK [THREADS]]]]]")?;
    let number = |k: usize, default: f64| -> Result<f64, String> {
        args.get(k).map_or(Ok(default), |s| {
            s.parse().map_err(|e| format!("argument {k} ({s}): {e}"))
        })
    };
    let time_s = number(1, 60.0)?;
    let threads = number(5, 2.0)? as u32;
    let w = infersched_workload::read_trace(Path::new(path)).map_err(|e| e.to_string())?;
    let limits = Limits {
        token_budget: Some(number(2, 2048.0)? as u64),
        kv_capacity: Some(number(3, 32_768.0)? as u64),
        block_size: number(4, 16.0)? as u32,
        ..Limits::unlimited()
    };
    let cost = infersched_cost_model::preset("llama2-7b-a100").ok_or("no such preset")?;
    let start = Instant::now();
    let bound =
        bounds::batch_index_bound(&w, &limits, &cost, Objective::MeanLatency, time_s, threads);
    let took = start.elapsed().as_secs_f64();
    match bound {
        Some(b) => println!(
            "batch-index bound {:.6} s mean latency in {took:.2} s",
            b.value_s
        ),
        None => println!("the batch-index bound does not apply ({took:.2} s)"),
    }
    Ok(())
}
