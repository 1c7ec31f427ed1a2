//! Mooncake trace JSONL files (kvcache-ai/Mooncake `FAST25-release/traces`, Apache-2.0):
//! one request per line, `{"timestamp": ms, "input_length": I, "output_length": O,
//! "hash_ids": [...]}`, each id naming one block of 512 prompt tokens; identical ids
//! (after identical ones before them) are identical tokens, so their KV can be shared.

use crate::error::TraceError;
use infersched_core::request::MAX_ARRIVAL_S;
use infersched_core::{PrefixIds, Request, Workload};
use serde::Deserialize;
use std::path::Path;

/// Prompt tokens per hash id in the Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// One line of a Mooncake trace (other fields are ignored).
#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Parses Mooncake JSONL text (`path` names it in errors): request ids are the 0-based
/// indices of the non-blank lines, arrivals the timestamps in seconds, and the hash ids
/// the prompts' block ids in blocks of `block_tokens`.
pub fn read_mooncake_str(
    text: &str,
    path: &Path,
    block_tokens: u32,
) -> Result<Workload, TraceError> {
    let invalid = |line: usize, reason: String| TraceError::Invalid {
        path: path.to_owned(),
        location: format!("line {line}"),
        reason,
    };
    let (mut requests, mut ids) = (Vec::new(), Vec::new());
    for (k, text) in text.lines().enumerate() {
        let line = k + 1;
        if text.trim().is_empty() {
            continue;
        }
        let row: Row = serde_json::from_str(text).map_err(|e| {
            invalid(
                line,
                format!("expected {{\"timestamp\": ms, \"input_length\": n, \"output_length\": n, \"hash_ids\": [...]}}: {e}"),
            )
        })?;
        let tokens = |v: u64, name: &str| {
            u32::try_from(v).ok().filter(|&v| v >= 1).ok_or_else(|| {
                invalid(
                    line,
                    format!("expected {name} from 1 to {}, got {v}", u32::MAX),
                )
            })
        };
        let input_tokens = tokens(row.input_length, "input_length")?;
        let output_tokens = tokens(row.output_length, "output_length")?;
        let arrival_s = row.timestamp / 1e3;
        if !(0.0..=MAX_ARRIVAL_S).contains(&arrival_s) {
            return Err(invalid(
                line,
                format!(
                    "expected a timestamp from 0 to {:e} ms, got {}",
                    MAX_ARRIVAL_S * 1e3,
                    row.timestamp
                ),
            ));
        }
        let want = input_tokens.div_ceil(block_tokens.max(1)) as usize;
        if row.hash_ids.len() != want {
            return Err(invalid(
                line,
                format!(
                    "hash_ids has {} ids; a prompt of {input_tokens} tokens in blocks of {block_tokens} has {want}",
                    row.hash_ids.len()
                ),
            ));
        }
        requests.push(Request {
            input_tokens,
            output_tokens,
            arrival_s,
        });
        ids.push(row.hash_ids);
    }
    let to_error = |source| TraceError::Workload {
        path: path.to_owned(),
        source,
    };
    Workload::new(requests)
        .map_err(to_error)?
        .with_prefix(PrefixIds { block_tokens, ids })
        .map_err(to_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_with_their_block_ids_and_names_bad_ones() {
        let text = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\n{\"timestamp\": 1500, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [0], \"extra\": 1}\n";
        let w = read_mooncake_str(text, Path::new("m.jsonl"), 512).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w.requests()[1].arrival_s, 1.5);
        assert_eq!(w.prefix().unwrap().ids, [vec![0, 1], vec![0]]);
        let bad =
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0]}\n";
        let e = read_mooncake_str(bad, Path::new("m.jsonl"), 512)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "m.jsonl: line 1: hash_ids has 1 ids; a prompt of 600 tokens in blocks of 512 has 2"
            ),
            "{e}"
        );
        let bad =
            "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}\n";
        let e = read_mooncake_str(bad, Path::new("m.jsonl"), 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1: expected input_length from 1"), "{e}");
        let e = read_mooncake_str("{\"timestamp\": 0}\n", Path::new("m.jsonl"), 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1: expected {\"timestamp\""), "{e}");
        let e = read_mooncake_str("", Path::new("m.jsonl"), 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no requests"), "{e}");
    }
}
