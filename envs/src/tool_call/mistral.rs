//! Mistral's tool calls (7B-Instruct v0.3 and later): the assistant turn is `[TOOL_CALLS]`
//! followed by a JSON list of `{"name": ..., "arguments": {...}}` objects, the form its chat
//! template renders past calls in. `[TOOL_CALLS]` is a control token that decoding usually
//! drops, so a turn whose text (after an optional `<think>...</think>` block) starts with
//! `[{` is read as calls too. The model writes no call ids; the runtime numbers the results.

use serde_json::Value;

use super::{after_think, call_from_value, python_json};
use crate::tool::{CallError, ToolCall};

/// The control token before a list of calls.
pub const TOOL_CALLS_TAG: &str = "[TOOL_CALLS]";

/// Parses the calls of an assistant turn, in order; empty when the turn is not a call.
pub fn parse_tool_calls(text: &str) -> Vec<Result<ToolCall, CallError>> {
    let Some(list) = call_list(text) else {
        return vec![];
    };
    let mut values = serde_json::Deserializer::from_str(list).into_iter::<Value>();
    match values.next() {
        Some(Ok(Value::Array(items))) if !items.is_empty() => {
            items.iter().map(call_from_value).collect()
        }
        Some(Ok(Value::Array(_))) => vec![Err(CallError::InvalidJson(
            "an empty list of tool calls".into(),
        ))],
        Some(Ok(_)) => vec![Err(CallError::InvalidJson(
            "[TOOL_CALLS] must be followed by a JSON list of calls".into(),
        ))],
        Some(Err(e)) => vec![Err(CallError::InvalidJson(e.to_string()))],
        None => vec![],
    }
}

/// Whether the turn, past an optional `<think>` block, is one list of calls and nothing
/// after it (the format reward's "well-formed call").
pub fn is_whole_call_list(text: &str) -> bool {
    let Some(list) = call_list(text) else {
        return false;
    };
    let mut values = serde_json::Deserializer::from_str(list).into_iter::<Value>();
    matches!(values.next(), Some(Ok(Value::Array(_))))
        && list[values.byte_offset()..].trim().is_empty()
}

/// The text after `[TOOL_CALLS]`, or from an untagged list's `[` on: where the calls are,
/// when the turn is a call.
fn call_list(text: &str) -> Option<&str> {
    let rest = after_think(text)?;
    let tagged = rest.strip_prefix(TOOL_CALLS_TAG).map(str::trim_start);
    let rest = tagged.unwrap_or(rest);
    let untagged_list = rest.starts_with('[') && rest[1..].trim_start().starts_with('{');
    (tagged.is_some() || untagged_list).then_some(rest)
}

/// Renders a call as the model writes it: `[TOOL_CALLS] [{"name": "NAME", "arguments":
/// ARGS}]`.
pub fn render_tool_call(call: &ToolCall) -> String {
    format!(
        "{TOOL_CALLS_TAG} [{{\"name\": \"{}\", \"arguments\": {}}}]",
        call.name,
        python_json(&call.arguments)
    )
}

/// The id of the `n`-th tool result (from 1) of a turn: nine alphanumeric characters, as
/// Mistral's template requires.
pub fn call_id(n: usize) -> String {
    format!("call{:05}", n % 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn search(q: &str) -> ToolCall {
        ToolCall {
            name: "search".into(),
            arguments: json!({ "query": q }),
        }
    }

    #[test]
    fn reads_calls_with_or_without_the_tag_and_answers_as_no_call() {
        let two = "[{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"b\"}, \"id\": \"abcdefghi\"}]";
        assert_eq!(
            parse_tool_calls(&format!("[TOOL_CALLS] {two}")),
            vec![Ok(search("a")), Ok(search("b"))]
        );
        assert_eq!(
            parse_tool_calls(&format!("<think>two</think> {two}")),
            vec![Ok(search("a")), Ok(search("b"))]
        );
        assert_eq!(
            parse_tool_calls("<think>so</think><answer>[1]</answer>"),
            vec![]
        );
        assert_eq!(parse_tool_calls("[1, 2] is a list"), vec![]);
        assert!(matches!(
            parse_tool_calls("[TOOL_CALLS] [{\"name\": \"search\"").as_slice(),
            [Err(CallError::InvalidJson(_))]
        ));
        assert!(matches!(
            parse_tool_calls("[TOOL_CALLS] {\"name\": \"search\"}").as_slice(),
            [Err(CallError::InvalidJson(_))]
        ));
    }

    #[test]
    fn renders_what_it_reads_and_ids_have_nine_characters() {
        let call = search("Scott Derrickson");
        let text = render_tool_call(&call);
        assert_eq!(
            text,
            "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"query\": \"Scott Derrickson\"}}]"
        );
        assert_eq!(parse_tool_calls(&text), vec![Ok(call)]);
        assert!(is_whole_call_list(&format!("<think>a</think>{text}")));
        assert!(!is_whole_call_list(&format!("{text} and more")));
        for n in [1, 42, 99_999] {
            let id = call_id(n);
            assert_eq!(id.len(), 9);
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }
}
