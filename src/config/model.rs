//! `[model]`: which model, and where it runs.

use std::path::PathBuf;

use agent_r1_actors::model::Placement;
use agent_r1_envs::config::Section;
use agent_r1_envs::tool_call::ToolCallFormat;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, FileCheck};

/// `[model]`: a model directory or a built-in preset, and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face style model directory (`config.json`, `tokenizer.json`, safetensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// A built-in preset (`"tiny"`), created fresh in the run directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// A PEFT LoRA adapter of this model to start from: the policy trains it (with its own
    /// rank, alpha and targets) beside the frozen base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<PathBuf>,
    /// `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when visible).
    #[serde(default = "default_auto")]
    pub device: String,
    /// `auto` (float32 on CPU, bf16 on CUDA), `float32` or `bf16` (CUDA only).
    #[serde(default = "default_auto")]
    pub dtype: String,
    /// How the model writes tool calls: `hermes` (`<tool_call>` spans, Qwen),
    /// `llama3_json` (Llama 3.1's JSON object) or `mistral` (`[TOOL_CALLS]` and a JSON
    /// list); absent, what its chat template teaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_format: Option<ToolCallFormat>,
    /// Extra variables for the chat template, as transformers' `apply_chat_template` kwargs
    /// (`{ enable_thinking = false }` turns Qwen3's reasoning off).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

/// The device spellings `model.device` and `rollout.devices` accept.
pub(super) const DEVICE_SPELLINGS: &str = "cpu, cuda, cuda:N, auto";

/// Whether `device` is one of [`DEVICE_SPELLINGS`] (not whether this machine has it).
pub(super) fn device_spelling_ok(device: &str) -> bool {
    matches!(device, "cpu" | "cuda" | "auto")
        || device
            .strip_prefix("cuda:")
            .is_some_and(|n| n.parse::<usize>().is_ok())
}

fn default_auto() -> String {
    "auto".into()
}

impl Section for ModelSection {
    fn rules(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        match (&self.dir, &self.preset) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(E::new(
                    "",
                    "set exactly one of `dir` (a model directory) and `preset` (\"tiny\")",
                ))
            }
            (None, Some(p)) => {
                let presets = agent_r1_actors::model::presets::PRESETS;
                if !presets.contains(&p.as_str()) {
                    return Err(E::range("preset", format!("{p:?}"), presets.join(", ")));
                }
            }
            (Some(_), None) => {}
        }
        if !device_spelling_ok(&self.device) {
            return Err(E::range(
                "device",
                format!("{:?}", self.device),
                DEVICE_SPELLINGS,
            ));
        }
        if !matches!(
            self.dtype.as_str(),
            "auto" | "float32" | "f32" | "fp32" | "bf16" | "bfloat16"
        ) {
            return Err(E::range(
                "dtype",
                format!("{:?}", self.dtype),
                "auto, float32, bf16",
            ));
        }
        if self.device == "cpu" && matches!(self.dtype.as_str(), "bf16" | "bfloat16") {
            return Err(E::range(
                "dtype",
                "\"bf16\" with device = \"cpu\"",
                "on CPU: auto, float32",
            ));
        }
        Ok(())
    }
}

impl ModelSection {
    /// The model's tool-call format: `tool_call_format` when written, else what the chat
    /// template in `dir` teaches, else hermes (the `tiny` preset's Qwen-style template).
    pub fn resolved_tool_call_format(&self) -> ToolCallFormat {
        self.tool_call_format
            .or_else(|| {
                let dir = self.dir.as_ref()?;
                agent_r1_actors::tokenizer::HfTokenizer::from_dir(dir)
                    .ok()?
                    .tool_call_format()
            })
            .unwrap_or_default()
    }

    /// With [`FileCheck::Require`], that the model directory holds a model.
    pub(super) fn check_files(&self, files: FileCheck) -> Result<(), ConfigError> {
        match (&self.dir, files) {
            (Some(dir), FileCheck::Require) => model_dir("model.dir", dir),
            _ => Ok(()),
        }
    }

    /// Device and dtype, checked against this machine (CUDA visible, device index in range);
    /// errors name `model.device` / `model.dtype`.
    pub fn placement(&self) -> Result<Placement, ConfigError> {
        self.placement_on(&self.device, "model.device")
    }

    /// [`Self::placement`] on another device with this model's dtype; a device error names
    /// `key`.
    pub(super) fn placement_on(&self, device: &str, key: &str) -> Result<Placement, ConfigError> {
        if device == "cpu" && matches!(self.dtype.as_str(), "bf16" | "bfloat16") {
            return Err(ConfigError::range(
                key,
                "\"cpu\" with model.dtype = \"bf16\"",
                "a CUDA device, or model.dtype = \"float32\"",
            ));
        }
        agent_r1_actors::device::parse_placement(device, &self.dtype).map_err(|e| {
            let e = e.to_string();
            let key = if e.contains("--dtype") {
                "model.dtype"
            } else {
                key
            };
            ConfigError::new(
                key,
                e.replace("--device", "device").replace("--dtype", "dtype"),
            )
        })
    }
}

/// That `dir` is a Hugging Face model directory (has `config.json`).
pub(super) fn model_dir(key: &str, dir: &std::path::Path) -> Result<(), ConfigError> {
    if dir.join("config.json").is_file() {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!(
                "{}: no config.json there (expected a Hugging Face model directory)",
                dir.display()
            ),
        ))
    }
}
