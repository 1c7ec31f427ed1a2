//! Pairs grouped in rounds in which no request appears twice, so that one round's MPLP
//! updates touch disjoint beliefs and may run side by side (module `dual`).

use std::ops::Range;

/// The pairs `(i, j)` (requests below `n`) reordered so that each round is a run of pairs
/// with no request in two of them: first fit, a pair in the first round that has neither
/// of its requests yet (for every pair of `n` requests, at most `2n - 1` rounds). Returns
/// the new order (indices into `pairs`) and each round's range in it; the order depends on
/// the pairs alone.
pub(super) fn in_rounds(n: usize, pairs: &[(usize, usize)]) -> (Vec<usize>, Vec<Range<usize>>) {
    // `busy[r * n + k]`: round `r` has request `k`.
    let mut busy: Vec<bool> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (at, &(i, j)) in pairs.iter().enumerate() {
        let round = (0..members.len())
            .find(|&r| !busy[r * n + i] && !busy[r * n + j])
            .unwrap_or_else(|| {
                busy.resize(busy.len() + n, false);
                members.push(Vec::new());
                members.len() - 1
            });
        busy[round * n + i] = true;
        busy[round * n + j] = true;
        members[round].push(at);
    }
    let mut order = Vec::with_capacity(pairs.len());
    let mut ranges = Vec::with_capacity(members.len());
    for m in members {
        let start = order.len();
        order.extend(m);
        ranges.push(start..order.len());
    }
    (order, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_once_and_no_request_twice_in_a_round() {
        for n in [2usize, 3, 7, 32] {
            // Every pair, then every third pair dropped.
            let all: Vec<(usize, usize)> = (0..n)
                .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                .collect();
            let some: Vec<(usize, usize)> = all
                .iter()
                .enumerate()
                .filter(|(k, _)| k % 3 != 1)
                .map(|(_, &p)| p)
                .collect();
            for pairs in [all, some] {
                let (order, rounds) = in_rounds(n, &pairs);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..pairs.len()).collect::<Vec<_>>());
                assert!(rounds.len() < 2 * n);
                assert_eq!(rounds.last().map_or(0, |r| r.end), pairs.len());
                for r in &rounds {
                    let mut seen = vec![false; n];
                    for &k in &order[r.clone()] {
                        let (i, j) = pairs[k];
                        assert!(!seen[i] && !seen[j], "n {n}: request twice in a round");
                        seen[i] = true;
                        seen[j] = true;
                    }
                }
            }
        }
    }
}
