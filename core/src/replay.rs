//! The independent replay: the executable definition of `semantics.md`.
//!
//! From (workload, limits, cost model, schedule) alone it recomputes every request's
//! state (`m` KV tokens held, `G` tokens generated), every batch's features, start and
//! end time, and every token's emission time, or rejects the schedule with an error that
//! names the batch, the request and the rule broken. Batch indices and request ids in
//! errors are 0-based, as in the schedule file.

use crate::cost::{BatchFeatures, CostModel};
use crate::kv_cache::{BlockKeys, CacheRule, KvCache};
use crate::limits::{Infeasibility, Limits, LimitsError};
use crate::pipeline::{Pipeline, PipelineClock, PipelineError};
use crate::request::Workload;
use crate::request_state::RequestState;
use crate::schedule::{Action, Schedule};
use thiserror::Error;

/// Relative tolerance when comparing a producer's claimed batch times to the replay's.
pub const CLAIMED_TIME_TOLERANCE: f64 = 1e-9;

/// Why a schedule is not valid for a workload under limits (one rule of `semantics.md`).
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ReplayError {
    /// The limits themselves are invalid.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// The pipeline is invalid.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// No schedule at all can serve the workload under these limits.
    #[error("infeasible: {0}")]
    Infeasible(#[from] Infeasibility),
    /// An entry names a request id outside the workload.
    #[error(
        "batch {batch}, entry {entry}: unknown request id {request} (the workload has {requests} requests, ids 0..{requests})"
    )]
    UnknownRequest {
        /// Batch index.
        batch: usize,
        /// Entry index within the batch.
        entry: usize,
        /// The id given.
        request: u32,
        /// Number of requests in the workload.
        requests: usize,
    },
    /// A request appears twice in one batch.
    #[error(
        "batch {batch}: request {request} appears more than once (at most one entry per request per batch)"
    )]
    DuplicateEntry {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
    },
    /// A request is both evicted and processed in one batch.
    #[error(
        "batch {batch}: request {request} is evicted and processes tokens in the same batch (an evicted request processes nothing in that batch)"
    )]
    EvictAndProcess {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
    },
    /// A processing entry with zero tokens.
    #[error(
        "batch {batch}: request {request} processes 0 tokens (a processing entry needs c >= 1)"
    )]
    ZeroTokens {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
    },
    /// A finished request appears again.
    #[error(
        "batch {batch}: request {request} already generated all its {output} tokens and cannot appear again"
    )]
    FinishedRequestScheduled {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
        /// O of the request.
        output: u32,
    },
    /// Eviction of a request that holds no KV.
    #[error(
        "batch {batch}: request {request} is evicted but holds no KV (only a request with m > 0 can be evicted)"
    )]
    EvictWithoutKv {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
    },
    /// Processing beyond the known tokens.
    #[error(
        "batch {batch}: request {request} processes {tokens} tokens but holds {held} of its {known} known tokens (m + c must be <= K = I + G = {known})"
    )]
    KnownTokenLimit {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
        /// m before the step.
        held: u64,
        /// c.
        tokens: u64,
        /// K = I + G.
        known: u64,
    },
    /// A cache hit that breaks a rule of prefix caching (semantics.md, "Prefix caching").
    #[error(
        "batch {batch}: request {request} takes {cached} tokens from the prefix cache, but {reason}"
    )]
    CacheHit {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
        /// The tokens the entry takes from the cache.
        cached: u64,
        /// The rule broken.
        reason: String,
    },
    /// An entry takes transferred KV against the rule (semantics.md, "Disaggregated
    /// prefill and decode").
    #[error(
        "batch {batch}: request {request} takes {tokens} tokens of transferred KV, but {reason}"
    )]
    Transferred {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
        /// The tokens the entry takes.
        tokens: u64,
        /// The rule broken.
        reason: String,
    },
    /// Token budget C exceeded.
    #[error("batch {batch}: processes {tokens} tokens, over the token budget C = {limit}")]
    TokenBudget {
        /// Batch index.
        batch: usize,
        /// Tokens processed.
        tokens: u64,
        /// C.
        limit: u64,
    },
    /// Prefill budget P exceeded.
    #[error(
        "batch {batch}: processes {tokens} prefill tokens, over the prefill budget P = {limit}"
    )]
    PrefillBudget {
        /// Batch index.
        batch: usize,
        /// Prefill tokens.
        tokens: u64,
        /// P.
        limit: u64,
    },
    /// KV capacity M exceeded.
    #[error(
        "batch {batch}: KV in use after the step is {used} tokens (in blocks of {block_size}), over the capacity M = {limit}; request {request} was the last to grow"
    )]
    KvCapacity {
        /// Batch index.
        batch: usize,
        /// Occupied KV after the step, block-rounded.
        used: u64,
        /// M.
        limit: u64,
        /// Block size.
        block_size: u32,
        /// The last request in the batch whose KV grew.
        request: u32,
    },
    /// Too many requests hold KV.
    #[error("batch {batch}: {running} requests hold KV after the step, over R_max = {limit}")]
    MaxRunning {
        /// Batch index.
        batch: usize,
        /// Requests with m > 0 after the step.
        running: u64,
        /// R_max.
        limit: u64,
    },
    /// A claimed start time precedes the arrival of a request the batch processes.
    #[error(
        "batch {batch}: claimed start {start_s} s is before the arrival of request {request} at {arrival_s} s (no processing before arrival)"
    )]
    BeforeArrival {
        /// Batch index.
        batch: usize,
        /// Request id.
        request: u32,
        /// Claimed start.
        start_s: f64,
        /// The request's arrival.
        arrival_s: f64,
    },
    /// Measured batch times given for a different number of batches.
    #[error("{times} measured batch times for a schedule of {batches} batches (one per batch)")]
    MeasuredTimes {
        /// Times given.
        times: usize,
        /// Batches in the schedule.
        batches: usize,
    },
    /// A producer's claimed time differs from the replay's.
    #[error("batch {batch}: claimed {field} = {claimed} s but replay computes {replayed} s")]
    ClaimedTimeMismatch {
        /// Batch index.
        batch: usize,
        /// `start_s` or `end_s`.
        field: &'static str,
        /// The producer's value.
        claimed: f64,
        /// The replay's value.
        replayed: f64,
    },
    /// The cost model returned a negative or non-finite time.
    #[error("batch {batch}: the cost model returned {time_s} s (expected a finite time >= 0)")]
    InvalidBatchTime {
        /// Batch index.
        batch: usize,
        /// What it returned.
        time_s: f64,
    },
    /// A request has not generated all its tokens by the end of the schedule.
    #[error(
        "request {request} never finishes: it generated {generated} of its {output} tokens by the end of the schedule ({batches} batches)"
    )]
    NeverFinished {
        /// Request id.
        request: u32,
        /// G at the end.
        generated: u32,
        /// O.
        output: u32,
        /// Number of batches in the schedule.
        batches: usize,
    },
}

impl ReplayError {
    /// The same error with every request id `k` it names replaced by `ids[k]` (a replay of
    /// part of a workload, renumbered `0..`, told in the workload's ids; ids outside `ids`
    /// are kept).
    pub fn with_request_ids(mut self, ids: &[u32]) -> Self {
        use ReplayError as E;
        let request = match &mut self {
            E::DuplicateEntry { request, .. }
            | E::EvictAndProcess { request, .. }
            | E::ZeroTokens { request, .. }
            | E::FinishedRequestScheduled { request, .. }
            | E::EvictWithoutKv { request, .. }
            | E::KnownTokenLimit { request, .. }
            | E::CacheHit { request, .. }
            | E::KvCapacity { request, .. }
            | E::BeforeArrival { request, .. }
            | E::NeverFinished { request, .. } => request,
            _ => return self,
        };
        if let Some(&id) = ids.get(*request as usize) {
            *request = id;
        }
        self
    }
}

/// What replay computed for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Request id.
    pub id: u32,
    /// I.
    pub input_tokens: u32,
    /// O.
    pub output_tokens: u32,
    /// T.
    pub arrival_s: f64,
    /// Start of the first batch that processes the request.
    pub first_scheduled_s: f64,
    /// Emission time of the first generated token.
    pub first_token_s: f64,
    /// Emission time of the last generated token.
    pub completion_s: f64,
    /// Times the request was evicted.
    pub evictions: u32,
    /// The KV discarded by evictions: processed again, unless taken back from the prefix
    /// cache.
    pub recomputed_tokens: u64,
    /// Tokens taken from the prefix cache instead of being processed.
    pub cached_tokens: u64,
    /// All tokens processed: `I + O - 1 + recomputed_tokens - cached_tokens`.
    pub processed_tokens: u64,
    /// Largest gap between consecutive tokens (0 when O = 1).
    pub max_tbt_s: f64,
}

impl RequestRecord {
    /// Time to first token: first token time - T.
    pub fn ttft_s(&self) -> f64 {
        self.first_token_s - self.arrival_s
    }
    /// End-to-end latency: completion - T.
    pub fn e2e_s(&self) -> f64 {
        self.completion_s - self.arrival_s
    }
    /// Time per output token after the first: (E2E - TTFT) / (O - 1); None when O = 1.
    pub fn tpot_s(&self) -> Option<f64> {
        (self.output_tokens > 1)
            .then(|| (self.completion_s - self.first_token_s) / f64::from(self.output_tokens - 1))
    }
    /// E2E / O.
    pub fn normalized_latency_s(&self) -> f64 {
        self.e2e_s() / f64::from(self.output_tokens)
    }
    /// Start of the first batch containing the request - T.
    pub fn queueing_delay_s(&self) -> f64 {
        self.first_scheduled_s - self.arrival_s
    }
}

/// What replay computed for one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    /// 0-based batch index.
    pub index: usize,
    /// S_j.
    pub start_s: f64,
    /// E_j.
    pub end_s: f64,
    /// The batch's cost-model features.
    pub features: BatchFeatures,
    /// Prefill tokens (sum of c over prefill entries).
    pub prefill_tokens: u64,
    /// Eviction entries.
    pub evictions: u32,
    /// Tokens generated (one per request whose m reached K).
    pub generated: u32,
    /// Requests that finished in this batch.
    pub finished: u32,
    /// KV occupied after the step (block-rounded, finishing requests included).
    pub kv_tokens: u64,
    /// KV the requests finishing in this batch release at its end (block-rounded): what is
    /// held until the next batch is `kv_tokens - kv_tokens_released`.
    pub kv_tokens_released: u64,
    /// Requests holding KV after the step (finishing requests included).
    pub running: u64,
}

impl BatchRecord {
    /// E_j - S_j.
    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }
    /// Processing entries (prefills + decodes).
    pub fn processing_entries(&self) -> u64 {
        self.features.n_prefill + self.features.n_decode
    }
}

/// The result of a successful replay: every batch and request, and all token gaps.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The limits the schedule was checked against.
    pub limits: Limits,
    /// Per batch, in order.
    pub batches: Vec<BatchRecord>,
    /// Per request, by id.
    pub requests: Vec<RequestRecord>,
    /// Every gap between consecutive tokens of a request (TBT samples).
    pub tbt_gaps_s: Vec<f64>,
    /// The request (index) of each gap in `tbt_gaps_s`.
    pub tbt_gap_requests: Vec<u32>,
}

impl Replay {
    /// End of the last batch.
    pub fn makespan_s(&self) -> f64 {
        self.batches.last().map_or(0.0, |b| b.end_s)
    }
}

/// What one entry of a batch did, classified by the rule the replay uses for batch features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Dropped the request's KV.
    Evict,
    /// Processed prompt or refill tokens (a prefill chunk).
    Prefill,
    /// Processed the one token after the last generated one (a decode step).
    Decode,
    /// Received the KV of prompt tokens computed elsewhere (`cached` of them).
    Receive,
}

/// One classified entry: request, kind, tokens processed (0 for an eviction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassifiedEntry {
    /// Request id.
    pub request: u32,
    /// What the entry did.
    pub kind: EntryKind,
    /// Tokens processed.
    pub tokens: u32,
    /// Tokens taken from the prefix cache first (the request's KV then starts there).
    pub cached: u32,
    /// Whether the entry generated a token.
    pub generated_token: bool,
}

/// Classifies every entry of `schedule`, batch by batch, as prefill, decode or eviction.
///
/// The schedule must be one [`replay()`] accepts for `workload` (reports, traces and plots
/// call this after the replay); entries naming unknown requests are skipped.
pub fn classify_entries(workload: &Workload, schedule: &Schedule) -> Vec<Vec<ClassifiedEntry>> {
    let reqs = workload.requests();
    let mut state = vec![RequestState::default(); reqs.len()];
    let v0 = schedule.prefix_cache == Some(CacheRule::VllmV0);
    schedule
        .batches
        .iter()
        .map(|batch| {
            batch
                .entries
                .iter()
                .filter(|e| (e.request as usize) < reqs.len())
                .map(|e| {
                    let i = e.request as usize;
                    match e.action {
                        Action::Evict => {
                            state[i].evict();
                            ClassifiedEntry {
                                request: e.request,
                                kind: EntryKind::Evict,
                                tokens: 0,
                                cached: 0,
                                generated_token: false,
                            }
                        }
                        Action::Receive => {
                            state[i].held = u64::from(e.cached);
                            ClassifiedEntry {
                                request: e.request,
                                kind: EntryKind::Receive,
                                tokens: 0,
                                cached: e.cached,
                                generated_token: false,
                            }
                        }
                        Action::Process(c) => {
                            if e.cached > 0 && state[i].held == 0 {
                                state[i].held = u64::from(e.cached);
                            }
                            let step = state[i].process(&reqs[i], u64::from(c));
                            let as_prompt = e.cached > 0 && v0;
                            ClassifiedEntry {
                                request: e.request,
                                kind: if step.decode && !as_prompt {
                                    EntryKind::Decode
                                } else {
                                    EntryKind::Prefill
                                },
                                tokens: c,
                                cached: e.cached,
                                generated_token: step.generates,
                            }
                        }
                    }
                })
                .collect()
        })
        .collect()
}

fn times_agree(a: f64, b: f64) -> bool {
    (a - b).abs() <= CLAIMED_TIME_TOLERANCE * a.abs().max(b.abs()).max(1.0)
}

/// Replays `schedule` for `workload` under `limits` with batch times from `cost`.
///
/// Checks every rule of `semantics.md`; see [`ReplayError`] for the list. Where the
/// workload has KV holds ([`Workload::with_kv_hold`]), a finished request's KV is free
/// for the batches starting at or after its completion plus its hold, and a batch may
/// start at a later claimed start (a scheduler waiting for held KV).
pub fn replay(
    workload: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    schedule: &Schedule,
) -> Result<Replay, ReplayError> {
    replay_timed(
        workload,
        limits,
        &Pipeline::none(),
        &|_, f| cost.batch_time_s(f),
        schedule,
    )
}

/// Replays `schedule` on a replica of `pipeline.stages` pipeline stages (semantics.md,
/// "Pipeline parallelism"): each batch flows through the stages in order, at most `P` in
/// flight; an entry of a request that has generated a token waits for the batch that
/// generated its last one to complete; a finished request's KV is released for the
/// batches starting at or after its last batch's completion. A batch starts as early as
/// that allows, or at its claimed start if later (a scheduler waiting for a batch in
/// flight to release KV). With one stage it is [`replay`], bit for bit.
pub fn replay_pipelined(
    workload: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    pipeline: &Pipeline,
    schedule: &Schedule,
) -> Result<Replay, ReplayError> {
    pipeline.validate()?;
    replay_timed(
        workload,
        limits,
        pipeline,
        &|_, f| cost.batch_time_s(f),
        schedule,
    )
}

/// Replays `schedule` with measured batch durations (`times_s[j]` seconds for batch `j`,
/// e.g. timed on a GPU) in place of a cost model: the same rules and metrics, for the
/// schedule as it ran. The producer's claimed batch times are not checked (they are its
/// cost model's, not the measurement's). Fails when there is not exactly one time per
/// batch.
pub fn replay_measured(
    workload: &Workload,
    limits: &Limits,
    times_s: &[f64],
    schedule: &Schedule,
) -> Result<Replay, ReplayError> {
    if times_s.len() != schedule.batches.len() {
        return Err(ReplayError::MeasuredTimes {
            times: times_s.len(),
            batches: schedule.batches.len(),
        });
    }
    let mut unclaimed = schedule.clone();
    for b in &mut unclaimed.batches {
        (b.start_s, b.end_s) = (None, None);
    }
    replay_timed(
        workload,
        limits,
        &Pipeline::none(),
        &|j, _| times_s[j],
        &unclaimed,
    )
}

/// The replay with batch `j`'s time from `time_of(j, features)`.
fn replay_timed(
    workload: &Workload,
    limits: &Limits,
    pipeline: &Pipeline,
    time_of: &dyn Fn(usize, &BatchFeatures) -> f64,
    schedule: &Schedule,
) -> Result<Replay, ReplayError> {
    limits.validate()?;
    limits.check_feasible(workload)?;
    let mut r = Replayer::new(workload, limits, schedule.batches.len());
    let rule =
        (schedule.prefix_cache).or_else(|| schedule.has_cache_hits().then_some(CacheRule::VllmV1));
    if let Some(rule) = rule.filter(|_| !workload.has_transferred()) {
        let keys = BlockKeys::new(workload, limits.block_size);
        let blocks = limits.kv_capacity.map(|m| m / u64::from(limits.block_size));
        r.cache = Some(KvCache::new(rule, keys, blocks, limits.block_size));
    }
    let mut clock = PipelineClock::new(*pipeline);
    r.pipelined = pipeline.is_pipelined();
    let mut step = BatchStep::default();
    for (j, batch) in schedule.batches.iter().enumerate() {
        step.clear();
        let mut earliest = clock.earliest_start();
        if r.pipelined || !r.hold_s.is_empty() || !r.transfer_s.is_empty() {
            // A scheduler may wait past that for a batch in flight to complete or a
            // request's KV to be sent, to release KV: a later claimed start is taken (and
            // checked below).
            let claimed = batch.start_s.filter(|t| t.is_finite()).unwrap_or(0.0);
            earliest = earliest.max(r.ready_s(batch)).max(claimed);
            r.release_until(earliest);
        }
        if let Some(cache) = &mut r.cache {
            cache.set_step(j as u64);
        }
        r.apply_entries(j, batch, &mut step)?;
        r.check_limits(j, &step)?;
        let start_s = earliest.max(step.latest_arrival);
        let time_s = time_of(j, &step.features);
        if !(time_s.is_finite() && time_s >= 0.0) {
            return Err(ReplayError::InvalidBatchTime { batch: j, time_s });
        }
        let end_s = clock.run(start_s, time_s, step.features.tokens);
        check_claims(j, batch, start_s, end_s, &step, r.reqs)?;
        for &i in &step.received {
            r.receive_ready_s[i] = start_s + r.transfer_s.get(i).copied().unwrap_or(0.0);
        }
        let record = r.emit_tokens(j, start_s, end_s, &step);
        r.batches.push(record);
    }
    r.finish(schedule.batches.len())
}

/// What ends when a finished request's entry in [`Replayer::unreleased`] comes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    /// It stops running and frees its KV (its last batch completed on a pipeline).
    Both,
    /// It stops running; its KV stays for its hold.
    RunningOnly,
    /// Its hold ends: its KV is free.
    KvOnly,
}

/// What one batch did so far, entry by entry.
#[derive(Default)]
struct BatchStep {
    features: BatchFeatures,
    prefill_tokens: u64,
    evictions: u32,
    latest_arrival: f64,
    /// The last request whose KV grew (named when the batch overflows M).
    last_grown: Option<u32>,
    /// (request, generated a token) for each processing entry.
    processed: Vec<(usize, bool)>,
    /// Requests that received their KV in this batch.
    received: Vec<usize>,
}

impl BatchStep {
    fn clear(&mut self) {
        let mut processed = std::mem::take(&mut self.processed);
        let mut received = std::mem::take(&mut self.received);
        processed.clear();
        received.clear();
        *self = BatchStep {
            processed,
            received,
            ..BatchStep::default()
        };
    }
}

/// The replay's running state: every request's state and record, KV and running counts.
struct Replayer<'a> {
    reqs: &'a [crate::request::Request],
    limits: &'a Limits,
    state: Vec<RequestState>,
    last_seen: Vec<usize>,
    last_token_s: Vec<f64>,
    records: Vec<RequestRecord>,
    kv_used: u64,
    running: u64,
    tbt_gaps_s: Vec<f64>,
    tbt_gap_requests: Vec<u32>,
    batches: Vec<BatchRecord>,
    /// The block pool, when some entry takes tokens from the prefix cache or the schedule
    /// names a cache rule.
    cache: Option<KvCache>,
    /// Per request, the prompt tokens whose KV it brings (empty: none brings any).
    transferred: Vec<u32>,
    /// More than one pipeline stage: entries wait for their requests' batches in flight
    /// and finished requests release their KV at their last batch's completion.
    pipelined: bool,
    /// Finished requests still running or holding KV: (when that ends, request, batch,
    /// what ends then).
    unreleased: Vec<(f64, usize, usize, Release)>,
    /// Per request, seconds it keeps its KV after its last token (empty: none does).
    hold_s: Vec<f64>,
    /// Per request, seconds its received KV takes to arrive (empty: none is received).
    transfer_s: Vec<f64>,
    /// Per request that received its KV and has not processed since: when the KV is there
    /// (NaN otherwise; infinite within the batch that receives it).
    receive_ready_s: Vec<f64>,
}

impl<'a> Replayer<'a> {
    fn new(workload: &'a Workload, limits: &'a Limits, batches: usize) -> Self {
        let reqs = workload.requests();
        let n = reqs.len();
        let records = reqs
            .iter()
            .enumerate()
            .map(|(id, r)| RequestRecord {
                id: id as u32,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                arrival_s: r.arrival_s,
                first_scheduled_s: f64::NAN,
                first_token_s: f64::NAN,
                completion_s: f64::NAN,
                evictions: 0,
                recomputed_tokens: 0,
                cached_tokens: 0,
                processed_tokens: 0,
                max_tbt_s: 0.0,
            })
            .collect();
        Self {
            reqs,
            limits,
            state: vec![RequestState::default(); n],
            last_seen: vec![usize::MAX; n],
            last_token_s: vec![0f64; n],
            records,
            kv_used: 0,
            running: 0,
            tbt_gaps_s: Vec::new(),
            tbt_gap_requests: Vec::new(),
            batches: Vec::with_capacity(batches),
            cache: None,
            transferred: if workload.has_transferred() {
                (0..n).map(|i| workload.transferred(i)).collect()
            } else {
                Vec::new()
            },
            pipelined: false,
            unreleased: Vec::new(),
            hold_s: if workload.has_kv_hold() {
                (0..n).map(|i| workload.kv_hold_s(i)).collect()
            } else {
                Vec::new()
            },
            transfer_s: if workload.pulls_kv() {
                (0..n).map(|i| workload.transfer_s(i)).collect()
            } else {
                Vec::new()
            },
            receive_ready_s: vec![f64::NAN; n],
        }
    }

    /// The earliest start of `batch` its requests allow in a pipeline: their arrivals, and
    /// for a request that has generated a token, the completion of the batch that
    /// generated its last one (its next entry needs it). A prompt chunk may follow the
    /// one before it while that one is in flight. (Unknown ids are refused when applied.)
    fn ready_s(&self, batch: &crate::schedule::Batch) -> f64 {
        let n = self.reqs.len();
        batch
            .entries
            .iter()
            .map(|e| e.request as usize)
            .filter(|&i| i < n)
            .map(|i| {
                let own = if self.pipelined && self.state[i].generated >= 1 {
                    self.last_token_s[i]
                } else {
                    0.0
                };
                // A request that received its KV waits for it to arrive.
                let received = self.receive_ready_s[i];
                let received = if received.is_nan() { 0.0 } else { received };
                own.max(received).max(self.reqs[i].arrival_s)
            })
            .fold(0.0, f64::max)
    }

    /// Releases the KV of the finished requests whose release time (their last batch's
    /// completion, plus their hold) is at most `t_s`, in the order they finished,
    /// counting it in their batches' records.
    fn release_until(&mut self, t_s: f64) {
        let mut unreleased = std::mem::take(&mut self.unreleased);
        unreleased.retain(|&(end_s, i, j, what)| {
            if end_s > t_s {
                return true;
            }
            if what != Release::KvOnly {
                self.running -= 1;
            }
            if what != Release::RunningOnly {
                let released = self.release(i);
                self.batches[j].kv_tokens_released += released;
            }
            false
        });
        self.unreleased = unreleased;
    }

    /// Finished request `i` (in batch `j`, ending at `end_s`) stops running and frees its
    /// KV: at once, at the batch's completion on a pipeline, its KV after its hold.
    /// Returns the KV tokens freed at once.
    fn finish_request(&mut self, i: usize, j: usize, end_s: f64) -> u64 {
        let hold_s = self.hold_s.get(i).copied().unwrap_or(0.0);
        match (self.pipelined, hold_s > 0.0) {
            (false, false) => {
                self.running -= 1;
                return self.release(i);
            }
            (false, true) => self.running -= 1,
            (true, false) => self.unreleased.push((end_s, i, j, Release::Both)),
            (true, true) => self.unreleased.push((end_s, i, j, Release::RunningOnly)),
        }
        if hold_s > 0.0 {
            self.unreleased
                .push((end_s + hold_s, i, j, Release::KvOnly));
        }
        0
    }

    /// Releases finished request `i`'s KV; returns the tokens freed (with the prefix
    /// cache, what the pool no longer holds).
    fn release(&mut self, i: usize) -> u64 {
        let held = self.limits.occupied(self.state[i].held);
        self.kv_used -= held;
        let mut released = held;
        if let Some(cache) = &mut self.cache {
            let before = self.kv_used + held;
            cache.free(i as u32, false);
            self.kv_used = cache.used_tokens();
            released = before - self.kv_used;
        }
        self.state[i].held = 0;
        released
    }

    /// Checks and applies batch `j`'s entries in the order listed: a scheduler preempts
    /// while it walks its running requests, after growing the ones before, and with a
    /// prefix cache which cached block an allocation reuses depends on whether a
    /// preempted request's blocks were freed yet.
    fn apply_entries(
        &mut self,
        j: usize,
        batch: &crate::schedule::Batch,
        step: &mut BatchStep,
    ) -> Result<(), ReplayError> {
        for k in 0..batch.entries.len() {
            self.apply_entry(j, k, batch, step)?;
        }
        Ok(())
    }

    /// Checks and applies entry `k` of batch `j`.
    fn apply_entry(
        &mut self,
        j: usize,
        k: usize,
        batch: &crate::schedule::Batch,
        step: &mut BatchStep,
    ) -> Result<(), ReplayError> {
        let entry = &batch.entries[k];
        let id = entry.request;
        let i = id as usize;
        self.check_entry(j, k, batch)?;
        self.last_seen[i] = j;
        match entry.action {
            Action::Evict if entry.cached > 0 => Err(ReplayError::CacheHit {
                batch: j,
                request: id,
                cached: u64::from(entry.cached),
                reason: "an eviction takes nothing from the cache".into(),
            }),
            Action::Evict => self.evict(j, id, step),
            Action::Receive => self.receive(j, id, u64::from(entry.cached), step),
            Action::Process(c) => {
                if entry.cached > 0 && !self.transferred.is_empty() {
                    self.take_transferred(j, id, u64::from(entry.cached))?;
                } else if entry.cached > 0 {
                    self.take_hit(j, id, u64::from(entry.cached))?;
                }
                // vLLM v0 runs a prompt that took cached blocks as a prompt, even when only
                // its last token is left (semantics.md, "Prefix caching").
                let as_prompt = entry.cached > 0
                    && self.cache.as_ref().map(KvCache::rule) == Some(CacheRule::VllmV0);
                self.process(j, id, c, as_prompt, step)
            }
        }
    }

    /// The entry names a known, unfinished request not already in the batch.
    fn check_entry(
        &self,
        j: usize,
        k: usize,
        batch: &crate::schedule::Batch,
    ) -> Result<(), ReplayError> {
        let entry = &batch.entries[k];
        let id = entry.request;
        let i = id as usize;
        let n = self.reqs.len();
        if i >= n {
            return Err(ReplayError::UnknownRequest {
                batch: j,
                entry: k,
                request: id,
                requests: n,
            });
        }
        if self.last_seen[i] == j {
            let evicted_too = batch
                .entries
                .iter()
                .enumerate()
                .any(|(kk, e)| kk != k && e.request == id && e.action == Action::Evict);
            let this_is_evict = entry.action == Action::Evict;
            return Err(if evicted_too != this_is_evict {
                ReplayError::EvictAndProcess {
                    batch: j,
                    request: id,
                }
            } else {
                ReplayError::DuplicateEntry {
                    batch: j,
                    request: id,
                }
            });
        }
        let r = &self.reqs[i];
        if self.state[i].generated == r.output_tokens {
            return Err(ReplayError::FinishedRequestScheduled {
                batch: j,
                request: id,
                output: r.output_tokens,
            });
        }
        Ok(())
    }

    fn evict(&mut self, j: usize, id: u32, step: &mut BatchStep) -> Result<(), ReplayError> {
        let i = id as usize;
        if self.state[i].held == 0 {
            return Err(ReplayError::EvictWithoutKv {
                batch: j,
                request: id,
            });
        }
        if !self.receive_ready_s[i].is_nan() {
            return Err(ReplayError::Transferred {
                batch: j,
                request: id,
                tokens: self.state[i].held,
                reason:
                    "it is receiving them, not running: it cannot be evicted before it processes"
                        .into(),
            });
        }
        match &mut self.cache {
            // The pool counts shared blocks once.
            Some(cache) => {
                cache.free(id, true);
                self.kv_used = cache.used_tokens();
            }
            None => self.kv_used -= self.limits.occupied(self.state[i].held),
        }
        self.running -= 1;
        self.records[i].recomputed_tokens += self.state[i].held;
        self.records[i].evictions += 1;
        self.state[i].evict();
        step.evictions += 1;
        Ok(())
    }

    fn process(
        &mut self,
        j: usize,
        id: u32,
        c: u32,
        as_prompt: bool,
        step: &mut BatchStep,
    ) -> Result<(), ReplayError> {
        let i = id as usize;
        let r = &self.reqs[i];
        if c == 0 {
            return Err(ReplayError::ZeroTokens {
                batch: j,
                request: id,
            });
        }
        let c = u64::from(c);
        if c > self.state[i].room(r) {
            return Err(ReplayError::KnownTokenLimit {
                batch: j,
                request: id,
                held: self.state[i].held,
                tokens: c,
                known: self.state[i].known(r),
            });
        }
        let done = self.state[i].process(r, c);
        let (before, after) = (done.before, done.after);
        if done.decode && !as_prompt {
            step.features.add_decode(after);
        } else {
            step.features.add_prefill(c, before);
            step.prefill_tokens += c;
        }
        // A request that received its KV starts running with its first processing entry.
        if before == 0 || !self.receive_ready_s[i].is_nan() {
            self.running += 1;
            self.receive_ready_s[i] = f64::NAN;
        }
        let grown = self.limits.occupied(after) - self.limits.occupied(before);
        if grown > 0 {
            step.last_grown = Some(id);
        }
        if self.cache.is_some() {
            self.grow_cached(j, id, after)?;
        } else {
            self.kv_used += grown;
        }
        self.records[i].processed_tokens += c;
        step.latest_arrival = step.latest_arrival.max(r.arrival_s);
        step.processed.push((i, done.generates));
        Ok(())
    }

    /// With the prefix cache: request `id`'s blocks grow to hold `tokens` (and register
    /// those it fills); a pool that runs out is a batch over M.
    fn grow_cached(&mut self, j: usize, id: u32, tokens: u64) -> Result<(), ReplayError> {
        let Some(cache) = &mut self.cache else {
            return Ok(());
        };
        let fits = cache.grow(id, tokens);
        self.kv_used = cache.used_tokens();
        if fits {
            return Ok(());
        }
        let block = u64::from(self.limits.block_size);
        let short = tokens.div_ceil(block) - cache.held(id).len() as u64;
        Err(ReplayError::KvCapacity {
            batch: j,
            used: self.kv_used + short * block,
            limit: self.limits.kv_capacity.unwrap_or(u64::MAX),
            block_size: self.limits.block_size,
            request: id,
        })
    }

    /// Request `id` takes its first `cached` tokens from the prefix cache: it holds no KV,
    /// takes whole blocks, leaves at least one known token to process, and each block is
    /// in the cache now.
    fn take_hit(&mut self, j: usize, id: u32, cached: u64) -> Result<(), ReplayError> {
        let i = id as usize;
        let block = u64::from(self.limits.block_size);
        let known = self.state[i].known(&self.reqs[i]);
        let fail = |reason: String| ReplayError::CacheHit {
            batch: j,
            request: id,
            cached,
            reason,
        };
        if self.state[i].held > 0 {
            return Err(fail(format!(
                "it holds {} tokens of KV (a hit is taken only by a request holding none)",
                self.state[i].held
            )));
        }
        if !cached.is_multiple_of(block) {
            return Err(fail(format!(
                "that is not a whole number of blocks of {block}"
            )));
        }
        if cached >= known {
            return Err(fail(format!(
                "it knows {known} tokens (a hit leaves at least the last known token to process)"
            )));
        }
        let cache = self
            .cache
            .as_mut()
            .expect("a schedule with hits has a cache");
        let (found, _) = cache.hit(id, cached / block);
        if found < cached / block {
            let when = match cache.rule() {
                CacheRule::VllmV1 => "at this point",
                CacheRule::VllmV0 => "computed in an earlier batch (vLLM v0's rule)",
            };
            return Err(fail(format!(
                "its block {found} (tokens {} to {}) is not in the cache {when}",
                found * block,
                (found + 1) * block
            )));
        }
        cache.take_hit(id, cached / block);
        self.kv_used = cache.used_tokens();
        self.state[i].held = cached;
        self.running += 1;
        self.records[i].cached_tokens += cached;
        Ok(())
    }

    /// Request `id` receives the KV of its first `tokens` prompt tokens, computed on a
    /// prefill replica: it has not been admitted here, holds none, brought at least that
    /// many and leaves the last known token to process. It holds them from this batch on
    /// (not running until it processes, which waits for the transfer).
    fn receive(
        &mut self,
        j: usize,
        id: u32,
        tokens: u64,
        step: &mut BatchStep,
    ) -> Result<(), ReplayError> {
        let i = id as usize;
        let fail = |reason: String| ReplayError::Transferred {
            batch: j,
            request: id,
            tokens,
            reason,
        };
        if self.transferred.is_empty() || self.transferred[i] == 0 {
            return Err(fail("it brought no KV to receive".into()));
        }
        if self.transfer_s.is_empty() {
            return Err(fail(
                "its KV is pushed here (p2p-nccl): taken at its first processing entry, not received"
                    .into(),
            ));
        }
        if self.admitted_before(i) {
            return Err(fail(
                "it was admitted before (the transferred KV is received at the first admission only)"
                    .into(),
            ));
        }
        let brought = u64::from(self.transferred[i]);
        let known = self.state[i].known(&self.reqs[i]);
        if tokens > brought || tokens >= known {
            return Err(fail(format!(
                "it brought {brought} and knows {known} (a receive takes at most {}; a prompt of one token keeps none and computes it again)",
                brought.min(known - 1)
            )));
        }
        self.kv_used += self.limits.occupied(tokens);
        self.state[i].held = tokens;
        self.records[i].cached_tokens += tokens;
        self.receive_ready_s[i] = f64::INFINITY;
        step.last_grown = Some(id);
        step.latest_arrival = step.latest_arrival.max(self.reqs[i].arrival_s);
        step.received.push(i);
        Ok(())
    }

    /// Whether request `i` has held KV here before (processed, evicted, or holds some).
    fn admitted_before(&self, i: usize) -> bool {
        let record = &self.records[i];
        record.processed_tokens > 0 || record.evictions > 0 || self.state[i].held > 0
    }

    /// Request `id` takes the KV of its first `tokens` prompt tokens that came with it:
    /// at its first admission only (an eviction loses it), at most what it brought, and
    /// leaving at least the last known token to process.
    fn take_transferred(&mut self, j: usize, id: u32, tokens: u64) -> Result<(), ReplayError> {
        let i = id as usize;
        let fail = |reason: String| ReplayError::Transferred {
            batch: j,
            request: id,
            tokens,
            reason,
        };
        if self.admitted_before(i) {
            return Err(fail(
                "it was admitted before (the transferred KV is taken at the first admission only)"
                    .into(),
            ));
        }
        let brought = u64::from(self.transferred[i]);
        if tokens > brought {
            return Err(fail(format!("it brought {brought}")));
        }
        let known = self.state[i].known(&self.reqs[i]);
        if tokens >= known {
            return Err(fail(format!(
                "it knows {known} tokens (at least the last known token is processed)"
            )));
        }
        self.kv_used += self.limits.occupied(tokens);
        self.state[i].held = tokens;
        self.running += 1;
        self.records[i].cached_tokens += tokens;
        Ok(())
    }

    /// The batch keeps C, P, M and R_max.
    fn check_limits(&self, j: usize, step: &BatchStep) -> Result<(), ReplayError> {
        let limits = self.limits;
        if let Some(limit) = limits.token_budget
            && step.features.tokens > limit
        {
            return Err(ReplayError::TokenBudget {
                batch: j,
                tokens: step.features.tokens,
                limit,
            });
        }
        if let Some(limit) = limits.effective_prefill_budget()
            && step.prefill_tokens > limit
        {
            return Err(ReplayError::PrefillBudget {
                batch: j,
                tokens: step.prefill_tokens,
                limit,
            });
        }
        if let Some(limit) = limits.kv_capacity
            && self.kv_used > limit
        {
            return Err(ReplayError::KvCapacity {
                batch: j,
                used: self.kv_used,
                limit,
                block_size: limits.block_size,
                request: step.last_grown.unwrap_or(0),
            });
        }
        if let Some(limit) = limits.max_running
            && self.running > limit
        {
            return Err(ReplayError::MaxRunning {
                batch: j,
                running: self.running,
                limit,
            });
        }
        Ok(())
    }

    /// Token times of batch `j` (from `start_s` to `end_s`): first tokens, gaps,
    /// completions (whose KV is released at the end of the batch); returns its record.
    fn emit_tokens(&mut self, j: usize, start_s: f64, end_s: f64, step: &BatchStep) -> BatchRecord {
        let (mut generated, mut finished, mut kv_released) = (0u32, 0u32, 0u64);
        let (kv_after_step, running_after_step) = (self.kv_used, self.running);
        for &(i, gen_token) in &step.processed {
            let rec = &mut self.records[i];
            if rec.first_scheduled_s.is_nan() {
                rec.first_scheduled_s = start_s;
            }
            if !gen_token {
                continue;
            }
            generated += 1;
            if self.state[i].generated == 1 {
                rec.first_token_s = end_s;
            } else {
                let gap = end_s - self.last_token_s[i];
                rec.max_tbt_s = rec.max_tbt_s.max(gap);
                self.tbt_gaps_s.push(gap);
                self.tbt_gap_requests.push(i as u32);
            }
            self.last_token_s[i] = end_s;
            if self.state[i].generated == self.reqs[i].output_tokens {
                rec.completion_s = end_s;
                finished += 1;
                kv_released += self.finish_request(i, j, end_s);
            }
        }
        BatchRecord {
            index: j,
            start_s,
            end_s,
            features: step.features,
            prefill_tokens: step.prefill_tokens,
            evictions: step.evictions,
            generated,
            finished,
            kv_tokens: kv_after_step,
            kv_tokens_released: kv_released,
            running: running_after_step,
        }
    }

    /// Every request finished: the replay.
    fn finish(self, batches: usize) -> Result<Replay, ReplayError> {
        let (state, reqs) = (&self.state, self.reqs);
        if let Some(i) = (0..reqs.len()).find(|&i| state[i].generated < reqs[i].output_tokens) {
            return Err(ReplayError::NeverFinished {
                request: i as u32,
                generated: state[i].generated,
                output: reqs[i].output_tokens,
                batches,
            });
        }
        Ok(Replay {
            limits: *self.limits,
            batches: self.batches,
            requests: self.records,
            tbt_gaps_s: self.tbt_gaps_s,
            tbt_gap_requests: self.tbt_gap_requests,
        })
    }
}

/// The producer's claimed times of batch `j`, if any, agree with the replay's and start no
/// processing before its request arrives.
fn check_claims(
    j: usize,
    batch: &crate::schedule::Batch,
    start_s: f64,
    end_s: f64,
    step: &BatchStep,
    reqs: &[crate::request::Request],
) -> Result<(), ReplayError> {
    if let Some(claimed) = batch.start_s {
        for &(i, _) in &step.processed {
            if claimed < reqs[i].arrival_s {
                return Err(ReplayError::BeforeArrival {
                    batch: j,
                    request: i as u32,
                    start_s: claimed,
                    arrival_s: reqs[i].arrival_s,
                });
            }
        }
        if !times_agree(claimed, start_s) {
            return Err(ReplayError::ClaimedTimeMismatch {
                batch: j,
                field: "start_s",
                claimed,
                replayed: start_s,
            });
        }
    }
    if let Some(claimed) = batch.end_s
        && !times_agree(claimed, end_s)
    {
        return Err(ReplayError::ClaimedTimeMismatch {
            batch: j,
            field: "end_s",
            claimed,
            replayed: end_s,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Feature;
    use crate::request::Request;
    use crate::schedule::{Batch, Entry};

    /// t = 1 * one + 0.1 * tokens + 0.01 * decode_kv + 0.001 * prefill_attn.
    struct TestCost;
    impl CostModel for TestCost {
        fn batch_time_s(&self, f: &BatchFeatures) -> f64 {
            f.get(Feature::One)
                + 0.1 * f.get(Feature::Tokens)
                + 0.01 * f.get(Feature::DecodeKv)
                + 0.001 * f.get(Feature::PrefillAttn)
        }
    }

    fn workload(reqs: &[(u32, u32, f64)]) -> Workload {
        Workload::new(
            reqs.iter()
                .map(|&(i, o, t)| Request {
                    input_tokens: i,
                    output_tokens: o,
                    arrival_s: t,
                })
                .collect(),
        )
        .unwrap()
    }

    fn sched(batches: Vec<Vec<Entry>>) -> Schedule {
        Schedule::new(batches.into_iter().map(Batch::new).collect())
    }

    use Entry as E;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_computed_chunk_mix_evict_refill() {
        let w = workload(&[(3, 2, 0.0), (2, 1, 0.5)]);
        let s = sched(vec![
            vec![E::process(0, 2)],
            vec![E::process(0, 1), E::process(1, 2)],
            vec![E::evict(0)],
            vec![E::process(0, 4)],
        ]);
        let r = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap();
        // b0: prefill chunk c=2 over m=0: 1 + 0.2 + 0.004.
        assert!(close(r.batches[0].end_s, 1.204));
        // b1: chunk c=1 over m=2 (attn 1 + 4) and r1's prefill c=2 (attn 4): 1 + 0.3 + 0.009.
        assert_eq!(r.batches[1].features.prefill_attn, 9);
        assert_eq!(r.batches[1].features.prefill_ctx, 2);
        assert!(close(r.batches[1].start_s, 1.204));
        assert!(close(r.batches[1].end_s, 2.513));
        assert_eq!(r.batches[1].generated, 2);
        assert_eq!(r.batches[1].finished, 1);
        assert_eq!(
            r.batches[1].kv_tokens, 5,
            "finishing r1 still counts in its batch"
        );
        // b2: eviction only, costs nothing.
        assert!(close(r.batches[2].end_s, 2.513));
        assert_eq!(r.batches[2].kv_tokens, 0);
        // b3: refill of K = I + G = 4 tokens, a prefill (attn 16): 1 + 0.4 + 0.016.
        assert_eq!(r.batches[3].features.n_prefill, 1);
        assert_eq!(r.batches[3].features.n_decode, 0);
        assert!(close(r.batches[3].end_s, 3.929));
        let r0 = &r.requests[0];
        assert!(close(r0.ttft_s(), 2.513));
        assert!(close(r0.e2e_s(), 3.929));
        assert!(close(r0.tpot_s().unwrap(), 1.416));
        assert_eq!(
            (r0.evictions, r0.recomputed_tokens, r0.processed_tokens),
            (1, 3, 7)
        );
        let r1 = &r.requests[1];
        assert!(close(r1.ttft_s(), 2.013));
        assert!(close(r1.queueing_delay_s(), 0.704));
        assert_eq!(r1.tpot_s(), None);
        assert_eq!(r.tbt_gaps_s.len(), 1);
        assert!(close(r.tbt_gaps_s[0], 1.416));
    }

    #[test]
    fn decodes_read_kv_and_arrivals_delay_batches() {
        let w = workload(&[(2, 3, 5.0)]);
        let s = sched(vec![
            vec![E::process(0, 2)],
            vec![E::process(0, 1)],
            vec![E::process(0, 1)],
        ]);
        let r = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap();
        assert!(
            close(r.batches[0].start_s, 5.0),
            "batch waits for the arrival"
        );
        assert!(close(r.batches[0].end_s, 5.0 + 1.0 + 0.2 + 0.004));
        // Decode: m 2 -> 3, reads KV 3: 1 + 0.1 + 0.03.
        assert_eq!(r.batches[1].features.n_decode, 1);
        assert_eq!(r.batches[1].features.decode_kv, 3);
        assert!(close(r.batches[1].duration_s(), 1.13));
        assert_eq!(r.batches[2].features.decode_kv, 4);
        assert!(close(r.batches[2].duration_s(), 1.14));
        assert_eq!(r.batches[2].kv_tokens, 4, "max KV is I + O - 1");
        // The request finishes in batch 2 and frees all of it; nothing earlier is freed.
        assert_eq!(r.batches[2].kv_tokens_released, 4);
        assert_eq!(r.batches[1].kv_tokens_released, 0);
        assert!(close(r.requests[0].max_tbt_s, 1.14));
        assert!(close(r.makespan_s(), 5.0 + 1.204 + 1.13 + 1.14));
    }

    #[test]
    fn entries_are_classified_as_the_features_count_them() {
        // I = 2, O = 3: prefill in two chunks, decode, evict, refill of I + 2 = 4 tokens.
        let w = workload(&[(2, 3, 0.0)]);
        let s = sched(vec![
            vec![E::process(0, 1)],
            vec![E::process(0, 1)],
            vec![E::process(0, 1)],
            vec![E::evict(0)],
            vec![E::process(0, 4)],
        ]);
        let r = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap();
        let kinds = classify_entries(&w, &s);
        let got: Vec<(EntryKind, u32, bool)> = kinds
            .iter()
            .map(|b| (b[0].kind, b[0].tokens, b[0].generated_token))
            .collect();
        use EntryKind::*;
        assert_eq!(
            got,
            vec![
                (Prefill, 1, false),
                (Prefill, 1, true),
                (Decode, 1, true),
                (Evict, 0, false),
                (Prefill, 4, true),
            ]
        );
        for (b, k) in r.batches.iter().zip(&kinds) {
            let decodes = k.iter().filter(|e| e.kind == Decode).count() as u64;
            assert_eq!(b.features.n_decode, decodes, "batch {}", b.index);
        }
    }

    fn two_stages() -> Pipeline {
        Pipeline {
            stages: 2,
            send_latency_s: 0.0,
            send_s_per_token: 0.0,
        }
    }

    #[test]
    fn a_pipeline_overlaps_prompt_chunks_and_waits_for_tokens_in_flight() {
        let p = two_stages();
        // A prompt's chunks follow each other one stage apart: b0 (2 tokens, 1.204 s:
        // stages [0, 0.602], [0.602, 1.204]); b1 (2 over 2 cached, 1.212 s) starts when
        // stage 0 is free, at 0.602, and its stage 1 runs [1.208, 1.814].
        let w = workload(&[(4, 1, 0.0)]);
        let s = sched(vec![vec![E::process(0, 2)], vec![E::process(0, 2)]]);
        let r = replay_pipelined(&w, &Limits::unlimited(), &TestCost, &p, &s).unwrap();
        assert!(close(r.batches[1].start_s, 0.602));
        assert!(close(r.requests[0].first_token_s, 1.814));
        // A decode waits for the batch that generated its last token: b1 starts at 1.204,
        // not 0.602, and lasts 1.13 s (1 + 0.1 + 0.01 x 3).
        let w = workload(&[(2, 2, 0.0)]);
        let s = sched(vec![vec![E::process(0, 2)], vec![E::process(0, 1)]]);
        let r = replay_pipelined(&w, &Limits::unlimited(), &TestCost, &p, &s).unwrap();
        assert!(close(r.batches[1].start_s, 1.204));
        assert!(close(r.requests[0].completion_s, 2.334));
        // A claimed start before the token is back is refused; a later one is taken.
        let mut claimed = s.clone();
        claimed.batches[1].start_s = Some(0.7);
        assert!(matches!(
            replay_pipelined(&w, &Limits::unlimited(), &TestCost, &p, &claimed),
            Err(ReplayError::ClaimedTimeMismatch { batch: 1, .. })
        ));
        claimed.batches[1].start_s = Some(1.5);
        let late = replay_pipelined(&w, &Limits::unlimited(), &TestCost, &p, &claimed).unwrap();
        assert!(close(late.requests[0].completion_s, 1.5 + 1.13));
        // One stage: the sequential replay, bit for bit.
        let one = replay_pipelined(&w, &Limits::unlimited(), &TestCost, &Pipeline::none(), &s);
        assert_eq!(
            one.unwrap(),
            replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap()
        );
        let bad = Pipeline { stages: 0, ..p };
        assert!(matches!(
            replay_pipelined(&w, &Limits::unlimited(), &TestCost, &bad, &s),
            Err(ReplayError::Pipeline(_))
        ));
    }

    #[test]
    fn a_held_kv_is_free_only_after_its_hold() {
        // M = 4, request 0 (2 tokens, O = 1) holds its KV for 0.5 s after its token at
        // 1.2 s (b0: 1 + 0.1 x 2 + 0.001 x 4 = 1.204 s): request 1's 3-token prompt fits
        // only in a batch starting at 1.704 s or later.
        let w = workload(&[(2, 1, 0.0), (3, 1, 0.0)])
            .with_kv_hold(vec![0.5, 0.0])
            .unwrap();
        let m4 = Limits {
            kv_capacity: Some(4),
            block_size: 1,
            ..Limits::unlimited()
        };
        let s = sched(vec![vec![E::process(0, 2)], vec![E::process(1, 3)]]);
        assert!(matches!(
            replay(&w, &m4, &TestCost, &s),
            Err(ReplayError::KvCapacity {
                batch: 1,
                used: 5,
                ..
            })
        ));
        // A scheduler waiting for the hold claims the later start; the replay takes it.
        let mut waited = s.clone();
        waited.batches[1].start_s = Some(1.704);
        let r = replay(&w, &m4, &TestCost, &waited).unwrap();
        assert!(close(r.batches[1].start_s, 1.704));
        assert_eq!(r.batches[0].kv_tokens_released, 2);
        // The request is done at its token; only its KV waits.
        assert!(close(r.requests[0].completion_s, 1.204));
        // Without the hold the same schedule fits back to back.
        let plain = workload(&[(2, 1, 0.0), (3, 1, 0.0)]);
        let r = replay(&plain, &m4, &TestCost, &s).unwrap();
        assert!(close(r.batches[1].start_s, 1.204));
        // A claimed start earlier than the hold allows is refused.
        let mut early = s.clone();
        early.batches[1].start_s = Some(1.3);
        assert!(replay(&w, &m4, &TestCost, &early).is_err());
    }

    #[test]
    fn a_pipeline_releases_kv_when_the_last_batch_completes() {
        // M = 4: request 1 (2 tokens, finishing in b0) holds its KV until b0 completes
        // (1.204 s), so request 2's 3-token prompt fits only in a batch starting then.
        let w = workload(&[(1, 1, 0.0), (2, 1, 0.0), (3, 1, 0.0)]);
        let m4 = Limits {
            kv_capacity: Some(4),
            block_size: 1,
            ..Limits::unlimited()
        };
        let p = two_stages();
        let early = sched(vec![
            vec![E::process(1, 2)],
            vec![E::process(2, 3)],
            vec![E::process(0, 1)],
        ]);
        assert!(matches!(
            replay_pipelined(&w, &m4, &TestCost, &p, &early),
            Err(ReplayError::KvCapacity {
                batch: 1,
                used: 5,
                ..
            })
        ));
        // Sequentially the same schedule fits (b0 is over before b1 starts).
        assert!(replay(&w, &m4, &TestCost, &early).is_ok());
        // With a batch between them, b2 starts after b0's completion (two in flight).
        let late = sched(vec![
            vec![E::process(1, 2)],
            vec![E::process(0, 1)],
            vec![E::process(2, 3)],
        ]);
        let r = replay_pipelined(&w, &m4, &TestCost, &p, &late).unwrap();
        assert!(close(r.batches[2].start_s, 1.204));
        assert_eq!(r.batches[0].kv_tokens_released, 2);
        assert_eq!(r.batches[2].kv_tokens, 4);
    }

    fn err(w: &Workload, l: Limits, s: Schedule) -> ReplayError {
        replay(w, &l, &TestCost, &s).unwrap_err()
    }

    #[test]
    fn transferred_kv_is_taken_once_at_admission_and_counted_in_memory() {
        // An 8-token prompt whose first 8 tokens' KV came with it: it takes 7, computes
        // the last prompt token (a prefill of 1 with 7 of context, generating the first
        // token), then decodes.
        let w = workload(&[(8, 2, 0.0), (4, 1, 0.0)])
            .with_transferred(vec![8, 0])
            .unwrap();
        let s = sched(vec![
            vec![E::cached_process(0, 7, 1), E::process(1, 4)],
            vec![E::process(0, 1)],
        ]);
        let r = replay(&w, &blocks_of_2(Some(12)), &TestCost, &s).unwrap();
        assert_eq!(r.requests[0].cached_tokens, 7);
        assert_eq!(r.requests[0].processed_tokens, 2);
        assert_eq!(r.batches[0].features.prefill_ctx, 7);
        // Memory: 8 tokens (4 blocks of 2) and request 1's 4 in the first batch.
        assert_eq!(r.batches[0].kv_tokens, 12);
        let over = replay(&w, &blocks_of_2(Some(10)), &TestCost, &s).unwrap_err();
        assert!(
            matches!(over, ReplayError::KvCapacity { batch: 0, .. }),
            "{over}"
        );
        // More than it brought, all it knows, or none brought: refused.
        for (tokens, id, why) in [(8, 0, "it knows 8"), (1, 1, "it brought 0")] {
            let bad = sched(vec![vec![E::cached_process(id, tokens, 1)]]);
            let e = err(&w, blocks_of_2(None), bad).to_string();
            assert!(e.contains("transferred KV") && e.contains(why), "{e}");
        }
        // After an eviction the KV is gone: a second take is refused.
        let again = sched(vec![
            vec![E::cached_process(0, 7, 1)],
            vec![E::evict(0)],
            vec![E::cached_process(0, 7, 1)],
        ]);
        let e = err(&w, blocks_of_2(None), again).to_string();
        assert!(
            e.contains("batch 2") && e.contains("admitted before"),
            "{e}"
        );
    }

    #[test]
    fn received_kv_is_held_from_the_receive_and_waits_for_its_transfer() {
        // Request 0 (I = 4, O = 2) brought its prompt's KV, which takes 0.5 s to move once
        // received. b0 receives 3 tokens (a batch of no work: 0 s), holding them (not
        // running); b1 computes the last prompt token, waiting for the KV: it starts at
        // 0.5 s and lasts 1 + 0.1 + 0.001 x (1 + 2 x 3) = 1.107 s; b2 decodes.
        let w = workload(&[(4, 2, 0.0), (2, 1, 0.0)])
            .with_transferred(vec![4, 2])
            .unwrap()
            .with_transfer_s(vec![0.5, 0.5])
            .unwrap();
        let one = |m: Option<u64>, r: Option<u64>| Limits {
            kv_capacity: m,
            max_running: r,
            block_size: 1,
            ..Limits::unlimited()
        };
        let s = sched(vec![
            vec![E::receive(0, 3)],
            vec![E::process(0, 1)],
            vec![E::process(0, 1)],
            vec![E::receive(1, 1)],
            vec![E::process(1, 1)],
        ]);
        let r = replay(&w, &one(None, None), &TestCost, &s).unwrap();
        assert_eq!((r.batches[0].start_s, r.batches[0].end_s), (0.0, 0.0));
        assert_eq!((r.batches[0].kv_tokens, r.batches[0].running), (3, 0));
        assert!(close(r.batches[1].start_s, 0.5) && close(r.batches[1].end_s, 1.607));
        assert_eq!(r.batches[1].running, 1);
        assert!(close(r.requests[0].first_token_s, 1.607));
        assert_eq!(
            (r.requests[0].cached_tokens, r.requests[0].processed_tokens),
            (3, 2)
        );
        // Its receive counts in M, not in R_max: two received at once under R_max = 1.
        let both = sched(vec![
            vec![E::receive(0, 3), E::receive(1, 1)],
            vec![E::process(0, 1)],
            vec![E::process(0, 1)],
            vec![E::process(1, 1)],
        ]);
        assert!(replay(&w, &one(Some(6), Some(1)), &TestCost, &both).is_ok());
        // ... its KV counted from the receive on: request 1's token beside request 0's 5.
        let e = err(&w, one(Some(5), None), both.clone()).to_string();
        assert!(e.contains("batch 2") && e.contains("6 tokens"), "{e}");
        // A claimed start before the KV is there is refused.
        let mut early = s.clone();
        early.batches[1].start_s = Some(0.2);
        assert!(replay(&w, &one(None, None), &TestCost, &early).is_err());
        // More than it brought or knows, twice, evicted while receiving, or nothing
        // brought: refused.
        let nothing = workload(&[(4, 2, 0.0)]).with_transferred(vec![0]).unwrap();
        let pushed = workload(&[(4, 2, 0.0)]).with_transferred(vec![4]).unwrap();
        let cases = [
            (&pushed, sched(vec![vec![E::receive(0, 3)]]), "pushed here"),
            (&w, sched(vec![vec![E::receive(0, 4)]]), "knows 4"),
            (
                &w,
                sched(vec![vec![E::receive(0, 3)], vec![E::receive(0, 3)]]),
                "admitted before",
            ),
            (
                &w,
                sched(vec![vec![E::receive(0, 3)], vec![E::evict(0)]]),
                "cannot be evicted",
            ),
            (
                &nothing,
                sched(vec![vec![E::receive(0, 1)]]),
                "brought no KV",
            ),
        ];
        for (wl, bad, why) in cases {
            let e = err(wl, one(None, None), bad).to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    /// Two 8-token prompts sharing their first 4 tokens (ids in blocks of 4: [1, 2] and
    /// [1, 3]); KV blocks of 2.
    fn shared_prefix() -> Workload {
        workload(&[(8, 2, 0.0), (8, 1, 0.0)])
            .with_prefix(crate::prefix::PrefixIds {
                block_tokens: 4,
                ids: vec![vec![1, 2], vec![1, 3]],
            })
            .unwrap()
    }

    fn blocks_of_2(m: Option<u64>) -> Limits {
        Limits {
            block_size: 2,
            kv_capacity: m,
            ..Limits::unlimited()
        }
    }

    #[test]
    fn a_cache_hit_skips_the_shared_prefix_and_counts_its_blocks_once() {
        let w = shared_prefix();
        // r0's prompt registers 4 blocks; in the same batch r1 takes the first 2 (4
        // tokens) and processes its other 4, with the 4 cached tokens as context.
        let s = sched(vec![
            vec![E::process(0, 8), E::cached_process(1, 4, 4)],
            vec![E::process(0, 1)],
        ]);
        let r = replay(&w, &blocks_of_2(Some(12)), &TestCost, &s).unwrap();
        let b0 = &r.batches[0];
        assert_eq!(b0.features.tokens, 12);
        // Attention: r0 64, r1 4^2 + 2 * 4 * 4 = 48.
        assert_eq!(b0.features.prefill_attn, 112);
        assert_eq!(b0.features.prefill_ctx, 4);
        // Memory: r0's 4 blocks and r1's 2 own ones; the 2 shared count once.
        assert_eq!(b0.kv_tokens, 12);
        assert_eq!(r.requests[1].cached_tokens, 4);
        assert_eq!(r.requests[1].processed_tokens, 4);
        assert!(close(b0.end_s, 1.0 + 1.2 + 0.112));
        // Counted for each request, M = 12 would not hold both: 16 tokens.
        let plain = sched(vec![
            vec![E::process(0, 8), E::process(1, 8)],
            vec![E::process(0, 1)],
        ]);
        assert!(matches!(
            replay(&w, &blocks_of_2(Some(12)), &TestCost, &plain),
            Err(ReplayError::KvCapacity { batch: 0, .. })
        ));
    }

    #[test]
    fn an_eviction_frees_its_blocks_where_it_stands_in_the_batch() {
        // Blocks of 2, M = 3 blocks. Batch 0: r2's prompt fills X (ids [7], shared with
        // r3), r0's its own block, r1 1 token; r2 finishes, X stays cached. Batch 1: r0's
        // decode needs a block and r1 is evicted. Listed first, r0 takes X, the only free
        // block, and X leaves the cache: r3's hit on it in batch 2 is refused. With r1's
        // eviction first, r0 takes r1's freed block and X is still there for r3.
        let w = workload(&[(2, 2, 0.0), (1, 2, 0.0), (2, 1, 0.0), (3, 1, 0.0)])
            .with_prefix(crate::prefix::PrefixIds {
                block_tokens: 2,
                ids: vec![vec![1], vec![2], vec![7], vec![7, 9]],
            })
            .unwrap();
        let batches = |batch1: Vec<Entry>| {
            sched(vec![
                vec![E::process(2, 2), E::process(0, 2), E::process(1, 1)],
                batch1,
                vec![E::cached_process(3, 2, 1), E::process(1, 2)],
            ])
        };
        let l = blocks_of_2(Some(6));
        let late = batches(vec![E::process(0, 1), E::evict(1)]);
        let e = replay(&w, &l, &TestCost, &late).unwrap_err();
        assert!(
            e.to_string()
                .contains("block 0 (tokens 0 to 2) is not in the cache"),
            "{e}"
        );
        let early = batches(vec![E::evict(1), E::process(0, 1)]);
        assert!(replay(&w, &l, &TestCost, &early).is_ok());
    }

    #[test]
    fn vllm_v0s_rule_shares_blocks_within_a_batch_but_hits_only_earlier_ones() {
        let w = shared_prefix();
        let v0 = |batches: Vec<Vec<Entry>>| Schedule {
            prefix_cache: Some(CacheRule::VllmV0),
            ..sched(batches)
        };
        // Both prompts in one batch, nothing taken from the cache: under vLLM v0's rule r1
        // shares r0's 2 prefix blocks (memory 12 tokens, within M = 12) and computes them
        // again (16 tokens processed); without the rule the batch holds 16 tokens.
        let both = vec![
            vec![E::process(0, 8), E::process(1, 8)],
            vec![E::process(0, 1)],
        ];
        let r = replay(&w, &blocks_of_2(Some(12)), &TestCost, &v0(both.clone())).unwrap();
        assert_eq!(r.batches[0].kv_tokens, 12);
        assert_eq!(r.batches[0].features.tokens, 16);
        assert!(matches!(
            replay(&w, &blocks_of_2(Some(12)), &TestCost, &sched(both)),
            Err(ReplayError::KvCapacity { batch: 0, .. })
        ));
        // A hit on blocks filled in the same batch: vLLM V1 takes it, v0 does not (they are
        // computed only from the next step on).
        let same = vec![
            vec![E::process(0, 8), E::cached_process(1, 4, 4)],
            vec![E::process(0, 1)],
        ];
        assert!(replay(&w, &blocks_of_2(None), &TestCost, &sched(same.clone())).is_ok());
        let e = replay(&w, &blocks_of_2(None), &TestCost, &v0(same)).unwrap_err();
        assert!(
            e.to_string().contains("computed in an earlier batch"),
            "{e}"
        );
        // A batch later it is a hit; a refill that finds all but its last token cached is
        // a prefill under v0 (a decode under V1's rule): r0 evicted after its first token
        // finds its 4 blocks cached (its own and the shared) and processes the 9th token.
        let refill = vec![
            vec![E::process(0, 8), E::process(1, 8)],
            vec![E::evict(0)],
            vec![E::cached_process(0, 8, 1)],
        ];
        let r = replay(&w, &blocks_of_2(None), &TestCost, &v0(refill.clone())).unwrap();
        assert_eq!(r.batches[2].features.n_prefill, 1);
        assert_eq!(r.batches[2].features.prefill_ctx, 8);
        let r = replay(&w, &blocks_of_2(None), &TestCost, &sched(refill)).unwrap();
        assert_eq!(r.batches[2].features.n_decode, 1);
    }

    #[test]
    fn each_cache_rule_has_a_breaking_schedule() {
        let w = shared_prefix();
        let hit = |s: Schedule, m: Option<u64>| match replay(&w, &blocks_of_2(m), &TestCost, &s)
            .unwrap_err()
        {
            ReplayError::CacheHit { reason, .. } => reason,
            e => panic!("expected a cache-hit error, got {e}"),
        };
        // Nothing registered yet: r1 comes first.
        let r = hit(
            sched(vec![vec![E::cached_process(1, 4, 4), E::process(0, 8)]]),
            None,
        );
        assert!(
            r.contains("block 0 (tokens 0 to 2) is not in the cache"),
            "{r}"
        );
        // Past the shared prefix: r1's block 2 is its own.
        let r = hit(
            sched(vec![vec![E::process(0, 8), E::cached_process(1, 6, 2)]]),
            None,
        );
        assert!(r.contains("block 2 (tokens 4 to 6)"), "{r}");
        // Half a block.
        let r = hit(
            sched(vec![vec![E::process(0, 8), E::cached_process(1, 3, 5)]]),
            None,
        );
        assert!(r.contains("not a whole number of blocks of 2"), "{r}");
        // The whole prompt: the last known token is always computed.
        let w2 = workload(&[(4, 2, 0.0), (4, 1, 0.0)])
            .with_prefix(crate::prefix::PrefixIds {
                block_tokens: 4,
                ids: vec![vec![1], vec![1]],
            })
            .unwrap();
        let e = replay(
            &w2,
            &blocks_of_2(None),
            &TestCost,
            &sched(vec![
                vec![E::process(0, 4)],
                vec![E::cached_process(1, 4, 1)],
            ]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("it knows 4 tokens"), "{e}");
        // A request holding KV takes no hit.
        let r = hit(
            sched(vec![
                vec![E::process(0, 8), E::process(1, 2)],
                vec![E::cached_process(1, 4, 4)],
            ]),
            None,
        );
        assert!(r.contains("it holds 2 tokens of KV"), "{r}");
        // Evicted blocks stay cached until reused: with M = 10 (5 blocks) r0 takes 4, is
        // evicted, and r1 still finds the shared blocks...
        let kept = sched(vec![
            vec![E::process(0, 8)],
            vec![E::evict(0), E::cached_process(1, 4, 4)],
            vec![E::process(0, 8)],
            vec![E::process(0, 1)],
        ]);
        assert!(replay(&w, &blocks_of_2(Some(10)), &TestCost, &kept).is_ok());
        // ...but not after r1's own 4 tokens reused them: r0's tail blocks go first (2 and
        // 3, freed first), then its head; a second request with r1's ids finds nothing.
        let w3 = workload(&[(8, 1, 0.0), (8, 1, 0.0), (8, 1, 0.0)])
            .with_prefix(crate::prefix::PrefixIds {
                block_tokens: 4,
                ids: vec![vec![1, 2], vec![5, 6], vec![1, 3]],
            })
            .unwrap();
        let reused = sched(vec![
            vec![E::process(0, 8)],
            vec![E::process(1, 8)],
            vec![E::cached_process(2, 4, 4)],
        ]);
        let e = replay(&w3, &blocks_of_2(Some(8)), &TestCost, &reused).unwrap_err();
        assert!(e.to_string().contains("is not in the cache"), "{e}");
        // An eviction takes nothing from the cache (the schedule file refuses it too).
        let mut bad = sched(vec![vec![E::process(0, 8), E::cached_process(1, 4, 4)]]);
        bad.batches.push(Batch::new(vec![E::evict(0)]));
        bad.batches[1].entries[0].cached = 2;
        let r = hit(bad, None);
        assert!(r.contains("an eviction takes nothing"), "{r}");
    }

    #[test]
    fn each_rule_has_a_breaking_schedule() {
        let w = workload(&[(2, 2, 0.0), (2, 1, 0.0)]);
        let ok = || {
            vec![
                vec![E::process(0, 2), E::process(1, 2)],
                vec![E::process(0, 1)],
            ]
        };
        assert!(replay(&w, &Limits::unlimited(), &TestCost, &sched(ok())).is_ok());
        let un = Limits::unlimited;

        // C: the first batch processes 4 tokens.
        let e = err(
            &w,
            Limits {
                token_budget: Some(3),
                ..un()
            },
            sched(ok()),
        );
        assert_eq!(
            e,
            ReplayError::TokenBudget {
                batch: 0,
                tokens: 4,
                limit: 3
            }
        );
        // P: 4 prefill tokens > 3, although C = 4 allows the batch.
        let l = Limits {
            token_budget: Some(4),
            prefill_budget: Some(3),
            ..un()
        };
        let e = err(&w, l, sched(ok()));
        assert_eq!(
            e,
            ReplayError::PrefillBudget {
                batch: 0,
                tokens: 4,
                limit: 3
            }
        );
        // P counts prefills only: the decode batch of 1 token passes P = 2 where prefills fit.
        let l = Limits {
            token_budget: Some(4),
            prefill_budget: Some(2),
            ..un()
        };
        let s = sched(vec![
            vec![E::process(0, 2)],
            vec![E::process(0, 1), E::process(1, 2)],
        ]);
        assert!(replay(&w, &l, &TestCost, &s).is_ok());
        // M: 4 tokens held after batch 0 (finishing r1 included) > 3.
        let e = err(
            &w,
            Limits {
                kv_capacity: Some(3),
                ..un()
            },
            sched(ok()),
        );
        assert!(
            matches!(
                e,
                ReplayError::KvCapacity {
                    batch: 0,
                    used: 4,
                    limit: 3,
                    ..
                }
            ),
            "{e}"
        );
        // M with block size 2: r0 holds 3 tokens = 2 blocks = 4 after batch 1.
        let l = Limits {
            kv_capacity: Some(4),
            block_size: 2,
            ..un()
        };
        let s = sched(vec![
            vec![E::process(1, 2)],
            vec![E::process(0, 2)],
            vec![E::process(0, 1)],
        ]);
        assert!(replay(&w, &l, &TestCost, &s).is_ok());
        let w3 = workload(&[(2, 2, 0.0), (1, 1, 0.0)]);
        let l = Limits {
            kv_capacity: Some(4),
            block_size: 2,
            ..un()
        };
        let s = sched(vec![
            vec![E::process(0, 2)],
            vec![E::process(0, 1), E::process(1, 1)],
        ]);
        // r0 holds 3 (2 blocks) and r1 holds 1 (1 block): 6 > 4, though 3 + 1 = 4 tokens.
        let e = err(&w3, l, s);
        assert!(
            matches!(
                e,
                ReplayError::KvCapacity {
                    batch: 1,
                    used: 6,
                    limit: 4,
                    block_size: 2,
                    ..
                }
            ),
            "{e}"
        );
        // R_max: two requests hold KV after batch 0.
        let e = err(
            &w,
            Limits {
                max_running: Some(1),
                ..un()
            },
            sched(ok()),
        );
        assert_eq!(
            e,
            ReplayError::MaxRunning {
                batch: 0,
                running: 2,
                limit: 1
            }
        );
        // Known-token limit: 3 tokens of a 2-token prompt.
        let e = err(&w, un(), sched(vec![vec![E::process(0, 3)]]));
        assert_eq!(
            e,
            ReplayError::KnownTokenLimit {
                batch: 0,
                request: 0,
                held: 0,
                tokens: 3,
                known: 2
            }
        );
        // A decode step processes exactly one token: 2 tokens when K - m = 1 breaks the rule.
        let e = err(
            &w,
            un(),
            sched(vec![vec![E::process(0, 2)], vec![E::process(0, 2)]]),
        );
        assert!(
            matches!(
                e,
                ReplayError::KnownTokenLimit {
                    batch: 1,
                    held: 2,
                    known: 3,
                    ..
                }
            ),
            "{e}"
        );
        // Evict and process in one batch.
        let e = err(
            &w,
            un(),
            sched(vec![
                vec![E::process(0, 1)],
                vec![E::evict(0), E::process(0, 1)],
            ]),
        );
        assert_eq!(
            e,
            ReplayError::EvictAndProcess {
                batch: 1,
                request: 0
            }
        );
        // Twice in one batch.
        let e = err(
            &w,
            un(),
            sched(vec![vec![E::process(0, 1), E::process(0, 1)]]),
        );
        assert_eq!(
            e,
            ReplayError::DuplicateEntry {
                batch: 0,
                request: 0
            }
        );
        // Finished request processing again.
        let mut s = ok();
        s.push(vec![E::process(1, 1)]);
        let e = err(&w, un(), sched(s));
        assert_eq!(
            e,
            ReplayError::FinishedRequestScheduled {
                batch: 2,
                request: 1,
                output: 1
            }
        );
        // Finished requests cannot be evicted either (their KV is already freed).
        let mut s = ok();
        s.push(vec![E::evict(1)]);
        assert!(matches!(
            err(&w, un(), sched(s)),
            ReplayError::FinishedRequestScheduled { .. }
        ));
        // Never finishing.
        let e = err(
            &w,
            un(),
            sched(vec![vec![E::process(0, 2), E::process(1, 2)]]),
        );
        assert_eq!(
            e,
            ReplayError::NeverFinished {
                request: 0,
                generated: 1,
                output: 2,
                batches: 1
            }
        );
        // Unknown id.
        let e = err(
            &w,
            un(),
            sched(vec![vec![E::process(0, 2), E::process(7, 1)]]),
        );
        assert_eq!(
            e,
            ReplayError::UnknownRequest {
                batch: 0,
                entry: 1,
                request: 7,
                requests: 2
            }
        );
        // Evicting a request that holds nothing.
        let e = err(&w, un(), sched(vec![vec![E::evict(0)]]));
        assert_eq!(
            e,
            ReplayError::EvictWithoutKv {
                batch: 0,
                request: 0
            }
        );
        // Zero tokens.
        let e = err(&w, un(), sched(vec![vec![E::process(0, 0)]]));
        assert_eq!(
            e,
            ReplayError::ZeroTokens {
                batch: 0,
                request: 0
            }
        );
        // A request that can never fit: I + O - 1 = 3 > M = 2.
        let e = err(
            &w,
            Limits {
                kv_capacity: Some(2),
                ..un()
            },
            sched(ok()),
        );
        assert!(matches!(e, ReplayError::Infeasible(_)), "{e}");
        assert!(e.to_string().contains("request 0 needs 3 KV tokens"), "{e}");
        // Invalid limits.
        let e = err(
            &w,
            Limits {
                max_running: Some(0),
                ..un()
            },
            sched(ok()),
        );
        assert!(matches!(e, ReplayError::Limits(_)));
    }

    #[test]
    fn arrival_and_claimed_times() {
        let w = workload(&[(1, 1, 0.0), (1, 1, 2.0)]);
        let mut s = sched(vec![vec![E::process(0, 1)], vec![E::process(1, 1)]]);
        // Batch 0: 1 + 0.1 + 0.001 = 1.101; batch 1 waits for r1's arrival at 2.0.
        let r = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap();
        assert!(close(r.batches[1].start_s, 2.0));
        let summary = crate::Summary::from_replay(&r);
        assert!(close(summary.idle_s, 2.0 - 1.101));
        // A producer claiming batch 1 starts at 1.101 would process r1 before it arrives.
        s.batches[1].start_s = Some(1.101);
        let e = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap_err();
        assert!(
            matches!(
                e,
                ReplayError::BeforeArrival {
                    batch: 1,
                    request: 1,
                    ..
                }
            ),
            "{e}"
        );
        s.batches[1].start_s = Some(2.0);
        s.batches[1].end_s = Some(3.2);
        let e = replay(&w, &Limits::unlimited(), &TestCost, &s).unwrap_err();
        assert!(
            matches!(
                e,
                ReplayError::ClaimedTimeMismatch {
                    batch: 1,
                    field: "end_s",
                    ..
                }
            ),
            "{e}"
        );
        s.batches[1].end_s = Some(3.101);
        assert!(replay(&w, &Limits::unlimited(), &TestCost, &s).is_ok());
    }

    #[test]
    fn measured_times_replace_the_cost_model_batch_by_batch() {
        let w = workload(&[(1, 1, 0.0), (1, 1, 2.0)]);
        let s = sched(vec![vec![E::process(0, 1)], vec![E::process(1, 1)]]);
        let un = Limits::unlimited();
        let r = replay_measured(&w, &un, &[0.5, 0.25], &s).unwrap();
        assert!(close(r.batches[0].end_s, 0.5));
        // Batch 1 still waits for its request's arrival, then takes its own time.
        assert!(close(r.batches[1].start_s, 2.0));
        assert!(close(r.makespan_s(), 2.25));
        assert!(close(r.requests[1].e2e_s(), 0.25));
        // Claimed times (a producer's cost model's) are not the measurement's.
        let mut claimed = s.clone();
        claimed.batches[0].end_s = Some(9.0);
        let r2 = replay_measured(&w, &un, &[0.5, 0.25], &claimed).unwrap();
        assert_eq!(r2, r);
        let e = replay_measured(&w, &un, &[0.5], &s).unwrap_err();
        assert_eq!(
            e,
            ReplayError::MeasuredTimes {
                times: 1,
                batches: 2
            }
        );
        let e = replay_measured(&w, &un, &[0.5, f64::NAN], &s).unwrap_err();
        assert!(matches!(e, ReplayError::InvalidBatchTime { batch: 1, .. }));
    }

    #[test]
    fn invalid_cost_is_rejected() {
        struct Negative;
        impl CostModel for Negative {
            fn batch_time_s(&self, _: &BatchFeatures) -> f64 {
                -1.0
            }
        }
        let w = workload(&[(1, 1, 0.0)]);
        let e = replay(
            &w,
            &Limits::unlimited(),
            &Negative,
            &sched(vec![vec![E::process(0, 1)]]),
        );
        assert!(matches!(
            e,
            Err(ReplayError::InvalidBatchTime { batch: 0, .. })
        ));
    }
}
