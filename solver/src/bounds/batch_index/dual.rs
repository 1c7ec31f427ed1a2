//! The dual of the local-polytope relaxation of a pairwise problem over binned batch
//! counts, raised by MPLP's edge updates (Globerson and Jaakkola 2007): messages
//! `lambda` per pair and side, each request's belief its unary cost plus its incoming
//! messages. For any messages, `sum_j min_p belief_j(p)` plus, over the pairs, the least
//! of `cost(p, q) - lambda_i(p) - lambda_j(q)` is at most the problem's minimum; the
//! updates keep the second sum at 0 or above and raise the first, and the answer is that
//! sum computed afresh from the final messages (so rounding in the updates cannot make it
//! invalid).

use std::time::{Duration, Instant};

use super::grid::Grid;
use super::pairs::PairCost;

/// The bins a request's batch count may take: global bins `first .. first + len`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Domain {
    pub(super) first: usize,
    pub(super) len: usize,
}

/// A pair of requests (`i < j`) and its cost by `m_i - m_j`.
#[derive(Debug)]
pub(super) struct Pair {
    pub(super) i: usize,
    pub(super) j: usize,
    pub(super) cost: PairCost,
}

/// The binned pairwise problem: minimize `fixed + sum_j unary_j(p_j) + sum_pairs
/// cost(p_i, p_j)`.
#[derive(Debug)]
pub(super) struct Model {
    pub(super) grid: Grid,
    pub(super) domains: Vec<Domain>,
    pub(super) unary: Vec<Vec<f64>>,
    pub(super) pairs: Vec<Pair>,
    pub(super) fixed: f64,
}

/// How long the updates run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Effort {
    /// The most sweeps over the pairs.
    pub(super) sweeps: usize,
    /// Stop once a sweep raised the beliefs' sum by less than this share of it.
    pub(super) min_gain: f64,
    /// No sweep starts that would end after this, by the last one's time (the final
    /// evaluation takes about half a sweep more).
    pub(super) deadline: Instant,
}

/// Per pair, the messages to its first and to its second request.
pub(super) type Messages = Vec<(Vec<f64>, Vec<f64>)>;

/// Scratch rows for one min-plus product.
#[derive(Default)]
struct Scratch {
    prefix: Vec<f64>,
    suffix: Vec<f64>,
}

impl Scratch {
    fn fill(&mut self, a: &[f64]) {
        self.prefix.clear();
        self.suffix.clear();
        let mut m = f64::INFINITY;
        for &x in a {
            m = m.min(x);
            self.prefix.push(m);
        }
        self.suffix.resize(a.len(), f64::INFINITY);
        let mut m = f64::INFINITY;
        for (k, &x) in a.iter().enumerate().rev() {
            m = m.min(x);
            self.suffix[k] = m;
        }
    }
}

impl Model {
    /// `out[p] = min_q cost(p, q) + a[q]` over the first request's bins `p`.
    fn to_first(&self, pair: &Pair, a: &[f64], out: &mut [f64], s: &mut Scratch) {
        let (di, dj) = (self.domains[pair.i], self.domains[pair.j]);
        let (first, last) = pair.cost.kept();
        s.fill(a);
        for (p, slot) in out.iter_mut().enumerate() {
            let (a0, a1) = self.grid.blocks(di.first + p);
            // Right-constant where a0 - c' > last, left-constant where a1 - c - 1 < first.
            let qr = self
                .grid
                .first_ending_above(dj.first, dj.len, a0 - last - 1);
            let ql = self
                .grid
                .first_starting_above(dj.first, dj.len, a1 - 1 - first)
                .max(qr);
            let mut best = f64::INFINITY;
            if qr > 0 {
                best = pair.cost.right() + s.prefix[qr - 1];
            }
            if ql < dj.len {
                best = best.min(pair.cost.left() + s.suffix[ql]);
            }
            *slot = best.min(self.band(pair, di.first + p, dj.first, qr..ql, a, false));
        }
    }

    /// `out[q] = min_p cost(p, q) + a[p]` over the second request's bins `q`.
    fn to_second(&self, pair: &Pair, a: &[f64], out: &mut [f64], s: &mut Scratch) {
        let (di, dj) = (self.domains[pair.i], self.domains[pair.j]);
        let (first, last) = pair.cost.kept();
        s.fill(a);
        for (q, slot) in out.iter_mut().enumerate() {
            let (c0, c1) = self.grid.blocks(dj.first + q);
            // Left-constant where a' <= c + first, right-constant where a > c' + last.
            let pl = self.grid.first_ending_above(di.first, di.len, c0 + first);
            let pr = self
                .grid
                .first_starting_above(di.first, di.len, c1 + last)
                .max(pl);
            let mut best = f64::INFINITY;
            if pl > 0 {
                best = pair.cost.left() + s.prefix[pl - 1];
            }
            if pr < di.len {
                best = best.min(pair.cost.right() + s.suffix[pr]);
            }
            *slot = best.min(self.band(pair, dj.first + q, di.first, pl..pr, a, true));
        }
    }

    /// The least `cost + a` over the other request's bins `others` (local indices of a
    /// domain starting at global bin `offset`) against global bin `at`; `at` is the
    /// second request's bin where `flipped`. Bins of one block each read the pair's
    /// table by block difference.
    fn band(
        &self,
        pair: &Pair,
        at: usize,
        offset: usize,
        others: std::ops::Range<usize>,
        a: &[f64],
        flipped: bool,
    ) -> f64 {
        let single = self.grid.single_blocks();
        let first = pair.cost.kept().0;
        let table = pair.cost.by_blocks();
        let mut best = f64::INFINITY;
        let split = if at < single {
            (offset + others.end).min(single).max(offset + others.start) - offset
        } else {
            others.start
        };
        // Both bins one block each: the block difference is the bins' difference.
        for (k, &ak) in a.iter().enumerate().take(split).skip(others.start) {
            let delta = if flipped {
                (offset + k) as i64 - at as i64
            } else {
                at as i64 - (offset + k) as i64
            };
            best = best.min(table[(delta - first) as usize] + ak);
        }
        for (k, &ak) in a.iter().enumerate().take(others.end).skip(split) {
            let c = if flipped {
                pair.cost.binned(&self.grid, offset + k, at)
            } else {
                pair.cost.binned(&self.grid, at, offset + k)
            };
            best = best.min(c + ak);
        }
        best
    }

    /// The dual value of `messages` (`(to i, to j)` per pair), computed afresh.
    fn dual_value(&self, messages: &Messages) -> f64 {
        let mut beliefs = self.unary.clone();
        let mut s = Scratch::default();
        let mut edges = 0.0;
        for (pair, (li, lj)) in self.pairs.iter().zip(messages) {
            add(&mut beliefs[pair.i], li, 1.0);
            add(&mut beliefs[pair.j], lj, 1.0);
            let minus: Vec<f64> = lj.iter().map(|x| -x).collect();
            let mut row = vec![0.0; li.len()];
            self.to_first(pair, &minus, &mut row, &mut s);
            edges += row
                .iter()
                .zip(li)
                .map(|(r, l)| r - l)
                .fold(f64::INFINITY, f64::min);
        }
        self.fixed + edges + beliefs.iter().map(|b| least(b)).sum::<f64>()
    }

    /// Each request's batch count where its belief under `messages` is least (the least
    /// count of that bin, at least `floor`): a point to start a search for a low `Phi`.
    pub(super) fn decode(&self, messages: &Messages, floor: &[u64]) -> Vec<u64> {
        let mut beliefs = self.unary.clone();
        for (pair, (li, lj)) in self.pairs.iter().zip(messages) {
            add(&mut beliefs[pair.i], li, 1.0);
            add(&mut beliefs[pair.j], lj, 1.0);
        }
        beliefs
            .iter()
            .zip(&self.domains)
            .zip(floor)
            .map(|((b, d), &f)| {
                let best = (0..b.len()).fold(0, |k, q| if b[q] < b[k] { q } else { k });
                self.grid.least(d.first + best).max(f)
            })
            .collect()
    }

    /// Messages of 0 (the dual value is then the unary terms' least values).
    pub(super) fn zero_messages(&self) -> Messages {
        self.pairs
            .iter()
            .map(|p| {
                (
                    vec![0.0; self.domains[p.i].len],
                    vec![0.0; self.domains[p.j].len],
                )
            })
            .collect()
    }

    /// `coarse`'s messages on this model's bins, each bin taking its coarse bin's (this
    /// grid refines `coarse`'s, with the same requests and pairs): the pair costs of finer
    /// bins are no lower, so the messages stay feasible and the dual value no lower.
    pub(super) fn transfer(&self, coarse: &Model, messages: &Messages) -> Messages {
        let parent = |j: usize, q: usize| -> usize {
            let d = coarse.domains[j];
            let at = coarse
                .grid
                .bin_of(self.grid.least(self.domains[j].first + q));
            at.clamp(d.first, d.first + d.len - 1) - d.first
        };
        self.pairs
            .iter()
            .zip(messages)
            .map(|(pair, (li, lj))| {
                let side = |j: usize, l: &[f64]| -> Vec<f64> {
                    (0..self.domains[j].len).map(|q| l[parent(j, q)]).collect()
                };
                (side(pair.i, li), side(pair.j, lj))
            })
            .collect()
    }

    /// MPLP's updates from `messages` within `effort`: the dual value of the messages they
    /// end with (computed afresh), and those messages.
    pub(super) fn raise(&self, mut messages: Messages, effort: Effort) -> (f64, Messages) {
        let mut beliefs = self.unary.clone();
        for (pair, (li, lj)) in self.pairs.iter().zip(&messages) {
            add(&mut beliefs[pair.i], li, 1.0);
            add(&mut beliefs[pair.j], lj, 1.0);
        }
        let mut s = Scratch::default();
        let mut last = beliefs.iter().map(|b| least(b)).sum::<f64>();
        let mut sweep_time = Duration::ZERO;
        for _ in 0..effort.sweeps {
            let began = Instant::now();
            if began + sweep_time >= effort.deadline {
                break;
            }
            for (pair, (li, lj)) in self.pairs.iter().zip(messages.iter_mut()) {
                self.update(pair, li, lj, &mut beliefs, &mut s);
            }
            sweep_time = began.elapsed();
            let now: f64 = beliefs.iter().map(|b| least(b)).sum();
            let gain = now - last;
            last = now;
            if gain <= effort.min_gain * now.abs() {
                break;
            }
        }
        (self.dual_value(&messages), messages)
    }

    /// MPLP's update of one pair's messages.
    fn update(
        &self,
        pair: &Pair,
        li: &mut [f64],
        lj: &mut [f64],
        beliefs: &mut [Vec<f64>],
        s: &mut Scratch,
    ) {
        add(&mut beliefs[pair.i], li, -1.0);
        add(&mut beliefs[pair.j], lj, -1.0);
        // The old messages are out of the beliefs: the min-plus products go in their place.
        let (ai, aj) = (&beliefs[pair.i], &beliefs[pair.j]);
        self.to_first(pair, aj, li, s);
        self.to_second(pair, ai, lj, s);
        for (l, a) in li.iter_mut().zip(ai) {
            *l = 0.5 * (*l - a);
        }
        for (l, a) in lj.iter_mut().zip(aj) {
            *l = 0.5 * (*l - a);
        }
        add(&mut beliefs[pair.i], li, 1.0);
        add(&mut beliefs[pair.j], lj, 1.0);
    }
}

/// `row += sign * by`.
fn add(row: &mut [f64], by: &[f64], sign: f64) {
    for (r, b) in row.iter_mut().zip(by) {
        *r += sign * b;
    }
}

/// The least entry.
fn least(row: &[f64]) -> f64 {
    row.iter().copied().fold(f64::INFINITY, f64::min)
}
