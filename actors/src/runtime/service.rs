//! The rollout service: one supervision tree per run, started once, fed by a stream of tasks
//! and streaming finished trajectories out as they end.
//!
//! Stopping is a message: [`RolloutService::finish`] closes the stream and waits for what
//! was taken, [`RolloutService::drain`] stops taking tasks, [`RolloutService::abort`] stops at
//! once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::episode::Shared;
use super::supervisor::{EpisodeRequest, RolloutSupervisor, SupervisorArgs, SupervisorMsg};
use super::tool_pool::{ToolPool, ToolPoolArgs, ToolPoolMsg};
use super::{RolloutReport, RolloutSetup};
use crate::trajectory::Trajectory;
use crate::{Error, Result};

/// Submits tasks to a running service (cheap to clone). Each submission waits while the
/// service has no room: the stream is paced by the episodes.
#[derive(Clone, Debug)]
pub struct TaskSender(mpsc::Sender<EpisodeRequest>);

impl TaskSender {
    /// Submits one episode.
    pub async fn submit(&self, request: EpisodeRequest) -> Result<()> {
        self.0
            .send(request)
            .await
            .map_err(|_| Error::Other("the rollout service has stopped taking tasks".into()))
    }

    /// Room for one episode now, or `None` while the service has none; the permit submits
    /// it (for a caller that must not wait, such as an actor handing tasks back).
    pub fn try_reserve(&self) -> Result<Option<mpsc::Permit<'_, EpisodeRequest>>> {
        match self.0.try_reserve() {
            Ok(permit) => Ok(Some(permit)),
            Err(mpsc::error::TrySendError::Full(())) => Ok(None),
            Err(mpsc::error::TrySendError::Closed(())) => Err(Error::Other(
                "the rollout service has stopped taking tasks".into(),
            )),
        }
    }

    /// Waits for room for one episode; the permit submits it (for a caller choosing
    /// between this service and another taker).
    pub async fn reserve(&self) -> Result<mpsc::Permit<'_, EpisodeRequest>> {
        self.0
            .reserve()
            .await
            .map_err(|_| Error::Other("the rollout service has stopped taking tasks".into()))
    }
}

/// A running rollout service.
pub struct RolloutService {
    tasks: Option<TaskSender>,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_join: JoinHandle<()>,
    /// Set once the supervisor has stopped: its summary (none if it ended without one).
    ended: watch::Receiver<Option<Option<super::RolloutSummary>>>,
    pools: Vec<(String, ActorRef<ToolPoolMsg>, JoinHandle<()>)>,
}

impl RolloutService {
    /// Starts the tree: one pool per tool and the supervisor. Finished trajectories (completed
    /// or failed with a reason) go into `sink`; awaiting it is the backpressure.
    pub async fn start(setup: RolloutSetup, sink: mpsc::Sender<Trajectory>) -> Result<Self> {
        let missing: Vec<String> = setup
            .env
            .tool_names()
            .into_iter()
            .filter(|n| !setup.tools.iter().any(|t| t.name() == n))
            .collect();
        if !missing.is_empty() {
            return Err(Error::invalid(
                "rollout",
                format!(
                    "the env uses tools that are not configured: {}",
                    missing.join(", ")
                ),
            ));
        }
        let spawn_err =
            |what: &str, e: ractor::SpawnErr| Error::Other(format!("spawning {what}: {e}"));
        let mut pools = Vec::new();
        let mut by_name = HashMap::new();
        for tool in &setup.tools {
            let args = ToolPoolArgs {
                tool: tool.clone(),
                queue_capacity: setup.tool_queue_capacity,
                restart: setup.restart.clone(),
                validate: setup.validate.clone(),
                stall: setup.stall.as_ref().map(|w| w.tool(tool.name())),
            };
            let (pool, join) = Actor::spawn(None, ToolPool, args)
                .await
                .map_err(|e| spawn_err("a tool pool", e))?;
            by_name.insert(tool.name().to_string(), (pool.clone(), tool.timeout()));
            pools.push((tool.name().to_string(), pool, join));
        }
        let shared = Arc::new(Shared {
            env: setup.env,
            engine: setup.engine,
            tools: by_name,
            renderer: setup.renderer,
            context_policy: setup.context_policy,
            config: setup.episode,
            live: setup.live,
            sink,
            stall: setup.stall,
            calls: setup.calls,
            in_flight: setup.in_flight,
        });
        let concurrency = setup.concurrency.max(1);
        // One task waits in the channel: the feeder takes tasks as slots free up, and a
        // producer that stops feeding (a drain, a signal) has little left in the pipe.
        let (tx, rx) = mpsc::channel(1);
        let (done_tx, done) = oneshot::channel();
        let args = SupervisorArgs {
            tasks: rx,
            concurrency,
            shared,
            done: done_tx,
        };
        let (supervisor, actor_join) = Actor::spawn(None, RolloutSupervisor, args)
            .await
            .map_err(|e| spawn_err("the rollout supervisor", e))?;
        let (ended_tx, ended) = watch::channel(None);
        let supervisor_join = tokio::spawn(async move {
            let _ = actor_join.await;
            // The supervisor sends its summary before it ends.
            ended_tx.send_replace(Some(done.await.ok()));
        });
        Ok(Self {
            tasks: Some(TaskSender(tx)),
            supervisor,
            supervisor_join,
            ended,
            pools,
        })
    }

    /// A sender for tasks. The stream ends when [`RolloutService::finish`] is called and
    /// every sender handed out has been dropped.
    pub fn tasks(&self) -> TaskSender {
        self.tasks
            .clone()
            .expect("the service's own sender lives until finish")
    }

    /// Submits one episode.
    pub async fn submit(&self, request: EpisodeRequest) -> Result<()> {
        self.tasks().submit(request).await
    }

    /// Resolves once the service has stopped on its own: a fatal failure (its summary's
    /// `fatal` says which) or an abort. A consumer waiting for trajectories selects on it,
    /// since other senders of its channel may outlive the service.
    /// Its fatal reason, if it had one. Cancel-safe.
    pub async fn stopped(&self) -> Option<String> {
        let mut ended = self.ended.clone();
        let ended = ended.wait_for(Option::is_some).await.ok()?;
        ended.as_ref()?.as_ref()?.fatal.clone()
    }

    /// Takes no more tasks; the episodes in flight (and their retries) still finish.
    pub fn drain(&self) {
        let _ = self.supervisor.cast(SupervisorMsg::Drain);
    }

    /// Stops now: episodes in flight are stopped and reported as not finished.
    pub fn abort(&self, reason: impl Into<String>) {
        let _ = self.supervisor.cast(SupervisorMsg::Abort(reason.into()));
    }

    /// Ends the task stream (once every [`TaskSender`] is dropped), waits for every task
    /// taken to end, stops the tool pools and returns the counters.
    pub async fn finish(mut self) -> Result<RolloutReport> {
        drop(self.tasks.take());
        let _ = (&mut self.supervisor_join).await;
        let summary =
            self.ended.borrow().clone().flatten().ok_or_else(|| {
                Error::Other("the rollout supervisor ended without a summary".into())
            })?;
        let mut report = RolloutReport {
            summary,
            ..Default::default()
        };
        for (name, pool, join) in self.pools.drain(..) {
            if let Ok(ractor::rpc::CallResult::Success(stats)) = pool
                .call(ToolPoolMsg::Stats, Some(Duration::from_secs(10)))
                .await
            {
                report.tool_restarts.insert(name.clone(), stats.restarts);
                report.tool_shed.insert(name, stats.shed);
            }
            pool.stop(None);
            let _ = join.await;
        }
        Ok(report)
    }
}

impl Drop for RolloutService {
    fn drop(&mut self) {
        // A service dropped without `finish` (its owner failed) must not leave actors behind.
        if self.tasks.is_some() {
            self.supervisor.stop_children(None);
            self.supervisor.stop(None);
            for (_, pool, _) in &self.pools {
                pool.stop(None);
            }
        }
    }
}
