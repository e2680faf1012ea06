//! One actor per running episode.
//!
//! Each turn is one message to itself: ask the engine for a turn on the exact context ids,
//! let the episode's env decide, run tool calls concurrently through the tool pools, append
//! the observation as tokens, and record the step. A finished trajectory is sent straight
//! into the run's trajectory channel (awaiting it is the backpressure on a slow consumer),
//! then the actor stops with [`COMPLETED`]. Every wait has a deadline; an error fails the
//! actor with an [`EpisodeError`], and its supervisor re-queues or reports the task.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;

use agent_r1_envs::env::TurnOutcome;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, ToolCall};

use super::call_ledger::{CallLedger, EpisodeCalls, Settled};
use super::context_policy::{ContextPolicy, History, NextContext, TurnRecord};
use super::env_actor::{EnvActor, EnvMsg, EnvReply, EnvState};
use super::env_source::EnvSource;
use super::episode_error::{EnvStage, EpisodeError};
use super::in_flight::{InFlightBoard, InFlightEpisode, WorkflowStep};
use super::live::{LiveBoard, LiveEntry, Stage};
use super::render::TurnRenderer;
use super::tool_pool::ToolPoolMsg;
use super::workflow::{compact, step_of, Agent, AgentRun, GenerateOptions, Workflow};
use super::EpisodeConfig;
use crate::engine::{TurnOutput, TurnRequest};
use crate::engine_set::EngineSet;
use crate::stall::StallWatch;
use crate::trajectory::{EpisodeEnd, RebuiltContext, Step, Trajectory};

/// The stop reason of an episode that delivered its trajectory.
pub(crate) const COMPLETED: &str = "completed";

/// What every episode of a run shares.
pub(crate) struct Shared {
    pub(crate) env: EnvSource,
    pub(crate) engine: EngineSet,
    pub(crate) tools: HashMap<String, (ActorRef<ToolPoolMsg>, Duration)>,
    pub(crate) renderer: Arc<TurnRenderer>,
    pub(crate) context_policy: Arc<dyn ContextPolicy>,
    pub(crate) config: EpisodeConfig,
    pub(crate) live: LiveBoard,
    pub(crate) sink: mpsc::Sender<Trajectory>,
    pub(crate) stall: Option<StallWatch>,
    pub(crate) calls: CallLedger,
    pub(crate) in_flight: InFlightBoard,
}

#[async_trait::async_trait]
impl AgentRun for Shared {
    fn renderer(&self) -> &TurnRenderer {
        &self.renderer
    }

    fn episode_config(&self) -> &EpisodeConfig {
        &self.config
    }

    async fn sample(
        &self,
        key: u64,
        context: Vec<u32>,
        options: &GenerateOptions,
    ) -> crate::Result<(TurnOutput, f64)> {
        sample_with(self, key, context, options).await
    }

    async fn run_calls(
        &self,
        place: (&EpisodeCalls, usize),
        calls: Vec<Result<ToolCall, CallError>>,
    ) -> Vec<CallOutcome> {
        run_calls(self, place, calls).await
    }

    fn release(&self, key: u64) {
        self.engine.release(key);
    }

    fn in_flight(&self) -> &InFlightBoard {
        &self.in_flight
    }
}

/// Arguments of an episode.
pub(crate) struct EpisodeArgs {
    pub(crate) episode_id: u64,
    pub(crate) group_id: u64,
    pub(crate) attempts: u32,
    pub(crate) task: Arc<Task>,
    pub(crate) shared: Arc<Shared>,
    /// Finished steps to continue from (a resume from a checkpoint).
    pub(crate) resume: Option<Box<InFlightEpisode>>,
}

/// An episode's messages (to itself).
#[derive(Debug)]
pub(crate) enum EpisodeMsg {
    /// Build the env and render the prompt.
    Start,
    /// Generate the next turn.
    Turn,
}

// Local only: never sent to another node.
impl ractor::Message for EpisodeMsg {}

/// The episode actor.
pub(crate) struct Episode;

/// A running episode.
pub(crate) struct EpisodeState {
    args: EpisodeArgs,
    env: Option<ActorRef<EnvMsg>>,
    prompt_ids: Vec<u32>,
    /// The context of the next turn.
    stream: Vec<u32>,
    /// How the next turn's context differs from the chained one, when the policy rebuilt it.
    rebuilt: Option<RebuiltContext>,
    /// Turns that called tools, for the context policy.
    history: Vec<TurnRecord>,
    transcript: Vec<Message>,
    steps: Vec<Step>,
    started: Instant,
    live: LiveEntry,
    /// Its tool calls' keys.
    calls: EpisodeCalls,
}

impl EpisodeState {
    /// Asks the episode's env actor, within `env_timeout`.
    async fn ask_env<T: Send + 'static>(
        &self,
        stage: EnvStage,
        build: impl FnOnce(EnvReply<T>) -> EnvMsg,
    ) -> Result<T, EpisodeError> {
        let env = self
            .env
            .as_ref()
            .ok_or_else(|| EpisodeError::Actor("the episode has no env actor".into()))?;
        let after = self.args.shared.config.env_timeout;
        match env.call(build, Some(after)).await {
            Ok(CallResult::Success(answer)) => answer,
            Ok(CallResult::Timeout) => Err(EpisodeError::EnvTimeout { stage, after }),
            Ok(CallResult::SenderError) | Err(_) => Err(EpisodeError::EnvPanicked {
                stage,
                reason: "the env actor stopped without answering".into(),
            }),
        }
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
            calls: EpisodeCalls::new(args.episode_id),
            args,
            env: None,
            prompt_ids: vec![],
            stream: vec![],
            rebuilt: None,
            history: vec![],
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
            EpisodeMsg::Start => start(&myself, state).await?,
            EpisodeMsg::Turn => match turn(state).await? {
                Some(reason) => finish(&myself, state, reason).await?,
                None => {
                    let env_state = snapshot_env(state).await;
                    state
                        .args
                        .shared
                        .in_flight
                        .put(in_flight_record(state, env_state));
                    myself.cast(EpisodeMsg::Turn)?
                }
            },
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The env actor failing mid-call was already answered to the call; failing here too
        // covers a failure between calls.
        if let SupervisionEvent::ActorFailed(_, err) = event {
            state.env = None;
            return Err(Box::new(EpisodeError::EnvPanicked {
                stage: EnvStage::Build,
                reason: err.to_string(),
            }));
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.args.shared.in_flight.remove(state.args.episode_id);
        if let Some(env) = state.env.take() {
            env.stop(None);
        }
        Ok(())
    }
}

/// The state of an env built for this episode, where it can be captured (a shared env's
/// episode is captured whole by its record). A snapshot that fails is left out, with a
/// warning: the episode runs on, and a resume from this turn would start it over.
async fn snapshot_env(state: &EpisodeState) -> Option<serde_json::Value> {
    if !matches!(state.args.shared.env, EnvSource::PerEpisode { .. }) {
        return None;
    }
    match state.ask_env(EnvStage::Snapshot, EnvMsg::Snapshot).await {
        Ok(saved) => saved,
        Err(e) => {
            tracing::warn!(episode = state.args.episode_id, error = %e, "env snapshot failed; a resume from this turn starts the episode over");
            None
        }
    }
}

/// What a checkpoint keeps of the episode after a finished turn.
fn in_flight_record(state: &EpisodeState, env_state: Option<serde_json::Value>) -> InFlightEpisode {
    InFlightEpisode {
        episode_id: state.args.episode_id,
        group_id: state.args.group_id,
        attempts: state.args.attempts,
        task: (*state.args.task).clone(),
        prompt_ids: state.prompt_ids.clone(),
        steps: state.steps.clone(),
        next_context: state.stream.clone(),
        rebuilt: state.rebuilt.clone(),
        history: state.history.clone(),
        transcript: state.transcript.clone(),
        wall_seconds: state.started.elapsed().as_secs_f64(),
        env_state,
        workflow_steps: vec![],
    }
}

/// Whether the episode's env is where `record` left it: a shared env always is; an env
/// built per episode is once it has restored the record's snapshot.
async fn restore_env(state: &EpisodeState, record: &InFlightEpisode) -> bool {
    match (&state.args.shared.env, &record.env_state) {
        // A workflow's record (the config named a workflow before) has no turn to go on from.
        (EnvSource::Shared(_), _) => record.workflow_steps.is_empty(),
        (EnvSource::PerEpisode { .. }, Some(saved)) => {
            let saved = saved.clone();
            match state
                .ask_env(EnvStage::Restore, |r| EnvMsg::Restore(saved, r))
                .await
            {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(episode = state.args.episode_id, error = %e, "env restore failed; the episode starts over");
                    false
                }
            }
        }
        _ => false,
    }
}

/// Continues from `record`'s last finished step: its next turn's context is prefilled again.
fn continue_from(state: &mut EpisodeState, record: InFlightEpisode) {
    for s in &record.steps {
        state.live.turn_done(s.action_ids.len(), s.tool_calls.len());
    }
    state.prompt_ids = record.prompt_ids;
    state.steps = record.steps;
    state.stream = record.next_context;
    state.rebuilt = record.rebuilt;
    state.history = record.history;
    state.transcript = record.transcript;
    let ran = Duration::from_secs_f64(record.wall_seconds.max(0.0));
    state.started = Instant::now().checked_sub(ran).unwrap_or_else(Instant::now);
}

/// One more episode given back by a checkpoint: `continued` from its last finished step, or
/// `restarted` (its env is built per episode, or it runs a workflow: neither can be
/// captured between turns).
fn count_resumed(outcome: &'static str) {
    metrics::counter!(crate::metric_names::EPISODES_RESUMED_TOTAL.name, "outcome" => outcome)
        .increment(1);
}

/// Runs a user's env builder on a blocking thread (it may open a browser or a sandbox),
/// within `env_timeout`. A builder past its deadline is left to finish on its thread, and
/// stays on record in the stall detector (`building` is held by the build itself) until it
/// returns; its episode fails (and may be retried) without waiting for it.
async fn build_env(
    source: EnvSource,
    building: Option<crate::stall::Operation>,
    after: Duration,
) -> Result<Arc<dyn agent_r1_envs::env::Env>, EpisodeError> {
    let stage = EnvStage::Build;
    let build = tokio::task::spawn_blocking(move || {
        let _building = building;
        source.build()
    });
    match tokio::time::timeout(after, build).await {
        Err(_) => Err(EpisodeError::EnvTimeout { stage, after }),
        Ok(Err(join)) => Err(EpisodeError::EnvPanicked {
            stage,
            reason: if join.is_panic() {
                crate::error::panic_message(join.into_panic().as_ref())
            } else {
                "the env build was cancelled".into()
            },
        }),
        Ok(Ok(built)) => built.map_err(|e| EpisodeError::Env {
            stage,
            reason: e.to_string(),
        }),
    }
}

async fn start(
    myself: &ActorRef<EpisodeMsg>,
    state: &mut EpisodeState,
) -> Result<(), EpisodeError> {
    let shared = state.args.shared.clone();
    let resume = state.args.resume.take();
    let env = match &shared.env {
        EnvSource::Workflow { workflow, .. } => {
            let replay = resume.map(|r| r.workflow_steps);
            return run_workflow(myself, state, workflow.clone(), replay).await;
        }
        EnvSource::Shared(env) => env.clone(),
        source @ EnvSource::PerEpisode { .. } => {
            let building = shared.stall.as_ref().map(|s| {
                s.env().start(format!(
                    "episode {}: {}",
                    state.args.episode_id,
                    EnvStage::Build
                ))
            });
            build_env(source.clone(), building, shared.config.env_timeout).await?
        }
    };
    let env = EnvState {
        env,
        episode_id: state.args.episode_id,
        stall: shared.stall.as_ref().map(StallWatch::env),
    };
    let (env, _) = Actor::spawn_linked(None, EnvActor, env, myself.get_cell())
        .await
        .map_err(|e| EpisodeError::Actor(format!("spawning the env actor: {e}")))?;
    state.env = Some(env);
    if let Some(record) = resume {
        if restore_env(state, &record).await {
            count_resumed("continued");
            continue_from(state, *record);
            return myself
                .cast(EpisodeMsg::Turn)
                .map_err(|e| EpisodeError::Actor(e.to_string()));
        }
        count_resumed("restarted");
    }
    let task = state.args.task.clone();
    let messages = state
        .ask_env(EnvStage::Reset, |r| EnvMsg::Reset(task, r))
        .await?;
    state.prompt_ids = shared
        .renderer
        .prompt(&messages)
        .map_err(EpisodeError::Render)?;
    let tokens = state.prompt_ids.len();
    let limits = [
        (shared.config.max_prompt, "rollout.max_prompt_length"),
        (
            Some(shared.config.max_context.saturating_sub(2)),
            "rollout.max_context_length less room for a turn",
        ),
    ];
    if let Some((limit, which)) = limits
        .into_iter()
        .find_map(|(limit, which)| limit.filter(|&l| tokens > l).map(|l| (l, which)))
    {
        metrics::counter!(crate::metric_names::PROMPTS_TOO_LONG_TOTAL.name).increment(1);
        return Err(EpisodeError::PromptTooLong {
            tokens,
            limit,
            which,
        });
    }
    state.stream = state.prompt_ids.clone();
    state.transcript = messages;
    myself
        .cast(EpisodeMsg::Turn)
        .map_err(|e| EpisodeError::Actor(e.to_string()))
}

/// Asks the engine for a turn on `context` within the turn's deadline.
async fn generate(
    state: &mut EpisodeState,
    context: Vec<u32>,
) -> Result<(TurnOutput, f64), EpisodeError> {
    state.live.set(Stage::Generating);
    Ok(sample(&state.args.shared, state.args.episode_id, context).await?)
}

/// Samples one turn on `context` under engine key `key` (an episode's id), with the
/// episode's sampling and its new tokens bounded by the room left in `max_context`; one
/// deadline for the whole turn (rollout.generate_timeout_secs): admission, queueing and
/// decoding. Returns the output and the seconds it took. The episode loop and a workflow's
/// `generate` both go through it.
pub(crate) async fn sample(
    shared: &Shared,
    key: u64,
    context: Vec<u32>,
) -> crate::Result<(TurnOutput, f64)> {
    sample_with(shared, key, context, &GenerateOptions::default()).await
}

/// [`sample`] with a call's own limits on top of the run's sampling settings.
pub(crate) async fn sample_with(
    shared: &Shared,
    key: u64,
    context: Vec<u32>,
    options: &GenerateOptions,
) -> crate::Result<(TurnOutput, f64)> {
    let config = &shared.config;
    let mut params = config.sampling.clone();
    params.max_new_tokens = params
        .max_new_tokens
        .min(options.max_new_tokens.unwrap_or(usize::MAX))
        .min(config.max_context.saturating_sub(context.len() + 1))
        .max(1);
    let mut stop_strings = config.stop_strings.clone();
    stop_strings.extend(options.stop.iter().cloned());
    let request = TurnRequest {
        episode: key,
        context,
        params,
        stop_strings,
    };
    let began = Instant::now();
    let out = shared
        .engine
        .generate_within(request, config.generate_timeout)
        .await?;
    Ok((out, began.elapsed().as_secs_f64()))
}

/// Runs one turn; returns the end reason when the episode is over.
async fn turn(state: &mut EpisodeState) -> Result<Option<String>, EpisodeError> {
    let shared = state.args.shared.clone();
    let config = &shared.config;
    let task = state.args.task.clone();
    let context_len = state.stream.len();
    let context = state.stream.clone();
    if let Some(r) = &state.rebuilt {
        count_rebuild(r);
    }
    let (out, generate_seconds) = generate(state, context).await?;
    let text = shared
        .renderer
        .tokenizer()
        .decode(&out.token_ids, true)
        .map_err(EpisodeError::Render)?;
    state.transcript.push(Message::assistant(text.clone()));
    let mut step = step_of(out, context_len, generate_seconds);
    step.rebuilt = state.rebuilt.take();
    state.stream.extend(&step.action_ids);
    let calls = shared.renderer.parse_tool_calls(&text);
    state.live.set(Stage::Deciding);
    let t2 = task.clone();
    let decision = state
        .ask_env(EnvStage::OnTurn, |r| EnvMsg::OnTurn(t2, text, calls, r))
        .await?;
    let calls = match decision {
        TurnOutcome::Done => {
            state.live.turn_done(step.action_ids.len(), 0);
            state.steps.push(step);
            return Ok(Some("done".into()));
        }
        TurnOutcome::Calls(calls) => within_limit(calls, config.max_tool_calls_per_turn),
    };
    if state.history.len() + 1 >= config.max_turns {
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
    let outcomes = run_calls(&shared, (&state.calls, state.steps.len()), calls).await;
    step.tool_seconds = tools_began.elapsed().as_secs_f64();
    state.live.set(Stage::Observing);
    let sent = outcomes.clone();
    let (observations, reward) = state
        .ask_env(EnvStage::Observe, |r| EnvMsg::Observe(task, sent, r))
        .await?;
    step.tool_calls = outcomes;
    step.reward = reward;
    state
        .live
        .turn_done(step.action_ids.len(), step.tool_calls.len());
    let continuation = shared
        .renderer
        .continuation(&step.action_ids, &observations)
        .map_err(EpisodeError::Render)?;
    let mut chained = std::mem::take(&mut state.stream);
    chained.extend(&continuation);
    state.history.push(TurnRecord {
        action_ids: step.action_ids.clone(),
        observation_ids: continuation.clone(),
        observations: observations.clone(),
    });
    let history = History {
        prompt_ids: &state.prompt_ids,
        turns: &state.history,
        chained: &chained,
    };
    let decision = shared
        .context_policy
        .next_context(&history, &shared.renderer)
        .map_err(EpisodeError::Render)?;
    let by = shared.context_policy.name();
    let next = match decision {
        NextContext::Chained => {
            if chained.len() + 1 >= config.max_context {
                state.steps.push(step);
                return Ok(Some("max_context".into()));
            }
            chained
        }
        NextContext::Rebuilt(ids) => {
            if ids.len() + 1 >= config.max_context {
                state.steps.push(step);
                return Ok(Some("max_context".into()));
            }
            state.rebuilt = Some(RebuiltContext::between(&chained, &ids, by));
            ids
        }
        NextContext::Summarize(request) => {
            if request.len() + 1 >= config.max_context {
                state.steps.push(step);
                return Ok(Some("max_context".into()));
            }
            step.observation_ids = continuation;
            state.transcript.extend(observations);
            state.steps.push(step);
            return summarize(state, chained, request).await;
        }
    };
    step.observation_ids = continuation;
    state.transcript.extend(observations);
    state.steps.push(step);
    state.stream = next;
    Ok(None)
}

/// Runs a summary turn on `request` (rebuilt from `chained`), records it as a step, and
/// sets the next context to what the policy builds from the summary.
async fn summarize(
    state: &mut EpisodeState,
    chained: Vec<u32>,
    request: Vec<u32>,
) -> Result<Option<String>, EpisodeError> {
    let shared = state.args.shared.clone();
    let by = shared.context_policy.name();
    let rebuilt = RebuiltContext::between(&chained, &request, by);
    count_rebuild(&rebuilt);
    let (out, generate_seconds) = generate(state, request.clone()).await?;
    let mut step = step_of(out, request.len(), generate_seconds);
    step.rebuilt = Some(rebuilt);
    state.live.turn_done(step.action_ids.len(), 0);
    let history = History {
        prompt_ids: &state.prompt_ids,
        turns: &state.history,
        chained: &chained,
    };
    let next = shared
        .context_policy
        .after_summary(&history, &step.action_ids, &shared.renderer)
        .map_err(EpisodeError::Render)?;
    let mut after = request;
    after.extend(&step.action_ids);
    state.steps.push(step);
    if next.len() + 1 >= shared.config.max_context {
        return Ok(Some("max_context".into()));
    }
    state.rebuilt = Some(RebuiltContext::between(&after, &next, by));
    state.stream = next;
    Ok(None)
}

/// One more rebuilt context in the metrics.
fn count_rebuild(r: &RebuiltContext) {
    metrics::counter!(crate::metric_names::CONTEXT_REBUILDS_TOTAL.name, "policy" => r.by.clone())
        .increment(1);
    metrics::counter!(crate::metric_names::CONTEXT_DROPPED_TOKENS_TOTAL.name, "policy" => r.by.clone())
        .increment(r.dropped as u64);
}

/// The turn's calls, those past `limit` replaced by [`CallError::TooManyCalls`] (answered in
/// order like the others, so the model sees which of its calls did not run).
fn within_limit(
    calls: Vec<Result<ToolCall, CallError>>,
    limit: usize,
) -> Vec<Result<ToolCall, CallError>> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| match call {
            Ok(_) if i >= limit => Err(CallError::TooManyCalls(limit)),
            other => other,
        })
        .collect()
}

/// Runs a step's calls (`place`: the episode's keys and the step they follow) concurrently;
/// outcomes in the calls' order. A call the run's journal holds is answered from it; a
/// call made is recorded in it.
pub(crate) async fn run_calls(
    shared: &Shared,
    (episode, step): (&EpisodeCalls, usize),
    calls: Vec<Result<ToolCall, CallError>>,
) -> Vec<CallOutcome> {
    // Keys first, in order: a key the journal holds for another call moves the later ones to
    // the next branch.
    let calls: Vec<_> = calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| {
            let settled = call
                .as_ref()
                .ok()
                .filter(|c| shared.tools.contains_key(&c.name))
                .map(|c| episode.settle(&shared.calls, step, index, c));
            (call, settled)
        })
        .collect();
    let futures = calls.into_iter().map(|(call, settled)| async move {
        let key = match settled {
            Some(Settled::Replayed(outcome)) => {
                let tool = outcome.name.clone().unwrap_or_default();
                metrics::counter!(crate::metric_names::TOOL_CALLS_REPLAYED_TOTAL.name, "tool" => tool)
                    .increment(1);
                return outcome;
            }
            Some(Settled::Make(key)) => Some(key),
            None => None,
        };
        let call = match call {
            Ok(call) => call,
            Err(e) => {
                // The model's call did not parse (bad JSON, no name, arguments not JSON), or
                // came past the turn's limit of calls.
                let tool = match e {
                    CallError::TooManyCalls(_) => "over_limit",
                    _ => "unparsed",
                };
                count_tool_error(tool, e.kind());
                return CallOutcome {
                    name: None,
                    result: Err(e),
                    latency: Duration::ZERO,
                }
            }
        };
        let Some((pool, timeout)) = shared.tools.get(&call.name) else {
            metrics::counter!(crate::metric_names::TOOL_ERRORS_TOTAL.name, "tool" => "unknown", "kind" => "unknown_tool")
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
        // A copy for the journal, only where the run keeps one.
        let to_record = key
            .clone()
            .filter(|_| shared.calls.journals())
            .map(|k| (k, call.clone()));
        let outcome = match pool
            .call(|r| ToolPoolMsg::Call(call, key, r), Some(deadline))
            .await
        {
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
        };
        if let Some((key, call)) = to_record {
            shared.calls.record(&key, &call, &outcome).await;
        }
        outcome
    });
    futures::future::join_all(futures).await
}

/// One more `agent_r1_tool_errors_total`: for a call that did not parse, or that its tool's
/// pool could not answer (timed out in the queue, or its worker crashed).
fn count_tool_error(tool: &str, kind: &'static str) {
    metrics::counter!(crate::metric_names::TOOL_ERRORS_TOTAL.name, "tool" => tool.to_string(), "kind" => kind)
        .increment(1);
}

async fn finish(
    myself: &ActorRef<EpisodeMsg>,
    state: &mut EpisodeState,
    reason: String,
) -> Result<(), EpisodeError> {
    let shared = state.args.shared.clone();
    let task = state.args.task.clone();
    let transcript = state.transcript.clone();
    state.live.set(Stage::Scoring);
    let score = state
        .ask_env(EnvStage::Score, |r| EnvMsg::Score(task, transcript, r))
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
    shared.engine.release(state.args.episode_id);
    state.live.completed();
    shared
        .sink
        .send(trajectory)
        .await
        .map_err(|_| EpisodeError::ConsumerGone)?;
    myself.stop(Some(COMPLETED.into()));
    Ok(())
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the episode's workflow within `workflow_timeout` on a task of its own (a panic or a
/// hang fails the episode with the reason, and the run goes on), then delivers its steps. On
/// a resume, `replay` holds the steps it had generated.
async fn run_workflow(
    myself: &ActorRef<EpisodeMsg>,
    state: &mut EpisodeState,
    workflow: Arc<dyn Workflow>,
    replay: Option<Vec<Option<WorkflowStep>>>,
) -> Result<(), EpisodeError> {
    let shared = state.args.shared.clone();
    // On a resume: the steps the episode had generated, replayed where asked for again.
    let replay = replay.map_or_else(Vec::new, |steps| {
        count_resumed(if steps.iter().any(Option::is_some) {
            "continued"
        } else {
            "restarted"
        });
        steps
    });
    let agent = Arc::new(Agent::new(
        shared.clone(),
        in_flight_record(state, None),
        replay,
    ));
    let task = state.args.task.clone();
    state.live.set(Stage::Generating);
    let running = {
        let (agent, workflow) = (agent.clone(), workflow.clone());
        tokio::spawn(async move { workflow.run(&task, &agent).await })
    };
    // The workflow ends with its episode: past the timeout, and when the episode actor is
    // stopped while waiting here (a service aborted), which drops this future.
    let abort = AbortOnDrop(running.abort_handle());
    let after = shared.config.workflow_timeout;
    let result = tokio::time::timeout(after, running).await;
    drop(abort);
    agent.release();
    let outcome = match result {
        Err(_) => {
            return Err(EpisodeError::Workflow(format!(
            "stuck stage: `{}` gave no outcome within {after:?} (rollout.workflow_timeout_secs)",
            workflow.name()
        )))
        }
        Ok(Err(join)) => {
            return Err(EpisodeError::Workflow(if join.is_panic() {
                format!(
                    "`{}` panicked: {}",
                    workflow.name(),
                    crate::error::panic_message(join.into_panic().as_ref())
                )
            } else {
                format!("`{}` was cancelled", workflow.name())
            }))
        }
        Ok(Ok(Err(crate::Error::EngineStopped(reason)))) => {
            return Err(EpisodeError::EngineStopped(reason))
        }
        Ok(Ok(Err(e))) => {
            return Err(EpisodeError::Workflow(format!(
                "`{}`: {e}",
                workflow.name()
            )))
        }
        Ok(Ok(Ok(outcome))) => outcome,
    };
    let bad = |what: String| EpisodeError::Workflow(format!("`{}` {what}", workflow.name()));
    if !outcome.reward.is_finite() {
        return Err(bad(format!("returned the reward {}", outcome.reward)));
    }
    let mut recorded = agent.take_steps();
    for (k, reward) in outcome.step_rewards {
        if !reward.is_finite() {
            return Err(bad(format!("returned the reward {reward} for step {k}")));
        }
        match recorded.iter_mut().find(|(index, _)| *index == k) {
            Some((_, r)) => r.step.reward += reward,
            None => {
                return Err(bad(format!(
                    "rewarded step {k}, which it did not make (its steps: {:?})",
                    recorded.iter().map(|(index, _)| *index).collect::<Vec<_>>()
                )))
            }
        }
    }
    let (prompt_ids, steps) = compact(
        recorded.into_iter().map(|(_, r)| r).collect(),
        workflow.name(),
    )
    .map_err(bad)?;
    for s in &steps {
        state.live.turn_done(s.action_ids.len(), s.tool_calls.len());
        if let Some(r) = &s.rebuilt {
            count_rebuild(r);
        }
    }
    let trajectory = Trajectory {
        episode_id: state.args.episode_id,
        group_id: state.args.group_id,
        task: (*state.args.task).clone(),
        prompt_ids,
        steps,
        reward: outcome.reward,
        metrics: outcome.metrics,
        end: EpisodeEnd::Completed {
            reason: "done".into(),
        },
        attempts: state.args.attempts,
        wall_seconds: state.started.elapsed().as_secs_f64(),
    };
    state.live.completed();
    shared
        .sink
        .send(trajectory)
        .await
        .map_err(|_| EpisodeError::ConsumerGone)?;
    myself.stop(Some(COMPLETED.into()));
    Ok(())
}
