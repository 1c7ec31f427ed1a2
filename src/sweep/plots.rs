//! Plots of each metric against each swept parameter.

use super::results::ResultRow;
use super::spec::Sweep;
use crate::report::{Plot, svg};
use std::collections::{BTreeMap, HashSet};

/// The metrics plotted against each swept parameter.
pub const PLOTTED_METRICS: &[(&str, &str)] = &[
    (
        "ratio_to_optimal",
        "objective / optimal scheduler's objective",
    ),
    ("objective_s", "objective (s)"),
    ("makespan_s", "makespan (s)"),
    ("mean_e2e_s", "mean E2E latency (s)"),
    ("mean_ttft_s", "mean TTFT (s)"),
    ("evictions", "evictions"),
    (
        "slo_attainment",
        "SLO attainment (share of requests meeting every SLO)",
    ),
];

/// A plotted point: (x, y), whether it is unproven, its bar (from y to the bound), and
/// the least and greatest of the runs averaged into it.
type PlotPoint = ((f64, f64), bool, Option<(f64, f64)>, (f64, f64));

/// Plots of each metric against each swept parameter: one line per scheduler (and
/// objective, when several), averaged over the other parameters (seeds included), with a
/// band from the least to the greatest run; doubling grids on a log axis. A point whose optimum is
/// not proven has a hollow marker and a bar to the proven bound; failed runs are crosses
/// on the x axis.
pub fn sweep_plots(sweep: &Sweep, recs: &[ResultRow]) -> Vec<Plot> {
    let rows = Rows::new(recs);
    let mut plots = Vec::new();
    let title = sweep.spec.name.clone().unwrap_or("sweep".into());
    for &param in plotted_params(sweep) {
        for &(metric, label) in PLOTTED_METRICS {
            if metric == "ratio_to_optimal" && rows.optimum.is_empty() {
                continue;
            }
            let series = rows.series(metric, param);
            if series.is_empty() {
                continue;
            }
            let mut s = svg::Svg::new(960, 420);
            svg::line_chart(
                &mut s,
                (0.0, 0.0, 960.0, 420.0),
                &format!("{title}: {label} vs {param}"),
                &axis_label(param),
                label,
                &series,
                &[],
                metric != "ratio_to_optimal",
            );
            plots.push(Plot {
                stem: format!("{metric}-vs-{param}"),
                caption: format!("{label} against {param}, mean over the other parameters"),
                svg: s,
            });
            for &by in plotted_params(sweep).filter(|p| **p != param) {
                if let Some(plot) = panelled(recs, (metric, label), param, by, &title) {
                    plots.push(plot);
                }
            }
        }
    }
    plots
}

/// The most panels a plot by a second parameter has (a parameter with more values is
/// averaged over only).
pub const MAX_PANELS: usize = 6;

/// `metric` against `param`, one panel per value of `by` (2 to [`MAX_PANELS`] values), so
/// `by`'s effect is shown instead of averaged into the band.
fn panelled(
    recs: &[ResultRow],
    (metric, label): (&str, &str),
    param: &str,
    by: &str,
    title: &str,
) -> Option<Plot> {
    let mut values: Vec<String> = Vec::new();
    for r in recs {
        let v = r.param(by);
        if !values.contains(&v) {
            values.push(v);
        }
    }
    if !(2..=MAX_PANELS).contains(&values.len()) {
        return None;
    }
    values.sort_by(|a, b| axis_value(a).total_cmp(&axis_value(b)).then(a.cmp(b)));
    let parts: Vec<Vec<ResultRow>> = values
        .iter()
        .map(|v| recs.iter().filter(|r| r.param(by) == *v).cloned().collect())
        .collect();
    let per_panel: Vec<Vec<svg::Series>> = parts
        .iter()
        .map(|part| Rows::new(part).series_hiding(metric, param, &[param, by]))
        .collect();
    if per_panel.iter().all(|s| s.is_empty()) {
        return None;
    }
    // Every panel lists every line (empty where it has none), so each line keeps its
    // style across panels and the one legend names them all.
    let mut names: Vec<String> = Vec::new();
    for s in per_panel.iter().flatten() {
        if !names.contains(&s.name) {
            names.push(s.name.clone());
        }
    }
    let series: Vec<Vec<svg::Series>> = per_panel
        .into_iter()
        .map(|panel| {
            names
                .iter()
                .map(|n| {
                    panel
                        .iter()
                        .find(|s| s.name == *n)
                        .cloned()
                        .unwrap_or(svg::Series {
                            name: n.clone(),
                            ..Default::default()
                        })
                })
                .collect()
        })
        .collect();
    let legend_w = svg::legend_width(series.iter().flatten().map(|s| s.name.as_str()));
    let panel_w = ((1400.0 - legend_w) / values.len() as f64).max(160.0);
    let width = panel_w * values.len() as f64 + legend_w;
    let mut s = svg::Svg::new(width.ceil() as u32, 420);
    for (k, (value, series)) in values.iter().zip(&series).enumerate() {
        let last = k + 1 == values.len();
        let x0 = k as f64 * panel_w;
        let x1 = x0 + panel_w + if last { legend_w } else { 0.0 };
        svg::line_chart_panel(
            &mut s,
            (x0, 0.0, x1, 420.0),
            &format!("{by} = {value}"),
            &axis_label(param),
            if k == 0 { label } else { "" },
            series,
            &[],
            metric != "ratio_to_optimal",
            last,
        );
    }
    Some(Plot {
        stem: format!("{metric}-vs-{param}-by-{by}"),
        caption: format!("{title}: {label} against {param}, one panel per {by}"),
        svg: s,
    })
}

/// The swept parameters plotted against: seeds are replicates (averaged over), cost
/// models, routers, prefill:decode splits and pipeline stages are names (each its own line
/// instead).
fn plotted_params(sweep: &Sweep) -> impl Iterator<Item = &&'static str> {
    sweep.swept.iter().filter(|p| {
        !matches!(
            **p,
            "seed" | "cost_model" | "router" | "disaggregate" | "pp"
        )
    })
}

/// Every path the plots of `sweep` may be written to in `dir` (and `dir` itself).
pub fn plot_paths(sweep: &Sweep, dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut paths = vec![dir.to_path_buf()];
    for &param in plotted_params(sweep) {
        for &(metric, _) in PLOTTED_METRICS {
            for ext in ["svg", "png"] {
                paths.push(dir.join(format!("{metric}-vs-{param}.{ext}")));
                for &by in plotted_params(sweep).filter(|p| **p != param) {
                    paths.push(dir.join(format!("{metric}-vs-{param}-by-{by}.{ext}")));
                }
            }
        }
    }
    paths
}

/// Per run: its value, the other end of its bar, whether it is proven.
type Runs = Vec<(f64, Option<f64>, bool)>;

/// A sweep's result rows, read for plotting.
struct Rows<'a> {
    recs: &'a [ResultRow],
    ok: Vec<&'a ResultRow>,
    /// The optimal scheduler's objective per setting, its proven bound, and whether it is
    /// proven optimal (else the ratios are to the best schedule found).
    optimum: BTreeMap<&'a str, (f64, Option<f64>, bool)>,
    several_objectives: bool,
}

impl<'a> Rows<'a> {
    fn new(recs: &'a [ResultRow]) -> Self {
        let ok: Vec<&ResultRow> = recs.iter().filter(|r| !r.failed()).collect();
        let mut optimum = BTreeMap::new();
        for r in &ok {
            if r.scheduler.is_solver()
                && let Some(v) = r.objective_s
            {
                optimum.insert(
                    r.setting_key(),
                    (v, r.best_bound_s, r.status.proven_optimal()),
                );
            }
        }
        let objectives: HashSet<&str> = recs.iter().map(|r| r.objective.as_str()).collect();
        Self {
            recs,
            ok,
            optimum,
            several_objectives: objectives.len() > 1,
        }
    }

    /// The line a row belongs to in a plot against `param`: its scheduler, with its
    /// objective where the sweep has several, after its cluster (replicas, cost model,
    /// pipeline stages, router; `param` itself left out) where the grid has clusters (`4 x
    /// roofline:h100:llama3-8b, round-robin: vllm-v1`; `2 x ... PP2, ...` for pipelines),
    /// so each cluster has a colour.
    fn series_name(&self, r: &ResultRow, hide: &[&str]) -> String {
        let shown = |p: &str| !hide.contains(&p);
        let mut cluster = Vec::new();
        if let Some(d) = r.disaggregate.as_ref().filter(|_| shown("disaggregate")) {
            cluster.push(format!("{d} P:D"));
        } else if let Some(n) = r.replicas.filter(|_| shown("replicas")) {
            cluster.push(format!("{n} x"));
        }
        if let Some(c) = r.cost_model.as_ref().filter(|_| shown("cost_model")) {
            cluster.push(c.clone());
        }
        if let Some(pp) = r.pp.filter(|_| shown("pp")) {
            cluster.push(format!("PP{pp}"));
        }
        if let Some(router) = r.router.as_ref().filter(|_| shown("router")) {
            if let Some(last) = cluster.last_mut() {
                last.push(',');
            }
            cluster.push(router.clone());
        }
        let mut name = r.scheduler.to_string();
        if !cluster.is_empty() {
            name = format!("{}: {name}", cluster.join(" "));
        }
        if self.several_objectives {
            name += &format!(" ({})", r.objective);
        }
        name
    }

    /// Row `r`'s point for `metric`: its value, the other end of its bar, whether it is
    /// proven; None where it has no value.
    fn point(&self, r: &ResultRow, metric: &str) -> Option<(f64, Option<f64>, bool)> {
        if metric == "ratio_to_optimal" {
            // Without a proof the true ratio lies between v / best and v / bound.
            return match (self.optimum.get(r.setting_key()), r.objective_s) {
                (Some(&(o, bound, proven)), Some(v)) if o > 0.0 => Some((
                    v / o,
                    bound.filter(|b| !proven && *b > 0.0).map(|b| v / b),
                    proven,
                )),
                _ => None,
            };
        }
        let v = r.metric(metric)?;
        let proven = !r.scheduler.is_solver() || r.status.proven_optimal();
        // The optimal row's objective reaches down to its proven bound.
        let bound = (metric == "objective_s" && !proven)
            .then_some(r.best_bound_s)
            .flatten();
        Some((v, bound, proven))
    }

    /// One line per series: the runs' points by x (means, bars, bands) and failed runs.
    fn series(&self, metric: &str, param: &str) -> Vec<svg::Series> {
        self.series_hiding(metric, param, &[param])
    }

    /// [`Self::series`] with the names leaving out the parameters `hide`.
    fn series_hiding(&self, metric: &str, param: &str, hide: &[&str]) -> Vec<svg::Series> {
        // series name -> x -> runs
        let mut data: BTreeMap<String, BTreeMap<String, Runs>> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        for r in &self.ok {
            let Some(point) = self.point(r, metric) else {
                continue;
            };
            let name = self.series_name(r, hide);
            if !order.contains(&name) {
                order.push(name.clone());
            }
            let runs = data.entry(name).or_default();
            runs.entry(r.param(param)).or_default().push(point);
        }
        // Failed runs, by series.
        let mut failed: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in self.recs.iter().filter(|r| r.failed()) {
            let name = self.series_name(r, hide);
            if !order.contains(&name) {
                order.push(name.clone());
            }
            let x = axis_value(&r.param(param));
            let xs = failed.entry(name).or_default();
            if !xs.contains(&x) {
                xs.push(x);
            }
        }
        order
            .iter()
            .map(|name| {
                let mut xs = failed.get(name).cloned().unwrap_or_default();
                xs.sort_by(f64::total_cmp);
                line(name, data.get(name), xs)
            })
            .collect()
    }
}

fn mean(v: &mut dyn Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    sum / n as f64
}

/// A series from its runs by x and its failed runs' x.
fn line(name: &str, runs: Option<&BTreeMap<String, Runs>>, failed: Vec<f64>) -> svg::Series {
    let mut pts: Vec<PlotPoint> = runs
        .into_iter()
        .flatten()
        .map(|(x, runs)| {
            let y = mean(&mut runs.iter().map(|r| r.0));
            let unproven = runs.iter().any(|r| !r.2);
            // The bar: the mean of each run's other end (its own value where it has none).
            let bar = runs
                .iter()
                .any(|r| r.1.is_some())
                .then(|| (y, mean(&mut runs.iter().map(|r| r.1.unwrap_or(r.0)))));
            let spread = runs
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
                    (lo.min(r.0), hi.max(r.0))
                });
            ((axis_value(x), y), unproven, bar, spread)
        })
        .collect();
    pts.sort_by(|a, b| a.0.0.total_cmp(&b.0.0));
    svg::Series {
        name: name.to_string(),
        points: pts.iter().map(|p| p.0).collect(),
        step: false,
        markers: true,
        unproven: pts.iter().map(|p| p.1).collect(),
        bars: pts.iter().map(|p| p.2).collect(),
        failed,
        spread: pts.iter().map(|p| Some(p.3)).collect(),
    }
}

/// A numeric x for a parameter value: the number itself, or a length distribution's
/// fixed value / mean-ish first parameter.
pub(super) fn axis_value(x: &str) -> f64 {
    if let Ok(v) = x.parse::<f64>() {
        return v;
    }
    // "fixed:8" -> 8; "uniform:4:16" -> (4 + 16) / 2; others: the first number.
    let nums: Vec<f64> = x.split(':').filter_map(|p| p.parse().ok()).collect();
    match (x.split(':').next(), nums.as_slice()) {
        (Some("uniform"), [lo, hi]) => (lo + hi) / 2.0,
        (_, [first, ..]) => *first,
        _ => f64::NAN,
    }
}

fn axis_label(param: &str) -> String {
    match param {
        "M" => "M (KV capacity, tokens)".into(),
        "C" => "C (token budget)".into(),
        "P" => "P (prefill budget)".into(),
        "R_max" => "R_max (running requests)".into(),
        "I" => "I (prompt tokens)".into(),
        "O" => "O (output tokens)".into(),
        "n" => "n (requests)".into(),
        "qps" => "arrival rate (requests/s)".into(),
        "time_scale" => "time scale (x the trace's arrival times)".into(),
        "replicas" => "replicas".into(),
        other => other.into(),
    }
}
