//! The one rule of a request's life (`semantics.md`, "Request state"): a request holds `m`
//! KV tokens and has generated `G` of its `O` output tokens; it knows `K = I + G` tokens.
//! Processing `c <= K - m` tokens takes it to `m + c`; reaching `K` generates a token. A
//! step from `m = K - 1` after the first token is a decode, any other a prefill (chunk).
//! Evicting drops `m` to 0 and keeps `G`.
//!
//! The replay, the classification of entries, the solver's policy-class check and chunk
//! merging all step requests through [`RequestState`]; the simulator and the exhaustive
//! test oracle keep their own code on purpose, as independent cross-checks.

use crate::request::Request;

/// Where one request is: KV tokens held and tokens generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestState {
    /// `m`: KV tokens held.
    pub held: u64,
    /// `G`: output tokens generated so far.
    pub generated: u32,
}

/// What one processing entry did to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// A decode step (else a prefill chunk).
    pub decode: bool,
    /// `m` before the step.
    pub before: u64,
    /// `m` after it.
    pub after: u64,
    /// Whether it generated a token (`after` reached `K`).
    pub generates: bool,
}

impl RequestState {
    /// `K = I + G`: the tokens the request knows now.
    pub fn known(&self, r: &Request) -> u64 {
        u64::from(r.input_tokens) + u64::from(self.generated)
    }

    /// Tokens a processing entry may take now: `K - m`.
    pub fn room(&self, r: &Request) -> u64 {
        self.known(r).saturating_sub(self.held)
    }

    /// Whether the next step is a decode: a token generated and all but the last known
    /// token held.
    pub fn is_decode_ready(&self, r: &Request) -> bool {
        self.generated >= 1 && self.held + 1 == self.known(r)
    }

    /// Whether all `O` tokens are generated.
    pub fn finished(&self, r: &Request) -> bool {
        self.generated >= r.output_tokens
    }

    /// Processes `c` tokens (the caller checks `c <= room`, as the replay does; beyond it
    /// the step generates no token) and returns what the step was.
    pub fn process(&mut self, r: &Request, c: u64) -> Step {
        let known = self.known(r);
        let decode = self.is_decode_ready(r);
        let before = self.held;
        let after = before + c;
        let generates = after == known;
        self.held = after;
        if generates {
            self.generated += 1;
        }
        Step {
            decode,
            before,
            after,
            generates,
        }
    }

    /// Evicts: the KV is dropped, the generated tokens are kept (and recomputed later).
    pub fn evict(&mut self) {
        self.held = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_prefills_in_chunks_decodes_and_refills_after_an_eviction() {
        let r = Request {
            input_tokens: 3,
            output_tokens: 3,
            arrival_s: 0.0,
        };
        let mut s = RequestState::default();
        assert_eq!((s.known(&r), s.room(&r)), (3, 3));
        // A chunk of 2, then the last prompt token generates the first output token.
        let a = s.process(&r, 2);
        assert!(!a.decode && !a.generates);
        let b = s.process(&r, 1);
        assert_eq!(
            (b.decode, b.before, b.after, b.generates),
            (false, 2, 3, true)
        );
        // K = 4, m = 3: a decode of one token.
        assert!(s.is_decode_ready(&r));
        let d = s.process(&r, 1);
        assert!(d.decode && d.generates);
        assert_eq!(
            s,
            RequestState {
                held: 4,
                generated: 2
            }
        );
        // Evicted: the refill is a prefill of all I + G = 5 known tokens.
        s.evict();
        assert!(!s.is_decode_ready(&r));
        assert_eq!(s.room(&r), 5);
        let refill = s.process(&r, 5);
        assert!(!refill.decode && refill.generates);
        assert!(s.finished(&r));
    }
}
