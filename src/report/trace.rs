//! Chrome trace export (the JSON object format read by Perfetto and chrome://tracing):
//! batches as complete ("X") slices with their entries as arguments, KV use and running
//! requests as counter ("C") tracks. Times are microseconds.

use crate::compare::Outcome;
use crate::core::{EntryKind, Workload, classify_entries};
use serde_json::{Value, json};

/// The trace of one schedule as a JSON value.
pub fn chrome_trace(w: &Workload, scheduler: &str, o: &Outcome) -> Value {
    let us = |s: f64| s * 1e6;
    let kinds = classify_entries(w, &o.schedule);
    let mut events = vec![
        json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
               "args": {"name": format!("infersched: {scheduler}")}}),
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
               "args": {"name": "GPU batches"}}),
    ];
    for (b, entries) in o.replay.batches.iter().zip(&kinds) {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                let kind = match e.kind {
                    EntryKind::Evict => "evict",
                    EntryKind::Prefill => "prefill",
                    EntryKind::Decode => "decode",
                };
                json!({"request": e.request, "kind": kind, "tokens": e.tokens,
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
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "infersched", "scheduler": scheduler,
                      "kv_capacity": o.replay.limits.kv_capacity},
    })
}
