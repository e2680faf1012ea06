//! The learner as a supervised actor, and [`LearnerRef`], the one way to reach it. The actor
//! owns the learner thread ([`super::thread`]: it starts it, loading the models on it, and
//! closes it when it stops) and passes each caller's command to it; the thread answers the
//! caller. A supervisor watches the actor and keeps why it failed.
//!
//! A panic inside an update (libtorch raises through tch as panics) is answered to the caller,
//! then fails the actor: the optimizer may have stepped some parameters and not others, so
//! the learner cannot vouch for its weights. The supervisor does not restart it in place (a
//! fresh learner from the start weights would silently undo training); it records the reason,
//! logs it and counts `agent_r1_learner_failures_total`, and every later call answers
//! [`Error::LearnerFailed`] with that reason. `train` then stops, and a resume continues from
//! the newest checkpoint.

use std::path::PathBuf;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::watch;

use super::config::LearnerConfig;
use super::data_parallel::RankJoin;
use super::stats::UpdateStats;
use super::thread::{self, BeforeUpdate, Command, PolicyWeights};
use super::trainer::LearnerModels;
use crate::engine_set::EngineSet;
use crate::trajectory::Trajectory;
use crate::{Error, Result};

/// Builds the learner's models; runs on the learner thread.
pub type LoadModels = Box<dyn FnOnce() -> Result<LearnerModels> + Send>;

/// What the learner starts from.
pub struct LearnerStart {
    /// Builds the models (on the learner thread).
    pub load: LoadModels,
    /// The learner's settings.
    pub config: LearnerConfig,
    /// Fault injection for tests and benchmarks ([`BeforeUpdate`]); `None` in production.
    pub before_update: Option<BeforeUpdate>,
    /// With several learner ranks: this learner is rank 0 of the group, which it joins once
    /// loaded (the other ranks run `Learner::follow` in their own processes).
    pub ranks: Option<RankJoin>,
}

impl LearnerStart {
    /// A learner from `load` and `config`, with no fault injected.
    pub fn new(
        load: impl FnOnce() -> Result<LearnerModels> + Send + 'static,
        config: LearnerConfig,
    ) -> Self {
        Self {
            load: Box::new(load),
            config,
            before_update: None,
            ranks: None,
        }
    }
}

/// Messages of the learner actor: a caller's command, passed on to the thread, or the
/// thread's report that a command panicked.
enum LearnerMsg {
    Command(Command),
    ThreadFailed(Error),
}

// Local only: never sent to another node.
impl ractor::Message for LearnerMsg {}

/// Owns the learner thread: starts it (loading the models on it), passes commands to it, and
/// fails when it reports a panic, so that its supervisor sees the failure. When it stops, its
/// state drops the command channel: the thread serves what is queued, then exits and frees
/// the models.
struct LearnerActor;

impl Actor for LearnerActor {
    type Msg = LearnerMsg;
    type State = crossbeam::channel::Sender<Command>;
    type Arguments = LearnerStart;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        start: LearnerStart,
    ) -> Result<Self::State, ActorProcessingErr> {
        let report = move |why: Error| {
            let _ = myself.cast(LearnerMsg::ThreadFailed(why));
        };
        // Loading reads checkpoints from disk: keep it off the runtime's threads.
        let started = tokio::task::spawn_blocking(move || {
            thread::start(
                start.load,
                start.config,
                start.before_update,
                start.ranks,
                report,
            )
        })
        .await?;
        Ok(started?)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        commands: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        use crossbeam::channel::TrySendError;
        match message {
            LearnerMsg::Command(command) => match commands.try_send(command) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(command)) => {
                    command.refuse(Error::Overloaded("the learner queue".into()));
                    Ok(())
                }
                // The thread has stopped and its report (`ThreadFailed`) is on its way: the
                // caller, left unanswered, gets the supervisor's reason.
                Err(TrySendError::Disconnected(_)) => Ok(()),
            },
            LearnerMsg::ThreadFailed(why) => Err(Box::new(why)),
        }
    }
}

/// Why the learner failed, as its supervisor keeps it for callers.
#[derive(Debug, Clone)]
struct Failure {
    why: String,
    /// A collective of the learner's ranks failed.
    rank: bool,
}

/// Watches the learner actor: a failure is logged, counted and kept for callers.
struct LearnerSupervisor;

impl Actor for LearnerSupervisor {
    type Msg = ();
    type State = watch::Sender<Option<Failure>>;
    type Arguments = watch::Sender<Option<Failure>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        failure: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        metrics::counter!(crate::metric_names::LEARNER_FAILURES_TOTAL.name).increment(0);
        Ok(failure)
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        failure: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(_, why) => {
                let rank = why
                    .downcast_ref::<Error>()
                    .is_some_and(Error::is_learner_rank_failure);
                let why = why.to_string();
                tracing::error!("the learner failed: {why}");
                metrics::counter!(crate::metric_names::LEARNER_FAILURES_TOTAL.name).increment(1);
                failure.send_replace(Some(Failure { why, rank }));
                myself.stop(Some("the learner failed".into()));
            }
            SupervisionEvent::ActorTerminated(..) => myself.stop(None),
            _ => {}
        }
        Ok(())
    }
}

/// How callers reach the supervised learner. Cheap to clone.
#[derive(Clone)]
pub struct LearnerRef {
    actor: ActorRef<LearnerMsg>,
    failure: watch::Receiver<Option<Failure>>,
    timeout: Duration,
}

impl std::fmt::Debug for LearnerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerRef")
            .field("actor", &self.actor.get_id())
            .field("failure", &*self.failure.borrow())
            .finish()
    }
}

impl LearnerRef {
    /// Starts the supervisor and, under it, the learner actor and its thread. Returns once the
    /// models are loaded, or with the loading or configuration error.
    pub async fn spawn(start: LearnerStart) -> Result<Self> {
        start.config.validate()?;
        let timeout = start.config.request_timeout;
        let (report, failure) = watch::channel(None);
        let (supervisor, _) = Actor::spawn(None, LearnerSupervisor, report)
            .await
            .map_err(|e| Error::Other(format!("cannot start the learner's supervisor: {e}")))?;
        match Actor::spawn_linked(None, LearnerActor, start, supervisor.get_cell()).await {
            Ok((actor, _)) => Ok(Self {
                actor,
                failure,
                timeout,
            }),
            Err(e) => {
                supervisor.stop(None);
                Err(Error::Other(format!("starting the learner: {e}")))
            }
        }
    }

    /// Trains on one batch.
    pub async fn update(&self, batch: Vec<Trajectory>) -> Result<UpdateStats> {
        self.call("a learner update", |r| Command::Update(batch, r))
            .await
    }

    /// Sends the current policy to the engine (every engine of a set), verified against the
    /// learner's checksums ([`EngineSet::update_weights_verified`]), so its next tokens
    /// sample from it; returns the version published.
    pub async fn publish(&self, engine: impl Into<EngineSet>) -> Result<u64> {
        let engine = engine.into();
        let weights = self.weights().await?;
        engine
            .update_weights_verified(weights.version, weights.tensors, weights.digest)
            .await?;
        Ok(weights.version)
    }

    /// Copies of the current policy's weights (no value head), their version and
    /// checksums: waits behind the learner's work in progress (an update) like any call.
    pub async fn weights(&self) -> Result<PolicyWeights> {
        self.call("the learner's weights", Command::Weights).await
    }

    /// The current policy version.
    pub async fn version(&self) -> Result<u64> {
        self.call("the learner's version", Command::Version).await
    }

    /// Saves the policy (and a separate critic under `dir/critic`) as Hugging Face
    /// directories, copying tokenizer files from `tokenizer_from`.
    pub async fn save(&self, dir: PathBuf, tokenizer_from: Option<PathBuf>) -> Result<()> {
        self.call("a learner checkpoint", |reply| Command::Save {
            dir,
            tokenizer_from,
            reply,
        })
        .await
    }

    /// Writes the optimizers' state (AdamW moments, step counts) to `path` (safetensors).
    pub async fn save_optimizer(&self, path: PathBuf) -> Result<()> {
        self.call("saving the optimizer state", |r| {
            Command::SaveOptimizer(path, r)
        })
        .await
    }

    /// Restores the optimizers' state from a [`Self::save_optimizer`] file.
    pub async fn load_optimizer(&self, path: PathBuf) -> Result<()> {
        self.call("loading the optimizer state", |r| {
            Command::LoadOptimizer(path, r)
        })
        .await
    }

    /// Why the learner failed, once its supervisor has reported it (`None` while it runs).
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().as_ref().map(|f| f.why.clone())
    }

    /// Stops the learner: it finishes the message it is on, and its thread the work queued.
    pub fn shutdown(&self) {
        self.actor.stop(None);
    }

    async fn call<T: Send + 'static>(
        &self,
        what: &str,
        command: impl FnOnce(RpcReplyPort<Result<T>>) -> Command,
    ) -> Result<T> {
        let message = |reply| LearnerMsg::Command(command(reply));
        match self.actor.call(message, Some(self.timeout)).await {
            Ok(CallResult::Success(result)) => result,
            Ok(CallResult::Timeout) => Err(Error::Timeout {
                what: what.into(),
                after: self.timeout,
            }),
            Ok(CallResult::SenderError) | Err(_) => Err(self.failed().await),
        }
    }

    /// The error for a call the actor could not answer: the supervisor's report when it comes
    /// (it follows the actor's failure by one message), else that the learner stopped.
    async fn failed(&self) -> Error {
        let mut failure = self.failure.clone();
        let reported =
            tokio::time::timeout(Duration::from_secs(10), failure.wait_for(|f| f.is_some())).await;
        match reported {
            Ok(Ok(f)) => match f.as_ref() {
                Some(Failure { why, rank: true }) => Error::LearnerRankFailed(why.clone()),
                Some(Failure { why, .. }) => Error::LearnerFailed(why.clone()),
                None => Error::LearnerFailed(String::new()),
            },
            _ => Error::LearnerFailed("the learner actor stopped".into()),
        }
    }
}
