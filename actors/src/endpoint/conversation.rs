//! One outside episode's chat history in token space.
//!
//! Every chat request is rendered into the context ids of one step. When its messages
//! repeat an earlier request's messages and then the assistant message this endpoint
//! returned for it, unchanged, the context is that request's context, the sampled ids as
//! they were sampled, and only what follows rendered anew (the template's end of turn, the
//! new messages, the generation prompt): nothing the model sampled is re-tokenised. Any
//! other request is rendered whole through the chat template, as `apply_chat_template`
//! would, and recorded as a rebuilt context.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use agent_r1_envs::tool_call::ToolCallFormat;

use super::error::ApiError;
use super::protocol::same_assistant_message;
use crate::runtime::TurnRenderer;
use crate::tokenizer::HfTokenizer;

/// The most recent answers a request can continue in token space; a request that sends back
/// an older reply is rendered whole (each answer holds its whole context).
const ANSWERS_KEPT: usize = 64;

/// A request that was answered: what it asked, the context the engine saw, one sampled
/// answer and the assistant message returned for it.
#[derive(Debug, Clone)]
struct Answered {
    messages: Vec<Value>,
    tools: Vec<Value>,
    context: Vec<u32>,
    action_ids: Vec<u32>,
    reply: Value,
}

/// A request's context and how it was built.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The ids the engine will see.
    pub context: Vec<u32>,
    /// Leading ids taken from an earlier step (its context and sampled action).
    pub reused_tokens: usize,
    /// The request carries earlier assistant messages that were not reused as sampled
    /// (edited, or never returned by this endpoint).
    pub rebuilt: bool,
    /// The renderer for the request's tools (parses the model's calls).
    pub renderer: Arc<TurnRenderer>,
}

/// An episode's answered requests.
#[derive(Debug)]
pub struct Conversation {
    tokenizer: Arc<HfTokenizer>,
    format: ToolCallFormat,
    answered: Vec<Answered>,
    renderers: HashMap<String, Arc<TurnRenderer>>,
    next_call_id: usize,
    /// The steps each completion id answered with (a step reward names its completion).
    completions: HashMap<String, Vec<usize>>,
    /// The step that wrote each tool call, by the call's id.
    call_steps: HashMap<String, usize>,
}

impl Conversation {
    /// A conversation of a model with this tokenizer (and chat template) and tool-call format.
    pub fn new(tokenizer: Arc<HfTokenizer>, format: ToolCallFormat) -> Self {
        Self {
            tokenizer,
            format,
            answered: vec![],
            renderers: HashMap::new(),
            next_call_id: 0,
            completions: HashMap::new(),
            call_steps: HashMap::new(),
        }
    }

    /// Notes the steps a completion id answered with.
    pub fn record_completion(&mut self, id: &str, steps: Vec<usize>) {
        self.completions.insert(id.to_string(), steps);
    }

    /// The steps a completion id answered with.
    pub fn steps_of(&self, id: &str) -> Option<&[usize]> {
        self.completions.get(id).map(Vec::as_slice)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<HfTokenizer> {
        &self.tokenizer
    }

    /// A fresh id for a tool call that `step` wrote: nine alphanumerics, unique in the
    /// episode (Mistral's template requires exactly nine).
    pub fn next_call_id(&mut self, step: usize) -> String {
        self.next_call_id += 1;
        let id = format!("call{:05}", self.next_call_id % 100_000);
        self.call_steps.insert(id.clone(), step);
        id
    }

    /// The step that wrote the tool call `id` (one this endpoint returned).
    pub fn step_of_call(&self, id: &str) -> Option<usize> {
        self.call_steps.get(id).copied()
    }

    fn renderer(&mut self, tools: &[Value]) -> Result<Arc<TurnRenderer>, ApiError> {
        let key = serde_json::to_string(tools).unwrap_or_default();
        if let Some(r) = self.renderers.get(&key) {
            return Ok(r.clone());
        }
        let r = TurnRenderer::new(self.tokenizer.clone(), tools.to_vec(), Some(self.format))
            .map(Arc::new)
            .map_err(|e| ApiError::invalid(format!("tools: {e}"), Some("tools".into())))?;
        self.renderers.insert(key, r.clone());
        Ok(r)
    }

    /// The context of a request with these messages and tools (as the template reads them).
    pub fn prepare(&mut self, messages: &[Value], tools: &[Value]) -> Result<Prepared, ApiError> {
        let renderer = self.renderer(tools)?;
        if let Some(earlier) = self.best_match(messages, tools) {
            let rest = &messages[earlier.messages.len() + 1..];
            // A template that cannot continue these messages in token space falls back to
            // the whole rendering below.
            if let Ok(suffix) = renderer.continuation_of_values(&earlier.action_ids, rest) {
                let mut context = earlier.context.clone();
                context.extend(&earlier.action_ids);
                let reused_tokens = context.len();
                context.extend(suffix);
                return Ok(Prepared {
                    context,
                    reused_tokens,
                    rebuilt: rest.iter().any(is_assistant),
                    renderer,
                });
            }
        }
        let tools = (!tools.is_empty()).then_some(tools);
        let context = self
            .tokenizer
            .encode_chat(messages, tools, true)
            .map_err(|e| {
                ApiError::invalid(
                    format!("the model's chat template cannot render this request: {e}"),
                    Some("messages".into()),
                )
            })?;
        Ok(Prepared {
            context,
            reused_tokens: 0,
            rebuilt: messages.iter().any(is_assistant),
            renderer,
        })
    }

    /// The answered request whose messages and reply `messages` continue, the longest
    /// (latest among equals).
    fn best_match(&self, messages: &[Value], tools: &[Value]) -> Option<&Answered> {
        self.answered
            .iter()
            .filter(|a| {
                let k = a.messages.len();
                messages.len() > k
                    && a.tools == tools
                    && messages[..k] == a.messages[..]
                    && same_assistant_message(&messages[k], &a.reply)
            })
            .max_by_key(|a| a.messages.len())
    }

    /// Records an answer: later requests that send `reply` back reuse `action_ids`.
    pub fn record(
        &mut self,
        messages: &[Value],
        tools: &[Value],
        context: &[u32],
        action_ids: &[u32],
        reply: Value,
    ) {
        if self.answered.len() == ANSWERS_KEPT {
            self.answered.remove(0);
        }
        self.answered.push(Answered {
            messages: messages.to_vec(),
            tools: tools.to_vec(),
            context: context.to_vec(),
            action_ids: action_ids.to_vec(),
            reply,
        });
    }
}

fn is_assistant(m: &Value) -> bool {
    m.get("role").and_then(Value::as_str) == Some("assistant")
}
