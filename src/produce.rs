//! The one path from a scheduler to its numbers: run a heuristic or the solver, replay the
//! schedule independently, summarise. `simulate`, `solve`, `compare` and `sweep` all go
//! through [`produce`], so the same flags give the same schedule and the same metrics in
//! every command, and no producer's own numbers are trusted.

use crate::core::{
    ClusterError, ClusterReplay, Limits, Replay, ReplayError, Routing, Schedule, Summary, Workload,
};
use crate::cost_model::{LinearCostModel, TimeBreakdown};
use crate::schedulers::{Knobs, Router, SchedulerKind, SimError};
use crate::solver::{
    Objective, PolicyConstraints, SolveError, SolveOptions, SolveReport, SolveStatus,
};
use std::fmt;
use thiserror::Error;

/// What produces a schedule: a heuristic policy, or the solver searching a policy class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contender {
    /// The solver (`solve`), over the schedules of a policy class (the default: all).
    /// Its constraints add to [`SolveOptions::constraints`].
    Optimal(PolicyConstraints),
    /// A heuristic policy (`simulate`).
    Heuristic(SchedulerKind),
}

/// The name the solver's rows carry in tables, plots and files.
pub const OPTIMAL: &str = "optimal";

/// How a row's schedule came to be, as tables, reports and `results.csv` name it: a
/// heuristic's (`heuristic`), the solver's with its status (`optimal`, `time-limit`,
/// `no-solution`, `not-proven`), or a run that failed (`error`, sweeps only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// A heuristic policy's schedule.
    Heuristic,
    /// The solver's schedule, with how its solve ended.
    Solver(SolveStatus),
    /// The run failed (its row says why).
    Error,
}

impl RunStatus {
    /// The name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Heuristic => "heuristic",
            RunStatus::Solver(s) => s.name(),
            RunStatus::Error => "error",
        }
    }

    /// The status of a produced schedule: the solver's where it solved, else a heuristic's.
    pub fn of(outcome: &Outcome) -> Self {
        outcome
            .solver_status()
            .map_or(RunStatus::Heuristic, RunStatus::Solver)
    }

    /// Whether the schedule is proven optimal (the solver's, status `optimal`).
    pub fn proven_optimal(self) -> bool {
        self == RunStatus::Solver(SolveStatus::Optimal)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "heuristic" => Ok(RunStatus::Heuristic),
            "error" => Ok(RunStatus::Error),
            _ => s.parse::<SolveStatus>().map(RunStatus::Solver).map_err(|_| {
                format!(
                    "unknown status \"{}\": expected heuristic, error, optimal, time-limit, no-solution or not-proven",
                    s.chars().take(80).collect::<String>()
                )
            }),
        }
    }
}

impl serde::Serialize for RunStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for RunStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The policy constraints as spelled after `optimal+`, in this order.
const CONSTRAINT_NAMES: [&str; 5] = ["no-evict", "no-chunk", "no-mix", "fcfs", "reserve"];

fn constraint_flags(c: &PolicyConstraints) -> [bool; 5] {
    [c.no_evict, c.no_chunk, c.no_mix, c.fcfs, c.reserve]
}

impl Contender {
    /// The solver over all schedules.
    pub const OPTIMAL: Contender = Contender::Optimal(PolicyConstraints {
        no_evict: false,
        no_chunk: false,
        no_mix: false,
        fcfs: false,
        reserve: false,
    });

    /// The name in tables and plots: `optimal` for the solver whatever its class (its
    /// full spelling is [`Display`](fmt::Display)), the policy's name otherwise.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Optimal(_) => OPTIMAL,
            Contender::Heuristic(k) => k.name(),
        }
    }

    /// Whether this is the solver (of any policy class).
    pub fn is_solver(self) -> bool {
        matches!(self, Contender::Optimal(_))
    }

    /// Whether it reads the requests' true output lengths (the offline solver, MC-SF):
    /// its schedules are bounds on what an online scheduler can do, not ones it can run.
    pub fn clairvoyant(self) -> bool {
        match self {
            Contender::Optimal(_) => true,
            Contender::Heuristic(k) => k.clairvoyant(),
        }
    }

    /// Parses a comma-separated list, rejecting duplicates.
    pub fn parse_list(s: &str) -> Result<Vec<Contender>, String> {
        let mut out: Vec<Contender> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let c: Contender = part.parse()?;
            if out.contains(&c) {
                return Err(format!("{part} is listed twice"));
            }
            out.push(c);
        }
        if out.is_empty() {
            return Err("no scheduler given".into());
        }
        Ok(out)
    }
}

impl fmt::Display for Contender {
    /// `vllm`, `optimal`, `optimal+no-evict+fcfs`: what [`str::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contender::Heuristic(k) => f.write_str(k.name()),
            Contender::Optimal(c) => {
                f.write_str(OPTIMAL)?;
                for (name, on) in CONSTRAINT_NAMES.iter().zip(constraint_flags(c)) {
                    if on {
                        write!(f, "+{name}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Written as its [`Display`](fmt::Display) name (`vllm`, `optimal+no-evict`) in CSV and
/// JSON, and read back by parsing it.
impl serde::Serialize for Contender {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Contender {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Contender {
    type Err = String;
    /// A policy name, or `optimal` with `+constraint`s (`optimal+no-evict+no-mix`).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split('+');
        let head = parts.next().unwrap_or_default();
        if head != OPTIMAL {
            if s.contains('+') {
                return Err(format!(
                    "\"{s}\": policy constraints (+{}) apply to optimal only",
                    CONSTRAINT_NAMES.join(", +")
                ));
            }
            return s
                .parse::<SchedulerKind>()
                .map(Contender::Heuristic)
                .map_err(|e| {
                    format!("{e} (or optimal[+no-evict][+no-chunk][+no-mix][+fcfs][+reserve])")
                });
        }
        let mut c = PolicyConstraints::default();
        for p in parts {
            match p {
                "no-evict" => c.no_evict = true,
                "no-chunk" => c.no_chunk = true,
                "no-mix" => c.no_mix = true,
                "fcfs" => c.fcfs = true,
                "reserve" => c.reserve = true,
                _ => {
                    return Err(format!(
                        "\"{s}\": unknown constraint \"{p}\"; expected {}",
                        CONSTRAINT_NAMES.join(", ")
                    ));
                }
            }
        }
        Ok(Contender::Optimal(c))
    }
}

/// Everything a [`Contender`] needs besides the workload and the cost model.
#[derive(Debug, Clone, Copy)]
pub struct ProduceWith<'a> {
    /// The heuristics' knobs: each runs under [`SchedulerKind::limits`] of them.
    pub knobs: &'a Knobs,
    /// The limits the solver runs under (it has no policy defaults).
    pub limits: &'a Limits,
    /// What the solver minimizes.
    pub objective: Objective,
    /// The solver's options (its class is the union of these constraints and the
    /// contender's).
    pub solve: &'a SolveOptions,
}

/// One contender's schedule, its independent replay and what is computed from it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The schedule.
    pub schedule: Schedule,
    /// The independent replay of the schedule.
    pub replay: Replay,
    /// Metrics from the replay.
    pub summary: Summary,
    /// The limits it ran under (and was replayed against).
    pub limits: Limits,
    /// The solver's report (the solver only).
    pub solve: Option<SolveReport>,
    /// Where its makespan goes, term by term of the cost model (for a cluster, summed
    /// over the replicas: GPU-seconds).
    pub time_split: TimeBreakdown,
    /// A cluster's parts, where the contender ran on replicas (`compare --replicas`):
    /// `schedule` is then empty (each replica's is here) and `replay` is the cluster's
    /// merged replay.
    pub cluster: Option<ClusterParts>,
}

/// What a contender run on a cluster of replicas produced.
#[derive(Debug, Clone)]
pub struct ClusterParts {
    /// The replica of each request.
    pub routing: Routing,
    /// Each replica's schedule (the workload's request ids).
    pub schedules: Vec<Schedule>,
    /// The replays of every replica and of the cluster.
    pub replay: ClusterReplay,
    /// The cluster search's report (the solver only).
    pub search: Option<crate::solver::cluster::ClusterSolveReport>,
}

impl Outcome {
    /// The solver's status, where a solver produced it (on one replica or a cluster).
    pub fn solver_status(&self) -> Option<SolveStatus> {
        let search = self.cluster.as_ref().and_then(|c| c.search.as_ref());
        self.solve
            .as_ref()
            .map(|r| r.status)
            .or(search.map(|r| r.status))
    }

    /// The solver's method, its proven lower bound (s) and certified gap.
    pub fn solver_result(&self) -> Option<(String, f64, f64)> {
        if let Some(r) = &self.solve {
            return Some((r.method.name().to_string(), r.best_bound, r.certified_gap));
        }
        let r = self.cluster.as_ref()?.search.as_ref()?;
        Some((
            format!("cluster-{}", r.method.name()),
            r.best_bound,
            r.certified_gap,
        ))
    }

    /// A cluster outcome of `producer` from each replica's schedule: replayed, summarized
    /// (by the cluster replay) and split into the cost model's terms per replica, summed.
    fn of_cluster(
        w: &Workload,
        cost: &LinearCostModel,
        producer: &str,
        parts: (Routing, Vec<Schedule>, Limits, &str),
        search: Option<crate::solver::cluster::ClusterSolveReport>,
    ) -> Result<Self, ProduceError> {
        let none = crate::core::Pipeline::none();
        Self::of_cluster_on(w, (cost, &none), producer, parts, search)
    }

    /// [`Self::of_cluster`] with every replica a pipeline of `pipeline.stages` stages (the
    /// split then in GPU-seconds of every stage GPU).
    fn of_cluster_on(
        w: &Workload,
        (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
        producer: &str,
        parts: (Routing, Vec<Schedule>, Limits, &str),
        search: Option<crate::solver::cluster::ClusterSolveReport>,
    ) -> Result<Self, ProduceError> {
        let (routing, schedules, limits, router) = parts;
        let replay = crate::core::cluster::replay_cluster_on(
            w,
            &limits,
            (cost, pipeline),
            &routing,
            &schedules,
        )
        .map_err(|e| ProduceError::ClusterRejected {
            producer: producer.to_string(),
            source: e,
        })?;
        let summary = Summary::of_cluster_on(&replay, router, pipeline);
        let parts = (routing, schedules, limits);
        Ok(Self::of_replayed_cluster(
            w,
            (cost, pipeline),
            parts,
            (replay, summary),
            search,
        ))
    }

    /// A cluster outcome from each replica's schedule, its replay and the summary of it:
    /// the time split per replica, summed (in GPU-seconds of every stage GPU).
    fn of_replayed_cluster(
        w: &Workload,
        (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
        (routing, schedules, limits): (Routing, Vec<Schedule>, Limits),
        (replay, summary): (ClusterReplay, Summary),
        search: Option<crate::solver::cluster::ClusterSolveReport>,
    ) -> Self {
        let mut time_split = TimeBreakdown::default();
        for (s, r) in schedules.iter().zip(&replay.replicas) {
            if let Some(r) = r {
                time_split = time_split.plus(&TimeBreakdown::of(cost, w, s, r));
            }
        }
        if pipeline.is_pipelined() {
            let work = time_split.total_s() - time_split.idle_s;
            let gpus = f64::from(pipeline.stages) * f64::from(routing.replicas());
            time_split.idle_s = (gpus * summary.makespan_s - work).max(0.0);
        }
        Outcome {
            schedule: Schedule::new(Vec::new()),
            replay: replay.merged.clone(),
            summary,
            limits,
            solve: None,
            time_split,
            cluster: Some(ClusterParts {
                routing,
                schedules,
                replay,
                search,
            }),
        }
    }
}

/// Why a contender produced no outcome.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProduceError {
    /// The heuristic could not serve the workload.
    #[error(transparent)]
    Simulate(#[from] SimError),
    /// The solver failed.
    #[error(transparent)]
    Solve(#[from] SolveError),
    /// Its schedules would not fit in the memory available (estimated before anything
    /// runs); the message says how much each needs.
    #[error("too large: {0}")]
    TooLarge(String),
    /// The cluster replay rejected a simulated cluster: a bug in the simulation.
    #[error("internal error: the replay rejects {producer}'s cluster: {source}")]
    ClusterRejected {
        /// Who produced it.
        producer: String,
        /// The rule it breaks.
        source: ClusterError,
    },
    /// The replay rejected the producer's schedule: a bug in the producer.
    #[error("internal error: the replay rejects {producer}'s schedule: {source}")]
    Rejected {
        /// Who produced it.
        producer: String,
        /// The rule it breaks.
        source: ReplayError,
    },
}

/// Refuses, before anything is simulated, a producer whose `held` schedules of `w` (an
/// entry per output token and prompt chunk, with their replay) would not fit in the memory
/// this process has: hostile output lengths or millions of requests get an error with the
/// numbers instead of exhausting memory.
fn check_schedule_memory(
    w: &Workload,
    limits: &Limits,
    held: u64,
    producer: &str,
) -> Result<(), ProduceError> {
    let one = crate::schedulers::estimated_peak_bytes(w, limits);
    let need = one.saturating_mul(held);
    match crate::resources::available_memory_bytes() {
        Some(available) if need > available => {
            let gib = crate::resources::gib;
            Err(ProduceError::TooLarge(format!(
                "{producer} on {} requests needs about {:.3} GiB ({held} schedule(s) of about \
                 {:.3} GiB each with the replay: an entry per output token and prompt chunk) \
                 and {:.3} GiB is available; use a sample of the workload (workload sample)",
                w.len(),
                gib(need),
                gib(one),
                gib(available)
            )))
        }
        _ => Ok(()),
    }
}

/// How many simulated schedules' worth of memory (`estimated_peak_bytes` each) the solver
/// holds at its peak for `objective`, measured with `/usr/bin/time` on 20,000 and 50,000
/// requests (I uniform 16-1,024, O uniform 16-256, Poisson arrivals; `solve --time-limit
/// 10`, with and without C = 256): makespan and mean latency peak at 7.0-8.3 estimates,
/// mean TTFT at 10.9-12.1 (9.4 at 200,000 requests, 12.8 GB). The priority-list search's candidates (one request at
/// a time: a batch, and its replay record, per entry) and, for TTFT, the first-token
/// problem's schedules and their finished copies are larger per entry than the
/// heuristics' schedules the estimate is measured on. The factors leave a margin
/// (a sixth to a fifth).
fn solver_schedules_held(objective: Objective) -> u64 {
    match objective {
        Objective::Makespan | Objective::MeanLatency => 10,
        Objective::MeanTtft => 14,
    }
}

/// Both sets of constraints at once.
fn union(a: PolicyConstraints, b: PolicyConstraints) -> PolicyConstraints {
    PolicyConstraints {
        no_evict: a.no_evict || b.no_evict,
        no_chunk: a.no_chunk || b.no_chunk,
        no_mix: a.no_mix || b.no_mix,
        fcfs: a.fcfs || b.fcfs,
        reserve: a.reserve || b.reserve,
    }
}

/// Runs `contender` on `w` with batch times from `cost`, replays its schedule under the
/// limits it ran under and summarises the replay.
pub fn produce(
    w: &Workload,
    cost: &LinearCostModel,
    contender: Contender,
    with: &ProduceWith<'_>,
) -> Result<Outcome, ProduceError> {
    match contender {
        Contender::Optimal(class) => {
            let options = SolveOptions {
                constraints: union(with.solve.constraints, class),
                ..with.solve.clone()
            };
            produce_optimal(w, cost, with.limits, with.objective, &options)
        }
        Contender::Heuristic(kind) => produce_heuristic(w, cost, kind, with.knobs),
    }
}

/// Simulates heuristic `kind` with `knobs` (see [`SchedulerKind::limits`]) and replays its
/// schedule.
pub fn produce_heuristic(
    w: &Workload,
    cost: &LinearCostModel,
    kind: SchedulerKind,
    knobs: &Knobs,
) -> Result<Outcome, ProduceError> {
    check_schedule_memory(w, &kind.limits(knobs, w), 1, kind.name())?;
    let sim = kind.simulate(w, knobs, cost)?;
    outcome(w, cost, kind.name(), sim.schedule, sim.limits, None)
}

/// Simulates heuristic `kind` with `knobs` on a replica of `pipeline.stages` pipeline
/// stages (`simulate --pp`) and replays its schedule on that pipeline; one stage is
/// [`produce_heuristic`]. The summary names the pipeline.
pub fn produce_heuristic_pipelined(
    w: &Workload,
    cost: &LinearCostModel,
    kind: SchedulerKind,
    knobs: &Knobs,
    pipeline: &crate::core::Pipeline,
) -> Result<Outcome, ProduceError> {
    if !pipeline.is_pipelined() {
        return produce_heuristic(w, cost, kind, knobs);
    }
    check_schedule_memory(w, &kind.limits(knobs, w), 1, kind.name())?;
    let sim = kind.simulate_on(w, knobs, cost, pipeline)?;
    let parts = (sim.schedule, sim.limits);
    outcome_on(w, cost, kind.name(), parts, pipeline)
}

/// A heuristic run on every replica of a cluster: where each request went, each
/// replica's schedule (in the workload's request ids), and the replays.
#[derive(Debug, Clone)]
pub struct ClusterOutcome {
    /// The replica of each request.
    pub routing: Routing,
    /// Each replica's schedule.
    pub schedules: Vec<Schedule>,
    /// The independent replay of every replica's schedule, and of the cluster.
    pub replay: ClusterReplay,
    /// The cluster's metrics (with the load on each replica).
    pub summary: Summary,
    /// The limits every replica ran under.
    pub limits: Limits,
}

/// Simulates heuristic `kind` with `knobs` on each of `replicas` replicas, requests routed
/// by `router`, and replays every replica's schedule (`core::replay_cluster`).
pub fn produce_cluster(
    w: &Workload,
    cost: &LinearCostModel,
    kind: SchedulerKind,
    knobs: &Knobs,
    replicas: u32,
    router: Router,
) -> Result<ClusterOutcome, ProduceError> {
    let none = crate::core::Pipeline::none();
    produce_cluster_on(w, (cost, &none), kind, knobs, (replicas, router))
}

/// [`produce_cluster`] with every replica a pipeline of `pipeline.stages` stages
/// (`simulate --replicas N --pp P`); the summary's busy time is each replica's time with
/// a batch in flight, summed, and names the pipeline.
pub fn produce_cluster_on(
    w: &Workload,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    kind: SchedulerKind,
    knobs: &Knobs,
    (replicas, router): (u32, Router),
) -> Result<ClusterOutcome, ProduceError> {
    let limits = kind.limits(knobs, w);
    check_schedule_memory(w, &limits, 1, kind.name())?;
    let mut policies = kind.cluster_policies(knobs, w, replicas, pipeline);
    let sim = crate::schedulers::simulate_cluster_on(
        w,
        &limits,
        &mut policies,
        (cost, pipeline),
        router,
    )?;
    let schedules: Vec<Schedule> = sim.replicas.into_iter().map(|s| s.schedule).collect();
    let replay = crate::core::cluster::replay_cluster_on(
        w,
        &limits,
        (cost, pipeline),
        &sim.routing,
        &schedules,
    )
    .map_err(|e| ProduceError::ClusterRejected {
        producer: format!("{} behind {router}", kind.name()),
        source: e,
    })?;
    let summary = Summary::of_cluster_on(&replay, &router.name(), pipeline);
    Ok(ClusterOutcome {
        routing: sim.routing,
        schedules,
        replay,
        summary,
        limits,
    })
}

/// A heuristic on a disaggregated cluster (`--disaggregate P:D`): each side's routing and
/// schedules, and the replay of both.
#[derive(Debug, Clone)]
pub struct DisaggregatedOutcome {
    /// The prefill side's replica of each request.
    pub prefill_routing: Routing,
    /// Each prefill replica's schedule.
    pub prefill_schedules: Vec<Schedule>,
    /// The decode side's replica of each request.
    pub decode_routing: Routing,
    /// Each decode replica's schedule.
    pub decode_schedules: Vec<Schedule>,
    /// The independent replay of both sides.
    pub replay: crate::core::disaggregated::DisaggregatedReplay,
    /// The whole cluster's metrics (prefill replicas first, then decode replicas).
    pub summary: Summary,
    /// The limits every replica ran under.
    pub limits: Limits,
}

/// Simulates heuristic `kind` with `knobs` on `split.prefill` prefill replicas and
/// `split.decode` decode replicas (both behind `router`, KV moved over `link`), and
/// replays both sides (`core::disaggregated::replay_disaggregated`).
pub fn produce_disaggregated(
    w: &Workload,
    cost: &LinearCostModel,
    kind: SchedulerKind,
    knobs: &Knobs,
    split: crate::core::disaggregated::Disaggregation,
    router: Router,
    link: &crate::core::disaggregated::KvLink,
) -> Result<DisaggregatedOutcome, ProduceError> {
    let none = crate::core::Pipeline::none();
    produce_disaggregated_on(w, (cost, &none), kind, knobs, (split, router), link)
}

/// [`produce_disaggregated`] with every replica of both sides a pipeline of
/// `pipeline.stages` stages (`simulate --disaggregate P:D --pp N`).
pub fn produce_disaggregated_on(
    w: &Workload,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    kind: SchedulerKind,
    knobs: &Knobs,
    (split, router): (crate::core::disaggregated::Disaggregation, Router),
    link: &crate::core::disaggregated::KvLink,
) -> Result<DisaggregatedOutcome, ProduceError> {
    let limits = kind.limits(knobs, w);
    check_schedule_memory(w, &limits, 1, kind.name())?;
    let side = |n: u32| -> Vec<_> { (0..n).map(|_| kind.policy(knobs, w)).collect() };
    let (mut prefill, mut decode) = (side(split.prefill), side(split.decode));
    let sim = crate::schedulers::disaggregated::simulate_disaggregated_on(
        w,
        &limits,
        (&mut prefill, &mut decode),
        (cost, pipeline),
        router,
        link,
    )?;
    let schedules = |c: crate::schedulers::ClusterSimulation| -> (Routing, Vec<Schedule>) {
        (
            c.routing,
            c.replicas.into_iter().map(|s| s.schedule).collect(),
        )
    };
    let (prefill_routing, prefill_schedules) = schedules(sim.prefill);
    let (decode_routing, decode_schedules) = schedules(sim.decode);
    let sides = (
        (prefill_routing, prefill_schedules),
        (decode_routing, decode_schedules),
    );
    let on = (cost, pipeline, link);
    DisaggregatedOutcome::replayed_on(w, on, limits, &router.name(), sides).map_err(|e| {
        ProduceError::ClusterRejected {
            producer: format!("{} disaggregated behind {router}", kind.name()),
            source: e,
        }
    })
}

/// Each side's replica of every request and each replica's schedule.
pub type Sides = ((Routing, Vec<Schedule>), (Routing, Vec<Schedule>));

impl DisaggregatedOutcome {
    /// Both sides' schedules (`sides`: prefill, then decode) replayed under `limits` with
    /// KV over `link` (`core::disaggregated::replay_disaggregated`) and the cluster
    /// summarized (`router` names the rule in the summary).
    pub fn replayed(
        w: &Workload,
        cost: &LinearCostModel,
        limits: Limits,
        link: &crate::core::disaggregated::KvLink,
        router: &str,
        sides: Sides,
    ) -> Result<Self, ClusterError> {
        let none = crate::core::Pipeline::none();
        Self::replayed_on(w, (cost, &none, link), limits, router, sides)
    }

    /// [`Self::replayed`] with every replica of both sides a pipeline of
    /// `pipeline.stages` stages.
    pub fn replayed_on(
        w: &Workload,
        (cost, pipeline, link): (
            &LinearCostModel,
            &crate::core::Pipeline,
            &crate::core::disaggregated::KvLink,
        ),
        limits: Limits,
        router: &str,
        sides: Sides,
    ) -> Result<Self, ClusterError> {
        let ((prefill_routing, prefill_schedules), (decode_routing, decode_schedules)) = sides;
        let replay = crate::core::disaggregated::replay_disaggregated_on(
            w,
            &limits,
            (cost, pipeline, link),
            (&prefill_routing, &prefill_schedules),
            (&decode_routing, &decode_schedules),
        )?;
        let summary = Summary::of_disaggregated_on(&replay, router, link, pipeline);
        Ok(Self {
            prefill_routing,
            prefill_schedules,
            decode_routing,
            decode_schedules,
            replay,
            summary,
            limits,
        })
    }
}

/// Heuristic `kind` on `replicas` replicas behind `router`, as an [`Outcome`] (the merged
/// replay, the cluster's summary, each replica's part in [`Outcome::cluster`]).
pub fn produce_heuristic_on_cluster(
    w: &Workload,
    cost: &LinearCostModel,
    kind: SchedulerKind,
    knobs: &Knobs,
    cluster: (u32, Router),
) -> Result<Outcome, ProduceError> {
    let none = crate::core::Pipeline::none();
    produce_heuristic_on_pipelined_cluster(w, (cost, &none), kind, knobs, cluster)
}

/// [`produce_heuristic_on_cluster`] with every replica a pipeline of `pipeline.stages`
/// stages (the Python package's `simulate(replicas=, pp=)`).
pub fn produce_heuristic_on_pipelined_cluster(
    w: &Workload,
    (cost, pipeline): (&LinearCostModel, &crate::core::Pipeline),
    kind: SchedulerKind,
    knobs: &Knobs,
    cluster: (u32, Router),
) -> Result<Outcome, ProduceError> {
    // The cluster's replay and summary once, as `produce_cluster_on` made them.
    let o = produce_cluster_on(w, (cost, pipeline), kind, knobs, cluster)?;
    Ok(Outcome::of_replayed_cluster(
        w,
        (cost, pipeline),
        (o.routing, o.schedules, o.limits),
        (o.replay, o.summary),
        None,
    ))
}

/// `contender` on `replicas` replicas behind `router` (`compare --replicas`): a heuristic
/// on every replica, or the cluster search (`solve --replicas`) for the solver, whose
/// class must be the unconstrained one. Every replica's schedule is replayed.
pub fn produce_on_cluster(
    w: &Workload,
    cost: &LinearCostModel,
    contender: Contender,
    with: &ProduceWith<'_>,
    cluster: (u32, Router),
) -> Result<Outcome, ProduceError> {
    let (replicas, router) = cluster;
    match contender {
        Contender::Heuristic(kind) => {
            produce_heuristic_on_cluster(w, cost, kind, with.knobs, (replicas, router))
        }
        Contender::Optimal(class) => {
            let options = SolveOptions {
                constraints: union(with.solve.constraints, class),
                ..with.solve.clone()
            };
            check_schedule_memory(
                w,
                with.limits,
                solver_schedules_held(with.objective),
                "the solver",
            )?;
            let report = crate::solver::cluster::solve_cluster(
                w,
                with.limits,
                cost,
                with.objective,
                replicas,
                &options,
            )?;
            let (routing, schedules) = (report.routing.clone(), report.schedules.clone());
            let router = report.router.clone();
            let producer = contender.to_string();
            Outcome::of_cluster(
                w,
                cost,
                &producer,
                (routing, schedules, *with.limits, &router),
                Some(report),
            )
        }
    }
}

/// Solves for `objective` under `limits` with `options` and replays the solver's schedule.
pub fn produce_optimal(
    w: &Workload,
    cost: &LinearCostModel,
    limits: &Limits,
    objective: Objective,
    options: &SolveOptions,
) -> Result<Outcome, ProduceError> {
    check_schedule_memory(w, limits, solver_schedules_held(objective), "the solver")?;
    let report = crate::solver::solve(w, limits, cost, objective, options)?;
    let producer = Contender::Optimal(options.constraints).to_string();
    outcome(
        w,
        cost,
        &producer,
        report.schedule.clone(),
        *limits,
        Some(report),
    )
}

/// The independent replay of `schedule` and what is computed from it.
/// The summary and time split of `schedule`'s replay `r` on `pipeline`. With several
/// stages the summary names the pipeline and the split is in GPU-seconds of the stage
/// GPUs, as a cluster's is of its replicas: each batch's time spread over the stages,
/// sends and bubbles idle.
pub fn summarize_on(
    w: &Workload,
    cost: &LinearCostModel,
    schedule: &Schedule,
    r: &Replay,
    pipeline: &crate::core::Pipeline,
) -> (Summary, TimeBreakdown) {
    let summary = Summary::from_replay(r).on_pipeline(pipeline, &r.batches);
    let mut split = TimeBreakdown::of(cost, w, schedule, r);
    if pipeline.is_pipelined() {
        let work = split.total_s() - split.idle_s;
        let gpus = f64::from(pipeline.stages);
        split.idle_s = (gpus * summary.makespan_s - work).max(0.0);
    }
    (summary, split)
}

/// A pipelined schedule's outcome: replayed on `pipeline` (`replay_pipelined`), its
/// summary naming the pipeline.
pub fn outcome_on(
    w: &Workload,
    cost: &LinearCostModel,
    producer: &str,
    (schedule, limits): (Schedule, Limits),
    pipeline: &crate::core::Pipeline,
) -> Result<Outcome, ProduceError> {
    let r =
        crate::core::replay_pipelined(w, &limits, cost, pipeline, &schedule).map_err(|source| {
            ProduceError::Rejected {
                producer: producer.to_string(),
                source,
            }
        })?;
    let (summary, time_split) = summarize_on(w, cost, &schedule, &r, pipeline);
    Ok(Outcome {
        schedule,
        replay: r,
        summary,
        limits,
        solve: None,
        time_split,
        cluster: None,
    })
}

fn outcome(
    w: &Workload,
    cost: &LinearCostModel,
    producer: &str,
    schedule: Schedule,
    limits: Limits,
    solve: Option<SolveReport>,
) -> Result<Outcome, ProduceError> {
    let none = crate::core::Pipeline::none();
    let mut o = outcome_on(w, cost, producer, (schedule, limits), &none)?;
    o.solve = solve;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Request;

    #[test]
    fn run_statuses_round_trip_through_their_names_and_refuse_others() {
        let all = [
            RunStatus::Heuristic,
            RunStatus::Error,
            RunStatus::Solver(SolveStatus::Optimal),
            RunStatus::Solver(SolveStatus::TimeLimit),
            RunStatus::Solver(SolveStatus::NoSolution),
            RunStatus::Solver(SolveStatus::NotProven),
        ];
        for s in all {
            assert_eq!(s.name().parse::<RunStatus>(), Ok(s));
            assert_eq!(s.to_string(), s.name());
            assert_eq!(
                s.proven_optimal(),
                s == RunStatus::Solver(SolveStatus::Optimal)
            );
        }
        assert_eq!(RunStatus::Solver(SolveStatus::Optimal).name(), "optimal");
        let e = "optimum".parse::<RunStatus>().unwrap_err();
        assert!(e.contains("unknown status \"optimum\""), "{e}");
    }

    #[test]
    fn contender_names_round_trip_through_display_and_parse() {
        for s in [
            "vllm",
            "sarathi",
            "optimal",
            "optimal+no-evict",
            "optimal+no-chunk+no-mix+fcfs+reserve",
        ] {
            let c: Contender = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
        }
        assert_eq!("optimal".parse::<Contender>(), Ok(Contender::OPTIMAL));
        assert!("vllm+no-evict".parse::<Contender>().is_err());
        assert!(
            "optimal+fast"
                .parse::<Contender>()
                .unwrap_err()
                .contains("unknown constraint \"fast\"")
        );
        assert!(Contender::parse_list("vllm, vllm").is_err());
    }

    #[test]
    fn heuristic_and_solver_outcomes_are_replayed_under_their_limits() {
        let w = Workload::new(vec![
            Request {
                input_tokens: 6,
                output_tokens: 3,
                arrival_s: 0.0,
            };
            3
        ])
        .unwrap();
        let cost = crate::cost_model::preset("llama2-7b-a100").unwrap();
        let limits = Limits {
            kv_capacity: Some(16),
            ..Limits::unlimited()
        };
        let knobs = Knobs::matching(&limits);
        let options = SolveOptions::default();
        let with = ProduceWith {
            knobs: &knobs,
            limits: &limits,
            objective: Objective::Makespan,
            solve: &options,
        };
        let vllm = produce(&w, &cost, Contender::Heuristic(SchedulerKind::Vllm), &with).unwrap();
        assert!(vllm.solve.is_none());
        assert_eq!(vllm.summary.batches, vllm.schedule.batches.len());
        let opt = produce(&w, &cost, Contender::OPTIMAL, &with).unwrap();
        let report = opt.solve.as_ref().unwrap();
        // The outcome's numbers are the replay's, and the optimum is no worse.
        assert!((report.replayed_objective - opt.summary.makespan_s).abs() < 1e-12);
        assert!(opt.summary.makespan_s <= vllm.summary.makespan_s + 1e-12);
        // The contender's class adds to the options': no eviction anywhere.
        let no_evict = produce(&w, &cost, "optimal+no-evict".parse().unwrap(), &with).unwrap();
        assert_eq!(no_evict.summary.evictions, 0);
        assert_eq!(
            no_evict.solve.unwrap().constraints,
            PolicyConstraints {
                no_evict: true,
                ..PolicyConstraints::default()
            }
        );
    }

    #[test]
    fn the_solver_takes_a_better_seed_in_its_class_and_names_it() {
        use crate::schedulers::SchedulerKind;
        // A long request, then a short one arriving while it runs: static batching makes
        // the short one wait for the long one; vLLM admits it at once.
        let req = |input_tokens, output_tokens, arrival_s| Request {
            input_tokens,
            output_tokens,
            arrival_s,
        };
        let w = Workload::new(vec![req(64, 40, 0.0), req(8, 2, 0.01)]).unwrap();
        let cost = crate::cost_model::preset("llama2-7b-a100").unwrap();
        let limits = Limits {
            kv_capacity: Some(512),
            ..Limits::unlimited()
        };
        let knobs = Knobs::default();
        let run = |k: SchedulerKind| produce_heuristic(&w, &cost, k, &knobs).unwrap();
        let (vllm, stat) = (run(SchedulerKind::Vllm), run(SchedulerKind::Static));
        let value = |o: &Outcome| Objective::MeanLatency.of(&o.summary);
        assert!(value(&vllm) < value(&stat), "the setting's premise");
        // The solver's own portfolio is static alone, with no search after it and no time
        // for anything else.
        let options = SolveOptions {
            time_limit_s: 1e-3,
            list_search_evaluations: 0,
            warm_start_from: vec![SchedulerKind::Static],
            seeds: vec![
                ("vllm (its own schedule)".to_string(), vllm.schedule.clone()),
                (
                    "static (its own schedule)".to_string(),
                    stat.schedule.clone(),
                ),
            ],
            ..SolveOptions::default()
        };
        let o = produce_optimal(&w, &cost, &limits, Objective::MeanLatency, &options).unwrap();
        let report = o.solve.as_ref().unwrap();
        let entries = |s: &Schedule| {
            s.batches
                .iter()
                .map(|b| b.entries.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(entries(&o.schedule), entries(&vllm.schedule));
        assert_eq!(
            report.warm_start.as_ref().unwrap().heuristic,
            "vllm (its own schedule)"
        );
        assert!((report.replayed_objective - value(&vllm)).abs() < 1e-12);
        assert!(report.best_bound <= report.replayed_objective);
        // Without the seeds the same solve answers with static's schedule.
        let alone = SolveOptions {
            seeds: Vec::new(),
            ..options.clone()
        };
        let o = produce_optimal(&w, &cost, &limits, Objective::MeanLatency, &alone).unwrap();
        assert_eq!(entries(&o.schedule), entries(&stat.schedule));
        // (A seed outside the class is refused by the store: `store` tests.)
    }
}
