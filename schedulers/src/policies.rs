//! The heuristic policies of `schedulers.md`.

use crate::sim::{Policy, SimError, Simulator};
use infersched_core::CacheRule;

mod fastgen;
mod lightllm;
pub use fastgen::Fastgen;
pub use lightllm::Lightllm;

/// Which running request to preempt on a memory shortfall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Victim {
    /// The last-arrived (vLLM's LIFO).
    #[default]
    Newest,
    /// The first-arrived.
    Oldest,
    /// The one holding the least KV (cheapest to recompute); ties: newest.
    Shortest,
    /// The one holding the most KV (frees the most); ties: newest.
    Longest,
}

infersched_core::named_enum!(Victim, "victim rule", {
    Newest => "newest",
    Oldest => "oldest",
    Shortest => "shortest",
    Longest => "longest",
});

/// The order in which MC-SF admits waiting requests ("shortest first" by what).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum McsfOrder {
    /// Output length `O` (the paper's rule).
    #[default]
    Output,
    /// Tokens `I + O`.
    Tokens,
    /// KV-time area `O I + O (O - 1) / 2`: the KV tokens the request holds summed over its
    /// steps, the memory-time it takes from others.
    KvArea,
}

impl McsfOrder {
    /// The sort key of `r` (smaller first).
    pub fn key(self, r: &infersched_core::Request) -> u64 {
        let (i, o) = (u64::from(r.input_tokens), u64::from(r.output_tokens));
        match self {
            Self::Output => o,
            Self::Tokens => i + o,
            Self::KvArea => o * i + o * o.saturating_sub(1) / 2,
        }
    }
}

infersched_core::named_enum!(McsfOrder, "MC-SF order", {
    Output => "output",
    Tokens => "tokens",
    KvArea => "kv-area",
});

/// Options shared by the policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyOptions {
    /// Admit only with a full `I + O - 1` reservation, so no preemption is ever needed.
    pub no_preemption: bool,
    /// Victim rule on a memory shortfall.
    pub victim: Victim,
    /// Tokens reserved per request by `orca-max`.
    pub max_model_len: u64,
    /// MC-SF's admission order.
    pub mcsf_order: McsfOrder,
    /// vLLM V1's whole-sequence admission check (`scheduler_reserve_full_isl`).
    pub reserve_full_isl: bool,
    /// vLLM V1's per-request cap on tokens per step (0: off).
    pub long_prefill_token_threshold: u64,
    /// DeepSpeed-FastGen's `max_ragged_sequence_count`: most sequences per step.
    pub max_ragged_sequence_count: u64,
    /// LightLLM's (Vidur's) `max_waiting_iters`: decode batches in a row before waiting
    /// requests are tried again while others run.
    pub max_waiting_iters: u64,
    /// vLLM's automatic prefix caching (`--enable-prefix-caching`; vllm-v1 only).
    pub prefix_caching: bool,
}

/// The victim picker of `rule` ([`choose_victim`]).
fn by_rule(rule: Victim) -> impl Fn(&Simulator<'_>, u32) -> u32 {
    move |sim, needy| choose_victim(sim, needy, rule)
}

/// Picks the victim among running requests not yet scheduled in this step (the request
/// that needs room, `needy`, is one of them).
fn choose_victim(sim: &Simulator<'_>, needy: u32, rule: Victim) -> u32 {
    let candidates = sim
        .running()
        .iter()
        .copied()
        .filter(|&r| r == needy || !sim.scheduled(r));
    let newest_first = |a: &u32, b: &u32| sim.fcfs_cmp(*a, *b);
    let pick = match rule {
        Victim::Newest => candidates.max_by(newest_first),
        Victim::Oldest => candidates.min_by(newest_first),
        Victim::Shortest => {
            candidates.min_by(|a, b| sim.held(*a).cmp(&sim.held(*b)).then(newest_first(b, a)))
        }
        Victim::Longest => {
            candidates.max_by(|a, b| sim.held(*a).cmp(&sim.held(*b)).then(newest_first(a, b)))
        }
    };
    pick.unwrap_or(needy)
}

/// vLLM V1's victim under FCFS (`self.running[-1]`): the last request admitted to the
/// running set not yet scheduled in this step (or `needy` itself). It is the newest
/// arrival as long as requests are admitted in arrival order; a pulled request (a decode
/// replica's) joins the running set when its KV has arrived, which may be after a later
/// arrival's.
fn last_admitted_victim(sim: &Simulator<'_>, needy: u32) -> u32 {
    sim.running()
        .iter()
        .rev()
        .copied()
        .find(|&r| r == needy || !sim.scheduled(r))
        .unwrap_or(needy)
}

/// Gives `c` tokens to running request `i`, preempting victims while its allocation
/// cannot grow or fewer than `spare_blocks` blocks are free; the victim may be `i`
/// itself, as in vLLM v0 (checked against vLLM 0.6.3's scheduler), except when it is the
/// only running request and its growth fits: vLLM v0 would preempt it and then never
/// readmit it above the watermark. Returns whether anyone was preempted.
fn grow_or_preempt(
    sim: &mut Simulator<'_>,
    i: u32,
    c: u64,
    victim: impl Fn(&Simulator<'_>, u32) -> u32,
    spare_blocks: u64,
) -> bool {
    let mut preempted = false;
    loop {
        let target = sim.held(i) + c;
        let free = sim.free_blocks();
        let fits = sim.extra_blocks(i, target) <= free;
        if fits && free >= spare_blocks {
            sim.process(i, c, target);
            return preempted;
        }
        let v = victim(sim, i);
        if fits && v == i && sim.running().len() == 1 {
            sim.process(i, c, target);
            return preempted;
        }
        sim.evict(v);
        preempted = true;
        if v == i {
            return true;
        }
    }
}

/// vLLM v0's decode step for running requests in `order`: one token each (only
/// decode-ready ones). Before each decode vLLM v0's block manager requires a free block
/// for the sequence whether or not its last block is full (`BlockSpaceManagerV1.
/// can_append_slots`: free blocks >= the group's running sequences, one here), and
/// preempts the newest running request until there is one. With `--no-preemption` every
/// request holds its whole `I + O - 1` reservation, so only real growth is checked (none
/// is ever short). Returns whether anyone was preempted.
fn decode_all_v0(sim: &mut Simulator<'_>, order: &[u32], o: PolicyOptions) -> bool {
    let spare_block = u64::from(!o.no_preemption);
    let mut preempted = false;
    for &i in order {
        if sim.token_room() == 0 {
            break;
        }
        if sim.scheduled(i) || !sim.running().contains(&i) || !sim.is_decode_ready(i) {
            continue;
        }
        preempted |= grow_or_preempt(sim, i, 1, by_rule(o.victim), spare_block);
    }
    preempted
}

/// Admits waiting requests FCFS, head-of-line: each gets `chunk(sim, i)` tokens (0 stops)
/// and an allocation of `reserve(sim, i, c)` tokens, kept above the watermark.
fn admit_fcfs(
    sim: &mut Simulator<'_>,
    chunk: impl Fn(&Simulator<'_>, u32) -> u64,
    reserve: impl Fn(&Simulator<'_>, u32, u64) -> u64,
) -> bool {
    let mut admitted = false;
    let watermark = sim.watermark_blocks();
    while let Some(&i) = sim.waiting().front() {
        // A request evicted in this step cannot also process in it (and, at the front,
        // blocks admission until the next step).
        if !sim.running_room() || sim.scheduled(i) {
            break;
        }
        let c = chunk(sim, i);
        if c == 0 {
            break;
        }
        let r = reserve(sim, i, c).max(c);
        if sim.extra_blocks(i, r) + watermark > sim.free_blocks() {
            break;
        }
        sim.admit_front();
        let h = take_v0_hit(sim, i);
        sim.process(i, c - h, r);
        admitted = true;
    }
    admitted
}

/// With vLLM v0's prefix cache, admitted request `i` takes its leading blocks computed in
/// an earlier step (`computed_block_nums`, never its last block), which the token budget
/// still counts; returns the tokens taken (0 without that cache).
fn take_v0_hit(sim: &mut Simulator<'_>, i: u32) -> u64 {
    if sim.cache_rule() != Some(CacheRule::VllmV0) {
        return 0;
    }
    let (h, _) = sim.cache_hit(i);
    sim.take_cache_hit(i, h);
    sim.charge_budget(h);
    h
}

/// The whole remaining prompt (or refill) if it fits the budgets, else 0.
fn whole(sim: &Simulator<'_>, i: u32) -> u64 {
    let need = sim.remaining(i);
    if need <= sim.token_room() && need <= sim.prefill_room() {
        need
    } else {
        0
    }
}

/// As much of the remaining prompt as the budgets allow.
fn chunked(sim: &Simulator<'_>, i: u32) -> u64 {
    sim.remaining(i)
        .min(sim.token_room())
        .min(sim.prefill_room())
}

fn max_kv(sim: &Simulator<'_>, i: u32) -> u64 {
    sim.request(i).max_kv_tokens()
}

/// Checks that each request, alone on the GPU, can be admitted: its prompt (if it must
/// be processed whole) fits C and P, and `reserve` tokens plus the watermark fit in M.
fn check_alone(
    sim: &Simulator<'_>,
    policy: &str,
    whole_prompt: bool,
    reserve: impl Fn(u32) -> u64,
) -> Result<(), SimError> {
    let c = sim.limits().token_budget.unwrap_or(u64::MAX);
    let p = sim.limits().effective_prefill_budget().unwrap_or(u64::MAX);
    for i in 0..sim.requests().len() as u32 {
        let r = sim.request(i);
        let unservable = |reason: String| SimError::Unservable {
            policy: policy.to_owned(),
            request: i,
            reason,
        };
        let prompt = u64::from(r.input_tokens);
        if whole_prompt && prompt > c.min(p) {
            return Err(unservable(format!(
                "its prompt of {prompt} tokens must run in one batch but the token budget is C = {c} (P = {p}); {policy} does not chunk prompts"
            )));
        }
        let need = sim.blocks_for(reserve(i)) + sim.watermark_blocks();
        if need > sim.total_blocks() {
            return Err(unservable(format!(
                "admitting it needs {} KV blocks ({} tokens reserved + watermark) but M holds {} blocks",
                need,
                reserve(i),
                sim.total_blocks()
            )));
        }
    }
    Ok(())
}

/// vLLM v0 without chunked prefill (the InferMax "vLLM").
pub struct Vllm(pub PolicyOptions);

impl Policy for Vllm {
    fn name(&self) -> String {
        "vllm".into()
    }
    /// vLLM v0's automatic prefix caching (`--enable-prefix-caching`, off by default).
    fn prefix_cache(&self) -> Option<CacheRule> {
        self.0.prefix_caching.then_some(CacheRule::VllmV0)
    }
    /// vLLM v0 on a pipeline: P virtual engines (`crate::virtual_engines`).
    fn pipelines(&self) -> bool {
        true
    }
    fn virtual_engines(&self) -> bool {
        true
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        let o = self.0;
        // With preemption a refill of up to I + O - 1 tokens is admitted whole above the
        // watermark; alone on the GPU that must fit in M.
        check_alone(sim, "vllm", true, |i| max_kv(sim, i))?;
        if !o.no_preemption {
            // A preempted request refills up to I + O - 1 tokens in one batch.
            let c = sim.limits().token_budget.unwrap_or(u64::MAX);
            let p = sim.limits().effective_prefill_budget().unwrap_or(u64::MAX);
            if let Some(i) = (0..sim.requests().len() as u32).find(|&i| max_kv(sim, i) > c.min(p)) {
                return Err(SimError::Unservable {
                    policy: "vllm".into(),
                    request: i,
                    reason: format!(
                        "after a preemption its refill can reach I + O - 1 = {} tokens, which must run in one batch, but C = {c} (P = {p}); raise the budget or use --no-preemption",
                        max_kv(sim, i)
                    ),
                });
            }
        }
        Ok(())
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.0;
        let admitted = admit_fcfs(
            sim,
            whole,
            |sim, i, c| if o.no_preemption { max_kv(sim, i) } else { c },
        );
        if !admitted {
            let order = sim.running_fcfs();
            decode_all_v0(sim, &order, o);
        }
    }
}

/// vLLM V1 engine (vLLM 0.32's `vllm/v1/core/sched/scheduler.py`, FCFS, chunked prefill,
/// no prefix caching, synchronous scheduling): running requests first, in admission order,
/// each as many tokens as C and P allow (preempting the newest on a shortfall); then, if
/// nobody was preempted, waiting requests in FCFS order, head-of-line, through
/// [`admit_v1`].
pub struct VllmV1(pub PolicyOptions);

/// vLLM V1's watermark in blocks, `int(watermark * num_gpu_blocks)`, where vLLM's pool
/// holds one more block than the usable `M / block` (its null block).
fn v1_watermark_blocks(sim: &Simulator<'_>) -> u64 {
    (sim.limits().watermark * (sim.total_blocks() + 1) as f64) as u64
}

/// vLLM V1's admission of waiting requests (`KVCacheManager.allocate_slots` for a
/// WAITING or PREEMPTED request): the chunk (as much of the prompt or refill as C and P
/// allow) is allocated if its blocks plus the watermark fit the free blocks; with
/// `reserve_full_isl` the blocks of all known tokens `I + G` plus the watermark must fit
/// as well. A chunk is at most `per_request_cap` tokens (`long_prefill_token_threshold`).
/// The watermark applies only while some request is running
/// (`has_scheduled_reqs = bool(self.running)`). The first request refused stops admission
/// for this step.
///
/// With prefix caching (`KVCacheManager.get_computed_blocks`), the request first takes
/// the longest run of its leading blocks found in the cache (at most `K - 1` tokens); the
/// chunk starts after them, and the cached blocks no request holds count against the free
/// blocks in both checks (taking them removes them from the free queue).
fn admit_v1(sim: &mut Simulator<'_>, o: PolicyOptions, per_request_cap: u64) {
    admit_received_v1(sim, per_request_cap);
    let watermark = v1_watermark_blocks(sim);
    while let Some(&i) = sim.waiting().front() {
        if !sim.running_room() || sim.scheduled(i) {
            break;
        }
        if let Some(tokens) = sim.to_receive(i) {
            if sim.token_room() == 0 || !receive_v1(sim, i, tokens) {
                break;
            }
            continue;
        }
        let (hit, evictable) = sim.cache_hit(i);
        let c = (sim.remaining(i) - hit)
            .min(sim.token_room())
            .min(sim.prefill_room())
            .min(per_request_cap);
        if c == 0 {
            break;
        }
        let reserve = if o.no_preemption {
            max_kv(sim, i)
        } else {
            hit + c
        }
        .max(hit + c);
        let watermark = if sim.running().is_empty() {
            0
        } else {
            watermark
        };
        let free = sim.free_blocks();
        let need = |tokens: u64| sim.blocks_for(tokens) - sim.blocks_for(hit) + evictable;
        if o.reserve_full_isl && need(sim.known(i)) + watermark > free {
            break;
        }
        if need(reserve) + watermark > free {
            break;
        }
        sim.admit_front();
        sim.take_cache_hit(i, hit);
        sim.process(i, c, reserve);
    }
}

/// vLLM V1 with a KV connector that pulls (NixlConnector), for a waiting request whose
/// prompt's KV is still on its prefill replica: `allocate_slots` for the external tokens,
/// none to compute, the blocks of its whole prompt plus the watermark (while some request
/// runs) against the free blocks; the request then waits in `WAITING_FOR_REMOTE_KVS`
/// holding them. False where they do not fit (admission stops, as for any request).
fn receive_v1(sim: &mut Simulator<'_>, i: u32, tokens: u64) -> bool {
    let watermark = if sim.running().is_empty() {
        0
    } else {
        v1_watermark_blocks(sim)
    };
    let whole = sim.known(i);
    if sim.blocks_for(whole) + watermark > sim.free_blocks() {
        return false;
    }
    sim.receive_front(tokens, whole);
    true
}

/// vLLM V1's `kv_holding_waiting` queue, drained before the waiting one: each request whose
/// received KV has arrived (`_update_waiting_for_remote_kv`) runs what is left of its
/// prompt, the last token, in its allocated blocks; the others are skipped this step.
fn admit_received_v1(sim: &mut Simulator<'_>, per_request_cap: u64) {
    let holding: Vec<u32> = sim.receiving().iter().copied().collect();
    for i in holding {
        if !sim.running_room() || sim.token_room() == 0 {
            break;
        }
        if !sim.received(i) || sim.scheduled(i) {
            continue;
        }
        let c = sim
            .remaining(i)
            .min(sim.token_room())
            .min(sim.prefill_room())
            .min(per_request_cap);
        let target = sim.held(i) + c;
        if c == 0 || sim.extra_blocks(i, target) > sim.free_blocks() {
            break;
        }
        sim.admit_received(i);
        sim.process(i, c, target);
    }
}

impl Policy for VllmV1 {
    fn name(&self) -> String {
        "vllm-v1".into()
    }
    fn prefix_cache(&self) -> Option<CacheRule> {
        self.0.prefix_caching.then_some(CacheRule::VllmV1)
    }
    fn takes_transferred_kv(&self) -> bool {
        true
    }
    /// vLLM V1's engine core keeps up to `--pp` batches in flight (`step_with_batch_queue`)
    /// and its scheduler skips a running request with no new token to compute ("PP > 1
    /// and we have already scheduled all prompt tokens but they are not finished yet").
    fn pipelines(&self) -> bool {
        true
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        let o = self.0;
        // Alone on the GPU (no watermark then) a request must be admissible, or it would
        // wait forever: its first chunk, and with `reserve_full_isl` all its known tokens
        // (up to I + O - 1 on a refill after preemption), must fit in M.
        let c = sim.limits().token_budget.unwrap_or(u64::MAX);
        let p = sim.limits().effective_prefill_budget().unwrap_or(u64::MAX);
        for i in 0..sim.requests().len() as u32 {
            let reserve = if o.no_preemption || o.reserve_full_isl {
                max_kv(sim, i)
            } else {
                max_kv(sim, i).min(c).min(p)
            };
            let need = sim.blocks_for(reserve);
            if need > sim.total_blocks() {
                return Err(SimError::Unservable {
                    policy: "vllm-v1".into(),
                    request: i,
                    reason: format!(
                        "admitting it needs {need} KV blocks ({reserve} tokens) but M holds {} blocks",
                        sim.total_blocks()
                    ),
                });
            }
        }
        Ok(())
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.0;
        // `long_prefill_token_threshold` caps each request's tokens in this step, unless it
        // is the only request running or waiting (nobody to starve).
        let eligible = sim.running().len() + sim.waiting().len();
        let per_request_cap = if o.long_prefill_token_threshold > 0 && eligible > 1 {
            o.long_prefill_token_threshold
        } else {
            u64::MAX
        };
        let mut preempted = false;
        let order = sim.running().to_vec();
        for i in order {
            if sim.token_room() == 0 {
                break;
            }
            if sim.scheduled(i) || !sim.running().contains(&i) {
                continue;
            }
            let mut c = sim.remaining(i).min(sim.token_room()).min(per_request_cap);
            if !sim.is_decode_ready(i) {
                c = c.min(sim.prefill_room());
            }
            if c == 0 {
                continue;
            }
            preempted |= if o.victim == Victim::Newest {
                grow_or_preempt(sim, i, c, last_admitted_victim, 0)
            } else {
                grow_or_preempt(sim, i, c, by_rule(o.victim), 0)
            };
        }
        if !preempted {
            admit_v1(sim, o, per_request_cap);
        }
    }
}

/// Sarathi-Serve: decodes first, then ongoing partial prefills, then new requests, all
/// under one token budget; a request's whole prompt KV is reserved at admission.
pub struct Sarathi(pub PolicyOptions);

impl Policy for Sarathi {
    fn name(&self) -> String {
        "sarathi".into()
    }
    /// Sarathi-Serve on a pipeline as Vidur simulates it (`SarathiReplicaScheduler`):
    /// up to P micro-batches in flight, each request back in the running set only when
    /// its batch ends, at most `R_max / P` requests per micro-batch.
    fn pipelines(&self) -> bool {
        true
    }
    fn holds_requests_in_flight(&self) -> bool {
        true
    }
    fn caps_micro_batches(&self) -> bool {
        true
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        // A refill after preemption reserves up to I + O - 1 tokens.
        check_alone(sim, "sarathi", false, |i| max_kv(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.0;
        let order = sim.running_fcfs();
        decode_all_v0(sim, &order, o);
        for &i in &order {
            if sim.scheduled(i) || !sim.running().contains(&i) || sim.is_decode_ready(i) {
                continue;
            }
            let c = chunked(sim, i);
            if c == 0 {
                break;
            }
            let target = sim.held(i) + c;
            if sim.extra_blocks(i, target) <= sim.free_blocks() {
                sim.process(i, c, target);
            }
        }
        admit_fcfs(sim, chunked, |sim, i, _| {
            if o.no_preemption {
                max_kv(sim, i)
            } else {
                sim.known(i)
            }
        });
    }
}

/// Orca: iteration-level scheduling; whole prompts, mixed batches, a reservation per
/// request until it finishes, never preempts.
pub struct Orca {
    /// Options.
    pub options: PolicyOptions,
    /// Reserve `max_model_len` instead of `I + O - 1` (Vidur's Orca).
    pub reserve_max_model_len: bool,
}

impl Orca {
    fn reservation(&self, sim: &Simulator<'_>, i: u32) -> u64 {
        if self.reserve_max_model_len {
            self.options.max_model_len.max(max_kv(sim, i))
        } else {
            max_kv(sim, i)
        }
    }
}

impl Policy for Orca {
    fn name(&self) -> String {
        if self.reserve_max_model_len {
            "orca-max"
        } else {
            "orca"
        }
        .into()
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        check_alone(sim, &self.name(), true, |i| self.reservation(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        for i in sim.running_fcfs() {
            if sim.token_room() == 0 {
                break;
            }
            let target = sim.held(i) + 1;
            sim.process(i, 1, target);
        }
        admit_fcfs(sim, whole, |sim, i, _| self.reservation(sim, i));
    }
}

/// Static (request-level) batching: a batch of up to R_max requests runs until all of
/// them finish; only then are new requests admitted.
pub struct Static(pub PolicyOptions);

impl Policy for Static {
    fn name(&self) -> String {
        "static".into()
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        check_alone(sim, "static", true, |i| max_kv(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        request_level_batch(sim, max_kv_reserve);
    }
}

/// FasterTransformer as Vidur simulates it (`faster_transformer_replica_scheduler.py`):
/// request-level batching like [`Static`], each request reserving `max_model_len` tokens
/// (Vidur's `max_blocks_per_sequence`), at least its own `I + O - 1`.
pub struct FasterTransformer(pub PolicyOptions);

impl FasterTransformer {
    fn reservation(&self, sim: &Simulator<'_>, i: u32) -> u64 {
        self.0.max_model_len.max(max_kv(sim, i))
    }
}

impl Policy for FasterTransformer {
    fn name(&self) -> String {
        "fastertransformer".into()
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        check_alone(sim, "fastertransformer", true, |i| self.reservation(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        request_level_batch(sim, |sim, i, _| self.reservation(sim, i));
    }
}

/// Request-level batching: while requests run, each decodes one token per batch; once
/// none runs, waiting requests are admitted FCFS with their whole prompts and
/// `reserve(sim, i, prompt)` tokens each.
fn request_level_batch(sim: &mut Simulator<'_>, reserve: impl Fn(&Simulator<'_>, u32, u64) -> u64) {
    if sim.running().is_empty() {
        admit_fcfs(sim, whole, reserve);
    } else {
        for i in sim.running_fcfs() {
            if sim.token_room() == 0 {
                break;
            }
            let target = sim.held(i) + 1;
            sim.process(i, 1, target);
        }
    }
}

/// Memory-constrained shortest-first (MC-SF; Jaillet, Jiang, Mellou, Molinaro, Podimata and
/// Zhou 2025, arXiv 2502.07115), with the workload's true output lengths as its
/// predictions (the clairvoyant variant their hindsight comparison uses).
///
/// Each step every running request decodes one token; then arrived requests are taken
/// shortest first ([`McsfOrder`]: by default output length; ties: arrival order) and admitted with their whole prompt
/// while it fits the budgets and the running set's **future KV peak** fits M: a request
/// holding `h` tokens with `r` decode steps left holds `h + k` at step `k <= r` and frees
/// everything after step `r`, so the peak is checked at each request's last step (in whole
/// blocks, against M minus the watermark). The first request that does not fit stops
/// admission for this step. Admission also keeps the running set within C, so every
/// running request decodes every step and the peak computed is the one that happens:
/// MC-SF never preempts.
pub struct Mcsf {
    /// Options (the admission order among them).
    pub options: PolicyOptions,
    /// The waiting requests in admission order: (order key, arrival bits, id); kept in
    /// step with the simulator's queue so no step sorts the whole queue.
    queue: std::collections::BTreeSet<(u64, u64, u32)>,
}

impl Mcsf {
    /// MC-SF with `options`.
    pub fn new(options: PolicyOptions) -> Self {
        Self {
            options,
            queue: std::collections::BTreeSet::new(),
        }
    }

    fn queue_key(&self, sim: &Simulator<'_>, i: u32) -> (u64, u64, u32) {
        let r = sim.request(i);
        // Arrival times are finite and >= 0, so their bits sort as the times do (-0 as 0).
        let arrival = if r.arrival_s == 0.0 {
            0
        } else {
            r.arrival_s.to_bits()
        };
        (self.options.mcsf_order.key(r), arrival, i)
    }

    /// Brings `queue` in step with the simulator's waiting queue: arrivals join at its
    /// back; anything else (an eviction by the fallback) rebuilds it.
    fn sync_queue(&mut self, sim: &Simulator<'_>) {
        for &i in sim.waiting().iter().rev() {
            if !self.queue.insert(self.queue_key(sim, i)) {
                break;
            }
        }
        if self.queue.len() != sim.waiting().len() {
            self.queue = sim
                .waiting()
                .iter()
                .map(|&i| self.queue_key(sim, i))
                .collect();
        }
    }

    /// Whether `set` (tokens held after this step, decode steps left) stays within
    /// `blocks` KV blocks of `block` tokens at every future step, exactly.
    ///
    /// A request holding `h + k` tokens takes `ceil((h + k) / b) = q + floor(k / b) +
    /// [s + k mod b >= b]` blocks, with `h + b - 1 = q b + s`; the KV is checked at each last
    /// step `k = r` over the requests still alive (a prefix by decode steps left), with
    /// running sums of `q` and a Fenwick tree counting the `s` values: O(n log b).
    fn future_peak_fits(set: &mut [(u64, u64)], block: u64, blocks: u64) -> bool {
        if block > 1 << 16 {
            // Blocks this large are not real; the direct sum keeps the tree small.
            return Self::future_peak_fits_direct(set, block, blocks);
        }
        // By decode steps left, longest first: those alive at step k are a prefix.
        set.sort_unstable_by_key(|x| std::cmp::Reverse(x.1));
        let size = block as usize;
        let mut tree = vec![0u32; size + 1];
        let (mut q_sum, mut alive) = (0u128, 0u128);
        for idx in 0..set.len() {
            let (h, r) = set[idx];
            let x = u128::from(h) + u128::from(block) - 1;
            q_sum += x / u128::from(block);
            let s = (x % u128::from(block)) as usize;
            let mut pos = s + 1;
            while pos <= size {
                tree[pos] += 1;
                pos += pos & pos.wrapping_neg();
            }
            alive += 1;
            // Check at step r once every request with r' >= r is counted.
            if r > 0 && set.get(idx + 1).is_none_or(|next| next.1 < r) {
                // Count s >= b - (r mod b): all alive minus those with s < threshold.
                let threshold = (block - r % block) as usize;
                let (mut below, mut pos) = (0u128, threshold);
                while pos > 0 {
                    below += u128::from(tree[pos]);
                    pos &= pos - 1;
                }
                let used = q_sum + alive * u128::from(r / block) + (alive - below);
                if used > u128::from(blocks) {
                    return false;
                }
            }
        }
        true
    }
}

impl Mcsf {
    /// [`Self::future_peak_fits`] by the direct sum at every last step: O(n^2).
    fn future_peak_fits_direct(set: &[(u64, u64)], block: u64, blocks: u64) -> bool {
        set.iter().filter(|x| x.1 > 0).all(|&(_, k)| {
            let used: u128 = set
                .iter()
                .filter(|x| x.1 >= k)
                .map(|&(h, _)| u128::from((h + k).div_ceil(block)))
                .sum();
            used <= u128::from(blocks)
        })
    }
}

impl Policy for Mcsf {
    fn name(&self) -> String {
        "mcsf".into()
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        check_alone(sim, "mcsf", true, |i| max_kv(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.options;
        let running = sim.running_fcfs();
        for &i in &running {
            if sim.token_room() == 0 {
                break;
            }
            let c = sim.remaining(i);
            if c == 0 {
                continue;
            }
            // The peak check makes room for this growth; the fallback keeps the schedule
            // valid should it ever not.
            let target = sim.held(i) + c;
            if sim.extra_blocks(i, target) <= sim.free_blocks() {
                sim.process(i, c, target);
            } else {
                grow_or_preempt(sim, i, c, by_rule(o.victim), 0);
            }
        }
        self.sync_queue(sim);
        if self.queue.is_empty() {
            return;
        }
        let token_budget = sim.limits().token_budget.unwrap_or(u64::MAX);
        let capacity = sim.total_blocks().saturating_sub(sim.watermark_blocks());
        let block = u64::from(sim.limits().block_size.max(1));
        let left = |sim: &Simulator<'_>, j: u32| {
            u64::from(sim.request(j).output_tokens) - u64::from(sim.generated(j))
        };
        let mut set: Vec<(u64, u64)> = sim
            .running()
            .iter()
            .map(|&j| (sim.held(j), left(sim, j)))
            .collect();
        let mut admitted = Vec::new();
        for &(key, arrival, i) in &self.queue {
            if !sim.running_room() || sim.scheduled(i) || sim.running().len() as u64 >= token_budget
            {
                break;
            }
            let c = whole(sim, i);
            if c == 0 || sim.extra_blocks(i, c) > sim.free_blocks() {
                break;
            }
            let out = u64::from(sim.request(i).output_tokens);
            let mut with = set.clone();
            with.push((c, out - 1));
            if !Self::future_peak_fits(&mut with, block, capacity) {
                break;
            }
            set = with;
            sim.admit(i);
            sim.process(i, c, c);
            admitted.push((key, arrival, i));
        }
        for k in admitted {
            self.queue.remove(&k);
        }
    }
}

fn max_kv_reserve(sim: &Simulator<'_>, i: u32, _c: u64) -> u64 {
    max_kv(sim, i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn mcsf_future_peak_is_exact_in_blocks() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..3000 {
            let n = rng.random_range(0..8);
            let block = [1u64, 2, 3, 16][rng.random_range(0..4)];
            let set: Vec<(u64, u64)> = (0..n)
                .map(|_| (rng.random_range(1..60), rng.random_range(0..12)))
                .collect();
            let blocks = rng.random_range(1..40);
            let direct = Mcsf::future_peak_fits_direct(&set, block, blocks);
            let mut sorted = set.clone();
            assert_eq!(
                Mcsf::future_peak_fits(&mut sorted, block, blocks),
                direct,
                "{set:?} block {block} blocks {blocks}"
            );
        }
        // One request alone that exactly fills M at its last step fits.
        assert!(Mcsf::future_peak_fits(&mut [(15, 5)], 2, 10));
        assert!(!Mcsf::future_peak_fits(&mut [(15, 6)], 2, 10));
    }
}
