//! Prefix identity of prompts (issue 47; semantics.md, "Prefix identity"): which KV
//! blocks of one request's prompt hold the same tokens as another's, as production traces
//! record it (the Mooncake traces' `hash_ids`).
//!
//! Block `k` of request `i` covers prompt tokens `[k b, (k + 1) b)` (the last one may be
//! partial) and has id `ids[i][k]`. Two requests whose id sequences agree on their first
//! `k` blocks start with the same `k b` tokens, so those blocks' KV can be shared: a
//! cache keyed by the whole sequence of ids up to a block (vLLM hashes a block with its
//! parent's hash) finds it.

use std::collections::HashMap;

/// The prompt blocks' ids of every request of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixIds {
    /// Tokens per block of ids (512 in the Mooncake traces).
    pub block_tokens: u32,
    /// Per request (by id), the ids of its prompt's blocks, `ceil(I / block_tokens)` of them.
    pub ids: Vec<Vec<u64>>,
}

/// What a cache of unlimited size would save: the prompt tokens of full blocks whose whole
/// prefix of ids an earlier request (by arrival) already had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfectCache {
    /// Prompt tokens a perfect cache serves (at most `I - 1` per request: the last prompt
    /// token is always computed, to give the first output token).
    pub saved_tokens: u64,
    /// All prompt tokens.
    pub prompt_tokens: u64,
    /// Requests that reuse at least one block.
    pub requests_hit: usize,
}

impl PerfectCache {
    /// `saved_tokens / prompt_tokens`.
    pub fn share(&self) -> f64 {
        self.saved_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

impl PrefixIds {
    /// Checks the ids against the prompts' lengths `inputs` (by request id): one list per
    /// request, `ceil(I / block_tokens)` ids each, `block_tokens >= 1`. An error names the
    /// request and what is wrong.
    pub fn validate(&self, inputs: &[u32]) -> Result<(), (usize, String)> {
        if self.block_tokens == 0 {
            return Err((0, "has a block size of 0 tokens; expected >= 1".into()));
        }
        if self.ids.len() != inputs.len() {
            return Err((
                self.ids.len().min(inputs.len()),
                format!(
                    "lists are {} for {} requests; expected one per request",
                    self.ids.len(),
                    inputs.len()
                ),
            ));
        }
        for (index, (ids, &input)) in self.ids.iter().zip(inputs).enumerate() {
            let want = input.div_ceil(self.block_tokens) as usize;
            if ids.len() != want {
                return Err((
                    index,
                    format!(
                        "has {} block ids; a prompt of {input} tokens in blocks of {} has {want}",
                        ids.len(),
                        self.block_tokens
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The ids of a request whose prompt was cut to its first `input_tokens` tokens.
    pub fn truncated(ids: &[u64], input_tokens: u32, block_tokens: u32) -> Vec<u64> {
        let keep = input_tokens.div_ceil(block_tokens.max(1)) as usize;
        ids[..keep.min(ids.len())].to_vec()
    }

    /// What a perfect cache saves on prompts of lengths `inputs` (by request id), the
    /// requests taken in `order` (arrival order).
    pub fn perfect_cache(&self, inputs: &[u32], order: &[u32]) -> PerfectCache {
        let chains = self.intern_chains();
        let nodes = chains.iter().flatten().max().map_or(0, |&m| m as usize + 1);
        let mut seen = vec![false; nodes];
        let mut cache = PerfectCache {
            saved_tokens: 0,
            prompt_tokens: 0,
            requests_hit: 0,
        };
        for &i in order {
            let input = inputs[i as usize];
            let full = (input / self.block_tokens) as usize;
            let mine = &chains[i as usize];
            let reused = mine[..full.min(mine.len())]
                .iter()
                .take_while(|&&c| seen[c as usize])
                .count();
            for &c in mine {
                seen[c as usize] = true;
            }
            let saved = (reused as u64 * u64::from(self.block_tokens)).min(u64::from(input) - 1);
            cache.saved_tokens += saved;
            cache.prompt_tokens += u64::from(input);
            cache.requests_hit += usize::from(saved > 0);
        }
        cache
    }

    /// Each request's chains of ids, interned: the chain up to its `k`-th id block is one
    /// number, equal for two requests exactly when their ids up to there are equal
    /// (numbered from 1 in request order; 0 is the empty chain).
    pub fn intern_chains(&self) -> Vec<Vec<u32>> {
        // A trie of id sequences: (parent node, id) -> node.
        let mut trie: HashMap<(u32, u64), u32> = HashMap::new();
        self.ids
            .iter()
            .map(|ids| {
                let mut node = 0u32;
                ids.iter()
                    .map(|&id| {
                        let next = trie.len() as u32 + 1;
                        node = *trie.entry((node, id)).or_insert(next);
                        node
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_perfect_cache_reuses_full_blocks_of_shared_prefixes_only() {
        // Blocks of 4. r0 [1, 2, 3] (10 tokens): nothing before it. r1 [1, 2, 9] (12):
        // reuses blocks 1 and 2 (8 tokens). r2 [5, 2] (8): block 2 follows another
        // prefix, nothing reused. r3 [1, 2] (6 tokens: one full block, one partial):
        // reuses the full block only (4). r4 [1] (4 tokens): its one block is cached but
        // the last prompt token is always computed: 3.
        let requests = [10, 12, 8, 6, 4];
        let p = PrefixIds {
            block_tokens: 4,
            ids: vec![
                vec![1, 2, 3],
                vec![1, 2, 9],
                vec![5, 2],
                vec![1, 2],
                vec![1],
            ],
        };
        p.validate(&requests).unwrap();
        let c = p.perfect_cache(&requests, &[0, 1, 2, 3, 4]);
        assert_eq!(c.saved_tokens, 8 + 4 + 3);
        assert_eq!(c.prompt_tokens, 40);
        assert_eq!(c.requests_hit, 3);
        // In another order r1 comes first and r0 reuses from it.
        let c = p.perfect_cache(&requests, &[1, 0, 2, 3, 4]);
        assert_eq!(c.saved_tokens, 8 + 4 + 3);
        assert_eq!(PrefixIds::truncated(&[1, 2, 3], 5, 4), [1, 2]);
    }

    #[test]
    fn ids_must_cover_each_prompt_in_blocks() {
        let p = PrefixIds {
            block_tokens: 4,
            ids: vec![vec![1, 2]],
        };
        let e = p.validate(&[9]).unwrap_err();
        assert_eq!(
            e,
            (
                0,
                "has 2 block ids; a prompt of 9 tokens in blocks of 4 has 3".into()
            )
        );
        assert!(p.validate(&[8]).is_ok());
        assert!(p.validate(&[8, 1]).is_err());
        // Through the workload, the error names the request and the field.
        let w = crate::Workload::new(vec![crate::Request {
            input_tokens: 9,
            output_tokens: 1,
            arrival_s: 0.0,
        }])
        .unwrap();
        let e = w.with_prefix(p).unwrap_err().to_string();
        assert_eq!(
            e,
            "request 0: hash_ids has 2 block ids; a prompt of 9 tokens in blocks of 4 has 3"
        );
    }
}
