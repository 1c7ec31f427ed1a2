//! DeepSpeed-FastGen's Dynamic SplitFuse (`schedulers.md`, "fastgen"): DeepSpeed-MII's
//! `RaggedBatchBase.schedule_requests` (`mii/batching/ragged_batching.py`, microsoft/DeepSpeed-MII
//! main at commit 041a216) over
//! DeepSpeed's blocked KV cache (`deepspeed/inference/v2`, `engine_v2.query` and
//! `get_kv_requirements`).
//!
//! Every unfinished request sits in one buffer. Each step walks the requests whose next
//! input is one token (decodes) and then the others (prompts, and recomputations), each
//! group in buffer order, with one token budget and one block pool:
//! * at most `max_ragged_sequence_count` sequences per step, and tokens while the budget
//!   `max_ragged_batch_size` (C) lasts; when either is spent the walk stops;
//! * a prompt whose whole remainder does not fit the free blocks stops the walk (MII's
//!   deadlock guard);
//! * each request gets `min(its remaining input, the budget left)` tokens, cut to what its
//!   blocks and the free ones hold (a decode that cannot get its next block is skipped);
//! * a prompt cut by the budget runs that chunk and its remainder goes to the front of the
//!   buffer (only the last chunk gives a token); the others go to the back once they ran,
//!   after the requests that arrived meanwhile.
//!
//! When nothing can be scheduled while requests wait, MII resets: every request holding
//! KV is flushed and recomputed (prompt and generated tokens as a new prompt), in buffer
//! order; here that is one batch of evictions, and the next step schedules the rest.

use crate::sim::{Policy, SimError, Simulator};
use std::collections::VecDeque;

use super::{PolicyOptions, check_alone, max_kv};

/// DeepSpeed-FastGen's scheduler.
pub struct Fastgen {
    options: PolicyOptions,
    /// Most sequences per step (`max_ragged_sequence_count`).
    max_sequences: u64,
    /// Every unfinished request that has arrived, in MII's buffer order.
    buffer: VecDeque<u32>,
    /// Requests that had arrived at the last step.
    arrived: usize,
    /// Requests that ran whole in the last step (decodes and last chunks), in the order
    /// they were scheduled: they rejoin the buffer's back.
    ran: Vec<u32>,
}

impl Fastgen {
    /// The policy with `options` (at most `max_ragged_sequence_count` sequences per step).
    pub fn new(options: PolicyOptions) -> Self {
        Self {
            options,
            max_sequences: options.max_ragged_sequence_count.max(1),
            buffer: VecDeque::new(),
            arrived: 0,
            ran: Vec::new(),
        }
    }

    /// MII's `schedule_requests` start: drop the finished, append the arrivals, then the
    /// requests that ran last step.
    fn refresh_buffer(&mut self, sim: &Simulator<'_>) {
        self.buffer.retain(|&i| !sim.is_finished(i));
        // The arrivals since the last step are the waiting queue's last ones.
        let new = sim.arrived_count() - self.arrived;
        self.arrived = sim.arrived_count();
        let waiting = sim.waiting();
        self.buffer.extend(
            waiting
                .iter()
                .skip(waiting.len().saturating_sub(new))
                .copied(),
        );
        let ran = std::mem::take(&mut self.ran);
        self.buffer
            .extend(ran.into_iter().filter(|&i| !sim.is_finished(i)));
    }

    /// Tokens a request holding KV may reserve at admission: its whole `I + O - 1` with
    /// `--no-preemption` (so no reset is ever needed), else what it processes.
    fn target(&self, sim: &Simulator<'_>, i: u32, tokens: u64) -> u64 {
        let after = sim.held(i) + tokens;
        if self.options.no_preemption {
            after.max(max_kv(sim, i))
        } else {
            after
        }
    }

    /// MII's `_do_schedule_requests` over the buffer's decodes (requests whose next input
    /// is one token) or its other requests, in buffer order; returns the request whose
    /// prompt was cut by the budget (its remainder goes to the buffer's front), if any, and
    /// whether the walk stopped. A request keeps its group while the walks run: a decode
    /// stays one, and a prompt is walked once.
    fn schedule_group(
        &mut self,
        sim: &mut Simulator<'_>,
        decodes: bool,
        count: &mut u64,
    ) -> (Option<u32>, bool) {
        for k in 0..self.buffer.len() {
            let i = self.buffer[k];
            if (sim.remaining(i) == 1) != decodes || sim.scheduled(i) {
                continue;
            }
            if *count >= self.max_sequences {
                return (None, true);
            }
            let waiting = !sim.is_running(i);
            let budget = sim.token_room();
            if budget == 0 {
                return (None, true);
            }
            let remaining = sim.remaining(i);
            let tracked = !waiting || sim.running_room();
            if remaining > 1 {
                // The whole remainder (or reservation) must fit the free blocks.
                let whole = self.target(sim, i, remaining);
                if !tracked || sim.extra_blocks(i, whole) > sim.free_blocks() {
                    return (None, true);
                }
            }
            // A prompt's tokens (a one-token remainder of one too) also count against P.
            let room = if remaining > 1 || !sim.is_decode_ready(i) {
                budget.min(sim.prefill_room())
            } else {
                budget
            };
            let tokens = if tracked {
                remaining.min(room).min(sim.token_capacity(i))
            } else {
                0
            };
            let target = self.target(sim, i, tokens);
            // A one-token prompt's reservation (--no-preemption) may not fit: no room.
            if tokens == 0 || sim.extra_blocks(i, target) > sim.free_blocks() {
                continue;
            }
            if waiting {
                sim.admit(i);
            }
            sim.process(i, tokens, target);
            *count += 1;
            if tokens < remaining {
                return (Some(i), true);
            }
            self.ran.push(i);
        }
        (None, false)
    }

    /// MII's reset: flush every buffered request holding KV (it is recomputed later).
    fn reset(&mut self, sim: &mut Simulator<'_>) {
        for &i in &self.buffer {
            if sim.is_running(i) {
                sim.evict(i);
            }
        }
    }
}

impl Policy for Fastgen {
    fn name(&self) -> String {
        "fastgen".into()
    }

    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        // Alone, a request's prompt and every token it generates fit the blocks.
        check_alone(sim, "fastgen", false, |i| max_kv(sim, i))
    }

    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        self.refresh_buffer(sim);
        let mut count = 0;
        let (mut cut, stopped) = self.schedule_group(sim, true, &mut count);
        if !stopped {
            cut = self.schedule_group(sim, false, &mut count).0;
        }
        if count == 0 && !self.buffer.is_empty() {
            self.reset(sim);
            return;
        }
        self.buffer.retain(|&i| !sim.scheduled(i));
        if let Some(i) = cut {
            self.buffer.push_front(i);
        }
    }
}
