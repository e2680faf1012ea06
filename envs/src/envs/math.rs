//! `math`: word problems with a numeric answer (GSM8K-format datasets or any other), solved
//! with a tool (`calculator` by default, or `python`), scored by numeric answer match.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::options::{check_option_keys, parse_options};
use super::prompt::{first_messages, math_system_prompt};
use crate::config::Section;
use crate::env::{Env, Score};
use crate::error::Result;
use crate::message::Message;
use crate::reward::numeric::score_numeric;
use crate::task::Task;
use crate::tool_call::ToolCallFormat;

/// Registry name.
pub const NAME: &str = "math";

/// Options of `math` (and of the scoring part of `synthetic_math`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct MathOptions {
    /// System prompt for tasks without their own prompt (default: [`math_system_prompt`] in
    /// the model's tool-call format).
    pub system_prompt: Option<String>,
    /// Use a task's ready-made prompt (Agent-R1 parquet rows) when it has one.
    pub use_task_prompt: bool,
    /// Longest observation shown to the model, in characters.
    #[schemars(range(min = 1))]
    pub max_observation_chars: usize,
    /// Tools an episode may call.
    pub tools: Vec<String>,
    /// Relative tolerance of the numeric match (absolute below 1).
    #[schemars(range(min = 0.0, max = 0.1))]
    pub tolerance: f64,
    /// How the model writes tool calls (`hermes`, `llama3_json`, `mistral`): the default
    /// system prompt shows it, and the `format` reward and `tool_calls` metric read it. The
    /// trainer sets it to the model's own format (`[model] tool_call_format`, else what its
    /// chat template teaches) unless written here.
    pub tool_call_format: Option<ToolCallFormat>,
}

impl Default for MathOptions {
    fn default() -> Self {
        Self {
            system_prompt: None,
            use_task_prompt: true,
            max_observation_chars: 2048,
            tools: vec!["calculator".to_string()],
            tolerance: 1e-6,
            tool_call_format: None,
        }
    }
}

impl Section for MathOptions {}

impl MathOptions {
    /// Checks the ranges; errors name `env.KEY` (reported by `train` as `env.options.KEY`).
    pub fn validate(&self) -> Result<()> {
        Section::validate(self).map_err(|e| e.under("env").into())
    }
}

/// Math word problems: the model computes with a tool, then answers inside `<answer>`.
#[derive(Debug, Clone)]
pub struct MathEnv {
    name: String,
    options: MathOptions,
}

impl MathEnv {
    /// An env with these options.
    pub fn new(options: MathOptions) -> Result<Self> {
        Self::named(NAME, options)
    }

    /// The same behaviour under another registry name (used by `synthetic_math`).
    pub fn named(name: &str, options: MathOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            name: name.to_string(),
            options,
        })
    }

    /// Builds from registry options; unknown keys are errors.
    pub fn from_options(options: &Value) -> Result<Self> {
        check_option_keys::<MathOptions>(NAME, options)?;
        Self::new(parse_options(NAME, options)?)
    }

    /// The options in effect.
    pub fn options(&self) -> &MathOptions {
        &self.options
    }
}

impl Env for MathEnv {
    fn name(&self) -> &str {
        &self.name
    }

    fn tool_names(&self) -> Vec<String> {
        self.options.tools.clone()
    }

    fn reset(&self, task: &Task) -> Result<Vec<Message>> {
        first_messages(
            task,
            self.options.use_task_prompt,
            self.options.system_prompt.as_deref(),
            &math_system_prompt(self.options.tool_call_format.unwrap_or_default()),
        )
    }

    fn max_observation_chars(&self) -> usize {
        self.options.max_observation_chars
    }

    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        score_numeric(
            self.options.tool_call_format.unwrap_or_default(),
            &task.answers,
            transcript,
            self.options.tolerance,
        )
    }
}
