//! Batch-time cost models for infersched.
//!
//! * [`LinearCostModel`]: `t(batch) = sum_k theta_k * phi_k(batch)` over the features of
//!   `semantics.md`, read from and written to coefficient files
//!   (`infersched-cost-model/1` JSON, with units and provenance).
//! * [`presets`]: the published InferMax coefficients (`llama2-7b-a100`,
//!   `llama3-70b-tp4-a100`), embedded from `notebooks-data/cost-models/`.
//! * [`roofline`]: first-order coefficients from a model shape and a GPU datasheet
//!   (`roofline:h200:llama2-7b`).
//! * [`hardware`]: model and GPU specs, bytes per KV token, and the KV capacity M.
//! * [`fit`]: non-negative least squares from a samples CSV (or Vidur's `mlp.csv`),
//!   with R^2 and absolute-percentage-error statistics.

pub mod breakdown;
pub mod fit;
pub mod fit_file;
pub mod hardware;
pub mod hf_config;
pub mod linear;
pub mod presets;
pub mod roofline;

pub use breakdown::{TERM_NAMES, TimeBreakdown};
pub use fit::{FitError, FitReport, FitStats, Samples, fit_nnls, nnls};
pub use fit_file::{FitInput, InputFit, fit_coefficient_file};
pub use hardware::{
    DEFAULT_GPU_MEMORY_UTILIZATION, GpuSpec, HardwareError, ModelSpec, kv_capacity_tokens,
};
pub use linear::{CoefficientFile, CostModelError, LinearCostModel, Provenance, TimeUnit};
pub use presets::{PRESET_NAMES, preset, resolve};
pub use roofline::{Datasheet, RooflineCheck, check_against_roofline, parse_roofline, roofline};
