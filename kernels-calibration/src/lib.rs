//! Cost-model calibration by timing a transformer layer's real kernels on an NVIDIA GPU
//! (cudarc: cuBLAS, NVRTC, CUDA events). Not built yet (tracked as its own issue); the
//! crate exists so the workspace layout is final and every build covers it.
