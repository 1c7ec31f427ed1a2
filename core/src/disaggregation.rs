//! The settings of a disaggregated cluster (semantics.md, "Disaggregated prefill and
//! decode"): how many replicas run prefills and decodes ([`Disaggregation`], `P:D`) and the
//! link their KV moves over ([`KvLink`]). The replay of such a cluster is
//! [`crate::disaggregated`]'s; these live apart so that a cluster's summary can name them.

use serde::Serialize;
use thiserror::Error;

/// The link KV moves over, from a prefill replica to a decode replica.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvLink {
    /// KV bytes per token that each GPU of a replica sends (its tensor-parallel shard; the
    /// GPUs send in parallel, each over its own link).
    pub bytes_per_token: f64,
    /// Bytes per second per GPU, one direction.
    pub bandwidth_bytes_per_s: f64,
    /// Fixed time per transfer (s).
    pub latency_s: f64,
}

/// Why a disaggregated cluster's settings are not valid.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum DisaggregationError {
    /// `P:D` is not two positive integers.
    #[error(
        "--disaggregate \"{0}\": expected P:D, the prefill and decode replicas, each at least 1 (e.g. 1:3)"
    )]
    Spec(String),
    /// A link figure is out of range.
    #[error("the KV link's {field} must be {expected}, got {value}")]
    Link {
        /// Which figure.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        value: f64,
    },
}

impl KvLink {
    /// Checks the figures: bytes and bandwidth positive and finite, latency finite and
    /// non-negative.
    pub fn validate(&self) -> Result<(), DisaggregationError> {
        let positive = |field, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(DisaggregationError::Link {
                    field,
                    expected: "positive and finite",
                    value,
                })
            }
        };
        positive("bytes per token", self.bytes_per_token)?;
        positive("bandwidth", self.bandwidth_bytes_per_s)?;
        if !(self.latency_s.is_finite() && self.latency_s >= 0.0) {
            return Err(DisaggregationError::Link {
                field: "latency",
                expected: "finite and non-negative",
                value: self.latency_s,
            });
        }
        Ok(())
    }

    /// Seconds to move the KV of `tokens` tokens.
    pub fn transfer_s(&self, tokens: u32) -> f64 {
        self.latency_s + f64::from(tokens) * self.bytes_per_token / self.bandwidth_bytes_per_s
    }
}

/// How many replicas run prefills and how many decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Disaggregation {
    /// Prefill replicas (P).
    pub prefill: u32,
    /// Decode replicas (D).
    pub decode: u32,
}

impl std::fmt::Display for Disaggregation {
    /// `P:D`, as parsed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.prefill, self.decode)
    }
}

impl std::str::FromStr for Disaggregation {
    type Err = DisaggregationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DisaggregationError::Spec(s.chars().take(40).collect());
        let (p, d) = s.split_once(':').ok_or_else(bad)?;
        let count = |t: &str| {
            t.trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| (1..=crate::limits::MAX_REPLICAS).contains(&n))
                .ok_or_else(bad)
        };
        Ok(Self {
            prefill: count(p)?,
            decode: count(d)?,
        })
    }
}
