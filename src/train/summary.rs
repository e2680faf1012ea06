//! What a run reports: the summary, its table, the progress bar and the curves.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use agent_r1_actors::engine::EngineStats;
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::runtime::RolloutSummary;

use super::records::{read_rows, EvalRow, UpdateRow};
use super::{plot, Run};
use crate::checkpoint;

/// Per engine: its device, the episodes routed to it, its turns and prefill figures.
pub(super) fn engine_summary(engines: &EngineSet, stats: Option<Vec<EngineStats>>) -> Value {
    let routed = engines.episodes_routed();
    let stats = stats.unwrap_or_default();
    let rows: Vec<Value> = engines
        .labels()
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let s = stats.get(i);
            json!({
                "device": label,
                "episodes": routed.get(i),
                "turns": s.map(|s| s.turns),
                "prefill_tokens": s.map(|s| s.prefill_tokens),
                "restarts": s.map(|s| s.restarts),
                "reused_tokens": s.map(|s| s.reused_tokens),
                "mean_batch": s.map(|s| s.mean_batch_size()),
            })
        })
        .collect();
    Value::Array(rows)
}

/// The run's summary: updates, outcomes of the episodes, held-out scores before and after,
/// where things are; the curves are redrawn.
pub(super) fn summarize(
    run: &Run,
    interrupted: bool,
    sampled: &RolloutSummary,
    warm: Value,
) -> anyhow::Result<Value> {
    let snapshot = run.sampler.snapshot();
    let curves = write_plots(&run.run_dir)?;
    let evals: Vec<EvalRow> = read_rows(&run.run_dir.join("eval.jsonl"))?;
    let (first, last) = (evals.first(), evals.last());
    Ok(json!({
        "updates": run.step,
        "interrupted": interrupted,
        "policy_version": run.version,
        "data_position": snapshot.position,
        "pending_trajectories": snapshot.pending.len(),
        "episodes_requeued": sampled.requeued,
        "episodes_failed": sampled.failed,
        "env_restarts": sampled.env_restarts,
        "em_before": first.map(|e| e.em),
        "em_after": last.map(|e| e.em),
        "f1_before": first.map(|e| e.f1),
        "f1_after": last.map(|e| e.f1),
        "tool_calls_before": first.map(|e| e.tool_calls_per_episode),
        "tool_calls_after": last.map(|e| e.tool_calls_per_episode),
        "eval_step_before": first.map(|e| e.step),
        "eval_step_after": last.map(|e| e.step),
        "warm_start": warm,
        "wall_s": run.started.elapsed().as_secs_f64(),
        "run_dir": run.run_dir.display().to_string(),
        "checkpoint": run.last_checkpoint.map(|s| checkpoint::checkpoints_dir(&run.run_dir).join(format!("step-{s}")).display().to_string()),
        "curves": curves.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    }))
}

/// The end-of-run table a person reads (the JSON summary follows it for scripts): held-out
/// scores before and after RL, tool use, wall time, and where the results are.
pub fn summary_table(summary: &Value) -> String {
    let num = |key: &str| match summary.get(key).and_then(Value::as_f64) {
        Some(v) => format!("{v:.3}"),
        None => "-".to_string(),
    };
    let text = |key: &str| summary.get(key).and_then(Value::as_str).unwrap_or("-");
    let step = |key: &str| {
        summary
            .get(key)
            .and_then(Value::as_u64)
            .map_or("-".to_string(), |s| format!("step {s}"))
    };
    let curves = summary
        .get("curves")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let rows = [
        (
            "held-out",
            format!("before RL ({})", step("eval_step_before")),
            format!("after RL ({})", step("eval_step_after")),
        ),
        ("EM", num("em_before"), num("em_after")),
        ("F1", num("f1_before"), num("f1_after")),
        (
            "tool calls / episode",
            num("tool_calls_before"),
            num("tool_calls_after"),
        ),
    ];
    let mut out = String::new();
    for (name, before, after) in rows {
        out.push_str(&format!("{name:<22}{before:>22}{after:>22}\n"));
    }
    out.push_str(&format!(
        "updates {}, wall {} s\nrun directory: {}\ncheckpoint: {}\ncurves: {}",
        summary.get("updates").and_then(Value::as_u64).unwrap_or(0),
        summary
            .get("wall_s")
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |w| format!("{w:.0}")),
        text("run_dir"),
        text("checkpoint"),
        if curves.is_empty() { "-" } else { &curves },
    ));
    out
}

/// A bar over the updates on a terminal; hidden otherwise, where the per-update log lines
/// are the record (a bar's redraws would only litter a log file).
pub(super) fn progress_bar(updates: u64, done: u64) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(updates).with_position(done);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} updates (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Writes a log line above the bar (or plainly, when the bar is hidden).
pub(super) fn log_line(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Redraws the curves from `metrics.jsonl` and `eval.jsonl`.
pub(super) fn write_plots(run_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let train: Vec<UpdateRow> = read_rows(&run_dir.join("metrics.jsonl"))?;
    let eval: Vec<EvalRow> = read_rows(&run_dir.join("eval.jsonl"))?;
    let curves = plot::Curves {
        reward: train
            .iter()
            .map(|r| (r.step as f64, r.reward_mean))
            .collect(),
        train_em: train.iter().map(|r| (r.step as f64, r.em)).collect(),
        eval_em: eval.iter().map(|r| (r.step as f64, r.em)).collect(),
    };
    plot::write_curves(run_dir, &curves)
}
