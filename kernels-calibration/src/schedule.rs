//! A schedule's batches as the GPU runs them, in order, over one paged KV cache that
//! persists from batch to batch: a request's blocks come from a free queue as its KV grows
//! (as vLLM's block pool hands them out), stay where they are while it runs, and go back to
//! the queue when it is evicted or finishes. Each batch's attention rows carry those real
//! block tables, so a decode reads the keys and values earlier batches wrote.
//!
//! Everything here but [`time_schedule`] is plain data and is tested without a GPU.

use crate::gpu::{AttentionRows, BatchTiming, GpuError, LayerRunner, logical_rows};
use crate::kernels::BLOCK_SIZE;
use crate::plan::{Measurement, PlanLimits};
use infersched_core::replay::{EntryKind, classify_entries};
use infersched_core::{Schedule, Workload};
use std::collections::VecDeque;

/// One batch of a schedule as the GPU runs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchWork {
    /// Requests whose KV is dropped before the batch runs (evictions).
    pub evicted: Vec<u32>,
    /// `(request, c, m_before)` per prefill chunk, in the schedule's entry order.
    pub prefills: Vec<(u32, u32, u32)>,
    /// `(request, context after the step)` per decode, in the schedule's entry order.
    pub decodes: Vec<(u32, u32)>,
    /// Requests that emit their last token in this batch (their KV is freed after it).
    pub finished: Vec<u32>,
}

impl BatchWork {
    /// The batch as a composite measurement: the same batch features the replay computes.
    pub fn measurement(&self) -> Measurement {
        Measurement::Composite {
            prefills: self.prefills.iter().map(|&(_, c, m)| (c, m)).collect(),
            decodes: self.decodes.iter().map(|&(_, l)| l).collect(),
        }
    }

    fn sequences(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let prefills = self.prefills.iter().map(|&(r, c, m)| (r, m + c));
        prefills.chain(self.decodes.iter().copied())
    }
}

/// The batches of `schedule` for `workload`, which must be a schedule the replay accepts
/// (run [`infersched_core::replay::replay`] first).
pub fn batch_work(workload: &Workload, schedule: &Schedule) -> Vec<BatchWork> {
    let reqs = workload.requests();
    let mut held = vec![0u32; reqs.len()];
    let mut generated = vec![0u32; reqs.len()];
    let classified = classify_entries(workload, schedule);
    classified
        .into_iter()
        .map(|entries| {
            let mut w = BatchWork::default();
            for e in entries {
                let i = e.request as usize;
                // A prefix-cache hit starts the request's KV at the cached tokens (on the
                // GPU in blocks of its own: the attention reads as much KV either way).
                if e.cached > 0 && held[i] == 0 {
                    held[i] = e.cached;
                }
                match e.kind {
                    // Received KV (computed elsewhere) is just there, as a cache hit's is.
                    EntryKind::Receive => {}
                    EntryKind::Evict => {
                        held[i] = 0;
                        w.evicted.push(e.request);
                    }
                    EntryKind::Prefill => {
                        w.prefills.push((e.request, e.tokens, held[i]));
                        held[i] += e.tokens;
                    }
                    EntryKind::Decode => {
                        held[i] += e.tokens;
                        w.decodes.push((e.request, held[i]));
                    }
                }
                if e.generated_token {
                    generated[i] += 1;
                    if generated[i] == reqs[i].output_tokens {
                        w.finished.push(e.request);
                    }
                }
            }
            w
        })
        .collect()
}

fn blocks_for(tokens: u32) -> usize {
    (tokens as usize).div_ceil(BLOCK_SIZE)
}

/// Blocks held per request and in all, counted without a pool.
#[derive(Default)]
struct Held {
    blocks: Vec<usize>,
    total: usize,
}

impl Held {
    fn grow(&mut self, r: u32, len: u32) {
        let r = r as usize;
        if self.blocks.len() <= r {
            self.blocks.resize(r + 1, 0);
        }
        let b = blocks_for(len).max(self.blocks[r]);
        self.total += b - self.blocks[r];
        self.blocks[r] = b;
    }

    fn release(&mut self, r: u32) {
        if let Some(h) = self.blocks.get_mut(r as usize) {
            self.total -= *h;
            *h = 0;
        }
    }
}

/// The runner's bounds for these batches: the largest batch in tokens, the longest
/// context, and the KV blocks held at the peak (in tokens, of [`BLOCK_SIZE`]-token blocks).
pub fn limits_for(work: &[BatchWork]) -> PlanLimits {
    let mut held = Held::default();
    let (mut peak, mut max_tokens, mut max_context) = (0usize, 1u32, 1u32);
    for w in work {
        w.evicted.iter().for_each(|&r| held.release(r));
        for (r, len) in w.sequences() {
            held.grow(r, len);
            max_context = max_context.max(len);
        }
        peak = peak.max(held.total);
        max_tokens = max_tokens.max(w.measurement().tokens());
        w.finished.iter().for_each(|&r| held.release(r));
    }
    PlanLimits {
        max_tokens,
        max_context,
        max_kv_tokens: (peak * BLOCK_SIZE) as u64,
        composites: 0,
        seed: 0,
    }
}

/// A paged KV cache's block pool: free blocks in a queue (taken from the front, returned to
/// the back), and each request's block table.
#[derive(Debug, Clone)]
pub struct KvPager {
    free: VecDeque<i32>,
    tables: Vec<Vec<i32>>,
}

impl KvPager {
    /// A pool of `blocks` blocks, all free, numbered in order.
    pub fn new(blocks: usize) -> Self {
        Self {
            free: (0..blocks as i32).collect(),
            tables: Vec::new(),
        }
    }

    /// Blocks not held by any request.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    fn release(&mut self, r: u32) {
        if let Some(t) = self.tables.get_mut(r as usize) {
            self.free.extend(t.drain(..));
        }
    }

    fn grow(&mut self, r: u32, len: u32) -> Result<(), GpuError> {
        let r = r as usize;
        if self.tables.len() <= r {
            self.tables.resize(r + 1, Vec::new());
        }
        while self.tables[r].len() < blocks_for(len) {
            let b = self.free.pop_front().ok_or_else(|| {
                GpuError::Shape(format!(
                    "the KV cache ran out of blocks growing request {r} to {len} tokens"
                ))
            })?;
            self.tables[r].push(b);
        }
        Ok(())
    }

    /// The attention rows of `w` with its requests' real block tables: frees the evicted
    /// requests' blocks, grows every processed request's table to its new length, builds
    /// the rows, then frees the blocks of the requests that finish in `w`.
    pub fn rows(&mut self, w: &BatchWork) -> Result<AttentionRows, GpuError> {
        for &r in &w.evicted {
            self.release(r);
        }
        for (r, len) in w.sequences() {
            self.grow(r, len)?;
        }
        let chunks: Vec<(u32, u32)> = w.prefills.iter().map(|&(_, c, m)| (c, m)).collect();
        let decodes: Vec<u32> = w.decodes.iter().map(|&(_, l)| l).collect();
        let mut rows = logical_rows(&chunks, &decodes);
        let mut table = Vec::with_capacity(rows.block_table.len());
        for (r, len) in w.sequences() {
            table.extend_from_slice(&self.tables[r as usize][..blocks_for(len)]);
        }
        rows.block_table = table;
        for &r in &w.finished {
            self.release(r);
        }
        Ok(rows)
    }
}

/// How each batch starts on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// The GPU waits while the host enqueues the batch's layers, so the events time the
    /// GPU's work alone, as a CUDA graph replays it (vLLM's decode steps) or as a server
    /// whose host runs ahead of the GPU sees it. What calibration measures.
    Queued,
    /// The batch starts on an idle GPU as the host launches it, so a host slower than the
    /// GPU shows in the time (eager launches, one batch at a time).
    Idle,
}

/// The GPU's wait before a queued batch: twice the host's time to enqueue the previous
/// batch, at least this many milliseconds (5 before the first).
pub const MIN_AHEAD_MS: f64 = 0.5;

/// Runs every batch of `work` once, in order, `layers` layers each, over one KV cache
/// that persists from batch to batch, and returns each batch's times. The first `warmup`
/// batches are run once before, over a separate pool, to bring the clocks up.
/// `clock_mhz` (the GPU's peak SM clock) turns a [`Launch::Queued`] wait into clock
/// cycles. `observe(done, total)` hears progress.
pub fn time_schedule(
    runner: &mut LayerRunner,
    work: &[BatchWork],
    layers: usize,
    warmup: usize,
    launch: Launch,
    clock_mhz: u32,
    observe: &mut dyn FnMut(usize, usize),
) -> Result<Vec<BatchTiming>, GpuError> {
    let mut ahead_ms = 5.0;
    let mut run = |runner: &mut LayerRunner, pager: &mut KvPager, w: &BatchWork| {
        let ahead = if launch == Launch::Queued {
            ahead_ms
        } else {
            0.0
        };
        let cycles = (ahead * 1e3 * f64::from(clock_mhz)) as i64;
        let rows = pager.rows(w)?;
        let mut t = runner.time_batch(&w.measurement(), &rows, layers, cycles)?;
        t.ahead_ms = ahead;
        ahead_ms = (2.0 * t.issue_ms).max(MIN_AHEAD_MS);
        Ok::<_, GpuError>(t)
    };
    let mut pager = KvPager::new(runner.cache_blocks());
    for w in work.iter().take(warmup) {
        run(runner, &mut pager, w)?;
    }
    let mut pager = KvPager::new(runner.cache_blocks());
    let mut out = Vec::with_capacity(work.len());
    for (k, w) in work.iter().enumerate() {
        out.push(run(runner, &mut pager, w)?);
        observe(k + 1, work.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{Batch, Entry, Request};

    fn workload() -> Workload {
        let r = |input_tokens, output_tokens| Request {
            input_tokens,
            output_tokens,
            arrival_s: 0.0,
        };
        Workload::new(vec![r(40, 3), r(20, 1), r(10, 2)]).unwrap()
    }

    /// One millisecond per batch.
    struct PerBatch;
    impl infersched_core::CostModel for PerBatch {
        fn batch_time_s(&self, _: &infersched_core::BatchFeatures) -> f64 {
            1e-3
        }
    }

    fn schedule() -> Schedule {
        let p = Entry::process;
        Schedule::new(vec![
            // 0 and 1 prefill (1 finishes: O = 1), 2 prefills part of its prompt.
            Batch::new(vec![p(0, 40), p(1, 20), p(2, 4)]),
            // 0 decodes, 2 finishes its prompt (first token).
            Batch::new(vec![p(0, 1), p(2, 6)]),
            // 2 is evicted; 0 decodes and finishes.
            Batch::new(vec![Entry::evict(2), p(0, 1)]),
            // 2 refills its prompt and first token, which emits its second and last token.
            Batch::new(vec![p(2, 11)]),
        ])
    }

    #[test]
    fn a_cache_hit_starts_the_chunk_after_the_cached_tokens() {
        // Request 2 comes back for 8 of the 10 tokens its eviction dropped.
        let w = workload();
        let mut s = schedule();
        s.batches[3] = Batch::new(vec![Entry::cached_process(2, 8, 3)]);
        let work = batch_work(&w, &s);
        assert_eq!(work[3].prefills, vec![(2, 3, 8)]);
        let limits = infersched_core::Limits::default();
        let r = infersched_core::replay::replay(&w, &limits, &PerBatch, &s).unwrap();
        assert_eq!(r.requests[2].cached_tokens, 8);
        assert_eq!(r.batches[3].features, work[3].measurement().features());
    }

    #[test]
    fn batches_carry_each_request_state_and_match_the_replay_features() {
        let (w, s) = (workload(), schedule());
        let work = batch_work(&w, &s);
        assert_eq!(work[0].prefills, vec![(0, 40, 0), (1, 20, 0), (2, 4, 0)]);
        assert_eq!(work[0].finished, vec![1]);
        assert_eq!(work[1].decodes, vec![(0, 41)]);
        assert_eq!(work[1].prefills, vec![(2, 6, 4)]);
        assert_eq!(work[2].evicted, vec![2]);
        assert_eq!(work[2].finished, vec![0]);
        assert_eq!(work[3].prefills, vec![(2, 11, 0)]);
        assert_eq!(work[3].finished, vec![2]);
        assert_eq!(work.len(), 4);
        let limits = infersched_core::Limits::default();
        let r = infersched_core::replay::replay(&w, &limits, &PerBatch, &s).unwrap();
        for (b, w) in r.batches.iter().zip(&work) {
            assert_eq!(b.features, w.measurement().features(), "batch {}", b.index);
        }
    }

    #[test]
    fn the_pool_keeps_blocks_in_place_and_reuses_freed_ones() {
        let work = batch_work(&workload(), &schedule());
        let mut pager = KvPager::new(10);
        let r0 = pager.rows(&work[0]).unwrap();
        // 40 tokens: 3 blocks; 20: 2 blocks; 4: 1 block, handed out in order.
        assert_eq!(r0.block_table, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(r0.bt_start, vec![0, 3, 5]);
        // Request 1 finished: its blocks went to the back of the queue.
        assert_eq!(pager.free_blocks(), 10 - 4);
        let r1 = pager.rows(&work[1]).unwrap();
        // 2 grows to 10 tokens (block 5 kept), 0 to 42 tokens (3 blocks, 0..3 kept).
        assert_eq!(r1.block_table, vec![5, 0, 1, 2]);
        let r2 = pager.rows(&work[2]).unwrap();
        assert_eq!(r2.block_table, vec![0, 1, 2]);
        assert_eq!(pager.free_blocks(), 10, "0 finished and 2 was evicted");
        let r3 = pager.rows(&work[3]).unwrap();
        // The queue: 6..10 first, then 3, 4 (request 1's), ...
        assert_eq!(r3.block_table, vec![6]);
        assert!(r3.block_table.iter().all(|&b| b < 10));
    }

    #[test]
    fn limits_cover_the_peak_and_a_small_pool_is_an_error_not_a_panic() {
        let work = batch_work(&workload(), &schedule());
        let l = limits_for(&work);
        assert_eq!(l.max_tokens, 64);
        assert_eq!(l.max_context, 42);
        assert_eq!(l.max_kv_tokens, 6 * BLOCK_SIZE as u64);
        let mut pager = KvPager::new(5);
        let e = pager.rows(&work[0]).unwrap_err().to_string();
        assert!(e.contains("ran out of blocks"), "{e}");
    }
}
