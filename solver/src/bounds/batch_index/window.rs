//! What one request's entries cost at least inside another request's window of batches,
//! given at most `before` of its entries before the window and at most `after` after it
//! (milp.md, "The batch-index bound").

use infersched_core::{Limits, Request};

use super::super::{Theta, largest_prompt_chunk, prompt_batches};
use infersched_core::Feature;

/// The most a request can have done before a window: prompt tokens processed and tokens
/// generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reach {
    pub(super) processed: u64,
    pub(super) generated: u64,
}

/// One request's least work by where its entries may lie.
pub(super) struct Progress<'a> {
    theta: &'a Theta<'a>,
    request: Request,
    /// The most prompt tokens one entry processes (`min(C, P)`, at most the prompt).
    chunk: u64,
    /// Its prompt's least number of batches.
    prompt_batches: u64,
    /// The prefill flag's surplus over the bias carried by each prompt token.
    surplus_per_token: f64,
}

impl<'a> Progress<'a> {
    pub(super) fn new(theta: &'a Theta<'a>, request: Request, limits: &Limits) -> Self {
        let surplus = (theta.get(Feature::HasPrefill) - theta.get(Feature::HasDecode)).max(0.0);
        let per_batch = largest_prompt_chunk(limits);
        Self {
            theta,
            request,
            chunk: per_batch.min(u64::from(request.input_tokens)).max(1),
            prompt_batches: prompt_batches(&request, limits),
            surplus_per_token: if per_batch == u64::MAX {
                0.0
            } else {
                surplus / per_batch as f64
            },
        }
    }

    /// The fewest batches the request takes part in: its prompt's, then one per later
    /// token.
    pub(super) fn batches(&self) -> u64 {
        self.prompt_batches + u64::from(self.request.output_tokens) - 1
    }

    /// Its arrival (seconds).
    pub(super) fn arrival(&self) -> f64 {
        self.request.arrival_s
    }

    /// The least work of its entries in a window of consecutive batches when it has done at
    /// most `before` before the window and has at most `after` entries after it.
    ///
    /// By the window's end it has generated at least
    /// `O - after` tokens, and where that is none, processed at least `I - (after - O + 1)
    /// chunk` prompt tokens (the entries after it hold the rest of the prompt and `O - 1`
    /// later tokens). The window holds the first processing of the prompt tokens between
    /// (each pays `tokens`, their `prefill_attn` terms add up to at least `p1^2 - p0^2`, one
    /// chunk pays `n_prefill`, each token its share of the prefill flag's surplus) and the
    /// entries generating the tokens between, each at least its least work; these entries
    /// are distinct (a prompt token is first processed before the first token exists, and
    /// every later token comes from its own entry).
    pub(super) fn window_work(&self, before: Reach, after: u64) -> f64 {
        let input = u64::from(self.request.input_tokens);
        let output = u64::from(self.request.output_tokens);
        let (processed_before, generated_before) = (before.processed, before.generated);
        let (processed_by_end, generated_by_end) = if after < output {
            (input, output - after)
        } else {
            let left = (after - output + 1).saturating_mul(self.chunk);
            (input.saturating_sub(left), 0)
        };
        self.prompt_work(processed_before, processed_by_end)
            + self.later_work(generated_before, generated_by_end)
    }

    /// Nothing done.
    pub(super) const NONE: Reach = Reach {
        processed: 0,
        generated: 0,
    };

    /// The most it can have done in `entries` entries: `min(I, entries * chunk)` prompt
    /// tokens and `entries - ch + 1` tokens (`ch` its prompt's batches; one token per entry
    /// after the first).
    pub(super) fn reach_in_entries(&self, entries: u64) -> Reach {
        Reach {
            processed: u64::from(self.request.input_tokens).min(entries.saturating_mul(self.chunk)),
            generated: (entries.saturating_add(1))
                .saturating_sub(self.prompt_batches)
                .min(u64::from(self.request.output_tokens)),
        }
    }

    /// The most it can have done in entries of batches that all lie within `gap` seconds of
    /// its arrival, with batches of at least `bias` each: those entries took at most `gap`
    /// (each at least the bias and its least work).
    pub(super) fn done_in_time(&self, gap: f64, bias: f64) -> Reach {
        let input = u64::from(self.request.input_tokens);
        let output = u64::from(self.request.output_tokens);
        let prompt_time = |p: u64| {
            if p == 0 {
                0.0
            } else {
                p.div_ceil(self.chunk) as f64 * bias + self.prompt_work(0, p)
            }
        };
        let whole_prompt = prompt_time(input);
        if whole_prompt > gap {
            return Reach {
                processed: last_below(input, |p| prompt_time(p) <= gap),
                generated: 0,
            };
        }
        // The prompt and `g - 1` later tokens in time.
        let later_time = |g: u64| whole_prompt + (g - 1) as f64 * bias + self.later_work(1, g);
        Reach {
            processed: input,
            generated: 1 + last_below(output - 1, |k| later_time(k + 1) <= gap),
        }
    }

    /// What one more entry can add to `reach`: a chunk of the prompt (and the first token
    /// with its last), or one token.
    pub(super) fn one_more(&self, reach: Reach) -> Reach {
        let input = u64::from(self.request.input_tokens);
        let output = u64::from(self.request.output_tokens);
        if reach.processed < input {
            let processed = reach.processed.saturating_add(self.chunk).min(input);
            return Reach {
                processed,
                generated: u64::from(processed == input),
            };
        }
        Reach {
            processed: input,
            generated: (reach.generated + 1).min(output),
        }
    }

    /// The least work of processing prompt tokens `p0 + 1 ..= p1` for the first time.
    fn prompt_work(&self, p0: u64, p1: u64) -> f64 {
        if p1 <= p0 {
            return 0.0;
        }
        let (a, b) = (p0 as f64, p1 as f64);
        let t = self.theta;
        t.get(Feature::Tokens) * (b - a)
            + t.get(Feature::PrefillAttn) * (b * b - a * a)
            + t.get(Feature::NPrefill)
            + self.surplus_per_token * (b - a)
    }

    /// The least work of generating tokens `g0 + 1 ..= g1` (the first of them, where it
    /// is token 1, counted with the prompt): token `k + 1` at least `later_token_work(k)`.
    fn later_work(&self, g0: u64, g1: u64) -> f64 {
        let from = g0.max(1);
        if g1 <= from {
            return 0.0;
        }
        // Both ends are at most O - 1 < 2^32.
        self.theta
            .later_tokens_work_between(&self.request, from as u32, (g1 - 1) as u32)
    }
}

/// The largest `x` in `0 ..= most` where `holds` (which holds at 0 and stops holding from
/// some point on).
fn last_below(most: u64, holds: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (0u64, most);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The smaller of two reaches, part by part (each an upper bound, so both hold).
pub(super) fn least_reach(a: Reach, b: Reach) -> Reach {
    Reach {
        processed: a.processed.min(b.processed),
        generated: a.generated.min(b.generated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Reach = Progress::NONE;

    /// A budget of 512 tokens (a prompt of 1,000 in two chunks).
    fn budget_512() -> Limits {
        Limits {
            token_budget: Some(512),
            ..Limits::unlimited()
        }
    }

    fn req(i: u32, o: u32) -> Request {
        Request {
            input_tokens: i,
            output_tokens: o,
            arrival_s: 0.0,
        }
    }

    #[test]
    fn the_whole_request_in_the_window_is_its_least_work_and_surplus() {
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let limits = budget_512();
        let r = req(1000, 7);
        let p = Progress::new(&t, r, &limits);
        assert_eq!(p.batches(), 2 + 6);
        let surplus = (t.get(Feature::HasPrefill) - t.get(Feature::HasDecode)).max(0.0);
        let whole = t.request_work(&r) + surplus * 1000.0 / 512.0;
        assert!((p.window_work(NONE, 0) - whole).abs() < 1e-12);
        // All of it may lie after the window, or before it.
        assert_eq!(p.window_work(NONE, 8), 0.0);
        assert_eq!(p.window_work(p.reach_in_entries(8), 0), 0.0);
    }

    #[test]
    fn what_fits_before_a_window_is_bounded_by_time() {
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let limits = budget_512();
        let r = req(1000, 7);
        let p = Progress::new(&t, r, &limits);
        let b = t.batch_bias();
        // No time: nothing done, one chunk may start.
        assert_eq!(p.done_in_time(0.0, b), NONE);
        let one = p.one_more(NONE);
        assert_eq!((one.processed, one.generated), (512, 0));
        // Just under the first 512 tokens' time: 511 done, then the rest in one chunk.
        let first = b + p.prompt_work(0, 512);
        let done = p.done_in_time(first * 0.999, b);
        assert_eq!((done.processed, done.generated), (511, 0));
        assert_eq!(p.one_more(done).processed, 1000);
        assert_eq!(p.one_more(done).generated, 1);
        // The prompt and two later tokens in time: a third may start.
        let three = 2.0 * b + p.prompt_work(0, 1000) + 2.0 * b + p.later_work(1, 3);
        let done = p.done_in_time(three * 1.001, b);
        assert_eq!((done.processed, done.generated), (1000, 3));
        assert_eq!(p.one_more(done).generated, 4);
        // Forever: everything.
        assert_eq!(p.done_in_time(1e9, b).generated, 7);
        assert_eq!(p.one_more(p.done_in_time(1e9, b)).generated, 7);
    }

    #[test]
    fn entries_outside_the_window_take_the_cheapest_part_each_side() {
        let c = infersched_cost_model::preset("llama2-7b-a100").unwrap();
        let t = Theta(&c);
        let limits = budget_512();
        let r = req(1000, 7);
        let p = Progress::new(&t, r, &limits);
        // Two entries after: tokens 6 and 7 may come after the window.
        let two_after = p.window_work(NONE, 2);
        let expected =
            p.window_work(NONE, 0) - t.later_token_work(&r, 5) - t.later_token_work(&r, 6);
        assert!((two_after - expected).abs() < 1e-12);
        // Seven after: the last prompt chunk too (488 tokens at most 512 each, the first
        // chunk of 488 = 1000 - 512 at least in the window).
        let prompt_only = p.prompt_work(0, 488);
        assert!((p.window_work(NONE, 7) - prompt_only).abs() < 1e-12);
        // One entry before: at most 512 prompt tokens before the window.
        let one_before = p.window_work(p.reach_in_entries(1), 0);
        // (the window still pays one chunk's n_prefill)
        let moved = p.prompt_work(0, 512) - t.get(Feature::NPrefill);
        assert!((p.window_work(NONE, 0) - one_before - moved).abs() < 1e-9);
        // Nothing grows when more may lie outside.
        for before in 0..10 {
            for after in 0..10 {
                let (r, r1) = (p.reach_in_entries(before), p.reach_in_entries(before + 1));
                let w = p.window_work(r, after);
                assert!(w >= p.window_work(r1, after) - 1e-15);
                assert!(w >= p.window_work(r, after + 1) - 1e-15);
            }
        }
    }
}
