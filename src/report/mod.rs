//! Reports: plots (SVG and PNG), Chrome traces and the self-contained `report.html` of a
//! comparison.

pub mod plots;
pub mod svg;
pub mod trace;

use crate::compare::{self, Comparison, ComparisonRow, Reference, Setting};
use crate::core::Workload;
use crate::core::io::write_bytes_atomic;
use crate::cost_model::TimeBreakdown;
use crate::output::{Cell, html_table, text_table};
use crate::solver::Objective;
use rayon::prelude::*;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

/// A named plot.
#[derive(Debug, Clone)]
pub struct Plot {
    /// File stem (`kv-memory` gives `kv-memory.svg` and `kv-memory.png`).
    pub stem: String,
    /// Caption in the report.
    pub caption: String,
    /// The drawing.
    pub svg: svg::Svg,
}

/// Writes `<dir>/<stem>.svg` and (with the `png` feature) `<dir>/<stem>.png` for each plot
/// (PNGs rendered in parallel).
pub fn write_plots(dir: &Path, plots: &[Plot]) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let written: Vec<io::Result<Vec<PathBuf>>> = plots
        .par_iter()
        .map(|p| {
            let doc = p.svg.finish();
            let svg_path = dir.join(format!("{}.svg", p.stem));
            write_bytes_atomic(&svg_path, doc.as_bytes())?;
            #[cfg(feature = "png")]
            {
                let png = svg::render_png(&doc).map_err(io::Error::other)?;
                let png_path = dir.join(format!("{}.png", p.stem));
                write_bytes_atomic(&png_path, &png)?;
                Ok(vec![svg_path, png_path])
            }
            #[cfg(not(feature = "png"))]
            Ok(vec![svg_path])
        })
        .collect();
    let mut out = Vec::new();
    for r in written {
        out.extend(r?);
    }
    Ok(out)
}

fn objective_label(o: Objective) -> &'static str {
    match o {
        Objective::Makespan => "makespan",
        Objective::MeanLatency => "mean E2E latency",
        Objective::MeanTtft => "mean TTFT",
    }
}

/// The comparison's plots.
pub fn comparison_plots(w: &Workload, c: &Comparison) -> Vec<Plot> {
    let rows = c.rows();
    // Series go by the rows' labels: the solver's unproven schedule is `best-found`.
    let labelled: Vec<(String, &crate::produce::Outcome)> = rows
        .iter()
        .zip(c.succeeded())
        .map(|(r, (_, o))| (r.label.clone(), o))
        .collect();
    let runs: Vec<(&str, &crate::produce::Outcome)> =
        labelled.iter().map(|(n, o)| (n.as_str(), *o)).collect();
    // A cluster's KV and timeline are per replica (in each replica-K/ folder's files).
    let single: Vec<_> = runs
        .iter()
        .copied()
        .filter(|(_, o)| o.cluster.is_none())
        .collect();
    let caption = match compare::reference(&rows) {
        Reference::Optimum => format!(
            "{} of each scheduler divided by the proven optimum (dashed red: the solver's lower bound)",
            objective_label(c.objective)
        ),
        Reference::BestFound => format!(
            "{} of each scheduler divided by the best schedule the solver found, which is not proven optimal (dashed red: the proven lower bound)",
            objective_label(c.objective)
        ),
        Reference::NoSolver => format!(
            "{} of each scheduler divided by the best scheduler's (no solver ran: no optimum or bound)",
            objective_label(c.objective)
        ),
    };
    let mut plots = vec![Plot {
        stem: "objective".into(),
        caption,
        svg: plots::objective_bars(&rows, objective_label(c.objective)),
    }];
    if !single.is_empty() {
        plots.push(Plot {
            stem: "kv-memory".into(),
            caption: "KV cache tokens held after each batch; dashed red: the capacity M".into(),
            svg: plots::kv_memory(&single, c.limits.kv_capacity),
        });
    }
    plots.extend([
        Plot {
            stem: "latency-cdf".into(),
            caption: "Latency distributions over requests".into(),
            svg: plots::latency_cdfs(&runs),
        },
        Plot {
            stem: "tokens-per-batch".into(),
            caption: if single.len() == runs.len() {
                "Tokens processed per batch, at each batch's start".into()
            } else {
                "Tokens processed per batch (every replica's), at each batch's start".into()
            },
            svg: plots::tokens_per_batch(&runs),
        },
    ]);
    if single.len() < runs.len() {
        plots.push(Plot {
            stem: "replica-load".into(),
            caption: "Time each replica ran batches, per scheduler: how evenly the requests were spread (per-replica requests, batches and peak KV are in each scheduler's summary.json)".into(),
            svg: plots::replica_load(&runs),
        });
    }
    // Timelines (of requests on one GPU, of replicas on a cluster) and each replica's KV (a
    // cluster) are files named after the contender (its folder's name), titled by label.
    for ((file, o), (label, _)) in c.succeeded().into_iter().zip(&runs) {
        match &o.cluster {
            None => plots.push(Plot {
                stem: format!("timeline-{file}"),
                caption: format!("{label}: what each request is doing over time"),
                svg: plots::timeline(w, label, o),
            }),
            Some(parts) => plots.extend([
                Plot {
                    stem: format!("timeline-{file}"),
                    caption: format!(
                        "{label}: each replica's batches over time (each request's own timeline is in its replica's trace.json)"
                    ),
                    svg: plots::replica_timeline(label, parts),
                },
                Plot {
                    stem: format!("kv-memory-{file}"),
                    caption: format!(
                        "{label}: KV cache tokens held after each batch on each replica; dashed red: the capacity M of each"
                    ),
                    svg: plots::replica_kv_memory(parts, o.limits.kv_capacity),
                },
            ]),
        }
    }
    plots
}

fn fmt_s(x: f64) -> String {
    if x.abs() >= 10.0 {
        format!("{x:.2} s")
    } else {
        format!("{:.3} ms", x * 1e3)
    }
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.4}"))
}

/// The ratio columns of the result tables, with their headers: to the optimum (or the best
/// schedule found) and to the bound where the solver ran; without a solver, only each
/// scheduler's ratio to the best scheduler (`/best`), as the objective plot shows it.
fn ratio_columns(rows: &[ComparisonRow]) -> (Vec<&'static str>, Vec<Vec<Cell>>) {
    let reference = match compare::reference(rows) {
        Reference::Optimum => "/optimum",
        Reference::BestFound => "/best found",
        Reference::NoSolver => {
            let best = rows
                .iter()
                .map(|r| r.objective_s)
                .fold(f64::INFINITY, f64::min);
            let cells = rows
                .iter()
                .map(|r| {
                    let ratio = (best > 0.0).then(|| r.objective_s / best);
                    vec![Cell::Text(fmt_ratio(ratio))]
                })
                .collect();
            return (vec!["/best"], cells);
        }
    };
    let cells = rows
        .iter()
        .map(|r| {
            vec![
                Cell::Text(fmt_ratio(r.ratio_to_optimum)),
                Cell::Text(fmt_ratio(r.ratio_to_bound)),
            ]
        })
        .collect();
    (vec![reference, "/bound"], cells)
}

/// What the marks of the table mean, and whether the best schedule came from a method that
/// reads the true output lengths.
pub fn clairvoyance_notes(rows: &[ComparisonRow]) -> Vec<String> {
    let mut notes = Vec::new();
    if rows.iter().any(|r| r.label.starts_with("best-found")) {
        notes.push(
            "best-found: the solver's best schedule, not proven optimal (its bound and gap are in the table)".to_string(),
        );
    }
    let clairvoyant: Vec<&str> = rows
        .iter()
        .filter(|r| r.clairvoyant)
        .map(|r| r.label.as_str())
        .collect();
    if !clairvoyant.is_empty() {
        notes.push(format!(
            "* clairvoyant ({}): reads the true output lengths, which no online scheduler knows",
            clairvoyant.join(", ")
        ));
    }
    let cached: Vec<&str> = rows
        .iter()
        .filter(|r| r.uses_prefix_cache())
        .map(|r| r.label.as_str())
        .collect();
    if !cached.is_empty() {
        notes.push(format!(
            "^ prefix cache ({}): takes prompt blocks from the prefix cache (or, by vLLM v0's rule, shares them); the solver's schedules and bound take nothing from one, so no ratio to them is given",
            cached.join(", ")
        ));
    }
    if let Some(best) = rows
        .iter()
        .min_by(|a, b| a.objective_s.total_cmp(&b.objective_s))
        .filter(|r| r.clairvoyant)
    {
        notes.push(format!(
            "the best schedule ({}) came from a clairvoyant method",
            best.label
        ));
    }
    notes
}

/// The comparison table for the terminal.
pub fn comparison_text(rows: &[ComparisonRow], objective: Objective) -> String {
    let (ratio_heads, ratios) = ratio_columns(rows);
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .zip(ratios)
        .map(|(r, ratio)| {
            let mut row = vec![
                Cell::Text(r.display_name()),
                Cell::Text(r.status.name().to_string()),
            ];
            row.extend(ratio);
            row.extend([
                Cell::Time(Some(r.makespan_s)),
                Cell::Time(Some(r.e2e_s.mean)),
                Cell::Time(Some(r.e2e_s.p99)),
                Cell::Time(Some(r.ttft_s.mean)),
                Cell::Time(Some(r.ttft_s.p99)),
                Cell::Time(r.tpot_s.map(|q| q.mean)),
                Cell::Text(r.evictions.to_string()),
                Cell::Text(r.batches.to_string()),
            ]);
            row
        })
        .collect();
    let mut t = format!(
        "ratios are of the {} (the objective)\n",
        objective_label(objective)
    );
    let mut headers = vec!["scheduler", "status"];
    headers.extend(ratio_heads);
    headers.extend([
        "makespan",
        "mean E2E",
        "p99 E2E",
        "mean TTFT",
        "p99 TTFT",
        "mean TPOT",
        "evictions",
        "batches",
    ]);
    t.push_str(&text_table(&headers, &cells));
    for line in clairvoyance_notes(rows) {
        t.push_str(&line);
        t.push('\n');
    }
    t.push_str("\nlimits each ran under (heuristics: the limits given and their own defaults):\n");
    for r in rows {
        let _ = writeln!(t, "  {:<10} {}", r.label, r.limits);
    }
    if let Some(d) = distance_to_optimum_text(rows) {
        t.push('\n');
        t.push_str(&d);
    }
    let names: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
    let splits: Vec<(&str, TimeBreakdown)> = rows
        .iter()
        .zip(&names)
        .map(|(r, name)| (name.as_str(), r.time_split))
        .collect();
    let label = match compare::reference(rows) {
        Reference::Optimum => "the proven optimum",
        _ => "the solver's best schedule, not proven optimal,",
    };
    let solver_label = rows
        .iter()
        .find(|r| r.scheduler.is_solver())
        .map(|r| r.label.as_str());
    let _ = write!(
        t,
        "\nwhere the makespan goes (the cost model's terms, and idle time waiting for arrivals):\n{}",
        crate::output::time_split_table(&splits, solver_label.map(|s| (s, label)))
    );
    t
}

/// How far each scheduler is from the optimum, as far as the solver proved it, where the
/// optimum is not proven: it lies between the bound and the best schedule found, so a
/// scheduler's objective is between its ratio to the best schedule found and its ratio to
/// the bound times the optimum: `(scheduler, low, high)` for each scheduler other than the
/// solver's. Empty where the optimum is proven (its ratio is exact) or no solver ran.
pub fn distance_to_optimum(rows: &[ComparisonRow]) -> Vec<(String, f64, f64)> {
    if compare::reference(rows) != Reference::BestFound {
        return Vec::new();
    }
    rows.iter()
        .filter(|r| !r.scheduler.is_solver())
        .filter_map(|r| {
            Some((
                r.scheduler.to_string(),
                r.ratio_to_optimum?,
                r.ratio_to_bound?,
            ))
        })
        .collect()
}

/// [`distance_to_optimum`] for the terminal, or None where it has no line.
pub fn distance_to_optimum_text(rows: &[ComparisonRow]) -> Option<String> {
    let d = distance_to_optimum(rows);
    if d.is_empty() {
        return None;
    }
    let mut t = String::from(
        "how far each scheduler is from the optimum (not proven: it lies between the bound and the best schedule found):\n",
    );
    for (name, low, high) in d {
        let _ = writeln!(t, "  {name:<10} {low:.3}x to {high:.3}x the optimum");
    }
    Some(t)
}

/// The report's results: one table of the objective and latencies, one of batches and
/// memory (split so that neither is wider than the page), every time column in one unit.
fn results_html(rows: &[ComparisonRow], objective: Objective) -> String {
    let pct = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0));
    let objective_head = format!("objective: {}", objective_label(objective));
    let (ratio_heads, ratios) = ratio_columns(rows);
    let latency: Vec<Vec<Cell>> = rows
        .iter()
        .zip(ratios)
        .map(|(r, ratio)| {
            let mut row = vec![
                Cell::Text(r.display_name()),
                Cell::Text(r.status.name().to_string()),
                Cell::Time(Some(r.objective_s)),
            ];
            row.extend(ratio);
            row.extend([
                Cell::Time(Some(r.makespan_s)),
                Cell::Text(r.throughput_tok_s.map_or("-".into(), |x| format!("{x:.1}"))),
                Cell::Time(Some(r.ttft_s.mean)),
                Cell::Time(Some(r.ttft_s.p99)),
                Cell::Time(r.tpot_s.map(|q| q.mean)),
                Cell::Time(r.tpot_s.map(|q| q.p99)),
                Cell::Time(Some(r.e2e_s.mean)),
                Cell::Time(Some(r.e2e_s.p99)),
            ]);
            row
        })
        .collect();
    let mut headers = vec!["scheduler", "status", objective_head.as_str()];
    headers.extend(ratio_heads);
    headers.extend([
        "makespan",
        "throughput (tok/s)",
        "TTFT mean",
        "TTFT p99",
        "TPOT mean",
        "TPOT p99",
        "E2E mean",
        "E2E p99",
    ]);
    let mut h = html_table(&headers, &latency);
    let memory: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| {
            vec![
                Cell::Text(r.display_name()),
                Cell::Text(r.batches.to_string()),
                Cell::Text(format!("{:.2}", r.mean_batch_size)),
                Cell::Text(r.evictions.to_string()),
                Cell::Text(r.recomputed_tokens.to_string()),
                Cell::Text(r.peak_kv_tokens.to_string()),
                Cell::Text(pct(r.peak_kv_utilization)),
                Cell::Text(pct(r.mean_kv_utilization)),
            ]
        })
        .collect();
    h.push_str("<p>Batches, evictions and KV memory (utilization: of the capacity M):</p>\n");
    h.push_str(&html_table(
        &[
            "scheduler",
            "batches",
            "mean batch (requests)",
            "evictions",
            "recomputed tokens",
            "peak KV (tokens)",
            "peak KV utilization",
            "mean KV utilization",
        ],
        &memory,
    ));
    h
}

/// How the solver answered: its status and method, where its schedule and its bound come
/// from, the certified gap and its note (why no exact model ran, which schedule won).
fn solver_html(c: &Comparison) -> String {
    if let Some(r) = c
        .optimal()
        .and_then(|o| o.cluster.as_ref())
        .and_then(|p| p.search.as_ref())
    {
        return cluster_search_html(r);
    }
    let Some(r) = c.optimal().and_then(|o| o.solve.as_ref()) else {
        return String::new();
    };
    let mut h = String::from("<h2>How the solver answered</h2>\n<table>\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(
            h,
            "<tr><th style=\"white-space:nowrap\">{}</th><td style=\"text-align:left;white-space:normal\">{}</td></tr>",
            html_escape(k),
            html_escape(&v)
        );
    };
    row("status", r.status.name().to_string());
    row("method", r.method.name().to_string());
    row(
        "schedule",
        r.warm_start.as_ref().map_or_else(
            || format!("the {} itself", r.method.name()),
            |s| format!("{} ({})", s.heuristic, fmt_s(s.objective)),
        ),
    );
    row(
        "lower bound",
        format!("{} ({})", fmt_s(r.best_bound), r.bound_method.name()),
    );
    row("certified gap", format!("{:.2}%", r.certified_gap * 100.0));
    if let Some(note) = &r.note {
        row("note", note.clone());
    }
    h.push_str("</table>\n");
    h
}

/// The cluster search's answer (`compare --replicas`).
fn cluster_search_html(r: &crate::solver::cluster::ClusterSolveReport) -> String {
    let rows = [
        ("status", r.status.name().to_string()),
        ("method", format!("cluster-{}", r.method.name())),
        (
            "schedule",
            format!(
                "{} behind {} ({} requests moved, {} replicas' parts re-solved)",
                r.scheduler, r.router, r.requests_moved, r.replicas_improved
            ),
        ),
        (
            "lower bound",
            format!(
                "{} ({}; valid for every routing)",
                fmt_s(r.best_bound),
                r.bound_argument.name()
            ),
        ),
        ("certified gap", format!("{:.2}%", r.certified_gap * 100.0)),
    ];
    let mut h = format!(
        "<h2>How the solver answered ({} replicas)</h2>\n<table>\n",
        r.replicas
    );
    for (k, v) in rows {
        let _ = writeln!(
            h,
            "<tr><th style=\"white-space:nowrap\">{}</th><td style=\"text-align:left;white-space:normal\">{}</td></tr>",
            html_escape(k),
            html_escape(&v)
        );
    }
    h.push_str("</table>\n");
    h
}

/// The "Where the time goes" section of the report: each scheduler's makespan split into
/// the cost model's terms, and (with the solver's row) each one's difference to it.
fn time_split_html(rows: &[ComparisonRow]) -> String {
    let mut h = String::from(
        "<h2>Where the time goes</h2>\n<p>Each makespan split into the cost model's terms: \
<i>batch bias</i> is paid once per batch (launch, weight reads: many small batches make it large), \
<i>per entry</i> once per request in a batch, <i>tokens</i> by the linear layers per token, \
<i>attention</i> grows with context, <i>recompute</i> re-processes tokens an eviction dropped, \
<i>idle</i> is time with nothing to run (waiting for arrivals). They add up to the makespan.</p>\n",
    );
    let table = |h: &mut String, rows: &[(String, [f64; 6])]| {
        let mut headers = vec!["scheduler"];
        headers.extend(crate::output::TIME_SPLIT_HEADERS);
        headers.push("makespan");
        let cells: Vec<Vec<Cell>> = rows
            .iter()
            .map(|(name, terms)| {
                let mut row = vec![Cell::Text(name.clone())];
                row.extend(terms.iter().map(|&x| Cell::Time(Some(x))));
                row.push(Cell::Time(Some(terms.iter().sum())));
                row
            })
            .collect();
        h.push_str(&html_table(&headers, &cells));
    };
    let split: Vec<(String, [f64; 6])> = rows
        .iter()
        .map(|r| (r.label.clone(), r.time_split.terms()))
        .collect();
    table(&mut h, &split);
    if let Some(base) = rows.iter().find(|r| r.scheduler.is_solver()) {
        let diffs: Vec<(String, [f64; 6])> = rows
            .iter()
            .filter(|r| !r.scheduler.is_solver())
            .map(|r| {
                (
                    r.scheduler.to_string(),
                    r.time_split.minus(&base.time_split),
                )
            })
            .collect();
        if !diffs.is_empty() {
            let _ = writeln!(
                h,
                "<p>What each scheduler spends more than the solver's schedule ({}), term by term (negative: less):</p>",
                html_escape(base.status.name())
            );
            table(&mut h, &diffs);
        }
    }
    h
}

fn html_escape(s: &str) -> String {
    svg::escape(s)
}

fn limit_text(v: Option<u64>) -> String {
    v.map_or("unlimited".into(), |x| x.to_string())
}

/// The self-contained HTML report (inline SVG; links only to files written beside it).
pub fn report_html(setting: &Setting, c: &Comparison, plots: &[Plot], links: &[String]) -> String {
    let rows = c.rows();
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(
        h,
        "<title>infersched comparison: {}</title>",
        html_escape(&setting.workload)
    );
    h.push_str(
        "<style>body{font-family:'DejaVu Sans',Verdana,sans-serif;margin:2em auto;max-width:1240px;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td{white-space:nowrap}\
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}.err{color:#a00}\
div.table{overflow-x:auto}figure{margin:1.5em 0}figcaption{font-size:13px;color:#555}svg{max-width:100%;height:auto}</style>\n</head>\n<body>\n",
    );
    let _ = writeln!(
        h,
        "<h1>Schedulers compared: {}</h1>",
        html_escape(&setting.workload)
    );
    h.push_str(&headline_html(&rows, c.objective));
    let ran_solver = rows.iter().any(|r| r.scheduler.is_solver());
    h.push_str(&setting_html(setting, ran_solver));
    h.push_str(&limits_html(&rows, c));
    h.push_str(&results_section_html(&rows, c.objective));
    h.push_str(&solver_html(c));
    h.push_str(&time_split_html(&rows));
    h.push_str("<h2>Plots</h2>\n");
    for p in plots {
        let _ = writeln!(
            h,
            "<figure id=\"{stem}\">\n{}<figcaption>{} (<a href=\"plots/{stem}.png\">PNG</a>, <a href=\"plots/{stem}.svg\">SVG</a>)</figcaption>\n</figure>",
            p.svg.inline(),
            html_escape(&p.caption),
            stem = p.stem
        );
    }
    h.push_str("<h2>Files</h2>\n<ul>\n");
    for l in links {
        let _ = writeln!(h, "<li><a href=\"{0}\">{0}</a></li>", html_escape(l));
    }
    h.push_str("</ul>\n<p>Traces load in <a href=\"https://ui.perfetto.dev\">Perfetto</a> or chrome://tracing.</p>\n</body>\n</html>\n");
    h
}

/// The headline: how far the best heuristic is from the optimum (proven, or between the
/// bound and the best schedule found), or the best scheduler where no solver ran.
fn headline_html(rows: &[ComparisonRow], objective: Objective) -> String {
    let mut h = String::new();
    // Among the heuristics the solver's optimum and bound speak for (none that took
    // tokens from the prefix cache).
    let best_heuristic = rows
        .iter()
        .filter(|r| !r.scheduler.is_solver() && !r.uses_prefix_cache())
        .min_by(|a, b| a.objective_s.total_cmp(&b.objective_s));
    let optimal_row = rows.iter().find(|r| r.scheduler.is_solver());
    let proven = crate::compare::optimum_proven(rows);
    if let (Some(best_h), Some(opt)) = (best_heuristic, optimal_row)
        && let Some(ratio) = best_h.ratio_to_optimum
        && proven
    {
        let _ = writeln!(
            h,
            "<p><b>The best heuristic, {}, is {:.2}% above the proven optimum</b>: its {} is {} versus {}.</p>",
            html_escape(&best_h.display_name()),
            (ratio - 1.0) * 100.0,
            objective_label(objective),
            fmt_s(best_h.objective_s),
            fmt_s(opt.objective_s)
        );
    } else if let (Some(best_h), Some(opt)) = (best_heuristic, optimal_row)
        && let (Some(ratio), Some(to_bound)) = (best_h.ratio_to_optimum, best_h.ratio_to_bound)
    {
        // What is proven first: the distance to the bound; then the best schedule found.
        let _ = writeln!(
            h,
            "<p><b>The best heuristic, {}, is at most {:.2}% above the optimum</b> (its {} {} against the proven lower bound {}). No schedule is proven optimal: the best the solver found ({}) is {}, {:.2}% below it; certified gap {:.2}%.</p>",
            html_escape(&best_h.display_name()),
            (to_bound - 1.0) * 100.0,
            objective_label(objective),
            fmt_s(best_h.objective_s),
            fmt_s(opt.best_bound_s.unwrap_or(f64::NAN)),
            html_escape(opt.status.name()),
            fmt_s(opt.objective_s),
            (1.0 - 1.0 / ratio) * 100.0,
            opt.certified_gap.unwrap_or(f64::NAN) * 100.0,
        );
    } else if let (Some(best_h), None) = (best_heuristic, optimal_row) {
        let _ = writeln!(
            h,
            "<p><b>The best of the schedulers run is {}</b>, with {} {}. No solver ran, so how far any of them is from the optimum is not known (add <code>optimal</code> to <code>--schedulers</code> for a schedule, a proven bound and the gap).</p>",
            html_escape(&best_h.display_name()),
            objective_label(objective),
            fmt_s(best_h.objective_s),
        );
    }
    h
}

/// The setting: workload statistics, cost model, objective, M and the solver's limit.
fn setting_html(setting: &Setting, ran_solver: bool) -> String {
    let mut h = String::new();
    h.push_str("<h2>Setting</h2>\n<table>\n");
    let ws = &setting.workload_stats;
    let l = &setting.limits;
    let mut row = |k: &str, v: String| {
        let _ = writeln!(
            h,
            "<tr><th>{}</th><td>{}</td></tr>",
            html_escape(k),
            html_escape(&v)
        );
    };
    row("workload", setting.workload.clone());
    row("requests", ws.requests.to_string());
    if let Some(c) = &setting.cluster {
        row(
            "cluster",
            format!(
                "{} replicas, heuristics behind {} (the solver searches routings); metrics are the whole cluster's, the time split sums the replicas' (GPU-seconds); each replica's schedule, replay and trace are in <scheduler>/replica-K/",
                c.replicas, c.router
            ),
        );
    }
    row(
        "prompt tokens I",
        format!(
            "mean {:.1}, p50 {:.1}, p99 {:.1}, max {}",
            ws.input_tokens.mean, ws.input_tokens.p50, ws.input_tokens.p99, ws.input_tokens.max
        ),
    );
    row(
        "output tokens O",
        format!(
            "mean {:.1}, p50 {:.1}, p99 {:.1}, max {}",
            ws.output_tokens.mean, ws.output_tokens.p50, ws.output_tokens.p99, ws.output_tokens.max
        ),
    );
    row(
        "arrivals",
        match ws.mean_qps {
            Some(q) => format!(
                "{:.3} s to {:.3} s, {q:.2} requests/s",
                ws.first_arrival_s, ws.last_arrival_s
            ),
            None => format!("all at {} s", ws.first_arrival_s),
        },
    );
    row("cost model", setting.cost_model.clone());
    row("objective", objective_label(setting.objective).to_string());
    row("M (KV tokens)", limit_text(l.kv_capacity));
    if ran_solver {
        row("solver time limit", format!("{} s", setting.time_limit_s));
    }
    h.push_str("</table>\n");
    h
}

/// Each scheduler's limits, and the schedulers that failed.
fn limits_html(rows: &[ComparisonRow], c: &Comparison) -> String {
    let mut h = String::new();
    h.push_str(
        "<h2>Limits</h2>\n<p>Each heuristic runs with the limits given and its own defaults for the rest (as <code>simulate</code> runs it); the optimal scheduler runs under the limits given alone, the best schedule they allow.</p>\n<table>\n<tr><th>scheduler</th><th>C (tokens per batch)</th><th>P (prefill tokens)</th><th>M (KV tokens)</th><th>R_max (running)</th><th>KV block</th><th>watermark</th></tr>\n",
    );
    for r in rows {
        let l = &r.limits;
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            html_escape(&r.display_name()),
            limit_text(l.token_budget),
            limit_text(l.effective_prefill_budget()),
            limit_text(l.kv_capacity),
            limit_text(l.max_running),
            l.block_size,
            l.watermark
        );
    }
    h.push_str("</table>\n");
    let failures = c.failures();
    if !failures.is_empty() {
        h.push_str("<h2>Failed</h2>\n<ul>\n");
        for (n, e) in failures {
            let _ = writeln!(
                h,
                "<li class=\"err\"><b>{}</b>: {}</li>",
                html_escape(&n),
                html_escape(e)
            );
        }
        h.push_str("</ul>\n");
    }
    h
}

/// The results table with what its ratios divide by, and each scheduler's interval to the
/// optimum where it is not proven.
fn results_section_html(rows: &[ComparisonRow], objective: Objective) -> String {
    let mut h = String::new();
    const BOUND_TEXT: &str = "<i>/bound</i> divides by the solver's proven lower bound, \
so it is an upper bound on how far a scheduler is from the true optimum.";
    let reference_text = match compare::reference(rows) {
        Reference::Optimum => format!(
            "<i>/optimum</i> divides by the proven optimum's replayed objective; {BOUND_TEXT}"
        ),
        Reference::BestFound => format!(
            "<i>/best found</i> divides by the replayed objective of the best schedule the solver found, which is <b>not proven optimal</b>; {BOUND_TEXT}"
        ),
        Reference::NoSolver => "No solver ran, so there is no optimum and no bound: \
<i>/best</i> divides by the best scheduler's objective."
            .to_string(),
    };
    let _ = write!(
        h,
        "<h2>Results</h2>\n<p>Every number below comes from the independent replay of each scheduler's schedule. \
{reference_text}</p>\n"
    );
    h.push_str(&results_html(rows, objective));
    for line in clairvoyance_notes(rows) {
        let _ = writeln!(h, "<p>{}</p>", html_escape(&line));
    }
    let distances = distance_to_optimum(rows);
    if !distances.is_empty() {
        h.push_str(
            "<p>How far each scheduler is from the optimum: it is not proven, but it lies between \
the bound and the best schedule found, so each scheduler's objective is</p>\n<ul>\n",
        );
        for (name, low, high) in distances {
            let _ = writeln!(
                h,
                "<li><b>{}</b>: {low:.3}x to {high:.3}x the optimum</li>",
                html_escape(&name)
            );
        }
        h.push_str("</ul>\n");
    }
    h
}

/// Writes every output of a comparison into `dir`; returns the paths written.
///
/// `dir/<scheduler>/` gets `schedule.json`, `requests.csv`, `batches.csv`, `summary.json`
/// (and `solve.json` for the MILP); `dir/` gets `comparison.csv`, `comparison.json`,
/// `trace-<scheduler>.json`, `plots/*.svg|png` and `report.html` (written last).
pub fn write_comparison(
    dir: &Path,
    w: &Workload,
    setting: &Setting,
    c: &Comparison,
) -> io::Result<Vec<PathBuf>> {
    write_comparison_parts(dir, w, setting, c, ReportParts::default())
}

/// A contender's folder where it ran on a cluster: the cluster's files
/// (`write_cluster_outputs`: routing.csv, the merged requests.csv and summary.json, and
/// replica-K/ with each replica's schedule, replay and, with `traces`, trace.json), and
/// the cluster search's solve.json for the solver.
fn write_cluster_contender(
    sub: &Path,
    w: &Workload,
    name: &str,
    o: &crate::produce::Outcome,
    parts: &crate::produce::ClusterParts,
    traces: bool,
) -> io::Result<Vec<PathBuf>> {
    let mut paths = crate::cluster::write_cluster_outputs(
        sub,
        w,
        &parts.routing,
        &parts.schedules,
        &parts.replay,
        &o.summary,
        traces.then_some(name),
    )?;
    if let Some(report) = &parts.search {
        let p = sub.join("solve.json");
        let text = serde_json::to_string_pretty(report).map_err(io::Error::other)? + "\n";
        write_bytes_atomic(&p, text.as_bytes())?;
        paths.push(p);
    }
    Ok(paths)
}

/// The optional parts of a comparison's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportParts {
    /// `plots/` and the figures in `report.html`.
    pub plots: bool,
    /// `trace-<scheduler>.json` (Chrome traces).
    pub traces: bool,
}

impl Default for ReportParts {
    fn default() -> Self {
        Self {
            plots: true,
            traces: true,
        }
    }
}

/// The goodput search's schedule, named by how it was found, and its replay's outputs
/// (its summary with the SLO report), in `sub`.
pub fn write_goodput_search(
    sub: &Path,
    g: &crate::goodput::GoodputFound,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(sub)?;
    let mut schedule = g.schedule.clone();
    schedule.meta = Some(serde_json::json!({"producer": format!("goodput search: {}", g.method)}));
    let schedule_path = sub.join("schedule.json");
    schedule.write(&schedule_path).map_err(io::Error::other)?;
    let mut summary = crate::core::Summary::from_replay(&g.replay);
    summary.slo = Some(g.report.clone());
    let mut paths = vec![schedule_path];
    paths.extend(crate::output::write_replay_outputs(
        sub, &g.replay, &summary,
    )?);
    Ok(paths)
}

/// [`write_comparison`] with only the `parts` asked for (the tables, each scheduler's
/// files and `report.html` are always written).
pub fn write_comparison_parts(
    dir: &Path,
    w: &Workload,
    setting: &Setting,
    c: &Comparison,
    parts: ReportParts,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    let mut links = Vec::new();
    let parts_traces = parts.traces;
    for (name, o) in c.succeeded() {
        let name = name.as_str();
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub)?;
        if let Some(parts) = &o.cluster {
            paths.extend(write_cluster_contender(
                &sub,
                w,
                name,
                o,
                parts,
                parts_traces,
            )?);
            links.push(format!("{name}/summary.json"));
            continue;
        }
        let schedule_path = sub.join("schedule.json");
        let mut schedule = o.schedule.clone();
        schedule.meta = Some(serde_json::json!({"producer": name}));
        schedule.write(&schedule_path).map_err(io::Error::other)?;
        paths.push(schedule_path);
        paths.extend(crate::output::write_replay_outputs(
            &sub, &o.replay, &o.summary,
        )?);
        if let Some(report) = &o.solve {
            let p = sub.join("solve.json");
            let text = serde_json::to_string_pretty(report).map_err(io::Error::other)? + "\n";
            write_bytes_atomic(&p, text.as_bytes())?;
            paths.push(p);
        }
        if parts.traces {
            let trace_path = dir.join(format!("trace-{name}.json"));
            let text = serde_json::to_string(&trace::chrome_trace(w, name, &o.schedule, &o.replay))
                .map_err(io::Error::other)?;
            write_bytes_atomic(&trace_path, text.as_bytes())?;
            paths.push(trace_path);
            links.push(format!("trace-{name}.json"));
        }
        links.push(format!("{name}/summary.json"));
    }
    if let Some(g) = &c.goodput_search {
        paths.extend(write_goodput_search(&dir.join("goodput-search"), g)?);
        links.push("goodput-search/summary.json".to_string());
    }
    let rows = c.rows();
    let csv_path = dir.join("comparison.csv");
    crate::core::io::write_atomic(&csv_path, |out| compare::write_csv(&rows, c.objective, out))?;
    paths.push(csv_path);
    let json_path = dir.join("comparison.json");
    compare::write_json(&json_path, setting, c)?;
    paths.push(json_path);
    links.splice(
        0..0,
        ["comparison.csv".to_string(), "comparison.json".to_string()],
    );
    let plots = if parts.plots {
        comparison_plots(w, c)
    } else {
        Vec::new()
    };
    if parts.plots {
        paths.extend(write_plots(&dir.join("plots"), &plots)?);
    }
    let html_path = dir.join("report.html");
    write_bytes_atomic(
        &html_path,
        report_html(setting, c, &plots, &links).as_bytes(),
    )?;
    paths.push(html_path);
    Ok(paths)
}
