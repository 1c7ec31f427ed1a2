//! What a replay writes and prints: `requests.csv`, `batches.csv`, `summary.json`.
//!
//! Every file is written atomically (temporary file, then rename), and floats are
//! printed in their shortest round-trip form, so identical inputs give identical bytes.

use crate::core::io::write_atomic;
use crate::core::{Replay, Schedule, Summary};
use crate::cost_model::TimeBreakdown;
use crate::solver::{Objective, SolveReport};
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

/// Writes a run's `schedule.json` and its replay's outputs (`requests.csv`,
/// `batches.csv`, `summary.json`) into `dir`, as `simulate --out` does per scheduler;
/// returns their paths.
pub fn write_run_outputs(
    dir: &Path,
    schedule: &Schedule,
    replay: &Replay,
    summary: &Summary,
) -> io::Result<Vec<PathBuf>> {
    let schedule_path = dir.join("schedule.json");
    schedule.write(&schedule_path).map_err(io::Error::other)?;
    let mut paths = vec![schedule_path];
    paths.extend(write_replay_outputs(dir, replay, summary)?);
    Ok(paths)
}

/// Writes what `solve --out` writes: the solver's schedule (`schedule.json`, its meta
/// naming the solver and `objective`), the replay's outputs and `solve.json` (the
/// report); returns their paths.
pub fn write_solve_outputs(
    out: &Path,
    report: &SolveReport,
    objective: Objective,
    replay: &Replay,
    summary: &Summary,
) -> io::Result<Vec<PathBuf>> {
    let mut schedule = report.schedule.clone();
    schedule.meta =
        Some(serde_json::json!({"producer": "infersched-solver", "objective": objective}));
    let mut paths = write_run_outputs(out, &schedule, replay, summary)?;
    let solve_path = out.join("solve.json");
    let json = serde_json::to_string_pretty(report)? + "\n";
    crate::core::io::write_bytes_atomic(&solve_path, json.as_bytes())?;
    paths.push(solve_path);
    Ok(paths)
}

/// A cell of [`text_table`].
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text as is.
    Text(String),
    /// A time in seconds (`None`: not defined, shown as `-`), printed in its column's unit.
    Time(Option<f64>),
}

/// The columns of a table, each its header first and then its rows' cells as text: every
/// column of times in one unit, named in its header (`s` when its largest value is at least
/// 10 s, else `ms`), so a column never mixes units. Shared by [`text_table`] and
/// [`html_table`], so the terminal and the report print the same numbers.
pub fn table_columns(headers: &[&str], rows: &[Vec<Cell>]) -> Vec<Vec<String>> {
    let mut columns: Vec<Vec<String>> = Vec::with_capacity(headers.len());
    for (c, h) in headers.iter().enumerate() {
        let is_time = rows.iter().any(|r| matches!(r.get(c), Some(Cell::Time(_))));
        let in_s = rows
            .iter()
            .any(|r| matches!(r.get(c), Some(Cell::Time(Some(x))) if x.abs() >= 10.0));
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
    columns
}

/// An HTML `<table>` of [`table_columns`] (headers in `<th>`, text escaped), inside a
/// `<div class="table">` that scrolls sideways rather than widening the page.
pub fn html_table(headers: &[&str], rows: &[Vec<Cell>]) -> String {
    let columns = table_columns(headers, rows);
    let mut h = String::from("<div class=\"table\"><table>\n");
    for line in 0..=rows.len() {
        h.push_str("<tr>");
        let tag = if line == 0 { "th" } else { "td" };
        for col in &columns {
            h.push_str(&format!(
                "<{tag}>{}</{tag}>",
                crate::report::svg::escape(&col[line])
            ));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table></div>\n");
    h
}

/// A terminal table: the first column left-aligned, the others right-aligned, the columns
/// of [`table_columns`].
pub fn text_table(headers: &[&str], rows: &[Vec<Cell>]) -> String {
    let columns = table_columns(headers, rows);
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

/// A pipeline for people: `2 stages, each send 7.2 us + 36.41 ns per token`.
fn pipeline_text(p: &crate::core::Pipeline) -> String {
    format!(
        "{} stages, each send {:.1} us + {:.2} ns per token",
        p.stages,
        p.send_latency_s * 1e6,
        p.send_s_per_token * 1e9
    )
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
    if let Some(p) = &s.pipeline {
        line(&mut t, "pipeline", pipeline_text(p));
    }
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
    let disaggregated = s
        .cluster
        .as_ref()
        .is_some_and(|c| c.prefill_replicas.is_some());
    if s.cached_tokens > 0 && disaggregated {
        line(
            &mut t,
            "KV moved",
            format!(
                "{} prompt tokens' KV taken from the prefill replicas (each last prompt token computed again)",
                s.cached_tokens
            ),
        );
    } else if s.cached_tokens > 0 {
        line(
            &mut t,
            "prefix cache",
            format!(
                "{} tokens taken from the cache ({:.1}% of prompt tokens)",
                s.cached_tokens,
                100.0 * s.cached_tokens as f64 / s.prompt_tokens.max(1) as f64
            ),
        );
    }
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
    if let Some(r) = &s.slo {
        slo_lines(&mut t, r);
    }
    t
}

/// The SLO lines of [`summary_text`]: attainment and goodput, then each SLO's aggregate.
fn slo_lines(t: &mut String, r: &crate::core::SloReport) {
    let per_s = |x: Option<f64>, unit: &str| x.map_or("n/a".into(), |x| format!("{x:.2} {unit}/s"));
    t.push_str(&format!(
        "  {:<22}{:.1}% of requests meet every SLO ({}); goodput {}, {}\n",
        "SLO attainment",
        r.attainment * 100.0,
        r.good_requests,
        per_s(r.goodput_requests_per_s, "requests"),
        per_s(r.goodput_tokens_per_s, "output tokens")
    ));
    for s in &r.slos {
        t.push_str(&format!(
            "  {:<22}{} {} (met by {:.1}% of requests)\n",
            "",
            s.slo,
            match (s.value_s, s.holds) {
                (None, _) => "holds: no values".to_string(),
                (Some(v), true) => format!("holds: {}", ms(v)),
                (Some(v), false) => format!("MISSED: {}", ms(v)),
            },
            s.met_by * 100.0
        ));
    }
}

/// The short names of the time-split terms in tables, in [`TimeBreakdown::terms`] order.
pub const TIME_SPLIT_HEADERS: [&str; 6] = [
    "batch bias",
    "per entry",
    "tokens",
    "attention",
    "recompute",
    "idle",
];

/// One line for the terminal: where the makespan goes, term by term with its share.
pub fn time_split_text(b: &TimeBreakdown) -> String {
    let total = b.total_s();
    let parts: Vec<String> = TIME_SPLIT_HEADERS
        .iter()
        .zip(b.terms())
        .map(|(name, x)| {
            let share = if total > 0.0 { x / total * 100.0 } else { 0.0 };
            format!("{name} {} ({share:.1}%)", ms(x))
        })
        .collect();
    format!("  {:<22}{}\n", "makespan split", parts.join(", "))
}

/// A table of where each scheduler's makespan goes (the cost model's terms and idle
/// time), one row each; with `reference` (a row's name and how the heading calls it), a
/// second table of each row's difference to it term by term (what it spends more, negative
/// where less).
pub fn time_split_table(rows: &[(&str, TimeBreakdown)], reference: Option<(&str, &str)>) -> String {
    let mut headers = vec!["scheduler"];
    headers.extend(TIME_SPLIT_HEADERS);
    headers.push("makespan");
    let row = |name: &str, terms: [f64; 6]| -> Vec<Cell> {
        let mut cells = vec![Cell::Text(name.to_string())];
        cells.extend(terms.iter().map(|&x| Cell::Time(Some(x))));
        cells.push(Cell::Time(Some(terms.iter().sum())));
        cells
    };
    let cells: Vec<Vec<Cell>> = rows.iter().map(|(n, b)| row(n, b.terms())).collect();
    let mut t = text_table(&headers, &cells);
    let base = reference.and_then(|(r, label)| {
        rows.iter()
            .find(|(n, _)| *n == r)
            .map(|(n, b)| (*n, label, b))
    });
    if let Some((base_name, label, base)) = base {
        let diffs: Vec<Vec<Cell>> = rows
            .iter()
            .filter(|(n, _)| *n != base_name)
            .map(|(n, b)| row(n, b.minus(base)))
            .collect();
        if !diffs.is_empty() {
            t.push_str(&format!("\nmore than {label} (negative: less)\n"));
            t.push_str(&text_table(&headers, &diffs));
        }
    }
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
    fn terminal_and_html_tables_print_each_time_column_in_one_unit() {
        let rows = vec![
            vec![
                Cell::Text("a<b".into()),
                Cell::Time(Some(12.5)),
                Cell::Time(Some(0.0042)),
            ],
            vec![
                Cell::Text("c".into()),
                Cell::Time(Some(0.25)),
                Cell::Time(None),
            ],
        ];
        let cols = table_columns(&["name", "makespan", "TPOT"], &rows);
        // A column with a value of 10 s or more is in s, the other in ms; none mixes.
        assert_eq!(cols[1], ["makespan (s)", "12.50", "0.25"]);
        assert_eq!(cols[2], ["TPOT (ms)", "4.200", "-"]);
        let html = html_table(&["name", "makespan", "TPOT"], &rows);
        assert!(html.contains("<th>makespan (s)</th>"), "{html}");
        assert!(
            html.contains("<td>a&lt;b</td><td>12.50</td><td>4.200</td>"),
            "{html}"
        );
        assert_eq!(html.matches("<tr>").count(), 3);
        let text = text_table(&["name", "makespan", "TPOT"], &rows);
        assert!(
            text.lines()
                .next()
                .unwrap()
                .ends_with("makespan (s)  TPOT (ms)"),
            "{text}"
        );
        assert!(text.contains("12.50"), "{text}");
    }

    #[test]
    fn the_time_split_table_shows_each_term_and_the_difference_to_the_reference() {
        let a = TimeBreakdown {
            batch_bias_s: 0.010,
            entry_overhead_s: 0.001,
            linear_tokens_s: 0.020,
            attention_s: 0.004,
            recomputation_s: 0.0,
            idle_s: 0.005,
        };
        let b = TimeBreakdown {
            batch_bias_s: 0.016,
            recomputation_s: 0.002,
            ..a
        };
        let t = time_split_table(
            &[("optimal", a), ("vllm", b)],
            Some(("optimal", "the best schedule found (not proven optimal)")),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "scheduler  batch bias (ms)  per entry (ms)  tokens (ms)  attention (ms)  recompute (ms)  idle (ms)  makespan (ms)"
        );
        assert!(
            lines[1].starts_with("optimal") && lines[1].ends_with("40.000"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("vllm") && lines[2].ends_with("48.000"),
            "{t}"
        );
        assert_eq!(
            lines[4],
            "more than the best schedule found (not proven optimal) (negative: less)"
        );
        // vllm pays 6 ms more bias and 2 ms of recomputation: 8 ms in all.
        let diff: Vec<&str> = lines[6].split_whitespace().collect();
        assert_eq!(
            diff,
            [
                "vllm", "6.000", "0.000", "0.000", "0.000", "2.000", "0.000", "8.000"
            ]
        );
        let line = time_split_text(&a);
        assert!(line.contains("batch bias 10.00 ms (25.0%)"), "{line}");
        assert!(line.contains("idle 5.00 ms (12.5%)"), "{line}");
    }

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
