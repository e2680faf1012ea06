//! `[training]`, `[checkpoint]` and `[eval]`: the run's length, mode, saving and evaluation.

use std::path::PathBuf;

use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Synchronous (sample, then train, then sample with the new weights) or asynchronous
/// (sampling continues while the learner trains; old tokens are masked by staleness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrainMode {
    /// On-policy: every batch is sampled with the latest weights.
    Sync,
    /// Off-policy by at most `max_staleness` versions.
    Async,
}

/// `[training]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingSection {
    /// Learner updates to run.
    #[schemars(range(min = 1))]
    pub updates: u64,
    /// `sync` or `async`.
    pub mode: TrainMode,
    /// Async only: tokens sampled more than this many policy versions ago are not trained on.
    pub max_staleness: u64,
    /// Async only: how many batches sampling may run ahead of the learner (AReaL's
    /// `max_head_offpolicyness`). More than `max_staleness` keeps the engine busy through
    /// slow updates at the price of dropping the tokens that grow too old.
    pub batches_ahead: u64,
    /// Async only: train stale tokens with decoupled PPO (AReaL): the trust region around the
    /// learner's weights as the update begins, each token weighted by `π_prox / π_behavior`.
    /// Off: the standard objective around the sampling log-probabilities.
    pub decoupled_ppo: bool,
    /// With `decoupled_ppo`: tokens whose weight `π_prox / π_behavior` exceeds this get
    /// weight 0 (AReaL's `behav_imp_weight_cap`; fresh tokens weigh 1).
    #[schemars(range(min = 1.0))]
    pub behavior_weight_cap: f64,
    /// Seed of everything random (sampling, shuffles, model init of a preset).
    pub seed: u64,
    /// Where checkpoints, the preset model and logs go.
    pub run_dir: PathBuf,
    /// Batches in a row in which every episode failed before the run stops with an error
    /// that names the first episode's reason (0 = never stop).
    pub max_failed_batches: u64,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            updates: 100,
            mode: TrainMode::Sync,
            max_staleness: 1,
            batches_ahead: 1,
            decoupled_ppo: false,
            behavior_weight_cap: 5.0,
            seed: 0,
            run_dir: PathBuf::from("runs/train"),
            max_failed_batches: 3,
        }
    }
}

impl Section for TrainingSection {
    fn rules(&self) -> Result<(), ConfigError> {
        let asynchronous = self.mode == TrainMode::Async;
        if asynchronous && self.max_staleness == 0 {
            return Err(ConfigError::range(
                "max_staleness",
                0,
                ">= 1 with mode = \"async\" (0 would drop every token; use mode = \"sync\")",
            ));
        }
        if asynchronous && self.batches_ahead == 0 {
            return Err(ConfigError::range(
                "batches_ahead",
                0,
                ">= 1 with mode = \"async\" (0 would never sample ahead; use mode = \"sync\")",
            ));
        }
        if self.decoupled_ppo && !asynchronous {
            return Err(ConfigError::range(
                "decoupled_ppo",
                true,
                "false with mode = \"sync\" (every token is on-policy; decoupled PPO corrects stale tokens in mode = \"async\")",
            ));
        }
        if self.run_dir.as_os_str().is_empty() {
            return Err(ConfigError::range("run_dir", "\"\"", "a directory path"));
        }
        Ok(())
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Save after every this many updates (0 = only at the end).
    pub every: u64,
    /// Complete checkpoints kept; older ones are deleted.
    #[schemars(range(min = 1))]
    pub keep_last: usize,
    /// Continue from the newest complete checkpoint in `run_dir` when there is one.
    pub resume: bool,
    /// Attempts after a failed checkpoint write (1 s, 2 s, 4 s, ... apart) before a periodic
    /// checkpoint is skipped with an alert (older checkpoints are kept; the final one fails
    /// the run instead).
    #[schemars(range(max = 10))]
    pub retries: u32,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            every: 10,
            keep_last: 3,
            resume: true,
            retries: 2,
        }
    }
}

impl Section for CheckpointSection {}

/// `[eval]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSection {
    /// Evaluate after every this many updates (0 = never during training).
    pub every: u64,
    /// Held-out questions per evaluation (0 = all).
    pub questions: usize,
    /// Greedy decoding (Agent-R1 validates greedily).
    pub greedy: bool,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            every: 10,
            questions: 200,
            greedy: true,
        }
    }
}

impl Section for EvalSection {}
