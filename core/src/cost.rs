//! Batch features and the cost-model interface (`semantics.md`, "Cost model").

use std::fmt;

/// One feature of a batch. Batch time is `sum_k theta_k * phi_k(batch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// 1 if the batch processes any token (launch overhead, weight reads).
    One,
    /// Sum of tokens processed (all linear layers).
    Tokens,
    /// Sum over decode entries of `m` after the step (decode attention KV reads).
    DecodeKv,
    /// Sum over prefill entries of `m_after^2 - m_before^2` (prefill attention).
    PrefillAttn,
    /// Sum over prefill entries of `m_before` (reading a chunk's cached context).
    PrefillCtx,
    /// Number of prefill entries.
    NPrefill,
    /// Number of decode entries.
    NDecode,
    /// 1 if the batch has any prefill entry.
    HasPrefill,
    /// 1 if the batch has any decode entry.
    HasDecode,
}

/// Feature names as written in files (coefficient JSON, samples CSV), in [`Feature::ALL`] order.
pub const FEATURE_NAMES: [&str; 9] = [
    "one",
    "tokens",
    "decode_kv",
    "prefill_attn",
    "prefill_ctx",
    "n_prefill",
    "n_decode",
    "has_prefill",
    "has_decode",
];

impl Feature {
    /// Every feature, in file order.
    pub const ALL: [Feature; 9] = [
        Feature::One,
        Feature::Tokens,
        Feature::DecodeKv,
        Feature::PrefillAttn,
        Feature::PrefillCtx,
        Feature::NPrefill,
        Feature::NDecode,
        Feature::HasPrefill,
        Feature::HasDecode,
    ];

    /// The feature's name in files.
    pub fn name(self) -> &'static str {
        FEATURE_NAMES[self as usize]
    }

    /// Parses a file name of a feature.
    pub fn from_name(name: &str) -> Option<Feature> {
        FEATURE_NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Feature::ALL[i])
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The features of one batch, exact integers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchFeatures {
    /// Sum of tokens processed.
    pub tokens: u64,
    /// Sum over decode entries of KV after the step.
    pub decode_kv: u64,
    /// Sum over prefill entries of `c^2 + 2 c m_before`.
    pub prefill_attn: u64,
    /// Sum over prefill entries of `m_before`.
    pub prefill_ctx: u64,
    /// Number of prefill entries.
    pub n_prefill: u64,
    /// Number of decode entries.
    pub n_decode: u64,
}

impl BatchFeatures {
    /// Adds one prefill entry of `c` tokens over `m_before` cached tokens.
    pub fn add_prefill(&mut self, c: u64, m_before: u64) {
        self.tokens += c;
        self.prefill_attn += c * c + 2 * c * m_before;
        self.prefill_ctx += m_before;
        self.n_prefill += 1;
    }

    /// Adds one decode entry (1 token) whose KV after the step is `m_after`.
    pub fn add_decode(&mut self, m_after: u64) {
        self.tokens += 1;
        self.decode_kv += m_after;
        self.n_decode += 1;
    }

    /// The value of one feature.
    pub fn get(&self, feature: Feature) -> f64 {
        match feature {
            Feature::One => f64::from(u8::from(self.tokens > 0)),
            Feature::Tokens => self.tokens as f64,
            Feature::DecodeKv => self.decode_kv as f64,
            Feature::PrefillAttn => self.prefill_attn as f64,
            Feature::PrefillCtx => self.prefill_ctx as f64,
            Feature::NPrefill => self.n_prefill as f64,
            Feature::NDecode => self.n_decode as f64,
            Feature::HasPrefill => f64::from(u8::from(self.n_prefill > 0)),
            Feature::HasDecode => f64::from(u8::from(self.n_decode > 0)),
        }
    }

    /// All feature values in [`Feature::ALL`] order.
    pub fn to_array(&self) -> [f64; 9] {
        Feature::ALL.map(|f| self.get(f))
    }
}

/// A batch-time model: seconds to run a batch with the given features.
///
/// Implementations must be deterministic, return finite values >= 0, and return 0 for a
/// batch that processes no token.
pub trait CostModel: Sync {
    /// Seconds to run a batch with features `features`.
    fn batch_time_s(&self, features: &BatchFeatures) -> f64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Feature::ALL {
            assert_eq!(Feature::from_name(f.name()), Some(f));
        }
        assert_eq!(Feature::from_name("nope"), None);
    }

    #[test]
    fn prefill_and_decode_accumulate() {
        let mut f = BatchFeatures::default();
        assert_eq!(f.get(Feature::One), 0.0);
        f.add_prefill(4, 3); // c^2 + 2cm = 16 + 24
        f.add_decode(10);
        assert_eq!(f.tokens, 5);
        assert_eq!(f.prefill_attn, 40);
        assert_eq!(f.prefill_ctx, 3);
        assert_eq!(f.decode_kv, 10);
        assert_eq!(
            f.to_array(),
            [1.0, 5.0, 10.0, 40.0, 3.0, 1.0, 1.0, 1.0, 1.0]
        );
    }
}
