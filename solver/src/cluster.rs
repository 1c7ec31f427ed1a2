//! The best schedule of a cluster of replicas, with a bound that holds whatever the
//! routing (milp.md, "The cluster bound and search").
//!
//! Schedules: every heuristic behind every router (each a cluster simulation, replayed),
//! the best kept; then each replica's requests under that routing solved on their own by
//! the single-replica solver, a replica's schedule replaced where its part improves; the
//! whole replayed again (`core::replay_cluster`). Bound: `bounds::cluster_lower_bound`.
//! No schedule is called optimal unless it meets the bound.

use crate::bounds::{BoundArgument, cluster_lower_bound};
use crate::report::certified_gap;
use crate::{Objective, SolveError, SolveOptions, SolveStatus, solve};
use infersched_core::{Limits, Request, Routing, Schedule, Summary, Workload, replay_cluster};
use infersched_cost_model::LinearCostModel;
use infersched_schedulers::{Knobs, Router, SCHEDULER_NAMES, SchedulerKind, simulate_cluster};
use serde::Serialize;
use std::time::Instant;

/// The routers every cluster search tries (the random ones with seed 0).
pub const SEARCHED_ROUTERS: [Router; 7] = [
    Router::RoundRobin,
    Router::LeastOutstanding,
    Router::LeastWaiting,
    Router::LeastKv,
    Router::VllmDp,
    Router::PowerOfTwo { seed: 0 },
    Router::Random { seed: 0 },
];

/// One heuristic behind one router, as the search measured it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterCandidate {
    /// The heuristic on every replica.
    pub scheduler: String,
    /// The router.
    pub router: String,
    /// Its replayed objective (s), or None where the heuristic cannot serve the workload.
    pub objective_s: Option<f64>,
}

/// How the best cluster schedule was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMethod {
    /// A heuristic behind a router, as simulated.
    Routed,
    /// That routing, with some replicas' parts re-solved by the single-replica solver.
    RoutedThenSolved,
    /// That routing with requests moved between replicas (and parts possibly re-solved).
    Searched,
}

impl ClusterMethod {
    /// Its name in files (`routed`, `routed-then-solved`, `searched`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Routed => "routed",
            Self::RoutedThenSolved => "routed-then-solved",
            Self::Searched => "searched",
        }
    }
}

/// The answer of [`solve_cluster`].
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSolveReport {
    /// `optimal` only where the schedule meets the bound; else `not-proven`.
    pub status: SolveStatus,
    /// How the schedule was found.
    pub method: ClusterMethod,
    /// The objective.
    pub objective: Objective,
    /// Replicas.
    pub replicas: u32,
    /// The heuristic and router whose routing the schedule keeps.
    pub scheduler: String,
    /// The router.
    pub router: String,
    /// The schedule's objective, from the cluster replay (s).
    pub replayed_objective: f64,
    /// The proven lower bound (s).
    pub best_bound: f64,
    /// The argument that gave it.
    pub bound_argument: BoundArgument,
    /// `(replayed - bound) / replayed`.
    pub certified_gap: f64,
    /// Requests the routing search moved to another replica.
    pub requests_moved: u32,
    /// Replicas whose part the single-replica solver improved.
    pub replicas_improved: u32,
    /// Every heuristic and router tried.
    pub candidates: Vec<ClusterCandidate>,
    /// Wall time (s).
    pub solve_s: f64,
    /// The routing.
    #[serde(skip)]
    pub routing: Routing,
    /// Each replica's schedule, in the workload's request ids.
    #[serde(skip)]
    pub schedules: Vec<Schedule>,
}

/// A cluster schedule and its objective.
struct Routed {
    scheduler: SchedulerKind,
    router: Router,
    routing: Routing,
    schedules: Vec<Schedule>,
    value: f64,
}

/// The cluster's objective of `schedules` under `routing`, from the replay.
fn replayed(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    routing: &Routing,
    schedules: &[Schedule],
) -> Result<f64, SolveError> {
    let r = replay_cluster(w, limits, cost, routing, schedules)
        .map_err(|e| SolveError::Internal(format!("the replay rejects a cluster schedule: {e}")))?;
    Ok(objective.of(&Summary::from_replay(&r.merged)))
}

/// Every heuristic behind every router; the best (None where none can serve).
fn best_routed(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    replicas: u32,
    candidates: &mut Vec<ClusterCandidate>,
) -> Result<Option<Routed>, SolveError> {
    let knobs = Knobs::matching(limits);
    let mut best: Option<Routed> = None;
    for name in SCHEDULER_NAMES {
        let kind: SchedulerKind = name.parse().expect("a scheduler name");
        for router in SEARCHED_ROUTERS {
            let mut policies: Vec<_> = (0..replicas).map(|_| kind.policy(&knobs, w)).collect();
            let value = match simulate_cluster(w, limits, &mut policies, cost, router) {
                Ok(sim) => {
                    let schedules: Vec<Schedule> =
                        sim.replicas.into_iter().map(|s| s.schedule).collect();
                    let v = replayed(w, limits, cost, objective, &sim.routing, &schedules)?;
                    if best.as_ref().is_none_or(|b| v < b.value) {
                        best = Some(Routed {
                            scheduler: kind,
                            router,
                            routing: sim.routing,
                            schedules,
                            value: v,
                        });
                    }
                    Some(v)
                }
                Err(_) => None,
            };
            candidates.push(ClusterCandidate {
                scheduler: kind.name().to_string(),
                router: router.name(),
                objective_s: value,
            });
        }
    }
    Ok(best)
}

/// The most single-replica simulations the routing search runs (two per move tried), so
/// results do not depend on the machine's speed (it also stops at half the time limit).
pub const ROUTING_SEARCH_SIMULATIONS: usize = 20_000;

/// One replica's part as the routing search sees it: its requests (increasing ids), the
/// heuristic's schedule of them (the workload's ids) and its contribution to the
/// objective (the sum of its requests' latencies or TTFTs; its makespan).
struct Part {
    ids: Vec<u32>,
    schedule: Schedule,
    value: f64,
}

/// `kind` on the requests `ids` alone (a replica's part), or None where it cannot serve
/// them.
fn simulate_part(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    kind: SchedulerKind,
    ids: Vec<u32>,
) -> Option<Part> {
    if ids.is_empty() {
        return Some(Part {
            ids,
            schedule: Schedule::new(Vec::new()),
            value: 0.0,
        });
    }
    let part = Workload::new(
        ids.iter()
            .map(|&g| w.requests()[g as usize])
            .collect::<Vec<Request>>(),
    )
    .expect("at least one request");
    let knobs = Knobs::matching(limits);
    let sim = kind.simulate(&part, &knobs, cost).ok()?;
    let r = infersched_core::replay(&part, limits, cost, &sim.schedule).ok()?;
    let v = objective.of(&Summary::from_replay(&r));
    let value = match objective {
        Objective::Makespan => v,
        _ => v * ids.len() as f64,
    };
    let mut schedule = sim.schedule;
    renumber(&mut schedule, |l| ids[l as usize]);
    Some(Part {
        ids,
        schedule,
        value,
    })
}

/// The cluster's objective from its parts' contributions.
fn combine(objective: Objective, parts: &[Part], n: usize) -> f64 {
    match objective {
        Objective::Makespan => parts.iter().map(|p| p.value).fold(0.0, f64::max),
        _ => parts.iter().map(|p| p.value).sum::<f64>() / n as f64,
    }
}

/// Moves requests between replicas while that improves the objective, each part
/// simulated by `best`'s heuristic on its own (the routing fixed, the replicas need no
/// router): first improvement, requests in id order, replicas in index order, until a
/// pass moves nothing, [`ROUTING_SEARCH_SIMULATIONS`] or `deadline`. Returns the requests
/// moved (`best` holds the result where any).
fn search_routing(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    deadline: Instant,
    best: &mut Routed,
) -> Result<u32, SolveError> {
    let n = w.len();
    let kind = best.scheduler;
    let Some(mut parts) = best
        .routing
        .members()
        .into_iter()
        .map(|ids| simulate_part(w, limits, cost, objective, kind, ids))
        .collect::<Option<Vec<Part>>>()
    else {
        return Ok(0);
    };
    let mut value = combine(objective, &parts, n);
    let (mut moved, mut simulations) = (0u32, 0usize);
    let mut improved = true;
    while improved && simulations < ROUTING_SEARCH_SIMULATIONS && Instant::now() < deadline {
        improved = false;
        for i in 0..n as u32 {
            let from = parts
                .iter()
                .position(|p| p.ids.binary_search(&i).is_ok())
                .expect("routed");
            for to in (0..parts.len()).filter(|&t| t != from) {
                if simulations >= ROUTING_SEARCH_SIMULATIONS || Instant::now() >= deadline {
                    break;
                }
                simulations += 2;
                let without: Vec<u32> = parts[from]
                    .ids
                    .iter()
                    .copied()
                    .filter(|&g| g != i)
                    .collect();
                let mut with = parts[to].ids.clone();
                with.insert(with.binary_search(&i).unwrap_err(), i);
                let (Some(a), Some(b)) = (
                    simulate_part(w, limits, cost, objective, kind, without),
                    simulate_part(w, limits, cost, objective, kind, with),
                ) else {
                    continue;
                };
                let (old_a, old_b) = (
                    std::mem::replace(&mut parts[from], a),
                    std::mem::replace(&mut parts[to], b),
                );
                let v = combine(objective, &parts, n);
                if v < value * (1.0 - 1e-12) {
                    value = v;
                    moved += 1;
                    improved = true;
                    break;
                }
                parts[from] = old_a;
                parts[to] = old_b;
            }
        }
    }
    if moved > 0 {
        let mut replica_of = vec![0u32; n];
        for (r, p) in parts.iter().enumerate() {
            for &g in &p.ids {
                replica_of[g as usize] = r as u32;
            }
        }
        let routing = Routing::new(parts.len() as u32, replica_of).expect("valid replicas");
        let schedules: Vec<Schedule> = parts.into_iter().map(|p| p.schedule).collect();
        let v = replayed(w, limits, cost, objective, &routing, &schedules)?;
        if v < best.value {
            (best.routing, best.schedules, best.value) = (routing, schedules, v);
        } else {
            moved = 0;
        }
    }
    Ok(moved)
}

/// Re-solves each replica's part of `best` with the single-replica solver in the time
/// left, keeping a replica's new schedule where its part's objective improves. Returns how
/// many replicas improved.
fn improve_replicas(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    options: &SolveOptions,
    deadline: Instant,
    best: &mut Routed,
) -> Result<u32, SolveError> {
    let members = best.routing.members();
    let busy: Vec<usize> = (0..members.len())
        .filter(|&r| !members[r].is_empty())
        .collect();
    let mut improved = 0;
    for (k, &r) in busy.iter().enumerate() {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        let share = left / (busy.len() - k) as f64;
        if share < 0.05 {
            break;
        }
        let ids = &members[r];
        let part = Workload::new(
            ids.iter()
                .map(|&g| w.requests()[g as usize])
                .collect::<Vec<Request>>(),
        )
        .expect("a replica with requests");
        let mut own = best.schedules[r].clone();
        renumber(&mut own, |g| {
            ids.binary_search(&g).expect("routed here") as u32
        });
        let before = infersched_core::replay(&part, limits, cost, &own)?;
        let one = SolveOptions {
            time_limit_s: share,
            observer: None,
            ..options.clone()
        };
        let report = solve(&part, limits, cost, objective, &one)?;
        if report.replayed_objective < objective.of(&Summary::from_replay(&before)) {
            let mut s = report.schedule;
            renumber(&mut s, |l| ids[l as usize]);
            best.schedules[r] = s;
            improved += 1;
        }
    }
    Ok(improved)
}

fn renumber(s: &mut Schedule, id: impl Fn(u32) -> u32) {
    for batch in &mut s.batches {
        for e in &mut batch.entries {
            e.request = id(e.request);
        }
    }
}

/// The best schedule found for a cluster of `replicas`, each under `limits` and `cost`,
/// and a bound valid for every routing. Policy classes are not searched (refused).
pub fn solve_cluster(
    w: &Workload,
    limits: &Limits,
    cost: &LinearCostModel,
    objective: Objective,
    replicas: u32,
    options: &SolveOptions,
) -> Result<ClusterSolveReport, SolveError> {
    let started = Instant::now();
    let deadline = started + std::time::Duration::from_secs_f64(options.time_limit_s.max(0.0));
    if options.constraints != crate::PolicyConstraints::default() {
        return Err(SolveError::Infeasible(
            "policy classes (--no-evict, --fcfs, ...) are not searched across replicas yet".into(),
        ));
    }
    limits.validate()?;
    limits
        .check_feasible(w)
        .map_err(|e| SolveError::Infeasible(e.to_string()))?;
    let bound = cluster_lower_bound(w, limits, cost, objective, replicas);
    let mut candidates = Vec::new();
    let Some(mut best) = best_routed(w, limits, cost, objective, replicas, &mut candidates)? else {
        return Err(SolveError::Infeasible(
            "no heuristic serves the workload on these replicas".into(),
        ));
    };
    let routed_value = best.value;
    let half = started + (deadline - started) / 2;
    let moved = search_routing(w, limits, cost, objective, half, &mut best)?;
    let improved = improve_replicas(w, limits, cost, objective, options, deadline, &mut best)?;
    let value = replayed(w, limits, cost, objective, &best.routing, &best.schedules)?;
    debug_assert!(value <= routed_value * (1.0 + 1e-9));
    if bound.value_s > value * (1.0 + 1e-9) {
        return Err(SolveError::Internal(format!(
            "the cluster bound {} s ({}) is above a replayed cluster schedule's {value} s",
            bound.value_s,
            bound.argument.name()
        )));
    }
    let proven = value <= bound.value_s * (1.0 + 1e-9);
    Ok(ClusterSolveReport {
        status: if proven {
            SolveStatus::Optimal
        } else {
            SolveStatus::NotProven
        },
        method: match (moved, improved) {
            (0, 0) => ClusterMethod::Routed,
            (0, _) => ClusterMethod::RoutedThenSolved,
            _ => ClusterMethod::Searched,
        },
        requests_moved: moved,
        objective,
        replicas,
        scheduler: best.scheduler.name().to_string(),
        router: best.router.name(),
        replayed_objective: value,
        best_bound: bound.value_s.min(value),
        bound_argument: bound.argument,
        certified_gap: certified_gap(value, bound.value_s.min(value)),
        replicas_improved: improved,
        candidates,
        solve_s: started.elapsed().as_secs_f64(),
        routing: best.routing,
        schedules: best.schedules,
    })
}
