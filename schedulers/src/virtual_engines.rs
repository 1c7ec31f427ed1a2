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

use crate::router::{Router, RouterState, replica_load_at};
use crate::sim::{Brings, ClusterSimulation, Run, Simulation, Simulator, Step, check_servable};
use crate::{Policy, SimError};
use infersched_core::cluster::MAX_REPLICAS;
use infersched_core::{
    Batch, CostModel, Limits, Pipeline, PipelineClock, Routing, Schedule, Workload,
};
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
    let mut c = engine_cluster(workload, limits, engines, (cost, pipeline), None)?;
    let mut one = c.replicas.pop().expect("one replica");
    one.schedule.meta = Some(serde_json::json!({
        "producer": engines[0].name(),
        "virtual_engines": pipeline.stages,
    }));
    Ok(one)
}

/// [`simulate_virtual_engines`] on `engines.len() / pipeline.stages` replicas behind
/// `router` (`engines[r * P + v]` is engine `v` of replica `r`): a request goes to a
/// replica by the router, reading each replica's engines' loads together, then to that
/// replica's engine with the fewest unfinished requests. Every replica's schedule names
/// requests by the workload's ids and replays under the simulation's limits.
pub fn simulate_virtual_engine_cluster(
    workload: &Workload,
    limits: &Limits,
    engines: &mut [Box<dyn Policy>],
    (cost, pipeline): (&dyn CostModel, &Pipeline),
    router: Router,
) -> Result<ClusterSimulation, SimError> {
    engine_cluster(workload, limits, engines, (cost, pipeline), Some(router))
}

/// vLLM v0 gives each virtual engine its own prefix cache, which one replayed schedule
/// cannot show: refused.
fn refuse_prefix_cache(engines: &[Box<dyn Policy>]) -> Result<(), SimError> {
    match engines.iter().find(|e| e.prefix_cache().is_some()) {
        Some(e) => Err(SimError::CacheOnVirtualEngines { policy: e.name() }),
        None => Ok(()),
    }
}

/// The engines' cluster; without a router, one replica (errors then name the engine).
fn engine_cluster(
    workload: &Workload,
    limits: &Limits,
    engines: &mut [Box<dyn Policy>],
    (cost, pipeline): (&dyn CostModel, &Pipeline),
    router: Option<Router>,
) -> Result<ClusterSimulation, SimError> {
    refuse_prefix_cache(engines)?;
    limits.validate()?;
    pipeline.validate()?;
    let p = pipeline.stages as usize;
    let replicas = engines.len() / p.max(1);
    if p == 0
        || replicas == 0
        || !engines.len().is_multiple_of(p)
        || (router.is_none() && replicas != 1)
    {
        return Err(SimError::Replicas(engines.len()));
    }
    if replicas > MAX_REPLICAS as usize {
        return Err(SimError::Replicas(replicas));
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
    let mut runs: Vec<Run<'_>> = Vec::with_capacity(engines.len());
    for _ in 0..replicas {
        let clock = Rc::new(RefCell::new(PipelineClock::new(*pipeline)));
        for _ in 0..p {
            let mut run = Run::new(Simulator::empty(one), 0);
            run.share_clock(Rc::clone(&clock));
            runs.push(run);
        }
    }
    let (members, order, replica_of) = drive(workload, &mut runs, engines, cost, (p, router))?;
    let mut per_engine: Vec<Vec<Batch>> = Vec::with_capacity(runs.len());
    for ((run, policy), ids) in runs.into_iter().zip(engines.iter()).zip(&members) {
        let mut s = run.finish(policy.as_ref()).schedule;
        for batch in &mut s.batches {
            for e in &mut batch.entries {
                e.request = ids[e.request as usize];
            }
        }
        per_engine.push(s.batches);
    }
    let sim_limits = Limits {
        kv_capacity: one.kv_capacity.map(|m| m * p as u64),
        max_running: limits.max_running.map(|r| r.saturating_mul(p as u64)),
        ..*limits
    };
    let mut next = vec![0usize; per_engine.len()];
    let replicas = order
        .iter()
        .enumerate()
        .map(|(r, order)| {
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
                "replica": r,
                "router": router.map(Router::name),
            }));
            Simulation {
                schedule,
                accounts: Vec::new(),
                limits: sim_limits,
            }
        })
        .collect();
    let routing = Routing::new(order.len() as u32, replica_of)
        .expect("each request routed to one of the replicas");
    Ok(ClusterSimulation { routing, replicas })
}

/// What [`drive`] returns: each engine's requests (workload ids, in the order given to
/// it), each replica's batches as the engines (global run indices) that built them, in
/// the order they entered its pipeline, and each request's replica.
type Driven = (Vec<Vec<u32>>, Vec<Vec<usize>>, Vec<u32>);

/// Runs the engines (`p` per replica) to the end: routes each request at its arrival to
/// a replica by `router` (one replica without), then to its engine with the fewest
/// unfinished requests, and steps the engine whose next decision comes first.
fn drive(
    workload: &Workload,
    runs: &mut [Run<'_>],
    engines: &mut [Box<dyn Policy>],
    cost: &dyn CostModel,
    (p, router): (usize, Option<Router>),
) -> Result<Driven, SimError> {
    let arrivals = workload.fcfs_order();
    let replicas = runs.len() / p;
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); runs.len()];
    let mut order = vec![Vec::new(); replicas];
    let mut replica_of = vec![0u32; workload.len()];
    let mut state = RouterState::new(router.unwrap_or(Router::RoundRobin));
    let mut next = 0;
    loop {
        let due = (0..runs.len())
            .filter_map(|v| runs[v].due_s().map(|t| (t, v)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if let Some(&g) = arrivals.get(next) {
            let request = workload.requests()[g as usize];
            let t = request.arrival_s;
            if due.is_none_or(|(due_t, _)| t <= due_t) {
                let r = state.pick(replicas, &|r| replica_load_at(&runs[r * p..(r + 1) * p], t));
                let v = (r * p..(r + 1) * p)
                    .min_by_key(|&v| (runs[v].unfinished_at(t), v))
                    .expect("at least one engine");
                let brings = Brings {
                    transferred: workload.transferred(g as usize),
                    kv_hold_s: workload.kv_hold_s(g as usize),
                    transfer_s: workload.pulls_kv().then(|| workload.transfer_s(g as usize)),
                };
                runs[v].add_request(request, Vec::new(), brings);
                members[v].push(g);
                replica_of[g as usize] = r as u32;
                next += 1;
                continue;
            }
        }
        let Some((_, v)) = due else { break };
        let horizon = arrivals.get(next).map_or(f64::INFINITY, |&g| {
            workload.requests()[g as usize].arrival_s
        });
        runs[v].set_horizon(horizon);
        let step = runs[v].step(engines[v].as_mut(), cost).map_err(|e| {
            // One replica: the engine; several: the replica.
            let replica = if router.is_none() { v } else { v / p };
            SimError::Replica {
                replica: replica as u32,
                source: Box::new(e),
            }
        })?;
        if step == Step::Batch {
            order[v / p].push(v);
        }
    }
    Ok((members, order, replica_of))
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

    #[test]
    fn replicas_of_virtual_engines_route_then_run_their_engines_as_one_replica_would() {
        // Four requests at 0 behind round robin: 0 and 2 to replica 0, 1 and 3 to replica
        // 1; in each, one per engine. Each replica's schedule is what one replica of
        // engines does with its two requests, and the cluster replays on its pipelines.
        let w =
            infersched_test_kit::workload(&[(4, 2, 0.0), (3, 2, 0.0), (4, 2, 0.0), (3, 2, 0.0)]);
        let knobs = Knobs {
            kv_capacity: Some(64),
            block_size: Some(1),
            ..Knobs::default()
        };
        let kind = SchedulerKind::Vllm;
        let limits = kind.limits(&knobs, &w);
        let p = two_stages();
        let mut engines = kind.cluster_policies(&knobs, &w, 2, &p);
        assert_eq!(engines.len(), 4);
        let c = crate::simulate_cluster_on(
            &w,
            &limits,
            &mut engines,
            (&Second, &p),
            super::Router::RoundRobin,
        )
        .unwrap();
        assert_eq!(c.routing.replica_of(), [0, 1, 0, 1]);
        for (r, ids) in [[0u32, 2], [1, 3]].iter().enumerate() {
            let own = w.members(ids).unwrap();
            let alone = kind.simulate_on(&own, &knobs, &Second, &p).unwrap();
            let mut renamed = alone.schedule.batches.clone();
            for b in &mut renamed {
                for e in &mut b.entries {
                    e.request = ids[e.request as usize];
                }
            }
            assert_eq!(c.replicas[r].schedule.batches, renamed, "replica {r}");
            assert_eq!(c.replicas[r].limits, alone.limits);
        }
        let schedules: Vec<_> = c.replicas.iter().map(|s| s.schedule.clone()).collect();
        infersched_core::cluster::replay_cluster_on(
            &w,
            &c.replicas[0].limits,
            (&Second, &p),
            &c.routing,
            &schedules,
        )
        .unwrap();
        // One replica behind any router is the single replica's engines, batch for batch.
        let mut one = kind.cluster_policies(&knobs, &w, 1, &p);
        let c1 = crate::simulate_cluster_on(
            &w,
            &limits,
            &mut one,
            (&Second, &p),
            super::Router::LeastKv,
        )
        .unwrap();
        let single = kind.simulate_on(&w, &knobs, &Second, &p).unwrap();
        assert_eq!(c1.replicas[0].schedule.batches, single.schedule.batches);
    }
}
