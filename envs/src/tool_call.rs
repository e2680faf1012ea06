//! The hermes tool-call format as Qwen models write it:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! Parsing never fails as a whole: each call span becomes either a [`ToolCall`] or a
//! [`CallError`] that is shown to the model, so malformed output is something to learn from.

use serde_json::Value;

use crate::tool::{CallError, ToolCall};

/// Opening tag of a call.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closing tag of a call; generation stops here.
pub const CALL_CLOSE: &str = "</tool_call>";

/// Parses every `<tool_call>...</tool_call>` span of an assistant turn, in order.
///
/// A final span with an opening tag but no closing tag (generation ran out of tokens) is
/// parsed up to the end of the text. `arguments` may be an object or a JSON string holding
/// one; a missing `arguments` means `{}`.
pub fn parse_tool_calls(text: &str) -> Vec<Result<ToolCall, CallError>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(CALL_OPEN) {
        let body_start = start + CALL_OPEN.len();
        let (body, next) = match rest[body_start..].find(CALL_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + CALL_CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        calls.push(parse_call_body(body));
        rest = next;
    }
    calls
}

/// Parses the JSON between the tags.
pub fn parse_call_body(body: &str) -> Result<ToolCall, CallError> {
    let value: Value =
        serde_json::from_str(body.trim()).map_err(|e| CallError::InvalidJson(e.to_string()))?;
    let name = match value.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        _ => return Err(CallError::MissingName),
    };
    let arguments = match value.get("arguments") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            CallError::InvalidArguments(format!("`arguments` is a string but not JSON: {e}"))
        })?,
        Some(other) => other.clone(),
    };
    Ok(ToolCall { name, arguments })
}

/// Renders a call the way the model is taught to write it.
pub fn render_tool_call(call: &ToolCall) -> String {
    let body = serde_json::json!({"name": call.name, "arguments": call.arguments});
    format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_object_and_string_arguments() {
        let text = r#"<think>x</think><tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>
<tool_call>{"name": "calculator", "arguments": "{\"expression\": \"1+2\"}"}</tool_call>"#;
        let calls = parse_tool_calls(text);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0].as_ref().unwrap(),
            &ToolCall {
                name: "search".into(),
                arguments: json!({"query": "a"})
            }
        );
        assert_eq!(
            calls[1].as_ref().unwrap().arguments,
            json!({"expression": "1+2"})
        );
    }

    #[test]
    fn malformed_calls_become_errors() {
        let calls = parse_tool_calls(
            "<tool_call>{not json</tool_call><tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\": \"x\", \"arguments\": \"oops\"}",
        );
        assert!(matches!(calls[0], Err(CallError::InvalidJson(_))));
        assert_eq!(calls[1], Err(CallError::MissingName));
        assert!(matches!(calls[2], Err(CallError::InvalidArguments(_))));
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn render_then_parse_round_trips() {
        let call = ToolCall {
            name: "search".into(),
            arguments: json!({"query": "Who founded X?", "k": 3}),
        };
        assert_eq!(parse_tool_calls(&render_tool_call(&call)), vec![Ok(call)]);
    }
}
