//! Checkpoints of a run: its training state, saving with retries.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use agent_r1_actors::runtime::RETRY_BIT;
use serde_json::json;

use super::{sampler, Run, OPTIMIZER_STATE};
use crate::checkpoint;
use crate::checkpoint::{TrainingState, IN_FLIGHT_EPISODES, PENDING_TRAJECTORIES};

impl Run {
    pub(super) fn state(&self, snapshot: &sampler::SamplerSnapshot) -> TrainingState {
        TrainingState {
            step: self.step,
            policy_version: self.version,
            data_position: snapshot.position,
            requeue_positions: snapshot.open.clone(),
            seed: self.cfg.training.seed,
            rng_state: json!({
                "task_stream": "epoch shuffles seeded by training.seed; position = data_position",
                "learner_seed": self.cfg.training.seed.wrapping_add(self.step),
                "engine": "tokens drawn from (engine seed, episode, position)",
            }),
        }
    }

    /// Writes `checkpoints/step-K` (policy + critic, pending trajectories, the resolved
    /// config) atomically, then prunes old ones.
    pub(super) async fn checkpoint(&mut self) -> anyhow::Result<PathBuf> {
        let _writing = self
            .stall
            .checkpoint()
            .start(format!("writing checkpoint step {}", self.step));
        let pending = checkpoint::begin(&self.run_dir, self.step)?;
        self.learner
            .save(
                pending.dir().join("policy"),
                Some(self.tokenizer_dir.clone()),
            )
            .await
            .context("saving the policy into the checkpoint")?;
        self.learner
            .save_optimizer(pending.dir().join(OPTIMIZER_STATE))
            .await
            .context("saving the optimizer state into the checkpoint")?;
        let sampler = &self.sampler;
        self.faults
            .during_checkpoint_write(self.step, || {
                sampler.holds_a_finished_step_or_nothing_running()
            })
            .await;
        self.sampler.absorb_finished();
        let snapshot = self.sampler.snapshot();
        if !snapshot.pending.is_empty() {
            pending.write_jsonl(PENDING_TRAJECTORIES, &snapshot.pending)?;
        }
        if !snapshot.in_flight.is_empty() {
            pending.write_jsonl(IN_FLIGHT_EPISODES, &snapshot.in_flight)?;
        }
        pending.write_file("config.toml", self.cfg.to_toml_string().as_bytes())?;
        let done = pending.commit(self.state(&snapshot))?;
        // Only episodes of the groups in flight at the checkpoint, or fed since, can be
        // sampled again after a resume from here; the journal keeps their calls only.
        let group = self.cfg.rollout.group_size.max(1) as u64;
        let open: std::collections::BTreeSet<u64> = snapshot.open.iter().copied().collect();
        let needed = |episode: u64| {
            let position = (episode & !RETRY_BIT) / group;
            position >= snapshot.position || open.contains(&position)
        };
        match self.journal.retain(needed) {
            Ok(0) => {}
            Ok(dropped) => tracing::debug!("tool-call journal: {dropped} calls no longer needed"),
            Err(e) => eprintln!("warning: compacting the tool-call journal: {e}"),
        }
        // The checkpoint is committed; failing to delete older ones is not worth a retry.
        if let Err(e) = checkpoint::prune(&self.run_dir, self.cfg.checkpoint.keep_last) {
            eprintln!("warning: pruning old checkpoints: {e}");
        }
        self.last_checkpoint = Some(self.step);
        self.live.touch(format!("checkpoint step {}", self.step));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        metrics::gauge!(crate::metric_names::TRAIN_LAST_CHECKPOINT_TIMESTAMP_SECONDS.name)
            .set(now.map_or(0.0, |d| d.as_secs_f64()));
        eprintln!(
            "checkpoint step {} -> {} ({} pending trajectories, {} of them in the {} groups in flight; {} episodes in flight with finished steps)",
            self.step,
            done.dir.display(),
            snapshot.pending.len(),
            snapshot.partial,
            snapshot.open.len(),
            snapshot.in_flight.len()
        );
        Ok(done.dir)
    }

    /// [`Run::checkpoint`], retried `checkpoint.retries` times (1 s, 2 s, 4 s, ... apart).
    /// When every attempt fails, a periodic checkpoint is skipped with an alert (a log
    /// line and `agent_r1_train_checkpoint_failures_total`; older checkpoints stay), and the
    /// final one (`required`) fails the run.
    pub(super) async fn checkpoint_with_retries(&mut self, required: bool) -> anyhow::Result<()> {
        let retries = self.cfg.checkpoint.retries;
        let mut wait = Duration::from_secs(1);
        for attempt in 0..=retries {
            match self.checkpoint().await {
                Ok(_) => return Ok(()),
                Err(e) if attempt < retries => {
                    eprintln!(
                        "warning: checkpoint step {} failed (attempt {} of {}): {e:#}; retrying in {wait:?}",
                        self.step,
                        attempt + 1,
                        retries + 1
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) if required => return Err(e),
                Err(e) => {
                    metrics::counter!(crate::metric_names::TRAIN_CHECKPOINT_FAILURES_TOTAL.name)
                        .increment(1);
                    eprintln!(
                        "ALERT: checkpoint step {} skipped after {} attempts: {e:#}; training goes on, \
                         the newest checkpoint is still step {}",
                        self.step,
                        retries + 1,
                        self.last_checkpoint
                            .map_or("none".to_string(), |s| s.to_string())
                    );
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
