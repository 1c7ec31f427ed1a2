//! The KV block pool with automatic prefix caching (issue 47; semantics.md, "Prefix
//! caching"): which blocks hold which tokens, which of them a request can take from the
//! cache instead of computing, and which cached blocks are reused first when memory runs
//! out.
//!
//! It follows vLLM V1's `BlockPool` (0.32): a block filled with known tokens is registered
//! under its *key* (what its tokens are, prefix included); a cached block no request
//! references joins the back of the free queue and stays in the cache, an uncached one goes
//! to the front; a new block is taken from the front of the free queue, and a cached block
//! taken so leaves the cache. A request frees its blocks last block first, so a prompt's
//! tail is reused before its head.
//!
//! vLLM v0 (0.6.3) caches by another rule ([`V0Cache`], in `v0.rs`); [`KvCache`] is either.
//! Both the simulator and the replay keep one; the vLLM parity fixtures check each against
//! vLLM's own.

use crate::request::Workload;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};

mod v0;
pub use v0::V0Cache;

/// Whose prefix-caching rule a KV pool follows (a schedule names it as `"prefix_cache"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheRule {
    /// vLLM V1's `BlockPool` (0.32): [`PrefixCache`].
    VllmV1,
    /// vLLM v0's prefix-caching block manager (0.6.3): [`V0Cache`].
    VllmV0,
}

impl CacheRule {
    /// The name in schedule files and messages.
    pub fn name(self) -> &'static str {
        match self {
            CacheRule::VllmV1 => "vllm-v1",
            CacheRule::VllmV0 => "vllm-v0",
        }
    }
}

/// A KV pool with prefix caching under one [`CacheRule`]: what the simulator and the
/// replay keep.
#[derive(Debug, Clone)]
pub enum KvCache {
    /// vLLM V1's rule.
    V1(PrefixCache),
    /// vLLM v0's rule.
    V0(V0Cache),
}

impl KvCache {
    /// A pool of `capacity` blocks (`None`: unlimited) of `kv_block` tokens under `rule`.
    pub fn new(rule: CacheRule, keys: BlockKeys, capacity: Option<u64>, kv_block: u32) -> Self {
        match rule {
            CacheRule::VllmV1 => KvCache::V1(PrefixCache::new(keys, capacity, kv_block)),
            CacheRule::VllmV0 => KvCache::V0(V0Cache::new(keys, capacity, kv_block)),
        }
    }

    /// The rule it follows.
    pub fn rule(&self) -> CacheRule {
        match self {
            KvCache::V1(_) => CacheRule::VllmV1,
            KvCache::V0(_) => CacheRule::VllmV0,
        }
    }

    /// Adds a request (a cluster's replica): see [`BlockKeys::push`].
    pub fn push(&mut self, input: u32, chains: Vec<u32>) {
        match self {
            KvCache::V1(c) => c.push(input, chains),
            KvCache::V0(c) => c.push(input, chains),
        }
    }

    /// Starts step `step` (a batch's index; vLLM v0 counts blocks filled before it as
    /// computed and marks the requests it runs as accessed in it).
    pub fn set_step(&mut self, step: u64) {
        if let KvCache::V0(c) = self {
            c.set_step(step);
        }
    }

    /// The longest run of request `i`'s leading blocks it can take from the cache now, at
    /// most `max_blocks`: `(blocks, how many of them no request references)`.
    pub fn hit(&self, i: u32, max_blocks: u64) -> (u64, u64) {
        match self {
            KvCache::V1(c) => c.hit(i, max_blocks),
            KvCache::V0(c) => c.hit(i, max_blocks),
        }
    }

    /// Request `i` (holding no blocks) takes its first `blocks` blocks from the cache;
    /// `false` (nothing taken) if they are not all there.
    pub fn take_hit(&mut self, i: u32, blocks: u64) -> bool {
        match self {
            KvCache::V1(c) => c.take_hit(i, blocks),
            KvCache::V0(c) => c.take_hit(i, blocks),
        }
    }

    /// Grows request `i`'s blocks to hold `tokens` tokens; `false` (with the blocks it
    /// got) when the pool runs out.
    pub fn grow(&mut self, i: u32, tokens: u64) -> bool {
        match self {
            KvCache::V1(c) => c.grow(i, tokens),
            KvCache::V0(c) => c.grow(i, tokens),
        }
    }

    /// Frees all of request `i`'s blocks (`evicted`: it may come back for them).
    pub fn free(&mut self, i: u32, evicted: bool) {
        match self {
            KvCache::V1(c) => c.free(i, evicted),
            KvCache::V0(c) => c.free(i),
        }
    }

    /// The blocks request `i` holds.
    pub fn held(&self, i: u32) -> &[u32] {
        match self {
            KvCache::V1(c) => &c.held[i as usize],
            KvCache::V0(c) => &c.held[i as usize],
        }
    }

    /// Blocks no request references (cached or not): what can be allocated.
    pub fn free_blocks(&self) -> u64 {
        match self {
            KvCache::V1(c) => c.pool.free(),
            KvCache::V0(c) => c.free_blocks(),
        }
    }

    /// Tokens of KV referenced by some request (each block counted once).
    pub fn used_tokens(&self) -> u64 {
        match self {
            KvCache::V1(c) => c.used_tokens(),
            KvCache::V0(c) => c.used_tokens(),
        }
    }
}

/// What a full KV block holds: equal keys mean equal tokens, prefix included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKey {
    /// Block `block` of a prompt whose tokens up to the end of that block are named by the
    /// chain of prefix ids `chain` (shared by every request with the same ids).
    Shared {
        /// The chain of prefix ids (an interned id of the sequence of ids).
        chain: u32,
        /// The KV block's index in the request.
        block: u32,
    },
    /// Block `block` of request `request`'s own tokens (no prefix ids, or generated tokens).
    Own {
        /// The request (by id).
        request: u32,
        /// The KV block's index in the request.
        block: u32,
    },
}

impl BlockKey {
    /// The key as one word: the chain or request in the high half (requests marked by the
    /// top bit), the block in the low half.
    fn word(self) -> u64 {
        match self {
            BlockKey::Shared { chain, block } => (u64::from(chain) << 32) | u64::from(block),
            BlockKey::Own { request, block } => {
                (1 << 63) | (u64::from(request) << 32) | u64::from(block)
            }
        }
    }
}

/// Hashed as its word.
impl std::hash::Hash for BlockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.word());
    }
}

/// The keys of every request's KV blocks, from the workload's prefix ids (if any).
///
/// Token `p` of a prompt is named by the chain of ids up to its id block
/// (`ids[0..=p / block_tokens]`): two requests agree on it when those chains are equal. A KV
/// block of `b` tokens that lies within the prompt is keyed by the chain of its last token
/// (which names all earlier tokens); other blocks (past the prompt, without ids, or named
/// by a chain no other request has) are the request's own.
#[derive(Debug, Clone, Default)]
pub struct BlockKeys {
    kv_block: u32,
    id_block: u32,
    inputs: Vec<u32>,
    /// Per request, the interned chain of each of its id blocks (empty without ids;
    /// [`OWN_CHAIN`] for a chain no other request has).
    chains: Vec<Vec<u32>>,
}

/// The chain of an id block no other request's prompt has: its KV blocks are the
/// request's own (only the request itself can find them again, after an eviction), which
/// spares the pool indexing blocks nobody else can hit.
const OWN_CHAIN: u32 = u32::MAX;

/// `chains` with every chain held by one request only replaced by [`OWN_CHAIN`].
fn only_shared(mut chains: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    let nodes = chains.iter().flatten().max().map_or(0, |&m| m as usize + 1);
    let mut holders = vec![0u8; nodes];
    for &c in chains.iter().flatten() {
        holders[c as usize] = holders[c as usize].saturating_add(1);
    }
    for c in chains.iter_mut().flatten() {
        if holders[*c as usize] < 2 {
            *c = OWN_CHAIN;
        }
    }
    chains
}

impl BlockKeys {
    /// Keys for `workload`'s requests in KV blocks of `kv_block` tokens.
    pub fn new(workload: &Workload, kv_block: u32) -> Self {
        let inputs = workload.input_lengths();
        let (id_block, chains) = match workload.prefix() {
            Some(p) => (p.block_tokens, only_shared(p.intern_chains())),
            None => (1, vec![Vec::new(); inputs.len()]),
        };
        Self {
            kv_block: kv_block.max(1),
            id_block,
            inputs,
            chains,
        }
    }

    /// Keys for requests added one by one (a cluster's replica): see [`Self::push`].
    pub fn empty(kv_block: u32, id_block: u32) -> Self {
        Self {
            kv_block: kv_block.max(1),
            id_block: id_block.max(1),
            ..Self::default()
        }
    }

    /// Adds a request with prompt length `input` whose id blocks have the interned chains
    /// `chains` (as [`Self::chains_of`] gives them; empty without ids).
    pub fn push(&mut self, input: u32, chains: Vec<u32>) {
        self.inputs.push(input);
        self.chains.push(chains);
    }

    /// The interned chains of request `i`'s id blocks.
    pub fn chains_of(&self, i: u32) -> &[u32] {
        &self.chains[i as usize]
    }

    /// Tokens per id block.
    pub fn id_block(&self) -> u32 {
        self.id_block
    }

    /// The keys of request `i`'s KV blocks from block `from` on, in order (endless; the
    /// same as [`Self::key`] block by block, without a division per block).
    pub fn keys_from(&self, i: u32, from: u32) -> impl Iterator<Item = BlockKey> + '_ {
        let chains = &self.chains[i as usize];
        let input = u64::from(self.inputs[i as usize]);
        let (kv, idb) = (u64::from(self.kv_block), u64::from(self.id_block));
        let mut end = (u64::from(from) + 1) * kv;
        let mut id_block = ((end - 1) / idb) as usize;
        (from..).map(move |k| {
            let key = match chains.get(id_block) {
                Some(&chain) if end <= input && chain != OWN_CHAIN => {
                    BlockKey::Shared { chain, block: k }
                }
                _ => BlockKey::Own {
                    request: i,
                    block: k,
                },
            };
            end += kv;
            while (id_block as u64 + 1) * idb < end {
                id_block += 1;
            }
            key
        })
    }

    /// The key of request `i`'s KV block `k`.
    pub fn key(&self, i: u32, k: u32) -> BlockKey {
        let end = (u64::from(k) + 1) * u64::from(self.kv_block);
        let chains = &self.chains[i as usize];
        if end <= u64::from(self.inputs[i as usize]) && !chains.is_empty() {
            let last_id_block = ((end - 1) / u64::from(self.id_block)) as usize;
            if let Some(&chain) = chains.get(last_id_block).filter(|&&c| c != OWN_CHAIN) {
                return BlockKey::Shared { chain, block: k };
            }
        }
        BlockKey::Own {
            request: i,
            block: k,
        }
    }
}

/// The most prompt tokens each request (by id) can ever take from a prefix cache filled
/// by *other* requests, in KV blocks of `kv_block`: its longest run of leading blocks that
/// another request's prompt also holds, at most `I - 1` tokens. (A request's own blocks
/// taken back after an eviction save only what the eviction discarded.) 0 for every
/// request without prefix ids.
pub fn most_shared_tokens(workload: &Workload, kv_block: u32) -> Vec<u64> {
    let keys = BlockKeys::new(workload, kv_block);
    let b = u64::from(keys.kv_block);
    // Per chain, the two longest prompts holding it: (length, request), longest first.
    let mut longest: HashMap<u32, [(u64, u32); 2]> = HashMap::new();
    for (i, chains) in keys.chains.iter().enumerate() {
        let len = u64::from(keys.inputs[i]);
        for &c in chains.iter().filter(|&&c| c != OWN_CHAIN) {
            let top = longest.entry(c).or_insert([(0, u32::MAX); 2]);
            if len > top[0].0 {
                top[1] = top[0];
                top[0] = (len, i as u32);
            } else if len > top[1].0 {
                top[1] = (len, i as u32);
            }
        }
    }
    (0..keys.inputs.len())
        .map(|i| {
            let input = u64::from(keys.inputs[i]);
            let most_blocks = (input.max(1) - 1) / b;
            let mut k = 0u64;
            while k < most_blocks {
                let BlockKey::Shared { chain, .. } = keys.key(i as u32, k as u32) else {
                    break;
                };
                let top = longest[&chain];
                let other = if top[0].1 == i as u32 {
                    top[1].0
                } else {
                    top[0].0
                };
                if other < (k + 1) * b {
                    break;
                }
                k += 1;
            }
            k * b
        })
        .collect()
}

/// `workload` with each prompt shortened by [`most_shared_tokens`] (and no prefix ids): a
/// relaxation of it with a prefix cache. Every schedule of `workload` that takes tokens
/// from the cache does at least the work of a schedule of this one: each request computes
/// at least its unshared tokens, with no more context, and holds no more KV of its own,
/// while shared blocks, counted once in the real pool, count nowhere here. Bounds computed
/// on it hold for schedulers with a prefix cache too.
pub fn without_shared_prompts(workload: &Workload, kv_block: u32) -> Workload {
    let shared = most_shared_tokens(workload, kv_block);
    let requests = workload
        .requests()
        .iter()
        .zip(&shared)
        .map(|(r, &s)| crate::request::Request {
            input_tokens: r.input_tokens - s as u32,
            ..*r
        })
        .collect();
    Workload::new(requests).expect("shortened prompts keep at least one token")
}

/// Blocks per group of [`KeyIndex`].
const GROUP: u64 = 16;

/// A block's key as one word ([`BlockKey::word`]); `NO_KEY` for none.
const NO_KEY: u64 = u64::MAX;

/// The first block registered under each key, kept in groups of [`GROUP`] consecutive
/// blocks of one chain or request: a request's blocks are registered, reused and released
/// together, so one group serves many operations in a row, and the group used last is
/// remembered (no hashing while the operations stay in it).
#[derive(Debug, Clone)]
struct KeyIndex {
    /// Group word (`key / GROUP`) -> its place in `slab`.
    places: FxHashMap<u64, u32>,
    slab: Vec<Group>,
    /// Places of `slab` no group uses.
    spare: Vec<u32>,
    /// The group word and place used last (`NO_KEY`: none).
    last: (u64, u32),
}

#[derive(Debug, Clone)]
struct Group {
    /// The block holding each key of the group (`u32::MAX`: none).
    first: [u32; GROUP as usize],
    live: u32,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self {
            places: FxHashMap::default(),
            slab: Vec::new(),
            spare: Vec::new(),
            last: (NO_KEY, 0),
        }
    }
}

impl KeyIndex {
    fn get(&self, w: u64) -> Option<u32> {
        let place = if self.last.0 == w / GROUP {
            self.last.1
        } else {
            *self.places.get(&(w / GROUP))?
        };
        let id = self.slab[place as usize].first[(w % GROUP) as usize];
        (id != u32::MAX).then_some(id)
    }

    /// The place of `w`'s group, remembered as the last one used.
    fn place(&mut self, w: u64) -> Option<u32> {
        let g = w / GROUP;
        if self.last.0 != g {
            self.last = (g, *self.places.get(&g)?);
        }
        Some(self.last.1)
    }

    /// The place of `w`'s group, made if it has none.
    fn place_or_make(&mut self, w: u64) -> u32 {
        if let Some(place) = self.place(w) {
            return place;
        }
        let blank = Group {
            first: [u32::MAX; GROUP as usize],
            live: 0,
        };
        let place = match self.spare.pop() {
            Some(p) => {
                self.slab[p as usize] = blank;
                p
            }
            None => {
                self.slab.push(blank);
                self.slab.len() as u32 - 1
            }
        };
        self.places.insert(w / GROUP, place);
        self.last = (w / GROUP, place);
        place
    }

    /// Makes `id` the key's block if it has none (or always, with `replace`); the block it
    /// had before, if any.
    fn insert(&mut self, w: u64, id: u32, replace: bool) -> Option<u32> {
        let place = self.place_or_make(w);
        let g = &mut self.slab[place as usize];
        let slot = &mut g.first[(w % GROUP) as usize];
        let before = *slot;
        if before == u32::MAX || replace {
            *slot = id;
            g.live += u32::from(before == u32::MAX);
        }
        (before != u32::MAX).then_some(before)
    }

    /// Drops the key if block `id` holds it (any block, with `None`); whether it did.
    fn remove(&mut self, w: u64, id: Option<u32>) -> bool {
        let Some(place) = self.place(w) else {
            return false;
        };
        let g = &mut self.slab[place as usize];
        let slot = &mut g.first[(w % GROUP) as usize];
        let held = *slot != u32::MAX && id.is_none_or(|id| *slot == id);
        if held {
            *slot = u32::MAX;
            g.live -= 1;
            if g.live == 0 {
                self.places.remove(&(w / GROUP));
                self.spare.push(place);
                self.last = (NO_KEY, 0);
            }
        }
        held
    }
}

#[derive(Debug, Clone)]
struct Block {
    /// Its key's word, or [`NO_KEY`].
    key: u64,
    refs: u32,
    /// Its place in the free queue while it is free and cached ([`NO_SEQ`]: none).
    seq: u32,
}

/// A block's place in no free queue.
///
/// Places are numbered modulo 2^32 (skipping this one), which keeps a block in 16 bytes
/// (the pool's hot loop waits on loading blocks). A stale queue entry could only be taken
/// for live if its block were queued again exactly 2^32 places later while the entry is
/// still queued; the queue holds at most about three times the pool's blocks (stale
/// entries are dropped past twice the live ones), so an entry leaves it within that many
/// places, far fewer than 2^32 for any pool that fits in memory.
const NO_SEQ: u32 = u32::MAX;

/// The pool of KV blocks: references, the cache of full blocks and the free queue.
///
/// The free queue is its uncached blocks (freed or never used; which of them is taken
/// first changes nothing, none holds a key), then its cached blocks in the order they were
/// freed: the least recently freed cached block is the first to leave the cache.
///
/// A block registered without being *indexed* holds its key (it is cached, for its place
/// in the queue) but no lookup finds it: the simulator and the replay index a request's own
/// blocks only when it is evicted, since nobody else can hit them and it cannot hit them
/// while it holds them (see [`PrefixCache::free`]).
#[derive(Debug, Clone, Default)]
pub struct BlockPool {
    /// Blocks in all (`None`: unlimited).
    capacity: Option<u64>,
    blocks: Vec<Block>,
    /// Free blocks without a key that were used before.
    uncached: Vec<u32>,
    /// Free cached blocks in queue order, with the place each was given; an entry whose
    /// block has since been taken (its `seq` differs) is skipped.
    free: VecDeque<(u32, u32)>,
    free_cached: u64,
    next_seq: u32,
    /// Per block, how many times it was registered (tells a live duplicate entry from a
    /// stale one).
    registrations: Vec<u32>,
    /// The first block indexed under each key (still holding it).
    cached: KeyIndex,
    /// Further blocks indexed under a key (two requests computed the same tokens), in
    /// order, with their registration count; an entry whose block has since left the
    /// cache or been registered again is stale and skipped.
    duplicates: FxHashMap<u64, VecDeque<(u32, u32)>>,
    referenced: u64,
}

impl BlockPool {
    /// A pool of `capacity` blocks (`None`: unlimited), all free and empty.
    pub fn new(capacity: Option<u64>) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// Blocks referenced by some request.
    pub fn referenced(&self) -> u64 {
        self.referenced
    }

    /// Blocks no request references (cached or not): what can be allocated.
    pub fn free(&self) -> u64 {
        self.capacity.map_or(u64::MAX / 4, |c| c - self.referenced)
    }

    /// Blocks that were never used (at the front of the free queue).
    fn blank(&self) -> u64 {
        self.capacity
            .map_or(u64::MAX / 4, |c| c - self.blocks.len() as u64)
    }

    /// Takes a block from the front of the free queue (an uncached one first); a cached
    /// block taken so leaves the cache. `None` when no block is free.
    pub fn allocate(&mut self) -> Option<u32> {
        let id = if let Some(id) = self.uncached.pop() {
            id
        } else if self.blank() > 0 {
            self.blocks.push(Block {
                key: NO_KEY,
                refs: 0,
                seq: NO_SEQ,
            });
            self.registrations.push(0);
            self.blocks.len() as u32 - 1
        } else {
            let id = self.pop_cached()?;
            let key = std::mem::replace(&mut self.blocks[id as usize].key, NO_KEY);
            self.uncache(key, id);
            id
        };
        self.blocks[id as usize].refs = 1;
        self.referenced += 1;
        Some(id)
    }

    /// The front of the queue of free cached blocks.
    fn pop_cached(&mut self) -> Option<u32> {
        while let Some((seq, id)) = self.free.pop_front() {
            let b = &mut self.blocks[id as usize];
            if b.seq == seq {
                b.seq = NO_SEQ;
                self.free_cached -= 1;
                return Some(id);
            }
        }
        None
    }

    /// Block `id` no longer holds key `w`: if it was the key's first holder, the next live
    /// duplicate takes its place (a duplicate's own entry just goes stale).
    fn uncache(&mut self, w: u64, id: u32) {
        if self.duplicates.is_empty() {
            self.cached.remove(w, Some(id));
            return;
        }
        if self.cached.get(w) != Some(id) {
            return;
        }
        let next = self.duplicates.get_mut(&w).and_then(|more| {
            while let Some((b, reg)) = more.pop_front() {
                let block = &self.blocks[b as usize];
                if block.key == w && self.registrations[b as usize] == reg {
                    return Some(b);
                }
            }
            None
        });
        match next {
            Some(b) => {
                self.cached.insert(w, b, true);
            }
            None => {
                self.cached.remove(w, Some(id));
                self.duplicates.remove(&w);
            }
        }
    }

    /// The block holding `key`, if cached and indexed (the first indexed of several).
    pub fn lookup(&self, key: &BlockKey) -> Option<u32> {
        self.cached.get(key.word())
    }

    /// Whether block `id` is referenced by no request (a hit on it takes it off the free
    /// queue).
    pub fn is_free(&self, id: u32) -> bool {
        self.blocks[id as usize].refs == 0
    }

    /// One more reference to block `id` (a cache hit); a free block leaves the free queue.
    pub fn touch(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.refs += 1;
        if b.refs == 1 {
            // A free block with a key is in the queue of cached ones: its entry goes stale.
            b.seq = NO_SEQ;
            self.free_cached -= 1;
            self.referenced += 1;
            if self.free.len() as u64 > 2 * self.free_cached + 64 {
                self.compact();
            }
        }
    }

    /// Drops the queue's stale entries (bounded memory under many hits).
    fn compact(&mut self) {
        let blocks = &self.blocks;
        self.free
            .retain(|&(seq, id)| blocks[id as usize].seq == seq);
    }

    /// Drops one reference to each of `blocks`, the last first; a block no longer
    /// referenced is free: a cached one joins the back of the free queue (and stays
    /// cached), an uncached one its front.
    pub fn release(&mut self, blocks: &[u32]) {
        let front = self.uncached.len();
        for &id in blocks.iter().rev() {
            let b = &mut self.blocks[id as usize];
            b.refs -= 1;
            if b.refs > 0 {
                continue;
            }
            self.referenced -= 1;
            if b.key != NO_KEY {
                b.seq = self.next_seq;
                self.free.push_back((self.next_seq, id));
                self.free_cached += 1;
                self.next_seq = match self.next_seq.wrapping_add(1) {
                    NO_SEQ => 0,
                    next => next,
                };
            } else {
                self.uncached.push(id);
            }
        }
        // `uncached` is taken from its end: the block freed first comes out first.
        self.uncached[front..].reverse();
    }

    /// Registers block `id` (full of known tokens) under `key` and, with `index`, makes
    /// lookups find it; a block already registered keeps its key.
    pub fn register(&mut self, id: u32, key: BlockKey, index: bool) {
        let b = &mut self.blocks[id as usize];
        if b.key != NO_KEY {
            return;
        }
        b.key = key.word();
        self.registrations[id as usize] += 1;
        if index {
            self.index(id);
        }
    }

    /// Makes lookups of block `id`'s key (registered) find it, after the blocks indexed
    /// before under the same key.
    pub fn index(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let (w, reg) = (b.key, self.registrations[id as usize]);
        if w == NO_KEY {
            return;
        }
        let Some(first) = self.cached.insert(w, id, false) else {
            return;
        };
        if first != id {
            let more = self.duplicates.entry(w).or_default();
            if more.iter().any(|&(d, r)| d == id && r == reg) {
                return;
            }
            more.push_back((id, reg));
            if more.len() >= 64 && more.len().is_power_of_two() {
                let (blocks, regs) = (&self.blocks, &self.registrations);
                more.retain(|&(d, r)| blocks[d as usize].key == w && regs[d as usize] == r);
            }
        }
    }
}

/// Each request's blocks in a [`BlockPool`], and its cache hits.
#[derive(Debug, Clone, Default)]
pub struct PrefixCache {
    /// The pool.
    pub pool: BlockPool,
    /// The block keys.
    pub keys: BlockKeys,
    /// Per request, its blocks in token order.
    pub held: Vec<Vec<u32>>,
    /// Per request, how many of its leading blocks are registered (or were hits).
    registered: Vec<usize>,
    kv_block: u64,
}

impl PrefixCache {
    /// A cache of `capacity` blocks of `kv_block` tokens for requests keyed by `keys`.
    pub fn new(keys: BlockKeys, capacity: Option<u64>, kv_block: u32) -> Self {
        let n = keys.inputs.len();
        Self {
            pool: BlockPool::new(capacity),
            keys,
            held: vec![Vec::new(); n],
            registered: vec![0; n],
            kv_block: u64::from(kv_block.max(1)),
        }
    }

    /// Adds a request (a cluster's replica): see [`BlockKeys::push`].
    pub fn push(&mut self, input: u32, chains: Vec<u32>) {
        self.keys.push(input, chains);
        self.held.push(Vec::new());
        self.registered.push(0);
    }

    /// The longest run of request `i`'s leading blocks in the cache, at most `max_blocks`:
    /// `(blocks, how many of them no request references)`.
    pub fn hit(&self, i: u32, max_blocks: u64) -> (u64, u64) {
        let (mut blocks, mut free) = (0u64, 0u64);
        for key in self.keys.keys_from(i, 0) {
            if blocks == max_blocks {
                break;
            }
            match self.pool.lookup(&key) {
                Some(id) => {
                    free += u64::from(self.pool.is_free(id));
                    blocks += 1;
                }
                None => break,
            }
        }
        (blocks, free)
    }

    /// Request `i` (holding no blocks) takes its first `blocks` blocks from the cache;
    /// `false` (nothing taken) if they are not all there.
    pub fn take_hit(&mut self, i: u32, blocks: u64) -> bool {
        debug_assert!(self.held[i as usize].is_empty());
        let ids: Option<Vec<u32>> = self
            .keys
            .keys_from(i, 0)
            .take(blocks as usize)
            .map(|key| self.pool.lookup(&key))
            .collect();
        let Some(ids) = ids else {
            return false;
        };
        for &id in &ids {
            self.pool.touch(id);
        }
        self.registered[i as usize] = ids.len();
        self.held[i as usize] = ids;
        true
    }

    /// Grows request `i`'s blocks to hold its `tokens` computed tokens and registers the
    /// blocks they fill; `false` (with the blocks it got) when the pool runs out.
    pub fn grow(&mut self, i: u32, tokens: u64) -> bool {
        let want = tokens.div_ceil(self.kv_block);
        while (self.held[i as usize].len() as u64) < want {
            match self.pool.allocate() {
                Some(id) => self.held[i as usize].push(id),
                None => return false,
            }
        }
        let full = (tokens / self.kv_block) as usize;
        let from = self.registered[i as usize];
        if from < full {
            let held = &self.held[i as usize][from..full];
            for (&id, key) in held.iter().zip(self.keys.keys_from(i, from as u32)) {
                // A request's own blocks are indexed when it is evicted (see `free`).
                self.pool
                    .register(id, key, matches!(key, BlockKey::Shared { .. }));
            }
        }
        self.registered[i as usize] = self.registered[i as usize].max(full);
        true
    }

    /// Frees all of request `i`'s blocks, the last first. An `evicted` request may come
    /// back for its own blocks: they become findable now (nobody else can find them, and
    /// it cannot take a hit while it holds them, so indexing them earlier would change
    /// nothing); a finished request's own blocks stay cached, unfindable.
    pub fn free(&mut self, i: u32, evicted: bool) {
        let blocks = std::mem::take(&mut self.held[i as usize]);
        if evicted {
            for &id in &blocks {
                self.pool.index(id);
            }
        }
        self.pool.release(&blocks);
        self.registered[i as usize] = 0;
    }

    /// Tokens of KV referenced by some request (each block counted once).
    pub fn used_tokens(&self) -> u64 {
        self.pool.referenced() * self.kv_block
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::prefix::PrefixIds;
    use crate::request::Request;

    /// Prompts of `inputs` tokens, 4 generated tokens each, all at 0, with prompt ids
    /// `(tokens per id block, ids)` if given.
    pub(crate) fn workload(inputs: &[u32], ids: Option<(u32, Vec<Vec<u64>>)>) -> Workload {
        let w = Workload::new(
            inputs
                .iter()
                .map(|&i| Request {
                    input_tokens: i,
                    output_tokens: 4,
                    arrival_s: 0.0,
                })
                .collect(),
        )
        .unwrap();
        match ids {
            Some((block_tokens, ids)) => w.with_prefix(PrefixIds { block_tokens, ids }).unwrap(),
            None => w,
        }
    }

    #[test]
    fn keys_are_shared_within_equal_chains_and_own_elsewhere() {
        // Id blocks of 8 tokens, KV blocks of 4: requests 0 and 1 share their first id
        // block (tokens 0..8), not the second; request 2 shares nothing.
        let w = workload(
            &[16, 14, 8],
            Some((8, vec![vec![1, 2], vec![1, 3], vec![9]])),
        );
        let keys = BlockKeys::new(&w, 4);
        assert_eq!(keys.key(0, 0), keys.key(1, 0));
        assert_eq!(keys.key(0, 1), keys.key(1, 1));
        assert_ne!(keys.key(0, 2), keys.key(1, 2));
        assert_ne!(keys.key(0, 0), keys.key(2, 0));
        // Request 1's block 3 (tokens 12..16) runs past its 14-token prompt: its own.
        assert_eq!(
            keys.key(1, 3),
            BlockKey::Own {
                request: 1,
                block: 3
            }
        );
        // Without ids every block is the request's own.
        let plain = BlockKeys::new(&workload(&[16, 16], None), 4);
        assert_ne!(plain.key(0, 0), plain.key(1, 0));
    }

    #[test]
    fn shared_tokens_are_the_leading_blocks_another_prompt_also_holds() {
        // Id blocks of 8, KV blocks of 4. Requests 0 and 1 share their first id block;
        // request 1's second block (tokens 8..12, chain [1, 2]) is also request 0's; request
        // 2 shares [1] but its prompt ends at 6 tokens: one full KV block, capped at I - 1.
        let w = workload(
            &[16, 12, 6, 8],
            Some((8, vec![vec![1, 2], vec![1, 2], vec![1], vec![9]])),
        );
        let shared = most_shared_tokens(&w, 4);
        assert_eq!(shared, [12, 8, 4, 0]);
        // Request 0 holds 4 blocks; request 1 (12 tokens) covers only 3 of them, and the
        // last token is always computed, so 12 for 0; 1 is capped at I - 1 = 11 -> 8.
        let relaxed = without_shared_prompts(&w, 4);
        let inputs: Vec<u32> = relaxed.requests().iter().map(|r| r.input_tokens).collect();
        assert_eq!(inputs, [4, 4, 2, 8]);
        assert!(relaxed.prefix().is_none());
        // Without ids nothing is shared.
        assert_eq!(most_shared_tokens(&workload(&[16, 16], None), 4), [0, 0]);
    }

    #[test]
    fn the_free_queue_reuses_never_used_blocks_then_the_oldest_freed_tail_first() {
        let mut pool = BlockPool::new(Some(4));
        let a: Vec<u32> = (0..2).map(|_| pool.allocate().unwrap()).collect();
        let b: Vec<u32> = (0..2).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(pool.allocate(), None);
        let key = |k| BlockKey::Own {
            request: 0,
            block: k,
        };
        pool.register(a[0], key(0), true);
        pool.register(a[1], key(1), true);
        pool.release(&a); // a[1] joins the queue first, then a[0]
        assert_eq!(pool.free(), 2);
        assert_eq!(pool.lookup(&key(0)), Some(a[0]));
        // The next allocation takes a[1] (the tail block, freed first) and uncaches it.
        assert_eq!(pool.allocate(), Some(a[1]));
        assert_eq!(pool.lookup(&key(1)), None);
        assert_eq!(pool.lookup(&key(0)), Some(a[0]));
        // A hit on a free cached block takes it off the queue.
        pool.touch(a[0]);
        assert_eq!(pool.free(), 0);
        pool.release(&b);
        assert_eq!(pool.allocate(), Some(b[1]));
        assert_eq!(pool.referenced(), 3);
    }

    #[test]
    fn uncached_free_blocks_are_taken_before_older_cached_ones() {
        let mut pool = BlockPool::new(Some(2));
        let (x, y) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        let key = BlockKey::Own {
            request: 0,
            block: 0,
        };
        pool.register(x, key, true);
        pool.release(&[x]); // cached: back of the queue
        pool.release(&[y]); // uncached, freed later: front
        assert_eq!(pool.allocate(), Some(y));
        assert_eq!(pool.lookup(&key), Some(x));
        assert_eq!(pool.allocate(), Some(x));
        assert_eq!(pool.lookup(&key), None);
    }

    #[test]
    fn a_request_hits_the_blocks_another_registered() {
        let w = workload(&[16, 16], Some((8, vec![vec![1, 2], vec![1, 5]])));
        let mut cache = PrefixCache::new(BlockKeys::new(&w, 4), Some(8), 4);
        assert!(cache.grow(0, 16));
        assert_eq!(cache.used_tokens(), 16);
        // Request 1 shares the first id block (2 KV blocks), held by request 0.
        assert_eq!(cache.hit(1, 3), (2, 0));
        assert!(cache.take_hit(1, 2));
        assert!(cache.grow(1, 12));
        assert_eq!(cache.used_tokens(), 20); // 4 blocks + 1 of its own
        cache.free(0, false);
        cache.free(1, false);
        assert_eq!(cache.used_tokens(), 0);
        // Freed but cached: a third look finds the shared id block; request 0's second id
        // block is its alone (no other prompt has it), so nobody can find it again.
        assert_eq!(cache.hit(0, 4), (2, 2));
        assert_eq!(
            cache.keys.key(0, 2),
            BlockKey::Own {
                request: 0,
                block: 2
            }
        );
        // Queue: request 0 freed 3, 2 (1 and 0 still held by request 1), request 1 then 4,
        // 1, 0: never-used blocks go first, then tails before the shared head.
        let mut pool = cache.pool.clone();
        let order: Vec<u32> = (0..8).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(order, [5, 6, 7, 3, 2, 4, 1, 0]);
        assert_eq!(pool.lookup(&cache.keys.key(0, 0)), None);
    }

    proptest::proptest! {
        /// Walking a request's keys block by block gives what each block's key is.
        #[test]
        fn keys_from_agrees_with_key(
            kv in 1u32..40, idb in 1u32..70, input in 1u32..400, common in 0usize..6, from in 0u32..30,
        ) {
            let n = input.div_ceil(idb) as usize;
            let other = (0..n).map(|k| if k < common { 7 } else { 8 }).collect();
            let prompt_ids = vec![vec![7u64; n], other];
            let w = workload(&[input, input], Some((idb, prompt_ids)));
            let keys = BlockKeys::new(&w, kv);
            for i in 0..2u32 {
                let walked: Vec<BlockKey> = keys.keys_from(i, from).take(40).collect();
                let each: Vec<BlockKey> = (from..from + 40).map(|k| keys.key(i, k)).collect();
                proptest::prop_assert_eq!(walked, each);
            }
        }

        /// The grouped index with its remembered group answers as a plain map does, through
        /// groups emptied and made again in other places of the slab.
        #[test]
        fn the_key_index_agrees_with_a_plain_map(
            ops in proptest::collection::vec((0u8..3, 0u64..80, 0u32..16), 1..400),
        ) {
            let mut index = KeyIndex::default();
            let mut plain: HashMap<u64, u32> = HashMap::new();
            for (op, w, id) in ops {
                match op {
                    0 => {
                        let before = plain.get(&w).copied();
                        proptest::prop_assert_eq!(index.insert(w, id, false), before);
                        plain.entry(w).or_insert(id);
                    }
                    1 => {
                        index.insert(w, id, true);
                        plain.insert(w, id);
                    }
                    2 if id % 2 == 0 => {
                        // Only if that block holds it.
                        let holds = plain.get(&w) == Some(&(id % 8));
                        proptest::prop_assert_eq!(index.remove(w, Some(id % 8)), holds);
                        if holds {
                            plain.remove(&w);
                        }
                    }
                    _ => {
                        proptest::prop_assert_eq!(index.remove(w, None), plain.remove(&w).is_some());
                    }
                }
                for probe in 0..80 {
                    proptest::prop_assert_eq!(index.get(probe), plain.get(&probe).copied());
                }
                let live: usize = index.places.values().map(|&p| index.slab[p as usize].live as usize).sum();
                proptest::prop_assert_eq!(live, plain.len());
            }
        }
    }
}
