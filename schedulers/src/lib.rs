//! Heuristic batch schedulers (vLLM, vLLM-V1, Sarathi-Serve, Orca, static batching) as
//! policies inside one simulation loop, each emitting a `Schedule` that the independent
//! replay validates. Not built yet (tracked as its own issue).
