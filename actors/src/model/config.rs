//! `config.json` of a Hugging Face Qwen2 / Llama checkpoint.
//!
//! Only the fields the architecture needs are typed; the original JSON is kept so that saving
//! writes back every field the user had (generation settings, custom keys) unchanged.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// Architectures this model implements (the `architectures` / `model_type` of config.json).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["Qwen2ForCausalLM", "LlamaForCausalLM"];

/// The typed part of `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `qwen2` or `llama`.
    pub model_type: String,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Per-head width (hidden_size / heads unless the config says otherwise).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary base.
    pub rope_theta: f64,
    /// Longest context the positions were trained for.
    pub max_position_embeddings: usize,
    /// Whether `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (always on for Qwen2; `attention_bias` for Llama).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` for Llama; off for Qwen2).
    pub o_bias: bool,
    /// Bias on the MLP projections (`mlp_bias` for Llama).
    pub mlp_bias: bool,
    /// Beginning-of-sequence id, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (config.json allows one id or a list).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads and checks `config.json`, naming the file and field in every error.
    pub fn from_file(path: &Path) -> Result<(Self, Value)> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let raw: Value = serde_json::from_str(&text)
            .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
        let config = Self::from_json(&raw).map_err(|msg| Error::model(path, msg))?;
        Ok((config, raw))
    }

    /// Interprets a parsed `config.json`; the error is the message without the path.
    pub fn from_json(raw: &Value) -> std::result::Result<Self, String> {
        let obj = raw
            .as_object()
            .ok_or_else(|| "expected a JSON object".to_string())?;
        let model_type = obj
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or("missing string field `model_type` (supported: qwen2, llama)")?
            .to_string();
        if model_type != "qwen2" && model_type != "llama" {
            return Err(format!(
                "unsupported `model_type` \"{model_type}\" (supported: qwen2, llama)"
            ));
        }
        if let Some(archs) = obj.get("architectures").and_then(Value::as_array) {
            for arch in archs {
                let arch = arch.as_str().unwrap_or_default();
                if !SUPPORTED_ARCHITECTURES.contains(&arch) {
                    return Err(format!(
                        "unsupported architecture \"{arch}\" in `architectures` (supported: {})",
                        SUPPORTED_ARCHITECTURES.join(", ")
                    ));
                }
            }
        }
        let usize_field = |key: &str| -> std::result::Result<usize, String> {
            match obj.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| format!("`{key}` must be a positive integer, got {v}")),
                None => Err(format!("missing field `{key}`")),
            }
        };
        let opt_usize = |key: &str| -> std::result::Result<Option<usize>, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(_) => usize_field(key).map(Some),
            }
        };
        let float_field = |key: &str, default: f64| -> std::result::Result<f64, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| format!("`{key}` must be a positive number, got {v}")),
            }
        };
        let bool_field = |key: &str, default: bool| -> std::result::Result<bool, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| format!("`{key}` must be true or false, got {v}")),
            }
        };

        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        let num_key_value_heads = opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(format!(
                "`num_attention_heads` ({num_attention_heads}) must be a multiple of `num_key_value_heads` ({num_key_value_heads})"
            ));
        }
        let head_dim = match opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(format!(
                    "`hidden_size` ({hidden_size}) is not a multiple of `num_attention_heads` ({num_attention_heads}) and no `head_dim` is given"
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(format!(
                "`head_dim` must be even for rotary embeddings, got {head_dim}"
            ));
        }
        if let Some(act) = obj.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(format!(
                    "unsupported `hidden_act` \"{act}\" (supported: silu)"
                ));
            }
        }
        // transformers 5 moved rope settings into `rope_parameters`; older configs have
        // `rope_theta` and `rope_scaling` at the top level.
        let rope = obj.get("rope_parameters").and_then(Value::as_object);
        let rope_theta = match rope.and_then(|r| r.get("rope_theta")) {
            Some(v) => v
                .as_f64()
                .filter(|x| *x > 0.0)
                .ok_or_else(|| format!("`rope_parameters.rope_theta` must be positive, got {v}"))?,
            None => float_field("rope_theta", 10000.0)?,
        };
        let rope_type = rope
            .and_then(|r| r.get("rope_type"))
            .or_else(|| {
                obj.get("rope_scaling")
                    .and_then(|s| s.get("rope_type").or(s.get("type")))
            })
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(format!(
                "unsupported rope scaling type \"{rope_type}\" (supported: default)"
            ));
        }
        if bool_field("use_sliding_window", false)? {
            return Err("`use_sliding_window: true` is not supported".into());
        }
        let is_qwen2 = model_type == "qwen2";
        let attention_bias = bool_field("attention_bias", false)?;
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| v.as_u64().map(|n| n as u32))
                .collect::<Option<Vec<_>>>()
                .ok_or("`eos_token_id` must be an integer or a list of integers")?,
            Some(v) => vec![v
                .as_u64()
                .ok_or("`eos_token_id` must be an integer or a list of integers")?
                as u32],
        };
        Ok(Self {
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: float_field("rms_norm_eps", 1e-6)?,
            rope_theta,
            max_position_embeddings: opt_usize("max_position_embeddings")?.unwrap_or(32768),
            tie_word_embeddings: bool_field("tie_word_embeddings", is_qwen2)?,
            qkv_bias: is_qwen2 || attention_bias,
            o_bias: !is_qwen2 && attention_bias,
            mlp_bias: !is_qwen2 && bool_field("mlp_bias", false)?,
            bos_token_id: obj
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|n| n as u32),
            eos_token_ids,
            model_type,
        })
    }

    /// A `config.json` that `transformers` loads for this architecture.
    ///
    /// `base` is the original JSON when there was one (its other keys are kept).
    pub fn to_json(&self, base: Option<&Value>) -> Value {
        let mut obj = base.and_then(Value::as_object).cloned().unwrap_or_default();
        let arch = if self.model_type == "qwen2" {
            "Qwen2ForCausalLM"
        } else {
            "LlamaForCausalLM"
        };
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        set("architectures", serde_json::json!([arch]));
        set("model_type", self.model_type.clone().into());
        set("vocab_size", self.vocab_size.into());
        set("hidden_size", self.hidden_size.into());
        set("intermediate_size", self.intermediate_size.into());
        set("num_hidden_layers", self.num_hidden_layers.into());
        set("num_attention_heads", self.num_attention_heads.into());
        set("num_key_value_heads", self.num_key_value_heads.into());
        set("head_dim", self.head_dim.into());
        set("hidden_act", "silu".into());
        set("rms_norm_eps", self.rms_norm_eps.into());
        set("rope_theta", self.rope_theta.into());
        set(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        set("tie_word_embeddings", self.tie_word_embeddings.into());
        if self.model_type == "llama" {
            set("attention_bias", self.qkv_bias.into());
            set("mlp_bias", self.mlp_bias.into());
        }
        if let Some(bos) = self.bos_token_id {
            set("bos_token_id", bos.into());
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => set("eos_token_id", (*one).into()),
            many => set("eos_token_id", serde_json::json!(many)),
        }
        set("torch_dtype", "float32".into());
        Value::Object(obj)
    }

    /// Parameters, counting tied matrices once.
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let attn = h * q + 2 * h * kv + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
        let mlp = 3 * h * self.intermediate_size;
        let layer = attn + mlp + 2 * h;
        let emb = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { emb };
        emb + head + self.num_hidden_layers * layer + h
    }

    /// Bytes of KV cache per token at `bytes_per_element`.
    pub fn kv_bytes_per_token(&self, bytes_per_element: usize) -> usize {
        self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * bytes_per_element
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen() -> Value {
        json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 100,
               "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
               "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
               "tie_word_embeddings": true, "eos_token_id": [1, 2]})
    }

    #[test]
    fn reads_qwen2_with_transformers5_rope_parameters() {
        let c = ModelConfig::from_json(&qwen()).unwrap();
        assert_eq!(c.head_dim, 8);
        assert_eq!(c.rope_theta, 1e6);
        assert!(c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        let back = ModelConfig::from_json(&c.to_json(Some(&qwen()))).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn errors_name_the_field() {
        let mut bad = qwen();
        bad["num_key_value_heads"] = json!(3);
        let e = ModelConfig::from_json(&bad).unwrap_err();
        assert!(e.contains("num_key_value_heads"), "{e}");
        let mut bad = qwen();
        bad["architectures"] = json!(["MistralForCausalLM"]);
        assert!(ModelConfig::from_json(&bad)
            .unwrap_err()
            .contains("MistralForCausalLM"));
        let mut bad = qwen();
        bad["hidden_size"] = json!("big");
        assert!(ModelConfig::from_json(&bad)
            .unwrap_err()
            .contains("`hidden_size`"));
        let mut bad = qwen();
        bad["model_type"] = json!("gpt2");
        assert!(ModelConfig::from_json(&bad).unwrap_err().contains("gpt2"));
    }
}
