//! `multihop_qa`: question answering with a `search` tool over any dataset format.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::corpus::CorpusSpec;
use super::options::{check_option_keys, parse_options};
use super::prompt::{first_messages, qa_system_prompt};
use crate::env::{Env, Score};
use crate::error::Result;
use crate::message::Message;
use crate::reward::{score_qa, ProcessRewardConfig, RewardKind};
use crate::task::Task;
use crate::tool::CallOutcome;
use crate::tool_call::ToolCallFormat;

/// Registry name.
pub const NAME: &str = "multihop_qa";

/// Options of `multihop_qa` (and of the QA part of `synthetic_multihop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct QaOptions {
    /// The reward trained on (`agent_r1_qa`, `hotpotqa_em`, `hotpotqa_f1`, `substring_em`).
    pub reward: RewardKind,
    /// System prompt for tasks without their own prompt (default: [`qa_system_prompt`] in
    /// the model's tool-call format).
    pub system_prompt: Option<String>,
    /// Use a task's ready-made prompt (Agent-R1 parquet rows) when it has one.
    pub use_task_prompt: bool,
    /// Longest observation shown to the model, in characters.
    #[schemars(range(min = 1))]
    pub max_observation_chars: usize,
    /// Per-call process rewards (off by default).
    pub process_reward: ProcessRewardConfig,
    /// Tools an episode may call.
    pub tools: Vec<String>,
    /// How the model writes tool calls (`hermes`, `llama3_json`, `mistral`): the default
    /// system prompt shows it, and the `format` reward and `tool_calls` metric read it. The
    /// trainer sets it to the model's own format (`[model] tool_call_format`, else what its
    /// chat template teaches) unless written here.
    pub tool_call_format: Option<ToolCallFormat>,
}

impl Default for QaOptions {
    fn default() -> Self {
        Self {
            reward: RewardKind::default(),
            system_prompt: None,
            use_task_prompt: true,
            max_observation_chars: 2048,
            process_reward: ProcessRewardConfig::default(),
            tools: vec!["search".to_string()],
            tool_call_format: None,
        }
    }
}

/// Options of `multihop_qa`: [`QaOptions`] plus the corpus to search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MultihopQaOptions {
    /// The QA settings.
    #[serde(flatten)]
    pub qa: QaOptions,
    /// The corpus the `search` tool should index (`{"jsonl": path}` or
    /// `{"hotpotqa": [paths]}`); `None` leaves it to the tool's own config.
    #[serde(default)]
    pub corpus: Option<CorpusSpec>,
}

/// Multi-hop QA: the model searches, then answers inside `<answer>`.
#[derive(Debug, Clone)]
pub struct MultihopQaEnv {
    name: String,
    options: MultihopQaOptions,
}

impl MultihopQaEnv {
    /// An env with these options.
    pub fn new(options: MultihopQaOptions) -> Result<Self> {
        Self::named(NAME, options)
    }

    /// The same behaviour under another registry name (used by `synthetic_multihop`).
    pub fn named(name: &str, options: MultihopQaOptions) -> Result<Self> {
        crate::config::check_declared(&options.qa).map_err(|e| e.under("env"))?;
        Ok(Self {
            name: name.to_string(),
            options,
        })
    }

    /// Builds from registry options; unknown keys are errors.
    pub fn from_options(options: &Value) -> Result<Self> {
        check_option_keys::<MultihopQaOptions>(NAME, options)?;
        Self::new(parse_options(NAME, options)?)
    }

    /// The options in effect.
    pub fn options(&self) -> &MultihopQaOptions {
        &self.options
    }

    /// The corpus the `search` tool should index, if configured.
    pub fn corpus(&self) -> Option<&CorpusSpec> {
        self.options.corpus.as_ref()
    }

    /// The reward trained on.
    pub fn reward_kind(&self) -> RewardKind {
        self.options.qa.reward
    }
}

impl Env for MultihopQaEnv {
    fn name(&self) -> &str {
        &self.name
    }

    fn tool_names(&self) -> Vec<String> {
        self.options.qa.tools.clone()
    }

    fn reset(&self, task: &Task) -> Result<Vec<Message>> {
        let qa = &self.options.qa;
        first_messages(
            task,
            qa.use_task_prompt,
            qa.system_prompt.as_deref(),
            &qa_system_prompt(qa.tool_call_format.unwrap_or_default()),
        )
    }

    fn max_observation_chars(&self) -> usize {
        self.options.qa.max_observation_chars
    }

    fn step_reward(&self, _task: &Task, outcomes: &[CallOutcome]) -> f64 {
        self.options.qa.process_reward.turn_reward(outcomes)
    }

    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        let qa = &self.options.qa;
        score_qa(
            qa.reward,
            qa.tool_call_format.unwrap_or_default(),
            &task.answers,
            transcript,
        )
    }
}
