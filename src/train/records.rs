//! What a run writes besides checkpoints: batch summaries and the JSON-lines logs
//! (`metrics.jsonl`, one line per update; `eval.jsonl`, one line per evaluation).
//!
//! Both logs are keyed by `step`. After a crash the logs can run ahead of the checkpoint a
//! resume starts from; [`truncate_after`] drops those lines, so each step appears once and
//! the curves stay monotone in the step.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use agent_r1_actors::trajectory::Trajectory;
use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

/// Means over a batch of finished episodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BatchSummary {
    /// Episodes.
    pub episodes: usize,
    /// Episodes that did not complete (errors, time-outs).
    pub failed: usize,
    /// Mean episode reward.
    pub reward_mean: f64,
    /// Mean of each env metric (`em`, `f1`, ...), over all episodes.
    pub metrics: BTreeMap<String, f64>,
    /// Tool calls per episode.
    pub tool_calls_per_episode: f64,
    /// Model turns per episode.
    pub turns_per_episode: f64,
}

impl BatchSummary {
    /// Summarises `trajectories` (all zeros when there are none).
    pub fn of(trajectories: &[Trajectory]) -> Self {
        let n = trajectories.len();
        if n == 0 {
            return Self::default();
        }
        let nf = n as f64;
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for t in trajectories {
            for (k, v) in &t.metrics {
                *metrics.entry(k.clone()).or_default() += v / nf;
            }
        }
        let calls: usize = trajectories
            .iter()
            .flat_map(|t| &t.steps)
            .map(|s| s.tool_calls.len())
            .sum();
        let turns: usize = trajectories.iter().map(|t| t.steps.len()).sum();
        Self {
            episodes: n,
            failed: trajectories.iter().filter(|t| !t.completed()).count(),
            reward_mean: trajectories.iter().map(|t| t.reward).sum::<f64>() / nf,
            metrics,
            tool_calls_per_episode: calls as f64 / nf,
            turns_per_episode: turns as f64 / nf,
        }
    }

    /// A metric's mean, 0 when the env does not report it.
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics.get(name).copied().unwrap_or(0.0)
    }
}

/// Appends one JSON object as a line.
pub fn append_jsonl(path: &Path, value: &Value) -> anyhow::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("{}: cannot open for appending", path.display()))?;
    writeln!(f, "{value}").with_context(|| format!("{}: cannot write", path.display()))
}

/// The lines of a JSON-lines file that parse (a line cut short by a crash is skipped); an
/// absent file is empty.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Rewrites `path` without the lines whose `step` is above `step` (and without unreadable
/// lines); returns how many were dropped.
pub fn truncate_after(path: &Path, step: u64) -> anyhow::Result<usize> {
    if !path.exists() {
        return Ok(0);
    }
    let text =
        fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let total = text.lines().count();
    let kept: Vec<Value> = read_jsonl(path)?
        .into_iter()
        .filter(|v| v.get("step").and_then(Value::as_u64).unwrap_or(u64::MAX) <= step)
        .collect();
    let mut out = String::new();
    for v in &kept {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, out).with_context(|| format!("{}: cannot write", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("{}: cannot replace", path.display()))?;
    Ok(total - kept.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_steps_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        for s in 1..=5u64 {
            append_jsonl(&path, &serde_json::json!({ "step": s })).unwrap();
        }
        fs::write(
            &path,
            fs::read_to_string(&path).unwrap() + "{\"step\": 6, \"cut",
        )
        .unwrap();
        assert_eq!(truncate_after(&path, 3).unwrap(), 3);
        let steps: Vec<u64> = read_jsonl(&path)
            .unwrap()
            .iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
        assert!(read_jsonl(&dir.path().join("absent")).unwrap().is_empty());
    }
}
