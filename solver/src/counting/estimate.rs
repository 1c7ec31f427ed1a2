//! The counting search's admissible estimate of what is left from a count vector
//! (milp.md, "the counting search"): per-slot cheapest paths, pattern prices, and the
//! positions argument for mean latency and TTFT.

use infersched_core::Feature;

use super::Search;
use crate::Objective;
use crate::bounds::patterns::{BatchTerms, EntryType, pattern_prices};
use crate::graph::{ArcKind, StateGraph};

/// The least per-batch term of a batch that processes anything (ms).
pub(super) fn bias_of(theta: &[f64; 9]) -> f64 {
    theta[Feature::One as usize]
        + theta[Feature::HasPrefill as usize].min(theta[Feature::HasDecode as usize])
}

/// `sum_k max(P_k, T_k)` over the requests not `done`, where `P_k` is the sum of the `k`
/// smallest `share` and `T_k` the `k`-th smallest `time` (slots listed in increasing order
/// of each in `by_share`, `by_time`; a slot holds `counts[slot]` requests).
pub(super) fn sum_of_positions<'a>(
    counts: &'a [u16],
    done: &'a [bool],
    by_share: &'a [usize],
    share: &'a [f64],
    by_time: &'a [usize],
    time: &'a [f64],
) -> f64 {
    // The requests not done, in each order, as runs of (value, how many).
    let runs = |order: &'a [usize], value: &'a [f64]| {
        order
            .iter()
            .filter(|&&i| counts[i] > 0 && !done[i])
            .map(move |&i| (value[i], counts[i]))
    };
    let (mut by_s, mut by_t) = (runs(by_share, share), runs(by_time, time));
    let (mut s, mut t) = (by_s.next(), by_t.next());
    let (mut prefix, mut sum) = (0.0, 0.0);
    while let (Some((share_i, left_s)), Some((time_j, left_t))) = (s, t) {
        let k = left_s.min(left_t);
        for _ in 0..k {
            prefix += share_i;
            sum += prefix.max(time_j);
        }
        s = if left_s > k {
            Some((share_i, left_s - k))
        } else {
            by_s.next()
        };
        t = if left_t > k {
            Some((time_j, left_t - k))
        } else {
            by_t.next()
        };
    }
    sum
}

impl Search<'_> {
    /// Per slot: the cheapest own remaining cost (ms, arc costs only), the fewest
    /// processing steps to finish, and the least KV-batch area (sum of the KV held in the
    /// batches that process it) to finish, each minimised on its own.
    pub(super) fn remaining(&self) -> Vec<(f64, u32, u64)> {
        let finished: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.state == self.graphs[s.class].finished())
            .collect();
        let own = self.cheapest_to(&finished, |class, a| self.arc_ms[class][a]);
        let steps = self.cheapest_to(&finished, |_, _| 1.0);
        let area = self.cheapest_to(&finished, |class, a| self.graphs[class].arcs[a].kv as f64);
        // Steps and areas are sums of integers far below 2^53: exact in f64.
        let whole = |v: f64, none: u64| if v.is_finite() { v as u64 } else { none };
        own.iter()
            .zip(&steps)
            .zip(&area)
            .map(|((&c, &k), &m)| (c, whole(k, u64::from(u32::MAX)) as u32, whole(m, u64::MAX)))
            .collect()
    }

    /// Per slot: the least sum of `weight(class, arc)` over the process arcs of a path to
    /// a slot in `target` (infinite where none).
    pub(super) fn cheapest_to(
        &self,
        target: &[bool],
        weight: impl Fn(usize, usize) -> f64,
    ) -> Vec<f64> {
        let mut best: Vec<f64> = target
            .iter()
            .map(|&t| if t { 0.0 } else { f64::INFINITY })
            .collect();
        loop {
            let mut changed = false;
            for (i, slot) in self.slots.iter().enumerate() {
                let g = &self.graphs[slot.class];
                for &a in &g.out[slot.state] {
                    let arc = &g.arcs[a];
                    if arc.to == slot.state {
                        continue;
                    }
                    let rest = best[self.arc_to[slot.class][a]];
                    if !rest.is_finite() {
                        continue;
                    }
                    let own = if matches!(arc.kind, ArcKind::Process { .. }) {
                        weight(slot.class, a)
                    } else {
                        0.0
                    };
                    if rest + own < best[i] - 1e-12 {
                        best[i] = rest + own;
                        changed = true;
                    }
                }
            }
            if !changed {
                return best;
            }
        }
    }

    /// Per class and arc: the pattern price (ms, [`crate::bounds::patterns`]) of the
    /// arc's entry (0 for idle and evict arcs), a lower bound on its share of its batch's
    /// per-batch terms; None when no prices could be computed.
    pub(super) fn arc_prices(&self, sizes: &[u16]) -> Option<Vec<Vec<f64>>> {
        let mut types: Vec<EntryType> = Vec::new();
        let mut index: std::collections::HashMap<EntryType, usize> = Default::default();
        let mut type_of: Vec<Vec<usize>> = Vec::new();
        for (class, g) in self.graphs.iter().enumerate() {
            let mut row = Vec::with_capacity(g.arcs.len());
            for arc in &g.arcs {
                if !self.position.contains_key(&(class, arc.from)) {
                    row.push(usize::MAX);
                    continue;
                }
                let t = match arc.kind {
                    ArcKind::Process { c, decode, .. } => EntryType {
                        kv: arc.kv,
                        tokens: u64::from(c),
                        prefill: !decode,
                    },
                    _ => {
                        row.push(usize::MAX);
                        continue;
                    }
                };
                let k = *index.entry(t).or_insert_with(|| {
                    types.push(t);
                    types.len() - 1
                });
                row.push(k);
            }
            type_of.push(row);
        }
        // The demand the prices are tuned for: each request's path without evictions,
        // taking the longest process arc (a whole prompt, then decodes).
        let mut demand = vec![0.0; types.len()];
        for (k, g) in self.graphs.iter().enumerate() {
            let mut at = StateGraph::START;
            let mut steps = 0;
            while at != g.finished() && steps <= g.states.len() {
                let Some(a) = g.out[at]
                    .iter()
                    .copied()
                    .filter(|&a| {
                        matches!(
                            g.arcs[a].kind,
                            ArcKind::Process {
                                evict_first: false,
                                ..
                            }
                        )
                    })
                    .max_by_key(|&a| match g.arcs[a].kind {
                        ArcKind::Process { c, .. } => c,
                        _ => 0,
                    })
                else {
                    break;
                };
                demand[type_of[k][a]] += f64::from(sizes[k]);
                at = g.arcs[a].to;
                steps += 1;
            }
        }
        let terms = BatchTerms {
            one: self.theta[Feature::One as usize],
            has_prefill: self.theta[Feature::HasPrefill as usize],
            has_decode: self.theta[Feature::HasDecode as usize],
        };
        let prices = pattern_prices(&types, &demand, self.limits, terms, self.no_mix)?;
        Some(
            type_of
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|&t| if t == usize::MAX { 0.0 } else { prices[t] })
                        .collect()
                })
                .collect(),
        )
    }
}

/// The admissible estimate of what is left from a count vector, with what it needs
/// precomputed per slot. Makespan: the requests' own cheapest remaining work plus the
/// larger of the batch counts (longest path, KV area over M, prefill batches) and the
/// pattern prices still to pay. Mean latency and TTFT: [`sum_of_positions`] over the
/// requests not yet done, over n.
pub(super) struct Estimate {
    objective: Objective,
    n: f64,
    /// Per slot: the request has finished.
    pub finished: Vec<bool>,
    /// Per slot: the request has no first token yet.
    pub no_first_token: Vec<bool>,
    /// Per slot: cheapest own remaining work (ms), fewest steps, least KV-batch area.
    remaining: Vec<(f64, u32, u64)>,
    /// Per slot: KV it must hold in a prefill batch before it finishes.
    prefill_kv: Vec<u64>,
    cap: Option<u64>,
    bias: f64,
    t_pre: f64,
    t_dec: f64,
    /// Per slot: the least pattern prices still to pay (makespan, when prices exist).
    patterns: Option<Vec<f64>>,
    /// Per slot: done for the objective (finished; for TTFT, has a first token).
    done: Vec<bool>,
    /// Per slot: least own work plus prices until done, and the slots in its order.
    share: Vec<f64>,
    by_share: Vec<usize>,
    /// Per slot: least own work plus a bias per step until done, and the slots in its
    /// order.
    own_time: Vec<f64>,
    by_time: Vec<usize>,
}

impl Estimate {
    /// Everything the estimate needs for `objective` on `search`'s slots (`sizes`: the
    /// classes' member counts, for the demand the pattern prices are tuned to).
    pub(super) fn new(search: &Search<'_>, objective: Objective, sizes: &[u16]) -> Self {
        let n: f64 = sizes.iter().map(|&s| f64::from(s)).sum();
        let remaining = search.remaining();
        let finished: Vec<bool> = search
            .slots
            .iter()
            .map(|s| s.state == search.graphs[s.class].finished())
            .collect();
        let no_first_token: Vec<bool> = search
            .slots
            .iter()
            .map(|s| search.graphs[s.class].states[s.state].1 == 0)
            .collect();
        let prices = search.arc_prices(sizes);
        // Makespan: per slot, the least sum of prices still to pay.
        let patterns = prices
            .as_ref()
            .filter(|_| objective == Objective::Makespan)
            .map(|y| search.cheapest_to(&finished, |class, a| y[class][a]));
        // Mean latency (TTFT): per slot, the least own work plus prices until the request
        // finishes (gets its first token), its share of the time until then, and its own
        // minimum time (that work plus a bias per step); each with the slots in increasing
        // order.
        let done: Vec<bool> = match objective {
            Objective::MeanTtft => no_first_token.iter().map(|&p| !p).collect(),
            _ => finished.clone(),
        };
        let own_work = search.cheapest_to(&done, |class, a| search.arc_ms[class][a]);
        let steps = search.cheapest_to(&done, |_, _| 1.0);
        let share: Vec<f64> = match &prices {
            Some(y) => search.cheapest_to(&done, |class, a| search.arc_ms[class][a] + y[class][a]),
            None => own_work.clone(),
        };
        let own_time: Vec<f64> = own_work
            .iter()
            .zip(&steps)
            .map(|(w, k)| w + bias_of(&search.theta) * k)
            .collect();
        let by = |v: &[f64]| {
            let mut order: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_finite()).collect();
            order.sort_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b)));
            order
        };
        let (by_share, by_time) = (by(&share), by(&own_time));
        let (t_pre, t_dec) = (
            search.theta[Feature::HasPrefill as usize],
            search.theta[Feature::HasDecode as usize],
        );
        let bias = bias_of(&search.theta);
        // KV a request on this slot must hold in some prefill batch before it finishes:
        // not started or evicted (m = 0) requests must prefill to I + G.
        let prefill_kv: Vec<u64> = search
            .slots
            .iter()
            .map(|sl| {
                let g = &search.graphs[sl.class];
                let (m, _) = g.states[sl.state];
                if m > 0 || sl.state == g.finished() {
                    return 0;
                }
                g.out[sl.state]
                    .iter()
                    .filter(|&&a| matches!(g.arcs[a].kind, ArcKind::Process { .. }))
                    .map(|&a| g.arcs[a].kv)
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        let cap = search.limits.kv_capacity;
        Self {
            objective,
            n,
            finished,
            no_first_token,
            remaining,
            prefill_kv,
            cap,
            bias,
            t_pre,
            t_dec,
            patterns,
            done,
            share,
            by_share,
            own_time,
            by_time,
        }
    }

    /// The estimate (ms, as the objective counts it) of what is left from `counts`;
    /// infinite where a request can no longer finish.
    pub(super) fn of(&self, counts: &[u16]) -> f64 {
        // A request on a state from which it cannot finish under the limits (with P, an
        // evicted request whose refill I + G no longer fits a batch): a dead end.
        if counts
            .iter()
            .zip(&self.remaining)
            .any(|(&c, r)| c > 0 && !r.0.is_finite())
        {
            return f64::INFINITY;
        }
        match self.objective {
            // Remaining batches B >= the longest path and >= area / M; batches with a
            // prefill P >= pending prefill KV / M; each batch costs the bias, and each
            // prefill batch the difference of the flags on top (when it is larger).
            Objective::Makespan => {
                let (mut own, mut steps, mut area, mut pre) = (0.0, 0u32, 0u64, 0u64);
                for (i, &c) in counts.iter().enumerate() {
                    if c > 0 {
                        own += f64::from(c) * self.remaining[i].0;
                        steps = steps.max(self.remaining[i].1);
                        area += u64::from(c) * self.remaining[i].2;
                        pre += u64::from(c) * self.prefill_kv[i];
                    }
                }
                let (mut batches, mut prefill_batches) = (u64::from(steps), 0);
                if let Some(m) = self.cap {
                    batches = batches.max(area.div_ceil(m));
                    prefill_batches = pre.div_ceil(m);
                }
                let by_counts = self.bias * batches as f64
                    + (self.t_pre - self.t_dec).max(0.0) * prefill_batches as f64;
                let by_prices = self.patterns.as_ref().map_or(0.0, |per_slot| {
                    counts
                        .iter()
                        .zip(per_slot)
                        .filter(|(c, _)| **c > 0)
                        .map(|(&c, y)| f64::from(c) * y)
                        .sum()
                });
                own + by_counts.max(by_prices)
            }
            // The k-th of the requests still to finish (to get a first token) gets there
            // no earlier than the k smallest shares of time add up to (own work plus
            // prices: the batches until then hold all their entries), nor than the
            // k-th smallest own minimum time.
            Objective::MeanLatency | Objective::MeanTtft => {
                sum_of_positions(
                    counts,
                    &self.done,
                    &self.by_share,
                    &self.share,
                    &self.by_time,
                    &self.own_time,
                ) / self.n
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_take_the_larger_of_the_share_prefix_and_the_own_time() {
        // Slots: 0 done; 1 holds 2 requests (share 1, time 5); 2 holds 1 (share 3, time 2).
        let counts = [4, 2, 1];
        let done = [true, false, false];
        let share = [0.0, 1.0, 3.0];
        let time = [0.0, 5.0, 2.0];
        // Shares in order 1, 1, 3: prefixes 1, 2, 5; times in order 2, 5, 5.
        let sum = sum_of_positions(&counts, &done, &[0, 1, 2], &share, &[0, 2, 1], &time);
        assert_eq!(sum, 2.0 + 5.0 + 5.0);
    }
}
