//! The tiny random model the engine tests share, and their runtime.
#![allow(dead_code)]

use std::path::Path;

use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel};

/// Two layers, 96 tokens, 32 wide.
pub fn tiny_config() -> ModelConfig {
    ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap()
}

/// A random model with large enough weights that greedy outputs vary from step to step,
/// saved in `dir`.
pub fn make_model(dir: &Path) {
    tch::manual_seed(11);
    let model = PolicyModel::new(tiny_config(), Placement::default(), false).unwrap();
    tch::no_grad(|| {
        for (_, mut t) in model.var_store().variables() {
            let noise = t.randn_like() * 0.4;
            t.copy_(&(&t + noise));
        }
    });
    model.save(dir, None).unwrap();
}

/// A two-thread runtime, as the tests' callers run on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
