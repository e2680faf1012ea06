//! The learner: turns batches of trajectories into policy (and critic) updates.
//!
//! It owns the trainable policy, an optional critic (a value head on the policy's trunk or a
//! separate model), an optional frozen reference for the KL term, and their AdamW
//! optimizers (and a frozen teacher for on-policy distillation, `distill`), on a dedicated OS thread (`thread`) owned by a supervised actor
//! reached through [`LearnerRef`] (a panic mid-update is reported by its supervisor, see
//! [`actor`]). One update:
//! trajectories become right-padded tensors (`batch`), stale tokens are dropped in async
//! mode (`staleness`), advantages come from the configured estimator (`advantages`),
//! then `ppo_epochs` passes over shuffled mini-batches with gradient accumulation
//! over micro-batches (`micro_batches`: a sequence count or a token budget; activations
//! optionally recomputed per layer) ([`trainer`]). Log-probabilities are recomputed under the current policy; the importance
//! ratio is taken against the log-probabilities the engine sampled with. A step whose loss or
//! gradient is not finite is skipped, counted and logged, never applied. After an update the
//! caller publishes the new weights to the engine ([`LearnerRef::publish`]).

pub mod actor;
mod advantages;
pub(crate) mod batch;
pub mod config;
mod critic_input;
mod critic_prefix;
mod data_parallel;
mod distill;
mod estimation_layout;
mod layer_shards;
mod micro_batches;
mod optim;
mod staleness;
pub mod stats;
mod thread;
mod token_stats;
pub mod trainer;

pub use actor::{LearnerRef, LearnerStart, LoadModels};
pub use config::{
    AlgorithmConfig, CriticConfig, Estimator, KlConfig, KlPlacement, LearnerConfig, MemoryConfig,
};
pub use critic_prefix::CriticPrefix;
pub use data_parallel::{RankJoin, ShardMode};
pub use distill::{DistillCombine, DistillConfig};
pub use stats::{DistillStats, Mismatch, UpdateStats};
pub use thread::{BeforeUpdate, PolicyWeights};
pub use trainer::{check_rewards, Learner, LearnerModels, Reference, CRITIC_DIR};
