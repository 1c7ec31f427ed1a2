//! The package's exceptions and how library errors and panics become them.

use infersched::core::names::Named;
use pyo3::exceptions::{PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _infersched,
    InferschedError,
    PyValueError,
    "Bad input or a failed run: the message names the file, row, field or flag and what was expected."
);
pyo3::create_exception!(
    _infersched,
    SolveInterrupted,
    PyKeyboardInterrupt,
    "Ctrl-C during solve(): `.args[1]` holds the best schedule found so far, replayed (a Run, not proven optimal), or None."
);

/// Any error of the library as an `InferschedError` with its full chain of causes.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    InferschedError::new_err(e.to_string())
}

/// Runs `f`, turning a panic (a bug: the library refuses bad input with errors) into an
/// `InferschedError` instead of letting it cross into Python.
pub(crate) fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Err(err(format!("internal error (please report it): {what}")))
    })
}

pub(crate) fn named<T: Named>(what: &str, name: &str) -> PyResult<T> {
    T::from_name(name).ok_or_else(|| {
        err(format!(
            "{what}: unknown name {name:?}; expected one of {}",
            T::NAMES.join(", ")
        ))
    })
}
