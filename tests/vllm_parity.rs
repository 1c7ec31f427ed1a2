//! `vllm-v1` against the real vLLM V1 scheduler: every case recorded from vLLM 0.32.0's own
//! `Scheduler` (notebooks-data/fidelity/vllm-0.32/, recorded by tools/vllm-parity/) must be
//! reproduced batch by batch by `simulate --scheduler vllm-v1` under the case's limits. A
//! difference fails on the first differing batch and names it. The same for the decode
//! side of disaggregated serving (notebooks-data/fidelity/vllm-0.32-pulled/: vLLM's
//! Scheduler pulling each prompt's KV through a connector, as NixlConnector does).

use infersched::core::{Action, Limits, Schedule, replay};
use infersched::cost_model::preset;
use infersched::schedulers::{Knobs, SchedulerKind};
use infersched::workload::read_trace;
use std::path::{Path, PathBuf};

const FIXTURES: &str = "notebooks-data/fidelity/vllm-0.32";
const PULLED: &str = "notebooks-data/fidelity/vllm-0.32-pulled";

/// A case's limits, as `config.json` states them in infersched's words.
struct CaseConfig {
    token_budget: u64,
    kv_capacity: u64,
    max_running: u64,
    block_size: u32,
    watermark: f64,
    reserve_full_isl: bool,
    num_gpu_blocks: u64,
    prefix_caching: bool,
}

fn read_config(dir: &Path) -> CaseConfig {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let u = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{dir:?}: {k}"));
    assert_eq!(v["vllm_version"], "0.32.0");
    assert_eq!(v["cost_model"], "llama2-7b-a100");
    CaseConfig {
        token_budget: u("token_budget"),
        kv_capacity: u("kv_capacity"),
        max_running: u("max_running"),
        block_size: u("block_size") as u32,
        watermark: v["watermark"].as_f64().unwrap(),
        reserve_full_isl: v["reserve_full_isl"].as_bool().unwrap(),
        num_gpu_blocks: v["vllm"]["num_gpu_blocks"].as_u64().unwrap(),
        prefix_caching: v["vllm"]["enable_prefix_caching"].as_bool().unwrap(),
    }
}

/// A case's limits as vllm-v1's knobs, with the whole-prompt check and prefix caching as
/// given.
fn case_knobs(cfg: &CaseConfig, reserve_full_isl: bool, prefix_caching: bool) -> Knobs {
    Knobs {
        token_budget: Some(cfg.token_budget),
        kv_capacity: Some(cfg.kv_capacity),
        max_running: Some(cfg.max_running),
        block_size: Some(cfg.block_size),
        watermark: Some(cfg.watermark),
        reserve_full_isl: Some(reserve_full_isl),
        prefix_caching: Some(prefix_caching),
        ..Knobs::default()
    }
}

fn cases() -> Vec<PathBuf> {
    infersched_test_kit::fixture_cases(FIXTURES)
}

use infersched_test_kit::assert_same_batches;

#[test]
fn every_recorded_vllm_0_32_schedule_is_reproduced_batch_by_batch() {
    let cost = preset("llama2-7b-a100").unwrap();
    let dirs = cases();
    assert!(
        dirs.len() >= 15,
        "expected the 15 recorded cases, found {}",
        dirs.len()
    );
    let (mut evictions_seen, mut cached_seen) = (0, 0u64);
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let cfg = read_config(dir);
        // vLLM's pool holds one null block besides the usable M / block.
        assert_eq!(
            cfg.num_gpu_blocks,
            cfg.kv_capacity / u64::from(cfg.block_size) + 1
        );
        let workload = read_trace(&dir.join("workload.csv")).unwrap();
        let recorded_path = dir.join("vllm-schedule.csv");
        let recorded = Schedule::from_csv_str(
            &std::fs::read_to_string(&recorded_path).unwrap(),
            &recorded_path,
        )
        .unwrap();
        let knobs = case_knobs(&cfg, cfg.reserve_full_isl, cfg.prefix_caching);
        let sim = SchedulerKind::VllmV1
            .simulate(&workload, &knobs, &cost)
            .unwrap_or_else(|e| panic!("{name}: vllm-v1 failed: {e}"));
        let ours = &sim.schedule.batches;
        let theirs = &recorded.batches;
        assert_same_batches(&name, ("vllm-v1", ours), ("vLLM 0.32", theirs));
        // vLLM's own schedule is valid under the same limits in infersched's semantics.
        let limits: Limits = sim.limits;
        replay(&workload, &limits, &cost, &recorded)
            .unwrap_or_else(|e| panic!("{name}: the replay rejects vLLM's schedule: {e}"));
        evictions_seen += theirs
            .iter()
            .flat_map(|b| &b.entries)
            .filter(|e| e.action == Action::Evict)
            .count();
        cached_seen += theirs
            .iter()
            .flat_map(|b| &b.entries)
            .map(|e| u64::from(e.cached))
            .sum::<u64>();
    }
    // The cases exercise preemption, not only admission, and prefix-cache hits.
    assert!(evictions_seen > 0);
    assert!(cached_seen > 0);
}

/// The float column `name` of a case's workload.csv (one the trace reader leaves aside).
fn column(path: &Path, name: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let k = lines
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == name)
        .unwrap_or_else(|| panic!("{path:?}: no {name} column"));
    lines
        .map(|l| l.split(',').nth(k).unwrap().parse().unwrap())
        .collect()
}

/// A pulled case's decode-side workload: each request arrives with its whole prompt's KV
/// on its prefill replica, to be received and then moved in its `transfer_s` seconds.
fn pulled_workload(dir: &Path) -> infersched::core::Workload {
    let path = dir.join("workload.csv");
    let w = read_trace(&path).unwrap();
    let prompts = w.requests().iter().map(|r| r.input_tokens).collect();
    w.with_transferred(prompts)
        .and_then(|w| w.with_transfer_s(column(&path, "transfer_s")))
        .unwrap()
}

/// A pulled case's prefill-side workload: requests of one output token, each keeping its
/// KV `kv_hold_s` seconds after it (until the decode side has read it).
fn held_workload(dir: &Path) -> infersched::core::Workload {
    let path = dir.join("workload.csv");
    let w = read_trace(&path).unwrap();
    assert!(
        w.requests().iter().all(|r| r.output_tokens == 1),
        "{path:?}"
    );
    w.with_kv_hold(column(&path, "kv_hold_s")).unwrap()
}

/// Simulates one side of a pulled case under its limits and requires vLLM's batches; the
/// replay accepts vLLM's schedule. Returns vLLM's schedule.
fn check_side(dir: &Path, workload: &infersched::core::Workload, caching: bool) -> Schedule {
    let name = dir.to_string_lossy().into_owned();
    let cost = preset("llama2-7b-a100").unwrap();
    let cfg = read_config(dir);
    assert_eq!(cfg.prefix_caching, caching, "{name}");
    // The prefill side's schedule has its batches' times (JSON): one that waited for held
    // KV to be read starts after the one before ended.
    let (csv, json) = (
        dir.join("vllm-schedule.csv"),
        dir.join("vllm-schedule.json"),
    );
    let recorded = if json.is_file() {
        Schedule::from_json_str(&std::fs::read_to_string(&json).unwrap(), &json)
    } else {
        Schedule::from_csv_str(&std::fs::read_to_string(&csv).unwrap(), &csv)
    }
    .unwrap();
    let knobs = case_knobs(&cfg, cfg.reserve_full_isl, caching);
    let sim = SchedulerKind::VllmV1
        .simulate(workload, &knobs, &cost)
        .unwrap_or_else(|e| panic!("{name}: vllm-v1 failed: {e}"));
    assert_same_batches(
        &name,
        ("vllm-v1", &sim.schedule.batches),
        ("vLLM 0.32", &recorded.batches),
    );
    replay(workload, &sim.limits, &cost, &recorded)
        .unwrap_or_else(|e| panic!("{name}: the replay rejects vLLM's schedule: {e}"));
    recorded
}

#[test]
fn every_recorded_vllm_0_32_pulled_decode_and_prefill_schedule_is_reproduced() {
    let dirs = infersched_test_kit::fixture_cases(PULLED);
    assert!(
        dirs.len() >= 6,
        "expected the 6 pulled cases, found {}",
        dirs.len()
    );
    let (mut receives, mut evictions, mut held) = (0, 0, 0);
    for dir in &dirs {
        // The decode replica pulls, without a prefix cache; the prefill replica keeps each
        // prompt's KV until read, with vllm-v1's prefix cache on.
        let decode = check_side(dir, &pulled_workload(dir), false);
        let prefill_dir = dir.join("prefill");
        let prefill_workload = held_workload(&prefill_dir);
        let prefill = check_side(&prefill_dir, &prefill_workload, true);
        let actions = |s: &Schedule| -> Vec<Action> {
            s.batches
                .iter()
                .flat_map(|b| &b.entries)
                .map(|e| e.action)
                .collect()
        };
        let (d, p) = (actions(&decode), actions(&prefill));
        receives += d.iter().filter(|a| **a == Action::Receive).count();
        evictions += d.iter().chain(&p).filter(|a| **a == Action::Evict).count();
        held += (0..prefill_workload.len())
            .filter(|&i| prefill_workload.kv_hold_s(i) > 0.0)
            .count();
    }
    // Every request is received once and held until then; some are preempted.
    assert!(
        receives >= 500 && held == receives,
        "{receives} receives, {held} held"
    );
    assert!(evictions > 0);
}

#[test]
fn without_prefix_caching_vllm_v1_differs_where_vllm_0_32_hits_the_cache() {
    // A Mooncake window recorded with caching on: switching it off must change the
    // schedule (shared prompt blocks are computed again).
    let cost = preset("llama2-7b-a100").unwrap();
    let dir = Path::new(FIXTURES).join("mooncake-syn100-c2048-m24576");
    let cfg = read_config(&dir);
    assert!(cfg.prefix_caching);
    let workload = read_trace(&dir.join("workload.csv")).unwrap();
    let knobs = |on| case_knobs(&cfg, cfg.reserve_full_isl, on);
    let run = |on| {
        SchedulerKind::VllmV1
            .simulate(&workload, &knobs(on), &cost)
            .unwrap()
            .schedule
    };
    let (on, off) = (run(true), run(false));
    assert!(on.has_cache_hits() && !off.has_cache_hits());
    let processed = |s: &Schedule| replay(&workload, &knobs_limits(&cfg), &cost, s).unwrap();
    let (a, b) = (processed(&on), processed(&off));
    let tokens = |r: &infersched::core::Replay| -> u64 {
        r.requests.iter().map(|q| q.processed_tokens).sum()
    };
    assert!(tokens(&a) < tokens(&b));
}

/// The limits a case's config names (for replaying outside a simulation).
fn knobs_limits(cfg: &CaseConfig) -> Limits {
    Limits {
        token_budget: Some(cfg.token_budget),
        prefill_budget: None,
        kv_capacity: Some(cfg.kv_capacity),
        max_running: Some(cfg.max_running),
        block_size: cfg.block_size,
        watermark: cfg.watermark,
    }
}

#[test]
fn without_the_full_prompt_check_vllm_v1_differs_where_vllm_0_32_holds_a_prompt_back() {
    // The rule is what makes the recorded memory-bound case match: switching it off must
    // change the schedule of a case recorded with it on.
    let cost = preset("llama2-7b-a100").unwrap();
    let dir = Path::new(FIXTURES).join("arxiv200-c512-m8000");
    let cfg = read_config(&dir);
    assert!(cfg.reserve_full_isl);
    let workload = read_trace(&dir.join("workload.csv")).unwrap();
    let knobs = |isl| case_knobs(&cfg, isl, false);
    let evictions = |s: &Schedule| {
        s.batches
            .iter()
            .flat_map(|b| &b.entries)
            .filter(|e| e.action == Action::Evict)
            .count()
    };
    let on = SchedulerKind::VllmV1
        .simulate(&workload, &knobs(true), &cost)
        .unwrap();
    let off = SchedulerKind::VllmV1
        .simulate(&workload, &knobs(false), &cost)
        .unwrap();
    // Admitting prompts that do not fit whole makes the engine thrash.
    assert!(
        evictions(&off.schedule) > 2 * evictions(&on.schedule),
        "{} evictions without the rule, {} with it",
        evictions(&off.schedule),
        evictions(&on.schedule)
    );
}
