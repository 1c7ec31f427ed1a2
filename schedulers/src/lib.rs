//! schedulers
