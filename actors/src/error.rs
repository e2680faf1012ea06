//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the model, engine, learner and actors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A model or tokenizer file is malformed or does not fit the architecture.
    #[error("{path}: {message}")]
    Model {
        /// The file (config.json, a safetensors shard, tokenizer.json, ...).
        path: PathBuf,
        /// What is wrong (the field or tensor name, and what was expected).
        message: String,
    },
    /// Rendering the chat template failed.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An invalid argument (sampling settings, device name, ...).
    #[error("{what}: {message}")]
    Invalid {
        /// The argument.
        what: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A config value is out of its range (the key and what is allowed).
    #[error("invalid config {0}")]
    Config(#[from] agent_r1_envs::config::ConfigError),
    /// The inference engine stopped (its thread failed or was shut down).
    #[error("inference engine stopped: {0}")]
    EngineStopped(String),
    /// The engine's thread failed while it ran this request and was restarted: the request
    /// was not carried out. A restarted engine is sent its weights again by whoever watches
    /// its restarts ([`crate::engine::EngineHandle::restarts`]).
    #[error("the inference engine restarted: {0}")]
    EngineRestarted(String),
    /// The engine gave up on one turn (its thread failed while running it) and goes on
    /// serving others: the episode can be tried again.
    #[error("the inference engine gave up on this turn: {0}")]
    TurnFailed(String),
    /// A wait ran past its limit.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// A bounded queue was full and the request was shed.
    #[error("{0} is full")]
    Overloaded(String),
    /// libtorch raised an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// libtorch (or our code) panicked inside a stage that cannot vouch for its state after.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// The stage (`learner update`, ...).
        what: String,
        /// The panic's message.
        message: String,
    },
    /// A weight publication did not arrive intact: a tensor's checksum differs between the
    /// learner and the engine.
    #[error("weight sync mismatch ({stage}): tensor `{tensor}`: {detail}")]
    WeightSyncMismatch {
        /// Where it was caught (`weights received`, `weights served`).
        stage: String,
        /// The first tensor that differs.
        tensor: String,
        /// Expected and found checksums.
        detail: String,
    },
    /// A collective of the learner's ranks failed: a peer left (its process ended) or the
    /// collective ran past the group's timeout.
    #[error("learner rank {rank} of {world}: {op} failed: {message}")]
    Collective {
        /// The operation (`all-reduce of gradients`, `rendezvous`, ...).
        op: String,
        /// This process's rank.
        rank: usize,
        /// How many ranks the group has.
        world: usize,
        /// torch.distributed's message.
        message: String,
    },
    /// The learner actor failed; its supervisor reported why.
    #[error("the learner failed: {0}")]
    LearnerFailed(String),
    /// The learner failed because one of its ranks did (a [`Error::Collective`] ended it).
    #[error("the learner failed: {0}")]
    LearnerRankFailed(String),
    /// Any other error, its context already in the message.
    #[error("{0}")]
    Other(String),
    /// An error from the environments crate.
    #[error(transparent)]
    Envs(#[from] agent_r1_envs::Error),
}

impl Error {
    /// Whether this error means a learner rank is gone or hung: the learner's ranks can no
    /// longer agree, so the run stops (as the stall detector stops it) and a resume continues
    /// from the newest checkpoint.
    pub fn is_learner_rank_failure(&self) -> bool {
        matches!(self, Error::Collective { .. } | Error::LearnerRankFailed(_))
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The message of a caught panic (a `String` or `&str` payload), or "unknown panic".
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    /// A model-file error on `path`.
    pub fn model(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Model {
            path: path.into(),
            message: message.into(),
        }
    }
    /// An invalid argument.
    pub fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            message: message.into(),
        }
    }
}
