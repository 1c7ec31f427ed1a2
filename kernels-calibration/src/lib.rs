//! kernels-calibration
