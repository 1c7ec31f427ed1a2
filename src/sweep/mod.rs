//! `sweep`: a grid of settings from a TOML spec, run in parallel, one row per finished run
//! appended to `results.csv` at once (a killed sweep loses nothing finished; `--resume`
//! skips what is there), then plots of each metric against each swept parameter.
//!
//! A spec (paths are relative to the spec file):
//! ```toml
//! name = "evictions-vs-m"
//! cost_model = "llama2-7b-a100"   # preset or coefficient file
//! time_limit = 20                 # solver seconds per run
//! threads = 1                     # HiGHS threads per run
//! milp_only = false               # true: never the exact counting search, always the MILP
//! block_size = 1
//!
//! [workload]                      # synthetic: n, I, O (a length distribution or an integer)
//! n = 4
//! I = 8
//! O = "uniform:2:6"
//! arrival = "static"              # or poisson:QPS, gamma:QPS:CV
//! seed = 0
//! # trace = "../traces/arxiv_summarization.csv"   # instead: n random requests of a trace
//! # prefill_scale = 0.05, decode_scale = 0.2, max_total_tokens = 128
//! # skip = 0, time_scale = 0.25   # trace: n consecutive requests, arrivals 4x as fast
//!
//! [limits]                        # base values (unset: unlimited; M: from the cost model)
//! C = 64
//!
//! [grid]                          # lists; the run set is their cartesian product
//! M = [16, 24, 32]
//! schedulers = ["optimal", "optimal+no-evict", "vllm", "sarathi"]
//! objectives = ["makespan"]
//! ```
//! Grid keys: `M`, `C`, `P`, `R_max`, `I`, `O`, `n`, `qps`, `time_scale` (a trace's
//! arrival times multiplied), `seed`, `clusters` (a list
//! of `{ replicas = N, cost_model = "..." }`), `routers`, `schedulers`, `objectives`. A scheduler is a heuristic name or `optimal`, optionally with policy
//! constraints: `optimal+no-evict`, `optimal+no-chunk+no-mix`, `optimal+fcfs`,
//! `optimal+reserve`.

mod lock;
mod merge;
mod plots;
mod results;
mod run;
mod spec;

pub use merge::*;
pub use plots::*;
pub use results::*;
pub use run::*;
pub use spec::*;

#[cfg(test)]
mod tests {
    use super::lock::lock_output_dir;
    use super::plots::axis_value;
    use super::results::{parse_results, write_results};
    use super::*;
    use crate::produce::RunStatus;
    use std::collections::HashSet;
    use std::path::Path;

    const SPEC: &str = r#"
name = "t"
[workload]
n = 2
I = 4
O = "uniform:1:3"
[grid]
M = [8, 12]
seed = [0, 1, 2]
schedulers = ["optimal", "vllm", "optimal+no-evict"]
"#;

    #[test]
    fn the_grid_is_the_cartesian_product_in_order() {
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        assert_eq!(s.points.len(), 2 * 3 * 3);
        assert_eq!(s.swept, vec!["M", "seed"]);
        assert_eq!(s.points[0].scheduler.to_string(), "optimal");
        assert_eq!(s.points[1].scheduler.to_string(), "vllm");
        assert_eq!(s.points[3].seed, 1);
        assert_eq!(s.points[9].m, Some(12));
        let keys: HashSet<String> = s.points.iter().map(Point::key).collect();
        assert_eq!(keys.len(), s.points.len(), "keys are unique");
        assert_eq!(s.points[0].input, "fixed:4");
    }

    #[test]
    fn shards_are_disjoint_and_cover_the_grid() {
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        for n in 1..=7 {
            let mut seen = Vec::new();
            for k in 1..=n {
                seen.extend(shard(&s.points, k, n).into_iter().map(|p| p.index));
            }
            seen.sort();
            assert_eq!(seen, (0..s.points.len()).collect::<Vec<_>>(), "n = {n}");
        }
        assert!(parse_shard("0/3").is_err());
        assert!(parse_shard("4/3").is_err());
        assert!(parse_shard("x").is_err());
        assert_eq!(parse_shard("2/3").unwrap(), (2, 3));
    }

    fn err(text: &str) -> String {
        format!("{:#}", Sweep::parse(text, Path::new(".")).unwrap_err())
    }

    #[test]
    fn bad_specs_name_the_key() {
        let e = err("[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nMM = [1]\nschedulers = [\"vllm\"]\n");
        assert!(e.contains("MM"), "{e}");
        let e = err("[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nschedulers = [\"vlm\"]\n");
        assert!(e.contains("grid.schedulers[0]"), "{e}");
        let e = err(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nI = [4, \"zipf:x\"]\nschedulers = [\"vllm\"]\n",
        );
        assert!(e.contains("grid.I[1]"), "{e}");
        let e = err("[workload]\nn = 2\nI = 4\n[grid]\nschedulers = [\"vllm\"]\n");
        assert!(e.contains("workload.O"), "{e}");
        let e = err("[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = []\nschedulers = [\"vllm\"]\n");
        assert!(e.contains("grid.M"), "{e}");
        let e = err("[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nschedulers = [\"vllm+no-evict\"]\n");
        assert!(e.contains("optimal only"), "{e}");
        let e = err(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nobjectives = [\"speed\"]\nschedulers = [\"vllm\"]\n",
        );
        assert!(e.contains("grid.objectives[0]"), "{e}");
        let e = err("[workload]\nn = \"two\"\nI = 4\nO = 2\n[grid]\nschedulers = [\"vllm\"]\n");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn time_scales_are_for_trace_arrivals_only_and_positive() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let trace = |workload: &str, grid: &str| {
            let spec = format!(
                "[workload]\ntrace = \"notebooks-data/traces/splitwise_code.csv\"\nn = 5\n{workload}\n[grid]\n{grid}\nschedulers = [\"vllm\"]\n"
            );
            Sweep::parse(&spec, root).map_err(|e| format!("{e:#}"))
        };
        let s = trace("skip = 3", "time_scale = [1.0, 0.5]").unwrap();
        assert_eq!(s.swept, vec!["time_scale"]);
        assert_eq!(s.points[1].time_scale, Some(0.5));
        // Rows 3..8 of the trace, their arrival gaps halved.
        let (w1, w2) = (
            s.workload(&s.points[0]).unwrap(),
            s.workload(&s.points[1]).unwrap(),
        );
        let a1: Vec<f64> = w1.requests().iter().map(|r| r.arrival_s).collect();
        let a2: Vec<f64> = w2.requests().iter().map(|r| r.arrival_s).collect();
        assert!(a1[4] > 0.0);
        for (x, y) in a1.iter().zip(&a2) {
            assert!((x * 0.5 - y).abs() < 1e-9, "{a1:?} {a2:?}");
        }
        for (workload, grid, want) in [
            (
                "",
                "time_scale = [1.0, 0.0]",
                "grid.time_scale: expected a factor > 0",
            ),
            (
                "time_scale = -1.0",
                "",
                "workload.time_scale: expected a factor > 0",
            ),
            (
                "arrival = \"poisson:2\"",
                "time_scale = [0.5]",
                "sweep one or the other",
            ),
            ("", "time_scale = [0.5, 0.5]", "grid.time_scale[1]: repeats"),
        ] {
            let e = trace(workload, grid).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let e = err(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\ntime_scale = [0.5]\nschedulers = [\"vllm\"]\n",
        );
        assert!(e.contains("for a trace workload"), "{e}");
    }

    #[test]
    fn repeated_grid_values_and_oversized_grids_are_errors() {
        let e =
            err("[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = [10, 10]\nschedulers = [\"vllm\"]\n");
        assert!(e.contains("grid.M[1]") && e.contains("repeats"), "{e}");
        let e = err(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nI = [4, \"fixed:4\"]\nschedulers = [\"vllm\"]\n",
        );
        assert!(e.contains("grid.I[1]") && e.contains("repeats"), "{e}");
        let e = err(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nschedulers = [\"vllm\", \"orca\", \"vllm\"]\n",
        );
        assert!(e.contains("grid.schedulers[2]"), "{e}");
        // 4,000 x 4,000 runs: refused by counting, before anything is allocated.
        let list = (1..=4000)
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let e = err(&format!(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = [{list}]\nseed = [{list}]\nschedulers = [\"vllm\"]\n"
        ));
        assert!(e.contains("more than 10000000 runs"), "{e}");
    }

    #[test]
    fn one_sweep_per_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_output_dir(dir.path()).unwrap();
        let e = format!("{:#}", lock_output_dir(dir.path()).unwrap_err());
        assert!(
            e.contains("another sweep") && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        // A run into the held directory fails and writes nothing.
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        assert!(run(&s, dir.path(), false, None, Some(1), false).is_err());
        assert!(!dir.path().join("results.csv").exists());
        drop(held);
        assert!(lock_output_dir(dir.path()).is_ok());
    }

    #[test]
    fn resume_drops_duplicate_and_foreign_rows() {
        let dir = tempfile::tempdir().unwrap();
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        let first = run(&s, dir.path(), false, None, Some(1), false).unwrap();
        assert_eq!(first.ran, s.points.len());
        let path = dir.path().join("results.csv");
        // What two unlocked writers could leave: a row twice and a row of another grid.
        let text = std::fs::read_to_string(&path).unwrap();
        let row = text.lines().nth(1).unwrap().to_string();
        let foreign = row.replacen("M=8;", "M=99;", 1);
        std::fs::write(&path, format!("{text}{row}\n{foreign}\n")).unwrap();
        let again = run(&s, dir.path(), true, None, Some(1), false).unwrap();
        assert_eq!(again.ran, 0);
        let recs = read_results(&path).unwrap();
        assert_eq!(recs.len(), s.points.len());
        let keys: HashSet<&str> = recs.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys.len(), s.points.len());
    }

    #[test]
    fn resuming_a_file_of_an_earlier_version_rewrites_it_in_this_ones_columns() {
        // A results.csv without the disaggregate column: its rows kept, the rest appended,
        // the whole file in this version's columns.
        let dir = tempfile::tempdir().unwrap();
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        run(&s, dir.path(), false, None, Some(1), false).unwrap();
        let path = dir.path().join("results.csv");
        let text = std::fs::read_to_string(&path).unwrap();
        let k = RESULT_COLUMNS
            .iter()
            .position(|c| *c == "disaggregate")
            .unwrap();
        let drop_column = |line: &str| {
            let mut cells: Vec<&str> = line.split(',').collect();
            cells.remove(k);
            cells.join(",")
        };
        let old: Vec<String> = text.lines().take(2).map(drop_column).collect();
        std::fs::write(&path, old.join("\n") + "\n").unwrap();
        let again = run(&s, dir.path(), true, None, Some(1), false).unwrap();
        assert_eq!(again.ran, s.points.len() - 1);
        let after = std::fs::read_to_string(&path).unwrap();
        // This version's header, the kept row as it was, every point once.
        let lines: Vec<&str> = after.lines().collect();
        assert_eq!(lines[..2], text.lines().take(2).collect::<Vec<_>>()[..]);
        assert_eq!(read_results(&path).unwrap().len(), s.points.len());
    }

    #[test]
    fn a_header_without_its_newline_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        std::fs::write(&path, RESULT_COLUMNS.join(",")).unwrap();
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        let o = run(&s, dir.path(), true, None, Some(1), false).unwrap();
        assert_eq!(o.ran, s.points.len());
        assert_eq!(read_results(&path).unwrap().len(), s.points.len());
        // Something else without a newline is refused and left alone.
        std::fs::write(&path, "garbage").unwrap();
        assert!(run(&s, dir.path(), true, None, Some(1), false).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
    }

    #[test]
    fn axis_values_of_length_distributions() {
        assert_eq!(axis_value("12"), 12.0);
        assert_eq!(axis_value("fixed:8"), 8.0);
        assert_eq!(axis_value("uniform:4:16"), 10.0);
    }

    #[test]
    fn committed_results_files_read_and_write_back_byte_for_byte() {
        // Every sweep's results.csv in the repository: the typed rows write the same bytes
        // (floats as Rust prints them, empty fields as empty).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("notebooks-data/experiments/results");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path().join("results.csv");
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            if !bytes.starts_with(RESULT_COLUMNS.join(",").as_bytes()) {
                continue; // a results table of another tool (the solver benchmark script)
            }
            let rows = parse_results(&path, &bytes).unwrap();
            assert!(!rows.is_empty(), "{}", path.display());
            let out = tempfile::tempdir().unwrap();
            let copy = out.path().join("results.csv");
            write_results(&copy, &rows).unwrap();
            assert_eq!(
                String::from_utf8(std::fs::read(&copy).unwrap()).unwrap(),
                String::from_utf8(bytes).unwrap(),
                "{}",
                path.display()
            );
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} results files checked");
    }

    #[test]
    fn rows_name_their_columns_in_header_order() {
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        let row = s.run_point(&s.points[1]);
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(&row).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), RESULT_COLUMNS.join(","));
        assert_eq!(
            (row.scheduler.to_string().as_str(), row.status),
            ("vllm", RunStatus::Heuristic)
        );
        assert_eq!(row.metric("objective_s"), row.makespan_s);
        assert!(row.metric("makespan_s").unwrap() > 0.0);
        assert_eq!(row.param("M"), "8");
        assert_eq!(row.param("I"), "fixed:4");
        assert!(row.error.is_none() && !row.failed());
        // A point that cannot run (M below a request's need) is an error row, metrics empty.
        let mut bad = s.points[1].clone();
        bad.m = Some(2);
        let row = s.run_point(&bad);
        assert!(row.failed() && row.makespan_s.is_none(), "{row:?}");
        assert!(row.error.as_deref().unwrap().contains("KV"), "{row:?}");
    }

    #[test]
    fn grid_points_are_the_mixed_radix_digits_of_their_index() {
        let s = Sweep::parse(
            "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = [8, 9]\nC = [4, 5, 6]\nseed = [0, 1]\nschedulers = [\"vllm\", \"orca\"]\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(s.points.len(), 2 * 3 * 2 * 2);
        let mut i = 0;
        for m in [8, 9] {
            for c in [4, 5, 6] {
                for seed in [0, 1] {
                    for sched in ["vllm", "orca"] {
                        let p = &s.points[i];
                        assert_eq!(
                            (p.index, p.m, p.c, p.seed, p.scheduler.to_string().as_str()),
                            (i, Some(m), Some(c), seed, sched)
                        );
                        i += 1;
                    }
                }
            }
        }
    }

    const CLUSTERS: &str = r#"
[workload]
n = 6
I = 8
O = 3
arrival = "poisson:50"
[grid]
clusters = [{ replicas = 2 }, { replicas = 3, cost_model = "llama3-8b-h100-fa2" }]
routers = ["round-robin", "least-kv"]
schedulers = ["vllm", "sarathi"]
"#;

    #[test]
    fn clusters_and_routers_are_grid_axes() {
        let s = Sweep::parse(CLUSTERS, Path::new(".")).unwrap();
        assert_eq!(s.points.len(), 2 * 2 * 2);
        assert_eq!(s.swept, vec!["cost_model", "replicas", "router"]);
        let p = &s.points[7];
        let c = p.cluster.as_ref().unwrap();
        assert_eq!((c.replicas, c.router.name().as_str()), (3, "least-kv"));
        assert_eq!(
            p.key(),
            "M=;C=;P=;R_max=;I=fixed:8;O=fixed:3;n=6;qps=;seed=0;cost_model=llama3-8b-h100-fa2;replicas=3;router=least-kv;objective=makespan;scheduler=sarathi"
        );
        assert_eq!(s.cost_of(p).name, "llama3-8b-h100-fa2");
        assert_eq!(
            s.cost_of(&s.points[0]).name,
            crate::cost_models::DEFAULT_COST_MODEL
        );
        // Without cluster axes the keys are what they always were.
        let plain = Sweep::parse(SPEC, Path::new(".")).unwrap();
        assert!(
            plain
                .points
                .iter()
                .all(|p| p.cluster.is_none() && !p.key().contains("replicas"))
        );
        // A row runs its cluster: the replicas' load adds up to the requests.
        let row = s.run_point(p);
        assert!(!row.failed(), "{row:?}");
        assert_eq!(
            (row.replicas, row.router.as_deref()),
            (Some(3), Some("least-kv"))
        );
        assert_eq!(row.param("replicas"), "3");
        let w = s.workload(p).unwrap();
        let kind = crate::schedulers::SchedulerKind::Sarathi;
        let knobs = crate::schedulers::Knobs::matching(&s.limits(p).unwrap());
        let o =
            crate::produce::produce_cluster(&w, s.cost_of(p), kind, &knobs, 3, c.router).unwrap();
        assert_eq!(row.makespan_s, Some(o.summary.makespan_s));
    }

    #[test]
    fn pipelined_replicas_are_a_grid_value() {
        let spec = r#"
cost_model = "roofline:h100:llama3-8b"
[workload]
n = 12
I = 40
O = 6
arrival = "poisson:50"
[grid]
clusters = [{ replicas = 2 }, { replicas = 1, pp = 2 }]
schedulers = ["vllm-v1"]
"#;
        let s = Sweep::parse(spec, Path::new(".")).unwrap();
        assert!(s.swept.contains(&"pp"), "{:?}", s.swept);
        let p = &s.points[1];
        assert!(p.key().contains(";replicas=1;pp=2;router="), "{}", p.key());
        assert!(!s.points[0].key().contains("pp="));
        let row = s.run_point(p);
        assert!(!row.failed(), "{row:?}");
        assert_eq!((row.replicas, row.pp), (Some(1), Some(2)));
        assert_eq!(s.run_point(&s.points[0]).pp, None);
        // The row is the pipelined cluster's, with M per stage GPU.
        let limits = s.limits(p).unwrap();
        let one = s.limits(&s.points[0]).unwrap();
        assert!(limits.kv_capacity > one.kv_capacity.map(|m| 2 * m));
        let cost = s.cost_of(p);
        let pipeline = crate::settings::pipeline(cost, 2, None, None).unwrap();
        let knobs = crate::schedulers::Knobs::matching(&limits);
        let kind = crate::schedulers::SchedulerKind::VllmV1;
        let c = p.cluster.as_ref().unwrap();
        let w = s.workload(p).unwrap();
        let o =
            crate::produce::produce_cluster_on(&w, (cost, &pipeline), kind, &knobs, (1, c.router))
                .unwrap();
        assert_eq!(row.mean_e2e_s, Some(o.summary.mean_e2e_s));
        // Refused: other schedulers on a pipeline, a stage count out of range.
        let with = |grid: &str| {
            Sweep::parse(
                &spec.replace(
                    r#"clusters = [{ replicas = 2 }, { replicas = 1, pp = 2 }]
schedulers = ["vllm-v1"]"#,
                    grid,
                ),
                Path::new("."),
            )
            .unwrap_err()
            .to_string()
        };
        let e = with("clusters = [{ replicas = 1, pp = 2 }]\nschedulers = [\"sarathi\", \"orca\"]");
        assert!(
            e.contains("orca on grid.clusters[0], whose replicas are pipelines of 2 stages"),
            "{e}"
        );
        // Both sides of a disaggregated cluster may be pipelines too.
        let split = Sweep::parse(
            &spec.replace(
                "clusters = [{ replicas = 2 }, { replicas = 1, pp = 2 }]",
                "clusters = [{ disaggregate = \"1:1\", pp = 2 }]",
            ),
            Path::new("."),
        )
        .unwrap();
        let row = split.run_point(&split.points[0]);
        assert!(!row.failed(), "{row:?}");
        assert_eq!(
            (row.disaggregate.as_deref(), row.pp),
            (Some("1:1"), Some(2))
        );
        // vLLM v0's virtual engines on every replica.
        let engines = Sweep::parse(
            &spec
                .replace(
                    "clusters = [{ replicas = 2 }, { replicas = 1, pp = 2 }]",
                    "clusters = [{ replicas = 2, pp = 2 }]",
                )
                .replace("schedulers = [\"vllm-v1\"]", "schedulers = [\"vllm\"]"),
            Path::new("."),
        )
        .unwrap();
        let row = engines.run_point(&engines.points[0]);
        assert!(!row.failed(), "{row:?}");
        assert_eq!((row.replicas, row.pp), (Some(2), Some(2)));
        assert!(row.mean_e2e_s.is_some_and(|s| s > 0.0));
        let e = with("clusters = [{ replicas = 1, pp = 0 }]\nschedulers = [\"vllm-v1\"]");
        assert!(
            e.contains("grid.clusters[0].pp: expected 1 to 64, got 0"),
            "{e}"
        );
    }

    #[test]
    fn a_disaggregated_cluster_is_a_grid_value() {
        let spec = r#"
[workload]
n = 6
I = 40
O = 3
arrival = "poisson:50"
[grid]
clusters = [{ replicas = 2 }, { disaggregate = "1:1" }]
schedulers = ["vllm-v1"]
"#;
        let s = Sweep::parse(spec, Path::new(".")).unwrap();
        assert_eq!(s.swept, vec!["disaggregate"]);
        let p = &s.points[1];
        let c = p.cluster.as_ref().unwrap();
        assert_eq!(c.replicas, 2);
        assert!(
            p.key()
                .contains(";replicas=2;disaggregate=1:1;router=round-robin;"),
            "{}",
            p.key()
        );
        // The colocated cluster's key is what it always was.
        assert!(!s.points[0].key().contains("disaggregate"));
        let row = s.run_point(p);
        assert!(!row.failed(), "{row:?}");
        assert_eq!(
            (row.replicas, row.disaggregate.as_deref()),
            (Some(2), Some("1:1"))
        );
        let w = s.workload(p).unwrap();
        let knobs = crate::schedulers::Knobs::matching(&s.limits(p).unwrap());
        let cost = s.cost_of(p);
        let link = crate::settings::kv_link(cost, None, 0.0).unwrap();
        let split = c.disaggregate.unwrap();
        let kind = crate::schedulers::SchedulerKind::VllmV1;
        let o =
            crate::produce::produce_disaggregated(&w, cost, kind, &knobs, split, c.router, &link)
                .unwrap();
        assert_eq!(row.mean_e2e_s, Some(o.summary.mean_e2e_s));
        assert_ne!(row.mean_e2e_s, s.run_point(&s.points[0]).mean_e2e_s);
    }

    #[test]
    fn bad_clusters_name_the_key() {
        let with = |grid: &str| {
            err(&format!(
                "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\n{grid}\n"
            ))
        };
        let e = with("clusters = [{ replicas = 0 }]\nschedulers = [\"vllm\"]");
        assert!(
            e.contains("grid.clusters[0].replicas: expected 1 to 4096, got 0"),
            "{e}"
        );
        let e = with("clusters = [{ replicas = 2 }]\nschedulers = [\"optimal\", \"vllm\"]");
        assert!(
            e.contains("optimal solves one replica; grid.clusters[0] has 2"),
            "{e}"
        );
        let e = with("routers = [\"round-robin\", \"closest\"]\nschedulers = [\"vllm\"]");
        assert!(
            e.contains("grid.routers[1]: unknown router \"closest\""),
            "{e}"
        );
        let e = with(
            "clusters = [{ replicas = 2, cost_model = \"no-such-gpu\" }]\nschedulers = [\"vllm\"]",
        );
        assert!(
            e.contains("grid.clusters[0].cost_model = \"no-such-gpu\""),
            "{e}"
        );
        let e = with("clusters = [{ replicas = 2 }, { replicas = 2 }]\nschedulers = [\"vllm\"]");
        assert!(e.contains("grid.clusters[1]: repeats"), "{e}");
        let e = with("clusters = [{ replica = 2 }]\nschedulers = [\"vllm\"]");
        assert!(e.contains("replica"), "{e}");
        let e = with(
            "clusters = [{ replicas = 2, disaggregate = \"1:1\" }]\nschedulers = [\"vllm-v1\"]",
        );
        assert!(
            e.contains("grid.clusters[0]: expected replicas = N or disaggregate"),
            "{e}"
        );
        let e = with("clusters = [{ disaggregate = \"1-1\" }]\nschedulers = [\"vllm-v1\"]");
        assert!(
            e.contains("grid.clusters[0].disaggregate: --disaggregate \"1-1\": expected P:D"),
            "{e}"
        );
        let e = with(
            "clusters = [{ disaggregate = \"1:1\" }]\nschedulers = [\"vllm-v1\", \"sarathi\"]",
        );
        assert!(
            e.contains("grid.schedulers: sarathi on grid.clusters[0], a disaggregated cluster"),
            "{e}"
        );
    }

    #[test]
    fn results_of_the_version_before_clusters_still_read() {
        let legacy: Vec<&str> = RESULT_COLUMNS
            .iter()
            .copied()
            .filter(|c| !ADDED_COLUMNS.contains(c))
            .collect();
        let s = Sweep::parse(SPEC, Path::new(".")).unwrap();
        let mut row = s.run_point(&s.points[1]);
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        w.serialize(&row).unwrap();
        let line = String::from_utf8(w.into_inner().unwrap()).unwrap();
        // The same row without the columns added since (no cell of it holds a comma).
        let old: Vec<&str> = line
            .trim_end()
            .split(',')
            .zip(RESULT_COLUMNS)
            .filter(|(_, c)| !ADDED_COLUMNS.contains(c))
            .map(|(cell, _)| cell)
            .collect();
        let text = format!("{}\n{}\n", legacy.join(","), old.join(","));
        let rows = parse_results(Path::new("old.csv"), text.as_bytes()).unwrap();
        (row.p50_ttft_s, row.p90_ttft_s) = (None, None);
        (row.p50_tpot_s, row.p90_tpot_s, row.p99_tpot_s) = (None, None, None);
        (row.p50_e2e_s, row.p90_e2e_s, row.p99_e2e_s) = (None, None, None);
        (row.p50_tbt_s, row.p90_tbt_s, row.p99_tbt_s) = (None, None, None);
        assert_eq!(rows, vec![row]);
        let bad = format!("{}\n", legacy[1..].join(","));
        assert!(parse_results(Path::new("old.csv"), bad.as_bytes()).is_err());
    }

    #[test]
    fn rows_measure_the_specs_slos() {
        let spec = format!("slos = [\"e2e-max=1ms\", \"ttft-p50=100s\"]\n{SPEC}");
        let s = Sweep::parse(&spec, Path::new(".")).unwrap();
        let row = s.run_point(&s.points[1]);
        // No request ends within 1 ms.
        assert_eq!(row.slo_attainment, Some(0.0), "{row:?}");
        assert_eq!(row.metric("slo_attainment"), Some(0.0));
        assert!(row.p99_e2e_s.unwrap() >= row.mean_e2e_s.unwrap());
        // Without slos the columns stay empty.
        let plain = Sweep::parse(SPEC, Path::new("."))
            .unwrap()
            .run_point(&s.points[1]);
        assert_eq!(plain.slo_attainment, None);
        let e = err(&format!("slos = [\"ttft=2s\"]\n{SPEC}"));
        assert!(e.contains("slos[0]"), "{e}");
    }

    #[test]
    fn a_second_swept_parameter_gets_a_panel_per_value() {
        let spec = "[workload]\nn = 3\nI = 4\nO = 2\n[grid]\nM = [8, 12, 16]\nC = [4, 8]\nschedulers = [\"vllm\", \"sarathi\"]\n";
        let s = Sweep::parse(spec, Path::new(".")).unwrap();
        let rows: Vec<ResultRow> = s.points.iter().map(|p| s.run_point(p)).collect();
        let plots = sweep_plots(&s, &rows);
        let by_c = plots
            .iter()
            .find(|p| p.stem == "makespan_s-vs-M-by-C")
            .unwrap();
        let doc = by_c.svg.finish();
        assert!(
            doc.contains("C = 4") && doc.contains("C = 8"),
            "one panel per value"
        );
        assert!(plots.iter().any(|p| p.stem == "makespan_s-vs-C-by-M"));
        // Every plot written is among the paths checked before the sweep writes.
        let paths = plot_paths(&s, Path::new("plots"));
        for p in &plots {
            assert!(
                paths.contains(&Path::new("plots").join(format!("{}.svg", p.stem))),
                "{}",
                p.stem
            );
        }
        // A parameter with more values than panels is averaged over only.
        let many = "[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = [8, 9, 10, 11, 12, 13, 14]\nC = [4, 8]\nschedulers = [\"vllm\"]\n";
        let s = Sweep::parse(many, Path::new(".")).unwrap();
        let rows: Vec<ResultRow> = s.points.iter().map(|p| s.run_point(p)).collect();
        let plots = sweep_plots(&s, &rows);
        assert!(plots.iter().all(|p| !p.stem.ends_with("-by-M")));
        assert!(plots.iter().any(|p| p.stem == "makespan_s-vs-M-by-C"));
    }
}
