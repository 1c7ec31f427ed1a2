//! The phase relaxation (milp.md, "The phase relaxation"): a lower bound on the mean
//! latency that knows a batch's bias is shared only by requests in it at the same time.
//!
//! Sort any schedule's completions `C_(1) <= ... <= C_(n)` and call the time between two
//! consecutive ones a *phase*; every batch ends inside one phase (completions happen at
//! batch ends) and the sum of latencies is `sum_m C_(m) - sum_i T_i`. The relaxation keeps,
//! per request `i` and phase `m`, only aggregates of what the schedule did:
//!
//! * which request completes `m`-th (`a[i][m]`, an assignment), whether `i`'s prompt is
//!   done by the end of `m` (`y`), whether `i` (or any request arriving no earlier) has
//!   begun by then (`v`, `g`);
//! * `i`'s prompt work in `m` (its first prefill's chunks, scaled down to the least prompt
//!   work), its later tokens' work and how many of them it generates there (`xp`, `xd`,
//!   `sd`), and how many prefill batches hold its prompt chunks (`sp`);
//! * how many batches of each kind (decode only, prefill only, mixed) the phase has.
//!
//! A phase lasts at least its batches' biases plus its entries' work; a request has at
//! most one entry per batch, so its entries there are at most the phase's batches; the
//! request completing `m`-th has done all its work by then, and nothing after; its later
//! tokens come after its prompt; everything a request does happens after its arrival, and
//! all the work of requests arriving at or after `T_i` fits between `T_i` and the phase's
//! end; the `m`-th completion is at least the `m`-th smallest own minimum time and the
//! single-machine relaxation's `m`-th completion (cuts from [`super::machine`]). Every
//! schedule maps onto a point of this MILP with the same sum of completions, so HiGHS's
//! dual bound on it (at optimality or at its time limit) bounds the optimum.
//!
//! What the machine relaxation gives away and this keeps: a request decoding alone pays
//! every batch's full bias, and the requests waiting meanwhile pay it too; sharing it
//! means doing their work in the same batches, which lengthens those batches for the
//! request being decoded. On 8 Splitwise requests (README family (b)) it raises the bound
//! from 432 to 529 ms against a 585 ms schedule.

use good_lp::{Expression, ProblemVariables, SolverModel, Variable, constraint, highs, variable};
use infersched_core::{Feature, Limits, Request};

use super::Theta;

/// The most requests the relaxation is built for: it has `4 n^2` binaries and `~10 n^2`
/// columns, and past a few dozen requests HiGHS cannot improve on its root in useful time.
pub const MAX_REQUESTS: usize = 48;

/// The least share of the requests' own times in batch biases for which the rows of later
/// arrivals also count each request's own biases (measured: 64 arXiv requests at 2 QPS,
/// about half in biases, gain; Splitwise bursts, about a tenth, only lose time).
const OWN_BIAS_SHARE: f64 = 0.3;

/// The least time worth giving HiGHS for this bound (seconds).
const MIN_TIME_S: f64 = 0.2;

/// What the relaxation needs of one request (milliseconds).
struct RequestNeeds {
    arrival: f64,
    prompt_work: f64,
    later_work: f64,
    later_tokens: f64,
    /// The least and the most one later token's entry costs.
    later_min: f64,
    later_max: f64,
    /// The least number of batches its prompt takes (at most C, P tokens each).
    prompt_batches: f64,
    prompt_tokens: f64,
    /// Arrival plus its own minimum time.
    own_completion: f64,
}

/// What HiGHS's best point of the relaxation plans (its incumbent, not a proof of
/// anything): the order of completions and when each prompt is worked on. A guide for a
/// schedule (module `plan_schedule`), which the replay then judges.
#[derive(Debug, Clone, PartialEq)]
pub struct PhasePlan {
    /// The request completing in each phase, in order (a permutation of the requests).
    pub completes: Vec<usize>,
    /// Per request and phase, the share of its prompt worked on in that phase (each
    /// request's shares sum to 1).
    pub prompt_share: Vec<Vec<f64>>,
}

/// The relaxation's result: the bound, and the plan of its best point when HiGHS found one.
pub(super) struct Relaxed {
    /// Lower bound on the mean latency (seconds).
    pub bound_s: f64,
    /// The incumbent's plan.
    pub plan: Option<PhasePlan>,
}

/// A lower bound on the mean latency (seconds) and the incumbent's plan, or None when the
/// relaxation does not apply (too many requests, a negative coefficient, too little time)
/// or HiGHS gives no bound. `position_bounds[m]` bounds the `(m + 1)`-th smallest
/// completion and `sum_bound` the sum of completions (absolute seconds).
pub(super) fn mean_latency_bound(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    position_bounds: &[f64],
    sum_bound: Option<f64>,
    time_limit_s: f64,
    threads: u32,
) -> Option<Relaxed> {
    let n = reqs.len();
    if n == 0 || n > MAX_REQUESTS || time_limit_s < MIN_TIME_S {
        return None;
    }
    if !t.non_negative() {
        return None;
    }
    // good_lp panics where HiGHS reports an error: no bound then, never a panic.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        solve_relaxation(
            t,
            reqs,
            limits,
            position_bounds,
            sum_bound,
            time_limit_s,
            threads,
        )
    }))
    .ok()
    .flatten()
}

fn needs(t: &Theta<'_>, r: &Request, limits: &Limits) -> RequestNeeds {
    let ms = 1e3;
    let get = |f| t.get(f) * ms;
    let (tok, np, pa, pc) = (
        get(Feature::Tokens),
        get(Feature::NPrefill),
        get(Feature::PrefillAttn),
        get(Feature::PrefillCtx),
    );
    let (dkv, nd) = (get(Feature::DecodeKv), get(Feature::NDecode));
    // With non-negative coefficients each option grows with the known tokens, so the
    // cheapest later token is the first one.
    let known = f64::from(r.input_tokens) + 1.0;
    let later_min = (tok + dkv * known + nd)
        .min(tok + pa * (2.0 * known - 1.0) + pc * (known - 1.0) + np)
        .min(tok * known + pa * known * known + np);
    let all = f64::from(r.input_tokens) + f64::from(r.output_tokens);
    let later_max = tok * all + pa * all * all + pc * all + np + dkv * all + nd;
    RequestNeeds {
        arrival: r.arrival_s * ms,
        prompt_work: t.first_token_work(r) * ms,
        later_work: t.later_tokens_work(r) * ms,
        later_tokens: f64::from(r.output_tokens.saturating_sub(1)),
        later_min,
        later_max,
        prompt_batches: super::prompt_batches(r, limits) as f64,
        prompt_tokens: f64::from(r.input_tokens),
        own_completion: (r.arrival_s + t.own_time(r, limits)) * ms,
    }
}

/// Columns of one request in one phase.
struct PhaseCols {
    /// Completes `m`-th; prompt done by the end of `m`; begun by then; some request
    /// arriving no earlier has begun by then.
    a: Variable,
    y: Variable,
    v: Variable,
    g: Variable,
    /// Prompt work, later tokens' work, later tokens generated, prompt batches.
    xp: Variable,
    xd: Variable,
    sd: Variable,
    sp: Variable,
    /// Cumulative to the end of `m`: completed, prompt work, later tokens, work, entries.
    done: Variable,
    cum_xp: Variable,
    cum_sd: Variable,
    cum_x: Variable,
    cum_s: Variable,
    /// HiGHS's column of `a` (`xp` is the fifth after it), to read the plan back.
    a_column: usize,
}

impl PhaseCols {
    /// Adds one request-phase pair's columns, in the order `a_column` relies on.
    fn add(vars: &mut ProblemVariables) -> Self {
        let a_column = vars.len();
        Self {
            a_column,
            a: vars.add(variable().binary()),
            y: vars.add(variable().binary()),
            v: vars.add(variable().binary()),
            g: vars.add(variable().binary()),
            xp: vars.add(variable().min(0.0)),
            xd: vars.add(variable().min(0.0)),
            sd: vars.add(variable().min(0.0)),
            sp: vars.add(variable().min(0.0)),
            done: vars.add(variable().min(0.0)),
            cum_xp: vars.add(variable().min(0.0)),
            cum_sd: vars.add(variable().min(0.0)),
            cum_x: vars.add(variable().min(0.0)),
            cum_s: vars.add(variable().min(0.0)),
        }
    }
}

// The rows read as the relaxation's algebra, indexed by request i and phase m.
#[allow(clippy::needless_range_loop)]
fn solve_relaxation(
    t: &Theta<'_>,
    reqs: &[Request],
    limits: &Limits,
    position_bounds: &[f64],
    sum_bound: Option<f64>,
    time_limit_s: f64,
    threads: u32,
) -> Option<Relaxed> {
    let n = reqs.len();
    let mut m = PhaseModel::new(t, reqs, limits);
    m.assignment_rows();
    for phase in 0..n {
        m.phase_rows(phase, position_bounds.get(phase).copied());
        for i in 0..n {
            m.request_rows(i, phase);
        }
    }
    m.later_arrival_rows();
    m.total_rows();
    // The completions add up to at least the mean-busy-time bound's sum.
    if let Some(sum) = sum_bound {
        let ends = m.ends.iter().sum::<Expression>();
        m.rows.push(constraint!(ends >= sum * MS));
    }
    let PhaseModel {
        vars,
        rows,
        cols,
        ends,
        ..
    } = m;
    let objective: Expression = ends.iter().sum();
    let mut problem = vars.minimise(objective).using(highs);
    for r in rows {
        problem.add_constraint(r);
    }
    let solved = run_relaxation(problem.into_inner(), time_limit_s, threads)?;
    let bound_ms = crate::backend::dual_bound(&solved)?;
    let arrivals: f64 = reqs.iter().map(|r| r.arrival_s).sum();
    // HiGHS's tolerances: keep a margin below its bound. Stopped before its root is solved,
    // HiGHS's dual bound can be below the cuts it was given, which are bounds themselves.
    let cuts = position_bounds
        .iter()
        .sum::<f64>()
        .max(sum_bound.unwrap_or(0.0));
    let bound = ((bound_ms * (1.0 - 1e-6) - 1e-6) / MS).max(cuts);
    let plan = matches!(
        solved.primal_solution_status(),
        highs::HighsSolutionStatus::Feasible
    )
    .then(|| read_plan(solved.get_solution().columns(), &cols))
    .flatten();
    Some(Relaxed {
        bound_s: ((bound - arrivals) / n as f64).max(0.0),
        plan,
    })
}

/// Milliseconds per second: the relaxation works in milliseconds.
const MS: f64 = 1e3;

/// Runs the relaxation's MILP; `None` when HiGHS overran its limit in heuristics that do
/// not check the clock (past the grace the relaxation gives no bound) or failed.
fn run_relaxation(
    mut model: highs::Model,
    time_limit_s: f64,
    threads: u32,
) -> Option<highs::SolvedModel> {
    crate::backend::configure(
        &mut model,
        &crate::backend::Settings {
            time_limit_s,
            threads,
            mip_rel_gap: 1e-6,
            mip_abs_gap: None,
            feasibility_jump: true,
            // Branch on pseudo-costs from the first node instead of strong branching until
            // they are reliable: strong branching spends the time share at the root here
            // (measured on the 12-request burst of README family (b) n = 32: bound 508.5 ->
            // 509.6 ms at 12 s, 508.5 -> 513.6 ms at 25 s; elsewhere within 0.02%).
            pscost_min_reliable: Some(0),
            presolve: true,
            log: crate::backend::Log::Quiet,
        },
    );
    crate::backend::run(model, time_limit_s)?.ok()
}

/// The phase relaxation's variables and rows under construction: phase `m` ends at the
/// `m`-th completion; `cols[i][m]` are request `i`'s columns in phase `m`.
struct PhaseModel {
    need: Vec<RequestNeeds>,
    /// Batch biases in ms: decode-only, prefill-only, the cheaper of the two; `hd`.
    bias_decode: f64,
    bias_prefill: f64,
    bias_min: f64,
    hd: f64,
    /// Entries one batch may hold.
    per_batch: f64,
    vars: ProblemVariables,
    rows: Vec<good_lp::Constraint>,
    cols: Vec<Vec<PhaseCols>>,
    decode_only: Vec<Variable>,
    prefill_only: Vec<Variable>,
    mixed: Vec<Variable>,
    ends: Vec<Variable>,
}

impl PhaseModel {
    fn new(t: &Theta<'_>, reqs: &[Request], limits: &Limits) -> Self {
        let n = reqs.len();
        let (one, hp, hd) = (
            t.get(Feature::One) * MS,
            t.get(Feature::HasPrefill) * MS,
            t.get(Feature::HasDecode) * MS,
        );
        let mut vars = ProblemVariables::new();
        let cols: Vec<Vec<PhaseCols>> = (0..n)
            .map(|_| (0..n).map(|_| PhaseCols::add(&mut vars)).collect())
            .collect();
        let column = |vars: &mut ProblemVariables| -> Vec<Variable> {
            (0..n).map(|_| vars.add(variable().min(0.0))).collect()
        };
        let (decode_only, prefill_only) = (column(&mut vars), column(&mut vars));
        let (mixed, ends) = (column(&mut vars), column(&mut vars));
        Self {
            need: reqs.iter().map(|r| needs(t, r, limits)).collect(),
            bias_decode: one + hd,
            bias_prefill: one + hp,
            bias_min: one + hp.min(hd),
            hd,
            per_batch: limits.max_running.unwrap_or(u64::MAX).min(n as u64) as f64,
            vars,
            rows: Vec::new(),
            cols,
            decode_only,
            prefill_only,
            mixed,
            ends,
        }
    }

    /// One request completes per phase, each request in one phase.
    fn assignment_rows(&mut self) {
        let n = self.cols.len();
        for i in 0..n {
            let phases = self.cols[i].iter().map(|c| c.a).sum::<Expression>();
            self.rows.push(constraint!(phases == 1.0));
        }
        for m in 0..n {
            let requests = (0..n).map(|i| self.cols[i][m].a).sum::<Expression>();
            self.rows.push(constraint!(requests == 1.0));
        }
    }

    /// Phase `m`'s length, entries per batch, and its completion's own and machine bounds
    /// (`position_bound`: the machine relaxation's `m`-th completion, seconds).
    fn phase_rows(&mut self, m: usize, position_bound: Option<f64>) {
        let n = self.cols.len();
        let cols = &self.cols;
        let batches = self.decode_only[m] + self.prefill_only[m] + self.mixed[m];
        // A phase lasts at least its batches' biases and its entries' work.
        let work: Expression = (0..n).map(|i| cols[i][m].xp + cols[i][m].xd).sum();
        let previous: Expression = if m == 0 {
            Expression::from(0.0)
        } else {
            self.ends[m - 1].into()
        };
        let (bd, bp, hd) = (self.bias_decode, self.bias_prefill, self.hd);
        let end = self.ends[m];
        self.rows.push(constraint!(
            end - previous
                >= bd * self.decode_only[m]
                    + bp * self.prefill_only[m]
                    + (bp + hd) * self.mixed[m]
                    + work
        ));
        // At most R entries per batch.
        let entries: Expression = (0..n).map(|i| cols[i][m].sp + cols[i][m].sd).sum();
        self.rows
            .push(constraint!(entries <= self.per_batch * batches));
        // The m-th completion: its own time and the machine relaxation's m-th.
        let own: Expression = (0..n)
            .map(|i| self.need[i].own_completion * cols[i][m].a)
            .sum();
        self.rows.push(constraint!(end >= own));
        if let Some(b) = position_bound {
            self.rows.push(constraint!(end >= b * MS));
        }
    }

    /// Request `i` in phase `m`: its entries and work, running sums, completion, order of
    /// prompt and later tokens, and arrival.
    fn request_rows(&mut self, i: usize, m: usize) {
        let c = &self.cols[i][m];
        let r = &self.need[i];
        let rows = &mut self.rows;
        let batches = self.decode_only[m] + self.prefill_only[m] + self.mixed[m];
        // The most entries it can have: a batch per prompt token and later token.
        let most = r.prompt_tokens + r.later_tokens;
        // One entry per request per batch; prompt chunks are in prefill batches.
        rows.push(constraint!(c.sp <= self.prefill_only[m] + self.mixed[m]));
        rows.push(constraint!(c.sp + c.sd <= batches));
        rows.push(constraint!(c.xp <= r.prompt_work * c.sp));
        rows.push(constraint!(c.xd >= r.later_min * c.sd));
        rows.push(constraint!(c.xd <= r.later_max * c.sd));
        // Cumulative sums.
        let zero = || Expression::from(0.0);
        let (done0, xp0, sd0, x0, s0): (
            Expression,
            Expression,
            Expression,
            Expression,
            Expression,
        ) = match m.checked_sub(1).map(|k| &self.cols[i][k]) {
            None => (zero(), zero(), zero(), zero(), zero()),
            Some(p) => (
                p.done.into(),
                p.cum_xp.into(),
                p.cum_sd.into(),
                p.cum_x.into(),
                p.cum_s.into(),
            ),
        };
        rows.push(constraint!(c.done == done0.clone() + c.a));
        rows.push(constraint!(c.cum_xp == xp0 + c.xp));
        rows.push(constraint!(c.cum_sd == sd0 + c.sd));
        rows.push(constraint!(c.cum_x == x0 + c.xp + c.xd));
        rows.push(constraint!(c.cum_s == s0 + c.sp + c.sd));
        // Completed by m: all its work is done; nothing after its completion.
        rows.push(constraint!(c.cum_xp >= r.prompt_work * c.done));
        rows.push(constraint!(c.cum_sd >= r.later_tokens * c.done));
        if m > 0 {
            rows.push(constraint!(
                c.xp + r.prompt_work * done0.clone() <= r.prompt_work
            ));
            rows.push(constraint!(c.sp + c.sd + most * done0 <= most));
        }
        // Later tokens only once the prompt is done.
        rows.push(constraint!(c.cum_sd <= r.later_tokens * c.y));
        rows.push(constraint!(c.cum_xp >= r.prompt_work * c.y));
        rows.push(constraint!(c.y >= c.done));
        // Everything it did by m is after its arrival, one batch per entry.
        rows.push(constraint!(c.cum_s <= most * c.v));
        let (bp, bmin) = (self.bias_prefill, self.bias_min);
        rows.push(constraint!(
            self.ends[m]
                >= r.arrival * c.v + c.cum_x + (bp - bmin) * (c.cum_s - c.cum_sd) + bmin * c.cum_s
        ));
    }

    /// The work of the requests arriving at or after T_i fits between T_i and the phase's
    /// end. Besides that work, request i's own batches pay their biases in the same span
    /// (every batch lasts its bias plus all its entries' work): counted where biases are a
    /// large part of the requests' own times (long outputs), as elsewhere it only changes
    /// HiGHS's path (milp.md).
    fn later_arrival_rows(&mut self) {
        let need = &self.need;
        let n = need.len();
        let own_time: f64 = need.iter().map(|r| r.own_completion - r.arrival).sum();
        let own_work: f64 = need.iter().map(|r| r.prompt_work + r.later_work).sum();
        let count_own_biases = own_time > 0.0 && (own_time - own_work) >= OWN_BIAS_SHARE * own_time;
        let (bp, bmin) = (self.bias_prefill, self.bias_min);
        for i in 0..n {
            let later: Vec<usize> = (0..n)
                .filter(|&k| need[k].arrival >= need[i].arrival)
                .collect();
            if later.len() <= 1 {
                continue;
            }
            let most: f64 = later
                .iter()
                .map(|&k| need[k].prompt_tokens + need[k].later_tokens)
                .sum();
            for m in 0..n {
                let cols = &self.cols;
                let started: Expression = later.iter().map(|&k| cols[k][m].cum_s).sum();
                let work: Expression = later.iter().map(|&k| cols[k][m].cum_x).sum();
                let c = &cols[i][m];
                let own_biases: Expression = if count_own_biases {
                    (bp - bmin) * (c.cum_s - c.cum_sd) + bmin * c.cum_s
                } else {
                    0.0.into()
                };
                self.rows.push(constraint!(started <= most * c.g));
                self.rows.push(constraint!(
                    self.ends[m] >= need[i].arrival * c.g + work + own_biases
                ));
            }
        }
    }

    /// Totals: the whole prompt (scaled to its least work), every later token.
    fn total_rows(&mut self) {
        for (i, r) in self.need.iter().enumerate() {
            let cols = &self.cols[i];
            let sum =
                |f: &dyn Fn(&PhaseCols) -> Variable| -> Expression { cols.iter().map(f).sum() };
            self.rows.push(constraint!(sum(&|c| c.xp) == r.prompt_work));
            self.rows.push(constraint!(sum(&|c| c.xd) >= r.later_work));
            self.rows
                .push(constraint!(sum(&|c| c.sd) == r.later_tokens));
            self.rows
                .push(constraint!(sum(&|c| c.sp) >= r.prompt_batches));
            self.rows
                .push(constraint!(sum(&|c| c.sp) <= r.prompt_tokens));
        }
    }
}

/// The plan of a solution's columns: who completes in each phase (the `a` at 1) and each
/// prompt's share per phase (`xp` over the prompt's total). None when the columns do not
/// make a permutation (they always should at a feasible point).
fn read_plan(columns: &[f64], cols: &[Vec<PhaseCols>]) -> Option<PhasePlan> {
    let n = cols.len();
    let value = |c: usize| columns.get(c).copied().unwrap_or(0.0);
    let completes = (0..n)
        .map(|m| (0..n).find(|&i| value(cols[i][m].a_column) > 0.5))
        .collect::<Option<Vec<usize>>>()?;
    let mut seen = vec![false; n];
    for &i in &completes {
        if std::mem::replace(&mut seen[i], true) {
            return None;
        }
    }
    // xp is the fifth column after a (a, y, v, g, xp).
    let prompt_share = cols
        .iter()
        .map(|row| {
            let xp: Vec<f64> = row.iter().map(|c| value(c.a_column + 4).max(0.0)).collect();
            let total: f64 = xp.iter().sum();
            if total > 0.0 {
                xp.iter().map(|x| x / total).collect()
            } else {
                vec![0.0; n]
            }
        })
        .collect();
    Some(PhasePlan {
        completes,
        prompt_share,
    })
}
