//! What a replay writes and prints: `requests.csv`, `batches.csv`, `summary.json`.
//!
//! Every file is written atomically (temporary file, then rename), and floats are
//! printed in their shortest round-trip form, so identical inputs give identical bytes.

use crate::core::io::write_atomic;
use crate::core::{Replay, Summary};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| x.to_string())
}

/// Writes `requests.csv`: one row per request with its times and latencies.
pub fn write_requests_csv(replay: &Replay, w: &mut dyn Write) -> io::Result<()> {
    w.write_all(b"request,input_tokens,output_tokens,arrival_s,first_scheduled_s,first_token_s,completion_s,queueing_delay_s,ttft_s,tpot_s,e2e_s,normalized_latency_s,max_tbt_s,evictions,recomputed_tokens,processed_tokens\n")?;
    for r in &replay.requests {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.id,
            r.input_tokens,
            r.output_tokens,
            r.arrival_s,
            r.first_scheduled_s,
            r.first_token_s,
            r.completion_s,
            r.queueing_delay_s(),
            r.ttft_s(),
            opt(r.tpot_s()),
            r.e2e_s(),
            r.normalized_latency_s(),
            r.max_tbt_s,
            r.evictions,
            r.recomputed_tokens,
            r.processed_tokens
        )?;
    }
    Ok(())
}

/// Writes `batches.csv`: one row per batch with its times, features and KV use.
pub fn write_batches_csv(replay: &Replay, w: &mut dyn Write) -> io::Result<()> {
    w.write_all(b"batch,start_s,end_s,duration_s,prefill_entries,decode_entries,evictions,tokens,prefill_tokens,decode_tokens,decode_kv,prefill_attn,prefill_ctx,generated,finished,kv_tokens,kv_utilization,running\n")?;
    let m = replay.limits.kv_capacity;
    for b in &replay.batches {
        let f = &b.features;
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            b.index,
            b.start_s,
            b.end_s,
            b.duration_s(),
            f.n_prefill,
            f.n_decode,
            b.evictions,
            f.tokens,
            b.prefill_tokens,
            f.n_decode,
            f.decode_kv,
            f.prefill_attn,
            f.prefill_ctx,
            b.generated,
            b.finished,
            b.kv_tokens,
            opt(m.map(|m| b.kv_tokens as f64 / m as f64)),
            b.running
        )?;
    }
    Ok(())
}

/// Writes `requests.csv`, `batches.csv` and `summary.json` into `dir`; returns their paths.
pub fn write_replay_outputs(
    dir: &Path,
    replay: &Replay,
    summary: &Summary,
) -> io::Result<Vec<PathBuf>> {
    let paths = [
        dir.join("requests.csv"),
        dir.join("batches.csv"),
        dir.join("summary.json"),
    ];
    write_atomic(&paths[0], |w| write_requests_csv(replay, w))?;
    write_atomic(&paths[1], |w| write_batches_csv(replay, w))?;
    write_atomic(&paths[2], |w| {
        serde_json::to_writer_pretty(&mut *w, summary)?;
        w.write_all(b"\n")
    })?;
    Ok(paths.to_vec())
}

/// A cell of [`text_table`].
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text as is.
    Text(String),
    /// A time in seconds (`None`: not defined, shown as `-`), printed in its column's unit.
    Time(Option<f64>),
}

/// A terminal table: the first column left-aligned, the others right-aligned; every
/// column of times in one unit, named in its header (`s` when its largest value is at least
/// 10 s, else `ms`), so a column never mixes units.
pub fn text_table(headers: &[&str], rows: &[Vec<Cell>]) -> String {
    let mut columns: Vec<Vec<String>> = Vec::with_capacity(headers.len());
    for (c, h) in headers.iter().enumerate() {
        let times: Vec<f64> = rows
            .iter()
            .filter_map(|r| match r.get(c) {
                Some(Cell::Time(Some(x))) => Some(*x),
                _ => None,
            })
            .collect();
        let is_time = rows.iter().any(|r| matches!(r.get(c), Some(Cell::Time(_))));
        let in_s = times.iter().any(|x| x.abs() >= 10.0);
        let mut col = vec![if is_time {
            format!("{h} ({})", if in_s { "s" } else { "ms" })
        } else {
            h.to_string()
        }];
        for r in rows {
            col.push(match r.get(c) {
                Some(Cell::Text(t)) => t.clone(),
                Some(Cell::Time(Some(x))) if in_s => format!("{x:.2}"),
                Some(Cell::Time(Some(x))) => format!("{:.3}", x * 1e3),
                Some(Cell::Time(None)) | None => "-".into(),
            });
        }
        columns.push(col);
    }
    let widths: Vec<usize> = columns
        .iter()
        .map(|c| c.iter().map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut t = String::new();
    for line in 0..=rows.len() {
        let cells: Vec<String> = columns
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (col, &w))| {
                if c == 0 {
                    format!("{:<w$}", col[line])
                } else {
                    format!("{:>w$}", col[line])
                }
            })
            .collect();
        t.push_str(cells.join("  ").trim_end());
        t.push('\n');
    }
    t
}

fn ms(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.2} s")
    } else {
        format!("{:.2} ms", x * 1e3)
    }
}

/// A readable summary for the terminal.
pub fn summary_text(s: &Summary) -> String {
    let mut t = String::new();
    let line = |t: &mut String, k: &str, v: String| t.push_str(&format!("  {k:<22}{v}\n"));
    line(
        &mut t,
        "requests / batches",
        format!("{} / {} ({} busy)", s.requests, s.batches, s.busy_batches),
    );
    line(&mut t, "makespan", ms(s.makespan_s));
    line(
        &mut t,
        "throughput",
        s.throughput_tok_s.map_or("n/a (makespan 0)".into(), |x| {
            format!("{x:.1} output tokens/s")
        }),
    );
    let dist = |d: &crate::core::Distribution| {
        format!(
            "mean {}  p50 {}  p90 {}  p99 {}",
            ms(d.mean),
            ms(d.p50),
            ms(d.p90),
            ms(d.p99)
        )
    };
    line(&mut t, "TTFT", dist(&s.ttft_s));
    if let Some(d) = &s.tpot_s {
        line(&mut t, "TPOT", dist(d));
    }
    line(&mut t, "E2E latency", dist(&s.e2e_s));
    if let Some(p) = s.p99_tbt_s {
        line(&mut t, "p99 TBT", ms(p));
    }
    line(
        &mut t,
        "evictions",
        format!(
            "{} ({} tokens recomputed)",
            s.evictions, s.recomputed_tokens
        ),
    );
    line(
        &mut t,
        "mean batch",
        format!(
            "{:.2} requests, {:.1} tokens",
            s.mean_batch_size, s.mean_batch_tokens
        ),
    );
    let kv = match (s.kv_capacity, s.peak_kv_utilization) {
        (Some(m), Some(u)) => format!(
            "peak {} of M = {} tokens ({:.1}%)",
            s.peak_kv_tokens,
            m,
            u * 100.0
        ),
        _ => format!("peak {} tokens (M unlimited)", s.peak_kv_tokens),
    };
    line(&mut t, "KV", kv);
    t
}

/// A table comparing schedulers' main metrics, one row each.
pub fn comparison_table(rows: &[(&str, Summary)]) -> String {
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|(name, s)| {
            vec![
                Cell::Text(name.to_string()),
                Cell::Time(Some(s.makespan_s)),
                Cell::Time(Some(s.e2e_s.mean)),
                Cell::Time(Some(s.e2e_s.p99)),
                Cell::Time(Some(s.ttft_s.mean)),
                Cell::Time(Some(s.ttft_s.p99)),
                Cell::Time(s.tpot_s.as_ref().map(|d| d.mean)),
                Cell::Time(s.p99_tbt_s),
                Cell::Text(s.throughput_tok_s.map_or("-".into(), |x| format!("{x:.1}"))),
                Cell::Text(s.evictions.to_string()),
                Cell::Text(s.batches.to_string()),
            ]
        })
        .collect();
    text_table(
        &[
            "scheduler",
            "makespan",
            "mean E2E",
            "p99 E2E",
            "mean TTFT",
            "p99 TTFT",
            "mean TPOT",
            "p99 TBT",
            "tok/s",
            "evictions",
            "batches",
        ],
        &cells,
    )
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn a_time_column_keeps_one_unit_named_in_its_header() {
        let rows = vec![
            vec![
                Cell::Text("a".into()),
                Cell::Time(Some(12.5)),
                Cell::Time(Some(0.0123)),
            ],
            vec![
                Cell::Text("bb".into()),
                Cell::Time(Some(0.5)),
                Cell::Time(None),
            ],
        ];
        let t = text_table(&["name", "makespan", "TTFT"], &rows);
        assert_eq!(
            t,
            "name  makespan (s)  TTFT (ms)\n\
             a            12.50     12.300\n\
             bb            0.50          -\n"
        );
    }
}
