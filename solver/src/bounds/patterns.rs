//! Batch-pattern prices: a lower bound on what the batches' per-batch terms cost, from the
//! linear relaxation of packing the entries a workload needs into batches (milp.md,
//! "Pattern prices").
//!
//! Entries are grouped into a few types (KV after the step, tokens, prefill or decode). A
//! *pattern* is a multiset of types one batch can hold within M, C, P and R_max (and not
//! mixing prefill with decode under `no_mix`); it costs the batch's per-batch terms,
//! `one + has_prefill [any prefill] + has_decode [any decode]`. The configuration LP packs
//! the entries into patterns at least cost; its dual is a price `y_t >= 0` per type with
//! `sum_t a_pt y_t <= cost_p` for every pattern `p`. Those prices hold for *any* entries
//! to pack: whatever batches a schedule runs, each is a pattern and pays at least the prices
//! of its entries, so the per-batch terms of the schedule are at least the sum of its
//! entries' prices. Unlike the area bound (KV over M), the prices see that entries do not
//! fill a batch exactly: three decodes at 9 KV tokens fill 27 of M = 33, and a fourth does
//! not fit.

use good_lp::{Expression, ProblemVariables, SolverModel, constraint, highs, variable};

use infersched_core::Limits;

/// One type of entry: the KV its request holds after the step (block-rounded), the tokens
/// it processes, and whether it is a prefill chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct EntryType {
    pub kv: u64,
    pub tokens: u64,
    pub prefill: bool,
}

/// The per-batch terms (ms): every batch, a batch with a prefill, a batch with a decode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchTerms {
    pub one: f64,
    pub has_prefill: f64,
    pub has_decode: f64,
}

/// The most patterns enumerated; past it no prices are computed.
pub(crate) const MAX_PATTERNS: usize = 50_000;

/// The most counts the enumerated patterns may hold together (patterns times types): with
/// many types (every distinct KV and chunk of real requests) fewer patterns are enumerated,
/// so the enumeration's memory and time stay bounded (8 MB of counts).
const MAX_PATTERN_COUNTS: usize = 2_000_000;

/// Prices per type (ms, in `types` order) such that every pattern a batch can hold under
/// `limits` costs at least the sum of its entries' prices, chosen to maximise the bound for
/// `demand` (how many entries of each type are expected). None when the patterns are too
/// many to enumerate, a term is negative or not finite, or HiGHS fails.
pub(crate) fn pattern_prices(
    types: &[EntryType],
    demand: &[f64],
    limits: &Limits,
    terms: BatchTerms,
    no_mix: bool,
) -> Option<Vec<f64>> {
    if [terms.one, terms.has_prefill, terms.has_decode]
        .iter()
        .any(|t| !t.is_finite() || *t < 0.0)
        || types.is_empty()
        || types.len() != demand.len()
    {
        return None;
    }
    let patterns = enumerate_patterns(types, limits, no_mix)?;
    let cost = |p: &[u32]| pattern_cost(types, p, terms);
    // good_lp panics where HiGHS reports an error: no prices then, never a panic.
    let prices = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut vars = ProblemVariables::new();
        let y: Vec<_> = types
            .iter()
            .map(|_| vars.add(variable().min(0.0)))
            .collect();
        let objective: Expression = y.iter().zip(demand).map(|(&v, &d)| d * v).sum();
        let mut problem = vars.maximise(objective).using(highs);
        for p in &patterns {
            let load: Expression = p
                .iter()
                .zip(&y)
                .filter(|(a, _)| **a > 0)
                .map(|(&a, &v)| f64::from(a) * v)
                .sum();
            problem.add_constraint(constraint!(load <= cost(p)));
        }
        let mut model = problem.into_inner();
        model.make_quiet();
        model.set_option("threads", 1);
        model.set_option("random_seed", 0);
        let solved = model.try_solve().ok()?;
        let columns = solved.get_solution().columns().to_vec();
        Some(columns)
    }))
    .ok()
    .flatten()?;
    if prices.len() != types.len() {
        return None;
    }
    let mut prices: Vec<f64> = prices
        .into_iter()
        .map(|v| if v.is_finite() { v.max(0.0) } else { 0.0 })
        .collect();
    // Raise the prices the LP left low (types outside the demand), then scale them all
    // down until every pattern's inequality holds with a margin in this arithmetic, so the
    // bound never rests on HiGHS's tolerances or a rounding.
    lift(&mut prices, types, &patterns, terms);
    let worst = patterns
        .iter()
        .map(|p| {
            let load: f64 = p.iter().zip(&prices).map(|(&a, y)| f64::from(a) * y).sum();
            load / cost(p)
        })
        .fold(0.0, f64::max);
    if worst > 0.0 {
        let scale = ((1.0 - 1e-9) / worst).min(1.0);
        for y in &mut prices {
            *y *= scale;
        }
    }
    Some(prices)
}

/// Raises each price, in turn, as far as every pattern allows: types the demand leaves
/// out (a refill after an eviction, say) would otherwise keep the LP's price of 0 and let a
/// path through them look free.
fn lift(prices: &mut [f64], types: &[EntryType], patterns: &[Vec<u32>], terms: BatchTerms) {
    let mut slack: Vec<f64> = patterns
        .iter()
        .map(|p| {
            let load: f64 = p
                .iter()
                .zip(prices.iter())
                .map(|(&a, y)| f64::from(a) * y)
                .sum();
            (pattern_cost(types, p, terms) - load).max(0.0)
        })
        .collect();
    for t in 0..types.len() {
        let room = patterns
            .iter()
            .zip(&slack)
            .filter(|(p, _)| p[t] > 0)
            .map(|(p, s)| s / f64::from(p[t]))
            .fold(f64::INFINITY, f64::min);
        if !room.is_finite() || room <= 0.0 {
            continue;
        }
        let raise = room * (1.0 - 1e-9);
        prices[t] += raise;
        for (p, s) in patterns.iter().zip(&mut slack) {
            *s = (*s - f64::from(p[t]) * raise).max(0.0);
        }
    }
}

/// A pattern's per-batch terms.
fn pattern_cost(types: &[EntryType], pattern: &[u32], terms: BatchTerms) -> f64 {
    let has = |prefill: bool| {
        pattern
            .iter()
            .zip(types)
            .any(|(&a, t)| a > 0 && t.prefill == prefill)
    };
    terms.one
        + if has(true) { terms.has_prefill } else { 0.0 }
        + if has(false) { terms.has_decode } else { 0.0 }
}

/// Every non-empty multiset of types one batch can hold (counts per type), or None past
/// [`MAX_PATTERNS`] (fewer with many types: [`MAX_PATTERN_COUNTS`]).
fn enumerate_patterns(types: &[EntryType], limits: &Limits, no_mix: bool) -> Option<Vec<Vec<u32>>> {
    struct Walk<'a> {
        types: &'a [EntryType],
        limits: &'a Limits,
        prefill_budget: Option<u64>,
        no_mix: bool,
        current: Vec<u32>,
        out: Vec<Vec<u32>>,
        most: usize,
        overflow: bool,
    }
    impl Walk<'_> {
        fn go(
            &mut self,
            t: usize,
            kv: u64,
            tokens: u64,
            prefill: u64,
            entries: u64,
            kinds: [bool; 2],
        ) {
            if self.overflow {
                return;
            }
            if t == self.types.len() {
                if entries > 0 {
                    if self.out.len() >= self.most {
                        self.overflow = true;
                        return;
                    }
                    self.out.push(self.current.clone());
                }
                return;
            }
            let ty = self.types[t];
            let mut take = 0u32;
            loop {
                let k = u64::from(take);
                let (kv2, tok2, pre2, n2) = (
                    kv + ty.kv * k,
                    tokens + ty.tokens * k,
                    prefill + if ty.prefill { ty.tokens * k } else { 0 },
                    entries + k,
                );
                let mut kinds2 = kinds;
                if take > 0 {
                    kinds2[usize::from(ty.prefill)] = true;
                }
                let fits = self.limits.kv_capacity.is_none_or(|m| kv2 <= m)
                    && self.limits.token_budget.is_none_or(|c| tok2 <= c)
                    && self.prefill_budget.is_none_or(|p| pre2 <= p)
                    && self.limits.max_running.is_none_or(|r| n2 <= r)
                    && !(self.no_mix && kinds2[0] && kinds2[1]);
                if !fits || (take > 0 && ty.kv == 0 && ty.tokens == 0) {
                    break;
                }
                self.current[t] = take;
                self.go(t + 1, kv2, tok2, pre2, n2, kinds2);
                if self.overflow {
                    return;
                }
                take += 1;
                // Without any limit a type could repeat forever: no finite pattern set.
                if take > 1_000_000 {
                    self.overflow = true;
                    return;
                }
            }
            self.current[t] = 0;
        }
    }
    let mut walk = Walk {
        types,
        limits,
        prefill_budget: limits.effective_prefill_budget(),
        no_mix,
        current: vec![0; types.len()],
        out: Vec::new(),
        most: MAX_PATTERNS.min(MAX_PATTERN_COUNTS / types.len().max(1)),
        overflow: false,
    };
    walk.go(0, 0, 0, 0, 0, [false; 2]);
    (!walk.overflow).then_some(walk.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms() -> BatchTerms {
        BatchTerms {
            one: 2.0,
            has_prefill: 3.0,
            has_decode: 0.5,
        }
    }

    fn decode(kv: u64) -> EntryType {
        EntryType {
            kv,
            tokens: 1,
            prefill: false,
        }
    }

    #[test]
    fn prices_see_that_entries_do_not_fill_a_batch() {
        // Decodes at 9 KV tokens, M = 33: three per batch (27 tokens). The area bound
        // says 9/33 of a batch each; the price is a third of a decode batch's 2.5 ms.
        let limits = Limits {
            kv_capacity: Some(33),
            ..Limits::unlimited()
        };
        let y = pattern_prices(&[decode(9)], &[30.0], &limits, terms(), false).unwrap();
        assert!((y[0] - 2.5 / 3.0).abs() < 1e-6, "{y:?}");
        assert!(y[0] * 3.0 <= 2.5);
    }

    #[test]
    fn every_pattern_pays_at_least_its_prices() {
        let limits = Limits {
            kv_capacity: Some(33),
            token_budget: Some(20),
            ..Limits::unlimited()
        };
        let types = [
            EntryType {
                kv: 8,
                tokens: 8,
                prefill: true,
            },
            decode(9),
            decode(10),
            decode(11),
        ];
        let y = pattern_prices(&types, &[4.0, 4.0, 4.0, 4.0], &limits, terms(), false).unwrap();
        let patterns = enumerate_patterns(&types, &limits, false).unwrap();
        // Two prefills of 8 plus a decode is 17 tokens (within C = 20); three are not.
        assert!(patterns.contains(&vec![2, 1, 0, 0]));
        assert!(!patterns.iter().any(|p| p[0] >= 3));
        for p in &patterns {
            let paid: f64 = p.iter().zip(&y).map(|(&a, y)| f64::from(a) * y).sum();
            assert!(paid <= pattern_cost(&types, p, terms()), "{p:?}");
        }
        // The bound is more than the area argument's 4 * (8 + 9 + 10 + 11) / 33 batches.
        let bound: f64 = y.iter().map(|y| 4.0 * y).sum();
        assert!(bound > (4.0 * 38.0 / 33.0) * 2.5, "{bound}");
    }

    /// Every batch of at most `most` entries over `types` (counts per type), found by
    /// brute force: the test's oracle for the enumeration.
    fn every_multiset(types: usize, most: u32) -> Vec<Vec<u32>> {
        let mut out = vec![vec![]];
        for _ in 0..types {
            out = out
                .into_iter()
                .flat_map(|p: Vec<u32>| {
                    let used: u32 = p.iter().sum();
                    (0..=most - used).map(move |k| {
                        let mut q = p.clone();
                        q.push(k);
                        q
                    })
                })
                .collect();
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn no_batch_within_the_limits_pays_less_than_its_prices(
            raw in proptest::collection::vec((1u64..12, 1u64..9, proptest::bool::ANY), 1..4),
            m in 8u64..40,
            c in proptest::option::of(4u64..24),
            r in proptest::option::of(1u64..6),
            no_mix in proptest::bool::ANY,
        ) {
            let types: Vec<EntryType> = raw
                .iter()
                .map(|&(kv, tokens, prefill)| EntryType { kv, tokens, prefill })
                .collect();
            let limits = Limits {
                kv_capacity: Some(m),
                token_budget: c,
                max_running: r,
                ..Limits::unlimited()
            };
            let demand = vec![3.0; types.len()];
            let Some(y) = pattern_prices(&types, &demand, &limits, terms(), no_mix) else {
                return Ok(());
            };
            proptest::prop_assert!(y.iter().all(|p| *p >= 0.0));
            // Every batch the limits allow (at most M / 1 entries), enumerated here by brute
            // force, pays at least its entries' prices.
            for p in every_multiset(types.len(), m as u32) {
                let count = |f: &dyn Fn(&EntryType) -> u64| -> u64 {
                    p.iter().zip(&types).map(|(&a, t)| u64::from(a) * f(t)).sum()
                };
                let kinds = |pre: bool| p.iter().zip(&types).any(|(&a, t)| a > 0 && t.prefill == pre);
                let fits = p.iter().any(|&a| a > 0)
                    && count(&|t| t.kv) <= m
                    && c.is_none_or(|c| count(&|t| t.tokens) <= c)
                    && r.is_none_or(|r| count(&|_| 1) <= r)
                    && !(no_mix && kinds(true) && kinds(false));
                if fits {
                    let paid: f64 = p.iter().zip(&y).map(|(&a, y)| f64::from(a) * y).sum();
                    proptest::prop_assert!(
                        paid <= pattern_cost(&types, &p, terms()),
                        "{p:?} pays {paid} with prices {y:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unlimited_batches_have_no_finite_pattern_set() {
        let y = pattern_prices(&[decode(9)], &[1.0], &Limits::unlimited(), terms(), false);
        assert!(y.is_none());
    }
}
