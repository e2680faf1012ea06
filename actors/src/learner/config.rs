//! The learner's settings, with Agent-R1's defaults where it has them.
//!
//! [`AlgorithmConfig`] is a training config's `[algorithm]`, [`MemoryConfig`] its `[learner]`
//! and [`CriticConfig`] its `[critic]`, as they are: a config file is read into these types,
//! not into copies of them. [`LearnerConfig`] adds what the learner takes from the rest of a
//! run (temperature, lengths, staleness, seed).

use std::time::Duration;

use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::algo::{KlKind, LossAgg, PpoClip, RolloutCorrection};
use crate::model::LoraConfig;
use crate::Result;

/// How advantages are estimated from a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
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

    /// Whether the estimator compares the episodes of a group (so groups need two or more).
    pub fn compares_groups(self) -> bool {
        matches!(
            self,
            Estimator::Grpo | Estimator::Rloo | Estimator::ReinforcePpBaseline
        )
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
/// `use_kl_loss`), or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// No KL term (no reference model is kept).
    Off,
    /// Added to the policy loss (Agent-R1's `use_kl_loss`).
    Loss,
    /// Subtracted per token from the rewards before advantages are estimated
    /// (`use_kl_in_reward`).
    InReward,
}

/// `[algorithm.kl]`: KL regularisation towards the frozen reference model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KlConfig {
    /// Where the KL term goes: `off`, `loss` or `in_reward`.
    pub placement: KlPlacement,
    /// Estimator: `k1` (`kl`), `k2` (`mse`) or `low_var_kl` (`k3`, Agent-R1's choice).
    pub kind: KlKind,
    /// Coefficient (0.001 in Agent-R1).
    #[schemars(range(min = 0.0))]
    pub coef: f64,
}

impl KlConfig {
    /// No KL term.
    pub const OFF: KlConfig = KlConfig {
        placement: KlPlacement::Off,
        kind: KlKind::K3,
        coef: 0.0,
    };

    /// The settings when a KL term is on, `None` with `placement = off`.
    pub fn active(&self) -> Option<&KlConfig> {
        (self.placement != KlPlacement::Off).then_some(self)
    }
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

/// `[algorithm]`: the advantage estimator, the PPO objective and the optimiser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// Advantage estimator: `gae`, `step_gae`, `grpo`, `rloo`, `reinforce_pp` or
    /// `reinforce_pp_baseline`.
    pub estimator: Estimator,
    /// GRPO divides by the group's standard deviation; `false` is Dr.GRPO.
    pub grpo_norm_by_std: bool,
    /// Discount (1.0 in Agent-R1).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub gamma: f64,
    /// GAE lambda (1.0 in Agent-R1).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub lambda: f64,
    /// Drop groups whose trajectories all scored the same (DAPO's dynamic sampling): they
    /// carry no group-relative signal but cost a backward pass.
    pub filter_zero_variance_groups: bool,
    /// KL towards the reference model.
    pub kl: KlConfig,
    /// Passes over the batch per update.
    #[schemars(range(min = 1))]
    pub ppo_epochs: usize,
    /// Trajectories per optimizer step (0 = the whole batch in one step).
    pub mini_batch_size: usize,
    /// Trajectories per forward/backward pass; gradients accumulate over a mini-batch (see
    /// also `learner.max_tokens_per_micro_batch`).
    #[schemars(range(min = 1))]
    pub micro_batch_size: usize,
    /// Peak policy learning rate (AdamW).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub actor_lr: f64,
    /// Peak critic learning rate (AdamW); also the value head's rate when it shares the trunk.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub critic_lr: f64,
    /// AdamW decoupled weight decay.
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// AdamW betas.
    #[schemars(extend("items" = { "type": "number", "minimum": 0, "exclusiveMaximum": 1 }))]
    pub betas: [f64; 2],
    /// Gradient L2-norm clip, per optimizer.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub grad_clip: f64,
    /// Optimizer steps of linear learning-rate warm-up (0 = none), counted per optimizer.
    pub lr_warmup_steps: usize,
    /// Updates during which only the critic trains (the policy stays as it is), so that the
    /// first policy steps see sensible values. Only with a critic.
    pub critic_warmup_updates: usize,
    /// The ratio is clipped below at `1 - clip_ratio_low` (verl's default 0.2).
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1))]
    pub clip_ratio_low: f64,
    /// The ratio is clipped above at `1 + clip_ratio_high` (0.2; DAPO's "clip higher" raises
    /// it to 0.28).
    #[schemars(range(min = 0.0))]
    pub clip_ratio_high: f64,
    /// Dual clip: for negative advantages the loss is capped at `-A * clip_ratio_c`.
    #[schemars(extend("exclusiveMinimum" = 1))]
    pub clip_ratio_c: f64,
    /// Value clip (`cliprange_value`).
    #[schemars(range(min = 0.0))]
    pub cliprange_value: f64,
    /// Weight of the value loss in the critic's objective.
    #[schemars(range(min = 0.0))]
    pub value_loss_coef: f64,
    /// Entropy bonus coefficient (0 in Agent-R1).
    pub entropy_coef: f64,
    /// How per-token losses become a scalar: `token-mean`, `seq-mean-token-sum` or
    /// `seq-mean-token-mean`.
    pub loss_agg: LossAgg,
    /// How the gap between the engine's sampling log-probabilities and the learner's is
    /// measured and corrected (`[algorithm.rollout_correction]`).
    pub rollout_correction: RolloutCorrection,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        let clip = PpoClip::default();
        Self {
            estimator: Estimator::Grpo,
            grpo_norm_by_std: true,
            gamma: 1.0,
            lambda: 1.0,
            filter_zero_variance_groups: false,
            kl: KlConfig::default(),
            ppo_epochs: 1,
            mini_batch_size: 0,
            micro_batch_size: 8,
            actor_lr: 1e-6,
            critic_lr: 1e-5,
            weight_decay: 0.01,
            betas: [0.9, 0.999],
            grad_clip: 1.0,
            lr_warmup_steps: 0,
            // Agent-R1 trains the critic alone for 5 updates before PPO's first policy step.
            critic_warmup_updates: 5,
            clip_ratio_low: clip.clip_ratio_low,
            clip_ratio_high: clip.clip_ratio_high,
            clip_ratio_c: clip.clip_ratio_c,
            cliprange_value: 0.5,
            value_loss_coef: 1.0,
            entropy_coef: 0.0,
            loss_agg: LossAgg::TokenMean,
            rollout_correction: RolloutCorrection::default(),
        }
    }
}

impl Section for AlgorithmConfig {}

impl AlgorithmConfig {
    /// The PPO clip settings.
    pub fn clip(&self) -> PpoClip {
        PpoClip {
            clip_ratio_low: self.clip_ratio_low,
            clip_ratio_high: self.clip_ratio_high,
            clip_ratio_c: self.clip_ratio_c,
        }
    }

    /// Critic-only updates at the start: `critic_warmup_updates` with a critic, else none.
    pub fn critic_warmup(&self) -> usize {
        if self.estimator.needs_critic() {
            self.critic_warmup_updates
        } else {
            0
        }
    }
}

/// `[learner]`: how the learner bounds its memory. None of these changes the update (the
/// gradients are the same up to float summation order); they trade time for memory. The
/// memory planner (`check-config`, and `train` at start-up) says which one to turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Positions whose vocabulary logits exist at once: the logits memory is about this many
    /// x vocab_size x 4 bytes, a few times over, whatever the sequence length.
    #[schemars(range(min = 1))]
    pub logits_chunk_tokens: usize,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations:
    /// one more forward pass, one layer's activations instead of all.
    pub recompute: bool,
    /// Pack micro-batches by padded tokens (sequences x the longest) instead of
    /// `algorithm.micro_batch_size` sequences; 0 = off, otherwise at least the longest
    /// sequence trained on (`rollout.max_context_length`).
    pub max_tokens_per_micro_batch: usize,
    /// Refuse to start when the memory planner's predicted peak exceeds the device's memory
    /// (`check-config` prints the plan either way).
    pub check_memory: bool,
    /// Learner ranks: processes that each train a share of every mini-batch (split by
    /// tokens) and sum their gradients through torch.distributed (Gloo, on the CPU); rank 0
    /// is the trainer's learner and owns checkpoints and weight publication. 1 = one process.
    #[schemars(range(min = 1, max = 64))]
    pub ranks: usize,
    /// What each rank keeps with `ranks > 1`: `replicated` (the whole optimizer),
    /// `optimizer_state` (float32 masters and AdamW moments split across the ranks, ZeRO-1:
    /// their memory divided by `ranks`) or `parameters` (also the decoder layers' weights and
    /// gradients, each layer gathered only while it runs, FSDP style; needs `recompute`).
    pub shard: crate::learner::ShardMode,
    /// Longest a rank waits for the others (joining, and in each collective) before the run
    /// fails with the rank named; a rank killed mid-collective is noticed at once.
    #[schemars(range(min = 5, max = 86400))]
    pub rank_timeout_s: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            logits_chunk_tokens: 1024,
            recompute: false,
            max_tokens_per_micro_batch: 0,
            check_memory: true,
            ranks: 1,
            shard: crate::learner::ShardMode::Replicated,
            rank_timeout_s: 300,
        }
    }
}

impl Section for MemoryConfig {}

impl MemoryConfig {
    /// The rule between packing and the longest sequence trained on (`max_len` tokens).
    pub fn fits(&self, max_len: usize) -> std::result::Result<(), ConfigError> {
        let packed = self.max_tokens_per_micro_batch;
        if packed != 0 && packed < max_len {
            return Err(ConfigError::range(
                "max_tokens_per_micro_batch",
                packed,
                format!("0 (off) or at least {max_len}, the longest sequence trained on"),
            ));
        }
        Ok(())
    }
}

/// `[critic]`: the critic of the estimators that have one (`gae`, `step_gae`). By default it
/// is a value head on the policy's own trunk; `separate = true` trains a model of its own, as
/// Agent-R1 does: a copy of the policy's starting weights (or `model`) with a value head, at
/// `algorithm.critic_lr` with its own AdamW, checkpointed beside the policy (`policy/critic`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CriticConfig {
    /// Train a separate critic model instead of a value head on the policy's trunk.
    pub separate: bool,
    /// The separate critic's starting weights (a model directory; default: the policy's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<std::path::PathBuf>,
    /// The asymmetric critic: text the separate critic reads before every row, rendered from
    /// the task's fields (`{question}`, `{answer}`, `{answers}`, `{id}`, `{data_source}`,
    /// `{extra.KEY}`), e.g. "Gold answer: {answer}\n"; the policy never sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The longest a rendered prefix may be, in tokens.
    #[schemars(range(min = 1))]
    pub prefix_max_tokens: usize,
    /// LoRA on the separate critic (`[critic.lora]`): adapters and the value head train
    /// beside its frozen base, as `[lora]` does for the policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

impl Default for CriticConfig {
    fn default() -> Self {
        Self {
            separate: false,
            model: None,
            prefix: None,
            prefix_max_tokens: 256,
            lora: None,
        }
    }
}

impl Section for CriticConfig {
    fn rules(&self) -> std::result::Result<(), ConfigError> {
        if let Some(lora) = &self.lora {
            if !self.separate {
                return Err(ConfigError::new(
                    "lora",
                    "is only read by a separate critic: set `separate = true` (a value head on \
                     the policy's trunk trains with the policy's [lora])",
                ));
            }
            lora.rules().map_err(|e| e.under("lora"))?;
            if lora.dropout > 0.0 {
                return Err(ConfigError::new(
                    "lora.dropout",
                    format!("got {}; allowed: 0 on the critic's adapters", lora.dropout),
                ));
            }
        }
        if self.model.is_some() && !self.separate {
            return Err(ConfigError::new(
                "model",
                "is only read with `separate = true`",
            ));
        }
        if let Some(prefix) = &self.prefix {
            if !self.separate {
                return Err(ConfigError::new(
                    "prefix",
                    "is only read by a separate critic: set `separate = true`",
                ));
            }
            agent_r1_envs::task_template::TaskTemplate::parse(prefix)
                .map_err(|e| ConfigError::new("prefix", e))?;
        }
        Ok(())
    }
}

/// Everything the learner needs to turn a batch of trajectories into optimizer steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnerConfig {
    /// Estimator, objective and optimiser.
    pub algorithm: AlgorithmConfig,
    /// Memory bounds.
    pub memory: MemoryConfig,
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
    /// On-policy distillation from a teacher (`[distill]`); the teacher model itself comes
    /// with [`super::LearnerModels`].
    pub distill: Option<super::DistillConfig>,
}

impl LearnerConfig {
    /// Checks every setting; errors name `algorithm.KEY`, `learner.KEY` (the memory bounds)
    /// or the field of this type.
    pub fn validate(&self) -> Result<()> {
        self.algorithm
            .validate()
            .map_err(|e| e.under("algorithm"))?;
        self.memory.validate().map_err(|e| e.under("learner"))?;
        let invalid = |key: &str, given: String, allowed: &str| {
            Err(ConfigError::range(key, given, allowed).into())
        };
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return invalid(
                "temperature",
                self.temperature.to_string(),
                "a finite number > 0",
            );
        }
        if self.max_len < 2 {
            return invalid("max_len", self.max_len.to_string(), "an integer >= 2");
        }
        if let Some(cap) = self.behavior_weight_cap {
            if !(cap.is_finite() && cap >= 1.0) {
                return invalid(
                    "behavior_weight_cap",
                    cap.to_string(),
                    "a finite number >= 1 (fresh tokens weigh 1)",
                );
            }
        }
        if self.queue_capacity == 0 {
            return invalid("queue_capacity", "0".into(), "an integer >= 1");
        }
        if let Some(d) = &self.distill {
            d.rules().map_err(|e| e.under("distill"))?;
        }
        self.memory
            .fits(self.max_len)
            .map_err(|e| e.under("learner").into())
    }
}

/// The learner config of [`crate::testing::learner_config`]: here, so that this crate's own
/// unit tests reach it without an import back from `testing`.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn fixture() -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig::default(),
        memory: MemoryConfig::default(),
        temperature: 1.0,
        max_len: 4096,
        max_staleness: None,
        behavior_weight_cap: None,
        seed: 0,
        initial_version: 0,
        queue_capacity: 4,
        request_timeout: Duration::from_secs(3600),
        distill: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_agent_r1_and_round_trip_through_json() {
        let c = LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator: Estimator::StepGae,
                ..Default::default()
            },
            ..fixture()
        };
        let a = &c.algorithm;
        assert_eq!(a.actor_lr, 1e-6);
        assert_eq!(a.critic_lr, 1e-5);
        assert_eq!(a.weight_decay, 0.01);
        assert_eq!(a.grad_clip, 1.0);
        assert_eq!(a.clip_ratio_c, 3.0);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["algorithm"]["estimator"], "step_gae");
        assert_eq!(json["algorithm"]["kl"]["kind"], "low_var_kl");
        assert_eq!(json["algorithm"]["loss_agg"], "token-mean");
        let back: LearnerConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
        c.validate().unwrap();
    }

    #[test]
    fn enums_read_verl_spellings_and_refuse_others_naming_the_allowed_ones() {
        let kl: KlConfig = serde_json::from_value(serde_json::json!({"kind": "mse"})).unwrap();
        assert_eq!(kl.kind, KlKind::K2);
        let kl: KlConfig = serde_json::from_value(serde_json::json!({"kind": "k3"})).unwrap();
        assert_eq!(kl.kind, KlKind::K3);
        let err = serde_json::from_value::<AlgorithmConfig>(
            serde_json::json!({"loss_agg": "token_mean"}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("token-mean") && err.contains("seq-mean-token-sum"),
            "{err}"
        );
    }

    #[test]
    fn validate_names_the_bad_setting_with_its_section() {
        let bad = LearnerConfig {
            algorithm: AlgorithmConfig {
                micro_batch_size: 0,
                ..Default::default()
            },
            ..fixture()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("algorithm.micro_batch_size"), "{err}");
        let bad = LearnerConfig {
            algorithm: AlgorithmConfig {
                actor_lr: f64::NAN,
                ..Default::default()
            },
            ..fixture()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("algorithm.actor_lr"));
        let bad = LearnerConfig {
            memory: MemoryConfig {
                max_tokens_per_micro_batch: 100,
                ..Default::default()
            },
            max_len: 200,
            ..fixture()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("learner.max_tokens_per_micro_batch"), "{err}");
    }

    #[test]
    fn one_rule_per_key_clip_ratio_low_below_one_and_gamma_at_most_one() {
        for (a, key) in [
            (
                AlgorithmConfig {
                    clip_ratio_low: 1.0,
                    ..Default::default()
                },
                "clip_ratio_low",
            ),
            (
                AlgorithmConfig {
                    gamma: 1.5,
                    ..Default::default()
                },
                "gamma",
            ),
            (
                AlgorithmConfig {
                    clip_ratio_c: 1.0,
                    ..Default::default()
                },
                "clip_ratio_c",
            ),
        ] {
            assert_eq!(a.validate().unwrap_err().key, key);
        }
    }
}
