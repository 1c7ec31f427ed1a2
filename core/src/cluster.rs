//! A cluster of replicas behind a router: which replica serves each request (the
//! [`Routing`]), one schedule per replica, and the replay that checks them all
//! ([`replay_cluster`]): every request is routed to exactly one replica, each replica's
//! schedule serves exactly the requests routed to it and replays under the limits, and the
//! cluster's metrics come from those replays.

use crate::replay::{Replay, ReplayError};
use crate::request::Workload;
use crate::schedule::Schedule;
use crate::{CostModel, Limits};
use serde::Serialize;
use std::path::Path;
use thiserror::Error;

pub use crate::limits::MAX_REPLICAS;

/// Why a cluster's routing or schedules are not valid.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ClusterError {
    /// A cluster has at least one replica.
    #[error("a cluster needs at least 1 replica and at most {MAX_REPLICAS}, got {0}")]
    Replicas(u32),
    /// The routing does not name one replica per request.
    #[error("the routing names {routed} requests and the workload has {requests}")]
    RoutingLength {
        /// Requests routed.
        routed: usize,
        /// Requests in the workload.
        requests: usize,
    },
    /// A request is routed to a replica that does not exist.
    #[error(
        "request {request} is routed to replica {replica}; the cluster has replicas 0..{replicas}"
    )]
    UnknownReplica {
        /// Request id.
        request: u32,
        /// The replica named.
        replica: u32,
        /// Replicas in the cluster.
        replicas: u32,
    },
    /// Not one schedule per replica.
    #[error("{schedules} schedules for {replicas} replicas")]
    Schedules {
        /// Schedules given.
        schedules: usize,
        /// Replicas in the cluster.
        replicas: u32,
    },
    /// A replica's schedule names a request routed to another replica (or none).
    #[error(
        "replica {replica}, batch {batch}: request {request} is routed to {}",
        match routed_to { Some(r) => format!("replica {r}"), None => "no replica (the workload has fewer requests)".to_string() }
    )]
    NotRouted {
        /// The replica whose schedule names it.
        replica: u32,
        /// Batch index in that schedule.
        batch: usize,
        /// Request id.
        request: u32,
        /// Where it is routed, if it exists.
        routed_to: Option<u32>,
    },
    /// A replica's schedule does not replay (request ids are the workload's).
    #[error("replica {replica}: {source}")]
    Replica {
        /// The replica.
        replica: u32,
        /// What the replay found.
        source: ReplayError,
    },
    /// No schedule of any cluster can serve the workload under these limits.
    #[error(transparent)]
    Workload(ReplayError),
    /// One side of a disaggregated cluster is not valid.
    #[error("the {side} side: {source}")]
    Side {
        /// `prefill` or `decode`.
        side: &'static str,
        /// What its replay found.
        source: Box<ClusterError>,
    },
    /// A disaggregated cluster's decode side cannot take the requests the prefill side
    /// hands it (e.g. KV ready past the latest time accepted).
    #[error("the decode replicas' requests: {0}")]
    DecodeSide(crate::WorkloadError),
    /// A disaggregated cluster's KV link is not valid.
    #[error("the KV link: {0}")]
    KvLink(crate::disaggregation::DisaggregationError),
    /// A decode replica's schedule pulls the KV (receive entries) but request `request`
    /// does not receive it before it runs, or takes it pushed.
    #[error("the decode side, replica {replica}, batch {batch}: request {request} {reason}")]
    Pull {
        /// The decode replica.
        replica: u32,
        /// Batch index in its schedule.
        batch: usize,
        /// Request id (the workload's).
        request: u32,
        /// What it did.
        reason: String,
    },
    /// A line of a routing file is not `request,replica,routed_at_s`.
    #[error("{path}, line {line}: {reason}")]
    RoutingFile {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What was wrong.
        reason: String,
    },
}

/// Which replica serves each request: `replica_of[i]` for request `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    replicas: u32,
    replica_of: Vec<u32>,
}

impl Routing {
    /// Checks that there are 1 to [`MAX_REPLICAS`] replicas and every request names one.
    pub fn new(replicas: u32, replica_of: Vec<u32>) -> Result<Self, ClusterError> {
        if replicas == 0 || replicas > MAX_REPLICAS {
            return Err(ClusterError::Replicas(replicas));
        }
        if let Some((i, &r)) = replica_of.iter().enumerate().find(|(_, r)| **r >= replicas) {
            return Err(ClusterError::UnknownReplica {
                request: i as u32,
                replica: r,
                replicas,
            });
        }
        Ok(Self {
            replicas,
            replica_of,
        })
    }

    /// Replicas in the cluster.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The replica of each request, by request id.
    pub fn replica_of(&self) -> &[u32] {
        &self.replica_of
    }

    /// The requests routed to each replica, each list in increasing id.
    pub fn members(&self) -> Vec<Vec<u32>> {
        let mut m = vec![Vec::new(); self.replicas as usize];
        for (i, &r) in self.replica_of.iter().enumerate() {
            m[r as usize].push(i as u32);
        }
        m
    }

    /// Reads a routing CSV (`request,replica,routed_at_s`, one row per request in any
    /// order, as `routing.csv` is written) for a workload of `requests` requests in a
    /// cluster of `replicas`.
    pub fn read_csv(path: &Path, requests: usize, replicas: u32) -> Result<Self, ClusterError> {
        let file_error = |line: usize, reason: String| ClusterError::RoutingFile {
            path: path.display().to_string(),
            line,
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(0, e.to_string()))?;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, h)) if h.trim().starts_with("request,replica") => {}
            _ => {
                return Err(file_error(
                    1,
                    "expected the header request,replica,routed_at_s".into(),
                ));
            }
        }
        let mut replica_of = vec![u32::MAX; requests];
        for (k, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
            let mut cells = line.split(',').map(str::trim);
            let mut number = |name: &str| -> Result<u32, ClusterError> {
                let cell = cells.next().unwrap_or("");
                cell.parse().map_err(|_| {
                    file_error(
                        k + 1,
                        format!("{name}: expected a non-negative integer, got \"{cell}\""),
                    )
                })
            };
            let (request, replica) = (number("request")?, number("replica")?);
            let slot = replica_of.get_mut(request as usize).ok_or_else(|| {
                file_error(
                    k + 1,
                    format!("request {request}: the workload has {requests} requests"),
                )
            })?;
            if *slot != u32::MAX {
                return Err(file_error(
                    k + 1,
                    format!("request {request} is routed twice"),
                ));
            }
            *slot = replica;
        }
        if let Some(i) = replica_of.iter().position(|&r| r == u32::MAX) {
            return Err(file_error(
                0,
                format!("request {i} is not routed (every request needs one row)"),
            ));
        }
        Self::new(replicas, replica_of)
    }
}

/// A cluster's replay: each replica's, and the whole cluster's in the workload's ids.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterReplay {
    /// Per replica (None where no request was routed to it). Each replay's `requests` are
    /// its members in increasing id and carry the workload's ids in `id`;
    /// `tbt_gap_requests` index that list.
    pub replicas: Vec<Option<Replay>>,
    /// The cluster as one replay: `requests` indexed by the workload's ids, the replicas'
    /// batches ordered by end time (ties by replica), every token gap. Its batch records
    /// keep their replica's batch indices.
    pub merged: Replay,
}

/// Replays `schedules[r]` for the requests `routing` sends to replica `r`, under `limits`
/// and `cost` (every replica alike). Schedules name requests by the workload's ids.
pub fn replay_cluster(
    workload: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    routing: &Routing,
    schedules: &[Schedule],
) -> Result<ClusterReplay, ClusterError> {
    let none = crate::pipeline::Pipeline::none();
    replay_cluster_on(workload, limits, (cost, &none), routing, schedules)
}

/// [`replay_cluster`] with every replica a pipeline of `pipeline.stages` stages
/// ([`crate::replay::replay_pipelined`]).
pub fn replay_cluster_on(
    workload: &Workload,
    limits: &Limits,
    (cost, pipeline): (&dyn CostModel, &crate::pipeline::Pipeline),
    routing: &Routing,
    schedules: &[Schedule],
) -> Result<ClusterReplay, ClusterError> {
    if routing.replica_of.len() != workload.len() {
        return Err(ClusterError::RoutingLength {
            routed: routing.replica_of.len(),
            requests: workload.len(),
        });
    }
    if schedules.len() != routing.replicas as usize {
        return Err(ClusterError::Schedules {
            schedules: schedules.len(),
            replicas: routing.replicas,
        });
    }
    // The whole workload's feasibility, named by the workload's ids.
    limits
        .validate()
        .map_err(|e| ClusterError::Workload(e.into()))?;
    limits
        .check_feasible(workload)
        .map_err(|e| ClusterError::Workload(e.into()))?;
    let mut local = vec![u32::MAX; workload.len()];
    let mut replicas = Vec::with_capacity(schedules.len());
    for (r, (members, schedule)) in routing.members().iter().zip(schedules).enumerate() {
        for (k, &g) in members.iter().enumerate() {
            local[g as usize] = k as u32;
        }
        let one = replay_replica(
            workload,
            limits,
            (cost, pipeline),
            routing,
            r as u32,
            members,
            &local,
            schedule,
        )?;
        replicas.push(one);
    }
    let merged = merge(workload, routing, &replicas);
    Ok(ClusterReplay { replicas, merged })
}

/// One replica's schedule renumbered to its members and replayed.
#[allow(clippy::too_many_arguments)]
fn replay_replica(
    workload: &Workload,
    limits: &Limits,
    (cost, pipeline): (&dyn CostModel, &crate::pipeline::Pipeline),
    routing: &Routing,
    replica: u32,
    members: &[u32],
    local: &[u32],
    schedule: &Schedule,
) -> Result<Option<Replay>, ClusterError> {
    let mut renumbered = schedule.clone();
    for (j, batch) in renumbered.batches.iter_mut().enumerate() {
        for e in &mut batch.entries {
            let routed_to = routing.replica_of.get(e.request as usize).copied();
            if routed_to != Some(replica) {
                return Err(ClusterError::NotRouted {
                    replica,
                    batch: j,
                    request: e.request,
                    routed_to,
                });
            }
            e.request = local[e.request as usize];
        }
    }
    if members.is_empty() {
        return Ok(None);
    }
    let sub = workload
        .members(members)
        .expect("members of a valid workload, at least one");
    let replayed = crate::replay::replay_pipelined(&sub, limits, cost, pipeline, &renumbered);
    let mut one = replayed.map_err(|e| ClusterError::Replica {
        replica,
        source: e.with_request_ids(members),
    })?;
    for rec in &mut one.requests {
        rec.id = members[rec.id as usize];
    }
    Ok(Some(one))
}

/// The replicas' replays as one, in the workload's ids.
fn merge(workload: &Workload, routing: &Routing, replicas: &[Option<Replay>]) -> Replay {
    let members = routing.members();
    let mut requests = vec![None; workload.len()];
    let (mut gaps, mut gap_requests) = (Vec::new(), Vec::new());
    for (one, ids) in replicas.iter().zip(&members) {
        let Some(one) = one else { continue };
        for rec in &one.requests {
            requests[rec.id as usize] = Some(rec.clone());
        }
        gaps.extend_from_slice(&one.tbt_gaps_s);
        gap_requests.extend(one.tbt_gap_requests.iter().map(|&k| ids[k as usize]));
    }
    let batches = merge_by_end(replicas);
    let first = replicas
        .iter()
        .flatten()
        .next()
        .expect("at least one request");
    Replay {
        limits: first.limits,
        batches,
        requests: requests
            .into_iter()
            .map(|r| r.expect("every request is routed to one replica, which replayed it"))
            .collect(),
        tbt_gaps_s: gaps,
        tbt_gap_requests: gap_requests,
    }
}

/// The replicas' batches by end time, ties in replica order: a k-way merge of lists each
/// already in that order (a replica's batches follow one another). Ends are finite and
/// non-negative, so their bits order as they do.
pub(crate) fn merge_by_end(replicas: &[Option<Replay>]) -> Vec<crate::replay::BatchRecord> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let lists: Vec<&[crate::replay::BatchRecord]> = replicas
        .iter()
        .map(|r| r.as_ref().map_or(&[][..], |r| &r.batches[..]))
        .collect();
    let mut next = vec![0usize; lists.len()];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = lists
        .iter()
        .enumerate()
        .filter_map(|(r, l)| Some(Reverse((l.first()?.end_s.to_bits(), r))))
        .collect();
    let mut out = Vec::with_capacity(lists.iter().map(|l| l.len()).sum());
    while let Some(Reverse((_, r))) = heap.pop() {
        out.push(lists[r][next[r]].clone());
        next[r] += 1;
        if let Some(b) = lists[r].get(next[r]) {
            heap.push(Reverse((b.end_s.to_bits(), r)));
        }
    }
    out
}

/// How the load fell on each replica (`summary.json`'s `cluster`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterLoad {
    /// Replicas in the cluster.
    pub replicas: u32,
    /// The routing rule (`round-robin`, `random:7`, ...).
    pub router: String,
    /// In a disaggregated cluster, the replicas that run prefills: the first ones, the
    /// others decode (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_replicas: Option<u32>,
    /// In a disaggregated cluster, the link KV moves over (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_link: Option<crate::disaggregation::KvLink>,
    /// Per replica, in order.
    pub per_replica: Vec<ReplicaLoad>,
}

/// One replica's share of the work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaLoad {
    /// Replica index.
    pub replica: u32,
    /// Requests routed to it.
    pub requests: usize,
    /// Batches it ran.
    pub batches: usize,
    /// Time it ran batches (s).
    pub busy_s: f64,
    /// End of its last batch (s; 0 when it served nothing).
    pub makespan_s: f64,
    /// Mean end-to-end latency of its requests (s; None when it served nothing).
    pub mean_e2e_s: Option<f64>,
    /// Largest KV it held after any batch (tokens, block-rounded).
    pub peak_kv_tokens: u64,
}

impl ClusterLoad {
    /// The load of each replica of `cluster`, routed by `router`.
    pub fn of(cluster: &ClusterReplay, router: &str) -> Self {
        let per_replica = cluster
            .replicas
            .iter()
            .enumerate()
            .map(|(r, one)| ReplicaLoad::of(r as u32, one.as_ref()))
            .collect();
        Self {
            replicas: cluster.replicas.len() as u32,
            router: router.to_string(),
            prefill_replicas: None,
            kv_link: None,
            per_replica,
        }
    }
}

impl ReplicaLoad {
    fn of(replica: u32, one: Option<&Replay>) -> Self {
        let Some(one) = one else {
            return Self {
                replica,
                requests: 0,
                batches: 0,
                busy_s: 0.0,
                makespan_s: 0.0,
                mean_e2e_s: None,
                peak_kv_tokens: 0,
            };
        };
        let n = one.requests.len();
        Self {
            replica,
            requests: n,
            batches: one.batches.len(),
            busy_s: one
                .batches
                .iter()
                .filter(|b| b.features.tokens > 0)
                .map(|b| b.duration_s())
                .sum(),
            makespan_s: one.makespan_s(),
            mean_e2e_s: Some(one.requests.iter().map(|r| r.e2e_s()).sum::<f64>() / n as f64),
            peak_kv_tokens: one.batches.iter().map(|b| b.kv_tokens).max().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Request;
    use crate::{Batch, BatchFeatures, Entry};

    struct Ms;
    impl CostModel for Ms {
        fn batch_time_s(&self, f: &BatchFeatures) -> f64 {
            0.001 * (1 + f.tokens) as f64
        }
    }

    /// Four requests of 2 prompt and 2 output tokens arriving at 0.
    fn four() -> Workload {
        let r = Request {
            input_tokens: 2,
            output_tokens: 2,
            arrival_s: 0.0,
        };
        Workload::new(vec![r; 4]).unwrap()
    }

    /// A schedule serving `ids` one after the other (prefill, decode each).
    fn serve(ids: &[u32]) -> Schedule {
        let mut b = Vec::new();
        for &i in ids {
            b.push(Batch::new(vec![Entry::process(i, 2)]));
            b.push(Batch::new(vec![Entry::process(i, 1)]));
        }
        Schedule::new(b)
    }

    fn replay_of(routing: &Routing, schedules: &[Schedule]) -> Result<ClusterReplay, ClusterError> {
        replay_cluster(&four(), &Limits::unlimited(), &Ms, routing, schedules)
    }

    #[test]
    fn each_replica_replays_its_requests_in_the_workloads_ids() {
        let routing = Routing::new(3, vec![1, 0, 1, 0]).unwrap();
        let r = replay_of(&routing, &[serve(&[3, 1]), serve(&[0, 2]), serve(&[])]).unwrap();
        assert!(r.replicas[2].is_none());
        let one = r.replicas[0].as_ref().unwrap();
        assert_eq!(
            one.requests.iter().map(|q| q.id).collect::<Vec<_>>(),
            [1, 3]
        );
        // Request 3 went first on replica 0: prefill 3 ms, decode 2 ms.
        assert!((r.merged.requests[3].completion_s - 0.005).abs() < 1e-12);
        assert!((r.merged.requests[1].completion_s - 0.010).abs() < 1e-12);
        assert_eq!(
            r.merged.requests.iter().map(|q| q.id).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(r.merged.batches.len(), 8);
        assert!(
            r.merged
                .batches
                .windows(2)
                .all(|b| b[0].end_s <= b[1].end_s)
        );
        assert_eq!(r.merged.tbt_gap_requests.len(), 4);
        let s = crate::Summary::of_cluster(&r, "round-robin");
        // Two replicas busy 10 ms each, the third idle: 3 x 10 - 20 ms idle.
        assert!((s.makespan_s - 0.010).abs() < 1e-12);
        assert!((s.idle_s - 0.010).abs() < 1e-12, "{}", s.idle_s);
        let load = s.cluster.unwrap();
        assert_eq!(load.per_replica[2].requests, 0);
        assert_eq!(load.per_replica[0].mean_e2e_s, Some(0.0075));
    }

    #[test]
    fn schedules_must_serve_exactly_their_routed_requests() {
        let routing = Routing::new(2, vec![1, 0, 1, 0]).unwrap();
        let e = replay_of(&routing, &[serve(&[3, 1, 0]), serve(&[2])]).unwrap_err();
        assert_eq!(
            e,
            ClusterError::NotRouted {
                replica: 0,
                batch: 4,
                request: 0,
                routed_to: Some(1)
            }
        );
        // A request left out is named by the workload's id, on its replica.
        let e = replay_of(&routing, &[serve(&[3, 1]), serve(&[2])]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("replica 1: request 0 never finishes"),
            "{e}"
        );
        let e = replay_of(&routing, &[serve(&[3, 1, 9]), serve(&[0, 2])]).unwrap_err();
        assert!(
            e.to_string().contains("request 9 is routed to no replica"),
            "{e}"
        );
        let e = replay_of(&routing, &[serve(&[3, 1])]).unwrap_err();
        assert_eq!(
            e,
            ClusterError::Schedules {
                schedules: 1,
                replicas: 2
            }
        );
        let short = Routing::new(2, vec![1, 0]).unwrap();
        assert!(matches!(
            replay_of(&short, &[serve(&[]), serve(&[])]),
            Err(ClusterError::RoutingLength { .. })
        ));
    }

    #[test]
    fn a_routing_names_existing_replicas() {
        assert_eq!(Routing::new(0, vec![]), Err(ClusterError::Replicas(0)));
        assert_eq!(
            Routing::new(2, vec![0, 2]),
            Err(ClusterError::UnknownReplica {
                request: 1,
                replica: 2,
                replicas: 2
            })
        );
        assert_eq!(
            Routing::new(2, vec![1, 0, 1]).unwrap().members(),
            [vec![1], vec![0, 2]]
        );
    }

    #[test]
    fn routing_files_name_the_line_that_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let read = |text: &str| {
            let p = dir.path().join("routing.csv");
            std::fs::write(&p, text).unwrap();
            Routing::read_csv(&p, 3, 2)
        };
        let ok = read("request,replica,routed_at_s\n2,1,0.5\n0,0,0\n1,1,0.2\n").unwrap();
        assert_eq!(ok.replica_of(), [0, 1, 1]);
        let cases = [
            ("req,rep\n", "line 1: expected the header"),
            (
                "request,replica\n0,0\n0,1\n1,0\n2,0\n",
                "line 3: request 0 is routed twice",
            ),
            (
                "request,replica\n0,0\n1,x\n2,0\n",
                "line 3: replica: expected a non-negative integer, got \"x\"",
            ),
            (
                "request,replica\n0,0\n1,0\n7,0\n",
                "line 4: request 7: the workload has 3 requests",
            ),
            ("request,replica\n0,0\n2,0\n", "request 1 is not routed"),
            (
                "request,replica\n0,0\n1,0\n2,5\n",
                "request 2 is routed to replica 5",
            ),
        ];
        for (text, want) in cases {
            let e = read(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
