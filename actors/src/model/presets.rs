//! Built-in model sizes.
//!
//! `tiny` is sized for the 2-core CPU demo: small enough that thousands of decode steps a
//! second are possible at batch 64, large enough to learn the tool-call format and chained
//! search on the synthetic multi-hop world.

use super::config::{Family, ModelConfig, RopeScaling};
use crate::{Error, Result};

/// Names of the presets `preset` accepts.
pub const PRESETS: &[&str] = &["tiny"];

/// The config of a preset for a tokenizer of `vocab_size` tokens and these end ids.
pub fn preset(name: &str, vocab_size: usize, eos_token_ids: Vec<u32>) -> Result<ModelConfig> {
    match name {
        "tiny" => Ok(ModelConfig {
            model_type: Family::Qwen2,
            // A multiple of 64 keeps the embedding matmul aligned; ids past the tokenizer's
            // vocabulary are never produced by it and are learnt away quickly.
            vocab_size: vocab_size.div_ceil(64) * 64,
            hidden_size: 128,
            intermediate_size: 384,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 4096,
            sliding_window: None,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: false,
            mlp_bias: false,
            qk_norm: false,
            bos_token_id: None,
            eos_token_ids,
        }),
        other => Err(Error::invalid(
            "--preset",
            format!("unknown preset `{other}` (allowed: {})", PRESETS.join(", ")),
        )),
    }
}
