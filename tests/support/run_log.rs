//! Reading what `agent-r1 train` leaves in its run directory, and running it as a user
//! would.
// Each test file uses its own share of these.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The rows of a JSON-lines file (`metrics.jsonl`, `rollouts/*.jsonl`).
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The mean of `reward_mean` over `rows` of `metrics.jsonl`.
pub fn mean_reward(rows: &[Value]) -> f64 {
    rows.iter()
        .map(|r| r["reward_mean"].as_f64().unwrap())
        .sum::<f64>()
        / rows.len() as f64
}

/// `agent-r1 train --config CONFIG --out OUT`, run in `root` with warnings logged.
pub fn train(root: &str, config: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["train", "--config"])
        .arg(config)
        .arg("--out")
        .arg(out)
        .current_dir(root)
        .env("AGENT_R1_LOG", "warn")
        .output()
        .unwrap()
}

/// Asserts that `reward_mean` rose: under 0.2 over the first three rows of `metrics.jsonl`
/// and more than 0.5 above that over the last three.
pub fn assert_reward_rose(rows: &[Value], what: &str) {
    let (first, last) = (
        mean_reward(&rows[..3]),
        mean_reward(&rows[rows.len() - 3..]),
    );
    assert!(
        first < 0.2 && last > first + 0.5,
        "{what} rose from {first:.3} to only {last:.3}"
    );
}

/// [`jsonl`], or nothing where the file does not exist (yet).
pub fn jsonl_if_any(path: &Path) -> Vec<Value> {
    if path.exists() {
        jsonl(path)
    } else {
        vec![]
    }
}

/// What checkpoint `step` of `run` holds of its open groups: (groups, finished episodes,
/// episodes in flight that finished a step and had not finished by the write).
pub fn open_groups_held(run: &Path, step: u64) -> (usize, usize, usize) {
    let c = run.join(format!("checkpoints/step-{step}"));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("manifest.json")).unwrap()).unwrap();
    let open: Vec<u64> = manifest["state"]["requeue_positions"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
        .unwrap_or_default();
    let of_open = |file: &str| -> Vec<Value> {
        jsonl_if_any(&c.join(file))
            .into_iter()
            .filter(|t| open.contains(&t["group_id"].as_u64().unwrap()))
            .collect()
    };
    let finished = of_open("pending_trajectories.jsonl");
    // An episode that finished while the checkpoint was written is in both; its trajectory
    // wins.
    let continued = of_open("in_flight_episodes.jsonl")
        .iter()
        .filter(|r| !finished.iter().any(|t| t["episode_id"] == r["episode_id"]))
        .count();
    (open.len(), finished.len(), continued)
}

/// The line a resume prints for `open` groups of `group_size` of which `finished` episodes
/// come back from the checkpoint and `continued` from their last finished step.
pub fn resume_line(open: usize, group_size: usize, finished: usize, continued: usize) -> String {
    format!(
        "resuming {open} groups in flight at the checkpoint: {finished} episodes restored, \
         {continued} continued from their last finished step, {} sampled from the start",
        open * group_size - finished - continued
    )
}
