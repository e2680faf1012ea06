//! Episodes in flight, as a checkpoint keeps them: each running episode's finished steps and
//! the state its next turn starts from. An episode of the built-in loop puts its record on
//! the run's [`InFlightBoard`] after every finished turn and takes it off when it ends; a
//! checkpoint reads the board; a resume hands each record back in its
//! [`EpisodeRequest`](super::EpisodeRequest), and the episode continues from its last
//! finished step (its context prefilled again) instead of from its first turn. An env built
//! per episode is captured with its record where it can snapshot itself
//! ([`Env::snapshot`](agent_r1_envs::env::Env::snapshot)) and restored on resume; one that
//! cannot starts its episode over (counted as `restarted`).
//!
//! A workflow episode (user code, whose place cannot be captured from outside) is on the
//! board with the steps it has generated, each with its whole context. A resume runs the
//! workflow again from its start and replays them: a generate call on a context a recorded
//! step had gets that step's action, log-probs and versions instead of sampling, and its tool
//! calls are answered from the call journal, so a workflow that does the same with the same
//! answers reaches its next unfinished step without sampling or calling anything again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;

use super::context_policy::TurnRecord;
use crate::trajectory::{RebuiltContext, Step};

/// One running episode of the built-in loop after its last finished turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InFlightEpisode {
    /// The episode's id (with [`super::RETRY_BIT`] on a second attempt).
    pub episode_id: u64,
    /// Its group.
    pub group_id: u64,
    /// Its attempt.
    pub attempts: u32,
    /// Its task.
    pub task: Task,
    /// The prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// The finished steps (contexts, actions, log-probs, versions, rewards, tool outcomes).
    pub steps: Vec<Step>,
    /// The next turn's context.
    pub next_context: Vec<u32>,
    /// How the next turn's context differs from the chained one, when the policy rebuilt it.
    pub rebuilt: Option<RebuiltContext>,
    /// The turns that called tools, for the context policy.
    pub history: Vec<TurnRecord>,
    /// The messages so far, for the score.
    pub transcript: Vec<Message>,
    /// Seconds the episode had run.
    pub wall_seconds: f64,
    /// The state of its env, where the env was built for it and can be captured
    /// ([`Env::snapshot`](agent_r1_envs::env::Env::snapshot)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_state: Option<serde_json::Value>,
    /// A workflow episode's steps by generate call (`None`: in flight, or failed), each with
    /// its whole context; empty for an episode of the built-in loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workflow_steps: Vec<Option<WorkflowStep>>,
}

/// A step a workflow generated, with its whole context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowStep {
    /// The context it was sampled on.
    pub context: Vec<u32>,
    /// The step (its action, log-probs, versions and tool outcomes).
    pub step: Step,
}

impl InFlightEpisode {
    /// Checks that the record can be continued: steps and context agree with each other.
    pub fn check(&self) -> Result<(), String> {
        if !self.workflow_steps.is_empty() {
            return check_workflow_steps(&self.workflow_steps);
        }
        if self.steps.is_empty() {
            return Err("it has no finished step".into());
        }
        if self.next_context.is_empty() {
            return Err("its next context is empty".into());
        }
        if self.history.len() > self.steps.len() {
            return Err(format!(
                "it has {} turns with tool calls but {} steps",
                self.history.len(),
                self.steps.len()
            ));
        }
        if let Some((k, s)) = self
            .steps
            .iter()
            .enumerate()
            .find(|(_, s)| s.logprobs.len() != s.action_ids.len())
        {
            return Err(format!(
                "step {k} has {} log-probs for {} action ids",
                s.logprobs.len(),
                s.action_ids.len()
            ));
        }
        Ok(())
    }
}

fn check_workflow_steps(steps: &[Option<WorkflowStep>]) -> Result<(), String> {
    if steps.iter().all(Option::is_none) {
        return Err("it has no finished step".into());
    }
    for (k, s) in steps.iter().enumerate() {
        let Some(s) = s else { continue };
        if s.context.is_empty() || s.step.context_len != s.context.len() {
            return Err(format!(
                "workflow step {k} has a context of {} ids but says {}",
                s.context.len(),
                s.step.context_len
            ));
        }
        if s.step.logprobs.len() != s.step.action_ids.len() {
            return Err(format!(
                "workflow step {k} has {} log-probs for {} action ids",
                s.step.logprobs.len(),
                s.step.action_ids.len()
            ));
        }
    }
    Ok(())
}

/// The run's episodes in flight, by id: what a checkpoint saves of them.
#[derive(Debug, Clone, Default)]
pub struct InFlightBoard(Arc<Mutex<BTreeMap<u64, InFlightEpisode>>>);

impl InFlightBoard {
    /// Every record, by episode id.
    pub fn snapshot(&self) -> Vec<InFlightEpisode> {
        self.lock().values().cloned().collect()
    }

    /// Whether no episode in flight has finished a step (only those are on the board).
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub(crate) fn put(&self, record: InFlightEpisode) {
        self.lock().insert(record.episode_id, record);
    }

    pub(crate) fn remove(&self, episode_id: u64) {
        self.lock().remove(&episode_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, InFlightEpisode>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
