//! Chat messages: the text-level view of an episode's context.
//!
//! The runtime trains on token ids, never on these strings; messages exist so that an env can
//! say what the model should see, and the chat template turns them into tokens once.

use serde::{Deserialize, Serialize};

/// Who speaks a message, as chat templates name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// The user (or the env speaking as the user).
    User,
    /// The model.
    Assistant,
    /// A tool result; Qwen-style templates wrap it in `<tool_response>` inside a user turn.
    Tool,
}

impl Role {
    /// The name chat templates use.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Text content.
    pub content: String,
    /// The call a tool result answers, for templates that pair them (Mistral's wants a
    /// 9-character id on every result); the renderer numbers results that have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with this role and content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_call_id: None,
        }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// A tool-result message.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new(Role::Tool, content)
    }
    /// This message, answering the call `id`.
    pub fn with_tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.tool_call_id = Some(id.into());
        self
    }
}
