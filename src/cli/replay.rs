//! `replay`: validate a schedule and compute every metric from it.

use super::{LimitArgs, load_workload, path_list};
use anyhow::{Context, Result};
use clap::Args;
use infersched::core::{Instance, Schedule, Summary};
use infersched::cost_model::{self, TimeBreakdown};
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ReplayArgs {
    /// Workload trace CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at).
    #[arg(long)]
    pub(crate) workload: PathBuf,
    /// Schedule file (infersched-schedule/1 JSON, or CSV batch,request,tokens).
    #[arg(long)]
    pub(crate) schedule: PathBuf,
    /// Cost-model preset name or coefficient JSON file.
    #[arg(long, default_value = "llama2-7b-a100")]
    pub(crate) cost_model: String,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    /// Output directory for requests.csv, batches.csv, summary.json.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

pub(crate) fn cmd_replay(a: &ReplayArgs) -> Result<()> {
    let w = load_workload(&a.workload)?;
    let cost = cost_model::resolve(&a.cost_model)?;
    let limits = a.limits.limits(&cost)?;
    let instance = Instance::new(w, limits, cost)
        .with_context(|| format!("{} under these limits", a.workload.display()))?;
    let (w, cost) = (instance.workload(), instance.cost());
    let schedule = Schedule::read(&a.schedule)?;
    let r = instance.replay(&schedule).with_context(|| {
        format!(
            "{} is not a valid schedule for {}",
            a.schedule.display(),
            a.workload.display()
        )
    })?;
    let summary = Summary::from_replay(&r);
    let split = TimeBreakdown::of(cost, w, &schedule, &r);
    let paths = infersched::output::write_replay_outputs(&a.out, &r, &summary)
        .with_context(|| format!("writing results to {}", a.out.display()))?;
    outln!(
        "schedule {} is valid for {} under cost model {}",
        a.schedule.display(),
        a.workload.display(),
        cost.name
    );
    out!("{}", infersched::output::summary_text(&summary));
    out!("{}", infersched::output::time_split_text(&split));
    outln!("wrote {}", path_list(&paths));
    Ok(())
}
