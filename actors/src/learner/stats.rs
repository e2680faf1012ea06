//! What one update did, returned to the caller and exported through the `metrics` crate.
//!
//! The same numbers go both ways so that a run's logs (the returned struct, serialised) and
//! its dashboards (Prometheus) never disagree.

use serde::{Deserialize, Serialize};

/// The numbers of one `update` call.
///
/// Losses and per-token statistics are token-weighted means over the micro-batches of the
/// applied optimizer steps; they are 0 when nothing was trained. Skipped steps (whose loss is
/// usually NaN) are left out so that one bad mini-batch does not turn the update's numbers
/// and the exported gauges into NaN; they are counted in `skipped_steps` instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    /// Policy version after the update (incremented when the policy took at least one step).
    pub version: u64,
    /// Whether the policy's weights changed (false during critic warm-up, when every step was
    /// skipped, or when the batch was empty after filtering).
    pub policy_updated: bool,
    /// Whether this update was one of the critic warm-up updates.
    pub critic_warmup: bool,
    /// Set when the caller skipped the update without training (an empty batch, a
    /// non-finite reward): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_reason: Option<String>,
    /// Trajectories received.
    pub trajectories: usize,
    /// Trajectories trained on after filtering.
    pub trajectories_kept: usize,
    /// Groups dropped by the zero-variance filter.
    pub filtered_groups: usize,
    /// Trajectories cut at `max_len`.
    pub truncated: usize,
    /// Real tokens (prompt, actions, observations) in the trained batch.
    pub tokens: u64,
    /// Action tokens trained on (after the staleness filter).
    pub action_tokens: u64,
    /// Mean outcome-plus-process reward of the received trajectories.
    pub reward_mean: f64,
    /// Mean advantage over trained action tokens.
    pub advantage_mean: f64,
    /// PPO clipped surrogate loss.
    pub policy_loss: f64,
    /// Critic loss, when there is a critic.
    pub value_loss: Option<f64>,
    /// Mean entropy of the current policy over action tokens.
    pub entropy: f64,
    /// Mean KL(policy || reference) estimate over action tokens, when a KL is configured.
    pub kl: Option<f64>,
    /// Mean of `old - new` log-probabilities (k1 KL of the sampler to the current policy).
    pub approx_kl: f64,
    /// Fraction of action tokens where the PPO clip was binding.
    pub clip_fraction: f64,
    /// Fraction where the dual clip was binding.
    pub clip_fraction_lower: f64,
    /// Fraction where the value clip was binding, when there is a critic.
    pub value_clip_fraction: Option<f64>,
    /// Mean pre-clip gradient norm of the policy over applied steps.
    pub grad_norm: f64,
    /// Mean pre-clip gradient norm of the critic over applied steps.
    pub critic_grad_norm: Option<f64>,
    /// Policy learning rate of the last step.
    pub lr: f64,
    /// Critic learning rate of the last step.
    pub critic_lr: Option<f64>,
    /// Optimizer steps applied.
    pub optimizer_steps: usize,
    /// Optimizer steps skipped because a loss or gradient was not finite.
    pub skipped_steps: usize,
    /// Episode ids blamed for skipped steps (rows with non-finite inputs or outputs; the whole
    /// mini-batch when no row could be singled out).
    pub skipped_episode_ids: Vec<u64>,
    /// Mean staleness (versions) of the action tokens received.
    pub staleness_mean: f64,
    /// Largest staleness of any action token received.
    pub staleness_max: u64,
    /// Action tokens dropped for being older than `max_staleness`.
    pub stale_tokens_dropped: u64,
    /// Decoupled PPO: mean importance weight `π_prox / π_behavior` over trained tokens
    /// (capped tokens count 0); `None` with the standard objective.
    #[serde(default)]
    pub behavior_weight_mean: Option<f64>,
    /// Decoupled PPO: KL(behavior || prox) over trained tokens (k1 estimate): how far off
    /// the tokens' sampling policies are from the learner's (0 when all are fresh).
    #[serde(default)]
    pub behavior_kl: Option<f64>,
    /// The gap between the engine's sampling log-probabilities and the learner's for the
    /// same weights, over the tokens sampled by the weights the update started from; `None`
    /// when there were none (every token stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<Mismatch>,
    /// Rollout correction's importance weights: their mean over the tokens they applied to
    /// and were kept; `None` with `weight = "off"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction_weight_mean: Option<f64>,
    /// On-policy distillation's numbers, with `[distill]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillStats>,
    /// Action tokens rollout correction's rejection removed from the loss.
    #[serde(default)]
    pub rejected_tokens: u64,
    /// Wall-clock seconds of the update.
    pub duration_seconds: f64,
    /// `tokens` times PPO epochs, per second of update: the learner's throughput.
    pub tokens_per_second: f64,
}

/// The sampler/trainer gap of one update, `δ = log π_learner - log π_engine` per token (see
/// [`crate::algo::mismatch_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Tokens measured.
    pub tokens: u64,
    /// Mean `|δ|`.
    pub abs_mean: f64,
    /// Largest `|δ|`.
    pub abs_max: f64,
    /// k3 estimate of KL(engine || learner).
    pub kl_k3: f64,
    /// Fraction of tokens with `|δ|` over `rollout_correction.report_threshold`.
    pub over_threshold: f64,
    /// The worst sequence's `|Σ δ|`.
    pub sequence_abs_max: f64,
}

/// On-policy distillation in one update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DistillStats {
    /// Mean per-token reverse KL `log π_student - log π_teacher` over the trained tokens
    /// (k1 estimate on the student's samples).
    pub reverse_kl: f64,
    /// The update's tokens per second of the teacher's forward passes.
    pub teacher_tokens_per_second: f64,
}

impl UpdateStats {
    /// Exports the numbers as `agent_r1_learner_*` series: gauges for the latest values,
    /// counters for totals, a histogram for the duration.
    pub fn record_metrics(&self) {
        use metrics::{counter, gauge, histogram};
        counter!(crate::metric_names::LEARNER_UPDATES_TOTAL.name).increment(1);
        counter!(crate::metric_names::LEARNER_OPTIMIZER_STEPS_TOTAL.name)
            .increment(self.optimizer_steps as u64);
        counter!(crate::metric_names::LEARNER_SKIPPED_UPDATES_TOTAL.name)
            .increment(self.skipped_steps as u64);
        counter!(crate::metric_names::LEARNER_TRAJECTORIES_TOTAL.name)
            .increment(self.trajectories as u64);
        counter!(crate::metric_names::LEARNER_FILTERED_GROUPS_TOTAL.name)
            .increment(self.filtered_groups as u64);
        counter!(crate::metric_names::LEARNER_TRUNCATED_TRAJECTORIES_TOTAL.name)
            .increment(self.truncated as u64);
        counter!(crate::metric_names::LEARNER_TOKENS_TOTAL.name).increment(self.tokens);
        counter!(crate::metric_names::LEARNER_ACTION_TOKENS_TOTAL.name)
            .increment(self.action_tokens);
        counter!(crate::metric_names::LEARNER_STALE_TOKENS_DROPPED_TOTAL.name)
            .increment(self.stale_tokens_dropped);
        gauge!(crate::metric_names::LEARNER_POLICY_VERSION.name).set(self.version as f64);
        gauge!(crate::metric_names::LEARNER_REWARD_MEAN.name).set(self.reward_mean);
        gauge!(crate::metric_names::LEARNER_ADVANTAGE_MEAN.name).set(self.advantage_mean);
        gauge!(crate::metric_names::LEARNER_POLICY_LOSS.name).set(self.policy_loss);
        gauge!(crate::metric_names::LEARNER_ENTROPY.name).set(self.entropy);
        gauge!(crate::metric_names::LEARNER_APPROX_KL.name).set(self.approx_kl);
        gauge!(crate::metric_names::LEARNER_CLIP_FRACTION.name).set(self.clip_fraction);
        gauge!(crate::metric_names::LEARNER_CLIP_FRACTION_LOWER.name).set(self.clip_fraction_lower);
        gauge!(crate::metric_names::LEARNER_GRAD_NORM.name).set(self.grad_norm);
        gauge!(crate::metric_names::LEARNER_LEARNING_RATE.name).set(self.lr);
        gauge!(crate::metric_names::LEARNER_STALENESS_MEAN.name).set(self.staleness_mean);
        gauge!(crate::metric_names::LEARNER_STALENESS_MAX.name).set(self.staleness_max as f64);
        gauge!(crate::metric_names::LEARNER_TOKENS_PER_SECOND.name).set(self.tokens_per_second);
        histogram!(crate::metric_names::LEARNER_UPDATE_DURATION_SECONDS.name)
            .record(self.duration_seconds);
        if let Some(v) = self.value_loss {
            gauge!(crate::metric_names::LEARNER_VALUE_LOSS.name).set(v);
        }
        if let Some(v) = self.value_clip_fraction {
            gauge!(crate::metric_names::LEARNER_VALUE_CLIP_FRACTION.name).set(v);
        }
        if let Some(v) = self.critic_grad_norm {
            gauge!(crate::metric_names::LEARNER_CRITIC_GRAD_NORM.name).set(v);
        }
        if let Some(v) = self.critic_lr {
            gauge!(crate::metric_names::LEARNER_CRITIC_LEARNING_RATE.name).set(v);
        }
        if let Some(v) = self.kl {
            gauge!(crate::metric_names::LEARNER_KL.name).set(v);
        }
        if let Some(m) = &self.mismatch {
            counter!(crate::metric_names::LEARNER_MISMATCH_TOKENS_TOTAL.name).increment(m.tokens);
            gauge!(crate::metric_names::LEARNER_MISMATCH_ABS_MEAN.name).set(m.abs_mean);
            gauge!(crate::metric_names::LEARNER_MISMATCH_ABS_MAX.name).set(m.abs_max);
            gauge!(crate::metric_names::LEARNER_MISMATCH_KL.name).set(m.kl_k3);
            gauge!(crate::metric_names::LEARNER_MISMATCH_OVER_THRESHOLD_FRACTION.name)
                .set(m.over_threshold);
            gauge!(crate::metric_names::LEARNER_MISMATCH_SEQUENCE_ABS_MAX.name)
                .set(m.sequence_abs_max);
        }
        if let Some(d) = &self.distill {
            gauge!(crate::metric_names::LEARNER_DISTILL_REVERSE_KL.name).set(d.reverse_kl);
            gauge!(crate::metric_names::LEARNER_TEACHER_TOKENS_PER_SECOND.name)
                .set(d.teacher_tokens_per_second);
        }
        if let Some(v) = self.correction_weight_mean {
            gauge!(crate::metric_names::LEARNER_CORRECTION_WEIGHT_MEAN.name).set(v);
        }
        counter!(crate::metric_names::LEARNER_REJECTED_TOKENS_TOTAL.name)
            .increment(self.rejected_tokens);
    }
}
