//! Each request's life as a path through its state graph (milp.md, "time-expanded state
//! network"): states `(m, G)` with `m < I + G`, plus a finished state; one arc per thing
//! the request can do in one batch (idle, evict, process `c` tokens). Every arc carries
//! its exact contribution to the batch features, the quadratic prefill-attention term
//! included, so the model needs no approximation.

use infersched_core::{BatchFeatures, Limits, Request, RequestState};

/// What an arc does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArcKind {
    /// Nothing (holds its KV).
    Idle,
    /// Drops its KV.
    Evict,
    /// Processes `c` tokens.
    Process {
        /// Tokens.
        c: u32,
        /// Evicted in a zero-time batch of evictions just before this one, so the tokens
        /// are processed from `m = 0` (turns a decode into a refill prefill, which can pay
        /// off under the per-batch biases).
        evict_first: bool,
        /// A decode entry (else a prefill).
        decode: bool,
        /// Generates the request's first token.
        first_token: bool,
        /// Generates its last token.
        finishes: bool,
    },
}

/// One arc of a request's state graph.
#[derive(Debug, Clone)]
pub struct Arc {
    /// From state.
    pub from: usize,
    /// To state.
    pub to: usize,
    /// What it does.
    pub kind: ArcKind,
    /// The entry's features (zero for idle and evict).
    pub features: BatchFeatures,
    /// KV occupied after the step (block-rounded; a finishing request still counts).
    pub kv: u64,
    /// Holds KV after the step (for R_max).
    pub holds: bool,
    /// Generation count `G` after the step.
    pub g_after: u32,
}

/// How big a request's state graph is ([`StateGraph::size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphSize {
    /// States.
    pub states: u64,
    /// Arcs.
    pub arcs: u64,
}

impl GraphSize {
    /// Bytes the built graph takes, about (its vectors and the state index).
    pub fn bytes(&self) -> u64 {
        let per_state = 8 + 24 + 48; // (m, G), its out-list header, its index entry
        let per_arc = std::mem::size_of::<Arc>() as u64 + 8; // the arc and its out-list slot
        self.states
            .saturating_mul(per_state)
            .saturating_add(self.arcs.saturating_mul(per_arc))
    }
}

/// A request's state graph.
#[derive(Debug, Clone)]
pub struct StateGraph {
    /// `(m, G)` per state; the last state is "finished".
    pub states: Vec<(u32, u32)>,
    /// All arcs.
    pub arcs: Vec<Arc>,
    /// Arcs leaving each state.
    pub out: Vec<Vec<usize>>,
}

impl StateGraph {
    /// The start state `(0, 0)`.
    pub const START: usize = 0;

    /// The finished state.
    pub fn finished(&self) -> usize {
        self.states.len() - 1
    }

    /// The largest prefill chunk any batch can hold: `min(C, P)` (unbounded without them).
    pub fn max_prefill_chunk(limits: &Limits) -> u32 {
        [limits.token_budget, limits.effective_prefill_budget()]
            .into_iter()
            .flatten()
            .min()
            .map_or(u32::MAX, |c| u32::try_from(c).unwrap_or(u32::MAX))
    }

    /// The number of states and arcs [`StateGraph::new`] builds for `r`, computed in
    /// `O(O)` without building anything (one closed form per generation count); exact up
    /// to 2^50 arcs, and at least that beyond (counting stops there).
    pub fn size(r: &Request, limits: &Limits, no_evict: bool, no_chunk: bool) -> GraphSize {
        // u128: hostile lengths (I, O near u32::MAX) must not overflow.
        let cap = u128::from(Self::max_prefill_chunk(limits));
        // Arcs processing from `m` with `rest = known - m` tokens to go (prefill).
        let chunks = |rest: u128| -> u128 {
            if no_chunk {
                u128::from(rest <= cap)
            } else {
                rest.min(cap)
            }
        };
        // The sum of `chunks(rest)` for rest = 1 ..= k.
        let chunk_sum = |k: u128| -> u128 {
            if no_chunk {
                k.min(cap)
            } else if k <= cap {
                k * (k + 1) / 2
            } else {
                cap * (cap + 1) / 2 + (k - cap) * cap
            }
        };
        let (i, o) = (u128::from(r.input_tokens), u128::from(r.output_tokens));
        let mut states = 1u128;
        let mut arcs = 1u128; // the finished state's idle arc
        // Past this many arcs the graph is far beyond any memory limit: stop counting, so
        // a hostile O (up to u32::MAX) costs no more than a few million steps.
        const ENOUGH: u128 = 1 << 50;
        for g in 0..o {
            if arcs > ENOUGH {
                break;
            }
            let k = i + g; // known tokens; states m = 0 .. k - 1
            states += k;
            arcs += k; // idle
            // From (m, g): rest = k - m runs over 1 ..= k; the one decode state (m = k - 1,
            // g >= 1) has one arc, as chunks(1) counts.
            arcs += chunk_sum(k);
            if !no_evict {
                // Evict from every m > 0, and process from (0, g) after it: a prefill of k.
                arcs += (k - 1) * (1 + chunks(k));
            }
        }
        let clamp = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let (states, arcs) = (clamp(states), clamp(arcs));
        GraphSize { states, arcs }
    }

    /// Builds the graph of `r` under `limits`; `no_evict` drops evict arcs, `no_chunk`
    /// drops prefill arcs that do not complete their phase, `reserve` counts `I + O - 1`
    /// KV tokens for every step from the first one to the last (Orca's reservation).
    /// Prefill chunks longer than [`StateGraph::max_prefill_chunk`] fit no batch and are
    /// left out.
    pub fn new(
        r: &Request,
        limits: &Limits,
        no_evict: bool,
        no_chunk: bool,
        reserve: bool,
    ) -> Self {
        let mut b = GraphBuilder::new(r, limits, no_evict, no_chunk, reserve);
        let fin = b.fin;
        b.push(Arc {
            from: fin,
            to: fin,
            kind: ArcKind::Idle,
            features: BatchFeatures::default(),
            kv: 0,
            holds: false,
            g_after: r.output_tokens,
        });
        for s in 0..fin {
            b.state_arcs(s);
        }
        Self {
            states: b.states,
            arcs: b.arcs,
            out: b.out,
        }
    }

    /// Calls `f(j, arc)` for every arc usable in batch `j` of `horizon`: from a state
    /// reachable by then, towards a state from which the request can still finish in the
    /// batches left. Stops early when `f` returns false.
    fn visit_usable(&self, o_tok: u32, horizon: usize, mut f: impl FnMut(usize, usize) -> bool) {
        let mut reach = vec![false; self.states.len()];
        reach[Self::START] = true;
        for j in 0..horizon {
            let left_after = (horizon - 1 - j) as u64;
            let mut next = vec![false; self.states.len()];
            for (s, &r) in reach.iter().enumerate() {
                if !r {
                    continue;
                }
                for &a in &self.out[s] {
                    let arc = &self.arcs[a];
                    if u64::from(o_tok - arc.g_after) > left_after {
                        continue;
                    }
                    next[arc.to] = true;
                    if !f(j, a) {
                        return;
                    }
                }
            }
            reach = next;
        }
    }

    /// Arcs usable in each batch of `horizon` (see `visit_usable`).
    pub fn usable_arcs(&self, o_tok: u32, horizon: usize) -> Vec<Vec<usize>> {
        let mut layers = vec![Vec::new(); horizon];
        self.visit_usable(o_tok, horizon, |j, a| {
            layers[j].push(a);
            true
        });
        layers
    }

    /// A lower bound on [`Self::usable_arc_count`] over `horizon` batches for the graph
    /// [`StateGraph::new`] builds for `r` (with `no_chunk` as given), in `O(horizon)` and
    /// without building anything: the idle and processing arcs of the prompt's states
    /// (`G = 0`) alone, in the batches from which the request can still finish after any
    /// of them (`j <= horizon - 1 - O`). By then every `m <= min(I - 1, j cap)` is
    /// reachable (chunks of 1 to `cap` tokens, or idling), and has `min(I - m, cap)`
    /// processing arcs besides its idle one; without chunks only `m = 0`, with its idle arc
    /// and its whole prompt where it fits a batch.
    pub fn min_usable_arc_count(
        r: &Request,
        limits: &Limits,
        no_chunk: bool,
        horizon: usize,
    ) -> u128 {
        let (i, o) = (u128::from(r.input_tokens), r.output_tokens as usize);
        let cap = u128::from(Self::max_prefill_chunk(limits));
        let Some(batches) = horizon.checked_sub(o) else {
            return 0;
        };
        if no_chunk {
            return batches as u128 * (1 + u128::from(i <= cap));
        }
        // The sum of min(rest, cap) for rest = 1 ..= k.
        let chunk_sum = |k: u128| -> u128 {
            if k <= cap {
                k * (k + 1) / 2
            } else {
                cap * (cap + 1) / 2 + (k - cap) * cap
            }
        };
        (0..batches as u128)
            .map(|j| {
                let top = (i - 1).min(j.saturating_mul(cap));
                (top + 1) + chunk_sum(i) - chunk_sum(i - top - 1)
            })
            .fold(0u128, u128::saturating_add)
    }

    /// How many (batch, arc) pairs [`Self::usable_arcs`] would return, counting at most
    /// `cap + 1` of them (so a huge model is rejected without being built).
    pub fn usable_arc_count(&self, o_tok: u32, horizon: usize, cap: usize) -> usize {
        let mut n = 0usize;
        self.visit_usable(o_tok, horizon, |_, _| {
            n += 1;
            n <= cap
        });
        n
    }
}

/// A request's state graph under construction.
struct GraphBuilder<'a> {
    r: &'a Request,
    limits: &'a Limits,
    no_evict: bool,
    no_chunk: bool,
    reserve: bool,
    max_chunk: u32,
    /// KV a reservation holds (blocks of `I + O - 1`).
    reserved: u64,
    states: Vec<(u32, u32)>,
    index: std::collections::HashMap<(u32, u32), usize>,
    /// The finished state.
    fin: usize,
    arcs: Vec<Arc>,
    out: Vec<Vec<usize>>,
}

impl<'a> GraphBuilder<'a> {
    /// The states `(m, g)`, every `m < I + g` for `g < O`, then the finished state.
    fn new(
        r: &'a Request,
        limits: &'a Limits,
        no_evict: bool,
        no_chunk: bool,
        reserve: bool,
    ) -> Self {
        let (i_tok, o_tok) = (r.input_tokens, r.output_tokens);
        let mut states = Vec::new();
        let mut index = std::collections::HashMap::new();
        for g in 0..o_tok {
            for m in 0..i_tok + g {
                index.insert((m, g), states.len());
                states.push((m, g));
            }
        }
        let fin = states.len();
        states.push((0, o_tok));
        Self {
            r,
            limits,
            no_evict,
            no_chunk,
            reserve,
            max_chunk: StateGraph::max_prefill_chunk(limits),
            reserved: limits.occupied(r.max_kv_tokens()),
            out: vec![Vec::new(); states.len()],
            states,
            index,
            fin,
            arcs: Vec::new(),
        }
    }

    fn push(&mut self, arc: Arc) {
        self.out[arc.from].push(self.arcs.len());
        self.arcs.push(arc);
    }

    /// KV held with `m` tokens: their blocks, or the whole reservation once admitted.
    fn kv_of(&self, m: u32) -> u64 {
        if self.reserve && m > 0 {
            self.reserved
        } else {
            self.limits.occupied(u64::from(m))
        }
    }

    /// State `s`'s arcs: idle, evict, and process (also after an eviction).
    fn state_arcs(&mut self, s: usize) {
        let (m, g) = self.states[s];
        self.push(Arc {
            from: s,
            to: s,
            kind: ArcKind::Idle,
            features: BatchFeatures::default(),
            kv: self.kv_of(m),
            holds: m > 0,
            g_after: g,
        });
        if m > 0 && !self.no_evict {
            self.push(Arc {
                from: s,
                to: self.index[&(0, g)],
                kind: ArcKind::Evict,
                features: BatchFeatures::default(),
                kv: 0,
                holds: false,
                g_after: g,
            });
        }
        // Process arcs from (m, g), and (evict_first) from (0, g) after an eviction.
        self.process_arcs(s, m, g, false);
        if m > 0 && !self.no_evict {
            self.process_arcs(s, 0, g, true);
        }
    }

    /// The arcs of state `s` that process `c` tokens from `m0` held (after an eviction
    /// when `evict_first`) at `g` generated.
    fn process_arcs(&mut self, s: usize, m0: u32, g: u32, evict_first: bool) {
        let (r, o_tok) = (self.r, self.r.output_tokens);
        let known = r.input_tokens + g;
        let from = RequestState {
            held: u64::from(m0),
            generated: g,
        };
        let decode = from.is_decode_ready(r);
        // Without chunks a prefill's one arc completes it (the others would be skipped
        // below, one by one: O(I) per state).
        let least = if self.no_chunk && !decode {
            known - m0
        } else {
            1
        };
        for c in least..=known - m0 {
            if !decode && c > self.max_chunk {
                break;
            }
            let generates = {
                let mut s = from;
                s.process(r, u64::from(c)).generates
            };
            let after = m0 + c;
            if self.no_chunk && !decode && !generates {
                continue;
            }
            let g_after = g + u32::from(generates);
            let to = if g_after == o_tok {
                self.fin
            } else if generates {
                self.index[&(after, g_after)]
            } else {
                self.index[&(after, g)]
            };
            let mut features = BatchFeatures::default();
            if decode {
                features.add_decode(u64::from(after));
            } else {
                features.add_prefill(u64::from(c), u64::from(m0));
            }
            self.push(Arc {
                from: s,
                to,
                kind: ArcKind::Process {
                    c,
                    evict_first,
                    decode,
                    first_token: generates && g == 0,
                    finishes: g_after == o_tok,
                },
                features,
                kv: self.kv_of(after),
                holds: true,
                g_after,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A request of up to 39 prompt and `max_output` output tokens, and limits with a
    /// token budget half the time and a prefill budget some of the time.
    fn small_request(rng: &mut ChaCha8Rng, max_output: u32) -> (Request, Limits) {
        let r = Request {
            input_tokens: rng.random_range(1..40),
            output_tokens: rng.random_range(1..=max_output),
            arrival_s: 0.0,
        };
        let limits = Limits {
            token_budget: rng.random_bool(0.5).then(|| rng.random_range(1..30)),
            prefill_budget: rng.random_bool(0.3).then(|| rng.random_range(1..30)),
            ..Limits::unlimited()
        };
        (r, limits)
    }

    #[test]
    fn min_usable_arc_count_is_at_most_the_usable_arcs() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut tight = 0;
        for _ in 0..300 {
            let (r, limits) = small_request(&mut rng, 5);
            let horizon = rng.random_range(1..20);
            for (no_evict, no_chunk) in [(false, false), (true, false), (false, true), (true, true)]
            {
                let g = StateGraph::new(&r, &limits, no_evict, no_chunk, false);
                let usable = g.usable_arc_count(r.output_tokens, horizon, usize::MAX - 1) as u128;
                let least = StateGraph::min_usable_arc_count(&r, &limits, no_chunk, horizon);
                assert!(
                    least <= usable,
                    "{r:?} {limits:?} J = {horizon} no_chunk {no_chunk}: {least} > {usable}"
                );
                tight += usize::from(least * 2 >= usable && usable > 0);
            }
        }
        // Prompts dominate these graphs often enough for the bound to catch huge models.
        assert!(tight >= 100, "{tight}");
    }

    #[test]
    fn size_counts_exactly_what_new_builds() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..300 {
            let (r, limits) = small_request(&mut rng, 7);
            for (no_evict, no_chunk) in [(false, false), (true, false), (false, true), (true, true)]
            {
                let g = StateGraph::new(&r, &limits, no_evict, no_chunk, false);
                let size = StateGraph::size(&r, &limits, no_evict, no_chunk);
                assert_eq!(
                    (size.states, size.arcs),
                    (g.states.len() as u64, g.arcs.len() as u64),
                    "{r:?} {limits:?} no_evict {no_evict} no_chunk {no_chunk}"
                );
                // No prefill arc is longer than a batch can hold.
                let cap = StateGraph::max_prefill_chunk(&limits);
                assert!(g.arcs.iter().all(|a| match a.kind {
                    ArcKind::Process { c, decode, .. } => decode || c <= cap,
                    _ => true,
                }));
            }
        }
        // A real prompt: 7,433 tokens under C = 2,048 is sized without building it.
        let long = Request {
            input_tokens: 7433,
            output_tokens: 300,
            arrival_s: 0.0,
        };
        let c = Limits {
            token_budget: Some(2048),
            ..Limits::unlimited()
        };
        let size = StateGraph::size(&long, &c, false, false);
        assert!(
            size.arcs > 1_000_000_000 && size.bytes() > 100 << 30,
            "{size:?}"
        );
        // A hostile output length is sized quickly and far over any limit.
        let hostile = Request {
            input_tokens: 1,
            output_tokens: u32::MAX,
            arrival_s: 0.0,
        };
        let size = StateGraph::size(&hostile, &Limits::unlimited(), false, false);
        assert!(size.arcs >= 1 << 50 && size.bytes() > 1 << 50, "{size:?}");
    }
}
