//! One update: the next batch, the learner's step on it, and publishing the new weights.

use std::time::Instant;

use anyhow::Context;

use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::{LearnerRef, UpdateStats};
use agent_r1_actors::stall::{Operations, StallWatch};
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};

use super::records::BatchSummary;
use super::skip::{no_reward_signal, unusable};
use super::{write_trajectories, Run, ROLLOUT_SAMPLE};
use crate::config::TrainMode;

impl Run {
    /// The next batch of whole groups: in sync mode, feeds exactly the groups the batch
    /// still needs and waits for them; in async mode, feeds the rest of the run's tasks once
    /// (the service paces them) and takes the next groups to complete. `None` when the stop
    /// flag ended feeding before a batch was complete.
    pub(super) async fn next_batch(&mut self) -> anyhow::Result<Option<Vec<Trajectory>>> {
        let batch = self.cfg.rollout.batch_size as u64;
        let updates_fed = match self.cfg.training.mode {
            TrainMode::Sync => 1,
            TrainMode::Async if self.fed_ahead => 0,
            TrainMode::Async => self.cfg.training.updates.saturating_sub(self.step),
        };
        self.faults.before_sampling(self.step, &self.engine_faults);
        if updates_fed > 0 {
            let requeue = std::mem::take(&mut self.requeue);
            let held = self.sampler.complete_groups() as u64 + requeue.len() as u64;
            let to = self.sampler.position() + (updates_fed * batch).saturating_sub(held);
            let ahead = (self.cfg.training.mode == TrainMode::Async)
                .then_some(self.cfg.training.batches_ahead);
            self.sampler.feed(requeue, to, ahead);
            self.fed_ahead = self.cfg.training.mode == TrainMode::Async;
        }
        let got = self.sampler.next_batch().await?;
        let position = self.sampler.position();
        metrics::gauge!(crate::metric_names::TRAIN_DATA_POSITION.name).set(position as f64);
        if let Some(b) = &got {
            eprintln!(
                "sampled update {}: {} episodes (data position {position})",
                self.step + 1,
                b.len()
            );
        }
        Ok(got)
    }

    /// A batch in which every episode failed is reported with the first episode's reason;
    /// `training.max_failed_batches` of them in a row end the run with an error, since a run
    /// that cannot complete an episode cannot learn.
    pub(super) fn check_failed_batches(
        &mut self,
        batch: &[Trajectory],
        summary: &BatchSummary,
    ) -> anyhow::Result<()> {
        if summary.episodes == 0 || summary.failed < summary.episodes {
            self.failed_batches = 0;
            return Ok(());
        }
        self.failed_batches += 1;
        let reason = batch
            .iter()
            .find_map(|t| match &t.end {
                EpisodeEnd::Failed { reason } => Some(reason.as_str()),
                _ => None,
            })
            .unwrap_or("(no reason recorded)");
        let limit = self.cfg.training.max_failed_batches;
        eprintln!(
            "every episode of update {} failed ({} of training.max_failed_batches {limit} in a \
             row); the first: {reason}",
            self.step + 1,
            self.failed_batches
        );
        anyhow::ensure!(
            limit == 0 || self.failed_batches < limit,
            "every episode of the last {} batches failed (training.max_failed_batches = \
             {limit}); the run cannot learn. The first episode's reason: {reason}",
            self.failed_batches
        );
        Ok(())
    }

    /// One update on `batch`: train, publish, write a sample of it. Trajectories keep
    /// arriving meanwhile (async mode samples on). Returns the batch summary, the learner's
    /// stats and the update's timings.
    pub(super) async fn update(
        &mut self,
        batch: Vec<Trajectory>,
    ) -> anyhow::Result<(BatchSummary, UpdateStats, UpdateTimes)> {
        let t0 = Instant::now();
        metrics::counter!(crate::metric_names::TRAIN_EPISODES_TOTAL.name)
            .increment(batch.len() as u64);
        let summary = BatchSummary::of(&batch);
        self.check_failed_batches(&batch, &summary)?;
        if let Some(rewards) = no_reward_signal(&batch) {
            eprintln!(
                "warning: in every group of update {}, all episodes earned the same return \
                 (returns seen: {rewards}): group baselines give every token an advantage of 0 \
                 and nothing is learnt from this batch",
                self.step + 1
            );
        }
        // An episode that failed before its first turn has no tokens to train on.
        let (batch, empty): (Vec<_>, Vec<_>) = batch.into_iter().partition(|t| !t.steps.is_empty());
        if !empty.is_empty() {
            metrics::counter!(crate::metric_names::TRAIN_EMPTY_EPISODES_TOTAL.name)
                .increment(empty.len() as u64);
            tracing::warn!(
                episodes = empty.len(),
                "episodes ended before their first turn (their reasons are logged: a prompt over rollout.max_prompt_length, a failed reset, ...); not trained on"
            );
        }
        let sample: Vec<Trajectory> = batch.iter().take(ROLLOUT_SAMPLE).cloned().collect();
        if let Some((reason, why)) = unusable(&batch) {
            // The batch's tasks are consumed and the weights stay as they are; the run goes
            // on with the next batch instead of ending on one bad one.
            self.step += 1;
            self.sampler.set_step(self.step);
            metrics::counter!(crate::metric_names::TRAIN_SKIPPED_UPDATES_TOTAL.name, "reason" => reason)
                .increment(1);
            tracing::warn!(step = self.step, reason, "update skipped: {why}");
            let stats = UpdateStats {
                version: self.version,
                trajectories: batch.len(),
                skipped_reason: Some(reason.to_string()),
                ..Default::default()
            };
            let times = UpdateTimes {
                seconds: t0.elapsed().as_secs_f64(),
                ..Default::default()
            };
            return Ok((summary, stats, times));
        }
        let learner = self.learner.clone();
        let step = self.step + 1;
        let updating = self.stall.learner().start(format!("update {step}"));
        let train = async move {
            let _updating = updating;
            learner
                .update(batch)
                .await
                .with_context(|| format!("learner update {step}"))
        };
        let engine_before = self.engine.stats().await.ok();
        let window = Instant::now();
        let stats = self.sampler.while_sampling(train).await??;
        let window = window.elapsed().as_secs_f64();
        let engine_after = self.engine.stats().await.ok();
        let engine_idle = engine_before
            .zip(engine_after)
            .map(|(a, b)| b.idle_seconds - a.idle_seconds);
        if let Some(idle) = engine_idle {
            metrics::histogram!(crate::metric_names::TRAIN_ENGINE_IDLE_DURING_UPDATE_SECONDS.name)
                .record(idle);
        }
        self.faults.before_publication(&self.engine_faults);
        let publish = publish(
            self.learner.clone(),
            self.engine.clone(),
            self.stall.publication(),
            format!("the weights of update {step}"),
        );
        self.version = self.sampler.while_sampling(publish).await??;
        self.faults
            .after_publication(self.step, &self.engine_faults, &self.engine);
        if let Some(cluster) = &self.cluster {
            let remote = cluster.publish(&self.learner, self.version);
            self.sampler.while_sampling(remote).await??;
        }
        self.step += 1;
        self.sampler.set_step(self.step);
        write_trajectories(
            &self
                .run_dir
                .join("rollouts")
                .join(format!("train-step-{:06}.jsonl", self.step)),
            &self.tokenizer,
            &sample,
        )?;
        let times = UpdateTimes {
            seconds: t0.elapsed().as_secs_f64(),
            learner_window: window,
            engine_idle,
        };
        Ok((summary, stats, times))
    }
}

/// Timings of one update.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct UpdateTimes {
    /// Wall seconds: training, publishing, writing samples.
    pub(super) seconds: f64,
    /// Wall seconds of the learner call as the loop saw it.
    pub(super) learner_window: f64,
    /// Seconds the engine sat idle during that call (`None` when its stats were unavailable).
    pub(super) engine_idle: Option<f64>,
}

/// Publishes the learner's weights to the engine, on record as `what` in the stall
/// detector's publication stage until it completes.
pub(super) async fn publish(
    learner: LearnerRef,
    engine: EngineSet,
    stage: Operations,
    what: String,
) -> anyhow::Result<u64> {
    let _publishing = stage.start(what);
    learner
        .publish(&engine)
        .await
        .context("publishing the new weights to the engine")
}

/// Sends the learner's current weights to each engine whose thread was restarted (it
/// admits no turn until it has them again). Runs until aborted.
pub(super) fn republish_after_restarts(
    engine: &EngineSet,
    learner: LearnerRef,
    stall: &StallWatch,
) -> tokio::task::JoinHandle<()> {
    let mut restarted = engine.restarted();
    let (learner_stage, publication) = (stall.learner(), stall.publication());
    tokio::spawn(async move {
        while let Some((label, handle)) = restarted.next().await {
            // A restarted engine holds its turns until it has its weights again. Asking the
            // learner for them waits behind its update in progress, which can be far longer
            // than the engine's or a publication's deadline: that wait is on record as the
            // learner's, and only the transfer as a publication.
            let weights = {
                let _asked =
                    learner_stage.start(format!("the weights for the restarted engine on {label}"));
                learner.weights().await
            };
            let sent = match weights {
                Ok(w) => {
                    let version = w.version;
                    let _sending = publication.start(format!(
                        "weights version {version} to the restarted engine on {label}"
                    ));
                    handle
                        .update_weights_verified(version, w.tensors, w.digest)
                        .await
                        .map(|()| version)
                }
                Err(e) => Err(e),
            };
            match sent {
                Ok(version) => {
                    eprintln!(
                        "engine on {label} restarted; weights version {version} sent to it again"
                    )
                }
                // It holds its turns until the next publication (after the learner's update
                // in progress); they time out meanwhile, each with its episode's error.
                Err(e) => tracing::error!(
                    "engine on {label} restarted and its weights could not be sent again: {e}"
                ),
            }
        }
    })
}
