//! A pair's cost as a function of the difference `d = m_i - m_j` of the two requests'
//! batch counts, kept per block of the grid's width, and its least value over two bins.
//!
//! The cost is constant (`left`) for `d <= dl` and (`right`) for `d >= dr`; in between it
//! is kept as, per block `k` (differences `k w .. k w + w - 1`), its value at `k w` and its
//! least over the rest of the block. Bins whose edges are whole blocks allow differences
//! `(a - c') w + 1 ..= (a' - c) w - 1` (bins `[a, a')` and `[c, c')` in blocks), which is
//! the rest of block `a - c'` and blocks `a - c' + 1 ..= a' - c - 1` whole.

use super::grid::Grid;

/// Range minima over a fixed array in O(1) (a sparse table).
#[derive(Debug)]
struct SparseMin {
    levels: Vec<Vec<f64>>,
}

impl SparseMin {
    fn new(values: Vec<f64>) -> Self {
        let mut levels = vec![values];
        let mut span = 1;
        while 2 * span <= levels[0].len() {
            let prev = levels.last().expect("a level");
            let next: Vec<f64> = (0..prev.len() - span)
                .map(|k| prev[k].min(prev[k + span]))
                .collect();
            levels.push(next);
            span *= 2;
        }
        Self { levels }
    }

    /// The least value over `lo ..= hi` (`lo <= hi` inside the array).
    fn min(&self, lo: usize, hi: usize) -> f64 {
        let level = (usize::BITS - 1 - (hi - lo + 1).leading_zeros()) as usize;
        let row = &self.levels[level];
        row[lo].min(row[hi + 1 - (1 << level)])
    }
}

/// One pair's cost by difference, at block resolution.
#[derive(Debug)]
pub(super) struct PairCost {
    left: f64,
    right: f64,
    /// The first and last blocks kept.
    first: i64,
    last: i64,
    /// Per kept block, the least over its differences but the first (`+inf` where the
    /// width is 1).
    rest: Vec<f64>,
    /// Per kept block, the least over all its differences.
    whole: SparseMin,
    /// The least over two bins of one block each, by the difference `δ` of their blocks,
    /// for `δ` in `first ..= last + 1` (`left` below, `right` above).
    by_blocks: Vec<f64>,
    /// `by_blocks` in reverse (for `δ` from `last + 1` down to `first`): read forwards
    /// where the other bin's block falls as the difference rises.
    by_blocks_reversed: Vec<f64>,
}

impl PairCost {
    /// The cost `cost(d)` of a pair, constant for `d <= dl` and for `d >= dr` (`dl < dr`),
    /// at the blocks of `width`.
    pub(super) fn new(cost: impl Fn(i64) -> f64, dl: i64, dr: i64, width: u64) -> Self {
        let w = width as i64;
        let (first, last) = (dl.div_euclid(w), dr.div_euclid(w));
        let mut rest = Vec::with_capacity((last - first + 1) as usize);
        let mut whole = Vec::with_capacity(rest.capacity());
        for k in first..=last {
            let at = cost(k * w);
            let r = (k * w + 1..k * w + w)
                .map(&cost)
                .fold(f64::INFINITY, f64::min);
            rest.push(r);
            whole.push(at.min(r));
        }
        let mut pair = Self {
            left: cost(dl),
            right: cost(dr),
            first,
            last,
            rest,
            whole: SparseMin::new(whole),
            by_blocks: Vec::new(),
            by_blocks_reversed: Vec::new(),
        };
        pair.by_blocks = (first..=last + 1).map(|d| pair.least(d - 1, d)).collect();
        pair.by_blocks_reversed = pair.by_blocks.iter().rev().copied().collect();
        pair
    }

    /// The least cost over two bins of one block each whose blocks differ by `first + k`
    /// (`k` in `0 ..= last + 1 - first`; the bins' differences are then the rest of block
    /// `first + k - 1` and block `first + k` whole).
    pub(super) fn by_blocks(&self) -> &[f64] {
        &self.by_blocks
    }

    /// [`Self::by_blocks`] in reverse: entry `k` is for the difference `last + 1 - k`.
    pub(super) fn by_blocks_reversed(&self) -> &[f64] {
        &self.by_blocks_reversed
    }

    /// The value for every difference at or below the kept blocks.
    pub(super) fn left(&self) -> f64 {
        self.left
    }

    /// The value for every difference at or above the kept blocks.
    pub(super) fn right(&self) -> f64 {
        self.right
    }

    /// The kept blocks, `(first, last)`: below `first` the cost is `left`, above `last`
    /// it is `right`.
    pub(super) fn kept(&self) -> (i64, i64) {
        (self.first, self.last)
    }

    /// The least cost over differences `k0 w + 1 ..= (k1 + 1) w - 1` (`k0 < k1 + 1`).
    fn least(&self, k0: i64, k1: i64) -> f64 {
        let head = if k0 < self.first {
            self.left
        } else if k0 > self.last {
            self.right
        } else {
            self.rest[(k0 - self.first) as usize]
        };
        let (lo, hi) = (k0 + 1, k1);
        let mut best = head;
        if lo < self.first {
            best = best.min(self.left);
        }
        if hi > self.last {
            best = best.min(self.right);
        }
        let (a, b) = (lo.max(self.first), hi.min(self.last));
        if a <= b {
            let base = self.first;
            best = best.min(self.whole.min((a - base) as usize, (b - base) as usize));
        }
        best
    }

    /// The least cost over bin `p` of the first request and bin `q` of the second.
    pub(super) fn binned(&self, grid: &Grid, p: usize, q: usize) -> f64 {
        let (a, a2) = grid.blocks(p);
        let (c, c2) = grid.blocks(q);
        self.least(a - c2, a2 - c - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binned_costs_are_the_least_over_the_bins_differences() {
        // A bumpy cost, constant below -7 and above 9.
        let cost = |d: i64| {
            let d = d.clamp(-7, 9);
            ((d * 37).rem_euclid(11) as f64) + if d < 0 { 5.0 } else { 0.0 }
        };
        for width in [1u64, 2, 3, 5] {
            let pair = PairCost::new(cost, -7, 9, width);
            let grid = Grid::new(width, 12, 60);
            for p in 0..grid.bins() {
                for q in 0..grid.bins() {
                    let (m_lo, m_hi) = (grid.least(p) as i64, grid.least(p + 1) as i64 - 1);
                    let (n_lo, n_hi) = (grid.least(q) as i64, grid.least(q + 1) as i64 - 1);
                    let brute = (m_lo - n_hi..=m_hi - n_lo)
                        .map(cost)
                        .fold(f64::INFINITY, f64::min);
                    assert_eq!(pair.binned(&grid, p, q), brute, "w {width} p {p} q {q}");
                    let (a, a2) = grid.blocks(p);
                    let (c, c2) = grid.blocks(q);
                    let k = a - c - pair.kept().0;
                    if a2 == a + 1 && c2 == c + 1 && k >= 0 && k < pair.by_blocks().len() as i64 {
                        assert_eq!(pair.by_blocks()[k as usize], brute);
                        let back = pair.by_blocks().len() - 1 - k as usize;
                        assert_eq!(pair.by_blocks_reversed()[back], brute);
                    }
                }
            }
        }
    }
}
