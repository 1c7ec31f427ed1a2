//! The sweep's spec: its TOML sections, the grid and its points, and each point's
//! workload and limits.

use crate::core::{Limits, Workload};
use crate::cost_model::{self, LinearCostModel};
use crate::produce::Contender;
use crate::schedulers::Router;
use crate::solver::Objective;
use crate::workload::{ArrivalProcess, LengthDist, SampleSpec, Selection, SynthSpec};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};

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
    /// Solver time limit per run (s) [default: the solver's own, 60, as `solve`'s].
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
    /// Service-level objectives (`"ttft-p90=2s"`, ...): each row gets the attainment and
    /// goodput against them.
    #[serde(default)]
    pub slos: Option<Vec<String>>,
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
    /// Trace: multiplies its arrival times (0.25: four times as fast) [default 1].
    #[serde(default)]
    pub time_scale: Option<f64>,
    /// Trace: take `n` consecutive requests after skipping this many, instead of `n` drawn
    /// at random (a real burst keeps its shape).
    #[serde(default)]
    pub skip: Option<usize>,
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
    /// Trace time scales (multiplying its arrival times).
    #[serde(default)]
    pub time_scale: Option<Vec<f64>>,
    /// Seeds.
    #[serde(default)]
    pub seed: Option<Vec<u64>>,
    /// Clusters (replicas, each with its own cost model where given) [default one replica
    /// of the spec's cost model].
    #[serde(default)]
    pub clusters: Option<Vec<ClusterSection>>,
    /// Routers of the clusters' requests (`round-robin`, `least-outstanding`, ...)
    /// [default round-robin].
    #[serde(default)]
    pub routers: Option<Vec<String>>,
    /// Schedulers.
    pub schedulers: Vec<String>,
    /// Objectives [default makespan].
    #[serde(default)]
    pub objectives: Option<Vec<String>>,
}

/// One entry of `grid.clusters`: `{ replicas = 4, cost_model = "roofline:h100:llama3-8b:tp1" }`,
/// or a disaggregated one, `{ disaggregate = "1:3" }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Replicas (each runs the scheduler on the requests routed to it).
    #[serde(default)]
    pub replicas: Option<u32>,
    /// Prefill and decode replicas, `P:D` (semantics.md, "Disaggregated prefill and
    /// decode"; the KV link from the cost model), instead of `replicas`.
    #[serde(default)]
    pub disaggregate: Option<String>,
    /// The replicas' cost model [default: the spec's]; M comes from it where not given.
    #[serde(default)]
    pub cost_model: Option<String>,
    /// Pipeline stages of each replica (semantics.md, "Pipeline parallelism"; vllm-v1
    /// and sarathi, the link from the cost model) [default: 1].
    #[serde(default)]
    pub pp: Option<u32>,
}

/// A point's cluster, where the grid has `clusters` or `routers`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterPoint {
    /// Replicas (all of them, prefill and decode where disaggregated).
    pub replicas: u32,
    /// Prefill and decode replicas, where disaggregated.
    pub disaggregate: Option<crate::core::disaggregated::Disaggregation>,
    /// The cost model's name as the spec gives it (None: the spec's `cost_model`).
    pub cost_model: Option<String>,
    /// Pipeline stages of each replica (1: none).
    pub pp: u32,
    /// Index of its cost model in the sweep's resolved cost models.
    pub(super) cost: usize,
    /// The router.
    pub router: Router,
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
    /// The trace's time scale, if swept.
    pub time_scale: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// Objective name.
    pub objective: String,
    /// The cluster, where the grid has `clusters` or `routers` (None: one replica of the
    /// spec's cost model).
    pub cluster: Option<ClusterPoint>,
    /// The scheduler (in files, its canonical spelling).
    pub scheduler: Contender,
}

pub(super) fn o2s<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or(String::new(), ToString::to_string)
}

impl Point {
    /// The identity of the run, the same for the same setting in every sweep.
    pub fn key(&self) -> String {
        let cluster = self.cluster.as_ref().map_or(String::new(), |c| {
            // Only where disaggregated, so other clusters' keys stay as they were.
            let split = c
                .disaggregate
                .map_or(String::new(), |d| format!("disaggregate={d};"));
            // Only where pipelined, likewise.
            let pp = if c.pp > 1 {
                format!("pp={};", c.pp)
            } else {
                String::new()
            };
            format!(
                "cost_model={};replicas={};{split}{pp}router={};",
                c.cost_model.as_deref().unwrap_or(""),
                c.replicas,
                c.router
            )
        });
        // Only where swept, so the keys of sweeps without it stay as they were.
        let time_scale = self
            .time_scale
            .map_or(String::new(), |t| format!("time_scale={t};"));
        format!(
            "M={};C={};P={};R_max={};I={};O={};n={};qps={};{time_scale}seed={};{cluster}objective={};scheduler={}",
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

    /// Its replicas' pipeline stages (1 without a cluster).
    pub fn pp(&self) -> u32 {
        self.cluster.as_ref().map_or(1, |c| c.pp)
    }

    /// How its cluster splits prefill and decode, where disaggregated.
    pub fn split(&self) -> Option<crate::core::disaggregated::Disaggregation> {
        self.cluster.as_ref().and_then(|c| c.disaggregate)
    }

    /// The key without the scheduler: runs that share it share a setting.
    pub fn setting_key(&self) -> String {
        let k = self.key();
        k[..k.rfind(";scheduler=").unwrap_or(k.len())].to_string()
    }
}

/// The parameters a grid can sweep, as they appear in `results.csv`.
pub const GRID_PARAMS: &[&str] = &[
    "M",
    "C",
    "P",
    "R_max",
    "I",
    "O",
    "n",
    "qps",
    "time_scale",
    "seed",
    "cost_model",
    "replicas",
    "router",
];

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
    pub(super) cost: LinearCostModel,
    /// The clusters' own cost models (`grid.clusters[k].cost_model`), in order.
    pub(super) cluster_costs: Vec<LinearCostModel>,
    pub(super) trace: Option<Workload>,
    /// The spec's `slos`, parsed.
    pub(super) slos: Vec<crate::core::Slo>,
}

/// The lists a grid multiplies, in the order of its cartesian product (objectives vary
/// slowest, schedulers fastest).
struct Grid {
    objectives: Vec<String>,
    /// None: no cluster axes (one replica of the spec's cost model).
    clusters: Vec<Option<(ClusterShape, usize)>>,
    routers: Vec<Router>,
    ms: Vec<Option<u64>>,
    cs: Vec<Option<u64>>,
    ps: Vec<Option<u64>>,
    rs: Vec<Option<u64>>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    ns: Vec<usize>,
    qpss: Vec<Option<f64>>,
    time_scales: Vec<Option<f64>>,
    seeds: Vec<u64>,
    schedulers: Vec<Contender>,
}

impl Grid {
    /// The list lengths, slowest first.
    fn radices(&self) -> [usize; 14] {
        [
            self.objectives.len(),
            self.clusters.len(),
            self.routers.len(),
            self.ms.len(),
            self.cs.len(),
            self.ps.len(),
            self.rs.len(),
            self.inputs.len(),
            self.outputs.len(),
            self.ns.len(),
            self.qpss.len(),
            self.time_scales.len(),
            self.seeds.len(),
            self.schedulers.len(),
        ]
    }

    /// The parameters with more than one value, as `results.csv` names them.
    fn swept(&self) -> Vec<&'static str> {
        [
            ("M", self.ms.len()),
            ("C", self.cs.len()),
            ("P", self.ps.len()),
            ("R_max", self.rs.len()),
            ("I", self.inputs.len()),
            ("O", self.outputs.len()),
            ("n", self.ns.len()),
            ("qps", self.qpss.len()),
            ("time_scale", self.time_scales.len()),
            ("seed", self.seeds.len()),
            (
                "cost_model",
                self.clusters
                    .iter()
                    .flatten()
                    .map(|c| &c.0.cost_model)
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
            ),
            (
                "replicas",
                self.clusters
                    .iter()
                    .flatten()
                    .map(|c| c.0.replicas)
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
            ),
            (
                "disaggregate",
                self.clusters
                    .iter()
                    .flatten()
                    .map(|c| c.0.disaggregate.map(|d| (d.prefill, d.decode)))
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
            ),
            (
                "pp",
                self.clusters
                    .iter()
                    .flatten()
                    .map(|c| c.0.pp)
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
            ),
            ("router", self.routers.len()),
        ]
        .into_iter()
        .filter(|&(_, count)| count > 1)
        .map(|(name, _)| name)
        .collect()
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
        let mut digit = [0usize; 14];
        let mut rest = index;
        for (d, &r) in digit.iter_mut().zip(&radices).rev() {
            *d = rest % r;
            rest /= r;
        }
        let [o, cl, ro, m, c, p, r, i, out, n, q, ts, seed, sched] = digit;
        Point {
            index,
            cluster: self.clusters[cl].as_ref().map(|(c, cost)| ClusterPoint {
                replicas: c.replicas,
                disaggregate: c.disaggregate,
                cost_model: c.cost_model.clone(),
                pp: c.pp,
                cost: *cost,
                router: self.routers[ro],
            }),
            m: self.ms[m],
            c: self.cs[c],
            p: self.ps[p],
            r_max: self.rs[r],
            input: self.inputs[i].clone(),
            output: self.outputs[out].clone(),
            n: self.ns[n],
            qps: self.qpss[q],
            time_scale: self.time_scales[ts],
            seed: self.seeds[seed],
            objective: self.objectives[o].clone(),
            scheduler: self.schedulers[sched],
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
        let cost = cost_model_of(&spec, base_dir)?;
        check_run_options(&spec)?;
        let trace = trace_of(&spec, base_dir)?;
        if let Some(a) = &spec.workload.arrival {
            a.parse::<ArrivalProcess>()
                .map_err(|e| anyhow::anyhow!("workload.arrival: {e}"))?;
        }
        let grid = grid_of(&spec, trace.is_some())?;
        let cluster_costs = cluster_costs_of(&spec, base_dir, &cost)?;
        let slos = spec
            .slos
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| t.parse().map_err(|e| anyhow::anyhow!("slos[{i}]: {e}")))
            .collect::<Result<Vec<crate::core::Slo>>>()?;
        let swept = grid.swept();
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
            cluster_costs,
            trace,
            slos,
        })
    }

    /// The cost model of a point: its cluster's, else the spec's.
    pub fn cost_of(&self, p: &Point) -> &LinearCostModel {
        p.cluster
            .as_ref()
            .map_or(&self.cost, |c| &self.cluster_costs[c.cost])
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
                    selection: w.skip.map_or(Selection::Random(p.n, p.seed), |k| {
                        Selection::Window(k, p.n)
                    }),
                    prefill_scale: w.prefill_scale.unwrap_or(1.0),
                    decode_scale: w.decode_scale.unwrap_or(1.0),
                    max_total_tokens: w.max_total_tokens,
                    time_scale: p.time_scale.or(w.time_scale).unwrap_or(1.0),
                    arrival,
                    arrival_seed: p.seed,
                    rebase_time: true,
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
                let cost = self.cost_of(p);
                let f = &cost.file;
                match (&f.model, &f.gpu) {
                    (Some(model), Some(gpu)) => cost_model::kv_capacity_tokens(
                        &model.pipeline_stage(p.pp())?,
                        gpu,
                        f.tensor_parallel,
                        cost_model::DEFAULT_GPU_MEMORY_UTILIZATION,
                    )?,
                    _ => bail!(
                        "M: required, cost model {} has no model and GPU spec",
                        cost.name
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
}

/// The spec's cost model: a coefficient file relative to the spec, or a preset.
fn cost_model_of(spec: &SweepSpec, base_dir: &Path) -> Result<LinearCostModel> {
    let cost_name = spec
        .cost_model
        .clone()
        .unwrap_or(crate::cost_models::DEFAULT_COST_MODEL.into());
    resolve_cost(&cost_name, base_dir).with_context(|| format!("cost_model = \"{cost_name}\""))
}

/// The cost model of each of `grid.clusters` (the spec's where it names none).
fn cluster_costs_of(
    spec: &SweepSpec,
    base_dir: &Path,
    spec_cost: &LinearCostModel,
) -> Result<Vec<LinearCostModel>> {
    let clusters = spec.grid.clusters.as_deref().unwrap_or_default();
    clusters
        .iter()
        .enumerate()
        .map(|(k, c)| match &c.cost_model {
            None => Ok(spec_cost.clone()),
            Some(name) => resolve_cost(name, base_dir)
                .with_context(|| format!("grid.clusters[{k}].cost_model = \"{name}\"")),
        })
        .collect()
}

/// A cost model by preset name or coefficient file (relative to the spec).
fn resolve_cost(cost_name: &str, base_dir: &Path) -> Result<LinearCostModel> {
    let as_path = base_dir.join(cost_name);
    let name = if as_path.exists() {
        as_path.display().to_string()
    } else {
        cost_name.to_string()
    };
    Ok(crate::cost_models::resolve(&name)?)
}

/// The per-run solver options and the block size, in range.
fn check_run_options(spec: &SweepSpec) -> Result<()> {
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
    Ok(())
}

/// The trace a workload samples, when it names one (then it gives the lengths).
fn trace_of(spec: &SweepSpec, base_dir: &Path) -> Result<Option<Workload>> {
    let w = &spec.workload;
    let Some(t) = &w.trace else {
        return Ok(None);
    };
    if w.input.is_some() || w.output.is_some() {
        bail!("workload: I and O are for synthetic workloads; a trace gives its own lengths");
    }
    if spec.grid.input.is_some() || spec.grid.output.is_some() {
        bail!(
            "grid.I / grid.O: a trace workload gives its own lengths (scale them with prefill_scale / decode_scale)"
        );
    }
    let p = base_dir.join(t);
    Ok(Some(
        crate::workload::read_trace(&p).with_context(|| format!("workload.trace = \"{t}\""))?,
    ))
}

/// The index of the first value of `vals` equal to an earlier one (in one pass: a grid
/// list of a million values is checked in a fraction of a second).
fn first_repeat<T: std::fmt::Debug>(vals: &[T]) -> Option<usize> {
    let mut seen = std::collections::HashSet::with_capacity(vals.len());
    vals.iter().position(|v| !seen.insert(format!("{v:?}")))
}

/// A grid list, or the base value alone; refuses an empty list and repeated values.
fn list<T: Clone + std::fmt::Debug>(
    grid: &Option<Vec<T>>,
    base: Option<T>,
    key: &str,
) -> Result<Vec<Option<T>>> {
    match grid {
        Some(v) if v.is_empty() => bail!("{key}: empty list"),
        Some(v) => {
            if let Some(j) = first_repeat(v) {
                bail!(
                    "{key}[{j}]: repeats an earlier value; each grid value must be distinct (a repeated run would write the same key twice)"
                );
            }
            Ok(v.iter().cloned().map(Some).collect())
        }
        None => Ok(vec![base]),
    }
}

/// The prompt or output lengths of the grid (`grid_key` `grid.I` or `grid.O`): its list,
/// else the workload's value (`-` for a trace); each a length distribution.
fn lengths(
    grid: &Option<Vec<toml::Value>>,
    base: &Option<toml::Value>,
    has_trace: bool,
    grid_key: &str,
) -> Result<Vec<String>> {
    let base_key = format!("workload.{}", &grid_key[5..]);
    // The workload's own value is checked first, even where the grid replaces it.
    let base = match base {
        Some(v) => vec![length_value(v, &base_key)?],
        None if has_trace => vec!["-".into()],
        None => vec![],
    };
    let Some(vs) = grid else {
        if base.is_empty() {
            bail!("{base_key}: required for a synthetic workload (or give {grid_key})");
        }
        return Ok(base);
    };
    if vs.is_empty() {
        bail!("{grid_key}: empty list");
    }
    let vals: Vec<String> = vs
        .iter()
        .enumerate()
        .map(|(i, v)| length_value(v, &format!("{grid_key}[{i}]")))
        .collect::<Result<_>>()?;
    if let Some(j) = first_repeat(&vals) {
        bail!("{grid_key}[{j}]: repeats an earlier value; each grid value must be distinct");
    }
    Ok(vals)
}

/// The trace's time scales (`grid.time_scale`, else none swept), each checked with the
/// workload's own `time_scale` and `skip`: trace options, and arrivals that a Poisson rate
/// (`arrival` or `grid.qps`) would replace.
fn time_scales(spec: &SweepSpec, qpss: &[Option<f64>]) -> Result<Vec<Option<f64>>> {
    let (w, g) = (&spec.workload, &spec.grid);
    let given = w.time_scale.is_some() || g.time_scale.is_some();
    if (given || w.skip.is_some()) && w.trace.is_none() {
        bail!(
            "workload.time_scale / workload.skip / grid.time_scale: for a trace workload (synthetic arrivals have their own rate: arrival or grid.qps)"
        );
    }
    if given && (w.arrival.is_some() || qpss.iter().any(Option::is_some)) {
        bail!(
            "time_scale: the trace's arrival times are replaced by arrival / grid.qps; sweep one or the other"
        );
    }
    let scales = list(&g.time_scale, None, "grid.time_scale")?;
    for (key, t) in scales
        .iter()
        .flatten()
        .map(|t| ("grid.time_scale", *t))
        .chain(w.time_scale.map(|t| ("workload.time_scale", t)))
    {
        if !(t.is_finite() && t > 0.0) {
            bail!("{key}: expected a factor > 0 multiplying the arrival times, got {t}");
        }
    }
    Ok(scales)
}

/// The grid's lists, each checked, from the spec's grid and base values.
fn grid_of(spec: &SweepSpec, has_trace: bool) -> Result<Grid> {
    let (w, g) = (&spec.workload, &spec.grid);
    let inputs = lengths(&g.input, &w.input, has_trace, "grid.I")?;
    let outputs = lengths(&g.output, &w.output, has_trace, "grid.O")?;
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
    let time_scales = time_scales(spec, &qpss)?;
    let seeds = list(&g.seed, Some(w.seed.unwrap_or(0)), "grid.seed")?;
    let objectives = schedulers_and_objectives(spec)?;
    let (clusters, routers) = clusters_and_routers(g)?;
    Ok(Grid {
        objectives,
        clusters,
        routers,
        ms,
        cs,
        ps,
        rs,
        inputs,
        outputs,
        ns: ns.into_iter().map(|n| n.expect("checked")).collect(),
        qpss,
        time_scales,
        seeds: seeds
            .into_iter()
            .map(|s| s.expect("has a default"))
            .collect(),
        schedulers: g
            .schedulers
            .iter()
            .map(|s| s.parse::<Contender>().map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?,
    })
}

/// A cluster of the grid, checked: its replicas (all of them), how they split where
/// disaggregated, its cost model's name.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ClusterShape {
    pub(super) replicas: u32,
    pub(super) disaggregate: Option<crate::core::disaggregated::Disaggregation>,
    pub(super) cost_model: Option<String>,
    pub(super) pp: u32,
}

/// The grid's clusters (each with the index of its cost model) and routers: `[None]` and
/// round-robin where the grid has neither.
type ClusterAxes = (Vec<Option<(ClusterShape, usize)>>, Vec<Router>);

/// Entry `k` of `grid.clusters`, checked: replicas from 1 to the most, or a `P:D` split.
fn cluster_shape(k: usize, c: &ClusterSection) -> Result<ClusterShape> {
    let max = crate::core::cluster::MAX_REPLICAS;
    let (replicas, disaggregate) = match (c.replicas, &c.disaggregate) {
        (Some(_), Some(_)) | (None, None) => {
            bail!(
                "grid.clusters[{k}]: expected replicas = N or disaggregate = \"P:D\", one of them"
            )
        }
        (Some(n), None) if !(1..=max).contains(&n) => {
            bail!("grid.clusters[{k}].replicas: expected 1 to {max}, got {n}")
        }
        (Some(n), None) => (n, None),
        (None, Some(spec)) => {
            let d: crate::core::disaggregated::Disaggregation = spec
                .parse()
                .map_err(|e| anyhow::anyhow!("grid.clusters[{k}].disaggregate: {e}"))?;
            (d.prefill.saturating_add(d.decode), Some(d))
        }
    };
    let max_pp = crate::core::pipeline::MAX_STAGES;
    let pp = match c.pp {
        None => 1,
        Some(p) if (1..=max_pp).contains(&p) => p,
        Some(p) => bail!("grid.clusters[{k}].pp: expected 1 to {max_pp}, got {p}"),
    };
    Ok(ClusterShape {
        replicas,
        disaggregate,
        cost_model: c.cost_model.clone(),
        pp,
    })
}

fn clusters_and_routers(g: &GridSection) -> Result<ClusterAxes> {
    if g.clusters.is_none() && g.routers.is_none() {
        return Ok((vec![None], vec![Router::RoundRobin]));
    }
    let one = vec![ClusterSection {
        replicas: Some(1),
        ..ClusterSection::default()
    }];
    let sections = g.clusters.clone().unwrap_or(one);
    if sections.is_empty() {
        bail!("grid.clusters: empty list");
    }
    let clusters = sections
        .iter()
        .enumerate()
        .map(|(k, c)| cluster_shape(k, c))
        .collect::<Result<Vec<_>>>()?;
    let shapes: Vec<_> = clusters
        .iter()
        .map(|c| {
            (
                c.replicas,
                c.disaggregate.map(|d| (d.prefill, d.decode)),
                &c.cost_model,
            )
        })
        .collect();
    if let Some(j) = first_repeat(&shapes) {
        bail!("grid.clusters[{j}]: repeats an earlier cluster; each grid value must be distinct");
    }
    let names = g.routers.clone().unwrap_or(vec!["round-robin".into()]);
    if names.is_empty() {
        bail!("grid.routers: empty list");
    }
    if let Some(j) = first_repeat(&names) {
        bail!("grid.routers[{j}]: repeats an earlier value; each grid value must be distinct");
    }
    let routers = names
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.parse()
                .map_err(|e| anyhow::anyhow!("grid.routers[{i}]: {e}"))
        })
        .collect::<Result<Vec<Router>>>()?;
    let solver = g
        .schedulers
        .iter()
        .any(|s| s.starts_with(crate::produce::OPTIMAL));
    let not_v1 = g.schedulers.iter().find(|s| s.as_str() != "vllm-v1");
    if let (Some(k), Some(s)) = (
        clusters.iter().position(|c| c.disaggregate.is_some()),
        not_v1,
    ) {
        bail!(
            "grid.schedulers: {s} on grid.clusters[{k}], a disaggregated cluster: its decode replicas take the prompts' KV as vllm-v1 does, and only vllm-v1 is built to"
        );
    }
    let not_pipelined = g.schedulers.iter().find(|s| {
        s.parse::<crate::schedulers::SchedulerKind>()
            .is_ok_and(|k| !k.pipelines())
            || s.starts_with(crate::produce::OPTIMAL)
    });
    if let (Some(k), Some(s)) = (clusters.iter().position(|c| c.pp > 1), not_pipelined) {
        bail!(
            "grid.schedulers: {s} on grid.clusters[{k}], whose replicas are pipelines of {} stages: pipeline parallelism is modelled for vllm-v1, vllm and sarathi only",
            clusters[k].pp
        );
    }
    if let Some(k) = clusters
        .iter()
        .position(|c| c.replicas > 1)
        .filter(|_| solver)
    {
        bail!(
            "grid.schedulers: optimal solves one replica; grid.clusters[{k}] has {} (the optimum across replicas is not built yet: list heuristics, or clusters of one replica)",
            clusters[k].replicas
        );
    }
    Ok((
        clusters
            .into_iter()
            .enumerate()
            .map(|(k, c)| Some((c, k)))
            .collect(),
        routers,
    ))
}

/// Checks the grid's schedulers and returns its objectives (default makespan), both
/// lists non-empty, parseable and without repeats.
fn schedulers_and_objectives(spec: &SweepSpec) -> Result<Vec<String>> {
    let g = &spec.grid;
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
        if let Some(j) = first_repeat(vals) {
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
    Ok(objectives)
}

/// The most runs a grid may have (each is held in memory while the sweep runs).
pub const MAX_GRID_RUNS: usize = 10_000_000;

/// Grids with more runs than this need `--yes`.
pub const CONFIRM_GRID_RUNS: usize = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_repeat_is_found_in_one_pass() {
        assert_eq!(first_repeat(&[1u64, 2, 1, 2]), Some(2));
        assert_eq!(first_repeat(&[1u64, 2, 3]), None);
        assert_eq!(first_repeat::<u64>(&[]), None);
        assert_eq!(first_repeat(&[0.5f64, 1.0, 0.5]), Some(2));
        let names = ["vllm".to_string(), "optimal".into(), "vllm".into()];
        assert_eq!(first_repeat(&names), Some(2));
        // A million distinct values, the repeat at the end.
        let mut many: Vec<u64> = (0..1_000_000).collect();
        many.push(999_999);
        assert_eq!(first_repeat(&many), Some(1_000_000));
    }
}
