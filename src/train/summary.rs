//! What a run reports: the summary, its table, the progress bar and the curves.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use agent_r1_actors::engine::EngineStats;
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::runtime::RolloutSummary;

use super::records::{read_rows, EvalRow, UpdateRow};
use super::{plot, Run};
use crate::checkpoint;
use crate::cluster::coordinator::ClusterSummary;

/// What `agent-r1 train` reports at the end, printed as [`summary_table`] and then as one
/// line of JSON (the field names are the JSON keys).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Updates done in all (a resumed run counts the ones before too).
    pub updates: u64,
    /// Whether the run stopped on a signal before its last update.
    pub interrupted: bool,
    /// The policy version at the end.
    pub policy_version: u64,
    /// The next position in the task stream.
    pub data_position: u64,
    /// Trajectories sampled but not trained on (kept in the last checkpoint).
    pub pending_trajectories: usize,
    /// Episodes sampled again after their engine or env failed.
    pub episodes_requeued: u64,
    /// Episodes that ended failed, with a reason.
    pub episodes_failed: u64,
    /// Env restarts by their supervisor.
    pub env_restarts: u64,
    /// Held-out exact match at the first and the last evaluation.
    pub em_before: Option<f64>,
    pub em_after: Option<f64>,
    /// Held-out F1 at the first and the last evaluation.
    pub f1_before: Option<f64>,
    pub f1_after: Option<f64>,
    /// Tool calls run per held-out episode at the first and the last evaluation.
    pub tool_calls_before: Option<f64>,
    pub tool_calls_after: Option<f64>,
    /// The update steps of the first and the last evaluation.
    pub eval_step_before: Option<u64>,
    pub eval_step_after: Option<u64>,
    /// Held-out questions in the smaller of the first and the last evaluation.
    pub eval_questions: Option<usize>,
    /// The warm start's own figures (null when the run had none).
    pub warm_start: Value,
    /// Wall seconds of this start of the run.
    pub wall_s: f64,
    pub run_dir: PathBuf,
    /// The newest checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// The curves drawn (`curves.svg`, `curves.png`).
    pub curves: Vec<PathBuf>,
    /// Per engine.
    pub engines: Vec<EngineSummary>,
    /// The remote workers' figures, when the run had a cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSummary>,
}

impl RunSummary {
    /// A run stopped by a signal before its first update (while building its env, or during
    /// its warm start): nothing trained, no checkpoint.
    pub(super) fn stopped_before_training(
        run_dir: PathBuf,
        warm_start: Value,
        wall_s: f64,
    ) -> Self {
        Self {
            interrupted: true,
            warm_start,
            wall_s,
            run_dir,
            ..Self::default()
        }
    }
}

/// One engine's figures: its device, the episodes routed to it, its turns and prefill.
#[derive(Debug, Clone, Serialize)]
pub struct EngineSummary {
    pub device: String,
    /// Episodes routed to it (null for a run with one engine, which routes none).
    pub episodes: Option<u64>,
    pub turns: Option<u64>,
    pub prefill_tokens: Option<u64>,
    pub restarts: Option<u64>,
    pub reused_tokens: Option<u64>,
    pub mean_batch: Option<f64>,
}

/// Per engine: its device, the episodes routed to it, its turns and prefill figures.
pub(super) fn engine_summary(
    engines: &EngineSet,
    stats: Option<Vec<EngineStats>>,
) -> Vec<EngineSummary> {
    let routed = engines.episodes_routed().unwrap_or_default();
    let stats = stats.unwrap_or_default();
    engines
        .labels()
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let s = stats.get(i);
            EngineSummary {
                device: label.to_string(),
                episodes: routed.get(i).copied(),
                turns: s.map(|s| s.turns),
                prefill_tokens: s.map(|s| s.prefill_tokens),
                restarts: s.map(|s| s.restarts),
                reused_tokens: s.map(|s| s.reused_tokens),
                mean_batch: s.map(|s| s.mean_batch_size()),
            }
        })
        .collect()
}

/// The run's summary: updates, outcomes of the episodes, held-out scores before and after,
/// where things are; the curves are redrawn.
pub(super) fn summarize(
    run: &Run,
    interrupted: bool,
    sampled: &RolloutSummary,
    warm: Value,
    engines: Vec<EngineSummary>,
    cluster: Option<ClusterSummary>,
) -> anyhow::Result<RunSummary> {
    let snapshot = run.sampler.snapshot();
    let curves = write_plots(&run.run_dir)?;
    let evals: Vec<EvalRow> = read_rows(&run.run_dir.join("eval.jsonl"))?;
    let (first, last) = (evals.first(), evals.last());
    Ok(RunSummary {
        updates: run.step,
        interrupted,
        policy_version: run.version,
        data_position: snapshot.position,
        pending_trajectories: snapshot.pending.len(),
        episodes_requeued: sampled.requeued,
        episodes_failed: sampled.failed,
        env_restarts: sampled.env_restarts,
        em_before: first.map(|e| e.em),
        em_after: last.map(|e| e.em),
        f1_before: first.map(|e| e.f1),
        f1_after: last.map(|e| e.f1),
        tool_calls_before: first.map(|e| e.tool_calls_per_episode),
        tool_calls_after: last.map(|e| e.tool_calls_per_episode),
        eval_step_before: first.map(|e| e.step),
        eval_step_after: last.map(|e| e.step),
        eval_questions: first.zip(last).map(|(f, l)| f.episodes.min(l.episodes)),
        warm_start: warm,
        wall_s: run.started.elapsed().as_secs_f64(),
        run_dir: run.run_dir.clone(),
        checkpoint: run
            .last_checkpoint
            .map(|s| checkpoint::checkpoints_dir(&run.run_dir).join(format!("step-{s}"))),
        curves,
        engines,
        cluster,
    })
}

/// The standard error of a lift in exact match between two evaluations of `questions` each,
/// as for two independent samples (the two evaluations share their questions, so it errs on
/// the wide side).
pub fn lift_standard_error(before: f64, after: f64, questions: usize) -> f64 {
    let var = |p: f64| p * (1.0 - p) / questions.max(1) as f64;
    (var(before) + var(after)).sqrt()
}

/// `EM lift +0.645 (standard error 0.034, 200 held-out questions)`, when the run evaluated
/// before and after some updates.
fn em_lift(summary: &RunSummary) -> Option<String> {
    let (before, after) = summary.em_before.zip(summary.em_after)?;
    let questions = summary.eval_questions?;
    if summary.eval_step_before == summary.eval_step_after {
        return None;
    }
    Some(format!(
        "EM lift {:+.3} (standard error {:.3}, {questions} held-out questions)",
        after - before,
        lift_standard_error(before, after, questions)
    ))
}

/// The end-of-run table a person reads (the JSON summary follows it for scripts): held-out
/// scores before and after RL, tool use, wall time, and where the results are.
pub fn summary_table(summary: &RunSummary) -> String {
    let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let step = |s: Option<u64>| s.map_or("-".to_string(), |s| format!("step {s}"));
    let path = |p: Option<&PathBuf>| p.map_or("-".to_string(), |p| p.display().to_string());
    let curves = summary
        .curves
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let rows = [
        (
            "held-out",
            format!("before RL ({})", step(summary.eval_step_before)),
            format!("after RL ({})", step(summary.eval_step_after)),
        ),
        ("EM", num(summary.em_before), num(summary.em_after)),
        ("F1", num(summary.f1_before), num(summary.f1_after)),
        (
            "tool calls run / episode",
            num(summary.tool_calls_before),
            num(summary.tool_calls_after),
        ),
    ];
    let mut out = String::new();
    for (name, before, after) in rows {
        out.push_str(&format!("{name:<24}{before:>22}{after:>22}\n"));
    }
    if let Some(lift) = em_lift(summary) {
        out.push_str(&lift);
        out.push('\n');
    }
    out.push_str(&format!(
        "updates {}, wall {:.0} s\nrun directory: {}\ncheckpoint: {}\ncurves: {}",
        summary.updates,
        summary.wall_s,
        summary.run_dir.display(),
        path(summary.checkpoint.as_ref()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluated(before: (u64, f64), after: (u64, f64), questions: usize) -> RunSummary {
        RunSummary {
            em_before: Some(before.1),
            em_after: Some(after.1),
            eval_step_before: Some(before.0),
            eval_step_after: Some(after.0),
            eval_questions: Some(questions),
            ..RunSummary::default()
        }
    }

    #[test]
    fn the_table_states_the_lift_with_its_standard_error() {
        let table = summary_table(&evaluated((0, 0.005), (10, 0.65), 200));
        // sqrt(0.005 * 0.995 / 200 + 0.65 * 0.35 / 200) = 0.03409
        assert!(
            table.contains("EM lift +0.645 (standard error 0.034, 200 held-out questions)"),
            "{table}"
        );
        let fewer = summary_table(&evaluated((0, 0.005), (10, 0.65), 50));
        assert!(
            fewer.contains("(standard error 0.068, 50 held-out questions)"),
            "{fewer}"
        );
    }

    #[test]
    fn one_evaluation_states_no_lift() {
        let table = summary_table(&evaluated((4, 0.3), (4, 0.3), 64));
        assert!(!table.contains("EM lift"), "{table}");
        assert!(!summary_table(&RunSummary::default()).contains("EM lift"));
    }
}
