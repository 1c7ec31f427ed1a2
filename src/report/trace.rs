//! Chrome trace export (the JSON object format read by Perfetto and chrome://tracing):
//! batches as complete ("X") slices with their entries as arguments, KV use and running
//! requests as counter ("C") tracks, and one track per request (the first
//! [`TRACE_MAX_REQUESTS`]) with its phases: waiting, prefill, decode, holding KV outside the
//! batch, evicted. Times are microseconds.

use super::plots::request_phases;
use crate::core::{EntryKind, Replay, Schedule, Workload, classify_entries};
use serde_json::{Value, json};

/// Requests that get a track of their own (the first ids); beyond them the trace keeps the
/// batch and counter tracks only, so traces of long runs stay loadable.
pub const TRACE_MAX_REQUESTS: usize = 1000;

/// The trace of one schedule (`replay` its replay) as a JSON value.
pub fn chrome_trace(w: &Workload, scheduler: &str, schedule: &Schedule, replay: &Replay) -> Value {
    chrome_trace_named(w, scheduler, schedule, replay, &|i| i)
}

/// [`chrome_trace`] of part of a workload (one replica's requests, renumbered `0..`), its
/// requests named by `id_of` (their ids in the whole workload).
pub fn chrome_trace_named(
    w: &Workload,
    scheduler: &str,
    schedule: &Schedule,
    replay: &Replay,
    id_of: &dyn Fn(u32) -> u32,
) -> Value {
    let us = |s: f64| s * 1e6;
    let kinds = classify_entries(w, schedule);
    let mut events = vec![
        json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
               "args": {"name": format!("infersched: {scheduler}")}}),
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
               "args": {"name": "GPU batches"}}),
        json!({"name": "process_name", "ph": "M", "pid": 2, "tid": 0,
               "args": {"name": "requests"}}),
    ];
    for (b, entries) in replay.batches.iter().zip(&kinds) {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                let kind = match e.kind {
                    EntryKind::Evict => "evict",
                    EntryKind::Receive => "receive",
                    EntryKind::Prefill => "prefill",
                    EntryKind::Decode => "decode",
                };
                json!({"request": id_of(e.request), "kind": kind, "tokens": e.tokens,
                       "generates_token": e.generated_token})
            })
            .collect();
        let f = &b.features;
        events.push(json!({
            "name": format!("batch {}", b.index),
            "cat": if f.n_prefill > 0 && f.n_decode > 0 { "mixed" }
                   else if f.n_prefill > 0 { "prefill" }
                   else if f.n_decode > 0 { "decode" } else { "evict" },
            "ph": "X", "pid": 1, "tid": 1,
            "ts": us(b.start_s), "dur": us(b.duration_s()),
            "args": {
                "tokens": f.tokens, "prefills": f.n_prefill, "decodes": f.n_decode,
                "evictions": b.evictions, "kv_tokens_after": b.kv_tokens,
                "running_after": b.running, "entries": list,
            }
        }));
        events.push(
            json!({"name": "KV tokens", "ph": "C", "pid": 1, "ts": us(b.end_s),
                           "args": {"kv_tokens": b.kv_tokens}}),
        );
        events.push(
            json!({"name": "running requests", "ph": "C", "pid": 1, "ts": us(b.end_s),
                           "args": {"running": b.running}}),
        );
    }
    let reqs = w.requests();
    for (i, phases) in request_phases(w, schedule, replay, TRACE_MAX_REQUESTS)
        .iter()
        .enumerate()
    {
        let r = &reqs[i];
        events.push(json!({"name": "thread_name", "ph": "M", "pid": 2, "tid": i,
            "args": {"name": format!("request {} (I = {}, O = {})", id_of(i as u32), r.input_tokens, r.output_tokens)}}));
        events.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": 2, "tid": i,
            "args": {"sort_index": i}}),
        );
        for &(a, b, phase) in phases {
            events.push(json!({"name": phase.name(), "cat": "request", "ph": "X",
                "pid": 2, "tid": i, "ts": us(a), "dur": us(b - a)}));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "infersched", "scheduler": scheduler,
                      "kv_capacity": replay.limits.kv_capacity,
                      "request_tracks": w.len().min(TRACE_MAX_REQUESTS),
                      "requests": w.len()},
    })
}
