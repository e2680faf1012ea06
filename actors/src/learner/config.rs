//! The learner's settings, with Agent-R1's defaults where it has them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::algo::{KlKind, LossAgg, PpoClip};
use crate::{Error, Result};

/// How advantages are estimated from a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// Token-level GAE with a critic (PPO); tool tokens are skipped.
    Gae,
    /// Step-level GAE with a critic: one decision per model turn, value read at the turn's
    /// first token, advantage broadcast to the turn's tokens.
    StepGae,
    /// Group-normalised outcome (GRPO; Dr.GRPO with `grpo_norm_by_std = false`).
    #[default]
    Grpo,
    /// Leave-one-out group baseline.
    Rloo,
    /// Discounted returns whitened over the batch (REINFORCE++).
    ReinforcePp,
    /// Group-mean baseline, whitened over the batch (REINFORCE++-baseline).
    ReinforcePpBaseline,
}

impl Estimator {
    /// Whether the estimator needs a critic (a value head).
    pub fn needs_critic(self) -> bool {
        matches!(self, Estimator::Gae | Estimator::StepGae)
    }

    /// The name used in configs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Estimator::Gae => "gae",
            Estimator::StepGae => "step_gae",
            Estimator::Grpo => "grpo",
            Estimator::Rloo => "rloo",
            Estimator::ReinforcePp => "reinforce_pp",
            Estimator::ReinforcePpBaseline => "reinforce_pp_baseline",
        }
    }
}

/// Where the KL to the reference policy enters the objective (verl's `use_kl_in_reward` versus
/// `use_kl_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// Subtracted per token from the rewards before advantages are estimated.
    InReward,
    /// Aggregated over action tokens and added to the policy loss.
    Loss,
}

/// KL regularisation towards the frozen reference model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KlConfig {
    /// In the reward or as a loss.
    pub placement: KlPlacement,
    /// Estimator: `k1`, `k2` or `k3` (`low_var_kl`, Agent-R1's choice for the KL loss).
    #[serde(with = "kl_kind_serde")]
    pub kind: KlKind,
    /// Coefficient (0.001 in Agent-R1).
    pub coef: f64,
}

impl Default for KlConfig {
    fn default() -> Self {
        Self {
            placement: KlPlacement::Loss,
            kind: KlKind::K3,
            coef: 0.001,
        }
    }
}

/// Everything the learner needs to turn a batch of trajectories into optimizer steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnerConfig {
    /// Advantage estimator.
    pub estimator: Estimator,
    /// GRPO divides by the group's standard deviation; `false` is Dr.GRPO.
    pub grpo_norm_by_std: bool,
    /// Discount (1.0 in Agent-R1).
    pub gamma: f64,
    /// GAE lambda (1.0 in Agent-R1).
    pub lambda: f64,
    /// Drop groups whose trajectories all scored the same (DAPO's dynamic sampling): they
    /// carry no group-relative signal but cost a backward pass.
    pub filter_zero_variance_groups: bool,
    /// KL towards the reference model; `None` trains without it (no reference needed).
    pub kl: Option<KlConfig>,
    /// Passes over the batch per update.
    pub ppo_epochs: usize,
    /// Trajectories per optimizer step (0 = the whole batch in one step).
    pub mini_batch_size: usize,
    /// Trajectories per forward/backward pass; gradients accumulate over a mini-batch.
    pub micro_batch_size: usize,
    /// Positions whose vocabulary logits exist at once when log-probabilities and entropies
    /// are computed (and backpropagated): the bound on the learner's logits memory,
    /// `logits_chunk_tokens x vocab_size` floats, whatever the sequence length.
    pub logits_chunk_tokens: usize,
    /// Keep only each decoder layer's input during the forward pass and recompute the
    /// layer in the backward pass (one more forward): activation memory of one layer instead
    /// of all of them.
    pub recompute: bool,
    /// When nonzero, micro-batches are packed by this many padded tokens (sequences x the
    /// longest one) instead of `micro_batch_size` sequences; at least `max_len`.
    pub max_tokens_per_micro_batch: usize,
    /// Peak policy learning rate (AdamW).
    pub actor_lr: f64,
    /// Peak critic learning rate (AdamW); also the value head's rate when it shares the trunk.
    pub critic_lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW betas.
    pub betas: (f64, f64),
    /// Gradient L2-norm clip, per optimizer.
    pub grad_clip: f64,
    /// Optimizer steps of linear learning-rate warm-up (0 = none), counted per optimizer.
    pub lr_warmup_steps: usize,
    /// Updates during which only the critic trains (the policy stays as it is), so that the
    /// first policy steps see sensible values. Only with a critic.
    pub critic_warmup_updates: usize,
    /// PPO clip settings (ratio low/high, dual clip).
    #[serde(with = "ppo_clip_serde")]
    pub clip: PpoClip,
    /// Value clip (`cliprange_value`).
    pub cliprange_value: f64,
    /// Weight of the value loss in the critic's objective.
    pub value_loss_coef: f64,
    /// Entropy bonus coefficient (0 in Agent-R1).
    pub entropy_coef: f64,
    /// How per-token losses become a scalar.
    #[serde(with = "loss_agg_serde")]
    pub loss_agg: LossAgg,
    /// Sampling temperature the engine used: logits are divided by it before log-probs are
    /// recomputed, or the importance ratio would compare different distributions.
    pub temperature: f64,
    /// Longest token stream trained on; longer trajectories keep their head.
    pub max_len: usize,
    /// Async mode: tokens sampled more than this many versions ago are masked out.
    /// `None` keeps every token (synchronous training).
    pub max_staleness: Option<u64>,
    /// Decoupled PPO (AReaL) for tokens sampled by older weights: when set, the trust region
    /// is taken around the learner's weights as the update begins (their log-probabilities
    /// are recomputed first) and each token's loss is weighted by `π_prox / π_behavior`;
    /// tokens whose weight exceeds this cap get weight 0. `None`: the standard objective
    /// around the log-probabilities the engine sampled with.
    pub behavior_weight_cap: Option<f64>,
    /// Seed of the mini-batch shuffle.
    pub seed: u64,
    /// Policy version of the weights the learner starts from (the engine's version), so
    /// that staleness is measured on the same clock after a resume.
    pub initial_version: u64,
    /// Requests waiting for the learner thread before callers are refused.
    pub queue_capacity: usize,
    /// Longest a caller waits for an update (or a state dict) to come back.
    pub request_timeout: Duration,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        Self {
            estimator: Estimator::Grpo,
            grpo_norm_by_std: true,
            gamma: 1.0,
            lambda: 1.0,
            filter_zero_variance_groups: false,
            kl: None,
            ppo_epochs: 1,
            mini_batch_size: 0,
            micro_batch_size: 8,
            logits_chunk_tokens: 1024,
            recompute: false,
            max_tokens_per_micro_batch: 0,
            actor_lr: 1e-6,
            critic_lr: 1e-5,
            weight_decay: 0.01,
            betas: (0.9, 0.999),
            grad_clip: 1.0,
            lr_warmup_steps: 0,
            critic_warmup_updates: 0,
            clip: PpoClip::default(),
            cliprange_value: 0.5,
            value_loss_coef: 1.0,
            entropy_coef: 0.0,
            loss_agg: LossAgg::TokenMean,
            temperature: 1.0,
            max_len: 4096,
            max_staleness: None,
            behavior_weight_cap: None,
            seed: 0,
            initial_version: 0,
            queue_capacity: 4,
            request_timeout: Duration::from_secs(3600),
        }
    }
}

impl LearnerConfig {
    /// Checks ranges, naming the offending setting.
    pub fn validate(&self) -> Result<()> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(
                    name,
                    format!("must be a finite number > 0, got {v}"),
                ))
            }
        };
        let non_negative = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(
                    name,
                    format!("must be a finite number >= 0, got {v}"),
                ))
            }
        };
        positive("actor_lr", self.actor_lr)?;
        positive("critic_lr", self.critic_lr)?;
        positive("grad_clip", self.grad_clip)?;
        positive("temperature", self.temperature)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("gamma", self.gamma)?;
        non_negative("lambda", self.lambda)?;
        non_negative("cliprange_value", self.cliprange_value)?;
        non_negative("value_loss_coef", self.value_loss_coef)?;
        if !self.entropy_coef.is_finite() {
            return Err(Error::invalid("entropy_coef", "must be finite"));
        }
        for (name, b) in [("betas.0", self.betas.0), ("betas.1", self.betas.1)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::invalid(name, format!("must be in [0, 1), got {b}")));
            }
        }
        if let Some(kl) = &self.kl {
            non_negative("kl.coef", kl.coef)?;
        }
        if let Some(cap) = self.behavior_weight_cap {
            if !(cap.is_finite() && cap >= 1.0) {
                return Err(Error::invalid(
                    "behavior_weight_cap",
                    format!("must be a finite number >= 1 (fresh tokens weigh 1), got {cap}"),
                ));
            }
        }
        if self.ppo_epochs == 0 {
            return Err(Error::invalid("ppo_epochs", "must be at least 1"));
        }
        if self.micro_batch_size == 0 {
            return Err(Error::invalid("micro_batch_size", "must be at least 1"));
        }
        if self.logits_chunk_tokens == 0 {
            return Err(Error::invalid("logits_chunk_tokens", "must be at least 1"));
        }
        if self.max_len < 2 {
            return Err(Error::invalid("max_len", "must be at least 2"));
        }
        if self.max_tokens_per_micro_batch != 0 && self.max_tokens_per_micro_batch < self.max_len {
            return Err(Error::invalid(
                "max_tokens_per_micro_batch",
                format!(
                    "{} is below the longest sequence trained on ({} tokens): use 0 (off) or \
                     at least {}",
                    self.max_tokens_per_micro_batch, self.max_len, self.max_len
                ),
            ));
        }
        if self.queue_capacity == 0 {
            return Err(Error::invalid("queue_capacity", "must be at least 1"));
        }
        let c = &self.clip;
        if !(c.clip_ratio_low >= 0.0 && c.clip_ratio_high >= 0.0 && c.clip_ratio_c > 1.0) {
            return Err(Error::invalid(
                "clip",
                "clip_ratio_low/high must be >= 0 and clip_ratio_c > 1",
            ));
        }
        Ok(())
    }
}

/// Serde for enums that already have `Display` + `FromStr` with verl's names, so configs use
/// the same spelling as verl's YAML.
macro_rules! display_fromstr_serde {
    ($module:ident, $ty:ty) => {
        mod $module {
            use serde::{Deserialize, Deserializer, Serializer};

            pub(super) fn serialize<S: Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(v.as_str())
            }

            pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

display_fromstr_serde!(kl_kind_serde, crate::algo::KlKind);
display_fromstr_serde!(loss_agg_serde, crate::algo::LossAgg);

/// `PpoClip` as a plain map (it lives in `algo`, which has no serde).
mod ppo_clip_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::algo::PpoClip;

    #[derive(Serialize, Deserialize)]
    struct Repr {
        clip_ratio_low: f64,
        clip_ratio_high: f64,
        clip_ratio_c: f64,
    }

    pub(super) fn serialize<S: Serializer>(c: &PpoClip, s: S) -> Result<S::Ok, S::Error> {
        Repr {
            clip_ratio_low: c.clip_ratio_low,
            clip_ratio_high: c.clip_ratio_high,
            clip_ratio_c: c.clip_ratio_c,
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PpoClip, D::Error> {
        let r = Repr::deserialize(d)?;
        Ok(PpoClip {
            clip_ratio_low: r.clip_ratio_low,
            clip_ratio_high: r.clip_ratio_high,
            clip_ratio_c: r.clip_ratio_c,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_agent_r1_and_round_trip_through_json() {
        let c = LearnerConfig {
            kl: Some(KlConfig::default()),
            estimator: Estimator::StepGae,
            ..Default::default()
        };
        assert_eq!(c.actor_lr, 1e-6);
        assert_eq!(c.critic_lr, 1e-5);
        assert_eq!(c.weight_decay, 0.01);
        assert_eq!(c.grad_clip, 1.0);
        assert_eq!(c.clip.clip_ratio_c, 3.0);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["estimator"], "step_gae");
        assert_eq!(json["kl"]["kind"], "low_var_kl");
        assert_eq!(json["loss_agg"], "token-mean");
        let back: LearnerConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
        c.validate().unwrap();
    }

    #[test]
    fn validate_names_the_bad_setting() {
        let bad = LearnerConfig {
            micro_batch_size: 0,
            ..Default::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("micro_batch_size"), "{err}");
        let bad = LearnerConfig {
            actor_lr: f64::NAN,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("actor_lr"));
    }
}
