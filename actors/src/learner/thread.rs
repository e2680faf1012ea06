//! The learner's OS thread and the one command enum it serves.
//!
//! Tensors are not `Sync` and grad mode is thread-local, so the learner lives on one thread
//! and receives [`Command`]s over a bounded crossbeam channel from its actor
//! ([`super::actor`]); each command carries the caller's reply port, answered from this
//! thread, so async callers never block a runtime thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use ractor::RpcReplyPort;
use tch::Tensor;

use super::config::LearnerConfig;
use super::data_parallel::RankJoin;
use super::stats::UpdateStats;
use super::trainer::{Learner, LearnerModels};
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

/// Fault injection for tests and benchmarks: runs on the learner thread at the start of
/// every update with the policy version being updated. A sleep slows the learner down on
/// purpose; a panic stands for libtorch failing mid-update.
pub type BeforeUpdate = Arc<dyn Fn(u64) + Send + Sync>;

/// What the learner thread does, each with the reply port of the caller that asked.
pub(super) enum Command {
    /// Train on one batch.
    Update(Vec<Trajectory>, RpcReplyPort<Result<UpdateStats>>),
    /// Copies of the current policy's weights.
    Weights(RpcReplyPort<Result<PolicyWeights>>),
    /// The current policy version.
    Version(RpcReplyPort<Result<u64>>),
    /// Save the policy (and a separate critic) as Hugging Face directories under `dir`,
    /// copying tokenizer files from `tokenizer_from`.
    Save {
        dir: PathBuf,
        tokenizer_from: Option<PathBuf>,
        reply: RpcReplyPort<Result<()>>,
    },
    /// Write the optimizers' state to a file.
    SaveOptimizer(PathBuf, RpcReplyPort<Result<()>>),
    /// Restore the optimizers' state from a file.
    LoadOptimizer(PathBuf, RpcReplyPort<Result<()>>),
}

impl Command {
    /// Answers the caller with `error` without running the command.
    pub(super) fn refuse(self, error: Error) {
        match self {
            Command::Update(_, reply) => drop(reply.send(Err(error))),
            Command::Weights(reply) => drop(reply.send(Err(error))),
            Command::Version(reply) => drop(reply.send(Err(error))),
            Command::Save { reply, .. }
            | Command::SaveOptimizer(_, reply)
            | Command::LoadOptimizer(_, reply) => drop(reply.send(Err(error))),
        }
    }
}

/// Starts the learner thread; `load` builds the models on it. Blocks until the learner is
/// ready (call it off the async runtime), and returns where its commands go (dropping it
/// stops the thread once it has served what is queued), or the loading error.
///
/// With `ranks`, the learner joins its process group once loaded (this is rank 0, which
/// leads: see [`Learner::join_ranks`]); while idle it tells the other ranks so before their
/// wait passes the group's timeout.
///
/// `on_failure` is called from the thread, once, whenever it stops other than by its sender
/// being dropped: when a command panicked (libtorch raises through tch as panics), its caller
/// was answered [`Error::Panicked`] first; when a collective of the ranks failed
/// ([`Error::Collective`]: the ranks can no longer agree). The thread then serves nothing
/// more; commands still queued are dropped unanswered.
pub(super) fn start(
    load: impl FnOnce() -> Result<LearnerModels> + Send + 'static,
    config: LearnerConfig,
    before_update: Option<BeforeUpdate>,
    ranks: Option<RankJoin>,
    on_failure: impl FnOnce(Error) + Send + 'static,
) -> Result<crossbeam::channel::Sender<Command>> {
    let (commands, rx) = crossbeam::channel::bounded::<Command>(config.queue_capacity);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    std::thread::Builder::new()
        .name("agent-r1-learner".into())
        .spawn(move || {
            let learner = match catch_unwind(AssertUnwindSafe(|| {
                let mut learner = load().and_then(|models| Learner::new(models, config))?;
                if let Some(join) = ranks {
                    learner.join_ranks(join.group()?, join.mode)?;
                }
                Ok(learner)
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
            let served = catch_unwind(AssertUnwindSafe(|| serve(learner, rx, before_update)));
            match served {
                Ok(None) => {}
                Ok(Some(why)) => on_failure(why),
                Err(panic) => on_failure(Error::Panicked {
                    what: "the learner thread".into(),
                    message: panic_message(panic.as_ref()),
                }),
            }
        })
        .map_err(|e| Error::Other(format!("cannot start the learner thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(commands),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Other("the learner thread died while loading".into())),
    }
}

/// Runs `f`, turning a panic into [`Error::Panicked`] naming `what`.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::Panicked {
            what: what.into(),
            message: panic_message(p.as_ref()),
        })
    })
}

/// Answers `reply` with `result`; returns why the learner cannot go on when the command
/// panicked (the optimizer may have stepped some parameters and not others) or a collective
/// of its ranks failed (they can no longer agree).
fn answer<T>(reply: RpcReplyPort<Result<T>>, result: Result<T>) -> Option<Error> {
    let fatal = match &result {
        Err(Error::Panicked { what, message }) => Some(Error::Panicked {
            what: what.clone(),
            message: message.clone(),
        }),
        Err(Error::Collective {
            op,
            rank,
            world,
            message,
        }) => Some(Error::Collective {
            op: op.clone(),
            rank: *rank,
            world: *world,
            message: message.clone(),
        }),
        _ => None,
    };
    let _ = reply.send(result);
    fatal
}

/// The thread's loop, until the actor drops its sender (a normal stop: what was queued is
/// served first) or a command panics or a collective fails (returns why). The learner's
/// ranks hear from it at least every quarter of their timeout.
fn serve(
    mut learner: Learner,
    rx: crossbeam::channel::Receiver<Command>,
    before_update: Option<BeforeUpdate>,
) -> Option<Error> {
    let keep_alive = learner.rank_timeout().map(|t| t / 4);
    loop {
        let command = match keep_alive {
            None => match rx.recv() {
                Ok(c) => c,
                Err(_) => return None,
            },
            Some(every) => match rx.recv_timeout(every) {
                Ok(c) => c,
                Err(crossbeam::channel::RecvTimeoutError::Timeout) => {
                    match guarded("telling the learner ranks it is idle", || {
                        learner.keep_ranks_alive()
                    }) {
                        Ok(()) => continue,
                        Err(e) => return Some(e),
                    }
                }
                Err(crossbeam::channel::RecvTimeoutError::Disconnected) => return None,
            },
        };
        let fatal = match command {
            Command::Update(batch, reply) => {
                let result = guarded("learner update", || {
                    if let Some(hook) = &before_update {
                        hook(learner.version());
                    }
                    learner.update(batch)
                });
                answer(reply, result)
            }
            Command::Weights(reply) => {
                let result = guarded("copying weights", || {
                    Ok(PolicyWeights {
                        version: learner.version(),
                        digest: learner.policy_digest()?,
                        tensors: learner.policy_weights(),
                    })
                });
                answer(reply, result)
            }
            Command::Version(reply) => answer(reply, Ok(learner.version())),
            Command::Save {
                dir,
                tokenizer_from,
                reply,
            } => {
                let result = guarded("saving the policy", || {
                    learner.save(&dir, tokenizer_from.as_deref())
                });
                answer(reply, result)
            }
            Command::SaveOptimizer(path, reply) => {
                let result = guarded("saving the optimizer state", || {
                    learner.save_optimizer(&path)
                });
                answer(reply, result)
            }
            Command::LoadOptimizer(path, reply) => {
                let result = guarded("loading the optimizer state", || {
                    learner.load_optimizer(&path)
                });
                answer(reply, result)
            }
        };
        if fatal.is_some() {
            return fatal;
        }
    }
}
