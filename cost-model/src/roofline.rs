//! The `roofline` cost model: first-order coefficients from a model's shape and a GPU's
//! datasheet (peak dense bf16 FLOP/s, memory bandwidth), usable anywhere as
//! `roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]]`, e.g. `roofline:h200:llama2-7b` (InferMax's "theoretical
//! hardware bound").
//!
//! Per layer and GPU (tensor parallel degree t, bytes per element b), each term the time of
//! the work it stands for at full speed, added (a sum of bounds, so it stays linear in the
//! batch features of `semantics.md`):
//! * `one`: reading the layer's weights once per batch, `W_layer * b / t / BW`;
//! * `tokens`: the GEMMs, `2 * W_layer / t / FLOPS` per token;
//! * `decode_kv`: a decode reads K and V of its context, `2 * n_kv * d * b / t / BW` per token;
//! * `prefill_attn`: causal attention FLOPs, `2 * n_h * d / t / FLOPS` per unit
//!   (the feature counts `c^2 + 2 c m`, twice the query-key pairs; QK and PV cost `2 d` each);
//! * `prefill_ctx`: reading the cached context of a chunk, `2 * n_kv * d * b / t / BW` per token;
//! * per-batch and per-request biases (kernel launches, scheduling) are 0: a roofline has none;
//! * with `t > 1`, tensor parallelism's communication: two all-reduces per layer (after
//!   attention and after the MLP) of the batch's activations, `tokens x hidden x b` bytes
//!   each; a ring all-reduce sends `2 (t - 1) / t` of them from every GPU, so `tokens` gains
//!   `2 * 2 (t - 1) / t * hidden * b / link` per token, `link` the GPU's bandwidth in one
//!   direction over NVLink (default) or PCIe ([`Link`]). Added to the compute, as vLLM
//!   runs them (no overlap); launch latencies are left out, as every other bias. On NVSwitch
//!   systems with in-network reduction (NVLink SHARP) an all-reduce can send less than a
//!   ring's volume, so there the communication term is a ring's, not a strict floor;
//! * with the suffix `:nccl`, each batch also pays NCCL's latency of its `2 x layers`
//!   all-reduces ([`all_reduce_latency_s`], in `one`): then it is no longer a floor.
//!
//! It is a lower bound on real kernel time, not a prediction: at small batches real GEMMs
//! reach a fraction of the peak, and launch overheads that a calibration measures are missing.

use crate::hardware::{GpuSpec, ModelSpec};
use crate::linear::{COST_MODEL_FORMAT, CoefficientFile, LinearCostModel, Provenance, TimeUnit};
use std::collections::BTreeMap;
use std::path::Path;

/// A GPU's datasheet numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Datasheet {
    /// Memory (for M).
    pub gpu: GpuSpec,
    /// Peak dense bf16 tensor-core FLOP/s.
    pub peak_flops: f64,
    /// Memory bandwidth in bytes/s.
    pub bandwidth: f64,
    /// NVLink bandwidth per GPU in one direction (bytes/s): half the datasheet's
    /// bidirectional total.
    pub nvlink: f64,
    /// PCIe x16 bandwidth per GPU in one direction (bytes/s), likewise.
    pub pcie: f64,
}

/// The link tensor-parallel all-reduces run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// NVLink (the SXM boards the datasheets describe).
    NvLink,
    /// PCIe x16 (boards without NVLink).
    Pcie,
}

impl Link {
    /// Name in specs: `nvlink`, `pcie`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NvLink => "nvlink",
            Self::Pcie => "pcie",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::NvLink, Self::Pcie]
            .into_iter()
            .find(|l| l.name() == s)
    }
}

impl Datasheet {
    /// The bandwidth of `link` per GPU in one direction (bytes/s).
    pub fn link_bandwidth(&self, link: Link) -> f64 {
        match link {
            Link::NvLink => self.nvlink,
            Link::Pcie => self.pcie,
        }
    }
}

/// Tensor parallelism's communication per token and layer (seconds): two ring all-reduces
/// of `hidden x dtype` bytes, each sending `2 (tp - 1) / tp` of them from every GPU over a
/// link of `link_bandwidth` bytes/s; 0 at `tp = 1`.
pub fn all_reduce_s_per_token(model: &ModelSpec, tp: u32, link_bandwidth: f64) -> f64 {
    let t = f64::from(tp.max(1));
    let bytes = f64::from(model.hidden) * f64::from(model.dtype_bytes);
    2.0 * 2.0 * (t - 1.0) / t * bytes / link_bandwidth
}

impl Datasheet {
    /// The datasheet of a GPU by short name: `a100`, `h100`, `h200`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            // A100 SXM4 80GB: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, NVLink 3 600 GB/s
            // and PCIe 4 x16 64 GB/s (both directions together).
            "a100" => Some(Self {
                gpu: GpuSpec::a100_80gb(),
                peak_flops: 312e12,
                bandwidth: 2.039e12,
                nvlink: 300e9,
                pcie: 32e9,
            }),
            // H100 SXM5 80GB: 989.4 TFLOP/s bf16 dense, 3.35 TB/s HBM3, NVLink 4 900 GB/s and
            // PCIe 5 x16 128 GB/s (both directions together).
            "h100" => Some(Self {
                gpu: GpuSpec::h100_80gb(),
                peak_flops: 989.4e12,
                bandwidth: 3.35e12,
                nvlink: 450e9,
                pcie: 64e9,
            }),
            // H200 SXM 141GB: 989.4 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, NVLink 4 900 GB/s and
            // PCIe 5 x16 128 GB/s (both directions together).
            "h200" => Some(Self {
                gpu: GpuSpec::h200(),
                peak_flops: 989.4e12,
                bandwidth: 4.8e12,
                nvlink: 450e9,
                pcie: 64e9,
            }),
            _ => None,
        }
    }
}

/// GPU names [`Datasheet::named`] knows.
pub const ROOFLINE_GPUS: &[&str] = &["a100", "h100", "h200"];
/// Model names [`model_named`] knows.
pub const ROOFLINE_MODELS: &[&str] = &["llama2-7b", "llama3-8b", "llama3-70b"];

/// A model shape by name: `llama2-7b`, `llama3-8b`, `llama3-70b`.
pub fn model_named(name: &str) -> Option<ModelSpec> {
    match name {
        "llama2-7b" => Some(ModelSpec::llama2_7b()),
        "llama3-8b" => Some(ModelSpec::llama3_8b()),
        "llama3-70b" => Some(ModelSpec::llama3_70b()),
        _ => None,
    }
}

/// A model shape by name (`llama2-7b`, `llama3-8b`, `llama3-70b`), or from a JSON file:
/// a Hugging Face `config.json` (named after its folder) or infersched's own model spec.
pub fn resolve_model(spec: &str) -> Result<ModelSpec, String> {
    if let Some(m) = model_named(spec) {
        return Ok(m);
    }
    let path = std::path::Path::new(spec);
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "\"{spec}\": neither a known model ({}) nor a readable JSON file: {e}",
            ROOFLINE_MODELS.join(", ")
        )
    })?;
    if let Ok(m) = serde_json::from_str::<ModelSpec>(&text) {
        return Ok(m);
    }
    let name = path
        .parent()
        .and_then(|p| p.file_name())
        .or_else(|| path.file_stem())
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
    crate::hf_config::model_from_hf_config(&text, &name).map_err(|e| format!("{spec}: {e}"))
}

/// The roofline coefficients of `model` on `sheet` with tensor parallelism `tp` over
/// NVLink.
pub fn roofline(model: &ModelSpec, sheet: &Datasheet, tp: u32) -> LinearCostModel {
    roofline_over(model, sheet, tp, Link::NvLink)
}

/// NCCL's latency of one ring all-reduce among `tp` GPUs over `link` (seconds): its
/// tuning model's base latency and per-step hardware latency for the LL protocol, the
/// least of its protocols (`src/graph/tuning.cc`: ring LL base 6.6 us, 0.6 us per step
/// over NVLink and 1.0 us over PCIe), `2 (tp - 1)` steps; 0 at `tp = 1`.
pub fn all_reduce_latency_s(tp: u32, link: Link) -> f64 {
    if tp <= 1 {
        return 0.0;
    }
    let per_step_us = match link {
        Link::NvLink => 0.6,
        Link::Pcie => 1.0,
    };
    (6.6 + 2.0 * f64::from(tp - 1) * per_step_us) * 1e-6
}

/// The latency of one send/recv between two GPUs over `link` (seconds), by the same
/// tuning model as [`all_reduce_latency_s`]: the LL base latency and one step's hardware
/// latency (7.2 us over NVLink, 7.6 us over PCIe). An estimate, not a measurement.
pub fn send_recv_latency_s(link: Link) -> f64 {
    let per_step_us = match link {
        Link::NvLink => 0.6,
        Link::Pcie => 1.0,
    };
    (6.6 + per_step_us) * 1e-6
}

/// The roofline coefficients of `model` on `sheet` with tensor parallelism `tp`, its
/// all-reduces over `link`.
pub fn roofline_over(model: &ModelSpec, sheet: &Datasheet, tp: u32, link: Link) -> LinearCostModel {
    roofline_with(model, sheet, tp, link, false)
}

/// [`roofline_over`], and with `nccl_latency` each batch also pays the latency of its
/// `2 x layers` all-reduces as NCCL's tuning model gives it ([`all_reduce_latency_s`]; in
/// `one`): a launch and link cost per step that grows with the TP degree, so no longer
/// a lower bound (spec suffix `:nccl`).
pub fn roofline_with(
    model: &ModelSpec,
    sheet: &Datasheet,
    tp: u32,
    link: Link,
    nccl_latency: bool,
) -> LinearCostModel {
    let t = f64::from(tp.max(1));
    let h = f64::from(model.hidden);
    let q = f64::from(model.heads) * f64::from(model.head_dim);
    let kv = f64::from(model.kv_heads) * f64::from(model.head_dim);
    let f = f64::from(model.mlp_hidden);
    let b = f64::from(model.dtype_bytes);
    let layer_params = h * q + 2.0 * h * kv + q * h + 3.0 * h * f + 2.0 * h;
    let ms = 1e3;
    let mut theta = BTreeMap::new();
    let latency = if nccl_latency {
        2.0 * all_reduce_latency_s(tp, link)
    } else {
        0.0
    };
    theta.insert(
        "one".to_string(),
        (layer_params * b / t / sheet.bandwidth + latency) * ms,
    );
    let communication = all_reduce_s_per_token(model, tp, sheet.link_bandwidth(link));
    theta.insert(
        "tokens".to_string(),
        (2.0 * layer_params / t / sheet.peak_flops + communication) * ms,
    );
    let kv_read = 2.0 * kv * b / t / sheet.bandwidth * ms;
    theta.insert("decode_kv".to_string(), kv_read);
    theta.insert("prefill_ctx".to_string(), kv_read);
    theta.insert(
        "prefill_attn".to_string(),
        2.0 * q / t / sheet.peak_flops * ms,
    );
    let name = format!(
        "roofline:{}:{}{}{}",
        sheet.gpu.name,
        model.name,
        match (tp > 1, link) {
            (false, _) => String::new(),
            (true, Link::NvLink) => format!(":tp{tp}"),
            (true, Link::Pcie) => format!(":tp{tp}:pcie"),
        },
        if nccl_latency && tp > 1 { ":nccl" } else { "" }
    );
    let over = if tp > 1 {
        format!(
            ", two all-reduces per layer over {} at {:.0} GB/s per direction{}",
            link.name(),
            sheet.link_bandwidth(link) / 1e9,
            if nccl_latency {
                format!(
                    ", each {:.1} us of NCCL latency",
                    all_reduce_latency_s(tp, link) * 1e6
                )
            } else {
                String::new()
            }
        )
    } else {
        String::new()
    };
    let file = CoefficientFile {
        format: COST_MODEL_FORMAT.to_string(),
        name: name.clone(),
        description: format!(
            "Roofline bound of {} on {} (TP {tp}): weights and KV reads at {:.0} GB/s, GEMM and attention FLOPs at {:.1} TFLOP/s bf16{over}",
            model.name,
            sheet.gpu.name,
            sheet.bandwidth / 1e9,
            sheet.peak_flops / 1e12
        ),
        unit: TimeUnit::Ms,
        per_layer: true,
        layers: Some(model.layers),
        theta,
        model: Some(model.clone()),
        gpu: Some(sheet.gpu.clone()),
        tensor_parallel: tp.max(1),
        provenance: Provenance {
            method: "roofline".into(),
            source: "GPU datasheet peak bf16 FLOP/s, memory and NVLink/PCIe bandwidth; model shape"
                .into(),
            notes: Some(if nccl_latency && tp > 1 {
                "GEMMs and attention at peak, with NCCL's latency of every all-reduce (src/graph/tuning.cc, ring LL): not a lower bound".into()
            } else {
                "a lower bound on kernel time: no launch overheads, GEMMs and attention at peak"
                    .into()
            }),
            fit: None,
        },
    };
    LinearCostModel::from_file(file, Path::new(&name))
        .expect("roofline coefficients are finite and non-negative")
}

/// One reference batch timed by a cost model and by the roofline of its model and GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflineCheck {
    /// The batch, for people.
    pub batch: &'static str,
    /// The cost model's time (s).
    pub model_s: f64,
    /// The roofline's time (s): no real kernel can be faster.
    pub roofline_s: f64,
}

impl RooflineCheck {
    /// Whether the cost model predicts a time below the physical floor.
    pub fn faster_than_physics(&self) -> bool {
        self.model_s < self.roofline_s
    }
}

/// The reference batches of [`check_against_roofline`]: a decode step of 1 and of 64
/// requests at 1,024 tokens of context, and a 512-token prefill.
pub fn reference_batches() -> Vec<(&'static str, infersched_core::BatchFeatures)> {
    use infersched_core::BatchFeatures;
    let mut one = BatchFeatures::default();
    one.add_decode(1024);
    let mut many = BatchFeatures::default();
    for _ in 0..64 {
        many.add_decode(1024);
    }
    let mut prefill = BatchFeatures::default();
    prefill.add_prefill(512, 0);
    vec![
        ("decode step of 1 request (context 1,024)", one),
        ("decode step of 64 requests (context 1,024)", many),
        ("prefill of 512 tokens", prefill),
    ]
}

/// The datasheet of the GPU a cost model names (`a100`, `a100-80gb`, `h100`, ...).
pub fn datasheet_of(gpu: &GpuSpec) -> Option<Datasheet> {
    let lower = gpu.name.to_lowercase();
    ROOFLINE_GPUS
        .iter()
        .find(|g| lower.starts_with(*g))
        .and_then(|g| Datasheet::named(g))
}

/// Times [`reference_batches`] with `m` and with the roofline of its model, GPU and tensor
/// parallelism; `None` when the file names no model or no GPU with a known datasheet.
pub fn check_against_roofline(m: &LinearCostModel) -> Option<Vec<RooflineCheck>> {
    use infersched_core::CostModel;
    let model = m.file.model.as_ref()?;
    let sheet = datasheet_of(m.file.gpu.as_ref()?)?;
    let floor = roofline(model, &sheet, m.file.tensor_parallel);
    Some(
        reference_batches()
            .into_iter()
            .map(|(batch, f)| RooflineCheck {
                batch,
                model_s: m.batch_time_s(&f),
                roofline_s: floor.batch_time_s(&f),
            })
            .collect(),
    )
}

/// The warning for a cost model that predicts less time than its GPU's datasheet allows
/// on some reference batch (None where it never does, or names no model and known GPU).
pub fn physics_warning(m: &LinearCostModel) -> Option<String> {
    let bad: Vec<&str> = check_against_roofline(m)?
        .iter()
        .filter(|c| c.faster_than_physics())
        .map(|c| c.batch)
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "{} predicts less time than its GPU's datasheet allows for: {}. Its times are not physically attainable on that GPU; use it to reproduce the results it was published with, and a calibrated preset for predictions.",
            m.name,
            bad.join("; ")
        )
    })
}

/// Parses `roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]]`; `Ok(None)` if `spec` is not a
/// roofline spec.
pub fn parse_roofline(spec: &str) -> Result<Option<LinearCostModel>, String> {
    let Some(rest) = spec.strip_prefix("roofline:") else {
        return Ok(None);
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let usage = || {
        format!(
            "\"{spec}\": expected roofline:GPU:MODEL[:tpN[:nvlink|pcie[:nccl]]] with GPU one of {} and MODEL one of {} or a Hugging Face config.json",
            ROOFLINE_GPUS.join(", "),
            ROOFLINE_MODELS.join(", ")
        )
    };
    if !(2..=5).contains(&parts.len()) {
        return Err(usage());
    }
    let sheet = Datasheet::named(parts[0]).ok_or_else(usage)?;
    let model = if parts[1].ends_with(".json") {
        resolve_model(parts[1])?
    } else {
        model_named(parts[1]).ok_or_else(usage)?
    };
    let tp = match parts.get(2) {
        None => 1,
        Some(p) => {
            let tp = p
                .strip_prefix("tp")
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    format!(
                        "\"{spec}\": the third part must be tpN with N from 1 to {}",
                        model.heads
                    )
                })?;
            model
                .check_tensor_parallel(tp)
                .map_err(|e| format!("\"{spec}\": {e}"))?;
            tp
        }
    };
    let link = match parts.get(3) {
        None => Link::NvLink,
        Some(l) => Link::parse(l).ok_or_else(|| {
            format!(
                "\"{spec}\": the fourth part must be nvlink or pcie, the link of the all-reduces"
            )
        })?,
    };
    let nccl = match parts.get(4) {
        None => false,
        Some(&"nccl") => true,
        Some(_) => {
            return Err(format!(
                "\"{spec}\": the fifth part must be nccl (NCCL's latency of every all-reduce)"
            ));
        }
    };
    Ok(Some(roofline_with(&model, &sheet, tp, link, nccl)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use infersched_core::{BatchFeatures, CostModel};

    #[test]
    fn the_published_a100_preset_is_faster_than_physics_and_calibrations_are_not() {
        // InferMax's llama2-7b-a100 decodes one request in ~3 ms; reading 13.5 GB of weights
        // at 2.039 TB/s takes ~6.6 ms.
        let checks = check_against_roofline(&crate::preset("llama2-7b-a100").unwrap()).unwrap();
        assert_eq!(checks.len(), 3);
        assert!(checks[0].faster_than_physics(), "{checks:?}");
        assert!((checks[0].roofline_s * 1e3 - 6.6).abs() < 0.3, "{checks:?}");
        // Measured presets respect their GPU's floor on every reference batch (a TP shard's
        // floor is its share of the model's work).
        for name in crate::PRESET_NAMES.iter().filter(|n| !n.ends_with("a100")) {
            let checks = check_against_roofline(&crate::preset(name).unwrap()).unwrap();
            for c in &checks {
                assert!(!c.faster_than_physics(), "{name}: {c:?}");
                // ... and within 4x of it (kernels reach a fair share of the datasheet).
                assert!(c.model_s < 4.0 * c.roofline_s, "{name}: {c:?}");
            }
        }
        // A roofline is exactly its own floor; a file without a GPU has no check.
        let r = parse_roofline("roofline:h100:llama3-8b").unwrap().unwrap();
        for c in check_against_roofline(&r).unwrap() {
            assert!((c.model_s - c.roofline_s).abs() <= 1e-15 && !c.faster_than_physics());
        }
    }

    #[test]
    fn decode_of_one_request_is_the_weight_read() {
        let m = parse_roofline("roofline:h200:llama2-7b").unwrap().unwrap();
        // Llama-2-7B layer: 4 * 4096^2 + 3 * 4096 * 11008 + 2 * 4096 = 202,383,360 params.
        let layer_bytes = 202_383_360.0 * 2.0;
        let mut f = BatchFeatures::default();
        f.add_decode(1);
        let t = m.batch_time_s(&f);
        let weights = 32.0 * layer_bytes / 4.8e12;
        let gemm = 32.0 * 2.0 * 202_383_360.0 / 989.4e12;
        let kv = 32.0 * 2.0 * 4096.0 * 2.0 / 4.8e12;
        assert!((t - (weights + gemm + kv)).abs() < 1e-12, "{t}");
        // About 2.7 ms: the memory-bound decode of a 13.5 GB model at 4.8 TB/s.
        assert!((t * 1e3 - 2.70).abs() < 0.02, "{}", t * 1e3);
    }

    #[test]
    fn long_prefill_is_compute_bound_and_tp_divides_the_work_but_adds_its_all_reduces() {
        let one = parse_roofline("roofline:a100:llama3-8b").unwrap().unwrap();
        let four = parse_roofline("roofline:a100:llama3-8b:tp4")
            .unwrap()
            .unwrap();
        let mut f = BatchFeatures::default();
        f.add_prefill(4096, 0);
        let (t1, t4) = (one.batch_time_s(&f), four.batch_time_s(&f));
        // A quarter of the compute per GPU, plus 4,096 tokens' all-reduces in 32 layers over
        // NVLink 3 (300 GB/s per direction): TP 4 is not 4x faster for free.
        let model = model_named("llama3-8b").unwrap();
        let comm = 4096.0 * 32.0 * all_reduce_s_per_token(&model, 4, 300e9);
        assert!((t4 - (t1 / 4.0 + comm)).abs() < 1e-12, "{t4} {t1} {comm}");
        assert!(t1 / t4 < 3.9 && t1 / t4 > 3.0, "{}", t1 / t4);
        // 8B-class model: ~2 * 7e9 FLOPs per token; 4096 tokens at 312 TFLOP/s ~ 0.18 s.
        assert!(t1 > 0.15 && t1 < 0.3, "{t1}");
        assert_eq!(four.file.tensor_parallel, 4);
        assert_eq!(one.file.provenance.method, "roofline");
    }

    #[test]
    fn tensor_parallel_pays_two_ring_all_reduces_per_layer_over_its_link() {
        let model = model_named("llama3-70b").unwrap();
        let sheet = Datasheet::named("h100").unwrap();
        let tokens = |m: &LinearCostModel| m.file.theta["tokens"];
        // TP 1 communicates nothing: the tokens term is the GEMM FLOPs alone.
        let one = roofline(&model, &sheet, 1);
        let gemm_ms = tokens(&one);
        // TP 8 over NVLink 4: 2 all-reduces x 2 (7 / 8) x 8,192 x 2 bytes / 450 GB/s per
        // token and layer, 0.1274 us, beside an eighth of the GEMMs.
        let eight = roofline(&model, &sheet, 8);
        let comm_ms: f64 = 2.0 * 2.0 * 7.0 / 8.0 * 8192.0 * 2.0 / 450e9 * 1e3;
        assert!((comm_ms - 1.274e-4).abs() < 1e-7, "{comm_ms}");
        assert!((tokens(&eight) - (gemm_ms / 8.0 + comm_ms)).abs() < 1e-12);
        // PCIe 5 (64 GB/s per direction) is 7x slower for the same bytes, and the spec says so.
        let pcie = parse_roofline("roofline:h100:llama3-70b:tp8:pcie")
            .unwrap()
            .unwrap();
        let pcie_comm = tokens(&pcie) - gemm_ms / 8.0;
        assert!((pcie_comm / comm_ms - 450.0 / 64.0).abs() < 1e-9);
        assert_eq!(pcie.name, "roofline:h100-80gb:llama3-70b:tp8:pcie");
        assert_eq!(
            parse_roofline("roofline:h100:llama3-70b:tp8")
                .unwrap()
                .unwrap()
                .file
                .theta,
            eight.file.theta
        );
        // Nothing else changes with the link.
        for f in ["one", "decode_kv", "prefill_ctx", "prefill_attn"] {
            assert_eq!(pcie.file.theta[f], eight.file.theta[f], "{f}");
        }
        assert_eq!(all_reduce_s_per_token(&model, 1, 450e9), 0.0);
        let err = parse_roofline("roofline:h100:llama3-70b:tp8:infiniband").unwrap_err();
        assert!(err.contains("fourth part must be nvlink or pcie"), "{err}");
        assert!(parse_roofline("roofline:h100:llama3-70b:tp8:pcie:x").is_err());
        assert!(parse_roofline("roofline:h100:llama3-70b:tp8:pcie:nccl:x").is_err());
    }

    #[test]
    fn nccl_latency_adds_each_all_reduce_launch_to_every_batch() {
        let spec = "roofline:h100:llama3-8b:tp4:nvlink:nccl";
        let with = parse_roofline(spec).unwrap().unwrap();
        let without = parse_roofline("roofline:h100:llama3-8b:tp4")
            .unwrap()
            .unwrap();
        // Per layer, two all-reduces of 6.6 + 2 x 3 x 0.6 = 10.2 us each (NCCL's ring LL).
        let per_layer_ms = with.file.theta["one"] - without.file.theta["one"];
        assert!(
            (per_layer_ms - 2.0 * 10.2e-3).abs() < 1e-12,
            "{per_layer_ms}"
        );
        assert!((all_reduce_latency_s(4, Link::Pcie) - 12.6e-6).abs() < 1e-15);
        assert_eq!(all_reduce_latency_s(1, Link::NvLink), 0.0);
        for f in ["tokens", "decode_kv", "prefill_ctx", "prefill_attn"] {
            assert_eq!(with.file.theta[f], without.file.theta[f], "{f}");
        }
        assert_eq!(with.name, "roofline:h100-80gb:llama3-8b:tp4:nccl");
        // A decode of one request: 32 layers x 20.4 us = 0.65 ms more per batch.
        let mut one = BatchFeatures::default();
        one.add_decode(100);
        let extra = with.batch_time_s(&one) - without.batch_time_s(&one);
        assert!((extra - 32.0 * 20.4e-6).abs() < 1e-12, "{extra}");
        // TP 1 has no all-reduce to pay for.
        let tp1 = parse_roofline("roofline:h100:llama3-8b:tp1:nvlink:nccl")
            .unwrap()
            .unwrap();
        assert_eq!(
            tp1.file.theta,
            roofline(
                &model_named("llama3-8b").unwrap(),
                &Datasheet::named("h100").unwrap(),
                1
            )
            .file
            .theta
        );
        let err = parse_roofline("roofline:h100:llama3-8b:tp4:nvlink:gloo").unwrap_err();
        assert!(err.contains("fifth part must be nccl"), "{err}");
    }

    #[test]
    fn tensor_parallel_degrees_vllm_would_reject_are_refused() {
        // Llama-3-8B: 32 heads, 8 KV heads.
        for (spec, expect) in [
            ("roofline:a100:llama3-8b:tp4294967295", "does not divide"),
            ("roofline:a100:llama3-8b:tp3", "does not divide"),
            (
                "roofline:a100:llama3-8b:tp99999999999",
                "tpN with N from 1 to 32",
            ),
            ("roofline:a100:llama3-8b:tp0", "tpN with N from 1 to 32"),
        ] {
            let e = parse_roofline(spec).unwrap_err();
            assert!(e.contains(expect), "{spec}: {e}");
        }
        assert!(parse_roofline("roofline:a100:llama3-8b:tp16").is_ok());
    }

    #[test]
    fn bad_specs_say_what_is_expected() {
        assert!(parse_roofline("llama2-7b-a100").unwrap().is_none());
        for bad in [
            "roofline:h300:llama2-7b",
            "roofline:h200:gpt5",
            "roofline:h200",
            "roofline:h200:llama2-7b:tp0",
            "roofline:h200:llama2-7b:x",
        ] {
            let e = parse_roofline(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
