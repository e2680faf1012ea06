//! The policy model: a decoder-only transformer compatible with Hugging Face Qwen2/2.5,
//! Qwen3 (dense), Llama 3.x and Mistral checkpoints (see [`config::Family`]), with a KV cache
//! for incremental decoding and an optional value head.
//!
//! One type serves the inference engine (no-grad decoding with a cache), the learner
//! (full-sequence forward with grad) and the critic (the same trunk read through the value
//! head). It holds tensors, so it is `Send` but not `Sync`: it lives on one OS thread.

pub mod config;
pub mod generate;
pub mod kv_cache;
pub mod layer_gate;
mod layers;
pub mod lora;
pub mod presets;
pub mod recompute;
pub mod sampling;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tch::nn::{self, Module, VarStore};
use tch::{Device, Kind, Tensor};

pub use config::ModelConfig;
pub use kv_cache::{KeyLengths, KvCache, KvStore};
pub use layer_gate::LayerGate;
pub use lora::{LoraConfig, TargetModules};
pub use recompute::LayerCheckpoints;
pub use sampling::SamplingParams;

use crate::{Error, Result};
use layers::{attention_bias, AttnMask, DecoderLayer, RmsNorm, Rotary};

/// Name prefix of the value head's weights (`value_head.weight`, `value_head.bias`).
pub const VALUE_HEAD: &str = "value_head";

/// Tokenizer and generation files copied beside the weights when saving.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// Where the model's tensors live and in which precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    /// CPU or a CUDA device.
    pub device: Device,
    /// Float32 on CPU; bfloat16 allowed on CUDA.
    pub kind: Kind,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            kind: Kind::Float,
        }
    }
}

/// The decoder, its weights and its config.
#[derive(Debug)]
pub struct PolicyModel {
    vs: VarStore,
    config: ModelConfig,
    raw_config: Value,
    placement: Placement,
    embed_tokens: nn::Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<nn::Linear>,
    value_head: Option<nn::Linear>,
    rotary: Rotary,
    /// Precision of the residual stream in training passes (`forward_right_padded`,
    /// `forward_checkpointed`): the weights' by default, float32 for a learner in bfloat16.
    residual: Kind,
    /// The attached LoRA adapters' settings (the base is then frozen).
    lora: Option<LoraConfig>,
    /// Training passes (adapter dropout on) and adapters off, read by the adapters.
    lora_switches: Arc<lora::LoraSwitches>,
    /// The directory the weights were loaded from (an adapter's `base_model_name_or_path`).
    base_dir: Option<PathBuf>,
    /// Called around each layer of the training passes (a learner rank sharding parameters).
    layer_gate: Option<Arc<dyn LayerGate>>,
}

/// How a fresh model's weights (and a value head a checkpoint lacks) are drawn.
const RANDOM_INIT: nn::Init = nn::Init::Randn {
    mean: 0.0,
    stdev: 0.02,
};

/// Where a model's weights come from, which decides how its variables are created.
#[derive(Clone, Copy, PartialEq)]
enum Weights {
    /// Drawn at random, in float32 and then converted to the model's precision: libtorch
    /// draws bfloat16 normals on CPU several times slower than float32 ones.
    Fresh,
    /// Read from a checkpoint, which overwrites every variable but a value head it lacks:
    /// created as zeros in the model's precision (no random draws, and no float32 copy that
    /// would take twice a bfloat16 model's memory while it loads).
    Loaded,
}

/// Writes `dir/config.json` for weights stored as `kind`: `config` over `raw` (the keys of the
/// file it was read from, kept), with `dtype` naming the stored precision.
pub fn write_config(
    dir: &Path,
    config: &ModelConfig,
    raw: Option<&Value>,
    kind: Kind,
) -> Result<()> {
    let (_, dtype) = weights::dtype_name(kind)?;
    let path = dir.join("config.json");
    let mut json = config.to_json(raw);
    if let Some(obj) = json.as_object_mut() {
        obj.remove("torch_dtype");
        obj.insert("dtype".into(), dtype.into());
    }
    let text =
        serde_json::to_string_pretty(&json).map_err(|e| Error::model(&path, e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

impl PolicyModel {
    /// A freshly initialised model (normal(0, 0.02) weights, as transformers initialises).
    pub fn new(config: ModelConfig, placement: Placement, value_head: bool) -> Result<Self> {
        let raw = config.to_json(None);
        Self::build(config, raw, placement, value_head, Weights::Fresh)
    }

    fn build(
        config: ModelConfig,
        raw_config: Value,
        placement: Placement,
        value_head: bool,
        weights: Weights,
    ) -> Result<Self> {
        if placement.device == Device::Cpu
            && !matches!(placement.kind, Kind::Float | Kind::BFloat16)
        {
            return Err(Error::invalid(
                "dtype",
                format!(
                    "{:?} is not supported on CPU (supported: float32, bfloat16)",
                    placement.kind
                ),
            ));
        }
        let mut vs = VarStore::new(placement.device);
        let init = match weights {
            Weights::Fresh => RANDOM_INIT,
            Weights::Loaded => {
                vs.set_kind(placement.kind);
                nn::Init::Const(0.0)
            }
        };
        let root = vs.root();
        let model = &root / "model";
        let h = config.hidden_size as i64;
        let embed_tokens = nn::embedding(
            &model / "embed_tokens",
            config.vocab_size as i64,
            h,
            nn::EmbeddingConfig {
                ws_init: init,
                ..Default::default()
            },
        );
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::new(&model / "layers" / i, &config, init))
            .collect();
        let norm = RmsNorm::new(&model / "norm", h, config.rms_norm_eps);
        let lm_head = (!config.tie_word_embeddings).then(|| {
            nn::linear(
                &root / "lm_head",
                h,
                config.vocab_size as i64,
                nn::LinearConfig {
                    ws_init: init,
                    bs_init: None,
                    bias: false,
                },
            )
        });
        let value_head = value_head.then(|| {
            nn::linear(
                &root / VALUE_HEAD,
                h,
                1,
                nn::LinearConfig {
                    ws_init: RANDOM_INIT,
                    bs_init: Some(nn::Init::Const(0.0)),
                    bias: true,
                },
            )
        });
        if vs.kind() != placement.kind {
            vs.set_kind(placement.kind);
        }
        let rotary = Rotary::new(&config, placement.device);
        Ok(Self {
            vs,
            config,
            raw_config,
            placement,
            embed_tokens,
            layers,
            norm,
            lm_head,
            value_head,
            rotary,
            residual: placement.kind,
            lora: None,
            lora_switches: Arc::default(),
            base_dir: None,
            layer_gate: None,
        })
    }

    /// Loads a Hugging Face model directory (`config.json` + safetensors weights).
    ///
    /// With `value_head`, a value head is attached: read from the checkpoint when it has one
    /// (a critic saved by agent-r1), freshly initialised otherwise.
    pub fn load(dir: &Path, placement: Placement, value_head: bool) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::model(dir, "model directory not found"));
        }
        let (config, raw) = ModelConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::build(config, raw, placement, value_head, Weights::Loaded)?;
        let tied = model.config.tie_word_embeddings;
        let allow_unused = |name: &str| {
            (tied && name == "lm_head.weight") || (!value_head && name.starts_with(VALUE_HEAD))
        };
        weights::load_into(&mut model.vs, dir, &[VALUE_HEAD], &allow_unused)?;
        model.base_dir = Some(dir.to_path_buf());
        Ok(model)
    }

    /// Writes a Hugging Face directory that `transformers` loads: `config.json`, the
    /// weights in the model's own precision (`model.safetensors`, sharded past
    /// [`weights::MAX_SHARD_BYTES`]), and the tokenizer files copied from `tokenizer_from` if
    /// given.
    ///
    /// With LoRA adapters attached it writes the adapter instead, in PEFT's format
    /// ([`PolicyModel::save_adapter`]), as PEFT's `save_pretrained` does;
    /// [`PolicyModel::save_merged`] writes the merged model.
    pub fn save(&self, dir: &Path, tokenizer_from: Option<&Path>) -> Result<()> {
        if self.lora.is_some() {
            return self.save_adapter(dir);
        }
        self.save_as(dir, tokenizer_from, self.placement.kind)
    }

    /// [`PolicyModel::save`] with the weights stored as `kind` (float32, bfloat16 or
    /// float16), as checkpoints on the hub usually are in bfloat16.
    pub fn save_as(&self, dir: &Path, tokenizer_from: Option<&Path>, kind: Kind) -> Result<()> {
        weights::dtype_name(kind)?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tensors = self.merged_weights();
        weights::save_weights(dir, &tensors, kind, weights::MAX_SHARD_BYTES)?;
        write_config(dir, &self.config, Some(&self.raw_config), kind)?;
        if let Some(src) = tokenizer_from {
            if src != dir {
                for name in TOKENIZER_FILES {
                    let from = src.join(name);
                    if from.is_file() {
                        std::fs::copy(&from, dir.join(name)).map_err(|e| Error::io(&from, e))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The precision the loaded directory's `config.json` says its weights are stored in
    /// (`dtype`, as [`write_config`] writes it, or transformers' older `torch_dtype`);
    /// float32 when it names none this crate saves.
    pub fn stored_kind(&self) -> Kind {
        let name = self
            .raw_config
            .get("dtype")
            .or_else(|| self.raw_config.get("torch_dtype"))
            .and_then(|v| v.as_str());
        [Kind::BFloat16, Kind::Half]
            .into_iter()
            .find(|&k| weights::dtype_name(k).is_ok_and(|(_, n)| Some(n) == name))
            .unwrap_or(Kind::Float)
    }

    /// Device and precision.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Bytes of the weights as loaded (every variable, in its own precision).
    pub fn weights_bytes(&self) -> u64 {
        self.vs
            .variables()
            .values()
            .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
            .sum()
    }

    /// The weights (for optimizers and weight sync).
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// The weights, mutably (for `VarStore::copy` in weight sync).
    pub fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.vs
    }

    /// Whether a value head is attached.
    pub fn has_value_head(&self) -> bool {
        self.value_head.is_some()
    }

    /// An empty KV cache sized for `batch` rows and `capacity` slots.
    pub fn new_cache(&self, batch: i64, capacity: i64) -> KvCache {
        KvCache::new(
            self.config.num_hidden_layers,
            batch,
            self.config.num_key_value_heads as i64,
            self.config.head_dim as i64,
            capacity,
            self.placement.kind,
            self.placement.device,
        )
    }

    /// Final hidden states [B, T, H] (after the last norm) for `ids` [B, T].
    ///
    /// `input_mask` [B, T] marks real tokens (false = padding). With a cache, the tokens are
    /// appended after what it holds; without one, the chunk is the whole sequence.
    pub fn forward(
        &self,
        ids: &Tensor,
        input_mask: &Tensor,
        mut cache: Option<&mut dyn KvStore>,
    ) -> Tensor {
        let t = ids.size()[1];
        let (positions, mask) = match cache.as_mut() {
            Some(cache) => cache.begin_chunk(input_mask),
            None => (
                padded_positions(input_mask),
                kv_cache::chunk_mask(input_mask, 0, t),
            ),
        };
        let (cos, sin) = self.rotary.cos_sin(&positions, self.placement.kind);
        let group = (self.config.num_attention_heads / self.config.num_key_value_heads) as i64;
        let lengths = cache.as_ref().and_then(|c| c.key_lengths());
        let bias = match lengths {
            Some(_) => None,
            None => Some(attention_bias(&mask, group, self.placement.kind)),
        };
        let attend = match (&lengths, &bias) {
            (Some(lengths), _) => AttnMask::Lengths(lengths),
            (None, Some(bias)) => AttnMask::Bias(bias),
            (None, None) => unreachable!("a bias is made whenever there are no key lengths"),
        };
        let mut x = self.embed_tokens.forward(ids);
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_mut().map(|c| (&mut **c as &mut dyn KvStore, i));
            x = layer.forward(&x, &cos, &sin, attend, layer_cache);
        }
        if let Some(cache) = cache {
            cache.end_chunk(t);
        }
        self.norm.forward(&x)
    }

    /// [`PolicyModel::forward`] for right-padded sequences without a cache (training
    /// batches): `input_mask` [B, T] must mark a prefix of each row. Attention is causal
    /// without a mask tensor, which a fused kernel runs without keeping `[T x T]` scores
    /// for the backward pass; real tokens' states are those of [`PolicyModel::forward`].
    pub fn forward_right_padded(&self, ids: &Tensor, input_mask: &Tensor) -> Tensor {
        let (cos, sin) = self.right_padded_rotary(input_mask);
        let mut x = self.embed_tokens.forward(ids).to_kind(self.residual);
        for (i, layer) in self.layers.iter().enumerate() {
            self.gate(|g| g.before_forward(i));
            x = layer.forward(&x, &cos, &sin, AttnMask::Causal, None);
            self.gate(|g| g.after_forward(i));
        }
        self.norm.forward_to(&x, self.placement.kind)
    }

    /// Puts `gate` around each decoder layer of the training passes (see [`LayerGate`]);
    /// `None` removes it.
    pub fn set_layer_gate(&mut self, gate: Option<Arc<dyn LayerGate>>) {
        self.layer_gate = gate;
    }

    /// Calls `f` on the layer gate, if there is one.
    pub(crate) fn gate(&self, f: impl FnOnce(&dyn LayerGate)) {
        if let Some(g) = &self.layer_gate {
            f(g.as_ref());
        }
    }

    /// The number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Keeps the residual stream of training passes in float32 around reduced-precision
    /// layers, as autocast does: each layer's update is added to a float32 sum instead of
    /// being rounded into a bfloat16 one, so gradients and log-probabilities are those of
    /// float32 accumulation. Costs a float32 `[B, T, H]` per layer boundary.
    pub fn set_float32_residual(&mut self, on: bool) {
        self.residual = if on { Kind::Float } else { self.placement.kind };
    }

    /// cos and sin of right-padded rows (positions count real tokens; padding repeats the
    /// last).
    fn right_padded_rotary(&self, input_mask: &Tensor) -> (Tensor, Tensor) {
        self.rotary
            .cos_sin(&padded_positions(input_mask), self.placement.kind)
    }

    /// Vocabulary logits [.., V] from hidden states [.., H].
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => hidden.matmul(&self.embed_tokens.ws.tr()),
        }
    }

    /// Scalar values [..] from hidden states [.., H]; `None` without a value head.
    pub fn values(&self, hidden: &Tensor) -> Option<Tensor> {
        self.value_head
            .as_ref()
            .map(|head| head.forward(hidden).squeeze_dim(-1))
    }

    /// Float32 logits [T, V] of one unpadded sequence, without a cache (for tests and
    /// scoring).
    pub fn sequence_logits(&self, ids: &[u32]) -> Result<Tensor> {
        self.check_ids(ids)?;
        let ids = self.ids_tensor(ids).unsqueeze(0);
        let mask = ids.ones_like().to_kind(Kind::Bool);
        Ok(tch::no_grad(|| {
            self.logits(&self.forward(&ids, &mask, None))
                .squeeze_dim(0)
                .to_kind(Kind::Float)
        }))
    }

    pub(crate) fn ids_tensor(&self, ids: &[u32]) -> Tensor {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        Tensor::from_slice(&ids).to_device(self.placement.device)
    }

    /// Rejects token ids outside the vocabulary (libtorch would abort on them).
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size as u32;
        match ids.iter().find(|&&i| i >= vocab) {
            Some(bad) => Err(Error::invalid(
                "token ids",
                format!("id {bad} is outside the vocabulary (size {vocab})"),
            )),
            None => Ok(()),
        }
    }
}

/// Rotary positions of a chunk without a cache: each real token's index among its row's
/// real tokens (padding repeats a neighbour's, and is never attended).
fn padded_positions(input_mask: &Tensor) -> Tensor {
    let counts = input_mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64);
    (counts - 1).clamp_min(0)
}
