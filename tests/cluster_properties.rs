//! Property tests of clusters: on random workloads and limits, for every policy and router,
//! every request is routed to exactly one replica and each replica's schedule replays
//! (`replay_cluster`), and a cluster of one replica is the single-replica simulation; a
//! disaggregated cluster serves each request once on each side and replays.

use infersched::core::cluster::replay_cluster_on;
use infersched::core::{Pipeline, Summary, Workload, replay_cluster};
use infersched::cost_model::preset;
use infersched::schedulers::{
    Knobs, Router, SCHEDULER_NAMES, SchedulerKind, simulate_cluster, simulate_cluster_on,
};
use proptest::prelude::*;

fn arb_case() -> impl Strategy<Value = (Workload, Knobs)> {
    let request = (1u32..40, 1u32..12, prop_oneof![Just(0.0), 0.0f64..0.3]);
    (
        prop::collection::vec(request, 1..14),
        prop::option::of(1u64..64),
        0u64..40,
        prop::option::of(1u64..6),
        1u32..5,
    )
        .prop_map(|(rs, c, m_slack, r_max, block)| {
            let w = infersched_test_kit::workload(&rs);
            let need = infersched_test_kit::largest_kv_need(&w);
            let b = u64::from(block);
            let knobs = Knobs {
                token_budget: c,
                kv_capacity: Some(need.div_ceil(b) * b + m_slack),
                max_running: r_max,
                block_size: Some(block),
                ..Knobs::default()
            };
            (w, knobs)
        })
}

const ROUTERS: [Router; 7] = [
    Router::RoundRobin,
    Router::VllmDp,
    Router::LeastOutstanding,
    Router::LeastWaiting,
    Router::LeastKv,
    Router::PowerOfTwo { seed: 5 },
    Router::Random { seed: 5 },
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn every_request_is_served_once_and_every_replica_replays(
        (w, knobs) in arb_case(),
        replicas in 1usize..5,
    ) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        for name in SCHEDULER_NAMES {
            let kind: SchedulerKind = name.parse().unwrap();
            let limits = kind.limits(&knobs, &w);
            for router in ROUTERS {
                let mut policies: Vec<_> = (0..replicas).map(|_| kind.policy(&knobs, &w)).collect();
                let sim = match simulate_cluster(&w, &limits, &mut policies, &cost, router) {
                    Ok(s) => s,
                    // A policy that cannot serve a request refuses before routing anything.
                    Err(e) => {
                        prop_assert!(kind.simulate(&w, &knobs, &cost).is_err(), "{kind:?} {router}: {e}");
                        continue;
                    }
                };
                let schedules: Vec<_> = sim.replicas.iter().map(|s| s.schedule.clone()).collect();
                let r = replay_cluster(&w, &limits, &cost, &sim.routing, &schedules)
                    .map_err(|e| TestCaseError::fail(format!("{name} {router} x{replicas}: {e}")))?;
                let members = sim.routing.members();
                prop_assert_eq!(members.iter().map(Vec::len).sum::<usize>(), w.len());
                for (k, one) in r.replicas.iter().enumerate() {
                    prop_assert_eq!(one.is_some(), !members[k].is_empty());
                }
                let s = Summary::of_cluster(&r, &router.name());
                prop_assert_eq!(s.requests, w.len());
                let load = s.cluster.unwrap();
                prop_assert_eq!(load.per_replica.iter().map(|l| l.requests).sum::<usize>(), w.len());
                prop_assert!(load.per_replica.iter().all(|l| l.makespan_s <= s.makespan_s));
            }
        }
    }

    #[test]
    fn one_replica_is_the_single_replica_simulation((w, knobs) in arb_case()) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        for name in SCHEDULER_NAMES {
            let kind: SchedulerKind = name.parse().unwrap();
            let Ok(single) = kind.simulate(&w, &knobs, &cost) else { continue };
            let limits = kind.limits(&knobs, &w);
            let mut policies = vec![kind.policy(&knobs, &w)];
            let c = simulate_cluster(&w, &limits, &mut policies, &cost, Router::LeastKv).unwrap();
            prop_assert_eq!(&c.replicas[0].schedule.batches, &single.schedule.batches, "{}", name);
            prop_assert_eq!(&c.replicas[0].accounts, &single.accounts);
        }
    }

    #[test]
    fn a_disaggregated_cluster_serves_each_request_once_on_each_side_and_replays(
        (w, knobs) in arb_case(),
        prefill in 1usize..3,
        decode in 1usize..4,
        latency_us in 0.0f64..500.0,
        pull in proptest::bool::ANY,
    ) {
        use infersched::core::disaggregated::{KvConnector, KvLink, replay_disaggregated};
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        let kind = SchedulerKind::VllmV1;
        let limits = kind.limits(&knobs, &w);
        let connector = if pull { KvConnector::Nixl } else { KvConnector::P2pNccl };
        let link = KvLink { bytes_per_token: 81_920.0, bandwidth_bytes_per_s: 300e9, latency_s: latency_us * 1e-6, connector };
        for router in [Router::RoundRobin, Router::LeastKv, Router::PowerOfTwo { seed: 3 }] {
            let side = |n: usize| -> Vec<_> { (0..n).map(|_| kind.policy(&knobs, &w)).collect() };
            let (mut p, mut d) = (side(prefill), side(decode));
            let sim = match infersched::schedulers::simulate_disaggregated(&w, &limits, &mut p, &mut d, &cost, router, &link) {
                Ok(s) => s,
                Err(e) => {
                    prop_assert!(kind.simulate(&w, &knobs, &cost).is_err(), "{router}: {e}");
                    continue;
                }
            };
            let schedules = |c: &infersched::schedulers::ClusterSimulation| -> Vec<_> {
                c.replicas.iter().map(|s| s.schedule.clone()).collect()
            };
            let r = replay_disaggregated(&w, &limits, &cost, &link, &sim.prefill.routing, &schedules(&sim.prefill), &sim.decode.routing, &schedules(&sim.decode))
                .map_err(|e| TestCaseError::fail(format!("{router} {prefill}:{decode}: {e}")))?;
            prop_assert_eq!(r.cluster.replicas.len(), prefill + decode);
            // The prefill replicas keep each prompt's KV while it is sent: the simulator
            // counts the KV the replay counts, batch by batch.
            // Where the KV is pulled, the decode replicas hold it from the receive, not
            // running: the simulator counts KV and running requests as the replay does.
            let sides = [(&sim.prefill, &r.prefill), (&sim.decode, &r.decode)];
            for (one, replayed) in sides.iter().flat_map(|(s, r)| s.replicas.iter().zip(&r.replicas)) {
                let kv = |b: &infersched::core::BatchRecord| (b.kv_tokens, b.running);
                let replayed: Vec<(u64, u64)> = replayed.iter().flat_map(|x| x.batches.iter().map(kv)).collect();
                let simulated: Vec<(u64, u64)> = one.accounts.iter().map(|a| (a.kv_tokens, a.running)).collect();
                prop_assert_eq!(replayed, simulated, "{}", router);
            }
            prop_assert_eq!(&sim.kv_ready_s, &r.kv_ready_s);
            for (i, (rec, req)) in r.cluster.merged.requests.iter().zip(w.requests()).enumerate() {
                let pre = &r.prefill.merged.requests[i];
                // Its KV leaves when the prefill side's token is out and arrives a transfer later
                // (pushed) or from when the decode replica received it (pulled), before the
                // decode side's first token.
                let sent = pre.first_token_s + link.transfer_s(req.input_tokens);
                if pull {
                    prop_assert!(r.kv_ready_s[i] >= sent - 1e-12);
                } else {
                    prop_assert!((r.kv_ready_s[i] - sent).abs() < 1e-12);
                }
                prop_assert!(rec.first_token_s > r.kv_ready_s[i]);
                prop_assert_eq!(rec.arrival_s, req.arrival_s);
                // I prompt tokens on the prefill side, then the last prompt token again and the
                // O - 1 decodes on the decode side, plus what evictions recomputed.
                prop_assert_eq!(rec.processed_tokens, u64::from(req.input_tokens + req.output_tokens) + rec.recomputed_tokens, "request {}", i);
                prop_assert_eq!(rec.cached_tokens, u64::from(req.input_tokens - 1));
            }
            let s = infersched::core::Summary::of_disaggregated(&r, &router.name(), &link);
            prop_assert_eq!(s.requests, w.len());
            let load = s.cluster.unwrap();
            prop_assert_eq!(load.per_replica[..prefill].iter().map(|l| l.requests).sum::<usize>(), w.len());
            prop_assert_eq!(load.per_replica[prefill..].iter().map(|l| l.requests).sum::<usize>(), w.len());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Clusters of pipelined replicas (vllm-v1, 2 or 3 stages): every request served once,
    /// every replica's schedule replays on its pipeline, each replica's busy time (some
    /// batch in flight) is at most its makespan, and one stage is the plain cluster.
    #[test]
    fn pipelined_replicas_serve_every_request_once_and_replay(
        (w, knobs) in arb_case(),
        replicas in 1usize..4,
        stages in 2u32..4,
    ) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        let kind = SchedulerKind::VllmV1;
        let limits = kind.limits(&knobs, &w);
        let pipeline = Pipeline { stages, send_latency_s: 1e-5, send_s_per_token: 1e-7 };
        for router in ROUTERS {
            let policies = || -> Vec<_> { (0..replicas).map(|_| kind.policy(&knobs, &w)).collect() };
            let sim = match simulate_cluster_on(&w, &limits, &mut policies(), (&cost, &pipeline), router) {
                Ok(s) => s,
                Err(e) => {
                    prop_assert!(kind.simulate(&w, &knobs, &cost).is_err(), "{router}: {e}");
                    continue;
                }
            };
            let schedules: Vec<_> = sim.replicas.iter().map(|s| s.schedule.clone()).collect();
            let r = replay_cluster_on(&w, &limits, (&cost, &pipeline), &sim.routing, &schedules)
                .map_err(|e| TestCaseError::fail(format!("{router} x{replicas}: {e}")))?;
            let members = sim.routing.members();
            prop_assert_eq!(members.iter().map(Vec::len).sum::<usize>(), w.len());
            let s = Summary::of_cluster_on(&r, &router.name(), &pipeline);
            prop_assert_eq!(s.pipeline, Some(pipeline));
            for l in &s.cluster.unwrap().per_replica {
                prop_assert!(l.busy_s <= l.makespan_s + 1e-12, "{l:?}");
            }
            // One pipelined replica behind any router is the pipelined replica alone.
            if replicas == 1 {
                let alone = kind.simulate_on(&w, &knobs, &cost, &pipeline).unwrap();
                prop_assert_eq!(&sim.replicas[0].schedule.batches, &alone.schedule.batches, "{}", router);
            }
            // On one stage the pipelined entry points are the plain cluster.
            let none = Pipeline::none();
            let plain = simulate_cluster(&w, &limits, &mut policies(), &cost, router).unwrap();
            let one = simulate_cluster_on(&w, &limits, &mut policies(), (&cost, &none), router).unwrap();
            let sched = |c: &infersched::schedulers::ClusterSimulation| -> Vec<_> {
                c.replicas.iter().map(|s| s.schedule.clone()).collect()
            };
            prop_assert_eq!(sched(&plain), sched(&one));
            prop_assert_eq!(plain.routing, one.routing);
        }
    }

    /// vLLM v0's virtual engines on every replica of a cluster: every request served once,
    /// every replica's schedule replays on its pipeline under the engines' limits together.
    #[test]
    fn replicas_of_virtual_engines_serve_every_request_once_and_replay(
        (w, knobs) in arb_case(),
        replicas in 1u32..4,
        stages in 2u32..4,
    ) {
        let cost = preset("llama3-70b-tp4-a100").unwrap();
        let kind = SchedulerKind::Vllm;
        let limits = kind.limits(&knobs, &w);
        let pipeline = Pipeline { stages, send_latency_s: 1e-5, send_s_per_token: 1e-7 };
        for router in ROUTERS {
            let mut engines = kind.cluster_policies(&knobs, &w, replicas, &pipeline);
            let sim = match simulate_cluster_on(&w, &limits, &mut engines, (&cost, &pipeline), router) {
                Ok(s) => s,
                Err(e) => {
                    prop_assert!(kind.simulate_on(&w, &knobs, &cost, &pipeline).is_err(), "{router}: {e}");
                    continue;
                }
            };
            prop_assert_eq!(sim.replicas.len(), replicas as usize);
            let schedules: Vec<_> = sim.replicas.iter().map(|s| s.schedule.clone()).collect();
            replay_cluster_on(&w, &sim.replicas[0].limits, (&cost, &pipeline), &sim.routing, &schedules)
                .map_err(|e| TestCaseError::fail(format!("{router} x{replicas}: {e}")))?;
            let members = sim.routing.members();
            prop_assert_eq!(members.iter().map(Vec::len).sum::<usize>(), w.len());
        }
    }
}
