//! The solver's exactness tests, one test binary: the MILP, the counting search and the
//! bounds against the independent exhaustive search (`infersched-test-kit`), the
//! heuristics and the replay.

mod chunk_merging;
mod cluster_bound;
mod golden_dispatch;
mod optimum_vs_heuristics;
mod solver_exact;
