//! Context policies: what an episode's next turn sees, decided between turns in token space.
//!
//! After each turn the episode has the *chained* context (the last context, the sampled
//! action, the observation appended after it). A policy keeps it (`full`), or rebuilds the
//! context from the episode's turns: a window of the last turns, old tool responses elided
//! to a placeholder, or a summary the policy model writes itself. Sampled ids are reused as
//! they were sampled; only what a policy writes anew (a placeholder tool response, the
//! request for a summary) is rendered through the chat template. Policies are kinds by name
//! in a [`ContextPolicies`] registry, so a user's crate registers its own as it does tools.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use agent_r1_envs::config::{key_docs, KeyDoc};
use agent_r1_envs::kinds::{KindOptions, Kinds};
use agent_r1_envs::message::Message;

use super::render::TurnRenderer;
use crate::Result;

/// One finished turn of an episode, as a policy sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnRecord {
    /// The ids the policy sampled.
    pub action_ids: Vec<u32>,
    /// The ids appended after them (end of turn, observations, next generation prompt).
    pub observation_ids: Vec<u32>,
    /// The observation messages those ids render.
    pub observations: Vec<Message>,
}

/// What a policy decides from.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// The episode's first context.
    pub prompt_ids: &'a [u32],
    /// Every finished turn that called tools, oldest first (summary turns excluded).
    pub turns: &'a [TurnRecord],
    /// The chained context: the last context, its action and its observation.
    pub chained: &'a [u32],
}

/// A policy's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum NextContext {
    /// The next turn sees the chained context.
    Chained,
    /// The next turn sees these ids.
    Rebuilt(Vec<u32>),
    /// First ask the policy model for a summary on these ids (a step, trained on like any
    /// other); [`ContextPolicy::after_summary`] then builds the next context from it.
    Summarize(Vec<u32>),
}

impl NextContext {
    /// `ids` as the next context: `Chained` when they are the chained context.
    pub fn of(ids: Vec<u32>, chained: &[u32]) -> Self {
        if ids == chained {
            NextContext::Chained
        } else {
            NextContext::Rebuilt(ids)
        }
    }
}

/// A context policy (see the module documentation).
pub trait ContextPolicy: Send + Sync + std::fmt::Debug + 'static {
    /// The policy's name, recorded on every context it rebuilds.
    fn name(&self) -> &str;

    /// The next turn's context.
    fn next_context(&self, history: &History<'_>, renderer: &TurnRenderer) -> Result<NextContext>;

    /// The next turn's context once the summary `summary_ids` was sampled (for policies that
    /// answer [`NextContext::Summarize`]).
    fn after_summary(
        &self,
        _history: &History<'_>,
        _summary_ids: &[u32],
        _renderer: &TurnRenderer,
    ) -> Result<Vec<u32>> {
        Err(crate::Error::Other(format!(
            "context policy `{}` asked for a summary but does not build a context from one",
            self.name()
        )))
    }

    /// Whether the policy can work within contexts of `max_context` tokens; the reason
    /// when not (checked before a run starts).
    fn check_fits(&self, _max_context: usize) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// `full`: every turn sees the whole history (the default).
#[derive(Debug, Clone, Default)]
pub struct Full;

impl ContextPolicy for Full {
    fn name(&self) -> &str {
        "full"
    }

    fn next_context(&self, _: &History<'_>, _: &TurnRenderer) -> Result<NextContext> {
        Ok(NextContext::Chained)
    }
}

/// `window`: the prompt and the last `turns` turns.
#[derive(Debug, Clone)]
pub struct Window {
    turns: usize,
}

impl ContextPolicy for Window {
    fn name(&self) -> &str {
        "window"
    }

    fn next_context(&self, h: &History<'_>, _: &TurnRenderer) -> Result<NextContext> {
        if h.turns.len() <= self.turns {
            return Ok(NextContext::Chained);
        }
        let mut ids = h.prompt_ids.to_vec();
        for t in &h.turns[h.turns.len() - self.turns..] {
            ids.extend(&t.action_ids);
            ids.extend(&t.observation_ids);
        }
        Ok(NextContext::of(ids, h.chained))
    }
}

/// `elide`: every turn is kept, but the tool responses of turns older than the last
/// `keep_turns` are replaced by `placeholder`.
#[derive(Debug, Clone)]
pub struct Elide {
    keep_turns: usize,
    placeholder: String,
}

impl ContextPolicy for Elide {
    fn name(&self) -> &str {
        "elide"
    }

    fn next_context(&self, h: &History<'_>, renderer: &TurnRenderer) -> Result<NextContext> {
        if h.turns.len() <= self.keep_turns {
            return Ok(NextContext::Chained);
        }
        let old = h.turns.len() - self.keep_turns;
        let mut ids = h.prompt_ids.to_vec();
        for (i, t) in h.turns.iter().enumerate() {
            ids.extend(&t.action_ids);
            if i < old {
                let elided: Vec<Message> = t
                    .observations
                    .iter()
                    .map(|m| Message {
                        content: self.placeholder.clone(),
                        ..m.clone()
                    })
                    .collect();
                ids.extend(renderer.continuation(&t.action_ids, &elided)?);
            } else {
                ids.extend(&t.observation_ids);
            }
        }
        Ok(NextContext::of(ids, h.chained))
    }
}

/// `summary`: when the chained context passes `budget_tokens`, the policy model is asked
/// for a summary of its progress (`request`, a user message after the last tool response);
/// the next context is the prompt, the summary as the model's own earlier turn, and the last
/// tool response.
#[derive(Debug, Clone)]
pub struct Summary {
    budget_tokens: usize,
    request: String,
}

impl ContextPolicy for Summary {
    fn name(&self) -> &str {
        "summary"
    }

    fn next_context(&self, h: &History<'_>, renderer: &TurnRenderer) -> Result<NextContext> {
        let Some(last) = h.turns.last() else {
            return Ok(NextContext::Chained);
        };
        if h.chained.len() <= self.budget_tokens {
            return Ok(NextContext::Chained);
        }
        let mut ids = h.chained[..h.chained.len() - last.observation_ids.len()].to_vec();
        let mut messages = last.observations.clone();
        messages.push(Message::user(self.request.clone()));
        ids.extend(renderer.continuation(&last.action_ids, &messages)?);
        Ok(NextContext::Summarize(ids))
    }

    fn after_summary(
        &self,
        h: &History<'_>,
        summary_ids: &[u32],
        renderer: &TurnRenderer,
    ) -> Result<Vec<u32>> {
        let mut ids = h.prompt_ids.to_vec();
        ids.extend(summary_ids);
        let observations = h.turns.last().map_or(&[][..], |t| &t.observations[..]);
        ids.extend(renderer.continuation(summary_ids, observations)?);
        Ok(ids)
    }

    fn check_fits(&self, max_context: usize) -> std::result::Result<(), String> {
        if self.budget_tokens >= max_context {
            return Err(format!(
                "budget_tokens {} must be below rollout.max_context_length {max_context}, \
                 so that the summary request and the summary fit",
                self.budget_tokens
            ));
        }
        Ok(())
    }
}

/// `[env.context]` options of `full`: none.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FullOptions {}

impl KindOptions for FullOptions {}

/// `[env.context]` options of `window`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowOptions {
    /// Turns (an action and its tool response) kept after the prompt; older ones are dropped.
    #[schemars(range(min = 1))]
    pub turns: usize,
}

impl KindOptions for WindowOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        if self.turns == 0 {
            return Err(config_error(
                "env.context.turns",
                "must be at least 1 (a window of 0 turns drops every tool response)",
            ));
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        key_docs::<Self>()
    }
}

/// `[env.context]` options of `elide`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ElideOptions {
    /// Turns whose tool responses stay whole; older responses become the placeholder.
    #[schemars(range(min = 1))]
    pub keep_turns: usize,
    /// What an elided tool response says instead.
    #[serde(default = "default_placeholder")]
    pub placeholder: String,
}

fn default_placeholder() -> String {
    "[earlier tool output elided]".into()
}

impl KindOptions for ElideOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        if self.keep_turns == 0 {
            return Err(config_error(
                "env.context.keep_turns",
                "must be at least 1 (the last tool response is always shown)",
            ));
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        key_docs::<Self>()
    }
}

/// `[env.context]` options of `summary`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryOptions {
    /// Context tokens past which the model is asked to summarise.
    #[schemars(range(min = 1))]
    pub budget_tokens: usize,
    /// The user message asking for the summary.
    #[serde(default = "default_request")]
    pub request: String,
}

fn default_request() -> String {
    "Your context is full. Write a short summary of what you have found so far that you \
     need to finish the task. Do not call a tool."
        .into()
}

impl KindOptions for SummaryOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        if self.budget_tokens == 0 {
            return Err(config_error(
                "env.context.budget_tokens",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        key_docs::<Self>()
    }
}

fn config_error(key: &str, message: &str) -> agent_r1_envs::Error {
    agent_r1_envs::Error::Config {
        key: key.into(),
        message: message.into(),
    }
}

/// Context policies by name (`full`, `window`, `elide`, `summary`, and a user's own).
#[derive(Debug, Clone)]
pub struct ContextPolicies {
    kinds: Kinds<Arc<dyn ContextPolicy>>,
}

impl Default for ContextPolicies {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl ContextPolicies {
    /// The built-in policies.
    pub fn with_builtins() -> Self {
        let mut r = Self {
            kinds: Kinds::new(|_| "env.context".to_string()),
        };
        r.register("full", |_: FullOptions| Ok(Arc::new(Full)));
        r.register("window", |o: WindowOptions| {
            Ok(Arc::new(Window { turns: o.turns }))
        });
        r.register("elide", |o: ElideOptions| {
            Ok(Arc::new(Elide {
                keep_turns: o.keep_turns,
                placeholder: o.placeholder,
            }))
        });
        r.register("summary", |o: SummaryOptions| {
            Ok(Arc::new(Summary {
                budget_tokens: o.budget_tokens,
                request: o.request,
            }))
        });
        r
    }

    /// Adds (or replaces) the policy `name`, built from options `O`.
    pub fn register<O, F>(&mut self, name: impl Into<String>, build: F) -> &mut Self
    where
        O: KindOptions,
        F: Fn(O) -> agent_r1_envs::Result<Arc<dyn ContextPolicy>> + Send + Sync + 'static,
    {
        self.kinds.register(name, build);
        self
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.kinds.names()
    }

    /// The option keys of `name`, for `check-config --explain`.
    pub fn keys(&self, name: &str) -> Vec<KeyDoc> {
        self.kinds.keys(name)
    }

    /// Builds the policy `name` from its options (the `[env.context]` table without
    /// `policy`).
    pub fn create(
        &self,
        name: &str,
        options: &Value,
    ) -> agent_r1_envs::Result<Arc<dyn ContextPolicy>> {
        self.kinds.create("context policy", name, options)
    }
}
