//! `http_judge`: an LLM as the judge, behind an OpenAI-compatible chat-completions endpoint
//! (vLLM, SGLang, TGI, llama.cpp's server, OpenAI). The prompt template is filled with the
//! episode's question, reference answers, final answer and transcript; the judge's reply is
//! read as the first number in it, clamped to `[min_reward, max_reward]`.
//!
//! Each call has a timeout and `retries` more tries on a transport error, a 5xx or 429, or a
//! reply with no number in it; at most `max_concurrency` calls are in flight.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::scorer::{check_call_limits, with_retries, ConcurrencyLimit, Scorer};
use crate::env::Score;
use crate::error::{Error, Result};
use crate::kinds::KindOptions;
use crate::message::{Message, Role};
use crate::task::Task;

/// `[scorer] type = "http_judge"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpJudgeOptions {
    /// The chat-completions URL (`http://127.0.0.1:8000/v1/chat/completions`).
    pub url: String,
    /// The `model` field of the request.
    #[serde(default = "default_model")]
    pub model: String,
    /// The user message; `{question}`, `{answer}`, `{reference}` and `{transcript}` are
    /// filled in.
    #[serde(default = "default_prompt")]
    pub prompt: String,
    /// An environment variable holding a bearer token (`OPENAI_API_KEY`), if the endpoint
    /// needs one.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Limit for one request, seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Further tries after a failed one.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Requests in flight at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
    /// Range the judge's number is clamped to.
    #[serde(default)]
    pub min_reward: f64,
    /// Range the judge's number is clamped to.
    #[serde(default = "one")]
    pub max_reward: f64,
}

fn default_model() -> String {
    "judge".into()
}
fn default_prompt() -> String {
    "Question: {question}\nReference answer: {reference}\nCandidate answer: {answer}\n\
     Is the candidate answer correct? Reply with 1 if it is and 0 if it is not."
        .into()
}
fn default_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    2
}
fn default_concurrency() -> usize {
    16
}
fn one() -> f64 {
    1.0
}

impl KindOptions for HttpJudgeOptions {
    fn validate(&self) -> Result<()> {
        let bad = |key: &str, message: String| Error::Config {
            key: format!("scorer.{key}"),
            message,
        };
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(bad(
                "url",
                format!("must be an http:// or https:// URL, got {:?}", self.url),
            ));
        }
        if !(self.min_reward.is_finite() && self.max_reward.is_finite())
            || self.min_reward > self.max_reward
        {
            return Err(bad(
                "min_reward",
                format!(
                    "min_reward and max_reward must be finite with min <= max, got [{}, {}]",
                    self.min_reward, self.max_reward
                ),
            ));
        }
        check_call_limits(self.timeout_secs, self.retries, self.max_concurrency)
    }
}

/// The judge.
pub struct HttpJudge {
    options: HttpJudgeOptions,
    agent: ureq::Agent,
    limit: ConcurrencyLimit,
    api_key: Option<String>,
}

impl HttpJudge {
    /// A judge with `options` (already validated by the registry).
    pub fn new(options: HttpJudgeOptions) -> Result<Self> {
        let api_key = match &options.api_key_env {
            None => None,
            Some(var) => Some(std::env::var(var).map_err(|_| Error::Config {
                key: "scorer.api_key_env".into(),
                message: format!("the environment variable {var} is not set"),
            })?),
        };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(options.timeout_secs)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self {
            limit: ConcurrencyLimit::new(options.max_concurrency),
            options,
            agent,
            api_key,
        })
    }

    fn prompt(&self, task: &Task, transcript: &[Message]) -> String {
        let answer = transcript
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(|m| m.content.as_str())
            .unwrap_or_default();
        let text: Vec<String> = transcript
            .iter()
            .map(|m| format!("{}: {}", m.role.as_str(), m.content))
            .collect();
        self.options
            .prompt
            .replace("{question}", &task.question)
            .replace("{reference}", &task.answers.join(" | "))
            .replace("{answer}", answer)
            .replace("{transcript}", &text.join("\n"))
    }

    /// One request: the number in the reply, or why there is none (and whether to retry).
    fn ask(&self, body: &Value, key: &str) -> std::result::Result<f64, (bool, String)> {
        let mut request = self
            .agent
            .post(&self.options.url)
            .header(crate::call_key::HTTP_HEADER, key);
        if let Some(key) = &self.api_key {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        let mut response = request
            .send_json(body)
            .map_err(|e| (true, format!("request failed: {e}")))?;
        let status = response.status().as_u16();
        let reply: Value = response
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_json()
            .map_err(|e| {
                (
                    status >= 500 || status == 429,
                    format!("HTTP {status}: {e}"),
                )
            })?;
        if status != 200 {
            return Err((
                status >= 500 || status == 429,
                format!("HTTP {status}: {reply}"),
            ));
        }
        let content = reply["choices"][0]["message"]["content"]
            .as_str()
            .ok_or_else(|| (false, format!("no choices[0].message.content in {reply}")))?;
        first_number(content).ok_or_else(|| (true, format!("no number in the reply {content:?}")))
    }
}

/// The idempotency key of a judgement: `judge/` and the first 32 hex digits of the
/// request's SHA-256. Every try of a judgement, and the same episode judged again after a
/// resume, carries the same key; another transcript gets another.
fn judgement_key(body: &Value) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(body.to_string().as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("judge/{}", &hex[..32])
}

/// The first decimal number in `text` (`"Score: 0.5"` gives 0.5).
pub(crate) fn first_number(text: &str) -> Option<f64> {
    let start = text.find(|c: char| c.is_ascii_digit() || c == '-')?;
    let rest = &text[start..];
    let end = rest
        .char_indices()
        .skip(1)
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].trim_end_matches('.').parse().ok()
}

impl Scorer for HttpJudge {
    fn name(&self) -> &str {
        "judge"
    }

    fn score(&self, task: &Task, transcript: &[Message], _env_score: &Score) -> Result<f64> {
        let body = json!({
            "model": self.options.model,
            "messages": [{"role": "user", "content": self.prompt(task, transcript)}],
            "temperature": 0,
        });
        let o = &self.options;
        let what = format!("judge at {}", o.url);
        let key = judgement_key(&body);
        let x = with_retries(&self.limit, o.timeout_secs, o.retries, &what, || {
            self.ask(&body, &key)
        })?;
        Ok(x.clamp(o.min_reward, o.max_reward))
    }
}

#[cfg(test)]
mod tests {
    use super::first_number;

    #[test]
    fn reads_the_first_number() {
        assert_eq!(first_number("1"), Some(1.0));
        assert_eq!(first_number("Score: 0.75."), Some(0.75));
        assert_eq!(first_number("-1 (wrong)"), Some(-1.0));
        assert_eq!(first_number("correct"), None);
    }
}
