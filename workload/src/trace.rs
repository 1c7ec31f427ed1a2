//! Vidur/Splitwise processed-trace CSV files.

pub use crate::error::TraceError;
use infersched_core::request::MAX_ARRIVAL_S;
use infersched_core::{PrefixIds, Request, Workload};
use std::io::{self, Write};
use std::path::Path;

/// Reads a trace: a CSV file, or a Mooncake JSONL file (name ending in `.jsonl`).
pub fn read_trace(path: &Path) -> Result<Workload, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        crate::mooncake::read_mooncake_str(&text, path, crate::mooncake::MOONCAKE_BLOCK_TOKENS)
    } else {
        read_trace_str(&text, path)
    }
}

fn parse_count(s: &str) -> Option<u32> {
    if let Ok(v) = s.parse::<u32>() {
        return Some(v);
    }
    // Accept integer-valued floats ("54.0"), as pandas sometimes writes them.
    let v = s.parse::<f64>().ok()?;
    (v.fract() == 0.0 && v >= 0.0 && v <= f64::from(u32::MAX)).then_some(v as u32)
}

/// Parses trace CSV text; `path` names it in errors. Request ids are 0-based data-row
/// indices. Columns: `num_prefill_tokens` (I >= 1), `num_decode_tokens` (O >= 1),
/// optional `arrived_at` (seconds >= 0; all 0 when absent); others are ignored.
pub fn read_trace_str(text: &str, path: &Path) -> Result<Workload, TraceError> {
    let invalid = |location: String, reason: String| TraceError::Invalid {
        path: path.to_owned(),
        location,
        reason,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = rdr
        .headers()
        .map_err(|e| invalid("header".into(), e.to_string()))?
        .clone();
    for name in ["num_prefill_tokens", "num_decode_tokens", "arrived_at"] {
        if header.iter().filter(|h| *h == name).count() > 1 {
            return Err(invalid(
                "header".into(),
                format!(
                    "the column \"{name}\" appears more than once; which one is meant is ambiguous"
                ),
            ));
        }
    }
    let find = |name: &str| header.iter().position(|h| h == name);
    let input_col = find("num_prefill_tokens").ok_or_else(|| {
        invalid(
            "header".into(),
            "expected a column \"num_prefill_tokens\" (and \"num_decode_tokens\", optional \"arrived_at\")".into(),
        )
    })?;
    let output_col = find("num_decode_tokens").ok_or_else(|| {
        invalid(
            "header".into(),
            "expected a column \"num_decode_tokens\"".into(),
        )
    })?;
    let arrival_col = find("arrived_at");
    let hash_cols = match (find("hash_block_tokens"), find("hash_ids")) {
        (Some(b), Some(h)) => Some((b, h)),
        (None, None) => None,
        _ => {
            return Err(invalid(
                "header".into(),
                "expected both \"hash_block_tokens\" and \"hash_ids\" (prompt block ids) or neither".into(),
            ));
        }
    };
    let mut prefix: Option<PrefixIds> = None;
    let mut requests = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            invalid(format!("line {line}"), e.to_string())
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        let count = |k: usize, name: &str| -> Result<u32, TraceError> {
            let s = rec.get(k).unwrap_or("");
            match parse_count(s) {
                Some(v) if v >= 1 => Ok(v),
                _ => Err(invalid(
                    format!("line {line}, column {name}"),
                    format!(
                        "expected a whole number of tokens from 1 to {}, got \"{}\"",
                        u32::MAX,
                        infersched_core::io::excerpt(s)
                    ),
                )),
            }
        };
        let input_tokens = count(input_col, "num_prefill_tokens")?;
        let output_tokens = count(output_col, "num_decode_tokens")?;
        let arrival_s = match arrival_col {
            None => 0.0,
            Some(k) => parse_arrival(rec.get(k).unwrap_or(""))
                .map_err(|reason| invalid(format!("line {line}, column arrived_at"), reason))?,
        };
        if let Some((b, h)) = hash_cols {
            let block = count(b, "hash_block_tokens")?;
            push_prefix_row(&mut prefix, block, rec.get(h).unwrap_or(""), line)
                .map_err(|(location, reason)| invalid(location, reason))?;
        }
        requests.push(Request {
            input_tokens,
            output_tokens,
            arrival_s,
        });
    }
    let to_error = |source| TraceError::Workload {
        path: path.to_owned(),
        source,
    };
    let w = Workload::new(requests).map_err(to_error)?;
    match prefix {
        Some(p) => w.with_prefix(p).map_err(to_error),
        None => Ok(w),
    }
}

/// An `arrived_at` value: seconds from 0 to [`MAX_ARRIVAL_S`], else what was expected.
fn parse_arrival(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=MAX_ARRIVAL_S).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a time in seconds from 0 to {MAX_ARRIVAL_S:e} (beyond it batch times added to it lose their resolution), got \"{}\"",
            infersched_core::io::excerpt(s)
        )),
    }
}

/// Adds one row's prompt block ids (`ids` as written, blocks of `block` tokens) to
/// `prefix`; an error is the location on `line` and what was expected.
fn push_prefix_row(
    prefix: &mut Option<PrefixIds>,
    block: u32,
    ids: &str,
    line: u64,
) -> Result<(), (String, String)> {
    let p = prefix.get_or_insert_with(|| PrefixIds {
        block_tokens: block,
        ids: Vec::new(),
    });
    if p.block_tokens != block {
        return Err((
            format!("line {line}, column hash_block_tokens"),
            format!(
                "expected the same block size on every row ({}), got {block}",
                p.block_tokens
            ),
        ));
    }
    let parsed = parse_ids(ids).ok_or_else(|| {
        (
            format!("line {line}, column hash_ids"),
            format!(
                "expected block ids (whole numbers) separated by spaces, got \"{}\"",
                infersched_core::io::excerpt(ids)
            ),
        )
    })?;
    p.ids.push(parsed);
    Ok(())
}

/// Block ids separated by spaces (none for an empty field).
fn parse_ids(s: &str) -> Option<Vec<u64>> {
    s.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// Writes a workload as trace CSV (`arrived_at,num_prefill_tokens,num_decode_tokens`, and
/// `hash_block_tokens,hash_ids` where it has prompt block ids, the ids separated by
/// spaces).
pub fn write_trace_to(workload: &Workload, w: &mut dyn Write) -> io::Result<()> {
    let Some(p) = workload.prefix() else {
        w.write_all(b"arrived_at,num_prefill_tokens,num_decode_tokens\n")?;
        for r in workload.requests() {
            writeln!(w, "{},{},{}", r.arrival_s, r.input_tokens, r.output_tokens)?;
        }
        return Ok(());
    };
    w.write_all(b"arrived_at,num_prefill_tokens,num_decode_tokens,hash_block_tokens,hash_ids\n")?;
    for (r, ids) in workload.requests().iter().zip(&p.ids) {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        writeln!(
            w,
            "{},{},{},{},{}",
            r.arrival_s,
            r.input_tokens,
            r.output_tokens,
            p.block_tokens,
            ids.join(" ")
        )?;
    }
    Ok(())
}

/// Writes a workload to `path` atomically.
pub fn write_trace(workload: &Workload, path: &Path) -> Result<(), TraceError> {
    infersched_core::io::write_atomic(path, |w| write_trace_to(workload, w)).map_err(|source| {
        TraceError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("t.csv")
    }

    #[test]
    fn reads_both_bundled_formats_and_round_trips() {
        let w = read_trace_str(
            "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n3772,54,3826,69.8\n2015,156.0,2171,12.9\n",
            p(),
        )
        .unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w.requests()[1].output_tokens, 156);
        assert_eq!(w.requests()[1].arrival_s, 0.0);
        let w = read_trace_str(
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4808,10\n0.052,3180,8\n",
            p(),
        )
        .unwrap();
        assert_eq!(w.requests()[1].arrival_s, 0.052);
        let mut out = Vec::new();
        write_trace_to(&w, &mut out).unwrap();
        let back = read_trace_str(std::str::from_utf8(&out).unwrap(), p()).unwrap();
        assert_eq!(back, w);
        // A byte-order mark (spreadsheet exports) is not part of the first column's name.
        let bom =
            read_trace_str("\u{feff}num_prefill_tokens,num_decode_tokens\n5,3\n", p()).unwrap();
        assert_eq!(bom.requests()[0].input_tokens, 5);
    }

    #[test]
    fn hostile_fields_get_bounded_precise_errors() {
        // A duplicated column is ambiguous, not "the first wins".
        let e = read_trace_str(
            "num_prefill_tokens,num_decode_tokens,num_decode_tokens\n4,2,3\n",
            p(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("header") && e.contains("\"num_decode_tokens\" appears more than once"),
            "{e}"
        );
        // An arrival where f64 time would round batch times away.
        let e = read_trace_str(
            "num_prefill_tokens,num_decode_tokens,arrived_at\n4,2,0\n4,2,1e18\n",
            p(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 3, column arrived_at") && e.contains("1e10"),
            "{e}"
        );
        // A huge field is cut in the message.
        let field = "9".repeat(1_000_000);
        let e = read_trace_str(
            &format!("num_prefill_tokens,num_decode_tokens\n{field},2\n"),
            p(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(
            e.contains("(1000000 bytes)") && e.contains("from 1 to 4294967295"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let e = read_trace_str("a,b\n1,2\n", p()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.csv: header: expected a column \"num_prefill_tokens\""),
            "{e}"
        );
        let e =
            read_trace_str("num_prefill_tokens,num_decode_tokens\n5,3\n0,3\n", p()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 3, column num_prefill_tokens: expected a whole number of tokens from 1 to 4294967295, got \"0\""
        );
        let e = read_trace_str("num_prefill_tokens,num_decode_tokens\n5,-3\n", p()).unwrap_err();
        assert!(
            e.to_string().contains("line 2, column num_decode_tokens"),
            "{e}"
        );
        let e = read_trace_str("num_prefill_tokens,num_decode_tokens\n5,2.5\n", p()).unwrap_err();
        assert!(e.to_string().contains("got \"2.5\""), "{e}");
        let e = read_trace_str(
            "arrived_at,num_prefill_tokens,num_decode_tokens\n-1,5,3\n",
            p(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("column arrived_at"), "{e}");
        let e = read_trace_str("num_prefill_tokens,num_decode_tokens\n5,3,9\n", p()).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = read_trace_str("num_prefill_tokens,num_decode_tokens\n", p()).unwrap_err();
        assert!(e.to_string().contains("no requests"), "{e}");
    }
}
