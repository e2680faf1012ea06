//! `external_agent`: episodes driven by an outside program through the endpoint.
//!
//! The program is either a command run once per episode, or a long-lived agent service that
//! takes many episodes at once: each episode is one `POST` to `service_url` with
//! `{"task", "base_url", "api_key", "episode_base_url"}`, answered (status 200) with the
//! reward object below. The run can start the service itself (`service_command`,
//! `agent_service.rs`): the URL is then the first line the service prints. The program may
//! call the run's own tools through the endpoint (`run_tools.rs`). A command is run like
//! this: the task as JSON on its stdin, the
//! endpoint in `OPENAI_BASE_URL` and the episode's key in `OPENAI_API_KEY` (also
//! `AGENT_R1_EPISODE_BASE_URL`, a base URL naming the episode, for clients whose key is
//! fixed). With `token_file` (required off loopback) the API key is the run's token and
//! both base URLs name the episode. Every completion it asks for is a step of the episode. When it exits with status
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

use agent_r1_envs::access::{check_exposure, Access, AccessKeys};
use agent_r1_envs::config::KeyDoc;
use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::task::Task;

use super::agent_service::AgentService;
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
    /// Or a long-lived agent service: one POST per episode (the task, the endpoint's base
    /// URL and the episode's key), answered with the reward object.
    pub service_url: Option<String>,
    /// Or an agent service the run starts itself (once, in working_dir): the first line it
    /// prints on stdout is the URL episodes are posted to (e.g. python/agent_r1_verifiers.py
    /// serving a verifiers environment).
    pub service_command: Vec<String>,
    /// Longest service_command may take to print its URL.
    #[schemars(range(min = 0.001))]
    pub service_start_timeout_secs: f64,
    /// Times a service_command that exited is started again (at the next episode) before
    /// its episodes fail for good.
    #[schemars(range(max = 1000))]
    pub service_restarts: usize,
    /// The program's working directory (the trainer's when unset).
    pub working_dir: Option<PathBuf>,
    /// Where the OpenAI-compatible endpoint listens (port 0 picks a free port). Anything
    /// but loopback needs `token_file`.
    pub listen: String,
    /// File whose first line is the bearer token the endpoint wants; required when `listen`
    /// is not loopback. Agents are then given the token as their API key and their
    /// episode's own base URL (`/episodes/KEY/v1`).
    pub token_file: Option<PathBuf>,
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
    /// Requests one episode may have in flight at once (as many more may wait for them);
    /// past that, requests are refused with 429.
    #[schemars(range(min = 1, max = 4096))]
    pub max_requests_per_episode: usize,
    /// Longest a request waits for its answer before it is answered 504.
    #[schemars(range(min = 0.001))]
    pub request_timeout_secs: f64,
    /// Longest tool result `POST /v1/agent_r1/tool_calls` answers, in characters (cut as the
    /// built-in loop cuts observations). When `[env.workflow]` drives an env's episodes, the
    /// env's own `max_observation_chars` is used unless this is written.
    #[schemars(range(min = 1))]
    pub max_observation_chars: usize,
}

impl Default for ExternalAgentOptions {
    fn default() -> Self {
        Self {
            command: vec![],
            service_url: None,
            service_command: vec![],
            service_start_timeout_secs: 300.0,
            service_restarts: 3,
            working_dir: None,
            listen: "127.0.0.1:0".into(),
            token_file: None,
            model_name: "agent-r1".into(),
            timeout_secs: 600.0,
            idle_timeout_secs: 300.0,
            max_processes: 256,
            max_requests_per_episode: 16,
            request_timeout_secs: 600.0,
            max_observation_chars: 2048,
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
        let given: Vec<&str> = [
            ("command", !self.command.is_empty()),
            ("service_url", self.service_url.is_some()),
            ("service_command", !self.service_command.is_empty()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        match given.as_slice() {
            [] => {
                return bad(
                    "command",
                    "missing: the agent program to run per episode, e.g. [\"python3\", \
                     \"agent.py\"] (or service_url, an agent service, or service_command, one \
                     the run starts)"
                        .into(),
                )
            }
            [_] => {}
            [first, second, ..] => {
                return bad(
                    second,
                    format!(
                        "set with {first}: an episode runs a command, posts to service_url or \
                         posts to the service service_command starts; one of them"
                    ),
                )
            }
        }
        if let Some(url) = &self.service_url {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return bad(
                    "service_url",
                    format!("{url:?}: an http:// or https:// URL"),
                );
            }
        }
        if !self.command.is_empty() && self.command[0].is_empty() {
            return bad("command", "its program is empty".into());
        }
        if !self.service_command.is_empty() && self.service_command[0].is_empty() {
            return bad("service_command", "its program is empty".into());
        }
        let Ok(listen) = self.listen.parse::<SocketAddr>() else {
            return bad(
                "listen",
                format!(
                    "{:?}: an IP address and port, e.g. \"127.0.0.1:0\"",
                    self.listen
                ),
            );
        };
        if let Err(e) = check_exposure(ACCESS_KEYS, listen, self.token_file.as_deref(), &[]) {
            return bad(&e.key, e.message);
        }
        for (key, v) in [
            ("timeout_secs", self.timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("request_timeout_secs", self.request_timeout_secs),
            (
                "service_start_timeout_secs",
                self.service_start_timeout_secs,
            ),
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
        if self.max_observation_chars == 0 {
            return bad("max_observation_chars", "0: at least 1".into());
        }
        Ok(())
    }

    fn keys() -> Vec<KeyDoc> {
        agent_r1_envs::config::key_docs::<Self>()
    }
}

/// The endpoint's keys, relative to `env.options`.
const ACCESS_KEYS: AccessKeys = AccessKeys {
    section: "env.options",
    address: "listen",
    token_file: "token_file",
    open_paths: "",
};

/// The workflow (see the module documentation).
pub struct ExternalAgent {
    options: ExternalAgentOptions,
    /// Who the endpoint admits (its token read when the workflow is made).
    access: Access,
    endpoint: OnceLock<std::result::Result<Arc<Endpoint>, String>>,
    slots: Arc<tokio::sync::Semaphore>,
    /// The service `service_command` starts, when set.
    service: Option<Arc<AgentService>>,
}

impl ExternalAgent {
    /// The workflow for `options` (validated); the endpoint starts with the first episode.
    pub fn new(options: ExternalAgentOptions) -> agent_r1_envs::Result<Self> {
        options.validate()?;
        let listen: SocketAddr =
            options
                .listen
                .parse()
                .map_err(|e| agent_r1_envs::Error::Config {
                    key: "env.options.listen".into(),
                    message: format!("{e}"),
                })?;
        let access = Access::load(ACCESS_KEYS, listen, options.token_file.as_deref(), &[])
            .map_err(|e| e.under("env.options"))?;
        let service = (!options.service_command.is_empty()).then(|| {
            Arc::new(AgentService::new(
                options.service_command.clone(),
                options.working_dir.clone(),
                Duration::from_secs_f64(options.service_start_timeout_secs),
                options.service_restarts,
            ))
        });
        Ok(Self {
            service,
            slots: Arc::new(tokio::sync::Semaphore::new(options.max_processes)),
            options,
            access,
            endpoint: OnceLock::new(),
        })
    }

    /// The endpoint, started on first use.
    pub fn endpoint(&self) -> Result<Arc<Endpoint>> {
        self.endpoint
            .get_or_init(|| {
                let addr: SocketAddr = self.options.listen.parse().map_err(|e| format!("{e}"))?;
                let access = self.access.clone();
                let limits = EndpointLimits {
                    request_timeout: Duration::from_secs_f64(self.options.request_timeout_secs),
                    ..Default::default()
                };
                let endpoint =
                    Endpoint::start(addr, access, self.options.model_name.clone(), limits)
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
        let program = match (&self.options.service_url, &self.service) {
            (Some(url), _) => format!("agent service {url}"),
            (None, Some(_)) => format!("agent service {:?}", self.options.service_command[0]),
            (None, None) => format!("agent command {:?}", self.options.command[0]),
        };
        let driver = self.start(&endpoint, &key, task, input, &program)?;
        tokio::pin!(driver);
        let timeout = Duration::from_secs_f64(self.options.timeout_secs);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let idle = Duration::from_secs_f64(self.options.idle_timeout_secs);
        let idle_deadline = tokio::time::sleep(idle);
        tokio::pin!(idle_deadline);
        let mut in_flight = FuturesUnordered::new();
        let in_flight_limit = self.options.max_requests_per_episode;
        let observation_chars = self.options.max_observation_chars;
        let timed_out = |what: String, after: Duration| {
            metrics::counter!(crate::metric_names::AGENT_PROCESSES_TOTAL.name, "outcome" => "timed_out")
                .increment(1);
            Err(Error::Timeout { what, after })
        };
        let finished = loop {
            tokio::select! {
                // A request already waiting is served before any deadline is looked at.
                biased;
                Some(request) = requests.recv(), if in_flight.len() < in_flight_limit => {
                    let (conversation, tag) = (&conversation, &tag);
                    in_flight.push(async move {
                        let answer =
                            serve(agent, conversation, request.call, tag, observation_chars).await;
                        let _ = request.reply.send(answer);
                    });
                }
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {
                    idle_deadline.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                finished = &mut driver => break finished,
                _ = &mut idle_deadline, if in_flight.is_empty() => {
                    // Dropping the driver kills a command's process group.
                    return timed_out(
                        format!("{program} to make a request or finish (env.options.idle_timeout_secs); it was taken as hung and stopped"),
                        idle,
                    );
                }
                _ = &mut deadline => {
                    return timed_out(
                        format!("{program} (env.options.timeout_secs); it was stopped"),
                        timeout,
                    );
                }
            }
        };
        // Requests still in flight answer a program that has finished.
        drop(in_flight);
        let outcome = finished
            .and_then(|text| read_outcome(&text, &conversation))
            .map_err(|e| Error::Other(format!("{program} {e}")));
        let label = if outcome.is_ok() {
            "completed"
        } else {
            "failed"
        };
        metrics::counter!(crate::metric_names::AGENT_PROCESSES_TOTAL.name, "outcome" => label)
            .increment(1);
        outcome
    }
}

/// What an episode's program hands back: the text holding the reward, or why there is none.
type Driven = std::result::Result<String, String>;

/// An episode's program running: its command or its post to the agent service.
type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = Driven> + Send>>;

impl ExternalAgent {
    /// Starts the episode's program: the command (its process group killed when the returned
    /// future is dropped) or the post to the agent service.
    fn start(
        &self,
        endpoint: &Endpoint,
        key: &str,
        task: &Task,
        input: Vec<u8>,
        program: &str,
    ) -> Result<Driver> {
        let (base_url, api_key) = endpoint.credentials(key);
        if self.options.service_url.is_some() || self.service.is_some() {
            let body = serde_json::json!({
                "task": task,
                "base_url": base_url,
                "api_key": api_key,
                "episode_base_url": endpoint.episode_base_url(key),
            });
            let (fixed, service) = (self.options.service_url.clone(), self.service.clone());
            let timeout = self.options.timeout_secs;
            return Ok(Box::pin(async move {
                let url = match (fixed, service) {
                    (Some(url), _) => url,
                    (None, Some(service)) => service.url().await.map_err(|e| e.to_string())?,
                    (None, None) => return Err("has no URL".into()),
                };
                tokio::task::spawn_blocking(move || post_episode(&url, &body, timeout))
                    .await
                    .unwrap_or_else(|e| Err(format!("the request to it failed: {e}")))
            }));
        }
        let env = [
            ("OPENAI_BASE_URL", base_url),
            ("OPENAI_API_KEY", api_key),
            ("AGENT_R1_EPISODE_BASE_URL", endpoint.episode_base_url(key)),
        ];
        let mut process = AgentProcess::spawn(
            &self.options.command,
            self.options.working_dir.as_deref(),
            &env,
            input,
        )
        .map_err(|e| Error::Other(format!("{program} cannot start: {e}")))?;
        Ok(Box::pin(async move {
            let status = process
                .wait()
                .await
                .map_err(|e| format!("cannot be waited for: {e}"))?;
            let finished = process.finish(status).await;
            if finished.status.success() {
                Ok(finished.stdout)
            } else {
                Err(format!(
                    "exited with {}; its stderr ends: {}",
                    finished.status,
                    last_chars(&finished.stderr, 600)
                ))
            }
        }))
    }
}

/// Posts one episode to an agent service and returns its answer's body.
fn post_episode(url: &str, body: &Value, timeout_secs: f64) -> Driven {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(timeout_secs)))
            .http_status_as_error(false)
            .build(),
    );
    let mut response = agent
        .post(url)
        .send_json(body)
        .map_err(|e| format!("could not be reached: {e}"))?;
    let status = response.status();
    let text = response
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_string()
        .map_err(|e| format!("answered a body that cannot be read: {e}"))?;
    if !status.is_success() {
        return Err(format!("answered {status}: {}", last_chars(&text, 600)));
    }
    Ok(text)
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
    let format_hint =
        "its answer (a command: the last line of its stdout) must be a JSON object like \
         {\"reward\": 1.0}";
    let whole = stdout.trim();
    let line = if whole.starts_with('{') && serde_json::from_str::<Value>(whole).is_ok() {
        Some(whole)
    } else {
        stdout.lines().rev().find(|l| !l.trim().is_empty())
    };
    let Some(line) = line else {
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
