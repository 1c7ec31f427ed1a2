//! Describing a workload.

use infersched_core::{Distribution, Workload};
use serde::Serialize;

/// Summary statistics of a workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadStats {
    /// Number of requests.
    pub requests: usize,
    /// Prompt lengths I.
    pub input_tokens: Distribution,
    /// Output lengths O.
    pub output_tokens: Distribution,
    /// Smallest prompt.
    pub min_input_tokens: u32,
    /// Smallest output.
    pub min_output_tokens: u32,
    /// Sum of I.
    pub total_input_tokens: u64,
    /// Sum of O.
    pub total_output_tokens: u64,
    /// Sum of I + O - 1: tokens processed by any schedule without evictions.
    pub total_processed_tokens: u64,
    /// Largest I + O - 1: the smallest KV capacity M that can serve every request.
    pub min_kv_capacity: u64,
    /// First arrival (s).
    pub first_arrival_s: f64,
    /// Last arrival (s).
    pub last_arrival_s: f64,
    /// Requests per second over the arrival span ((n - 1) / span); None if all arrive at once.
    pub mean_qps: Option<f64>,
    /// Where the trace names its prompts' blocks: what a KV cache of unlimited size, shared
    /// by all requests in arrival order, would save.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheStats>,
}

/// What a perfect prefix cache saves on a workload ([`infersched_core::PerfectCache`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefixCacheStats {
    /// Tokens per block of ids.
    pub block_tokens: u32,
    /// Prompt tokens served from the cache.
    pub saved_tokens: u64,
    /// Their share of all prompt tokens.
    pub saved_share: f64,
    /// Requests that reuse at least one block.
    pub requests_hit: usize,
}

impl WorkloadStats {
    /// Computes the statistics of `w`.
    pub fn of(w: &Workload) -> Self {
        let r = w.requests();
        let col = |f: &dyn Fn(&infersched_core::Request) -> f64| {
            Distribution::of(r.iter().map(f).collect()).expect("a workload is never empty")
        };
        let first = r.iter().map(|x| x.arrival_s).fold(f64::INFINITY, f64::min);
        let last = r.iter().map(|x| x.arrival_s).fold(0.0, f64::max);
        Self {
            requests: r.len(),
            input_tokens: col(&|x| f64::from(x.input_tokens)),
            output_tokens: col(&|x| f64::from(x.output_tokens)),
            min_input_tokens: r.iter().map(|x| x.input_tokens).min().unwrap_or(0),
            min_output_tokens: r.iter().map(|x| x.output_tokens).min().unwrap_or(0),
            total_input_tokens: r.iter().map(|x| u64::from(x.input_tokens)).sum(),
            total_output_tokens: r.iter().map(|x| u64::from(x.output_tokens)).sum(),
            total_processed_tokens: r.iter().map(|x| x.max_kv_tokens()).sum(),
            min_kv_capacity: r.iter().map(|x| x.max_kv_tokens()).max().unwrap_or(0),
            first_arrival_s: first,
            last_arrival_s: last,
            mean_qps: (last > first).then(|| (r.len() - 1) as f64 / (last - first)),
            prefix_cache: w.prefix().map(|p| {
                let c = p.perfect_cache(&w.input_lengths(), &w.fcfs_order());
                PrefixCacheStats {
                    block_tokens: p.block_tokens,
                    saved_tokens: c.saved_tokens,
                    saved_share: c.share(),
                    requests_hit: c.requests_hit,
                }
            }),
        }
    }

    /// A few readable lines.
    pub fn to_text(&self) -> String {
        let d = |x: &Distribution| {
            format!(
                "mean {:.1}, p50 {:.0}, p90 {:.0}, p99 {:.0}, max {:.0}",
                x.mean, x.p50, x.p90, x.p99, x.max
            )
        };
        let mut s = format!(
            "requests            {}\nprompt tokens I      {} (min {})\noutput tokens O      {} (min {})\ntotal tokens         {} prompt + {} output; {} processed without evictions\nKV needed (max I+O-1) {} tokens\n",
            self.requests,
            d(&self.input_tokens),
            self.min_input_tokens,
            d(&self.output_tokens),
            self.min_output_tokens,
            self.total_input_tokens,
            self.total_output_tokens,
            self.total_processed_tokens,
            self.min_kv_capacity,
        );
        match self.mean_qps {
            Some(q) => s.push_str(&format!(
                "arrivals             {:.3} s .. {:.3} s, {:.3} requests/s\n",
                self.first_arrival_s, self.last_arrival_s, q
            )),
            None => s.push_str(&format!(
                "arrivals             all at {} s\n",
                self.first_arrival_s
            )),
        }
        if let Some(c) = &self.prefix_cache {
            s.push_str(&format!(
                "prefix cache         a perfect cache (unlimited, shared, blocks of {}) serves {} prompt tokens ({:.1}%); {} requests reuse a block\n",
                c.block_tokens,
                c.saved_tokens,
                100.0 * c.saved_share,
                c.requests_hit
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::Request;

    #[test]
    fn stats_are_hand_checkable() {
        let w = Workload::new(vec![
            Request {
                input_tokens: 4,
                output_tokens: 2,
                arrival_s: 1.0,
            },
            Request {
                input_tokens: 8,
                output_tokens: 6,
                arrival_s: 3.0,
            },
        ])
        .unwrap();
        let s = WorkloadStats::of(&w);
        assert_eq!(s.total_processed_tokens, 5 + 13);
        assert_eq!(s.min_kv_capacity, 13);
        assert_eq!(s.input_tokens.mean, 6.0);
        assert_eq!(s.mean_qps, Some(0.5));
        assert!(s.to_text().contains("KV needed (max I+O-1) 13 tokens"));
    }
}
