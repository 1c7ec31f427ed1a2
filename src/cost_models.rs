//! The cost model every command uses by default, and the warning for cost models faster
//! than physics.

use crate::cost_model::{self, CostModelError, LinearCostModel};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The cost model used when none is named: Llama-3-8B on one H100 with FlashAttention-2,
/// calibrated on the GPU (held-out median error 1.3%). `llama2-7b-a100` (InferMax's
/// published coefficients, faster than physics on small decodes) stays available by name.
pub const DEFAULT_COST_MODEL: &str = "llama3-8b-h100-fa2";

/// Cost models already warned about in this process.
static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Prints (to stderr, once per process and cost model) that `m` predicts less time than
/// its GPU allows, where it does.
pub fn warn_if_unphysical(m: &LinearCostModel) {
    let Some(text) = cost_model::roofline::physics_warning(m) else {
        return;
    };
    let first = WARNED
        .lock()
        .map(|mut w| w.insert(m.name.clone()))
        .unwrap_or(true);
    if first {
        eprintln!("warning: {text}");
    }
}

/// [`cost_model::resolve`], warning once where the model is faster than physics.
pub fn resolve(spec: &str) -> Result<LinearCostModel, CostModelError> {
    let m = cost_model::resolve(spec)?;
    warn_if_unphysical(&m);
    Ok(m)
}
