//! The batches from one count vector: the requests of each occupied slot distributed over
//! the slot's arcs within M, R_max, C and P.

use infersched_core::{Feature, Limits};

use super::Search;
use crate::graph::ArcKind;

/// The most batches enumerated from one count vector before the search gives up (many
/// distinct requests, each with its own choices, multiply them).
const MAX_MOVES: usize = 50_000;

/// What a batch holds while its moves are enumerated: KV after it, requests holding KV,
/// tokens processed and prefill tokens (the last two against C and P), and what it costs.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Load {
    pub kv: u64,
    pub holders: u64,
    pub tokens: u64,
    pub prefill: u64,
    /// The entries' own cost (ms), without the per-batch terms.
    pub ms: f64,
    pub has_prefill: bool,
    pub has_decode: bool,
}

impl Load {
    /// Whether the batch is within M, R_max, C and P.
    pub(super) fn fits(&self, limits: &Limits) -> bool {
        !(limits.kv_capacity.is_some_and(|m| self.kv > m)
            || limits.max_running.is_some_and(|r| self.holders > r)
            || limits.token_budget.is_some_and(|c| self.tokens > c)
            || limits
                .effective_prefill_budget()
                .is_some_and(|p| self.prefill > p))
    }

    /// Prompt tokens the batch can still take (C and P).
    pub(super) fn prompt_room(&self, limits: &Limits) -> u64 {
        let tokens = limits
            .token_budget
            .map_or(u64::MAX, |b| b.saturating_sub(self.tokens));
        let prefill = limits
            .effective_prefill_budget()
            .map_or(u64::MAX, |b| b.saturating_sub(self.prefill));
        tokens.min(prefill)
    }

    /// Whether a finished batch is one: it processes something, and mixes prefill with
    /// decode only where `no_mix` allows.
    pub(super) fn is_batch(&self, no_mix: bool) -> bool {
        (self.has_prefill || self.has_decode) && !(no_mix && self.has_prefill && self.has_decode)
    }

    /// The batch's duration (ms): its entries' cost plus the per-batch terms `theta` (ms,
    /// in [`Feature::ALL`] order) it pays.
    pub(super) fn duration(&self, theta: &[f64; 9]) -> f64 {
        self.ms
            + theta[Feature::One as usize]
            + if self.has_prefill {
                theta[Feature::HasPrefill as usize]
            } else {
                0.0
            }
            + if self.has_decode {
                theta[Feature::HasDecode as usize]
            } else {
                0.0
            }
    }
}

/// What a batch does: how many requests of `(class, arc)` take it.
pub(super) type Move = Vec<(usize, usize, u16)>;

impl Search<'_> {
    /// Calls `emit(next, duration_ms, move)` for every batch from `counts` (one processing
    /// at least one token) until it returns false. False when there were more than
    /// [`MAX_MOVES`] batches (or `emit` stopped the walk).
    pub(super) fn batches(
        &self,
        counts: &[u16],
        emit: impl FnMut(&[u16], f64, &Move) -> bool,
    ) -> bool {
        let mut walk = Walk {
            search: self,
            counts,
            occupied: (0..counts.len()).filter(|&i| counts[i] > 0).collect(),
            next: vec![0; counts.len()],
            mv: Vec::new(),
            emitted: 0,
            stopped: false,
            emit,
        };
        walk.go(0, Load::default());
        !walk.stopped
    }

    /// The move that takes `from` to `to` at cost `cost_ms` (duration times weight), for
    /// writing the schedule of the path found.
    pub(super) fn move_between(&self, from: &[u16], to: &[u16], cost_ms: f64, weight: f64) -> Move {
        let mut best: Option<(f64, Move)> = None;
        self.batches(from, |next, duration, mv| {
            if next == to {
                let miss = (duration * weight - cost_ms).abs();
                if best.as_ref().is_none_or(|(m, _)| miss < *m) {
                    best = Some((miss, mv.clone()));
                }
            }
            true
        });
        best.map(|(_, mv)| mv).unwrap_or_default()
    }
}

/// Enumerates the batches from one count vector: the requests of each occupied slot are
/// distributed over the slot's arcs, holding arcs first (within C, P, M and R_max), the
/// rest taking the slot's free arc.
struct Walk<'b, F> {
    search: &'b Search<'b>,
    counts: &'b [u16],
    occupied: Vec<usize>,
    /// The count vector after the batch built so far.
    next: Vec<u16>,
    mv: Move,
    emitted: usize,
    /// Set when there are more than `MAX_MOVES` batches or `emit` said stop.
    stopped: bool,
    emit: F,
}

impl<F: FnMut(&[u16], f64, &Move) -> bool> Walk<'_, F> {
    /// Distributes the requests of occupied slot `o` and after; `load` is what the batch
    /// holds so far.
    fn go(&mut self, o: usize, load: Load) {
        if self.stopped {
            return;
        }
        if o == self.occupied.len() {
            self.finish(load);
            return;
        }
        let n = self.counts[self.occupied[o]];
        self.assign(o, 0, n, load);
    }

    /// Moves `take` requests of `class` along arc `a` (or back, `sign` -1).
    fn shift(&mut self, class: usize, a: usize, take: u16, undo: bool) {
        let to = self.search.arc_to[class][a];
        if undo {
            self.next[to] -= take;
            self.mv.pop();
        } else {
            self.next[to] += take;
            self.mv.push((class, a, take));
        }
    }

    fn assign(&mut self, o: usize, h: usize, left: u16, load: Load) {
        let s = self.search;
        let slot = self.occupied[o];
        let class = s.slots[slot].class;
        let holding = &s.holding[slot];
        if h == holding.len() {
            if left > 0 {
                let Some(a) = s.free[slot] else { return };
                self.shift(class, a, left, false);
                self.go(o + 1, load);
                self.shift(class, a, left, true);
            } else {
                self.go(o + 1, load);
            }
            return;
        }
        let a = holding[h];
        let arc = &s.graphs[class].arcs[a];
        let (tokens, prefill, decode) = match arc.kind {
            ArcKind::Process { c, decode, .. } => (
                u64::from(c),
                if decode { 0 } else { u64::from(c) },
                Some(decode),
            ),
            _ => (0, 0, None),
        };
        for take in (0..=left).rev() {
            let t = u64::from(take);
            let mut next = Load {
                kv: load.kv + arc.kv * t,
                holders: load.holders + t,
                tokens: load.tokens + tokens * t,
                prefill: load.prefill + prefill * t,
                ms: load.ms,
                has_prefill: load.has_prefill,
                has_decode: load.has_decode,
            };
            if !next.fits(s.limits) {
                continue;
            }
            if take > 0 {
                if let Some(d) = decode {
                    next.ms += f64::from(take) * s.arc_ms[class][a];
                    next.has_decode |= d;
                    next.has_prefill |= !d;
                }
                self.shift(class, a, take, false);
            }
            self.assign(o, h + 1, left - take, next);
            if take > 0 {
                self.shift(class, a, take, true);
            }
        }
    }

    fn finish(&mut self, load: Load) {
        let s = self.search;
        if !load.is_batch(s.no_mix) {
            return;
        }
        let duration = load.duration(&s.theta);
        self.emitted += 1;
        if !(self.emit)(&self.next, duration, &self.mv) || self.emitted > MAX_MOVES {
            self.stopped = true;
        }
    }
}
