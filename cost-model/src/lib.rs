//! cost-model
