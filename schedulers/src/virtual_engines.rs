//! vLLM v0 on a pipeline: its *virtual engines* (`vllm --pp P`, semantics.md "Pipeline
//! parallelism").
//!
//! vLLM v0 with `pipeline_parallel_size = P` runs P schedulers, each over `1 / P` of the
//! KV blocks (`Scheduler.__init__`: `num_gpu_blocks //= pipeline_parallel_size`) with its
//! own queues; an arriving request goes to the one with the fewest unfinished requests
//! (`LLMEngine.add_request`, ties to the first); each engine builds its next batch when
//! the output of its last one is back (`AsyncLLMEngine.run_engine_loop`, one step per
//! virtual engine in flight), and the batches enter the pipeline in the order they are
//! built. Here each engine is a simulation of its own requests whose batches are timed by
//! one [`PipelineClock`] shared by all; the engine whose next decision comes first builds
//! next. The schedule is every engine's batches in that order, in the workload's ids.

use crate::sim::{Run, Simulation, Simulator, Step, check_servable};
use crate::{Policy, SimError};
use infersched_core::{Batch, CostModel, Limits, Pipeline, PipelineClock, Schedule, Workload};
use std::cell::RefCell;
use std::rc::Rc;

/// The limits of one of `p` virtual engines under the replica's `limits`: `1 / p` of the
/// KV blocks (none left over is refused by the caller).
fn engine_limits(limits: &Limits, p: u64) -> Limits {
    let block = u64::from(limits.block_size);
    Limits {
        kv_capacity: limits.kv_capacity.map(|m| m / block / p * block),
        ..*limits
    }
}

/// Simulates vLLM v0's virtual engines, `engines.len()` of them (the pipeline's stages),
/// on `workload` under the replica's `limits`. The simulation's limits are those its
/// schedule replays under on the pipeline: M the engines' blocks together, R_max each
/// engine's times their number (each engine admits up to R_max).
pub fn simulate_virtual_engines(
    workload: &Workload,
    limits: &Limits,
    engines: &mut [Box<dyn Policy>],
    cost: &dyn CostModel,
    pipeline: &Pipeline,
) -> Result<Simulation, SimError> {
    limits.validate()?;
    pipeline.validate()?;
    let p = engines.len();
    if p != pipeline.stages as usize || p == 0 {
        return Err(SimError::Replicas(p));
    }
    let one = engine_limits(limits, p as u64);
    if one.kv_capacity == Some(0) {
        return Err(SimError::Unservable {
            policy: engines[0].name(),
            request: 0,
            reason: format!(
                "each of the {p} virtual engines gets 1 / {p} of M's blocks, and M = {} in blocks of {} leaves them none",
                limits.kv_capacity.unwrap_or(0),
                limits.block_size
            ),
        });
    }
    one.validate()?;
    check_servable(
        workload,
        &one,
        engines[0].as_ref(),
        &Simulator::new(workload, one),
    )?;
    let clock = Rc::new(RefCell::new(PipelineClock::new(*pipeline)));
    let mut runs: Vec<Run<'_>> = (0..p)
        .map(|_| {
            let mut run = Run::new(Simulator::empty(one), 0);
            run.share_clock(Rc::clone(&clock));
            run
        })
        .collect();
    let (members, order) = drive(workload, &mut runs, engines, cost)?;
    let mut per_engine: Vec<Vec<Batch>> = Vec::with_capacity(p);
    for ((run, policy), ids) in runs.into_iter().zip(engines.iter()).zip(&members) {
        let mut s = run.finish(policy.as_ref()).schedule;
        for batch in &mut s.batches {
            for e in &mut batch.entries {
                e.request = ids[e.request as usize];
            }
        }
        per_engine.push(s.batches);
    }
    let mut next = vec![0usize; p];
    let batches = order
        .iter()
        .map(|&v| {
            next[v] += 1;
            std::mem::take(&mut per_engine[v][next[v] - 1])
        })
        .collect();
    let mut schedule = Schedule::new(batches);
    schedule.meta = Some(serde_json::json!({
        "producer": engines[0].name(),
        "virtual_engines": p,
    }));
    Ok(Simulation {
        schedule,
        accounts: Vec::new(),
        limits: Limits {
            kv_capacity: one.kv_capacity.map(|m| m * p as u64),
            max_running: limits.max_running.map(|r| r.saturating_mul(p as u64)),
            ..*limits
        },
    })
}

/// Runs the engines to the end: routes each request at its arrival to the engine with the
/// fewest unfinished requests then, and steps the engine whose next decision comes first.
/// Returns each engine's requests (workload ids, in the order given to it) and the engine
/// of each batch, in the order the batches entered the pipeline.
fn drive(
    workload: &Workload,
    runs: &mut [Run<'_>],
    engines: &mut [Box<dyn Policy>],
    cost: &dyn CostModel,
) -> Result<(Vec<Vec<u32>>, Vec<usize>), SimError> {
    let arrivals = workload.fcfs_order();
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); runs.len()];
    let (mut next, mut order) = (0, Vec::new());
    loop {
        let due = (0..runs.len())
            .filter_map(|v| runs[v].due_s().map(|t| (t, v)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if let Some(&g) = arrivals.get(next) {
            let request = workload.requests()[g as usize];
            if due.is_none_or(|(t, _)| request.arrival_s <= t) {
                let v = (0..runs.len())
                    .min_by_key(|&v| (runs[v].unfinished_at(request.arrival_s), v))
                    .expect("at least one engine");
                runs[v].add_request(request, Vec::new(), workload.transferred(g as usize));
                members[v].push(g);
                next += 1;
                continue;
            }
        }
        let Some((_, v)) = due else { break };
        let step = runs[v]
            .step(engines[v].as_mut(), cost)
            .map_err(|e| SimError::Replica {
                replica: v as u32,
                source: Box::new(e),
            })?;
        if step == Step::Batch {
            order.push(v);
        }
    }
    Ok((members, order))
}

#[cfg(test)]
mod tests {
    use crate::{Knobs, SchedulerKind};
    use infersched_core::{Pipeline, replay_pipelined};
    use infersched_test_kit::EverySecond as Second;

    fn two_stages() -> Pipeline {
        Pipeline {
            stages: 2,
            send_latency_s: 0.0,
            send_s_per_token: 0.0,
        }
    }

    #[test]
    fn two_virtual_engines_take_a_request_each_and_interleave_their_batches() {
        // Every batch 1 s, half a second per stage. Request 0 goes to engine 0, request 1
        // (engine 0 has one unfinished) to engine 1. Engine 0: prompt [0, 1], decode
        // [1, 2]; engine 1: prompt [0.5, 1.5] (stage 0 is busy until 0.5), decode
        // [1.5, 2.5]. One engine would batch them together: both done at 2.
        let w = infersched_test_kit::workload(&[(4, 2, 0.0), (4, 2, 0.0)]);
        let knobs = Knobs {
            kv_capacity: Some(64),
            block_size: Some(1),
            ..Knobs::default()
        };
        let sim = SchedulerKind::Vllm
            .simulate_on(&w, &knobs, &Second, &two_stages())
            .unwrap();
        let spans: Vec<(f64, f64, u32)> = sim
            .schedule
            .batches
            .iter()
            .map(|b| (b.start_s.unwrap(), b.end_s.unwrap(), b.entries[0].request))
            .collect();
        assert_eq!(
            spans,
            [(0.0, 1.0, 0), (0.5, 1.5, 1), (1.0, 2.0, 0), (1.5, 2.5, 1)]
        );
        // Each engine has half the blocks; the replay checks them together.
        assert_eq!(sim.limits.kv_capacity, Some(64));
        let r = replay_pipelined(&w, &sim.limits, &Second, &two_stages(), &sim.schedule).unwrap();
        assert_eq!(r.requests[1].completion_s, 2.5);
        let one = SchedulerKind::Vllm.simulate(&w, &knobs, &Second).unwrap();
        assert_eq!(one.schedule.batches.len(), 2);
    }

    #[test]
    fn engines_left_without_blocks_refuse_the_workload() {
        let w = infersched_test_kit::workload(&[(1, 1, 0.0)]);
        let knobs = Knobs {
            kv_capacity: Some(1),
            block_size: Some(1),
            ..Knobs::default()
        };
        let e = SchedulerKind::Vllm
            .simulate_on(&w, &knobs, &Second, &two_stages())
            .unwrap_err();
        assert!(
            matches!(e, crate::SimError::Unservable { .. })
                && e.to_string().contains("leaves them none"),
            "{e}"
        );
    }

    #[test]
    fn an_engine_that_cannot_hold_a_request_in_its_share_of_the_blocks_refuses() {
        // 12 blocks over 2 engines: 6 each; a request needing 8 (I + O - 1) cannot run.
        let w = infersched_test_kit::workload(&[(6, 3, 0.0)]);
        let knobs = Knobs {
            kv_capacity: Some(12),
            block_size: Some(1),
            ..Knobs::default()
        };
        assert!(SchedulerKind::Vllm.simulate(&w, &knobs, &Second).is_ok());
        let e = SchedulerKind::Vllm
            .simulate_on(&w, &knobs, &Second, &two_stages())
            .unwrap_err();
        assert!(e.to_string().contains("request 0"), "{e}");
    }
}
