//! Model and GPU specs, and the KV capacity M they imply.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The shape of a Llama-style decoder (gated MLP, grouped-query attention).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Name, e.g. `llama2-7b`.
    pub name: String,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size h.
    pub hidden: u32,
    /// Attention heads.
    pub heads: u32,
    /// KV heads (grouped-query attention; = heads for multi-head attention).
    pub kv_heads: u32,
    /// Head dimension d.
    pub head_dim: u32,
    /// MLP intermediate width f (gated: gate and up projections of width f each).
    pub mlp_hidden: u32,
    /// Vocabulary size (embedding and LM head).
    pub vocab: u32,
    /// Bytes per weight and KV element (2 for fp16/bf16).
    pub dtype_bytes: u32,
}

/// A GPU's memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Name, e.g. `a100-80gb`.
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
}

/// Why a KV capacity cannot be computed.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum HardwareError {
    /// A spec or argument is out of range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The weights leave no room for KV.
    #[error(
        "the weights ({weights_gib:.2} GiB per GPU) do not fit in {usable_gib:.2} GiB ({utilization} of {gpu}'s memory): no room for KV cache"
    )]
    NoRoomForKv {
        /// Weight bytes per GPU in GiB.
        weights_gib: f64,
        /// Usable memory in GiB.
        usable_gib: f64,
        /// Utilization fraction.
        utilization: f64,
        /// GPU name.
        gpu: String,
    },
}

impl ModelSpec {
    /// Llama-2-7B.
    pub fn llama2_7b() -> Self {
        Self {
            name: "llama2-7b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            mlp_hidden: 11008,
            vocab: 32000,
            dtype_bytes: 2,
        }
    }

    /// Llama-3-8B.
    pub fn llama3_8b() -> Self {
        Self {
            name: "llama3-8b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            mlp_hidden: 14336,
            vocab: 128256,
            dtype_bytes: 2,
        }
    }

    /// Llama-3-70B.
    pub fn llama3_70b() -> Self {
        Self {
            name: "llama3-70b".into(),
            layers: 80,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            mlp_hidden: 28672,
            vocab: 128256,
            dtype_bytes: 2,
        }
    }

    /// Parameter count: embedding and LM head, and per layer the Q, K, V, O projections,
    /// the gated MLP (gate, up, down) and two RMSNorm weight vectors, plus the final norm.
    pub fn parameters(&self) -> u64 {
        let h = u64::from(self.hidden);
        let q = u64::from(self.heads) * u64::from(self.head_dim);
        let kv = u64::from(self.kv_heads) * u64::from(self.head_dim);
        let f = u64::from(self.mlp_hidden);
        let per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h;
        2 * u64::from(self.vocab) * h + u64::from(self.layers) * per_layer + h
    }

    /// Weight bytes held by each of `tp` tensor-parallel GPUs.
    pub fn weight_bytes_per_gpu(&self, tp: u32) -> u64 {
        self.parameters() * u64::from(self.dtype_bytes) / u64::from(tp.max(1))
    }

    /// KV bytes per token on each GPU: `2 * layers * kv_heads_per_gpu * head_dim * dtype`,
    /// where a GPU holds `kv_heads / tp` KV heads, or one replicated head when `tp` exceeds
    /// `kv_heads` (vLLM's rule for grouped-query attention).
    pub fn kv_bytes_per_token(&self, tp: u32) -> u64 {
        let tp = tp.max(1);
        let kv_heads_per_gpu = if self.kv_heads >= tp {
            self.kv_heads / tp
        } else {
            1
        };
        2 * u64::from(self.layers)
            * u64::from(kv_heads_per_gpu)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// One of `stages` pipeline stages of this model: `ceil(layers / stages)` layers (the
    /// largest stage, which binds memory), the embedding and LM head counted in full
    /// (conservatively: vLLM puts them on the first and last stage). Refuses 0 stages and
    /// more stages than layers.
    pub fn pipeline_stage(&self, stages: u32) -> Result<ModelSpec, HardwareError> {
        if stages == 0 || stages > self.layers {
            return Err(HardwareError::Invalid {
                field: "pipeline_parallel",
                reason: format!(
                    "--pp {stages}: {} has {} layers (each of 1 to {} stages needs at least one)",
                    self.name, self.layers, self.layers
                ),
            });
        }
        Ok(ModelSpec {
            layers: self.layers.div_ceil(stages),
            ..self.clone()
        })
    }

    /// Bytes per token a pipeline stage sends the next: the hidden states and the
    /// residual (vLLM's `IntermediateTensors` for Llama), `2 x hidden x dtype`.
    pub fn pipeline_bytes_per_token(&self) -> u64 {
        2 * u64::from(self.hidden) * u64::from(self.dtype_bytes)
    }

    /// Checks a tensor-parallel degree as vLLM does: at least 1, dividing the attention
    /// heads, and dividing the KV heads (or, when larger, divided by them: replication).
    pub fn check_tensor_parallel(&self, tp: u32) -> Result<(), HardwareError> {
        let invalid = |reason: String| HardwareError::Invalid {
            field: "tensor_parallel",
            reason,
        };
        if tp == 0 {
            return Err(invalid("must be >= 1".into()));
        }
        if !self.heads.is_multiple_of(tp) {
            return Err(invalid(format!(
                "{tp} does not divide {}'s {} attention heads",
                self.name, self.heads
            )));
        }
        if (self.kv_heads >= tp && !self.kv_heads.is_multiple_of(tp))
            || (self.kv_heads < tp && !tp.is_multiple_of(self.kv_heads))
        {
            return Err(invalid(format!(
                "{tp} and {}'s {} KV heads: one must divide the other",
                self.name, self.kv_heads
            )));
        }
        Ok(())
    }

    /// Checks that every dimension is at least 1.
    pub fn validate(&self) -> Result<(), HardwareError> {
        for (field, v) in [
            ("model.layers", self.layers),
            ("model.hidden", self.hidden),
            ("model.heads", self.heads),
            ("model.kv_heads", self.kv_heads),
            ("model.head_dim", self.head_dim),
            ("model.dtype_bytes", self.dtype_bytes),
        ] {
            if v == 0 {
                return Err(HardwareError::Invalid {
                    field,
                    reason: "must be >= 1".into(),
                });
            }
        }
        Ok(())
    }
}

impl GpuSpec {
    /// NVIDIA A100 80GB (80 GiB).
    pub fn a100_80gb() -> Self {
        Self {
            name: "a100-80gb".into(),
            memory_bytes: 80 << 30,
        }
    }
    /// NVIDIA H100 80GB (80 GiB).
    pub fn h100_80gb() -> Self {
        Self {
            name: "h100-80gb".into(),
            memory_bytes: 80 << 30,
        }
    }
    /// NVIDIA H200 (141 GB; 139.8 GiB usable as reported by the driver here).
    pub fn h200() -> Self {
        Self {
            name: "h200".into(),
            memory_bytes: 150_109_880_320,
        }
    }
}

/// vLLM's default `gpu_memory_utilization`: the fraction of GPU memory for weights,
/// activations and KV that M is derived with unless told otherwise.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// KV capacity M in tokens:
/// `(memory * utilization - weight bytes per GPU) / KV bytes per token per GPU`.
pub fn kv_capacity_tokens(
    model: &ModelSpec,
    gpu: &GpuSpec,
    tp: u32,
    utilization: f64,
) -> Result<u64, HardwareError> {
    model.validate()?;
    model.check_tensor_parallel(tp)?;
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(HardwareError::Invalid {
            field: "utilization",
            reason: format!("must be in (0, 1], got {utilization}"),
        });
    }
    let usable = gpu.memory_bytes as f64 * utilization;
    let weights = model.weight_bytes_per_gpu(tp) as f64;
    if weights >= usable {
        return Err(HardwareError::NoRoomForKv {
            weights_gib: weights / (1u64 << 30) as f64,
            usable_gib: usable / (1u64 << 30) as f64,
            utilization,
            gpu: gpu.name.clone(),
        });
    }
    Ok(((usable - weights) / model.kv_bytes_per_token(tp) as f64).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_stage_holds_its_share_of_layers_and_more_kv() {
        let m = ModelSpec::llama3_8b();
        let gpu = GpuSpec::h100_80gb();
        let one = kv_capacity_tokens(&m, &gpu, 1, 0.9).unwrap();
        let stage = m.pipeline_stage(2).unwrap();
        assert_eq!(stage.layers, 16);
        assert_eq!(stage.kv_bytes_per_token(1) * 2, m.kv_bytes_per_token(1));
        let two = kv_capacity_tokens(&stage, &gpu, 1, 0.9).unwrap();
        assert!(two > 2 * one, "{one} -> {two}");
        assert_eq!(m.pipeline_stage(1).unwrap(), m);
        assert_eq!(m.pipeline_stage(3).unwrap().layers, 11);
        for bad in [0, 33] {
            let e = m.pipeline_stage(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("--pp {bad}")) && e.contains("32 layers"),
                "{e}"
            );
        }
        assert_eq!(m.pipeline_bytes_per_token(), 2 * 4096 * 2);
    }

    #[test]
    fn tensor_parallel_degrees_follow_vllm() {
        let m = ModelSpec::llama3_70b(); // 64 heads, 8 KV heads
        assert!(m.check_tensor_parallel(8).is_ok());
        assert!(m.check_tensor_parallel(16).is_ok()); // KV heads replicated
        for tp in [0, 3, 4_294_967_295] {
            assert!(m.check_tensor_parallel(tp).is_err(), "{tp}");
        }
        let gpu = GpuSpec::a100_80gb();
        let e = kv_capacity_tokens(&m, &gpu, 4_294_967_295, 0.9).unwrap_err();
        assert!(e.to_string().contains("does not divide"), "{e}");
        // Past the KV heads each GPU holds one replicated head, not a fraction of one.
        assert_eq!(m.kv_bytes_per_token(16), m.kv_bytes_per_token(8));
    }

    #[test]
    fn llama2_7b_shape() {
        let m = ModelSpec::llama2_7b();
        // 6.74 billion parameters is Llama-2-7B's published size.
        let p = m.parameters() as f64 / 1e9;
        assert!((p - 6.738).abs() < 0.01, "{p}");
        assert_eq!(m.kv_bytes_per_token(1), 524_288); // 512 KiB per token
        let l3 = ModelSpec::llama3_70b().parameters() as f64 / 1e9;
        assert!((l3 - 70.55).abs() < 0.1, "{l3}");
        let l8 = ModelSpec::llama3_8b().parameters() as f64 / 1e9;
        assert!((l8 - 8.03).abs() < 0.01, "{l8}");
    }

    #[test]
    fn kv_capacity_matches_hand_computation() {
        // (80 GiB * 0.9 - 13.476 GB) / 512 KiB = 121,625 tokens.
        let m = kv_capacity_tokens(&ModelSpec::llama2_7b(), &GpuSpec::a100_80gb(), 1, 0.9).unwrap();
        let expected = ((80.0 * (1u64 << 30) as f64 * 0.9)
            - ModelSpec::llama2_7b().parameters() as f64 * 2.0)
            / 524_288.0;
        assert_eq!(m, expected.floor() as u64);
        assert!((110_000..125_000).contains(&m), "{m}");
        // 70B at TP 4: 81,920 KV bytes per token per GPU.
        assert_eq!(ModelSpec::llama3_70b().kv_bytes_per_token(4), 81_920);
    }

    #[test]
    fn weights_that_do_not_fit_are_an_error() {
        let e = kv_capacity_tokens(&ModelSpec::llama3_70b(), &GpuSpec::a100_80gb(), 1, 0.9)
            .unwrap_err();
        assert!(e.to_string().contains("no room for KV"), "{e}");
        assert!(
            kv_capacity_tokens(&ModelSpec::llama2_7b(), &GpuSpec::a100_80gb(), 1, 0.0).is_err()
        );
        assert!(
            kv_capacity_tokens(&ModelSpec::llama2_7b(), &GpuSpec::a100_80gb(), 0, 0.9).is_err()
        );
    }
}
