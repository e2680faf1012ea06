//! The deterministic training run the resume tests share (`exact_resume.rs`,
//! `learner_ranks_train.rs`): a fresh tiny model, GAE with the value head on the policy's
//! trunk, mini-batches and two PPO epochs, `rollout.deterministic` and sync mode, so that two
//! runs of it end with the same weights bit for bit; a checkpoint after every update.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Writes the config of `updates` updates, with `extra` (whole sections) appended, to
/// `dir/train.toml`.
pub fn config(dir: &Path, updates: u64, extra: &str) -> PathBuf {
    let text = format!(
        r#"
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 40
test_fraction = 0.2

[tools.search]
top_k = 2

[algorithm]
# GAE with the value head on the policy's trunk: every update changes the weights, even
# while every reward of the untrained model is the same.
estimator = "gae"
critic_warmup_updates = 0
actor_lr = 1e-3
micro_batch_size = 4
mini_batch_size = 8
ppo_epochs = 2

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 4
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 16
max_context_length = 1024
concurrency = 8
deterministic = true

[training]
updates = {updates}
mode = "sync"
seed = 7

[checkpoint]
every = 1
keep_last = 2

[eval]
every = 0

[metrics]
address = "127.0.0.1:0"
{extra}
"#
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The rows of `run`'s `metrics.jsonl`, one per update.
pub fn rows(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The policy weights and the optimizer file of `run`'s checkpoint at `step`.
pub fn final_files(run: &Path, step: u64) -> (Vec<u8>, Vec<u8>) {
    let dir = run.join(format!("checkpoints/step-{step}"));
    (
        std::fs::read(dir.join("policy/model.safetensors")).unwrap(),
        std::fs::read(dir.join("optimizer.safetensors")).unwrap(),
    )
}
