//! `sweep merge`: the results of shards combined into one grid's.

use super::lock::lock_output_dir;
use super::plots::sweep_plots;
use super::results::{ResultRow, parse_results, write_results};
use super::spec::{Point, Sweep};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    crate::core::io::refuse_links(&[&results_path])?;
    crate::core::io::refuse_links(&super::plots::plot_paths(sweep, &out.join("plots")))?;
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
