//! The `Tool` extension point: what a tool is, what a call returns, and how a call can fail.
//!
//! A user's own tool is one type implementing [`Tool`] plus one registration line. The
//! runtime runs every tool behind a pool with the tool's [`Tool::max_concurrency`] and
//! [`Tool::timeout`], so a slow or dead tool never stalls generation.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a successful tool call returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The observation shown to the model (before truncation to the env's limit).
    pub text: String,
    /// An optional process reward for this call (for example, a retrieval hit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// Free-form facts for logs and metrics (hit ids, exit codes, ...); never shown to the model.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, Value>,
}

impl ToolOutput {
    /// An output with text only.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }
}

/// A tool the agent can call.
///
/// Arguments reach [`Tool::call`] only after they were validated against
/// [`Tool::parameters`], so implementations may index into them without re-checking types
/// the schema already guarantees.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The name the model uses in `{"name": ...}`.
    fn name(&self) -> &str;
    /// One or two sentences for the model: what it does and when to use it.
    fn description(&self) -> &str;
    /// JSON schema of the arguments (an `"type": "object"` schema, OpenAI function format).
    fn parameters(&self) -> Value;
    /// Wall-clock limit for one call; past it the call fails with [`CallError::Timeout`].
    fn timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    /// How many calls of this tool may run at once.
    fn max_concurrency(&self) -> usize {
        16
    }
    /// Runs the call. An `Err` becomes an error observation for the model, never a crash.
    async fn call(&self, arguments: Value) -> crate::Result<ToolOutput>;

    /// Runs the call made under `key`, its idempotency key (the same each time this call of
    /// this episode is made, after a crash too). A tool whose calls have side effects passes
    /// the key on to whatever can tell a repeated call from a new one; the default ignores it
    /// and runs [`Tool::call`].
    async fn call_keyed(
        &self,
        key: &crate::call_key::CallKey,
        arguments: Value,
    ) -> crate::Result<ToolOutput> {
        let _ = key;
        self.call(arguments).await
    }

    /// The OpenAI function spec that chat templates receive in `tools`.
    fn spec(&self) -> Value {
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.name(),
                "description": self.description(),
                "parameters": self.parameters(),
            }
        })
    }
}

/// Why a tool call produced no output. Each variant becomes an observation the model can
/// learn from, in the wording Agent-R1 uses (`Error: JSONDecodeError`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum CallError {
    /// The text between the tags was not valid JSON.
    #[error("Error: JSONDecodeError: {0}")]
    InvalidJson(String),
    /// The JSON had no string `name`.
    #[error("Error: No tool name")]
    MissingName,
    /// No tool of that name is available in this episode.
    #[error("Error: ToolNotFoundError: no tool named `{0}`")]
    UnknownTool(String),
    /// The arguments failed the tool's schema.
    #[error("Error: Invalid tool arguments: {0}")]
    InvalidArguments(String),
    /// The call ran past the tool's timeout.
    #[error("Error: Timeout: the tool did not answer within {0:?}")]
    Timeout(Duration),
    /// The tool's queue was full and the call was shed.
    #[error("Error: Overloaded: the tool is busy, try again later")]
    Overloaded,
    /// The tool ran and failed.
    #[error("Error: {0}")]
    Failed(String),
    /// The tool panicked while running the call.
    #[error("Error: the tool panicked: {0}")]
    Panicked(String),
    /// The turn made more calls than a turn may (`env.max_tool_calls_per_turn`); this one
    /// was not run.
    #[error(
        "Error: TooManyToolCalls: a turn may make at most {0} tool calls; this call was not run"
    )]
    TooManyCalls(usize),
}

impl CallError {
    /// A short stable label for metrics (`invalid_json`, `timeout`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::InvalidJson(_) => "invalid_json",
            CallError::MissingName => "missing_name",
            CallError::UnknownTool(_) => "unknown_tool",
            CallError::InvalidArguments(_) => "invalid_arguments",
            CallError::Timeout(_) => "timeout",
            CallError::Overloaded => "overloaded",
            CallError::Failed(_) => "failed",
            CallError::Panicked(_) => "panicked",
            CallError::TooManyCalls(_) => "too_many_calls",
        }
    }
}

/// A well-formed call parsed from the model's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Tool name.
    pub name: String,
    /// Arguments as a JSON value (an object when well formed).
    pub arguments: Value,
}

/// The result of one call attempt, parsed or not, run or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    /// The tool's name, where the call got far enough to have one.
    pub name: Option<String>,
    /// The output, or why there is none.
    pub result: Result<ToolOutput, CallError>,
    /// Time from dispatch to answer (zero for calls that never ran).
    pub latency: Duration,
}

impl CallOutcome {
    /// The observation text for the model, cut to `max_chars` characters (not bytes, so a
    /// cut never splits a UTF-8 sequence).
    pub fn observation(&self, max_chars: usize) -> String {
        let full = match &self.result {
            Ok(out) => std::borrow::Cow::Borrowed(out.text.as_str()),
            Err(e) => std::borrow::Cow::Owned(e.to_string()),
        };
        truncate_chars(&full, max_chars)
    }
}

/// Cuts `text` to at most `max_chars` characters, appending a marker when it cut.
pub fn truncate_chars(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((byte, _)) => format!("{}...[truncated]", &text[..byte]),
    }
}
