//! Why an episode failed, typed across actor boundaries: the episode actor fails with an
//! [`EpisodeError`] and the rollout supervisor reads it back from the supervision event to
//! decide between re-queueing the task, counting an env restart, and stopping the run.

use std::fmt;
use std::time::Duration;

/// The env call an episode was waiting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvStage {
    /// Building a fresh env from its source for this episode.
    Build,
    /// `Env::reset`.
    Reset,
    /// `Env::on_turn`.
    OnTurn,
    /// `Env::observe` and `Env::step_reward`.
    Observe,
    /// `Env::score`.
    Score,
    /// `Env::snapshot`.
    Snapshot,
    /// `Env::restore`.
    Restore,
}

impl fmt::Display for EnvStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnvStage::Build => "build",
            EnvStage::Reset => "reset",
            EnvStage::OnTurn => "on_turn",
            EnvStage::Observe => "observe",
            EnvStage::Score => "score",
            EnvStage::Snapshot => "snapshot",
            EnvStage::Restore => "restore",
        })
    }
}

/// Every way an episode can fail.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    /// The env answered with an error for this task.
    #[error("env {stage}: {reason}")]
    Env {
        /// The call.
        stage: EnvStage,
        /// The env's message.
        reason: String,
    },
    /// The env panicked; its actor failed and the next attempt builds a fresh env.
    #[error("env {stage} panicked: {reason}")]
    EnvPanicked {
        /// The call.
        stage: EnvStage,
        /// The panic message.
        reason: String,
    },
    /// The env did not answer within `rollout.env_timeout_secs`.
    #[error("stuck stage: env {stage} gave no answer within {after:?} (rollout.env_timeout_secs)")]
    EnvTimeout {
        /// The call.
        stage: EnvStage,
        /// The limit.
        after: Duration,
    },
    /// The task's prompt is longer than `max_prompt` or leaves no room for a turn in
    /// `max_context`; retrying cannot help, so the episode is not re-queued.
    #[error("the prompt has {tokens} tokens, over the limit of {limit} ({which})")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// The limit it broke.
        limit: usize,
        /// Which limit, by its config key (`rollout.max_prompt_length`, or
        /// `rollout.max_context_length` less room for a turn).
        which: &'static str,
    },
    /// The engine failed this turn (a timeout, an invalid request, an overload).
    #[error("engine: {0}")]
    Engine(crate::Error),
    /// The engine stopped: no episode can go on, so the run stops.
    #[error("inference engine stopped: {0}")]
    EngineStopped(String),
    /// Rendering or decoding tokens failed.
    #[error("rendering: {0}")]
    Render(crate::Error),
    /// Nobody takes finished trajectories any more: the run stops.
    #[error("the trajectory consumer went away")]
    ConsumerGone,
    /// The episode's workflow returned an error, panicked, returned no steps or a bad
    /// reward, or did not finish within `workflow_timeout`.
    #[error("workflow: {0}")]
    Workflow(String),
    /// An actor could not be spawned or answered nothing.
    #[error("{0}")]
    Actor(String),
}

impl EpisodeError {
    /// Whether the failure ends the whole run rather than this episode.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            EpisodeError::EngineStopped(_) | EpisodeError::ConsumerGone
        )
    }

    /// Whether another attempt of the episode could end otherwise.
    pub fn worth_retrying(&self) -> bool {
        !matches!(self, EpisodeError::PromptTooLong { .. })
    }

    /// Whether the episode's env actor failed with it (and was replaced by a fresh env).
    pub fn restarted_env(&self) -> bool {
        matches!(self, EpisodeError::EnvPanicked { .. })
    }
}

impl From<crate::Error> for EpisodeError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::EngineStopped(reason) => EpisodeError::EngineStopped(reason),
            e => EpisodeError::Engine(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_the_engine_gave_up_on_is_retried_and_a_stopped_engine_ends_the_run() {
        let gave_up = EpisodeError::from(crate::Error::TurnFailed("crashed twice".into()));
        assert!(!gave_up.is_fatal() && gave_up.worth_retrying(), "{gave_up}");
        let stopped = EpisodeError::from(crate::Error::EngineStopped("shut down".into()));
        assert!(stopped.is_fatal(), "{stopped}");
    }
}
