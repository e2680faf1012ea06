//! The default system prompts of the built-in envs, and the first messages of a task.

use crate::error::{Error, Result};
use crate::message::Message;
use crate::task::Task;
use crate::tool_call::ToolCallFormat;

/// The first messages of an episode: the task's own prompt when it has one and
/// `use_task_prompt` (Agent-R1 parquet rows), else `[system(system or default_system),
/// user("Question: ...")]`. An empty question is an error naming the task.
pub fn first_messages(
    task: &Task,
    use_task_prompt: bool,
    system: Option<&str>,
    default_system: &str,
) -> Result<Vec<Message>> {
    if use_task_prompt {
        if let Some(prompt) = task.prompt.as_ref().filter(|p| !p.is_empty()) {
            return Ok(prompt.clone());
        }
    }
    if task.question.trim().is_empty() {
        return Err(Error::Other(format!(
            "task `{}` has an empty question",
            task.id
        )));
    }
    Ok(vec![
        Message::system(system.unwrap_or(default_system)),
        Message::user(format!("Question: {}", task.question)),
    ])
}

/// The QA envs' default system prompt for a model that writes tool calls in `calls`:
/// [`QA_SYSTEM_PROMPT`] for hermes, the same instructions with the call written the
/// model's way otherwise.
pub fn qa_system_prompt(calls: ToolCallFormat) -> String {
    match calls {
        ToolCallFormat::Hermes => QA_SYSTEM_PROMPT.to_string(),
        other => format!(
            "You answer questions by searching a document collection. First think step by step \
             inside <think>...</think>. To search, write a call to the `search` tool as {} \
             and wait for its result. Search once per fact you need; questions may need several \
             searches, each using what the previous one found. When you know the answer, write \
             <think>...</think> followed by <answer>...</answer> containing only the short answer.",
            other.example("search", serde_json::json!({"query": "..."}))
        ),
    }
}

/// The math envs' default system prompt for a model that writes tool calls in `calls`
/// ([`MATH_SYSTEM_PROMPT`] for hermes).
pub fn math_system_prompt(calls: ToolCallFormat) -> String {
    match calls {
        ToolCallFormat::Hermes => MATH_SYSTEM_PROMPT.to_string(),
        other => format!(
            "You solve math word problems. First think step by step inside <think>...</think>. \
             To compute, write a call to the `calculator` tool as {} and wait for its result. \
             When you know the answer, write <think>...</think> followed by \
             <answer>...</answer> containing only the number.",
            other.example("calculator", serde_json::json!({"expression": "..."}))
        ),
    }
}

/// Tells the model the hermes protocol: reason in `<think>`, search with a `<tool_call>`,
/// answer in `<answer>`. The tool's JSON schema reaches the model separately, through the
/// chat template's `tools`.
pub const QA_SYSTEM_PROMPT: &str = "You answer questions by searching a document collection. \
First think step by step inside <think>...</think>. To search, write a call to the `search` tool as \
<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"...\"}}\n</tool_call> and wait for the \
<tool_response>. Search once per fact you need; questions may need several searches, each using what \
the previous one found. When you know the answer, write <think>...</think> followed by \
<answer>...</answer> containing only the short answer.";

/// The math envs' default: reason in `<think>`, compute with the `calculator` tool, answer
/// with the number alone in `<answer>`.
pub const MATH_SYSTEM_PROMPT: &str = "You solve math word problems. First think step by step \
inside <think>...</think>. To compute, write a call to the `calculator` tool as \
<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"...\"}}\n</tool_call> and \
wait for the <tool_response>. When you know the answer, write <think>...</think> followed by \
<answer>...</answer> containing only the number.";
