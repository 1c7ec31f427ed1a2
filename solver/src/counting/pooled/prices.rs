//! The level bundle method that chooses the prices of the balanced cycle-ratio bound
//! ([`super::balanced`]) and of the layered bound ([`super::layered`]).
//!
//! Both bounds are the least of linear functions of the prices (one per cycle or path),
//! so each is concave in them. Each evaluation at some prices gives its value and the
//! cycle or path that attains it: a *cut*, which bounds the value from above everywhere.
//! A small linear program gives the most the cuts found so far allow (the *prediction*);
//! the next prices are the nearest (in L1) to the best found at which every cut reaches
//! the level halfway from the best value to the prediction, so steps stay short. It stops
//! within `enough` of a target (a known schedule's value: then it is proven), where the
//! cuts allow no more, when it stalls ([`Stall`]), or at the deadline.
//! Whatever prices it ends with, the value found at them is the bound.

use std::ops::RangeInclusive;
use std::time::Instant;

use highs::{Col, HighsModelStatus, RowProblem, Sense};

/// When the search counts as stalled: after `rounds` rounds in a row without a relative
/// gain of `gain` (the rest of its share goes to the searches after it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Stall {
    pub rounds: usize,
    pub gain: f64,
}

/// What one evaluation found, as a linear row in the value `t` and the prices `mu`:
/// `t_coef x t + sum(coef_j x mu_j) <= rhs` holds at every value the prices allow. A
/// cycle of the balanced bound: `tokens x rho - balance . mu <= ms`; a path of the layered
/// bound: `t - weighted balance . mu <= weight`; a cycle costing less than 0 at some prices
/// (no value there): `- balance . mu <= ms`.
pub(super) struct Cut {
    pub rhs: f64,
    pub t_coef: f64,
    pub coefs: Vec<(usize, f64)>,
}

/// One evaluation of a bound at some prices: `(prices, prediction, cuts)` to its value,
/// pushing the cut it found.
pub(super) type Evaluate<'a> = dyn FnMut(&[f64], f64, &mut Vec<Cut>) -> Option<f64> + 'a;

/// Adds `n` at price position `j` to sparse coefficients.
pub(super) fn add_coef(coefs: &mut Vec<(usize, f64)>, j: usize, n: f64) {
    match coefs.iter_mut().find(|(k, _)| *k == j) {
        Some((_, c)) => *c += n,
        None => coefs.push((j, n)),
    }
}

/// The prices (each within `range`) that make the value largest, by the level bundle
/// method from prices `start`. `evaluate(mu, prediction, cuts)` gives the value at `mu` (None
/// past the deadline; minus infinity where it has none), pushing the cut it found; the
/// value never exceeds `target`. Returns the best value found, the rounds taken and the
/// prices that gave it; None where not even the first evaluation ended.
pub(super) fn best_prices(
    start: &[f64],
    range: RangeInclusive<f64>,
    target: f64,
    enough: f64,
    stall: Stall,
    deadline: Instant,
    evaluate: &mut Evaluate,
) -> Option<(f64, usize, Vec<f64>)> {
    let width = start.len();
    let mut cuts: Vec<Cut> = Vec::new();
    let mut center = start.to_vec();
    let mut best = evaluate(&center, target, &mut cuts)?;
    let (mut rounds, mut since_gain) = (0, 0);
    while best < enough && Instant::now() < deadline && since_gain < stall.rounds {
        rounds += 1;
        since_gain += 1;
        // What the cuts found allow at most.
        let mut pb = RowProblem::default();
        let t = pb.add_column(1.0, ..=target);
        let mu: Vec<Col> = (0..width)
            .map(|_| pb.add_column(0.0, range.clone()))
            .collect();
        for cut in &cuts {
            let mut row = vec![(t, cut.t_coef)];
            row.extend(cut.coefs.iter().map(|&(j, c)| (mu[j], c)));
            pb.add_row(..=cut.rhs, row);
        }
        let mut lp = pb.optimise(Sense::Maximise);
        lp.make_quiet();
        let solved = lp.try_solve().ok()?;
        if solved.status() != HighsModelStatus::Optimal {
            break;
        }
        let predicted = solved.get_solution().columns()[0];
        if predicted <= best * (1.0 + 1e-9) {
            break;
        }
        // The prices nearest the best found (in L1) where every cut found has at least
        // the level halfway up (a level method: steps stay short, the cuts stay valid).
        let level = best.max(0.0) + 0.5 * (predicted - best.max(0.0));
        let mut pb = RowProblem::default();
        let mu: Vec<Col> = (0..width)
            .map(|_| pb.add_column(0.0, range.clone()))
            .collect();
        for (j, &c) in center.iter().enumerate() {
            let d = pb.add_column(1.0, 0.0..);
            pb.add_row(c.., [(mu[j], 1.0), (d, 1.0)]);
            pb.add_row(..=c, [(mu[j], 1.0), (d, -1.0)]);
        }
        for cut in &cuts {
            let row: Vec<_> = cut.coefs.iter().map(|&(j, c)| (mu[j], c)).collect();
            pb.add_row(..=cut.rhs - level * cut.t_coef, row);
        }
        let mut lp = pb.optimise(Sense::Minimise);
        lp.make_quiet();
        let solved = lp.try_solve().ok()?;
        if solved.status() != HighsModelStatus::Optimal {
            break;
        }
        let next = solved.get_solution().columns()[..width].to_vec();
        // Past the deadline (or at a rounding stop) the best so far stands.
        let Some(found) = evaluate(&next, predicted, &mut cuts) else {
            break;
        };
        if found > best {
            if found > best + stall.gain * best.abs() {
                since_gain = 0;
            }
            best = found;
            center = next;
        }
    }
    Some((best, rounds, center))
}
