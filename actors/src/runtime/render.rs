//! Building an episode's context in token space.
//!
//! The context of turn k+1 is the context of turn k, the sampled ids unchanged, the template's
//! end-of-turn ids, and the ids of the observation messages plus the next generation prompt.
//! The last part is rendered as a *delta*: the template applied to a fixed dummy conversation
//! ending with an assistant turn, with and without the observation messages appended; the
//! difference is what the template adds after an assistant turn. Sampled text is never
//! decoded and re-encoded, which is what broke Agent-R1's importance ratios.

use std::sync::Arc;

use serde_json::Value;

use agent_r1_envs::message::Message;

use crate::tokenizer::HfTokenizer;
use crate::{Error, Result};

/// Renders prompts and observation deltas for one set of tools.
#[derive(Debug)]
pub struct TurnRenderer {
    tokenizer: Arc<HfTokenizer>,
    tools: Option<Vec<Value>>,
    dummy: Vec<Message>,
    dummy_ids: Vec<u32>,
    /// Ids the template puts after an assistant message's content (e.g. `<|im_end|>`, `\n`).
    turn_close: Vec<u32>,
}

impl TurnRenderer {
    /// Checks that the template renders incrementally and learns its turn-closing ids.
    pub fn new(tokenizer: Arc<HfTokenizer>, tools: Vec<Value>) -> Result<Self> {
        let tools = (!tools.is_empty()).then_some(tools);
        let t = tools.as_deref();
        let dummy = vec![Message::user("x"), Message::assistant("y")];
        let prompt = tokenizer.encode_chat(&dummy[..1], t, true)?;
        let dummy_ids = tokenizer.encode_chat(&dummy, t, false)?;
        let content = tokenizer.encode("y", false)?;
        let mut expected = prompt.clone();
        expected.extend(&content);
        if !dummy_ids.starts_with(&expected) {
            return Err(Error::Template(
                "the chat template does not render an assistant turn as generation prompt + \
                 content; token-level episodes need a template that does (ChatML-style)"
                    .into(),
            ));
        }
        let turn_close = dummy_ids[expected.len()..].to_vec();
        if turn_close.is_empty() {
            return Err(Error::Template(
                "the chat template adds nothing after an assistant turn".into(),
            ));
        }
        Ok(Self {
            tokenizer,
            tools,
            dummy,
            dummy_ids,
            turn_close,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<HfTokenizer> {
        &self.tokenizer
    }

    /// The tools shown to the model.
    pub fn tools(&self) -> Option<&[Value]> {
        self.tools.as_deref()
    }

    /// The id that ends an assistant turn (the model stops on it).
    pub fn end_of_turn_id(&self) -> u32 {
        self.turn_close[0]
    }

    /// The first context of an episode.
    pub fn prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer
            .encode_chat(messages, self.tools.as_deref(), true)
    }

    /// Ids to append after a sampled action so the context continues with `observations`
    /// and the next generation prompt.
    pub fn continuation(&self, action_ids: &[u32], observations: &[Message]) -> Result<Vec<u32>> {
        let mut ids = self.close_turn(action_ids);
        let mut convo = self.dummy.clone();
        convo.extend_from_slice(observations);
        let full = self
            .tokenizer
            .encode_chat(&convo, self.tools.as_deref(), true)?;
        if !full.starts_with(&self.dummy_ids) {
            return Err(Error::Template(
                "observation messages change how earlier turns render; cannot append them as tokens"
                    .into(),
            ));
        }
        ids.extend(&full[self.dummy_ids.len()..]);
        Ok(ids)
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
}
