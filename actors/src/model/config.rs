//! `config.json` of a Hugging Face Qwen2/2.5, Qwen3 (dense), Llama 3.x or Mistral checkpoint.
//!
//! Only the fields the architecture needs are typed; the original JSON is kept so that saving
//! writes back every field the user had (generation settings, custom keys) unchanged. Defaults
//! are transformers' own per family (Mistral's `sliding_window` is 4096 when absent, Qwen3's
//! `head_dim` 128), and anything this model does not implement is refused in one line naming
//! the field, its value and what is supported.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, Result};

/// A model family: one `model_type` of transformers and its `*ForCausalLM` class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen2 and Qwen2.5: biased q/k/v projections.
    Qwen2,
    /// Qwen3 (dense): per-head RMSNorm on queries and keys, `head_dim` of its own.
    Qwen3,
    /// Llama 1-3.x, with `llama3` rope scaling for 3.1-3.3.
    Llama,
    /// Mistral: Llama's layers, optionally a sliding window.
    Mistral,
}

impl Family {
    /// Every family, in the order messages list them.
    pub const ALL: [Family; 4] = [Family::Qwen2, Family::Qwen3, Family::Llama, Family::Mistral];

    /// The `model_type` of config.json.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
        }
    }

    /// The transformers class (`architectures` of config.json).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
        }
    }

    fn from_model_type(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.model_type() == name)
    }

    fn list(f: impl Fn(Family) -> &'static str) -> String {
        Self::ALL.map(f).join(", ")
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// Rotary scaling (`rope_parameters.rope_type`, or the older `rope_scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Plain rotary embeddings.
    Default,
    /// Inverse frequencies divided by `factor` (position interpolation).
    Linear {
        /// Divisor of every inverse frequency.
        factor: f64,
    },
    /// Llama 3.1's scaling: low frequencies divided by `factor`, high ones kept, a smooth
    /// blend between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was pretrained for.
        original_max_position_embeddings: usize,
    },
}

/// The rope types this model implements.
const ROPE_TYPES: &str = "default, linear, llama3";

/// Keys that mark a mixture-of-experts config, which this dense model cannot run.
const MOE_KEYS: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
];

/// The typed part of `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The family (`model_type`).
    pub model_type: Family,
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
    /// Rotary scaling.
    pub rope_scaling: RopeScaling,
    /// Longest context the positions were trained for.
    pub max_position_embeddings: usize,
    /// Attention window of sliding-window layers, when the model has any. Contexts up to
    /// the window are exact; longer ones are refused where the served context is set.
    pub sliding_window: Option<usize>,
    /// Whether `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (always on for Qwen2; `attention_bias` for the others).
    pub qkv_bias: bool,
    /// Bias on the output projection (`attention_bias` for Llama and Qwen3).
    pub o_bias: bool,
    /// Bias on the MLP projections (`mlp_bias` for Llama).
    pub mlp_bias: bool,
    /// Per-head RMSNorm of queries and keys before the rotary embedding (Qwen3).
    pub qk_norm: bool,
    /// Beginning-of-sequence id, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (config.json allows one id or a list).
    pub eos_token_ids: Vec<u32>,
}

/// Typed reads of config.json fields, each error naming the field and the value.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn present(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> std::result::Result<usize, String> {
        match self.present(key) {
            Some(v) => positive_int(key, v),
            None => Err(format!("missing field `{key}` (a positive integer)")),
        }
    }

    fn opt_usize(&self, key: &str) -> std::result::Result<Option<usize>, String> {
        self.present(key).map(|v| positive_int(key, v)).transpose()
    }

    fn float(&self, key: &str, default: f64) -> std::result::Result<f64, String> {
        match self.present(key) {
            None => Ok(default),
            Some(v) => positive_float(key, v),
        }
    }

    fn bool(&self, key: &str, default: bool) -> std::result::Result<bool, String> {
        match self.present(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("`{key}` must be true or false, got {v}")),
        }
    }

    fn ids(&self, key: &str) -> std::result::Result<Vec<u32>, String> {
        let bad = |v: &Value| format!("`{key}` must be an integer or a list of integers, got {v}");
        let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.present(key) {
            None => Ok(vec![]),
            Some(Value::Array(ids)) => ids.iter().map(|v| id(v).ok_or_else(|| bad(v))).collect(),
            Some(v) => Ok(vec![id(v).ok_or_else(|| bad(v))?]),
        }
    }
}

fn positive_int(key: &str, v: &Value) -> std::result::Result<usize, String> {
    v.as_u64()
        .filter(|&n| n > 0)
        .map(|n| n as usize)
        .ok_or_else(|| format!("`{key}` must be a positive integer, got {v}"))
}

fn positive_float(key: &str, v: &Value) -> std::result::Result<f64, String> {
    v.as_f64()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("`{key}` must be a positive number, got {v}"))
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
        let f = Fields(obj);
        let supported_types = Family::list(Family::model_type);
        let family = match f.present("model_type") {
            Some(Value::String(name)) => Family::from_model_type(name).ok_or_else(|| {
                format!("unsupported `model_type` \"{name}\" (supported: {supported_types})")
            })?,
            Some(v) => return Err(format!("`model_type` must be a string, got {v}")),
            None => {
                return Err(format!(
                    "missing string field `model_type` (supported: {supported_types})"
                ))
            }
        };
        if let Some(archs) = f.present("architectures") {
            let archs = archs
                .as_array()
                .ok_or_else(|| format!("`architectures` must be a list, got {archs}"))?;
            for arch in archs {
                if arch.as_str() != Some(family.architecture()) {
                    return Err(format!(
                        "unsupported `architectures` entry {arch} for model_type {family} \
                         (supported: {})",
                        family.architecture()
                    ));
                }
            }
        }
        if let Some(key) = MOE_KEYS.iter().find(|k| f.present(k).is_some()) {
            return Err(format!(
                "`{key}` = {} asks for a mixture-of-experts model (supported: dense models)",
                obj[*key]
            ));
        }
        if let Some(act) = f.present("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(format!(
                    "unsupported `hidden_act` {act} (supported: \"silu\")"
                ));
            }
        }

        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let num_key_value_heads = f
            .opt_usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(format!(
                "`num_attention_heads` ({num_attention_heads}) must be a multiple of `num_key_value_heads` ({num_key_value_heads})"
            ));
        }
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None if family == Family::Qwen3 => 128,
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
        let max_position_embeddings =
            f.opt_usize("max_position_embeddings")?
                .unwrap_or(match family {
                    Family::Llama => 2048,
                    Family::Mistral => 131072,
                    Family::Qwen2 | Family::Qwen3 => 32768,
                });
        let (rope_theta, rope_scaling) = rope(&f, max_position_embeddings)?;
        let sliding_window = match family {
            Family::Mistral => match obj.get("sliding_window") {
                None => Some(4096),
                Some(Value::Null) => None,
                Some(v) => Some(positive_int("sliding_window", v)?),
            },
            Family::Qwen2 | Family::Qwen3 => {
                let layers = f.usize("num_hidden_layers")?;
                let slides = f.bool("use_sliding_window", false)?
                    && f.opt_usize("max_window_layers")?.unwrap_or(28) < layers;
                match (slides, f.present("sliding_window")) {
                    (false, _) => None,
                    (true, None) => Some(4096),
                    (true, Some(v)) => Some(positive_int("sliding_window", v)?),
                }
            }
            Family::Llama => None,
        };

        let attention_bias = f.bool("attention_bias", false)?;
        let (qkv_bias, o_bias, mlp_bias) = match family {
            Family::Qwen2 => (true, false, false),
            Family::Qwen3 => (attention_bias, attention_bias, false),
            Family::Llama => (attention_bias, attention_bias, f.bool("mlp_bias", false)?),
            Family::Mistral => (false, false, false),
        };
        let (default_bos, default_eos) = match family {
            Family::Llama | Family::Mistral => (Some(1), vec![2]),
            Family::Qwen2 | Family::Qwen3 => (None, vec![]),
        };
        Ok(Self {
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f.float("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            sliding_window,
            tie_word_embeddings: f.bool("tie_word_embeddings", false)?,
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: family == Family::Qwen3,
            bos_token_id: match obj.get("bos_token_id") {
                None => default_bos,
                Some(_) => f.ids("bos_token_id")?.first().copied(),
            },
            eos_token_ids: match obj.get("eos_token_id") {
                None => default_eos,
                Some(_) => f.ids("eos_token_id")?,
            },
            model_type: family,
        })
    }

    /// Checks that contexts of up to `max_context` tokens run exactly as transformers runs
    /// them: within the sliding window, if the model has one.
    pub fn check_context(&self, max_context: usize) -> std::result::Result<(), String> {
        match self.sliding_window {
            Some(window) if max_context > window => Err(format!(
                "`sliding_window` = {window} in config.json is shorter than the {max_context}-token \
                 context served; sliding-window attention is not implemented (supported: contexts \
                 of at most {window} tokens)"
            )),
            _ => Ok(()),
        }
    }

    /// A `config.json` that `transformers` loads for this architecture.
    ///
    /// `base` is the original JSON when there was one (its other keys are kept).
    pub fn to_json(&self, base: Option<&Value>) -> Value {
        let mut obj = base.and_then(Value::as_object).cloned().unwrap_or_default();
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        set(
            "architectures",
            serde_json::json!([self.model_type.architecture()]),
        );
        set("model_type", self.model_type.model_type().into());
        set("vocab_size", self.vocab_size.into());
        set("hidden_size", self.hidden_size.into());
        set("intermediate_size", self.intermediate_size.into());
        set("num_hidden_layers", self.num_hidden_layers.into());
        set("num_attention_heads", self.num_attention_heads.into());
        set("num_key_value_heads", self.num_key_value_heads.into());
        set("head_dim", self.head_dim.into());
        set("hidden_act", "silu".into());
        set("rms_norm_eps", self.rms_norm_eps.into());
        set(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        set("tie_word_embeddings", self.tie_word_embeddings.into());
        // transformers 5 reads rope settings from `rope_parameters` (and still accepts the
        // older top-level `rope_theta` / `rope_scaling`, which are dropped to leave one truth).
        let mut rope = serde_json::to_value(self.rope_scaling).expect("rope scaling serializes");
        rope["rope_theta"] = self.rope_theta.into();
        set("rope_parameters", rope);
        obj.remove("rope_theta");
        obj.remove("rope_scaling");
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        match self.model_type {
            Family::Llama => {
                set("attention_bias", self.qkv_bias.into());
                set("mlp_bias", self.mlp_bias.into());
            }
            Family::Qwen3 => set("attention_bias", self.qkv_bias.into()),
            Family::Mistral => set(
                "sliding_window",
                self.sliding_window.map_or(Value::Null, Value::from),
            ),
            Family::Qwen2 => {}
        }
        if let Some(bos) = self.bos_token_id {
            set("bos_token_id", bos.into());
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => set("eos_token_id", (*one).into()),
            many => set("eos_token_id", serde_json::json!(many)),
        }
        Value::Object(obj)
    }

    /// Parameters, counting tied matrices once.
    pub fn num_parameters(&self) -> usize {
        let emb = self.vocab_size * self.hidden_size;
        let head = if self.tie_word_embeddings { 0 } else { emb };
        emb + head + self.num_hidden_layers * self.layer_parameters() + self.hidden_size
    }

    /// Parameters of one decoder layer (attention, MLP and its two norms).
    pub fn layer_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let attn = h * q
            + 2 * h * kv
            + q * h
            + if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.o_bias { h } else { 0 }
            + if self.qk_norm { 2 * self.head_dim } else { 0 };
        let mlp = 3 * h * self.intermediate_size
            + if self.mlp_bias {
                2 * self.intermediate_size + h
            } else {
                0
            };
        attn + mlp + 2 * h
    }

    /// Bytes of KV cache per token at `bytes_per_element`.
    pub fn kv_bytes_per_token(&self, bytes_per_element: usize) -> usize {
        self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * bytes_per_element
    }
}

/// The rotary base and scaling, from transformers 5's `rope_parameters` or the older
/// top-level `rope_theta` and `rope_scaling`.
fn rope(
    f: &Fields<'_>,
    max_position_embeddings: usize,
) -> std::result::Result<(f64, RopeScaling), String> {
    let (section, params) = match f.present("rope_parameters") {
        Some(v) => (
            "rope_parameters",
            Some(
                v.as_object()
                    .ok_or_else(|| format!("`rope_parameters` must be an object, got {v}"))?,
            ),
        ),
        None => match f.present("rope_scaling") {
            Some(v) => (
                "rope_scaling",
                Some(
                    v.as_object()
                        .ok_or_else(|| format!("`rope_scaling` must be an object, got {v}"))?,
                ),
            ),
            None => ("rope_scaling", None),
        },
    };
    let p = params.map(Fields);
    let theta = match p.as_ref().and_then(|p| p.present("rope_theta")) {
        Some(v) => positive_float(&format!("{section}.rope_theta"), v)?,
        None => f.float("rope_theta", 10000.0)?,
    };
    let Some(p) = p else {
        return Ok((theta, RopeScaling::Default));
    };
    if let Some(v) = p.present("partial_rotary_factor") {
        if v.as_f64() != Some(1.0) {
            return Err(format!(
                "unsupported `{section}.partial_rotary_factor` {v} (supported: 1.0)"
            ));
        }
    }
    let kind = p.present("rope_type").or_else(|| p.present("type"));
    let kind = match kind {
        None => "default",
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(format!("`{section}.rope_type` must be a string, got {v}")),
    };
    let num = |key: &str| -> std::result::Result<f64, String> {
        let field = format!("{section}.{key}");
        match p.present(key) {
            Some(v) => positive_float(&field, v),
            None => Err(format!("missing field `{field}` for rope type \"{kind}\"")),
        }
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: num("factor")?,
        },
        "llama3" => {
            let (low, high) = (num("low_freq_factor")?, num("high_freq_factor")?);
            if high <= low {
                return Err(format!(
                    "`{section}.high_freq_factor` ({high}) must exceed `low_freq_factor` ({low})"
                ));
            }
            RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: match p
                    .present("original_max_position_embeddings")
                {
                    Some(v) => {
                        positive_int(&format!("{section}.original_max_position_embeddings"), v)?
                    }
                    None => max_position_embeddings,
                },
            }
        }
        other => {
            return Err(format!(
                "unsupported `{section}.rope_type` \"{other}\" (supported: {ROPE_TYPES})"
            ))
        }
    };
    Ok((theta, scaling))
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

    fn llama31() -> Value {
        json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
               "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
               "max_position_embeddings": 131072, "rope_theta": 500000.0,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})
    }

    #[test]
    fn reads_qwen2_with_transformers5_rope_parameters() {
        let c = ModelConfig::from_json(&qwen()).unwrap();
        assert_eq!(c.head_dim, 8);
        assert_eq!(c.rope_theta, 1e6);
        assert!(c.qkv_bias && !c.o_bias && c.tie_word_embeddings && !c.qk_norm);
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        assert_eq!(c.sliding_window, None);
        let back = ModelConfig::from_json(&c.to_json(Some(&qwen()))).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn reads_llama31_rope_scaling_in_both_layouts() {
        let c = ModelConfig::from_json(&llama31()).unwrap();
        let expected = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(c.rope_scaling, expected);
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.bos_token_id, Some(128000));
        assert!(!c.qkv_bias && !c.tie_word_embeddings);
        // Written back in transformers 5's layout, read again the same.
        let json = c.to_json(Some(&llama31()));
        assert!(json.get("rope_scaling").is_none());
        assert_eq!(json["rope_parameters"]["rope_type"], "llama3");
        assert_eq!(ModelConfig::from_json(&json).unwrap(), c);
    }

    #[test]
    fn qwen3_and_mistral_take_transformers_defaults() {
        let mut q3 = qwen();
        q3["model_type"] = json!("qwen3");
        q3["architectures"] = json!(["Qwen3ForCausalLM"]);
        let c = ModelConfig::from_json(&q3).unwrap();
        assert_eq!(c.head_dim, 128, "Qwen3Config's head_dim default");
        assert!(c.qk_norm && !c.qkv_bias && !c.o_bias);

        let mut m = llama31();
        m["model_type"] = json!("mistral");
        m["architectures"] = json!(["MistralForCausalLM"]);
        let c = ModelConfig::from_json(&m).unwrap();
        assert_eq!(
            c.sliding_window,
            Some(4096),
            "MistralConfig's default window"
        );
        assert!(c.check_context(4096).is_ok());
        let e = c.check_context(8192).unwrap_err();
        assert!(
            e.contains("`sliding_window` = 4096") && e.contains("8192"),
            "{e}"
        );
        m["sliding_window"] = Value::Null;
        let c = ModelConfig::from_json(&m).unwrap();
        assert_eq!(c.sliding_window, None);
        assert!(c.check_context(100_000).is_ok());
        assert_eq!(ModelConfig::from_json(&c.to_json(Some(&m))).unwrap(), c);
    }

    #[test]
    fn refusals_name_the_field_the_value_and_what_is_supported() {
        let cases: Vec<(Value, &[&str])> = vec![
            (
                {
                    let mut b = qwen();
                    b["num_key_value_heads"] = json!(3);
                    b
                },
                &["num_key_value_heads"],
            ),
            (
                {
                    let mut b = qwen();
                    b["architectures"] = json!(["MistralForCausalLM"]);
                    b
                },
                &["`architectures`", "MistralForCausalLM", "Qwen2ForCausalLM"],
            ),
            (
                {
                    let mut b = qwen();
                    b["hidden_size"] = json!("big");
                    b
                },
                &["`hidden_size`", "\"big\""],
            ),
            (
                {
                    let mut b = qwen();
                    b["model_type"] = json!("qwen3_moe");
                    b
                },
                &["`model_type`", "qwen3_moe", "qwen2, qwen3, llama, mistral"],
            ),
            (
                {
                    let mut b = qwen();
                    b["num_experts"] = json!(64);
                    b
                },
                &["`num_experts`", "64", "dense"],
            ),
            (
                {
                    let mut b = qwen();
                    b["rope_parameters"]["rope_type"] = json!("yarn");
                    b
                },
                &[
                    "`rope_parameters.rope_type`",
                    "yarn",
                    "default, linear, llama3",
                ],
            ),
            (
                {
                    let mut b = llama31();
                    b["rope_scaling"]["rope_type"] = json!("dynamic");
                    b
                },
                &["`rope_scaling.rope_type`", "dynamic"],
            ),
            (
                {
                    let mut b = llama31();
                    b["rope_scaling"]["factor"] = json!(-1);
                    b
                },
                &["`rope_scaling.factor`", "-1"],
            ),
            (
                {
                    let mut b = qwen();
                    b["hidden_act"] = json!("gelu");
                    b
                },
                &["`hidden_act`", "gelu", "silu"],
            ),
        ];
        for (config, needles) in cases {
            let e = ModelConfig::from_json(&config).unwrap_err();
            assert!(!e.contains('\n'), "one line: {e}");
            for needle in needles {
                assert!(e.contains(needle), "{needle:?} not in {e:?}");
            }
        }
    }

    #[test]
    fn parameter_count_matches_the_shapes() {
        // Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings).
        let c = ModelConfig::from_json(&json!({
            "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "tie_word_embeddings": true
        }))
        .unwrap();
        assert_eq!(c.num_parameters(), 494_032_768);
    }
}
