//! A cluster's files and text: `routing.csv`, the cluster's `requests.csv` and
//! `summary.json`, and a folder per replica (`replica-K/`: its schedule in the workload's
//! request ids and its replay's outputs); and reading such a folder back for `replay`.

use crate::core::io::write_atomic;
use crate::core::{ClusterReplay, Routing, Schedule, Summary, Workload};
use crate::output::{Cell, text_table, write_requests_csv};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The folder of replica `r` under a cluster's output folder.
pub fn replica_dir(dir: &Path, r: usize) -> PathBuf {
    dir.join(format!("replica-{r}"))
}

/// Writes `routing.csv`: `request,replica,routed_at_s` (requests are routed as they arrive).
pub fn write_routing_csv(w: &Workload, routing: &Routing, out: &mut dyn Write) -> io::Result<()> {
    out.write_all(b"request,replica,routed_at_s\n")?;
    for (i, (r, req)) in routing.replica_of().iter().zip(w.requests()).enumerate() {
        writeln!(out, "{i},{r},{}", req.arrival_s)?;
    }
    Ok(())
}

/// A cluster's own files in `dir`: `routing.csv` (by `routing`), the merged replay's
/// `requests.csv` and `summary.json`; returns their paths.
fn write_cluster_files(
    dir: &Path,
    routing: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    merged: &crate::core::Replay,
    summary: &Summary,
) -> io::Result<Vec<PathBuf>> {
    let paths = vec![
        dir.join("routing.csv"),
        dir.join("requests.csv"),
        dir.join("summary.json"),
    ];
    write_atomic(&paths[0], routing)?;
    write_atomic(&paths[1], |out| write_requests_csv(merged, out))?;
    write_atomic(&paths[2], |out| {
        serde_json::to_writer_pretty(&mut *out, summary)?;
        out.write_all(b"\n")
    })?;
    Ok(paths)
}

/// Writes a cluster's outputs into `dir`; returns the paths written. With `trace` (the
/// producer's name), each busy replica's folder also gets `trace.json`, its Chrome trace
/// (requests named by the workload's ids).
pub fn write_cluster_outputs(
    dir: &Path,
    w: &Workload,
    routing: &Routing,
    schedules: &[Schedule],
    replay: &ClusterReplay,
    summary: &Summary,
    trace: Option<&str>,
) -> io::Result<Vec<PathBuf>> {
    let mut paths = write_cluster_files(
        dir,
        |out| write_routing_csv(w, routing, out),
        &replay.merged,
        summary,
    )?;
    let members = routing.members();
    for (r, (schedule, one)) in schedules.iter().zip(&replay.replicas).enumerate() {
        let sub = replica_dir(dir, r);
        let path = sub.join("schedule.json");
        schedule.write(&path).map_err(io::Error::other)?;
        paths.push(path);
        if let Some(one) = one {
            let s = match &summary.pipeline {
                Some(p) => Summary::from_replay(one).on_pipeline(p, &one.batches),
                None => Summary::from_replay(one),
            };
            paths.extend(crate::output::write_replay_outputs(&sub, one, &s)?);
            if let Some(name) = trace {
                let path = sub.join("trace.json");
                let json = replica_trace(
                    w,
                    &members[r],
                    schedule,
                    one,
                    &format!("{name}, replica {r}"),
                );
                crate::core::io::write_bytes_atomic(&path, json.to_string().as_bytes())?;
                paths.push(path);
            }
        }
    }
    Ok(paths)
}

/// Writes a disaggregated cluster's outputs into `dir`: `routing.csv`
/// (`request,prefill_replica,routed_at_s,kv_ready_s,decode_replica`), the whole cluster's
/// `requests.csv` and `summary.json`, and each side as a cluster folder of its own
/// (`prefill/` over the requests of one output token, `decode/` over the requests as they
/// arrive with their KV), as [`write_cluster_outputs`] writes one. Returns the paths.
pub fn write_disaggregated_outputs(
    dir: &Path,
    w: &Workload,
    o: &crate::produce::DisaggregatedOutcome,
    trace: Option<&str>,
) -> io::Result<Vec<PathBuf>> {
    use crate::core::disaggregated::{decode_workload, prefill_workload};
    let r = &o.replay;
    let routing = |out: &mut dyn Write| {
        out.write_all(b"request,prefill_replica,routed_at_s,kv_ready_s,decode_replica\n")?;
        let sides = o
            .prefill_routing
            .replica_of()
            .iter()
            .zip(o.decode_routing.replica_of());
        for (i, ((p, d), req)) in sides.zip(w.requests()).enumerate() {
            writeln!(out, "{i},{p},{},{},{d}", req.arrival_s, r.kv_ready_s[i])?;
        }
        Ok(())
    };
    let mut paths = write_cluster_files(dir, routing, &r.cluster.merged, &o.summary)?;
    let router = o.summary.cluster.as_ref().map_or("", |c| c.router.as_str());
    let link = o
        .summary
        .cluster
        .as_ref()
        .and_then(|c| c.kv_link)
        .ok_or_else(|| io::Error::other("a disaggregated cluster's summary names its KV link"))?;
    let decode_w = decode_workload(w, &r.kv_ready_s).map_err(io::Error::other)?;
    let sides = [
        (
            "prefill",
            prefill_workload(w, &link).map_err(io::Error::other)?,
            &o.prefill_routing,
            &o.prefill_schedules,
            &r.prefill,
        ),
        (
            "decode",
            decode_w,
            &o.decode_routing,
            &o.decode_schedules,
            &r.decode,
        ),
    ];
    for (name, side_w, routing, schedules, replay) in sides {
        let summary = Summary::of_cluster(replay, router);
        let side_trace = trace.map(|t| format!("{t}, {name}"));
        paths.extend(write_cluster_outputs(
            &dir.join(name),
            &side_w,
            routing,
            schedules,
            replay,
            &summary,
            side_trace.as_deref(),
        )?);
    }
    Ok(paths)
}

/// The Chrome trace of one replica: its requests (`ids`, in increasing id) renumbered to
/// its own replay's order, named by their workload ids.
fn replica_trace(
    w: &Workload,
    ids: &[u32],
    schedule: &Schedule,
    one: &crate::core::Replay,
    name: &str,
) -> serde_json::Value {
    let part = Workload::new(ids.iter().map(|&g| w.requests()[g as usize]).collect())
        .expect("a replica with requests");
    let mut local = schedule.clone();
    for batch in &mut local.batches {
        for e in &mut batch.entries {
            e.request = ids.binary_search(&e.request).expect("routed here") as u32;
        }
    }
    crate::report::trace::chrome_trace_named(&part, name, &local, one, &|i| ids[i as usize])
}

/// Reads a cluster's folder as `simulate --replicas --out DIR` writes it: `routing.csv`
/// and `replica-0/schedule.json`, `replica-1/schedule.json`, ... (as many replicas as
/// there are such folders in a row from 0).
pub fn read_cluster(dir: &Path, w: &Workload) -> anyhow::Result<(Routing, Vec<Schedule>)> {
    use anyhow::Context;
    let mut schedules = Vec::new();
    while replica_dir(dir, schedules.len()).is_dir() {
        let path = replica_dir(dir, schedules.len()).join("schedule.json");
        schedules.push(Schedule::read(&path)?);
    }
    if schedules.is_empty() {
        anyhow::bail!(
            "{}: no replica-0/ folder (a cluster folder holds routing.csv and replica-0/schedule.json, replica-1/schedule.json, ...)",
            dir.display()
        );
    }
    let routing_path = dir.join("routing.csv");
    let routing = Routing::read_csv(&routing_path, w.len(), schedules.len() as u32)
        .with_context(|| format!("reading the routing of {}", dir.display()))?;
    Ok((routing, schedules))
}

/// A table of the load on each replica.
pub fn load_table(summary: &Summary) -> String {
    let Some(c) = &summary.cluster else {
        return String::new();
    };
    let rows: Vec<Vec<Cell>> = c
        .per_replica
        .iter()
        .map(|l| {
            vec![
                Cell::Text(match c.prefill_replicas {
                    Some(p) if l.replica < p => format!("prefill {}", l.replica),
                    Some(p) => format!("decode {}", l.replica - p),
                    None => l.replica.to_string(),
                }),
                Cell::Text(l.requests.to_string()),
                Cell::Text(l.batches.to_string()),
                Cell::Time(Some(l.busy_s)),
                Cell::Time(Some(l.makespan_s)),
                Cell::Time(l.mean_e2e_s),
                Cell::Text(l.peak_kv_tokens.to_string()),
            ]
        })
        .collect();
    let headers = [
        "replica",
        "requests",
        "batches",
        "busy",
        "makespan",
        "mean e2e",
        "peak KV tokens",
    ];
    let shape = match (c.prefill_replicas, &c.kv_link) {
        (Some(p), Some(link)) => format!(
            "{p} prefill and {} decode replicas, router {} on each side, KV over {:.0} GB/s per GPU ({:.0} KiB per token{})",
            c.replicas - p,
            c.router,
            link.bandwidth_bytes_per_s / 1e9,
            link.bytes_per_token / 1024.0,
            if link.latency_s > 0.0 {
                format!(", {:.1} us each", link.latency_s * 1e6)
            } else {
                String::new()
            }
        ),
        _ => format!("{} replicas, router {}", c.replicas, c.router),
    };
    format!("{shape}\n{}", text_table(&headers, &rows))
}
