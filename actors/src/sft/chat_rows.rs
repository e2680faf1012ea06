//! Demonstrations from a JSONL file of conversations in the chat-messages format users
//! already have (OpenAI / Hugging Face): one `{"messages": [...], "tools": [...]}` per line,
//! assistant messages with `tool_calls` (`{"function": {"name", "arguments"}}`, arguments as
//! a JSON string or an object) and `tool` messages answering them.
//!
//! An assistant message becomes the text the model itself will write: its content, then each
//! call in the model's tool-call format, so the tokens trained on are the ones RL samples
//! and parses.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use agent_r1_envs::message::{Message, Role};
use agent_r1_envs::tool::ToolCall;
use agent_r1_envs::tool_call::ToolCallFormat;

use super::Demonstration;
use crate::{Error, Result};

/// How demonstrations are read: the model's call format and what a run lets a turn do.
#[derive(Debug, Clone)]
pub struct ChatRowRules {
    /// The model's tool-call format.
    pub format: ToolCallFormat,
    /// Tool names a call may use (`None`: any).
    pub tools: Option<BTreeSet<String>>,
    /// Calls one assistant turn may make (`env.max_tool_calls_per_turn`).
    pub max_calls_per_turn: usize,
    /// Specs shown to the model when a row has no `tools`.
    pub default_tools: Option<Vec<Value>>,
    /// The system message put first when a conversation has none (the env's own).
    pub default_system: Option<String>,
}

/// Reads every row of `path`; the first bad one is the error, with its line and field.
pub fn read_chat_demonstrations(path: &Path, rules: &ChatRowRules) -> Result<Vec<Demonstration>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut demos = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad =
            |message: String| Error::invalid(format!("{}:{}", path.display(), i + 1), message);
        let row: Value = serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        demos.push(demonstration(&row, rules).map_err(bad)?);
    }
    if demos.is_empty() {
        return Err(Error::invalid(
            path.display().to_string(),
            "no conversations (one {\"messages\": [...]} per line)",
        ));
    }
    Ok(demos)
}

/// One row as a demonstration, or what is wrong with it (naming the field).
pub fn demonstration(
    row: &Value,
    rules: &ChatRowRules,
) -> std::result::Result<Demonstration, String> {
    let messages = row
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("missing `messages` (a list of {role, content} objects)")?;
    let tools = match row.get("tools") {
        None | Some(Value::Null) => rules.default_tools.clone(),
        Some(Value::Array(t)) => Some(t.clone()),
        Some(_) => return Err("`tools` must be a list of function specs".into()),
    };
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = &rules.default_system {
        let has_system = messages
            .first()
            .and_then(|m| m.get("role"))
            .is_some_and(|r| r == "system" || r == "developer");
        if !has_system {
            out.push(Message::system(system.clone()));
        }
    }
    for (i, m) in messages.iter().enumerate() {
        out.push(message(i, m, rules)?);
    }
    if !out.iter().any(|m| m.role == Role::Assistant) {
        return Err("no assistant message: nothing to train on".into());
    }
    Ok(Demonstration {
        messages: out,
        tools,
    })
}

fn message(i: usize, m: &Value, rules: &ChatRowRules) -> std::result::Result<Message, String> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        other => {
            return Err(format!(
                "{}: {other:?}; allowed: system, developer, user, assistant, tool",
                at("role")
            ))
        }
    };
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(format!(
                        "{}: only text parts can be trained on",
                        at("content")
                    )),
                },
            )
            .collect::<std::result::Result<String, String>>()?,
        Some(_) => {
            return Err(format!(
                "{}: a string or a list of text parts",
                at("content")
            ))
        }
    };
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) if role == Role::Assistant => calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                tool_call(c, rules).map_err(|e| format!("{}[{k}]: {e}", at("tool_calls")))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(format!(
                "{}: only assistant messages make calls",
                at("tool_calls")
            ))
        }
        Some(_) => return Err(format!("{}: must be a list", at("tool_calls"))),
    };
    if calls.len() > rules.max_calls_per_turn {
        return Err(format!(
            "{}: {} calls in one turn, but a turn may make {} (env.max_tool_calls_per_turn)",
            at("tool_calls"),
            calls.len(),
            rules.max_calls_per_turn
        ));
    }
    if calls.len() > 1 && rules.format == ToolCallFormat::Llama3Json {
        return Err(format!(
            "{}: {} calls in one turn; the llama3_json format writes one call per turn",
            at("tool_calls"),
            calls.len()
        ));
    }
    if role == Role::Assistant && content.trim().is_empty() && calls.is_empty() {
        return Err(format!(
            "{}: an assistant message with neither content nor tool_calls",
            at("content")
        ));
    }
    let mut text = content.trim_end().to_string();
    for call in &calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&rules.format.render(call));
    }
    let mut message = Message::new(role, text);
    if role == Role::Tool {
        message.tool_call_id = m
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    Ok(message)
}

fn tool_call(c: &Value, rules: &ChatRowRules) -> std::result::Result<ToolCall, String> {
    let function = c
        .get("function")
        .ok_or("missing `function` {name, arguments}")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("missing `function.name`")?;
    if let Some(known) = &rules.tools {
        if !known.contains(name) {
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            return Err(format!(
                "calls `{name}`, which the run does not define (its tools: {})",
                known.join(", ")
            ));
        }
    }
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str(s)
            .map_err(|e| format!("`function.arguments` is not JSON ({e})"))?,
        Some(v) => v.clone(),
    };
    if !arguments.is_object() {
        return Err(format!(
            "`function.arguments` must be a JSON object, got {arguments}; the {} format writes \
             arguments as an object",
            rules.format.name()
        ));
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules() -> ChatRowRules {
        ChatRowRules {
            format: ToolCallFormat::Hermes,
            tools: Some(["search".to_string()].into()),
            max_calls_per_turn: 1,
            default_tools: None,
            default_system: Some("SYS".into()),
        }
    }

    #[test]
    fn openai_rows_become_what_the_model_writes() {
        let row = json!({"messages": [
            {"role": "user", "content": "Where was Ada born?"},
            {"role": "assistant", "content": "<think>look</think>", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "search", "arguments": "{\"query\": \"Ada\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Ada was born in Oslo."},
            {"role": "assistant", "content": "<answer>Oslo</answer>"}
        ]});
        let d = demonstration(&row, &rules()).unwrap();
        assert_eq!(d.messages[0], Message::system("SYS"));
        assert_eq!(
            d.messages[2].content,
            "<think>look</think>\n<tool_call>\n{\"name\":\"search\",\"arguments\":{\"query\":\"Ada\"}}\n</tool_call>"
        );
        assert_eq!(d.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(d.messages.len(), 5);
    }

    #[test]
    fn rows_the_run_cannot_express_are_named() {
        let e = demonstration(
            &json!({"messages": [{"role": "user", "content": "Q"}]}),
            &rules(),
        )
        .unwrap_err();
        assert!(e.contains("no assistant message"), "{e}");
        let call = |name: &str, args: Value| {
            json!({"messages": [{"role": "user", "content": "Q"},
                {"role": "assistant", "tool_calls": [{"function": {"name": name, "arguments": args}}]}]})
        };
        let e = demonstration(&call("lookup", json!({})), &rules()).unwrap_err();
        assert!(
            e.contains("messages[1].tool_calls[0]: calls `lookup`"),
            "{e}"
        );
        let e = demonstration(&call("search", json!("[1, 2]")), &rules()).unwrap_err();
        assert!(e.contains("must be a JSON object"), "{e}");
        let two = json!({"messages": [{"role": "user", "content": "Q"},
            {"role": "assistant", "tool_calls": [
                {"function": {"name": "search", "arguments": {}}},
                {"function": {"name": "search", "arguments": {}}}]}]});
        let e = demonstration(&two, &rules()).unwrap_err();
        assert!(e.contains("env.max_tool_calls_per_turn"), "{e}");
        let e = demonstration(
            &json!({"messages": [{"role": "robot", "content": "Q"}]}),
            &rules(),
        )
        .unwrap_err();
        assert!(e.contains("messages[0].role"), "{e}");
    }
}
