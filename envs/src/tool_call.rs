//! How a model writes tool calls. The format is a property of the model (what its chat
//! template taught it), not of the env: Qwen models write hermes `<tool_call>` spans, Llama
//! 3.1-3.3 write a bare JSON object as the whole turn, Mistral writes `[TOOL_CALLS]` and a
//! JSON list.
//!
//! Parsing never fails as a whole: each call becomes either a [`ToolCall`] or a
//! [`CallError`] that is shown to the model, so malformed output is something to learn from.

pub mod hermes;
pub mod llama3_json;
pub mod mistral;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tool::{CallError, ToolCall};

pub use hermes::{parse_tool_calls, render_tool_call, CALL_CLOSE, CALL_OPEN};

/// A model's tool-call format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, several per turn (Qwen2.5,
    /// Qwen3, and Agent-R1's own prompts).
    #[default]
    Hermes,
    /// `{"name": ..., "parameters": {...}}` as the whole assistant turn (Llama 3.1-3.3's JSON
    /// tool calling).
    Llama3Json,
    /// `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]` as the whole assistant turn
    /// (Mistral-7B-Instruct v0.3 and later).
    Mistral,
}

impl ToolCallFormat {
    /// Every format, in the order messages list them.
    pub const ALL: [ToolCallFormat; 3] = [
        ToolCallFormat::Hermes,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
    ];

    /// The name used in configs.
    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
        }
    }

    /// The calls of an assistant turn, in order.
    pub fn parse(self, text: &str) -> Vec<Result<ToolCall, CallError>> {
        match self {
            ToolCallFormat::Hermes => hermes::parse_tool_calls(text),
            ToolCallFormat::Llama3Json => llama3_json::parse_tool_calls(text),
            ToolCallFormat::Mistral => mistral::parse_tool_calls(text),
        }
    }

    /// A call written as the model writes it.
    pub fn render(self, call: &ToolCall) -> String {
        match self {
            ToolCallFormat::Hermes => hermes::render_tool_call(call),
            ToolCallFormat::Llama3Json => llama3_json::render_tool_call(call),
            ToolCallFormat::Mistral => mistral::render_tool_call(call),
        }
    }

    /// Text after which generation stops because a call is complete (`None`: the model
    /// ends its turn after a call, with its end-of-turn token).
    pub fn call_end(self) -> Option<&'static str> {
        match self {
            ToolCallFormat::Hermes => Some(CALL_CLOSE),
            ToolCallFormat::Llama3Json | ToolCallFormat::Mistral => None,
        }
    }

    /// The text of a turn before its tool calls (a `<think>` block, a sentence), trimmed:
    /// what an OpenAI-style response returns as the message's `content` beside its
    /// `tool_calls`. The whole turn when it has no call start.
    pub fn content_before_calls(self, text: &str) -> &str {
        let cut = match self {
            ToolCallFormat::Hermes => text.find(CALL_OPEN),
            ToolCallFormat::Mistral => text
                .find(mistral::TOOL_CALLS_TAG)
                .or_else(|| json_turn_start(text, '[')),
            ToolCallFormat::Llama3Json => {
                json_turn_start(text, '{').or_else(|| text.find("<|python_tag|>"))
            }
        };
        cut.map_or(text, |at| &text[..at]).trim()
    }

    /// How the format writes a call, for system prompts: `call` as the model writes it.
    pub fn example(self, name: &str, arguments: Value) -> String {
        self.render(&ToolCall {
            name: name.to_string(),
            arguments,
        })
    }

    /// The format a chat template teaches, recognised by what it writes for tool calls:
    /// `<tool_call>` tags (hermes), `[TOOL_CALLS]` (Mistral), or Llama 3.1's `"parameters"`
    /// objects and `<|python_tag|>`. `None` for a template without tool calls.
    pub fn detect(chat_template: &str) -> Option<Self> {
        if chat_template.contains(CALL_OPEN) {
            Some(ToolCallFormat::Hermes)
        } else if chat_template.contains(mistral::TOOL_CALLS_TAG) {
            Some(ToolCallFormat::Mistral)
        } else if chat_template.contains("<|python_tag|>")
            || chat_template.contains("\"parameters\": ")
        {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }
}

impl std::fmt::Display for ToolCallFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ToolCallFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown tool-call format \"{s}\" (supported: {})",
                    Self::ALL.map(Self::name).join(", ")
                )
            })
    }
}

/// Where a turn that is a JSON call after an optional `<think>` block starts its JSON.
fn json_turn_start(text: &str, open: char) -> Option<usize> {
    let rest = after_think(text)?;
    rest.starts_with(open).then(|| text.len() - rest.len())
}

/// The turn past one leading `<think>...</think>` block (trimmed), or the whole turn when
/// it has none; `None` when the block is not closed. The JSON formats let an agent prompted
/// to reason first still call tools.
pub(crate) fn after_think(text: &str) -> Option<&str> {
    let rest = text.trim_start();
    match rest.strip_prefix("<think>") {
        Some(after) => {
            let end = after.find("</think>")?;
            Some(after[end + "</think>".len()..].trim_start())
        }
        None => Some(rest),
    }
}

/// Reads one call's JSON object: a string `name`, and its arguments under `arguments`
/// (hermes) or `parameters` (Llama 3.1), as an object or a JSON string holding one; none
/// means `{}`.
pub fn parse_call_body(body: &str) -> Result<ToolCall, CallError> {
    let value: Value =
        serde_json::from_str(body.trim()).map_err(|e| CallError::InvalidJson(e.to_string()))?;
    call_from_value(&value)
}

pub(crate) fn call_from_value(value: &Value) -> Result<ToolCall, CallError> {
    let name = match value.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        _ => return Err(CallError::MissingName),
    };
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            CallError::InvalidArguments(format!("the arguments are a string but not JSON: {e}"))
        })?,
        Some(other) => other.clone(),
    };
    Ok(ToolCall { name, arguments })
}

/// JSON with Python's `json.dumps` separators (`", "` and `": "`), as chat templates'
/// `tojson` writes it.
pub fn python_json(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_json(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_formats_parse_into_the_same_call() {
        let call = ToolCall {
            name: "search".into(),
            arguments: json!({"query": "Scott Derrickson", "top_k": 3}),
        };
        let hermes = "<think>I need his nationality.</think>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Scott Derrickson\", \"top_k\": 3}}\n</tool_call>";
        let llama = "{\"name\": \"search\", \"parameters\": {\"query\": \"Scott Derrickson\", \"top_k\": 3}}";
        assert_eq!(ToolCallFormat::Hermes.parse(hermes), vec![Ok(call.clone())]);
        assert_eq!(
            ToolCallFormat::Llama3Json.parse(llama),
            vec![Ok(call.clone())]
        );
        for format in ToolCallFormat::ALL {
            assert_eq!(format.parse(&format.render(&call)), vec![Ok(call.clone())]);
        }
    }

    #[test]
    fn names_round_trip_and_unknown_ones_say_what_is_supported() {
        for format in ToolCallFormat::ALL {
            assert_eq!(format.name().parse::<ToolCallFormat>(), Ok(format));
        }
        let e = "pythonic".parse::<ToolCallFormat>().unwrap_err();
        assert!(
            e.contains("pythonic") && e.contains("hermes, llama3_json, mistral"),
            "{e}"
        );
    }

    #[test]
    fn detects_the_format_a_template_teaches() {
        assert_eq!(
            ToolCallFormat::detect("{{- '<tool_call>\\n' }}"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(
            ToolCallFormat::detect("{{- '<|python_tag|>' + tool_call.name }}"),
            Some(ToolCallFormat::Llama3Json)
        );
        assert_eq!(
            ToolCallFormat::detect("{{- \"[TOOL_CALLS] [\" }}"),
            Some(ToolCallFormat::Mistral)
        );
        assert_eq!(ToolCallFormat::detect("{{ messages[0].content }}"), None);
    }
}
