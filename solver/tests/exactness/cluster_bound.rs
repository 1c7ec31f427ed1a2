//! The cluster bound (`bounds::cluster_lower_bound`) against the exhaustive optimum of a
//! cluster: every routing of the requests over two replicas, each replica's part solved
//! exactly by the independent exhaustive search, the best routing kept.

use infersched_core::{Limits, Request, Workload};
use infersched_cost_model::preset;
use infersched_solver::Objective;
use infersched_solver::bounds::{BoundArgument, cluster_lower_bound, lower_bound};
use infersched_test_kit::exhaustive::{self, Class};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `least..=4` offline requests of 1-4 prompt and 1-4 output tokens.
fn tiny_offline(rng: &mut ChaCha8Rng, least: usize) -> Workload {
    let n = rng.random_range(least..=4);
    Workload::new(
        (0..n)
            .map(|_| Request {
                input_tokens: rng.random_range(1..=4),
                output_tokens: rng.random_range(1..=4),
                arrival_s: 0.0,
            })
            .collect(),
    )
    .unwrap()
}

/// The exhaustive optimum of `objective` over every routing to `replicas` replicas (None
/// when a part's search is too large).
fn cluster_optimum(
    w: &Workload,
    limits: &Limits,
    objective: Objective,
    replicas: u32,
) -> Option<f64> {
    let cost = preset("llama2-7b-a100").unwrap();
    let reqs = w.requests();
    let n = reqs.len();
    let target = match objective {
        Objective::Makespan => exhaustive::Objective::Makespan,
        Objective::MeanLatency => exhaustive::Objective::MeanLatency,
        Objective::MeanTtft => exhaustive::Objective::MeanTtft,
    };
    // Each part's optimum once (a part is a set of requests: a bit mask), and routings up
    // to the replicas' order (the first request on replica 0).
    let mut memo: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
    let mut part_optimum = |mask: usize| -> Option<f64> {
        if let Some(&v) = memo.get(&mask) {
            return Some(v);
        }
        let part: Vec<Request> = (0..n)
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| reqs[i])
            .collect();
        let sub = Workload::new(part).unwrap();
        let (v, _) = exhaustive::optimum(&sub, limits, &cost, target, Class::default(), 200_000)?;
        memo.insert(mask, v);
        Some(v)
    };
    let k = replicas as usize;
    let mut best = f64::INFINITY;
    for code in 0..k.pow(n as u32 - 1) {
        let mut masks = vec![0usize; k];
        masks[0] = 1;
        let mut c = code;
        for i in 1..n {
            masks[c % k] |= 1 << i;
            c /= k;
        }
        let (mut total, mut last) = (0.0, 0.0f64);
        for &mask in masks.iter().filter(|m| **m != 0) {
            let v = part_optimum(mask)?;
            total += v * mask.count_ones() as f64;
            last = last.max(v);
        }
        let value = match objective {
            Objective::Makespan => last,
            _ => total / n as f64,
        };
        best = best.min(value);
    }
    Some(best)
}

#[test]
fn the_cluster_bound_is_at_most_the_cluster_optimum() {
    let cost = preset("llama2-7b-a100").unwrap();
    let (mut checked, mut by_machine) = (0, 0);
    for seed in 0..16u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = tiny_offline(&mut rng, 2);
        let need = infersched_test_kit::largest_kv_need(&w);
        let limits = Limits {
            token_budget: rng.random_bool(0.5).then(|| rng.random_range(2..=6)),
            kv_capacity: Some(need + rng.random_range(0..=3)),
            ..Limits::unlimited()
        };
        for objective in [
            Objective::Makespan,
            Objective::MeanLatency,
            Objective::MeanTtft,
        ] {
            let Some(best) = cluster_optimum(&w, &limits, objective, 2) else {
                continue;
            };
            let bound = cluster_lower_bound(&w, &limits, &cost, objective, 2);
            assert!(
                bound.value_s > 0.0 && bound.value_s <= best * (1.0 + 1e-9),
                "seed {seed} {objective:?}: bound {bound:?} above the cluster optimum {best}"
            );
            checked += 1;
            by_machine += usize::from(bound.argument == BoundArgument::FastMachine);
            // One replica's own bounds hold for one replica only: the cluster's is weaker.
            let one = cluster_lower_bound(&w, &limits, &cost, objective, 1);
            assert!(
                one.value_s <= lower_bound(&w, &limits, &cost, objective).value_s * (1.0 + 1e-9)
            );
            assert!(bound.value_s <= one.value_s * (1.0 + 1e-9));
        }
    }
    assert!(checked >= 30, "only {checked} instances solved");
    // The fast machine is the strongest argument on some instances (so a machine that
    // forgot the replicas' count would be caught above where it exceeds the optimum).
    assert!(
        by_machine >= 3,
        "the fast machine was strongest on {by_machine} instances only"
    );
}

#[test]
fn the_cluster_search_lies_between_its_bound_and_what_it_replays() {
    use infersched_solver::SolveOptions;
    use infersched_solver::cluster::{ClusterMethod, solve_cluster};
    let cost = preset("llama2-7b-a100").unwrap();
    let options = SolveOptions {
        time_limit_s: 5.0,
        ..SolveOptions::default()
    };
    // Two requests on two replicas: each alone on its own, at its own minimum time, which
    // the bound meets: proven optimal.
    let r = Request {
        input_tokens: 6,
        output_tokens: 3,
        arrival_s: 0.0,
    };
    let w = Workload::new(vec![r, r]).unwrap();
    let limits = Limits::unlimited();
    let rep = solve_cluster(&w, &limits, &cost, Objective::MeanLatency, 2, &options).unwrap();
    assert_eq!(
        rep.status,
        infersched_solver::SolveStatus::Optimal,
        "{rep:?}"
    );
    assert_eq!(rep.routing.members(), [vec![0], vec![1]]);
    // Every heuristic behind every searched router.
    assert_eq!(
        rep.candidates.len(),
        infersched_schedulers::SCHEDULER_NAMES.len()
            * infersched_solver::cluster::SEARCHED_ROUTERS.len()
    );
    // Tiny random instances: bound <= exhaustive cluster optimum <= the search's schedule.
    for seed in 0..8u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = tiny_offline(&mut rng, 3);
        let limits = Limits {
            kv_capacity: Some(infersched_test_kit::largest_kv_need(&w) + 2),
            ..Limits::unlimited()
        };
        for objective in [Objective::Makespan, Objective::MeanLatency] {
            let Some(best) = cluster_optimum(&w, &limits, objective, 2) else {
                continue;
            };
            let rep = solve_cluster(&w, &limits, &cost, objective, 2, &options).unwrap();
            assert!(
                rep.best_bound <= best * (1.0 + 1e-9),
                "seed {seed}: {rep:?}"
            );
            assert!(
                rep.replayed_objective >= best * (1.0 - 1e-9),
                "seed {seed}: {rep:?}"
            );
            let routed = rep
                .candidates
                .iter()
                .filter_map(|c| c.objective_s)
                .fold(f64::INFINITY, f64::min);
            // Re-solving the replicas' parts never makes it worse than the best routing.
            assert!(rep.replayed_objective <= routed * (1.0 + 1e-9));
            if rep.method == ClusterMethod::Routed {
                assert!((rep.replayed_objective - routed).abs() <= 1e-12 * routed.max(1.0));
            }
        }
    }
}

#[test]
fn the_routing_search_moves_a_short_request_off_a_long_ones_replica() {
    use infersched_solver::SolveOptions;
    use infersched_solver::cluster::{ClusterMethod, solve_cluster};
    let cost = preset("llama2-7b-a100").unwrap();
    // A long request first, then two short ones, all at 0: the routers put the second
    // short request beside the long one (round robin: 0, 1, 0; least-outstanding and
    // vllm-dp: a tie, to replica 0; least-kv: nothing allocated yet, all to 0).
    let r = |i, o| Request {
        input_tokens: i,
        output_tokens: o,
        arrival_s: 0.0,
    };
    let w = Workload::new(vec![r(64, 40), r(2, 2), r(2, 2)]).unwrap();
    let options = SolveOptions {
        time_limit_s: 5.0,
        ..SolveOptions::default()
    };
    let rep = solve_cluster(
        &w,
        &Limits::unlimited(),
        &cost,
        Objective::MeanLatency,
        2,
        &options,
    )
    .unwrap();
    let mut members = rep.routing.members();
    members.sort();
    assert_eq!(members, [vec![0], vec![1, 2]], "{rep:?}");
    let rr = rep
        .candidates
        .iter()
        .find(|c| c.router == "round-robin")
        .unwrap();
    assert!(rep.replayed_objective < rr.objective_s.unwrap());
    assert!(
        rep.method == ClusterMethod::Searched && rep.requests_moved >= 1,
        "{rep:?}"
    );
}
