//! `[warm_start]`: supervised steps on generated demonstrations before RL.

use agent_r1_actors::sft::SftConfig;
use agent_r1_envs::config::Section;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[warm_start]`: a short supervised warm start on generated demonstrations before RL, so
/// that a fresh model knows the tool-call format (RL alone rarely discovers it). Only envs
/// that generate their own tasks (`synthetic_multihop`, `synthetic_math`, a user's
/// `register_generated` env) make demonstrations; `steps = 0` (the default) skips it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WarmStartSection {
    /// Optimizer steps (0 = no warm start).
    pub steps: usize,
    /// Demonstrations per step.
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Peak learning rate.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub learning_rate: f64,
    /// Rate at the last step as a fraction of the peak (cosine decay; 1 keeps it constant
    /// after the warm-up).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub final_lr_fraction: f64,
    /// Share of demonstrations that answer before the work is done with a wrong answer
    /// (the multi-hop world: the entity the first search found; math: a number off by a
    /// few, without the calculator): imperfect on purpose, so RL has something to fix.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub early_wrong_answer_prob: f64,
    /// Demonstrations per training question. Above one, every question gets both kinds in
    /// the proportion above, so the habit of answering early is the same on every question
    /// (and on held-out ones) rather than memorised per question.
    #[schemars(range(min = 1, max = 64))]
    pub variants_per_question: usize,
    /// A last phase that teaches a bad habit, after the steps above taught the skills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad_habit: Option<BadHabitSection>,
    /// Your own demonstrations, for any env: a JSONL of chat-format conversations (OpenAI /
    /// Hugging Face messages with `tool_calls`), trained on instead of generated ones, as
    /// `agent-r1 sft` does (docs/own-data.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<std::path::PathBuf>,
}

/// `[warm_start.bad_habit]`: more warm-start steps on demonstrations that mostly answer right
/// after the first search, with the entity it found (in the multi-hop world).
///
/// Why a separate phase: a small model learns to copy names from its context only after
/// some hundreds of steps on demonstrations that do it, and far later when most of them
/// guess instead. So the skills come first on (mostly) gold demonstrations, and a short
/// phase then sets the probability of answering early on every question, which greedy
/// decoding turns into a policy that always stops early: a flaw RL sees in its samples (the
/// episodes that search again score) and can remove.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BadHabitSection {
    /// Optimizer steps, at the warm start's batch size.
    #[schemars(range(min = 1))]
    pub steps: usize,
    /// Learning rate (constant after a short warm-up). Lower than the first phase's: the
    /// habit is one decision, and a high rate on wrong answers also erodes copying.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub learning_rate: f64,
    /// Share of these demonstrations that answer early.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub early_wrong_answer_prob: f64,
    /// Demonstrations per training question.
    #[schemars(range(min = 1, max = 64))]
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
            data: None,
        }
    }
}

impl Section for WarmStartSection {}
