//! What a calibration measures: per layer, the token-linear work for N tokens, decode
//! attention over sets of contexts, chunked causal prefill attention, and composite
//! batches (the whole layer sequence) that the fit never sees, for validation.

use infersched_core::BatchFeatures;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Which operator group a measurement times (and so which features it identifies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// GEMMs (QKV, O, gate/up, down), RMSNorm x2, RoPE, SiLU-and-multiply, residual adds.
    Linear,
    /// Decode attention over a KV cache.
    DecodeAttention,
    /// Causal prefill attention of chunks over cached context.
    PrefillAttention,
    /// The whole layer for a mixed batch (validation only).
    Composite,
}

impl Group {
    /// Name in `samples.csv`.
    pub fn name(self) -> &'static str {
        match self {
            Group::Linear => "linear",
            Group::DecodeAttention => "decode_attention",
            Group::PrefillAttention => "prefill_attention",
            Group::Composite => "composite",
        }
    }

    /// Parses [`Group::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        [
            Group::Linear,
            Group::DecodeAttention,
            Group::PrefillAttention,
            Group::Composite,
        ]
        .into_iter()
        .find(|g| g.name() == s)
    }
}

/// One timed configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measurement {
    /// The token-linear part of a layer for this many tokens.
    Linear {
        /// Tokens in the batch.
        tokens: u32,
    },
    /// Decode attention: one query token per sequence over its context (KV after the step).
    DecodeAttention {
        /// Context length of each sequence, the new token included.
        contexts: Vec<u32>,
    },
    /// Prefill attention: per sequence, `c` new tokens over `m` cached ones (causal).
    PrefillAttention {
        /// `(c, m_before)` per sequence.
        chunks: Vec<(u32, u32)>,
    },
    /// A mixed batch run as the whole layer.
    Composite {
        /// `(c, m_before)` per prefill entry.
        prefills: Vec<(u32, u32)>,
        /// Context after the step per decode entry.
        decodes: Vec<u32>,
    },
}

impl Measurement {
    /// The operator group.
    pub fn group(&self) -> Group {
        match self {
            Measurement::Linear { .. } => Group::Linear,
            Measurement::DecodeAttention { .. } => Group::DecodeAttention,
            Measurement::PrefillAttention { .. } => Group::PrefillAttention,
            Measurement::Composite { .. } => Group::Composite,
        }
    }

    /// The batch features this measurement stands for, restricted to the ones its group
    /// identifies (`semantics.md`): linear work gives `one` and `tokens`; decode attention
    /// `decode_kv`, `n_decode`, `has_decode`; prefill attention `prefill_attn`,
    /// `prefill_ctx`, `n_prefill`, `has_prefill`; a composite batch all of them. Summing the
    /// groups of a batch gives the batch's features, so one NNLS fit over all samples gives
    /// the whole layer's coefficients.
    pub fn features(&self) -> BatchFeatures {
        let mut f = BatchFeatures::default();
        match self {
            Measurement::Linear { tokens } => f.tokens = u64::from(*tokens),
            Measurement::DecodeAttention { contexts } => {
                for &l in contexts {
                    f.add_decode(u64::from(l));
                }
                f.tokens = 0;
            }
            Measurement::PrefillAttention { chunks } => {
                for &(c, m) in chunks {
                    f.add_prefill(u64::from(c), u64::from(m));
                }
                f.tokens = 0;
            }
            Measurement::Composite { prefills, decodes } => {
                for &(c, m) in prefills {
                    f.add_prefill(u64::from(c), u64::from(m));
                }
                for &l in decodes {
                    f.add_decode(u64::from(l));
                }
            }
        }
        f
    }

    /// Tokens the layer processes (rows of the activations).
    pub fn tokens(&self) -> u32 {
        match self {
            Measurement::Linear { tokens } => *tokens,
            Measurement::DecodeAttention { contexts } => contexts.len() as u32,
            Measurement::PrefillAttention { chunks } => chunks.iter().map(|c| c.0).sum(),
            Measurement::Composite { prefills, decodes } => {
                prefills.iter().map(|c| c.0).sum::<u32>() + decodes.len() as u32
            }
        }
    }

    /// KV tokens the measurement keeps in the cache (context of every sequence).
    pub fn kv_tokens(&self) -> u64 {
        match self {
            Measurement::Linear { .. } => 0,
            Measurement::DecodeAttention { contexts } => {
                contexts.iter().map(|&l| u64::from(l)).sum()
            }
            Measurement::PrefillAttention { chunks } => {
                chunks.iter().map(|&(c, m)| u64::from(c + m)).sum()
            }
            Measurement::Composite { prefills, decodes } => {
                prefills.iter().map(|&(c, m)| u64::from(c + m)).sum::<u64>()
                    + decodes.iter().map(|&l| u64::from(l)).sum::<u64>()
            }
        }
    }
}

/// Bounds of a calibration sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanLimits {
    /// Largest batch in tokens (the token budget to calibrate for).
    pub max_tokens: u32,
    /// Largest context of one sequence.
    pub max_context: u32,
    /// Largest KV cache held by one measurement, in tokens.
    pub max_kv_tokens: u64,
    /// Composite validation batches.
    pub composites: usize,
    /// Seed of the composite batches.
    pub seed: u64,
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self {
            max_tokens: 8192,
            max_context: 8192,
            max_kv_tokens: 262_144,
            composites: 40,
            seed: 0,
        }
    }
}

/// Token counts: every N up to 64 (tiles and waves make the small-N curve step), then
/// about 12% apart.
pub fn token_sweep(max_tokens: u32) -> Vec<u32> {
    let mut v: Vec<u32> = (1..=max_tokens.min(64)).collect();
    let mut n = 64f64;
    while (n as u32) < max_tokens {
        n = (n * 1.12).ceil();
        v.push((n as u32).min(max_tokens));
    }
    v.dedup();
    v
}

/// The measurements of a calibration, fit samples first, composites last.
pub fn plan(limits: &PlanLimits) -> Vec<Measurement> {
    let mut out: Vec<Measurement> = token_sweep(limits.max_tokens)
        .into_iter()
        .map(|tokens| Measurement::Linear { tokens })
        .collect();
    let contexts = [16u32, 128, 512, 1024, 2048, 4096, 8192];
    for &batch in &[1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
        for &l in contexts.iter().filter(|&&l| l <= limits.max_context) {
            if u64::from(batch) * u64::from(l) <= limits.max_kv_tokens {
                out.push(Measurement::DecodeAttention {
                    contexts: vec![l; batch as usize],
                });
            }
        }
    }
    for &seqs in &[1u32, 4] {
        for &c in &[16u32, 64, 256, 1024, 4096] {
            for &m in &[0u32, 512, 2048] {
                if c + m <= limits.max_context
                    && c * seqs <= limits.max_tokens
                    && u64::from(seqs) * u64::from(c + m) <= limits.max_kv_tokens
                {
                    out.push(Measurement::PrefillAttention {
                        chunks: vec![(c, m); seqs as usize],
                    });
                }
            }
        }
    }
    out.extend(composites(limits));
    out
}

/// Random mixed batches within the limits (seeded).
pub fn composites(limits: &PlanLimits) -> Vec<Measurement> {
    let mut rng = ChaCha8Rng::seed_from_u64(limits.seed);
    let mut out = Vec::new();
    while out.len() < limits.composites {
        let n_prefill = rng.random_range(0..=3u32);
        let n_decode = rng.random_range(0..=128u32);
        let mut tokens = n_decode;
        let mut kv = 0u64;
        let mut prefills = Vec::new();
        for _ in 0..n_prefill {
            let c = rng.random_range(1..=2048u32);
            let m = rng.random_range(0..=2048u32);
            prefills.push((c, m));
            tokens += c;
            kv += u64::from(c + m);
        }
        let decodes: Vec<u32> = (0..n_decode)
            .map(|_| rng.random_range(16..=4096u32))
            .collect();
        kv += decodes.iter().map(|&l| u64::from(l)).sum::<u64>();
        if tokens == 0
            || tokens > limits.max_tokens
            || kv > limits.max_kv_tokens
            || prefills.iter().any(|&(c, m)| c + m > limits.max_context)
            || decodes.iter().any(|&l| l > limits.max_context)
        {
            continue;
        }
        out.push(Measurement::Composite { prefills, decodes });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_every_group_within_its_limits() {
        let limits = PlanLimits::default();
        let p = plan(&limits);
        for g in [
            Group::Linear,
            Group::DecodeAttention,
            Group::PrefillAttention,
            Group::Composite,
        ] {
            assert!(p.iter().any(|m| m.group() == g), "{g:?}");
            assert_eq!(Group::from_name(g.name()), Some(g));
        }
        assert_eq!(
            p.iter().filter(|m| m.group() == Group::Composite).count(),
            40
        );
        for m in &p {
            assert!(m.tokens() >= 1 && m.tokens() <= limits.max_tokens, "{m:?}");
            assert!(m.kv_tokens() <= limits.max_kv_tokens, "{m:?}");
        }
        let sweep = token_sweep(8192);
        assert_eq!(&sweep[..3], &[1, 2, 3]);
        assert_eq!(*sweep.last().unwrap(), 8192);
        assert!(sweep.windows(2).all(|w| w[0] < w[1]));
        // Same seed, same composites.
        assert_eq!(composites(&limits), composites(&limits));
    }

    #[test]
    fn group_features_add_up_to_the_batch_features() {
        let prefills = vec![(100, 20), (7, 0)];
        let decodes = vec![33, 40, 50];
        let whole = Measurement::Composite {
            prefills: prefills.clone(),
            decodes: decodes.clone(),
        }
        .features();
        let lin = Measurement::Linear { tokens: 110 }.features();
        let dec = Measurement::DecodeAttention { contexts: decodes }.features();
        let pre = Measurement::PrefillAttention { chunks: prefills }.features();
        assert_eq!(lin.tokens + dec.tokens + pre.tokens, whole.tokens);
        assert_eq!(dec.decode_kv, whole.decode_kv);
        assert_eq!(dec.n_decode, 3);
        assert_eq!(pre.prefill_attn, whole.prefill_attn);
        assert_eq!(pre.prefill_ctx, whole.prefill_ctx);
        assert_eq!(pre.n_prefill, 2);
        assert_eq!(whole.tokens, 110);
    }
}
