//! The index of a trajectories file: one summary line per episode, with the byte range of
//! the episode's line in the data file, written beside it (`X.jsonl` -> `X.idx`).
//!
//! A viewer lists, filters and sorts episodes from the index alone and reads one episode by
//! seeking to its line, so a file of 100,000 episodes is never parsed whole to show a page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{EpisodeEnd, Trajectory};

/// Longest question kept in an index line, in characters (the data file has it whole).
const QUESTION_CHARS: usize = 300;

/// The index file of a trajectories file.
pub fn index_path(data: &Path) -> PathBuf {
    data.with_extension("idx")
}

/// One episode of a trajectories file, as its index line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeSummary {
    /// Byte offset of the episode's line in the data file.
    pub offset: u64,
    /// Length of that line in bytes, without the newline.
    pub bytes: u64,
    /// The episode's id.
    pub episode_id: u64,
    /// Its group.
    pub group_id: u64,
    /// The task's id.
    pub task_id: String,
    /// The question (cut to 300 characters).
    pub question: String,
    /// Final reward.
    pub reward: f64,
    /// The env's metrics.
    pub metrics: BTreeMap<String, f64>,
    /// Model turns.
    pub turns: usize,
    /// Tool calls over all turns.
    pub tool_calls: usize,
    /// Tool calls that failed (did not parse, unknown tool, timed out, errored).
    pub tool_errors: usize,
    /// Tokens the policy generated.
    pub tokens: usize,
    /// `completed` or `failed`.
    pub end: String,
    /// Why it ended (`done`, `max_turns`, ... or the failure).
    pub end_reason: String,
    /// The policy versions that sampled its turns, ascending, each once.
    pub versions: Vec<u64>,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
}

impl EpisodeSummary {
    /// The summary of `t`, whose line spans `bytes` bytes from `offset`.
    pub fn of(t: &Trajectory, offset: u64, bytes: u64) -> Self {
        let (end, end_reason) = match &t.end {
            EpisodeEnd::Completed { reason } => ("completed", reason.clone()),
            EpisodeEnd::Failed { reason } => ("failed", reason.clone()),
        };
        let mut versions: Vec<u64> = t.steps.iter().map(|s| s.policy_version).collect();
        versions.sort_unstable();
        versions.dedup();
        let calls = t.steps.iter().flat_map(|s| &s.tool_calls);
        Self {
            offset,
            bytes,
            episode_id: t.episode_id,
            group_id: t.group_id,
            task_id: t.task.id.clone(),
            question: t.task.question.chars().take(QUESTION_CHARS).collect(),
            reward: t.reward,
            metrics: t.metrics.clone(),
            turns: t.steps.len(),
            tool_calls: calls.clone().count(),
            tool_errors: calls.filter(|c| c.result.is_err()).count(),
            tokens: t.generated_tokens(),
            end: end.into(),
            end_reason,
            versions,
            wall_seconds: t.wall_seconds,
        }
    }
}
