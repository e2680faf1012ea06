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
