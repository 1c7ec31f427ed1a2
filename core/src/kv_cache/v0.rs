//! vLLM v0's KV block pool with automatic prefix caching (vLLM 0.6.3's
//! `SelfAttnBlockSpaceManager` over `PrefixCachingBlockAllocator` and `LRUEvictor`;
//! semantics.md, "Prefix caching", the vLLM v0 rule).
//!
//! It differs from vLLM V1's pool ([`super::PrefixCache`]) in four ways:
//! - **Sharing without a hit.** Every full block a request allocates is looked up by its
//!   key first and shared if some block holds it, even one another request filled in the
//!   same step (memory counts once); but only blocks filled in an *earlier* step are
//!   computed (a hit, [`V0Cache::hit`]): the others are computed again by each request.
//! - **LRU eviction.** A free cached block goes to the evictor with its last access (the
//!   step its last freeing request was last scheduled in); a new block is a never-cached
//!   free one if any, else the evictor's choice, made as vLLM 0.6.3's `LRUEvictor.evict`
//!   makes it: walking its blocks in the order they were freed, from the first, switching
//!   to a later block with more tokens (a deeper one) and stopping at the first block
//!   accessed after the one chosen so far.
//! - **Freeing order.** A request frees its blocks first block first (`BlockTable.free`).
//! - **Everything findable.** Every full block is indexed when filled, a request's own
//!   (generated tokens, unshared prompt) included.

use super::{BlockKeys, NO_KEY};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// A step before any (a block never accessed: vLLM's `_DEFAULT_LAST_ACCESSED_TIME`).
const NEVER: i64 = -1;

/// No place in the evictor.
const NOT_FREE: u64 = u64::MAX;

#[derive(Debug, Clone)]
struct Block {
    /// Its key's word, or [`NO_KEY`].
    key: u64,
    refs: u32,
    /// The step of its last access, as the evictor sees it.
    last: i64,
    /// Tokens from the start of the sequence to the end of this block (`num_hashed_tokens`).
    depth: u64,
    /// The step in which it was filled (computed from the next step on).
    filled_in: u64,
    /// Its place in the evictor ([`NOT_FREE`]: not there).
    place: u64,
}

/// vLLM v0's prefix-caching block pool and each request's blocks.
#[derive(Debug, Clone, Default)]
pub struct V0Cache {
    /// The block keys.
    pub keys: BlockKeys,
    /// Per request, its blocks in token order.
    pub held: Vec<Vec<u32>>,
    kv_block: u64,
    capacity: Option<u64>,
    blocks: Vec<Block>,
    /// Free blocks holding no key (freed uncached, or evicted and not reused).
    hashless: Vec<u32>,
    /// The block holding each key.
    cached: FxHashMap<u64, u32>,
    /// Free cached blocks by the order they were freed.
    evictor: BTreeMap<u64, u32>,
    /// The evictor's last walk, while the evictor has changed only by losing the block
    /// it chose: the blocks it switched to before that one, in order (see [`Self::evict`]).
    walk: Vec<(u64, u32)>,
    /// Where the last walk's choice was (the next walk resumes after it), if `walk` holds.
    resume: Option<u64>,
    next_place: u64,
    referenced: u64,
    /// Per request, how many of its leading blocks are full and registered (or shared).
    registered: Vec<usize>,
    /// Per request, the last step it was scheduled in.
    last_access: Vec<i64>,
    /// Per request, whether its blocks are being allocated whole in this step (each full
    /// block looked up before a block is allocated for it).
    allocating: Vec<bool>,
    step: u64,
}

impl V0Cache {
    /// A pool of `capacity` blocks (`None`: unlimited) of `kv_block` tokens for requests
    /// keyed by `keys`.
    pub fn new(keys: BlockKeys, capacity: Option<u64>, kv_block: u32) -> Self {
        let n = keys.inputs.len();
        Self {
            keys,
            held: vec![Vec::new(); n],
            kv_block: u64::from(kv_block.max(1)),
            capacity,
            registered: vec![0; n],
            last_access: vec![NEVER; n],
            allocating: vec![false; n],
            ..Self::default()
        }
    }

    /// Adds a request (a cluster's replica): see [`BlockKeys::push`].
    pub fn push(&mut self, input: u32, chains: Vec<u32>) {
        self.keys.push(input, chains);
        self.held.push(Vec::new());
        self.registered.push(0);
        self.last_access.push(NEVER);
        self.allocating.push(false);
    }

    /// Starts step `step` (a batch's index): blocks filled before it are computed.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Blocks no request references (cached or not).
    pub fn free_blocks(&self) -> u64 {
        self.capacity.map_or(u64::MAX / 4, |c| c - self.referenced)
    }

    /// Tokens of KV referenced by some request (each block counted once).
    pub fn used_tokens(&self) -> u64 {
        self.referenced * self.kv_block
    }

    /// The longest run of request `i`'s leading blocks computed in an earlier step and
    /// still cached, at most `max_blocks`: `(blocks, how many of them no request
    /// references)`.
    pub fn hit(&self, i: u32, max_blocks: u64) -> (u64, u64) {
        let (mut blocks, mut free) = (0u64, 0u64);
        for key in self.keys.keys_from(i, 0) {
            if blocks == max_blocks {
                break;
            }
            match self.cached.get(&key.word()) {
                Some(&id) if self.blocks[id as usize].filled_in < self.step => {
                    free += u64::from(self.blocks[id as usize].refs == 0);
                    blocks += 1;
                }
                _ => break,
            }
        }
        (blocks, free)
    }

    /// Request `i` (holding no blocks) takes its first `blocks` blocks from the cache;
    /// `false` (nothing taken) if they are not all there and computed.
    pub fn take_hit(&mut self, i: u32, blocks: u64) -> bool {
        debug_assert!(self.held[i as usize].is_empty());
        if self.hit(i, blocks).0 < blocks {
            return false;
        }
        let ids: Vec<u32> = self
            .keys
            .keys_from(i, 0)
            .take(blocks as usize)
            .map(|key| self.cached[&key.word()])
            .collect();
        for &id in &ids {
            self.touch(id);
        }
        let idx = i as usize;
        self.registered[idx] = ids.len();
        self.held[idx] = ids;
        self.allocating[idx] = true;
        self.last_access[idx] = self.step as i64;
        true
    }

    /// Grows request `i`'s blocks to hold `tokens` tokens as vLLM v0 does: a request
    /// holding nothing (or only this step's hit) allocates its sequence whole, each full
    /// block shared if its key is cached, else a new block registered under it; a running
    /// one first takes new blocks for its new tokens, then registers each block they fill
    /// (switching to a cached block with the same key, if one exists). `false` (with the
    /// blocks it got) when the pool runs out.
    pub fn grow(&mut self, i: u32, tokens: u64) -> bool {
        let idx = i as usize;
        self.last_access[idx] = self.step as i64;
        let allocating = std::mem::take(&mut self.allocating[idx]) || self.held[idx].is_empty();
        let full = (tokens / self.kv_block) as usize;
        let want = tokens.div_ceil(self.kv_block) as usize;
        if allocating {
            while self.held[idx].len() < full {
                let k = self.held[idx].len();
                let id = match self.shared(i, k) {
                    Some(id) => id,
                    None => match self.allocate() {
                        Some(id) => {
                            self.register(i, k, id);
                            id
                        }
                        None => return false,
                    },
                };
                self.held[idx].push(id);
                self.registered[idx] = k + 1;
            }
        }
        while self.held[idx].len() < want {
            match self.allocate() {
                Some(id) => self.held[idx].push(id),
                None => return false,
            }
        }
        for k in self.registered[idx]..full {
            self.promote(i, k);
        }
        self.registered[idx] = self.registered[idx].max(full);
        true
    }

    /// The cached block holding request `i`'s block `k`'s key, taken (one more reference).
    fn shared(&mut self, i: u32, k: usize) -> Option<u32> {
        let key = self.keys.key(i, k as u32).word();
        let id = *self.cached.get(&key)?;
        self.touch(id);
        Some(id)
    }

    /// Request `i`'s block `k`, now full, is registered under its key; if another block
    /// holds that key already, the request switches to it and frees its own.
    fn promote(&mut self, i: u32, k: usize) {
        let own = self.held[i as usize][k];
        let key = self.keys.key(i, k as u32).word();
        match self.cached.get(&key) {
            Some(&other) if other != own => {
                self.touch(other);
                self.held[i as usize][k] = other;
                self.release_one(own);
            }
            Some(_) => {}
            None => self.register(i, k, own),
        }
    }

    /// Block `id` now holds request `i`'s block `k`, filled in this step.
    fn register(&mut self, i: u32, k: usize, id: u32) {
        let key = self.keys.key(i, k as u32).word();
        let b = &mut self.blocks[id as usize];
        b.key = key;
        b.depth = (k as u64 + 1) * self.kv_block;
        b.filled_in = self.step;
        self.cached.insert(key, id);
    }

    /// One more reference to block `id`; a free one leaves the evictor.
    fn touch(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.refs += 1;
        if b.refs > 1 {
            return;
        }
        self.referenced += 1;
        b.last = NEVER;
        let place = std::mem::replace(&mut b.place, NOT_FREE);
        if place != NOT_FREE {
            self.evictor.remove(&place);
            self.forget(place);
        }
    }

    /// A new block: a free one holding no key, else a never-used one, else the evictor's
    /// choice (which leaves the cache). `None` when no block is free.
    fn allocate(&mut self) -> Option<u32> {
        let id = match self.hashless.pop() {
            Some(id) => id,
            None if self.capacity.is_none_or(|c| (self.blocks.len() as u64) < c) => {
                self.blocks.push(Block {
                    key: NO_KEY,
                    refs: 0,
                    last: NEVER,
                    depth: 0,
                    filled_in: 0,
                    place: NOT_FREE,
                });
                self.blocks.len() as u32 - 1
            }
            None => self.evict()?,
        };
        let b = &mut self.blocks[id as usize];
        b.refs = 1;
        b.last = NEVER;
        self.referenced += 1;
        Some(id)
    }

    /// The evictor lost the block at `place` (a hit took it): the kept walk stays as far
    /// as it went before that block. A block it passed without switching changed nothing,
    /// and a later one is walked again anyway; a choice it switched to is dropped with the
    /// choices after it, and the walk resumes after its place.
    fn forget(&mut self, place: u64) {
        if self.resume.is_none_or(|r| place > r) {
            return;
        }
        if let Ok(k) = self.walk.binary_search_by_key(&place, |&(p, _)| p) {
            self.walk.truncate(k);
            self.resume = Some(place);
        }
    }

    /// vLLM 0.6.3's `LRUEvictor.evict`: from the first block freed, take a later one with
    /// more tokens while no block accessed after the current choice comes between; the
    /// block chosen leaves the evictor and the cache.
    ///
    /// A walk's choices so far are kept: when the evictor has lost the block the last walk
    /// chose (blocks allocated one after another), the walk up to the choice before it is
    /// the same, and resumes where that block was with that choice (the blocks between
    /// neither stopped nor switched it, and the choice before accepts no fewer of them).
    /// A block freed since joined the end, which the resumed walk reaches anyway; a block
    /// a hit took is handled by [`Self::forget`].
    fn evict(&mut self) -> Option<u32> {
        let from = match self.resume {
            Some(place) if !self.walk.is_empty() => place + 1,
            _ => {
                self.walk.clear();
                let (&place, &id) = self.evictor.first_key_value()?;
                self.walk.push((place, id));
                place + 1
            }
        };
        let (_, mut chosen) = *self.walk.last().expect("a walk has a choice");
        for (&place, &id) in self.evictor.range(from..) {
            let (b, c) = (&self.blocks[id as usize], &self.blocks[chosen as usize]);
            if c.last < b.last {
                break;
            }
            if c.depth < b.depth {
                self.walk.push((place, id));
                chosen = id;
            }
        }
        let (place, id) = self.walk.pop().expect("a walk has a choice");
        self.evictor.remove(&place);
        self.resume = Some(place);
        let b = &mut self.blocks[id as usize];
        b.place = NOT_FREE;
        let key = std::mem::replace(&mut b.key, NO_KEY);
        self.cached.remove(&key);
        Some(id)
    }

    /// Drops one reference to block `id`; a block no longer referenced goes to the evictor
    /// (cached) or back to the free blocks without a key.
    fn release_one(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.refs -= 1;
        if b.refs > 0 {
            return;
        }
        self.referenced -= 1;
        if b.key == NO_KEY {
            self.hashless.push(id);
        } else {
            b.place = self.next_place;
            self.evictor.insert(self.next_place, id);
            self.next_place += 1;
        }
    }

    /// Frees all of request `i`'s blocks, first block first, each marked accessed at the
    /// request's last step (`BlockSpaceManager.free`).
    pub fn free(&mut self, i: u32) {
        let idx = i as usize;
        let blocks = std::mem::take(&mut self.held[idx]);
        let last = self.last_access[idx];
        for &id in &blocks {
            self.blocks[id as usize].last = last;
        }
        for &id in &blocks {
            self.release_one(id);
        }
        self.registered[idx] = 0;
        self.allocating[idx] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prompts of `inputs` tokens, 4 generated each, ids in blocks of 8 tokens; KV blocks
    /// of 4.
    fn keys(inputs: &[u32], ids: Vec<Vec<u64>>) -> BlockKeys {
        BlockKeys::new(&crate::kv_cache::tests::workload(inputs, Some((8, ids))), 4)
    }

    #[test]
    fn two_prompts_of_one_step_share_blocks_but_neither_hits() {
        // Requests 0 and 1 share their first id block (2 KV blocks of 4 tokens).
        let mut cache = V0Cache::new(keys(&[12, 12], vec![vec![1, 2], vec![1, 3]]), Some(8), 4);
        cache.set_step(0);
        assert_eq!(cache.hit(0, 2), (0, 0));
        assert!(cache.grow(0, 12));
        // Filled in this step: shared, not computed.
        assert_eq!(cache.hit(1, 2), (0, 0));
        assert!(cache.grow(1, 12));
        assert_eq!(cache.used_tokens(), 16); // 2 shared + 1 own each
        assert_eq!(cache.held[0][..2], cache.held[1][..2]);
        cache.set_step(1);
        // From the next step a third look finds them computed.
        assert_eq!(cache.hit(0, 2), (2, 0));
    }

    #[test]
    fn the_evictor_takes_the_least_recently_accessed_deepest_block() {
        // Request 0 runs in step 0 and request 1 in step 1, both freed after it: request
        // 0's blocks (accessed in step 0) go first, its deepest first.
        let mut cache = V0Cache::new(keys(&[8, 8], vec![vec![1], vec![2]]), Some(4), 4);
        cache.set_step(0);
        assert!(cache.grow(0, 8));
        cache.set_step(1);
        assert!(cache.grow(1, 8));
        cache.free(0);
        cache.free(1);
        assert_eq!(cache.evictor.len(), 4);
        assert_eq!(cache.evict(), Some(1));
        assert_eq!(cache.evict(), Some(0));
        cache.set_step(2);
        assert_eq!(cache.hit(1, 2), (2, 2));
        assert_eq!(cache.hit(0, 2), (0, 0));
    }

    #[test]
    fn the_evictor_walks_as_vllm_0_6_3_does() {
        // Freed in this order: a (step 1, 4 tokens), b1 (step 2, 4), b2 (step 2, 8), then
        // c1..c3 (step 0, 4, 8, 12). The walk stops at b1, accessed after a: a goes, though
        // the c blocks are older. Then from b1 it takes b2 (deeper), and c3, deeper still
        // and not accessed after b2.
        let mut cache = V0Cache::new(
            keys(&[4, 8, 12], vec![vec![1], vec![2], vec![3, 4]]),
            None,
            4,
        );
        cache.set_step(0);
        for (i, tokens) in [(0u32, 4u64), (1, 8), (2, 12)] {
            assert!(cache.grow(i, tokens));
        }
        cache.last_access = vec![1, 2, 0];
        for i in 0..3 {
            cache.free(i);
        }
        assert_eq!(cache.evict(), Some(0));
        assert_eq!(cache.evict(), Some(5));
        assert_eq!(cache.evict(), Some(2));
    }

    #[test]
    fn a_request_frees_its_blocks_first_block_first_at_its_last_step() {
        let mut cache = V0Cache::new(keys(&[12], vec![vec![1, 2]]), Some(4), 4);
        cache.set_step(3);
        assert!(cache.grow(0, 12));
        cache.set_step(5);
        assert!(cache.grow(0, 13)); // a decode: one more block, the third filled
        assert_eq!(cache.held[0].len(), 4);
        cache.free(0);
        let order: Vec<u32> = cache.evictor.values().copied().collect();
        assert_eq!(order, [0, 1, 2]);
        assert!(cache.blocks[..3].iter().all(|b| b.last == 5));
        // The partial block went back without a key.
        assert_eq!(cache.hashless, [3]);
    }

    /// vLLM's walk over the whole evictor, from the first block freed.
    fn naive_choice(cache: &V0Cache) -> Option<u32> {
        let mut chosen: Option<u32> = None;
        for &id in cache.evictor.values() {
            let b = &cache.blocks[id as usize];
            match chosen {
                None => chosen = Some(id),
                Some(c) if cache.blocks[c as usize].last < b.last => break,
                Some(c) if cache.blocks[c as usize].depth < b.depth => chosen = Some(id),
                Some(_) => {}
            }
        }
        chosen
    }

    proptest::proptest! {
        /// The resumed walk chooses what vLLM's full walk chooses, through evictions,
        /// hits taking blocks out of the evictor and blocks freed into it.
        #[test]
        fn the_resumed_walk_agrees_with_vllms_full_walk(
            blocks in proptest::collection::vec((0i64..6, 1u64..6), 1..40),
            ops in proptest::collection::vec((0u8..3, 0usize..40), 0..80),
        ) {
            let mut cache = V0Cache::new(BlockKeys::default(), None, 4);
            for (k, &(last, depth)) in blocks.iter().enumerate() {
                cache.blocks.push(Block {
                    key: k as u64,
                    refs: 1,
                    last,
                    depth,
                    filled_in: 0,
                    place: NOT_FREE,
                });
                cache.cached.insert(k as u64, k as u32);
                cache.referenced += 1;
                cache.release_one(k as u32);
            }
            for (op, x) in ops {
                let free: Vec<u32> = cache.evictor.values().copied().collect();
                match op {
                    0 => {
                        let want = naive_choice(&cache);
                        proptest::prop_assert_eq!(cache.evict(), want);
                        if let Some(id) = want {
                            // Its key gone, a new key; then it is held.
                            cache.blocks[id as usize].key = 1000 + id as u64;
                            cache.cached.insert(1000 + id as u64, id);
                            cache.blocks[id as usize].refs = 1;
                            cache.referenced += 1;
                        }
                    }
                    1 if !free.is_empty() => cache.touch(free[x % free.len()]),
                    _ => {
                        let held: Vec<u32> = (0..cache.blocks.len() as u32)
                            .filter(|&id| cache.blocks[id as usize].refs > 0)
                            .collect();
                        if !held.is_empty() {
                            let id = held[x % held.len()];
                            cache.blocks[id as usize].last = (x % 6) as i64;
                            cache.release_one(id);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_full_pool_fails_the_growth() {
        let mut cache = V0Cache::new(keys(&[12, 12], vec![vec![1, 2], vec![3, 4]]), Some(4), 4);
        cache.set_step(0);
        assert!(cache.grow(0, 12));
        assert!(!cache.grow(1, 12));
        assert_eq!(cache.free_blocks(), 0);
    }
}
