//! One actor per running episode.
//!
//! Each turn is one message to itself: ask the engine for a turn on the exact context ids,
//! let the env decide, run tool calls concurrently through the tool pools, append the
//! observation as tokens, and send the finished step on. Every wait has a deadline; an error
//! fails the actor, and the rollout supervisor re-queues or reports the task.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use agent_r1_envs::env::TurnOutcome;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, ToolCall};

use super::engine_actor::EngineMsg;
use super::env_actor::EnvMsg;
use super::live::{LiveBoard, LiveEntry, Stage};
use super::render::TurnRenderer;
use super::supervisor::SupervisorMsg;
use super::tool_pool::ToolPoolMsg;
use super::EpisodeConfig;
use crate::engine::TurnRequest;
use crate::trajectory::{EpisodeEnd, Step, Trajectory};
use crate::Error;

/// What every episode of a run shares.
pub(crate) struct Shared {
    pub(crate) env: RwLock<ActorRef<EnvMsg>>,
    pub(crate) engine: ActorRef<EngineMsg>,
    pub(crate) tools: HashMap<String, (ActorRef<ToolPoolMsg>, Duration)>,
    pub(crate) renderer: Arc<TurnRenderer>,
    pub(crate) config: EpisodeConfig,
    pub(crate) live: LiveBoard,
}

impl Shared {
    fn env(&self) -> ActorRef<EnvMsg> {
        self.env.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Asks the env actor. If the actor died under the call (another episode's task crashed
/// it), waits for the supervisor's replacement and asks again, until `ENV_RESTART_WAIT`.
/// An error the env itself answered (its own failure on this task) is returned at once.
async fn ask_env<T: Send + 'static>(
    shared: &Shared,
    what: &str,
    build: impl Fn(ractor::RpcReplyPort<Result<T, String>>) -> EnvMsg,
) -> Result<T, ActorProcessingErr> {
    let deadline = Instant::now() + ENV_RESTART_WAIT;
    loop {
        let env = shared.env();
        match ask(&env, what, ENV_TIMEOUT, &build).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(reason)) => return Err(format!("{what}: {reason}").into()),
            Err(e) => {
                while shared.env().get_id() == env.get_id() {
                    if Instant::now() > deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}

const ENV_RESTART_WAIT: Duration = Duration::from_secs(5);

/// Arguments of an episode.
pub struct EpisodeArgs {
    pub(crate) episode_id: u64,
    pub(crate) group_id: u64,
    pub(crate) attempts: u32,
    pub(crate) task: Arc<Task>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
}

/// An episode's messages (to itself).
#[derive(Debug)]
pub enum EpisodeMsg {
    /// Render the prompt.
    Start,
    /// Generate the next turn.
    Turn,
}

/// The episode actor.
pub struct Episode;

/// A running episode.
pub struct EpisodeState {
    args: EpisodeArgs,
    prompt_ids: Vec<u32>,
    stream: Vec<u32>,
    transcript: Vec<Message>,
    steps: Vec<Step>,
    started: Instant,
    live: LiveEntry,
}

const ENV_TIMEOUT: Duration = Duration::from_secs(60);

async fn ask<T: Send + 'static, M: ractor::Message>(
    actor: &ActorRef<M>,
    what: &str,
    timeout: Duration,
    build: impl Fn(ractor::RpcReplyPort<T>) -> M,
) -> Result<T, ActorProcessingErr> {
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(v)) => Ok(v),
        Ok(CallResult::Timeout) => Err(format!("{what}: no answer within {timeout:?}").into()),
        Ok(CallResult::SenderError) => Err(format!("{what}: the actor dropped the request").into()),
        Err(e) => Err(format!("{what}: {e}").into()),
    }
}

impl Actor for Episode {
    type Msg = EpisodeMsg;
    type State = EpisodeState;
    type Arguments = EpisodeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: EpisodeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(EpisodeMsg::Start)?;
        let live = args
            .shared
            .live
            .enter(args.episode_id, &args.task.id, &args.task.question);
        Ok(EpisodeState {
            live,
            args,
            prompt_ids: vec![],
            stream: vec![],
            transcript: vec![],
            steps: vec![],
            started: Instant::now(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            EpisodeMsg::Start => {
                let shared = state.args.shared.clone();
                let task = state.args.task.clone();
                let messages =
                    ask_env(&shared, "env reset", |r| EnvMsg::Reset(task.clone(), r)).await?;
                state.prompt_ids = shared.renderer.prompt(&messages)?;
                if state.prompt_ids.len() + 1 >= shared.config.max_context {
                    return Err(format!(
                        "the prompt has {} tokens, more than max_context {}",
                        state.prompt_ids.len(),
                        shared.config.max_context
                    )
                    .into());
                }
                state.stream = state.prompt_ids.clone();
                state.transcript = messages;
                myself.cast(EpisodeMsg::Turn)?;
            }
            EpisodeMsg::Turn => {
                if let Some(reason) = turn(state).await? {
                    finish(myself, state, reason).await?;
                } else {
                    myself.cast(EpisodeMsg::Turn)?;
                }
            }
        }
        Ok(())
    }
}

/// Runs one turn; returns the end reason when the episode is over.
async fn turn(state: &mut EpisodeState) -> Result<Option<String>, ActorProcessingErr> {
    let shared = state.args.shared.clone();
    let config = &shared.config;
    let task = state.args.task.clone();
    let context_len = state.stream.len();
    let mut params = config.sampling.clone();
    params.max_new_tokens = params
        .max_new_tokens
        .min(config.max_context.saturating_sub(context_len + 1))
        .max(1);
    let request = TurnRequest {
        episode: state.args.episode_id,
        context: state.stream.clone(),
        params,
        stop_strings: config.stop_strings.clone(),
    };
    let began = Instant::now();
    state.live.set(Stage::Generating);
    let out = match ask(&shared.engine, "engine", config.generate_timeout, |r| {
        EngineMsg::Generate(request.clone(), r)
    })
    .await?
    {
        Ok(out) => out,
        Err(Error::EngineStopped(reason)) => {
            let _ = state.args.supervisor.cast(SupervisorMsg::Fatal(format!(
                "inference engine stopped: {reason}"
            )));
            return Err(format!("inference engine stopped: {reason}").into());
        }
        Err(e) => return Err(format!("engine: {e}").into()),
    };
    let generate_seconds = began.elapsed().as_secs_f64();
    let text = shared.renderer.tokenizer().decode(&out.token_ids, true)?;
    state.transcript.push(Message::assistant(text.clone()));
    let mut step = Step {
        context_len,
        logprobs: out.logprobs,
        policy_version: out.policy_version,
        finish_reason: out.finish_reason,
        tool_calls: vec![],
        observation_ids: vec![],
        reward: 0.0,
        generate_seconds,
        tool_seconds: 0.0,
        prefill_tokens: out.prefill_tokens,
        action_ids: out.token_ids,
    };
    state.stream.extend(&step.action_ids);
    let t2 = task.clone();
    let calls = shared.renderer.parse_tool_calls(&text);
    state.live.set(Stage::Deciding);
    let decision = ask_env(&shared, "env on_turn", |r| {
        EnvMsg::OnTurn(t2.clone(), text.clone(), calls.clone(), r)
    })
    .await?;
    let calls = match decision {
        TurnOutcome::Done => {
            state.live.turn_done(step.action_ids.len(), 0);
            state.steps.push(step);
            return Ok(Some("done".into()));
        }
        TurnOutcome::Calls(calls) => calls,
    };
    if state.steps.len() + 1 >= config.max_turns {
        state.live.turn_done(step.action_ids.len(), 0);
        state.steps.push(step);
        return Ok(Some("max_turns".into()));
    }
    let tools_began = Instant::now();
    state.live.set(Stage::InTools(
        calls
            .iter()
            .map(|c| c.as_ref().map_or("(unparsed)".into(), |c| c.name.clone()))
            .collect(),
    ));
    let outcomes = run_calls(&shared, calls).await;
    step.tool_seconds = tools_began.elapsed().as_secs_f64();
    state.live.set(Stage::Observing);
    let (observations, reward) = ask_env(&shared, "env observe", |r| {
        EnvMsg::Observe(task.clone(), outcomes.clone(), r)
    })
    .await?;
    step.tool_calls = outcomes;
    step.reward = reward;
    state
        .live
        .turn_done(step.action_ids.len(), step.tool_calls.len());
    let continuation = shared
        .renderer
        .continuation(&step.action_ids, &observations)?;
    if state.stream.len() + continuation.len() + 1 >= config.max_context {
        state.steps.push(step);
        return Ok(Some("max_context".into()));
    }
    state.stream.extend(&continuation);
    step.observation_ids = continuation;
    state.transcript.extend(observations);
    state.steps.push(step);
    Ok(None)
}

async fn run_calls(shared: &Shared, calls: Vec<Result<ToolCall, CallError>>) -> Vec<CallOutcome> {
    let futures = calls.into_iter().map(|call| async move {
        let call = match call {
            Ok(call) => call,
            Err(e) => {
                // The model's call did not parse (bad JSON, no name, arguments not JSON).
                count_tool_error("unparsed", e.kind());
                return CallOutcome {
                    name: None,
                    result: Err(e),
                    latency: Duration::ZERO,
                }
            }
        };
        let Some((pool, timeout)) = shared.tools.get(&call.name) else {
            metrics::counter!("agent_r1_tool_errors_total", "tool" => "unknown", "kind" => "unknown_tool")
                .increment(1);
            return CallOutcome {
                name: Some(call.name.clone()),
                result: Err(CallError::UnknownTool(call.name)),
                latency: Duration::ZERO,
            };
        };
        let name = call.name.clone();
        // The worker enforces the tool's own timeout; this deadline also covers queueing.
        let deadline = *timeout + shared.config.tool_queue_timeout;
        let began = Instant::now();
        match pool.call(|r| ToolPoolMsg::Call(call, r), Some(deadline)).await {
            Ok(CallResult::Success(outcome)) => outcome,
            Ok(CallResult::Timeout) => {
                count_tool_error(&name, "timeout");
                CallOutcome {
                    name: Some(name),
                    result: Err(CallError::Timeout(deadline)),
                    latency: began.elapsed(),
                }
            }
            Ok(CallResult::SenderError) | Err(_) => {
                // The worker died mid-call (the pool counts the restart, not the error).
                count_tool_error(&name, "failed");
                CallOutcome {
                    name: Some(name),
                    result: Err(CallError::Failed(
                        "the tool crashed while running this call (its worker was restarted)"
                            .into(),
                    )),
                    latency: began.elapsed(),
                }
            }
        }
    });
    futures::future::join_all(futures).await
}

/// One more `agent_r1_tool_errors_total`: for a call that did not parse, or that its tool's
/// pool could not answer (timed out in the queue, or its worker crashed).
fn count_tool_error(tool: &str, kind: &'static str) {
    metrics::counter!("agent_r1_tool_errors_total", "tool" => tool.to_string(), "kind" => kind)
        .increment(1);
}

async fn finish(
    myself: ActorRef<EpisodeMsg>,
    state: &mut EpisodeState,
    reason: String,
) -> Result<(), ActorProcessingErr> {
    let shared = state.args.shared.clone();
    let task = state.args.task.clone();
    let transcript = state.transcript.clone();
    state.live.set(Stage::Scoring);
    let score = ask_env(&shared, "env score", |r| {
        EnvMsg::Score(task.clone(), transcript.clone(), r)
    })
    .await?;
    let trajectory = Trajectory {
        episode_id: state.args.episode_id,
        group_id: state.args.group_id,
        task: (*state.args.task).clone(),
        prompt_ids: std::mem::take(&mut state.prompt_ids),
        steps: std::mem::take(&mut state.steps),
        reward: score.reward,
        metrics: score.metrics,
        end: EpisodeEnd::Completed { reason },
        attempts: state.args.attempts,
        wall_seconds: state.started.elapsed().as_secs_f64(),
    };
    let _ = shared
        .engine
        .cast(EngineMsg::Release(state.args.episode_id));
    state.live.completed();
    state.args.supervisor.cast(SupervisorMsg::EpisodeFinished(
        myself.get_id(),
        Box::new(trajectory),
    ))?;
    myself.stop(None);
    Ok(())
}
