//! `openenv`: episodes on an OpenEnv environment server (`openenv-core`).
//!
//! Each episode opens a session of its own on the server (`session.rs`), resets it with the
//! task's `reset` object (a dataset row's `reset` key: `seed` and the env's own keyword
//! arguments), and then loops: the observation is rendered as a user message (after the
//! system prompt and, on the first step, the task's question), the model replies, the reply
//! goes to the env as the action (as one text field of the env's action type, or as the
//! whole action written as a JSON object), and the env's reward for that action is placed on
//! the step that sampled it. The episode ends when the env says `done`, after `max_steps`
//! actions, or when the next context would not fit `rollout.max_context_length`. Contexts
//! grow in token space: each step's context is the previous one, its sampled ids as they
//! were sampled and the next observation, so nothing sampled is re-tokenised.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use agent_r1_envs::config::KeyDoc;
use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;

use super::session::{ws_url, Session};
use crate::runtime::{Agent, Workflow, WorkflowOutcome};
use crate::{Error, Result};

/// The name `[env] name` gives this workflow.
pub const NAME: &str = "openenv";

/// How the model's reply becomes the env's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActionFormat {
    /// The reply's text is the value of `action_field`.
    Text,
    /// The reply is the action as a JSON object (its fields those of the env's action type);
    /// a reply that is not one is answered with an error observation and costs a step.
    Json,
}

/// `[env.options]` of `openenv`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OpenEnvOptions {
    /// The OpenEnv server: http(s)://host:port (its WebSocket /ws is used, one session per
    /// episode).
    pub url: String,
    /// "text": the reply is the value of action_field; "json": the reply is the whole action
    /// as a JSON object.
    pub action_format: ActionFormat,
    /// The action field that takes the reply's text (action_format "text").
    pub action_field: String,
    /// The observation field shown to the model; unset: the only field when there is one,
    /// else the observation as JSON.
    pub observation_field: Option<String>,
    /// The system prompt of every episode (none when unset).
    pub system_prompt: Option<String>,
    /// At most this many actions per episode; an episode still running then ends there.
    #[schemars(range(min = 1, max = 100000))]
    pub max_steps: usize,
    /// Sessions open at once; more episodes wait for one (keep it at or under the server's
    /// max_concurrent_envs).
    #[schemars(range(min = 1, max = 100000))]
    pub max_sessions: usize,
    /// Longest a connection may take to open.
    #[schemars(range(min = 0.001))]
    pub connect_timeout_secs: f64,
    /// Longest the env may take to answer a reset or a step.
    #[schemars(range(min = 0.001))]
    pub step_timeout_secs: f64,
}

impl Default for OpenEnvOptions {
    fn default() -> Self {
        Self {
            url: String::new(),
            action_format: ActionFormat::Text,
            action_field: "message".into(),
            observation_field: None,
            system_prompt: None,
            max_steps: 8,
            max_sessions: 64,
            connect_timeout_secs: 30.0,
            step_timeout_secs: 60.0,
        }
    }
}

impl KindOptions for OpenEnvOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        let bad = |key: &str, message: String| {
            Err(agent_r1_envs::Error::Config {
                key: format!("env.options.{key}"),
                message,
            })
        };
        if self.url.is_empty() {
            return bad(
                "url",
                "missing: the OpenEnv server, e.g. \"http://127.0.0.1:8000\"".into(),
            );
        }
        if let Err(e) = ws_url(&self.url) {
            return bad("url", e);
        }
        if self.action_format == ActionFormat::Text && self.action_field.is_empty() {
            return bad(
                "action_field",
                "empty: the action field that takes the reply (e.g. \"message\")".into(),
            );
        }
        if self.max_steps == 0 {
            return bad("max_steps", "0: at least 1".into());
        }
        if self.max_sessions == 0 {
            return bad("max_sessions", "0: at least 1".into());
        }
        for (key, v) in [
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("step_timeout_secs", self.step_timeout_secs),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, format!("{v}: a positive number of seconds"));
            }
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        agent_r1_envs::config::key_docs::<Self>()
    }
}

/// The workflow (see the module documentation).
pub struct OpenEnv {
    options: OpenEnvOptions,
    sessions: Arc<tokio::sync::Semaphore>,
    /// The server's action schema checked against the options, once.
    schema: OnceLock<std::result::Result<(), String>>,
}

impl OpenEnv {
    /// The workflow for `options` (validated); nothing connects before the first episode.
    pub fn new(options: OpenEnvOptions) -> agent_r1_envs::Result<Self> {
        options.validate()?;
        Ok(Self {
            sessions: Arc::new(tokio::sync::Semaphore::new(options.max_sessions)),
            options,
            schema: OnceLock::new(),
        })
    }

    /// Reads the server's `/schema` (over HTTP) and checks that its action has
    /// `action_field`, so that a wrong field is one clear error rather than a validation
    /// error from every step. A server without `/schema` (or a ws:// URL) is not checked.
    async fn check_schema(&self) -> Result<()> {
        if let Some(done) = self.schema.get() {
            return done.clone().map_err(Error::Other);
        }
        let result = match (self.options.action_format, schema_url(&self.options.url)) {
            (ActionFormat::Text, Some(url)) => {
                let timeout = Duration::from_secs_f64(self.options.connect_timeout_secs);
                let fetched = tokio::task::spawn_blocking(move || fetch_json(&url, timeout))
                    .await
                    .map_err(|e| Error::Other(format!("reading the env's schema: {e}")))?;
                match fetched {
                    Ok(schema) => check_action_field(&schema, &self.options.action_field),
                    Err(e) => {
                        tracing::warn!("openenv: {e}; the action field is not checked");
                        Ok(())
                    }
                }
            }
            _ => Ok(()),
        };
        let _ = self.schema.set(result.clone());
        result.map_err(Error::Other)
    }

    /// What the model is shown of an observation.
    fn render_observation(&self, observation: &Value) -> String {
        let value = match (&self.options.observation_field, observation) {
            (Some(field), Value::Object(o)) => o.get(field).cloned().unwrap_or(Value::Null),
            (None, Value::Object(o)) if o.len() == 1 => {
                o.values().next().cloned().unwrap_or(Value::Null)
            }
            _ => observation.clone(),
        };
        match value {
            Value::String(s) => s,
            other => other.to_string(),
        }
    }

    /// The env's action for a reply, or the error observation the model sees instead.
    fn action(&self, reply: &str) -> std::result::Result<Value, String> {
        match self.options.action_format {
            ActionFormat::Text => Ok(json!({ self.options.action_field.clone(): reply.trim() })),
            ActionFormat::Json => match serde_json::from_str::<Value>(reply.trim()) {
                Ok(Value::Object(o)) => Ok(Value::Object(o)),
                Ok(other) => Err(format!(
                    "Error: the action must be a JSON object, not {}",
                    kind(&other)
                )),
                Err(e) => Err(format!("Error: the action is not JSON: {e}")),
            },
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn schema_url(base: &str) -> Option<String> {
    let base = base.trim_end_matches('/');
    (base.starts_with("http://") || base.starts_with("https://")).then(|| format!("{base}/schema"))
}

fn fetch_json(url: &str, timeout: Duration) -> std::result::Result<Value, String> {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .build()
        .new_agent();
    let mut response = agent
        .get(url)
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    response
        .body_mut()
        .read_json::<Value>()
        .map_err(|e| format!("GET {url}: {e}"))
}

/// Checks that the env's action type (`/schema`'s `action`, a JSON schema) has `field`.
fn check_action_field(schema: &Value, field: &str) -> std::result::Result<(), String> {
    let Some(properties) = schema
        .pointer("/action/properties")
        .and_then(Value::as_object)
    else {
        return Ok(());
    };
    if properties.contains_key(field) {
        return Ok(());
    }
    let fields: Vec<&str> = properties
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "metadata")
        .collect();
    Err(format!(
        "env.options.action_field: the env's action has no field {field:?}; its fields: {} \
         (or set action_format = \"json\" to have the model write the whole action)",
        fields.join(", ")
    ))
}

#[async_trait]
impl Workflow for OpenEnv {
    fn name(&self) -> &str {
        NAME
    }

    async fn run(&self, task: &Task, agent: &Agent) -> Result<WorkflowOutcome> {
        self.check_schema().await?;
        let _slot = self
            .sessions
            .acquire()
            .await
            .map_err(|_| Error::Other("the openenv sessions are closed".into()))?;
        let o = &self.options;
        let mut session = Session::connect(
            &o.url,
            Duration::from_secs_f64(o.connect_timeout_secs),
            Duration::from_secs_f64(o.step_timeout_secs),
        )
        .await?;
        let outcome = self.episode(&mut session, task, agent).await;
        session.close().await;
        outcome
    }
}

impl OpenEnv {
    async fn episode(
        &self,
        session: &mut Session,
        task: &Task,
        agent: &Agent,
    ) -> Result<WorkflowOutcome> {
        let reset = match task.extra.get("reset") {
            None | Some(Value::Null) => json!({}),
            Some(Value::Object(o)) => Value::Object(o.clone()),
            Some(other) => {
                return Err(Error::Other(format!(
                    "task {}: `reset` must be an object of the env's reset arguments, not {}",
                    task.id,
                    kind(other)
                )))
            }
        };
        let first = session.reset(reset).await?;
        let renderer = agent.renderer();
        let mut opening = vec![];
        if let Some(system) = &self.options.system_prompt {
            opening.push(Message::system(system.clone()));
        }
        let shown = self.render_observation(&first.observation);
        opening.push(Message::user(if task.question.trim().is_empty() {
            shown
        } else {
            format!("{}\n\n{shown}", task.question)
        }));
        let mut context = renderer.prompt(&opening)?;
        let mut step_rewards = vec![];
        let mut total = 0.0;
        let mut done = first.done;
        let mut invalid = 0usize;
        let mut cut_by_context = false;
        while !done && step_rewards.len() < self.options.max_steps {
            let generation = agent.generate(context.clone()).await?;
            let next = match self.action(&generation.text) {
                Ok(action) => {
                    let reply = session.step(action).await?;
                    let reward = reply.reward.unwrap_or(0.0);
                    total += reward;
                    step_rewards.push((generation.step, reward));
                    done = reply.done;
                    self.render_observation(&reply.observation)
                }
                Err(error) => {
                    invalid += 1;
                    step_rewards.push((generation.step, 0.0));
                    error
                }
            };
            if done || step_rewards.len() == self.options.max_steps {
                break;
            }
            let tail = renderer.continuation(&generation.token_ids, &[Message::user(next)])?;
            if context.len() + generation.token_ids.len() + tail.len() + 1 >= agent.max_context() {
                cut_by_context = true;
                break;
            }
            context.extend(&generation.token_ids);
            context.extend(tail);
        }
        let steps = step_rewards.len() as f64;
        let metrics: BTreeMap<String, f64> = [
            ("env_return", total),
            ("env_steps", steps),
            ("env_done", f64::from(u8::from(done))),
            ("invalid_actions", invalid as f64),
            ("cut_by_context", f64::from(u8::from(cut_by_context))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Ok(WorkflowOutcome {
            reward: 0.0,
            step_rewards,
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(options: Value) -> agent_r1_envs::Result<OpenEnv> {
        OpenEnv::new(serde_json::from_value(options).unwrap())
    }

    #[test]
    fn options_are_checked() {
        let e = workflow(json!({})).err().unwrap().to_string();
        assert!(
            e.contains("env.options.url") && e.contains("missing"),
            "{e}"
        );
        let e = workflow(json!({"url": "localhost:8000"}))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("http://"), "{e}");
        let e = workflow(json!({"url": "http://h:1", "max_steps": 0}))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("env.options.max_steps"), "{e}");
        let e = serde_json::from_value::<OpenEnvOptions>(
            json!({"url": "http://h:1", "action_format": "xml"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text") && e.contains("json"), "{e}");
    }

    #[test]
    fn replies_become_actions_and_observations_text() {
        let text = workflow(json!({"url": "http://h:1"})).unwrap();
        assert_eq!(text.action(" 42 \n").unwrap(), json!({"message": "42"}));
        assert_eq!(text.render_observation(&json!({"echoed": "hi"})), "hi");
        assert_eq!(
            text.render_observation(&json!({"a": 1, "b": [2]})),
            r#"{"a":1,"b":[2]}"#
        );
        let json_actions = workflow(json!({
            "url": "http://h:1", "action_format": "json", "observation_field": "board"
        }))
        .unwrap();
        assert_eq!(
            json_actions.action(r#"{"move": 3}"#).unwrap(),
            json!({"move": 3})
        );
        assert!(json_actions.action("[3]").unwrap_err().contains("an array"));
        assert!(json_actions
            .action("move 3")
            .unwrap_err()
            .contains("not JSON"));
        assert_eq!(
            json_actions.render_observation(&json!({"board": "x.o", "legal": [1]})),
            "x.o"
        );
    }

    #[test]
    fn the_action_field_is_checked_against_the_schema() {
        let schema = json!({"action": {"properties": {"message": {}, "metadata": {}}}});
        assert!(check_action_field(&schema, "message").is_ok());
        let e = check_action_field(&schema, "text").unwrap_err();
        assert!(
            e.contains("\"text\"") && e.contains("its fields: message"),
            "{e}"
        );
    }
}
