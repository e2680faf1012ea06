//! The learner's OS thread and the async handle that talks to it.
//!
//! Tensors are not `Sync` and grad mode is thread-local, so the learner lives on one thread
//! and receives commands over a bounded crossbeam channel; replies come back on tokio
//! oneshots, so async callers (the daemon, the rollout loop) never block a runtime thread.
//! A semaphore bounds the queue: callers wait (up to the request timeout) for room instead
//! of piling batches up in memory.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tch::Tensor;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::config::LearnerConfig;
use super::stats::UpdateStats;
use super::trainer::{Learner, LearnerModels};
use crate::engine_set::EngineSet;
use crate::error::panic_message;
use crate::trajectory::Trajectory;
use crate::weight_digest::WeightDigest;
use crate::{Error, Result};

/// A snapshot of the policy's weights and the version they are.
#[derive(Debug)]
pub struct PolicyWeights {
    /// The learner's policy version.
    pub version: u64,
    /// `(name, tensor)` copies in the engine's naming, value head excluded.
    pub tensors: Vec<(String, Tensor)>,
    /// Checksums of the learner's own policy weights (those `tensors` copy), which the
    /// engine verifies a publication against.
    pub digest: WeightDigest,
}

enum Command {
    Update {
        batch: Vec<Trajectory>,
        reply: oneshot::Sender<Result<UpdateStats>>,
        _permit: OwnedSemaphorePermit,
    },
    Weights(oneshot::Sender<Result<PolicyWeights>>),
    Version(oneshot::Sender<u64>),
    Save {
        dir: PathBuf,
        tokenizer_from: Option<PathBuf>,
        reply: oneshot::Sender<Result<()>>,
    },
    SaveOptimizer {
        path: PathBuf,
        reply: oneshot::Sender<Result<()>>,
    },
    LoadOptimizer {
        path: PathBuf,
        reply: oneshot::Sender<Result<()>>,
    },
    Shutdown,
}

/// A cheap, cloneable way to talk to the learner thread.
#[derive(Clone)]
pub struct LearnerHandle {
    tx: crossbeam::channel::Sender<Command>,
    permits: Arc<Semaphore>,
    timeout: Duration,
}

impl std::fmt::Debug for LearnerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnerHandle")
            .field("available_permits", &self.permits.available_permits())
            .finish()
    }
}

/// Fault injection for tests and benchmarks: runs on the learner thread at the start of
/// every update with the policy version being updated. A sleep slows the learner down on
/// purpose; a panic stands for libtorch failing mid-update.
pub type BeforeUpdate = Arc<dyn Fn(u64) + Send + Sync>;

/// Starts the learner thread; `load` builds the models on that thread.
///
/// Returns once the learner is ready, or with the loading or configuration error.
pub fn spawn_learner(
    load: impl FnOnce() -> Result<LearnerModels> + Send + 'static,
    config: LearnerConfig,
) -> Result<(LearnerHandle, std::thread::JoinHandle<()>)> {
    spawn_learner_with(load, config, None)
}

/// [`spawn_learner`] with a fault-injection hook run before every update.
pub fn spawn_learner_with(
    load: impl FnOnce() -> Result<LearnerModels> + Send + 'static,
    config: LearnerConfig,
    before_update: Option<BeforeUpdate>,
) -> Result<(LearnerHandle, std::thread::JoinHandle<()>)> {
    config.validate()?;
    let capacity = config.queue_capacity;
    let timeout = config.request_timeout;
    let (tx, rx) = crossbeam::channel::bounded::<Command>(capacity + 16);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let join = std::thread::Builder::new()
        .name("agent-r1-learner".into())
        .spawn(move || {
            let learner = match catch_unwind(AssertUnwindSafe(|| {
                load().and_then(|models| Learner::new(models, config))
            })) {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                Err(panic) => {
                    let _ = ready_tx.send(Err(Error::Other(format!(
                        "learner panicked while loading: {}",
                        panic_message(panic.as_ref())
                    ))));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            serve(learner, rx, before_update);
        })
        .map_err(|e| Error::Other(format!("cannot start the learner thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(Error::Other("the learner thread died while loading".into())),
    }
    Ok((
        LearnerHandle {
            tx,
            permits: Arc::new(Semaphore::new(capacity)),
            timeout,
        },
        join,
    ))
}

/// Runs `f`, turning a panic (libtorch raises through tch as panics) into
/// [`Error::Panicked`] naming `what`.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::Panicked {
            what: what.into(),
            message: panic_message(p.as_ref()),
        })
    })
}

/// The thread's loop. A panic inside a command (libtorch raises through tch as panics)
/// becomes that command's error ([`Error::Panicked`]); the thread keeps serving, and
/// [`super::LearnerActor`] decides whether the learner can go on.
fn serve(
    mut learner: Learner,
    rx: crossbeam::channel::Receiver<Command>,
    before_update: Option<BeforeUpdate>,
) {
    while let Ok(command) = rx.recv() {
        match command {
            Command::Update { batch, reply, .. } => {
                let _ = reply.send(guarded("learner update", || {
                    if let Some(hook) = &before_update {
                        hook(learner.version());
                    }
                    learner.update(batch)
                }));
            }
            Command::Weights(reply) => {
                let _ = reply.send(guarded("copying weights", || {
                    Ok(PolicyWeights {
                        version: learner.version(),
                        digest: learner.policy_digest()?,
                        tensors: learner.policy_weights(),
                    })
                }));
            }
            Command::Version(reply) => {
                let _ = reply.send(learner.version());
            }
            Command::Save {
                dir,
                tokenizer_from,
                reply,
            } => {
                let _ = reply.send(guarded("saving the policy", || {
                    learner.save(&dir, tokenizer_from.as_deref())
                }));
            }
            Command::SaveOptimizer { path, reply } => {
                let _ = reply.send(guarded("saving the optimizer state", || {
                    learner.save_optimizer(&path)
                }));
            }
            Command::LoadOptimizer { path, reply } => {
                let _ = reply.send(guarded("loading the optimizer state", || {
                    learner.load_optimizer(&path)
                }));
            }
            Command::Shutdown => return,
        }
    }
}

impl LearnerHandle {
    /// Trains on one batch; waits for room in the queue and for the result, each up to the
    /// configured request timeout.
    pub async fn update(&self, batch: Vec<Trajectory>) -> Result<UpdateStats> {
        let permit = tokio::time::timeout(self.timeout, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| Error::Timeout {
                what: "room in the learner queue".into(),
                after: self.timeout,
            })?
            .map_err(|_| Error::Other("learner closed".into()))?;
        let (reply, rx) = oneshot::channel();
        self.send(Command::Update {
            batch,
            reply,
            _permit: permit,
        })?;
        self.wait(rx, "a learner update").await?
    }

    /// Copies of the policy's weights (no value head) and their version.
    pub async fn state_dict(&self) -> Result<PolicyWeights> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Weights(reply))?;
        self.wait(rx, "the learner's weights").await?
    }

    /// Sends the current policy to the engine (every engine of a set), verified against the
    /// learner's checksums ([`EngineSet::update_weights_verified`]), so the next turns sample
    /// from it; returns the version published.
    pub async fn publish(&self, engine: impl Into<EngineSet>) -> Result<u64> {
        let engine = engine.into();
        let weights = self.state_dict().await?;
        engine
            .update_weights_verified(weights.version, weights.tensors, weights.digest)
            .await?;
        Ok(weights.version)
    }

    /// The current policy version.
    pub async fn version(&self) -> Result<u64> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Version(reply))?;
        self.wait(rx, "the learner's version").await
    }

    /// Saves the policy (and a separate critic under `dir/critic`) as Hugging Face
    /// directories, copying tokenizer files from `tokenizer_from`.
    pub async fn save(&self, dir: PathBuf, tokenizer_from: Option<PathBuf>) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Save {
            dir,
            tokenizer_from,
            reply,
        })?;
        self.wait(rx, "a learner checkpoint").await?
    }

    /// Writes the optimizers' state (AdamW moments, step counts) to `path` (safetensors).
    pub async fn save_optimizer(&self, path: PathBuf) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::SaveOptimizer { path, reply })?;
        self.wait(rx, "saving the optimizer state").await?
    }

    /// Restores the optimizers' state from a [`Self::save_optimizer`] file.
    pub async fn load_optimizer(&self, path: PathBuf) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::LoadOptimizer { path, reply })?;
        self.wait(rx, "loading the optimizer state").await?
    }

    /// Asks the thread to finish after the commands already queued.
    pub fn shutdown(&self) {
        let _ = self
            .tx
            .send_timeout(Command::Shutdown, Duration::from_secs(5));
    }

    fn send(&self, command: Command) -> Result<()> {
        self.tx.try_send(command).map_err(|e| match e {
            crossbeam::channel::TrySendError::Full(_) => {
                Error::Overloaded("the learner queue".into())
            }
            crossbeam::channel::TrySendError::Disconnected(_) => {
                Error::Other("the learner thread has exited".into())
            }
        })
    }

    async fn wait<T>(&self, rx: oneshot::Receiver<T>, what: &str) -> Result<T> {
        match tokio::time::timeout(self.timeout, rx).await {
            Err(_) => Err(Error::Timeout {
                what: what.into(),
                after: self.timeout,
            }),
            Ok(Err(_)) => Err(Error::Other(
                "the learner dropped the request (it failed or shut down)".into(),
            )),
            Ok(Ok(v)) => Ok(v),
        }
    }
}
