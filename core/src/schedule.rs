//! Schedules: ordered batches of entries, and their stable file formats.
//!
//! JSON (`infersched-schedule/1`), read by other tools, so kept stable:
//! ```json
//! {"format": "infersched-schedule/1", "batches": [
//!   {"entries": [{"request": 0, "tokens": 512}, {"request": 3, "evict": true}]}
//! ]}
//! ```
//! Request ids are 0-based row indices of the workload. Optional fields: top-level
//! `"meta"` (any JSON value, e.g. the producer's name) and `"prefix_cache"` (the rule the
//! KV pool follows, `"vllm-v1"` or `"vllm-v0"`: [`CacheRule`]; without it, a schedule
//! with cache hits follows vLLM V1's), and per batch `"start_s"` / `"end_s"`, the
//! producer's claimed times, which replay checks against its own.
//!
//! CSV: header `batch,request,tokens`, one row per entry, `tokens` a positive integer or
//! the word `evict`; batch indices are 0-based and non-decreasing (gaps are empty batches,
//! at most as many as the file has lines, so a stray index cannot allocate without bound).
//! A fourth column `cached` gives the tokens an entry takes without computing them: from
//! the prefix cache before processing, or, with `tokens` the word `receive`, the KV a
//! disaggregated decode replica receives (`{"request": 3, "receive": 511}` in JSON).

use crate::kv_cache::CacheRule;
use serde::Deserialize;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The `format` value of schedule JSON files.
pub const SCHEDULE_FORMAT: &str = "infersched-schedule/1";

/// What an entry does to its request in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Drop the request's KV (`m := 0`); generated tokens are kept and must be refilled.
    Evict,
    /// Process this many tokens (>= 1).
    Process(u32),
    /// Receive the KV of the entry's `cached` prompt tokens, computed on a prefill replica
    /// (a disaggregated decode replica's admission, vLLM's NixlConnector: the blocks are
    /// allocated now, the transfer runs, the request processes once it has ended);
    /// processes nothing.
    Receive,
}

/// One request's step in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    /// 0-based request id.
    pub request: u32,
    /// Evict or process tokens.
    pub action: Action,
    /// Tokens taken without computing them: from the prefix cache before processing
    /// (whole KV blocks; only when the request holds no KV), or received with
    /// [`Action::Receive`]; 0 for an eviction.
    pub cached: u32,
}

/// Compact text: `3:128` (request 3 processes 128 tokens), `3:hit512+128` (it takes 512
/// tokens from the prefix cache, then processes 128), `3:receive511` or `3:evict`.
impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.action {
            Action::Process(c) if self.cached > 0 => {
                write!(f, "{}:hit{}+{c}", self.request, self.cached)
            }
            Action::Process(c) => write!(f, "{}:{c}", self.request),
            Action::Evict => write!(f, "{}:evict", self.request),
            Action::Receive => write!(f, "{}:receive{}", self.request, self.cached),
        }
    }
}

/// Compact text: the entries' [`Entry`] texts separated by spaces (`0:4 1:evict`).
impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, e) in self.entries.iter().enumerate() {
            if k > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl Entry {
    /// An entry processing `tokens` tokens of `request`.
    pub fn process(request: u32, tokens: u32) -> Self {
        Self {
            request,
            action: Action::Process(tokens),
            cached: 0,
        }
    }

    /// An entry taking `cached` tokens of `request` from the prefix cache, then
    /// processing `tokens` tokens.
    pub fn cached_process(request: u32, cached: u32, tokens: u32) -> Self {
        Self {
            request,
            action: Action::Process(tokens),
            cached,
        }
    }

    /// An entry evicting `request`.
    pub fn evict(request: u32) -> Self {
        Self {
            request,
            action: Action::Evict,
            cached: 0,
        }
    }

    /// An entry in which `request` receives the KV of `tokens` prompt tokens.
    pub fn receive(request: u32, tokens: u32) -> Self {
        Self {
            request,
            action: Action::Receive,
            cached: tokens,
        }
    }
}

/// One batch: its entries, and optionally the times its producer claims for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The entries, at most one per request.
    pub entries: Vec<Entry>,
    /// The producer's claimed start time (checked by replay when present).
    pub start_s: Option<f64>,
    /// The producer's claimed end time (checked by replay when present).
    pub end_s: Option<f64>,
}

impl Batch {
    /// A batch of `entries` with no claimed times.
    pub fn new(entries: Vec<Entry>) -> Self {
        Self {
            entries,
            start_s: None,
            end_s: None,
        }
    }
}

/// An ordered list of batches, as produced by heuristics and the MILP alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schedule {
    /// The batches in execution order.
    pub batches: Vec<Batch>,
    /// Free-form metadata (e.g. `{"producer": "vllm"}`), written as `"meta"`.
    pub meta: Option<serde_json::Value>,
    /// The prefix-caching rule of the KV pool that ran it (`None`: vLLM V1's where an
    /// entry takes tokens from the cache, else no cache), written as `"prefix_cache"`.
    pub prefix_cache: Option<CacheRule>,
}

/// Why a schedule file could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The JSON is malformed or does not have the schedule's shape.
    #[error("{path}: line {line} column {column}: {message}")]
    Json {
        /// File path.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What serde_json said.
        message: String,
    },
    /// A field has a value the format does not allow.
    #[error("{path}: {location}: {reason}")]
    Invalid {
        /// File path.
        path: PathBuf,
        /// Where: a JSON path like `batches[2].entries[0]`, or `line 7`.
        location: String,
        /// What was expected.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    format: String,
    #[serde(default)]
    meta: Option<serde_json::Value>,
    #[serde(default)]
    prefix_cache: Option<CacheRule>,
    batches: Vec<BatchRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRepr {
    entries: Vec<EntryRepr>,
    #[serde(default)]
    start_s: Option<f64>,
    #[serde(default)]
    end_s: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryRepr {
    request: u32,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    evict: Option<bool>,
    #[serde(default)]
    cached: Option<u64>,
    #[serde(default)]
    receive: Option<u64>,
}

impl EntryRepr {
    /// The entry this JSON object describes, or what is wrong with it.
    fn entry(self) -> Result<Entry, String> {
        let too_large = |name: &str, v: u64| format!("\"{name}\" = {v} is larger than 4294967295");
        if let Some(h) = self.receive {
            if self.tokens.is_some() || self.evict.is_some() || self.cached.is_some() {
                return Err(
                    "a receive is {\"request\": R, \"receive\": N} (N tokens), nothing else".into(),
                );
            }
            let h = u32::try_from(h).map_err(|_| too_large("receive", h))?;
            return Ok(Entry::receive(self.request, h));
        }
        let action = match (self.tokens, self.evict) {
            (Some(_), Some(true)) => {
                return Err(
                    "has both \"tokens\" and \"evict\": an entry either evicts or processes".into(),
                );
            }
            (Some(t), _) => Action::Process(u32::try_from(t).map_err(|_| too_large("tokens", t))?),
            (None, Some(true)) => Action::Evict,
            (None, _) => return Err("expected \"tokens\": N (N >= 1) or \"evict\": true".into()),
        };
        let cached = match (self.cached, action) {
            (None, _) => 0,
            (Some(h), Action::Process(_)) => {
                u32::try_from(h).map_err(|_| too_large("cached", h))?
            }
            (Some(_), Action::Evict | Action::Receive) => {
                return Err("has \"cached\" on an eviction: only a processing entry takes tokens from the prefix cache".into());
            }
        };
        Ok(Entry {
            request: self.request,
            action,
            cached,
        })
    }
}

/// One CSV row's batch index and entry; an error names the column and what was expected.
fn csv_entry(fields: &[&str]) -> Result<(usize, Entry), (&'static str, String)> {
    let batch: usize = fields[0].parse().map_err(|_| {
        (
            "batch",
            format!(
                "expected a batch index >= 0, got \"{}\"",
                crate::io::excerpt(fields[0])
            ),
        )
    })?;
    let request: u32 = fields[1].parse().map_err(|_| {
        (
            "request",
            format!(
                "expected a request id from 0 to {}, got \"{}\"",
                u32::MAX,
                crate::io::excerpt(fields[1])
            ),
        )
    })?;
    let action = match fields[2] {
        "evict" => Action::Evict,
        "receive" => Action::Receive,
        text => Action::Process(text.parse().map_err(|_| {
            (
                "tokens",
                format!(
                    "expected a token count from 1 to {}, \"evict\" or \"receive\", got \"{}\"",
                    u32::MAX,
                    crate::io::excerpt(text)
                ),
            )
        })?),
    };
    let cached = csv_cached(fields, action).map_err(|reason| ("cached", reason))?;
    Ok((
        batch,
        Entry {
            request,
            action,
            cached,
        },
    ))
}

/// The CSV `cached` column of an entry (absent: 0; not on evictions; a receive's tokens,
/// at least 1).
fn csv_cached(fields: &[&str], action: Action) -> Result<u32, String> {
    let Some(text) = fields.get(3) else {
        if action == Action::Receive {
            return Err("a receive names the tokens it receives in a fourth column, cached".into());
        }
        return Ok(0);
    };
    let h: u32 = text.parse().map_err(|_| {
        format!(
            "expected a token count from 0 to {}, got \"{}\"",
            u32::MAX,
            crate::io::excerpt(text)
        )
    })?;
    if h > 0 && action == Action::Evict {
        return Err("an eviction takes nothing from the prefix cache; expected 0".into());
    }
    Ok(h)
}

impl Schedule {
    /// A schedule of these batches, without metadata.
    pub fn new(batches: Vec<Batch>) -> Self {
        Self {
            batches,
            meta: None,
            prefix_cache: None,
        }
    }

    /// Whether any entry takes tokens without computing them (from the prefix cache, or
    /// received).
    pub fn has_cache_hits(&self) -> bool {
        self.batches.iter().any(|b| {
            b.entries
                .iter()
                .any(|e| e.cached > 0 || e.action == Action::Receive)
        })
    }

    /// Total number of entries over all batches.
    pub fn entry_count(&self) -> usize {
        self.batches.iter().map(|b| b.entries.len()).sum()
    }

    /// Reads a schedule file: CSV if the name ends in `.csv`, JSON otherwise.
    pub fn read(path: &Path) -> Result<Self, ScheduleError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScheduleError::Io {
            path: path.to_owned(),
            source,
        })?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        {
            Self::from_csv_str(text, path)
        } else {
            Self::from_json_str(text, path)
        }
    }

    /// Parses schedule JSON; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ScheduleError> {
        let repr: FileRepr = serde_json::from_str(text).map_err(|e| ScheduleError::Json {
            path: path.to_owned(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let invalid = |location: String, reason: String| ScheduleError::Invalid {
            path: path.to_owned(),
            location,
            reason,
        };
        if repr.format != SCHEDULE_FORMAT {
            return Err(invalid(
                "format".into(),
                format!(
                    "expected \"{SCHEDULE_FORMAT}\", got \"{}\"",
                    crate::io::excerpt(&repr.format)
                ),
            ));
        }
        let mut batches = Vec::with_capacity(repr.batches.len());
        for (j, b) in repr.batches.into_iter().enumerate() {
            for (name, v) in [("start_s", b.start_s), ("end_s", b.end_s)] {
                if let Some(v) = v
                    && !(v.is_finite() && v >= 0.0)
                {
                    return Err(invalid(
                        format!("batches[{j}].{name}"),
                        format!("expected a finite time >= 0, got {v}"),
                    ));
                }
            }
            let mut entries = Vec::with_capacity(b.entries.len());
            for (k, e) in b.entries.into_iter().enumerate() {
                let entry = e
                    .entry()
                    .map_err(|reason| invalid(format!("batches[{j}].entries[{k}]"), reason))?;
                entries.push(entry);
            }
            batches.push(Batch {
                entries,
                start_s: b.start_s,
                end_s: b.end_s,
            });
        }
        Ok(Self {
            batches,
            meta: repr.meta,
            prefix_cache: repr.prefix_cache,
        })
    }

    /// Parses the CSV form; `path` is only used in error messages.
    pub fn from_csv_str(text: &str, path: &Path) -> Result<Self, ScheduleError> {
        let invalid = |location: String, reason: String| ScheduleError::Invalid {
            path: path.to_owned(),
            location,
            reason,
        };
        let mut lines = text.lines().enumerate();
        let header = lines
            .next()
            .map(|(_, h)| h.trim().to_owned())
            .unwrap_or_default();
        let columns = match header.as_str() {
            "batch,request,tokens" => 3,
            "batch,request,tokens,cached" => 4,
            _ => 0,
        };
        if columns == 0 {
            return Err(invalid(
                "line 1".into(),
                format!(
                    "expected the header \"batch,request,tokens\" (or \"batch,request,tokens,cached\"), got \"{}\"",
                    crate::io::excerpt(&header)
                ),
            ));
        }
        let line_count = text.lines().count();
        let mut batches: Vec<Batch> = Vec::new();
        for (i, line) in lines {
            let lineno = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != columns {
                return Err(invalid(
                    format!("line {lineno}"),
                    format!("expected {columns} fields ({header}), got {}", fields.len()),
                ));
            }
            let (batch, entry) = csv_entry(&fields).map_err(|(column, reason)| {
                invalid(format!("line {lineno}, column {column}"), reason)
            })?;
            if batch.saturating_add(1) < batches.len() {
                return Err(invalid(
                    format!("line {lineno}, column batch"),
                    format!(
                        "batch indices must not decrease: {batch} after {}",
                        batches.len() - 1
                    ),
                ));
            }
            if batch >= batches.len() {
                // Empty batches in a gap cost memory but carry nothing: allow no more of
                // them than the file has lines (a typo like 9223372036854775807 must not
                // allocate exabytes).
                if batch >= line_count {
                    return Err(invalid(
                        format!("line {lineno}, column batch"),
                        format!(
                            "batch index {batch} is beyond what this file of {line_count} lines can hold (indices count from 0; a gap of empty batches may not be longer than the file)"
                        ),
                    ));
                }
                batches.resize_with(batch + 1, Batch::default);
            }
            batches[batch].entries.push(entry);
        }
        Ok(Self::new(batches))
    }

    /// Writes the JSON form, one batch per line.
    pub fn write_json(&self, w: &mut dyn Write) -> io::Result<()> {
        write!(w, "{{\"format\":\"{SCHEDULE_FORMAT}\",")?;
        if let Some(meta) = &self.meta {
            write!(w, "\"meta\":{},", serde_json::to_string(meta)?)?;
        }
        if let Some(rule) = self.prefix_cache {
            write!(w, "\"prefix_cache\":\"{}\",", rule.name())?;
        }
        w.write_all(b"\"batches\":[")?;
        let mut line = String::new();
        for (j, b) in self.batches.iter().enumerate() {
            line.clear();
            line.push_str(if j == 0 { "\n" } else { ",\n" });
            line.push_str("{\"entries\":[");
            for (k, e) in b.entries.iter().enumerate() {
                if k > 0 {
                    line.push(',');
                }
                match e.action {
                    Action::Process(c) if e.cached > 0 => {
                        let _ = write!(
                            line,
                            "{{\"request\":{},\"tokens\":{c},\"cached\":{}}}",
                            e.request, e.cached
                        );
                    }
                    Action::Process(c) => {
                        let _ = write!(line, "{{\"request\":{},\"tokens\":{c}}}", e.request);
                    }
                    Action::Evict => {
                        let _ = write!(line, "{{\"request\":{},\"evict\":true}}", e.request);
                    }
                    Action::Receive => {
                        let _ = write!(
                            line,
                            "{{\"request\":{},\"receive\":{}}}",
                            e.request, e.cached
                        );
                    }
                }
            }
            line.push(']');
            for (name, v) in [("start_s", b.start_s), ("end_s", b.end_s)] {
                if let Some(v) = v {
                    let _ = write!(line, ",\"{name}\":{}", serde_json::to_string(&v)?);
                }
            }
            line.push('}');
            w.write_all(line.as_bytes())?;
        }
        w.write_all(b"\n]}\n")
    }

    /// Writes the CSV form (empty trailing batches are not representable and are omitted);
    /// an error for a schedule under vLLM v0's cache rule, which the CSV cannot name.
    pub fn write_csv(&self, w: &mut dyn Write) -> io::Result<()> {
        if self.prefix_cache == Some(CacheRule::VllmV0) {
            return Err(io::Error::other(
                "the CSV form cannot name the vLLM v0 prefix-cache rule this schedule follows; write it as JSON",
            ));
        }
        let hits = self.has_cache_hits();
        w.write_all(if hits {
            b"batch,request,tokens,cached\n"
        } else {
            b"batch,request,tokens\n"
        })?;
        for (j, b) in self.batches.iter().enumerate() {
            for e in &b.entries {
                match e.action {
                    Action::Process(c) => write!(w, "{j},{},{c}", e.request)?,
                    Action::Evict => write!(w, "{j},{},evict", e.request)?,
                    Action::Receive => write!(w, "{j},{},receive", e.request)?,
                }
                if hits {
                    write!(w, ",{}", e.cached)?;
                }
                writeln!(w)?;
            }
        }
        Ok(())
    }

    /// Writes the schedule to `path` atomically: CSV if the name ends in `.csv`, else JSON.
    pub fn write(&self, path: &Path) -> Result<(), ScheduleError> {
        let csv = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
        crate::io::write_atomic(path, |w| {
            if csv {
                self.write_csv(w)
            } else {
                self.write_json(w)
            }
        })
        .map_err(|source| ScheduleError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_batches_print_compactly() {
        let b = Batch::new(vec![
            Entry::process(0, 4),
            Entry::evict(1),
            Entry::process(2, 1),
        ]);
        assert_eq!(b.to_string(), "0:4 1:evict 2:1");
        assert_eq!(Batch::new(vec![]).to_string(), "");
    }

    fn p() -> &'static Path {
        Path::new("s.json")
    }

    proptest::proptest! {
        /// Every time written reads back to the same bits (serde_json's default float
        /// parser is not exact; the workspace enables `float_roundtrip`).
        #[test]
        fn claimed_times_round_trip_bit_for_bit(
            times in proptest::collection::vec(0.0f64..1e7, 1..50)
        ) {
            let batches = times
                .iter()
                .map(|&t| Batch {
                    entries: vec![Entry::process(0, 1)],
                    start_s: Some(t),
                    end_s: Some(t * 1.000_000_1 + 1e-9),
                })
                .collect();
            let s = Schedule::new(batches);
            let mut bytes = Vec::new();
            s.write_json(&mut bytes).unwrap();
            let back = Schedule::from_json_str(std::str::from_utf8(&bytes).unwrap(), p()).unwrap();
            for (a, b) in s.batches.iter().zip(&back.batches) {
                proptest::prop_assert_eq!(a.start_s.unwrap().to_bits(), b.start_s.unwrap().to_bits());
                proptest::prop_assert_eq!(a.end_s.unwrap().to_bits(), b.end_s.unwrap().to_bits());
            }
        }
    }

    #[test]
    fn a_time_serde_json_used_to_misread_reads_back_exactly() {
        // From issue 14: written as 9.838020941127045, read back 1 ulp lower without
        // float_roundtrip.
        let t: f64 = "9.838020941127045".parse().unwrap();
        let text = format!(
            r#"{{"format":"infersched-schedule/1","batches":[{{"entries":[{{"request":0,"tokens":1}}],"start_s":{t}}}]}}"#
        );
        let s = Schedule::from_json_str(&text, p()).unwrap();
        assert_eq!(s.batches[0].start_s.unwrap().to_bits(), t.to_bits());
    }

    #[test]
    fn a_huge_batch_index_is_an_error_not_an_allocation() {
        for index in ["9223372036854775807", "100000000", "18446744073709551615"] {
            let text = format!("batch,request,tokens\n0,0,96\n{index},0,1\n");
            let e = Schedule::from_csv_str(&text, p()).unwrap_err().to_string();
            assert!(
                e.contains("line 3, column batch") && e.contains(index),
                "{e}"
            );
        }
        // A short gap is still empty batches.
        let s = Schedule::from_csv_str("batch,request,tokens\n0,0,2\n2,0,1\n", p()).unwrap();
        assert_eq!(s.batches.len(), 3);
        assert!(s.batches[1].entries.is_empty());
    }

    #[test]
    fn parses_the_documented_example() {
        let s = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": [{"request": 0, "tokens": 512}, {"request": 3, "evict": true}]}]}"#,
            p(),
        )
        .unwrap();
        assert_eq!(
            s.batches[0].entries,
            vec![Entry::process(0, 512), Entry::evict(3)]
        );
    }

    #[test]
    fn json_and_csv_round_trip() {
        let mut s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 3), Entry::process(1, 2)]),
            Batch::default(),
            Batch {
                entries: vec![Entry::evict(1), Entry::process(0, 1)],
                start_s: Some(0.5),
                end_s: Some(0.75),
            },
        ]);
        s.meta = Some(serde_json::json!({"producer": "test"}));
        let mut out = Vec::new();
        s.write_json(&mut out).unwrap();
        let back = Schedule::from_json_str(std::str::from_utf8(&out).unwrap(), p()).unwrap();
        assert_eq!(back, s);

        let mut out = Vec::new();
        s.write_csv(&mut out).unwrap();
        let back = Schedule::from_csv_str(std::str::from_utf8(&out).unwrap(), p()).unwrap();
        assert_eq!(back.batches.len(), 3);
        assert!(back.batches[1].entries.is_empty());
        assert_eq!(back.batches[2].entries, s.batches[2].entries);
    }

    #[test]
    fn receives_round_trip_in_both_forms_and_bad_ones_are_named() {
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::receive(0, 31), Entry::process(1, 2)]),
            Batch::new(vec![Entry::process(0, 1), Entry::receive(2, 0)]),
        ]);
        assert!(s.has_cache_hits());
        let mut json = Vec::new();
        s.write_json(&mut json).unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(text.contains(r#"{"request":0,"receive":31}"#), "{text}");
        assert_eq!(Schedule::from_json_str(&text, p()).unwrap(), s);
        let mut csv = Vec::new();
        s.write_csv(&mut csv).unwrap();
        let text = String::from_utf8(csv).unwrap();
        assert_eq!(
            text,
            "batch,request,tokens,cached\n0,0,receive,31\n0,1,2,0\n1,0,1,0\n1,2,receive,0\n"
        );
        assert_eq!(
            Schedule::from_csv_str(&text, p()).unwrap().batches,
            s.batches
        );
        assert_eq!(s.batches[0].to_string(), "0:receive31 1:2");
        // A receive names its tokens: the fourth column, or nothing but them in JSON.
        let e = Schedule::from_csv_str("batch,request,tokens\n0,0,receive\n", p()).unwrap_err();
        assert!(e.to_string().contains("fourth column"), "{e}");
        let e = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": [{"request": 0, "receive": 3, "tokens": 1}]}]}"#,
            p(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("entries[0]") && e.to_string().contains("nothing else"),
            "{e}"
        );
    }

    #[test]
    fn cache_hits_round_trip_and_only_schedules_with_hits_write_them() {
        let s = Schedule::new(vec![
            Batch::new(vec![Entry::process(0, 32)]),
            Batch::new(vec![Entry::cached_process(1, 16, 4), Entry::evict(0)]),
        ]);
        assert!(s.has_cache_hits());
        let mut json = Vec::new();
        s.write_json(&mut json).unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(
            text.contains(r#"{"request":1,"tokens":4,"cached":16}"#),
            "{text}"
        );
        assert_eq!(Schedule::from_json_str(&text, p()).unwrap(), s);
        let mut csv = Vec::new();
        s.write_csv(&mut csv).unwrap();
        let text = String::from_utf8(csv).unwrap();
        assert_eq!(
            text,
            "batch,request,tokens,cached\n0,0,32,0\n1,1,4,16\n1,0,evict,0\n"
        );
        assert_eq!(
            Schedule::from_csv_str(&text, p()).unwrap().batches,
            s.batches
        );
        assert_eq!(s.batches[1].entries[0].to_string(), "1:hit16+4");
        // Without hits, the forms are as before.
        let plain = Schedule::new(vec![Batch::new(vec![Entry::process(0, 3)])]);
        let mut csv = Vec::new();
        plain.write_csv(&mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "batch,request,tokens\n0,0,3\n"
        );
        // An eviction cannot take from the cache, in either form.
        let e =
            Schedule::from_csv_str("batch,request,tokens,cached\n0,0,evict,2\n", p()).unwrap_err();
        assert!(e.to_string().contains("line 2, column cached"), "{e}");
        let e = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": [{"request": 0, "evict": true, "cached": 2}]}]}"#,
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("an eviction"), "{e}");
    }

    #[test]
    fn errors_name_the_place() {
        let e = Schedule::from_json_str(r#"{"format": "other", "batches": []}"#, p()).unwrap_err();
        assert!(e.to_string().contains("format: expected"), "{e}");
        let e = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": []}, {"entries": [{"request": 1}]}]}"#,
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("batches[1].entries[0]"), "{e}");
        let e = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": [{"request": 1, "tokens": 2, "evict": true}]}]}"#,
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("both"), "{e}");
        let e = Schedule::from_json_str("{\"format\": \"infersched-schedule/1\",\n \"batches\": [{\"entries\": [{\"request\": -1, \"tokens\": 1}]}]}", p()).unwrap_err();
        assert!(e.to_string().starts_with("s.json: line 2"), "{e}");
        let e = Schedule::from_json_str(
            r#"{"format": "infersched-schedule/1", "batches": [{"entries": [], "typo": 1}]}"#,
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("typo"), "{e}");
        let e = Schedule::from_csv_str("batch,request,tokens\n1,0,3\n0,0,2\n", p()).unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = Schedule::from_csv_str("batch,request,tokens\n0,0,x\n", p()).unwrap_err();
        assert!(e.to_string().contains("line 2, column tokens"), "{e}");
    }
}
