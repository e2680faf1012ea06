//! `agent-r1 init-model`: writes a fresh model directory from a built-in preset.
//!
//! The result is an ordinary Hugging Face directory (tokenizer, chat template, config,
//! safetensors), so the tiny model and a downloaded Qwen2.5 go through one loading path.

use std::path::PathBuf;

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
        Some(path) => Some(agent_r1::setup::TokenizerCorpus {
            text: std::fs::read_to_string(path)
                .with_context(|| format!("--corpus {}: cannot read", path.display()))?,
            whole_words: vec![],
        }),
        None => None,
    };
    let summary = init_model(
        &args.preset,
        &args.out,
        corpus.as_ref(),
        args.vocab_size,
        args.seed,
        args.force,
    )?;
    println!("{summary}");
    Ok(())
}

pub(crate) use agent_r1::setup::init_model;
