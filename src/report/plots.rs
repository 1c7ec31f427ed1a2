//! The comparison plots: batch timelines, KV memory over time, latency CDFs, objective
//! bars normalized to the optimum, tokens per batch over time.

use super::svg::{self, Anchor, Frame, RefLine, Series, Svg};
use crate::compare::{ComparisonRow, Outcome};
use crate::core::{EntryKind, Replay, Schedule, Workload, classify_entries};

/// At most this many request rows in a timeline (the first ids).
pub const TIMELINE_MAX_ROWS: usize = 64;

/// A time unit that keeps axis numbers readable for spans up to `max_s` seconds.
pub fn time_unit(max_s: f64) -> (f64, &'static str) {
    if max_s < 10.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    }
}

/// At most `limit` points, keeping the first and last (stride decimation).
fn thin(points: Vec<(f64, f64)>, limit: usize) -> Vec<(f64, f64)> {
    if points.len() <= limit {
        return points;
    }
    let stride = points.len().div_ceil(limit);
    let last = *points.last().expect("non-empty");
    let mut out: Vec<_> = points.into_iter().step_by(stride).collect();
    if out.last() != Some(&last) {
        out.push(last);
    }
    out
}

/// What a request is doing over an interval of a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Arrived, holds no KV, not yet served (or between an arrival and the first batch).
    Waiting,
    /// Processing a prefill chunk or refill.
    Prefill,
    /// Processing a decode step.
    Decode,
    /// Holds KV but is not in the batch.
    Paused,
    /// Lost its KV to an eviction and waits for the refill.
    Evicted,
}

impl Phase {
    /// Legend name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
            Phase::Paused => "holds KV, not in batch",
            Phase::Evicted => "evicted",
        }
    }

    /// Fill colour.
    pub fn color(self) -> &'static str {
        match self {
            Phase::Waiting => "#d9d9d9",
            Phase::Prefill => "#E69F00",
            Phase::Decode => "#0072B2",
            Phase::Paused => "#a6cee3",
            Phase::Evicted => "#D55E00",
        }
    }
}

/// For the first `limit` requests (by id), their phases as `(start_s, end_s, phase)` from
/// arrival to completion, in `schedule` as `replay` timed it.
pub fn request_phases(
    w: &Workload,
    schedule: &Schedule,
    replay: &Replay,
    limit: usize,
) -> Vec<Vec<(f64, f64, Phase)>> {
    let kinds = classify_entries(w, schedule);
    let n = w.len().min(limit);
    let mut held = vec![false; n];
    let mut evicted = vec![false; n];
    let mut done = vec![false; n];
    let mut generated = vec![0u32; n];
    let mut out: Vec<Vec<(f64, f64, Phase)>> = vec![Vec::new(); n];
    let reqs = w.requests();
    let push = |segs: &mut Vec<(f64, f64, Phase)>, a: f64, b: f64, p: Phase| {
        if b < a {
            return;
        }
        if let Some(last) = segs.last_mut()
            && last.2 == p
            && (last.1 - a).abs() <= 1e-12
        {
            last.1 = b;
            return;
        }
        segs.push((a, b, p));
    };
    let mut prev_end = 0.0f64;
    for (b, entries) in replay.batches.iter().zip(&kinds) {
        let mut in_batch = vec![None; 0];
        in_batch.resize(n, None);
        for e in entries.iter().filter(|e| (e.request as usize) < n) {
            in_batch[e.request as usize] = Some(*e);
        }
        for i in 0..n {
            if done[i] {
                continue;
            }
            let arrival = reqs[i].arrival_s;
            let idle = if held[i] {
                Phase::Paused
            } else if evicted[i] {
                Phase::Evicted
            } else {
                Phase::Waiting
            };
            // The gap before this batch (the GPU idle, waiting for arrivals).
            let gap_start = prev_end.max(arrival);
            if gap_start < b.start_s {
                push(&mut out[i], gap_start, b.start_s, idle);
            }
            let phase = match in_batch[i] {
                None => idle,
                Some(e) => match e.kind {
                    // Holds the KV it received, not in the batch until it has arrived.
                    EntryKind::Receive => {
                        held[i] = true;
                        Phase::Paused
                    }
                    EntryKind::Evict => {
                        held[i] = false;
                        evicted[i] = true;
                        Phase::Evicted
                    }
                    EntryKind::Prefill | EntryKind::Decode => {
                        held[i] = true;
                        evicted[i] = false;
                        if e.generated_token {
                            generated[i] += 1;
                            if generated[i] >= reqs[i].output_tokens {
                                done[i] = true;
                            }
                        }
                        if e.kind == EntryKind::Prefill {
                            Phase::Prefill
                        } else {
                            Phase::Decode
                        }
                    }
                },
            };
            let start = b.start_s.max(arrival);
            if start <= b.end_s && (in_batch[i].is_some() || arrival < b.end_s) {
                push(&mut out[i], start, b.end_s, phase);
            }
        }
        prev_end = b.end_s;
    }
    out
}

/// A batch timeline: one row per request (the first [`TIMELINE_MAX_ROWS`]), coloured by phase.
pub fn timeline(w: &Workload, name: &str, o: &Outcome) -> Svg {
    let phases = request_phases(w, &o.schedule, &o.replay, TIMELINE_MAX_ROWS);
    let rows = phases.len();
    let title = if rows < w.len() {
        format!(
            "{name}: batch timeline (first {rows} of {} requests)",
            w.len()
        )
    } else {
        format!("{name}: batch timeline")
    };
    let rows: Vec<Vec<(f64, f64, &str)>> = phases
        .iter()
        .map(|segs| segs.iter().map(|&(a, b, p)| (a, b, p.color())).collect())
        .collect();
    let legend: Vec<(&str, &str)> = [
        Phase::Waiting,
        Phase::Prefill,
        Phase::Decode,
        Phase::Paused,
        Phase::Evicted,
    ]
    .map(|p| (p.name(), p.color()))
    .to_vec();
    gantt(&title, "request", o.replay.makespan_s(), &rows, &legend)
}

/// What a batch of a replica's timeline did: prompt tokens only, decodes only, both, or
/// only evictions.
fn batch_colour(b: &crate::core::BatchRecord) -> &'static str {
    const MIXED: &str = "#009E73";
    match (b.features.n_prefill > 0, b.features.n_decode > 0) {
        (true, true) => MIXED,
        (true, false) => Phase::Prefill.color(),
        (false, true) => Phase::Decode.color(),
        (false, false) => Phase::Evicted.color(),
    }
}

/// Bars `(start_s, end_s, colour)` for batches in start order, neighbours of one colour
/// less than `merge_s` apart drawn as one.
fn batch_bars<'a>(
    batches: impl Iterator<Item = &'a crate::core::BatchRecord>,
    merge_s: f64,
) -> Vec<(f64, f64, &'static str)> {
    let mut bars: Vec<(f64, f64, &str)> = Vec::new();
    for b in batches {
        let colour = batch_colour(b);
        match bars.last_mut() {
            Some(last) if last.2 == colour && b.start_s - last.1 < merge_s => {
                last.1 = last.1.max(b.end_s)
            }
            _ => bars.push((b.start_s, b.end_s, colour)),
        }
    }
    bars
}

/// One contender's cluster over time: a row per replica (the first
/// [`TIMELINE_MAX_ROWS`]), each batch coloured by what it did; neighbouring batches of one
/// kind less than half a pixel apart are drawn as one bar, so the picture stays small at
/// any batch count.
pub fn replica_timeline(name: &str, parts: &crate::produce::ClusterParts) -> Svg {
    let replicas = &parts.replay.replicas;
    let longest = replicas
        .iter()
        .flatten()
        .map(|r| r.makespan_s())
        .fold(0.0, f64::max);
    // Half a pixel of the plot's 870 px, in seconds.
    let merge_s = longest / 870.0 / 2.0;
    let shown = replicas.len().min(TIMELINE_MAX_ROWS);
    let rows: Vec<Vec<(f64, f64, &str)>> = replicas[..shown]
        .iter()
        .map(|r| batch_bars(r.iter().flat_map(|r| &r.batches), merge_s))
        .collect();
    let title = if shown < replicas.len() {
        format!(
            "{name}: batches on each replica (first {shown} of {})",
            replicas.len()
        )
    } else {
        format!("{name}: batches on each replica")
    };
    let legend = [
        ("prompt tokens only", Phase::Prefill.color()),
        ("decodes only", Phase::Decode.color()),
        ("both", "#009E73"),
        ("evictions only", Phase::Evicted.color()),
    ];
    gantt(&title, "replica", longest, &rows, &legend)
}

/// A chart of labelled rows over time from 0 to `makespan`: each row's bars
/// `(start_s, end_s, colour)`, a legend of `(name, colour)` below.
fn gantt(
    title: &str,
    row_name: &str,
    makespan: f64,
    rows: &[Vec<(f64, f64, &str)>],
    legend: &[(&str, &str)],
) -> Svg {
    let n = rows.len();
    let row_h = timeline_row_height(n);
    let height = (110.0 + row_h * n as f64).ceil() as u32;
    let mut s = Svg::new(960, height.max(200));
    let (k, unit) = time_unit(makespan);
    let frame = Frame {
        x0: 70.0,
        y0: 40.0,
        x1: 940.0,
        y1: 40.0 + row_h * n as f64,
        x: svg::Axis::covering([0.0, makespan * k], true),
        y: svg::Axis::span(0.0, n.max(1) as f64),
    };
    frame.draw_background(&mut s);
    frame.draw_x_grid(&mut s);
    let mid_x = (frame.x0 + frame.x1) / 2.0;
    s.text(mid_x, 24.0, title, 14.0, Anchor::Middle, 0.0, true);
    let xlabel = format!("time ({unit})");
    s.text(
        mid_x,
        frame.y1 + 34.0,
        &xlabel,
        12.0,
        Anchor::Middle,
        0.0,
        false,
    );
    let mid_y = (frame.y0 + frame.y1) / 2.0;
    s.text(18.0, mid_y, row_name, 12.0, Anchor::Middle, -90.0, false);
    let label_every = timeline_label_step(row_h);
    for (i, bars) in rows.iter().enumerate() {
        let y = frame.y0 + i as f64 * row_h;
        if i % label_every == 0 {
            // The label sits at its row's middle, with a tick where rows are too thin to
            // tell which one a label names.
            let mid = y + row_h / 2.0;
            s.text(
                frame.x0 - 7.0,
                mid + 3.5,
                &i.to_string(),
                10.0,
                Anchor::End,
                0.0,
                false,
            );
            s.line(frame.x0 - 4.0, mid, frame.x0, mid, "#444444", 1.0, "");
        }
        for &(a, b, colour) in bars {
            let (xa, xb) = (frame.px(a * k), frame.px(b * k));
            // Zero-time bars (evictions only) still show as a thin mark.
            s.rect(xa, y + 1.0, (xb - xa).max(1.0), row_h - 2.0, colour, 1.0);
        }
    }
    s.line(frame.x0, frame.y1, frame.x1, frame.y1, "#444444", 1.0, "");
    let mut x = frame.x0;
    let ly = frame.y1 + 54.0;
    for (name, colour) in legend {
        s.rect(x, ly - 10.0, 14.0, 12.0, colour, 1.0);
        s.text(x + 18.0, ly, name, 11.0, Anchor::Start, 0.0, false);
        x += 34.0 + name.len() as f64 * 6.5;
    }
    s
}

/// A timeline's row height in px: 18 up to 16 rows, then 360 px shared (at least 5 each).
fn timeline_row_height(rows: usize) -> f64 {
    if rows <= 16 {
        18.0
    } else {
        (360.0 / rows as f64).max(5.0)
    }
}

/// Which requests a timeline labels: every one where rows are at least 11 px tall, else
/// every 2nd, 5th, 10th, ... so that labels stay at least 11 px apart.
fn timeline_label_step(row_h: f64) -> usize {
    const MIN_LABEL_GAP_PX: f64 = 11.0;
    [1, 2, 5, 10, 20, 50, 100]
        .into_iter()
        .find(|&k| k as f64 * row_h >= MIN_LABEL_GAP_PX)
        .unwrap_or(100)
}

fn longest_makespan(runs: &[(&str, &Outcome)]) -> f64 {
    runs.iter()
        .map(|(_, o)| o.replay.makespan_s())
        .fold(0.0, f64::max)
}

/// KV tokens held after each batch, per scheduler, against M.
pub fn kv_memory(runs: &[(&str, &Outcome)], kv_capacity: Option<u64>) -> Svg {
    let (k, unit) = time_unit(longest_makespan(runs));
    let series: Vec<Series> = runs
        .iter()
        .map(|(name, o)| Series {
            name: name.to_string(),
            points: thin(kv_steps(&o.replay.batches, k), 4000),
            step: true,
            markers: false,
            ..Default::default()
        })
        .collect();
    kv_chart(
        "KV memory in use after each batch",
        unit,
        &series,
        kv_capacity,
    )
}

/// A chart of KV tokens over time (`unit`) with M marked.
fn kv_chart(title: &str, unit: &str, series: &[Series], kv_capacity: Option<u64>) -> Svg {
    let refs: Vec<RefLine> = kv_capacity
        .map(|m| RefLine {
            y: m as f64,
            label: format!("M = {m}"),
        })
        .into_iter()
        .collect();
    let mut s = Svg::new(960, 420);
    svg::line_chart(
        &mut s,
        (0.0, 0.0, 960.0, 420.0),
        title,
        &format!("time ({unit})"),
        "KV tokens",
        series,
        &refs,
        true,
    );
    s
}

/// KV tokens held after each batch on each replica of one contender run on a cluster,
/// against M (every replica has the same limits).
pub fn replica_kv_memory(parts: &crate::produce::ClusterParts, kv_capacity: Option<u64>) -> Svg {
    let replays: Vec<(usize, &crate::core::Replay)> = parts
        .replay
        .replicas
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some((k, r.as_ref()?)))
        .collect();
    let longest = replays
        .iter()
        .map(|(_, r)| r.makespan_s())
        .fold(0.0, f64::max);
    let (k, unit) = time_unit(longest);
    let series: Vec<Series> = replays
        .iter()
        .map(|(replica, r)| Series {
            name: format!("replica {replica}"),
            points: thin(kv_steps(&r.batches, k), 4000),
            step: true,
            markers: false,
            ..Default::default()
        })
        .collect();
    kv_chart(
        "KV memory in use after each batch, per replica",
        unit,
        &series,
        kv_capacity,
    )
}

/// Each replica's busy time (the time it ran batches), per scheduler run on a cluster:
/// how evenly its router spread the work (`compare --replicas`).
pub fn replica_load(runs: &[(&str, &Outcome)]) -> Svg {
    let series: Vec<Series> = runs
        .iter()
        .filter_map(|(name, o)| {
            let load = o.summary.cluster.as_ref()?;
            Some(Series {
                name: name.to_string(),
                points: load
                    .per_replica
                    .iter()
                    .map(|r| (f64::from(r.replica), r.busy_s))
                    .collect(),
                markers: true,
                ..Default::default()
            })
        })
        .collect();
    let mut s = Svg::new(960, 420);
    svg::line_chart(
        &mut s,
        (0.0, 0.0, 960.0, 420.0),
        "Time each replica ran batches",
        "replica",
        "busy time (s)",
        &series,
        &[],
        true,
    );
    s
}

/// The KV plot's steps (time scaled by `k`, tokens): from 0, each batch's KV at its end,
/// then, where requests finish in it, what is still held once they free theirs, so idle
/// time until the next batch shows what is really held.
fn kv_steps(batches: &[crate::core::BatchRecord], k: f64) -> Vec<(f64, f64)> {
    let mut pts = vec![(0.0, 0.0)];
    for b in batches {
        pts.push((b.end_s * k, b.kv_tokens as f64));
        if b.kv_tokens_released > 0 {
            let held = b.kv_tokens - b.kv_tokens_released;
            pts.push((b.end_s * k, held as f64));
        }
    }
    pts
}

/// Empirical CDFs of TTFT, TPOT and E2E latency, one panel each; the last carries the
/// legend for all three.
pub fn latency_cdfs(runs: &[(&str, &Outcome)]) -> Svg {
    let max_e2e = runs
        .iter()
        .flat_map(|(_, o)| o.replay.requests.iter().map(|r| r.e2e_s()))
        .fold(0.0, f64::max);
    let (k, unit) = time_unit(max_e2e);
    let mut s = Svg::new(1200, 400);
    type Metric = fn(&crate::core::RequestRecord) -> Option<f64>;
    let panels: [(&str, Metric); 3] = [
        ("TTFT", |r| Some(r.ttft_s())),
        ("TPOT", |r| r.tpot_s()),
        ("E2E latency", |r| Some(r.e2e_s())),
    ];
    let legend_w = svg::legend_width(runs.iter().map(|(name, _)| *name));
    let panel_w = (1200.0 - legend_w) / 3.0;
    for (p, (title, metric)) in panels.iter().enumerate() {
        let series: Vec<Series> = runs
            .iter()
            .map(|(name, o)| {
                let mut v: Vec<f64> = o.replay.requests.iter().filter_map(metric).collect();
                v.sort_by(f64::total_cmp);
                let n = v.len() as f64;
                let pts = v
                    .first()
                    .map(|x| (x * k, 0.0))
                    .into_iter()
                    .chain(
                        v.iter()
                            .enumerate()
                            .map(|(i, x)| (x * k, (i + 1) as f64 / n)),
                    )
                    .collect();
                Series {
                    name: name.to_string(),
                    points: thin(pts, 2000),
                    step: true,
                    markers: false,
                    ..Default::default()
                }
            })
            .collect();
        let last = p + 1 == panels.len();
        let x0 = p as f64 * panel_w;
        let x1 = x0 + panel_w + if last { legend_w } else { 0.0 };
        svg::line_chart_panel(
            &mut s,
            (x0, 0.0, x1, 400.0),
            &format!("{title} CDF"),
            &format!("{title} ({unit})"),
            "fraction of requests",
            &series,
            &[],
            true,
            last,
        );
    }
    s
}

/// Each scheduler's objective normalized to the optimum (or, without one, to the best
/// scheduler), with the solver's proven lower bound marked.
pub fn objective_bars(rows: &[ComparisonRow], objective_name: &str) -> Svg {
    let reference = rows
        .iter()
        .find(|r| r.scheduler.is_solver())
        .map(|r| r.objective_s)
        .or_else(|| rows.iter().map(|r| r.objective_s).reduce(f64::min))
        .unwrap_or(1.0);
    let bound = rows.iter().find_map(|r| r.best_bound_s);
    let ratio = |v: f64| if reference > 0.0 { v / reference } else { 1.0 };
    let values: Vec<f64> = rows.iter().map(|r| ratio(r.objective_s)).collect();
    let mut s = Svg::new(960, 420);
    let frame = Frame {
        x0: 70.0,
        y0: 40.0,
        x1: 940.0,
        y1: 360.0,
        x: svg::Axis::span(0.0, rows.len().max(1) as f64),
        y: svg::Axis::covering(values.iter().copied().chain([1.0]), true),
    };
    let norm = match crate::compare::reference(rows) {
        crate::compare::Reference::Optimum => "proven optimum",
        crate::compare::Reference::BestFound => "best schedule found (not proven optimal)",
        crate::compare::Reference::NoSolver => "best scheduler",
    };
    // Axes without x ticks: the bars are labelled.
    frame.draw_background(&mut s);
    frame.draw_y_grid(&mut s);
    s.line(frame.x0, frame.y1, frame.x1, frame.y1, "#444444", 1.0, "");
    s.line(frame.x0, frame.y0, frame.x0, frame.y1, "#444444", 1.0, "");
    s.text(
        (frame.x0 + frame.x1) / 2.0,
        24.0,
        &format!("{objective_name} relative to the {norm} (lower is better)"),
        14.0,
        Anchor::Middle,
        0.0,
        true,
    );
    s.text(
        18.0,
        200.0,
        &format!("{objective_name} / {norm}"),
        12.0,
        Anchor::Middle,
        -90.0,
        false,
    );
    for (i, (r, v)) in rows.iter().zip(&values).enumerate() {
        let xa = frame.px(i as f64 + 0.15);
        let xb = frame.px(i as f64 + 0.85);
        let y = frame.py(*v);
        s.rect(
            xa,
            y,
            xb - xa,
            frame.y1 - y,
            svg::series_style(&r.label, i).color,
            1.0,
        );
        s.text(
            (xa + xb) / 2.0,
            y - 5.0,
            &format!("{v:.3}"),
            11.0,
            Anchor::Middle,
            0.0,
            false,
        );
        s.text(
            (xa + xb) / 2.0,
            frame.y1 + 16.0,
            &r.display_name(),
            12.0,
            Anchor::Middle,
            0.0,
            false,
        );
    }
    let y1 = frame.py(1.0);
    s.line(frame.x0, y1, frame.x1, y1, "#444444", 1.0, "2 3");
    if let Some(b) = bound {
        let yb = frame.py(ratio(b));
        s.line(frame.x0, yb, frame.x1, yb, "#aa0000", 1.5, "6 4");
        s.text(
            frame.x1 - 4.0,
            yb + 14.0,
            &format!("proven lower bound ({:.3})", ratio(b)),
            11.0,
            Anchor::End,
            0.0,
            false,
        );
    }
    s
}

/// Runs longer than this many batches are drawn as means over as many equal time bins.
pub const TOKEN_BINS: usize = 200;

/// One time bin of [`binned_tokens`]: (its start, the mean tokens per batch), and the least
/// and greatest batch (None: no batch started in it).
pub type TokenBin = ((f64, f64), Option<(f64, f64)>);

/// Tokens per batch of `batches` averaged over `bins` equal intervals of their start times
/// (scaled by `k`): per bin its start, the mean, and the least and greatest batch; a bin
/// where no batch starts (the GPU idle, waiting for arrivals) has 0 and no range.
pub fn binned_tokens(batches: &[crate::core::BatchRecord], bins: usize, k: f64) -> Vec<TokenBin> {
    let Some(last) = batches.last() else {
        return Vec::new();
    };
    let span = last.start_s.max(f64::MIN_POSITIVE);
    let bins = bins.max(1);
    // (sum, count, least, greatest) per bin.
    let mut acc = vec![(0.0f64, 0usize, f64::INFINITY, f64::NEG_INFINITY); bins];
    for b in batches {
        let i = (((b.start_s / span) * bins as f64) as usize).min(bins - 1);
        let t = b.features.tokens as f64;
        let a = &mut acc[i];
        *a = (a.0 + t, a.1 + 1, a.2.min(t), a.3.max(t));
    }
    acc.iter()
        .enumerate()
        .map(|(i, a)| {
            let x = span * i as f64 / bins as f64 * k;
            if a.1 == 0 {
                ((x, 0.0), None)
            } else {
                ((x, a.0 / a.1 as f64), Some((a.2, a.3)))
            }
        })
        .collect()
}

/// Tokens per batch over time (at each batch's start), per scheduler: every batch with a
/// marker up to [`TOKEN_BINS`] batches, else the mean per time bin as steps with a band
/// from the least to the greatest batch of the bin.
pub fn tokens_per_batch(runs: &[(&str, &Outcome)]) -> Svg {
    let (k, unit) = time_unit(longest_makespan(runs));
    let mut binned = false;
    let series: Vec<Series> = runs
        .iter()
        .map(|(name, o)| {
            let batches = &o.replay.batches;
            if batches.len() <= TOKEN_BINS {
                return Series {
                    name: name.to_string(),
                    points: batches
                        .iter()
                        .map(|b| (b.start_s * k, b.features.tokens as f64))
                        .collect(),
                    markers: true,
                    ..Default::default()
                };
            }
            binned = true;
            let bins = binned_tokens(batches, TOKEN_BINS, k);
            Series {
                name: name.to_string(),
                points: bins.iter().map(|b| b.0).collect(),
                step: true,
                spread: bins.iter().map(|b| b.1).collect(),
                ..Default::default()
            }
        })
        .collect();
    let title = if binned {
        format!("Tokens per batch over time (mean per 1/{TOKEN_BINS} of the run)")
    } else {
        "Tokens per batch over time".to_string()
    };
    let mut s = Svg::new(960, 420);
    svg::line_chart(
        &mut s,
        (0.0, 0.0, 960.0, 420.0),
        &title,
        &format!("batch start ({unit})"),
        "tokens in the batch",
        &series,
        &[],
        true,
    );
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn batches_of_one_kind_closer_than_half_a_pixel_are_drawn_as_one_bar() {
        use crate::core::{BatchFeatures, BatchRecord};
        let batch = |start_s: f64, end_s: f64, n_prefill: u64, n_decode: u64| BatchRecord {
            index: 0,
            start_s,
            end_s,
            features: BatchFeatures {
                n_prefill,
                n_decode,
                ..BatchFeatures::default()
            },
            prefill_tokens: 0,
            evictions: 0,
            generated: 0,
            finished: 0,
            kv_tokens: 0,
            kv_tokens_released: 0,
            running: 0,
        };
        let batches = [
            batch(0.0, 1.0, 1, 0),
            batch(1.0, 2.0, 1, 0),  // same kind, touching: merged
            batch(2.0, 3.0, 0, 2),  // decodes: a new bar
            batch(3.05, 4.0, 0, 1), // 0.05 s after: merged at 0.1
            batch(4.5, 5.0, 0, 1),  // 0.5 s after: a new bar
            batch(5.0, 6.0, 1, 1),  // mixed
            batch(6.0, 6.0, 0, 0),  // evictions only
        ];
        let bars = super::batch_bars(batches.iter(), 0.1);
        let d = super::Phase::Decode.color();
        assert_eq!(
            bars,
            vec![
                (0.0, 2.0, super::Phase::Prefill.color()),
                (2.0, 4.0, d),
                (4.5, 5.0, d),
                (5.0, 6.0, "#009E73"),
                (6.0, 6.0, super::Phase::Evicted.color()),
            ]
        );
    }

    use super::*;
    use crate::core::{BatchFeatures, BatchRecord};

    fn batch(start_s: f64, tokens: u64) -> BatchRecord {
        BatchRecord {
            index: 0,
            start_s,
            end_s: start_s,
            features: BatchFeatures {
                tokens,
                ..BatchFeatures::default()
            },
            prefill_tokens: 0,
            evictions: 0,
            generated: 0,
            finished: 0,
            kv_tokens: 0,
            kv_tokens_released: 0,
            running: 0,
        }
    }

    #[test]
    fn long_runs_are_averaged_per_time_bin_with_their_range() {
        // Starts at 0, 1, 2, 3 (s): two bins of 2 s.
        let b = [batch(0.0, 10), batch(1.0, 30), batch(2.0, 5), batch(3.0, 7)];
        let bins = binned_tokens(&b, 2, 1e3);
        assert_eq!(bins.len(), 2);
        assert_eq!(bins[0], ((0.0, 20.0), Some((10.0, 30.0))));
        // The last batch starts at the end of the span and belongs to the last bin.
        assert_eq!(bins[1], ((1500.0, 6.0), Some((5.0, 7.0))));
        // An idle stretch: bins without batches are 0 with no range.
        let idle = binned_tokens(&[batch(0.0, 8), batch(3.0, 4)], 3, 1.0);
        assert_eq!(idle[1], ((1.0, 0.0), None));
        assert!(binned_tokens(&[], 4, 1.0).is_empty());
    }

    #[test]
    fn timeline_labels_stay_readable_at_every_row_height() {
        // 16 rows of 18 px: every request; 64 rows of 5.6 px: every 2nd (11.2 px apart).
        assert_eq!(timeline_label_step(18.0), 1);
        assert_eq!(timeline_label_step(360.0 / 64.0), 2);
        assert_eq!(timeline_label_step(5.0), 5);
        for rows in 1..=TIMELINE_MAX_ROWS {
            let row_h = timeline_row_height(rows);
            let k = timeline_label_step(row_h);
            assert!(
                k as f64 * row_h >= 11.0,
                "{rows} rows: labels {k} rows apart"
            );
            // Some label besides request 0 wherever there is a second row to label.
            assert!(
                rows == 1 || k < rows,
                "{rows} rows: only request 0 labelled"
            );
        }
    }

    #[test]
    fn kv_steps_drop_when_requests_finish() {
        let mut a = batch(0.0, 4);
        a.end_s = 1.0;
        a.kv_tokens = 30;
        a.kv_tokens_released = 20;
        let mut b = batch(5.0, 1);
        b.end_s = 6.0;
        b.kv_tokens = 11;
        b.kv_tokens_released = 11;
        // After batch a, 10 tokens stay held through the idle time until b.
        assert_eq!(
            kv_steps(&[a, b], 1e3),
            [
                (0.0, 0.0),
                (1e3, 30.0),
                (1e3, 10.0),
                (6e3, 11.0),
                (6e3, 0.0)
            ]
        );
    }
}
