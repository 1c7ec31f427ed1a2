//! The optimal scheduler (placeholder for the MILP of `milp.md`).
