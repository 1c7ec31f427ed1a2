//! infersched
