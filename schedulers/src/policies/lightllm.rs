//! LightLLM as Vidur simulates it (`schedulers.md`, "lightllm"; Vidur's
//! `vidur/scheduler/replica_scheduler/lightllm_replica_scheduler.py`): prefill-only and
//! decode-only batches, admission by an estimate of the running set's future KV peak
//! from the requests' **true output lengths** (clairvoyant, as in Vidur; LightLLM itself
//! estimates with each request's `max_new_tokens`).
//!
//! While nothing runs, a prefill batch admits waiting requests FCFS with whole prompts
//! while their tokens fit the budget C (`max_tokens_in_batch`), R_max
//! (`batch_size_cap`) and the estimate: each request, running or admitted, as
//! `(has_run, left)` = (KV it will have after its next token, tokens it will add after
//! that); sorted by `left`, largest first, the peak is `max_k (left_k k + has_run_1 +
//! ... + has_run_k)`, and it must stay below M. While requests run, every batch is a
//! decode of all of them, except that after `max_waiting_iters` decodes in a row a
//! prefill batch is tried first (and used when it admits anyone).

use crate::sim::{Policy, SimError, Simulator};

use super::{PolicyOptions, check_alone};

/// LightLLM's scheduler (Vidur's version).
pub struct Lightllm {
    options: PolicyOptions,
    /// Decode batches since the last prefill batch (Vidur's `_num_waiting_iters`).
    waiting_iters: u64,
}

impl Lightllm {
    /// The policy with `options` (its `max_waiting_iters`).
    pub fn new(options: PolicyOptions) -> Self {
        Self {
            options,
            waiting_iters: 0,
        }
    }
}

/// Whether the running set's future KV peak, estimated from `(has_run, left)` per
/// request, stays below `limit` tokens; each request's estimate rounded up by
/// `block - 1` tokens (its last block; Vidur supports blocks of 1 only).
fn peak_fits(est: &mut [(u64, u64)], limit: Option<u64>, block: u64) -> bool {
    let Some(limit) = limit else {
        return true;
    };
    est.sort_by_key(|e| std::cmp::Reverse(e.1));
    let mut has_run = 0u64;
    let mut need = 0u64;
    for (k, &(run, left)) in est.iter().enumerate() {
        has_run = has_run.saturating_add(run + block - 1);
        need = need.max(left.saturating_mul(k as u64 + 1).saturating_add(has_run));
    }
    need < limit
}

/// `(has_run, left)` of running request `i`: its KV after its next token, and the tokens
/// it adds after that (Vidur's `_get_tuple_tokens`).
fn running_estimate(sim: &Simulator<'_>, i: u32) -> (u64, u64) {
    let o = u64::from(sim.request(i).output_tokens);
    (
        sim.held(i) + 1,
        o.saturating_sub(u64::from(sim.generated(i)))
            .saturating_sub(1),
    )
}

/// A prefill batch: waiting requests FCFS with whole prompts while they fit C, P, R_max
/// and the peak estimate; returns whether anyone was admitted.
fn prefill_batch(sim: &mut Simulator<'_>) -> bool {
    let mut est: Vec<(u64, u64)> = sim
        .running()
        .iter()
        .map(|&i| running_estimate(sim, i))
        .collect();
    let block = u64::from(sim.limits().block_size.max(1));
    let mut admitted = false;
    while let Some(&i) = sim.waiting().front() {
        let r = sim.request(i);
        let prompt = u64::from(r.input_tokens);
        if prompt > sim.token_room() || prompt > sim.prefill_room() || !sim.running_room() {
            break;
        }
        est.push((prompt + 1, u64::from(r.output_tokens).saturating_sub(2)));
        // M in whole blocks (what the simulator allocates from).
        let m = sim.limits().kv_capacity.map(|_| sim.total_blocks() * block);
        if !peak_fits(&mut est, m, block) || sim.extra_blocks(i, prompt) > sim.free_blocks() {
            break;
        }
        sim.admit_front();
        sim.process(i, prompt, prompt);
        admitted = true;
    }
    admitted
}

impl Policy for Lightllm {
    fn name(&self) -> String {
        "lightllm".into()
    }

    fn check(&self, sim: &Simulator<'_>) -> Result<(), SimError> {
        // Alone, its estimate must stay below M: at least one token more than it.
        let block = u64::from(sim.limits().block_size.max(1));
        check_alone(sim, "lightllm", true, |i| {
            let r = sim.request(i);
            u64::from(r.input_tokens) + block + u64::from(r.output_tokens).saturating_sub(2) + 1
        })
    }

    fn next_batch(&mut self, sim: &mut Simulator<'_>) {
        if sim.running().is_empty() {
            if prefill_batch(sim) {
                self.waiting_iters = 0;
            }
            return;
        }
        if self.waiting_iters >= self.options.max_waiting_iters {
            self.waiting_iters = 0;
            if prefill_batch(sim) {
                return;
            }
        }
        self.waiting_iters += 1;
        for i in sim.running().to_vec() {
            let target = sim.held(i) + 1;
            if sim.token_room() == 0 || sim.extra_blocks(i, target) > sim.free_blocks() {
                break;
            }
            sim.process(i, 1, target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_largest_running_total_by_longest_left_first() {
        // (has_run, left): (10, 5), (20, 1), (4, 3) sorted by left: 5, 3, 1. Peaks:
        // 5 * 1 + 10 = 15; 3 * 2 + 14 = 20; 1 * 3 + 34 = 37. Below 38, not below 37.
        let est = [(10, 5), (20, 1), (4, 3)];
        assert!(peak_fits(&mut est.clone(), Some(38), 1));
        assert!(!peak_fits(&mut est.clone(), Some(37), 1));
        assert!(peak_fits(&mut est.clone(), None, 1));
        // Blocks of 4: each request up to 3 tokens more: 37 + 9 = 46.
        assert!(!peak_fits(&mut est.clone(), Some(46), 4));
        assert!(peak_fits(&mut est.clone(), Some(47), 4));
    }
}
