//! Disaggregated prefill and decode (`--disaggregate P:D`; semantics.md, "Disaggregated
//! prefill and decode"), as vLLM serves it with a KV connector behind its proxy: every
//! request goes first to one of P *prefill replicas* as a request for one output token;
//! when that token is out, its prompt's KV moves over a link to one of D *decode
//! replicas* (the prefill replica keeps it until sent), where the request arrives (at
//! `first token + transfer time`) with the KV of
//! its `I` prompt tokens, takes `I - 1` of them at admission, computes its last prompt
//! token again (the decode side's first token, the one the client sees) and decodes the
//! rest. Each side is a cluster of its own ([`crate::cluster`]); the replay checks both and
//! derives the decode side's arrivals from the prefill side's replay, never from a
//! producer's claim.

use crate::cluster::{ClusterError, ClusterReplay, Routing, replay_cluster_on};
pub use crate::disaggregation::{Disaggregation, DisaggregationError, KvConnector, KvLink};
use crate::replay::Replay;
use crate::request::{Request, Workload};
use crate::schedule::Schedule;
use crate::{CostModel, Limits};

/// The prefill side's workload: every request asks for one output token (vLLM's proxy
/// sends the prompt to the prefill instance with `max_tokens = 1`) and keeps its KV while
/// it is sent over `link` after that token (`link.transfer_s(I)`). Fails on a link out
/// of range.
pub fn prefill_workload(w: &Workload, link: &KvLink) -> Result<Workload, DisaggregationError> {
    link.validate()?;
    let reqs = w
        .requests()
        .iter()
        .map(|r| Request {
            output_tokens: 1,
            ..*r
        })
        .collect();
    let hold = w
        .requests()
        .iter()
        .map(|r| link.transfer_s(r.input_tokens))
        .collect();
    // A valid workload's requests, and finite holds over a valid link.
    Ok(Workload::new(reqs)
        .and_then(|p| p.with_kv_hold(hold))
        .expect("the requests of a valid workload and a validated link"))
}

/// The decode side's workload: request `i` arrives at `ready_s[i]` with the KV of its
/// whole prompt.
pub fn decode_workload(w: &Workload, ready_s: &[f64]) -> Result<Workload, crate::WorkloadError> {
    let reqs = w
        .requests()
        .iter()
        .zip(ready_s)
        .map(|(r, &t)| Request { arrival_s: t, ..*r })
        .collect();
    Workload::new(reqs)?.with_transferred(w.requests().iter().map(|r| r.input_tokens).collect())
}

/// The decode side's workload where the KV is pulled (vLLM's NixlConnector): request `i`
/// arrives at `first_token_s[i]` with the KV of its whole prompt still on the prefill
/// replica, to be received (a receive entry) and then moved in `link.transfer_s(I)`.
pub fn pulled_decode_workload(
    w: &Workload,
    first_token_s: &[f64],
    link: &KvLink,
) -> Result<Workload, crate::WorkloadError> {
    let transfer = w
        .requests()
        .iter()
        .map(|r| link.transfer_s(r.input_tokens))
        .collect();
    decode_workload(w, first_token_s)?.with_transfer_s(transfer)
}

/// Whether the decode side's schedules pull the KV (a receive entry allocates it, the
/// transfer follows: vLLM's NixlConnector) rather than take it pushed, at the first
/// processing entry (vLLM's P2pNcclConnector).
pub fn pulls(decode_schedules: &[Schedule]) -> bool {
    decode_schedules
        .iter()
        .flat_map(|s| &s.batches)
        .flat_map(|b| &b.entries)
        .any(|e| e.action == crate::schedule::Action::Receive)
}

/// When each request's KV is at its decode replica: its first token on the prefill side
/// plus the transfer of its `I` prompt tokens.
pub fn kv_ready_s(w: &Workload, prefill: &ClusterReplay, link: &KvLink) -> Vec<f64> {
    prefill
        .merged
        .requests
        .iter()
        .zip(w.requests())
        .map(|(rec, r)| rec.first_token_s + link.transfer_s(r.input_tokens))
        .collect()
}

/// A disaggregated cluster's replay.
#[derive(Debug, Clone, PartialEq)]
pub struct DisaggregatedReplay {
    /// The prefill replicas' replay (requests of one output token).
    pub prefill: ClusterReplay,
    /// The decode replicas' replay (requests arriving at `kv_ready_s`).
    pub decode: ClusterReplay,
    /// When each request's KV reached its decode replica.
    pub kv_ready_s: Vec<f64>,
    /// The whole cluster as one: the prefill replicas first, then the decode replicas;
    /// each request's record is its decode side's (first token, token gaps, completion)
    /// measured from its arrival at the cluster, with its first scheduling on the prefill
    /// side and the tokens both sides processed.
    pub cluster: ClusterReplay,
}

/// Replays a disaggregated cluster: the prefill side's schedules (`prefill_schedules[r]`
/// for the requests `prefill_routing` sends to prefill replica `r`, each asking one
/// token), then, with arrivals from that replay and `link`, the decode side's.
#[allow(clippy::too_many_arguments)]
pub fn replay_disaggregated(
    workload: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    link: &KvLink,
    prefill_routing: &Routing,
    prefill_schedules: &[Schedule],
    decode_routing: &Routing,
    decode_schedules: &[Schedule],
) -> Result<DisaggregatedReplay, ClusterError> {
    replay_disaggregated_on(
        workload,
        limits,
        (cost, &crate::pipeline::Pipeline::none(), link),
        (prefill_routing, prefill_schedules),
        (decode_routing, decode_schedules),
    )
}

/// [`replay_disaggregated`] with every replica of both sides a pipeline of
/// `pipeline.stages` stages (`replay_cluster_on`).
pub fn replay_disaggregated_on(
    workload: &Workload,
    limits: &Limits,
    (cost, pipeline, link): (&dyn CostModel, &crate::pipeline::Pipeline, &KvLink),
    (prefill_routing, prefill_schedules): (&Routing, &[Schedule]),
    (decode_routing, decode_schedules): (&Routing, &[Schedule]),
) -> Result<DisaggregatedReplay, ClusterError> {
    let side = |side| {
        move |e| ClusterError::Side {
            side,
            source: Box::new(e),
        }
    };
    let prefill_side = |w: &Workload| {
        replay_cluster_on(
            w,
            limits,
            (cost, pipeline),
            prefill_routing,
            prefill_schedules,
        )
        .map_err(side("prefill"))
    };
    // Each prompt's KV is held at least while it is sent (pushed at its first token).
    let first = prefill_workload(workload, link).map_err(ClusterError::KvLink)?;
    let prefill = prefill_side(&first)?;
    let pull = link.connector == KvConnector::Nixl;
    let decode_w = if pull {
        let first: Vec<f64> = prefill
            .merged
            .requests
            .iter()
            .map(|r| r.first_token_s)
            .collect();
        pulled_decode_workload(workload, &first, link)
    } else {
        decode_workload(workload, &kv_ready_s(workload, &prefill, link))
    }
    .map_err(ClusterError::DecodeSide)?;
    let decode = replay_cluster_on(
        &decode_w,
        limits,
        (cost, pipeline),
        decode_routing,
        decode_schedules,
    )
    .map_err(side("decode"))?;
    let (prefill, ready) = if pull {
        // Pulled: held on the prefill replica until the decode replica has read it.
        let ready = pulled_ready_s(&decode_w, decode_schedules, &decode).map_err(side("decode"))?;
        let hold = ready
            .iter()
            .zip(&prefill.merged.requests)
            .map(|(&r, rec)| hold_until(rec.first_token_s, r))
            .collect();
        let held = first.with_kv_hold(hold).map_err(ClusterError::DecodeSide)?;
        (prefill_side(&held)?, ready)
    } else {
        let ready = kv_ready_s(workload, &prefill, link);
        (prefill, ready)
    };
    let cluster = joined(workload, &prefill, &decode);
    Ok(DisaggregatedReplay {
        prefill,
        decode,
        kv_ready_s: ready,
        cluster,
    })
}

/// The hold after a last token at `end_s` that frees the KV at `ready_s`: the largest
/// `h` with `end_s + h <= ready_s` in floating point (`ready_s - end_s` may round up, and
/// the KV would then be free a step later than the batch that takes it).
fn hold_until(end_s: f64, ready_s: f64) -> f64 {
    let mut h = (ready_s - end_s).max(0.0);
    while h > 0.0 && end_s + h > ready_s {
        h = h.next_down();
    }
    h
}

/// Where the KV is pulled: when each request's KV was at its decode replica, the start of
/// the batch that received it plus its transfer. Every request receives it (once, by the
/// replay's rules) and none takes it pushed, at a processing entry.
fn pulled_ready_s(
    decode_w: &Workload,
    schedules: &[Schedule],
    decode: &ClusterReplay,
) -> Result<Vec<f64>, ClusterError> {
    let mut ready = vec![f64::NAN; decode_w.len()];
    for (r, (s, replay)) in schedules.iter().zip(&decode.replicas).enumerate() {
        let Some(replay) = replay else { continue };
        for (j, b) in s.batches.iter().enumerate() {
            for e in &b.entries {
                let i = e.request as usize;
                let refuse = |reason: &str| ClusterError::Pull {
                    replica: r as u32,
                    batch: j,
                    request: e.request,
                    reason: reason.into(),
                };
                match e.action {
                    crate::schedule::Action::Receive => {
                        ready[i] = replay.batches[j].start_s + decode_w.transfer_s(i);
                    }
                    crate::schedule::Action::Process(_) if e.cached > 0 => {
                        return Err(refuse("takes pushed KV where the others pull theirs"));
                    }
                    _ if ready[i].is_nan() => {
                        return Err(refuse("runs before receiving its KV"));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(ready)
}

/// Both sides as one cluster (see [`DisaggregatedReplay::cluster`]).
fn joined(workload: &Workload, prefill: &ClusterReplay, decode: &ClusterReplay) -> ClusterReplay {
    let mut merged: Replay = decode.merged.clone();
    for ((rec, pre), r) in merged
        .requests
        .iter_mut()
        .zip(&prefill.merged.requests)
        .zip(workload.requests())
    {
        rec.arrival_s = r.arrival_s;
        rec.first_scheduled_s = pre.first_scheduled_s;
        rec.evictions += pre.evictions;
        rec.recomputed_tokens += pre.recomputed_tokens;
        rec.processed_tokens += pre.processed_tokens;
    }
    let replicas: Vec<Option<Replay>> = prefill
        .replicas
        .iter()
        .chain(&decode.replicas)
        .cloned()
        .collect();
    merged.batches = crate::cluster::merge_by_end(&replicas);
    ClusterReplay { replicas, merged }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Batch;

    /// Every batch with tokens lasts 1 s; a batch of receives only, none.
    struct OneSecond;
    impl CostModel for OneSecond {
        fn batch_time_s(&self, f: &crate::BatchFeatures) -> f64 {
            if f.tokens > 0 { 1.0 } else { 0.0 }
        }
    }

    #[test]
    fn pulled_kv_is_held_on_the_prefill_replica_until_the_decode_replica_has_read_it() {
        // Two prompts of 4 tokens (O = 2) at 0, M = 6 in blocks of 1, a link of 0.5 s.
        // Prefill: request 0 in [0, 1]. Its decode replica receives it late, at 2 s (a
        // claimed start), reads it by 2.5 s, so request 1's prompt, which does not fit
        // beside request 0's KV, runs on the prefill replica from 2.5 s, not 1 s.
        let w = Workload::new(vec![
            Request {
                input_tokens: 4,
                output_tokens: 2,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 4,
                output_tokens: 2,
                arrival_s: 0.0,
            },
        ])
        .unwrap();
        let limits = Limits {
            kv_capacity: Some(6),
            block_size: 1,
            ..Limits::unlimited()
        };
        // 4 tokens of 1 byte at 8 bytes/s: 0.5 s each transfer.
        let link = KvLink {
            bytes_per_token: 1.0,
            bandwidth_bytes_per_s: 8.0,
            latency_s: 0.0,
            connector: KvConnector::Nixl,
        };
        let at = |start: f64, entries: Vec<crate::schedule::Entry>| crate::schedule::Batch {
            entries,
            start_s: Some(start),
            end_s: None,
        };
        use crate::schedule::Entry as E;
        let prefill = |second: f64| {
            Schedule::new(vec![
                at(0.0, vec![E::process(0, 4)]),
                at(second, vec![E::process(1, 4)]),
            ])
        };
        let decode = Schedule::new(vec![
            at(2.0, vec![E::receive(0, 3)]),
            Batch::new(vec![E::process(0, 1)]),
            Batch::new(vec![E::process(0, 1)]),
            Batch::new(vec![E::receive(1, 3)]),
            Batch::new(vec![E::process(1, 1)]),
            Batch::new(vec![E::process(1, 1)]),
        ]);
        let one = Routing::new(1, vec![0, 0]).unwrap();
        let run = |p: Schedule, d: Schedule| {
            replay_disaggregated(&w, &limits, &OneSecond, &link, &one, &[p], &one, &[d])
        };
        let r = run(prefill(2.5), decode.clone()).unwrap();
        assert_eq!(r.kv_ready_s, vec![2.5, 5.0]);
        assert_eq!(r.prefill.merged.batches[1].start_s, 2.5);
        let rec = &r.cluster.merged.requests[0];
        assert_eq!((rec.first_token_s, rec.completion_s), (3.5, 4.5));
        // Had it run at 1 s, request 0's KV would still be on the prefill replica.
        let e = run(prefill(1.0), decode.clone()).unwrap_err().to_string();
        assert!(e.contains("the prefill side") && e.contains("M = 6"), "{e}");
        // Pulled KV is received before the request runs, and none is pushed beside it.
        let mut early = decode.clone();
        early.batches[3].entries = vec![E::process(1, 4)];
        early.batches.truncate(5);
        let e = run(prefill(2.5), early).unwrap_err().to_string();
        assert!(e.contains("request 1 runs before receiving its KV"), "{e}");
        let mut mixed = decode;
        mixed.batches[3].entries = vec![E::cached_process(1, 3, 1)];
        mixed.batches.truncate(5);
        let e = run(prefill(2.5), mixed).unwrap_err().to_string();
        assert!(e.contains("takes pushed KV"), "{e}");
    }

    #[test]
    fn the_spec_and_the_link_are_checked() {
        let d: Disaggregation = "1:3".parse().unwrap();
        assert_eq!((d.prefill, d.decode), (1, 3));
        for bad in ["0:2", "2:0", "2", "a:b", "1:2:3", "-1:2"] {
            let e = bad.parse::<Disaggregation>().unwrap_err().to_string();
            assert!(e.contains("expected P:D"), "{bad}: {e}");
        }
        let link = KvLink {
            bytes_per_token: 131_072.0,
            bandwidth_bytes_per_s: 450e9,
            latency_s: 1e-5,
            connector: KvConnector::Nixl,
        };
        link.validate().unwrap();
        // 4,096 tokens of 128 KiB over 450 GB/s: 1.19 ms, plus 10 us.
        assert!((link.transfer_s(4096) - (1e-5 + 4096.0 * 131_072.0 / 450e9)).abs() < 1e-15);
        let zero = KvLink {
            bandwidth_bytes_per_s: 0.0,
            ..link
        };
        assert!(
            zero.validate()
                .unwrap_err()
                .to_string()
                .contains("bandwidth")
        );
    }
}
