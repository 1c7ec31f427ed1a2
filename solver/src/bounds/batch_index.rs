//! The batch-index bound on the sum of completion times (milp.md, "The batch-index
//! bound"): a pairwise problem on how many batches each request spends in the system,
//! relaxed over the local polytope and bounded through its dual.
//!
//! **The identity.** Let `k_j` be the first batch starting at or after request `j`'s
//! arrival `T_j` and `c_j` its last batch; `m_j = c_j - k_j + 1 >= nb_j`, `j`'s fewest
//! batches. The batches `k_j ..= c_j` run one after the other after `T_j`, each lasting at
//! least the bias `b` plus its entries' least work (the prefill flag's surplus carried by
//! prompt tokens, at most `min(C, P)` of them per batch), so
//! `C_j >= T_j + b m_j + sum_i (i's least work in j's window)`.
//! A request `i` arriving no earlier than `j` has all its entries in batches from `k_i >=
//! k_j`, and at most `c_i - c_j <= m_i - m_j + D_ij` of them after `c_j`, where `D_ij =
//! ceil((T_i - T_j) / b)` bounds the batches starting in `[T_j, T_i)`; one arriving
//! earlier has at most `D_ji` entries before `k_j`, no more progress there than its entries
//! in `T_j - T_i` and one more batch allow (the batch in progress at `T_j`, whose part after
//! `T_j` delays `j` too: [`Setup::term`]), and at most `m_i - m_j` after `c_j`.
//! Either way its least work inside the window is a function of `m_i - m_j`
//! (`window::Progress::window_work`), so `sum_j C_j >= min over integers m_j >= nb_j of
//! Phi(m)`, `Phi` a sum of unary terms `T_j + b m_j + w_j` and one term per pair by the
//! difference of the two counts.
//!
//! **The relaxation.** Any `m` with `Phi(m) <= U` has `m_j <= nb_j + (U - base) / b`
//! (every pair term is at least 0), where `U` is `Phi` at a few points and `base` is `Phi`'s
//! unary part at `nb`: that is each request's horizon. The counts are grouped in bins
//! (module `grid`); each request's unary term is taken at its bin's least count and each
//! pair's at its least over the differences the two bins allow, so the binned problem's
//! minimum is at most `Phi`'s. Its local-polytope relaxation's dual (module `dual`) is a
//! bound at any messages; MPLP's updates raise it.
//!
//! **Scope.** Evictions only add entries and work, and memory, budgets and the running
//! limit only restrict schedules, so the bound holds in every policy class. It needs
//! non-negative cost coefficients and a positive bias. Memory is one message per pair and
//! bin; the bins are chosen so that it stays within [`MAX_CELLS`] and each sweep within
//! about [`SWEEP_WORK`] pair-bin products.

mod dual;
mod grid;
mod pairs;
mod rounds;
mod window;

use std::time::{Duration, Instant};

use infersched_core::{Limits, Request};

use super::Theta;
use dual::{Domain, Effort, Messages, Model, Pair};
use grid::Grid;
use pairs::PairCost;
use window::{Progress, Reach, least_reach};

/// The most message entries (pairs times bins), 8 bytes each: 512 MiB.
const MAX_CELLS: usize = 64 << 20;

/// About how many pair-bin products a sweep may cost per thread-second of the time limit
/// (2e7: 8e8, about 0.15 s of one thread on 32 requests of README family (c), for 21 s on
/// two threads; 2e8 a sweep before the products ran eight at a time, which left the bound
/// 0.15% lower there in the same time and the same on 64 requests), within
/// [`SWEEP_WORK_RANGE`].
const SWEEP_WORK: f64 = 2e7;

/// The least and the most pair-bin products a sweep may cost.
const SWEEP_WORK_RANGE: (f64, f64) = (2e8, 1.6e10);

/// The most requests: every ordered pair's relation is kept (48 bytes each, 48 MiB at this
/// count) before the bins are chosen, and at this count [`MAX_CELLS`] already leaves about
/// 50 bins a pair (on 128 requests of README family (c), 891 bins were not enough to pass
/// the machine relaxation).
const MAX_REQUESTS: usize = 1024;

/// The fewest bins in the uniform part worth a bound.
const MIN_BINS: u64 = 8;

/// The most sweeps at one width.
const MAX_SWEEPS: usize = 2_000;

/// At the finest width, stop once a sweep gains less than this share.
const MIN_GAIN: f64 = 1e-7;

/// At a coarser width, go finer once a sweep gains less than this share...
const LEVEL_GAIN: f64 = 1e-5;

/// ... or once it has had this share of the time left.
const LEVEL_SHARE: f64 = 0.3;

/// About how many bins the coarsest width has up to where most counts lie.
const COARSE_BINS: u64 = 64;

/// A lower bound on the sum of completion times (absolute seconds) within `time_limit_s`
/// on `threads` (the finest bins' width follows both: [`SWEEP_WORK`]), and a low point of
/// the pairwise problem searched for `descent_s` more (from the dual's beliefs); None where
/// it does not apply (a negative coefficient, no bias, fewer than two or more than
/// [`MAX_REQUESTS`] requests, too many pairs).
///
/// The dual is raised on coarse bins first, then on bins of half the width from the
/// coarser messages, down to the width [`Setup::width_for`] chooses: messages travel far
/// in few sweeps on coarse bins, and the finer bins' costs are never lower.
pub(super) fn sum_of_completions(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    time_limit_s: f64,
    descent_s: f64,
    threads: usize,
) -> Option<Relaxed> {
    let deadline = Instant::now() + Duration::try_from_secs_f64(time_limit_s.max(0.0)).ok()?;
    let setup = Setup::new(t, reqs, limits)?;
    let frame = setup.frame();
    let work = SWEEP_WORK * time_limit_s * threads as f64;
    let finest = setup.width_for(
        frame.uniform_end,
        work.clamp(SWEEP_WORK_RANGE.0, SWEEP_WORK_RANGE.1),
    )?;
    let mut width = finest;
    while frame.uniform_end / width.saturating_mul(2) >= COARSE_BINS {
        width *= 2;
    }
    let mut grid = Grid::new(width, frame.uniform_end, frame.most_batches());
    let mut best = f64::NEG_INFINITY;
    let mut coarser: Option<(Model, Messages)> = None;
    loop {
        let model = setup.model_on(grid.clone(), &frame)?;
        let messages = match &coarser {
            Some((coarse, m)) => model.transfer(coarse, m),
            None => model.zero_messages(),
        };
        let last = grid.width() <= finest;
        let now = Instant::now();
        let effort = Effort {
            sweeps: MAX_SWEEPS,
            min_gain: if last { MIN_GAIN } else { LEVEL_GAIN },
            deadline: if last {
                deadline
            } else {
                now + deadline.saturating_duration_since(now).mul_f64(LEVEL_SHARE)
            },
            threads,
        };
        let (value, messages) = model.raise(messages, effort);
        best = best.max(value);
        match grid.refined() {
            Some(finer) if !last && Instant::now() < deadline => {
                coarser = Some((model, messages));
                grid = finer;
            }
            _ => {
                coarser = Some((model, messages));
                break;
            }
        }
    }
    let (model, messages) = coarser?;
    let mut counts = model.decode(&messages, &frame.nb);
    let descent = Duration::try_from_secs_f64(descent_s.max(0.0)).ok()?;
    setup.descend(&mut counts, &frame, grid.width(), Instant::now() + descent);
    best.is_finite().then(|| Relaxed {
        sum_s: best - best.abs() * 1e-12,
        counts,
    })
}

/// The bound and a low point of the pairwise problem.
pub(super) struct Relaxed {
    /// The bound on the sum of completion times (absolute seconds).
    pub(super) sum_s: f64,
    /// Batch counts where `Phi` is low: from the dual's beliefs, improved one request at a
    /// time (a guide for a schedule, not a bound).
    pub(super) counts: Vec<u64>,
}

/// Where the requests' batch counts may lie.
struct Frame {
    /// Each request's fewest batches.
    nb: Vec<u64>,
    /// Each request's most batches in a minimizer.
    horizon: Vec<u64>,
    /// Where uniform bins end: all requests' fewest batches together.
    uniform_end: u64,
}

impl Frame {
    /// The largest horizon.
    fn most_batches(&self) -> u64 {
        self.horizon.iter().copied().max().unwrap_or(0)
    }
}

/// How request `i` stands to request `j`'s window.
#[derive(Debug, Clone, Copy)]
struct Relation {
    /// The most `i` can have done before `j`'s window (nothing where it arrives no earlier).
    before: Reach,
    /// The most `i` can have done in batches that end by `j`'s arrival (`before` but for
    /// the batch in progress then).
    ended: Reach,
    /// How much earlier `i` arrives (0 where it does not).
    gap: f64,
    /// Where `i` arrives no earlier, the most batches starting from `j`'s arrival to `i`'s
    /// (`c_i - c_j <= m_i - m_j + shift`); else 0.
    shift: u64,
}

/// What the bound needs of the requests.
struct Setup<'a> {
    progress: Vec<Progress<'a>>,
    /// Each request's least work in its own window (`w_j`).
    own_work: Vec<f64>,
    bias: f64,
    /// `relations[i * n + j]`: `i` to `j`'s window.
    relations: Vec<Relation>,
}

impl<'a> Setup<'a> {
    fn new(t: &'a Theta<'a>, reqs: &[Request], limits: &Limits) -> Option<Self> {
        let bias = t.batch_bias();
        let n = reqs.len();
        if !(2..=MAX_REQUESTS).contains(&n) || !t.non_negative() || bias.is_nan() || bias <= 0.0 {
            return None;
        }
        let progress: Vec<Progress<'a>> =
            reqs.iter().map(|r| Progress::new(t, *r, limits)).collect();
        let own_work: Vec<f64> = progress
            .iter()
            .map(|p| p.window_work(Progress::NONE, 0))
            .collect();
        let mut setup = Self {
            progress,
            own_work,
            bias,
            relations: Vec::new(),
        };
        setup.relations = setup.relations();
        setup
            .own_work
            .iter()
            .all(|w| w.is_finite())
            .then_some(setup)
    }

    /// Every request's relation to every window.
    fn relations(&self) -> Vec<Relation> {
        let n = self.progress.len();
        let mut out = Vec::with_capacity(n * n);
        for pi in &self.progress {
            for pj in &self.progress {
                let gap = pj.arrival() - pi.arrival();
                out.push(if gap > 0.0 {
                    let entries = pi.reach_in_entries(self.batches_in(gap));
                    let ended = least_reach(entries, pi.done_in_time(gap, self.bias));
                    Relation {
                        before: least_reach(entries, pi.one_more(ended)),
                        ended,
                        gap,
                        shift: 0,
                    }
                } else {
                    Relation {
                        before: Progress::NONE,
                        ended: Progress::NONE,
                        gap: 0.0,
                        shift: self.batches_in(-gap),
                    }
                });
            }
        }
        out
    }

    /// The most batches that can start in a gap of `gap` seconds (each lasts at least the
    /// bias), rounded up so that rounding never lowers it.
    fn batches_in(&self, gap: f64) -> u64 {
        if gap <= 0.0 {
            return 0;
        }
        let x = gap / self.bias * (1.0 + 1e-9) + 1e-9;
        if x >= 1e15 {
            u64::MAX / 4
        } else {
            x.ceil() as u64
        }
    }

    /// Request `i`'s least work in `j`'s window where `m_i - m_j = d`.
    ///
    /// Where `i` arrives earlier and has an entry in the batch in progress at `j`'s
    /// arrival, that batch's part after the arrival delays `j` too: it lasts at least the
    /// entries' work less the time since it started, at most `gap` for each of them, so `i`
    /// adds its work there and in the window, less `gap`.
    fn term(&self, i: usize, j: usize, d: i64) -> f64 {
        let rel = self.relations[i * self.progress.len() + j];
        let after = (d as i128 + i128::from(rel.shift)).max(0);
        let after = u64::try_from(after).unwrap_or(u64::MAX);
        let progress = &self.progress[i];
        let window = progress.window_work(rel.before, after);
        if rel.gap > 0.0 {
            window.max(progress.window_work(rel.ended, after) - rel.gap)
        } else {
            window
        }
    }

    /// The differences `dl < dr` at or below which and at or above which the pair's cost
    /// `term(i, j, d) + term(j, i, -d)` is constant: `term(i, j, d)` changes only for `d +
    /// shift` in `0 .. nb_i`, and not at all where `i` may be done before `j`'s window.
    fn pair_range(&self, i: usize, j: usize) -> (i64, i64) {
        let n = self.progress.len();
        let clamp = |x: u64| x.min(i64::MAX as u64 / 8) as i64;
        let changing = |a: usize, b: usize| {
            let rel = self.relations[a * n + b];
            let moves = self.progress[a].window_work(rel.ended, 0) > 0.0;
            moves.then(|| {
                (
                    -clamp(rel.shift),
                    clamp(self.progress[a].batches()) - clamp(rel.shift),
                )
            })
        };
        // term(j, i, -d) changes for -d in (lo, hi), that is d in (-hi, -lo).
        let ranges = [changing(i, j), changing(j, i).map(|(lo, hi)| (-hi, -lo))];
        let (dl, dr) = ranges
            .into_iter()
            .flatten()
            .fold((i64::MAX, i64::MIN), |(l, r), (lo, hi)| {
                (l.min(lo), r.max(hi))
            });
        if dl < dr { (dl, dr) } else { (0, 1) }
    }

    /// `Phi` at the batch counts `m`.
    fn phi(&self, m: &[u64]) -> f64 {
        let n = m.len();
        let mut total = 0.0;
        for j in 0..n {
            total += self.progress[j].arrival() + self.bias * m[j] as f64 + self.own_work[j];
            for i in (0..n).filter(|&i| i != j) {
                total += self.term(i, j, m[i] as i64 - m[j] as i64);
            }
        }
        total
    }

    /// `Phi`'s terms that involve request `j` at counts `m`.
    fn phi_of(&self, m: &[u64], j: usize) -> f64 {
        let mut total = self.bias * m[j] as f64;
        for i in (0..m.len()).filter(|&i| i != j) {
            let d = m[i] as i64 - m[j] as i64;
            total += self.term(i, j, d) + self.term(j, i, -d);
        }
        total
    }

    /// Lowers `Phi` at `m` one request at a time (each moved to its best count, tried every
    /// `step` batches up to the others' last count and its own fewest batches past it,
    /// then batch by batch around the best), until no move helps, or `deadline`.
    fn descend(&self, m: &mut [u64], frame: &Frame, step: u64, deadline: Instant) {
        let step = step.max(1);
        let mut moved = true;
        while moved && Instant::now() < deadline {
            moved = false;
            for j in 0..m.len() {
                let before = m[j];
                let top = m.iter().copied().max().unwrap_or(0) + frame.nb[j];
                let coarse = (frame.nb[j]..=top).step_by(step as usize);
                let best = self.best_count(m, j, before, coarse);
                let fine = best.saturating_sub(step).max(frame.nb[j])..best + step;
                m[j] = self.best_count(m, j, best, fine);
                moved |= m[j] != before;
            }
        }
    }

    /// The count among `at` and `candidates` where `Phi` is least, the others at `m`
    /// (ties kept at `at`).
    fn best_count(
        &self,
        m: &mut [u64],
        j: usize,
        at: u64,
        candidates: impl Iterator<Item = u64>,
    ) -> u64 {
        m[j] = at;
        let mut best = (self.phi_of(m, j), at);
        for v in candidates {
            m[j] = v;
            let value = self.phi_of(m, j);
            if value < best.0 - 1e-12 * value.abs() {
                best = (value, v);
            }
        }
        m[j] = best.1;
        best.1
    }

    /// The least `Phi` at a few points: every request at its fewest batches, and requests
    /// in waves of 1, 2, 4, ... in order of arrival then least work, each wave starting
    /// together once the last one is done.
    fn upper(&self) -> f64 {
        let nb: Vec<u64> = self.progress.iter().map(Progress::batches).collect();
        let mut order: Vec<usize> = (0..nb.len()).collect();
        order.sort_by(|&a, &b| {
            let (pa, pb) = (&self.progress[a], &self.progress[b]);
            (pa.arrival().total_cmp(&pb.arrival()))
                .then(self.own_work[a].total_cmp(&self.own_work[b]))
                .then(a.cmp(&b))
        });
        let mut best = self.phi(&nb);
        let mut wave = 1;
        while wave < nb.len() {
            let mut m = nb.clone();
            let mut start = 0u64;
            for group in order.chunks(wave) {
                let mut end = start;
                for &k in group {
                    m[k] = start.saturating_add(nb[k]);
                    end = end.max(m[k]);
                }
                start = end;
            }
            best = best.min(self.phi(&m));
            wave *= 2;
        }
        best
    }

    /// The requests' fewest batches and horizons.
    fn frame(&self) -> Frame {
        let n = self.progress.len();
        let nb: Vec<u64> = self.progress.iter().map(Progress::batches).collect();
        let base: f64 = (0..n)
            .map(|j| self.progress[j].arrival() + self.bias * nb[j] as f64 + self.own_work[j])
            .sum();
        let slack = ((self.upper() - base) / self.bias).max(0.0);
        let slack = if slack >= 1e15 {
            1u64 << 50
        } else {
            slack as u64
        };
        let horizon = nb.iter().map(|&b| b.saturating_add(slack)).collect();
        let uniform_end = nb.iter().fold(0u64, |a, &b| a.saturating_add(b));
        Frame {
            nb,
            horizon,
            uniform_end,
        }
    }

    /// The binned model on `grid`.
    fn model_on(&self, grid: Grid, frame: &Frame) -> Option<Model> {
        let n = self.progress.len();
        let domains: Vec<Domain> = (0..n)
            .map(|j| {
                let first = grid.bin_of(frame.nb[j]);
                Domain {
                    first,
                    len: grid.bin_of(frame.horizon[j]) - first + 1,
                }
            })
            .collect();
        let unary: Vec<Vec<f64>> = (0..n)
            .map(|j| {
                let at = self.progress[j].arrival() + self.own_work[j];
                let least = |q: usize| grid.least(domains[j].first + q).max(frame.nb[j]);
                (0..domains[j].len)
                    .map(|q| at + self.bias * least(q) as f64)
                    .collect()
            })
            .collect();
        let (pairs, fixed) = self.pairs(&grid, &domains, frame)?;
        let ends: Vec<(usize, usize)> = pairs.iter().map(|p| (p.i, p.j)).collect();
        let (order, rounds) = rounds::in_rounds(n, &ends);
        let mut pairs: Vec<Option<Pair>> = pairs.into_iter().map(Some).collect();
        let pairs = order.iter().filter_map(|&k| pairs[k].take()).collect();
        Some(Model {
            grid,
            domains,
            unary,
            pairs,
            rounds,
            fixed,
        })
    }

    /// The finest bins' width: about `sqrt(work / 2n)` bins up to `uniform_end` (a sweep
    /// costs about `2 n` times the bins squared pair-bin products, `work` the most it may
    /// cost), fewer where the messages would pass [`MAX_CELLS`]; None below [`MIN_BINS`].
    fn width_for(&self, uniform_end: u64, work: f64) -> Option<u64> {
        let n = self.progress.len();
        let by_time = (work / (2.0 * n as f64)).sqrt();
        let pairs = (n * (n - 1) / 2) as f64;
        let by_memory = MAX_CELLS as f64 / (2.0 * pairs) * 0.8;
        let bins = by_time.min(by_memory).floor() as u64;
        (bins >= MIN_BINS).then(|| uniform_end.div_ceil(bins).max(1))
    }

    /// Every pair whose cost is not constant where the two counts may lie (the same pairs
    /// on every grid, so that messages carry from one to a finer one), and the constant
    /// ones' sum; None past [`MAX_CELLS`].
    fn pairs(&self, grid: &Grid, domains: &[Domain], frame: &Frame) -> Option<(Vec<Pair>, f64)> {
        let n = domains.len();
        let (mut pairs, mut fixed, mut cells) = (Vec::new(), 0.0, 0usize);
        let count = |x: u64| x.min(i64::MAX as u64 / 8) as i64;
        for i in 0..n {
            for j in i + 1..n {
                let (dl, dr) = self.pair_range(i, j);
                let cost = |d: i64| self.term(i, j, d) + self.term(j, i, -d);
                let least_d = count(frame.nb[i]) - count(frame.horizon[j]);
                let most_d = count(frame.horizon[i]) - count(frame.nb[j]);
                if most_d <= dl {
                    fixed += cost(dl);
                } else if least_d >= dr {
                    fixed += cost(dr);
                } else {
                    cells += domains[i].len + domains[j].len;
                    if cells > MAX_CELLS {
                        return None;
                    }
                    let cost = PairCost::new(cost, dl, dr, grid.width());
                    pairs.push(Pair { i, j, cost });
                }
            }
        }
        Some((pairs, fixed))
    }
}

#[cfg(test)]
mod tests;
