//! `replay`: validate a schedule and compute every metric from it.

use super::{LimitArgs, load_workload, path_list};
use anyhow::{Context, Result};
use clap::Args;
use infersched::core::{Instance, Schedule, Summary};
use infersched::cost_model;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// Workload trace CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Schedule file (infersched-schedule/1 JSON, or CSV batch,request,tokens).
    #[arg(long, required_unless_present = "cluster")]
    pub(crate) schedule: Option<PathBuf>,
    /// A cluster's folder instead of one schedule (as `simulate --replicas N --out DIR`
    /// writes it: routing.csv and replica-K/schedule.json): checks that every request is
    /// routed to one replica and each replica's schedule serves exactly those, under the
    /// limits, and writes the cluster's outputs (and replica-K/ folders) to --out.
    /// A disaggregated cluster's folder (`simulate --disaggregate P:D --out DIR`: prefill/
    /// and decode/ each a cluster folder) is checked as one: the prefill side's schedules
    /// on requests of one output token, then the decode side's on the requests arriving
    /// when that replay says their KV is there (--kv-bandwidth, --kv-latency-us).
    #[arg(long, conflicts_with_all = ["schedule", "on_gpu"])]
    pub(crate) cluster: Option<PathBuf>,
    /// With a disaggregated --cluster: the KV link's bandwidth per GPU, one direction, in
    /// GB/s [default: the NVLink of the cost model's GPU, from its datasheet].
    #[arg(long, requires = "cluster", value_name = "GB/S")]
    pub(crate) kv_bandwidth: Option<f64>,
    /// With a disaggregated --cluster: a fixed time per KV transfer, in microseconds.
    #[arg(long, requires = "cluster", default_value_t = 0.0, value_name = "US")]
    pub(crate) kv_latency_us: f64,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = infersched::cost_models::DEFAULT_COST_MODEL)]
    pub(crate) cost_model: String,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    #[command(flatten)]
    pub(crate) pipeline: super::PipelineArgs,
    /// A service-level objective, METRIC-STATISTIC=TIME (e.g. ttft-p90=2s, tbt-p99=200ms,
    /// tpot-mean=50ms; METRIC ttft, tbt, tpot or e2e; STATISTIC mean, max or pN); repeat
    /// for several. The summary then gives the share of requests meeting every one on their
    /// own values, the goodput, and whether each holds over all requests; with --on-gpu,
    /// read on the measured times too (does the predicted goodput hold on the GPU?).
    #[arg(long = "slo", value_name = "SLO")]
    pub(crate) slo: Vec<infersched::core::Slo>,
    /// Also run every batch on an NVIDIA GPU, in order, through all the layers of this
    /// model (llama2-7b, llama3-8b, llama3-70b or a model-spec JSON file) over a paged KV
    /// cache carried from batch to batch, and compare the measured times and metrics with
    /// the cost model's (gpu-summary.json, gpu-batches.csv, measured/).
    #[arg(long, value_name = "MODEL")]
    pub(crate) on_gpu: Option<String>,
    /// With --on-gpu: tensor-parallel degree (the GPU runs one shard's layers).
    #[arg(long, default_value_t = 1, requires = "on_gpu")]
    pub(crate) tp: u32,
    /// With --on-gpu: GPU ordinal.
    #[arg(long, default_value_t = 0, requires = "on_gpu")]
    pub(crate) gpu: usize,
    /// With --on-gpu: how each batch starts: queued (the GPU waits while the host enqueues
    /// the batch, so the GPU's work alone is timed, as calibration and CUDA graphs do) or
    /// idle (as the host launches it, the host's launch rate included).
    #[arg(long, value_enum, default_value_t = GpuLaunch::Queued, requires = "on_gpu")]
    pub(crate) gpu_launch: GpuLaunch,
    /// Output directory for requests.csv, batches.csv, summary.json.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

/// How each batch starts on the GPU (`kernels_calibration::schedule::Launch`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum GpuLaunch {
    /// The GPU's work alone.
    Queued,
    /// As launched on an idle GPU.
    Idle,
}

pub(crate) fn cmd_replay(a: &ReplayArgs) -> Result<()> {
    // With --on-gpu, a missing model or driver is said before anything is written.
    let gpu_model = match &a.on_gpu {
        Some(m) => {
            let model = super::calibrate::calibration_model(m)?;
            infersched::kernels_calibration::check_libraries()?;
            Some(model)
        }
        None => None,
    };
    let w = load_workload(&a.workload)?;
    let cost = infersched::cost_models::resolve(&a.cost_model)?;
    let pipeline = a.pipeline.pipeline(&cost)?;
    if pipeline.is_pipelined() && a.on_gpu.is_some() {
        anyhow::bail!(
            "--pp {} with --on-gpu: the GPU runs one batch at a time through all the layers",
            pipeline.stages
        );
    }
    let limits = a.limits.limits_on(&cost, pipeline.stages)?;
    let instance = Instance::new(w, limits, cost)
        .with_context(|| format!("{} under these limits", a.workload.display()))?;
    let (w, cost) = (instance.workload(), instance.cost());
    let Some(schedule_path) = &a.schedule else {
        let dir = a
            .cluster
            .as_deref()
            .expect("clap requires --schedule or --cluster");
        return replay_cluster(a, &instance, &pipeline, dir);
    };
    let schedule = Schedule::read(schedule_path)?;
    let r = infersched::core::replay_pipelined(w, instance.limits(), cost, &pipeline, &schedule)
        .with_context(|| {
            format!(
                "{} is not a valid schedule for {}",
                schedule_path.display(),
                a.workload.display()
            )
        })?;
    let (mut summary, split) = infersched::produce::summarize_on(w, cost, &schedule, &r, &pipeline);
    if !a.slo.is_empty() {
        summary.slo = Some(infersched::core::SloReport::of(&r, &a.slo));
    }
    let paths = infersched::output::write_replay_outputs(&a.out, &r, &summary)
        .with_context(|| format!("writing results to {}", a.out.display()))?;
    outln!(
        "schedule {} is valid for {} under cost model {}",
        schedule_path.display(),
        a.workload.display(),
        cost.name
    );
    out!("{}", infersched::output::summary_text(&summary));
    out!("{}", infersched::output::time_split_text(&split));
    outln!("wrote {}", path_list(&paths));
    if let Some(model) = &gpu_model {
        on_gpu(a, model, &instance, &schedule, &r)?;
    }
    Ok(())
}

/// `replay --cluster DIR`: every replica's schedule replayed, the cluster summarised.
fn replay_cluster(
    a: &ReplayArgs,
    instance: &Instance<cost_model::LinearCostModel>,
    pipeline: &infersched::core::Pipeline,
    dir: &std::path::Path,
) -> Result<()> {
    let w = instance.workload();
    if dir.join("prefill").is_dir() && dir.join("decode").is_dir() {
        return replay_disaggregated(a, instance, pipeline, dir);
    }
    let (routing, schedules) = infersched::cluster::read_cluster(dir, w)?;
    let r = infersched::core::cluster::replay_cluster_on(
        w,
        instance.limits(),
        (instance.cost(), pipeline),
        &routing,
        &schedules,
    )
    .with_context(|| {
        format!(
            "{} is not a valid cluster for {}",
            dir.display(),
            a.workload.display()
        )
    })?;
    let router = routing_rule(&schedules);
    let mut summary = Summary::of_cluster_on(&r, &router, pipeline);
    if !a.slo.is_empty() {
        summary.slo = Some(infersched::core::SloReport::of(&r.merged, &a.slo));
    }
    let paths = infersched::cluster::write_cluster_outputs(
        &a.out, w, &routing, &schedules, &r, &summary, None,
    )
    .with_context(|| format!("writing results to {}", a.out.display()))?;
    outln!(
        "the cluster in {} ({} replicas) is valid for {} under cost model {}",
        dir.display(),
        schedules.len(),
        a.workload.display(),
        instance.cost().name
    );
    out!("{}", infersched::output::summary_text(&summary));
    out!("{}", infersched::cluster::load_table(&summary));
    outln!("wrote {} files under {}", paths.len(), a.out.display());
    Ok(())
}

/// `replay --cluster DIR` on a disaggregated cluster's folder: both sides replayed (the
/// decode side's arrivals from the prefill side's replay), the cluster summarised.
fn replay_disaggregated(
    a: &ReplayArgs,
    instance: &Instance<cost_model::LinearCostModel>,
    pipeline: &infersched::core::Pipeline,
    dir: &std::path::Path,
) -> Result<()> {
    let w = instance.workload();
    let link = infersched::settings::kv_link(instance.cost(), a.kv_bandwidth, a.kv_latency_us)?;
    let prefill = infersched::cluster::read_cluster(&dir.join("prefill"), w)?;
    let decode = infersched::cluster::read_cluster(&dir.join("decode"), w)?;
    // Decode schedules that receive the KV pulled it (nixl); the others took it pushed.
    use infersched::core::disaggregated::{KvConnector, KvLink, pulls};
    let connector = if pulls(&decode.1) {
        KvConnector::Nixl
    } else {
        KvConnector::P2pNccl
    };
    let link = KvLink { connector, ..link };
    let router = routing_rule(&prefill.1);
    let limits = *instance.limits();
    let mut o = infersched::produce::DisaggregatedOutcome::replayed_on(
        w,
        (instance.cost(), pipeline, &link),
        limits,
        &router,
        (prefill, decode),
    )
    .with_context(|| {
        format!(
            "{} is not a valid disaggregated cluster for {}",
            dir.display(),
            a.workload.display()
        )
    })?;
    if !a.slo.is_empty() {
        o.summary.slo = Some(infersched::core::SloReport::of(
            &o.replay.cluster.merged,
            &a.slo,
        ));
    }
    let paths = infersched::cluster::write_disaggregated_outputs(&a.out, w, &o, None)
        .with_context(|| format!("writing results to {}", a.out.display()))?;
    outln!(
        "the disaggregated cluster in {} ({} prefill and {} decode replicas) is valid for {} under cost model {}",
        dir.display(),
        o.prefill_schedules.len(),
        o.decode_schedules.len(),
        a.workload.display(),
        instance.cost().name
    );
    out!("{}", infersched::output::summary_text(&o.summary));
    out!("{}", infersched::cluster::load_table(&o.summary));
    outln!("wrote {} files under {}", paths.len(), a.out.display());
    Ok(())
}

/// The router a cluster's schedules name (`meta.router`), or `given`: the replay checks
/// the routing itself, not the rule that made it.
fn routing_rule(schedules: &[Schedule]) -> String {
    schedules
        .iter()
        .find_map(|s| s.meta.as_ref()?.get("router")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "given".to_string())
}

/// `--on-gpu`: the schedule's batches timed on the GPU, replayed with those times, and
/// compared with the cost model's replay `predicted`.
fn on_gpu(
    a: &ReplayArgs,
    model: &cost_model::ModelSpec,
    instance: &Instance<cost_model::LinearCostModel>,
    schedule: &Schedule,
    predicted: &infersched::core::Replay,
) -> Result<()> {
    use infersched::gpu_replay;
    let mut last = 0;
    let mut observe = |done: usize, total: usize| {
        if done * 10 / total > last || done == total {
            last = done * 10 / total;
            eprintln!("timed {done} of {total} batches on the GPU");
        }
    };
    let w = instance.workload();
    use infersched::kernels_calibration::schedule::Launch;
    let launch = match a.gpu_launch {
        GpuLaunch::Queued => Launch::Queued,
        GpuLaunch::Idle => Launch::Idle,
    };
    let timing = gpu_replay::time_on_gpu(model, a.tp, a.gpu, launch, w, schedule, &mut observe)?;
    let times_s = timing.times_s();
    let measured = infersched::core::replay_measured(w, instance.limits(), &times_s, schedule)
        .context("replaying the schedule with the measured batch times")?;
    let c = gpu_replay::compare(&timing, &instance.cost().name, predicted, &measured, &a.slo);
    let paths = gpu_replay::write_outputs(&a.out, &timing, predicted, &measured, &c)
        .with_context(|| format!("writing the GPU results to {}", a.out.display()))?;
    out!("{}", gpu_replay::comparison_text(&c));
    outln!("wrote {}", path_list(&paths));
    Ok(())
}
