//! Where the counting search keeps what it reached: the count vectors, stored flat behind
//! one hash table of ids, and the open list's entries.

use std::cmp::Ordering;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// The count vectors reached by the search, stored flat (`width` counts each), with the
/// best cost found to reach each and the vector it was reached from; indexed by a hash
/// table of ids, so a vector is stored once and looked up without allocating.
pub(super) struct Reached {
    width: usize,
    counts: Vec<u16>,
    /// Per vector: the best cost found to reach it (ms, as the objective counts it).
    pub cost: Vec<f64>,
    /// Per vector: the vector it was reached from (`u32::MAX` for the start).
    pub parent: Vec<u32>,
    index: HashTable<u32>,
}

fn key_hash(key: &[u16]) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl Reached {
    /// Bytes one reached vector may take: its counts, cost and parent (twice: a growing
    /// vector reallocates to double), its table slot (with the table's spare room), and
    /// about two open-list entries. Family (a) with C = 64, n = 32: 556,373 vectors of
    /// 16 counts, estimated 55 MB before this doubling; the whole process peaked at 54 MB.
    pub(super) fn bytes_per_vector(width: usize) -> usize {
        2 * (2 * width + 8 + 4) + 16 + 2 * std::mem::size_of::<Open>()
    }

    /// The most vectors a search keeps: `max_states`, and what a quarter of `memory_bytes`
    /// holds (the process holds the workload, the graphs and the heuristics' schedules
    /// besides, and the MILP after a search that gives up needs its own).
    pub(super) fn state_cap(width: usize, max_states: usize, memory_bytes: u64) -> usize {
        let per_vector = Self::bytes_per_vector(width) as u64;
        max_states.min(usize::try_from(memory_bytes / 4 / per_vector).unwrap_or(usize::MAX))
    }

    pub(super) fn new(width: usize) -> Self {
        Self {
            width,
            counts: Vec::new(),
            cost: Vec::new(),
            parent: Vec::new(),
            index: HashTable::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.cost.len()
    }

    pub(super) fn counts(&self, id: usize) -> &[u16] {
        &self.counts[id * self.width..(id + 1) * self.width]
    }

    pub(super) fn find(&self, key: &[u16]) -> Option<usize> {
        let (counts, width) = (&self.counts, self.width);
        self.index
            .find(key_hash(key), |&j| {
                &counts[j as usize * width..(j as usize + 1) * width] == key
            })
            .map(|&j| j as usize)
    }

    /// Stores a vector not reached before; its id.
    pub(super) fn insert(&mut self, key: &[u16], cost: f64, parent: u32) -> usize {
        let id = self.len();
        self.counts.extend_from_slice(key);
        self.cost.push(cost);
        self.parent.push(parent);
        let (counts, width) = (&self.counts, self.width);
        self.index.insert_unique(key_hash(key), id as u32, |&j| {
            key_hash(&counts[j as usize * width..(j as usize + 1) * width])
        });
        id
    }
}

impl Reached {
    /// A* step: `next`, reached from vector `from` at cost `g`, is stored (or its cost
    /// lowered) and opened when that is cheaper than before and its estimate total stays
    /// below `cutoff`.
    pub(super) fn reach(
        &mut self,
        open: &mut std::collections::BinaryHeap<Open>,
        from: usize,
        next: &[u16],
        g: f64,
        estimate: impl FnOnce(&[u16]) -> f64,
        cutoff: f64,
    ) {
        match self.find(next) {
            Some(j) if self.cost[j] <= g + 1e-12 => {}
            Some(j) => {
                let f = g + estimate(next);
                if f < cutoff {
                    self.cost[j] = g;
                    self.parent[j] = from as u32;
                    open.push(Open { f, g, id: j });
                }
            }
            None => {
                let f = g + estimate(next);
                if f.is_finite() && f < cutoff {
                    let id = self.insert(next, g, from as u32);
                    open.push(Open { f, g, id });
                }
            }
        }
    }
}

#[derive(PartialEq)]
/// An entry of the open list: estimated total `f`, cost so far `g`, and the vector.
pub(super) struct Open {
    pub f: f64,
    pub g: f64,
    pub id: usize,
}

impl Eq for Open {}

impl Ord for Open {
    fn cmp(&self, other: &Self) -> Ordering {
        // Min-heap on f, then the larger g (deeper) first; ids for determinism.
        other
            .f
            .total_cmp(&self.f)
            .then(self.g.total_cmp(&other.g))
            .then(other.id.cmp(&self.id))
    }
}

impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
