//! A schedule from the pooled search's optimal path (milp.md, "The pooled search"): the
//! path's batches followed request by request, so that where the pooled model prices the
//! path exactly, the replayed schedule meets the bound and is proven optimal.
//!
//! Each pooled batch's choices ([`Choices`]) are found again by walking the batches from
//! the path's vector to the next one (the cheapest batch between them, as the search
//! took). Requests of a class are identical, so the choices name counts, and each count
//! is taken from the front of the requests in that state:
//! - first prefills fill the class's prompts in order, the partial one first;
//! - decode-ready requests of generation count `G` decode or are evicted;
//! - evicted requests of `G` refill to decode-ready (`I + G - 1` tokens) or through a
//!   token (`I + G`), the earliest evicted first, in one batch.
//!
//! A batch's evictions go in a batch of their own just before it (it takes no time), so
//! that a request evicted by a pooled batch may be refilled in it. The pooled path
//! reaches TTFT's goal with requests still unfinished: [`complete`] finishes them (it
//! changes no first token). The schedule is what the path says, not a proof: a refill
//! takes all its tokens in its last batch (the pooled model holds only one or two of them
//! to C and P), KV is counted in blocks, and chunks pay their context; the caller replays
//! it and trusts only the replay.

use std::collections::VecDeque;

use infersched_core::{Batch, Entry, Schedule};

use super::{Model, Path, Step, batches};
use crate::Objective;

/// Where the requests of one class are, as ids in the order they are taken.
struct ClassState {
    /// Waiting for their first prefill, the partial one (holding `have` prompt tokens)
    /// first.
    waiting: VecDeque<u32>,
    have: u64,
    /// Per generation count `G` (index `G`, 1 .. O-1): decode-ready.
    ready: Vec<Vec<u32>>,
    /// Per generation count `G`: evicted, waiting to refill.
    evicted: Vec<Vec<u32>>,
}

/// The schedule that follows `path` (see the module doc), or None where its choices cannot
/// be found again or the completion cannot finish without an eviction the class forbids.
pub(super) fn path_schedule(
    model: &Model,
    members: &[Vec<usize>],
    path: &Path,
) -> Option<Schedule> {
    let mut states = start_states(model, members);
    let mut out = Vec::new();
    for (at, pair) in path.counts.windows(2).enumerate() {
        let choices = cheapest_choices(model, &pair[0], &pair[1])?;
        debug_assert!(path.cost[at + 1] >= path.cost[at]);
        follow(model, &mut states, &choices, &mut out)?;
    }
    if model.objective == Objective::MeanTtft {
        let left = states
            .iter()
            .zip(&model.classes)
            .flat_map(|(s, c)| {
                let ready = s.ready.iter().enumerate().flat_map(move |(g, ids)| {
                    ids.iter().map(move |&id| Left::new(id, c, g as u64, true))
                });
                let evicted = s.evicted.iter().enumerate().flat_map(move |(g, ids)| {
                    ids.iter().map(move |&id| Left::new(id, c, g as u64, false))
                });
                ready.chain(evicted)
            })
            .collect();
        complete(left, model, &mut out)?;
    }
    Some(Schedule::new(out))
}

/// Every request waiting for its first prefill, in id order per class.
fn start_states(model: &Model, members: &[Vec<usize>]) -> Vec<ClassState> {
    model
        .classes
        .iter()
        .zip(members)
        .map(|(c, m)| ClassState {
            waiting: m.iter().map(|&i| i as u32).collect(),
            have: 0,
            ready: vec![Vec::new(); c.output as usize],
            evicted: vec![Vec::new(); c.output as usize],
        })
        .collect()
}

/// The choices of the cheapest pooled batch from `from` to `to`.
fn cheapest_choices(model: &Model, from: &[u16], to: &[u16]) -> Option<Vec<[u64; 2]>> {
    let mut best: Option<(f64, Vec<[u64; 2]>)> = None;
    batches(model, from, None, &mut |next, ms, choices| {
        if next == to && best.as_ref().is_none_or(|(least, _)| ms < *least) {
            best = Some((ms, choices.to_vec()));
        }
        true
    });
    best.map(|(_, choices)| choices)
}

/// Appends the batch (and its eviction batch) that `choices` make from `states`, and
/// moves the requests it names.
fn follow(
    model: &Model,
    states: &mut [ClassState],
    choices: &[[u64; 2]],
    out: &mut Vec<Batch>,
) -> Option<()> {
    let mut batch = Moves::default();
    let mut slot = 0;
    for (k, c) in model.classes.iter().enumerate() {
        let s = &mut states[k];
        let output = c.output as usize;
        // Where requests are after the batch (those that stay are put back below).
        let (mut ready, mut evicted) = (vec![Vec::new(); output], vec![Vec::new(); output]);
        for step in [Step::First(k)]
            .into_iter()
            .chain((1..c.output).map(|g| Step::Ready(k, g)))
            .chain((c.output > 1).then_some(Step::Refill(k)))
        {
            match step {
                Step::First(_) => {
                    batch.first(s, c, choices[slot][0], &mut ready)?;
                    slot += 1;
                }
                Step::Ready(_, g) => {
                    let here = std::mem::take(&mut s.ready[g as usize]);
                    batch.decode_or_evict(
                        here,
                        g as usize,
                        choices[slot],
                        &mut ready,
                        &mut evicted,
                    )?;
                    slot += 1;
                }
                Step::Refill(_) => {
                    for g in 1..output {
                        let mut pool = std::mem::take(&mut s.evicted[g]);
                        pool.append(&mut evicted[g]);
                        batch.refill(
                            pool,
                            c.known(g as u32),
                            g,
                            choices[slot],
                            &mut ready,
                            &mut evicted,
                        )?;
                        slot += 1;
                    }
                }
            }
        }
        s.ready = ready;
        // A class without refills (O = 1) keeps nobody evicted.
        for (g, ids) in evicted.into_iter().enumerate() {
            s.evicted[g].extend(ids);
        }
    }
    batch.append_to(out)
}

/// The entries of the batch [`follow`] builds, and of the eviction batch before it.
#[derive(Default)]
struct Moves {
    evictions: Vec<Entry>,
    entries: Vec<Entry>,
}

/// Request `id`, now at generation `g`, joins the decode-ready of the batch's end (unless
/// it has finished: `g` is its output).
fn to_after(id: u32, g: usize, ready: &mut [Vec<u32>]) {
    if g < ready.len() {
        ready[g].push(id);
    }
}

impl Moves {
    /// `x` prompt tokens to the class's waiting requests, the partial one first; a prompt
    /// completed generates its first token.
    fn first(
        &mut self,
        s: &mut ClassState,
        c: &super::Class,
        mut x: u64,
        ready: &mut [Vec<u32>],
    ) -> Option<()> {
        while x > 0 {
            let &id = s.waiting.front()?;
            let take = x.min(c.input - s.have);
            self.entries
                .push(Entry::process(id, u32::try_from(take).ok()?));
            x -= take;
            s.have += take;
            if s.have == c.input {
                s.waiting.pop_front();
                s.have = 0;
                to_after(id, 1, ready);
            }
        }
        Some(())
    }

    /// Of the decode-ready at generation `g` (`here`), the first `decoded` decode, the next
    /// `out_now` are evicted (refilled after those evicted before), the rest stay.
    fn decode_or_evict(
        &mut self,
        here: Vec<u32>,
        g: usize,
        [decoded, out_now]: [u64; 2],
        ready: &mut [Vec<u32>],
        evicted: &mut [Vec<u32>],
    ) -> Option<()> {
        if (decoded + out_now) as usize > here.len() {
            return None;
        }
        let (decoded, out_now) = (decoded as usize, out_now as usize);
        for (j, &id) in here.iter().enumerate() {
            if j < decoded {
                self.entries.push(Entry::process(id, 1));
                to_after(id, g + 1, ready);
            } else if j < decoded + out_now {
                self.evictions.push(Entry::evict(id));
                evicted[g].push(id);
            } else {
                ready[g].push(id);
            }
        }
        Some(())
    }

    /// Of the evicted at generation `g` (`pool`, `known` tokens each), the first
    /// `to_ready` refill all but their last token, the next `through` refill it too and
    /// generate, the rest stay evicted.
    fn refill(
        &mut self,
        pool: Vec<u32>,
        known: u64,
        g: usize,
        [to_ready, through]: [u64; 2],
        ready: &mut [Vec<u32>],
        evicted: &mut [Vec<u32>],
    ) -> Option<()> {
        if (to_ready + through) as usize > pool.len() {
            return None;
        }
        let (to_ready, through) = (to_ready as usize, through as usize);
        for (j, &id) in pool.iter().enumerate() {
            if j < to_ready {
                self.entries
                    .push(Entry::process(id, u32::try_from(known - 1).ok()?));
                ready[g].push(id);
            } else if j < to_ready + through {
                self.entries
                    .push(Entry::process(id, u32::try_from(known).ok()?));
                to_after(id, g + 1, ready);
            } else {
                evicted[g].push(id);
            }
        }
        Some(())
    }

    /// Appends the eviction batch (if any) and the batch; None for an empty batch.
    fn append_to(mut self, out: &mut Vec<Batch>) -> Option<()> {
        if self.entries.is_empty() {
            return None;
        }
        self.evictions.sort_by_key(|e| e.request);
        self.entries.sort_by_key(|e| e.request);
        if !self.evictions.is_empty() {
            out.push(Batch::new(self.evictions));
        }
        out.push(Batch::new(self.entries));
        Some(())
    }
}

/// An unfinished request after TTFT's goal.
struct Left {
    id: u32,
    input: u64,
    output: u64,
    /// Tokens generated.
    generated: u64,
    /// Decode-ready (holding `I + G - 1` tokens of KV), or evicted (holding none).
    resident: bool,
}

impl Left {
    fn new(id: u32, c: &super::Class, generated: u64, resident: bool) -> Self {
        Self {
            id,
            input: c.input,
            output: u64::from(c.output),
            generated,
            resident,
        }
    }
    fn held(&self) -> u64 {
        if self.resident {
            self.input + self.generated - 1
        } else {
            0
        }
    }
    fn remaining(&self) -> u64 {
        self.output - self.generated
    }
}

/// Finishes `left` after the last first token (it changes no first token), greedily: each
/// batch decodes every resident request that fits, fewest tokens left first, and refills
/// whole (through their next token) the evicted requests that fit beside them (unless
/// no-mix keeps them apart) within C, P, M and R_max. Where nothing fits, a resident
/// request with the most left is evicted (None where evictions are not allowed), or with
/// none resident, the evicted request with the fewest left refills alone, in chunks within
/// C and P. Each request alone fits M (the solver checks `I + O - 1` first), so this ends.
fn complete(mut left: Vec<Left>, model: &Model, out: &mut Vec<Batch>) -> Option<()> {
    let limits = model.limits;
    let token_room = limits.token_budget.unwrap_or(u64::MAX);
    let prefill_room = limits.effective_prefill_budget().unwrap_or(u64::MAX);
    let chunk = token_room.min(prefill_room).max(1);
    let capacity = limits.kv_capacity.unwrap_or(u64::MAX);
    let max_running = limits.max_running.unwrap_or(u64::MAX);
    loop {
        left.retain(|l| l.generated < l.output);
        left.sort_by_key(|l| (l.remaining(), l.id));
        if left.is_empty() {
            return Some(());
        }
        let mut kv: u64 = left.iter().map(|l| limits.occupied(l.held())).sum();
        let mut holders = left.iter().filter(|l| l.resident).count() as u64;
        let (mut tokens, mut prefill) = (0u64, 0u64);
        let mut taken = Vec::new();
        for (j, l) in left.iter().enumerate() {
            let grown = kv - limits.occupied(l.held()) + limits.occupied(l.held() + 1);
            if l.resident && grown <= capacity && tokens < token_room {
                taken.push(j);
                kv = grown;
                tokens += 1;
            }
        }
        if !(model.no_mix && tokens > 0) {
            for (j, l) in left.iter().enumerate() {
                let t = l.input + l.generated;
                let grown = kv + limits.occupied(t);
                if !l.resident
                    && tokens + t <= token_room
                    && prefill + t <= prefill_room
                    && grown <= capacity
                    && holders < max_running
                {
                    taken.push(j);
                    kv = grown;
                    tokens += t;
                    prefill += t;
                    holders += 1;
                }
            }
        }
        if taken.is_empty() {
            if let Some(victim) = left.iter_mut().rev().find(|l| l.resident) {
                if !model.evictions {
                    return None;
                }
                victim.resident = false;
                out.push(Batch::new(vec![Entry::evict(victim.id)]));
                continue;
            }
            // Nobody resident and no whole refill fits one batch: the first refills alone,
            // in chunks, up to its last known token.
            let l = &mut left[0];
            let mut t = l.input + l.generated;
            while t > chunk {
                out.push(Batch::new(vec![Entry::process(
                    l.id,
                    u32::try_from(chunk).ok()?,
                )]));
                t -= chunk;
            }
            out.push(Batch::new(vec![Entry::process(
                l.id,
                u32::try_from(t).ok()?,
            )]));
            l.generated += 1;
            l.resident = true;
            continue;
        }
        let mut entries = Vec::new();
        for j in taken {
            let l = &mut left[j];
            let t = if l.resident { 1 } else { l.input + l.generated };
            entries.push(Entry::process(l.id, u32::try_from(t).ok()?));
            l.generated += 1;
            l.resident = true;
        }
        entries.sort_by_key(|e| e.request);
        out.push(Batch::new(entries));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyConstraints;
    use infersched_core::{Limits, Request, Workload, replay};

    #[test]
    fn choices_are_followed_request_by_request() {
        // Two requests with I = 4, O = 3. Choices per batch: first prefills' tokens,
        // decode-ready at G = 1 and 2 (decoded, evicted), refills from E_1 and E_2 (to
        // decode-ready, through a token).
        let w = Workload::new(vec![
            Request {
                input_tokens: 4,
                output_tokens: 3,
                arrival_s: 0.0,
            };
            2
        ])
        .unwrap();
        let limits = Limits::unlimited();
        let cost = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let class = PolicyConstraints::default();
        let (model, members) =
            Model::new(&w, &limits, &cost, Objective::Makespan, &class, true).unwrap();
        let to_ready = [
            [[8, 0], [0, 0], [0, 0], [0, 0], [0, 0]],
            // Request 0 decodes, 1 is evicted and refills its I + G - 1 = 4 tokens.
            [[0, 0], [1, 1], [0, 0], [1, 0], [0, 0]],
            [[0, 0], [1, 0], [1, 0], [0, 0], [0, 0]],
            [[0, 0], [0, 0], [1, 0], [0, 0], [0, 0]],
        ];
        let through = [
            // Prompts in chunks: 6 tokens fill request 0's prompt and half of 1's.
            [[6, 0], [0, 0], [0, 0], [0, 0], [0, 0]],
            [[2, 0], [1, 0], [0, 0], [0, 0], [0, 0]],
            // Request 1 is evicted and refills through a token: I + G = 5 tokens.
            [[0, 0], [0, 1], [0, 0], [0, 1], [0, 0]],
            [[0, 0], [0, 0], [2, 0], [0, 0], [0, 0]],
        ];
        for (path, expected) in [
            (
                &to_ready,
                &["0:4 1:4", "1:evict", "0:1 1:4", "0:1 1:1", "1:1"][..],
            ),
            (
                &through,
                &["0:4 1:2", "0:1 1:2", "1:evict", "1:5", "0:1 1:1"][..],
            ),
        ] {
            let mut states = start_states(&model, &members);
            let mut out = Vec::new();
            for choices in path {
                follow(&model, &mut states, choices, &mut out).unwrap();
            }
            let text: Vec<String> = out.iter().map(|b| b.to_string()).collect();
            assert_eq!(text, expected);
            // Every request finishes, exactly: the replay rejects steps past the last.
            replay(&w, &limits, &cost, &Schedule::new(out)).unwrap();
        }
        // A choice naming more requests than the state holds is refused.
        let mut states = start_states(&model, &members);
        let mut out = Vec::new();
        let too_many = [[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]];
        assert!(follow(&model, &mut states, &too_many, &mut out).is_none());
    }
}
