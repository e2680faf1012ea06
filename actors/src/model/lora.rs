//! LoRA (Hu et al. 2021) as PEFT defines it: beside a frozen projection `W`, a trainable
//! pair `A` `[r, in]` and `B` `[out, r]` adds `scale * B A x`, with `scale = alpha / r` (or
//! `alpha / sqrt(r)` under rsLoRA). `A` starts as PEFT draws it (Kaiming-uniform with
//! `a = sqrt(5)`, that is uniform in `±1/sqrt(in)`) and `B` as zeros, so a fresh adapter
//! changes nothing. The adapters are float32 whatever the base's precision, and their term is
//! computed beside `W x`, never merged into `W`, so the frozen base loses nothing to rounding
//! and the learner and the engine compute the same thing.
//!
//! An adapter is saved and read in PEFT's format: `adapter_config.json` and
//! `adapter_model.safetensors` with PEFT's tensor names
//! (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::{Kind, Tensor};

use crate::{Error, Result};

/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The prefix PEFT's `PeftModelForCausalLM` puts before the base model's own names.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The projections an adapter can target, by PEFT's module names, with their place in a
/// decoder layer.
pub const TARGETS: [(&str, &str); 7] = [
    ("q_proj", "self_attn.q_proj"),
    ("k_proj", "self_attn.k_proj"),
    ("v_proj", "self_attn.v_proj"),
    ("o_proj", "self_attn.o_proj"),
    ("gate_proj", "mlp.gate_proj"),
    ("up_proj", "mlp.up_proj"),
    ("down_proj", "mlp.down_proj"),
];

/// Which projections carry adapters: PEFT's `all-linear` (every projection of every layer,
/// the output head excepted) or a list of module names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TargetModules {
    /// `"all-linear"`.
    All(String),
    /// Module names: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`,
    /// `down_proj`.
    List(Vec<String>),
}

impl Default for TargetModules {
    fn default() -> Self {
        TargetModules::All(ALL_LINEAR.into())
    }
}

const ALL_LINEAR: &str = "all-linear";

impl TargetModules {
    /// The targeted module names in PEFT's order, or what is wrong with the list.
    pub fn resolve(&self) -> std::result::Result<Vec<&'static str>, String> {
        let known = || {
            TARGETS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            TargetModules::All(s) if s == ALL_LINEAR => Ok(TARGETS.iter().map(|(n, _)| *n).collect()),
            TargetModules::All(s) => Err(format!(
                "`{s}` is not a target (a list of module names, or \"all-linear\"; patterns are not supported)"
            )),
            TargetModules::List(names) => {
                if names.is_empty() {
                    return Err(format!("the list is empty (module names: {})", known()));
                }
                for name in names {
                    if !TARGETS.iter().any(|(n, _)| n == name) {
                        return Err(format!(
                            "`{name}` is not a projection of the supported families (module names: {}, or \"all-linear\")",
                            known()
                        ));
                    }
                }
                Ok(TARGETS
                    .iter()
                    .map(|(n, _)| *n)
                    .filter(|n| names.iter().any(|m| m == n))
                    .collect())
            }
        }
    }
}

/// `[lora]`: train low-rank adapters beside a frozen base instead of the full weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank `r`: at least 1 and at most the narrower side of every targeted
    /// projection.
    #[serde(default = "default_rank")]
    #[schemars(range(min = 1))]
    pub rank: usize,
    /// `alpha`: the adapter's term is scaled by `alpha / rank` (`alpha / sqrt(rank)` with
    /// `use_rslora`).
    #[serde(default = "default_alpha")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub alpha: f64,
    /// Dropout on the adapters' input in training passes (0 turns it off; sampling and the
    /// learner's log-probabilities of the old policy never drop).
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    #[schemars(extend("exclusiveMaximum" = 1))]
    pub dropout: f64,
    /// Which projections carry adapters (PEFT's names, or `"all-linear"`).
    #[serde(default)]
    pub target_modules: TargetModules,
    /// rsLoRA's scale, `alpha / sqrt(rank)`.
    #[serde(default)]
    pub use_rslora: bool,
}

fn default_rank() -> usize {
    16
}

fn default_alpha() -> f64 {
    32.0
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: default_rank(),
            alpha: default_alpha(),
            dropout: 0.0,
            target_modules: TargetModules::default(),
            use_rslora: false,
        }
    }
}

impl Section for LoraConfig {
    fn rules(&self) -> std::result::Result<(), ConfigError> {
        if self.rank == 0 {
            return Err(ConfigError::range(
                "rank",
                0,
                ">= 1 (remove [lora] to train the full weights)",
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(ConfigError::range("alpha", self.alpha, "> 0"));
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return Err(ConfigError::range("dropout", self.dropout, "in [0, 1)"));
        }
        self.target_modules
            .resolve()
            .map_err(|why| ConfigError::new("target_modules", why))?;
        Ok(())
    }
}

impl LoraConfig {
    /// The factor on `B A x`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// PEFT's `adapter_config.json` for this adapter on `base` (`base_model_name_or_path`).
    pub fn to_peft_json(&self, base: Option<&str>) -> Value {
        let targets = self.target_modules.resolve().unwrap_or_default();
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.use_rslora,
            "use_dora": false,
            "modules_to_save": null,
            "init_lora_weights": true,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "inference_mode": true,
        })
    }

    /// The LoRA settings of a PEFT `adapter_config.json` (`path`), refusing what this
    /// implementation does not compute (DoRA, per-layer ranks, trained biases, extra
    /// modules), each in one line naming the file and the key.
    pub fn from_peft_json(path: &Path, json: &Value) -> Result<Self> {
        let bad = |key: &str, why: String| Error::model(path, format!("`{key}`: {why}"));
        let peft_type = json.get("peft_type").and_then(Value::as_str).unwrap_or("");
        if peft_type != "LORA" {
            return Err(bad(
                "peft_type",
                format!("`{peft_type}` is not supported (supported: LORA)"),
            ));
        }
        let rank = json
            .get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("r", "missing or not a positive integer".into()))?
            as usize;
        let alpha = json
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("lora_alpha", "missing or not a number".into()))?;
        let dropout = json
            .get("lora_dropout")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let flag = |key: &str| json.get(key).and_then(Value::as_bool).unwrap_or(false);
        for key in [
            "use_dora",
            "fan_in_fan_out",
            "lora_bias",
            "use_qalora",
            "use_bdlora",
        ] {
            if flag(key) {
                return Err(bad(key, "true is not supported (supported: false)".into()));
            }
        }
        let empty = |key: &str| match json.get(key) {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        for key in [
            "rank_pattern",
            "alpha_pattern",
            "modules_to_save",
            "layers_to_transform",
            "exclude_modules",
            "layer_replication",
            "target_parameters",
            "trainable_token_indices",
            "alora_invocation_tokens",
        ] {
            if !empty(key) {
                return Err(bad(
                    key,
                    "is set, which is not supported (one rank and alpha for every targeted projection of every layer)".into(),
                ));
            }
        }
        let bias = json.get("bias").and_then(Value::as_str).unwrap_or("none");
        if bias != "none" {
            return Err(bad(
                "bias",
                format!("`{bias}` is not supported (supported: none)"),
            ));
        }
        let target_modules = match json.get("target_modules") {
            Some(Value::String(s)) => TargetModules::All(s.clone()),
            Some(Value::Array(a)) => TargetModules::List(
                a.iter()
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .collect(),
            ),
            _ => return Err(bad("target_modules", "missing".into())),
        };
        let config = LoraConfig {
            rank,
            alpha,
            dropout,
            target_modules,
            use_rslora: flag("use_rslora"),
        };
        config
            .rules()
            .map_err(|e| Error::model(path, e.to_string()))?;
        Ok(config)
    }
}

/// Whether a variable name is an adapter's.
pub fn is_adapter_name(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

/// The trainable pair beside one projection.
#[derive(Debug)]
pub(crate) struct LoraAdapter {
    /// `[r, in]`, float32.
    pub(crate) a: Tensor,
    /// `[out, r]`, float32.
    pub(crate) b: Tensor,
    pub(crate) scale: f64,
    dropout: f64,
    /// The model's switches: dropout applies only in training passes; no adapter applies
    /// while they are off.
    switches: Arc<LoraSwitches>,
}

/// Switches a model's adapters read on every pass.
#[derive(Debug, Default)]
pub(crate) struct LoraSwitches {
    /// Training passes (adapter dropout applies).
    pub(crate) training: AtomicBool,
    /// The adapters are skipped: the model computes its frozen base alone.
    pub(crate) off: AtomicBool,
}

impl LoraAdapter {
    /// An adapter for a projection `in -> out`, initialised as PEFT does, its variables
    /// registered in `vs` (`lora_A.weight`, `lora_B.weight`) as trainable.
    pub(crate) fn new(
        vs: tch::nn::Path<'_>,
        inp: i64,
        out: i64,
        config: &LoraConfig,
        switches: Arc<LoraSwitches>,
    ) -> Self {
        let r = config.rank as i64;
        let device = vs.device();
        let bound = 1.0 / (inp as f64).sqrt();
        let a = Tensor::empty([r, inp], (Kind::Float, device)).uniform_(-bound, bound);
        let b = Tensor::zeros([out, r], (Kind::Float, device));
        Self {
            a: (&vs / "lora_A").add("weight", a, true),
            b: (&vs / "lora_B").add("weight", b, true),
            scale: config.scale(),
            dropout: config.dropout,
            switches,
        }
    }

    /// `y + scale * B A dropout(x)`, computed in float32 and rounded to `y`'s precision, as
    /// PEFT's `Linear.forward` does.
    ///
    /// A float32 `y` is added to in place (one `addmm_`, the scale folded into the rank-wide
    /// intermediate): the adapter then allocates nothing as wide as the projection's output.
    /// Out-of-place, each adapted projection of a training pass frees two such temporaries
    /// between tensors autograd keeps; on a CPU, where the binary keeps freed blocks in
    /// malloc's heaps, the heap fragments around them (measured at the qwen2.5-0.5b shape:
    /// 1.9 GB free but held in the heap at the peak of an update with adapters on every
    /// projection).
    pub(crate) fn add_to(&self, y: Tensor, x: &Tensor) -> Tensor {
        if self.switches.off.load(Ordering::Relaxed) {
            return y;
        }
        let x = x.to_kind(Kind::Float);
        let x = if self.dropout > 0.0 && self.switches.training.load(Ordering::Relaxed) {
            x.dropout(self.dropout, true)
        } else {
            x
        };
        let ax = x.linear::<Tensor>(&self.a, None) * self.scale;
        let kind = y.kind();
        if kind == Kind::Float && y.is_contiguous() {
            let rank = self.a.size()[0];
            let out = self.b.size()[0];
            let _ = y
                .view([-1, out])
                .addmm_(&ax.reshape([-1, rank]), &self.b.tr());
            y
        } else {
            (y + ax.linear::<Tensor>(&self.b, None)).to_kind(kind)
        }
    }

    /// `scale * B A`, the update a merge adds to `W`.
    pub(crate) fn delta_weight(&self) -> Tensor {
        self.b.matmul(&self.a) * self.scale
    }
}

/// The tensors of one safetensors file by the model's own variable names (`prefix` removed),
/// checked against `expected` (name to shape): every expected tensor present with its shape,
/// nothing else; `hint` says in each refusal what a mismatch likely means.
pub(crate) fn read_expected_tensors(
    path: &Path,
    prefix: &str,
    expected: &BTreeMap<String, Vec<i64>>,
    hint: &str,
) -> Result<BTreeMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::model(path, format!("not a safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let ours = name.strip_prefix(prefix).unwrap_or(&name).to_string();
        let Some(shape) = expected.get(&ours) else {
            return Err(Error::model(
                path,
                format!("unexpected tensor `{name}` ({hint})"),
            ));
        };
        let got: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        if &got != shape {
            return Err(Error::model(
                path,
                format!(
                    "tensor `{name}` has shape {got:?}, but this base implies {shape:?} ({hint})"
                ),
            ));
        }
        let kind = super::weights::kind_of(view.dtype()).ok_or_else(|| {
            Error::model(
                path,
                format!(
                    "tensor `{name}` has dtype {:?} (supported: F32, F16, BF16, F64)",
                    view.dtype()
                ),
            )
        })?;
        out.insert(ours, Tensor::f_from_data_size(view.data(), &got, kind)?);
    }
    let missing: BTreeSet<&String> = expected.keys().filter(|k| !out.contains_key(*k)).collect();
    if let Some(first) = missing.iter().next() {
        return Err(Error::model(
            path,
            format!(
                "{} tensor(s) missing, first `{prefix}{first}` ({hint})",
                missing.len()
            ),
        ));
    }
    Ok(out)
}

/// The last component of a model name or path, lowercased (`Qwen/Qwen2.5-0.5B` and
/// `/models/qwen2.5-0.5b/` both give `qwen2.5-0.5b`).
pub(crate) fn model_stem(name: &str) -> String {
    name.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

impl super::PolicyModel {
    /// Attaches fresh adapters (`A` drawn as PEFT draws it, `B` zero) to the projections
    /// `config` targets and freezes everything else but a value head: afterwards only the
    /// adapters (and the value head) have gradients.
    pub fn add_lora(&mut self, config: &LoraConfig) -> Result<()> {
        if self.lora.is_some() {
            return Err(Error::invalid("lora", "adapters are already attached"));
        }
        config
            .rules()
            .map_err(|e| Error::invalid("lora", e.under("lora").to_string()))?;
        let targets = config
            .target_modules
            .resolve()
            .map_err(|why| Error::invalid("lora.target_modules", why))?;
        if let Some((name, width)) = config.rank_too_wide(&self.config) {
            return Err(Error::invalid(
                "lora.rank",
                format!(
                    "got {}; allowed: 1..={width} (`{name}` is {width} wide on its narrower side)",
                    config.rank
                ),
            ));
        }
        for (name, t) in self.vs.variables() {
            if !name.starts_with(super::VALUE_HEAD) {
                let _ = t.set_requires_grad(false);
            }
        }
        let root = self.vs.root();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (place, proj) in layer.projections_mut() {
                if !targets.iter().any(|t| place.ends_with(t)) {
                    continue;
                }
                let s = proj.weight().size();
                let mut path = &root / "model" / "layers" / i;
                for part in place.split('.') {
                    path = &path / part;
                }
                proj.adapter = Some(LoraAdapter::new(
                    path,
                    s[1],
                    s[0],
                    config,
                    self.lora_switches.clone(),
                ));
            }
        }
        self.lora = Some(config.clone());
        Ok(())
    }

    /// The attached adapters' settings, if any.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// Training passes (adapter dropout applies) or not.
    pub fn set_training(&self, on: bool) {
        self.lora_switches.training.store(on, Ordering::Relaxed);
    }

    /// Runs `f` with the adapters skipped: the frozen base alone computes, which is the KL
    /// reference of a LoRA run (no second copy of the base is kept for it). The adapters
    /// are back on when `f` returns or unwinds.
    pub fn with_adapters_off<R>(&self, f: impl FnOnce() -> R) -> R {
        struct On<'a>(&'a LoraSwitches);
        impl Drop for On<'_> {
            fn drop(&mut self) {
                self.0.off.store(false, Ordering::Relaxed);
            }
        }
        self.lora_switches.off.store(true, Ordering::Relaxed);
        let _on = On(&self.lora_switches);
        f()
    }

    /// The adapters' variables by name, sorted (empty without LoRA).
    pub fn adapter_variables(&self) -> Vec<(String, Tensor)> {
        let mut vars: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .filter(|(name, _)| is_adapter_name(name))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    /// The model's weights with every adapter merged into its projection (`W + scale B A`,
    /// in `W`'s precision) and the adapters themselves left out, sorted by name: what a
    /// Hugging Face directory of the adapted model holds. Without LoRA, the weights.
    pub fn merged_weights(&self) -> Vec<(String, Tensor)> {
        let mut deltas: BTreeMap<String, Tensor> = BTreeMap::new();
        tch::no_grad(|| {
            for (i, layer) in self.layers.iter().enumerate() {
                for (place, proj) in layer.projections() {
                    if let Some(adapter) = &proj.adapter {
                        deltas.insert(
                            format!("model.layers.{i}.{place}.weight"),
                            adapter.delta_weight(),
                        );
                    }
                }
            }
        });
        let mut out: Vec<(String, Tensor)> = tch::no_grad(|| {
            self.vs
                .variables()
                .into_iter()
                .filter(|(name, _)| !is_adapter_name(name))
                .map(|(name, t)| match deltas.get(&name) {
                    Some(delta) => {
                        let merged = (t.to_kind(Kind::Float) + delta).to_kind(t.kind());
                        (name, merged)
                    }
                    None => (name, t.detach()),
                })
                .collect()
        });
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Writes the adapters as PEFT does: `adapter_config.json` (with
    /// `base_model_name_or_path` the directory the base was loaded from) and
    /// `adapter_model.safetensors` (float32, PEFT's names). A value head, which PEFT's format
    /// has no place for, goes to `value_head.safetensors` beside them.
    pub fn save_adapter(&self, dir: &Path) -> Result<()> {
        let Some(config) = &self.lora else {
            return Err(Error::invalid(
                "save adapter",
                "no LoRA adapters are attached",
            ));
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let base = self.base_dir.as_ref().map(|d| d.display().to_string());
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let text = serde_json::to_string_pretty(&config.to_peft_json(base.as_deref()))
            .map_err(|e| Error::model(&path, e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        let tensors: Vec<(String, Tensor)> = self
            .adapter_variables()
            .into_iter()
            .map(|(name, t)| (format!("{PEFT_PREFIX}{name}"), t))
            .collect();
        super::weights::save_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors, Kind::Float)?;
        let head: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .filter(|(name, _)| name.starts_with(super::VALUE_HEAD))
            .collect();
        if !head.is_empty() {
            super::weights::save_tensors(&dir.join(VALUE_HEAD_FILE), &head, self.placement.kind)?;
        }
        Ok(())
    }

    /// Attaches the adapter PEFT (or [`Self::save_adapter`]) wrote in `dir`, after checking
    /// it was made for this base: its `base_model_name_or_path` names a model of the same
    /// name as the base's directory, and every tensor has the shape this base implies. Each
    /// refusal is one line naming the file and the key or tensor.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        let (path, json) = read_adapter_json(dir)?;
        let config = LoraConfig::from_peft_json(&path, &json)?;
        if let (Some(named), Some(base)) = (adapter_base_name(&json), &self.base_dir) {
            if !named.is_empty() && model_stem(named) != model_stem(&base.display().to_string()) {
                return Err(Error::model(
                    &path,
                    format!(
                        "`base_model_name_or_path`: the adapter was made for `{named}`, the base is `{}` (set the key to the base's name if this is the same model)",
                        base.display()
                    ),
                ));
            }
        }
        self.add_lora(&config)
            .map_err(|e| Error::model(&path, e.to_string()))?;
        let shapes = |vars: Vec<(String, Tensor)>| -> BTreeMap<String, Vec<i64>> {
            vars.into_iter().map(|(name, t)| (name, t.size())).collect()
        };
        let mut loaded = read_expected_tensors(
            &dir.join(ADAPTER_WEIGHTS_FILE),
            PEFT_PREFIX,
            &shapes(self.adapter_variables()),
            "an adapter for another base, or target_modules that disagree with it?",
        )?;
        let head = dir.join(VALUE_HEAD_FILE);
        if self.has_value_head() && head.is_file() {
            let vars = self.vs.variables().into_iter();
            let head_vars = vars.filter(|(name, _)| name.starts_with(super::VALUE_HEAD));
            loaded.extend(read_expected_tensors(
                &head,
                "",
                &shapes(head_vars.collect()),
                "a value head of another model?",
            )?);
        }
        let vars = self.vs.variables();
        tch::no_grad(|| {
            for (name, value) in &loaded {
                let mut var = vars[name].shallow_clone();
                var.copy_(&value.to_kind(var.kind()).to_device(var.device()));
            }
        });
        Ok(())
    }
}

/// Where [`super::PolicyModel::save_adapter`] keeps a value head.
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

/// The adapters a policy starts with: fresh ones of `config`, or those saved in `from` (a
/// PEFT adapter directory, or a checkpoint's), whose own `adapter_config.json` then decides.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSource {
    /// The settings of fresh adapters.
    pub config: LoraConfig,
    /// A saved adapter to start from.
    pub from: Option<std::path::PathBuf>,
}

impl AdapterSource {
    /// The settings the adapters will have: `from`'s when given, else `config`.
    pub fn resolved(&self) -> Result<LoraConfig> {
        match &self.from {
            Some(dir) => read_adapter_config(dir),
            None => Ok(self.config.clone()),
        }
    }
}

/// `dir`'s `adapter_config.json`: its path and its JSON.
fn read_adapter_json(dir: &Path) -> Result<(std::path::PathBuf, Value)> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    if !path.is_file() {
        return Err(Error::model(
            dir,
            format!("no {ADAPTER_CONFIG_FILE} in the adapter directory"),
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| Error::model(&path, format!("not valid JSON: {e}")))?;
    Ok((path, json))
}

fn adapter_base_name(json: &Value) -> Option<&str> {
    json.get("base_model_name_or_path").and_then(Value::as_str)
}

/// The LoRA settings of the adapter saved in `dir` (its `adapter_config.json`).
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig> {
    let (path, json) = read_adapter_json(dir)?;
    LoraConfig::from_peft_json(&path, &json)
}

/// The base the adapter saved in `dir` names (`base_model_name_or_path`), if any.
pub fn read_adapter_base(dir: &Path) -> Result<Option<String>> {
    let (_, json) = read_adapter_json(dir)?;
    Ok(adapter_base_name(&json).map(String::from))
}

impl super::PolicyModel {
    /// [`super::PolicyModel::load`], then the adapters of `adapter` when given.
    pub fn load_adapted(
        dir: &Path,
        placement: super::Placement,
        value_head: bool,
        adapter: Option<&AdapterSource>,
    ) -> Result<Self> {
        let mut model = Self::load(dir, placement, value_head)?;
        match adapter {
            Some(AdapterSource {
                from: Some(from), ..
            }) => model.load_adapter(from)?,
            Some(AdapterSource { config, from: None }) => model.add_lora(config)?,
            None => {}
        }
        Ok(model)
    }
}

impl LoraConfig {
    /// Parameters of the adapters on a model of `m`'s shape: `rank * (in + out)` per
    /// targeted projection per layer.
    pub fn parameters(&self, m: &super::ModelConfig) -> u64 {
        self.projection_widths(m)
            .into_iter()
            .map(|(_, inp, out)| self.rank as u64 * (inp + out))
            .sum::<u64>()
            * m.num_hidden_layers as u64
    }

    /// `(module name, in, out)` of each targeted projection of one layer of `m`.
    pub fn projection_widths(&self, m: &super::ModelConfig) -> Vec<(&'static str, u64, u64)> {
        let h = m.hidden_size as u64;
        let i = m.intermediate_size as u64;
        let q = (m.num_attention_heads * m.head_dim) as u64;
        let kv = (m.num_key_value_heads * m.head_dim) as u64;
        let widths = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)];
        let targets = self.target_modules.resolve().unwrap_or_default();
        TARGETS
            .iter()
            .zip(widths)
            .filter(|((name, _), _)| targets.contains(name))
            .map(|((name, _), (inp, out))| (*name, inp, out))
            .collect()
    }

    /// The narrowest targeted projection of `m` (its name and narrower side) when `rank` is
    /// wider than it.
    pub fn rank_too_wide(&self, m: &super::ModelConfig) -> Option<(&'static str, u64)> {
        self.projection_widths(m)
            .into_iter()
            .map(|(name, inp, out)| (inp.min(out), name))
            .min()
            .filter(|(width, _)| self.rank as u64 > *width)
            .map(|(width, name)| (name, width))
    }
}
