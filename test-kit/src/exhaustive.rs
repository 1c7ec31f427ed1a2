//! An exhaustive search for optimal schedules of tiny offline instances, written from
//! `semantics.md` alone (it shares no code with the schedulers or the solver): Dijkstra
//! over joint request states `(m, G)`, one edge per valid batch.
//!
//! Costs are additive for both objectives when every request arrives at 0: a batch of
//! time `t` adds `t` to the makespan and `t` to the completion time of every request not
//! yet finished before it (so the sum of completion times grows by `t * unfinished`).

use infersched_core::{Batch, BatchFeatures, CostModel, Entry, Limits, Schedule, Workload};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// What is being minimized.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// End of the last batch.
    Makespan,
    /// Mean end-to-end latency.
    MeanLatency,
    /// Mean time to first token.
    MeanTtft,
}

/// Restrictions on the schedule class (the solver's policy constraints).
#[derive(Clone, Copy, Debug, Default)]
pub struct Class {
    /// No evictions.
    pub no_evict: bool,
    /// Every prefill entry completes its phase (generates a token).
    pub no_chunk: bool,
    /// No batch mixes prefill and decode entries.
    pub no_mix: bool,
    /// Requests start in id order (offline instances: arrival order).
    pub fcfs: bool,
    /// A started, unfinished request counts I + O - 1 KV tokens; no evictions.
    pub reserve: bool,
}

type State = Vec<(u32, u32)>; // (m, G) per request

#[derive(Clone, Copy)]
enum Act {
    Idle,
    Evict,
    Process(u32),
}

/// The optimum and a schedule reaching it, or None if the search space exceeds `max_states`.
pub fn optimum(
    w: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    objective: Objective,
    class: Class,
    max_states: usize,
) -> Option<(f64, Schedule)> {
    let reqs = w.requests();
    assert!(
        reqs.iter().all(|r| r.arrival_s == 0.0),
        "offline instances only"
    );
    let n = reqs.len();
    let start: State = vec![(0, 0); n];
    let done = |s: &State| (0..n).all(|i| s[i].1 == reqs[i].output_tokens);
    let mut dist: HashMap<State, f64> = HashMap::new();
    let mut prev: HashMap<State, (State, Vec<Entry>)> = HashMap::new();
    let mut heap = BinaryHeap::new();
    dist.insert(start.clone(), 0.0);
    heap.push((Reverse(OrdF64(0.0)), start));
    while let Some((Reverse(OrdF64(d)), s)) = heap.pop() {
        if d > dist[&s] {
            continue;
        }
        if done(&s) {
            let mut batches = Vec::new();
            let mut cur = s.clone();
            while let Some((p, entries)) = prev.get(&cur) {
                batches.push(Batch::new(entries.clone()));
                cur = p.clone();
            }
            batches.reverse();
            let value = match objective {
                Objective::Makespan => d,
                Objective::MeanLatency | Objective::MeanTtft => d / n as f64,
            };
            return Some((value, Schedule::new(batches)));
        }
        if dist.len() > max_states {
            return None;
        }
        // Enumerate every combination of per-request actions.
        let options: Vec<Vec<Act>> = (0..n)
            .map(|i| {
                let (m, g) = s[i];
                let r = &reqs[i];
                if g == r.output_tokens {
                    return vec![Act::Idle];
                }
                let known = r.input_tokens + g;
                let decode = g >= 1 && m + 1 == known;
                let mut v = vec![Act::Idle];
                if m > 0 && !class.no_evict && !class.reserve {
                    v.push(Act::Evict);
                }
                for c in 1..=known - m {
                    if class.no_chunk && !decode && m + c < known {
                        continue;
                    }
                    v.push(Act::Process(c));
                }
                v
            })
            .collect();
        let mut choice = vec![0usize; n];
        loop {
            if let Some((t, next, entries)) = step(&s, &choice, &options, w, limits, cost, class) {
                let unfinished = (0..n).filter(|&i| s[i].1 < reqs[i].output_tokens).count();
                let no_first_token = (0..n).filter(|&i| s[i].1 == 0).count();
                let add = match objective {
                    Objective::Makespan => t,
                    Objective::MeanLatency => t * unfinished as f64,
                    Objective::MeanTtft => t * no_first_token as f64,
                };
                let nd = d + add;
                if dist.get(&next).is_none_or(|&old| nd < old) {
                    dist.insert(next.clone(), nd);
                    prev.insert(next.clone(), (s.clone(), entries));
                    heap.push((Reverse(OrdF64(nd)), next));
                }
            }
            // Next combination (odometer).
            let mut k = 0;
            while k < n {
                choice[k] += 1;
                if choice[k] < options[k].len() {
                    break;
                }
                choice[k] = 0;
                k += 1;
            }
            if k == n {
                break;
            }
        }
    }
    None
}

/// Applies one batch; None if it is empty or breaks a limit.
fn step(
    s: &State,
    choice: &[usize],
    options: &[Vec<Act>],
    w: &Workload,
    limits: &Limits,
    cost: &dyn CostModel,
    class: Class,
) -> Option<(f64, State, Vec<Entry>)> {
    let reqs = w.requests();
    let mut next = s.clone();
    let mut entries = Vec::new();
    let mut f = BatchFeatures::default();
    let mut prefill_tokens = 0u64;
    let mut kv = 0u64;
    let mut holding = 0u64;
    for (i, (&k, opts)) in choice.iter().zip(options).enumerate() {
        let (m, g) = s[i];
        let r = &reqs[i];
        match opts[k] {
            Act::Idle => {}
            Act::Evict => {
                next[i].0 = 0;
                entries.push(Entry::evict(i as u32));
            }
            Act::Process(c) => {
                let known = r.input_tokens + g;
                if g >= 1 && m + 1 == known {
                    f.add_decode(u64::from(m + c));
                } else {
                    f.add_prefill(u64::from(c), u64::from(m));
                    prefill_tokens += u64::from(c);
                }
                next[i].0 = m + c;
                if m + c == known {
                    next[i].1 = g + 1;
                }
                entries.push(Entry::process(i as u32, c));
            }
        }
        let held = u64::from(next[i].0);
        let started = next[i].0 > 0 || next[i].1 > 0;
        kv += if class.reserve && started && g < r.output_tokens {
            limits.occupied(r.max_kv_tokens())
        } else {
            limits.occupied(held)
        };
        holding += u64::from(held > 0);
        if next[i].1 == r.output_tokens {
            next[i].0 = 0; // freed after the batch
        }
    }
    if entries.is_empty() {
        return None;
    }
    let started = |i: usize| next[i].0 > 0 || next[i].1 > 0;
    if class.fcfs && (1..reqs.len()).any(|i| started(i) && !started(i - 1)) {
        return None;
    }
    let over = |v: u64, l: Option<u64>| l.is_some_and(|l| v > l);
    if over(f.tokens, limits.token_budget)
        || over(prefill_tokens, limits.effective_prefill_budget())
        || over(kv, limits.kv_capacity)
        || over(holding, limits.max_running)
        || (class.no_mix && f.n_prefill > 0 && f.n_decode > 0)
    {
        return None;
    }
    Some((cost.batch_time_s(&f), next, entries))
}

#[derive(Clone, Copy, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
