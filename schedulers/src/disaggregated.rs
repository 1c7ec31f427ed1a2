//! A disaggregated cluster (`--disaggregate P:D`; semantics.md, "Disaggregated prefill and
//! decode"): P prefill replicas serve every request's prompt and first token, then D decode
//! replicas, where each request arrives when its KV has crossed the link, serve the rest.
//! Each side is a cluster behind the same router rule ([`crate::cluster`]); the decode
//! side's arrivals come from the independent replay of the prefill side's schedules.

use crate::cluster::{ClusterSimulation, Router, simulate_cluster_on};
use crate::{Policy, SimError};
use infersched_core::cluster::replay_cluster_on;
use infersched_core::disaggregated::{KvLink, decode_workload, kv_ready_s, prefill_workload};
use infersched_core::{CostModel, Limits, Pipeline, Workload};

/// Each side's policies, one per replica: prefill, then decode.
pub type Sides<'a> = (&'a mut [Box<dyn Policy>], &'a mut [Box<dyn Policy>]);

/// A simulated disaggregated cluster.
#[derive(Debug, Clone)]
pub struct DisaggregatedSimulation {
    /// The prefill replicas (requests of one output token, routed at arrival).
    pub prefill: ClusterSimulation,
    /// The decode replicas (requests routed when their KV is ready).
    pub decode: ClusterSimulation,
    /// When each request's KV reached the decode side.
    pub kv_ready_s: Vec<f64>,
}

/// Simulates `prefill.len()` prefill replicas and `decode.len()` decode replicas, each
/// running its policy under `limits` with batch times from `cost`, requests routed on each
/// side by `router`, KV moved over `link`. Decode replicas must take transferred KV (vLLM
/// V1's policy does).
pub fn simulate_disaggregated(
    workload: &Workload,
    limits: &Limits,
    prefill: &mut [Box<dyn Policy>],
    decode: &mut [Box<dyn Policy>],
    cost: &dyn CostModel,
    router: Router,
    link: &KvLink,
) -> Result<DisaggregatedSimulation, SimError> {
    let none = Pipeline::none();
    simulate_disaggregated_on(
        workload,
        limits,
        (prefill, decode),
        (cost, &none),
        router,
        link,
    )
}

/// [`simulate_disaggregated`] with every replica of both sides a pipeline of
/// `pipeline.stages` stages (`simulate_cluster_on`).
pub fn simulate_disaggregated_on(
    workload: &Workload,
    limits: &Limits,
    (prefill, decode): Sides<'_>,
    (cost, pipeline): (&dyn CostModel, &Pipeline),
    router: Router,
    link: &KvLink,
) -> Result<DisaggregatedSimulation, SimError> {
    link.validate()
        .map_err(|e| SimError::Disaggregated(e.to_string()))?;
    if let Some(p) = decode.iter().find(|p| !p.takes_transferred_kv()) {
        return Err(SimError::TransferredKv { policy: p.name() });
    }
    let first = prefill_workload(workload, link);
    let prefill_side = simulate_cluster_on(&first, limits, prefill, (cost, pipeline), router)?;
    let schedules: Vec<_> = prefill_side
        .replicas
        .iter()
        .map(|s| s.schedule.clone())
        .collect();
    let routing = &prefill_side.routing;
    let replayed = replay_cluster_on(&first, limits, (cost, pipeline), routing, &schedules)
        .map_err(|e| SimError::Disaggregated(format!("the prefill side does not replay: {e}")))?;
    let ready = kv_ready_s(workload, &replayed, link);
    let second = decode_workload(workload, &ready)
        .map_err(|e| SimError::Disaggregated(format!("the decode side's requests: {e}")))?;
    let mut decode_side = simulate_cluster_on(&second, limits, decode, (cost, pipeline), router)?;
    let mut prefill_side = prefill_side;
    for (side, c) in [("prefill", &mut prefill_side), ("decode", &mut decode_side)] {
        for s in &mut c.replicas {
            if let Some(serde_json::Value::Object(meta)) = &mut s.schedule.meta {
                meta.insert("side".into(), side.into());
            }
        }
    }
    Ok(DisaggregatedSimulation {
        prefill: prefill_side,
        decode: decode_side,
        kv_ready_s: ready,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Knobs, SchedulerKind};
    use infersched_core::disaggregated::replay_disaggregated;
    use infersched_core::{Action, Summary};

    use infersched_test_kit::EverySecond as Second;

    fn link(latency_s: f64) -> KvLink {
        KvLink {
            bytes_per_token: 1.0,
            bandwidth_bytes_per_s: 1e12,
            latency_s,
        }
    }

    fn policies(kind: SchedulerKind, n: usize, w: &Workload) -> Vec<Box<dyn Policy>> {
        (0..n).map(|_| kind.policy(&Knobs::default(), w)).collect()
    }

    /// The independent replay of a simulated disaggregated cluster (one-second batches).
    fn replayed(
        w: &Workload,
        limits: &Limits,
        lk: &KvLink,
        sim: &DisaggregatedSimulation,
    ) -> infersched_core::disaggregated::DisaggregatedReplay {
        let schedules = |c: &crate::ClusterSimulation| -> Vec<_> {
            c.replicas.iter().map(|s| s.schedule.clone()).collect()
        };
        replay_disaggregated(
            w,
            limits,
            &Second,
            lk,
            &sim.prefill.routing,
            &schedules(&sim.prefill),
            &sim.decode.routing,
            &schedules(&sim.decode),
        )
        .unwrap()
    }

    #[test]
    fn a_request_prefills_on_one_side_and_decodes_on_the_other() {
        // One request (I = 4, O = 3) at 0: prefilled in [0, 1] (first token at 1), its KV
        // ready at 1.5; on the decode side it takes 3 tokens of KV, computes the last prompt
        // token in [1.5, 2.5] (the client's first token) and decodes in [2.5, 3.5] and
        // [3.5, 4.5].
        let w = infersched_test_kit::workload(&[(4, 3, 0.0)]);
        let kind = SchedulerKind::VllmV1;
        let limits = kind.limits(&Knobs::default(), &w);
        let (mut p, mut d) = (policies(kind, 1, &w), policies(kind, 1, &w));
        let lk = link(0.5);
        let sim = simulate_disaggregated(
            &w,
            &limits,
            &mut p,
            &mut d,
            &Second,
            Router::RoundRobin,
            &lk,
        )
        .unwrap();
        assert!((sim.kv_ready_s[0] - 1.5).abs() < 1e-9);
        let first = &sim.decode.replicas[0].schedule.batches[0].entries[0];
        assert_eq!((first.cached, first.action), (3, Action::Process(1)));
        let r = replayed(&w, &limits, &lk, &sim);
        let rec = &r.cluster.merged.requests[0];
        assert_eq!(rec.arrival_s, 0.0);
        assert!((rec.first_token_s - 2.5).abs() < 1e-9);
        assert!((rec.completion_s - 4.5).abs() < 1e-9);
        // Processed: 4 prompt tokens on the prefill side, 1 + 2 on the decode side.
        assert_eq!((rec.processed_tokens, rec.cached_tokens), (7, 3));
        let s = Summary::of_disaggregated(&r, "round-robin", &lk);
        let c = s.cluster.as_ref().unwrap();
        assert_eq!((c.replicas, c.prefill_replicas), (2, Some(1)));
        assert_eq!(s.batches, 4);
    }

    #[test]
    fn a_prefill_replica_keeps_a_prompts_kv_until_it_is_sent() {
        // Two prompts of 5 tokens at 0, M = 8 in blocks of 1 (each batch 1 s): the first
        // prompt's KV stays on the prefill replica until its send ends (0.5 s after its
        // token at 1 s), so the second prompt, which does not fit beside it, starts at
        // 1.5 s rather than 1 s; the replay takes that start and the same KV.
        let w = infersched_test_kit::workload(&[(5, 2, 0.0), (5, 2, 0.0)]);
        let kind = SchedulerKind::VllmV1;
        let knobs = Knobs {
            kv_capacity: Some(8),
            block_size: Some(1),
            ..Knobs::default()
        };
        let limits = kind.limits(&knobs, &w);
        let run = |latency_s| {
            let side = || -> Vec<Box<dyn Policy>> { vec![kind.policy(&knobs, &w)] };
            let (mut p, mut d) = (side(), side());
            let lk = link(latency_s);
            let sim = simulate_disaggregated(
                &w,
                &limits,
                &mut p,
                &mut d,
                &Second,
                Router::RoundRobin,
                &lk,
            )
            .unwrap();
            let r = replayed(&w, &limits, &lk, &sim);
            let kv: Vec<u64> = r
                .prefill
                .merged
                .batches
                .iter()
                .map(|b| b.kv_tokens)
                .collect();
            let accounts: Vec<u64> = sim.prefill.replicas[0]
                .accounts
                .iter()
                .map(|a| a.kv_tokens)
                .collect();
            assert_eq!(kv, accounts, "the simulator's KV is the replay's");
            r.prefill.merged.batches[1].start_s
        };
        assert!((run(0.5) - 1.5).abs() < 1e-9);
        assert!((run(0.0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn decode_replicas_must_take_the_transferred_kv() {
        let w = infersched_test_kit::workload(&[(4, 3, 0.0)]);
        let limits = SchedulerKind::VllmV1.limits(&Knobs::default(), &w);
        let mut p = policies(SchedulerKind::VllmV1, 1, &w);
        let mut d = policies(SchedulerKind::Sarathi, 1, &w);
        let e = simulate_disaggregated(
            &w,
            &limits,
            &mut p,
            &mut d,
            &Second,
            Router::RoundRobin,
            &link(0.0),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("sarathi does not take KV computed elsewhere"),
            "{e}"
        );
    }
}
