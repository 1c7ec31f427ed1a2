//! Why a trace file could not be read or written.

use infersched_core::WorkloadError;
use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Why a trace file could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Read or write failure.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// A header, row or value is wrong.
    #[error("{path}: {location}: {reason}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// `header`, `line N` or `line N, column X`.
        location: String,
        /// What was expected.
        reason: String,
    },
    /// The rows are well-formed but do not make a workload.
    #[error("{path}: {source}")]
    Workload {
        /// File.
        path: PathBuf,
        /// Cause.
        source: WorkloadError,
    },
}
