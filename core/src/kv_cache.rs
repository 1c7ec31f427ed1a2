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
//! Both the simulator and the replay keep one; the vLLM parity fixtures check it against
//! vLLM's own.

use crate::prefix::PrefixIds;
use crate::request::Workload;
use std::collections::{BTreeMap, HashMap};

/// What a full KV block holds: equal keys mean equal tokens, prefix included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// The keys of every request's KV blocks, from the workload's prefix ids (if any).
///
/// Token `p` of a prompt is named by the chain of ids up to its id block
/// (`ids[0..=p / block_tokens]`): two requests agree on it when those chains are equal. A KV
/// block of `b` tokens that lies within the prompt is keyed by the chain of its last token
/// (which names all earlier tokens); other blocks (past the prompt, or without ids) are the
/// request's own.
#[derive(Debug, Clone, Default)]
pub struct BlockKeys {
    kv_block: u32,
    id_block: u32,
    inputs: Vec<u32>,
    /// Per request, the interned chain of each of its id blocks (empty without ids).
    chains: Vec<Vec<u32>>,
}

impl BlockKeys {
    /// Keys for `workload`'s requests in KV blocks of `kv_block` tokens.
    pub fn new(workload: &Workload, kv_block: u32) -> Self {
        let inputs = workload.input_lengths();
        let (id_block, chains) = match workload.prefix() {
            Some(p) => (p.block_tokens, intern_chains(p)),
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

    /// The key of request `i`'s KV block `k`.
    pub fn key(&self, i: u32, k: u32) -> BlockKey {
        let end = (u64::from(k) + 1) * u64::from(self.kv_block);
        let chains = &self.chains[i as usize];
        if end <= u64::from(self.inputs[i as usize]) && !chains.is_empty() {
            let last_id_block = ((end - 1) / u64::from(self.id_block)) as usize;
            if let Some(&chain) = chains.get(last_id_block) {
                return BlockKey::Shared { chain, block: k };
            }
        }
        BlockKey::Own {
            request: i,
            block: k,
        }
    }
}

/// Interns each request's chains of ids: `(parent chain, id) -> chain`, in request order.
fn intern_chains(p: &PrefixIds) -> Vec<Vec<u32>> {
    let mut trie: HashMap<(u32, u64), u32> = HashMap::new();
    p.ids
        .iter()
        .map(|ids| {
            let mut node = 0u32;
            ids.iter()
                .map(|&id| {
                    let next = trie.len() as u32 + 1;
                    node = *trie.entry((node, id)).or_insert(next);
                    node
                })
                .collect()
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Block {
    key: Option<BlockKey>,
    refs: u32,
    /// Its place in the free queue while `refs == 0`.
    seq: u64,
}

/// The pool of KV blocks: references, the cache of full blocks and the free queue.
///
/// The free queue is its uncached blocks (freed or never used; which of them is taken
/// first changes nothing, none holds a key), then its cached blocks in the order they were
/// freed: the least recently freed cached block is the first to leave the cache.
#[derive(Debug, Clone, Default)]
pub struct BlockPool {
    /// Blocks in all (`None`: unlimited).
    capacity: Option<u64>,
    blocks: Vec<Block>,
    /// Free blocks without a key that were used before.
    uncached: Vec<u32>,
    /// Free cached blocks, by their place in the queue.
    free: BTreeMap<u64, u32>,
    next_seq: u64,
    cached: HashMap<BlockKey, Vec<u32>>,
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
                key: None,
                refs: 0,
                seq: 0,
            });
            self.blocks.len() as u32 - 1
        } else {
            let (_, id) = self.free.pop_first()?;
            if let Some(key) = self.blocks[id as usize].key.take() {
                self.uncache(key, id);
            }
            id
        };
        self.blocks[id as usize].refs = 1;
        self.referenced += 1;
        Some(id)
    }

    fn uncache(&mut self, key: BlockKey, id: u32) {
        if let Some(holders) = self.cached.get_mut(&key) {
            holders.retain(|&b| b != id);
            if holders.is_empty() {
                self.cached.remove(&key);
            }
        }
    }

    /// The block holding `key`, if cached (the first registered of several).
    pub fn lookup(&self, key: &BlockKey) -> Option<u32> {
        self.cached.get(key).and_then(|h| h.first().copied())
    }

    /// Whether block `id` is referenced by no request (a hit on it takes it off the free
    /// queue).
    pub fn is_free(&self, id: u32) -> bool {
        self.blocks[id as usize].refs == 0
    }

    /// One more reference to block `id` (a cache hit); a free block leaves the free queue.
    pub fn touch(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if b.refs == 0 {
            self.free.remove(&b.seq);
            self.referenced += 1;
        }
        b.refs += 1;
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
            if b.key.is_some() {
                b.seq = self.next_seq;
                self.free.insert(self.next_seq, id);
                self.next_seq += 1;
            } else {
                self.uncached.push(id);
            }
        }
        // `uncached` is taken from its end: the block freed first comes out first.
        self.uncached[front..].reverse();
    }

    /// Registers block `id` (full of known tokens) under `key`; a block already
    /// registered keeps its key.
    pub fn register(&mut self, id: u32, key: BlockKey) {
        let b = &mut self.blocks[id as usize];
        if b.key.is_none() {
            b.key = Some(key);
            self.cached.entry(key).or_default().push(id);
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
        while blocks < max_blocks {
            match self.pool.lookup(&self.keys.key(i, blocks as u32)) {
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
        let ids: Option<Vec<u32>> = (0..blocks)
            .map(|k| self.pool.lookup(&self.keys.key(i, k as u32)))
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
        for k in self.registered[i as usize]..full {
            let id = self.held[i as usize][k];
            self.pool.register(id, self.keys.key(i, k as u32));
        }
        self.registered[i as usize] = self.registered[i as usize].max(full);
        true
    }

    /// Frees all of request `i`'s blocks (evicted or finished), the last first.
    pub fn free(&mut self, i: u32) {
        let blocks = std::mem::take(&mut self.held[i as usize]);
        self.pool.release(&blocks);
        self.registered[i as usize] = 0;
    }

    /// Tokens of KV referenced by some request (each block counted once).
    pub fn used_tokens(&self) -> u64 {
        self.pool.referenced() * self.kv_block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Request;

    fn workload(inputs: &[u32], ids: Option<(u32, Vec<Vec<u64>>)>) -> Workload {
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
    fn the_free_queue_reuses_never_used_blocks_then_the_oldest_freed_tail_first() {
        let mut pool = BlockPool::new(Some(4));
        let a: Vec<u32> = (0..2).map(|_| pool.allocate().unwrap()).collect();
        let b: Vec<u32> = (0..2).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(pool.allocate(), None);
        let key = |k| BlockKey::Own {
            request: 0,
            block: k,
        };
        pool.register(a[0], key(0));
        pool.register(a[1], key(1));
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
        pool.register(x, key);
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
        cache.free(0);
        cache.free(1);
        assert_eq!(cache.used_tokens(), 0);
        // Freed but cached: a third look finds request 0's whole prompt.
        assert_eq!(cache.hit(0, 4), (4, 4));
        // Queue: request 0 freed 3, 2 (1 and 0 still held by request 1), request 1 then 4,
        // 1, 0: never-used blocks go first, then tails before the shared head.
        let mut pool = cache.pool.clone();
        let order: Vec<u32> = (0..8).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(order, [5, 6, 7, 3, 2, 4, 1, 0]);
        assert_eq!(pool.lookup(&cache.keys.key(0, 0)), None);
    }
}
