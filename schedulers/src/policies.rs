//! The heuristic policies of `schedulers.md`.

use crate::sim::{Policy, SimError, Simulator};

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

impl std::str::FromStr for Victim {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "newest" => Ok(Victim::Newest),
            "oldest" => Ok(Victim::Oldest),
            "shortest" => Ok(Victim::Shortest),
            "longest" => Ok(Victim::Longest),
            _ => Err(format!(
                "unknown victim rule \"{s}\"; expected newest, oldest, shortest or longest"
            )),
        }
    }
}

/// Options shared by the policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyOptions {
    /// Admit only with a full `I + O - 1` reservation, so no preemption is ever needed.
    pub no_preemption: bool,
    /// Victim rule on a memory shortfall.
    pub victim: Victim,
    /// Tokens reserved per request by `orca-max`.
    pub max_model_len: u64,
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

/// Gives `c` tokens to running request `i`, preempting victims while its allocation
/// cannot grow. Returns whether anyone was preempted.
fn grow_or_preempt(sim: &mut Simulator<'_>, i: u32, c: u64, rule: Victim) -> bool {
    let mut preempted = false;
    loop {
        let target = sim.held(i) + c;
        if sim.extra_blocks(i, target) <= sim.free_blocks() {
            sim.process(i, c, target);
            return preempted;
        }
        let v = choose_victim(sim, i, rule);
        sim.evict(v);
        preempted = true;
        if v == i {
            return true;
        }
    }
}

/// Decode step for running requests in `order`: one token each (only decode-ready ones),
/// preempting on shortfall. Returns whether anyone was preempted.
fn decode_all(sim: &mut Simulator<'_>, order: &[u32], rule: Victim) -> bool {
    let mut preempted = false;
    for &i in order {
        if sim.token_room() == 0 {
            break;
        }
        if sim.scheduled(i) || !sim.running().contains(&i) || !sim.is_decode_ready(i) {
            continue;
        }
        preempted |= grow_or_preempt(sim, i, 1, rule);
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
        sim.process(i, c, r);
        admitted = true;
    }
    admitted
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
            decode_all(sim, &order, o.victim);
        }
    }
}

/// vLLM V1 engine: chunked prefill always on.
pub struct VllmV1(pub PolicyOptions);

impl Policy for VllmV1 {
    fn name(&self) -> String {
        "vllm-v1".into()
    }
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        let o = self.0;
        // Admission allocates the whole first chunk (as much of the prompt or refill as
        // C and P allow) above the watermark; alone on the GPU that must fit in M, or the
        // request would wait forever.
        let c = sim.limits().token_budget.unwrap_or(u64::MAX);
        let p = sim.limits().effective_prefill_budget().unwrap_or(u64::MAX);
        check_alone(sim, "vllm-v1", false, |i| {
            if o.no_preemption {
                max_kv(sim, i)
            } else {
                max_kv(sim, i).min(c).min(p)
            }
        })
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.0;
        let mut preempted = false;
        let order = sim.running().to_vec();
        for i in order {
            if sim.token_room() == 0 {
                break;
            }
            if sim.scheduled(i) || !sim.running().contains(&i) {
                continue;
            }
            let mut c = sim.remaining(i).min(sim.token_room());
            if !sim.is_decode_ready(i) {
                c = c.min(sim.prefill_room());
            }
            if c == 0 {
                continue;
            }
            preempted |= grow_or_preempt(sim, i, c, o.victim);
        }
        if !preempted {
            admit_fcfs(sim, chunked, |sim, i, c| {
                if o.no_preemption { max_kv(sim, i) } else { c }
            });
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
    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        // A refill after preemption reserves up to I + O - 1 tokens.
        check_alone(sim, "sarathi", false, |i| max_kv(sim, i))
    }
    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        let o = self.0;
        let order = sim.running_fcfs();
        decode_all(sim, &order, o.victim);
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
        if sim.running().is_empty() {
            admit_fcfs(sim, whole, max_kv_reserve);
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
}

fn max_kv_reserve(sim: &Simulator<'_>, i: u32, _c: u64) -> u64 {
    max_kv(sim, i)
}
