//! What the bench commands share: the flags that choose a benchmark's model, where their
//! runs go, and the process's peak memory.

use std::path::{Path, PathBuf};

use agent_r1_actors::model::presets::{preset, shape};
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel};

/// The flags that choose a benchmark's model, shared by the bench commands.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ModelFlags {
    /// A model directory; without it, a randomly initialised preset or shape.
    #[arg(long, conflicts_with = "shape")]
    model: Option<PathBuf>,
    /// A real model's shape, randomly initialised (qwen2.5-0.5b, qwen2.5-1.5b, qwen3-1.7b,
    /// llama3.2-1b).
    #[arg(long)]
    shape: Option<String>,
    /// Preset used when neither --model nor --shape is given.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Vocabulary size of the preset model.
    #[arg(long, default_value_t = 4096)]
    vocab_size: usize,
}

impl ModelFlags {
    /// The model these flags name.
    pub(crate) fn choice(&self) -> ModelChoice<'_> {
        ModelChoice {
            dir: self.model.as_deref(),
            shape: self.shape.as_deref(),
            preset: &self.preset,
            vocab_size: self.vocab_size,
        }
    }
}

/// Which model a benchmark runs: a directory, a real shape or a preset (randomly
/// initialised), in that order of precedence.
pub(crate) struct ModelChoice<'a> {
    pub(crate) dir: Option<&'a Path>,
    pub(crate) shape: Option<&'a str>,
    pub(crate) preset: &'a str,
    pub(crate) vocab_size: usize,
}

impl ModelChoice<'_> {
    /// Loads or initialises the model (with a value head when asked).
    pub(crate) fn build(
        &self,
        placement: Placement,
        value_head: bool,
    ) -> anyhow::Result<PolicyModel> {
        Ok(match (self.dir, self.shape) {
            (Some(dir), _) => PolicyModel::load(dir, placement, value_head)?,
            (None, Some(name)) => PolicyModel::new(shape(name)?.0, placement, value_head)?,
            (None, None) => PolicyModel::new(
                preset(self.preset, self.vocab_size, vec![])?,
                placement,
                value_head,
            )?,
        })
    }

    /// The model's config, without building it.
    pub(crate) fn config(&self) -> anyhow::Result<ModelConfig> {
        Ok(match (self.dir, self.shape) {
            (Some(dir), _) => ModelConfig::from_file(&dir.join("config.json"))?.0,
            (None, Some(name)) => shape(name)?.0,
            (None, None) => preset(self.preset, self.vocab_size, vec![])?,
        })
    }

    /// What the model is called in reports.
    pub(crate) fn name(&self) -> String {
        match (self.dir, self.shape) {
            (Some(dir), _) => dir.display().to_string(),
            (None, Some(name)) => name.to_string(),
            (None, None) => self.preset.to_string(),
        }
    }
}

/// Peak resident memory of this process in MiB (`VmHWM`; 0 where /proc is missing).
pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Resets the kernel's peak-RSS mark (`VmHWM`) so the next reading is this phase's own;
/// best effort (Linux only).
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Where a bench's runs go: `out` when given, else a temporary directory, removed when the
/// returned guard drops.
pub(crate) fn runs_dir(out: Option<&Path>) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf)> {
    use anyhow::Context;
    match out {
        Some(dir) => Ok((None, dir.to_path_buf())),
        None => {
            let tmp = tempfile::tempdir().context("creating a temporary directory")?;
            let dir = tmp.path().to_path_buf();
            Ok((Some(tmp), dir))
        }
    }
}
