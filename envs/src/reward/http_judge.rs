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

use super::scorer::{ConcurrencyLimit, Scorer};
use crate::env::Score;
use crate::error::{Error, Result};
use crate::message::{Message, Role};
use crate::task::Task;
use crate::tools::ToolOptions;

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

impl ToolOptions for HttpJudgeOptions {
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
        if !(self.timeout_secs > 0.0 && self.timeout_secs <= 3600.0) {
            return Err(bad(
                "timeout_secs",
                format!(
                    "must be a number of seconds in (0, 3600], got {}",
                    self.timeout_secs
                ),
            ));
        }
        if self.retries > 10 {
            return Err(bad(
                "retries",
                format!("must be at most 10, got {}", self.retries),
            ));
        }
        if !(1..=1024).contains(&self.max_concurrency) {
            return Err(bad(
                "max_concurrency",
                format!("must be in 1..=1024, got {}", self.max_concurrency),
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
        Ok(())
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
    fn ask(&self, body: &Value) -> std::result::Result<f64, (bool, String)> {
        let mut request = self.agent.post(&self.options.url);
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
        let wait = Duration::from_secs_f64(
            self.options.timeout_secs * f64::from(self.options.retries + 1),
        );
        let _slot = self.limit.acquire(wait)?;
        let mut last = String::new();
        for _ in 0..=self.options.retries {
            match self.ask(&body) {
                Ok(x) => return Ok(x.clamp(self.options.min_reward, self.options.max_reward)),
                Err((retry, why)) => {
                    last = why;
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(Error::Other(format!(
            "judge at {}: {last} (after {} tries)",
            self.options.url,
            self.options.retries + 1
        )))
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
