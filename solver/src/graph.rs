//! Each request's life as a path through its state graph (milp.md, "time-expanded state
//! network"): states `(m, G)` with `m < I + G`, plus a finished state; one arc per thing
//! the request can do in one batch (idle, evict, process `c` tokens). Every arc carries
//! its exact contribution to the batch features, the quadratic prefill-attention term
//! included, so the model needs no approximation.

use infersched_core::{BatchFeatures, Limits, Request};

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

    /// Builds the graph of `r` under `limits`; `no_evict` drops evict arcs, `no_chunk`
    /// drops prefill arcs that do not complete their phase, `reserve` counts `I + O - 1`
    /// KV tokens for every step from the first one to the last (Orca's reservation).
    pub fn new(
        r: &Request,
        limits: &Limits,
        no_evict: bool,
        no_chunk: bool,
        reserve: bool,
    ) -> Self {
        let (i_tok, o_tok) = (r.input_tokens, r.output_tokens);
        let reserved = limits.occupied(r.max_kv_tokens());
        let kv_of = |m: u32| {
            if reserve && m > 0 {
                reserved
            } else {
                limits.occupied(u64::from(m))
            }
        };
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
        let mut arcs = Vec::new();
        let mut out = vec![Vec::new(); states.len()];
        let mut push = |arcs: &mut Vec<Arc>, arc: Arc| {
            out[arc.from].push(arcs.len());
            arcs.push(arc);
        };
        push(
            &mut arcs,
            Arc {
                from: fin,
                to: fin,
                kind: ArcKind::Idle,
                features: BatchFeatures::default(),
                kv: 0,
                holds: false,
                g_after: o_tok,
            },
        );
        for (s, &(m, g)) in states[..fin].iter().enumerate() {
            let known = i_tok + g;
            push(
                &mut arcs,
                Arc {
                    from: s,
                    to: s,
                    kind: ArcKind::Idle,
                    features: BatchFeatures::default(),
                    kv: kv_of(m),
                    holds: m > 0,
                    g_after: g,
                },
            );
            if m > 0 && !no_evict {
                push(
                    &mut arcs,
                    Arc {
                        from: s,
                        to: index[&(0, g)],
                        kind: ArcKind::Evict,
                        features: BatchFeatures::default(),
                        kv: 0,
                        holds: false,
                        g_after: g,
                    },
                );
            }
            // Process arcs from (m, g), and (evict_first) from (0, g) after an eviction.
            let froms: &[(u32, bool)] = if m > 0 && !no_evict {
                &[(m, false), (0, true)]
            } else {
                &[(m, false)]
            };
            for &(m0, evict_first) in froms {
                let decode = g >= 1 && m0 + 1 == known;
                for c in 1..=known - m0 {
                    let after = m0 + c;
                    let generates = after == known;
                    if no_chunk && !decode && !generates {
                        continue;
                    }
                    let g_after = g + u32::from(generates);
                    let to = if g_after == o_tok {
                        fin
                    } else if generates {
                        index[&(after, g_after)]
                    } else {
                        index[&(after, g)]
                    };
                    let mut features = BatchFeatures::default();
                    if decode {
                        features.add_decode(u64::from(after));
                    } else {
                        features.add_prefill(u64::from(c), u64::from(m0));
                    }
                    push(
                        &mut arcs,
                        Arc {
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
                            kv: kv_of(after),
                            holds: true,
                            g_after,
                        },
                    );
                }
            }
        }
        Self { states, arcs, out }
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
