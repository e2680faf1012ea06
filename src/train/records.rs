//! What a run writes besides checkpoints: batch summaries and the JSON-lines logs
//! (`metrics.jsonl`, one line per update; `eval.jsonl`, one line per evaluation).
//!
//! Both logs are keyed by `step`. After a crash the logs can run ahead of the checkpoint a
//! resume starts from; [`truncate_after`] drops those lines, so each step appears once and
//! the curves stay monotone in the step.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use agent_r1_actors::learner::UpdateStats;
use agent_r1_actors::trajectory::Trajectory;
use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Means over a batch of finished episodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BatchSummary {
    /// Episodes.
    pub episodes: usize,
    /// Episodes that did not complete (errors, time-outs).
    pub failed: usize,
    /// Mean episode return: the outcome reward plus the steps' own rewards, as the learner
    /// trains on them.
    pub reward_mean: f64,
    /// Mean of each env metric (`em`, `f1`, ...), over all episodes.
    pub metrics: BTreeMap<String, f64>,
    /// Tool calls per episode.
    pub tool_calls_per_episode: f64,
    /// Model turns per episode.
    pub turns_per_episode: f64,
    /// Context tokens the engine prefilled, over every step.
    pub prefill_tokens: u64,
    /// Context tokens of every step's whole context: what prefilling each from scratch
    /// would cost.
    pub context_tokens: u64,
}

impl BatchSummary {
    /// Summarises `trajectories` (all zeros when there are none).
    pub fn of(trajectories: &[Trajectory]) -> Self {
        let n = trajectories.len();
        if n == 0 {
            return Self::default();
        }
        let nf = n as f64;
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for t in trajectories {
            for (k, v) in &t.metrics {
                *metrics.entry(k.clone()).or_default() += v / nf;
            }
        }
        let calls: usize = trajectories
            .iter()
            .flat_map(|t| &t.steps)
            .map(|s| s.tool_calls.len())
            .sum();
        let turns: usize = trajectories.iter().map(|t| t.steps.len()).sum();
        let steps = || trajectories.iter().flat_map(|t| &t.steps);
        Self {
            prefill_tokens: steps().map(|s| s.prefill_tokens as u64).sum(),
            context_tokens: steps().map(|s| s.context_len as u64).sum(),
            episodes: n,
            failed: trajectories.iter().filter(|t| !t.completed()).count(),
            reward_mean: trajectories
                .iter()
                .map(Trajectory::episode_return)
                .sum::<f64>()
                / nf,
            metrics,
            tool_calls_per_episode: calls as f64 / nf,
            turns_per_episode: turns as f64 / nf,
        }
    }

    /// A metric's mean, 0 when the env does not report it.
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics.get(name).copied().unwrap_or(0.0)
    }
}

/// One line of `metrics.jsonl`: an update. Fields a line lacks (written by an older
/// version) read as their defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpdateRow {
    /// Updates done, this one included.
    pub step: u64,
    /// The policy version after it.
    pub policy_version: u64,
    /// Tasks taken from the task stream so far.
    pub data_position: u64,
    /// Episodes in the batch.
    pub episodes: usize,
    /// Of those, episodes that did not complete.
    pub failed: usize,
    /// Mean episode reward.
    pub reward_mean: f64,
    /// Mean exact match (0 when the env does not report it).
    pub em: f64,
    /// Mean F1 (0 when the env does not report it).
    pub f1: f64,
    /// Tool calls per episode.
    pub tool_calls_per_episode: f64,
    /// Model turns per episode.
    pub turns_per_episode: f64,
    /// Context tokens the engine prefilled for the batch (the rest came from reused KV).
    pub prefill_tokens: u64,
    /// Context tokens of all the batch's steps: what prefilling each context whole would cost.
    pub context_tokens: u64,
    /// Every env metric's mean.
    pub metrics: BTreeMap<String, f64>,
    /// Policy-gradient loss.
    pub policy_loss: f64,
    /// Critic loss (estimators with a critic).
    pub value_loss: Option<f64>,
    /// Mean token entropy.
    pub entropy: f64,
    /// KL to the reference (when configured).
    pub kl: Option<f64>,
    /// Approximate KL between the sampling and the updated policy.
    pub approx_kl: f64,
    /// Fraction of tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Trajectories trained on after filtering.
    pub kept: usize,
    /// Action tokens trained on.
    pub action_tokens: u64,
    /// Mean versions between a token's sampling policy and the learner's.
    pub staleness_mean: f64,
    /// Largest such lag.
    pub staleness_max: u64,
    /// Tokens masked out for being older than `max_staleness`.
    pub stale_tokens_dropped: u64,
    /// Decoupled PPO: mean importance weight `π_prox / π_behavior` of the trained tokens.
    pub behavior_weight_mean: Option<f64>,
    /// Decoupled PPO: KL(behavior || prox) of the trained tokens (k1 estimate).
    pub behavior_kl: Option<f64>,
    /// The gap between the engine's sampling log-probabilities and the learner's for the
    /// same weights (mean and max |Δ|, k3 KL, fraction over the report threshold, worst
    /// sequence), over the tokens the update's starting weights sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<agent_r1_actors::learner::Mismatch>,
    /// On-policy distillation: the mean per-token reverse KL to the teacher over the trained
    /// tokens, and the teacher's forward-pass tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<agent_r1_actors::learner::DistillStats>,
    /// Rollout correction: mean importance weight of the corrected tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction_weight_mean: Option<f64>,
    /// Rollout correction: action tokens rejected from the loss.
    #[serde(default)]
    pub rejected_tokens: u64,
    /// Why the update was skipped, if it was.
    pub skipped: Option<String>,
    /// The episodes of the batch, in batch order (a retried episode carries its retry bit): what the
    /// update trained on, unless it was skipped. Each episode of a run appears in one row.
    pub episode_ids: Vec<u64>,
    /// Seconds inside the learner.
    pub update_seconds: f64,
    /// Seconds the engine sat idle while the learner trained (`None` when unknown).
    pub engine_idle_during_update_seconds: Option<f64>,
    /// Wall seconds of the learner call as the loop saw it: the window the engine's idle
    /// time is measured over (includes queueing and any injected delay).
    pub update_window_seconds: f64,
    /// Seconds waiting for the batch.
    pub sample_seconds: f64,
    /// Seconds the engine sat idle while the loop waited for the batch (`None` when unknown).
    pub engine_idle_while_sampling_seconds: Option<f64>,
    /// Wall seconds of the update: training, publishing, writing samples.
    pub seconds: f64,
    /// Seconds since the run started.
    pub wall_s: f64,
}

impl UpdateRow {
    /// The row of the update `step` trained on a batch summarised by `batch`.
    pub fn new(step: u64, batch: &BatchSummary, stats: &UpdateStats) -> Self {
        Self {
            step,
            episodes: batch.episodes,
            failed: batch.failed,
            reward_mean: batch.reward_mean,
            em: batch.metric("em"),
            f1: batch.metric("f1"),
            tool_calls_per_episode: batch.tool_calls_per_episode,
            turns_per_episode: batch.turns_per_episode,
            prefill_tokens: batch.prefill_tokens,
            context_tokens: batch.context_tokens,
            metrics: batch.metrics.clone(),
            policy_loss: stats.policy_loss,
            value_loss: stats.value_loss,
            entropy: stats.entropy,
            kl: stats.kl,
            approx_kl: stats.approx_kl,
            clip_fraction: stats.clip_fraction,
            grad_norm: stats.grad_norm,
            kept: stats.trajectories_kept,
            action_tokens: stats.action_tokens,
            staleness_mean: stats.staleness_mean,
            staleness_max: stats.staleness_max,
            stale_tokens_dropped: stats.stale_tokens_dropped,
            behavior_weight_mean: stats.behavior_weight_mean,
            behavior_kl: stats.behavior_kl,
            mismatch: stats.mismatch,
            correction_weight_mean: stats.correction_weight_mean,
            distill: stats.distill,
            rejected_tokens: stats.rejected_tokens,
            skipped: stats.skipped_reason.clone(),
            update_seconds: stats.duration_seconds,
            ..Default::default()
        }
    }
}

/// One line of `eval.jsonl`: a held-out evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalRow {
    /// Updates done when it ran.
    pub step: u64,
    /// The policy version evaluated.
    pub policy_version: u64,
    /// Episodes (one per held-out task).
    pub episodes: usize,
    /// Mean exact match.
    pub em: f64,
    /// Mean F1.
    pub f1: f64,
    /// Mean episode reward.
    pub reward_mean: f64,
    /// Tool calls per episode.
    pub tool_calls_per_episode: f64,
    /// Every env metric's mean.
    pub metrics: BTreeMap<String, f64>,
    /// Whether decoding was greedy.
    pub greedy: bool,
    /// Seconds it took.
    pub seconds: f64,
}

/// Appends one row as a JSON line.
pub fn append_row(path: &Path, row: &impl Serialize) -> anyhow::Result<()> {
    let line = serde_json::to_string(row).context("encoding a log row")?;
    append_line(path, &line)
}

/// The rows of a JSON-lines log that parse as `T` (a line cut short by a crash is skipped).
pub fn read_rows<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    Ok(read_jsonl(path)?
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect())
}

/// Appends one JSON object as a line.
pub fn append_jsonl(path: &Path, value: &Value) -> anyhow::Result<()> {
    append_line(path, &value.to_string())
}

fn append_line(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("{}: cannot open for appending", path.display()))?;
    writeln!(f, "{line}").with_context(|| format!("{}: cannot write", path.display()))
}

/// The lines of a JSON-lines file that parse (a line cut short by a crash is skipped); an
/// absent file is empty.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Rewrites `path` without the lines whose `step` is above `step` (and without unreadable
/// lines); returns how many were dropped.
pub fn truncate_after(path: &Path, step: u64) -> anyhow::Result<usize> {
    if !path.exists() {
        return Ok(0);
    }
    let text =
        fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let total = text.lines().count();
    let kept: Vec<Value> = read_jsonl(path)?
        .into_iter()
        .filter(|v| v.get("step").and_then(Value::as_u64).unwrap_or(u64::MAX) <= step)
        .collect();
    let mut out = String::new();
    for v in &kept {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, out).with_context(|| format!("{}: cannot write", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("{}: cannot replace", path.display()))?;
    Ok(total - kept.len())
}

/// Removes the JSON-lines file at `path` (if any); how many lines it had.
pub fn drop_records(path: &Path) -> anyhow::Result<usize> {
    match fs::read_to_string(path) {
        Ok(text) => {
            fs::remove_file(path).with_context(|| format!("{}: cannot remove", path.display()))?;
            Ok(text.lines().count())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("{}: cannot read", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_steps_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        for s in 1..=5u64 {
            append_jsonl(&path, &serde_json::json!({ "step": s })).unwrap();
        }
        fs::write(
            &path,
            fs::read_to_string(&path).unwrap() + "{\"step\": 6, \"cut",
        )
        .unwrap();
        assert_eq!(truncate_after(&path, 3).unwrap(), 3);
        let steps: Vec<u64> = read_jsonl(&path)
            .unwrap()
            .iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
        assert!(read_jsonl(&dir.path().join("absent")).unwrap().is_empty());
    }

    #[test]
    fn records_of_a_life_without_a_checkpoint_are_dropped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        for s in [1u64, 1, 2] {
            append_jsonl(&path, &serde_json::json!({ "step": s })).unwrap();
        }
        assert_eq!(drop_records(&path).unwrap(), 3);
        assert!(!path.exists());
        assert_eq!(drop_records(&path).unwrap(), 0);
    }

    #[test]
    fn rows_round_trip_and_old_lines_read_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let row = UpdateRow {
            step: 3,
            em: 0.5,
            engine_idle_during_update_seconds: Some(1.5),
            skipped: Some("no_signal".into()),
            ..Default::default()
        };
        append_row(&path, &row).unwrap();
        append_jsonl(&path, &serde_json::json!({"step": 4, "reward_mean": 0.25})).unwrap();
        let rows: Vec<UpdateRow> = read_rows(&path).unwrap();
        assert_eq!(rows[0], row);
        assert_eq!(
            (rows[1].step, rows[1].reward_mean, rows[1].em),
            (4, 0.25, 0.0)
        );
        let line = fs::read_to_string(&path).unwrap();
        assert!(
            line.starts_with("{\"step\":3,\"policy_version\":0,"),
            "{line}"
        );
    }
}
