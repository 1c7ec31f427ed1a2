//! `compare` and `sweep` end to end: the files a researcher opens are there and well-formed,
//! numbers agree with the replay, sweeps resume and shard correctly.

use infersched::compare::{self, CSV_COLUMNS, CompareSpec, Contender, Setting};
use infersched::core::{Limits, Summary, Workload, replay};
use infersched::produce::RunStatus;
use infersched::report;
use infersched::schedulers::SchedulerKind;
use infersched::solver::{Objective, SolveOptions, SolveStatus};
use infersched::sweep::{self, RESULT_COLUMNS, Sweep};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;

fn cost() -> infersched::cost_model::LinearCostModel {
    infersched::cost_model::preset("llama2-7b-a100").unwrap()
}

fn limits(m: u64) -> Limits {
    Limits {
        kv_capacity: Some(m),
        ..Limits::unlimited()
    }
}

fn setting(w: &Workload, l: Limits) -> Setting {
    Setting {
        workload: "test".into(),
        workload_stats: infersched::workload::WorkloadStats::of(w),
        cost_model: "llama2-7b-a100".into(),
        objective: Objective::Makespan,
        limits: l,
        time_limit_s: 30.0,
        cluster: None,
    }
}

fn spec(contenders: Vec<Contender>, l: Limits) -> CompareSpec {
    CompareSpec {
        contenders,
        objective: Objective::Makespan,
        limits: l,
        knobs: infersched::schedulers::Knobs::matching(&l),
        solve: SolveOptions {
            time_limit_s: 30.0,
            threads: 1,
            ..SolveOptions::default()
        },
        slos: Vec::new(),
        cluster: None,
    }
}

fn all_contenders() -> Vec<Contender> {
    vec![
        Contender::OPTIMAL,
        Contender::Heuristic(SchedulerKind::Vllm),
        Contender::Heuristic(SchedulerKind::VllmV1),
        Contender::Heuristic(SchedulerKind::Sarathi),
        Contender::Heuristic(SchedulerKind::Orca),
    ]
}

/// Three requests and a memory tight enough that heuristics evict.
fn tiny() -> Workload {
    infersched_test_kit::workload(&[(4, 3, 0.0), (4, 3, 0.0), (3, 2, 0.0)])
}

fn svg_size(path: &Path) -> (u32, u32) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let attr = |n: &str| root.attribute(n).unwrap().parse::<u32>().unwrap();
    (attr("width"), attr("height"))
}

#[test]
fn compare_writes_a_consistent_well_formed_report() {
    let w = tiny();
    let l = limits(10);
    let c = compare::run(&w, &cost(), &spec(all_contenders(), l));
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    let dir = tempfile::tempdir().unwrap();
    let paths = report::write_comparison(dir.path(), &w, &setting(&w, l), &c).unwrap();
    assert!(paths.iter().all(|p| p.exists()));
    // The offline solver reads the true output lengths, and the table says so.
    let text = report::comparison_text(&c.rows(), Objective::Makespan);
    assert!(text.contains("optimal*"), "{text}");
    assert!(text.contains("* clairvoyant (optimal)"), "{text}");

    // The table: header, one row per scheduler, ratios from the replayed objectives.
    let mut rdr = csv::Reader::from_path(dir.path().join("comparison.csv")).unwrap();
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, CSV_COLUMNS);
    let rows: Vec<csv::StringRecord> = rdr.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 5);
    let col = |n: &str| CSV_COLUMNS.iter().position(|c| *c == n).unwrap();
    let opt_value: f64 = rows[0][col("objective_s")].parse().unwrap();
    assert_eq!(&rows[0][col("scheduler")], "optimal");
    assert_eq!(&rows[0][col("contender")], "optimal");
    assert_eq!(&rows[0][col("clairvoyant")], "true", "the offline solver");
    assert!(!rows[0][col("method")].is_empty());
    assert_eq!(&rows[1][col("clairvoyant")], "false");
    assert_eq!(&rows[1][col("method")], "");
    assert_eq!(&rows[0][col("ratio_to_optimum")], "1");
    let mut recomputing = 0;
    for (row, (name, outcome)) in rows.iter().zip(c.succeeded()) {
        assert_eq!(&row[col("scheduler")], name);
        // Each row's numbers are the replay of that scheduler's schedule.
        let again = Summary::from_replay(&replay(&w, &l, &cost(), &outcome.schedule).unwrap());
        let v: f64 = row[col("objective_s")].parse().unwrap();
        assert_eq!(v, again.makespan_s);
        let cached: u64 = row[col("cached_tokens")].parse().unwrap();
        assert_eq!(cached, again.cached_tokens);
        if cached > 0 {
            // vllm-v1 took its own blocks back from the prefix cache after a preemption:
            // the solver's optimum and bound speak for schedules without a cache.
            assert_eq!(&row[col("ratio_to_optimum")], "", "{name}");
            assert_eq!(&row[col("ratio_to_bound")], "", "{name}");
        } else {
            let ratio: f64 = row[col("ratio_to_optimum")].parse().unwrap();
            assert!((ratio - v / opt_value).abs() < 1e-12);
            assert!(ratio >= 1.0 - 1e-9, "{name} beats the optimum: {ratio}");
            let to_bound: f64 = row[col("ratio_to_bound")].parse().unwrap();
            assert!(to_bound >= ratio - 1e-9, "the bound is below the optimum");
        }
        assert_eq!(
            row[col("evictions")].parse::<u64>().unwrap(),
            again.evictions
        );
        // The time split adds up to the makespan; evicting schedulers pay recomputation.
        let split: Vec<f64> = infersched::cost_model::TERM_NAMES
            .iter()
            .map(|t| row[col(&format!("split_{t}_s"))].parse().unwrap())
            .collect();
        let makespan: f64 = row[col("makespan_s")].parse().unwrap();
        assert!(
            (split.iter().sum::<f64>() - makespan).abs() < 1e-12,
            "{name}: {split:?}"
        );
        // Discarded KV taken back from the prefix cache costs nothing to recompute.
        if again.cached_tokens == 0 {
            assert_eq!(
                split[4] > 0.0,
                again.recomputed_tokens > 0,
                "{name}: {split:?}"
            );
        } else {
            assert!(split[4] == 0.0 || again.recomputed_tokens > 0, "{name}");
        }
        recomputing += usize::from(again.recomputed_tokens > 0);
    }
    assert!(
        recomputing > 0,
        "no heuristic evicts: the recomputation column is untested"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("comparison.json")).unwrap())
            .unwrap();
    assert_eq!(json["format"], "infersched-comparison/1");
    assert_eq!(json["rows"].as_array().unwrap().len(), 5);
    assert_eq!(json["setting"]["limits"]["kv_capacity"], 10);

    // Plots: every SVG parses as XML and has its PNG twin at the same size.
    let plots = dir.path().join("plots");
    let mut stems = BTreeSet::new();
    for e in std::fs::read_dir(&plots).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "svg") {
            let (width, height) = svg_size(&p);
            let png = std::fs::read(p.with_extension("png")).unwrap();
            let img = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
            assert_eq!(
                (img.width(), img.height()),
                (width, height),
                "{}",
                p.display()
            );
            stems.insert(p.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    for s in [
        "objective",
        "kv-memory",
        "latency-cdf",
        "tokens-per-batch",
        "timeline-optimal",
        "timeline-vllm",
        "timeline-sarathi",
    ] {
        assert!(stems.contains(s), "missing plot {s}: {stems:?}");
    }

    // The report references only files that exist, and inlines the plots.
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    let mut links = 0;
    for part in html.split("href=\"").skip(1) {
        let target = &part[..part.find('"').unwrap()];
        if target.starts_with("http") {
            continue;
        }
        links += 1;
        assert!(
            dir.path().join(target).exists(),
            "report links to missing {target}"
        );
    }
    assert!(links >= 10, "{links} links");
    assert_eq!(html.matches("<svg ").count(), stems.len());
    assert!(html.contains("sarathi") && html.contains("M (KV tokens)"));
    assert!(html.contains("<h2>Where the time goes</h2>"));
    assert!(html.contains("What each scheduler spends more than the solver's schedule"));

    // Chrome traces: one complete slice per batch with its entries, KV counters.
    for (name, o) in c.succeeded() {
        let text = std::fs::read_to_string(dir.path().join(format!("trace-{name}.json"))).unwrap();
        let t: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = t["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == 1)
            .collect();
        // One track per request besides the batch track.
        let tracks = events
            .iter()
            .filter(|e| e["name"] == "thread_name" && e["pid"] == 2)
            .count();
        assert_eq!(tracks, w.len(), "{name}");
        assert_eq!(slices.len(), o.replay.batches.len(), "{name}");
        for (s, b) in slices.iter().zip(&o.replay.batches) {
            assert!((s["ts"].as_f64().unwrap() - b.start_s * 1e6).abs() < 1e-6);
            assert!((s["dur"].as_f64().unwrap() - b.duration_s() * 1e6).abs() < 1e-6);
            assert!(s["pid"].is_number() && s["tid"].is_number());
            let entries = s["args"]["entries"].as_array().unwrap();
            let tokens: u64 = entries.iter().map(|e| e["tokens"].as_u64().unwrap()).sum();
            assert_eq!(tokens, b.features.tokens);
        }
        let counters = events.iter().filter(|e| e["ph"] == "C").count();
        assert_eq!(counters, 2 * o.replay.batches.len());
    }
}

#[test]
fn heuristic_comparisons_are_byte_identical_across_runs() {
    let w =
        infersched_test_kit::workload(&[(6, 4, 0.0), (5, 3, 0.001), (7, 2, 0.002), (3, 5, 0.004)]);
    let l = limits(16);
    let contenders = all_contenders()[1..].to_vec();
    let mut outputs = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let c = compare::run(&w, &cost(), &spec(contenders.clone(), l));
        report::write_comparison(dir.path(), &w, &setting(&w, l), &c).unwrap();
        let mut files = Vec::new();
        for rel in [
            "comparison.csv",
            "comparison.json",
            "report.html",
            "plots/kv-memory.svg",
            "plots/kv-memory.png",
            "plots/timeline-vllm.svg",
            "trace-sarathi.json",
        ] {
            files.push(std::fs::read(dir.path().join(rel)).unwrap());
        }
        outputs.push(files);
    }
    assert_eq!(outputs[0], outputs[1]);
    // Without a solver the report claims no optimum or bound: its ratios are to the best
    // heuristic (1.0000 for that one), and it says how to get the optimum.
    let html = String::from_utf8(outputs[0][2].clone()).unwrap();
    assert!(html.contains("<th>/best</th>"), "{html}");
    assert!(
        !html.contains("/bound") && !html.contains("/optimum"),
        "{html}"
    );
    assert!(html.contains("<td>1.0000</td>"), "{html}");
    assert!(
        html.contains("<p><b>The best of the schedulers run is "),
        "{html}"
    );
    assert!(!html.contains("MILP"), "{html}");
    assert!(!html.contains("How the solver answered"), "{html}");
    let text = report::comparison_text(
        &compare::run(&w, &cost(), &spec(contenders, l)).rows(),
        infersched::solver::Objective::Makespan,
    );
    assert!(text.lines().nth(1).unwrap().contains("/best"), "{text}");
    assert!(!text.contains("/bound"), "{text}");
}

#[test]
fn timeline_phases_follow_the_schedule() {
    use infersched::report::plots::{Phase, request_phases};
    let w = tiny();
    let l = limits(10);
    let c = compare::run(
        &w,
        &cost(),
        &spec(vec![Contender::Heuristic(SchedulerKind::Vllm)], l),
    );
    let (_, o) = c.succeeded()[0];
    let phases = request_phases(&w, &o.schedule, &o.replay, 64);
    for (i, segs) in phases.iter().enumerate() {
        let r = &o.replay.requests[i];
        // From arrival to completion, contiguous, in time order.
        assert!((segs[0].0 - r.arrival_s).abs() < 1e-12);
        assert!(
            (segs.last().unwrap().1 - r.completion_s).abs() < 1e-12,
            "request {i}"
        );
        for pair in segs.windows(2) {
            assert!((pair[0].1 - pair[1].0).abs() < 1e-12);
        }
        let evicted = segs.iter().any(|s| s.2 == Phase::Evicted);
        assert_eq!(evicted, r.evictions > 0, "request {i}");
        assert!(segs.iter().any(|s| s.2 == Phase::Decode));
    }
    assert!(
        o.summary.evictions > 0,
        "the test needs a schedule with evictions"
    );
}

const SPEC: &str = r#"
name = "test sweep"
[workload]
n = 3
I = 4
O = "uniform:1:3"
[grid]
M = [8, 12]
seed = [0, 1, 2]
schedulers = ["vllm", "sarathi", "orca"]
"#;

fn keys(path: &Path) -> Vec<String> {
    sweep::read_results(path)
        .unwrap()
        .iter()
        .map(|r| r.key.clone())
        .collect()
}

#[test]
fn sweep_resumes_after_being_cut_short() {
    let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
    let full = tempfile::tempdir().unwrap();
    let o = sweep::run(&s, full.path(), false, None, Some(2), false).unwrap();
    assert_eq!((o.planned, o.ran, o.skipped, o.failed), (18, 18, 0, 0));
    let results = full.path().join("results.csv");
    let complete = std::fs::read_to_string(&results).unwrap();
    let lines: Vec<&str> = complete.lines().collect();
    assert_eq!(lines.len(), 19);
    assert_eq!(lines[0], RESULT_COLUMNS.join(","));
    // Rows are in grid order and each key once.
    let k = keys(&results);
    assert_eq!(k, s.points.iter().map(|p| p.key()).collect::<Vec<_>>());
    assert!(!o.plots.is_empty());

    // Simulate a kill: five finished rows and half of a sixth.
    let cut = tempfile::tempdir().unwrap();
    let partial = format!("{}\n{}", lines[..6].join("\n"), &lines[6][..20]);
    std::fs::write(cut.path().join("results.csv"), partial).unwrap();
    let err = sweep::run(&s, cut.path(), false, None, Some(2), false).unwrap_err();
    assert!(format!("{err:#}").contains("--resume"), "{err:#}");
    let o = sweep::run(&s, cut.path(), true, None, Some(2), false).unwrap();
    assert_eq!((o.ran, o.skipped), (13, 5));
    // Heuristic runs are deterministic: the resumed file equals the uninterrupted one.
    assert_eq!(
        std::fs::read_to_string(cut.path().join("results.csv")).unwrap(),
        complete
    );
    // Resuming a finished sweep runs nothing.
    let o = sweep::run(&s, cut.path(), true, None, Some(2), false).unwrap();
    assert_eq!((o.ran, o.skipped), (0, 18));
}

/// A solver of a policy class is the sweep's optimal scheduler too: its rows are read as
/// the solver's (ratios to it are plotted), and its name round-trips through results.csv.
#[test]
fn a_constrained_solver_is_the_sweeps_optimum() {
    let spec = SPEC.replace(
        r#"schedulers = ["vllm", "sarathi", "orca"]"#,
        r#"schedulers = ["optimal+no-evict", "vllm"]"#,
    );
    let s = Sweep::parse(&spec, Path::new(".")).unwrap();
    let d = tempfile::tempdir().unwrap();
    let o = sweep::run(&s, d.path(), false, None, Some(1), false).unwrap();
    assert_eq!(o.failed, 0);
    let rows = sweep::read_results(&d.path().join("results.csv")).unwrap();
    assert!(rows.iter().any(|r| r.scheduler.is_solver()));
    assert!(
        std::fs::read_to_string(d.path().join("results.csv"))
            .unwrap()
            .contains(",optimal+no-evict,")
    );
    assert!(
        o.plots
            .iter()
            .any(|p| p.to_string_lossy().contains("ratio_to_optimal-vs-M")),
        "{:?}",
        o.plots
    );
}

#[test]
fn sweep_shards_are_disjoint_and_together_are_the_grid() {
    let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
    let mut all = Vec::new();
    for k in 1..=3 {
        let d = tempfile::tempdir().unwrap();
        let o = sweep::run(&s, d.path(), false, Some((k, 3)), Some(1), false).unwrap();
        assert_eq!(o.ran, 6);
        all.extend(keys(&d.path().join("results.csv")));
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a run is in two shards");
    let grid: HashSet<String> = s.points.iter().map(|p| p.key()).collect();
    assert_eq!(unique.len(), grid.len());
    assert!(all.iter().all(|k| grid.contains(k)));
}

#[test]
fn sweep_merge_combines_disjoint_shards_that_cover_the_grid_and_refuses_the_rest() {
    let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
    let shards: Vec<tempfile::TempDir> = (1..=3)
        .map(|k| {
            let d = tempfile::tempdir().unwrap();
            sweep::run(&s, d.path(), false, Some((k, 3)), Some(1), false).unwrap();
            d
        })
        .collect();
    let dirs: Vec<std::path::PathBuf> = shards.iter().map(|d| d.path().to_path_buf()).collect();
    let out = tempfile::tempdir().unwrap();
    let merged = out.path().join("all");
    let o = sweep::merge(&s, &dirs, &merged, false).unwrap();
    assert_eq!((o.files, o.rows, o.missing), (3, s.points.len(), 0));
    assert!(!o.plots.is_empty());
    // Every row of every shard, once, in run order.
    let rows = sweep::read_results(&merged.join("results.csv")).unwrap();
    let indices: Vec<usize> = rows.iter().map(|r| r.run).collect();
    assert_eq!(indices, (0..s.points.len()).collect::<Vec<_>>());
    let mut from_shards: Vec<sweep::ResultRow> = dirs
        .iter()
        .flat_map(|d| sweep::read_results(&d.join("results.csv")).unwrap())
        .collect();
    from_shards.sort_by_key(|r| r.run);
    assert_eq!(rows, from_shards);
    // An existing merge is not overwritten.
    let e = sweep::merge(&s, &dirs, &merged, false).unwrap_err();
    assert!(format!("{e:#}").contains("exists"), "{e:#}");
    // Not covering the grid: refused, unless asked for.
    let partial = out.path().join("partial");
    let e = sweep::merge(&s, &dirs[..2], &partial, false).unwrap_err();
    assert!(
        format!("{e:#}").contains("6 of 18 runs of the grid are in no file"),
        "{e:#}"
    );
    assert!(
        !partial.join("results.csv").exists(),
        "nothing is written on refusal"
    );
    let o = sweep::merge(&s, &dirs[..2], &partial, true).unwrap();
    assert_eq!((o.rows, o.missing), (12, 6));
    // The same shard twice: not disjoint.
    let twice = vec![dirs[0].clone(), dirs[0].join("results.csv")];
    let e = sweep::merge(&s, &twice, &out.path().join("twice"), true).unwrap_err();
    assert!(format!("{e:#}").contains("is in two files"), "{e:#}");
    // A shard of another grid: its rows name runs this grid does not have.
    let other = Sweep::parse(&SPEC.replace("M = [8, 12]", "M = [9, 13]"), Path::new(".")).unwrap();
    assert_ne!(other.points[0].key(), s.points[0].key());
    let e = sweep::merge(&other, &dirs, &out.path().join("other"), true).unwrap_err();
    assert!(
        format!("{e:#}").contains("is not in the grid of this spec"),
        "{e:#}"
    );
    // A shard cut short mid-line (still running, or killed): refused, and left as it is.
    let cut = out.path().join("cut.csv");
    let text = std::fs::read_to_string(dirs[2].join("results.csv")).unwrap();
    std::fs::write(&cut, &text[..text.len() - 5]).unwrap();
    let e = sweep::merge(
        &s,
        &[dirs[0].clone(), dirs[1].clone(), cut.clone()],
        &out.path().join("cut"),
        false,
    )
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("the last line is incomplete"),
        "{e:#}"
    );
    assert_eq!(std::fs::read_to_string(&cut).unwrap().len(), text.len() - 5);
}

#[test]
fn sweep_with_the_optimal_scheduler_plots_ratios() {
    let text = r#"
time_limit = 20
[workload]
n = 2
I = 3
O = 2
[grid]
M = [5, 8]
schedulers = ["optimal", "optimal+no-evict", "vllm"]
"#;
    let s = Sweep::parse(text, Path::new(".")).unwrap();
    let d = tempfile::tempdir().unwrap();
    let o = sweep::run(&s, d.path(), false, None, Some(2), false).unwrap();
    assert_eq!(o.failed, 0);
    let recs = sweep::read_results(&d.path().join("results.csv")).unwrap();
    for pair in recs.chunks(3) {
        let v = |i: usize| pair[i].objective_s.unwrap();
        assert_eq!(pair[0].status, RunStatus::Solver(SolveStatus::Optimal));
        assert!(v(0) <= v(1) + 1e-12, "constraints cannot help");
        assert!(v(0) <= v(2) + 1e-12, "the optimum beats vllm");
    }
    assert!(
        o.plots
            .iter()
            .any(|p| p.ends_with("plots/ratio_to_optimal-vs-M.svg"))
    );
    // Every point here is proven and no run failed: filled markers, no notes.
    let plots = sweep::sweep_plots(&s, &recs);
    let ratio = plots
        .iter()
        .find(|p| p.stem == "ratio_to_optimal-vs-M")
        .unwrap()
        .svg
        .finish();
    assert!(!ratio.contains("fill=\"#ffffff\" stroke="), "hollow marker");
    assert!(!ratio.contains("not proven") && !ratio.contains("failed"));
    // The same results with the M = 5 optimum unproven (its bound 20% lower) and vllm
    // failed at M = 8: hollow markers with bars at M = 5, a cross at M = 8, and both notes.
    let edited: Vec<sweep::ResultRow> = recs
        .iter()
        .map(|r| {
            let mut v = r.clone();
            if v.m == Some(5) && v.scheduler.is_solver() {
                v.status = RunStatus::Solver(SolveStatus::TimeLimit);
                v.best_bound_s = Some(0.8 * v.objective_s.unwrap());
            }
            if v.m == Some(8) && v.scheduler.to_string() == "vllm" {
                v.status = RunStatus::Error;
                (v.objective_s, v.makespan_s, v.mean_e2e_s) = (None, None, None);
            }
            v
        })
        .collect();
    let plots = sweep::sweep_plots(&s, &edited);
    for stem in ["ratio_to_optimal-vs-M", "objective_s-vs-M"] {
        let svg = plots.iter().find(|p| p.stem == stem).unwrap().svg.finish();
        assert!(
            svg.contains("fill=\"#ffffff\" stroke="),
            "{stem}: no hollow marker"
        );
        assert!(svg.contains("hollow: not proven optimal"), "{stem}");
        assert!(svg.contains("a run failed"), "{stem}");
    }
}

#[test]
fn the_cli_compares_and_rejects_bad_specs() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    infersched::workload::write_trace(&tiny(), &w).unwrap();
    let out = dir.path().join("cmp");
    let o = Command::new(env!("CARGO_BIN_EXE_infersched"))
        .args(["compare", "--workload"])
        .arg(&w)
        .args([
            "--schedulers",
            "optimal,vllm,sarathi",
            "--kv-capacity",
            "10",
            "--block-size",
            "1",
            "--time-limit",
            "30",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("/optimum") && stdout.contains("sarathi"));
    assert!(stdout.contains("report.html"));
    assert!(out.join("report.html").exists());

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nschedulers = [\"vllm\"]\nR_max = [0]\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_infersched"))
        .arg("sweep")
        .arg(&bad)
        .arg("--out")
        .arg(dir.path().join("sw"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("R_max") && err.contains("bad.toml"), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_infersched"))
        .args(["compare", "--workload"])
        .arg(&w)
        .args(["--schedulers", "vllm,fastest", "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--schedulers"));

    // Two shards on the command line, then `sweep merge`.
    let spec = dir.path().join("s.toml");
    std::fs::write(
        &spec,
        "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nschedulers = [\"vllm\", \"orca\"]\nM = [8, 12]\n",
    )
    .unwrap();
    let cli = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_infersched"))
            .args(args)
            .output()
            .unwrap()
    };
    let (s1, s2, all) = (
        dir.path().join("s1"),
        dir.path().join("s2"),
        dir.path().join("all"),
    );
    for (k, d) in [("1/2", &s1), ("2/2", &s2)] {
        let o = cli(&[
            "sweep".as_ref(),
            spec.as_os_str(),
            "--shard".as_ref(),
            k.as_ref(),
            "--out".as_ref(),
            d.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = cli(&[
        "sweep".as_ref(),
        "merge".as_ref(),
        spec.as_os_str(),
        s1.as_os_str(),
        "--out".as_ref(),
        all.as_os_str(),
    ]);
    assert!(
        !o.status.success(),
        "one shard of two does not cover the grid"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("2 of 4 runs"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = cli(&[
        "sweep".as_ref(),
        "merge".as_ref(),
        spec.as_os_str(),
        s1.as_os_str(),
        s2.as_os_str(),
        "--out".as_ref(),
        all.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("merged 4 runs of 4 from 2 files"));
    assert_eq!(
        sweep::read_results(&all.join("results.csv")).unwrap().len(),
        4
    );
}

#[test]
fn without_a_proof_the_report_says_best_found_and_leads_with_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    infersched::workload::write_trace(&tiny(), &w).unwrap();
    let run = |memory_limit: &str, out: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_infersched"))
            .args(["compare", "--workload"])
            .arg(&w)
            .args([
                "--schedulers",
                "optimal,vllm,sarathi",
                "--kv-capacity",
                "10",
                "--block-size",
                "1",
                "--memory-limit",
                memory_limit,
                "--out",
            ])
            .arg(out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let html = std::fs::read_to_string(out.join("report.html")).unwrap();
        (String::from_utf8_lossy(&o.stdout).into_owned(), html)
    };
    // A memory limit too small for any exact model: the best heuristic with a bound.
    let (stdout, html) = run("0.000000001", &dir.path().join("unproven"));
    assert!(
        stdout.contains("not-proven") && stdout.contains("/best found"),
        "{stdout}"
    );
    assert!(!stdout.contains("/optimum"), "{stdout}");
    assert!(stdout.contains("no proof of optimality"), "{stdout}");
    // Each scheduler's distance from the optimum is the interval from its ratio to the best
    // schedule found to its ratio to the bound, the numbers of the table.
    let rows: Vec<csv::StringRecord> =
        csv::Reader::from_path(dir.path().join("unproven").join("comparison.csv"))
            .unwrap()
            .records()
            .map(Result::unwrap)
            .collect();
    let col = |n: &str| CSV_COLUMNS.iter().position(|c| *c == n).unwrap();
    // The unproven solver row is called what it is, with its method, never `optimal`.
    let solver = rows
        .iter()
        .find(|r| &r[col("contender")] == "optimal")
        .unwrap();
    assert_eq!(&solver[col("scheduler")], "best-found");
    assert_eq!(&solver[col("method")], "best-heuristic");
    assert!(
        stdout.contains("best-found*") && !stdout.contains("optimal*"),
        "{stdout}"
    );
    let vllm = rows
        .iter()
        .find(|r| &r[col("scheduler")] == "vllm")
        .unwrap();
    let ratio = |n: &str| vllm[col(n)].parse::<f64>().unwrap();
    assert!(ratio("ratio_to_bound") > ratio("ratio_to_optimum"));
    let line = format!(
        "  vllm       {:.3}x to {:.3}x the optimum",
        ratio("ratio_to_optimum"),
        ratio("ratio_to_bound")
    );
    assert!(
        stdout.contains("how far each scheduler is from the optimum") && stdout.contains(&line),
        "{line}\n{stdout}"
    );
    assert!(
        html.contains(&format!(
            "<li><b>vllm</b>: {:.3}x to {:.3}x the optimum</li>",
            ratio("ratio_to_optimum"),
            ratio("ratio_to_bound")
        )),
        "{html}"
    );
    // The time split's differences are to the best schedule found, not called optimal.
    assert!(
        stdout.contains("more than the solver's best schedule, not proven optimal, (negative"),
        "{stdout}"
    );
    assert!(html.contains("is at most") && html.contains("No schedule is proven optimal"));
    assert!(!html.contains("above the proven optimum"));
    assert!(html.contains("not proven optimal"));
    // Which method produced the schedule and the bound, and why no exact model ran.
    assert!(html.contains("<h2>How the solver answered</h2>"), "{html}");
    assert!(
        html.contains(
            ">method</th><td style=\"text-align:left;white-space:normal\">best-heuristic</td>"
        ),
        "{html}"
    );
    assert!(html.contains("no exact model"), "{html}");
    // With the exact model: proven, and said so.
    let (stdout, html) = run("4", &dir.path().join("proven"));
    assert!(
        stdout.contains("/optimum") && !stdout.contains("no proof"),
        "{stdout}"
    );
    assert!(html.contains("above the proven optimum"));
    assert!(
        !stdout.contains("how far each scheduler")
            && stdout.contains("more than the proven optimum"),
        "{stdout}"
    );
}
