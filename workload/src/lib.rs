//! Workloads for infersched.
//!
//! * [`trace`]: read and write Vidur/Splitwise processed-trace CSVs
//!   (`num_prefill_tokens`, `num_decode_tokens`, optional `arrived_at`).
//! * [`synth`]: seeded synthetic workloads: fixed, uniform, zipf and normal lengths;
//!   static, poisson and gamma arrivals.
//! * [`sample`]: take the first N or N random requests of a trace, scale lengths and
//!   time (Vidur's scale factors), trim to a maximum total length, replace arrivals.
//! * [`stats`]: describe a workload.

pub mod error;
pub mod mooncake;
pub mod sample;
pub mod stats;
pub mod synth;
pub mod trace;

pub use sample::{SampleError, SampleSpec, Selection, sample};
pub use stats::{PrefixCacheStats, WorkloadStats};
pub use synth::{
    ArrivalProcess, LengthDist, SpecError, SynthSpec, assign_arrivals, generate,
    reassign_arrivals_in_order,
};
pub use trace::{TraceError, read_trace, read_trace_str, write_trace, write_trace_to};
