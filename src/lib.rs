//! infersched: provably optimal batch schedules for LLM inference serving, and the
//! schedulers real systems use, measured through one independent replay.
//!
//! This crate is the library facade and the `infersched` binary. The parts:
//! * [`core`]: requests, limits, schedules, the replay/validator and metrics;
//! * [`workload`]: traces, synthetic workloads, sampling;
//! * [`cost_model`]: linear batch-time models, presets, fitting;
//! * [`schedulers`], [`solver`], [`kernels_calibration`]: heuristic policies, the MILP,
//!   GPU calibration;
//! * [`produce`]: the one path from a scheduler (heuristic or solver) to its replayed
//!   schedule and metrics, used by every command;
//! * [`compare`] and [`report`]: several schedulers on one setting, the comparison table,
//!   plots (SVG and PNG), Chrome traces and `report.html`;
//! * [`calibration`]: `calibrate`'s fit, validation and output files (also from recorded samples);
//! * [`sweep`]: grids of settings from a TOML spec, `results.csv`, plots per parameter;
//! * [`cluster`]: a cluster's files (`routing.csv`, a folder per replica) and its load table;
//! * [`ceiling`]: a request rate at which no schedule meets a set of SLOs (from the bounds);
//! * [`capacity`]: the highest request rate at which each scheduler meets a set of SLOs;
//! * [`goodput`]: the most requests meeting their SLOs that a schedule found reaches;
//! * [`constrained`]: an objective minimized over the schedules meeting a set of SLOs;
//!
//! Features (all on by default): `png` (PNG copies of plots, resvg), `sweep` (the sweep
//! module: toml, indicatif), `calibrate` (the GPU calibration: the kernels crate and the
//! [`calibration`] module), `cli` (all three, plus Ctrl-C handling; the binary needs it).
//! With `default-features = false` the library is the solver, replay, compare and SVG
//! reports.
//!
//! * [`settings`]: M, vLLM's block count and `max_model_len` as every front end reads them;
//! * [`output`]: the files and text a replay produces (`requests.csv`, `batches.csv`,
//!   `summary.json`).
//!
//! ```
//! use infersched::core::{replay, Entry, Batch, Limits, Request, Schedule, Summary, Workload};
//! let workload = Workload::new(vec![Request { input_tokens: 4, output_tokens: 2, arrival_s: 0.0 }]).unwrap();
//! let schedule = Schedule::new(vec![
//!     Batch::new(vec![Entry::process(0, 4)]), // prefill: generates token 1
//!     Batch::new(vec![Entry::process(0, 1)]), // decode: generates token 2
//! ]);
//! let cost = infersched::cost_model::preset("llama2-7b-a100").unwrap();
//! let r = replay(&workload, &Limits::unlimited(), &cost, &schedule).unwrap();
//! let s = Summary::from_replay(&r);
//! assert_eq!(s.batches, 2);
//! assert!(s.makespan_s > 0.0);
//! ```

pub use infersched_core as core;
pub use infersched_cost_model as cost_model;
#[cfg(feature = "calibrate")]
pub use infersched_kernels_calibration as kernels_calibration;
pub use infersched_schedulers as schedulers;
pub use infersched_solver as solver;
pub use infersched_workload as workload;

#[cfg(feature = "calibrate")]
pub mod calibration;
pub mod capacity;
pub mod ceiling;
pub mod cluster;
pub mod compare;
pub mod constrained;
pub mod cost_models;
pub mod goodput;
#[cfg(feature = "calibrate")]
pub mod gpu_replay;
#[cfg(feature = "cli")]
pub mod interrupt;
pub mod output;
pub mod produce;
pub mod report;
pub mod resources;
pub mod settings;
#[cfg(feature = "sweep")]
pub mod sweep;
