//! Per-batch limits: C (token budget), P (prefill budget), M (KV capacity), R_max.

use crate::request::Workload;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The most replicas a cluster may have.
pub const MAX_REPLICAS: u32 = 4096;

/// The constraints every batch obeys (`semantics.md`, "Batch limits").
///
/// `None` means unlimited. The watermark is an admission knob of the heuristic
/// schedulers (keep that fraction of M free when admitting); it is carried here so
/// every tool sees one set of limits, but replay enforces only the hard capacity M.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// C: tokens processed per batch.
    pub token_budget: Option<u64>,
    /// P: prefill tokens per batch (P <= C; unset means P = C).
    pub prefill_budget: Option<u64>,
    /// M: KV capacity in tokens.
    pub kv_capacity: Option<u64>,
    /// R_max: requests holding KV after a batch.
    pub max_running: Option<u64>,
    /// KV block size b >= 1: a request holding m tokens occupies `b * ceil(m / b)`.
    pub block_size: u32,
    /// Fraction of M kept free at admission by watermark-aware schedulers, in [0, 1).
    pub watermark: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self::unlimited()
    }
}

/// Why a set of limits is not valid.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A limit is zero or otherwise out of range.
    #[error("invalid limit {field}: {reason}")]
    Invalid {
        /// Limit name (CLI flag spelling).
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// Why no schedule at all can serve a workload under given limits.
#[derive(Debug, Error, PartialEq)]
pub enum Infeasibility {
    /// A request needs more KV than M to generate its last token.
    #[error(
        "request {request} needs {needed} KV tokens (I + O - 1 = {max_kv}, in blocks of {block_size}) to generate its last token, but the KV capacity M is {capacity}"
    )]
    KvTooSmall {
        /// Request id.
        request: usize,
        /// I + O - 1.
        max_kv: u64,
        /// max_kv rounded up to whole blocks.
        needed: u64,
        /// Block size.
        block_size: u32,
        /// M.
        capacity: u64,
    },
}

/// `C = 4074, P = 4074, M = 16384, R_max = 256, block 16, watermark 0.01` (P is the
/// effective prefill budget; an absent limit is `unlimited`).
impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lim = |v: Option<u64>| v.map_or("unlimited".to_string(), |x| x.to_string());
        write!(
            f,
            "C = {}, P = {}, M = {}, R_max = {}, block {}, watermark {}",
            lim(self.token_budget),
            lim(self.effective_prefill_budget()),
            lim(self.kv_capacity),
            lim(self.max_running),
            self.block_size,
            self.watermark
        )
    }
}

impl Limits {
    /// No limits at all, block size 1, no watermark.
    pub const fn unlimited() -> Self {
        Self {
            token_budget: None,
            prefill_budget: None,
            kv_capacity: None,
            max_running: None,
            block_size: 1,
            watermark: 0.0,
        }
    }

    /// Checks ranges: every set limit >= 1, P <= C, block size >= 1, watermark in [0, 1).
    pub fn validate(&self) -> Result<(), LimitsError> {
        let positive = |field: &'static str, v: Option<u64>| match v {
            Some(0) => Err(LimitsError::Invalid {
                field,
                reason: "must be >= 1".into(),
            }),
            _ => Ok(()),
        };
        positive("token-budget", self.token_budget)?;
        positive("prefill-budget", self.prefill_budget)?;
        positive("kv-capacity", self.kv_capacity)?;
        positive("max-running", self.max_running)?;
        if self.block_size == 0 {
            return Err(LimitsError::Invalid {
                field: "block-size",
                reason: "must be >= 1".into(),
            });
        }
        if let (Some(p), Some(c)) = (self.prefill_budget, self.token_budget)
            && p > c
        {
            return Err(LimitsError::Invalid {
                field: "prefill-budget",
                reason: format!("P = {p} exceeds the token budget C = {c} (P <= C)"),
            });
        }
        if !(self.watermark.is_finite() && (0.0..1.0).contains(&self.watermark)) {
            return Err(LimitsError::Invalid {
                field: "watermark",
                reason: format!("must be a fraction in [0, 1), got {}", self.watermark),
            });
        }
        if let Some(m) = self.kv_capacity
            && m < u64::from(self.block_size)
        {
            return Err(LimitsError::Invalid {
                field: "kv-capacity",
                reason: format!("M = {m} is smaller than one block ({})", self.block_size),
            });
        }
        Ok(())
    }

    /// The effective prefill budget: P if set, else C.
    pub fn effective_prefill_budget(&self) -> Option<u64> {
        self.prefill_budget.or(self.token_budget)
    }

    /// KV capacity a request holding `m` tokens occupies: `b * ceil(m / b)`.
    pub fn occupied(&self, m: u64) -> u64 {
        let b = u64::from(self.block_size);
        m.div_ceil(b) * b
    }

    /// Checks that some schedule can serve `workload`: every request's last token needs
    /// `I + O - 1` KV tokens at once, so that (in blocks) must fit in M.
    pub fn check_feasible(&self, workload: &Workload) -> Result<(), Infeasibility> {
        let Some(capacity) = self.kv_capacity else {
            return Ok(());
        };
        for (request, r) in workload.requests().iter().enumerate() {
            let max_kv = r.max_kv_tokens();
            let needed = self.occupied(max_kv);
            if needed > capacity {
                return Err(Infeasibility::KvTooSmall {
                    request,
                    max_kv,
                    needed,
                    block_size: self.block_size,
                    capacity,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_print_every_limit_with_p_defaulting_to_c() {
        let l = Limits {
            token_budget: Some(4074),
            kv_capacity: Some(16384),
            max_running: Some(256),
            block_size: 16,
            watermark: 0.01,
            ..Limits::unlimited()
        };
        assert_eq!(
            l.to_string(),
            "C = 4074, P = 4074, M = 16384, R_max = 256, block 16, watermark 0.01"
        );
        assert_eq!(
            Limits::unlimited().to_string(),
            "C = unlimited, P = unlimited, M = unlimited, R_max = unlimited, block 1, watermark 0"
        );
    }
    use crate::request::Request;

    #[test]
    fn validate_rejects_bad_limits() {
        assert!(Limits::unlimited().validate().is_ok());
        let bad = Limits {
            token_budget: Some(0),
            ..Limits::unlimited()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("token-budget")
        );
        let bad = Limits {
            token_budget: Some(10),
            prefill_budget: Some(11),
            ..Limits::unlimited()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("P = 11"));
        let bad = Limits {
            watermark: 1.0,
            ..Limits::unlimited()
        };
        assert!(bad.validate().is_err());
        let bad = Limits {
            block_size: 0,
            ..Limits::unlimited()
        };
        assert!(bad.validate().is_err());
        let bad = Limits {
            kv_capacity: Some(8),
            block_size: 16,
            ..Limits::unlimited()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn occupied_rounds_to_blocks() {
        let l = Limits {
            block_size: 16,
            ..Limits::unlimited()
        };
        assert_eq!(l.occupied(0), 0);
        assert_eq!(l.occupied(1), 16);
        assert_eq!(l.occupied(16), 16);
        assert_eq!(l.occupied(17), 32);
    }

    #[test]
    fn feasibility_uses_blocks() {
        let w = Workload::new(vec![Request {
            input_tokens: 10,
            output_tokens: 7,
            arrival_s: 0.0,
        }])
        .unwrap();
        // I + O - 1 = 16 fits exactly in M = 16 with block 1 and block 16, not block 32 of M = 31.
        let l = Limits {
            kv_capacity: Some(16),
            ..Limits::unlimited()
        };
        assert!(l.check_feasible(&w).is_ok());
        let l = Limits {
            kv_capacity: Some(15),
            ..Limits::unlimited()
        };
        let e = l.check_feasible(&w).unwrap_err();
        assert!(
            e.to_string().contains("request 0 needs 16 KV tokens"),
            "{e}"
        );
        let l = Limits {
            kv_capacity: Some(31),
            block_size: 32,
            ..Limits::unlimited()
        };
        assert!(Limits { ..l }.validate().is_err());
        let l = Limits {
            kv_capacity: Some(40),
            block_size: 12,
            ..Limits::unlimited()
        };
        assert!(l.check_feasible(&w).is_ok()); // 24 <= 40
    }
}
