//! The OpenAI wire format: requests as clients send them, validated once into what the
//! episode needs, and the error object every refusal is. The request types' fields are
//! OpenAI's, named and typed as its API reference has them.
#![allow(missing_docs)]

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;

/// `POST /v1/chat/completions`, as sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub tools: Option<Vec<ToolSpec>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
}

/// `POST /v1/agent_r1/tool_calls`: the calls of an assistant message, as the chat answer
/// returned them, run through the run's tools.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallsRequest {
    pub tool_calls: Vec<MessageToolCall>,
}

/// `POST /v1/completions`, as sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub logprobs: Option<u64>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
}

/// A completion prompt: text, or token ids taken as they are.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// One chat message, as sent (the fields an assistant message returned by this endpoint
/// carries when a client sends it back are accepted).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub refusal: Option<Value>,
    #[serde(default)]
    pub annotations: Option<Value>,
    #[serde(default)]
    pub audio: Option<Value>,
    #[serde(default)]
    pub function_call: Option<Value>,
}

/// Message content: text, or a list of parts of which only text parts are served.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// A tool call on an assistant message.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCall,
    #[serde(default)]
    pub index: Option<u64>,
}

/// A call's function: its name and its arguments as a JSON string.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A tool in OpenAI function format.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionSpec,
}

/// A function tool's name, description and JSON-schema parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// Parses a request body, naming the field that is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("the body is not valid JSON: {inner}")
        } else if path == "." {
            format!("the request: {inner}")
        } else {
            format!("{path}: {inner}")
        };
        ApiError::invalid(message, (path != ".").then_some(path))
    })
}

/// What every request may set and this endpoint serves as the run samples.
pub struct Sampling<'a> {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<u64>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub stop: &'a Option<Stop>,
}

/// The largest `n` one request may ask for.
pub const MAX_N: usize = 16;
/// The most stop strings one request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;

/// Checks the sampling fields against the run's settings: the learner trains with the
/// log-probabilities the engine recorded at the run's temperature, so a request may not
/// sample at another. Returns (n, stop strings).
pub fn check_sampling(
    s: &Sampling<'_>,
    run: &crate::model::SamplingParams,
) -> Result<(usize, Vec<String>), ApiError> {
    let same = |field: &str, got: Option<f64>, run_value: f64, key: &str| match got {
        Some(v) if (v - run_value).abs() > 1e-9 => Err(ApiError::invalid(
            format!(
                "{field} {v}: this endpoint samples as the run does ({key} = {run_value}), so \
                 that the log-probabilities the learner trains with are the sampler's; omit \
                 {field} or pass {run_value}"
            ),
            Some(field.to_string()),
        )),
        _ => Ok(()),
    };
    same(
        "temperature",
        s.temperature,
        run.temperature,
        "rollout.temperature",
    )?;
    same("top_p", s.top_p, run.top_p, "rollout.top_p")?;
    for (field, v) in [
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ] {
        if matches!(v, Some(p) if p != 0.0) {
            return Err(ApiError::invalid(
                format!("{field}: penalties change the sampling distribution; only 0 is served"),
                Some(field.to_string()),
            ));
        }
    }
    let _ = s.seed; // accepted for compatibility: the run's seed decides the draws
    let n = s.n.unwrap_or(1);
    if n == 0 || n as usize > MAX_N {
        return Err(ApiError::invalid(
            format!("n {n}: allowed 1 to {MAX_N}"),
            Some("n".into()),
        ));
    }
    let stop = match s.stop {
        None => vec![],
        Some(Stop::One(one)) => vec![one.clone()],
        Some(Stop::Many(many)) => many.clone(),
    };
    if stop.len() > MAX_STOP || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            format!(
                "stop: {} strings; allowed up to {MAX_STOP}, none empty",
                stop.len()
            ),
            Some("stop".into()),
        ));
    }
    Ok((n as usize, stop))
}

/// A chat request's messages and tools as the chat template reads them: roles `system`
/// (`developer` too), `user`, `assistant`, `tool`; content as text; an assistant message's
/// `tool_calls` with their arguments parsed into objects (as vLLM hands them to templates).
pub fn template_messages(messages: &[ChatMessage]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: empty; a chat request needs at least one message",
            Some("messages".into()),
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect()
}

fn template_message(i: usize, m: &ChatMessage) -> Result<Value, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let role = match m.role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        other => {
            return Err(ApiError::invalid(
                format!(
                    "{}: {other:?}; allowed: system, developer, user, assistant, tool",
                    at("role")
                ),
                Some(at("role")),
            ))
        }
    };
    let content = match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (k, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            format!(
                                "{}[{k}]: a {kind:?} part; only text parts are served",
                                at("content")
                            ),
                            Some(at("content")),
                        ))
                    }
                }
            }
            text
        }
    };
    if m.content.is_none() && m.tool_calls.is_none() {
        return Err(ApiError::invalid(
            format!(
                "{}: missing; a message needs content or tool_calls",
                at("content")
            ),
            Some(at("content")),
        ));
    }
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    out.insert("content".into(), json!(content));
    if let Some(calls) = &m.tool_calls {
        if role != "assistant" {
            return Err(ApiError::invalid(
                format!(
                    "{}: only assistant messages carry tool calls",
                    at("tool_calls")
                ),
                Some(at("tool_calls")),
            ));
        }
        let mut list = Vec::with_capacity(calls.len());
        for (k, c) in calls.iter().enumerate() {
            let arguments: Value = serde_json::from_str(&c.function.arguments).map_err(|e| {
                ApiError::invalid(
                    format!(
                        "{}[{k}].function.arguments: not a JSON object ({e})",
                        at("tool_calls")
                    ),
                    Some(at("tool_calls")),
                )
            })?;
            list.push(json!({
                "id": c.id.clone().unwrap_or_default(),
                "type": "function",
                "function": {"name": c.function.name, "arguments": arguments},
            }));
        }
        out.insert("tool_calls".into(), Value::Array(list));
    }
    if role == "tool" {
        let Some(id) = &m.tool_call_id else {
            return Err(ApiError::invalid(
                format!(
                    "{}: missing; a tool message answers a call by its id",
                    at("tool_call_id")
                ),
                Some(at("tool_call_id")),
            ));
        };
        out.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = &m.name {
        out.insert("name".into(), json!(name));
    }
    Ok(Value::Object(out))
}

/// Tools as the chat template reads them (`{"type": "function", "function": {...}}`).
pub fn template_tools(tools: &Option<Vec<ToolSpec>>) -> Result<Vec<Value>, ApiError> {
    let Some(tools) = tools else {
        return Ok(vec![]);
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(ApiError::invalid(
                    format!(
                        "tools[{i}].type: {:?}; only \"function\" tools are served",
                        t.kind
                    ),
                    Some(format!("tools[{i}].type")),
                ));
            }
            if t.function.name.is_empty() {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name: empty"),
                    Some(format!("tools[{i}].function.name")),
                ));
            }
            if let Some(p) = &t.function.parameters {
                if !p.is_object() {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].function.parameters: a JSON schema object is required"),
                        Some(format!("tools[{i}].function.parameters")),
                    ));
                }
            }
            let mut function = Map::new();
            function.insert("name".into(), json!(t.function.name));
            if let Some(d) = &t.function.description {
                function.insert("description".into(), json!(d));
            }
            function.insert(
                "parameters".into(),
                t.function
                    .parameters
                    .clone()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            );
            Ok(json!({"type": "function", "function": Value::Object(function)}))
        })
        .collect()
}

/// Whether the model's tool calls are read from its turns: `auto` (the default) and `none`
/// are served; forcing a call needs constrained decoding, which the engine does not do.
pub fn reads_tool_calls(tool_choice: &Option<Value>, has_tools: bool) -> Result<bool, ApiError> {
    match tool_choice {
        None => Ok(has_tools),
        Some(Value::String(s)) if s == "auto" => Ok(has_tools),
        Some(Value::String(s)) if s == "none" => Ok(false),
        Some(other) => Err(ApiError::invalid(
            format!(
                "tool_choice {other}: only \"auto\" and \"none\" are served (forcing a call \
                 would need constrained decoding)"
            ),
            Some("tool_choice".into()),
        )),
    }
}

/// Whether two assistant messages (as the template reads them) say the same: content and
/// the calls' names and arguments; call ids are the client's to keep.
pub fn same_assistant_message(a: &Value, b: &Value) -> bool {
    let calls = |m: &Value| -> Vec<(Value, Value)> {
        m.get("tool_calls")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|c| {
                        (
                            c["function"]["name"].clone(),
                            c["function"]["arguments"].clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    a.get("role") == b.get("role") && a.get("content") == b.get("content") && calls(a) == calls(b)
}
