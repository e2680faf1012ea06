//! `agent-r1 init-model`: writes a fresh model directory from a built-in preset.
//!
//! The result is an ordinary Hugging Face directory (tokenizer, chat template, config,
//! safetensors), so the tiny model and a downloaded Qwen2.5 go through one loading path.

use std::path::{Path, PathBuf};

use agent_r1_actors::model::presets::{preset, PRESETS};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::tiny_tokenizer::write_tiny_tokenizer;
use anyhow::Context;

/// Flags of `agent-r1 init-model`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitModelArgs {
    /// Preset name.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Output directory (created; must be empty or absent unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Text file to train the tokenizer on (default: the built-in corpus).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Largest tokenizer vocabulary (special and tag tokens included).
    #[arg(long, default_value_t = 2048)]
    vocab_size: usize,
    /// Seed for the weight initialisation.
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Overwrite files in a non-empty --out.
    #[arg(long)]
    force: bool,
}

pub(crate) fn run(args: InitModelArgs) -> anyhow::Result<()> {
    let corpus = match &args.corpus {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--corpus {}: cannot read", path.display()))?,
        ),
        None => None,
    };
    let summary = init_model(
        &args.preset,
        &args.out,
        corpus.as_deref(),
        args.vocab_size,
        args.seed,
        args.force,
    )?;
    println!("{summary}");
    Ok(())
}

/// Writes the model directory and returns a one-line JSON summary.
pub(crate) fn init_model(
    preset_name: &str,
    out: &Path,
    corpus: Option<&str>,
    vocab_size: usize,
    seed: i64,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        PRESETS.contains(&preset_name),
        "--preset: unknown preset `{preset_name}` (allowed: {})",
        PRESETS.join(", ")
    );
    if out.exists() && !force {
        let non_empty = std::fs::read_dir(out)
            .with_context(|| format!("--out {}: not a readable directory", out.display()))?
            .next()
            .is_some();
        anyhow::ensure!(
            !non_empty,
            "--out {}: directory is not empty (pass --force to overwrite)",
            out.display()
        );
    }
    let ids = write_tiny_tokenizer(out, corpus, vocab_size)?;
    let config = preset(preset_name, ids.vocab_size, ids.eos_token_ids.clone())?;
    tch::manual_seed(seed);
    let model = PolicyModel::new(config, Placement::default(), false)?;
    model.save(out, None)?;
    let gen_path = out.join("generation_config.json");
    std::fs::write(
        &gen_path,
        serde_json::to_string_pretty(&ids.generation_config())? + "\n",
    )
    .with_context(|| format!("{}: cannot write", gen_path.display()))?;
    Ok(serde_json::json!({
        "out": out.display().to_string(),
        "preset": preset_name,
        "parameters": model.config().num_parameters(),
        "vocab_size": model.config().vocab_size,
        "tokenizer_vocab_size": ids.vocab_size,
    }))
}
