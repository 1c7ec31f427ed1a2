//! The MILP against the independent exhaustive search, the heuristics and the replay.

use infersched_core::{Limits, Request, Summary, Workload, replay};
use infersched_cost_model::preset;
use infersched_schedulers::{Knobs, SCHEDULER_NAMES, SchedulerKind};
use infersched_solver::{
    BoundMethod, Objective, PolicyConstraints, SolveError, SolveMethod, SolveOptions, SolveStatus,
    solve,
};
use infersched_test_kit::exhaustive::{self, Class};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn tiny(seed: u64) -> (Workload, Limits) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = rng.random_range(2..=3);
    let w = Workload::new(
        (0..n)
            .map(|_| Request {
                input_tokens: rng.random_range(1..=4),
                output_tokens: rng.random_range(1..=3),
                arrival_s: 0.0,
            })
            .collect(),
    )
    .unwrap();
    let need = infersched_test_kit::largest_kv_need(&w);
    // M from just enough for the largest request (forcing evictions) to a little more.
    let limits = Limits {
        token_budget: if rng.random_bool(0.5) {
            Some(rng.random_range(2..=6))
        } else {
            None
        },
        kv_capacity: Some(need + rng.random_range(0..=2)),
        ..Limits::unlimited()
    };
    (w, limits)
}

fn exact_options(constraints: PolicyConstraints) -> SolveOptions {
    SolveOptions {
        mip_rel_gap: 1e-9,
        time_limit_s: 60.0,
        constraints,
        ..SolveOptions::default()
    }
}

fn class_of(c: PolicyConstraints) -> Class {
    Class {
        no_evict: c.no_evict,
        no_chunk: c.no_chunk,
        no_mix: c.no_mix,
        fcfs: c.fcfs,
        reserve: c.reserve,
    }
}

/// Solves instance `seed` for makespan in `constraints` and checks the MILP against the
/// exhaustive search: proven optimal, the same replayed value, a schedule in the class.
/// Returns the search's optimum and the report; None when the search space is too big.
fn check_against_search(
    seed: u64,
    w: &Workload,
    limits: &Limits,
    cost: &infersched_cost_model::LinearCostModel,
    constraints: PolicyConstraints,
) -> Option<(f64, infersched_solver::SolveReport)> {
    let (best, _) = exhaustive::optimum(
        w,
        limits,
        cost,
        exhaustive::Objective::Makespan,
        class_of(constraints),
        500_000,
    )?;
    // The combinatorial bound holds for every schedule, so it is at most the optimum (of
    // the unconstrained class too, which is at most this class's).
    let bound = infersched_solver::bounds::lower_bound(w, limits, cost, Objective::Makespan);
    assert!(
        bound.value_s > 0.0 && bound.value_s <= best * (1.0 + 1e-9),
        "seed {seed}: combinatorial bound {:?} above the optimum {best}",
        bound
    );
    // Both exact methods: the default (the counting search where it applies) and the
    // MILP alone.
    let mut reports = Vec::new();
    for max_search_states in [SolveOptions::default().max_search_states, 0] {
        let options = SolveOptions {
            max_search_states,
            ..exact_options(constraints)
        };
        let report = match solve(w, limits, cost, Objective::Makespan, &options) {
            Ok(r) => r,
            Err(SolveError::Infeasible(why)) => {
                panic!("seed {seed}: the search found {best} but the solver says infeasible: {why}")
            }
            Err(e) => panic!("seed {seed}: {e}"),
        };
        assert_eq!(report.status, SolveStatus::Optimal, "seed {seed}");
        let rel = (report.replayed_objective - best).abs() / best;
        assert!(
            rel < 1e-7,
            "seed {seed} {constraints:?} {:?}: {} vs exhaustive {best}",
            report.method,
            report.replayed_objective
        );
        assert!(
            constraints.admits(w, limits, &report.schedule),
            "seed {seed}"
        );
        if max_search_states == 0 {
            assert_eq!(report.method, SolveMethod::Milp);
        }
        reports.push(report);
    }
    Some((best, reports.swap_remove(1)))
}

#[test]
fn fcfs_and_reserve_optima_equal_the_exhaustive_search() {
    let cost = preset("llama2-7b-a100").unwrap();
    let mut compared = 0;
    for seed in 200..212 {
        let (w, limits) = tiny(seed);
        let constraints = if seed % 2 == 0 {
            PolicyConstraints {
                fcfs: true,
                ..Default::default()
            }
        } else {
            PolicyConstraints {
                reserve: true,
                ..Default::default()
            }
        };
        let Some((_, report)) = check_against_search(seed, &w, &limits, &cost, constraints) else {
            continue;
        };
        // No worse than the heuristic of the class: Orca reserves I + O - 1 and never
        // preempts; every heuristic admits in arrival order.
        let kind = if constraints.reserve {
            SchedulerKind::Orca
        } else {
            SchedulerKind::Vllm
        };
        if let Ok(sim) = kind.simulate(&w, &Knobs::matching(&limits), &cost) {
            let h = replay(&w, &limits, &cost, &sim.schedule).unwrap();
            assert!(
                report.replayed_objective <= h.makespan_s() * (1.0 + 1e-9),
                "seed {seed}"
            );
            assert!(
                constraints.admits(&w, &limits, &sim.schedule),
                "seed {seed}: {kind:?}"
            );
        }
        compared += 1;
    }
    assert!(compared >= 8, "only {compared} instances were small enough");
}

#[test]
fn class_membership_checks_fcfs_order_and_reservations() {
    use infersched_core::{Batch, Entry, Schedule};
    let w = infersched_test_kit::workload(&[(2, 2, 0.0), (2, 2, 0.0)]);
    let limits = Limits {
        kv_capacity: Some(5),
        ..Limits::unlimited()
    };
    let fcfs = PolicyConstraints {
        fcfs: true,
        ..Default::default()
    };
    let reserve = PolicyConstraints {
        reserve: true,
        ..Default::default()
    };
    // Request 1 first, then 0: not FCFS. Both together reserve 3 + 3 > 5.
    let late = Schedule::new(vec![
        Batch::new(vec![Entry::process(1, 2)]),
        Batch::new(vec![Entry::process(0, 2), Entry::process(1, 1)]),
        Batch::new(vec![Entry::process(0, 1)]),
    ]);
    replay(&w, &limits, &cost_model(), &late).unwrap();
    assert!(!fcfs.admits(&w, &limits, &late));
    assert!(!reserve.admits(&w, &limits, &late));
    // One after the other, in order: both classes admit it.
    let serial = Schedule::new(vec![
        Batch::new(vec![Entry::process(0, 2)]),
        Batch::new(vec![Entry::process(0, 1)]),
        Batch::new(vec![Entry::process(1, 2)]),
        Batch::new(vec![Entry::process(1, 1)]),
    ]);
    replay(&w, &limits, &cost_model(), &serial).unwrap();
    assert!(fcfs.admits(&w, &limits, &serial));
    assert!(reserve.admits(&w, &limits, &serial));
}

/// README family (a) with a token budget: `n` requests of I = 16, O = 8 at t = 0, C = 64,
/// M = 92.
fn family_a_with_a_token_budget(n: usize) -> (Workload, Limits) {
    let w = Workload::new(vec![
        Request {
            input_tokens: 16,
            output_tokens: 8,
            arrival_s: 0.0,
        };
        n
    ])
    .unwrap();
    let limits = Limits {
        token_budget: Some(64),
        kv_capacity: Some(92),
        ..Limits::unlimited()
    };
    (w, limits)
}

fn cost_model() -> infersched_cost_model::LinearCostModel {
    preset("llama2-7b-a100").unwrap()
}

#[test]
fn makespan_equals_the_exhaustive_optimum_on_60_random_tiny_instances() {
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut compared, mut with_evictions) = (0, 0);
    for seed in 0..60 {
        let (w, limits) = tiny(seed);
        let constraints = match seed % 4 {
            0 | 1 => PolicyConstraints::default(),
            2 => PolicyConstraints {
                no_chunk: true,
                no_mix: true,
                ..Default::default()
            },
            _ => PolicyConstraints {
                no_evict: true,
                ..Default::default()
            },
        };
        let Some((best, report)) = check_against_search(seed, &w, &limits, &cost, constraints)
        else {
            continue;
        };
        assert!(report.horizon_proven_sufficient, "seed {seed}");
        assert!(report.best_bound <= report.replayed_objective * (1.0 + 1e-9));
        assert!(
            report.best_bound >= best * (1.0 - 1e-6),
            "seed {seed}: bound {} far below {best}",
            report.best_bound
        );
        // The solver's schedule passes the replay (class membership checked above).
        let r = replay(&w, &limits, &cost, &report.schedule).unwrap();
        with_evictions += usize::from(Summary::from_replay(&r).evictions > 0);
        compared += 1;
    }
    eprintln!("{compared} instances compared, {with_evictions} optimal schedules evict");
    // Most instances are small enough for the exhaustive search, and the memory limits
    // make some optima evict: otherwise this test would check little.
    assert!(
        compared >= 50,
        "only {compared} instances compared (55 when written)"
    );
    assert!(
        with_evictions >= 4,
        "{with_evictions} optimal schedules evict (8 when written)"
    );
}

#[test]
fn mean_latency_equals_the_exhaustive_optimum() {
    let cost = preset("llama2-7b-a100").unwrap();
    for seed in 100..112 {
        let (w, limits) = tiny(seed);
        let Some((best, s)) = exhaustive::optimum(
            &w,
            &limits,
            &cost,
            exhaustive::Objective::MeanLatency,
            Class::default(),
            500_000,
        ) else {
            continue;
        };
        let bound =
            infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::MeanLatency);
        assert!(
            bound.value_s > 0.0 && bound.value_s <= best * (1.0 + 1e-9),
            "seed {seed}: mean-latency bound {bound:?} above the optimum {best}"
        );
        // Both exact methods: the counting search (which applies when C is unlimited) and
        // the MILP; mean latency has no horizon proof, so give the MILP J enough for the
        // exhaustive search's schedule.
        let counting = SolveOptions {
            horizon: None,
            ..exact_options(PolicyConstraints::default())
        };
        let milp = SolveOptions {
            horizon: Some(s.batches.len() + 2),
            max_search_states: 0,
            ..exact_options(PolicyConstraints::default())
        };
        for options in [counting, milp] {
            if options.max_search_states > 0 && limits.token_budget.is_some() {
                continue;
            }
            let report = solve(&w, &limits, &cost, Objective::MeanLatency, &options).unwrap();
            assert_eq!(report.status, SolveStatus::Optimal, "seed {seed}");
            let rel = (report.replayed_objective - best).abs() / best;
            assert!(
                rel < 1e-7,
                "seed {seed} {:?}: {} vs exhaustive {best}",
                report.method,
                report.replayed_objective
            );
            assert!(report.best_bound <= report.replayed_objective * (1.0 + 1e-9));
            assert_eq!(
                report.method == SolveMethod::CountingSearch,
                options.max_search_states > 0
            );
        }
    }
}

#[test]
fn the_phase_relaxation_never_exceeds_the_exhaustive_optimum() {
    // Tiny offline instances, evictions forced by M in many: the phase relaxation's bound
    // is at most the exhaustive optimum, at least the machine bound, and above it often.
    // Mean TTFT too (the relaxation of the first tokens alone).
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut compared, mut stronger) = ([0; 2], [0; 2]);
    for seed in 300..340 {
        let (w, limits) = tiny(seed);
        for (k, (objective, exhaustive_objective)) in [
            (Objective::MeanLatency, exhaustive::Objective::MeanLatency),
            (Objective::MeanTtft, exhaustive::Objective::MeanTtft),
        ]
        .into_iter()
        .enumerate()
        {
            let Some((best, _)) = exhaustive::optimum(
                &w,
                &limits,
                &cost,
                exhaustive_objective,
                Class::default(),
                500_000,
            ) else {
                continue;
            };
            let phase = infersched_solver::bounds::phase_relaxation_bound(
                &w, &limits, &cost, objective, 5.0, 1,
            )
            .expect("applies to a few requests");
            let machine =
                infersched_solver::bounds::lower_bound(&w, &limits, &cost, objective).value_s;
            assert!(
                phase.value_s <= best * (1.0 + 1e-9),
                "seed {seed} {objective:?}: phase relaxation {phase:?} above the optimum {best}"
            );
            assert!(phase.value_s >= machine * (1.0 - 1e-5), "seed {seed}");
            compared[k] += 1;
            stronger[k] += usize::from(phase.value_s > machine * 1.001);
        }
    }
    eprintln!("compared {compared:?}, stronger {stronger:?}");
    assert!(compared.iter().all(|&c| c >= 30), "{compared:?}");
    assert!(
        stronger[0] >= 5 && stronger[1] >= 5,
        "{stronger:?} of {compared:?}"
    );
}

#[test]
fn the_optimum_beats_every_heuristic_and_constraints_only_cost() {
    let cost = preset("llama2-7b-a100").unwrap();
    for seed in 200..215 {
        let (w, limits) = tiny(seed);
        let free = solve(
            &w,
            &limits,
            &cost,
            Objective::Makespan,
            &exact_options(PolicyConstraints::default()),
        )
        .unwrap();
        let knobs = Knobs::matching(&limits);
        for name in SCHEDULER_NAMES {
            let kind: SchedulerKind = name.parse().unwrap();
            let Ok(sim) = kind.simulate(&w, &knobs, &cost) else {
                continue;
            };
            let h = Summary::from_replay(&replay(&w, &sim.limits, &cost, &sim.schedule).unwrap())
                .makespan_s;
            assert!(
                free.replayed_objective <= h * (1.0 + 1e-9),
                "seed {seed}: {name} {h} < optimum {}",
                free.replayed_objective
            );
            // vLLM's class (whole prompts, prefill-only batches): its constrained optimum
            // lies between the unconstrained optimum and vLLM itself.
            if kind == SchedulerKind::Vllm {
                let c = PolicyConstraints {
                    no_chunk: true,
                    no_mix: true,
                    ..Default::default()
                };
                let cls =
                    solve(&w, &limits, &cost, Objective::Makespan, &exact_options(c)).unwrap();
                assert!(cls.replayed_objective >= free.replayed_objective * (1.0 - 1e-9));
                assert!(
                    cls.replayed_objective <= h * (1.0 + 1e-9),
                    "seed {seed}: {} > vllm {h}",
                    cls.replayed_objective
                );
            }
        }
        let no_evict = solve(
            &w,
            &limits,
            &cost,
            Objective::Makespan,
            &exact_options(PolicyConstraints {
                no_evict: true,
                ..Default::default()
            }),
        )
        .unwrap();
        assert!(no_evict.replayed_objective >= free.replayed_objective * (1.0 - 1e-9));
    }
}

#[test]
fn infeasible_input_fails_fast_with_the_reason() {
    let cost = preset("llama2-7b-a100").unwrap();
    let w = Workload::new(vec![Request {
        input_tokens: 5,
        output_tokens: 4,
        arrival_s: 0.0,
    }])
    .unwrap();
    let limits = Limits {
        kv_capacity: Some(7),
        ..Limits::unlimited()
    };
    let e = solve(
        &w,
        &limits,
        &cost,
        Objective::Makespan,
        &SolveOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("request 0 needs 8 KV tokens"), "{e}");
    let limits = Limits {
        kv_capacity: Some(8),
        ..Limits::unlimited()
    };
    let short = SolveOptions {
        horizon: Some(3),
        ..SolveOptions::default()
    };
    let e = solve(&w, &limits, &cost, Objective::Makespan, &short).unwrap_err();
    assert!(
        e.to_string().contains("shorter than the longest output"),
        "{e}"
    );
    // A model over the size limit is not built: the best heuristic schedule comes back with
    // a combinatorial bound, and the report says why; just under, the MILP solves.
    let small = SolveOptions {
        max_arc_columns: 5,
        max_search_states: 0,
        ..SolveOptions::default()
    };
    let r = solve(&w, &limits, &cost, Objective::Makespan, &small).unwrap();
    assert_eq!(r.method, SolveMethod::BestHeuristic);
    // Proven only where the bound meets the schedule.
    assert_eq!(
        r.status == SolveStatus::Optimal,
        r.best_bound >= r.replayed_objective * (1.0 - 1e-9),
        "{r:?}"
    );
    assert!(
        r.note
            .as_deref()
            .unwrap()
            .contains("more than 5 arc variables"),
        "{:?}",
        r.note
    );
    assert!(matches!(r.bound_method, BoundMethod::Combinatorial(_)));
    assert!(r.best_bound > 0.0 && r.best_bound <= r.replayed_objective);
    assert!((r.certified_gap - (1.0 - r.best_bound / r.replayed_objective)).abs() < 1e-12);
    replay(&w, &limits, &cost, &r.schedule).unwrap();
    // Likewise past the memory limit, estimated before any state graph is built.
    let tight = SolveOptions {
        memory_limit_bytes: 1000,
        // Not stopping where the best heuristic meets the bound (it does here).
        max_search_states: 0,
        ..SolveOptions::default()
    };
    let r = solve(&w, &limits, &cost, Objective::MeanLatency, &tight).unwrap();
    assert_eq!(r.method, SolveMethod::BestHeuristic);
    assert!(
        r.note.as_deref().unwrap().contains("over the memory limit"),
        "{:?}",
        r.note
    );
    assert!(r.best_bound > 0.0 && r.best_bound <= r.replayed_objective);
    let roomy = SolveOptions {
        max_arc_columns: 100_000,
        max_search_states: 0,
        ..SolveOptions::default()
    };
    assert!(solve(&w, &limits, &cost, Objective::Makespan, &roomy).is_ok());
}

#[test]
fn arrivals_delay_batches_in_the_model_as_in_the_replay() {
    let cost = preset("llama2-7b-a100").unwrap();
    let w = Workload::new(vec![
        Request {
            input_tokens: 3,
            output_tokens: 2,
            arrival_s: 0.0,
        },
        Request {
            input_tokens: 2,
            output_tokens: 2,
            arrival_s: 0.05,
        },
    ])
    .unwrap();
    let limits = Limits {
        kv_capacity: Some(8),
        ..Limits::unlimited()
    };
    let r = solve(
        &w,
        &limits,
        &cost,
        Objective::Makespan,
        // The MILP itself (the best heuristic meets the bound here).
        &SolveOptions {
            max_search_states: 0,
            ..exact_options(PolicyConstraints::default())
        },
    )
    .unwrap();
    assert_eq!(r.status, SolveStatus::Optimal);
    let m = r.milp_objective.unwrap();
    assert!(
        (m - r.replayed_objective).abs() < 1e-9,
        "MILP {m} vs replay {}",
        r.replayed_objective
    );
    assert!(r.replayed_objective > 0.05);
}

#[test]
fn identical_requests_are_aggregated_and_still_exact() {
    let cost = preset("llama2-7b-a100").unwrap();
    for (i, o, m, c) in [
        (3u32, 2u32, 6u64, Some(6u64)),
        (2, 3, 5, None),
        (4, 2, 7, Some(5)),
    ] {
        let w = Workload::new(vec![
            Request {
                input_tokens: i,
                output_tokens: o,
                arrival_s: 0.0
            };
            3
        ])
        .unwrap();
        let limits = Limits {
            token_budget: c,
            kv_capacity: Some(m),
            ..Limits::unlimited()
        };
        let (best, _) = exhaustive::optimum(
            &w,
            &limits,
            &cost,
            exhaustive::Objective::Makespan,
            Class::default(),
            500_000,
        )
        .unwrap();
        let r = solve(
            &w,
            &limits,
            &cost,
            Objective::Makespan,
            &exact_options(PolicyConstraints::default()),
        )
        .unwrap();
        assert_eq!(r.status, SolveStatus::Optimal);
        let rel = (r.replayed_objective - best).abs() / best;
        assert!(
            rel < 1e-7,
            "I={i} O={o} M={m}: MILP {} vs exhaustive {best}",
            r.replayed_objective
        );
        // One class of three: the flows were split back into three valid request paths.
        assert_eq!(
            replay(&w, &limits, &cost, &r.schedule)
                .unwrap()
                .requests
                .len(),
            3
        );
    }
}

#[test]
fn counting_search_equals_the_milp_on_identical_requests() {
    // Identical offline requests without C: the counting search proves the optimum; the
    // MILP alone (with J from the search's schedule for the latency objectives) agrees.
    let cost = preset("llama2-7b-a100").unwrap();
    let cases = [
        (6, 8, 4, 33, Objective::Makespan),
        (4, 4, 3, 12, Objective::MeanLatency),
        (4, 4, 3, 12, Objective::MeanTtft),
    ];
    for (n, i, o, m, objective) in cases {
        let w = Workload::new(vec![
            Request {
                input_tokens: i,
                output_tokens: o,
                arrival_s: 0.0,
            };
            n
        ])
        .unwrap();
        let limits = Limits {
            kv_capacity: Some(m),
            ..Limits::unlimited()
        };
        let counted = solve(
            &w,
            &limits,
            &cost,
            objective,
            &exact_options(PolicyConstraints::default()),
        )
        .unwrap();
        assert_eq!(counted.method, SolveMethod::CountingSearch, "{objective:?}");
        assert_eq!(counted.status, SolveStatus::Optimal);
        assert_eq!(counted.certified_gap, 0.0);
        let milp = solve(
            &w,
            &limits,
            &cost,
            objective,
            &SolveOptions {
                max_search_states: 0,
                horizon: (objective != Objective::Makespan)
                    .then_some(counted.schedule.batches.len() + 2),
                ..exact_options(PolicyConstraints::default())
            },
        )
        .unwrap();
        assert_eq!(milp.method, SolveMethod::Milp);
        assert_eq!(milp.status, SolveStatus::Optimal, "{objective:?}");
        let rel = (milp.replayed_objective - counted.replayed_objective).abs()
            / counted.replayed_objective;
        assert!(
            rel < 1e-7,
            "{objective:?}: MILP {} vs counting search {}",
            milp.replayed_objective,
            counted.replayed_objective
        );
        // The counting search's schedule replays to the value it reports.
        let r = replay(&w, &limits, &cost, &counted.schedule).unwrap();
        assert!(
            (objective.of(&Summary::from_replay(&r)) - counted.replayed_objective).abs() < 1e-15
        );
    }
}

#[test]
fn counting_search_is_exact_for_whole_prefills_under_token_budgets() {
    // With C (and P) the counting search answers the no-chunk class exactly: per batch it
    // enforces the budgets, and the class has no partial-prefill arcs. The MILP of the same
    // class agrees; the unrestricted MILP can only be better (chunks fill leftover budget).
    let cost = preset("llama2-7b-a100").unwrap();
    let r = |i, o| Request {
        input_tokens: i,
        output_tokens: o,
        arrival_s: 0.0,
    };
    let cases = [
        (vec![r(6, 3); 4], 20, Some(8), None, Objective::Makespan),
        (vec![r(6, 3); 4], 20, Some(8), None, Objective::MeanLatency),
        (
            vec![r(5, 2), r(5, 2), r(3, 3), r(3, 3)],
            14,
            Some(7),
            Some(5),
            Objective::Makespan,
        ),
        (
            vec![r(5, 2), r(5, 2), r(3, 3), r(3, 3)],
            14,
            Some(7),
            Some(5),
            Objective::MeanTtft,
        ),
    ];
    let no_chunk = PolicyConstraints {
        no_chunk: true,
        ..PolicyConstraints::default()
    };
    for (reqs, m, c, p, objective) in cases {
        let w = Workload::new(reqs).unwrap();
        let limits = Limits {
            kv_capacity: Some(m),
            token_budget: c,
            prefill_budget: p,
            ..Limits::unlimited()
        };
        let counted = solve(&w, &limits, &cost, objective, &exact_options(no_chunk)).unwrap();
        assert_eq!(
            (counted.method, counted.status),
            (SolveMethod::CountingSearch, SolveStatus::Optimal),
            "{objective:?}"
        );
        assert!(no_chunk.admits(&w, &limits, &counted.schedule));
        let milp = solve(
            &w,
            &limits,
            &cost,
            objective,
            &SolveOptions {
                max_search_states: 0,
                horizon: (objective != Objective::Makespan)
                    .then_some(counted.schedule.batches.len() + 2),
                ..exact_options(no_chunk)
            },
        )
        .unwrap();
        assert_eq!(
            (milp.method, milp.status),
            (SolveMethod::Milp, SolveStatus::Optimal),
            "{objective:?}"
        );
        let rel = (milp.replayed_objective - counted.replayed_objective).abs()
            / counted.replayed_objective;
        assert!(
            rel < 1e-7,
            "{objective:?}: MILP {} vs counting search {}",
            milp.replayed_objective,
            counted.replayed_objective
        );
        // Chunks allowed: not the counting search's question, and never worse, even
        // stopped early (the whole-prefill optimum is among its starting schedules).
        let any = solve(
            &w,
            &limits,
            &cost,
            objective,
            &SolveOptions {
                time_limit_s: 3.0,
                ..exact_options(PolicyConstraints::default())
            },
        )
        .unwrap();
        // The MILP answers, or the pooled search proves a schedule optimal over chunked ones
        // before it (here TTFT).
        assert!(
            matches!(any.method, SolveMethod::Milp | SolveMethod::CountingSearch),
            "{objective:?}: {:?}",
            any.method
        );
        assert!(any.replayed_objective <= counted.replayed_objective * (1.0 + 1e-9));
    }
}

/// The agreement of the independent groups with the whole workload's MILP over `seeds`, counted:
/// (solves split, split bounds stronger than the machine bound, proven by both, proven
/// by the groups only).
fn groups_agree_with_the_whole_milp(seeds: std::ops::Range<u64>) -> (usize, usize, usize, usize) {
    // Two bursts of tiny requests with arrivals, mostly far apart (the best heuristic serves
    // each burst before the next arrives), some close enough to compete. Reference: the
    // arc-flow MILP on the whole workload (3 s; its schedule at the limit is a schedule
    // too, and its bound a bound). Forced off exact models (memory limit 0), the solve
    // splits the bursts and solves each alone: its bound is at most the MILP's schedule.
    // With exact models, each burst's MILP: where both prove optimality they agree.
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut split_count, mut stronger, mut both_proven, mut only_groups) = (0, 0, 0, 0);
    for seed in seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut reqs = Vec::new();
        let mut t = 0.0;
        for _ in 0..2 {
            for _ in 0..rng.random_range(1..=2) {
                reqs.push(Request {
                    input_tokens: rng.random_range(1..=6),
                    output_tokens: rng.random_range(1..=3),
                    arrival_s: t + rng.random_range(0.0..0.002),
                });
            }
            t += if rng.random_bool(0.75) { 1.0 } else { 0.004 };
        }
        let w = Workload::new(reqs).unwrap();
        let limits = Limits {
            token_budget: Some(rng.random_range(3..=8)),
            kv_capacity: Some(infersched_test_kit::largest_kv_need(&w) + rng.random_range(0..=4)),
            ..Limits::unlimited()
        };
        let run = |options: SolveOptions| {
            let r = solve(&w, &limits, &cost, Objective::MeanLatency, &options).unwrap();
            // The returned schedule replays to the value reported.
            let replayed = replay(&w, &limits, &cost, &r.schedule).unwrap();
            let value = Summary::from_replay(&replayed).mean_e2e_s;
            assert!((value - r.replayed_objective).abs() <= 1e-12, "seed {seed}");
            assert!(r.best_bound <= r.replayed_objective, "seed {seed}");
            r
        };
        // The MILP (where a heuristic meets the bound it would not run).
        let quick = SolveOptions {
            time_limit_s: 3.0,
            threads: 1,
            max_search_states: 0,
            ..exact_options(PolicyConstraints::default())
        };
        let whole = run(SolveOptions {
            independent_groups: false,
            ..quick.clone()
        });
        assert_eq!(whole.method, SolveMethod::Milp, "seed {seed}");
        let split = run(SolveOptions {
            memory_limit_bytes: 0,
            ..quick.clone()
        });
        let grouped = run(quick);
        for (name, r) in [("split", &split), ("grouped", &grouped)] {
            assert!(
                r.best_bound <= whole.replayed_objective * (1.0 + 1e-9),
                "seed {seed}: {name} bound {} ({}) above the MILP's schedule {}",
                r.best_bound,
                r.bound_method.name(),
                whole.replayed_objective
            );
            assert!(
                whole.best_bound <= r.replayed_objective * (1.0 + 1e-9),
                "seed {seed}: {name} schedule {} below the MILP's bound {}",
                r.replayed_objective,
                whole.best_bound
            );
        }
        if split.method == SolveMethod::IndependentGroups {
            split_count += 1;
            let machine =
                infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::MeanLatency)
                    .value_s;
            stronger += usize::from(split.best_bound > machine * 1.001);
        }
        if grouped.status == SolveStatus::Optimal {
            if whole.status == SolveStatus::Optimal {
                both_proven += 1;
                let rel = (grouped.replayed_objective - whole.replayed_objective).abs()
                    / whole.replayed_objective;
                assert!(rel < 1e-6, "seed {seed}: {grouped:?} vs {whole:?}");
            } else {
                only_groups += 1;
            }
        }
    }
    eprintln!(
        "{split_count} split, {stronger} stronger than the machine bound, {both_proven} proven by both, {only_groups} only by the groups"
    );
    (split_count, stronger, both_proven, only_groups)
}

// Two tests of 10 seeds each (20 in all), so that they run side by side. Measured
// (2026-11-28, alone): seeds 400-409 split 9, stronger 2, proven by both 2 and by the
// groups only 3; seeds 410-419 split 7, stronger 5, both 2, groups only 0.

#[test]
fn independent_groups_agree_with_the_whole_workload_milp_a() {
    let (split, stronger, both, only_groups) = groups_agree_with_the_whole_milp(400..410);
    assert!(split >= 8, "{split} of 10 split");
    // The groups' bound beats the whole workload's combinatorial one on some seeds.
    assert!(stronger >= 2, "{stronger} of {split} stronger");
    // Each burst's MILP is tiny: the groups prove optimality where the whole MILP, over
    // the idle second between the bursts, often stops at its limit.
    assert!(
        both + only_groups >= 4,
        "{both} + {only_groups} proven by the groups"
    );
    // The whole MILP proves within its 3 s on 2 of these seeds alone, on fewer under the
    // load of the other exactness tests: at least one checks the agreement.
    assert!(both >= 1, "{both} proven by both");
}

#[test]
fn independent_groups_agree_with_the_whole_workload_milp_b() {
    let (split, stronger, both, only_groups) = groups_agree_with_the_whole_milp(410..420);
    assert!(split >= 7, "{split} of 10 split");
    assert!(stronger >= 2, "{stronger} of {split} stronger");
    assert!(
        both + only_groups >= 1,
        "{both} + {only_groups} proven by the groups"
    );
}

#[test]
fn the_pooled_search_bound_never_exceeds_the_exhaustive_optimum() {
    // Classes of identical requests under a token budget, M from just enough (evictions
    // pay) to a little more, KV blocks of 1 or 2 tokens: the pooled search's bound over
    // chunked schedules is at most the exhaustive optimum of every class it is asked for,
    // for makespan, mean latency and mean TTFT, and meets it often.
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut compared, mut tight) = ([0; 3], [0; 3]);
    for seed in 900..940u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = infersched_test_kit::identical_classes(&mut rng, 2..=4, 1..=3, 1..=2);
        let need = infersched_test_kit::largest_kv_need(&w);
        let block_size = if rng.random_bool(0.25) { 2 } else { 1 };
        let need = need.div_ceil(u64::from(block_size)) * u64::from(block_size);
        let limits = Limits {
            token_budget: Some(rng.random_range(2..=6)),
            kv_capacity: Some(need + rng.random_range(0..=3)),
            block_size,
            ..Limits::unlimited()
        };
        let constraints = PolicyConstraints {
            no_evict: rng.random_bool(0.3),
            ..PolicyConstraints::default()
        };
        for (k, (objective, exhaustive_objective)) in [
            (Objective::Makespan, exhaustive::Objective::Makespan),
            (Objective::MeanLatency, exhaustive::Objective::MeanLatency),
            (Objective::MeanTtft, exhaustive::Objective::MeanTtft),
        ]
        .into_iter()
        .enumerate()
        {
            let Some((best, _)) = exhaustive::optimum(
                &w,
                &limits,
                &cost,
                exhaustive_objective,
                class_of(constraints),
                100_000,
            ) else {
                continue;
            };
            let bound = infersched_solver::bounds::pooled_search_bound(
                &w,
                &limits,
                &cost,
                objective,
                &constraints,
                30.0,
                1_000_000,
            )
            .expect("applies to offline classes");
            assert!(
                bound.value_s <= best * (1.0 + 1e-9),
                "seed {seed} {objective:?} {constraints:?}: pooled bound {} above the optimum {best}",
                bound.value_s
            );
            compared[k] += 1;
            tight[k] += usize::from(bound.value_s >= best * (1.0 - 1e-9));
        }
    }
    assert!(compared.iter().all(|&c| c >= 35), "{compared:?}");
    // Makespan 27, mean latency 31, TTFT 31 of 40 when written: the dropped terms (a chunk's
    // context), costs moved to a phase's last batch and the refills' pooled tokens are
    // what separates the others.
    assert!(tight.iter().all(|&t| t >= 20), "{tight:?} of {compared:?}");
}

#[test]
fn the_pooled_search_bound_never_exceeds_a_replayed_heuristic_on_larger_classes() {
    // Beyond the exhaustive search's reach: classes of up to 10 identical requests with
    // prompts of up to 24 tokens under C and a tight M, evictions allowed (where the
    // canonical-eviction rules prune). The pooled bound (stopped at 10,000 vectors where it
    // does not finish) is at most every heuristic's replayed makespan, mean latency and mean
    // TTFT under every running-set cap, and meets the best of them on some (makespan 7,
    // mean latency 8, TTFT 2 of 30 when written).
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut compared, mut met) = ([0; 3], [0; 3]);
    for seed in 0..30u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(7_000 + seed);
        let w = infersched_test_kit::identical_classes(&mut rng, 4..=24, 2..=6, 2..=5);
        let need = infersched_test_kit::largest_kv_need(&w);
        let limits = Limits {
            token_budget: Some(rng.random_range(need / 2..=2 * need).max(2)),
            kv_capacity: Some(need + rng.random_range(0..=2 * need)),
            ..Limits::unlimited()
        };
        for (k, objective) in [
            Objective::Makespan,
            Objective::MeanLatency,
            Objective::MeanTtft,
        ]
        .into_iter()
        .enumerate()
        {
            let bound = infersched_solver::bounds::pooled_search_bound(
                &w,
                &limits,
                &cost,
                objective,
                &PolicyConstraints::default(),
                600.0,
                10_000,
            )
            .expect("applies to offline classes")
            .value_s;
            let mut best = f64::INFINITY;
            for name in SCHEDULER_NAMES {
                let kind: SchedulerKind = name.parse().unwrap();
                for cap in [None, Some(1), Some(2), Some(3), Some(4)] {
                    let knobs = Knobs {
                        max_running: cap,
                        ..Knobs::matching(&limits)
                    };
                    let Ok(sim) = kind.simulate(&w, &knobs, &cost) else {
                        continue;
                    };
                    let Ok(rep) = replay(&w, &limits, &cost, &sim.schedule) else {
                        continue;
                    };
                    let h = objective.of(&Summary::from_replay(&rep));
                    assert!(
                        bound <= h * (1.0 + 1e-9),
                        "seed {seed} {objective:?}: pooled bound {bound} above {name} (cap {cap:?}) {h}"
                    );
                    best = best.min(h);
                    compared[k] += 1;
                }
            }
            met[k] += usize::from(bound >= best * (1.0 - 1e-9));
        }
    }
    assert!(compared.iter().all(|&c| c >= 150), "{compared:?}");
    // The heuristics seldom reach the least TTFT (none evicts a request right after its
    // first token to make room for the next prompt), hence its lower count.
    assert!(met[0] >= 5 && met[1] >= 5 && met[2] >= 1, "{met:?}");
}

#[test]
fn solve_proves_a_whole_prefill_schedule_optimal_over_chunked_ones_by_the_pooled_search() {
    // Family (a) with a token budget (I = 16, O = 8, C = 64, M = 92), n = 8, no evictions:
    // the MILP proves 61.022 ms optimal with chunks (README); `solve` proves it through
    // the pooled search without building the MILP, and says so; and the mean latency.
    let cost = preset("llama2-7b-a100").unwrap();
    let (w, limits) = family_a_with_a_token_budget(8);
    let no_evict = PolicyConstraints {
        no_evict: true,
        ..PolicyConstraints::default()
    };
    let report = solve(
        &w,
        &limits,
        &cost,
        Objective::Makespan,
        &exact_options(no_evict),
    )
    .unwrap();
    assert_eq!(
        (report.status, report.method, report.bound_method),
        (
            SolveStatus::Optimal,
            SolveMethod::CountingSearch,
            BoundMethod::Exact
        )
    );
    assert!(report.model.is_none(), "no MILP was built");
    assert!(
        report
            .note
            .as_deref()
            .is_some_and(|n| n.contains("pooled search")),
        "{:?}",
        report.note
    );
    assert!(
        (report.replayed_objective - 0.061_022).abs() < 1e-6,
        "{}",
        report.replayed_objective
    );
    assert!(no_evict.admits(&w, &limits, &report.schedule));
    // Mean latency too (each batch weighs by the requests it delays): two groups of four,
    // at 30.511 and 61.022 ms, 45.767 ms on average; proven by the quick pooled pass where
    // it ends in its 2% of the time limit, else by the layered bound after it (exact
    // without evictions).
    let report = solve(
        &w,
        &limits,
        &cost,
        Objective::MeanLatency,
        &exact_options(no_evict),
    )
    .unwrap();
    assert_eq!(
        (report.status, report.bound_method),
        (SolveStatus::Optimal, BoundMethod::Exact)
    );
    assert!(
        report
            .note
            .as_deref()
            .is_some_and(|n| n.contains("pooled search") || n.contains("layered bound")),
        "{:?}",
        report.note
    );
    assert!(
        (report.replayed_objective - 0.045_767).abs() < 1e-6,
        "{}",
        report.replayed_objective
    );
    // Mean TTFT with evictions: two whole prompts per batch at first, each group evicted
    // to make room for the next, is optimal (the pooled optimum, 13.728 ms). No heuristic
    // evicts that way; the pooled search's path, followed request by request, does. (The
    // list search on the first tokens finds it too; without it, the path is what proves.)
    let options = SolveOptions {
        time_limit_s: 10.0,
        list_search_evaluations: 0,
        ..exact_options(PolicyConstraints::default())
    };
    let report = solve(&w, &limits, &cost, Objective::MeanTtft, &options).unwrap();
    assert_eq!(
        (report.status, report.bound_method),
        (SolveStatus::Optimal, BoundMethod::Exact)
    );
    assert!(
        report
            .note
            .as_deref()
            .is_some_and(|n| n.contains("optimal path")),
        "{:?}",
        report.note
    );
    assert!(
        (report.replayed_objective - 0.013_728).abs() < 1e-6,
        "{}",
        report.replayed_objective
    );
    let r = replay(&w, &limits, &cost, &report.schedule).unwrap();
    assert!(r.batches.iter().any(|b| b.evictions > 0));
    let best = report.warm_start.expect("the heuristics ran").objective;
    assert!(best > report.replayed_objective * 1.1, "{best}");
    // With it, the first-token search's schedule is at the optimum and the pooled search
    // proves it.
    let options = SolveOptions {
        time_limit_s: 10.0,
        ..exact_options(PolicyConstraints::default())
    };
    let report = solve(&w, &limits, &cost, Objective::MeanTtft, &options).unwrap();
    assert_eq!(report.status, SolveStatus::Optimal);
    assert!(
        (report.replayed_objective - 0.013_728).abs() < 1e-6,
        "{}",
        report.replayed_objective
    );
    let from = report.warm_start.expect("proven incumbent").heuristic;
    assert!(from.ends_with("on the first tokens"), "{from}");
}

#[test]
fn first_tokens_without_evictions_never_pass_the_exhaustive_optimum() {
    // Tiny instances with M just above the largest request: in the classes without
    // evictions (`--no-evict`, `--reserve`) first tokens wait for completions, and the
    // class's bound on the mean TTFT stays at most the class's exhaustive optimum while
    // rising above the bound of every schedule in many.
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut compared, mut stronger) = (0, 0);
    for seed in 500..560 {
        let (w, limits) = tiny(seed);
        let classes = [
            (
                Class {
                    no_evict: true,
                    ..Class::default()
                },
                PolicyConstraints {
                    no_evict: true,
                    ..PolicyConstraints::default()
                },
            ),
            (
                Class {
                    reserve: true,
                    ..Class::default()
                },
                PolicyConstraints {
                    reserve: true,
                    ..PolicyConstraints::default()
                },
            ),
        ];
        for (class, constraints) in classes {
            let Some((best, _)) = exhaustive::optimum(
                &w,
                &limits,
                &cost,
                exhaustive::Objective::MeanTtft,
                class,
                500_000,
            ) else {
                continue;
            };
            let bound = infersched_solver::bounds::lower_bound_in_class(
                &w,
                &limits,
                &cost,
                Objective::MeanTtft,
                &constraints,
            );
            let free =
                infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::MeanTtft);
            assert!(
                bound.value_s <= best * (1.0 + 1e-9),
                "seed {seed} {constraints:?}: {bound:?} above the class's optimum {best}"
            );
            assert!(bound.value_s >= free.value_s);
            compared += 1;
            stronger += usize::from(bound.value_s > free.value_s * 1.001);
        }
    }
    eprintln!("compared {compared}, stronger {stronger}");
    assert!(compared >= 100 && stronger >= 20, "{compared} {stronger}");
}

/// The mean-latency solve of the arrival tests below: 3 s on one thread, exact options.
fn solve_mean_latency_briefly(
    w: &Workload,
    limits: &Limits,
    cost: &infersched_cost_model::LinearCostModel,
) -> infersched_solver::SolveReport {
    solve(
        w,
        limits,
        cost,
        Objective::MeanLatency,
        &SolveOptions {
            time_limit_s: 3.0,
            threads: 1,
            ..exact_options(PolicyConstraints::default())
        },
    )
    .unwrap()
}

#[test]
fn the_pairwise_interference_bound_never_exceeds_the_optimum_with_arrivals() {
    // Two tiny requests, the second arriving while the first may still run: the
    // combinatorial mean-latency bound (the pairwise-interference argument where it is the
    // strongest) is at most the MILP's proven optimum, and the pairwise argument is the
    // strongest on some of them.
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut proven, mut pairwise) = (0, 0);
    for seed in 500..520 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = 2;
        let mut at = 0.0;
        let w = Workload::new(
            (0..n)
                .map(|k| {
                    if k > 0 {
                        at += rng.random_range(0.0..0.008);
                    }
                    Request {
                        input_tokens: rng.random_range(1..=4),
                        output_tokens: rng.random_range(2..=3),
                        arrival_s: at,
                    }
                })
                .collect(),
        )
        .unwrap();
        let limits = Limits::unlimited();
        let r = solve_mean_latency_briefly(&w, &limits, &cost);
        if r.status != SolveStatus::Optimal {
            continue;
        }
        proven += 1;
        let bound =
            infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::MeanLatency);
        assert!(
            bound.value_s <= r.replayed_objective * (1.0 + 1e-9),
            "seed {seed}: {bound:?} above the optimum {}",
            r.replayed_objective
        );
        pairwise += usize::from(
            bound.argument == infersched_solver::bounds::BoundArgument::PairwiseInterference,
        );
    }
    eprintln!("{proven} proven, the pairwise argument strongest on {pairwise}");
    assert!(proven >= 10, "{proven} of 20 proven");
    assert!(
        pairwise >= 5,
        "pairwise strongest on {pairwise} of {proven}"
    );
}

#[test]
fn the_backlog_bound_never_exceeds_the_milp_schedule_under_congestion() {
    // Two tiny requests at 0 and a third arriving after either could have finished alone,
    // but before the machine can have done both: with the pairwise argument's backlog
    // terms (work the machine cannot have done when the third comes) the combinatorial
    // mean-latency bound stays at most the MILP's schedule (3 s on three tiny requests,
    // most within 0.01% of the solve's own best bound, from its phase relaxation).
    // Tokens cost 100 times the preset's, so that the tiny requests' work,
    // not the batches' biases, fills the time before the third arrives.
    let mut cost = preset("llama2-7b-a100").unwrap();
    cost.theta_s[infersched_core::Feature::Tokens as usize] *= 100.0;
    for seed in 600..608 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut request = |arrival_s: f64| Request {
            input_tokens: rng.random_range(1..=4),
            output_tokens: rng.random_range(2..=3),
            arrival_s,
        };
        let (a, b) = (request(0.0), request(0.0));
        let alone = |r: &Request| {
            let one = Workload::new(vec![Request {
                arrival_s: 0.0,
                ..*r
            }])
            .unwrap();
            infersched_solver::bounds::lower_bound(
                &one,
                &Limits::unlimited(),
                &cost,
                Objective::Makespan,
            )
            .value_s
        };
        let at = alone(&a).max(alone(&b)) * 1.2;
        let w = Workload::new(vec![a, b, request(at)]).unwrap();
        let limits = Limits::unlimited();
        let r = solve_mean_latency_briefly(&w, &limits, &cost);
        let bound =
            infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::MeanLatency);
        assert!(
            bound.value_s <= r.replayed_objective * (1.0 + 1e-9),
            "seed {seed}: {bound:?} above the schedule {}",
            r.replayed_objective
        );
        assert!(r.best_bound <= r.replayed_objective * (1.0 + 1e-9));
    }
}

#[test]
fn a_schedule_that_meets_the_bound_is_proven_optimal_without_an_exact_model() {
    // A request alone (as many of a trace's bursts are): the heuristics serve it at its own
    // minimum time, which the combinatorial bound is, so `solve` proves it at once. Each
    // such proof is checked against the exhaustive optimum on tiny requests.
    let cost = cost_model();
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut proven_by_bound = 0;
    for case in 0..12 {
        let w = Workload::new(vec![Request {
            input_tokens: rng.random_range(1..=4),
            output_tokens: rng.random_range(1..=3),
            arrival_s: rng.random_range(0.0..2.0),
        }])
        .unwrap();
        let limits = Limits {
            token_budget: rng.random_bool(0.5).then(|| rng.random_range(1..=4)),
            ..Limits::unlimited()
        };
        for (objective, searched) in [
            (Objective::Makespan, exhaustive::Objective::Makespan),
            (Objective::MeanLatency, exhaustive::Objective::MeanLatency),
        ] {
            let report = solve(
                &w,
                &limits,
                &cost,
                objective,
                &exact_options(PolicyConstraints::default()),
            )
            .unwrap();
            assert_eq!(report.status, SolveStatus::Optimal, "case {case}");
            // The search is offline: the same request at t = 0.
            let offline = Workload::new(vec![Request {
                arrival_s: 0.0,
                ..w.requests()[0]
            }])
            .unwrap();
            let (best, _) = exhaustive::optimum(
                &offline,
                &limits,
                &cost,
                searched,
                Class::default(),
                100_000,
            )
            .unwrap();
            let best = match objective {
                // The search counts the makespan from the arrival.
                Objective::Makespan => best + w.requests()[0].arrival_s,
                _ => best,
            };
            assert!(
                (report.replayed_objective - best).abs() <= 1e-9 * best.max(1.0),
                "case {case} {objective:?}: {} vs exhaustive {best}",
                report.replayed_objective
            );
            if report.method == SolveMethod::BestHeuristic {
                proven_by_bound += 1;
                assert!(
                    report.best_bound >= report.replayed_objective * (1.0 - 1e-9),
                    "case {case}: {} vs {}",
                    report.best_bound,
                    report.replayed_objective
                );
                assert!(
                    report
                        .note
                        .as_deref()
                        .is_some_and(|n| n.contains("meets the")),
                    "{:?}",
                    report.note
                );
            }
        }
    }
    assert!(proven_by_bound >= 12, "{proven_by_bound}");
    // Real lengths: a Splitwise request's state graph takes hundreds of MB and seconds to
    // build; none is needed.
    let w = Workload::new(vec![Request {
        input_tokens: 2595,
        output_tokens: 186,
        arrival_s: 215.34,
    }])
    .unwrap();
    let limits = Limits {
        token_budget: Some(4096),
        kv_capacity: Some(16_000),
        block_size: 16,
        ..Limits::unlimited()
    };
    let report = solve(
        &w,
        &limits,
        &cost,
        Objective::MeanLatency,
        &exact_options(PolicyConstraints::default()),
    )
    .unwrap();
    assert_eq!(
        (report.status, report.method),
        (SolveStatus::Optimal, SolveMethod::BestHeuristic)
    );
    assert!(report.model.is_none() && report.states_expanded.is_none());
}

#[test]
fn the_pooled_search_bounds_identical_requests_whose_state_graphs_do_not_fit() {
    // Family (a) with a token budget (I = 16, O = 8, C = 64, M = 92), n = 8, no
    // evictions, under a memory limit just below its state graph: no exact model, but the
    // pooled search needs no graph, and its bound beats the combinatorial one.
    let cost = cost_model();
    let (w, limits) = family_a_with_a_token_budget(8);
    let graph = infersched_solver::graph::StateGraph::size(&w.requests()[0], &limits, true, false);
    let options = SolveOptions {
        memory_limit_bytes: graph.bytes() - 1,
        ..exact_options(PolicyConstraints {
            no_evict: true,
            ..PolicyConstraints::default()
        })
    };
    let report = solve(&w, &limits, &cost, Objective::Makespan, &options).unwrap();
    let combinatorial =
        infersched_solver::bounds::lower_bound(&w, &limits, &cost, Objective::Makespan);
    assert!(
        report.best_bound > combinatorial.value_s * (1.0 + 1e-6),
        "{} vs {combinatorial:?}: {:?}",
        report.best_bound,
        report.note
    );
    assert!(
        matches!(
            report.bound_method,
            BoundMethod::Exact
                | BoundMethod::Combinatorial(
                    infersched_solver::bounds::BoundArgument::PooledSearch
                )
        ),
        "{:?}",
        report.bound_method
    );
    assert!(report.model.is_none());
    // The optimum is 61.022 ms (README): the bound is at most it.
    assert!(report.best_bound <= 0.061_023, "{}", report.best_bound);
}

/// `n` identical requests whose best schedules serve them two by two under
/// [`pairs_limits`]: prompts of 4 tokens, 3 outputs.
fn pairs_requests(n: usize) -> Workload {
    Workload::new(vec![
        Request {
            input_tokens: 4,
            output_tokens: 3,
            arrival_s: 0.0,
        };
        n
    ])
    .unwrap()
}

/// C = 8, M = 12: two prompts fit a batch, two requests the memory.
fn pairs_limits() -> Limits {
    Limits {
        token_budget: Some(8),
        kv_capacity: Some(12),
        ..Limits::unlimited()
    }
}

#[test]
fn identical_requests_at_any_scale_are_proven_by_the_cycle_ratio_bound() {
    // 400 identical requests (prompts of 4 tokens, 3 outputs; C = 8, M = 12) without
    // evictions: the best cycle through memory configurations is two prompts in a batch,
    // then two decodes of the two, and the best schedule repeats it 200 times, so the bound
    // proves it: its makespan is 200 times the proven optimum of 2 requests.
    let cost = cost_model();
    let (requests, limits) = (pairs_requests, pairs_limits());
    let options = exact_options(PolicyConstraints {
        no_evict: true,
        ..PolicyConstraints::default()
    });
    let pair = solve(&requests(2), &limits, &cost, Objective::Makespan, &options).unwrap();
    let report = solve(
        &requests(400),
        &limits,
        &cost,
        Objective::Makespan,
        &options,
    )
    .unwrap();
    for r in [&pair, &report] {
        assert_eq!(r.status, SolveStatus::Optimal, "{:?}", r.note);
    }
    assert!(
        report
            .note
            .as_deref()
            .unwrap_or("")
            .contains("cycle-ratio bound"),
        "{:?}",
        report.note
    );
    assert!(
        (report.replayed_objective - 200.0 * pair.replayed_objective).abs() < 1e-9,
        "{} against 200 x {}",
        report.replayed_objective,
        pair.replayed_objective
    );
}

#[test]
fn identical_requests_mean_latency_is_proven_by_the_layered_bound() {
    // 60 identical requests (prompts of 4 tokens, 3 outputs; C = 8, M = 12): the best
    // schedule serves them two by two (two prompts in a batch, then two decodes of the
    // two), so the k-th pair finishes at k times the proven makespan of 2 requests and the
    // mean latency is 15.5 times it. The layered bound (configurations copied per count
    // finished) proves it without evictions, where it is exact, and with them, where it
    // prices evictions against refills.
    let cost = cost_model();
    let (requests, limits) = (pairs_requests, pairs_limits());
    let pair = solve(
        &requests(2),
        &limits,
        &cost,
        Objective::Makespan,
        &exact_options(PolicyConstraints::default()),
    )
    .unwrap();
    assert_eq!(pair.status, SolveStatus::Optimal, "{:?}", pair.note);
    for no_evict in [true, false] {
        let options = exact_options(PolicyConstraints {
            no_evict,
            ..PolicyConstraints::default()
        });
        let report = solve(
            &requests(60),
            &limits,
            &cost,
            Objective::MeanLatency,
            &options,
        )
        .unwrap();
        assert_eq!(report.status, SolveStatus::Optimal, "{:?}", report.note);
        let note = report.note.as_deref().unwrap_or("");
        assert!(note.contains("layered bound"), "{note}");
        assert_eq!(note.contains("evictions priced"), !no_evict, "{note}");
        assert!(
            (report.replayed_objective - 15.5 * pair.replayed_objective).abs() < 1e-9,
            "{} against 15.5 x {}",
            report.replayed_objective,
            pair.replayed_objective
        );
    }
}
