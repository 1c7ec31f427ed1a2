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
pub use crate::disaggregation::{Disaggregation, DisaggregationError, KvLink};
use crate::replay::Replay;
use crate::request::{Request, Workload};
use crate::schedule::Schedule;
use crate::{CostModel, Limits};

/// The prefill side's workload: every request asks for one output token (vLLM's proxy
/// sends the prompt to the prefill instance with `max_tokens = 1`) and keeps its KV while
/// it is sent over `link` after that token (`link.transfer_s(I)`).
pub fn prefill_workload(w: &Workload, link: &KvLink) -> Workload {
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
    Workload::new(reqs)
        .and_then(|p| p.with_kv_hold(hold))
        .expect("the requests of a valid workload and a validated link")
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
    link.validate().map_err(ClusterError::KvLink)?;
    let prefill = replay_cluster_on(
        &prefill_workload(workload, link),
        limits,
        (cost, pipeline),
        prefill_routing,
        prefill_schedules,
    )
    .map_err(side("prefill"))?;
    let ready = kv_ready_s(workload, &prefill, link);
    let decode_w = decode_workload(workload, &ready).map_err(ClusterError::DecodeSide)?;
    let decode = replay_cluster_on(
        &decode_w,
        limits,
        (cost, pipeline),
        decode_routing,
        decode_schedules,
    )
    .map_err(side("decode"))?;
    let cluster = joined(workload, &prefill, &decode);
    Ok(DisaggregatedReplay {
        prefill,
        decode,
        kv_ready_s: ready,
        cluster,
    })
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
