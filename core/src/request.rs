//! Requests and workloads.

use thiserror::Error;

/// One inference request: `I` prompt tokens, `O` output tokens, arrival time `T`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// `I`: prompt tokens (>= 1).
    pub input_tokens: u32,
    /// `O`: output tokens to generate (>= 1).
    pub output_tokens: u32,
    /// `T`: arrival time in seconds (finite, >= 0).
    pub arrival_s: f64,
}

impl Request {
    /// The most KV tokens this request ever holds: `I + O - 1` (the newest token never has KV).
    pub fn max_kv_tokens(&self) -> u64 {
        u64::from(self.input_tokens) + u64::from(self.output_tokens) - 1
    }

    /// Tokens processed by a run without evictions: `I + O - 1`.
    pub fn base_processed_tokens(&self) -> u64 {
        self.max_kv_tokens()
    }
}

/// Why a workload is not valid.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum WorkloadError {
    /// A workload must hold at least one request.
    #[error("the workload has no requests")]
    Empty,
    /// A field of one request is out of range.
    #[error("request {index}: {field} {reason}")]
    InvalidField {
        /// 0-based request id (row index).
        index: usize,
        /// Field name.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// More requests than request ids can address.
    #[error("the workload has {0} requests; at most 4294967295 are supported")]
    TooMany(usize),
    /// More requests than are generated at once (checked before anything is allocated).
    #[error(
        "generating {requests} requests would take about {} GiB before any simulation; at most {max} are generated at once",
        requests.saturating_mul(32) >> 30
    )]
    TooManyToGenerate {
        /// Requests asked for.
        requests: usize,
        /// The most generated at once.
        max: usize,
    },
}

/// The latest arrival time accepted, in seconds (about 317 years): an f64 time there is
/// still resolved to about 2 microseconds, finer than any batch time; beyond it batch times
/// added to it would round away.
pub const MAX_ARRIVAL_S: f64 = 1e10;

/// A validated, non-empty list of requests. Request ids are 0-based indices into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    requests: Vec<Request>,
    /// The prompts' block ids, where the trace gives them.
    prefix: Option<std::sync::Arc<crate::prefix::PrefixIds>>,
    /// Per request, prompt tokens whose KV arrives with it, computed elsewhere.
    transferred: Option<std::sync::Arc<Vec<u32>>>,
    /// Per request, seconds it keeps its KV after its last token (while sending it).
    kv_hold_s: Option<std::sync::Arc<Vec<f64>>>,
    /// Per request, seconds its transferred KV takes to arrive after it is received.
    transfer_s: Option<std::sync::Arc<Vec<f64>>>,
}

impl Workload {
    /// Validates and wraps `requests`: at least one, `I >= 1`, `O >= 1`, arrival from 0 to
    /// [`MAX_ARRIVAL_S`].
    pub fn new(requests: Vec<Request>) -> Result<Self, WorkloadError> {
        if requests.is_empty() {
            return Err(WorkloadError::Empty);
        }
        if u32::try_from(requests.len()).is_err() {
            return Err(WorkloadError::TooMany(requests.len()));
        }
        for (index, r) in requests.iter().enumerate() {
            if r.input_tokens == 0 {
                return Err(WorkloadError::InvalidField {
                    index,
                    field: "input_tokens",
                    reason: "must be >= 1".into(),
                });
            }
            if r.output_tokens == 0 {
                return Err(WorkloadError::InvalidField {
                    index,
                    field: "output_tokens",
                    reason: "must be >= 1".into(),
                });
            }
            if !(0.0..=MAX_ARRIVAL_S).contains(&r.arrival_s) {
                return Err(WorkloadError::InvalidField {
                    index,
                    field: "arrival_s",
                    reason: format!(
                        "must be from 0 to {MAX_ARRIVAL_S:e} s (finer than batch times), got {}",
                        crate::io::short_number(r.arrival_s)
                    ),
                });
            }
        }
        Ok(Self {
            requests,
            prefix: None,
            transferred: None,
            kv_hold_s: None,
            transfer_s: None,
        })
    }

    /// The workload with its prompts' block ids (checked against the requests).
    pub fn with_prefix(mut self, prefix: crate::prefix::PrefixIds) -> Result<Self, WorkloadError> {
        if self.transferred.is_some() {
            return Err(WorkloadError::InvalidField {
                index: 0,
                field: "hash_ids",
                reason: "a workload whose KV is transferred takes no prefix ids".into(),
            });
        }
        prefix
            .validate(&self.input_lengths())
            .map_err(|(index, reason)| WorkloadError::InvalidField {
                index,
                field: "hash_ids",
                reason,
            })?;
        self.prefix = Some(std::sync::Arc::new(prefix));
        Ok(self)
    }

    /// The prompts' block ids, where the trace gives them.
    pub fn prefix(&self) -> Option<&crate::prefix::PrefixIds> {
        self.prefix.as_deref()
    }

    /// The workload whose request `i` arrives with the KV of its first `tokens[i]` prompt
    /// tokens computed elsewhere (a disaggregated decode replica's requests: a prefill
    /// replica computed it and a link moved it; semantics.md, "Disaggregated prefill and
    /// decode"). At most `I` each; not with prefix ids.
    pub fn with_transferred(mut self, tokens: Vec<u32>) -> Result<Self, WorkloadError> {
        let invalid = |index, reason: String| WorkloadError::InvalidField {
            index,
            field: "transferred",
            reason,
        };
        if tokens.len() != self.requests.len() {
            return Err(invalid(
                0,
                format!(
                    "{} values for {} requests",
                    tokens.len(),
                    self.requests.len()
                ),
            ));
        }
        if self.prefix.is_some() {
            return Err(invalid(
                0,
                "a workload with prefix ids takes no transferred KV".into(),
            ));
        }
        if let Some(i) = (0..tokens.len()).find(|&i| tokens[i] > self.requests[i].input_tokens) {
            return Err(invalid(
                i,
                format!(
                    "{} tokens, more than the prompt's {}",
                    tokens[i], self.requests[i].input_tokens
                ),
            ));
        }
        self.transferred = Some(std::sync::Arc::new(tokens));
        Ok(self)
    }

    /// Prompt tokens whose KV request `i` brings with it (0 without transferred KV).
    pub fn transferred(&self, i: usize) -> u32 {
        self.transferred.as_ref().map_or(0, |t| t[i])
    }

    /// Whether any request brings KV with it.
    pub fn has_transferred(&self) -> bool {
        self.transferred.is_some()
    }

    /// The workload whose request `i` keeps its KV for `hold_s[i]` seconds after its last
    /// token (a disaggregated prefill replica's requests, sending their prompt's KV;
    /// semantics.md, "Disaggregated prefill and decode"). Each finite and `>= 0`.
    pub fn with_kv_hold(mut self, hold_s: Vec<f64>) -> Result<Self, WorkloadError> {
        let invalid = |index, reason: String| WorkloadError::InvalidField {
            index,
            field: "kv_hold_s",
            reason,
        };
        if hold_s.len() != self.requests.len() {
            let reason = format!("{} values for {} requests", hold_s.len(), self.len());
            return Err(invalid(0, reason));
        }
        if let Some(i) = hold_s.iter().position(|h| !(h.is_finite() && *h >= 0.0)) {
            return Err(invalid(
                i,
                format!("must be finite and >= 0, got {}", hold_s[i]),
            ));
        }
        self.kv_hold_s = Some(std::sync::Arc::new(hold_s));
        Ok(self)
    }

    /// The workload whose request `i`'s transferred KV ([`Self::with_transferred`]) takes
    /// `seconds[i]` to arrive once a receive entry has allocated it (a pulled transfer,
    /// semantics.md "Disaggregated prefill and decode"). Each finite and `>= 0`.
    pub fn with_transfer_s(mut self, seconds: Vec<f64>) -> Result<Self, WorkloadError> {
        let invalid = |index, reason: String| WorkloadError::InvalidField {
            index,
            field: "transfer_s",
            reason,
        };
        if seconds.len() != self.requests.len() {
            let reason = format!("{} values for {} requests", seconds.len(), self.len());
            return Err(invalid(0, reason));
        }
        if let Some(i) = seconds.iter().position(|t| !(t.is_finite() && *t >= 0.0)) {
            return Err(invalid(
                i,
                format!("must be finite and >= 0, got {}", seconds[i]),
            ));
        }
        self.transfer_s = Some(std::sync::Arc::new(seconds));
        Ok(self)
    }

    /// Whether transferred KV is pulled ([`Self::with_transfer_s`]): received, then moved.
    pub fn pulls_kv(&self) -> bool {
        self.transfer_s.is_some()
    }

    /// Seconds request `i`'s received KV takes to arrive (0 without).
    pub fn transfer_s(&self, i: usize) -> f64 {
        self.transfer_s.as_ref().map_or(0.0, |t| t[i])
    }

    /// Seconds request `i` keeps its KV after its last token (0 without a hold).
    pub fn kv_hold_s(&self, i: usize) -> f64 {
        self.kv_hold_s.as_ref().map_or(0.0, |h| h[i])
    }

    /// Whether any request keeps its KV after its last token.
    pub fn has_kv_hold(&self) -> bool {
        self.kv_hold_s.is_some()
    }

    /// The requests `ids` (in that order, renumbered 0..), with their prefix ids,
    /// transferred KV and KV holds.
    pub fn members(&self, ids: &[u32]) -> Result<Workload, WorkloadError> {
        let reqs = ids.iter().map(|&g| self.requests[g as usize]).collect();
        let mut sub = Workload::new(reqs)?;
        if let Some(p) = self.prefix() {
            let ids = ids.iter().map(|&g| p.ids[g as usize].clone()).collect();
            sub = sub.with_prefix(crate::prefix::PrefixIds {
                block_tokens: p.block_tokens,
                ids,
            })?;
        }
        if self.has_transferred() {
            sub =
                sub.with_transferred(ids.iter().map(|&g| self.transferred(g as usize)).collect())?;
        }
        if self.has_kv_hold() {
            sub = sub.with_kv_hold(ids.iter().map(|&g| self.kv_hold_s(g as usize)).collect())?;
        }
        if self.transfer_s.is_some() {
            sub =
                sub.with_transfer_s(ids.iter().map(|&g| self.transfer_s(g as usize)).collect())?;
        }
        Ok(sub)
    }

    /// The prompts' lengths `I`, by request id.
    pub fn input_lengths(&self) -> Vec<u32> {
        self.requests.iter().map(|r| r.input_tokens).collect()
    }

    /// The requests, indexed by request id.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Number of requests (never 0).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Always false: a workload is never empty. Present for API symmetry with slices.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Consumes the workload, returning its requests.
    pub fn into_requests(self) -> Vec<Request> {
        self.requests
    }

    /// Request ids in first-come-first-served order: by arrival time, then id.
    pub fn fcfs_order(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..self.requests.len() as u32).collect();
        ids.sort_by(|&a, &b| {
            self.requests[a as usize]
                .arrival_s
                .total_cmp(&self.requests[b as usize].arrival_s)
                .then(a.cmp(&b))
        });
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(i: u32, o: u32, t: f64) -> Request {
        Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: t,
        }
    }

    #[test]
    fn rejects_empty_zero_and_negative() {
        assert_eq!(Workload::new(vec![]), Err(WorkloadError::Empty));
        let e = Workload::new(vec![req(1, 1, 0.0), req(0, 1, 0.0)]).unwrap_err();
        assert!(e.to_string().contains("request 1: input_tokens"), "{e}");
        let e = Workload::new(vec![req(1, 0, 0.0)]).unwrap_err();
        assert!(e.to_string().contains("output_tokens"), "{e}");
        let e = Workload::new(vec![req(1, 1, -1.0)]).unwrap_err();
        assert!(e.to_string().contains("arrival_s"), "{e}");
        assert!(Workload::new(vec![req(1, 1, f64::NAN)]).is_err());
    }

    #[test]
    fn transferred_kv_is_checked_and_kept_by_members() {
        let w = Workload::new(vec![req(4, 2, 0.0), req(3, 1, 1.0)]).unwrap();
        let e = w.clone().with_transferred(vec![4]).unwrap_err();
        assert!(e.to_string().contains("1 values for 2 requests"), "{e}");
        let e = w.clone().with_transferred(vec![4, 4]).unwrap_err();
        assert!(
            e.to_string().contains("request 1: transferred 4 tokens"),
            "{e}"
        );
        let t = w.with_transferred(vec![4, 2]).unwrap();
        assert_eq!((t.transferred(0), t.transferred(1)), (4, 2));
        let one = t.members(&[1]).unwrap();
        assert_eq!((one.len(), one.transferred(0)), (1, 2));
        assert_eq!(one.requests()[0].input_tokens, 3);
    }

    #[test]
    fn kv_holds_are_checked_and_kept_by_members() {
        let w = Workload::new(vec![req(4, 1, 0.0), req(3, 1, 1.0)]).unwrap();
        assert_eq!(w.kv_hold_s(1), 0.0);
        let e = w.clone().with_kv_hold(vec![0.5]).unwrap_err();
        assert!(e.to_string().contains("1 values for 2 requests"), "{e}");
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = w.clone().with_kv_hold(vec![0.0, bad]).unwrap_err();
            assert!(e.to_string().contains("request 1: kv_hold_s"), "{e}");
        }
        let h = w.with_kv_hold(vec![0.25, 0.5]).unwrap();
        assert!(h.has_kv_hold());
        let one = h.members(&[1]).unwrap();
        assert_eq!((one.len(), one.kv_hold_s(0)), (1, 0.5));
    }

    #[test]
    fn max_kv_and_fcfs_order() {
        assert_eq!(req(5, 3, 0.0).max_kv_tokens(), 7);
        let w = Workload::new(vec![req(1, 1, 2.0), req(1, 1, 1.0), req(1, 1, 1.0)]).unwrap();
        assert_eq!(w.fcfs_order(), vec![1, 2, 0]);
    }
}
