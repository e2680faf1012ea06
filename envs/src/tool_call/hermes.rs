//! The hermes tool-call format as Qwen models write it:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
//!
//! Parsing never fails as a whole: each call span becomes either a [`ToolCall`] or a
//! [`CallError`] that is shown to the model, so malformed output is something to learn from.

use super::parse_call_body;
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

/// Renders a call the way the model is taught to write it.
pub fn render_tool_call(call: &ToolCall) -> String {
    let body = serde_json::json!({"name": call.name, "arguments": call.arguments});
    format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

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

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Pieces a model's output is made of: tags (whole and broken), JSON fragments,
        /// text and awkward characters.
        fn fragment() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(CALL_OPEN.to_string()),
                Just(CALL_CLOSE.to_string()),
                Just("<tool_".to_string()),
                Just("</tool_call".to_string()),
                Just("{".to_string()),
                Just("}".to_string()),
                Just("\"name\": ".to_string()),
                Just("\"arguments\": ".to_string()),
                Just("{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}".to_string()),
                Just("\"{\\\"a\\\": 1}\"".to_string()),
                Just("[1, 2]".to_string()),
                Just("null".to_string()),
                Just(",".to_string()),
                Just("\u{1F600}é\u{0}".to_string()),
                "[a-z ]{0,8}",
                any::<String>(),
            ]
        }

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<String>().prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                let calls = parse_tool_calls(&text);
                prop_assert!(calls.len() <= text.matches(CALL_OPEN).count());
            }

            #[test]
            fn fragment_soup_never_panics(parts in prop::collection::vec(fragment(), 0..24)) {
                let text = parts.concat();
                let calls = parse_tool_calls(&text);
                // Exactly one outcome per opening tag not swallowed by an earlier span.
                prop_assert!(calls.len() <= text.matches(CALL_OPEN).count());
                prop_assert_eq!(calls.is_empty(), !text.contains(CALL_OPEN));
                for call in calls.iter().flatten() {
                    prop_assert!(!call.name.trim().is_empty());
                }
            }

            #[test]
            fn rendered_calls_round_trip(
                name in "[A-Za-z_][A-Za-z0-9_.-]{0,20}",
                args in prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..5),
                before in "[^<]{0,20}",
                between in "[^<]{0,20}",
            ) {
                let call = ToolCall {
                    name,
                    arguments: Value::Object(args.into_iter().collect()),
                };
                let text = format!(
                    "{before}{}{between}{}",
                    render_tool_call(&call),
                    render_tool_call(&call)
                );
                prop_assert_eq!(parse_tool_calls(&text), vec![Ok(call.clone()), Ok(call)]);
            }
        }
    }
}
