//! Llama 3.1-3.3's JSON tool calls: the assistant turn is a JSON object
//! `{"name": ..., "parameters": {...}}`, the form the model's chat template both asks for and
//! renders past calls in. Several objects separated by `;` are read as several calls (as
//! vLLM's `llama3_json` parser does); a turn that does not start with `{` is an answer.
//!
//! Before the object the parser skips `<|python_tag|>` (when decoding kept it) and one
//! `<think>...</think>` block, so that an agent prompted to reason first still calls tools.

use serde_json::Value;

use super::{after_think, call_from_value, python_json};
use crate::tool::{CallError, ToolCall};

/// Llama 3.1's marker before code or a call, a special token decoding usually drops.
const PYTHON_TAG: &str = "<|python_tag|>";

/// Parses the calls of an assistant turn, in order; empty when the turn is not a call.
pub fn parse_tool_calls(text: &str) -> Vec<Result<ToolCall, CallError>> {
    let Some(mut rest) = call_start(text) else {
        return vec![];
    };
    let mut calls = Vec::new();
    while rest.starts_with('{') {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                calls.push(call_from_value(&value));
                rest = rest[values.byte_offset()..].trim_start();
                rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
            }
            Some(Err(e)) => {
                calls.push(Err(CallError::InvalidJson(e.to_string())));
                break;
            }
            None => break,
        }
    }
    calls
}

/// Whether the turn, past an optional `<think>` block and `<|python_tag|>`, is one call
/// object and nothing after it (the format reward's "well-formed call").
pub fn is_whole_call(text: &str) -> bool {
    let Some(rest) = call_start(text).filter(|r| r.starts_with('{')) else {
        return false;
    };
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    matches!(values.next(), Some(Ok(v)) if call_from_value(&v).is_ok())
        && rest[values.byte_offset()..].trim().is_empty()
}

/// Where the calls of a turn would start: past `<|python_tag|>` and one `<think>` block
/// (the tag may sit before or after it); `None` for an unclosed `<think>`.
fn call_start(text: &str) -> Option<&str> {
    let rest = text.trim_start();
    let rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
    let rest = after_think(rest)?;
    Some(rest.strip_prefix(PYTHON_TAG).unwrap_or(rest).trim_start())
}

/// Renders a call as Llama 3.1's chat template renders an assistant's past call:
/// `{"name": "NAME", "parameters": ARGS}` with ARGS as `tojson` writes them.
pub fn render_tool_call(call: &ToolCall) -> String {
    format!(
        "{{\"name\": \"{}\", \"parameters\": {}}}",
        call.name,
        python_json(&call.arguments)
    )
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
    fn reads_one_or_several_calls_and_answers_as_no_call() {
        assert_eq!(
            parse_tool_calls("{\"name\": \"search\", \"parameters\": {\"query\": \"a\"}}"),
            vec![Ok(search("a"))]
        );
        assert_eq!(
            parse_tool_calls(
                "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"a\"}}; {\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"b\\\"}\"}"
            ),
            vec![Ok(search("a")), Ok(search("b"))]
        );
        assert_eq!(
            parse_tool_calls("<think>need a fact</think>\n{\"name\": \"search\", \"parameters\": {\"query\": \"a\"}}"),
            vec![Ok(search("a"))]
        );
        assert!(parse_tool_calls("<answer>Paris</answer>").is_empty());
        assert!(parse_tool_calls("The answer is {not a call}").is_empty());
        assert!(parse_tool_calls("<think>unfinished").is_empty());
    }

    #[test]
    fn malformed_calls_become_errors_shown_to_the_model() {
        assert!(matches!(
            parse_tool_calls("{\"name\": \"search\", \"parameters\": {\"query\"")[..],
            [Err(CallError::InvalidJson(_))]
        ));
        assert_eq!(
            parse_tool_calls("{\"parameters\": {}}"),
            vec![Err(CallError::MissingName)]
        );
        // Text after a complete call is not another call.
        assert_eq!(
            parse_tool_calls("{\"name\": \"search\", \"parameters\": {\"query\": \"a\"}} thanks"),
            vec![Ok(search("a"))]
        );
    }

    #[test]
    fn renders_as_the_template_does() {
        let call = ToolCall {
            name: "calc".into(),
            arguments: json!({"digits": [1, 2], "exact": true, "expression": "1+2"}),
        };
        assert_eq!(
            render_tool_call(&call),
            "{\"name\": \"calc\", \"parameters\": {\"digits\": [1, 2], \"exact\": true, \"expression\": \"1+2\"}}"
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                let calls = parse_tool_calls(&text);
                let opening = text.matches('{').count();
                prop_assert!(calls.len() <= opening);
            }

            #[test]
            fn rendered_calls_round_trip(
                name in "[A-Za-z_][A-Za-z0-9_.-]{0,20}",
                args in prop::collection::btree_map("[a-z_]{1,8}", any::<i64>(), 0..5),
            ) {
                let call = ToolCall {
                    name,
                    arguments: Value::Object(args.into_iter().map(|(k, v)| (k, Value::from(v))).collect()),
                };
                let text = format!("{}; {}", render_tool_call(&call), render_tool_call(&call));
                prop_assert_eq!(parse_tool_calls(&text), vec![Ok(call.clone()), Ok(call)]);
            }
        }
    }
}
