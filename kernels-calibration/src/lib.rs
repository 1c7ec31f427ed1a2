//! Cost-model calibration by timing a transformer layer's real kernels on an NVIDIA GPU
//! (`docs/design/calibration.md`).
//!
//! * [`plan`]: what is measured: the token-linear work of a layer for N tokens, decode
//!   attention, chunked causal prefill attention, and composite mixed batches kept for
//!   validation; each measurement knows the batch features it stands for.
//! * [`gpu`]: runs the measurements with cudarc (cuBLAS GEMMs in bf16, NVRTC kernels for
//!   RMSNorm, RoPE, SiLU-and-multiply, residual adds, KV append and attention), timed with
//!   CUDA events. CUDA libraries are loaded at run time: without a driver,
//!   [`gpu::check_libraries`] returns [`gpu::GpuError::NoDriver`] and nothing panics.
//! * [`samples`]: `samples.csv`, the NNLS fit of the coefficients (the same fit as
//!   `infersched fit`) and validation on the composite batches (R^2, APE).
//! * [`schedule`]: a schedule's batches run in order over one paged KV cache that
//!   persists from batch to batch, each batch timed through all the model's layers.
//! * [`kernels`]: the CUDA C source.

pub mod gpu;
pub mod kernels;
pub mod plan;
pub mod samples;
pub mod schedule;

pub use gpu::{GpuError, GpuInfo, LayerRunner, check_libraries, probe};
pub use plan::{Group, Measurement, PlanLimits, plan};
pub use samples::{Calibration, Sample, calibrate};
