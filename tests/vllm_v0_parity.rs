//! `vllm` against the real vLLM v0 scheduler: every case recorded from vLLM 0.6.3.post1's
//! own `vllm.core.scheduler.Scheduler` (chunked prefill off, its `SelfAttnBlockSpaceManager`;
//! notebooks-data/fidelity/vllm-0.6.3/, recorded by tools/vllm-parity/vllm_v0_oracle.py) must
//! be reproduced batch by batch by `simulate --scheduler vllm` under the case's limits. A
//! difference fails on the first differing batch and names it.

use infersched::core::{Action, CacheRule, Schedule, replay};
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

const PREFIX_FIXTURES: &str = "notebooks-data/fidelity/vllm-0.6.3-prefix";

/// vLLM v0's automatic prefix caching on windows of the Mooncake traces (recorded by
/// `record_fixtures.py v0-prefix`): `vllm --enable-prefix-caching` must take the same
/// tokens from the cache, batch by batch, and the replay (under vLLM v0's cache rule, which
/// the recorded schedule names) must accept vLLM's schedule and its claimed times.
#[test]
fn every_recorded_vllm_0_6_3_prefix_caching_schedule_is_reproduced() {
    let cost = preset("llama2-7b-a100").unwrap();
    let dirs = infersched_test_kit::fixture_cases(PREFIX_FIXTURES);
    assert!(
        dirs.len() >= 4,
        "expected the 4 recorded cases, found {}",
        dirs.len()
    );
    let (mut hits, mut evicted) = (0u64, 0);
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let workload = read_trace(&dir.join("workload.csv")).unwrap();
        assert!(workload.prefix().is_some(), "{name}: no prompt block ids");
        let recorded = Schedule::read(&dir.join("vllm-schedule.json")).unwrap();
        assert_eq!(recorded.prefix_cache, Some(CacheRule::VllmV0), "{name}");
        let knobs = Knobs {
            prefix_caching: Some(true),
            ..case_knobs(dir)
        };
        let sim = SchedulerKind::Vllm
            .simulate(&workload, &knobs, &cost)
            .unwrap_or_else(|e| panic!("{name}: vllm failed: {e}"));
        assert_eq!(sim.schedule.prefix_cache, Some(CacheRule::VllmV0), "{name}");
        assert_same_batches(
            &name,
            ("vllm", &sim.schedule.batches),
            ("vLLM 0.6.3", &recorded.batches),
        );
        replay(&workload, &sim.limits, &cost, &recorded)
            .unwrap_or_else(|e| panic!("{name}: the replay rejects vLLM's schedule: {e}"));
        let entries = recorded.batches.iter().flat_map(|b| &b.entries);
        hits += entries.map(|e| u64::from(e.cached)).sum::<u64>();
        evicted += evictions(&recorded);
    }
    // The cases take many blocks from the cache and preempt too.
    assert!(hits > 100_000, "{hits} tokens from the cache");
    assert!(evicted > 20, "{evicted} evictions");
}
