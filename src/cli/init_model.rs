//! `agent-r1 init-model`: writes a fresh model directory from a built-in preset, or a
//! randomly initialised model of a real model's shape.
//!
//! The result is an ordinary Hugging Face directory (tokenizer, chat template, config,
//! safetensors), so the tiny model, a real-shaped one and a downloaded Qwen2.5 go through one
//! loading path.

use std::path::PathBuf;

use agent_r1_actors::device::parse_storage_dtype;
use agent_r1_actors::model::presets::SHAPES;
use anyhow::Context;

/// Flags of `agent-r1 init-model`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitModelArgs {
    /// Preset name.
    #[arg(long, default_value = "tiny", conflicts_with = "shape")]
    preset: String,
    /// A real model's shape, randomly initialised, with a byte-level BPE tokenizer of its
    /// exact vocabulary size in its family's style: qwen2.5-0.5b, qwen2.5-1.5b, qwen3-1.7b,
    /// llama3.2-1b, qwen2.5-7b, llama3.1-8b.
    #[arg(long)]
    shape: Option<String>,
    /// Stored weight precision of a --shape model: bf16 (as released), float16 or float32.
    #[arg(long, default_value = "bf16", requires = "shape")]
    dtype: String,
    /// Output directory (created; must be empty or absent unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Text file to train the tokenizer on (default: the built-in corpus).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Largest tokenizer vocabulary (special and tag tokens included); a --shape model's is
    /// its own.
    #[arg(long, default_value_t = 2048, conflicts_with = "shape")]
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
        Some(path) => Some(crate::setup::TokenizerCorpus {
            text: std::fs::read_to_string(path)
                .with_context(|| format!("--corpus {}: cannot read", path.display()))?,
            whole_words: vec![],
        }),
        None => None,
    };
    let summary = match &args.shape {
        Some(shape) => {
            anyhow::ensure!(
                SHAPES.contains(&shape.as_str()),
                "--shape: unknown shape `{shape}` (allowed: {})",
                SHAPES.join(", ")
            );
            let dtype = parse_storage_dtype(&args.dtype)?;
            crate::setup::init_shape(
                shape,
                &args.out,
                corpus.as_ref(),
                args.seed,
                dtype,
                args.force,
            )?
        }
        None => init_model(
            &args.preset,
            &args.out,
            corpus.as_ref(),
            args.vocab_size,
            args.seed,
            args.force,
        )?,
    };
    println!("{summary}");
    Ok(())
}

pub(crate) use crate::setup::init_model;
