//! The `Env` extension point: a task family.
//!
//! An env turns a [`Task`] into the first messages, decides after each assistant turn
//! whether to call tools or stop, formats tool results as observations, and scores the
//! finished episode. It does not run tools itself: the runtime does that through its tool
//! pools, so that tool concurrency, timeouts and restarts live in one place.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::Message;
use crate::task::Task;
use crate::tool::{CallError, CallOutcome, ToolCall};

/// What an env says after an assistant turn.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnOutcome {
    /// Run these calls (parse failures included, as errors to show the model), then continue.
    Calls(Vec<Result<ToolCall, CallError>>),
    /// The episode is over: the turn had no tool call (a final answer, or nothing usable).
    Done,
}

/// A finished episode's score.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// The scalar reward the learner optimises (placed on the last generated token).
    pub reward: f64,
    /// Named metrics (`em`, `f1`, `substring_em`, `format`, ...), so users know which EM
    /// they read.
    pub metrics: BTreeMap<String, f64>,
}

/// A task family.
pub trait Env: Send + Sync + 'static {
    /// Registry name (`multihop_qa`, `synthetic_multihop`, ...).
    fn name(&self) -> &str;

    /// Names of the tools an episode of this env may call.
    fn tool_names(&self) -> Vec<String>;

    /// The first messages of an episode (system prompt and the question).
    fn reset(&self, task: &Task) -> crate::Result<Vec<Message>>;

    /// Decides what an assistant turn asks for. `calls` are the turn's tool calls as the
    /// model's tool-call format ([`crate::tool_call::ToolCallFormat`]) parsed them from
    /// `assistant_text`. The default follows Agent-R1: a turn with tool calls runs them, a
    /// turn without one ends the episode.
    fn on_turn(
        &self,
        _task: &Task,
        _assistant_text: &str,
        calls: Vec<Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        if calls.is_empty() {
            TurnOutcome::Done
        } else {
            TurnOutcome::Calls(calls)
        }
    }

    /// Longest observation shown to the model, in characters (`max_tool_response_length`).
    fn max_observation_chars(&self) -> usize {
        2048
    }

    /// Messages that carry the call results back to the model: one `tool` message per
    /// call, which Qwen-style templates wrap in `<tool_response>` inside a user turn.
    fn observe(&self, _task: &Task, outcomes: &[CallOutcome]) -> Vec<Message> {
        outcomes
            .iter()
            .map(|o| Message::tool(o.observation(self.max_observation_chars())))
            .collect()
    }

    /// Process reward for one turn's calls (added to the step). Default: the sum of the
    /// rewards the tools returned.
    fn step_reward(&self, _task: &Task, outcomes: &[CallOutcome]) -> f64 {
        outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().ok().and_then(|out| out.reward))
            .sum()
    }

    /// Scores a finished episode from its messages (the whole transcript, prompt included).
    fn score(&self, task: &Task, transcript: &[Message]) -> Score;

    /// Scores a finished episode, or says why it cannot be scored (an external scorer that
    /// failed): the runtime then fails the episode with that reason instead of training on
    /// a made-up reward. The runtime calls this; the default is [`Env::score`].
    fn try_score(&self, task: &Task, transcript: &[Message]) -> crate::Result<Score> {
        Ok(self.score(task, transcript))
    }

    /// The state this env holds for its episode after a finished turn, for a checkpoint to
    /// keep with the episode's steps (`None`, the default: it cannot be captured, and an
    /// episode resumed from a checkpoint starts over, counted as restarted). Asked only of
    /// envs built per episode: the steps and transcript of a shared env's episode, which
    /// the runtime keeps itself, are all there is to capture.
    fn snapshot(&self) -> crate::Result<Option<serde_json::Value>> {
        Ok(None)
    }

    /// Puts a freshly built env into a state its [`Env::snapshot`] returned, before the
    /// resumed episode's next turn. An error starts the episode over (counted) instead.
    fn restore(&self, state: serde_json::Value) -> crate::Result<()> {
        let _ = state;
        Err(crate::Error::Other(format!(
            "env `{}` keeps no snapshots",
            self.name()
        )))
    }
}
