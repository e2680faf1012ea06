//! One env actor per episode: resets, turn decisions, observations and scores for that
//! episode's env, each run on tokio's blocking pool (env methods are synchronous and may be
//! slow, e.g. a scorer), so no env call occupies a runtime thread and no episode's env
//! calls wait behind another's.
//!
//! A panic inside the env is answered to the request that caused it, then fails the actor:
//! its episode fails with [`EpisodeError::EnvPanicked`], and the retry builds a fresh env.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, ToolCall};

use super::episode_error::{EnvStage, EpisodeError};
use crate::error::panic_message;
use crate::stall::Operations;

/// An env answer, or why the env could not give one.
pub(crate) type EnvReply<T> = RpcReplyPort<Result<T, EpisodeError>>;

/// Messages of the env actor.
#[derive(Debug)]
pub(crate) enum EnvMsg {
    /// First messages of the episode.
    Reset(Arc<Task>, EnvReply<Vec<Message>>),
    /// What an assistant turn asks for.
    OnTurn(
        Arc<Task>,
        String,
        Vec<Result<ToolCall, CallError>>,
        EnvReply<TurnOutcome>,
    ),
    /// Observation messages and the step reward for a turn's call outcomes.
    Observe(Arc<Task>, Vec<CallOutcome>, EnvReply<(Vec<Message>, f64)>),
    /// Score of the finished transcript.
    Score(Arc<Task>, Vec<Message>, EnvReply<Score>),
    /// The env's state between turns, where it can be captured.
    Snapshot(EnvReply<Option<serde_json::Value>>),
    /// Back to a captured state.
    Restore(serde_json::Value, EnvReply<()>),
}

// Local only: never sent to another node.
impl ractor::Message for EnvMsg {}

/// The env actor.
pub(crate) struct EnvActor;

/// The env actor's state: its episode's env, and where its calls are recorded for the stall
/// detector.
pub(crate) struct EnvState {
    pub(crate) env: Arc<dyn Env>,
    pub(crate) episode_id: u64,
    pub(crate) stall: Option<Operations>,
}

/// Runs `f` on the blocking pool and answers `reply`; a panic is answered, then fails the
/// actor.
async fn run<T: Send + 'static>(
    state: &EnvState,
    stage: EnvStage,
    reply: EnvReply<T>,
    f: impl FnOnce(&dyn Env) -> Result<T, String> + Send + 'static,
) -> Result<(), ActorProcessingErr> {
    let env = state.env.clone();
    // Held by the blocking call itself: an env call that never returns stays on record
    // after the episode stopped waiting for it.
    let running = state
        .stall
        .as_ref()
        .map(|ops| ops.start(format!("episode {}: {stage}", state.episode_id)));
    match tokio::task::spawn_blocking(move || {
        let _running = running;
        f(env.as_ref())
    })
    .await
    {
        Ok(result) => {
            let _ = reply.send(result.map_err(|reason| EpisodeError::Env { stage, reason }));
            Ok(())
        }
        Err(join) => {
            let reason = if join.is_panic() {
                panic_message(join.into_panic().as_ref())
            } else {
                "the env call was cancelled".into()
            };
            let _ = reply.send(Err(EpisodeError::EnvPanicked {
                stage,
                reason: reason.clone(),
            }));
            Err(Box::new(EpisodeError::EnvPanicked { stage, reason }))
        }
    }
}

impl Actor for EnvActor {
    type Msg = EnvMsg;
    type State = EnvState;
    type Arguments = EnvState;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: EnvState,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        env: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            EnvMsg::Reset(task, reply) => {
                run(env, EnvStage::Reset, reply, move |env| {
                    env.reset(&task).map_err(|e| e.to_string())
                })
                .await
            }
            EnvMsg::OnTurn(task, text, calls, reply) => {
                run(env, EnvStage::OnTurn, reply, move |env| {
                    Ok(env.on_turn(&task, &text, calls))
                })
                .await
            }
            EnvMsg::Observe(task, outcomes, reply) => {
                run(env, EnvStage::Observe, reply, move |env| {
                    let messages = env.observe(&task, &outcomes);
                    Ok((messages, env.step_reward(&task, &outcomes)))
                })
                .await
            }
            EnvMsg::Score(task, transcript, reply) => {
                run(env, EnvStage::Score, reply, move |env| {
                    env.try_score(&task, &transcript).map_err(|e| e.to_string())
                })
                .await
            }
            EnvMsg::Snapshot(reply) => {
                run(env, EnvStage::Snapshot, reply, |env| {
                    env.snapshot().map_err(|e| e.to_string())
                })
                .await
            }
            EnvMsg::Restore(state, reply) => {
                run(env, EnvStage::Restore, reply, move |env| {
                    env.restore(state).map_err(|e| e.to_string())
                })
                .await
            }
        }
    }
}
