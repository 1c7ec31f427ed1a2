//! `results.csv`: its columns, its rows, and reading and writing it.

use super::spec::o2s;
use crate::produce::Contender;
use crate::produce::RunStatus;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

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
    "time_scale",
    "seed",
    "cost_model",
    "replicas",
    "disaggregate",
    "pp",
    "router",
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
    "p50_ttft_s",
    "p90_ttft_s",
    "p50_tpot_s",
    "p90_tpot_s",
    "p99_tpot_s",
    "p50_e2e_s",
    "p90_e2e_s",
    "p99_e2e_s",
    "p50_tbt_s",
    "p90_tbt_s",
    "p99_tbt_s",
    "slo_attainment",
    "goodput_requests_per_s",
    "best_bound_s",
    "certified_gap",
    "solve_s",
    "milp_rows",
    "milp_columns",
    "milp_integers",
    "solve_method",
    "error",
];

/// The columns added since the first version of `results.csv` (files without them still
/// read, those cells empty).
pub const ADDED_COLUMNS: &[&str] = &[
    "time_scale",
    "cost_model",
    "replicas",
    "disaggregate",
    "pp",
    "router",
    "p50_ttft_s",
    "p90_ttft_s",
    "p50_tpot_s",
    "p90_tpot_s",
    "p99_tpot_s",
    "p50_e2e_s",
    "p90_e2e_s",
    "p99_e2e_s",
    "p50_tbt_s",
    "p90_tbt_s",
    "p99_tbt_s",
    "slo_attainment",
    "goodput_requests_per_s",
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
    /// The trace's time scale, if swept.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub time_scale: Option<f64>,
    /// Seed.
    pub seed: u64,
    /// The cluster's cost model where `grid.clusters` names one (empty: the spec's).
    #[serde(default)]
    pub cost_model: Option<String>,
    /// Replicas, where the grid has clusters or routers (empty: one, no cluster).
    #[serde(default)]
    pub replicas: Option<u32>,
    /// Prefill and decode replicas `P:D`, where the cluster is disaggregated.
    #[serde(default)]
    pub disaggregate: Option<String>,
    /// Pipeline stages of each replica, where more than one.
    #[serde(default)]
    pub pp: Option<u32>,
    /// The router, where the grid has clusters or routers.
    #[serde(default)]
    pub router: Option<String>,
    /// Objective name.
    pub objective: String,
    /// The scheduler, written as in the spec.
    pub scheduler: Contender,
    /// `heuristic`, the solver's status (`optimal`, `time-limit`, ...), or `error`.
    pub status: RunStatus,
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
    /// 50th percentile TTFT (s).
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p50_ttft_s: Option<f64>,
    /// 90th percentile TTFT (s).
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p90_ttft_s: Option<f64>,
    /// 50th percentile TPOT (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p50_tpot_s: Option<f64>,
    /// 90th percentile TPOT (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p90_tpot_s: Option<f64>,
    /// 99th percentile TPOT (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p99_tpot_s: Option<f64>,
    /// 50th percentile end-to-end latency (s).
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p50_e2e_s: Option<f64>,
    /// 90th percentile end-to-end latency (s).
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p90_e2e_s: Option<f64>,
    /// 99th percentile end-to-end latency (s).
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p99_e2e_s: Option<f64>,
    /// 50th percentile of the gaps between tokens (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p50_tbt_s: Option<f64>,
    /// 90th percentile of the gaps between tokens (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p90_tbt_s: Option<f64>,
    /// 99th percentile of the gaps between tokens (s), where some O > 1.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub p99_tbt_s: Option<f64>,
    /// With the spec's `slos`: the share of requests meeting every SLO.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub slo_attainment: Option<f64>,
    /// With the spec's `slos`: requests meeting every SLO per second of makespan.
    #[serde(default, serialize_with = "float_as_displayed")]
    pub goodput_requests_per_s: Option<f64>,
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

impl ResultRow {
    /// Whether the run failed.
    pub fn failed(&self) -> bool {
        self.status == RunStatus::Error
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
            "p50_ttft_s" => self.p50_ttft_s,
            "p90_ttft_s" => self.p90_ttft_s,
            "p50_tpot_s" => self.p50_tpot_s,
            "p90_tpot_s" => self.p90_tpot_s,
            "p99_tpot_s" => self.p99_tpot_s,
            "p50_e2e_s" => self.p50_e2e_s,
            "p90_e2e_s" => self.p90_e2e_s,
            "p99_e2e_s" => self.p99_e2e_s,
            "p50_tbt_s" => self.p50_tbt_s,
            "p90_tbt_s" => self.p90_tbt_s,
            "p99_tbt_s" => self.p99_tbt_s,
            "slo_attainment" => self.slo_attainment,
            "goodput_requests_per_s" => self.goodput_requests_per_s,
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
            "time_scale" => o2s(&self.time_scale),
            "seed" => self.seed.to_string(),
            "cost_model" => o2s(&self.cost_model),
            "replicas" => o2s(&self.replicas),
            "disaggregate" => o2s(&self.disaggregate),
            "pp" => o2s(&self.pp),
            "router" => o2s(&self.router),
            _ => String::new(),
        }
    }

    /// The key without the scheduler: rows that share it share a setting.
    pub fn setting_key(&self) -> &str {
        &self.key[..self.key.rfind(";scheduler=").unwrap_or(self.key.len())]
    }
}

/// The CSV bytes of the header line.
pub(super) fn header_line() -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    w.write_record(RESULT_COLUMNS)?;
    w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))
}

/// The CSV bytes of one row (no header).
pub(super) fn row_line(row: &ResultRow) -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(row)?;
    w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))
}

/// Reads `results.csv`: the header check, complete rows only. Only a file that parses as
/// this version's results (its header and every complete row) is repaired: a line cut
/// short by a kill is moved to `results.csv.cut` (appended there, so nothing is lost) and
/// the file truncated to its last complete line; anything else is refused untouched.
pub fn read_results(path: &Path) -> Result<Vec<ResultRow>> {
    crate::core::io::refuse_links(&[path])?;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
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
        return parse_results(path, &bytes);
    }
    let rows = parse_results(path, &bytes[..complete])?;
    if complete < bytes.len() {
        let cut = path.with_extension("csv.cut");
        crate::core::io::refuse_links(&[&cut])?;
        let mut keep = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cut)
            .with_context(|| format!("opening {}", cut.display()))?;
        keep.write_all(&bytes[complete..])?;
        keep.write_all(b"\n")?;
        keep.sync_all()?;
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        f.set_len(complete as u64)?;
        eprintln!(
            "{}: its last line was cut short (a killed run); moved it to {}",
            path.display(),
            cut.display()
        );
    }
    Ok(rows)
}

/// The rows of a results file's complete lines `bytes` (from `path`, for messages): this
/// version's header, then rows of its columns; errors name the line and the field.
pub(super) fn parse_results(path: &Path, bytes: &[u8]) -> Result<Vec<ResultRow>> {
    let mut r = csv::ReaderBuilder::new().from_reader(bytes);
    let header = r
        .headers()
        .with_context(|| format!("{}: no header", path.display()))?
        .clone();
    // Files of earlier versions (this version's columns less some added since, in order)
    // read with those cells empty (one replica, no SLOs, ...); the file is written back in
    // this version's columns.
    if !is_earlier_header(&header) {
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

/// Whether `header` is this version's columns, less some of [`ADDED_COLUMNS`], in order.
fn is_earlier_header(header: &csv::StringRecord) -> bool {
    let mut given = header.iter().peekable();
    for c in RESULT_COLUMNS {
        if given.peek() == Some(c) {
            given.next();
        } else if !ADDED_COLUMNS.contains(c) {
            return false;
        }
    }
    given.next().is_none()
}

/// Rewrites `results.csv` whole (atomically): the header, then `rows`.
pub(super) fn write_results(path: &Path, rows: &[ResultRow]) -> Result<()> {
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
