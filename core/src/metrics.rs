//! Per-schedule metrics computed from a [`Replay`] (`semantics.md`, "Metrics").
//!
//! Percentiles use linear interpolation between closest ranks (numpy's default), so
//! they match what pandas/numpy compute from `requests.csv`.

use crate::replay::Replay;
use serde::Serialize;

/// Summary statistics of one metric over requests (or token gaps).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

pub use crate::quantile::quantile_sorted;

impl Distribution {
    /// Statistics of `values`; None when empty.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        Some(Self {
            mean,
            p50: quantile_sorted(&values, 0.50),
            p90: quantile_sorted(&values, 0.90),
            p99: quantile_sorted(&values, 0.99),
            max: values[values.len() - 1],
        })
    }
}

/// The objective values of `semantics.md` ("Objectives").
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Objectives {
    /// `makespan`: end of the last batch.
    pub makespan_s: f64,
    /// `mean-latency`: mean E2E.
    pub mean_latency_s: f64,
    /// `mean-ttft`: mean TTFT.
    pub mean_ttft_s: f64,
    /// `throughput`: output tokens / makespan (None if the makespan is 0).
    pub throughput_tok_s: Option<f64>,
}

impl Objectives {
    /// The objective values of a replay alone, without the rest of [`Summary`] (no
    /// time-between-tokens distribution, whose sort dominates on long outputs): the same
    /// numbers, bit for bit, as `Summary::from_replay(replay).objectives`.
    pub fn from_replay(replay: &Replay) -> Self {
        let reqs = &replay.requests;
        let mean = |f: &dyn Fn(&crate::replay::RequestRecord) -> f64| {
            Distribution::of(reqs.iter().map(f).collect()).map_or(0.0, |d| d.mean)
        };
        let makespan_s = replay.makespan_s();
        let output_tokens: u64 = reqs.iter().map(|r| u64::from(r.output_tokens)).sum();
        Self {
            makespan_s,
            mean_latency_s: mean(&|r| r.e2e_s()),
            mean_ttft_s: mean(&|r| r.ttft_s()),
            throughput_tok_s: (makespan_s > 0.0).then(|| output_tokens as f64 / makespan_s),
        }
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Everything `summary.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Number of requests.
    pub requests: usize,
    /// Number of batches in the schedule (empty ones included).
    pub batches: usize,
    /// Batches that process at least one token.
    pub busy_batches: usize,
    /// End of the last batch (s).
    pub makespan_s: f64,
    /// Mean end-to-end latency (s).
    pub mean_e2e_s: f64,
    /// Mean time to first token (s).
    pub mean_ttft_s: f64,
    /// Mean time per output token after the first (s); None when every O = 1.
    pub mean_tpot_s: Option<f64>,
    /// 99th percentile of the gaps between consecutive tokens (s); None when every O = 1.
    pub p99_tbt_s: Option<f64>,
    /// Output tokens per second of makespan; None if the makespan is 0.
    pub throughput_tok_s: Option<f64>,
    /// Requests per second of makespan; None if the makespan is 0.
    pub requests_per_s: Option<f64>,
    /// Sum of I.
    pub prompt_tokens: u64,
    /// Sum of O.
    pub output_tokens: u64,
    /// All tokens processed (prefill, decode and recompute).
    pub processed_tokens: u64,
    /// Evictions.
    pub evictions: u64,
    /// Tokens processed again after evictions.
    pub recomputed_tokens: u64,
    /// Tokens taken from the prefix cache instead of being processed (absent from
    /// `summary.json` when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// Mean processing entries per busy batch.
    pub mean_batch_size: f64,
    /// Mean tokens per busy batch.
    pub mean_batch_tokens: f64,
    /// Largest KV occupied after any batch (tokens, block-rounded).
    pub peak_kv_tokens: u64,
    /// M, if limited.
    pub kv_capacity: Option<u64>,
    /// peak_kv_tokens / M.
    pub peak_kv_utilization: Option<f64>,
    /// Mean over busy batches of KV occupied / M.
    pub mean_kv_utilization: Option<f64>,
    /// Time the GPU runs batches (s).
    pub busy_s: f64,
    /// Time the GPU waits for arrivals (s).
    pub idle_s: f64,
    /// TTFT distribution (s).
    pub ttft_s: Distribution,
    /// TPOT distribution over requests with O > 1 (s).
    pub tpot_s: Option<Distribution>,
    /// E2E distribution (s).
    pub e2e_s: Distribution,
    /// Time-between-tokens distribution over all gaps (s).
    pub tbt_s: Option<Distribution>,
    /// E2E / O distribution (s).
    pub normalized_latency_s: Distribution,
    /// Queueing delay distribution (s).
    pub queueing_delay_s: Distribution,
    /// The objective values.
    pub objectives: Objectives,
    /// What the schedule attains of the SLOs asked for (`--slo`); None when none were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<crate::slo::SloReport>,
    /// A cluster's replicas and the load on each (`--replicas`); None for one replica.
    /// The times above are then the cluster's: `busy_s` and `idle_s` summed over the
    /// replicas, the KV figures those of the fullest replica's batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::ClusterLoad>,
    /// The pipeline of each replica (`--pp`), when it has more than one stage. Batches
    /// then overlap: `busy_s` is the time some batch is in flight ([`in_flight_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<crate::pipeline::Pipeline>,
}

/// The time some batch of one replica's `batches` (in order, as a pipeline runs them,
/// overlapping) is in flight: the length of the union of their spans.
pub fn in_flight_s(batches: &[crate::replay::BatchRecord]) -> f64 {
    let mut spans = batches.iter().filter(|b| b.features.tokens > 0);
    let Some(first) = spans.next() else {
        return 0.0;
    };
    let (mut total, mut from, mut to) = (0.0, first.start_s, first.end_s);
    for b in spans {
        if b.start_s > to {
            total += to - from;
            from = b.start_s;
        }
        to = to.max(b.end_s);
    }
    total + (to - from)
}

impl Summary {
    /// Computes every metric from a replay.
    pub fn from_replay(replay: &Replay) -> Self {
        let reqs = &replay.requests;
        let n = reqs.len();
        let collect = |f: &dyn Fn(&crate::replay::RequestRecord) -> f64| -> Vec<f64> {
            reqs.iter().map(f).collect()
        };
        let nonempty = |v: Vec<f64>| Distribution::of(v).expect("a workload is never empty");
        let ttft = nonempty(collect(&|r| r.ttft_s()));
        let e2e = nonempty(collect(&|r| r.e2e_s()));
        let tpot = Distribution::of(reqs.iter().filter_map(|r| r.tpot_s()).collect());
        let tbt = Distribution::of(replay.tbt_gaps_s.clone());
        let makespan_s = replay.makespan_s();
        let output_tokens: u64 = reqs.iter().map(|r| u64::from(r.output_tokens)).sum();
        let per_second = |x: f64| (makespan_s > 0.0).then(|| x / makespan_s);
        let busy: Vec<_> = replay
            .batches
            .iter()
            .filter(|b| b.features.tokens > 0)
            .collect();
        let busy_s: f64 = busy.iter().map(|b| b.duration_s()).sum();
        let per_busy = |x: u64| {
            if busy.is_empty() {
                0.0
            } else {
                x as f64 / busy.len() as f64
            }
        };
        let peak_kv_tokens = replay
            .batches
            .iter()
            .map(|b| b.kv_tokens)
            .max()
            .unwrap_or(0);
        let capacity = replay.limits.kv_capacity;
        let throughput = per_second(output_tokens as f64);
        Self {
            requests: n,
            batches: replay.batches.len(),
            busy_batches: busy.len(),
            makespan_s,
            mean_e2e_s: e2e.mean,
            mean_ttft_s: ttft.mean,
            mean_tpot_s: tpot.map(|d| d.mean),
            p99_tbt_s: tbt.map(|d| d.p99),
            throughput_tok_s: throughput,
            requests_per_s: per_second(n as f64),
            prompt_tokens: reqs.iter().map(|r| u64::from(r.input_tokens)).sum(),
            output_tokens,
            processed_tokens: reqs.iter().map(|r| r.processed_tokens).sum(),
            evictions: reqs.iter().map(|r| u64::from(r.evictions)).sum(),
            recomputed_tokens: reqs.iter().map(|r| r.recomputed_tokens).sum(),
            cached_tokens: reqs.iter().map(|r| r.cached_tokens).sum(),
            mean_batch_size: per_busy(busy.iter().map(|b| b.processing_entries()).sum()),
            mean_batch_tokens: per_busy(busy.iter().map(|b| b.features.tokens).sum()),
            peak_kv_tokens,
            kv_capacity: capacity,
            peak_kv_utilization: capacity.map(|m| peak_kv_tokens as f64 / m as f64),
            mean_kv_utilization: capacity.filter(|_| !busy.is_empty()).map(|m| {
                busy.iter()
                    .map(|b| b.kv_tokens as f64 / m as f64)
                    .sum::<f64>()
                    / busy.len() as f64
            }),
            busy_s,
            idle_s: (makespan_s - busy_s).max(0.0),
            ttft_s: ttft,
            tpot_s: tpot,
            e2e_s: e2e,
            tbt_s: tbt,
            normalized_latency_s: nonempty(collect(&|r| r.normalized_latency_s())),
            queueing_delay_s: nonempty(collect(&|r| r.queueing_delay_s())),
            objectives: Objectives {
                makespan_s,
                mean_latency_s: e2e.mean,
                mean_ttft_s: ttft.mean,
                throughput_tok_s: throughput,
            },
            slo: None,
            cluster: None,
            pipeline: None,
        }
    }

    /// This summary of one replica's replay (`batches` its batches) on `pipeline`: with
    /// several stages it names the pipeline, and its busy time is the time some batch is
    /// in flight ([`in_flight_s`]).
    pub fn on_pipeline(
        mut self,
        pipeline: &crate::pipeline::Pipeline,
        batches: &[crate::replay::BatchRecord],
    ) -> Self {
        if pipeline.is_pipelined() {
            self.pipeline = Some(*pipeline);
            self.busy_s = in_flight_s(batches);
            self.idle_s = (self.makespan_s - self.busy_s).max(0.0);
        }
        self
    }

    /// [`Self::of_cluster`] for replicas of `pipeline.stages` stages: busy times (the
    /// cluster's and each replica's) are the time some batch is in flight.
    pub fn of_cluster_on(
        cluster: &crate::cluster::ClusterReplay,
        router: &str,
        pipeline: &crate::pipeline::Pipeline,
    ) -> Self {
        Self::of_cluster(cluster, router).on_pipelined_replicas(cluster, pipeline)
    }

    /// This cluster summary of `cluster` with its replicas pipelines: busy times (the
    /// cluster's and each replica's) the time some batch is in flight.
    fn on_pipelined_replicas(
        mut self,
        cluster: &crate::cluster::ClusterReplay,
        pipeline: &crate::pipeline::Pipeline,
    ) -> Self {
        if !pipeline.is_pipelined() {
            return self;
        }
        self.pipeline = Some(*pipeline);
        let busy: Vec<f64> = cluster
            .replicas
            .iter()
            .map(|r| r.as_ref().map_or(0.0, |r| in_flight_s(&r.batches)))
            .collect();
        if let Some(load) = &mut self.cluster {
            for (l, b) in load.per_replica.iter_mut().zip(&busy) {
                l.busy_s = *b;
            }
        }
        self.busy_s = busy.iter().sum();
        let replicas = cluster.replicas.len() as f64;
        self.idle_s = (replicas * self.makespan_s - self.busy_s).max(0.0);
        self
    }

    /// The summary of a cluster's replay: the merged replay's, with the idle time summed
    /// over the replicas and the load on each.
    pub fn of_cluster(cluster: &crate::cluster::ClusterReplay, router: &str) -> Self {
        let mut s = Self::from_replay(&cluster.merged);
        let replicas = cluster.replicas.len() as f64;
        s.idle_s = (replicas * s.makespan_s - s.busy_s).max(0.0);
        s.cluster = Some(crate::cluster::ClusterLoad::of(cluster, router));
        s
    }

    /// The summary of a disaggregated cluster's replay: the whole cluster's
    /// ([`crate::disaggregated::DisaggregatedReplay::cluster`]), its first
    /// `prefill_replicas` replicas marked as the prefill side, with the KV link.
    pub fn of_disaggregated(
        d: &crate::disaggregated::DisaggregatedReplay,
        router: &str,
        link: &crate::disaggregated::KvLink,
    ) -> Self {
        let mut s = Self::of_cluster(&d.cluster, router);
        if let Some(c) = &mut s.cluster {
            c.prefill_replicas = Some(d.prefill.replicas.len() as u32);
            c.kv_link = Some(*link);
        }
        s
    }

    /// [`Self::of_disaggregated`] with every replica a pipeline of `pipeline.stages` stages.
    pub fn of_disaggregated_on(
        d: &crate::disaggregated::DisaggregatedReplay,
        router: &str,
        link: &crate::disaggregated::KvLink,
        pipeline: &crate::pipeline::Pipeline,
    ) -> Self {
        Self::of_disaggregated(d, router, link).on_pipelined_replicas(&d.cluster, pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_alone_equal_the_summarys_bit_for_bit() {
        use crate::{Batch, Entry, Limits, Request, Schedule, Workload};
        struct Cost;
        impl crate::CostModel for Cost {
            fn batch_time_s(&self, f: &crate::BatchFeatures) -> f64 {
                0.001 + 0.0003 * f.tokens as f64 + 1e-7 * f.decode_kv as f64
            }
        }
        let w = Workload::new(vec![
            Request {
                input_tokens: 3,
                output_tokens: 3,
                arrival_s: 0.0,
            },
            Request {
                input_tokens: 2,
                output_tokens: 2,
                arrival_s: 0.0007,
            },
        ])
        .unwrap();
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 3)]),
            Batch::new(vec![Entry::process(0, 1), Entry::process(1, 2)]),
            Batch::new(vec![Entry::process(0, 1), Entry::process(1, 1)]),
        ]);
        let r = crate::replay(&w, &Limits::unlimited(), &Cost, &s).unwrap();
        let alone = Objectives::from_replay(&r);
        assert_eq!(alone, Summary::from_replay(&r).objectives);
        assert!(alone.mean_latency_s > 0.0 && alone.mean_ttft_s < alone.mean_latency_s);
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.5), 2.5);
        assert!((quantile_sorted(&v, 0.9) - 3.7).abs() < 1e-12);
        assert_eq!(quantile_sorted(&v, 1.0), 4.0);
        assert_eq!(quantile_sorted(&[7.0], 0.99), 7.0);
        let d = Distribution::of(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!((d.mean, d.p50, d.max), (2.0, 2.0, 3.0));
        assert!(Distribution::of(vec![]).is_none());
    }
}
