//! Replicas behind a router: each arriving request is sent to one replica by a routing rule
//! that reads the replicas' state at its arrival, and each replica runs its own policy on
//! the requests routed to it.
//!
//! The replicas are simulated side by side in time: before a request arriving at `t` is
//! routed, every replica runs each batch it starts before `t` (no replica can start a batch
//! before `t` knowing of it, as none could in the single-replica loop), so the router sees
//! each replica as it is at `t`: the requests it has not finished (those finishing in a
//! batch still running at `t` count as unfinished), its waiting queue, its KV blocks.

pub use crate::router::{ROUTER_NAMES, Router};
use crate::router::{RouterState, load_at};
pub use crate::sim::ClusterSimulation;
use crate::sim::{Brings, Run, Simulator, Step, check_servable};
use crate::{Policy, SimError};
use infersched_core::cluster::MAX_REPLICAS;
use infersched_core::{BlockKeys, CostModel, Limits, Pipeline, Routing, Workload};

/// Runs `run` on until its next batch would start at or after `until` (or, with `None`,
/// until every request given to it has finished).
fn advance(
    run: &mut Run<'_>,
    policy: &mut dyn Policy,
    cost: &dyn CostModel,
    until: Option<f64>,
) -> Result<(), SimError> {
    while until.is_none_or(|t| run.sim.now() < t) {
        if run.step(policy, cost)? == Step::Idle {
            break;
        }
    }
    Ok(())
}

/// Simulates a cluster of `policies.len()` replicas, replica `r` running `policies[r]`
/// under `limits` with batch times from `cost`, requests routed by `router` as they
/// arrive. Every replica's schedule names requests by the workload's ids.
pub fn simulate_cluster(
    workload: &Workload,
    limits: &Limits,
    policies: &mut [Box<dyn Policy>],
    cost: &dyn CostModel,
    router: Router,
) -> Result<ClusterSimulation, SimError> {
    let none = Pipeline::none();
    simulate_cluster_on(workload, limits, policies, (cost, &none), router)
}

/// [`simulate_cluster`] with every replica a pipeline of `pipeline.stages` stages
/// ([`crate::simulate_pipelined`]; a load-based router reads a replica's load at a
/// request's arrival, a request finished in a batch completing later counted as not).
/// A policy that runs on a pipeline as vLLM v0's virtual engines takes one policy per
/// engine, `pipeline.stages` per replica
/// ([`crate::virtual_engines::simulate_virtual_engine_cluster`];
/// [`crate::SchedulerKind::cluster_policies`] builds them).
pub fn simulate_cluster_on(
    workload: &Workload,
    limits: &Limits,
    policies: &mut [Box<dyn Policy>],
    (cost, pipeline): (&dyn CostModel, &Pipeline),
    router: Router,
) -> Result<ClusterSimulation, SimError> {
    limits.validate()?;
    pipeline.validate()?;
    let replicas = policies.len();
    let Some(first) = policies
        .first()
        .filter(|_| replicas as u64 <= u64::from(MAX_REPLICAS))
    else {
        return Err(SimError::Replicas(replicas));
    };
    check_servable(
        workload,
        limits,
        first.as_ref(),
        &Simulator::new(workload, *limits),
    )?;
    if pipeline.is_pipelined() && !first.pipelines() {
        return Err(SimError::NotPipelined {
            policy: first.name(),
        });
    }
    if pipeline.is_pipelined() && first.virtual_engines() {
        return crate::virtual_engines::simulate_virtual_engine_cluster(
            workload,
            limits,
            policies,
            (cost, pipeline),
            router,
        );
    }
    let rule = first.prefix_cache().filter(|_| !workload.has_transferred());
    let keys = rule.map(|_| BlockKeys::new(workload, limits.block_size));
    let mut runs: Vec<Run<'_>> = policies
        .iter()
        .map(|_| {
            let mut sim = Simulator::empty(*limits);
            if let (Some(rule), Some(k)) = (rule, &keys) {
                sim.enable_prefix_cache(rule, BlockKeys::empty(limits.block_size, k.id_block()));
            }
            let mut run = Run::new(sim, 0);
            run.set_pipeline(*pipeline, first.as_ref());
            run
        })
        .collect();
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); policies.len()];
    let mut replica_of = vec![0u32; workload.len()];
    let mut state = RouterState::new(router);
    let replica_error = |r: usize| {
        move |e| SimError::Replica {
            replica: r as u32,
            source: Box::new(e),
        }
    };
    for g in workload.fcfs_order() {
        let request = workload.requests()[g as usize];
        for (r, (run, policy)) in runs.iter_mut().zip(policies.iter_mut()).enumerate() {
            run.set_horizon(request.arrival_s);
            advance(run, policy.as_mut(), cost, Some(request.arrival_s))
                .map_err(replica_error(r))?;
        }
        let t = request.arrival_s;
        let r = state.pick(runs.len(), &|r| load_at(&runs[r], t));
        let chains = keys
            .as_ref()
            .map_or_else(Vec::new, |k| k.chains_of(g).to_vec());
        let brings = Brings {
            transferred: workload.transferred(g as usize),
            kv_hold_s: workload.kv_hold_s(g as usize),
            transfer_s: workload.pulls_kv().then(|| workload.transfer_s(g as usize)),
        };
        runs[r].add_request(request, chains, brings);
        members[r].push(g);
        replica_of[g as usize] = r as u32;
    }
    for (r, (run, policy)) in runs.iter_mut().zip(policies.iter_mut()).enumerate() {
        run.set_horizon(f64::INFINITY);
        advance(run, policy.as_mut(), cost, None).map_err(replica_error(r))?;
    }
    Ok(into_cluster(runs, policies, &members, replica_of, router))
}

/// The finished replicas as a cluster: each run's schedule in the workload's ids
/// (`members[r]`: replica `r`'s requests in the order given to it), named by its policy,
/// replica and `router`.
pub(crate) fn into_cluster(
    runs: Vec<Run<'_>>,
    policies: &[Box<dyn Policy>],
    members: &[Vec<u32>],
    replica_of: Vec<u32>,
    router: Router,
) -> ClusterSimulation {
    let mut replicas = Vec::with_capacity(runs.len());
    for (r, ((run, policy), ids)) in runs.into_iter().zip(policies).zip(members).enumerate() {
        let mut simulation = run.finish(policy.as_ref());
        simulation.schedule.meta = Some(serde_json::json!({
            "producer": policy.name(),
            "replica": r,
            "router": router.name(),
        }));
        for batch in &mut simulation.schedule.batches {
            for e in &mut batch.entries {
                e.request = ids[e.request as usize];
            }
        }
        replicas.push(simulation);
    }
    let routing = Routing::new(replicas.len() as u32, replica_of)
        .expect("each request routed to one of the replicas");
    ClusterSimulation { routing, replicas }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Knobs;
    use crate::SchedulerKind;
    use infersched_core::Request;

    use infersched_test_kit::EverySecond as Second;

    fn run(reqs: &[(u32, u32, f64)], replicas: usize, router: Router) -> Vec<u32> {
        let w = infersched_test_kit::workload(reqs);
        let knobs = Knobs {
            block_size: Some(1),
            ..Knobs::default()
        };
        let kind = SchedulerKind::Vllm;
        let limits = kind.limits(&knobs, &w);
        let mut policies: Vec<_> = (0..replicas).map(|_| kind.policy(&knobs, &w)).collect();
        let c = simulate_cluster(&w, &limits, &mut policies, &Second, router).unwrap();
        c.routing.replica_of().to_vec()
    }

    #[test]
    fn round_robin_takes_requests_in_arrival_order() {
        // Arrival order 3, 1, 2, 0, 4 -> replicas 0, 1, 0, 1, 0.
        let reqs = [
            (4, 2, 0.3),
            (4, 2, 0.1),
            (4, 2, 0.2),
            (4, 2, 0.0),
            (4, 2, 0.4),
        ];
        assert_eq!(run(&reqs, 2, Router::RoundRobin), [1, 1, 0, 0, 0]);
        // More replicas than requests: the rest stay idle.
        assert_eq!(run(&reqs[..2], 4, Router::RoundRobin), [1, 0]);
    }

    #[test]
    fn least_outstanding_counts_a_request_until_its_batch_ends() {
        // A (3 one-second batches from t = 0) on replica 0; B arrives at 0.5 and goes to
        // the idle replica 1, whose batch [0.5, 1.5] finishes it.
        let a = (1, 3, 0.0);
        let b = (1, 1, 0.5);
        // At 1.2 B is still running: 1 and 1 unfinished, the tie goes to replica 0.
        assert_eq!(
            run(&[a, b, (1, 1, 1.2)], 2, Router::LeastOutstanding),
            [0, 1, 0]
        );
        // At 1.5 B has finished: replica 1 has none.
        assert_eq!(
            run(&[a, b, (1, 1, 1.5)], 2, Router::LeastOutstanding),
            [0, 1, 1]
        );
        // Two replicas: power of two draws both, so it is least-outstanding.
        assert_eq!(
            run(&[a, b, (1, 1, 1.2)], 2, Router::PowerOfTwo { seed: 3 }),
            [0, 1, 0]
        );
        assert_eq!(
            run(&[a, b, (1, 1, 1.5)], 2, Router::PowerOfTwo { seed: 9 }),
            [0, 1, 1]
        );
    }

    #[test]
    fn least_kv_weighs_the_memory_each_replica_holds() {
        // A holds 10+ KV tokens on replica 0; B 2 on replica 1, still running at 0.6.
        let reqs = [(10, 5, 0.0), (2, 1, 0.5), (1, 1, 0.6)];
        assert_eq!(run(&reqs, 2, Router::LeastKv), [0, 1, 1]);
        assert_eq!(run(&reqs, 2, Router::LeastOutstanding), [0, 1, 0]);
    }

    #[test]
    fn least_waiting_counts_requests_not_yet_admitted() {
        // A runs on replica 0 (admitted at once, so nothing waits there); B goes to 0 too
        // (ties to the lowest), and waits there until A's batch ends; C sees 1 waiting on
        // replica 0 and none on replica 1.
        let reqs = [(1, 3, 0.0), (1, 1, 0.5), (1, 1, 0.6)];
        assert_eq!(run(&reqs, 2, Router::LeastWaiting), [0, 0, 1]);
    }

    #[test]
    fn vllm_dp_weighs_waiting_four_times_running() {
        // A at 0 -> 0; B at 0 -> 1 (A waits on 0: 4 against 0); C at 0.2 -> 0 (one running
        // on each); D at 0.5 -> 1 (A running and C waiting on 0: 5 against 1); E at 0.5
        // -> 0 (B running and D waiting on 1: 5 against 5).
        let reqs = [
            (1, 4, 0.0),
            (1, 4, 0.0),
            (1, 4, 0.2),
            (1, 1, 0.5),
            (1, 1, 0.5),
        ];
        assert_eq!(run(&reqs, 2, Router::VllmDp), [0, 1, 0, 1, 0]);
    }

    #[test]
    fn random_routers_repeat_with_their_seed() {
        let reqs: Vec<_> = (0..40).map(|k| (3, 2, f64::from(k) * 0.1)).collect();
        let a = run(&reqs, 3, Router::Random { seed: 1 });
        assert_eq!(a, run(&reqs, 3, Router::Random { seed: 1 }));
        assert_ne!(a, run(&reqs, 3, Router::Random { seed: 2 }));
        assert!((0..3).all(|r| a.contains(&r)));
        let p = run(&reqs, 3, Router::PowerOfTwo { seed: 1 });
        assert_eq!(p, run(&reqs, 3, Router::PowerOfTwo { seed: 1 }));
    }

    #[test]
    fn a_cluster_needs_replicas() {
        let w = Workload::new(vec![Request {
            input_tokens: 1,
            output_tokens: 1,
            arrival_s: 0.0,
        }])
        .unwrap();
        let limits = Limits::unlimited();
        let e = simulate_cluster(&w, &limits, &mut [], &Second, Router::RoundRobin).unwrap_err();
        assert_eq!(e, SimError::Replicas(0));
        assert!(e.to_string().contains("1 to 4096 replicas, got 0"), "{e}");
    }
}
