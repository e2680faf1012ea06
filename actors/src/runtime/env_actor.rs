//! The env as an actor: resets, turn decisions, observations and scores for every episode
//! of a run. Env methods are cheap and synchronous; the actor gives the env one place to
//! fail and be restarted by the rollout supervisor.
//!
//! A panic inside the env is answered to the request that caused it (so that episode fails
//! with the reason), then fails the actor so the supervisor restarts it. Requests queued
//! behind it are dropped with the mailbox; their episodes wait for the replacement and ask
//! again.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, ToolCall};

/// An env answer, or why the env could not give one.
pub type EnvReply<T> = RpcReplyPort<Result<T, String>>;

/// Messages of the env actor.
#[derive(Debug)]
pub enum EnvMsg {
    /// First messages of an episode.
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
    /// Score of a finished transcript.
    Score(Arc<Task>, Vec<Message>, EnvReply<Score>),
}

/// The env actor.
pub struct EnvActor;

fn run<T>(
    reply: EnvReply<T>,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(), ActorProcessingErr> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => {
            let _ = reply.send(result);
            Ok(())
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            let _ = reply.send(Err(format!("env panicked: {what}")));
            Err(format!("env panicked: {what}").into())
        }
    }
}

impl Actor for EnvActor {
    type Msg = EnvMsg;
    type State = Arc<dyn Env>;
    type Arguments = Arc<dyn Env>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        env: Arc<dyn Env>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(env)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        env: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            EnvMsg::Reset(task, reply) => {
                run(reply, || env.reset(&task).map_err(|e| e.to_string()))
            }
            EnvMsg::OnTurn(task, text, calls, reply) => {
                run(reply, || Ok(env.on_turn(&task, &text, calls)))
            }
            EnvMsg::Observe(task, outcomes, reply) => run(reply, || {
                let messages = env.observe(&task, &outcomes);
                Ok((messages, env.step_reward(&task, &outcomes)))
            }),
            EnvMsg::Score(task, transcript, reply) => {
                run(reply, || Ok(env.score(&task, &transcript)))
            }
        }
    }
}
