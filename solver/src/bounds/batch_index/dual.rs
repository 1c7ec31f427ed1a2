//! The dual of the local-polytope relaxation of a pairwise problem over binned batch
//! counts, raised by MPLP's edge updates (Globerson and Jaakkola 2007): messages
//! `lambda` per pair and side, each request's belief its unary cost plus its incoming
//! messages. For any messages, `sum_j min_p belief_j(p)` plus, over the pairs, the least
//! of `cost(p, q) - lambda_i(p) - lambda_j(q)` is at most the problem's minimum; the
//! updates keep the second sum at 0 or above and raise the first, and the answer is that
//! sum computed afresh from the final messages (so rounding in the updates cannot make it
//! invalid).

use std::ops::Range;
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::grid::{Cursor, Grid};
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
    /// The pairs, a round after another (module `rounds`).
    pub(super) pairs: Vec<Pair>,
    /// Each round's pairs: no request in two of them.
    pub(super) rounds: Vec<Range<usize>>,
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
    /// How many threads share each round's updates (the same results at any count).
    pub(super) threads: usize,
}

/// Per pair, the messages to its first and to its second request.
pub(super) type Messages = Vec<(Vec<f64>, Vec<f64>)>;

/// One thread's part of a sweep: per round, the index of its first pair and those pairs'
/// messages (none where the round has too few pairs).
type Share<'a> = Vec<(usize, &'a mut [(Vec<f64>, Vec<f64>)])>;

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
        let mut cursor = Cursor::new(dj.first, dj.len);
        for (p, slot) in out.iter_mut().enumerate() {
            let (a0, a1) = self.grid.blocks(di.first + p);
            // Right-constant where a0 - c' > last, left-constant where a1 - c - 1 < first
            // (both rise with `p`).
            let qr = cursor.ending_above(&self.grid, a0 - last - 1);
            let ql = cursor.starting_above(&self.grid, a1 - 1 - first).max(qr);
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
        let mut cursor = Cursor::new(di.first, di.len);
        for (q, slot) in out.iter_mut().enumerate() {
            let (c0, c1) = self.grid.blocks(dj.first + q);
            // Left-constant where a' <= c + first, right-constant where a > c' + last (both
            // rise with `q`).
            let pl = cursor.ending_above(&self.grid, c0 + first);
            let pr = cursor.starting_above(&self.grid, c1 + last).max(pl);
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
        let split = if at < single {
            (offset + others.end).min(single).max(offset + others.start) - offset
        } else {
            others.start
        };
        // Both bins one block each: the block difference is the bins' difference, so the
        // table is read at consecutive entries (forwards, or in reverse where `at` is the
        // first request's bin and the difference falls as `k` rises).
        let ks = others.start..split;
        let mut best = if ks.is_empty() {
            f64::INFINITY
        } else if flipped {
            let from = (offset + ks.start) as i64 - at as i64 - first;
            let table = &pair.cost.by_blocks()[from as usize..][..ks.len()];
            min_plus(table, &a[ks])
        } else {
            // Entry `at - (offset + k) - first` of the table, reversed: `len - 1 - that`.
            let len = pair.cost.by_blocks().len() as i64;
            let from = len - 1 - (at as i64 - (offset + ks.start) as i64 - first);
            let table = &pair.cost.by_blocks_reversed()[from as usize..][..ks.len()];
            min_plus(table, &a[ks])
        };
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
        let beliefs: Vec<Mutex<Vec<f64>>> = beliefs.into_iter().map(Mutex::new).collect();
        let total = |beliefs: &[Mutex<Vec<f64>>]| -> f64 {
            beliefs
                .iter()
                .map(|b| least(&b.lock().unwrap_or_else(PoisonError::into_inner)))
                .sum()
        };
        let mut last = total(&beliefs);
        let mut sweep_time = Duration::ZERO;
        for _ in 0..effort.sweeps {
            let began = Instant::now();
            if began + sweep_time >= effort.deadline {
                break;
            }
            self.sweep(&mut messages, &beliefs, effort.threads);
            sweep_time = began.elapsed();
            let now = total(&beliefs);
            let gain = now - last;
            last = now;
            if gain <= effort.min_gain * now.abs() {
                break;
            }
        }
        (self.dual_value(&messages), messages)
    }

    /// One sweep of updates over the pairs, round by round; each round's pairs split in
    /// runs among `threads`, which wait for one another at the round's end.
    fn sweep(&self, messages: &mut Messages, beliefs: &[Mutex<Vec<f64>>], threads: usize) {
        let threads = threads.clamp(1, 64);
        let mut shares: Vec<Share<'_>> = (0..threads).map(|_| Vec::new()).collect();
        let mut rest: &mut [(Vec<f64>, Vec<f64>)] = messages;
        for round in &self.rounds {
            let (mine, tail) = rest.split_at_mut(round.len());
            rest = tail;
            let per = round.len().div_ceil(threads).max(1);
            let mut chunks = mine.chunks_mut(per);
            for (t, share) in shares.iter_mut().enumerate() {
                let chunk = chunks.next().unwrap_or_default();
                share.push((round.start + t * per, chunk));
            }
        }
        if threads == 1 {
            let share = shares.pop().unwrap_or_default();
            self.run_share(share, beliefs, None);
            return;
        }
        let barrier = Barrier::new(threads);
        std::thread::scope(|scope| {
            let mut shares = shares.into_iter();
            let own = shares.next().unwrap_or_default();
            for share in shares {
                let barrier = &barrier;
                scope.spawn(move || self.run_share(share, beliefs, Some(barrier)));
            }
            self.run_share(own, beliefs, Some(&barrier));
        });
    }

    /// A thread's updates, round by round (waiting at `barrier` after each).
    fn run_share(&self, share: Share<'_>, beliefs: &[Mutex<Vec<f64>>], barrier: Option<&Barrier>) {
        let mut s = Scratch::default();
        let lock = |k: usize| beliefs[k].lock().unwrap_or_else(PoisonError::into_inner);
        for (start, messages) in share {
            for (k, (li, lj)) in messages.iter_mut().enumerate() {
                let pair = &self.pairs[start + k];
                // No other thread holds these in this round.
                let (mut bi, mut bj) = (lock(pair.i), lock(pair.j));
                self.update(pair, li, lj, &mut bi, &mut bj, &mut s);
            }
            if let Some(b) = barrier {
                b.wait();
            }
        }
    }

    /// MPLP's update of one pair's messages (`bi`, `bj`: the two requests' beliefs).
    fn update(
        &self,
        pair: &Pair,
        li: &mut [f64],
        lj: &mut [f64],
        bi: &mut [f64],
        bj: &mut [f64],
        s: &mut Scratch,
    ) {
        add(bi, li, -1.0);
        add(bj, lj, -1.0);
        // The old messages are out of the beliefs: the min-plus products go in their place.
        self.to_first(pair, bj, li, s);
        self.to_second(pair, bi, lj, s);
        for (l, a) in li.iter_mut().zip(bi.iter()) {
            *l = 0.5 * (*l - a);
        }
        for (l, a) in lj.iter_mut().zip(bj.iter()) {
            *l = 0.5 * (*l - a);
        }
        add(bi, li, 1.0);
        add(bj, lj, 1.0);
    }
}

/// The least `table[k] + a[k]` (`+inf` for none): eight running minima, which the
/// compiler keeps in vector registers, since this is where a sweep spends its time.
fn min_plus(table: &[f64], a: &[f64]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [f64::INFINITY; LANES];
    let (tc, ac) = (table.chunks_exact(LANES), a.chunks_exact(LANES));
    let (tr, ar) = (tc.remainder(), ac.remainder());
    for (t, x) in tc.zip(ac) {
        for l in 0..LANES {
            let s = t[l] + x[l];
            if s < acc[l] {
                acc[l] = s;
            }
        }
    }
    for (l, (t, x)) in tr.iter().zip(ar).enumerate() {
        let s = t + x;
        if s < acc[l] {
            acc[l] = s;
        }
    }
    let mut best = acc[0];
    for &x in &acc[1..] {
        if x < best {
            best = x;
        }
    }
    best
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
