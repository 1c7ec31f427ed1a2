//! Batch counts grouped in bins: bins of `width` batches up to where most of the mass
//! lies, then each twice the last, up to the horizon. Every edge is a multiple of `width`,
//! so two bins' differences are whole blocks of `width` (module `pairs`).

/// The bins of batch counts `0 ..= horizon`.
#[derive(Debug, Clone)]
pub(super) struct Grid {
    /// Batches per block.
    width: u64,
    /// Bin `q` is batch counts `edges[q] .. edges[q + 1]`, all multiples of `width`.
    edges: Vec<i64>,
    /// How many bins from the first are one block each.
    single: usize,
}

impl Grid {
    /// Bins of `width` batches (at least 1) up to `uniform_end`, then doubling, the last
    /// one holding `horizon`.
    pub(super) fn new(width: u64, uniform_end: u64, horizon: u64) -> Self {
        let width = width.max(1);
        let w = width as i64;
        let last_block = (horizon / width).min(1 << 52) as i64;
        let uniform_blocks = (uniform_end.div_ceil(width).min(1 << 52) as i64).max(1);
        let mut blocks = vec![0i64];
        let mut step = 1i64;
        while *blocks.last().expect("an edge") <= last_block {
            let at = *blocks.last().expect("an edge");
            if at >= uniform_blocks {
                step = step.saturating_mul(2);
            }
            blocks.push(at.saturating_add(step));
        }
        Self::with_edges(
            width,
            blocks.into_iter().map(|b| b.saturating_mul(w)).collect(),
        )
    }

    /// The same bins with those of one block split in two blocks of half the width (None
    /// where the width is odd).
    pub(super) fn refined(&self) -> Option<Self> {
        if !self.width.is_multiple_of(2) {
            return None;
        }
        let w = self.width as i64;
        let mut edges = Vec::with_capacity(2 * self.edges.len());
        for pair in self.edges.windows(2) {
            edges.push(pair[0]);
            if pair[1] - pair[0] == w {
                edges.push(pair[0] + w / 2);
            }
        }
        edges.push(*self.edges.last().expect("an edge"));
        Some(Self::with_edges(self.width / 2, edges))
    }

    fn with_edges(width: u64, edges: Vec<i64>) -> Self {
        let w = width as i64;
        let single = edges.windows(2).take_while(|e| e[1] - e[0] == w).count();
        Self {
            width,
            edges,
            single,
        }
    }

    /// How many bins from the first are one block each.
    pub(super) fn single_blocks(&self) -> usize {
        self.single
    }

    /// Batches per block.
    pub(super) fn width(&self) -> u64 {
        self.width
    }

    /// How many bins.
    pub(super) fn bins(&self) -> usize {
        self.edges.len() - 1
    }

    /// Bin `q`'s blocks, `[first, end)`.
    pub(super) fn blocks(&self, q: usize) -> (i64, i64) {
        let w = self.width as i64;
        (self.edges[q] / w, self.edges[q + 1] / w)
    }

    /// The least batch count of bin `q` (`q` up to the number of bins: the end of the last).
    pub(super) fn least(&self, q: usize) -> u64 {
        self.edges[q] as u64
    }

    /// The bin holding batch count `m` (the last bin past the horizon).
    pub(super) fn bin_of(&self, m: u64) -> usize {
        let m = m.min(i64::MAX as u64) as i64;
        (self.edges.partition_point(|&e| e <= m) - 1).min(self.bins() - 1)
    }

    /// The first bin among `first .. first + len` whose end block is above `block`.
    #[cfg(test)]
    pub(super) fn first_ending_above(&self, first: usize, len: usize, block: i64) -> usize {
        let at = block.saturating_mul(self.width as i64);
        self.edges[first + 1..first + len + 1].partition_point(|&e| e <= at)
    }

    /// The first bin among `first .. first + len` whose first block is above `block`.
    #[cfg(test)]
    pub(super) fn first_starting_above(&self, first: usize, len: usize, block: i64) -> usize {
        let at = block.saturating_mul(self.width as i64);
        self.edges[first..first + len].partition_point(|&e| e <= at)
    }
}

/// The first bin of a domain whose end (or first) block is above a block that never falls
/// from one call to the next: a walk instead of a search each time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor {
    first: usize,
    len: usize,
    ending: usize,
    starting: usize,
}

impl Cursor {
    /// A cursor over the bins `first .. first + len`.
    pub(super) fn new(first: usize, len: usize) -> Self {
        Self {
            first,
            len,
            ending: 0,
            starting: 0,
        }
    }

    /// The first bin whose end block is above `block` (no lower than at the last call).
    pub(super) fn ending_above(&mut self, grid: &Grid, block: i64) -> usize {
        let at = block.saturating_mul(grid.width as i64);
        let ends = &grid.edges[self.first + 1..self.first + self.len + 1];
        while self.ending < self.len && ends[self.ending] <= at {
            self.ending += 1;
        }
        self.ending
    }

    /// The first bin whose first block is above `block` (no lower than at the last call).
    pub(super) fn starting_above(&mut self, grid: &Grid, block: i64) -> usize {
        let at = block.saturating_mul(grid.width as i64);
        let starts = &grid.edges[self.first..self.first + self.len];
        while self.starting < self.len && starts[self.starting] <= at {
            self.starting += 1;
        }
        self.starting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_uniform_then_double_and_hold_the_horizon() {
        let g = Grid::new(10, 40, 200);
        // Blocks 0..4 one each, then 2, 4, 8, 16 (the last holds block 20).
        assert_eq!(g.edges, vec![0, 10, 20, 30, 40, 60, 100, 180, 340]);
        assert_eq!(g.bin_of(0), 0);
        assert_eq!(g.bin_of(39), 3);
        assert_eq!(g.bin_of(40), 4);
        assert_eq!(g.bin_of(200), 7);
        assert_eq!(g.least(5), 60);
        assert_eq!(g.first_ending_above(0, 8, 3), 3);
        assert_eq!(g.first_starting_above(0, 8, 3), 4);
        // Refined: the bins of one block split, the others kept.
        let r = g.refined().unwrap();
        assert_eq!(r.width(), 5);
        assert_eq!(
            r.edges,
            vec![0, 5, 10, 15, 20, 25, 30, 35, 40, 60, 100, 180, 340]
        );
        assert_eq!(r.blocks(9), (12, 20));
        assert!(r.refined().is_none());
        // Width 1 and a horizon inside the uniform part.
        let g = Grid::new(1, 10, 5);
        assert_eq!(g.bins(), 6);
        assert_eq!(g.bin_of(5), 5);
    }

    #[test]
    fn cursors_walk_to_where_the_searches_land() {
        let g = Grid::new(3, 30, 400);
        for (first, len) in [(0, g.bins()), (2, 9), (5, g.bins() - 5)] {
            let mut c = Cursor::new(first, len);
            for block in -3..150 {
                assert_eq!(
                    c.ending_above(&g, block),
                    g.first_ending_above(first, len, block),
                    "ending, {first} {len} {block}"
                );
                assert_eq!(
                    c.starting_above(&g, block / 2),
                    g.first_starting_above(first, len, block / 2),
                    "starting, {first} {len} {block}"
                );
            }
        }
    }
}
