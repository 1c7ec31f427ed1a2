//! Pipeline parallelism (semantics.md, "Pipeline parallelism"): a replica's layers split
//! into `P` stages on `P` GPUs, a batch flowing through them in order, up to `P` batches
//! in flight (vLLM V1's batch queue of `max_concurrent_batches = P`).
//!
//! [`Pipeline`] says how many stages and what a stage boundary costs; [`PipelineClock`]
//! times batches through the stages. With one stage the clock is today's sequential
//! machine, bit for bit: a batch starts when the previous one ends (or later) and lasts
//! its cost model's time.

use std::collections::VecDeque;
use thiserror::Error;

/// The most pipeline stages a replica may have.
pub const MAX_STAGES: u32 = 64;

/// A replica's pipeline: `stages` GPUs each running `1 / stages` of the layers, and what
/// moving a batch's activations from one stage to the next costs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pipeline {
    /// P, the number of stages (1: no pipeline parallelism).
    pub stages: u32,
    /// Fixed time of one send/recv between consecutive stages (seconds).
    pub send_latency_s: f64,
    /// Time per token of the batch of one send/recv (seconds): the activations' bytes per
    /// token over the link's bandwidth.
    pub send_s_per_token: f64,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::none()
    }
}

/// Why a pipeline is not valid.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum PipelineError {
    /// The stage count is out of range.
    #[error("--pp: the pipeline stages must be from 1 to {MAX_STAGES}, got {0}")]
    Stages(u32),
    /// A send/recv figure is negative or not finite.
    #[error("--pp: the stage-to-stage {field} must be a finite number >= 0, got {value}")]
    Send {
        /// Which figure.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// More stages than the model has layers.
    #[error("--pp {stages}: the model has only {layers} layers (each stage needs at least one)")]
    MoreStagesThanLayers {
        /// P.
        stages: u32,
        /// The model's layers.
        layers: u32,
    },
}

impl Pipeline {
    /// One stage: no pipeline parallelism.
    pub const fn none() -> Self {
        Self {
            stages: 1,
            send_latency_s: 0.0,
            send_s_per_token: 0.0,
        }
    }

    /// Whether this is more than one stage.
    pub fn is_pipelined(&self) -> bool {
        self.stages > 1
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), PipelineError> {
        if !(1..=MAX_STAGES).contains(&self.stages) {
            return Err(PipelineError::Stages(self.stages));
        }
        for (field, value) in [
            ("latency", self.send_latency_s),
            ("time per token", self.send_s_per_token),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(PipelineError::Send { field, value });
            }
        }
        Ok(())
    }

    /// One send/recv of a batch of `tokens` tokens between consecutive stages.
    pub fn send_s(&self, tokens: u64) -> f64 {
        self.send_latency_s + self.send_s_per_token * tokens as f64
    }
}

/// Times batches through a [`Pipeline`], in order. Batch `k`'s stage `s` starts when its
/// stage `s - 1` has ended and its activations have arrived (one send/recv), and stage
/// `s` has ended batch `k - 1`; each stage takes `1 / P` of the batch's time. Batch `k`
/// starts (stage 0) no earlier than batch `k - P` has completed (at most `P` in flight).
#[derive(Debug, Clone)]
pub struct PipelineClock {
    pipeline: Pipeline,
    /// When each stage ends the last batch it ran (0 before any).
    stage_ends: Vec<f64>,
    /// The completions of the last `P` batches, oldest first.
    completions: VecDeque<f64>,
}

impl PipelineClock {
    /// A clock before any batch.
    pub fn new(pipeline: Pipeline) -> Self {
        let p = pipeline.stages.max(1) as usize;
        Self {
            pipeline,
            stage_ends: vec![0.0; p],
            completions: VecDeque::with_capacity(p),
        }
    }

    /// The pipeline it times.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The earliest time the next batch can start: stage 0 is free and fewer than `P`
    /// batches are in flight.
    pub fn earliest_start(&self) -> f64 {
        let first_free = self.stage_ends[0];
        if self.completions.len() == self.stage_ends.len() {
            first_free.max(self.completions[0])
        } else {
            first_free
        }
    }

    /// The earliest completion after `t_s` of a batch run so far (one in flight at
    /// `t_s`), if any.
    pub fn next_completion_after(&self, t_s: f64) -> Option<f64> {
        self.completions.iter().copied().find(|&c| c > t_s)
    }

    /// Runs the next batch from `start_s` (at least [`Self::earliest_start`]), lasting
    /// `time_s` on the whole model and processing `tokens` tokens; returns its completion
    /// (the end of its last stage).
    pub fn run(&mut self, start_s: f64, time_s: f64, tokens: u64) -> f64 {
        let p = self.stage_ends.len();
        if p == 1 {
            let end = start_s + time_s;
            self.stage_ends[0] = end;
            self.completions.clear();
            self.completions.push_back(end);
            return end;
        }
        let stage_s = time_s / p as f64;
        let send = self.pipeline.send_s(tokens);
        let mut end = start_s + stage_s;
        self.stage_ends[0] = end;
        for s in 1..p {
            end = (end + send).max(self.stage_ends[s]) + stage_s;
            self.stage_ends[s] = end;
        }
        if self.completions.len() == p {
            self.completions.pop_front();
        }
        self.completions.push_back(end);
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two(send_latency_s: f64) -> PipelineClock {
        PipelineClock::new(Pipeline {
            stages: 2,
            send_latency_s,
            send_s_per_token: 0.0,
        })
    }

    #[test]
    fn one_stage_is_the_sequential_machine() {
        let mut c = PipelineClock::new(Pipeline::none());
        assert_eq!(c.earliest_start(), 0.0);
        assert_eq!(c.run(0.5, 1.25, 10), 1.75);
        assert_eq!(c.earliest_start(), 1.75);
        assert_eq!(c.run(2.0, 0.1, 1), 2.1);
        assert_eq!(c.earliest_start(), 2.1);
    }

    #[test]
    fn two_stages_by_hand() {
        // Batches of 2 s, 0.1 s of send/recv: stage time 1 s.
        let mut c = two(0.1);
        // Batch 0: stage 0 [0, 1], send, stage 1 [1.1, 2.1].
        assert_eq!(c.run(0.0, 2.0, 5), 2.1);
        // Stage 0 is free at 1, one batch in flight: batch 1 may start at 1.
        assert_eq!(c.earliest_start(), 1.0);
        // Batch 1: stage 0 [1, 2], stage 1 from max(2.1, 2.1) to 3.1.
        assert_eq!(c.run(1.0, 2.0, 5), 3.1);
        // Two in flight: batch 2 waits for batch 0's completion (2.1), not stage 0 (2).
        assert_eq!(c.earliest_start(), 2.1);
        // A short batch (0.2 s) waits at stage 1 for batch 1: [3.1, 3.2].
        assert!((c.run(2.1, 0.2, 1) - 3.2).abs() < 1e-12);
        assert!((c.earliest_start() - 3.1).abs() < 1e-12);
    }

    #[test]
    fn sends_scale_with_tokens_and_bad_figures_are_refused() {
        let p = Pipeline {
            stages: 4,
            send_latency_s: 1e-5,
            send_s_per_token: 2e-6,
        };
        assert!((p.send_s(100) - 2.1e-4).abs() < 1e-15);
        // Four stages of 1 s, three sends of 2.1e-4 s.
        let mut c = PipelineClock::new(p);
        assert!((c.run(0.0, 4.0, 100) - (4.0 + 3.0 * 2.1e-4)).abs() < 1e-12);
        assert!(p.validate().is_ok());
        assert_eq!(
            Pipeline { stages: 0, ..p }.validate(),
            Err(PipelineError::Stages(0))
        );
        assert!(Pipeline { stages: 65, ..p }.validate().is_err());
        assert!(
            Pipeline {
                send_latency_s: f64::NAN,
                ..p
            }
            .validate()
            .is_err()
        );
        assert!(
            Pipeline {
                send_s_per_token: -1.0,
                ..p
            }
            .validate()
            .is_err()
        );
    }
}
