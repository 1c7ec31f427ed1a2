//! Shared vocabulary of infersched: the one execution model of `semantics.md`.
//!
//! * [`Request`] and [`Workload`]: what arrives (prompt tokens `I`, output tokens `O`,
//!   arrival time `T`).
//! * [`Limits`]: the per-batch constraints C, P, M (with block size), R_max.
//! * [`Instance`]: a workload, its limits and a cost model, validated once and shared by
//!   replay, simulation and the solver.
//! * [`Schedule`]: an ordered list of batches of [`Entry`]s, the data every producer
//!   (heuristic or MILP) emits, with a stable JSON file format.
//! * [`BatchFeatures`] and [`CostModel`]: batch time as a function of batch features.
//! * [`replay()`]: the independent validator. From (workload, limits, cost model,
//!   schedule) alone it recomputes every state and time, or rejects the schedule naming
//!   the batch, the request and the rule broken. All metrics ([`Summary`]) come from it.

pub mod cluster;
pub mod cost;
pub mod disaggregated;
pub mod disaggregation;
pub mod instance;
pub mod io;
pub mod kv_cache;
pub mod limits;
pub mod metrics;
pub mod names;
pub mod pipeline;
pub mod prefix;
pub mod quantile;
pub mod replay;
pub mod request;
pub mod request_state;
pub mod schedule;
pub mod slo;

pub use cluster::{ClusterError, ClusterReplay, Routing, replay_cluster};
pub use cost::{BatchFeatures, CostModel, FEATURE_NAMES, Feature};
pub use instance::{Instance, InstanceError};
pub use kv_cache::{
    BlockKey, BlockKeys, BlockPool, CacheRule, KvCache, PrefixCache, V0Cache, most_shared_tokens,
    without_shared_prompts,
};
pub use limits::{Infeasibility, Limits, LimitsError};
pub use metrics::{Distribution, Objectives, Summary};
pub use pipeline::{Pipeline, PipelineClock, PipelineError};
pub use prefix::{PerfectCache, PrefixIds};
pub use replay::{
    BatchRecord, ClassifiedEntry, EntryKind, Replay, ReplayError, RequestRecord, classify_entries,
    replay, replay_measured, replay_pipelined,
};
pub use request::{Request, Workload, WorkloadError};
pub use request_state::{RequestState, Step};
pub use schedule::{Action, Batch, Entry, SCHEDULE_FORMAT, Schedule, ScheduleError};
pub use slo::{Slo, SloMetric, SloParseError, SloReport, SloResult, SloStatistic, meets_every};
