//! Step-level trajectories, token-in token-out.
//!
//! Each step is one RL transition with its own context: the exact ids the engine was given,
//! and the ids it sampled (`action_ids`). Storage is compact. A step's context is *chained*
//! when it is the previous step's context, action and observation (`observation_ids`: the end
//! of the assistant turn the template adds, tool responses, the next generation prompt; for
//! the first step, the prompt), and then nothing more is stored for it. A context that a
//! context policy or a workflow *rebuilt* (a window of turns, elided tool output, a summary)
//! is stored once, as [`RebuiltContext`]: how many head tokens of the chained context it
//! kept and the ids after them. With the `full` policy every context is chained, and a
//! trajectory is the one token stream it always was. Nothing is re-tokenised, and only
//! `action_ids` are ever attributed to the policy.

pub mod index;
pub mod rows;
#[cfg(test)]
pub(crate) mod test_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use agent_r1_envs::task::Task;
use agent_r1_envs::tool::CallOutcome;

use crate::model::generate::FinishReason;
use crate::tokenizer::HfTokenizer;
use crate::{Error, Result};

/// One interaction step: one RL transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Length of the context the model saw, as a prefix of the trajectory's token stream.
    pub context_len: usize,
    /// Tokens the policy sampled.
    pub action_ids: Vec<u32>,
    /// Their sampling log-probabilities.
    pub logprobs: Vec<f32>,
    /// Weights version when the turn was admitted: the oldest version that sampled any of
    /// its tokens.
    pub policy_version: u64,
    /// The version that sampled each action token, when they differ (weights were swapped
    /// while the turn decoded: a partial rollout); empty when every token has
    /// `policy_version`. Read it through [`Step::token_version`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_versions: Vec<u64>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Tool calls made in this step and their outcomes.
    pub tool_calls: Vec<CallOutcome>,
    /// Tokens appended after the action (template, observations, next prompt); never trained on.
    pub observation_ids: Vec<u32>,
    /// Process reward of this step (tool and env rewards).
    pub reward: f64,
    /// Seconds waiting for the engine (queue + generation).
    pub generate_seconds: f64,
    /// Seconds running tools.
    pub tool_seconds: f64,
    /// Context tokens the engine prefilled for this step (the rest were reused).
    pub prefill_tokens: usize,
    /// Set when this step's context is not the chained one (see the module documentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt: Option<RebuiltContext>,
}

/// A step's context that is not the previous step's context, action and observation: its
/// chained context's first `kept` tokens, then `ids`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RebuiltContext {
    /// Head tokens kept from the chained context (the engine's KV for them is reused).
    pub kept: usize,
    /// The ids after the kept head.
    pub ids: Vec<u32>,
    /// Tokens of the chained context left out.
    pub dropped: usize,
    /// What rebuilt it: the context policy (`window`, `elide`, `summary`) or a workflow.
    pub by: String,
}

impl RebuiltContext {
    /// The rebuilt form of `context` against the `chained` context it replaces.
    pub fn between(chained: &[u32], context: &[u32], by: impl Into<String>) -> Self {
        let kept = common_prefix(chained, context);
        Self {
            kept,
            ids: context[kept..].to_vec(),
            dropped: chained.len() - kept,
            by: by.into(),
        }
    }

    /// The context it stands for, given the chained context it replaced.
    pub fn apply(&self, chained: &[u32]) -> Vec<u32> {
        let mut ids = chained[..self.kept.min(chained.len())].to_vec();
        ids.extend(&self.ids);
        ids
    }
}

/// How many leading ids two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Step {
    /// The stored form of per-token versions: empty when all equal `policy_version`.
    pub fn compact_versions(policy_version: u64, versions: Vec<u64>) -> Vec<u64> {
        if versions.iter().all(|&v| v == policy_version) {
            vec![]
        } else {
            versions
        }
    }

    /// The weights version that sampled action token `i`.
    pub fn token_version(&self, i: usize) -> u64 {
        self.token_versions
            .get(i)
            .copied()
            .unwrap_or(self.policy_version)
    }

    /// The distinct versions that sampled this step's tokens, oldest first.
    pub fn versions(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (0..self.action_ids.len())
            .map(|i| self.token_version(i))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// How an episode ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum EpisodeEnd {
    /// The env said done, or a limit (turns, context) was reached.
    Completed {
        /// `done`, `max_turns` or `max_context`.
        reason: String,
    },
    /// The episode failed and will not be retried.
    Failed {
        /// What went wrong.
        reason: String,
    },
}

/// A finished episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Unique episode id.
    pub episode_id: u64,
    /// Episodes of the same task in one batch share a group (for group-based estimators).
    pub group_id: u64,
    /// The task.
    pub task: Task,
    /// The prompt's token ids (the chat template's rendering of the env's first messages).
    pub prompt_ids: Vec<u32>,
    /// Interaction steps.
    pub steps: Vec<Step>,
    /// Final (outcome) reward.
    pub reward: f64,
    /// Named metrics from the env's score.
    pub metrics: BTreeMap<String, f64>,
    /// How it ended.
    pub end: EpisodeEnd,
    /// Attempts it took (2 when re-queued once).
    pub attempts: u32,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
}

impl Trajectory {
    /// The full history: prompt, then each step's action and observation ids. With no rebuilt
    /// context this is every step's context and action in one stream (the `full` policy);
    /// otherwise it is what the `full` policy would have given.
    pub fn token_stream(&self) -> Vec<u32> {
        let mut ids = self.prompt_ids.clone();
        for s in &self.steps {
            ids.extend(&s.action_ids);
            ids.extend(&s.observation_ids);
        }
        ids
    }

    /// Per token of [`Trajectory::token_stream`]: whether the policy produced it.
    pub fn action_mask(&self) -> Vec<bool> {
        let mut mask = vec![false; self.prompt_ids.len()];
        for s in &self.steps {
            mask.extend(std::iter::repeat_n(true, s.action_ids.len()));
            mask.extend(std::iter::repeat_n(false, s.observation_ids.len()));
        }
        mask
    }

    /// The context step `k` was generated from.
    pub fn context(&self, k: usize) -> Vec<u32> {
        self.contexts().nth(k).unwrap_or_default()
    }

    /// Each step's context, in order (built incrementally: one pass over the steps).
    pub fn contexts(&self) -> impl Iterator<Item = Vec<u32>> + '_ {
        let mut chained = self.prompt_ids.clone();
        self.steps.iter().map(move |s| {
            let context = match &s.rebuilt {
                Some(r) => r.apply(&chained),
                None => std::mem::take(&mut chained),
            };
            chained = context.clone();
            chained.extend(&s.action_ids);
            chained.extend(&s.observation_ids);
            context
        })
    }

    /// Steps whose context was rebuilt.
    pub fn rebuilt_steps(&self) -> usize {
        self.steps.iter().filter(|s| s.rebuilt.is_some()).count()
    }

    /// Checks that the stored form is consistent: each rebuilt context keeps no more than its
    /// chained context has, and each step's `context_len` is its context's length. A
    /// trajectory from another program (a file, the cluster's wire) is checked before it is
    /// trained on.
    pub fn check_contexts(&self) -> Result<()> {
        let mut chained = self.prompt_ids.len();
        for (k, s) in self.steps.iter().enumerate() {
            let len = match &s.rebuilt {
                Some(r) if r.kept > chained => {
                    return Err(Error::invalid(
                        format!("trajectory {} step {k}", self.episode_id),
                        format!("keeps {} tokens of a chained context of {chained}", r.kept),
                    ))
                }
                Some(r) => r.kept + r.ids.len(),
                None => chained,
            };
            if len != s.context_len {
                return Err(Error::invalid(
                    format!("trajectory {} step {k}", self.episode_id),
                    format!(
                        "says its context has {} tokens; it has {len}",
                        s.context_len
                    ),
                ));
            }
            chained = len + s.action_ids.len() + s.observation_ids.len();
        }
        Ok(())
    }

    /// Tokens generated over all steps.
    pub fn generated_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.action_ids.len()).sum()
    }

    /// The episode's return: its outcome reward plus its steps' own rewards.
    pub fn episode_return(&self) -> f64 {
        self.reward + self.steps.iter().map(|s| s.reward).sum::<f64>()
    }

    /// Whether it completed (as opposed to failed).
    pub fn completed(&self) -> bool {
        matches!(self.end, EpisodeEnd::Completed { .. })
    }
}

/// Writes trajectories as JSON lines, with decoded text beside the ids, and their index
/// ([`index::EpisodeSummary`] lines in [`index::index_path`]).
pub struct TrajectoryWriter {
    out: std::io::BufWriter<std::fs::File>,
    index: std::io::BufWriter<std::fs::File>,
    offset: u64,
    tokenizer: Option<std::sync::Arc<HfTokenizer>>,
    path: std::path::PathBuf,
}

impl TrajectoryWriter {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path, tokenizer: Option<std::sync::Arc<HfTokenizer>>) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let index_path = index::index_path(path);
        let index_file =
            std::fs::File::create(&index_path).map_err(|e| Error::io(&index_path, e))?;
        Ok(Self {
            out: std::io::BufWriter::new(file),
            index: std::io::BufWriter::new(index_file),
            offset: 0,
            tokenizer,
            path: path.to_path_buf(),
        })
    }

    /// Appends one trajectory.
    pub fn write(&mut self, t: &Trajectory) -> Result<()> {
        let mut value = serde_json::to_value(t).map_err(|e| Error::Other(e.to_string()))?;
        if let Some(tok) = &self.tokenizer {
            value["prompt_text"] = tok.decode(&t.prompt_ids, false)?.into();
            if let Some(steps) = value["steps"].as_array_mut() {
                for (s, json) in t.steps.iter().zip(steps) {
                    json["action_text"] = tok.decode(&s.action_ids, false)?.into();
                    json["observation_text"] = tok.decode(&s.observation_ids, false)?.into();
                }
            }
        }
        let line = serde_json::to_string(&value).map_err(|e| Error::Other(e.to_string()))?;
        writeln!(self.out, "{line}").map_err(|e| Error::io(&self.path, e))?;
        let summary = index::EpisodeSummary::of(t, self.offset, line.len() as u64);
        self.offset += line.len() as u64 + 1;
        let entry = serde_json::to_string(&summary).map_err(|e| Error::Other(e.to_string()))?;
        writeln!(self.index, "{entry}").map_err(|e| Error::io(&self.path, e))
    }

    /// Flushes to disk, the data file first.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        self.index.flush().map_err(|e| Error::io(&self.path, e))
    }
}
