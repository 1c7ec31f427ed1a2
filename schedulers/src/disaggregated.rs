//! A disaggregated cluster (`--disaggregate P:D`; semantics.md, "Disaggregated prefill and
//! decode"): P prefill replicas serve every request's prompt and first token, then D decode
//! replicas, where each request arrives when its KV has crossed the link, serve the rest.
//! Each side is a cluster behind the same router rule ([`crate::cluster`]); the decode
//! side's arrivals come from the independent replay of the prefill side's schedules.

use crate::cluster::{ClusterSimulation, Router, into_cluster, simulate_cluster_on};
use crate::router::{RouterState, load_at};
use crate::sim::{Brings, Run, Simulator, Step, check_servable};
use crate::{Policy, SimError};
use infersched_core::cluster::replay_cluster_on;
use infersched_core::disaggregated::{
    KvConnector, KvLink, decode_workload, kv_ready_s, prefill_workload,
};
use infersched_core::{BlockKeys, CostModel, Limits, Pipeline, Request, Workload};

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
    if let Some(p) = decode.iter().find(|p| !p.takes_transferred_kv()) {
        return Err(SimError::TransferredKv { policy: p.name() });
    }
    if link.connector == KvConnector::Nixl {
        return simulate_disaggregated_pulled(
            workload,
            limits,
            (prefill, decode),
            (cost, pipeline),
            router,
            link,
        );
    }
    let first =
        prefill_workload(workload, link).map_err(|e| SimError::Disaggregated(e.to_string()))?;
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

/// [`simulate_disaggregated_on`] where the KV is pulled (the link and the decode
/// policies checked): a request's decode replica receives it (allocating its blocks) when
/// its scheduler admits the request, the transfer follows, and the prefill replica keeps
/// it until then (vLLM's NixlConnector). Both sides are simulated together, in time
/// order, since each waits on the other.
fn simulate_disaggregated_pulled(
    workload: &Workload,
    limits: &Limits,
    (prefill, decode): Sides<'_>,
    (cost, pipeline): (&dyn CostModel, &Pipeline),
    router: Router,
    link: &KvLink,
) -> Result<DisaggregatedSimulation, SimError> {
    limits.validate()?;
    pipeline.validate()?;
    let first =
        prefill_workload(workload, link).map_err(|e| SimError::Disaggregated(e.to_string()))?;
    let (Some(p0), Some(d0)) = (prefill.first(), decode.first()) else {
        return Err(SimError::Replicas(0));
    };
    check_servable(
        &first,
        limits,
        p0.as_ref(),
        &Simulator::new(&first, *limits),
    )?;
    check_servable(
        workload,
        limits,
        d0.as_ref(),
        &Simulator::new(workload, *limits),
    )?;
    let mut co = CoSimulation::new(
        (workload, &first),
        limits,
        (prefill, decode),
        pipeline,
        router,
        link,
    );
    co.run(cost)?;
    Ok(co.finish())
}

/// The state of a pulled disaggregated simulation: both sides' replicas, where each
/// request went, and the events between them.
struct CoSimulation<'a, 'w> {
    workload: &'w Workload,
    link: &'a KvLink,
    router: Router,
    policies: Sides<'a>,
    prefill: Side<'w>,
    decode: Side<'w>,
    /// Requests whose prefill token is out, by when (their decode-side arrival).
    handed: std::collections::BinaryHeap<std::cmp::Reverse<Handed>>,
    /// Prefill arrivals routed so far (in FCFS order).
    next_arrival: usize,
    arrivals: Vec<u32>,
    /// When each request's KV reached its decode replica (receive + transfer).
    kv_ready_s: Vec<f64>,
}

/// One side's replicas and bookkeeping.
struct Side<'w> {
    runs: Vec<Run<'w>>,
    routing: RouterState,
    members: Vec<Vec<u32>>,
    replica_of: Vec<u32>,
    local: Vec<u32>,
    blocked: Vec<bool>,
    /// With prefix caching, the key chains of the side's requests (as
    /// [`crate::simulate_cluster_on`] keeps them).
    keys: Option<BlockKeys>,
}

impl<'w> Side<'w> {
    /// `replicas` replicas running `policy` on `pipeline`, for the requests of `w` (with
    /// its prefix cache where `caching` and the policy keeps one).
    fn new(
        (replicas, w, caching): (usize, &Workload, bool),
        limits: &Limits,
        pipeline: &Pipeline,
        policy: &dyn Policy,
        router: Router,
    ) -> Self {
        let rule = policy.prefix_cache().filter(|_| caching);
        let keys = rule.map(|_| BlockKeys::new(w, limits.block_size));
        let runs = (0..replicas)
            .map(|_| {
                let mut sim = Simulator::empty(*limits);
                if let (Some(rule), Some(k)) = (rule, &keys) {
                    sim.enable_prefix_cache(
                        rule,
                        BlockKeys::empty(limits.block_size, k.id_block()),
                    );
                }
                let mut run = Run::new(sim, 0);
                run.set_pipeline(*pipeline, policy);
                run
            })
            .collect();
        let n = w.len();
        Self {
            runs,
            routing: RouterState::new(router),
            members: vec![Vec::new(); replicas],
            replica_of: vec![0; n],
            local: vec![0; n],
            blocked: vec![false; replicas],
            keys,
        }
    }

    /// Routes request `g` (arriving at `r.arrival_s`) to a replica and gives it there.
    fn route(&mut self, g: u32, r: Request, brings: Brings) {
        let t = r.arrival_s;
        let runs = &self.runs;
        let k = self.routing.pick(runs.len(), &|k| load_at(&runs[k], t));
        let chains = self
            .keys
            .as_ref()
            .map_or_else(Vec::new, |keys| keys.chains_of(g).to_vec());
        self.local[g as usize] = self.runs[k].add_request(r, chains, brings);
        self.members[k].push(g);
        self.replica_of[g as usize] = k as u32;
        self.blocked[k] = false;
    }

    /// The replica whose next decision comes first (not blocked), with when.
    fn due(&self) -> Option<(f64, usize)> {
        (0..self.runs.len())
            .filter(|&k| !self.blocked[k])
            .filter_map(|k| self.runs[k].due_s().map(|t| (t, k)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
    }
}

/// A request handed from the prefill side to the decode side at `at_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Handed {
    at_s: f64,
    request: u32,
}

impl Eq for Handed {}
impl PartialOrd for Handed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Handed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at_s
            .total_cmp(&other.at_s)
            .then(self.request.cmp(&other.request))
    }
}

/// What happens next in a co-simulation (ties in this order: arrivals before batches).
enum Next {
    Arrival(u32),
    Handed(Handed),
    PrefillStep(usize),
    DecodeStep(usize),
}

impl<'a, 'w> CoSimulation<'a, 'w> {
    /// Both sides for `workload`, its prefill side's requests `first` (one token each).
    fn new(
        (workload, first): (&'w Workload, &Workload),
        limits: &Limits,
        policies: Sides<'a>,
        pipeline: &Pipeline,
        router: Router,
        link: &'a KvLink,
    ) -> Self {
        let n = workload.len();
        let (p, d) = (&policies.0[0], &policies.1[0]);
        let sides = (policies.0.len(), policies.1.len());
        let prefill = Side::new((sides.0, first, true), limits, pipeline, p.as_ref(), router);
        // The decode side's requests bring their KV: no prefix cache there.
        let decode = Side::new(
            (sides.1, workload, false),
            limits,
            pipeline,
            d.as_ref(),
            router,
        );
        Self {
            workload,
            link,
            router,
            policies,
            prefill,
            decode,
            handed: std::collections::BinaryHeap::new(),
            next_arrival: 0,
            arrivals: workload.fcfs_order(),
            kv_ready_s: vec![f64::NAN; n],
        }
    }

    /// The earliest event: an arrival at the cluster, a request handed over, or a
    /// replica's next batch.
    fn next(&self) -> Option<Next> {
        let reqs = self.workload.requests();
        let arrival = self
            .arrivals
            .get(self.next_arrival)
            .map(|&g| (reqs[g as usize].arrival_s, Next::Arrival(g)));
        let handed = self.handed.peek().map(|h| (h.0.at_s, Next::Handed(h.0)));
        let p = self.prefill.due().map(|(t, k)| (t, Next::PrefillStep(k)));
        let d = self.decode.due().map(|(t, k)| (t, Next::DecodeStep(k)));
        [arrival, handed, p, d]
            .into_iter()
            .flatten()
            .reduce(|a, b| if b.0 < a.0 { b } else { a })
            .map(|(_, e)| e)
    }

    fn run(&mut self, cost: &dyn CostModel) -> Result<(), SimError> {
        while let Some(event) = self.next() {
            match event {
                Next::Arrival(g) => self.arrive(g),
                Next::Handed(h) => self.hand_over(h),
                Next::PrefillStep(k) => self.prefill_step(k, cost)?,
                Next::DecodeStep(k) => self.decode_step(k, cost)?,
            }
        }
        if let Some(k) = (0..self.prefill.runs.len()).find(|&k| self.prefill.blocked[k]) {
            let reason = "its KV is full of prompts their decode replicas never receive";
            return Err(SimError::Replica {
                replica: k as u32,
                source: Box::new(SimError::Disaggregated(format!(
                    "the prefill side: {reason}"
                ))),
            });
        }
        Ok(())
    }

    fn arrive(&mut self, g: u32) {
        self.next_arrival += 1;
        let r = Request {
            output_tokens: 1,
            ..self.workload.requests()[g as usize]
        };
        let hold = Brings {
            transferred: 0,
            kv_hold_s: f64::INFINITY,
            transfer_s: None,
        };
        self.prefill.route(g, r, hold);
    }

    fn hand_over(&mut self, h: Handed) {
        self.handed.pop();
        let r = Request {
            arrival_s: h.at_s,
            ..self.workload.requests()[h.request as usize]
        };
        let brings = Brings {
            transferred: r.input_tokens,
            kv_hold_s: 0.0,
            transfer_s: Some(self.link.transfer_s(r.input_tokens)),
        };
        self.decode.route(h.request, r, brings);
    }

    fn prefill_step(&mut self, k: usize, cost: &dyn CostModel) -> Result<(), SimError> {
        // A request may be given to the replica no earlier than the next arrival, and KV it
        // holds may be released no earlier than the decode side's next batch (a receive
        // there, perhaps of a request about to be handed over, ends a hold after it).
        let reqs = self.workload.requests();
        let arrival = self
            .arrivals
            .get(self.next_arrival)
            .map_or(f64::INFINITY, |&g| reqs[g as usize].arrival_s);
        let handed = self.handed.peek().map_or(f64::INFINITY, |h| h.0.at_s);
        let decode = self.decode.due().map_or(f64::INFINITY, |(t, _)| t);
        self.prefill.runs[k].set_horizon(arrival.min(handed).min(decode));
        let step = self.prefill.runs[k]
            .step(self.policies.0[k].as_mut(), cost)
            .map_err(|e| side_error("prefill", k, e))?;
        self.prefill.blocked[k] = step == Step::Blocked;
        for (i, end_s) in std::mem::take(&mut self.prefill.runs[k].completed) {
            let request = self.prefill.members[k][i as usize];
            self.handed.push(std::cmp::Reverse(Handed {
                at_s: end_s,
                request,
            }));
        }
        Ok(())
    }

    fn decode_step(&mut self, k: usize, cost: &dyn CostModel) -> Result<(), SimError> {
        // A request may be handed over no earlier than the next known hand-over, the
        // next prefill batch (which ends after it starts) or the next arrival at the
        // cluster (which a prefill batch serves first).
        let handed = self.handed.peek().map_or(f64::INFINITY, |h| h.0.at_s);
        let prefill = self.prefill.due().map_or(f64::INFINITY, |(t, _)| t);
        let reqs = self.workload.requests();
        let arrival = self
            .arrivals
            .get(self.next_arrival)
            .map_or(f64::INFINITY, |&g| reqs[g as usize].arrival_s);
        self.decode.runs[k].set_horizon(handed.min(prefill).min(arrival));
        let run = &mut self.decode.runs[k];
        let step = run
            .step(self.policies.1[k].as_mut(), cost)
            .map_err(|e| side_error("decode", k, e))?;
        if step != Step::Batch {
            return Ok(());
        }
        let batch = run.last_batch().expect("a batch was run");
        let start = batch.start_s.unwrap_or(0.0);
        let received: Vec<u32> = batch
            .entries
            .iter()
            .filter(|e| e.action == infersched_core::Action::Receive)
            .map(|e| self.decode.members[k][e.request as usize])
            .collect();
        for g in received {
            let ready = start
                + self
                    .link
                    .transfer_s(self.workload.requests()[g as usize].input_tokens);
            self.kv_ready_s[g as usize] = ready;
            let p = self.prefill.replica_of[g as usize] as usize;
            self.prefill.runs[p].release_at(self.prefill.local[g as usize], ready);
            self.prefill.blocked[p] = false;
        }
        Ok(())
    }

    fn finish(self) -> DisaggregatedSimulation {
        let mark = |mut c: ClusterSimulation, side: &str| {
            for s in &mut c.replicas {
                if let Some(serde_json::Value::Object(meta)) = &mut s.schedule.meta {
                    meta.insert("side".into(), side.into());
                }
            }
            c
        };
        let (p, d) = (self.prefill, self.decode);
        let prefill = into_cluster(
            p.runs,
            self.policies.0,
            &p.members,
            p.replica_of,
            self.router,
        );
        let decode = into_cluster(
            d.runs,
            self.policies.1,
            &d.members,
            d.replica_of,
            self.router,
        );
        DisaggregatedSimulation {
            prefill: mark(prefill, "prefill"),
            decode: mark(decode, "decode"),
            kv_ready_s: self.kv_ready_s,
        }
    }
}

/// An error of replica `k` of one side.
fn side_error(side: &str, k: usize, e: SimError) -> SimError {
    SimError::Replica {
        replica: k as u32,
        source: Box::new(SimError::Disaggregated(format!("the {side} side: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Knobs, SchedulerKind};
    use infersched_core::disaggregated::replay_disaggregated;
    use infersched_core::{Action, Summary};

    use infersched_test_kit::EverySecond as Second;

    /// A link of `latency_s` per transfer (and next to no time per token), pushing.
    fn link(latency_s: f64) -> KvLink {
        KvLink {
            bytes_per_token: 1.0,
            bandwidth_bytes_per_s: 1e12,
            latency_s,
            connector: KvConnector::P2pNccl,
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
        replayed_with(&Second, w, limits, lk, sim)
    }

    /// The independent replay of a simulated disaggregated cluster under `cost`.
    fn replayed_with(
        cost: &dyn CostModel,
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
            cost,
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

    /// One second per batch that computes anything; a batch of receives only takes no
    /// time (as with every linear cost model).
    struct SecondPerComputingBatch;

    impl CostModel for SecondPerComputingBatch {
        fn batch_time_s(&self, f: &infersched_core::BatchFeatures) -> f64 {
            if f.tokens == 0 { 0.0 } else { 1.0 }
        }
    }

    #[test]
    fn a_decode_replica_waiting_for_a_pull_receives_a_request_handed_over_meanwhile() {
        // A at 0 and B at 1.5 (I = 4, O = 2; each computing batch 1 s), pulled over a
        // link of 10 s per transfer: the decode replica receives A at 1 (its first token)
        // and waits for its KV until 11; B, prefilled in [1.5, 2.5], is received at 2.5,
        // as vLLM admits it into WAITING_FOR_REMOTE_KVS when it arrives. (It was received
        // at 11: the replica's wait ignored arrivals at the cluster still to be prefilled.)
        let w = infersched_test_kit::workload(&[(4, 2, 0.0), (4, 2, 1.5)]);
        let kind = SchedulerKind::VllmV1;
        let limits = kind.limits(&Knobs::default(), &w);
        let (mut p, mut d) = (policies(kind, 1, &w), policies(kind, 1, &w));
        let lk = KvLink {
            connector: KvConnector::Nixl,
            ..link(10.0)
        };
        let cost = SecondPerComputingBatch;
        let sim =
            simulate_disaggregated(&w, &limits, &mut p, &mut d, &cost, Router::RoundRobin, &lk)
                .unwrap();
        let receive_start = |request| {
            sim.decode.replicas[0]
                .schedule
                .batches
                .iter()
                .find(|b| {
                    b.entries
                        .iter()
                        .any(|e| e.request == request && e.action == Action::Receive)
                })
                .and_then(|b| b.start_s)
                .unwrap()
        };
        assert!((receive_start(0) - 1.0).abs() < 1e-9);
        assert!(
            (receive_start(1) - 2.5).abs() < 1e-9,
            "{}",
            receive_start(1)
        );
        assert!((sim.kv_ready_s[1] - 12.5).abs() < 1e-9);
        // A computes in [11, 12] and decodes in [12, 13]; B's KV is there at 12.5, so it
        // runs in the next batch, [13, 14]; the replay agrees.
        let r = replayed_with(&cost, &w, &limits, &lk, &sim);
        let first_token = r.cluster.merged.requests[1].first_token_s;
        assert!((first_token - 14.0).abs() < 1e-9, "{first_token}");
    }

    #[test]
    fn a_prefill_replica_waits_for_releases_the_decode_side_may_still_make() {
        // A (I = 8), B (I = 2) and C (I = 4) at 0 (C = 8 tokens per batch, M = 12 in blocks
        // of 1, the link moving 1 token per second): A is prefilled in [0, 1] and B in
        // [1, 2]; C does not fit beside their held KV. The decode side receives A at 1 (its
        // KV read by 9) and B at 2 (read by 4), so the prefill replica frees B's KV at 4
        // and runs C then, as vLLM frees it when the send is reported. (It ran C at 9:
        // knowing only A's release, it waited for that one.)
        let w = infersched_test_kit::workload(&[(8, 2, 0.0), (2, 2, 0.0), (4, 2, 0.0)]);
        let kind = SchedulerKind::VllmV1;
        let knobs = Knobs {
            token_budget: Some(8),
            kv_capacity: Some(12),
            block_size: Some(1),
            ..Knobs::default()
        };
        let limits = kind.limits(&knobs, &w);
        let side = || -> Vec<Box<dyn Policy>> { vec![kind.policy(&knobs, &w)] };
        let (mut p, mut d) = (side(), side());
        let lk = KvLink {
            bytes_per_token: 1.0,
            bandwidth_bytes_per_s: 1.0,
            latency_s: 0.0,
            connector: KvConnector::Nixl,
        };
        let cost = SecondPerComputingBatch;
        let sim =
            simulate_disaggregated(&w, &limits, &mut p, &mut d, &cost, Router::RoundRobin, &lk)
                .unwrap();
        assert!((sim.kv_ready_s[0] - 9.0).abs() < 1e-9 && (sim.kv_ready_s[1] - 4.0).abs() < 1e-9);
        let prefill = &sim.prefill.replicas[0].schedule.batches;
        let c_start = prefill
            .iter()
            .find(|b| b.entries.iter().any(|e| e.request == 2))
            .and_then(|b| b.start_s)
            .unwrap();
        assert!((c_start - 4.0).abs() < 1e-9, "C starts at {c_start}");
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
