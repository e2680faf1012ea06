//! Held-out evaluation: greedy episodes on the test tasks, their rows and rollouts.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use agent_r1_actors::runtime::{run_rollout, CallLedger, RolloutSetup};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{Trajectory, TrajectoryWriter};
use agent_r1_envs::task::Task;

use super::records::{append_row, BatchSummary, EvalRow};
use super::Run;

impl Run {
    /// Greedy (per config) episodes on the held-out tasks; appends to `eval.jsonl`.
    pub(super) async fn evaluate(&mut self) -> anyhow::Result<Option<BatchSummary>> {
        if self.test.is_empty() {
            return Ok(None);
        }
        let t0 = Instant::now();
        // Evaluation episodes are numbered from 0 at every evaluation: their calls are keyed
        // apart from training's and from other evaluations', and not journaled.
        let setup = RolloutSetup {
            calls: CallLedger::unjournaled(format!("{}-eval{}", self.journal.run(), self.step)),
            ..self.eval_setup.clone()
        };
        let (trajectories, s) = evaluate_tasks(&setup, &self.test, self.cfg.eval.questions).await?;
        let dir = self.run_dir.join("rollouts");
        write_trajectories(
            &dir.join(format!("eval-step-{:06}.jsonl", self.step)),
            &self.tokenizer,
            &trajectories,
        )?;
        let row = EvalRow {
            step: self.step,
            policy_version: self.version,
            episodes: s.episodes,
            em: s.metric("em"),
            f1: s.metric("f1"),
            reward_mean: s.reward_mean,
            tool_calls_per_episode: s.tool_calls_per_episode,
            metrics: s.metrics.clone(),
            greedy: self.cfg.eval.greedy,
            seconds: t0.elapsed().as_secs_f64(),
        };
        append_row(&self.run_dir.join("eval.jsonl"), &row)?;
        for (k, v) in &s.metrics {
            metrics::gauge!(crate::metric_names::TRAIN_EVAL_SCORE.name, "metric" => k.clone())
                .set(*v);
        }
        metrics::gauge!(crate::metric_names::TRAIN_EVAL_SCORE.name, "metric" => "reward")
            .set(s.reward_mean);
        eprintln!(
            "eval   step {:>4}  em {:.3}  f1 {:.3}  reward {:+.3}  calls/ep {:.2}  ({} episodes, {:.1}s)",
            self.step,
            s.metric("em"),
            s.metric("f1"),
            s.reward_mean,
            s.tool_calls_per_episode,
            s.episodes,
            t0.elapsed().as_secs_f64()
        );
        self.last_eval = Some(self.step);
        Ok(Some(s))
    }
}

/// Runs `tasks` through the runtime and returns their trajectories sorted by (group,
/// episode), so that the batch handed to the learner does not depend on finishing order.
pub(super) async fn rollout(
    setup: &RolloutSetup,
    tasks: Vec<(Task, u64)>,
) -> anyhow::Result<Vec<Trajectory>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(256);
    let collect = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(t) = rx.recv().await {
            all.push(t);
        }
        all
    });
    let report = run_rollout(setup.clone(), tasks, tx).await?;
    let mut all = collect.await.context("collecting trajectories")?;
    if let Some(fatal) = &report.summary.fatal {
        anyhow::bail!("the rollout stopped: {fatal}");
    }
    all.sort_by_key(|t| (t.group_id, t.episode_id));
    Ok(all)
}

/// One episode of each of the first `questions` tasks (0 = all), in order, with the task's
/// index as its group id; returns the trajectories (sorted) and their summary. The held-out
/// evaluation of `train` and `agent-r1 eval` both run this.
pub async fn evaluate_tasks(
    setup: &RolloutSetup,
    tasks: &[Task],
    questions: usize,
) -> anyhow::Result<(Vec<Trajectory>, BatchSummary)> {
    let n = match questions {
        0 => tasks.len(),
        q => q.min(tasks.len()),
    };
    let tasks: Vec<(Task, u64)> = tasks[..n]
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, t)| (t, i as u64))
        .collect();
    let trajectories = rollout(setup, tasks).await?;
    let summary = BatchSummary::of(&trajectories);
    Ok((trajectories, summary))
}

/// Writes trajectories as JSON lines with their decoded text.
pub fn write_trajectories(
    path: &Path,
    tokenizer: &Arc<HfTokenizer>,
    trajectories: &[Trajectory],
) -> anyhow::Result<()> {
    let mut w = TrajectoryWriter::create(path, Some(tokenizer.clone()))?;
    for t in trajectories {
        w.write(t)?;
    }
    w.flush()?;
    Ok(())
}
