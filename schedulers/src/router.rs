//! The routers of a cluster: how an arriving request is sent to one replica, by a rule
//! that may read the replicas' state at its arrival ([`Load`]).

use crate::sim::Run;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;

/// How arriving requests are spread over the replicas. Ties go to the lowest index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Router {
    /// Requests in arrival order to replicas 0, 1, ..., N - 1, 0, ... (Vidur's round robin).
    RoundRobin,
    /// To the replica with the fewest requests routed to it and not finished.
    LeastOutstanding,
    /// To the replica with the fewest requests waiting (routed and not yet admitted, or
    /// evicted): Vidur's "least outstanding requests" (LOR), which counts its replica
    /// schedulers' request queues.
    LeastWaiting,
    /// To the replica with the fewest KV blocks allocated.
    LeastKv,
    /// vLLM V1's data-parallel load balancer (`DPLBAsyncMPClient`): the least
    /// `4 x waiting + running`.
    VllmDp,
    /// Two distinct replicas drawn at random; the one with fewer unfinished requests.
    PowerOfTwo {
        /// Seed of the draws.
        seed: u64,
    },
    /// A replica drawn uniformly at random.
    Random {
        /// Seed of the draws.
        seed: u64,
    },
}

/// The names `--router` accepts (`power-of-two` and `random` take `:SEED`, default 0).
pub const ROUTER_NAMES: &[&str] = &[
    "round-robin",
    "least-outstanding",
    "least-waiting",
    "least-kv",
    "vllm-dp",
    "power-of-two[:SEED]",
    "random[:SEED]",
];

impl Router {
    /// The name, with the seed where it has one (`random:7`).
    pub fn name(self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Router::RoundRobin => f.write_str("round-robin"),
            Router::LeastOutstanding => f.write_str("least-outstanding"),
            Router::LeastWaiting => f.write_str("least-waiting"),
            Router::LeastKv => f.write_str("least-kv"),
            Router::VllmDp => f.write_str("vllm-dp"),
            Router::PowerOfTwo { seed } => write!(f, "power-of-two:{seed}"),
            Router::Random { seed } => write!(f, "random:{seed}"),
        }
    }
}

impl std::str::FromStr for Router {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, seed) = match s.split_once(':') {
            Some((n, seed)) => (n, Some(seed)),
            None => (s, None),
        };
        let seeded = || -> Result<u64, String> {
            seed.map_or(Ok(0), |t| {
                t.parse().map_err(|_| {
                    format!("router {name}: seed \"{t}\" is not a non-negative integer")
                })
            })
        };
        let plain = |r: Router| match seed {
            None => Ok(r),
            Some(_) => Err(format!("router {name} takes no seed")),
        };
        match name {
            "round-robin" => plain(Router::RoundRobin),
            "least-outstanding" => plain(Router::LeastOutstanding),
            "least-waiting" => plain(Router::LeastWaiting),
            "least-kv" => plain(Router::LeastKv),
            "vllm-dp" => plain(Router::VllmDp),
            "power-of-two" => Ok(Router::PowerOfTwo { seed: seeded()? }),
            "random" => Ok(Router::Random { seed: seeded()? }),
            _ => Err(format!(
                "unknown router \"{}\": expected one of {}",
                s.chars().take(80).collect::<String>(),
                ROUTER_NAMES.join(", ")
            )),
        }
    }
}

/// One replica as the router sees it at time `t`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    unfinished: usize,
    waiting: usize,
    running: usize,
    kv_blocks: u64,
}

/// A replica of several runs (vLLM v0's virtual engines) as the router sees it: their
/// loads summed.
pub(crate) fn replica_load_at(runs: &[Run<'_>], t: f64) -> Load {
    runs.iter()
        .map(|r| load_at(r, t))
        .fold(Load::default(), |a, l| Load {
            unfinished: a.unfinished + l.unfinished,
            waiting: a.waiting + l.waiting,
            running: a.running + l.running,
            kv_blocks: a.kv_blocks + l.kv_blocks,
        })
}

/// One replica as the router sees it at time `t`.
pub(crate) fn load_at(run: &Run<'_>, t: f64) -> Load {
    // A request freed at a batch's completion after `t` was not yet finished then, and
    // held its KV.
    let (late, late_blocks) = run
        .recent_frees
        .iter()
        .filter(|f| f.at_s > t)
        .fold((0, 0), |(n, b), f| {
            (n + usize::from(f.request), b + f.blocks)
        });
    let sim = &run.sim;
    Load {
        unfinished: sim.requests().len() - run.finished + late,
        waiting: sim.waiting().len() + sim.pending_count(),
        running: sim.running().len() + late,
        kv_blocks: sim.total_blocks() - sim.free_blocks() + late_blocks,
    }
}

impl Router {
    /// A load-based router's score of a replica (the least wins); 0 for the others.
    pub(crate) fn score(self, l: &Load) -> u64 {
        let n = |x: usize| x as u64;
        match self {
            Router::LeastOutstanding => n(l.unfinished),
            Router::LeastWaiting => n(l.waiting),
            Router::LeastKv => l.kv_blocks,
            Router::VllmDp => 4 * n(l.waiting) + n(l.running),
            _ => 0,
        }
    }
}

/// The index of the least `key` (the first of equals).
fn least<K: Ord>(keys: impl Iterator<Item = K>) -> usize {
    keys.enumerate()
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map_or(0, |(i, _)| i)
}

/// A router with its state (the round robin's turn, the draws' generator).
pub(crate) struct RouterState {
    router: Router,
    next: usize,
    rng: ChaCha8Rng,
}

impl RouterState {
    pub(crate) fn new(router: Router) -> Self {
        let seed = match router {
            Router::PowerOfTwo { seed } | Router::Random { seed } => seed,
            _ => 0,
        };
        Self {
            router,
            next: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The replica, of `n`, for a request arriving when replica `r`'s load is `load(r)`.
    pub(crate) fn pick(&mut self, n: usize, load: &dyn Fn(usize) -> Load) -> usize {
        let loads = || (0..n).map(load);
        match self.router {
            Router::RoundRobin => {
                let r = self.next % n;
                self.next += 1;
                r
            }
            Router::LeastOutstanding | Router::LeastWaiting | Router::LeastKv | Router::VllmDp => {
                least(loads().map(|l| self.router.score(&l)))
            }
            Router::Random { .. } => self.rng.random_range(0..n),
            Router::PowerOfTwo { .. } if n == 1 => 0,
            Router::PowerOfTwo { .. } => {
                let a = self.rng.random_range(0..n);
                let b = (a + 1 + self.rng.random_range(0..n - 1)) % n;
                let (a, b) = (a.min(b), a.max(b));
                if load(b).unfinished < load(a).unfinished {
                    b
                } else {
                    a
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routers_parse_and_print_their_names() {
        for s in [
            "round-robin",
            "vllm-dp",
            "least-outstanding",
            "least-waiting",
            "least-kv",
            "random:7",
            "power-of-two:0",
        ] {
            assert_eq!(s.parse::<Router>().unwrap().name(), s);
        }
        assert_eq!("random".parse::<Router>(), Ok(Router::Random { seed: 0 }));
        let e = "round-robin:3".parse::<Router>().unwrap_err();
        assert!(e.contains("takes no seed"), "{e}");
        let e = "random:x".parse::<Router>().unwrap_err();
        assert!(e.contains("seed \"x\""), "{e}");
        let e = "fastest".parse::<Router>().unwrap_err();
        assert!(
            e.contains("unknown router \"fastest\"") && e.contains("least-kv"),
            "{e}"
        );
    }

    #[test]
    fn each_load_based_router_scores_what_it_reads() {
        // Three running and none waiting beats one running and one waiting (3 < 5), where
        // least-outstanding prefers the latter (2 < 3).
        let busy = Load {
            unfinished: 3,
            waiting: 0,
            running: 3,
            kv_blocks: 9,
        };
        let queued = Load {
            unfinished: 2,
            waiting: 1,
            running: 1,
            kv_blocks: 4,
        };
        assert!(Router::VllmDp.score(&busy) < Router::VllmDp.score(&queued));
        assert!(Router::LeastOutstanding.score(&busy) > Router::LeastOutstanding.score(&queued));
        assert!(Router::LeastKv.score(&busy) > Router::LeastKv.score(&queued));
        assert!(Router::LeastWaiting.score(&busy) < Router::LeastWaiting.score(&queued));
    }
}
