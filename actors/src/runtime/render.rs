//! Building an episode's context in token space.
//!
//! The context of turn k+1 is the context of turn k, the sampled ids unchanged, the template's
//! end-of-turn ids, and the ids of the observation messages plus the next generation prompt.
//! The last part is rendered as a *suffix*: the template applied to a fixed conversation whose
//! assistant turn is a marker, followed by the observations; what the template writes after
//! the marker is what it adds after an assistant turn. The marker makes this independent of
//! how a template rewrites assistant turns (Qwen3 moves `<think>` blocks, Llama 3.1 trims).
//! Sampled text is never decoded and re-encoded, which is what broke Agent-R1's importance
//! ratios.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use agent_r1_envs::message::{Message, Role};
use agent_r1_envs::tool::{CallError, ToolCall};
use agent_r1_envs::tool_call::{mistral, ToolCallFormat};

use crate::tokenizer::HfTokenizer;
use crate::{Error, Result};

/// Stands for the sampled action in the rendered conversation; no template rewrites it.
const ACTION_MARKER: &str = "AGENT_R1_ACTION_MARKER";

/// Renders prompts and observation suffixes for one set of tools and one tool-call format.
#[derive(Debug)]
pub struct TurnRenderer {
    tokenizer: Arc<HfTokenizer>,
    tools: Option<Vec<Value>>,
    format: ToolCallFormat,
    /// Ids the template puts after an assistant message's content (e.g. `<|im_end|>`, `\n`).
    turn_close: Vec<u32>,
}

impl TurnRenderer {
    /// Checks that the template renders observations as a suffix that tokenizes on its own,
    /// and learns its turn-closing ids. `format` is the model's tool-call format; `None`
    /// takes the one its chat template teaches (hermes when it teaches none).
    pub fn new(
        tokenizer: Arc<HfTokenizer>,
        tools: Vec<Value>,
        format: Option<ToolCallFormat>,
    ) -> Result<Self> {
        let tools = (!tools.is_empty()).then_some(tools);
        let format = format
            .or_else(|| tokenizer.tool_call_format())
            .unwrap_or_default();
        let mut renderer = Self {
            tokenizer,
            tools,
            format,
            turn_close: vec![],
        };
        let (_, close) = renderer.split_at_marker(&[], false)?;
        renderer.turn_close = renderer.tokenizer.encode(&close, false)?;
        if renderer.turn_close.is_empty() {
            return Err(Error::Template(
                "the chat template adds nothing after an assistant turn".into(),
            ));
        }
        // The suffix must tokenize as it does inside the whole text; it does when it starts
        // with a special token, as every chat template's turn separator does.
        let probe = to_values(&renderer.with_call_ids(&[Message::tool("probe result")]))?;
        let (before, after) = renderer.split_at_marker(&probe, true)?;
        let whole = renderer
            .tokenizer
            .encode(&format!("{before}{ACTION_MARKER}{after}"), false)?;
        let mut parts = renderer
            .tokenizer
            .encode(&format!("{before}{ACTION_MARKER}"), false)?;
        parts.extend(renderer.tokenizer.encode(&after, false)?);
        if whole != parts {
            return Err(Error::Template(
                "what the chat template writes after an assistant turn does not tokenize on \
                 its own; cannot append observations as tokens"
                    .into(),
            ));
        }
        Ok(renderer)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<HfTokenizer> {
        &self.tokenizer
    }

    /// The tools shown to the model.
    pub fn tools(&self) -> Option<&[Value]> {
        self.tools.as_deref()
    }

    /// How the model writes tool calls.
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.format
    }

    /// The tool calls of a decoded assistant turn, in the model's format.
    pub fn parse_tool_calls(&self, text: &str) -> Vec<Result<ToolCall, CallError>> {
        self.format.parse(text)
    }

    /// The id that ends an assistant turn (the model stops on it).
    pub fn end_of_turn_id(&self) -> u32 {
        self.turn_close[0]
    }

    /// Every id generation stops on: the end of a turn, the tokenizer's end ids, and, when
    /// a turn may make one call (`calls_per_turn` = 1, Agent-R1's default), the end of a call
    /// where the format has one that is a single token (`</tool_call>`). With more, the turn
    /// runs to its end and every call in it is parsed.
    pub fn stop_ids(&self, calls_per_turn: usize) -> Vec<u32> {
        let mut stops = vec![self.end_of_turn_id()];
        if calls_per_turn <= 1 {
            stops.extend(
                self.format
                    .call_end()
                    .and_then(|end| self.tokenizer.single_token_id(end)),
            );
        }
        stops.extend(self.tokenizer.eos_token_ids());
        stops.sort_unstable();
        stops.dedup();
        stops
    }

    /// The first context of an episode.
    pub fn prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer
            .encode_chat(&self.with_call_ids(messages), self.tools.as_deref(), true)
    }

    /// `messages` with every tool result that has no `tool_call_id` numbered within its
    /// turn (`call00001`, ...), for formats whose template pairs results with calls
    /// (Mistral's); unchanged for the others.
    fn with_call_ids<'a>(&self, messages: &'a [Message]) -> Cow<'a, [Message]> {
        let needs = |m: &Message| m.role == Role::Tool && m.tool_call_id.is_none();
        if self.format != ToolCallFormat::Mistral || !messages.iter().any(needs) {
            return Cow::Borrowed(messages);
        }
        let mut n = 0;
        let numbered = messages
            .iter()
            .map(|m| {
                n = if m.role == Role::Tool { n + 1 } else { 0 };
                if needs(m) {
                    m.clone().with_tool_call_id(mistral::call_id(n))
                } else {
                    m.clone()
                }
            })
            .collect();
        Cow::Owned(numbered)
    }

    /// Ids to append after a sampled action so the context continues with `observations`
    /// and the next generation prompt.
    pub fn continuation(&self, action_ids: &[u32], observations: &[Message]) -> Result<Vec<u32>> {
        let observations = self.with_call_ids(observations);
        let observations = to_values(&observations)?;
        self.continuation_of_values(action_ids, &observations)
    }

    /// [`Self::continuation`] for messages as the chat template reads them (OpenAI-style
    /// objects: `tool_calls` on assistant messages, `tool_call_id` and `name` on tool
    /// results), written as they are.
    pub fn continuation_of_values(
        &self,
        action_ids: &[u32],
        observations: &[Value],
    ) -> Result<Vec<u32>> {
        let (_, suffix) = self.split_at_marker(observations, true)?;
        let suffix = self.tokenizer.encode(&suffix, false)?;
        if !suffix.starts_with(&self.turn_close) {
            return Err(Error::Template(
                "observation messages change how an assistant turn ends; cannot append them as \
                 tokens"
                    .into(),
            ));
        }
        let skip = usize::from(action_ids.last() == Some(&self.turn_close[0]));
        Ok(suffix[skip..].to_vec())
    }

    /// The ids that close an assistant turn after `action_ids` (the end-of-turn id is not
    /// repeated when the model sampled it).
    pub fn close_turn(&self, action_ids: &[u32]) -> Vec<u32> {
        if action_ids.last() == Some(&self.turn_close[0]) {
            self.turn_close[1..].to_vec()
        } else {
            self.turn_close.clone()
        }
    }

    /// Renders `user, assistant(marker), observations...` and splits the text around the
    /// marker.
    fn split_at_marker(
        &self,
        observations: &[Value],
        add_generation_prompt: bool,
    ) -> Result<(String, String)> {
        let mut convo = to_values(&[Message::user("x"), Message::assistant(ACTION_MARKER)])?;
        convo.extend_from_slice(observations);
        let text = self.tokenizer.apply_chat_template(
            &convo,
            self.tools.as_deref(),
            add_generation_prompt,
        )?;
        let mut pieces = text.split(ACTION_MARKER);
        match (pieces.next(), pieces.next(), pieces.next()) {
            (Some(before), Some(after), None) => Ok((before.to_string(), after.to_string())),
            _ => Err(Error::Template(
                "the chat template does not write an assistant turn's content exactly once; \
                 token-level episodes need one that does"
                    .into(),
            )),
        }
    }
}

/// Messages as the JSON objects the chat template reads.
fn to_values(messages: &[Message]) -> Result<Vec<Value>> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).map_err(|e| Error::Template(format!("a message: {e}"))))
        .collect()
}
