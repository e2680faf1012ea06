//! The task the learning tests share: each prompt `[BOS, Q, 4 + k]` (k in 0..4) has one
//! right answer token, `8 + k`, out of a 16-token vocabulary; and the tiny model that learns
//! it.
#![allow(dead_code)]

use agent_r1_actors::model::ModelConfig;
use agent_r1_actors::trajectory::{EpisodeEnd, Step, Trajectory};
use agent_r1_envs::task::Task;

pub const VOCAB: i64 = 16;
pub const PROMPTS: u32 = 4;

/// Two layers, 32 wide, over the task's vocabulary.
pub fn model_config(tied: bool) -> ModelConfig {
    ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": tied
    }))
    .unwrap()
}

pub fn prompt(k: u32) -> Vec<u32> {
    vec![1, 2, 4 + k]
}

pub fn target(k: u32) -> u32 {
    8 + k
}

/// A completed trajectory of prompt `k` with `steps`, rewarded `reward`.
pub fn trajectory(id: u64, group: u64, k: u32, steps: Vec<Step>, reward: f64) -> Trajectory {
    Trajectory {
        episode_id: id,
        group_id: group,
        task: Task {
            id: format!("pick-{k}"),
            data_source: "bandit".into(),
            question: format!("pick the answer for {k}"),
            answers: vec![target(k).to_string()],
            prompt: None,
            extra: serde_json::Value::Null,
        },
        prompt_ids: prompt(k),
        steps,
        reward,
        metrics: Default::default(),
        end: EpisodeEnd::Completed {
            reason: "done".into(),
        },
        attempts: 1,
        wall_seconds: 0.0,
    }
}
