//! The settings of a disaggregated cluster (semantics.md, "Disaggregated prefill and
//! decode"): how many replicas run prefills and decodes ([`Disaggregation`], `P:D`) and the
//! link their KV moves over ([`KvLink`]). The replay of such a cluster is
//! [`crate::disaggregated`]'s; these live apart so that a cluster's summary can name them.

use serde::Serialize;
use thiserror::Error;

/// How a prompt's KV gets from its prefill replica to its decode replica (vLLM's KV
/// connectors; semantics.md, "Disaggregated prefill and decode").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KvConnector {
    /// Pulled (vLLM's NixlConnector): the decode replica's scheduler admits the request,
    /// allocating its blocks (a receive entry), then reads the KV; the prefill replica
    /// keeps it until then.
    #[default]
    Nixl,
    /// Pushed (vLLM's P2pNcclConnector, in vLLM from 0.9.2 until June 2026, not in 0.32):
    /// the prefill replica sends the KV as soon as the first token is out, keeping it until
    /// sent, into the decode instance's own buffer; the decode replica takes it at
    /// admission.
    P2pNccl,
}

/// The names `--kv-connector` accepts.
pub const KV_CONNECTOR_NAMES: &[&str] = &["nixl", "p2p-nccl"];

impl KvConnector {
    /// The name, as parsed.
    pub fn name(self) -> &'static str {
        match self {
            KvConnector::Nixl => "nixl",
            KvConnector::P2pNccl => "p2p-nccl",
        }
    }
}

impl std::fmt::Display for KvConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvConnector {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nixl" => Ok(KvConnector::Nixl),
            "p2p-nccl" => Ok(KvConnector::P2pNccl),
            _ => Err(format!(
                "unknown KV connector \"{}\": expected one of {}",
                s.chars().take(40).collect::<String>(),
                KV_CONNECTOR_NAMES.join(", ")
            )),
        }
    }
}

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
    /// How the KV is moved: pulled by the decode replica, or pushed by the prefill one.
    pub connector: KvConnector,
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
