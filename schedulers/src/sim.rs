//! The one simulation loop (InferMax's unified algorithm) and its state.
//!
//! ```text
//! waiting (FCFS by arrival; evicted requests go back to its FRONT), running (hold KV)
//! loop: move arrived requests into waiting
//!       B = policy.next_batch(sim)        # may evict members of running
//!       if B processes nothing: advance time to the next arrival (idle), continue
//!       run B (time from the cost model), emit tokens, free finished requests
//! ```
//!
//! The simulator keeps its own account of every request's KV and of time; the schedule it
//! emits carries its claimed batch times, which the independent replay checks.
//!
//! On a pipeline of `P > 1` stages ([`simulate_pipelined`], semantics.md "Pipeline
//! parallelism") the next batch is built as soon as stage 0 is free and fewer than `P`
//! batches are in flight (vLLM V1's batch queue): a request whose last token is still in
//! flight counts as scheduled (vLLM skips it: its next tokens are not known yet), a
//! finished request holds its KV until its last batch completes, and when nothing can be
//! scheduled time moves to the next completion or arrival.

use infersched_core::{
    Batch, BatchFeatures, BlockKeys, CacheRule, CostModel, Entry, KvCache, Limits, Pipeline,
    PipelineClock, Request, Schedule, Workload,
};
use std::borrow::Cow;
use std::collections::VecDeque;
use thiserror::Error;

/// Why a simulation could not run to completion.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    /// The limits are invalid.
    #[error(transparent)]
    Limits(#[from] infersched_core::LimitsError),
    /// A request can never be served by this policy under these limits.
    #[error("{policy} cannot serve request {request}: {reason}")]
    Unservable {
        /// Policy name.
        policy: String,
        /// Request id.
        request: u32,
        /// Why.
        reason: String,
    },
    /// A cluster needs 1 to [`infersched_core::cluster::MAX_REPLICAS`] replicas.
    #[error("a cluster needs 1 to {max} replicas, got {0}", max = infersched_core::cluster::MAX_REPLICAS)]
    Replicas(usize),
    /// One replica of a cluster failed (request ids in its state are the replica's own,
    /// numbered in the order they were routed to it).
    #[error("replica {replica}: {source}")]
    Replica {
        /// The replica.
        replica: u32,
        /// What went wrong there.
        source: Box<SimError>,
    },
    /// A disaggregated cluster's settings or hand-over failed.
    #[error("disaggregated prefill and decode: {0}")]
    Disaggregated(String),
    /// The workload's requests bring KV that the policy would not take.
    #[error(
        "{policy} does not take KV computed elsewhere (disaggregated decode replicas run vllm-v1, as vLLM's KV connectors do)"
    )]
    TransferredKv {
        /// Policy name.
        policy: String,
    },
    /// The pipeline is invalid.
    #[error(transparent)]
    Pipeline(#[from] infersched_core::PipelineError),
    /// The policy does not run on a pipeline of several stages.
    #[error(
        "{policy} does not run on a pipeline of several stages (--pp > 1 is modelled for vllm-v1, whose batch queue keeps up to --pp batches in flight)"
    )]
    NotPipelined {
        /// Policy name.
        policy: String,
    },
    /// vLLM v0's virtual engines each keep their own prefix cache, which one replayed
    /// schedule cannot show.
    #[error(
        "{policy} with --enable-prefix-caching does not run on a pipeline: vLLM v0 gives each virtual engine its own prefix cache, which infersched does not model; drop --pp or the cache"
    )]
    CacheOnVirtualEngines {
        /// Policy name.
        policy: String,
    },
    /// The simulation stopped making progress.
    #[error("{policy} made no progress at t = {time_s} s after {batches} batches: {state}")]
    Stalled {
        /// Policy name.
        policy: String,
        /// Simulated time.
        time_s: f64,
        /// Batches emitted so far.
        batches: usize,
        /// Queues and memory at the stall.
        state: String,
    },
}

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not yet arrived.
    Pending,
    /// In the waiting queue.
    Waiting,
    /// In the running set (holds KV).
    Running,
    /// Generated all its tokens.
    Finished,
    /// Received its transferred KV, allocated; running once the KV has arrived.
    Receiving,
}

#[derive(Debug, Clone)]
struct ReqState {
    held: u64,
    generated: u32,
    alloc_blocks: u64,
    status: Status,
    scheduled_in: usize,
    /// Tokens taken from the prefix cache for the entry being built (0: none).
    cached_now: u64,
}

impl ReqState {
    const PENDING: ReqState = ReqState {
        held: 0,
        generated: 0,
        alloc_blocks: 0,
        status: Status::Pending,
        scheduled_in: usize::MAX,
        cached_now: 0,
    };
}

/// The state a policy reads and changes while it builds the next batch.
pub struct Simulator<'w> {
    // The whole workload, or (one replica of a cluster) the requests routed to it so far.
    reqs: Cow<'w, [Request]>,
    st: Vec<ReqState>,
    pending: Vec<u32>,
    next_pending: usize,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    limits: Limits,
    block: u64,
    total_blocks: u64,
    used_blocks: u64,
    actual_kv: u64,
    now: f64,
    batch_index: usize,
    // The batch under construction.
    entries: Vec<Entry>,
    features: BatchFeatures,
    batch_tokens: u64,
    batch_prefill_tokens: u64,
    generated_now: Vec<u32>,
    /// The block pool with prefix caching, for policies that use it.
    cache: Option<KvCache>,
    /// With prefix caching: blocks allocated to requests beyond those their KV fills (a
    /// reservation is counted against the free blocks, the pool holds only filled ones,
    /// as the replay's does).
    reserved_unfilled: u64,
    /// Per request, the prompt tokens whose KV it brings (empty: none brings any).
    transferred: Vec<u32>,
    /// Per request, seconds it keeps its KV after its last token (empty: none does).
    kv_hold_s: Vec<f64>,
    /// Per request, seconds its transferred KV takes to arrive once received (empty: the
    /// KV is not pulled: taken at the first admission).
    transfer_s: Vec<f64>,
    /// Per request that received its KV and has not run since, when the KV is there
    /// (NaN: none; infinite within the batch that receives it).
    receive_ready_s: Vec<f64>,
    /// Requests holding received KV, in the order received (vLLM's `kv_holding_waiting`).
    receiving: VecDeque<u32>,
    /// Requests receiving their KV in the batch under construction.
    received_now: Vec<u32>,
    /// On a pipeline of several stages, per request, the completion of the batch it
    /// waits for (empty: one stage): the one that generated its last token, or with
    /// [`Policy::holds_requests_in_flight`] the last one it was in.
    ready_s: Vec<f64>,
    /// On a pipeline, the most processing entries of one batch (a micro-batch's share of
    /// R_max, [`Policy::caps_micro_batches`]); `u64::MAX` otherwise.
    micro_batch_cap: u64,
}

/// A simulated cluster: where each request went and each replica's simulation.
#[derive(Debug, Clone)]
pub struct ClusterSimulation {
    /// The replica of each request (routed at its arrival).
    pub routing: infersched_core::Routing,
    /// Per replica, its simulation; schedules name requests by the workload's ids.
    pub replicas: Vec<Simulation>,
}

/// What one simulated batch left behind, for checking against the replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchAccount {
    /// KV occupied after the step (block-rounded, finishing requests included).
    pub kv_tokens: u64,
    /// Requests holding KV after the step.
    pub running: u64,
}

/// A finished simulation: the schedule and the simulator's own per-batch account.
#[derive(Debug, Clone)]
pub struct Simulation {
    /// The emitted schedule (with claimed start and end times per batch).
    pub schedule: Schedule,
    /// The simulator's KV and running count after each batch.
    pub accounts: Vec<BatchAccount>,
    /// The limits the policy ran under.
    pub limits: Limits,
}

/// A scheduling policy: decides the next batch by calling the simulator's primitives.
pub trait Policy {
    /// Name used in outputs.
    fn name(&self) -> String;
    /// Checks before simulating that every request can eventually be served.
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError>;
    /// Builds the next batch (may evict running requests). Adding no processing entry
    /// while work is waiting is a stall.
    fn next_batch(&mut self, sim: &mut Simulator<'_>);
    /// The prefix-caching rule of the policy's KV pool, if it caches prompt blocks (then
    /// the simulator keeps such a pool).
    fn prefix_cache(&self) -> Option<CacheRule> {
        None
    }
    /// Whether the policy runs on a pipeline of several stages, building a batch while
    /// others are in flight and skipping the requests [`Simulator::scheduled`] reports.
    fn pipelines(&self) -> bool {
        false
    }
    /// On a pipeline: whether every request of a batch in flight waits for it (Vidur's
    /// replica schedulers put a request back only at its batch's end), rather than only
    /// one whose next token is in flight (vLLM V1, whose prompt chunks may follow one
    /// another through the stages).
    fn holds_requests_in_flight(&self) -> bool {
        false
    }
    /// On a pipeline of `P` stages: whether a batch holds at most `R_max / P` requests
    /// (Vidur's Sarathi: `max_micro_batch_size = batch_size_cap // num_stages`).
    fn caps_micro_batches(&self) -> bool {
        false
    }
    /// Whether the policy runs on a pipeline as P virtual engines, each a copy of it over
    /// its own requests and `1 / P` of the KV (vLLM v0: `simulate_virtual_engines`), rather
    /// than as one scheduler.
    fn virtual_engines(&self) -> bool {
        false
    }
    /// Whether the policy admits requests that bring their prompt's KV (a disaggregated
    /// decode replica's), taking it through [`Simulator::cache_hit`] as vLLM's KV
    /// connectors do; a policy that does not would recompute the prompts, so it is refused.
    fn takes_transferred_kv(&self) -> bool {
        false
    }
}

impl<'w> Simulator<'w> {
    pub(crate) fn new(workload: &'w Workload, limits: Limits) -> Self {
        let mut sim = Self::empty(limits);
        sim.reqs = Cow::Borrowed(workload.requests());
        sim.st = vec![ReqState::PENDING; workload.len()];
        sim.pending = workload.fcfs_order();
        if workload.has_transferred() {
            sim.transferred = (0..workload.len())
                .map(|i| workload.transferred(i))
                .collect();
        }
        if workload.has_kv_hold() {
            sim.kv_hold_s = (0..workload.len()).map(|i| workload.kv_hold_s(i)).collect();
        }
        if workload.pulls_kv() {
            sim.transfer_s = (0..workload.len())
                .map(|i| workload.transfer_s(i))
                .collect();
        }
        sim.receive_ready_s = vec![f64::NAN; workload.len()];
        sim
    }

    /// A simulator with no requests yet (a cluster's replica before any routing).
    pub(crate) fn empty(limits: Limits) -> Self {
        let block = u64::from(limits.block_size);
        let total_blocks = limits.kv_capacity.map_or(u64::MAX / 4, |m| m / block);
        Self {
            reqs: Cow::Owned(Vec::new()),
            st: Vec::new(),
            pending: Vec::new(),
            next_pending: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            limits,
            block,
            total_blocks,
            used_blocks: 0,
            actual_kv: 0,
            now: 0.0,
            batch_index: 0,
            entries: Vec::new(),
            features: BatchFeatures::default(),
            batch_tokens: 0,
            batch_prefill_tokens: 0,
            generated_now: Vec::new(),
            cache: None,
            reserved_unfilled: 0,
            transferred: Vec::new(),
            kv_hold_s: Vec::new(),
            transfer_s: Vec::new(),
            receive_ready_s: Vec::new(),
            receiving: VecDeque::new(),
            received_now: Vec::new(),
            ready_s: Vec::new(),
            micro_batch_cap: u64::MAX,
        }
    }

    /// Turns on automatic prefix caching (semantics.md, "Prefix caching"): KV blocks kept
    /// in a pool that remembers what each full block holds, hits taken through
    /// [`Self::cache_hit`] and [`Self::take_cache_hit`].
    pub(crate) fn enable_prefix_cache(&mut self, rule: CacheRule, keys: BlockKeys) {
        let capacity = self.limits.kv_capacity.map(|_| self.total_blocks);
        self.cache = Some(KvCache::new(rule, keys, capacity, self.limits.block_size));
    }

    /// The rule of the prefix cache, if on.
    pub fn cache_rule(&self) -> Option<CacheRule> {
        self.cache.as_ref().map(KvCache::rule)
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.cache.is_some()
    }

    /// What request `i` (holding no KV) would take from the prefix cache now: the tokens
    /// of the longest run of its leading blocks in the cache, at most `K - 1` (the last
    /// known token is always computed), and how many of those blocks no request holds
    /// (taking them uses free blocks). `(0, 0)` without caching or while `i` holds KV.
    /// A request that brought its prompt's KV takes it at its first admission: at most
    /// `K - 1` tokens, all their blocks new.
    pub fn cache_hit(&self, i: u32) -> (u64, u64) {
        if let Some(tokens) = self.transferred_hit(i) {
            return (tokens, self.blocks_for(tokens));
        }
        match &self.cache {
            Some(cache) if self.held(i) == 0 => {
                let (blocks, free) = cache.hit(i, (self.known(i) - 1) / self.block);
                (blocks * self.block, free)
            }
            _ => (0, 0),
        }
    }

    /// The transferred KV request `i` takes if admitted now: at its first admission only,
    /// and only where it is pushed (where it is pulled, [`Self::to_receive`]).
    fn transferred_hit(&self, i: u32) -> Option<u64> {
        if self.pulls() {
            return None;
        }
        self.fresh_transferred(i)
    }

    /// The tokens of transferred KV request `i` brought and has not used: at most `K - 1`,
    /// while it has never been admitted.
    fn fresh_transferred(&self, i: u32) -> Option<u64> {
        let idx = i as usize;
        let brought = u64::from(*self.transferred.get(idx)?);
        let fresh = self.st[idx].held == 0 && self.st[idx].scheduled_in == usize::MAX;
        (fresh && brought > 0).then(|| brought.min(self.known(i) - 1))
    }

    /// Running request `i` (holding no KV) takes its first `tokens` tokens from the prefix
    /// cache (or from the KV it brought), as [`Self::cache_hit`] offered them; the next
    /// [`Self::process`] of `i` in this batch records them in its entry.
    pub fn take_cache_hit(&mut self, i: u32, tokens: u64) {
        let idx = i as usize;
        debug_assert_eq!(self.st[idx].held, 0);
        debug_assert_eq!(self.st[idx].status, Status::Running);
        if tokens == 0 {
            return;
        }
        if !self.transferred.is_empty() {
            debug_assert_eq!(self.transferred_hit(i), Some(tokens));
            let blocks = self.blocks_for(tokens);
            self.st[idx].held = tokens;
            self.st[idx].alloc_blocks = blocks;
            self.used_blocks += blocks;
            self.st[idx].cached_now = tokens;
            self.actual_kv += self.limits.occupied(tokens);
            return;
        }
        let cache = self
            .cache
            .as_mut()
            .expect("a cache hit with prefix caching on");
        let taken = cache.take_hit(i, tokens / self.block);
        assert!(taken, "a cache hit the cache no longer holds");
        self.st[idx].held = tokens;
        self.st[idx].alloc_blocks = tokens / self.block;
        self.used_blocks += tokens / self.block;
        self.st[idx].cached_now = tokens;
        self.actual_kv = cache.used_tokens();
    }

    /// Counts `tokens` taken from the prefix cache against this batch's token budgets as
    /// if processed (vLLM v0's budget counts a prompt's cached tokens too).
    pub fn charge_budget(&mut self, tokens: u64) {
        self.batch_tokens += tokens;
        self.batch_prefill_tokens += tokens;
    }

    // ---- reading the state ----

    /// The request `i`.
    pub fn request(&self, i: u32) -> &Request {
        &self.reqs[i as usize]
    }
    /// All requests.
    pub fn requests(&self) -> &[Request] {
        &self.reqs
    }
    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// Waiting queue, front first.
    pub fn waiting(&self) -> &VecDeque<u32> {
        &self.waiting
    }
    /// Running requests in admission order.
    pub fn running(&self) -> &[u32] {
        &self.running
    }
    /// Running requests in FCFS order (arrival, then id).
    pub fn running_fcfs(&self) -> Vec<u32> {
        let mut r = self.running.clone();
        r.sort_by(|&a, &b| self.fcfs_cmp(a, b));
        r
    }
    /// FCFS comparison: arrival time, then id.
    pub fn fcfs_cmp(&self, a: u32, b: u32) -> std::cmp::Ordering {
        self.reqs[a as usize]
            .arrival_s
            .total_cmp(&self.reqs[b as usize].arrival_s)
            .then(a.cmp(&b))
    }
    /// KV tokens request `i` holds.
    pub fn held(&self, i: u32) -> u64 {
        self.st[i as usize].held
    }
    /// Tokens generated so far by `i`.
    pub fn generated(&self, i: u32) -> u32 {
        self.st[i as usize].generated
    }
    /// Known tokens `K = I + G`.
    pub fn known(&self, i: u32) -> u64 {
        u64::from(self.reqs[i as usize].input_tokens) + u64::from(self.st[i as usize].generated)
    }
    /// Tokens left before the next token is generated: `K - m`.
    pub fn remaining(&self, i: u32) -> u64 {
        self.known(i) - self.held(i)
    }
    /// Whether `i`'s next step is a decode (`G >= 1` and `m = K - 1`).
    pub fn is_decode_ready(&self, i: u32) -> bool {
        self.generated(i) >= 1 && self.held(i) + 1 == self.known(i)
    }
    /// Whether `i` already has an entry in the batch under construction, or (on a
    /// pipeline) the batch that generated its last token is still in flight.
    pub fn scheduled(&self, i: u32) -> bool {
        self.st[i as usize].scheduled_in == self.batch_index
            || self.ready_s.get(i as usize).is_some_and(|&r| r > self.now)
    }
    /// Tokens of the batch under construction.
    pub fn batch_tokens(&self) -> u64 {
        self.batch_tokens
    }
    /// Token budget left in this batch (C minus tokens so far; none once a pipeline's
    /// micro-batch holds its most requests).
    pub fn token_room(&self) -> u64 {
        if self.features.n_prefill + self.features.n_decode >= self.micro_batch_cap {
            return 0;
        }
        self.limits
            .token_budget
            .map_or(u64::MAX, |c| c.saturating_sub(self.batch_tokens))
    }
    /// Prefill budget left in this batch (P minus prefill tokens so far).
    pub fn prefill_room(&self) -> u64 {
        self.limits
            .effective_prefill_budget()
            .map_or(u64::MAX, |p| p.saturating_sub(self.batch_prefill_tokens))
    }
    /// Whether another request may start holding KV (R_max).
    pub fn running_room(&self) -> bool {
        self.limits
            .max_running
            .is_none_or(|r| (self.running.len() as u64) < r)
    }
    /// Blocks needed for `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block)
    }
    /// Total KV blocks (M / block size).
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }
    /// Blocks not allocated to any request (with prefix caching, cached blocks no request
    /// holds count as free: they are reused when needed).
    pub fn free_blocks(&self) -> u64 {
        match &self.cache {
            Some(cache) => cache.free_blocks().min(self.total_blocks) - self.reserved_unfilled,
            None => self.total_blocks - self.used_blocks,
        }
    }
    /// Watermark in blocks (kept free at admission).
    pub fn watermark_blocks(&self) -> u64 {
        (self.limits.watermark * self.total_blocks as f64) as u64
    }
    /// Extra blocks `i` needs so that its allocation covers `target_tokens`.
    pub fn extra_blocks(&self, i: u32, target_tokens: u64) -> u64 {
        self.blocks_for(target_tokens)
            .saturating_sub(self.st[i as usize].alloc_blocks)
    }
    /// Tokens `i` can hold more within its allocated blocks and the free ones (what
    /// DeepSpeed-FastGen's `query` grants a sequence).
    pub fn token_capacity(&self, i: u32) -> u64 {
        (self.st[i as usize].alloc_blocks + self.free_blocks())
            .saturating_mul(self.block)
            .saturating_sub(self.held(i))
    }
    /// Requests that have arrived so far (moved into the waiting queue at their arrival,
    /// in arrival order, at its back).
    pub fn arrived_count(&self) -> usize {
        self.next_pending
    }
    /// Whether `i` is in the running set (holds KV).
    pub fn is_running(&self, i: u32) -> bool {
        self.st[i as usize].status == Status::Running
    }
    /// Whether transferred KV is pulled here: received by a receive entry
    /// ([`Self::receive_front`]), then moved (vLLM's NixlConnector).
    pub fn pulls(&self) -> bool {
        !self.transfer_s.is_empty()
    }
    /// Where KV is pulled: the tokens waiting request `i` would receive now (at its first
    /// admission only; at most `K - 1`).
    pub fn to_receive(&self, i: u32) -> Option<u64> {
        if !self.pulls() {
            return None;
        }
        self.fresh_transferred(i)
    }
    /// Requests holding received KV, in the order received (vLLM's `kv_holding_waiting`).
    pub fn receiving(&self) -> &VecDeque<u32> {
        &self.receiving
    }
    /// Whether receiving request `i`'s KV has arrived by now.
    pub fn received(&self, i: u32) -> bool {
        self.receive_ready_s
            .get(i as usize)
            .is_some_and(|&r| r <= self.now)
    }
    /// Seconds request `i` keeps its KV after its last token (0: none).
    pub fn kv_hold_s(&self, i: u32) -> f64 {
        self.kv_hold_s.get(i as usize).copied().unwrap_or(0.0)
    }
    /// Whether `i` has generated all its tokens.
    pub fn is_finished(&self, i: u32) -> bool {
        self.generated(i) >= self.request(i).output_tokens
    }
    /// Requests given to the simulator that have not arrived yet (or, in a cluster, that
    /// were routed here and are not yet in the waiting queue).
    pub fn pending_count(&self) -> usize {
        self.pending.len() - self.next_pending
    }
    /// Current simulated time.
    pub fn now(&self) -> f64 {
        self.now
    }

    // ---- changing the state ----

    /// Moves the front of the waiting queue into the running set.
    pub fn admit_front(&mut self) -> u32 {
        let i = self
            .waiting
            .pop_front()
            .expect("admit_front on an empty queue");
        self.st[i as usize].status = Status::Running;
        self.running.push(i);
        i
    }

    /// The front of the waiting queue receives `tokens` of the KV it brought (a receive
    /// entry), its blocks allocated for `alloc_tokens`: it leaves the queue for
    /// [`Self::receiving`], holding the KV (not running) until it has arrived, its
    /// transfer time after this batch starts. The caller has checked the blocks.
    pub fn receive_front(&mut self, tokens: u64, alloc_tokens: u64) -> u32 {
        let i = self
            .waiting
            .pop_front()
            .expect("receive_front on an empty queue");
        let idx = i as usize;
        debug_assert_eq!(self.to_receive(i), Some(tokens));
        let blocks = self.blocks_for(tokens.max(alloc_tokens));
        assert!(
            blocks <= self.free_blocks(),
            "policy over-allocated KV blocks"
        );
        self.st[idx].status = Status::Receiving;
        self.st[idx].held = tokens;
        self.st[idx].alloc_blocks = blocks;
        self.st[idx].scheduled_in = self.batch_index;
        self.used_blocks += blocks;
        self.actual_kv += self.limits.occupied(tokens);
        self.receive_ready_s[idx] = f64::INFINITY;
        self.receiving.push_back(i);
        self.received_now.push(i);
        self.entries.push(Entry::receive(i, tokens as u32));
        i
    }

    /// Receiving request `i`, whose KV has arrived, moves into the running set (its next
    /// [`Self::process`] computes what is left of its prompt).
    pub fn admit_received(&mut self, i: u32) {
        debug_assert!(self.received(i));
        self.receiving.retain(|&r| r != i);
        self.receive_ready_s[i as usize] = f64::NAN;
        self.st[i as usize].status = Status::Running;
        self.running.push(i);
    }

    /// Moves waiting request `i` (anywhere in the queue) into the running set.
    pub fn admit(&mut self, i: u32) {
        let pos = self
            .waiting
            .iter()
            .position(|&w| w == i)
            .expect("admit: the request is not waiting");
        self.waiting.remove(pos);
        self.st[i as usize].status = Status::Running;
        self.running.push(i);
    }

    /// Adds an entry processing `c` tokens of running request `i`, growing its allocation
    /// to cover `max(m + c, alloc_target_tokens)` tokens. The caller has checked budgets
    /// and memory ([`Self::extra_blocks`] <= [`Self::free_blocks`]).
    pub fn process(&mut self, i: u32, c: u64, alloc_target_tokens: u64) {
        let idx = i as usize;
        debug_assert!(c >= 1 && c <= self.remaining(i));
        debug_assert_eq!(self.st[idx].status, Status::Running);
        debug_assert!(!self.scheduled(i));
        let before = self.st[idx].held;
        let after = before + c;
        let extra = self.extra_blocks(i, after.max(alloc_target_tokens));
        assert!(
            extra <= self.free_blocks(),
            "policy over-allocated KV blocks"
        );
        self.st[idx].alloc_blocks += extra;
        self.used_blocks += extra;
        if let Some(cache) = &mut self.cache {
            let filled_before = cache.held(i).len() as u64;
            let grown = cache.grow(i, after);
            assert!(grown, "policy over-allocated KV blocks");
            let filled = cache.held(i).len() as u64;
            self.reserved_unfilled = self.reserved_unfilled + extra - (filled - filled_before);
        }
        // vLLM v0 runs a prompt that took cached blocks as a prompt, even when only its
        // last token is left.
        let as_prompt = self.st[idx].cached_now > 0 && self.cache_rule() == Some(CacheRule::VllmV0);
        if self.is_decode_ready(i) && !as_prompt {
            self.features.add_decode(after);
        } else {
            self.features.add_prefill(c, before);
            self.batch_prefill_tokens += c;
        }
        self.batch_tokens += c;
        self.actual_kv = match &self.cache {
            Some(cache) => cache.used_tokens(),
            None => self.actual_kv + self.limits.occupied(after) - self.limits.occupied(before),
        };
        self.st[idx].held = after;
        self.st[idx].scheduled_in = self.batch_index;
        if after == self.known(i) {
            self.st[idx].generated += 1;
            self.generated_now.push(i);
        }
        let cached = std::mem::take(&mut self.st[idx].cached_now) as u32;
        self.entries
            .push(Entry::cached_process(i, cached, c as u32));
    }

    /// Evicts running request `i` (recompute): drops its KV and allocation and puts it
    /// back at the front of the waiting queue (evictions of one step keep FCFS order).
    pub fn evict(&mut self, i: u32) {
        let idx = i as usize;
        debug_assert_eq!(self.st[idx].status, Status::Running);
        debug_assert!(!self.scheduled(i));
        self.used_blocks -= self.st[idx].alloc_blocks;
        self.actual_kv -= self.limits.occupied(self.st[idx].held);
        if let Some(cache) = &mut self.cache {
            self.reserved_unfilled -= self.st[idx].alloc_blocks - cache.held(i).len() as u64;
            cache.free(i, true);
            self.actual_kv = cache.used_tokens();
        }
        self.st[idx].alloc_blocks = 0;
        self.st[idx].held = 0;
        self.st[idx].status = Status::Waiting;
        self.st[idx].scheduled_in = self.batch_index;
        self.running.retain(|&r| r != i);
        // Insert at the front, after requests evicted earlier in this step that come first.
        let pos = self
            .waiting
            .iter()
            .take_while(|&&w| {
                self.st[w as usize].scheduled_in == self.batch_index && self.fcfs_cmp(w, i).is_lt()
            })
            .count();
        self.waiting.insert(pos, i);
        self.entries.push(Entry::evict(i));
    }

    fn admit_arrivals(&mut self) {
        while let Some(&i) = self.pending.get(self.next_pending) {
            if self.reqs[i as usize].arrival_s > self.now {
                break;
            }
            self.st[i as usize].status = Status::Waiting;
            self.waiting.push_back(i);
            self.next_pending += 1;
        }
    }

    fn describe(&self) -> String {
        let show = |v: &mut dyn Iterator<Item = u32>| {
            let v: Vec<String> = v
                .take(8)
                .map(|i| {
                    let r = &self.reqs[i as usize];
                    format!(
                        "{i}(I={},O={},m={},G={})",
                        r.input_tokens,
                        r.output_tokens,
                        self.held(i),
                        self.generated(i)
                    )
                })
                .collect();
            v.join(" ")
        };
        format!(
            "waiting {} [{}], running {} [{}], KV blocks used {} of {} (block size {})",
            self.waiting.len(),
            show(&mut self.waiting.iter().copied()),
            self.running.len(),
            show(&mut self.running.iter().copied()),
            self.used_blocks,
            self.total_blocks,
            self.block
        )
    }
}

/// Runs `policy` on a validated [`infersched_core::Instance`]: its workload, limits and
/// cost model.
pub fn simulate_instance<C: CostModel>(
    instance: &infersched_core::Instance<C>,
    policy: &mut dyn Policy,
) -> Result<Simulation, SimError> {
    simulate(
        instance.workload(),
        instance.limits(),
        policy,
        instance.cost(),
    )
}

/// Runs `policy` on `workload` under `limits` with batch times from `cost`.
pub fn simulate(
    workload: &Workload,
    limits: &Limits,
    policy: &mut dyn Policy,
    cost: &dyn CostModel,
) -> Result<Simulation, SimError> {
    simulate_pipelined(workload, limits, policy, cost, &Pipeline::none())
}

/// Runs `policy` on `workload` under `limits` on a replica of `pipeline.stages` pipeline
/// stages (the module's notes; [`infersched_core::replay_pipelined`] checks the schedule).
/// One stage is [`simulate`]; several are refused for a policy that does not
/// [`Policy::pipelines`].
pub fn simulate_pipelined(
    workload: &Workload,
    limits: &Limits,
    policy: &mut dyn Policy,
    cost: &dyn CostModel,
    pipeline: &Pipeline,
) -> Result<Simulation, SimError> {
    limits.validate()?;
    pipeline.validate()?;
    if pipeline.is_pipelined() && (!policy.pipelines() || policy.virtual_engines()) {
        return Err(SimError::NotPipelined {
            policy: policy.name(),
        });
    }
    let mut sim = Simulator::new(workload, *limits);
    if let Some(rule) = policy
        .prefix_cache()
        .filter(|_| !workload.has_transferred())
    {
        sim.enable_prefix_cache(rule, BlockKeys::new(workload, limits.block_size));
    }
    check_servable(workload, limits, policy, &sim)?;
    let base_tokens: u64 = workload.requests().iter().map(|r| r.max_kv_tokens()).sum();
    let mut run = Run::new(sim, base_tokens);
    run.set_pipeline(*pipeline, &*policy);
    while run.step(policy, cost)? != Step::Idle {}
    Ok(run.finish(policy))
}

/// Refuses, before anything runs, a request that no schedule of `policy` under `limits`
/// can serve.
pub(crate) fn check_servable(
    workload: &Workload,
    limits: &Limits,
    policy: &dyn Policy,
    sim: &Simulator<'_>,
) -> Result<(), SimError> {
    if workload.has_transferred() && !policy.takes_transferred_kv() {
        return Err(SimError::TransferredKv {
            policy: policy.name(),
        });
    }
    if let Err(e) = limits.check_feasible(workload) {
        let infersched_core::Infeasibility::KvTooSmall { request, .. } = &e;
        return Err(SimError::Unservable {
            policy: policy.name(),
            request: *request as u32,
            reason: e.to_string(),
        });
    }
    policy.check(sim)
}

/// What one [`Run::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Ran a batch (possibly of evictions only).
    Batch,
    /// Nothing was waiting or running: time moved to the next arrival.
    Waited,
    /// Every request given to the simulator has finished.
    Idle,
    /// Nothing can run until KV held for another replica is released
    /// ([`Run::release_at`]; a disaggregated prefill replica whose KV is pulled).
    Blocked,
}

/// A request finishing, or a finished request's KV freed, as a router looking back at an
/// earlier time sees it ([`Run::recent_frees`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Freed {
    /// When (a batch's completion, or a hold's end).
    pub(crate) at_s: f64,
    /// KV blocks freed then.
    pub(crate) blocks: u64,
    /// Whether a request finished then (else only its held KV was freed).
    pub(crate) request: bool,
}

/// What a request given to a replica ([`Run::add_request`]) brings besides itself.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Brings {
    /// Prompt tokens whose KV it brings (a disaggregated decode replica's request).
    pub(crate) transferred: u32,
    /// Seconds it keeps its KV after its last token (a prefill replica's, sending it;
    /// infinite: until [`Run::release_at`] says).
    pub(crate) kv_hold_s: f64,
    /// Where its KV is pulled, the seconds it takes to arrive once received.
    pub(crate) transfer_s: Option<f64>,
}

/// A simulation in progress: the simulator, the batches so far and the loop's guards.
pub(crate) struct Run<'w> {
    pub(crate) sim: Simulator<'w>,
    batches: Vec<Batch>,
    accounts: Vec<BatchAccount>,
    /// Sum of `I + O - 1` over the requests given so far (the livelock guard's scale).
    base_tokens: u64,
    processed_total: u64,
    pub(crate) finished: usize,
    idle_rounds: u32,
    /// What finished or freed KV since the last batch was built.
    pub(crate) recent_frees: Vec<Freed>,
    /// Requests finished (this run's ids) with their last batch's completion, for a
    /// driver to take ([`std::mem::take`]).
    pub(crate) completed: Vec<(u32, f64)>,
    /// Times batches through the replica's pipeline stages.
    clock: PipelineClock,
    /// On a pipeline: finished requests whose last batch is in flight, with its
    /// completion, in the order they finished.
    unreleased: Vec<(f64, u32)>,
    /// Finished requests keeping their KV (a hold, [`Simulator::kv_hold_s`]), with the
    /// time it is free, in the order they finished.
    held_kv: Vec<(f64, u32)>,
    /// The earliest time a request may still be given to this run (a cluster's next
    /// arrival): waiting for a batch in flight, held KV or received KV never moves time
    /// past it (infinite: no more requests come).
    horizon: f64,
    /// Waiting at a horizon no later than now (something outside may still change this run
    /// at or after now): the time of its own next event, when it is due again unless a
    /// request is given to it or a hold ends sooner (NaN: not parked).
    parked_until: f64,
    /// On a pipeline: every request of a batch waits for its completion.
    holds_in_flight: bool,
    /// One of vLLM v0's virtual engines: its batches are timed by the pipeline's clock,
    /// shared with the other engines (`virtual_engines.rs`).
    shared_clock: Option<std::rc::Rc<std::cell::RefCell<PipelineClock>>>,
}

impl<'w> Run<'w> {
    pub(crate) fn new(sim: Simulator<'w>, base_tokens: u64) -> Self {
        Self {
            sim,
            batches: Vec::new(),
            accounts: Vec::new(),
            base_tokens,
            processed_total: 0,
            finished: 0,
            idle_rounds: 0,
            recent_frees: Vec::new(),
            completed: Vec::new(),
            clock: PipelineClock::new(Pipeline::none()),
            unreleased: Vec::new(),
            held_kv: Vec::new(),
            horizon: f64::INFINITY,
            parked_until: f64::NAN,
            holds_in_flight: false,
            shared_clock: None,
        }
    }

    /// Times this run's batches on `clock`, shared with other runs (a virtual engine:
    /// its next batch is built when its last one completes).
    pub(crate) fn share_clock(&mut self, clock: std::rc::Rc<std::cell::RefCell<PipelineClock>>) {
        self.shared_clock = Some(clock);
    }

    /// When this run builds its next batch: now if a request is waiting or running (when
    /// parked, its next own event), at the next arrival given to it otherwise; None with
    /// nothing left.
    pub(crate) fn due_s(&self) -> Option<f64> {
        let sim = &self.sim;
        if !sim.waiting.is_empty() || !sim.running.is_empty() || !sim.receiving.is_empty() {
            return Some(if self.parked_until > sim.now {
                self.parked_until
            } else {
                sim.now
            });
        }
        let next = sim.pending.get(sim.next_pending)?;
        Some(sim.now.max(sim.reqs[*next as usize].arrival_s))
    }

    /// Requests given to this run and not finished at `t_s` (one freed at a batch's
    /// completion after `t_s` counts as unfinished).
    pub(crate) fn unfinished_at(&self, t_s: f64) -> usize {
        let late = self
            .recent_frees
            .iter()
            .filter(|f| f.request && f.at_s > t_s)
            .count();
        self.sim.reqs.len() - self.finished + late
    }

    /// Runs the replica on `pipeline` with `policy`'s rules for requests in flight and
    /// micro-batches (before any request is given).
    pub(crate) fn set_pipeline(&mut self, pipeline: Pipeline, policy: &dyn Policy) {
        if pipeline.is_pipelined() {
            self.sim.ready_s = vec![0.0; self.sim.reqs.len()];
            self.holds_in_flight = policy.holds_requests_in_flight();
            if policy.caps_micro_batches() {
                let r_max = self.sim.limits.max_running.unwrap_or(u64::MAX);
                self.sim.micro_batch_cap = (r_max / u64::from(pipeline.stages)).max(1);
            }
        }
        self.clock = PipelineClock::new(pipeline);
    }

    fn pipelined(&self) -> bool {
        self.clock.pipeline().is_pipelined()
    }

    /// Adds request `r` (a cluster's replica): it arrives at `r.arrival_s`, which is no
    /// earlier than any request added before. Returns its id in this simulation.
    pub(crate) fn add_request(&mut self, r: Request, chains: Vec<u32>, brings: Brings) -> u32 {
        let id = self.sim.reqs.len() as u32;
        if brings.transferred > 0 || !self.sim.transferred.is_empty() {
            self.sim.transferred.resize(id as usize, 0);
            self.sim.transferred.push(brings.transferred);
        }
        if brings.kv_hold_s > 0.0 || !self.sim.kv_hold_s.is_empty() {
            self.sim.kv_hold_s.resize(id as usize, 0.0);
            self.sim.kv_hold_s.push(brings.kv_hold_s);
        }
        if let Some(t) = brings.transfer_s {
            self.sim.transfer_s.resize(id as usize, 0.0);
            self.sim.transfer_s.push(t);
        }
        self.sim.receive_ready_s.push(f64::NAN);
        if let Some(cache) = &mut self.sim.cache {
            cache.push(r.input_tokens, chains);
        }
        self.sim.reqs.to_mut().push(r);
        self.sim.st.push(ReqState::PENDING);
        if self.pipelined() {
            self.sim.ready_s.push(0.0);
        }
        self.sim.pending.push(id);
        self.base_tokens += r.max_kv_tokens();
        self.parked_until = f64::NAN;
        id
    }

    /// One turn of the loop: admit arrivals, let the policy build a batch, run it.
    pub(crate) fn step(
        &mut self,
        policy: &mut dyn Policy,
        cost: &dyn CostModel,
    ) -> Result<Step, SimError> {
        self.release_due();
        self.parked_until = f64::NAN;
        let sim = &mut self.sim;
        sim.admit_arrivals();
        if sim.waiting.is_empty()
            && sim.running.is_empty()
            && sim.receiving.is_empty()
            && sim.next_pending == sim.pending.len()
        {
            return Ok(Step::Idle);
        }
        sim.entries.clear();
        sim.features = BatchFeatures::default();
        sim.batch_tokens = 0;
        sim.batch_prefill_tokens = 0;
        sim.generated_now.clear();
        policy.next_batch(sim);
        if sim.batch_tokens == 0 {
            if sim.entries.is_empty()
                && let Some(t) = self.next_in_flight_event()
            {
                // No further than the horizon: a request given there may run at once. At a
                // horizon no later than now, stay and be due again at `t` (or sooner, when
                // a request is given or a hold ends), letting the other side move first.
                if self.horizon > self.sim.now {
                    self.sim.now = t.min(self.horizon);
                } else {
                    self.parked_until = t;
                }
                self.release_due();
                return Ok(Step::Waited);
            }
            let sim = &mut self.sim;
            if sim.entries.is_empty() {
                // Idle only while nothing is waiting or running: wait for the next arrival.
                let next = sim.pending.get(sim.next_pending).copied();
                match next {
                    Some(i) if sim.waiting.is_empty() && sim.running.is_empty() => {
                        sim.now = sim.now.max(sim.reqs[i as usize].arrival_s);
                        return Ok(Step::Waited);
                    }
                    _ if self.held_kv.iter().any(|h| h.0.is_infinite()) => {
                        return Ok(Step::Blocked);
                    }
                    _ => {
                        return Err(self.stalled(
                            policy,
                            "the policy scheduled nothing while work was waiting",
                        ));
                    }
                }
            }
            // A batch of evictions only is a legal zero-time step, but not twice in a row (a
            // batch that receives KV is progress).
            self.idle_rounds += u32::from(self.sim.received_now.is_empty());
            if self.idle_rounds > 1 {
                return Err(self.stalled(policy, "two batches in a row evicted without processing"));
            }
        } else {
            self.idle_rounds = 0;
        }
        self.check_livelock(policy)?;
        self.run_batch(cost);
        Ok(Step::Batch)
    }

    fn stalled(&self, policy: &dyn Policy, note: &str) -> SimError {
        SimError::Stalled {
            policy: policy.name(),
            time_s: self.sim.now,
            batches: self.batches.len(),
            state: format!("{note}; {}", self.sim.describe()),
        }
    }

    fn check_livelock(&mut self, policy: &dyn Policy) -> Result<(), SimError> {
        self.processed_total += self.sim.batch_tokens;
        let token_cap = self.base_tokens.saturating_mul(64).saturating_add(1 << 20);
        if self.processed_total <= token_cap {
            return Ok(());
        }
        let note = format!(
            "recomputation livelock: {} tokens processed for {} needed",
            self.processed_total, self.base_tokens
        );
        Err(self.stalled(policy, &note))
    }

    /// Times the batch built, emits its tokens and frees the requests it finished (on a
    /// pipeline, when its last stage completes).
    fn run_batch(&mut self, cost: &dyn CostModel) {
        let time_s = cost.batch_time_s(&self.sim.features);
        let tokens = self.sim.features.tokens;
        let (start, end) = match &self.shared_clock {
            Some(clock) => {
                let mut clock = clock.borrow_mut();
                let start = self.sim.now.max(clock.earliest_start());
                (start, clock.run(start, time_s, tokens))
            }
            None => (self.sim.now, self.clock.run(self.sim.now, time_s, tokens)),
        };
        self.accounts.push(BatchAccount {
            kv_tokens: self.sim.actual_kv,
            running: self.sim.running.len() as u64,
        });
        for i in std::mem::take(&mut self.sim.received_now) {
            let idx = i as usize;
            self.sim.receive_ready_s[idx] = start + self.sim.transfer_s[idx];
        }
        self.recent_frees.clear();
        let pipelined = self.pipelined();
        if self.holds_in_flight {
            for e in &self.sim.entries {
                if matches!(e.action, infersched_core::Action::Process(_)) {
                    self.sim.ready_s[e.request as usize] = end;
                }
            }
        }
        for k in 0..self.sim.generated_now.len() {
            let i = self.sim.generated_now[k];
            let idx = i as usize;
            if pipelined {
                self.sim.ready_s[idx] = end;
            }
            if self.sim.st[idx].generated == self.sim.reqs[idx].output_tokens {
                if pipelined {
                    self.unreleased.push((end, i));
                } else {
                    self.complete(i, end);
                }
            }
        }
        self.batches.push(Batch {
            entries: std::mem::take(&mut self.sim.entries),
            start_s: Some(start),
            end_s: Some(end),
        });
        self.sim.batch_index += 1;
        if let Some(cache) = &mut self.sim.cache {
            cache.set_step(self.sim.batch_index as u64);
        }
        if pipelined {
            self.sim.now = self.clock.earliest_start();
            self.release_due();
        } else {
            self.sim.now = end;
        }
    }

    /// Request `i` finished in the batch completing at `end_s`: it leaves the running set
    /// and frees its KV and allocation, or keeps them for its hold.
    fn complete(&mut self, i: u32, end_s: f64) {
        let sim = &mut self.sim;
        sim.st[i as usize].status = Status::Finished;
        sim.running.retain(|&r| r != i);
        self.finished += 1;
        self.completed.push((i, end_s));
        let hold = sim.kv_hold_s(i);
        let blocks = if hold > 0.0 {
            self.held_kv.push((end_s + hold, i));
            0
        } else {
            self.release_kv(i)
        };
        self.recent_frees.push(Freed {
            at_s: end_s,
            blocks,
            request: true,
        });
    }

    /// Frees finished request `i`'s KV and allocation; returns the blocks freed.
    fn release_kv(&mut self, i: u32) -> u64 {
        let sim = &mut self.sim;
        let idx = i as usize;
        let blocks = sim.st[idx].alloc_blocks;
        sim.used_blocks -= blocks;
        sim.actual_kv -= sim.limits.occupied(sim.st[idx].held);
        if let Some(cache) = &mut sim.cache {
            sim.reserved_unfilled -= blocks - cache.held(i).len() as u64;
            cache.free(i, false);
            sim.actual_kv = cache.used_tokens();
        }
        sim.st[idx].alloc_blocks = 0;
        sim.st[idx].held = 0;
        blocks
    }

    /// Completes the finished requests whose last batch has completed by now (on a
    /// pipeline), then frees the KV whose hold is over, each in the order they finished
    /// (as the replay releases them).
    fn release_due(&mut self) {
        let now = self.sim.now;
        let mut unreleased = std::mem::take(&mut self.unreleased);
        unreleased.retain(|&(end_s, i)| {
            if end_s > now {
                return true;
            }
            self.complete(i, end_s);
            false
        });
        self.unreleased = unreleased;
        let mut held = std::mem::take(&mut self.held_kv);
        held.retain(|&(free_s, i)| {
            if free_s > now {
                return true;
            }
            let blocks = self.release_kv(i);
            self.recent_frees.push(Freed {
                at_s: free_s,
                blocks,
                request: false,
            });
            false
        });
        self.held_kv = held;
    }

    /// Sets the earliest time a request may still be given to this run (see `horizon`).
    pub(crate) fn set_horizon(&mut self, t_s: f64) {
        self.horizon = t_s;
    }

    /// Finished request `i` (this run's id), holding its KV until told, frees it at `t_s`
    /// (its decode replica has read it).
    pub(crate) fn release_at(&mut self, i: u32, t_s: f64) {
        if let Some(h) = self.held_kv.iter_mut().find(|h| h.1 == i) {
            h.0 = t_s;
        }
        self.parked_until = f64::NAN;
    }

    /// With a batch in flight (on a pipeline) or KV held: the next time something can
    /// change (a batch completes, a hold ends or a request arrives); `None` otherwise.
    fn next_in_flight_event(&self) -> Option<f64> {
        let sim = &self.sim;
        let completion = self.clock.next_completion_after(sim.now);
        let hold_end = self
            .held_kv
            .iter()
            .map(|h| h.0)
            .filter(|&t| t > sim.now && t.is_finite())
            .min_by(f64::total_cmp);
        let arrived_kv = sim
            .receiving
            .iter()
            .map(|&i| sim.receive_ready_s[i as usize])
            .filter(|&t| t > sim.now && t.is_finite())
            .min_by(f64::total_cmp);
        let event = completion
            .into_iter()
            .chain(hold_end)
            .chain(arrived_kv)
            .min_by(f64::total_cmp)?;
        let arrival = sim
            .pending
            .get(sim.next_pending)
            .map_or(f64::INFINITY, |&i| sim.reqs[i as usize].arrival_s);
        Some(event.min(arrival))
    }

    /// The last batch run, if any.
    pub(crate) fn last_batch(&self) -> Option<&Batch> {
        self.batches.last()
    }

    /// The finished simulation.
    pub(crate) fn finish(self, policy: &dyn Policy) -> Simulation {
        let mut schedule = Schedule::new(self.batches);
        schedule.meta = Some(serde_json::json!({"producer": policy.name()}));
        // vLLM V1's rule is what a schedule with hits follows by default.
        schedule.prefix_cache = self.sim.cache_rule().filter(|&r| r != CacheRule::VllmV1);
        Simulation {
            schedule,
            accounts: self.accounts,
            limits: self.sim.limits,
        }
    }
}
