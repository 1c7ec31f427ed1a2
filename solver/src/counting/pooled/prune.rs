//! Cutting off hopeless batches while the pooled search enumerates them (makespan).
//!
//! A batch from a vector leads to a vector whose estimate total `f = g + duration +
//! estimate` decides whether the search keeps it: at or above the cutoff (the incumbent) it
//! is dropped. With evictions, family (a) with C = 64 (n = 12) enumerates about 1,700
//! batches per vector of which 6 stay under the cutoff, so the walk, not the search, takes
//! the time. A walk decides a batch step by step (a class's first prefills, its
//! decode-ready requests per generation count, its refills per pool); once some steps are
//! decided, every batch that completes them has a total of at least
//!
//! - the cost so far, plus the duration of the decided part of the batch (its entries, the
//!   per-batch bias and the flags it already has, or the cheaper flag if none), plus
//! - the estimate ([`Estimate::of_sums`], nondecreasing in each summed measure) of the
//!   decided requests where they go, and of every undecided request the least of each
//!   measure over where one batch can take it ([`lows`]); its own cost counted as what it
//!   needs now, since a batch moves no more own cost out of the estimate than it adds to
//!   the batch (a decode's, a refill's or a prefill's own cost is paid in the batch and no
//!   longer needed after it; an idle or evicted request needs at least as much as before).
//!
//! So a partial batch whose bound reaches the cutoff (plus a rounding margin) has no
//! completion the search would keep, and the walk skips them all: the search expands the
//! same vectors with the same costs, only faster. The search checks only where it pays:
//! with evictions (without, a vector has tens of batches), and from vectors within about
//! one batch's cost of the cutoff ([`window_ms`]). Measured (the pooled search alone, this
//! 2-core machine): family (a) with C = 64 and evictions, n = 12 in 0.3 s instead of 3.0 s
//! and n = 16 in 9.6 s instead of 68 s, the same 10,075 and 177,071 vectors.

use super::super::batches::Load;
use super::{Class, Estimate, Model, Need, Step, Sums};

/// Per position of a vector, what a request there needs at least after one more batch:
/// each measure the least over where the batch can take it (stay, decode or be evicted,
/// refill, complete its prompt), its own cost what it needs now. Prompt tokens a class's
/// partial prompt holds are credited separately ([`Sums::held`]).
pub(super) fn lows(model: &Model, need: &[Need]) -> Vec<Need> {
    let mut lows = need.to_vec();
    let least = |at: usize, to: &[usize]| {
        let mut n = need[at];
        for &t in to {
            n = n.min(need[t]);
        }
        Need {
            ms: need[at].ms,
            ..n
        }
    };
    for c in &model.classes {
        // Waiting for the first prefill: its prompt may be (partly) processed in the batch,
        // so no prompt tokens or prefill KV are counted.
        lows[c.pool(0)] = Need {
            tokens: 0,
            prompt: 0,
            prefill_kv: 0,
            ..least(c.pool(0), &[c.after(1)])
        };
        for g in 1..c.output {
            let mut to = vec![c.after(g + 1)];
            if model.evictions {
                to.push(c.pool(g));
            }
            lows[c.ready(g)] = least(c.ready(g), &to);
            lows[c.pool(g)] = least(c.pool(g), &[c.ready(g), c.after(g + 1)]);
        }
    }
    lows
}

/// How far below the cutoff a vector's estimate total must be for the walk to check its
/// partial batches: about the most one batch can cost (each feature at its largest under
/// C and M; unbounded without them). A batch raises the total by its duration less the
/// progress it makes, so from vectors further below the cutoff hardly any batch reaches
/// it, and the checks would only cost time (family (a) with C = 64, n = 32: half the
/// vectors expanded in the same time while the least total is 15 ms below the cutoff).
/// Only when to check: which batches are skipped does not depend on it.
pub(super) fn window_ms(model: &Model) -> f64 {
    use infersched_core::Feature;
    let l = model.limits;
    let (Some(c), Some(m)) = (l.token_budget, l.kv_capacity) else {
        return f64::INFINITY;
    };
    let (c, m) = (c as f64, m as f64);
    let most = |f: Feature| match f {
        Feature::One | Feature::HasPrefill | Feature::HasDecode => 1.0,
        Feature::Tokens | Feature::NPrefill | Feature::NDecode => c,
        Feature::DecodeKv | Feature::PrefillCtx => m,
        Feature::PrefillAttn => c * (c + 2.0 * m),
    };
    Feature::ALL
        .iter()
        .map(|&f| model.theta[f as usize] * most(f))
        .sum()
}

/// The bound of partial batches from one vector, and the cutoff it is held against.
pub(super) struct Prune<'a> {
    estimate: &'a Estimate,
    lows: &'a [Need],
    /// The cost of reaching the vector (ms).
    base: f64,
    cutoff: f64,
    /// Rounding allowance (relative 1e-9 of the cutoff).
    margin: f64,
    /// The per-batch bias and flag a batch without a flag yet pays at least.
    least_flag: f64,
    /// Per step and after the last: what the requests of the steps from it on need at
    /// least.
    undecided: Vec<Sums>,
    /// Per class (its refill step) and pool `E_G` (G = 1 .. O): what the requests of its
    /// pools from `E_G` on, and of the steps after, need at least (those evicted in the
    /// batch aside).
    refill_rest: Vec<Vec<Sums>>,
}

impl<'a> Prune<'a> {
    pub(super) fn new(
        model: &Model,
        estimate: &'a Estimate,
        lows: &'a [Need],
        counts: &[u16],
        steps: &[Step],
        (base, cutoff): (f64, f64),
    ) -> Self {
        let mut undecided = vec![Sums::default(); steps.len() + 1];
        let mut refill_rest = vec![Vec::new(); model.classes.len()];
        for (i, step) in steps.iter().enumerate().rev() {
            let mut s = undecided[i + 1];
            match *step {
                Step::First(k) => {
                    let c = &model.classes[k];
                    s = s.plus(counts[c.pool(0)], &lows[c.pool(0)]);
                    s.held += u64::from(counts[c.prompt_held()]);
                }
                Step::Ready(k, g) => {
                    let c = &model.classes[k];
                    s = s.plus(counts[c.ready(g)], &lows[c.ready(g)]);
                }
                Step::Refill(k) => {
                    let c = &model.classes[k];
                    let mut rest = vec![s; c.output as usize + 1];
                    for g in (1..c.output).rev() {
                        rest[g as usize] =
                            rest[g as usize + 1].plus(counts[c.pool(g)], &lows[c.pool(g)]);
                    }
                    s = rest[1];
                    refill_rest[k] = rest;
                }
            }
            undecided[i] = s;
        }
        Self {
            estimate,
            lows,
            base,
            cutoff,
            margin: 1e-9 * cutoff.abs().max(1.0),
            // The estimate's per-batch bias is `one` plus the cheaper flag.
            least_flag: estimate.bias - model.theta[infersched_core::Feature::One as usize],
            undecided,
            refill_rest,
        }
    }

    /// What a request at `position` needs (the estimate's [`Need`]).
    pub(super) fn need(&self, position: usize) -> &Need {
        &self.estimate.need[position]
    }

    /// What the undecided requests from step `i` on need at least.
    pub(super) fn undecided(&self, i: usize) -> &Sums {
        &self.undecided[i]
    }

    /// What class `k`'s pools from `E_g` on and the steps after its refills need at least.
    pub(super) fn refill_rest(&self, k: usize, g: u32) -> &Sums {
        &self.refill_rest[k][g as usize]
    }

    /// Requests of `c` evicted in the batch at generation counts `gs`, not yet refilled or
    /// left in their pools: what they need at least.
    pub(super) fn evicted(&self, c: &Class, evicted: &[u16], gs: std::ops::Range<u32>) -> Sums {
        gs.fold(Sums::default(), |s, g| {
            s.plus(evicted[g as usize], &self.lows[c.pool(g)])
        })
    }

    /// Whether every batch completing a partial one is at or above the cutoff: the partial
    /// batch `load` (and `extra_ms` of its entries' own cost not in it yet), and what the
    /// requests need in all after it.
    pub(super) fn hopeless(
        &self,
        load: &Load,
        theta: &[f64; 9],
        extra_ms: f64,
        needs: &Sums,
    ) -> bool {
        let flag = if load.has_prefill || load.has_decode {
            0.0
        } else {
            self.least_flag
        };
        let duration = load.duration(theta) + extra_ms + flag;
        // The bound adds up the same terms in another order: a margin far above rounding
        // keeps every batch the search would keep.
        self.base + duration + self.estimate.of_sums(needs) >= self.cutoff + self.margin
    }
}
