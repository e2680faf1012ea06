//! Built-in model sizes: the `tiny` preset, and the shapes of real models (`shape`) for
//! benchmarks and memory planning at real sizes without real weights.
//!
//! `tiny` is sized for the 2-core CPU demo: small enough that thousands of decode steps a
//! second are possible at batch 64, large enough to learn the tool-call format and chained
//! search on the synthetic multi-hop world.

use serde_json::json;

use super::config::{Family, ModelConfig, RopeScaling};
use crate::tiny_tokenizer::TokenizerStyle;
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

/// Names of the real model shapes [`shape`] knows.
pub const SHAPES: &[&str] = &[
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen3-1.7b",
    "llama3.2-1b",
    "qwen2.5-7b",
    "llama3.1-8b",
];

/// The `config.json` of a real model's shape (layers, widths, heads, vocabulary, rope) and
/// the tokenizer style of its family, without its weights. Token ids (`bos_token_id`,
/// `eos_token_id`) are left to the tokenizer the caller writes.
pub fn shape(name: &str) -> Result<(ModelConfig, TokenizerStyle)> {
    let (json, style) = match name {
        "qwen2.5-0.5b" => (
            json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
                   "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2, "max_position_embeddings": 32768,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}),
            TokenizerStyle::Qwen2_5,
        ),
        "qwen2.5-1.5b" => (
            json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
                   "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                   "num_key_value_heads": 2, "max_position_embeddings": 32768,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}),
            TokenizerStyle::Qwen2_5,
        ),
        "qwen3-1.7b" => (
            json!({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048,
                   "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
                   "attention_bias": false}),
            TokenizerStyle::Qwen3,
        ),
        "llama3.2-1b" => (
            json!({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
                   "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
                   "rope_scaling": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}}),
            TokenizerStyle::Llama3_1,
        ),
        "qwen2.5-7b" => (
            json!({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
                   "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "max_position_embeddings": 32768,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false}),
            TokenizerStyle::Qwen2_5,
        ),
        "llama3.1-8b" => (
            json!({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
                   "rope_scaling": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}}),
            TokenizerStyle::Llama3_1,
        ),
        other => {
            return Err(Error::invalid(
                "--shape",
                format!("unknown shape `{other}` (allowed: {})", SHAPES.join(", ")),
            ))
        }
    };
    let config = ModelConfig::from_json(&json).map_err(|e| Error::invalid("--shape", e))?;
    Ok((config, style))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_their_published_parameter_counts() {
        // Counts as transformers reports them for the released checkpoints.
        for (name, params) in [
            ("qwen2.5-0.5b", 494_032_768),
            ("qwen2.5-1.5b", 1_543_714_304),
            ("qwen3-1.7b", 1_720_574_976),
            ("llama3.2-1b", 1_235_814_400),
            ("qwen2.5-7b", 7_615_616_512),
            ("llama3.1-8b", 8_030_261_248),
        ] {
            let (config, _) = shape(name).unwrap();
            assert_eq!(config.num_parameters(), params, "{name}");
        }
        assert!(shape("qwen9-1t")
            .unwrap_err()
            .to_string()
            .contains("allowed"));
    }
}
