//! `external_agent`: episodes driven by an outside program through the endpoint.
//!
//! Each episode runs the configured command once: the task as JSON on its stdin, the
//! endpoint in `OPENAI_BASE_URL` and the episode's key in `OPENAI_API_KEY` (also
//! `AGENT_R1_EPISODE_BASE_URL`, a base URL naming the episode, for clients whose key is
//! fixed). Every completion it asks for is a step of the episode. When it exits with status
//! 0, the last line of its stdout is the reward: `{"reward": 1.0}`, optionally with
//! `"metrics": {"name": number}` and `"step_rewards": {"<completion id>": number}`. A program
//! that exits non-zero, prints no reward or runs past its timeout fails its episode with the
//! reason, and its whole process group is killed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{FuturesUnordered, StreamExt};
use rand::RngCore;
use serde::Deserialize;
use serde_json::Value;

use agent_r1_envs::config::KeyDoc;
use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::task::Task;

use super::conversation::Conversation;
use super::process::AgentProcess;
use super::serve::serve;
use super::server::{Endpoint, EndpointLimits};
use crate::runtime::{Agent, Workflow, WorkflowOutcome};
use crate::{Error, Result};

/// The name `[env] name` gives this workflow.
pub const NAME: &str = "external_agent";

/// `[env.options]` of `external_agent`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExternalAgentOptions {
    /// The agent program and its arguments, run once per episode: the task as JSON on
    /// stdin, the endpoint in OPENAI_BASE_URL and OPENAI_API_KEY; its last line of stdout is
    /// the reward, {"reward": 1.0} (with optional "metrics" and "step_rewards").
    pub command: Vec<String>,
    /// The program's working directory (the trainer's when unset).
    pub working_dir: Option<PathBuf>,
    /// Where the OpenAI-compatible endpoint listens (port 0 picks a free port).
    pub listen: String,
    /// The model name /v1/models lists (requests may name any).
    pub model_name: String,
    /// Longest one episode's program may run; past it its process group is killed and the
    /// episode fails.
    #[schemars(range(min = 0.001))]
    pub timeout_secs: f64,
    /// Longest the program may go without a request of its own in flight (from its start,
    /// or from the last answer it was given); past it, it is taken as hung, its process
    /// group killed and the episode failed. Time its requests wait on the engine does not
    /// count.
    #[schemars(range(min = 0.001))]
    pub idle_timeout_secs: f64,
    /// Agent programs running at once; more episodes wait for a slot.
    #[schemars(range(min = 1, max = 100000))]
    pub max_processes: usize,
    /// Requests one episode may have waiting at once; more are refused with 429.
    #[schemars(range(min = 1, max = 4096))]
    pub max_requests_per_episode: usize,
    /// Longest a request waits for its answer before it is answered 504.
    #[schemars(range(min = 0.001))]
    pub request_timeout_secs: f64,
}

impl Default for ExternalAgentOptions {
    fn default() -> Self {
        Self {
            command: vec![],
            working_dir: None,
            listen: "127.0.0.1:0".into(),
            model_name: "agent-r1".into(),
            timeout_secs: 600.0,
            idle_timeout_secs: 300.0,
            max_processes: 256,
            max_requests_per_episode: 16,
            request_timeout_secs: 600.0,
        }
    }
}

impl KindOptions for ExternalAgentOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        let bad = |key: &str, message: String| {
            Err(agent_r1_envs::Error::Config {
                key: format!("env.options.{key}"),
                message,
            })
        };
        if self.command.is_empty() || self.command[0].is_empty() {
            return bad(
                "command",
                "missing: the agent program to run per episode, e.g. [\"python3\", \"agent.py\"]"
                    .into(),
            );
        }
        if self.listen.parse::<SocketAddr>().is_err() {
            return bad(
                "listen",
                format!(
                    "{:?}: an IP address and port, e.g. \"127.0.0.1:0\"",
                    self.listen
                ),
            );
        }
        for (key, v) in [
            ("timeout_secs", self.timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("request_timeout_secs", self.request_timeout_secs),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, format!("{v}: a positive number of seconds"));
            }
        }
        if self.max_processes == 0 {
            return bad("max_processes", "0: at least 1".into());
        }
        if self.max_requests_per_episode == 0 {
            return bad("max_requests_per_episode", "0: at least 1".into());
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        agent_r1_envs::config::key_docs::<Self>()
    }
}

/// The workflow (see the module documentation).
pub struct ExternalAgent {
    options: ExternalAgentOptions,
    endpoint: OnceLock<std::result::Result<Arc<Endpoint>, String>>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl ExternalAgent {
    /// The workflow for `options` (validated); the endpoint starts with the first episode.
    pub fn new(options: ExternalAgentOptions) -> agent_r1_envs::Result<Self> {
        options.validate()?;
        Ok(Self {
            slots: Arc::new(tokio::sync::Semaphore::new(options.max_processes)),
            options,
            endpoint: OnceLock::new(),
        })
    }

    /// The endpoint, started on first use.
    pub fn endpoint(&self) -> Result<Arc<Endpoint>> {
        self.endpoint
            .get_or_init(|| {
                let addr: SocketAddr = self.options.listen.parse().map_err(|e| format!("{e}"))?;
                let limits = EndpointLimits {
                    request_timeout: Duration::from_secs_f64(self.options.request_timeout_secs),
                    ..Default::default()
                };
                let endpoint = Endpoint::start(addr, self.options.model_name.clone(), limits)
                    .map_err(|e| format!("the OpenAI endpoint cannot listen on {addr}: {e}"))?;
                tracing::info!("openai endpoint at {}", endpoint.base_url());
                Ok(Arc::new(endpoint))
            })
            .clone()
            .map_err(Error::Other)
    }
}

fn new_key() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("ar1-{hex}")
}

#[async_trait]
impl Workflow for ExternalAgent {
    fn name(&self) -> &str {
        NAME
    }

    async fn run(&self, task: &Task, agent: &Agent) -> Result<WorkflowOutcome> {
        let endpoint = self.endpoint()?;
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Error::Other("the agent process slots are closed".into()))?;
        let key = new_key();
        let tag = key[4..16].to_string();
        let (_registration, mut requests) =
            endpoint.register(key.clone(), self.options.max_requests_per_episode);
        let renderer = agent.renderer();
        let conversation = Mutex::new(Conversation::new(
            renderer.tokenizer().clone(),
            renderer.tool_call_format(),
        ));
        let input =
            serde_json::to_vec(task).map_err(|e| Error::Other(format!("the task as JSON: {e}")))?;
        let env = [
            ("OPENAI_BASE_URL", endpoint.base_url()),
            ("OPENAI_API_KEY", key.clone()),
            ("AGENT_R1_EPISODE_BASE_URL", endpoint.episode_base_url(&key)),
        ];
        let program = &self.options.command[0];
        let mut process = AgentProcess::spawn(
            &self.options.command,
            self.options.working_dir.as_deref(),
            &env,
            input,
        )
        .map_err(|e| Error::Other(format!("agent command {program:?} cannot start: {e}")))?;
        let timeout = Duration::from_secs_f64(self.options.timeout_secs);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let idle = Duration::from_secs_f64(self.options.idle_timeout_secs);
        let idle_deadline = tokio::time::sleep(idle);
        tokio::pin!(idle_deadline);
        let mut in_flight = FuturesUnordered::new();
        let exited = loop {
            tokio::select! {
                // A request already waiting is served before any deadline is looked at.
                biased;
                Some(request) = requests.recv() => {
                    let (conversation, tag) = (&conversation, &tag);
                    in_flight.push(async move {
                        let answer = serve(agent, conversation, request.call, tag).await;
                        let _ = request.reply.send(answer);
                    });
                }
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {
                    idle_deadline.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                status = process.wait() => break status,
                _ = &mut idle_deadline, if in_flight.is_empty() => {
                    process.kill_group();
                    metrics::counter!("agent_r1_agent_processes_total", "outcome" => "timed_out")
                        .increment(1);
                    return Err(Error::Timeout {
                        what: format!("agent command {program:?} to make a request or exit (env.options.idle_timeout_secs); it was taken as hung and its process group was killed"),
                        after: idle,
                    });
                }
                _ = &mut deadline => {
                    process.kill_group();
                    metrics::counter!("agent_r1_agent_processes_total", "outcome" => "timed_out")
                        .increment(1);
                    return Err(Error::Timeout {
                        what: format!("agent command {program:?} (env.options.timeout_secs); its process group was killed"),
                        after: timeout,
                    });
                }
            }
        };
        // Requests still in flight answer a program that has exited.
        drop(in_flight);
        let status = exited
            .map_err(|e| Error::Other(format!("waiting for agent command {program:?}: {e}")))?;
        let finished = process.finish(status).await;
        let outcome = if finished.status.success() {
            read_outcome(&finished.stdout, &conversation)
                .map_err(|e| Error::Other(format!("agent command {program:?} {e}")))
        } else {
            Err(Error::Other(format!(
                "agent command {program:?} exited with {}; its stderr ends: {}",
                finished.status,
                last_chars(&finished.stderr, 600)
            )))
        };
        let label = if outcome.is_ok() {
            "completed"
        } else {
            "failed"
        };
        metrics::counter!("agent_r1_agent_processes_total", "outcome" => label).increment(1);
        outcome
    }
}

fn last_chars(s: &str, n: usize) -> String {
    let s = s.trim_end();
    let start = s
        .char_indices()
        .rev()
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    let tail = &s[start..];
    if tail.is_empty() {
        "(nothing)".into()
    } else {
        tail.to_string()
    }
}

/// The reward line: the last non-empty line of stdout.
fn read_outcome(
    stdout: &str,
    conversation: &Mutex<Conversation>,
) -> std::result::Result<WorkflowOutcome, String> {
    let format_hint = "its last line of stdout must be a JSON object like {\"reward\": 1.0}";
    let Some(line) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Err(format!("printed no reward: {format_hint}"));
    };
    let value: Value = serde_json::from_str(line.trim()).map_err(|e| {
        format!(
            "printed no reward: {format_hint}; its last line is {:?} ({e})",
            last_chars(line, 200)
        )
    })?;
    let reward = value
        .get("reward")
        .and_then(Value::as_f64)
        .filter(|r| r.is_finite())
        .ok_or_else(|| {
            format!(
                "printed no reward: {format_hint}; its last line has no finite \"reward\": {}",
                last_chars(line, 200)
            )
        })?;
    let mut metrics = BTreeMap::new();
    if let Some(m) = value.get("metrics") {
        let Some(m) = m.as_object() else {
            return Err("printed \"metrics\" that is not an object of numbers".into());
        };
        for (k, v) in m {
            let Some(v) = v.as_f64().filter(|v| v.is_finite()) else {
                return Err(format!(
                    "printed metric {k:?} = {v}: a finite number is required"
                ));
            };
            metrics.insert(k.clone(), v);
        }
    }
    let mut step_rewards = vec![];
    if let Some(s) = value.get("step_rewards") {
        let Some(s) = s.as_object() else {
            return Err("printed \"step_rewards\" that is not an object of completion ids".into());
        };
        let conv = conversation.lock().unwrap_or_else(|e| e.into_inner());
        for (id, r) in s {
            let Some(r) = r.as_f64().filter(|r| r.is_finite()) else {
                return Err(format!(
                    "printed step reward {id:?} = {r}: a finite number is required"
                ));
            };
            let Some(steps) = conv.steps_of(id) else {
                return Err(format!(
                    "printed a step reward for {id:?}, which is not a completion of its episode"
                ));
            };
            step_rewards.extend(steps.iter().map(|&k| (k, r)));
        }
    }
    Ok(WorkflowOutcome {
        reward,
        step_rewards,
        metrics,
    })
}
