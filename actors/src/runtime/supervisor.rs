//! The rollout supervisor: keeps `concurrency` episodes in flight, collects finished
//! trajectories, and decides what a failure means.
//!
//! An episode actor that fails (an error or a panic) has its task re-queued once; a second
//! failure is reported as a failed trajectory with the reason. A failed env actor is
//! restarted. A failing engine stops the run with its error. So every task ends completed,
//! failed with a reason, or re-queued, and the counters say which.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use agent_r1_envs::env::Env;
use agent_r1_envs::task::Task;

use super::engine_actor::EngineMsg;
use super::env_actor::EnvActor;
use super::episode::{Episode, EpisodeArgs, Shared};
use crate::trajectory::{EpisodeEnd, Trajectory};

/// Messages of the supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// An episode finished and sends its trajectory.
    EpisodeFinished(ActorId, Box<Trajectory>),
    /// Something the run cannot continue without failed.
    Fatal(String),
    /// Spawn episodes up to the concurrency limit.
    Fill,
    /// An episode stopped cleanly; if its result has not arrived by the time this message
    /// is handled (results are sent before stopping, so they are ahead of it in the
    /// mailbox), it ended without one.
    CheckStopped(ActorId),
}

/// What happened to the tasks of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutSummary {
    /// Episodes that completed.
    pub completed: u64,
    /// Episodes that failed twice and were reported.
    pub failed: u64,
    /// Episodes re-queued after a first failure.
    pub requeued: u64,
    /// Env actors restarted.
    pub env_restarts: u64,
    /// The fatal error that stopped the run early, if any.
    pub fatal: Option<String>,
    /// Tasks never started because the run stopped early.
    pub not_started: u64,
}

struct InFlight {
    task: Arc<Task>,
    group_id: u64,
    attempts: u32,
    episode_id: u64,
    started: Instant,
}

/// Arguments of the supervisor.
pub(crate) struct SupervisorArgs {
    pub(crate) tasks: Vec<(Arc<Task>, u64)>,
    pub(crate) concurrency: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) env: Arc<dyn Env>,
    pub(crate) results: mpsc::Sender<Trajectory>,
    pub(crate) done: oneshot::Sender<RolloutSummary>,
}

/// The supervisor actor.
pub(crate) struct RolloutSupervisor;

/// Its state.
pub(crate) struct SupervisorState {
    queue: VecDeque<(Arc<Task>, u64, u32)>,
    in_flight: HashMap<ActorId, InFlight>,
    concurrency: usize,
    shared: Arc<Shared>,
    env: Arc<dyn Env>,
    env_id: ActorId,
    results: mpsc::Sender<Trajectory>,
    done: Option<oneshot::Sender<RolloutSummary>>,
    summary: RolloutSummary,
    next_episode: u64,
}

impl Actor for RolloutSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let env_id = args
            .shared
            .env
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get_id();
        // The env actor was spawned before us; link it so its failures come here.
        args.shared
            .env
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .link(myself.get_cell());
        myself.cast(SupervisorMsg::Fill)?;
        // Known series start at zero, so rates and `increase` exist before the first event.
        metrics::counter!("agent_r1_env_restarts_total").increment(0);
        for status in ["completed", "requeued", "failed"] {
            metrics::counter!("agent_r1_episodes_total", "status" => status).increment(0);
        }
        Ok(SupervisorState {
            queue: args.tasks.into_iter().map(|(t, g)| (t, g, 1)).collect(),
            in_flight: HashMap::new(),
            concurrency: args.concurrency.max(1),
            shared: args.shared,
            env: args.env,
            env_id,
            results: args.results,
            done: Some(args.done),
            summary: RolloutSummary::default(),
            next_episode: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Fill => {}
            SupervisorMsg::EpisodeFinished(id, trajectory) => {
                if state.in_flight.remove(&id).is_some() {
                    state.summary.completed += 1;
                    metrics::counter!("agent_r1_episodes_total", "status" => "completed")
                        .increment(1);
                    // Awaiting the bounded channel is the backpressure on a slow consumer.
                    if state.results.send(*trajectory).await.is_err() {
                        return stop(
                            myself,
                            state,
                            Some("the trajectory consumer went away".into()),
                        );
                    }
                }
            }
            SupervisorMsg::Fatal(reason) => {
                return stop(myself, state, Some(reason));
            }
            SupervisorMsg::CheckStopped(id) => {
                if state.in_flight.contains_key(&id) {
                    episode_failed(&myself, state, id, "stopped without a result".into()).await?;
                    return Ok(());
                }
            }
        }
        fill(&myself, state).await?;
        finish_if_done(&myself, state);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Supervision events overtake ordinary messages, so a cleanly stopped episode's
        // result may still be in the mailbox: check for it behind the result.
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if state.in_flight.contains_key(&cell.get_id()) {
                    myself.cast(SupervisorMsg::CheckStopped(cell.get_id()))?;
                    return Ok(());
                }
                (cell, "stopped".into())
            }
            _ => return Ok(()),
        };
        let id = cell.get_id();
        if id == state.env_id {
            if state.summary.fatal.is_some() {
                return Ok(());
            }
            state.summary.env_restarts += 1;
            metrics::counter!("agent_r1_env_restarts_total").increment(1);
            tracing::warn!("env actor failed ({reason}); restarting it");
            let (env, _) =
                Actor::spawn_linked(None, EnvActor, state.env.clone(), myself.get_cell()).await?;
            state.env_id = env.get_id();
            *state.shared.env.write().unwrap_or_else(|p| p.into_inner()) = env;
            return Ok(());
        }
        episode_failed(&myself, state, id, reason).await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.summary.not_started += state.queue.len() as u64;
        if let Some(done) = state.done.take() {
            let _ = done.send(state.summary.clone());
        }
        Ok(())
    }
}

async fn fill(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
) -> Result<(), ActorProcessingErr> {
    if state.summary.fatal.is_some() {
        return Ok(());
    }
    while state.in_flight.len() < state.concurrency {
        let Some((task, group_id, attempts)) = state.queue.pop_front() else {
            break;
        };
        let episode_id = state.next_episode;
        state.next_episode += 1;
        let args = EpisodeArgs {
            episode_id,
            group_id,
            attempts,
            task: task.clone(),
            shared: state.shared.clone(),
            supervisor: myself.clone(),
        };
        let (episode, _) = Actor::spawn_linked(None, Episode, args, myself.get_cell()).await?;
        state.in_flight.insert(
            episode.get_id(),
            InFlight {
                task,
                group_id,
                attempts,
                episode_id,
                started: Instant::now(),
            },
        );
    }
    metrics::gauge!("agent_r1_episodes_in_flight").set(state.in_flight.len() as f64);
    metrics::gauge!("agent_r1_episodes_queued").set(state.queue.len() as f64);
    Ok(())
}

fn finish_if_done(myself: &ActorRef<SupervisorMsg>, state: &SupervisorState) {
    if state.queue.is_empty() && state.in_flight.is_empty() {
        myself.stop(None);
    }
}

fn stop(
    myself: ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    fatal: Option<String>,
) -> Result<(), ActorProcessingErr> {
    if state.summary.fatal.is_none() {
        state.summary.fatal = fatal;
    }
    // Episodes still running are stopped; they are counted as not finished.
    state.summary.not_started += state.in_flight.len() as u64;
    myself.stop_children(None);
    myself.stop(None);
    Ok(())
}

async fn episode_failed(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    id: ActorId,
    reason: String,
) -> Result<(), ActorProcessingErr> {
    if let Some(f) = state.in_flight.remove(&id) {
        // A retry gets a new episode id, so the failed attempt's parked KV is dead weight.
        let _ = state.shared.engine.cast(EngineMsg::Release(f.episode_id));
        if f.attempts < 2 && state.summary.fatal.is_none() {
            state.summary.requeued += 1;
            metrics::counter!("agent_r1_episodes_total", "status" => "requeued").increment(1);
            tracing::warn!(
                episode = f.episode_id,
                "episode failed ({reason}); re-queued"
            );
            state.queue.push_front((f.task, f.group_id, f.attempts + 1));
        } else {
            state.summary.failed += 1;
            metrics::counter!("agent_r1_episodes_total", "status" => "failed").increment(1);
            let t = Trajectory {
                episode_id: f.episode_id,
                group_id: f.group_id,
                task: (*f.task).clone(),
                prompt_ids: vec![],
                steps: vec![],
                reward: 0.0,
                metrics: Default::default(),
                end: EpisodeEnd::Failed { reason },
                attempts: f.attempts,
                wall_seconds: f.started.elapsed().as_secs_f64(),
            };
            if state.results.send(t).await.is_err() {
                return stop(
                    myself.clone(),
                    state,
                    Some("the trajectory consumer went away".into()),
                );
            }
        }
    }
    fill(myself, state).await?;
    finish_if_done(myself, state);
    Ok(())
}
