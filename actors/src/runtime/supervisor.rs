//! The rollout supervisor: keeps up to `concurrency` episodes in flight, taking tasks from the
//! service's task stream as episodes end, and decides what a failure means.
//!
//! Tasks arrive from a feeder task that holds one credit per episode slot: it reads the next
//! task only when a slot is free, so the stream's producer is paced by the episodes, and a
//! re-queued task keeps its credit. An episode that fails (an error or a panic) has its task
//! re-queued once; a second failure is reported as a failed trajectory with the reason. A
//! fatal failure (the engine stopped, nobody takes trajectories) stops the run. So every task
//! taken ends completed, failed with a reason, or re-queued, and the counters say which.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use agent_r1_envs::task::Task;

use super::episode::{Episode, EpisodeArgs, Shared, COMPLETED};
use super::episode_error::EpisodeError;
use super::in_flight::InFlightEpisode;
use crate::trajectory::{EpisodeEnd, Trajectory};

/// A task as submitted to the service.
#[derive(Debug, Clone)]
pub struct EpisodeRequest {
    /// The task.
    pub task: Task,
    /// Episodes of one task in a batch share a group id (group estimators).
    pub group_id: u64,
    /// The episode's id, unique among the service's episodes: the engine keys parked KV by
    /// it and draws the episode's tokens from (seed, id, position, version), so a caller that
    /// numbers episodes by what they are (task position, member of the group) samples the
    /// same tokens however episodes interleave. A retry runs as `id | RETRY_BIT`.
    pub episode_id: u64,
    /// The episode's finished steps, from a checkpoint: it continues from the last one
    /// (where its env allows; else it starts over, counted).
    pub resume: Option<Box<InFlightEpisode>>,
}

/// Set in the episode id of a task's second attempt.
pub const RETRY_BIT: u64 = 1 << 63;

/// Messages of the supervisor.
#[derive(Debug)]
pub(crate) enum SupervisorMsg {
    /// The feeder took a task from the stream (with the credit of the slot it will run in).
    Task(Box<EpisodeRequest>, OwnedSemaphorePermit),
    /// The task stream ended: finish what was taken, then stop.
    InputClosed,
    /// Take no more tasks; finish the episodes in flight (and re-queued ones), then stop.
    Drain,
    /// Stop now: episodes in flight are stopped and counted as not finished.
    Abort(String),
    /// An episode stopped cleanly without saying it completed; if it was still counted in
    /// flight when this is handled, it ended without a result.
    CheckStopped(ActorId),
}

// Local only: never sent to another node.
impl ractor::Message for SupervisorMsg {}

/// What happened to the tasks of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutSummary {
    /// Episodes that completed.
    pub completed: u64,
    /// Episodes that failed twice and were reported.
    pub failed: u64,
    /// Episodes re-queued after a first failure.
    pub requeued: u64,
    /// Env actors that failed and were replaced by a fresh env on the retry.
    pub env_restarts: u64,
    /// The fatal error that stopped the run early, if any.
    pub fatal: Option<String>,
    /// Tasks taken from the stream but not finished because the run stopped early.
    pub not_started: u64,
    /// Tasks taken from the stream.
    pub taken: u64,
    /// Episode actors started (first attempts and retries).
    pub episodes_spawned: u64,
}

struct Queued {
    task: Arc<Task>,
    group_id: u64,
    episode_id: u64,
    attempts: u32,
    /// Where the first attempt continues from (a retry starts over).
    resume: Option<Box<InFlightEpisode>>,
    /// Held until the task ends: the slot the feeder may fill next.
    _credit: OwnedSemaphorePermit,
}

struct InFlight {
    queued: Queued,
    episode_id: u64,
    started: Instant,
}

/// Arguments of the supervisor.
pub(crate) struct SupervisorArgs {
    pub(crate) tasks: mpsc::Receiver<EpisodeRequest>,
    pub(crate) concurrency: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) done: tokio::sync::oneshot::Sender<RolloutSummary>,
}

/// The supervisor actor.
pub(crate) struct RolloutSupervisor;

/// Its state.
pub(crate) struct SupervisorState {
    queue: VecDeque<Queued>,
    in_flight: HashMap<ActorId, InFlight>,
    shared: Arc<Shared>,
    feeder: Option<tokio::task::JoinHandle<()>>,
    input_open: bool,
    done: Option<tokio::sync::oneshot::Sender<RolloutSummary>>,
    summary: RolloutSummary,
}

/// Reads tasks while credits last and hands each to the supervisor.
async fn feed(
    mut tasks: mpsc::Receiver<EpisodeRequest>,
    credits: Arc<Semaphore>,
    supervisor: ActorRef<SupervisorMsg>,
) {
    loop {
        let Ok(credit) = credits.clone().acquire_owned().await else {
            return;
        };
        match tasks.recv().await {
            Some(task) => {
                if supervisor
                    .cast(SupervisorMsg::Task(Box::new(task), credit))
                    .is_err()
                {
                    return;
                }
            }
            None => {
                let _ = supervisor.cast(SupervisorMsg::InputClosed);
                return;
            }
        }
    }
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
        // Known series start at zero, so rates and `increase` exist before the first event.
        metrics::counter!(crate::metric_names::ENV_RESTARTS_TOTAL.name).increment(0);
        for outcome in ["continued", "restarted"] {
            metrics::counter!(crate::metric_names::EPISODES_RESUMED_TOTAL.name, "outcome" => outcome)
                .increment(0);
        }
        for status in ["completed", "requeued", "failed"] {
            metrics::counter!(crate::metric_names::EPISODES_TOTAL.name, "status" => status)
                .increment(0);
        }
        let credits = Arc::new(Semaphore::new(args.concurrency.max(1)));
        let feeder = tokio::spawn(feed(args.tasks, credits, myself.clone()));
        Ok(SupervisorState {
            queue: VecDeque::new(),
            in_flight: HashMap::new(),
            shared: args.shared,
            feeder: Some(feeder),
            input_open: true,
            done: Some(args.done),
            summary: RolloutSummary::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Task(task, credit) => {
                let EpisodeRequest {
                    task,
                    group_id,
                    episode_id,
                    resume,
                } = *task;
                state.summary.taken += 1;
                if state.input_open {
                    state.queue.push_back(Queued {
                        task: Arc::new(task),
                        group_id,
                        episode_id,
                        attempts: 1,
                        resume,
                        _credit: credit,
                    });
                } else {
                    // Taken by the feeder just before a drain: never started.
                    state.summary.not_started += 1;
                }
            }
            SupervisorMsg::InputClosed => state.input_open = false,
            SupervisorMsg::Drain => {
                state.input_open = false;
                if let Some(feeder) = state.feeder.take() {
                    feeder.abort();
                }
            }
            SupervisorMsg::Abort(reason) => {
                tracing::info!(
                    in_flight = state.in_flight.len(),
                    "rollout service stopped: {reason}"
                );
                stop(&myself, state, None);
                return Ok(());
            }
            SupervisorMsg::CheckStopped(id) => {
                if state.in_flight.contains_key(&id) {
                    let reason = "the episode stopped without a result".to_string();
                    episode_failed(&myself, state, id, reason, None, true).await?;
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
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let id = cell.get_id();
                if reason.as_deref() == Some(COMPLETED) {
                    if state.in_flight.remove(&id).is_some() {
                        state.summary.completed += 1;
                        metrics::counter!(crate::metric_names::EPISODES_TOTAL.name, "status" => "completed")
                            .increment(1);
                    }
                } else if state.in_flight.contains_key(&id) {
                    myself.cast(SupervisorMsg::CheckStopped(id))?;
                    return Ok(());
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                let typed = err.downcast_ref::<EpisodeError>();
                if let Some(e) = typed.filter(|e| e.is_fatal()) {
                    stop(&myself, state, Some(e.to_string()));
                    return Ok(());
                }
                let restarted_env = typed.is_some_and(EpisodeError::restarted_env);
                let retry = typed.is_none_or(EpisodeError::worth_retrying);
                let reason = err.to_string();
                let id = cell.get_id();
                episode_failed(&myself, state, id, reason, Some(restarted_env), retry).await?;
                return Ok(());
            }
            _ => return Ok(()),
        }
        fill(&myself, state).await?;
        finish_if_done(&myself, state);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(feeder) = state.feeder.take() {
            feeder.abort();
        }
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
    // Every queued task holds a credit, so the queue never outgrows the free slots.
    while let Some(mut queued) = state.queue.pop_front() {
        let episode_id = match queued.attempts {
            1 => queued.episode_id,
            _ => queued.episode_id | RETRY_BIT,
        };
        let args = EpisodeArgs {
            episode_id,
            group_id: queued.group_id,
            attempts: queued.attempts,
            task: queued.task.clone(),
            shared: state.shared.clone(),
            resume: queued.resume.take(),
        };
        let (episode, _) = Actor::spawn_linked(None, Episode, args, myself.get_cell()).await?;
        state.summary.episodes_spawned += 1;
        state.in_flight.insert(
            episode.get_id(),
            InFlight {
                queued,
                episode_id,
                started: Instant::now(),
            },
        );
    }
    metrics::gauge!(crate::metric_names::EPISODES_IN_FLIGHT.name).set(state.in_flight.len() as f64);
    metrics::gauge!(crate::metric_names::EPISODES_QUEUED.name).set(state.queue.len() as f64);
    Ok(())
}

fn finish_if_done(myself: &ActorRef<SupervisorMsg>, state: &SupervisorState) {
    if !state.input_open && state.queue.is_empty() && state.in_flight.is_empty() {
        myself.stop(None);
    }
}

/// Stops the tree; `fatal` is the error that forced it (none for an abort asked for).
fn stop(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, fatal: Option<String>) {
    if let (None, Some(fatal)) = (&state.summary.fatal, fatal) {
        tracing::error!("rollout stopped: {fatal}");
        state.summary.fatal = Some(fatal);
    }
    // Episodes still running are stopped; they are counted as not finished.
    state.summary.not_started += state.in_flight.len() as u64;
    state.in_flight.clear();
    myself.stop_children(None);
    myself.stop(None);
}

async fn episode_failed(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    id: ActorId,
    reason: String,
    restarted_env: Option<bool>,
    retry: bool,
) -> Result<(), ActorProcessingErr> {
    if let Some(f) = state.in_flight.remove(&id) {
        if restarted_env == Some(true) {
            state.summary.env_restarts += 1;
            metrics::counter!(crate::metric_names::ENV_RESTARTS_TOTAL.name).increment(1);
        }
        // A retry gets a new episode id, so the failed attempt's parked KV is dead weight.
        state.shared.engine.release(f.episode_id);
        let mut queued = f.queued;
        if retry && queued.attempts < 2 && state.summary.fatal.is_none() {
            state.summary.requeued += 1;
            metrics::counter!(crate::metric_names::EPISODES_TOTAL.name, "status" => "requeued")
                .increment(1);
            tracing::warn!(
                episode = f.episode_id,
                "episode failed ({reason}); re-queued"
            );
            queued.attempts += 1;
            state.queue.push_front(queued);
        } else {
            state.summary.failed += 1;
            metrics::counter!(crate::metric_names::EPISODES_TOTAL.name, "status" => "failed")
                .increment(1);
            let t = Trajectory {
                episode_id: f.episode_id,
                group_id: queued.group_id,
                task: (*queued.task).clone(),
                prompt_ids: vec![],
                steps: vec![],
                reward: 0.0,
                metrics: Default::default(),
                end: EpisodeEnd::Failed { reason },
                attempts: queued.attempts,
                wall_seconds: f.started.elapsed().as_secs_f64(),
            };
            // The credit is released once the failure is delivered.
            if state.shared.sink.send(t).await.is_err() {
                stop(myself, state, Some(EpisodeError::ConsumerGone.to_string()));
                return Ok(());
            }
        }
    }
    fill(myself, state).await?;
    finish_if_done(myself, state);
    Ok(())
}
