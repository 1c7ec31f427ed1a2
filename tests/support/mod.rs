//! Test support shared by the cross-crate tests.

pub mod exhaustive;
