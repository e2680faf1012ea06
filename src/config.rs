//! The `agent-r1 train` config: one TOML file, checked completely before anything heavy starts.
//!
//! A training run takes hours; a typo found after the model has loaded wastes minutes and a
//! silently ignored key wastes the run. So every section rejects unknown keys, types are
//! checked by serde (the error names the key path, e.g. `algorithm.ppo_epochs`, and the
//! line), and [`TrainConfig::validate`] checks ranges, cross-section rules and (optionally)
//! that the files named exist. Every error is one [`ConfigError`]: the key, what was given,
//! what is allowed.
//!
//! Sections (all optional except `[model]` and `[env]`; defaults follow Agent-R1):
//! `[model]`, `[env]` (+ `[env.dataset]`, `[env.world]`, `[env.options]`), `[tools.NAME]`
//! (read exactly as [`agent_r1_envs::tools::ToolsConfig`] reads them), `[algorithm]`
//! (+ `[algorithm.kl]`), `[rollout]`, `[training]`, `[checkpoint]`, `[eval]`, `[metrics]`.
//! Relative paths are relative to the working directory, as for tools.
//!
//! The training loop reads the typed sections directly and gets the library-level settings
//! from [`TrainConfig::learner_config`], [`TrainConfig::tools_config`],
//! [`TrainConfig::env_options`] and [`TrainConfig::placement`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use agent_r1_actors::algo::{KlKind, LossAgg, PpoClip};
use agent_r1_actors::learner::{Estimator, KlConfig, KlPlacement, LearnerConfig};
use agent_r1_actors::model::Placement;
use agent_r1_actors::sft::SftConfig;
use agent_r1_actors::stall::StallConfig;
use agent_r1_envs::dataset::LoadOptions;
use agent_r1_envs::synthetic::SyntheticConfig;
use agent_r1_envs::tool_call::ToolCallFormat;
use agent_r1_envs::tools::ToolsConfig;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::registries::Registries;

/// One problem with a config: where (`key`, and `line`/`column` when the TOML parser knows
/// them) and what (given versus allowed, in `message`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file, when the config came from one.
    pub file: Option<PathBuf>,
    /// Dotted key path, e.g. `algorithm.ppo_epochs` (empty for a document-level error).
    pub key: String,
    /// 1-based line and column of the offending text, when known.
    pub position: Option<(usize, usize)>,
    /// What was given and what is allowed.
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            key: key.into(),
            position: None,
            message: message.into(),
        }
    }

    /// `key`: got `given`; allowed: `allowed`.
    fn range(key: &str, given: impl fmt::Display, allowed: &str) -> Self {
        Self::new(key, format!("got {given}; allowed: {allowed}"))
    }

    fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some((line, column)) = self.position {
                write!(f, ":{line}:{column}")?;
            }
            write!(f, ": ")?;
        } else if let Some((line, column)) = self.position {
            write!(f, "line {line}, column {column}: ")?;
        }
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "`{}`: {}", self.key, self.message)
        }
    }
}

/// Keys that moved, with where to: an old config gets told where the key went.
const MOVED_KEYS: &[(&str, &str)] = &[
    ("training.update_timeout_secs", "stall.learner_secs"),
    ("training.publish_timeout_secs", "stall.publish_secs"),
];

/// Built-in training configs, `agent-r1 train --preset NAME`: the commented files in
/// `examples/`, compiled in so that `make demo` needs no path.
pub const PRESETS: &[(&str, &str)] = &[
    ("demo", include_str!("../examples/demo.toml")),
    ("math", include_str!("../examples/math.toml")),
];

/// Whether [`TrainConfig::validate`] checks that named files exist. `Skip` lets a config be
/// checked on a machine without the data (CI, or before a download).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileCheck {
    /// Model directories and dataset files must exist.
    Require,
    /// Paths are not looked at.
    Skip,
}

/// The whole training config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The policy model.
    pub model: ModelSection,
    /// The environment and its data.
    pub env: EnvSection,
    /// Tools by table name (`[tools.NAME]`); see [`agent_r1_envs::tools::ToolsConfig`].
    #[serde(default)]
    pub tools: BTreeMap<String, toml::Table>,
    /// A scorer that gives the reward in place of the env's (`[scorer] type = "http_judge"`,
    /// or a registered kind); its other keys are the kind's options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<toml::Table>,
    /// Advantage estimator and optimiser.
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// Where the critic of `gae` / `step_gae` lives.
    #[serde(default)]
    pub critic: CriticSection,
    /// How the learner bounds its memory.
    #[serde(default)]
    pub learner: LearnerSection,
    /// How episodes are sampled.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// Length and mode of the run.
    #[serde(default)]
    pub training: TrainingSection,
    /// Checkpoint cadence and retention.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Held-out evaluation.
    #[serde(default)]
    pub eval: EvalSection,
    /// Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// Supervised warm start before RL (synthetic env only).
    #[serde(default)]
    pub warm_start: WarmStartSection,
    /// The stall detector's deadline per stage.
    #[serde(default)]
    pub stall: StallConfig,
}

/// `[critic]`: the critic of the estimators that have one (`gae`, `step_gae`). By default it
/// is a value head on the policy's own trunk; `separate = true` trains a model of its own, as
/// Agent-R1 does: a copy of the policy's starting weights (or `model`) with a value head, at
/// `algorithm.critic_lr` with its own AdamW, checkpointed beside the policy (`policy/critic`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticSection {
    /// Train a separate critic model instead of a value head on the policy's trunk.
    pub separate: bool,
    /// The separate critic's starting weights (a model directory; default: the policy's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
}

/// `[learner]`: how the learner bounds its memory. None of these changes the update (the
/// gradients are the same up to float summation order); they trade time for memory. The
/// memory planner (`check-config`, and `train` at start-up) says which one to turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerSection {
    /// Positions whose vocabulary logits exist at once (>= 1): the logits memory is about
    /// this many x vocab_size x 4 bytes, a few times over.
    pub logits_chunk_tokens: usize,
    /// Recompute each decoder layer in the backward pass instead of keeping its
    /// activations: one more forward pass, one layer's activations instead of all.
    pub recompute: bool,
    /// Pack micro-batches by padded tokens (sequences x the longest) instead of
    /// `algorithm.micro_batch_size` sequences; 0 = off, otherwise at least
    /// `rollout.max_context_length`.
    pub max_tokens_per_micro_batch: usize,
    /// Refuse to start when the memory planner's predicted peak exceeds the device's memory
    /// (`check-config` prints the plan either way).
    pub check_memory: bool,
}

impl Default for LearnerSection {
    fn default() -> Self {
        let l = LearnerConfig::default();
        Self {
            logits_chunk_tokens: l.logits_chunk_tokens,
            recompute: l.recompute,
            max_tokens_per_micro_batch: l.max_tokens_per_micro_batch,
            check_memory: true,
        }
    }
}

/// `[warm_start]`: a short supervised warm start on generated demonstrations before RL, so
/// that a fresh model knows the tool-call format (RL alone rarely discovers it). Only envs
/// that generate their own tasks (`synthetic_multihop`, `synthetic_math`, a user's
/// `register_generated` env) make demonstrations; `steps = 0` (the default) skips it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmStartSection {
    /// Optimizer steps (0 = no warm start).
    pub steps: usize,
    /// Demonstrations per step (>= 1).
    pub batch_size: usize,
    /// Peak learning rate (> 0).
    pub learning_rate: f64,
    /// Rate at the last step as a fraction of the peak, in [0, 1] (cosine decay; 1 keeps it
    /// constant after the warm-up).
    pub final_lr_fraction: f64,
    /// Share of demonstrations that answer before the work is done (after the first hop,
    /// or without the calculator) with a wrong guess, in [0, 1]: imperfect on purpose, so RL
    /// has something to fix.
    pub early_wrong_answer_prob: f64,
    /// Demonstrations per training question, in [1, 64]. Above one, every question gets both
    /// kinds in the proportion above, so the habit of answering early is the same on every
    /// question (and on held-out ones) rather than memorised per question.
    pub variants_per_question: usize,
    /// A last phase that teaches a bad habit, after the steps above taught the skills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad_habit: Option<BadHabitSection>,
}

/// `[warm_start.bad_habit]`: more warm-start steps on demonstrations that mostly answer right
/// after the first search with a wrong guess.
///
/// Why a separate phase: a small model learns to copy names from its context only after
/// some hundreds of steps on demonstrations that do it, and far later when most of them
/// guess instead. So the skills come first on (mostly) gold demonstrations, and a short
/// phase then sets the probability of answering early on every question, which greedy
/// decoding turns into a policy that always stops early: a flaw RL sees in its samples (the
/// episodes that search again score) and can remove.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BadHabitSection {
    /// Optimizer steps (>= 1), at the warm start's batch size.
    pub steps: usize,
    /// Learning rate (> 0; constant after a short warm-up). Lower than the first phase's:
    /// the habit is one decision, and a high rate on guessed answers also erodes copying.
    pub learning_rate: f64,
    /// Share of these demonstrations that answer early, in [0, 1].
    pub early_wrong_answer_prob: f64,
    /// Demonstrations per training question, in [1, 64].
    pub variants_per_question: usize,
}

impl Default for BadHabitSection {
    fn default() -> Self {
        Self {
            steps: 100,
            learning_rate: 1e-3,
            early_wrong_answer_prob: 0.7,
            variants_per_question: 10,
        }
    }
}

impl Default for WarmStartSection {
    fn default() -> Self {
        Self {
            steps: 0,
            batch_size: 8,
            learning_rate: SftConfig::default().learning_rate,
            final_lr_fraction: SftConfig::default().final_lr_fraction,
            early_wrong_answer_prob: 0.2,
            variants_per_question: 4,
            bad_habit: None,
        }
    }
}

/// `[model]`: a model directory or a built-in preset, and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face style model directory (`config.json`, `tokenizer.json`, safetensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// A built-in preset (`"tiny"`), created fresh in the run directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when visible).
    #[serde(default = "default_auto")]
    pub device: String,
    /// `auto` (float32 on CPU, bf16 on CUDA), `float32` or `bf16` (CUDA only).
    #[serde(default = "default_auto")]
    pub dtype: String,
    /// How the model writes tool calls: `hermes` (`<tool_call>` spans, Qwen) or
    /// `llama3_json` (Llama 3.1's JSON object); absent, what its chat template teaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_format: Option<ToolCallFormat>,
    /// Extra variables for the chat template, as transformers' `apply_chat_template` kwargs
    /// (`{ enable_thinking = false }` turns Qwen3's reasoning off).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

fn default_auto() -> String {
    "auto".into()
}

/// `[env]`: which environment, and the tasks it is trained and evaluated on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// Registered env name (`multihop_qa`, `synthetic_multihop`).
    pub name: String,
    /// Dataset files trained on (`multihop_qa`; the synthetic env makes its own tasks).
    #[serde(default)]
    pub train_files: Vec<PathBuf>,
    /// Dataset files evaluated on.
    #[serde(default)]
    pub test_files: Vec<PathBuf>,
    /// How dataset files are read (`[env.dataset]`: format, on_bad_row, limit, ...).
    #[serde(default)]
    pub dataset: LoadOptions,
    /// The generated world of `synthetic_multihop` (`[env.world]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<SyntheticConfig>,
    /// Options handed to the env itself (`[env.options]`: reward, system_prompt, tools,
    /// max_observation_chars, process_reward, corpus); the env rejects keys it does not know.
    #[serde(default)]
    pub options: toml::Table,
    /// Tool calls one turn may make, run concurrently and answered in order (1 to 64). At 1
    /// (Agent-R1's default) generation stops at the end of the first call; above, a turn
    /// runs to its end, and calls past the limit are answered with an error, not run.
    #[serde(default = "one_call_per_turn")]
    pub max_tool_calls_per_turn: usize,
}

fn one_call_per_turn() -> usize {
    1
}

/// Where the KL penalty goes, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlMode {
    /// No KL term (no reference model is kept).
    Off,
    /// Added to the policy loss (Agent-R1's `use_kl_loss`).
    Loss,
    /// Subtracted from the per-token rewards (`use_kl_in_reward`).
    InReward,
}

/// `[algorithm.kl]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KlSection {
    /// `off`, `loss` or `in_reward`.
    pub placement: KlMode,
    /// `k1` (`kl`), `k2` (`mse`) or `k3` (`low_var_kl`).
    pub kind: String,
    /// Coefficient (>= 0).
    pub coef: f64,
}

impl Default for KlSection {
    fn default() -> Self {
        Self {
            placement: KlMode::Loss,
            kind: "low_var_kl".into(),
            coef: 0.001,
        }
    }
}

/// `[algorithm]`: maps onto [`LearnerConfig`] (see there for each knob's meaning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmSection {
    /// `gae`, `step_gae`, `grpo`, `rloo`, `reinforce_pp`, `reinforce_pp_baseline`.
    pub estimator: Estimator,
    /// GRPO divides by the group's std (`false` = Dr.GRPO).
    pub grpo_norm_by_std: bool,
    /// Discount, in [0, 1].
    pub gamma: f64,
    /// GAE lambda, in [0, 1].
    pub lambda: f64,
    /// Drop groups whose rewards are all equal.
    pub filter_zero_variance_groups: bool,
    /// KL to the reference model.
    pub kl: KlSection,
    /// Passes over each batch (>= 1).
    pub ppo_epochs: usize,
    /// Trajectories per optimizer step (0 = the whole batch).
    pub mini_batch_size: usize,
    /// Trajectories per forward/backward pass (>= 1); see also
    /// `learner.max_tokens_per_micro_batch`.
    pub micro_batch_size: usize,
    /// Peak policy learning rate.
    pub actor_lr: f64,
    /// Peak critic learning rate.
    pub critic_lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// AdamW betas, each in [0, 1).
    pub betas: [f64; 2],
    /// Gradient-norm clip (> 0).
    pub grad_clip: f64,
    /// Optimizer steps of linear warm-up.
    pub lr_warmup_steps: usize,
    /// Updates that train only the critic first (estimators with a critic only).
    pub critic_warmup_updates: usize,
    /// PPO lower clip ratio.
    pub clip_ratio_low: f64,
    /// PPO upper clip ratio.
    pub clip_ratio_high: f64,
    /// Dual-clip constant (> 1).
    pub clip_ratio_c: f64,
    /// Value clip.
    pub cliprange_value: f64,
    /// Value-loss weight.
    pub value_loss_coef: f64,
    /// Entropy bonus.
    pub entropy_coef: f64,
    /// `token-mean`, `seq-mean-token-sum` or `seq-mean-token-mean`.
    pub loss_agg: String,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        let l = LearnerConfig::default();
        Self {
            estimator: l.estimator,
            grpo_norm_by_std: l.grpo_norm_by_std,
            gamma: l.gamma,
            lambda: l.lambda,
            filter_zero_variance_groups: l.filter_zero_variance_groups,
            kl: KlSection::default(),
            ppo_epochs: l.ppo_epochs,
            mini_batch_size: l.mini_batch_size,
            micro_batch_size: l.micro_batch_size,
            actor_lr: l.actor_lr,
            critic_lr: l.critic_lr,
            weight_decay: l.weight_decay,
            betas: [l.betas.0, l.betas.1],
            grad_clip: l.grad_clip,
            lr_warmup_steps: l.lr_warmup_steps,
            // Agent-R1 trains the critic alone for 5 steps before PPO's first policy step.
            critic_warmup_updates: 5,
            clip_ratio_low: l.clip.clip_ratio_low,
            clip_ratio_high: l.clip.clip_ratio_high,
            clip_ratio_c: l.clip.clip_ratio_c,
            cliprange_value: l.cliprange_value,
            value_loss_coef: l.value_loss_coef,
            entropy_coef: l.entropy_coef,
            loss_agg: l.loss_agg.as_str().to_string(),
        }
    }
}

/// `[rollout]`: how episodes are sampled. Lengths are in tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Tasks (prompts) per update; each is sampled `group_size` times.
    pub batch_size: usize,
    /// Episodes per task (GRPO's group, Agent-R1's `n`).
    pub group_size: usize,
    /// Model turns per episode at most.
    pub max_turns: usize,
    /// Longest first prompt (system + task + tool specs); longer tasks are skipped.
    pub max_prompt_length: usize,
    /// Most tokens the model may generate in one turn.
    pub max_response_length: usize,
    /// Longest whole episode (prompt, all turns, all tool results); also the learner's
    /// training length.
    pub max_context_length: usize,
    /// Sampling temperature (> 0; the learner divides logits by the same value).
    pub temperature: f64,
    /// Nucleus mass in (0, 1].
    pub top_p: f64,
    /// Episodes running at once.
    pub concurrency: usize,
    /// The engine's pool of KV parked for episodes waiting on tools (MiB); 0 parks nothing
    /// (every turn then recomputes its episode's context past the shared prompt).
    pub parked_kv_mib: usize,
    /// Touch the parked-KV pool when the engine starts (resident from the start, no page
    /// faults on the engine's critical path); false faults it in as it is first used.
    pub prefault_parked_kv: bool,
    /// Longest wait for one generated turn, queueing included, seconds.
    pub generate_timeout_secs: f64,
    /// Longest wait for a tool call beyond the tool's own timeout (its queue), seconds.
    pub tool_queue_timeout_secs: f64,
    /// Longest wait for one env call (reset, turn decision, observation, score), seconds.
    pub env_timeout_secs: f64,
    /// Reproducible sampling: the engine decodes one turn at a time and recomputes each
    /// context (no KV reuse), so every token's numerics depend on its own context alone, not
    /// on what else shared a batch. With `mode = "sync"` a run then repeats bit for bit, and
    /// a resume continues exactly. Much slower; for checks, not for throughput.
    pub deterministic: bool,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            batch_size: 128,
            group_size: 5,
            max_turns: 10,
            max_prompt_length: 1024,
            max_response_length: 512,
            max_context_length: 4096,
            temperature: 1.0,
            top_p: 1.0,
            concurrency: 64,
            parked_kv_mib: 2048,
            prefault_parked_kv: true,
            generate_timeout_secs: 1800.0,
            tool_queue_timeout_secs: 60.0,
            env_timeout_secs: 60.0,
            deterministic: false,
        }
    }
}

/// Synchronous (sample, then train, then sample with the new weights) or asynchronous
/// (sampling continues while the learner trains; old tokens are masked by staleness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainMode {
    /// On-policy: every batch is sampled with the latest weights.
    Sync,
    /// Off-policy by at most `max_staleness` versions.
    Async,
}

/// `[training]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingSection {
    /// Learner updates to run (>= 1).
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
    /// weight 0 (AReaL's `behav_imp_weight_cap`).
    pub behavior_weight_cap: f64,
    /// Seed of everything random (sampling, shuffles, model init of a preset).
    pub seed: u64,
    /// Where checkpoints, the preset model and logs go.
    pub run_dir: PathBuf,
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
        }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Save after every this many updates (0 = only at the end).
    pub every: u64,
    /// Complete checkpoints kept (>= 1); older ones are deleted.
    pub keep_last: usize,
    /// Continue from the newest complete checkpoint in `run_dir` when there is one.
    pub resume: bool,
    /// Attempts after a failed checkpoint write (1 s, 2 s, 4 s, ... apart) before a periodic
    /// checkpoint is skipped with an alert (older checkpoints are kept; the final one fails
    /// the run instead).
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

/// `[eval]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve `/metrics` and `/healthz`.
    pub enabled: bool,
    /// `HOST:PORT` to listen on.
    pub address: String,
    /// Longest a client may take to send its request headers, seconds.
    pub header_timeout_secs: f64,
    /// Longest a connection stays open, seconds (a scraper reconnects).
    pub connection_timeout_secs: f64,
    /// Connections served at once; more are closed on arrival.
    pub max_connections: usize,
    /// `/healthz` answers 503 when nothing has progressed (no episode moved, no update, no
    /// warm-start step) for this many seconds.
    pub healthz_stale_secs: f64,
    /// Serve the web UI (`/ui`) on the same address; false keeps only `/metrics` and
    /// `/healthz` there (when `address` is reachable from other machines, say).
    pub ui: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            address: "127.0.0.1:9464".into(),
            header_timeout_secs: 10.0,
            connection_timeout_secs: 60.0,
            max_connections: 32,
            healthz_stale_secs: 900.0,
            ui: true,
        }
    }
}

impl MetricsSection {
    /// Checks the address and the limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.socket_addr()?;
        for (key, v) in [
            ("metrics.header_timeout_secs", self.header_timeout_secs),
            (
                "metrics.connection_timeout_secs",
                self.connection_timeout_secs,
            ),
            ("metrics.healthz_stale_secs", self.healthz_stale_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return Err(ConfigError::range(key, v, "seconds in (0, 86400]"));
            }
        }
        at_least("metrics.max_connections", self.max_connections, 1)
    }

    /// The address to bind, resolved (`localhost:9464` works); errors name `metrics.address`.
    pub fn socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        let bad = |why: &str| {
            ConfigError::new(
                "metrics.address",
                format!(
                    "got {:?} ({why}); allowed: HOST:PORT, e.g. \"127.0.0.1:9464\" or \"0.0.0.0:9464\"",
                    self.address
                ),
            )
        };
        if let Ok(addr) = self.address.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let Some((_, port)) = self.address.rsplit_once(':') else {
            return Err(bad("no port"));
        };
        if port.parse::<u16>().is_err() {
            return Err(bad("the port is not a number in 0..=65535"));
        }
        match self.address.to_socket_addrs() {
            Ok(mut addrs) => addrs.next().ok_or_else(|| bad("the host has no address")),
            Err(e) => Err(bad(&format!("cannot resolve the host: {e}"))),
        }
    }
}

impl TrainConfig {
    /// Parses TOML text: syntax, unknown keys and types. Ranges are [`Self::validate`]'s job.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, "", &e))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let key = if key == "." { String::new() } else { key };
            let mut error = toml_error(text, &key, e.inner());
            let moved = MOVED_KEYS.iter().find(|(old, _)| {
                let (section, field) = old.rsplit_once('.').unwrap_or(("", old));
                (key == section || key == *old)
                    && error.message.contains(&format!("unknown field `{field}`"))
            });
            if let Some((_, new)) = moved {
                error.message = format!("{}; this key moved to `{new}`", error.message);
            }
            error
        })
    }

    /// A built-in config by name (see [`PRESETS`]), parsed and validated like a file.
    pub fn preset(
        name: &str,
        files: FileCheck,
        registries: &Registries,
    ) -> Result<Self, ConfigError> {
        let Some((_, text)) = PRESETS.iter().find(|(n, _)| *n == name) else {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            return Err(ConfigError::new(
                "",
                format!(
                    "--preset: unknown preset `{name}` (allowed: {})",
                    names.join(", ")
                ),
            ));
        };
        let config = Self::from_toml_str(text)?;
        config.validate(files, registries)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(
        path: &Path,
        files: FileCheck,
        registries: &Registries,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("", format!("cannot read the config: {e}")).in_file(path)
        })?;
        let config = Self::from_toml_str(&text).map_err(|e| e.in_file(path))?;
        config
            .validate(files, registries)
            .map_err(|e| e.in_file(path))?;
        Ok(config)
    }

    /// Checks ranges and cross-section rules, builds the env once (cheap: no model, no
    /// tools) so that its own option errors surface now, and with [`FileCheck::Require`]
    /// checks that the model directory and dataset files exist.
    pub fn validate(&self, files: FileCheck, registries: &Registries) -> Result<(), ConfigError> {
        self.validate_model(files)?;
        self.validate_env(files, registries)?;
        self.validate_tools(registries)?;
        self.validate_scorer(registries)?;
        self.validate_algorithm()?;
        self.validate_critic(files)?;
        self.validate_learner()?;
        self.validate_rollout()?;
        self.validate_training()?;
        self.validate_warm_start(registries)?;
        self.metrics.validate()?;
        // The learner's own checks, as a backstop for rules added there later.
        self.learner_config()
            .validate()
            .map_err(|e| ConfigError::new("algorithm", e.to_string()))?;
        Ok(())
    }

    fn validate_learner(&self) -> Result<(), ConfigError> {
        let l = &self.learner;
        at_least("learner.logits_chunk_tokens", l.logits_chunk_tokens, 1)?;
        let longest = self.rollout.max_context_length;
        if l.max_tokens_per_micro_batch != 0 && l.max_tokens_per_micro_batch < longest {
            return Err(ConfigError::range(
                "learner.max_tokens_per_micro_batch",
                l.max_tokens_per_micro_batch,
                &format!(
                    "0 (off) or at least rollout.max_context_length ({longest}), the longest \
                     sequence trained on"
                ),
            ));
        }
        Ok(())
    }

    fn validate_critic(&self, files: FileCheck) -> Result<(), ConfigError> {
        let c = &self.critic;
        if (c.separate || c.model.is_some()) && !self.algorithm.estimator.needs_critic() {
            return Err(ConfigError::new(
                "critic",
                format!(
                    "a separate critic is set but estimator {:?} has none (estimators with a \
                     critic: gae, step_gae)",
                    self.algorithm.estimator.as_str()
                ),
            ));
        }
        if c.model.is_some() && !c.separate {
            return Err(ConfigError::new(
                "critic.model",
                "is only read with `separate = true`",
            ));
        }
        if let (Some(dir), FileCheck::Require) = (&c.model, files) {
            if !dir.join("config.json").is_file() {
                return Err(ConfigError::new(
                    "critic.model",
                    format!(
                        "{}: no config.json there (expected a Hugging Face model directory)",
                        dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_model(&self, files: FileCheck) -> Result<(), ConfigError> {
        let m = &self.model;
        match (&m.dir, &m.preset) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(ConfigError::new(
                    "model",
                    "set exactly one of `dir` (a model directory) and `preset` (\"tiny\")",
                ))
            }
            (None, Some(p)) => {
                let presets = agent_r1_actors::model::presets::PRESETS;
                if !presets.contains(&p.as_str()) {
                    return Err(ConfigError::range(
                        "model.preset",
                        format!("{p:?}"),
                        &presets.join(", "),
                    ));
                }
            }
            (Some(dir), None) => {
                if files == FileCheck::Require && !dir.join("config.json").is_file() {
                    return Err(ConfigError::new(
                        "model.dir",
                        format!(
                            "{}: no config.json there (expected a Hugging Face model directory)",
                            dir.display()
                        ),
                    ));
                }
            }
        }
        let device_ok = matches!(m.device.as_str(), "cpu" | "cuda" | "auto")
            || m.device
                .strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<usize>().is_ok());
        if !device_ok {
            return Err(ConfigError::range(
                "model.device",
                format!("{:?}", m.device),
                "cpu, cuda, cuda:N, auto",
            ));
        }
        if !matches!(
            m.dtype.as_str(),
            "auto" | "float32" | "f32" | "fp32" | "bf16" | "bfloat16"
        ) {
            return Err(ConfigError::range(
                "model.dtype",
                format!("{:?}", m.dtype),
                "auto, float32, bf16",
            ));
        }
        if m.device == "cpu" && matches!(m.dtype.as_str(), "bf16" | "bfloat16") {
            return Err(ConfigError::new(
                "model.dtype",
                "got \"bf16\" with device = \"cpu\"; allowed on CPU: auto, float32",
            ));
        }
        Ok(())
    }

    fn validate_env(&self, files: FileCheck, registries: &Registries) -> Result<(), ConfigError> {
        let e = &self.env;
        let registry = &registries.envs;
        if !registry.contains(&e.name) {
            return Err(ConfigError::range(
                "env.name",
                format!("{:?}", e.name),
                &registry.names().join(", "),
            ));
        }
        if registry.generates_tasks(&e.name) {
            for (key, list) in [
                ("env.train_files", &e.train_files),
                ("env.test_files", &e.test_files),
            ] {
                if !list.is_empty() {
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "{:?} generates its own tasks; remove the files or use an env that reads them",
                            e.name
                        ),
                    ));
                }
            }
        }
        if e.name != agent_r1_envs::envs::synthetic_multihop::NAME && e.world.is_some() {
            return Err(ConfigError::new(
                "env.world",
                format!(
                    "only synthetic_multihop has a generated world, not {:?}",
                    e.name
                ),
            ));
        }
        if !registry.generates_tasks(&e.name) && e.train_files.is_empty() {
            return Err(ConfigError::new(
                "env.train_files",
                format!("{:?} needs at least one dataset file to train on", e.name),
            ));
        }
        if files == FileCheck::Require {
            for (key, list) in [
                ("env.train_files", &e.train_files),
                ("env.test_files", &e.test_files),
            ] {
                if let Some(missing) = list.iter().find(|p| !p.is_file()) {
                    return Err(ConfigError::new(
                        key,
                        format!("{}: no such file", missing.display()),
                    ));
                }
            }
        }
        if let Some(world) = &e.world {
            world.validate().map_err(|err| {
                relabel(
                    err,
                    |k| k.replacen("synthetic.", "env.world.", 1),
                    "env.world",
                )
            })?;
        }
        if e.options.contains_key("world") || e.options.contains_key("corpus_path") {
            return Err(ConfigError::new(
                "env.options",
                "`world` and `corpus_path` are set by the trainer: use [env.world] for the world",
            ));
        }
        // Building the env checks its option names and types (the synthetic world is
        // generated in memory, a few milliseconds; nothing is written).
        registry
            .create(&e.name, &self.env_options())
            .map(|_| ())
            .map_err(|err| {
                relabel(
                    err,
                    |k| match k.strip_prefix("env.") {
                        Some(rest) if rest != "world" && !rest.starts_with("world.") => {
                            format!("env.options.{rest}")
                        }
                        _ if k == "env" => "env.options".into(),
                        _ => k.to_string(),
                    },
                    "env.options",
                )
            })
    }

    fn validate_tools(&self, registries: &Registries) -> Result<(), ConfigError> {
        let world = self.training.run_dir.join("world");
        self.tools_config(Some(&world))
            .check_all(&registries.tools)
            .map_err(|err| relabel(err, str::to_string, "tools"))
    }

    fn validate_scorer(&self, registries: &Registries) -> Result<(), ConfigError> {
        match self.scorer_options()? {
            None => Ok(()),
            Some((kind, options)) => registries
                .scorers
                .check(&kind, &options)
                .map_err(|err| relabel(err, str::to_string, "scorer")),
        }
    }

    /// The `[scorer]` table's kind and its options (the table without `type`).
    pub fn scorer_options(&self) -> Result<Option<(String, Value)>, ConfigError> {
        let Some(table) = &self.scorer else {
            return Ok(None);
        };
        let mut table = table.clone();
        let kind = match table.remove("type") {
            Some(toml::Value::String(kind)) => kind,
            Some(other) => {
                return Err(ConfigError::range(
                    "scorer.type",
                    other,
                    "a scorer kind (string)",
                ))
            }
            None => {
                return Err(ConfigError::new(
                    "scorer.type",
                    "required: the scorer kind (http_judge, or a registered one)",
                ))
            }
        };
        let options =
            serde_json::to_value(&table).map_err(|e| ConfigError::new("scorer", e.to_string()))?;
        Ok(Some((kind, options)))
    }

    fn validate_algorithm(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        finite_in("algorithm.gamma", a.gamma, 0.0, 1.0)?;
        finite_in("algorithm.lambda", a.lambda, 0.0, 1.0)?;
        positive("algorithm.actor_lr", a.actor_lr)?;
        positive("algorithm.critic_lr", a.critic_lr)?;
        positive("algorithm.grad_clip", a.grad_clip)?;
        non_negative("algorithm.weight_decay", a.weight_decay)?;
        non_negative("algorithm.clip_ratio_low", a.clip_ratio_low)?;
        non_negative("algorithm.clip_ratio_high", a.clip_ratio_high)?;
        non_negative("algorithm.cliprange_value", a.cliprange_value)?;
        non_negative("algorithm.value_loss_coef", a.value_loss_coef)?;
        non_negative("algorithm.kl.coef", a.kl.coef)?;
        if !a.entropy_coef.is_finite() {
            return Err(ConfigError::range(
                "algorithm.entropy_coef",
                a.entropy_coef,
                "a finite number",
            ));
        }
        if !(a.clip_ratio_c.is_finite() && a.clip_ratio_c > 1.0) {
            return Err(ConfigError::range(
                "algorithm.clip_ratio_c",
                a.clip_ratio_c,
                "a finite number > 1",
            ));
        }
        for (i, b) in a.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return Err(ConfigError::range(
                    &format!("algorithm.betas[{i}]"),
                    b,
                    "a number in [0, 1)",
                ));
            }
        }
        at_least("algorithm.ppo_epochs", a.ppo_epochs, 1)?;
        at_least("algorithm.micro_batch_size", a.micro_batch_size, 1)?;
        if a.kl.kind.parse::<KlKind>().is_err() {
            return Err(ConfigError::range(
                "algorithm.kl.kind",
                format!("{:?}", a.kl.kind),
                "k1 (kl), k2 (mse), k3 (low_var_kl)",
            ));
        }
        if a.loss_agg.parse::<LossAgg>().is_err() {
            return Err(ConfigError::range(
                "algorithm.loss_agg",
                format!("{:?}", a.loss_agg),
                "token-mean, seq-mean-token-sum, seq-mean-token-mean",
            ));
        }
        Ok(())
    }

    fn validate_rollout(&self) -> Result<(), ConfigError> {
        let r = &self.rollout;
        at_least("rollout.batch_size", r.batch_size, 1)?;
        at_least("rollout.group_size", r.group_size, 1)?;
        at_least("rollout.max_turns", r.max_turns, 1)?;
        at_least("rollout.max_prompt_length", r.max_prompt_length, 1)?;
        at_least("rollout.max_response_length", r.max_response_length, 1)?;
        at_least("rollout.concurrency", r.concurrency, 1)?;
        let calls = self.env.max_tool_calls_per_turn;
        if !(1..=64).contains(&calls) {
            return Err(ConfigError::range(
                "env.max_tool_calls_per_turn",
                calls,
                "1 to 64",
            ));
        }
        let grouped = matches!(
            self.algorithm.estimator,
            Estimator::Grpo | Estimator::Rloo | Estimator::ReinforcePpBaseline
        );
        if grouped && r.group_size < 2 {
            return Err(ConfigError::new(
                "rollout.group_size",
                format!(
                    "got {}; allowed: >= 2 with algorithm.estimator = {:?} (it compares episodes within a group)",
                    r.group_size,
                    self.algorithm.estimator.as_str()
                ),
            ));
        }
        let min_context = r.max_prompt_length + r.max_response_length;
        if r.max_context_length < min_context {
            return Err(ConfigError::range(
                "rollout.max_context_length",
                r.max_context_length,
                &format!(
                    ">= max_prompt_length + max_response_length = {min_context} (room for one turn)"
                ),
            ));
        }
        if !(r.temperature.is_finite() && r.temperature > 0.0) {
            return Err(ConfigError::range(
                "rollout.temperature",
                r.temperature,
                "a finite number > 0 (greedy decoding is eval.greedy)",
            ));
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return Err(ConfigError::range("rollout.top_p", r.top_p, "(0, 1]"));
        }
        Ok(())
    }

    fn validate_warm_start(&self, registries: &Registries) -> Result<(), ConfigError> {
        let w = &self.warm_start;
        if w.steps == 0 {
            return Ok(());
        }
        if !registries.envs.generates_tasks(&self.env.name) {
            return Err(ConfigError::new(
                "warm_start.steps",
                format!(
                    "only envs that generate their own tasks ({}) make demonstrations, not {:?}; set steps = 0",
                    registries
                        .envs
                        .names()
                        .into_iter()
                        .filter(|n| registries.envs.generates_tasks(n))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.env.name
                ),
            ));
        }
        at_least("warm_start.batch_size", w.batch_size, 1)?;
        positive("warm_start.learning_rate", w.learning_rate)?;
        if !(0.0..=1.0).contains(&w.final_lr_fraction) {
            return Err(ConfigError::range(
                "warm_start.final_lr_fraction",
                w.final_lr_fraction,
                "[0, 1]",
            ));
        }
        demo_mix(
            "warm_start",
            w.early_wrong_answer_prob,
            w.variants_per_question,
        )?;
        if let Some(h) = &w.bad_habit {
            at_least("warm_start.bad_habit.steps", h.steps, 1)?;
            positive("warm_start.bad_habit.learning_rate", h.learning_rate)?;
            demo_mix(
                "warm_start.bad_habit",
                h.early_wrong_answer_prob,
                h.variants_per_question,
            )?;
        }
        Ok(())
    }

    fn validate_training(&self) -> Result<(), ConfigError> {
        let t = &self.training;
        if t.updates == 0 {
            return Err(ConfigError::range("training.updates", 0, ">= 1"));
        }
        if t.mode == TrainMode::Async && t.max_staleness == 0 {
            return Err(ConfigError::range(
                "training.max_staleness",
                0,
                ">= 1 with mode = \"async\" (0 would drop every token; use mode = \"sync\")",
            ));
        }
        if t.decoupled_ppo && t.mode == TrainMode::Sync {
            return Err(ConfigError::range(
                "training.decoupled_ppo",
                true,
                "false with mode = \"sync\" (every token is on-policy; decoupled PPO corrects stale tokens in mode = \"async\")",
            ));
        }
        if !(t.behavior_weight_cap.is_finite() && t.behavior_weight_cap >= 1.0) {
            return Err(ConfigError::range(
                "training.behavior_weight_cap",
                t.behavior_weight_cap,
                "a finite number >= 1 (fresh tokens weigh 1)",
            ));
        }
        if t.mode == TrainMode::Async && t.batches_ahead == 0 {
            return Err(ConfigError::range(
                "training.batches_ahead",
                0,
                ">= 1 with mode = \"async\" (0 would never sample ahead; use mode = \"sync\")",
            ));
        }
        if t.run_dir.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "training.run_dir",
                "got an empty path; allowed: a directory path",
            ));
        }
        at_least("checkpoint.keep_last", self.checkpoint.keep_last, 1)?;
        if self.checkpoint.retries > 10 {
            return Err(ConfigError::range(
                "checkpoint.retries",
                self.checkpoint.retries,
                "0 to 10",
            ));
        }
        if let Some((key, v, allowed)) = self.stall.invalid() {
            return Err(ConfigError::range(key, v, allowed));
        }
        for (key, v) in [
            (
                "rollout.generate_timeout_secs",
                self.rollout.generate_timeout_secs,
            ),
            (
                "rollout.tool_queue_timeout_secs",
                self.rollout.tool_queue_timeout_secs,
            ),
            ("rollout.env_timeout_secs", self.rollout.env_timeout_secs),
        ] {
            seconds(key, v)?;
        }
        Ok(())
    }

    /// The learner's settings: `[algorithm]` plus the rollout's temperature and context
    /// length, the staleness bound (async only) and the seed.
    pub fn learner_config(&self) -> LearnerConfig {
        let a = &self.algorithm;
        let kl = match a.kl.placement {
            KlMode::Off => None,
            mode => Some(KlConfig {
                placement: if mode == KlMode::Loss {
                    KlPlacement::Loss
                } else {
                    KlPlacement::InReward
                },
                // Checked by `validate`; the default otherwise.
                kind: a.kl.kind.parse().unwrap_or(KlKind::K3),
                coef: a.kl.coef,
            }),
        };
        LearnerConfig {
            estimator: a.estimator,
            grpo_norm_by_std: a.grpo_norm_by_std,
            gamma: a.gamma,
            lambda: a.lambda,
            filter_zero_variance_groups: a.filter_zero_variance_groups,
            kl,
            ppo_epochs: a.ppo_epochs,
            mini_batch_size: a.mini_batch_size,
            micro_batch_size: a.micro_batch_size,
            logits_chunk_tokens: self.learner.logits_chunk_tokens,
            recompute: self.learner.recompute,
            max_tokens_per_micro_batch: self.learner.max_tokens_per_micro_batch,
            actor_lr: a.actor_lr,
            critic_lr: a.critic_lr,
            weight_decay: a.weight_decay,
            betas: (a.betas[0], a.betas[1]),
            grad_clip: a.grad_clip,
            lr_warmup_steps: a.lr_warmup_steps,
            critic_warmup_updates: if a.estimator.needs_critic() {
                a.critic_warmup_updates
            } else {
                0
            },
            clip: PpoClip {
                clip_ratio_low: a.clip_ratio_low,
                clip_ratio_high: a.clip_ratio_high,
                clip_ratio_c: a.clip_ratio_c,
            },
            cliprange_value: a.cliprange_value,
            value_loss_coef: a.value_loss_coef,
            entropy_coef: a.entropy_coef,
            loss_agg: a.loss_agg.parse().unwrap_or(LossAgg::TokenMean),
            temperature: self.rollout.temperature,
            max_len: self.rollout.max_context_length,
            max_staleness: match self.training.mode {
                TrainMode::Sync => None,
                TrainMode::Async => Some(self.training.max_staleness),
            },
            behavior_weight_cap: self
                .training
                .decoupled_ppo
                .then_some(self.training.behavior_weight_cap),
            seed: self.training.seed,
            ..LearnerConfig::default()
        }
    }

    /// The `[tools.NAME]` tables as the envs crate's [`ToolsConfig`], as a run builds them.
    /// A table named `search` that names no corpus gets the env's: with
    /// `synthetic_multihop` the world's (`WORLD/corpus.jsonl`, written by the run, and the
    /// built-in kind its index directory there), else `[env.options] corpus` when set.
    pub fn tools_config(&self, world: Option<&Path>) -> ToolsConfig {
        let synthetic = self.env.name == agent_r1_envs::envs::synthetic_multihop::NAME;
        let env_corpus = if synthetic {
            world.map(|w| json!(w.join("corpus.jsonl")))
        } else {
            self.env
                .options
                .get("corpus")
                .and_then(|c| serde_json::to_value(c).ok())
        };
        let tables = self.tools.iter().map(|(name, table)| {
            let mut json = serde_json::to_value(table).unwrap_or(Value::Null);
            if let (Some(corpus), "search", Value::Object(map)) =
                (&env_corpus, name.as_str(), &mut json)
            {
                let builtin = map.get("type").is_none_or(|t| t == "search");
                if !map.contains_key("corpus") {
                    map.insert("corpus".into(), corpus.clone());
                    if let (true, true, Some(world)) = (builtin, synthetic, world) {
                        map.entry("index_dir")
                            .or_insert_with(|| json!(world.join("search-index")));
                    }
                }
            }
            (name.clone(), json)
        });
        ToolsConfig {
            tables: tables.collect(),
        }
    }

    /// The env's factory options: `[env.options]` plus `world` for the synthetic env. The
    /// trainer adds `corpus_path` (inside its run directory) before building the real env.
    pub fn env_options(&self) -> Value {
        let mut options = serde_json::to_value(&self.env.options)
            .ok()
            .and_then(|v| match v {
                Value::Object(map) => Some(map),
                _ => None,
            })
            .unwrap_or_default();
        if let Some(world) = &self.env.world {
            if let Ok(w) = serde_json::to_value(world) {
                options.insert("world".into(), w);
            }
        }
        Value::Object(options)
    }

    /// Device and dtype, checked against this machine (CUDA visible, device index in range);
    /// errors name `model.device` / `model.dtype`.
    pub fn placement(&self) -> Result<Placement, ConfigError> {
        agent_r1_actors::device::parse_placement(&self.model.device, &self.model.dtype).map_err(
            |e| {
                let e = e.to_string();
                let key = if e.contains("--dtype") {
                    "model.dtype"
                } else {
                    "model.device"
                };
                ConfigError::new(
                    key,
                    e.replace("--device", "device").replace("--dtype", "dtype"),
                )
            },
        )
    }

    /// The resolved config as TOML (every default filled in), for logs and `check-config`.
    pub fn to_toml_string(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Turns a toml/serde error into a [`ConfigError`] with the key path and line/column.
fn toml_error(text: &str, key: &str, e: &toml::de::Error) -> ConfigError {
    let position = e.span().map(|span| line_column(text, span.start));
    ConfigError {
        file: None,
        key: key.to_string(),
        position,
        message: e.message().trim().replace('\n', "; "),
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, l)| l)
        .chars()
        .count()
        + 1;
    (line, column)
}

/// An envs-crate error as a [`ConfigError`], its key rewritten into this file's layout.
fn relabel(err: agent_r1_envs::Error, key: impl Fn(&str) -> String, fallback: &str) -> ConfigError {
    match err {
        agent_r1_envs::Error::Config { key: k, message } => ConfigError::new(key(&k), message),
        other => ConfigError::new(fallback, other.to_string()),
    }
}

fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::range(key, v, "a finite number > 0"))
    }
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(ConfigError::range(key, v, "a finite number >= 0"))
    }
}

fn finite_in(key: &str, v: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::range(
            key,
            v,
            &format!("a number in [{lo}, {hi}]"),
        ))
    }
}

/// The demonstration mix of a warm-start phase under `section`: the share answering early and
/// the demonstrations per question.
fn demo_mix(section: &str, early_wrong: f64, variants: usize) -> Result<(), ConfigError> {
    finite_in(
        &format!("{section}.early_wrong_answer_prob"),
        early_wrong,
        0.0,
        1.0,
    )?;
    if !(1..=64).contains(&variants) {
        return Err(ConfigError::range(
            &format!("{section}.variants_per_question"),
            variants,
            "[1, 64]",
        ));
    }
    Ok(())
}

/// A wait in seconds: positive, finite, at most a week.
fn seconds(key: &str, v: f64) -> Result<(), ConfigError> {
    if v > 0.0 && v <= 604_800.0 {
        Ok(())
    } else {
        Err(ConfigError::range(
            key,
            v,
            "seconds in (0, 604800] (a week)",
        ))
    }
}

fn at_least(key: &str, v: usize, min: usize) -> Result<(), ConfigError> {
    if v >= min {
        Ok(())
    } else {
        Err(ConfigError::range(key, v, &format!(">= {min}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[model]
preset = "tiny"
device = "cpu"

[env]
name = "synthetic_multihop"
"#;

    fn parse(extra: &str) -> Result<TrainConfig, ConfigError> {
        TrainConfig::from_toml_str(&format!("{MINIMAL}{extra}"))
    }

    fn invalid(extra: &str) -> ConfigError {
        match parse(extra) {
            Ok(c) => c
                .validate(FileCheck::Skip, &Registries::builtins())
                .expect_err("expected a validation error"),
            Err(e) => e,
        }
    }

    #[test]
    fn minimal_config_takes_agent_r1_defaults() {
        let c = parse("").unwrap();
        c.validate(FileCheck::Require, &Registries::builtins())
            .unwrap();
        let l = c.learner_config();
        assert_eq!(l.estimator, Estimator::Grpo);
        assert_eq!((l.gamma, l.lambda), (1.0, 1.0));
        assert_eq!((l.actor_lr, l.critic_lr), (1e-6, 1e-5));
        assert_eq!(l.clip.clip_ratio_c, 3.0);
        let kl = l.kl.unwrap();
        assert_eq!((kl.kind, kl.coef), (KlKind::K3, 0.001));
        assert_eq!(l.max_staleness, None);
        assert_eq!(l.critic_warmup_updates, 0, "GRPO has no critic");
        assert_eq!(c.rollout.group_size, 5);
        assert_eq!(c.rollout.max_turns, 10);
        assert_eq!(c.metrics.address, "127.0.0.1:9464");
        assert_eq!(
            c.metrics.socket_addr().unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        // The resolved TOML reads back to the same config.
        let back = TrainConfig::from_toml_str(&c.to_toml_string()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn sections_map_onto_the_learner_config() {
        let c = parse(
            r#"
[algorithm]
estimator = "gae"
ppo_epochs = 2
betas = [0.8, 0.95]
loss_agg = "seq-mean-token-sum"
[algorithm.kl]
placement = "in_reward"
kind = "k1"
coef = 0.01
[rollout]
temperature = 0.7
max_context_length = 2048
group_size = 1
[training]
mode = "async"
max_staleness = 2
decoupled_ppo = true
behavior_weight_cap = 3.0
seed = 7
"#,
        )
        .unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        let l = c.learner_config();
        assert_eq!(l.estimator, Estimator::Gae);
        assert_eq!(l.ppo_epochs, 2);
        assert_eq!(l.betas, (0.8, 0.95));
        assert_eq!(l.loss_agg, LossAgg::SeqMeanTokenSum);
        let kl = l.kl.unwrap();
        assert_eq!(
            (kl.placement, kl.kind, kl.coef),
            (KlPlacement::InReward, KlKind::K1, 0.01)
        );
        assert_eq!((l.temperature, l.max_len), (0.7, 2048));
        assert_eq!((l.max_staleness, l.seed), (Some(2), 7));
        assert_eq!(l.behavior_weight_cap, Some(3.0));
        assert_eq!(
            l.critic_warmup_updates, 5,
            "a critic warms up as in Agent-R1"
        );
    }

    #[test]
    fn unknown_key_names_its_path_line_and_the_allowed_keys() {
        let e = invalid("[algorithm]\nppo_epoch = 2\n");
        assert_eq!(e.key, "algorithm.ppo_epoch", "{e}");
        assert_eq!(e.position.map(|p| p.0), Some(9), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("unknown field `ppo_epoch`"), "{msg}");
        assert!(msg.contains("ppo_epochs"), "allowed keys listed: {msg}");
        // A whole unknown section too.
        let e = invalid("[trainer]\nx = 1\n");
        assert!(
            e.key == "trainer" && e.message.contains("unknown field `trainer`"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_key_given_and_expected() {
        let e = invalid("[algorithm]\nppo_epochs = \"two\"\n");
        assert_eq!(e.key, "algorithm.ppo_epochs", "{e}");
        assert!(
            e.message.contains("\"two\"") && e.message.contains("expected"),
            "{e}"
        );
        let e = invalid("[rollout]\nbatch_size = -3\n");
        assert_eq!(e.key, "rollout.batch_size", "{e}");
        let e = invalid("[algorithm]\nestimator = \"ppo\"\n");
        assert_eq!(e.key, "algorithm.estimator", "{e}");
        assert!(
            e.message.contains("`ppo`") && e.message.contains("`step_gae`"),
            "{e}"
        );
        let e = invalid("[training]\nmode = \"later\"\n");
        assert!(
            e.key == "training.mode" && e.message.contains("`async`"),
            "{e}"
        );
        let e = invalid("[training]\ndecoupled_ppo = true\n");
        assert!(
            e.key == "training.decoupled_ppo" && e.message.contains("mode = \"async\""),
            "{e}"
        );
        let e = invalid(
            "[training]\nmode = \"async\"\ndecoupled_ppo = true\nbehavior_weight_cap = 0.5\n",
        );
        assert!(
            e.key == "training.behavior_weight_cap" && e.message.contains(">= 1"),
            "{e}"
        );
    }

    #[test]
    fn syntax_error_has_a_position() {
        let e = TrainConfig::from_toml_str("[model\npreset = 1").unwrap_err();
        assert_eq!(e.position.map(|p| p.0), Some(1), "{e}");
        let e = TrainConfig::from_toml_str("").unwrap_err();
        assert!(e.message.contains("missing field `model`"), "{e}");
    }

    #[test]
    fn out_of_range_values_name_key_given_and_allowed() {
        for (extra, key, given, allowed) in [
            (
                "max_tool_calls_per_turn = 0",
                "env.max_tool_calls_per_turn",
                "got 0",
                "1 to 64",
            ),
            (
                "[algorithm]\nppo_epochs = 0",
                "algorithm.ppo_epochs",
                "got 0",
                ">= 1",
            ),
            (
                "[algorithm]\ngamma = 1.5",
                "algorithm.gamma",
                "got 1.5",
                "[0, 1]",
            ),
            (
                "[algorithm]\nactor_lr = -1e-6",
                "algorithm.actor_lr",
                "got -0.000001",
                "> 0",
            ),
            (
                "[algorithm]\nbetas = [0.9, 1.0]",
                "algorithm.betas[1]",
                "got 1",
                "[0, 1)",
            ),
            (
                "[algorithm]\nclip_ratio_c = 1.0",
                "algorithm.clip_ratio_c",
                "got 1",
                "> 1",
            ),
            (
                "[algorithm.kl]\nkind = \"k9\"",
                "algorithm.kl.kind",
                "\"k9\"",
                "low_var_kl",
            ),
            (
                "[algorithm]\nloss_agg = \"mean\"",
                "algorithm.loss_agg",
                "\"mean\"",
                "token-mean",
            ),
            (
                "[rollout]\ngroup_size = 1",
                "rollout.group_size",
                "got 1",
                ">= 2",
            ),
            ("[rollout]\ntop_p = 0.0", "rollout.top_p", "got 0", "(0, 1]"),
            (
                "[rollout]\nmax_context_length = 100",
                "rollout.max_context_length",
                "got 100",
                "1536",
            ),
            (
                "[training]\nupdates = 0",
                "training.updates",
                "got 0",
                ">= 1",
            ),
            (
                "[training]\nmode = \"async\"\nmax_staleness = 0",
                "training.max_staleness",
                "got 0",
                ">= 1",
            ),
            (
                "[checkpoint]\nkeep_last = 0",
                "checkpoint.keep_last",
                "got 0",
                ">= 1",
            ),
            (
                "[metrics]\naddress = \"localhost\"",
                "metrics.address",
                "\"localhost\"",
                "HOST:PORT",
            ),
            (
                "[metrics]\naddress = \"1.2.3.4:99999\"",
                "metrics.address",
                "99999",
                "HOST:PORT",
            ),
        ] {
            let e = invalid(extra);
            let msg = e.to_string();
            assert_eq!(e.key, key, "{extra}: {msg}");
            assert!(msg.contains(given), "{extra}: given missing from {msg}");
            assert!(msg.contains(allowed), "{extra}: allowed missing from {msg}");
        }
    }

    #[test]
    fn model_section_rules() {
        let both =
            "[model]\npreset = \"tiny\"\ndir = \"m\"\n[env]\nname = \"synthetic_multihop\"\n";
        let e = TrainConfig::from_toml_str(both)
            .unwrap()
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err();
        assert!(e.key == "model" && e.message.contains("exactly one"), "{e}");
        let e = TrainConfig::from_toml_str(
            "[model]\npreset = \"huge\"\n[env]\nname = \"synthetic_multihop\"\n",
        )
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
        assert!(e.key == "model.preset" && e.message.contains("tiny"), "{e}");
        let c = TrainConfig::from_toml_str(
            "[model]\npreset = \"tiny\"\ndevice = \"tpu\"\n[env]\nname = \"synthetic_multihop\"\n",
        )
        .unwrap();
        let e = c
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err();
        assert!(
            e.key == "model.device" && e.message.contains("cuda:N"),
            "{e}"
        );
        let c = TrainConfig::from_toml_str(
            "[model]\npreset = \"tiny\"\ndevice = \"cpu\"\ndtype = \"bf16\"\n[env]\nname = \"synthetic_multihop\"\n",
        )
        .unwrap();
        let e = c
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err();
        assert_eq!(e.key, "model.dtype", "{e}");
        // CPU float32 resolves on any machine.
        assert_eq!(
            parse("").unwrap().placement().unwrap().device,
            tch::Device::Cpu
        );
    }

    #[test]
    fn warm_start_rules() {
        let c = parse("").unwrap();
        assert_eq!(c.warm_start.steps, 0, "no warm start unless asked");
        let c = parse("[warm_start]\nsteps = 50\n").unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        assert_eq!(c.warm_start.batch_size, 8);
        let e = invalid("[warm_start]\nsteps = 5\nbatch_size = 0\n");
        assert_eq!(e.key, "warm_start.batch_size", "{e}");
        let e = invalid("[warm_start]\nsteps = 5\nearly_wrong_answer_prob = 1.5\n");
        assert!(
            e.key == "warm_start.early_wrong_answer_prob" && e.message.contains("[0, 1]"),
            "{e}"
        );
        let e = invalid("[warm_start]\nstep = 5\n");
        assert!(e.key.contains("warm_start"), "{e}");
        let e = invalid("[warm_start]\nsteps = 5\nvariants_per_question = 0\n");
        assert!(
            e.key == "warm_start.variants_per_question" && e.message.contains("[1, 64]"),
            "{e}"
        );
        let habit = |body: &str| format!("[warm_start]\nsteps = 5\n[warm_start.bad_habit]\n{body}");
        let c = parse(&habit("steps = 30\n")).unwrap();
        assert_eq!(
            c.warm_start.bad_habit,
            Some(BadHabitSection {
                steps: 30,
                ..BadHabitSection::default()
            })
        );
        for (body, key, allowed) in [
            ("steps = 0\n", "warm_start.bad_habit.steps", ">= 1"),
            (
                "learning_rate = 0.0\n",
                "warm_start.bad_habit.learning_rate",
                "> 0",
            ),
            (
                "early_wrong_answer_prob = -0.1\n",
                "warm_start.bad_habit.early_wrong_answer_prob",
                "[0, 1]",
            ),
            (
                "variants_per_question = 65\n",
                "warm_start.bad_habit.variants_per_question",
                "[1, 64]",
            ),
        ] {
            let e = invalid(&habit(body));
            assert!(e.key == key && e.message.contains(allowed), "{body}: {e}");
        }
        let e = invalid(&habit("step = 3\n"));
        assert!(e.key.contains("bad_habit"), "an unknown key is named: {e}");
    }

    #[test]
    fn missing_files_are_reported_unless_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        let text = format!(
            "[model]\ndir = {:?}\n[env]\nname = \"multihop_qa\"\ntrain_files = [{:?}]\n",
            model.display().to_string(),
            dir.path().join("train.json").display().to_string()
        );
        let c = TrainConfig::from_toml_str(&text).unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        let e = c
            .validate(FileCheck::Require, &Registries::builtins())
            .unwrap_err();
        assert!(
            e.key == "model.dir" && e.message.contains("config.json"),
            "{e}"
        );
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let e = c
            .validate(FileCheck::Require, &Registries::builtins())
            .unwrap_err();
        assert!(
            e.key == "env.train_files" && e.message.contains("train.json: no such file"),
            "{e}"
        );
        // And through `load`, the file name leads the message.
        let path = dir.path().join("c.toml");
        std::fs::write(&path, &text).unwrap();
        let e = TrainConfig::load(&path, FileCheck::Require, &Registries::builtins()).unwrap_err();
        assert!(
            e.to_string().starts_with(&path.display().to_string()),
            "{e}"
        );
        let e = TrainConfig::load(
            &dir.path().join("nope.toml"),
            FileCheck::Skip,
            &Registries::builtins(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot read the config"), "{e}");
    }

    #[test]
    fn env_rules_and_env_option_errors() {
        let e = TrainConfig::from_toml_str("[model]\npreset = \"tiny\"\n[env]\nname = \"chess\"\n")
            .unwrap()
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err();
        assert!(
            e.key == "env.name" && e.message.contains("synthetic_multihop"),
            "{e}"
        );
        let e = invalid("train_files = [\"x.json\"]\n");
        assert_eq!(e.key, "env.train_files", "{e}");
        let e = invalid("[env.world]\nn_countries = 1\n");
        assert_eq!(e.key, "env.world.n_countries", "{e}");
        let e = invalid("[env.world]\ncountries = 3\n");
        assert_eq!(e.key, "env.world.countries", "{e}");
        let e = invalid("[env.options]\nrewardd = \"hotpotqa_em\"\n");
        assert!(
            e.key == "env.options.rewardd" && e.message.contains("reward"),
            "{e}"
        );
        let e = invalid("[env.options]\nreward = \"bleu\"\n");
        assert_eq!(e.key, "env.options", "{e}");
        assert!(e.message.contains("bleu"), "{e}");
        let e = invalid("[env.dataset]\non_bad_row = \"ignore\"\n");
        assert_eq!(e.key, "env.dataset.on_bad_row", "{e}");
        // World options reach the env.
        let c = parse("[env.world]\nseed = 3\nn_questions = 50\n").unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        assert_eq!(c.env_options()["world"]["n_questions"], 50);
    }

    #[test]
    fn math_envs_follow_the_same_rules() {
        let math = |body: &str| {
            TrainConfig::from_toml_str(&format!(
                "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_math\"\n{body}"
            ))
            .and_then(|c| c.validate(FileCheck::Skip, &Registries::builtins()))
        };
        math("[env.options.problems]\nn_problems = 50\n[warm_start]\nsteps = 5\n").unwrap();
        let e = math("[env.options.problems]\nn_problems = 0\n").unwrap_err();
        assert!(
            e.key == "env.options.problems.n_problems" && e.message.contains("1 to 100000"),
            "{e}"
        );
        let e = math("[env.options]\ntolerance = 1.0\n").unwrap_err();
        assert!(
            e.key == "env.options.tolerance" && e.message.contains("[0, 0.1]"),
            "{e}"
        );
        let e = math("train_files = [\"gsm8k.jsonl\"]\n").unwrap_err();
        assert!(
            e.key == "env.train_files" && e.message.contains("generates"),
            "{e}"
        );
        let e = math("[env.world]\nseed = 1\n").unwrap_err();
        assert_eq!(e.key, "env.world", "{e}");
        // `math` reads dataset files, so it makes no demonstrations to warm start on.
        let e = TrainConfig::from_toml_str(
            "[model]\npreset = \"tiny\"\n[env]\nname = \"math\"\ntrain_files = [\"g.jsonl\"]\n[warm_start]\nsteps = 5\n",
        )
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
        assert!(
            e.key == "warm_start.steps" && e.message.contains("synthetic_math"),
            "{e}"
        );
    }

    #[test]
    fn tool_tables_reuse_the_envs_reading() {
        let c =
            parse("[tools.search]\ntop_k = 3\n[tools.py]\ntype = \"python\"\ntimeout_secs = 2.5\n")
                .unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        let tools = c.tools_config(None);
        assert_eq!(tools.tables.len(), 2);
        assert_eq!(tools.tables["py"]["timeout_secs"], 2.5);
        // Same result as the envs crate reading the same text.
        let text = format!("{MINIMAL}[tools.search]\ntop_k = 3\n[tools.py]\ntype = \"python\"\ntimeout_secs = 2.5\n");
        assert_eq!(ToolsConfig::from_toml_str(&text).unwrap(), tools);
        let e = invalid("[tools.web]\nurl = \"x\"\n");
        assert!(
            e.key == "tools.web" && e.message.contains("calculator"),
            "{e}"
        );
        let e = invalid("[tools.x]\ntype = 3\n");
        assert_eq!(e.key, "tools.x.type", "{e}");
        let e = invalid("[tools]\nsearch = 1\n");
        assert_eq!(e.key, "tools.search", "{e}");
    }

    #[test]
    fn tool_options_are_checked_by_their_kind_as_train_builds_them() {
        // An MCP table passes only with what `train` needs to start the server.
        let e = invalid("[tools.clock]\ntype = \"mcp\"\n");
        assert!(
            e.key == "tools.clock.command" && e.message.contains("url"),
            "{e}"
        );
        let e = invalid("[tools.clock]\ntype = \"mcp\"\ncommand = \"x\"\ntimeout_secs = 1e30\n");
        assert_eq!(e.key, "tools.clock.timeout_secs", "{e}");
        let e = invalid("[tools.python]\ntimeout = 3\n");
        assert_eq!(e.key, "tools.python.timeout", "{e}");
        let e = invalid("[tools.py]\ntype = \"python\"\nmemory_mib = 0\n");
        assert_eq!(e.key, "tools.py.memory_mib", "{e}");
        let e = invalid("[tools.search]\ntop_k = 0\n");
        assert_eq!(e.key, "tools.search.top_k", "{e}");
        let e = invalid("[tools.calc]\ntype = \"calculator\"\nprecision = 3\n");
        assert_eq!(e.key, "tools.calc.precision", "{e}");
        // Nothing is started to check: a server that does not exist passes.
        parse("[tools.clock]\ntype = \"mcp\"\ncommand = \"/nonexistent/server\"\n")
            .unwrap()
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
    }

    #[test]
    fn a_scorer_table_is_checked_by_its_kind() {
        let judge = "[scorer]\ntype = \"http_judge\"\nurl = \"http://127.0.0.1:8000/v1/chat/completions\"\n";
        let c = parse(judge).unwrap();
        c.validate(FileCheck::Skip, &Registries::builtins())
            .unwrap();
        assert_eq!(c.scorer_options().unwrap().unwrap().0, "http_judge");
        let e = invalid("[scorer]\nurl = \"http://x\"\n");
        assert_eq!(e.key, "scorer.type", "{e}");
        let e = invalid("[scorer]\ntype = \"gpt_judge\"\n");
        assert!(
            e.key == "scorer.type" && e.message.contains("http_judge"),
            "{e}"
        );
        let e = invalid("[scorer]\ntype = \"http_judge\"\nurl = \"ftp://x\"\n");
        assert_eq!(e.key, "scorer.url", "{e}");
        let e = invalid(&format!("{judge}timeout_secs = 1e30\n"));
        assert_eq!(e.key, "scorer.timeout_secs", "{e}");
        let e = invalid(&format!("{judge}retry = 3\n"));
        assert_eq!(e.key, "scorer.retry", "{e}");
        let e = invalid(&format!("{judge}max_concurrency = 0\n"));
        assert_eq!(e.key, "scorer.max_concurrency", "{e}");
    }

    #[test]
    fn a_search_table_gets_the_envs_corpus() {
        let c = parse("[tools.search]\ntop_k = 3\n").unwrap();
        let world = Path::new("/run/world");
        let tools = c.tools_config(Some(world));
        assert_eq!(
            tools.tables["search"]["corpus"],
            json!(world.join("corpus.jsonl"))
        );
        assert_eq!(
            tools.tables["search"]["index_dir"],
            json!(world.join("search-index"))
        );
        // Another kind under the name `search` gets the corpus, not the built-in's index.
        let c = parse("[tools.search]\ntype = \"mine\"\n").unwrap();
        let tools = c.tools_config(Some(world));
        assert!(tools.tables["search"].get("index_dir").is_none());
        assert_eq!(
            tools.tables["search"]["corpus"],
            json!(world.join("corpus.jsonl"))
        );
    }
}
