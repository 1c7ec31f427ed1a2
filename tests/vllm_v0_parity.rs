//! `vllm` against the real vLLM v0 scheduler: every case recorded from vLLM 0.6.3.post1's
//! own `vllm.core.scheduler.Scheduler` (chunked prefill off, its `SelfAttnBlockSpaceManager`;
//! notebooks-data/fidelity/vllm-0.6.3/, recorded by tools/vllm-parity/vllm_v0_oracle.py) must
//! be reproduced batch by batch by `simulate --scheduler vllm` under the case's limits. A
//! difference fails on the first differing batch and names it.

use infersched::core::{Action, Schedule, replay};
use infersched::cost_model::preset;
use infersched::schedulers::{Knobs, SchedulerKind};
use infersched::workload::read_trace;
use infersched_test_kit::{assert_same_batches, normalized_batch};
use std::path::{Path, PathBuf};

const FIXTURES: &str = "notebooks-data/fidelity/vllm-0.6.3";

/// A case's limits (`config.json`) as the `vllm` policy's knobs.
fn case_knobs(dir: &Path) -> Knobs {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let u = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{dir:?}: {k}"));
    assert_eq!(v["vllm_version"], "0.6.3.post1");
    assert_eq!(v["cost_model"], "llama2-7b-a100");
    assert_eq!(v["vllm"]["enable_chunked_prefill"], false);
    // vLLM v0 has no null block: its pool is M / block blocks.
    assert_eq!(
        v["vllm"]["num_gpu_blocks"].as_u64(),
        Some(u("kv_capacity") / u("block_size"))
    );
    Knobs {
        token_budget: Some(u("token_budget")),
        kv_capacity: Some(u("kv_capacity")),
        max_running: Some(u("max_running")),
        block_size: Some(u("block_size") as u32),
        watermark: Some(v["watermark"].as_f64().unwrap()),
        ..Knobs::default()
    }
}

fn cases() -> Vec<PathBuf> {
    infersched_test_kit::fixture_cases(FIXTURES)
}

fn evictions(s: &Schedule) -> usize {
    s.batches
        .iter()
        .flat_map(|b| &b.entries)
        .filter(|e| e.action == Action::Evict)
        .count()
}

#[test]
fn every_recorded_vllm_0_6_3_schedule_is_reproduced_batch_by_batch() {
    let cost = preset("llama2-7b-a100").unwrap();
    let dirs = cases();
    assert!(
        dirs.len() >= 8,
        "expected the 8 recorded cases, found {}",
        dirs.len()
    );
    let mut evictions_seen = 0;
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let workload = read_trace(&dir.join("workload.csv")).unwrap();
        let path = dir.join("vllm-schedule.csv");
        let recorded =
            Schedule::from_csv_str(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let sim = SchedulerKind::Vllm
            .simulate(&workload, &case_knobs(dir), &cost)
            .unwrap_or_else(|e| panic!("{name}: vllm failed: {e}"));
        let (ours, theirs) = (&sim.schedule.batches, &recorded.batches);
        assert_same_batches(&name, ("vllm", ours), ("vLLM 0.6.3", theirs));
        // vLLM's own schedule is valid under the same limits in infersched's semantics.
        replay(&workload, &sim.limits, &cost, &recorded)
            .unwrap_or_else(|e| panic!("{name}: the replay rejects vLLM's schedule: {e}"));
        evictions_seen += evictions(&recorded);
    }
    // The cases exercise preemption, not only admission.
    assert!(evictions_seen > 100, "{evictions_seen} evictions");
}

#[test]
fn vllm_v0_preempts_the_request_that_finds_no_free_block_even_when_its_own_block_has_room() {
    // Prompts of 31, 31 and 20 tokens, 20 outputs each, M = 8 blocks of 16, no
    // watermark: after the prefills (2 blocks each, 2 free) the first two requests' 33rd
    // tokens take the two free blocks, and the newest, finding no free block before its
    // decode, preempts itself although its own last block has room (22 of 32 slots); it
    // is readmitted and preempts itself again at each such step while the others decode.
    // vLLM 0.6.3 recorded exactly that (`v0-hand-self-preempt`).
    let dir = Path::new(FIXTURES).join("v0-hand-self-preempt");
    let workload = read_trace(&dir.join("workload.csv")).unwrap();
    let cost = preset("llama2-7b-a100").unwrap();
    let sim = SchedulerKind::Vllm
        .simulate(&workload, &case_knobs(&dir), &cost)
        .unwrap();
    let b = |k: usize| normalized_batch(&sim.schedule.batches[k]);
    assert_eq!(b(3), (vec![2], vec![(0, 1, 0), (1, 1, 0)]));
    assert_eq!(b(4), (vec![], vec![(2, 22, 0)]));
    assert_eq!(evictions(&sim.schedule), 13);
}
