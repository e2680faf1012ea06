//! A request served on an episode's [`Agent`]: validated, rendered into a context, sampled
//! (each choice one recorded step), and answered as OpenAI answers, whole or as server-sent
//! events.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::conversation::{Conversation, Prepared};
use super::error::ApiError;
use super::protocol::{
    check_sampling, reads_tool_calls, template_messages, template_tools, ChatRequest,
    CompletionRequest, Prompt, Sampling, ToolCallsRequest,
};
use super::run_tools;
use crate::model::generate::FinishReason;
use crate::runtime::{Agent, GenerateOptions, Generation};
use crate::tokenizer::HfTokenizer;

/// A request for an episode.
#[derive(Debug, Clone)]
pub enum Call {
    /// `POST /v1/chat/completions`.
    Chat(Box<ChatRequest>),
    /// `POST /v1/completions`.
    Completion(Box<CompletionRequest>),
    /// `GET /v1/agent_r1/tools`.
    Tools,
    /// `POST /v1/agent_r1/tool_calls`.
    ToolCalls(Box<ToolCallsRequest>),
}

/// An answer: a JSON body, or the whole event stream when the request streamed.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `application/json`.
    Json(Value),
    /// `text/event-stream`: `data: {...}` events, then `data: [DONE]`.
    Events(String),
}

/// Serves `call` on `agent`; `tag` names the episode in completion ids, and tool results
/// are cut to `max_observation_chars`.
pub async fn serve(
    agent: &Agent,
    conversation: &Mutex<Conversation>,
    call: Call,
    tag: &str,
    max_observation_chars: usize,
) -> Result<Reply, ApiError> {
    match call {
        Call::Chat(req) => serve_chat(agent, conversation, *req, tag).await,
        Call::Completion(req) => serve_completion(agent, conversation, *req, tag).await,
        Call::Tools => Ok(Reply::Json(run_tools::list(agent))),
        Call::ToolCalls(req) => run_tools::run(agent, conversation, *req, max_observation_chars)
            .await
            .map(Reply::Json),
    }
}

fn lock(c: &Mutex<Conversation>) -> std::sync::MutexGuard<'_, Conversation> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The request's token limit, checked against the run's longest turn.
fn max_tokens(agent: &Agent, asked: Option<u64>, field: &str) -> Result<Option<usize>, ApiError> {
    let run_max = agent.sampling().max_new_tokens;
    match asked {
        None => Ok(None),
        Some(0) => Err(ApiError::invalid(
            format!("{field} 0: at least 1"),
            Some(field.into()),
        )),
        Some(n) if n as usize > run_max => Err(ApiError::invalid(
            format!(
                "{field} {n}: over the run's longest turn (rollout.max_response_length = \
                 {run_max})"
            ),
            Some(field.into()),
        )),
        Some(n) => Ok(Some(n as usize)),
    }
}

/// Refuses a context with no room for the turn asked for.
fn check_room(agent: &Agent, context: usize, max_tokens: Option<usize>) -> Result<(), ApiError> {
    let max_context = agent.max_context();
    if context + 1 >= max_context {
        return Err(ApiError::invalid(
            format!(
                "the conversation renders to {context} tokens; the context holds {max_context} \
                 (rollout.max_context_length) with room for at least one new token"
            ),
            Some("messages".into()),
        ));
    }
    if let Some(n) = max_tokens {
        if context + n > max_context {
            return Err(ApiError::invalid(
                format!(
                    "max_tokens {n}: the conversation renders to {context} tokens and the \
                     context holds {max_context} (rollout.max_context_length), leaving room \
                     for {}",
                    max_context - context
                ),
                Some("max_tokens".into()),
            ));
        }
    }
    Ok(())
}

async fn sample_n(
    agent: &Agent,
    context: &[u32],
    n: usize,
    options: &GenerateOptions,
) -> Result<Vec<Generation>, ApiError> {
    let calls = (0..n).map(|_| agent.generate_with(context.to_vec(), options));
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|g| {
            g.map_err(|e| match e {
                crate::Error::Invalid { .. } => ApiError::invalid(e.to_string(), None),
                crate::Error::Timeout { .. } => ApiError::timeout(e.to_string()),
                other => ApiError::server(format!("generation failed: {other}")),
            })
        })
        .collect()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn finish_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

fn token_text(tokenizer: &HfTokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// Chat-style log-probs: each sampled token with its sampling log-probability.
fn chat_logprobs(tokenizer: &HfTokenizer, g: &Generation) -> Value {
    let content: Vec<Value> = g
        .token_ids
        .iter()
        .zip(&g.logprobs)
        .map(|(&id, &lp)| {
            let token = token_text(tokenizer, id);
            json!({
                "token": token,
                "logprob": lp,
                "bytes": token.as_bytes(),
                "top_logprobs": [],
            })
        })
        .collect();
    json!({ "content": content })
}

/// What the endpoint adds to a response beside OpenAI's fields.
fn extension(g: &[Generation], prepared_len: usize, reused: usize, rebuilt: bool) -> Value {
    json!({
        "steps": g.iter().map(|g| g.step).collect::<Vec<_>>(),
        "policy_versions": g.iter().map(|g| g.policy_version).collect::<Vec<_>>(),
        "context_tokens": prepared_len,
        "reused_tokens": reused,
        "rebuilt": rebuilt,
    })
}

fn usage(prompt: usize, g: &[Generation]) -> Value {
    let completion: usize = g.iter().map(|g| g.token_ids.len()).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn events(chunks: &[Value]) -> String {
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// One choice of a chat answer: its message (as returned and as the template reads it
/// back), and its finish reason.
struct ChatChoice {
    content: String,
    calls: Vec<(String, String, Value)>,
    finish: &'static str,
}

impl ChatChoice {
    fn message(&self) -> Value {
        let mut m = json!({
            "role": "assistant",
            "content": if self.content.is_empty() && !self.calls.is_empty() {
                Value::Null
            } else {
                json!(self.content)
            },
        });
        if !self.calls.is_empty() {
            m["tool_calls"] = self.wire_calls(false);
        }
        m
    }

    fn wire_calls(&self, indexed: bool) -> Value {
        Value::Array(
            self.calls
                .iter()
                .enumerate()
                .map(|(k, (id, name, args))| {
                    let mut c = json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": args.to_string()},
                    });
                    if indexed {
                        c["index"] = json!(k);
                    }
                    c
                })
                .collect(),
        )
    }

    /// The message as [`super::protocol::template_messages`] reads it when sent back.
    fn as_template_message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.calls.is_empty() {
            m["tool_calls"] = Value::Array(
                self.calls
                    .iter()
                    .map(|(id, name, args)| {
                        json!({"id": id, "type": "function",
                               "function": {"name": name, "arguments": args}})
                    })
                    .collect(),
            );
        }
        m
    }
}

async fn serve_chat(
    agent: &Agent,
    conversation: &Mutex<Conversation>,
    req: ChatRequest,
    tag: &str,
) -> Result<Reply, ApiError> {
    let messages = template_messages(&req.messages)?;
    let tools = template_tools(&req.tools)?;
    let reads_calls = reads_tool_calls(&req.tool_choice, !tools.is_empty())?;
    if matches!(req.top_logprobs, Some(k) if k > 0) {
        return Err(ApiError::invalid(
            "top_logprobs: only 0 is served; `logprobs: true` returns each sampled token's own \
             log-probability",
            Some("top_logprobs".into()),
        ));
    }
    let (n, stop) = check_sampling(
        &Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            n: req.n,
            seed: req.seed,
            frequency_penalty: req.frequency_penalty,
            presence_penalty: req.presence_penalty,
            stop: &req.stop,
        },
        agent.sampling(),
    )?;
    let limit = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => max_tokens(agent, Some(m), "max_completion_tokens")?,
        (None, m) => max_tokens(agent, m, "max_tokens")?,
    };
    let prepared: Prepared = lock(conversation).prepare(&messages, &tools)?;
    check_room(agent, prepared.context.len(), limit)?;
    if prepared.rebuilt {
        metrics::counter!(crate::metric_names::ENDPOINT_CONTEXTS_REBUILT_TOTAL.name).increment(1);
    }
    metrics::counter!(crate::metric_names::ENDPOINT_REUSED_TOKENS_TOTAL.name)
        .increment(prepared.reused_tokens as u64);
    let options = GenerateOptions {
        max_new_tokens: limit,
        stop,
    };
    let generations = sample_n(agent, &prepared.context, n, &options).await?;

    let renderer = &prepared.renderer;
    let format = renderer.tool_call_format();
    let tokenizer = renderer.tokenizer().clone();
    let mut choices = Vec::with_capacity(n);
    {
        let mut conv = lock(conversation);
        for g in &generations {
            let parsed: Vec<_> = if reads_calls {
                renderer
                    .parse_tool_calls(&g.text)
                    .into_iter()
                    .filter_map(Result::ok)
                    .collect()
            } else {
                vec![]
            };
            let choice = if parsed.is_empty() {
                ChatChoice {
                    content: g.text.clone(),
                    calls: vec![],
                    finish: finish_name(g.finish_reason),
                }
            } else {
                ChatChoice {
                    content: format.content_before_calls(&g.text).to_string(),
                    calls: parsed
                        .into_iter()
                        .map(|c| (conv.next_call_id(g.step), c.name, c.arguments))
                        .collect(),
                    finish: "tool_calls",
                }
            };
            conv.record(
                &messages,
                &tools,
                &prepared.context,
                &g.token_ids,
                choice.as_template_message(),
            );
            choices.push(choice);
        }
    }
    let id = format!("chatcmpl-{tag}-{}", generations[0].step);
    lock(conversation).record_completion(&id, generations.iter().map(|g| g.step).collect());
    let created = now();
    let ext = extension(
        &generations,
        prepared.context.len(),
        prepared.reused_tokens,
        prepared.rebuilt,
    );
    let want_logprobs = req.logprobs == Some(true);
    let usage = usage(prepared.context.len(), &generations);
    if req.stream == Some(true) {
        let mut chunks = vec![];
        let chunk = |choices: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created,
                   "model": req.model, "choices": choices})
        };
        for (i, (c, g)) in choices.iter().zip(&generations).enumerate() {
            chunks.push(chunk(
                json!([{"index": i, "finish_reason": null, "logprobs": null,
                "delta": {"role": "assistant", "content": ""}}]),
            ));
            let logprobs = if want_logprobs {
                chat_logprobs(&tokenizer, g)
            } else {
                Value::Null
            };
            chunks.push(chunk(
                json!([{"index": i, "finish_reason": null, "logprobs": logprobs,
                "delta": {"content": c.content}}]),
            ));
            if !c.calls.is_empty() {
                chunks.push(chunk(
                    json!([{"index": i, "finish_reason": null, "logprobs": null,
                    "delta": {"tool_calls": c.wire_calls(true)}}]),
                ));
            }
            chunks.push(chunk(
                json!([{"index": i, "finish_reason": c.finish, "logprobs": null,
                "delta": {}, "token_ids": g.token_ids}]),
            ));
        }
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let mut last = chunk(json!([]));
        last["agent_r1"] = ext;
        if include_usage {
            last["usage"] = usage;
        }
        chunks.push(last);
        return Ok(Reply::Events(events(&chunks)));
    }
    let choices: Vec<Value> = choices
        .iter()
        .zip(&generations)
        .enumerate()
        .map(|(i, (c, g))| {
            json!({
                "index": i,
                "message": c.message(),
                "finish_reason": c.finish,
                "logprobs": if want_logprobs { chat_logprobs(&tokenizer, g) } else { Value::Null },
                "token_ids": g.token_ids,
            })
        })
        .collect();
    Ok(Reply::Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": req.model,
        "choices": choices,
        "usage": usage,
        "agent_r1": ext,
    })))
}

async fn serve_completion(
    agent: &Agent,
    conversation: &Mutex<Conversation>,
    req: CompletionRequest,
    tag: &str,
) -> Result<Reply, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::invalid(
            "echo: not served; the prompt's ids are yours already",
            Some("echo".into()),
        ));
    }
    if matches!(req.logprobs, Some(k) if k > 1) {
        return Err(ApiError::invalid(
            format!(
                "logprobs {}: at most 1 (each sampled token's own log-probability)",
                req.logprobs.unwrap_or(0)
            ),
            Some("logprobs".into()),
        ));
    }
    let (n, stop) = check_sampling(
        &Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            n: req.n,
            seed: req.seed,
            frequency_penalty: req.frequency_penalty,
            presence_penalty: req.presence_penalty,
            stop: &req.stop,
        },
        agent.sampling(),
    )?;
    let limit = max_tokens(agent, req.max_tokens, "max_tokens")?;
    let tokenizer = lock(conversation).tokenizer().clone();
    let context = match &req.prompt {
        Prompt::Text(text) => tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::invalid(format!("prompt: {e}"), Some("prompt".into())))?,
        Prompt::Ids(ids) => {
            let vocab = tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    format!(
                        "prompt: token id {bad} is outside the vocabulary (0 to {})",
                        vocab - 1
                    ),
                    Some("prompt".into()),
                ));
            }
            ids.clone()
        }
    };
    if context.is_empty() {
        return Err(ApiError::invalid(
            "prompt: empty; at least one token",
            Some("prompt".into()),
        ));
    }
    check_room(agent, context.len(), limit)?;
    let options = GenerateOptions {
        max_new_tokens: limit,
        stop,
    };
    let generations = sample_n(agent, &context, n, &options).await?;
    let id = format!("cmpl-{tag}-{}", generations[0].step);
    lock(conversation).record_completion(&id, generations.iter().map(|g| g.step).collect());
    let created = now();
    let logprobs = |g: &Generation| {
        if req.logprobs.is_none() {
            return Value::Null;
        }
        let tokens: Vec<String> = g
            .token_ids
            .iter()
            .map(|&t| token_text(&tokenizer, t))
            .collect();
        let mut offset = 0;
        let offsets: Vec<usize> = tokens
            .iter()
            .map(|t| {
                let at = offset;
                offset += t.len();
                at
            })
            .collect();
        json!({"tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": null,
               "text_offset": offsets})
    };
    let choices: Vec<Value> = generations
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({"index": i, "text": g.text, "logprobs": logprobs(g),
                   "finish_reason": finish_name(g.finish_reason), "token_ids": g.token_ids})
        })
        .collect();
    let ext = extension(&generations, context.len(), 0, false);
    let usage = usage(context.len(), &generations);
    let body = json!({
        "id": id, "object": "text_completion", "created": created, "model": req.model,
        "choices": choices, "usage": usage, "agent_r1": ext,
    });
    if req.stream == Some(true) {
        let mut chunks: Vec<Value> = choices
            .iter()
            .map(|c| {
                json!({"id": id, "object": "text_completion", "created": created,
                       "model": req.model, "choices": [c]})
            })
            .collect();
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        if include_usage {
            chunks.push(
                json!({"id": id, "object": "text_completion", "created": created,
                "model": req.model, "choices": [], "usage": body["usage"]}),
            );
        }
        return Ok(Reply::Events(events(&chunks)));
    }
    Ok(Reply::Json(body))
}
