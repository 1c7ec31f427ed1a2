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
//!
//! [limits]                        # base values (unset: unlimited; M: from the cost model)
//! C = 64
//!
//! [grid]                          # lists; the run set is their cartesian product
//! M = [16, 24, 32]
//! schedulers = ["optimal", "optimal+no-evict", "vllm", "sarathi"]
//! objectives = ["makespan"]
//! ```
//! Grid keys: `M`, `C`, `P`, `R_max`, `I`, `O`, `n`, `qps`, `seed`, `schedulers`,
//! `objectives`. A scheduler is a heuristic name or `optimal`, optionally with policy
//! constraints: `optimal+no-evict`, `optimal+no-chunk+no-mix`, `optimal+fcfs`,
//! `optimal+reserve`.

use crate::core::{Limits, Summary, Workload};
use crate::cost_model::{self, LinearCostModel};
use crate::produce::{Contender, ProduceWith, produce};
use crate::report::{Plot, svg};
use crate::schedulers::Knobs;
use crate::solver::{Objective, SolveOptions};
use crate::workload::{ArrivalProcess, LengthDist, SampleSpec, Selection, SynthSpec};
use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// A parsed sweep specification.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Name (used in plot titles).
    #[serde(default)]
    pub name: Option<String>,
    /// What the sweep shows.
    #[serde(default)]
    pub description: Option<String>,
    /// Cost-model preset or coefficient file.
    #[serde(default)]
    pub cost_model: Option<String>,
    /// Solver time limit per run (s) [default 30].
    #[serde(default)]
    pub time_limit: Option<f64>,
    /// HiGHS threads per run [default 1].
    #[serde(default)]
    pub threads: Option<u32>,
    /// Relative MIP gap [default 1e-6].
    #[serde(default)]
    pub mip_gap: Option<f64>,
    /// Always solve the MILP, even where the exact counting search applies [default false].
    #[serde(default)]
    pub milp_only: Option<bool>,
    /// KV block size [default 1].
    #[serde(default)]
    pub block_size: Option<u32>,
    /// The workload.
    pub workload: WorkloadSection,
    /// Base limits.
    #[serde(default)]
    pub limits: LimitSection,
    /// The swept values.
    pub grid: GridSection,
}

/// `[workload]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// A trace to sample from (instead of synthetic lengths).
    #[serde(default)]
    pub trace: Option<String>,
    /// Requests.
    #[serde(default)]
    pub n: Option<usize>,
    /// Prompt lengths: an integer or a length distribution.
    #[serde(default, rename = "I")]
    pub input: Option<toml::Value>,
    /// Output lengths: an integer or a length distribution.
    #[serde(default, rename = "O")]
    pub output: Option<toml::Value>,
    /// Arrival process [default static; a `qps` grid makes it poisson].
    #[serde(default)]
    pub arrival: Option<String>,
    /// Seed [default 0].
    #[serde(default)]
    pub seed: Option<u64>,
    /// Trace: prompt scale factor.
    #[serde(default)]
    pub prefill_scale: Option<f64>,
    /// Trace: output scale factor.
    #[serde(default)]
    pub decode_scale: Option<f64>,
    /// Trace: cap on I + O.
    #[serde(default)]
    pub max_total_tokens: Option<u32>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSection {
    /// M.
    #[serde(default, rename = "M")]
    pub m: Option<u64>,
    /// C.
    #[serde(default, rename = "C")]
    pub c: Option<u64>,
    /// P.
    #[serde(default, rename = "P")]
    pub p: Option<u64>,
    /// R_max.
    #[serde(default, rename = "R_max")]
    pub r_max: Option<u64>,
}

/// `[grid]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridSection {
    /// M values.
    #[serde(default, rename = "M")]
    pub m: Option<Vec<u64>>,
    /// C values.
    #[serde(default, rename = "C")]
    pub c: Option<Vec<u64>>,
    /// P values.
    #[serde(default, rename = "P")]
    pub p: Option<Vec<u64>>,
    /// R_max values.
    #[serde(default, rename = "R_max")]
    pub r_max: Option<Vec<u64>>,
    /// Prompt lengths.
    #[serde(default, rename = "I")]
    pub input: Option<Vec<toml::Value>>,
    /// Output lengths.
    #[serde(default, rename = "O")]
    pub output: Option<Vec<toml::Value>>,
    /// Request counts.
    #[serde(default)]
    pub n: Option<Vec<usize>>,
    /// Poisson arrival rates.
    #[serde(default)]
    pub qps: Option<Vec<f64>>,
    /// Seeds.
    #[serde(default)]
    pub seed: Option<Vec<u64>>,
    /// Schedulers.
    pub schedulers: Vec<String>,
    /// Objectives [default makespan].
    #[serde(default)]
    pub objectives: Option<Vec<String>>,
}

/// One run of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Position in the grid (the order of the cartesian product).
    pub index: usize,
    /// M (None: from the cost model).
    pub m: Option<u64>,
    /// C.
    pub c: Option<u64>,
    /// P.
    pub p: Option<u64>,
    /// R_max.
    pub r_max: Option<u64>,
    /// Prompt lengths (a length distribution; `-` for a trace).
    pub input: String,
    /// Output lengths.
    pub output: String,
    /// Requests.
    pub n: usize,
    /// Poisson rate, if swept.
    pub qps: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// Objective name.
    pub objective: String,
    /// Scheduler name as written in the spec.
    pub scheduler: String,
}

fn o2s<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or(String::new(), ToString::to_string)
}

impl Point {
    /// The identity of the run, the same for the same setting in every sweep.
    pub fn key(&self) -> String {
        format!(
            "M={};C={};P={};R_max={};I={};O={};n={};qps={};seed={};objective={};scheduler={}",
            o2s(&self.m),
            o2s(&self.c),
            o2s(&self.p),
            o2s(&self.r_max),
            self.input,
            self.output,
            self.n,
            o2s(&self.qps),
            self.seed,
            self.objective,
            self.scheduler
        )
    }

    /// The key without the scheduler: runs that share it share a setting.
    pub fn setting_key(&self) -> String {
        let k = self.key();
        k[..k.rfind(";scheduler=").unwrap_or(k.len())].to_string()
    }
}

/// The columns of `results.csv`.
pub const RESULT_COLUMNS: &[&str] = &[
    "run",
    "key",
    "M",
    "C",
    "P",
    "R_max",
    "I",
    "O",
    "n",
    "qps",
    "seed",
    "objective",
    "scheduler",
    "status",
    "objective_s",
    "makespan_s",
    "mean_e2e_s",
    "mean_ttft_s",
    "p99_ttft_s",
    "mean_tpot_s",
    "throughput_tok_s",
    "evictions",
    "recomputed_tokens",
    "batches",
    "peak_kv_utilization",
    "best_bound_s",
    "certified_gap",
    "solve_s",
    "milp_rows",
    "milp_columns",
    "milp_integers",
    "solve_method",
    "error",
];

/// Writes an optional float as Rust prints it (`0.5`, `12`, `0.0000001`), the spelling
/// `results.csv` has always used, so identical results give identical bytes.
fn float_as_displayed<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) => s.serialize_str(&x.to_string()),
        None => s.serialize_none(),
    }
}

/// One row of `results.csv`: a grid point, its status and what its replay measured (empty
/// on error rows, which carry the error instead). Columns in [`RESULT_COLUMNS`] order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// The point's index in the grid.
    pub run: usize,
    /// The point's identity ([`Point::key`]).
    pub key: String,
    /// M (empty: from the cost model).
    #[serde(rename = "M")]
    pub m: Option<u64>,
    /// C.
    #[serde(rename = "C")]
    pub c: Option<u64>,
    /// P.
    #[serde(rename = "P")]
    pub p: Option<u64>,
    /// R_max.
    #[serde(rename = "R_max")]
    pub r_max: Option<u64>,
    /// Prompt lengths (a length distribution, `-` for a trace).
    #[serde(rename = "I")]
    pub input: String,
    /// Output lengths.
    #[serde(rename = "O")]
    pub output: String,
    /// Requests.
    pub n: usize,
    /// Poisson rate, if swept.
    #[serde(serialize_with = "float_as_displayed")]
    pub qps: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// Objective name.
    pub objective: String,
    /// Scheduler as written in the spec.
    pub scheduler: String,
    /// `heuristic`, the solver's status (`optimal`, `time-limit`, ...), or `error`.
    pub status: String,
    /// The objective's replayed value (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub objective_s: Option<f64>,
    /// Makespan (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub makespan_s: Option<f64>,
    /// Mean end-to-end latency (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub mean_e2e_s: Option<f64>,
    /// Mean time to first token (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub mean_ttft_s: Option<f64>,
    /// 99th percentile time to first token (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub p99_ttft_s: Option<f64>,
    /// Mean time per output token (s), where defined.
    #[serde(serialize_with = "float_as_displayed")]
    pub mean_tpot_s: Option<f64>,
    /// Output tokens per second, where defined.
    #[serde(serialize_with = "float_as_displayed")]
    pub throughput_tok_s: Option<f64>,
    /// Evictions.
    pub evictions: Option<u64>,
    /// Tokens computed again after evictions.
    pub recomputed_tokens: Option<u64>,
    /// Batches.
    pub batches: Option<u64>,
    /// Peak KV use / M, where M is finite.
    #[serde(serialize_with = "float_as_displayed")]
    pub peak_kv_utilization: Option<f64>,
    /// The solver's proven lower bound (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub best_bound_s: Option<f64>,
    /// The solver's certified gap.
    #[serde(serialize_with = "float_as_displayed")]
    pub certified_gap: Option<f64>,
    /// The solver's time (s).
    #[serde(serialize_with = "float_as_displayed")]
    pub solve_s: Option<f64>,
    /// The MILP's rows, when one was solved.
    pub milp_rows: Option<usize>,
    /// The MILP's columns.
    pub milp_columns: Option<usize>,
    /// The MILP's integer columns.
    pub milp_integers: Option<usize>,
    /// Which of the solver's methods answered.
    pub solve_method: Option<String>,
    /// Why the run failed (error rows only).
    pub error: Option<String>,
}

/// The status of a failed run.
pub const ERROR_STATUS: &str = "error";

impl ResultRow {
    /// Whether the run failed.
    pub fn failed(&self) -> bool {
        self.status == ERROR_STATUS
    }

    /// A numeric column by its name in `results.csv` (None when empty or not numeric).
    pub fn metric(&self, column: &str) -> Option<f64> {
        let u = |v: Option<u64>| v.map(|x| x as f64);
        let z = |v: Option<usize>| v.map(|x| x as f64);
        match column {
            "objective_s" => self.objective_s,
            "makespan_s" => self.makespan_s,
            "mean_e2e_s" => self.mean_e2e_s,
            "mean_ttft_s" => self.mean_ttft_s,
            "p99_ttft_s" => self.p99_ttft_s,
            "mean_tpot_s" => self.mean_tpot_s,
            "throughput_tok_s" => self.throughput_tok_s,
            "evictions" => u(self.evictions),
            "recomputed_tokens" => u(self.recomputed_tokens),
            "batches" => u(self.batches),
            "peak_kv_utilization" => self.peak_kv_utilization,
            "best_bound_s" => self.best_bound_s,
            "certified_gap" => self.certified_gap,
            "solve_s" => self.solve_s,
            "milp_rows" => z(self.milp_rows),
            "milp_columns" => z(self.milp_columns),
            "milp_integers" => z(self.milp_integers),
            _ => None,
        }
    }

    /// A grid parameter ([`GRID_PARAMS`]) as written in `results.csv`.
    pub fn param(&self, name: &str) -> String {
        match name {
            "M" => o2s(&self.m),
            "C" => o2s(&self.c),
            "P" => o2s(&self.p),
            "R_max" => o2s(&self.r_max),
            "I" => self.input.clone(),
            "O" => self.output.clone(),
            "n" => self.n.to_string(),
            "qps" => o2s(&self.qps),
            "seed" => self.seed.to_string(),
            _ => String::new(),
        }
    }

    /// The key without the scheduler: rows that share it share a setting.
    pub fn setting_key(&self) -> &str {
        &self.key[..self.key.rfind(";scheduler=").unwrap_or(self.key.len())]
    }
}

/// The parameters a grid can sweep, as they appear in `results.csv`.
pub const GRID_PARAMS: &[&str] = &["M", "C", "P", "R_max", "I", "O", "n", "qps", "seed"];

fn length_value(v: &toml::Value, key: &str) -> Result<String> {
    let s = match v {
        toml::Value::Integer(i) if *i >= 1 => format!("fixed:{i}"),
        toml::Value::String(s) => s.clone(),
        other => bail!(
            "{key}: expected a positive integer or a length distribution such as \"uniform:4:16\", got {other}"
        ),
    };
    s.parse::<LengthDist>()
        .map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
    Ok(s)
}

/// A loaded spec: the grid's points and what every run needs.
#[derive(Debug)]
pub struct Sweep {
    /// The spec.
    pub spec: SweepSpec,
    /// The spec file's directory (relative paths resolve against it).
    pub base_dir: PathBuf,
    /// All points of the grid, in order.
    pub points: Vec<Point>,
    /// Parameters with more than one value.
    pub swept: Vec<&'static str>,
    cost: LinearCostModel,
    trace: Option<Workload>,
}

/// The lists a grid multiplies, in the order of its cartesian product (objectives vary
/// slowest, schedulers fastest).
struct Grid {
    objectives: Vec<String>,
    ms: Vec<Option<u64>>,
    cs: Vec<Option<u64>>,
    ps: Vec<Option<u64>>,
    rs: Vec<Option<u64>>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    ns: Vec<usize>,
    qpss: Vec<Option<f64>>,
    seeds: Vec<u64>,
    schedulers: Vec<String>,
}

impl Grid {
    /// The list lengths, slowest first.
    fn radices(&self) -> [usize; 11] {
        [
            self.objectives.len(),
            self.ms.len(),
            self.cs.len(),
            self.ps.len(),
            self.rs.len(),
            self.inputs.len(),
            self.outputs.len(),
            self.ns.len(),
            self.qpss.len(),
            self.seeds.len(),
            self.schedulers.len(),
        ]
    }

    /// Points in the grid, or None when the count overflows.
    fn len(&self) -> Option<usize> {
        self.radices()
            .iter()
            .try_fold(1usize, |acc, &k| acc.checked_mul(k))
    }

    /// Point `index` of the product: its digits in the mixed radix of the list lengths.
    fn point(&self, index: usize) -> Point {
        let radices = self.radices();
        let mut digit = [0usize; 11];
        let mut rest = index;
        for (d, &r) in digit.iter_mut().zip(&radices).rev() {
            *d = rest % r;
            rest /= r;
        }
        let [o, m, c, p, r, i, out, n, q, seed, sched] = digit;
        Point {
            index,
            m: self.ms[m],
            c: self.cs[c],
            p: self.ps[p],
            r_max: self.rs[r],
            input: self.inputs[i].clone(),
            output: self.outputs[out].clone(),
            n: self.ns[n],
            qps: self.qpss[q],
            seed: self.seeds[seed],
            objective: self.objectives[o].clone(),
            scheduler: self.schedulers[sched].clone(),
        }
    }
}

impl Sweep {
    /// Parses and checks a spec; errors name the file and the key.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let base_dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::parse(&text, &base_dir).with_context(|| format!("sweep spec {}", path.display()))
    }

    /// Parses a spec from text; relative paths resolve against `base_dir`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<Self> {
        let spec: SweepSpec = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let cost_name = spec.cost_model.clone().unwrap_or("llama2-7b-a100".into());
        let cost = {
            let as_path = base_dir.join(&cost_name);
            let name = if as_path.exists() {
                as_path.display().to_string()
            } else {
                cost_name.clone()
            };
            cost_model::resolve(&name).with_context(|| format!("cost_model = \"{cost_name}\""))?
        };
        if let Some(t) = spec.time_limit
            && !(t.is_finite() && t > 0.0)
        {
            bail!("time_limit: expected seconds > 0, got {t}");
        }
        if let Some(t) = spec.threads
            && !(1..=256).contains(&t)
        {
            bail!("threads: expected 1 to 256 HiGHS threads per run, got {t}");
        }
        if let Some(g) = spec.mip_gap
            && !(0.0..1.0).contains(&g)
        {
            bail!("mip_gap: expected a value in [0, 1), got {g}");
        }
        if spec.block_size == Some(0) {
            bail!("block_size: expected >= 1");
        }
        let w = &spec.workload;
        let trace = match &w.trace {
            Some(t) => {
                if w.input.is_some() || w.output.is_some() {
                    bail!(
                        "workload: I and O are for synthetic workloads; a trace gives its own lengths"
                    );
                }
                if spec.grid.input.is_some() || spec.grid.output.is_some() {
                    bail!(
                        "grid.I / grid.O: a trace workload gives its own lengths (scale them with prefill_scale / decode_scale)"
                    );
                }
                let p = base_dir.join(t);
                Some(
                    crate::workload::read_trace(&p)
                        .with_context(|| format!("workload.trace = \"{t}\""))?,
                )
            }
            None => None,
        };
        if let Some(a) = &w.arrival {
            a.parse::<ArrivalProcess>()
                .map_err(|e| anyhow::anyhow!("workload.arrival: {e}"))?;
        }
        let base_len = |v: &Option<toml::Value>, key: &str| -> Result<Vec<String>> {
            match v {
                Some(v) => Ok(vec![length_value(v, key)?]),
                None if trace.is_some() => Ok(vec!["-".into()]),
                None => Ok(vec![]),
            }
        };
        let g = &spec.grid;
        let lengths = |grid: &Option<Vec<toml::Value>>,
                       base: Vec<String>,
                       key: &str|
         -> Result<Vec<String>> {
            match grid {
                Some(vs) => {
                    if vs.is_empty() {
                        bail!("{key}: empty list");
                    }
                    let vals: Vec<String> = vs
                        .iter()
                        .enumerate()
                        .map(|(i, v)| length_value(v, &format!("{key}[{i}]")))
                        .collect::<Result<_>>()?;
                    if let Some(j) = (1..vals.len()).find(|&j| vals[..j].contains(&vals[j])) {
                        bail!(
                            "{key}[{j}]: repeats an earlier value; each grid value must be distinct"
                        );
                    }
                    Ok(vals)
                }
                None if base.is_empty() => bail!(
                    "workload.{}: required for a synthetic workload (or give {key})",
                    &key[5..]
                ),
                None => Ok(base),
            }
        };
        let inputs = lengths(&g.input, base_len(&w.input, "workload.I")?, "grid.I")?;
        let outputs = lengths(&g.output, base_len(&w.output, "workload.O")?, "grid.O")?;
        fn list<T: Clone + PartialEq>(
            grid: &Option<Vec<T>>,
            base: Option<T>,
            key: &str,
        ) -> Result<Vec<Option<T>>> {
            match grid {
                Some(v) if v.is_empty() => bail!("{key}: empty list"),
                Some(v) => {
                    if let Some(j) = (1..v.len()).find(|&j| v[..j].contains(&v[j])) {
                        bail!(
                            "{key}[{j}]: repeats an earlier value; each grid value must be distinct (a repeated run would write the same key twice)"
                        );
                    }
                    Ok(v.iter().cloned().map(Some).collect())
                }
                None => Ok(vec![base]),
            }
        }
        let ms = list(&g.m, spec.limits.m, "grid.M")?;
        let cs = list(&g.c, spec.limits.c, "grid.C")?;
        let ps = list(&g.p, spec.limits.p, "grid.P")?;
        let rs = list(&g.r_max, spec.limits.r_max, "grid.R_max")?;
        for (key, vals) in [("M", &ms), ("C", &cs), ("P", &ps), ("R_max", &rs)] {
            if vals.contains(&Some(0)) {
                bail!("{key}: expected values >= 1");
            }
        }
        let ns = list(&g.n, w.n, "grid.n")?;
        if ns.iter().any(|n| n.is_none()) {
            bail!("workload.n: required (or give grid.n)");
        }
        if ns.contains(&Some(0)) {
            bail!("n: expected >= 1 requests");
        }
        let qpss = list(&g.qps, None, "grid.qps")?;
        if qpss.iter().flatten().any(|q| !(q.is_finite() && *q > 0.0)) {
            bail!("grid.qps: expected rates > 0");
        }
        let seeds = list(&g.seed, Some(w.seed.unwrap_or(0)), "grid.seed")?;
        if g.schedulers.is_empty() {
            bail!("grid.schedulers: empty list");
        }
        for (i, s) in g.schedulers.iter().enumerate() {
            s.parse::<Contender>()
                .map_err(|e| anyhow::anyhow!("grid.schedulers[{i}]: {e}"))?;
        }
        let objectives = g.objectives.clone().unwrap_or(vec!["makespan".into()]);
        if objectives.is_empty() {
            bail!("grid.objectives: empty list");
        }
        for (key, vals) in [
            ("grid.schedulers", &g.schedulers),
            ("grid.objectives", &objectives),
        ] {
            if let Some(j) = (1..vals.len()).find(|&j| vals[..j].contains(&vals[j])) {
                bail!(
                    "{key}[{j}]: \"{}\" repeats an earlier value; each grid value must be distinct",
                    vals[j]
                );
            }
        }
        for (i, o) in objectives.iter().enumerate() {
            o.parse::<Objective>()
                .map_err(|e| anyhow::anyhow!("grid.objectives[{i}]: {e}"))?;
        }
        let mut swept = Vec::new();
        for (name, count) in [
            ("M", ms.len()),
            ("C", cs.len()),
            ("P", ps.len()),
            ("R_max", rs.len()),
            ("I", inputs.len()),
            ("O", outputs.len()),
            ("n", ns.len()),
            ("qps", qpss.len()),
            ("seed", seeds.len()),
        ] {
            if count > 1 {
                swept.push(name);
            }
        }
        let grid = Grid {
            objectives,
            ms,
            cs,
            ps,
            rs,
            inputs,
            outputs,
            ns: ns.into_iter().map(|n| n.expect("checked")).collect(),
            qpss,
            seeds: seeds
                .into_iter()
                .map(|s| s.expect("has a default"))
                .collect(),
            schedulers: g.schedulers.clone(),
        };
        // The grid's size before anything is allocated for it.
        let Some(runs) = grid.len().filter(|&r| r <= MAX_GRID_RUNS) else {
            bail!(
                "grid: more than {MAX_GRID_RUNS} runs (the product of the lists' lengths); split it into several specs"
            );
        };
        let points: Vec<Point> = (0..runs).map(|i| grid.point(i)).collect();
        Ok(Self {
            spec,
            base_dir: base_dir.to_path_buf(),
            points,
            swept,
            cost,
            trace,
        })
    }

    /// The workload of a point.
    pub fn workload(&self, p: &Point) -> Result<Workload> {
        let w = &self.spec.workload;
        let arrival = match (p.qps, &w.arrival) {
            (Some(q), _) => Some(ArrivalProcess::Poisson(q)),
            (None, Some(a)) => Some(a.parse::<ArrivalProcess>().map_err(anyhow::Error::msg)?),
            (None, None) => None,
        };
        match &self.trace {
            Some(trace) => Ok(crate::workload::sample(
                trace,
                &SampleSpec {
                    selection: Selection::Random(p.n, p.seed),
                    prefill_scale: w.prefill_scale.unwrap_or(1.0),
                    decode_scale: w.decode_scale.unwrap_or(1.0),
                    max_total_tokens: w.max_total_tokens,
                    arrival,
                    arrival_seed: p.seed,
                    rebase_time: true,
                    ..SampleSpec::default()
                },
            )?),
            None => Ok(crate::workload::generate(&SynthSpec {
                requests: p.n,
                input: p.input.parse().map_err(anyhow::Error::msg)?,
                output: p.output.parse().map_err(anyhow::Error::msg)?,
                arrival: arrival.unwrap_or(ArrivalProcess::Static),
                seed: p.seed,
            })?),
        }
    }

    /// The limits of a point.
    pub fn limits(&self, p: &Point) -> Result<Limits> {
        let m = match p.m {
            Some(m) => m,
            None => {
                let f = &self.cost.file;
                match (&f.model, &f.gpu) {
                    (Some(model), Some(gpu)) => cost_model::kv_capacity_tokens(
                        model,
                        gpu,
                        f.tensor_parallel,
                        cost_model::DEFAULT_GPU_MEMORY_UTILIZATION,
                    )?,
                    _ => bail!(
                        "M: required, cost model {} has no model and GPU spec",
                        self.cost.name
                    ),
                }
            }
        };
        let l = Limits {
            token_budget: p.c,
            prefill_budget: p.p,
            kv_capacity: Some(m),
            max_running: p.r_max,
            block_size: self.spec.block_size.unwrap_or(1),
            watermark: 0.0,
        };
        l.validate()?;
        Ok(l)
    }

    /// Runs one point and returns its `results.csv` row.
    pub fn run_point(&self, p: &Point) -> ResultRow {
        let mut row = ResultRow {
            run: p.index,
            key: p.key(),
            m: p.m,
            c: p.c,
            p: p.p,
            r_max: p.r_max,
            input: p.input.clone(),
            output: p.output.clone(),
            n: p.n,
            qps: p.qps,
            seed: p.seed,
            objective: p.objective.clone(),
            scheduler: p.scheduler.clone(),
            status: ERROR_STATUS.into(),
            objective_s: None,
            makespan_s: None,
            mean_e2e_s: None,
            mean_ttft_s: None,
            p99_ttft_s: None,
            mean_tpot_s: None,
            throughput_tok_s: None,
            evictions: None,
            recomputed_tokens: None,
            batches: None,
            peak_kv_utilization: None,
            best_bound_s: None,
            certified_gap: None,
            solve_s: None,
            milp_rows: None,
            milp_columns: None,
            milp_integers: None,
            solve_method: None,
            error: None,
        };
        // A panic in one run (a dependency's included) is that run's error row, so the
        // sweep goes on and `--resume` does not repeat it.
        let measured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.measure(p)))
            .unwrap_or_else(|payload| {
                Err(anyhow::anyhow!(
                    "internal error: this run panicked: {}",
                    crate::solver::panic_message(payload.as_ref())
                ))
            });
        match measured {
            Ok((status, objective, s, solve)) => {
                row.status = status;
                row.objective_s = Some(objective);
                row.makespan_s = Some(s.makespan_s);
                row.mean_e2e_s = Some(s.mean_e2e_s);
                row.mean_ttft_s = Some(s.mean_ttft_s);
                row.p99_ttft_s = Some(s.ttft_s.p99);
                row.mean_tpot_s = s.mean_tpot_s;
                row.throughput_tok_s = s.throughput_tok_s;
                row.evictions = Some(s.evictions);
                row.recomputed_tokens = Some(s.recomputed_tokens);
                row.batches = Some(s.batches as u64);
                row.peak_kv_utilization = s.peak_kv_utilization;
                if let Some(x) = solve {
                    row.best_bound_s = Some(x.best_bound);
                    row.certified_gap = Some(x.certified_gap);
                    row.solve_s = Some(x.solve_s);
                    row.milp_rows = x.model.map(|m| m.rows);
                    row.milp_columns = x.model.map(|m| m.columns);
                    row.milp_integers = x.model.map(|m| m.integers);
                    row.solve_method = Some(x.method.name().to_string());
                }
            }
            Err(e) => row.error = Some(format!("{e:#}").replace('\n', " ")),
        }
        row
    }

    fn measure(&self, p: &Point) -> Result<(String, f64, Summary, Option<SolveFacts>)> {
        let w = self.workload(p)?;
        let limits = self.limits(p)?;
        let objective: Objective = p.objective.parse().map_err(anyhow::Error::msg)?;
        let contender: Contender = p.scheduler.parse().map_err(anyhow::Error::msg)?;
        let options = SolveOptions {
            time_limit_s: self.spec.time_limit.unwrap_or(30.0),
            threads: self.spec.threads.unwrap_or(1),
            mip_rel_gap: self.spec.mip_gap.unwrap_or(1e-6),
            max_search_states: if self.spec.milp_only.unwrap_or(false) {
                0
            } else {
                SolveOptions::default().max_search_states
            },
            ..SolveOptions::default()
        };
        // Heuristics run under exactly the grid point's limits, like the solver.
        let knobs = Knobs::matching(&limits);
        let with = ProduceWith {
            knobs: &knobs,
            limits: &limits,
            objective,
            solve: &options,
        };
        let outcome = produce(&w, &self.cost, contender, &with)?;
        let (status, solve) = match &outcome.solve {
            None => ("heuristic".to_string(), None),
            Some(r) => (
                r.status.name().to_string(),
                Some(SolveFacts {
                    method: r.method,
                    best_bound: r.best_bound,
                    certified_gap: r.certified_gap,
                    solve_s: r.solve_s,
                    model: r.model,
                }),
            ),
        };
        let s = outcome.summary;
        Ok((status, objective.of(&s), s, solve))
    }
}

/// What a sweep row records of a MILP solve.
#[derive(Debug, Clone, Copy)]
struct SolveFacts {
    method: crate::solver::SolveMethod,
    best_bound: f64,
    certified_gap: f64,
    solve_s: f64,
    model: Option<crate::solver::ModelSize>,
}

/// Parses `K/N` (1 <= K <= N).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let err = || anyhow::anyhow!("--shard: expected K/N with 1 <= K <= N, e.g. 2/4; got \"{s}\"");
    let (k, n) = s.split_once('/').ok_or_else(err)?;
    let (k, n): (usize, usize) = (
        k.trim().parse().map_err(|_| err())?,
        n.trim().parse().map_err(|_| err())?,
    );
    if k == 0 || n == 0 || k > n {
        return Err(err());
    }
    Ok((k, n))
}

/// The points of shard `k` of `n` (1-based): every n-th point starting at k - 1.
pub fn shard(points: &[Point], k: usize, n: usize) -> Vec<Point> {
    points
        .iter()
        .filter(|p| p.index % n == k - 1)
        .cloned()
        .collect()
}

/// The CSV bytes of the header line.
fn header_line() -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    w.write_record(RESULT_COLUMNS)?;
    w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))
}

/// The CSV bytes of one row (no header).
fn row_line(row: &ResultRow) -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(row)?;
    w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))
}

/// Reads `results.csv`: the header check, complete rows only (a line cut short by a kill
/// is dropped and the file truncated to the last complete line).
pub fn read_results(path: &Path) -> Result<Vec<ResultRow>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(i) => i + 1,
        None => 0,
    };
    if complete == 0 {
        // No complete line: a header written without its newline is still the header;
        // anything else is not a results file (and is left as it is).
        if bytes.trim_ascii() != RESULT_COLUMNS.join(",").as_bytes() {
            bail!(
                "{}: no complete header line; not a sweep results file (delete it or choose another --out)",
                path.display()
            );
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
        f.write_all(b"\n")?;
        complete = bytes.len();
    } else if complete < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        f.set_len(complete as u64)?;
    }
    parse_results(path, &bytes[..complete.min(bytes.len())])
}

/// The rows of a results file's complete lines `bytes` (from `path`, for messages): this
/// version's header, then rows of its columns; errors name the line and the field.
fn parse_results(path: &Path, bytes: &[u8]) -> Result<Vec<ResultRow>> {
    let mut r = csv::ReaderBuilder::new().from_reader(bytes);
    let header = r
        .headers()
        .with_context(|| format!("{}: no header", path.display()))?
        .clone();
    if header.iter().ne(RESULT_COLUMNS.iter().copied()) {
        bail!(
            "{}: not a sweep results file of this version (columns differ)",
            path.display()
        );
    }
    r.deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{}: line {}", path.display(), i + 2)))
        .collect()
}

/// Rewrites `results.csv` whole (atomically): the header, then `rows`.
fn write_results(path: &Path, rows: &[ResultRow]) -> Result<()> {
    crate::core::io::write_atomic(path, |w| {
        let mut cw = csv::WriterBuilder::new().has_headers(false).from_writer(w);
        cw.write_record(RESULT_COLUMNS)?;
        for r in rows {
            cw.serialize(r)?;
        }
        cw.flush()
    })
    .with_context(|| format!("writing {}", path.display()))
}

/// Takes the exclusive lock of a sweep's output directory (`.infersched-sweep.lock`, with
/// the holder's process id inside), or says who holds it. The OS releases the lock when
/// the file is closed or the process dies, so a killed sweep never leaves it held.
fn lock_output_dir(out: &Path) -> Result<std::fs::File> {
    let path = out.join(".infersched-sweep.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => {
            f.set_len(0)?;
            write!(f, "{}", std::process::id())?;
            f.flush()?;
            Ok(f)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "{}: another sweep (process {}) is writing to this directory; wait for it to finish or choose another --out",
                out.display(),
                if holder.trim().is_empty() {
                    "unknown"
                } else {
                    holder.trim()
                }
            )
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// What a sweep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Runs in this shard.
    pub planned: usize,
    /// Runs skipped because results.csv had them.
    pub skipped: usize,
    /// Runs done now.
    pub ran: usize,
    /// Of those, runs that failed (status `error`).
    pub failed: usize,
    /// Plots written.
    pub plots: Vec<PathBuf>,
}

/// Runs `sweep` (or one shard of it) into `out`; see the module docs.
pub fn run(
    sweep: &Sweep,
    out: &Path,
    resume: bool,
    shard_of: Option<(usize, usize)>,
    jobs: Option<usize>,
    progress: bool,
) -> Result<SweepOutcome> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Held until this function returns: one sweep per output directory at a time.
    let _lock = lock_output_dir(out)?;
    let results_path = out.join("results.csv");
    let points = match shard_of {
        Some((k, n)) => shard(&sweep.points, k, n),
        None => sweep.points.clone(),
    };
    let mut done = HashSet::new();
    if results_path.exists() {
        if !resume {
            bail!(
                "{} exists; pass --resume to continue that sweep, or choose another --out",
                results_path.display()
            );
        }
        // Keep the first row of each key of this grid; duplicates (from an older version
        // without the lock) and rows of another grid are dropped, and said so.
        let grid: HashSet<String> = sweep.points.iter().map(Point::key).collect();
        let recs = read_results(&results_path)?;
        let total = recs.len();
        let mut kept = Vec::with_capacity(total);
        let (mut duplicates, mut foreign) = (0, 0);
        for rec in recs {
            if !grid.contains(&rec.key) {
                foreign += 1;
            } else if done.insert(rec.key.clone()) {
                kept.push(rec);
            } else {
                duplicates += 1;
            }
        }
        if kept.len() < total {
            eprintln!(
                "{}: dropped {duplicates} duplicate rows and {foreign} rows not in this grid",
                results_path.display()
            );
            write_results(&results_path, &kept)?;
        }
    } else {
        crate::core::io::write_bytes_atomic(&results_path, &header_line()?)?;
    }
    let todo: Vec<&Point> = points.iter().filter(|p| !done.contains(&p.key())).collect();
    let skipped = points.len() - todo.len();
    let file = Mutex::new(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&results_path)
            .with_context(|| format!("opening {}", results_path.display()))?,
    );
    let bar = if progress {
        indicatif::ProgressBar::new(todo.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {pos}/{len} runs, ETA {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.unwrap_or(0))
        .build()?;
    let write_result: Result<()> = pool.install(|| {
        todo.par_iter().try_for_each(|p| -> Result<()> {
            let row = sweep.run_point(p);
            if row.failed() {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                bar.println(format!(
                    "run {} ({}): {}",
                    p.index,
                    p.key(),
                    row.error.as_deref().unwrap_or_default()
                ));
            }
            let line = row_line(&row)?;
            let mut f = file.lock().expect("no panics while holding the lock");
            f.write_all(&line)?;
            f.flush()?;
            drop(f);
            bar.inc(1);
            Ok(())
        })
    });
    bar.finish_and_clear();
    write_result.with_context(|| format!("appending to {}", results_path.display()))?;
    // Deterministic final file: the records sorted by run index.
    let mut recs = read_results(&results_path)?;
    recs.sort_by_key(|r| r.run);
    write_results(&results_path, &recs)?;
    let plots = sweep_plots(sweep, &recs);
    let plot_paths = crate::report::write_plots(&out.join("plots"), &plots)?;
    Ok(SweepOutcome {
        planned: points.len(),
        skipped,
        ran: todo.len(),
        failed: failed.into_inner(),
        plots: plot_paths,
    })
}

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
    let ok: Vec<&ResultRow> = recs.iter().filter(|r| !r.failed()).collect();
    // The optimal scheduler's objective per setting, its proven bound, and whether it is
    // proven optimal (else the ratios are to the best schedule found).
    let mut optimum: BTreeMap<&str, (f64, Option<f64>, bool)> = BTreeMap::new();
    for r in &ok {
        if r.scheduler == crate::produce::OPTIMAL
            && let Some(v) = r.objective_s
        {
            optimum.insert(r.setting_key(), (v, r.best_bound_s, r.status == "optimal"));
        }
    }
    let objectives: HashSet<&str> = recs.iter().map(|r| r.objective.as_str()).collect();
    let several_objectives = objectives.len() > 1;
    let series_name = |r: &ResultRow| {
        if several_objectives {
            format!("{} ({})", r.scheduler, r.objective)
        } else {
            r.scheduler.clone()
        }
    };
    let mut plots = Vec::new();
    let title = sweep.spec.name.clone().unwrap_or("sweep".into());
    // Seeds are replicates: averaged over, not plotted against.
    for &param in sweep.swept.iter().filter(|p| **p != "seed") {
        for &(metric, label) in PLOTTED_METRICS {
            if metric == "ratio_to_optimal" && optimum.is_empty() {
                continue;
            }
            // series name -> x -> (value, the other end of its bar, proven) per run
            type Runs = Vec<(f64, Option<f64>, bool)>;
            let mut data: BTreeMap<String, BTreeMap<String, Runs>> = BTreeMap::new();
            let mut order: Vec<String> = Vec::new();
            for r in &ok {
                let is_optimal = r.scheduler == crate::produce::OPTIMAL;
                let point = if metric == "ratio_to_optimal" {
                    // Without a proof the true ratio lies between v / best and v / bound.
                    match (optimum.get(r.setting_key()), r.objective_s) {
                        (Some(&(o, bound, proven)), Some(v)) if o > 0.0 => (
                            v / o,
                            bound.filter(|b| !proven && *b > 0.0).map(|b| v / b),
                            proven,
                        ),
                        _ => continue,
                    }
                } else {
                    let Some(v) = r.metric(metric) else {
                        continue;
                    };
                    let proven = !is_optimal || r.status == "optimal";
                    // The optimal row's objective reaches down to its proven bound.
                    let bound = (metric == "objective_s" && !proven)
                        .then_some(r.best_bound_s)
                        .flatten();
                    (v, bound, proven)
                };
                let name = series_name(r);
                if !order.contains(&name) {
                    order.push(name.clone());
                }
                data.entry(name)
                    .or_default()
                    .entry(r.param(param))
                    .or_default()
                    .push(point);
            }
            // Failed runs, by series.
            let mut failed: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for r in recs.iter().filter(|r| r.failed()) {
                let name = series_name(r);
                if !order.contains(&name) {
                    order.push(name.clone());
                }
                let x = axis_value(&r.param(param));
                let xs = failed.entry(name).or_default();
                if !xs.contains(&x) {
                    xs.push(x);
                }
            }
            let mean = |v: &mut dyn Iterator<Item = f64>| {
                let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
                sum / n as f64
            };
            let series: Vec<svg::Series> = order
                .iter()
                .map(|name| {
                    let mut pts: Vec<PlotPoint> =
                        data.get(name)
                            .into_iter()
                            .flatten()
                            .map(|(x, runs)| {
                                let y = mean(&mut runs.iter().map(|r| r.0));
                                let unproven = runs.iter().any(|r| !r.2);
                                // The bar: the mean of each run's other end (its own value
                                // where it has none).
                                let bar = runs.iter().any(|r| r.1.is_some()).then(|| {
                                    (y, mean(&mut runs.iter().map(|r| r.1.unwrap_or(r.0))))
                                });
                                let spread = runs
                                    .iter()
                                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
                                        (lo.min(r.0), hi.max(r.0))
                                    });
                                ((axis_value(x), y), unproven, bar, spread)
                            })
                            .collect();
                    pts.sort_by(|a, b| a.0.0.total_cmp(&b.0.0));
                    let mut xs = failed.get(name).cloned().unwrap_or_default();
                    xs.sort_by(f64::total_cmp);
                    svg::Series {
                        name: name.clone(),
                        points: pts.iter().map(|p| p.0).collect(),
                        step: false,
                        markers: true,
                        unproven: pts.iter().map(|p| p.1).collect(),
                        bars: pts.iter().map(|p| p.2).collect(),
                        failed: xs,
                        spread: pts.iter().map(|p| Some(p.3)).collect(),
                    }
                })
                .collect();
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
        }
    }
    plots
}

/// A numeric x for a parameter value: the number itself, or a length distribution's
/// fixed value / mean-ish first parameter.
fn axis_value(x: &str) -> f64 {
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
        other => other.into(),
    }
}

/// The most runs a grid may have (each is held in memory while the sweep runs).
pub const MAX_GRID_RUNS: usize = 10_000_000;

/// Grids with more runs than this need `--yes`.
pub const CONFIRM_GRID_RUNS: usize = 100_000;

/// What `sweep merge` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeOutcome {
    /// Result files read.
    pub files: usize,
    /// Rows written (one per run of the grid found).
    pub rows: usize,
    /// Runs of the grid no file has (0 unless `allow_missing`).
    pub missing: usize,
    /// Plots written.
    pub plots: Vec<PathBuf>,
}

/// Reads a shard's `results.csv` without touching it: the header must be this version's,
/// every line complete (a shard still running, or killed mid-line, is refused).
fn read_shard(path: &Path) -> Result<Vec<ResultRow>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        bail!(
            "{}: the last line is incomplete (is that shard still running? finish it with --resume first)",
            path.display()
        );
    }
    parse_results(path, &bytes)
}

/// Combines the results of shards of `sweep` (their `results.csv` files, or directories
/// holding one) into `out/results.csv` and its plots, as one run of the whole grid would
/// have written them. Refuses rows of another grid (a key, or a run index, that is not
/// this grid's), runs found in two files, and, unless `allow_missing`, a grid not covered;
/// every error names the file and line. Nothing is written unless all checks pass.
pub fn merge(
    sweep: &Sweep,
    shards: &[PathBuf],
    out: &Path,
    allow_missing: bool,
) -> Result<MergeOutcome> {
    if shards.is_empty() {
        bail!("sweep merge: no shard results given");
    }
    let grid: HashMap<String, usize> = sweep.points.iter().map(|p| (p.key(), p.index)).collect();
    let mut found: HashMap<usize, (ResultRow, PathBuf, usize)> = HashMap::new();
    for shard in shards {
        let path = if shard.is_dir() {
            shard.join("results.csv")
        } else {
            shard.clone()
        };
        for (i, rec) in read_shard(&path)?.into_iter().enumerate() {
            let line = i + 2;
            let Some(&index) = grid.get(&rec.key) else {
                bail!(
                    "{}: line {line}: run {} is not in the grid of this spec (another spec, or an edited one?)",
                    path.display(),
                    rec.run
                );
            };
            if rec.run != index {
                bail!(
                    "{}: line {line}: this grid runs that setting as run {index}, the file says run {}",
                    path.display(),
                    rec.run
                );
            }
            if let Some((_, other, other_line)) = found.get(&index) {
                bail!(
                    "run {index} is in two files: {} line {other_line} and {} line {line}; shards must be disjoint",
                    other.display(),
                    path.display()
                );
            }
            found.insert(index, (rec, path.clone(), line));
        }
    }
    let missing: Vec<&Point> = sweep
        .points
        .iter()
        .filter(|p| !found.contains_key(&p.index))
        .collect();
    if !missing.is_empty() && !allow_missing {
        let examples: Vec<String> = missing
            .iter()
            .take(5)
            .map(|p| p.index.to_string())
            .collect();
        bail!(
            "{} of {} runs of the grid are in no file (runs {}{}); pass --allow-missing to merge what there is",
            missing.len(),
            sweep.points.len(),
            examples.join(", "),
            if missing.len() > examples.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let _lock = lock_output_dir(out)?;
    let results_path = out.join("results.csv");
    if results_path.exists() {
        bail!(
            "{} exists; choose another --out for the merged results",
            results_path.display()
        );
    }
    let mut recs: Vec<ResultRow> = found.into_values().map(|(rec, _, _)| rec).collect();
    recs.sort_by_key(|r| r.run);
    write_results(&results_path, &recs)?;
    let plots = sweep_plots(sweep, &recs);
    let plot_paths = crate::report::write_plots(&out.join("plots"), &plots)?;
    Ok(MergeOutcome {
        files: shards.len(),
        rows: recs.len(),
        missing: missing.len(),
        plots: plot_paths,
    })
}

/// The `sweep merge` command.
pub fn merge_cli(spec: &Path, shards: &[PathBuf], out: &Path, allow_missing: bool) -> Result<()> {
    let sweep = Sweep::load(spec)?;
    let o = merge(&sweep, shards, out, allow_missing)?;
    println!(
        "merged {} runs of {} from {} files{}",
        o.rows,
        sweep.points.len(),
        o.files,
        if o.missing > 0 {
            format!(" ({} missing)", o.missing)
        } else {
            String::new()
        }
    );
    println!("results: {}", out.join("results.csv").display());
    println!(
        "plots:   {} files in {}",
        o.plots.len(),
        out.join("plots").display()
    );
    Ok(())
}

/// The most parallel runs `--jobs` accepts.
pub const MAX_JOBS: usize = 1024;

/// The `sweep` command.
pub fn run_cli(
    spec: &Path,
    out: &Path,
    resume: bool,
    shard_arg: Option<&str>,
    jobs: Option<usize>,
    yes: bool,
) -> Result<()> {
    if let Some(j) = jobs
        && (j == 0 || j > MAX_JOBS)
    {
        bail!(
            "--jobs: expected 1 to {MAX_JOBS} parallel runs (this machine has {} CPUs), got {j}",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
    }
    let sweep = Sweep::load(spec)?;
    let shard_of = shard_arg.map(parse_shard).transpose()?;
    if sweep.points.len() > CONFIRM_GRID_RUNS && !yes {
        bail!(
            "{}: the grid has {} runs; pass --yes to run more than {CONFIRM_GRID_RUNS}",
            spec.display(),
            sweep.points.len()
        );
    }
    let started = Instant::now();
    eprintln!(
        "sweep {}: {} runs in the grid{}; swept: {}",
        spec.display(),
        sweep.points.len(),
        shard_of.map_or(String::new(), |(k, n)| format!(", shard {k}/{n}")),
        if sweep.swept.is_empty() {
            "nothing (one setting)".to_string()
        } else {
            sweep.swept.join(", ")
        }
    );
    let o = run(&sweep, out, resume, shard_of, jobs, true)?;
    println!(
        "{} runs: {} ran now ({} failed), {} already in results.csv; {:.1} s",
        o.planned,
        o.ran,
        o.failed,
        o.skipped,
        started.elapsed().as_secs_f64()
    );
    println!("results: {}", out.join("results.csv").display());
    println!(
        "plots:   {} files in {}",
        o.plots.len(),
        out.join("plots").display()
    );
    if o.failed > 0 {
        bail!("{} runs failed (their rows say why)", o.failed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(s.points[0].scheduler, "optimal");
        assert_eq!(s.points[1].scheduler, "vllm");
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
            (row.scheduler.as_str(), row.status.as_str()),
            ("vllm", "heuristic")
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
                            (p.index, p.m, p.c, p.seed, p.scheduler.as_str()),
                            (i, Some(m), Some(c), seed, sched)
                        );
                        i += 1;
                    }
                }
            }
        }
    }
}
