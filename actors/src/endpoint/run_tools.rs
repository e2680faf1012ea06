//! The run's tools, served to outside agents.
//!
//! `GET /v1/agent_r1/tools` lists the tools an episode may call in OpenAI function format:
//! the specs the built-in loop renders into its prompts, so an agent that sends them back as
//! its request's `tools` gets the prompt tokens the built-in loop (and the warm start) uses.
//! `POST /v1/agent_r1/tool_calls` runs an assistant message's `tool_calls` through the run's
//! tool pools (their timeouts, concurrency limits, sandbox and call journal), records them on
//! the step that wrote them, and answers the tool messages to append: each result cut to the
//! observation limit as the built-in loop cuts it, a failed call answered with the error the
//! model would see there.

use std::sync::Mutex;

use serde_json::{json, Value};

use agent_r1_envs::tool::{CallError, ToolCall};

use super::conversation::Conversation;
use super::error::ApiError;
use super::protocol::ToolCallsRequest;
use crate::runtime::Agent;

/// The most calls one request may carry (the built-in loop's own limit per turn is
/// `env.max_tool_calls_per_turn`, at most 64).
pub const MAX_CALLS_PER_REQUEST: usize = 64;

/// `GET /v1/agent_r1/tools`: the episode's tools.
pub fn list(agent: &Agent) -> Value {
    let data: Vec<Value> = agent
        .renderer()
        .tools()
        .map(<[Value]>::to_vec)
        .unwrap_or_default();
    json!({"object": "list", "data": data})
}

/// `POST /v1/agent_r1/tool_calls`: runs the calls and answers their tool messages.
pub async fn run(
    agent: &Agent,
    conversation: &Mutex<Conversation>,
    req: ToolCallsRequest,
    max_observation_chars: usize,
) -> Result<Value, ApiError> {
    if req.tool_calls.is_empty() || req.tool_calls.len() > MAX_CALLS_PER_REQUEST {
        return Err(ApiError::invalid(
            format!(
                "tool_calls: {} calls; send 1 to {MAX_CALLS_PER_REQUEST}, the tool_calls of an \
                 assistant message",
                req.tool_calls.len()
            ),
            Some("tool_calls".into()),
        ));
    }
    let mut ids = Vec::with_capacity(req.tool_calls.len());
    let mut calls = Vec::with_capacity(req.tool_calls.len());
    for (i, call) in req.tool_calls.into_iter().enumerate() {
        if let Some(kind) = call.kind.as_deref().filter(|k| *k != "function") {
            return Err(ApiError::invalid(
                format!("tool_calls[{i}].type: {kind:?}; only \"function\" calls are run"),
                Some(format!("tool_calls[{i}].type")),
            ));
        }
        let Some(id) = call.id.filter(|id| !id.is_empty()) else {
            return Err(ApiError::invalid(
                format!(
                    "tool_calls[{i}].id: missing; each call needs the id its tool message \
                     answers"
                ),
                Some(format!("tool_calls[{i}].id")),
            ));
        };
        ids.push(id);
        calls.push(
            match serde_json::from_str::<Value>(&call.function.arguments) {
                Ok(arguments) => Ok(ToolCall {
                    name: call.function.name,
                    arguments,
                }),
                Err(e) => Err(CallError::InvalidJson(e.to_string())),
            },
        );
    }
    let step = conversation
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .step_of_call(&ids[0]);
    let outcomes = agent.call_tools(step, calls).await;
    let messages: Vec<Value> = ids
        .iter()
        .zip(&outcomes)
        .map(|(id, o)| {
            json!({
                "role": "tool",
                "tool_call_id": id,
                "content": o.observation(max_observation_chars),
            })
        })
        .collect();
    Ok(json!({
        "object": "agent_r1.tool_results",
        "messages": messages,
        "step": step,
    }))
}
