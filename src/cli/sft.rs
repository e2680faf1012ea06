//! `agent-r1 sft`: a supervised warm start on one's own demonstrations, so that RL starts
//! from a model that already writes the run's tool calls.
//!
//! The demonstrations are a JSONL of conversations in the chat-messages format (OpenAI /
//! Hugging Face, with `tool_calls` and `tool` messages). The training config says what the
//! run will show the model: its tools, its tool-call format, its calls per turn and its env's
//! system prompt (put first in a conversation that has none), so the demonstrations are
//! rendered the way RL's prompts will be. The loss is on the assistant tokens only.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;

use agent_r1_actors::model::PolicyModel;
use agent_r1_actors::sft::{train_sft, SftConfig};
use agent_r1_actors::tokenizer::HfTokenizer;

use crate::config::{FileCheck, TrainConfig};
use crate::demonstrations::{run_rules, tokenized_demonstrations};
use crate::registries::Registries;

/// Arguments of `agent-r1 sft`.
#[derive(Debug, clap::Args)]
pub(crate) struct SftArgs {
    /// The training config the model will be trained with (its model, tools and env).
    #[arg(long)]
    config: PathBuf,
    /// Demonstrations: JSONL, one `{"messages": [...], "tools": [...]}` conversation a line.
    #[arg(long)]
    data: PathBuf,
    /// Where the trained model directory is written (then set `model.dir` to it).
    #[arg(long)]
    out: PathBuf,
    /// The model to start from (default: the config's `model.dir`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Conversations per step.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Learning rate (AdamW, constant after a short warm-up).
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f64,
    /// Seed for the order of the conversations.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub(crate) fn run(args: SftArgs, registries: &Registries) -> anyhow::Result<()> {
    anyhow::ensure!(args.steps > 0, "--steps: got 0; allowed: 1 or more");
    anyhow::ensure!(
        args.batch_size > 0,
        "--batch-size: got 0; allowed: 1 or more"
    );
    anyhow::ensure!(
        args.learning_rate.is_finite() && args.learning_rate > 0.0,
        "--learning-rate: got {}; allowed: a positive number",
        args.learning_rate
    );
    let cfg = TrainConfig::load(&args.config, FileCheck::Require, registries)?;
    let base = match (&args.model, &cfg.model.dir) {
        (Some(dir), _) | (None, Some(dir)) => dir.clone(),
        (None, None) => anyhow::bail!(
            "{}: sft needs a model directory: set model.dir, or pass --model DIR (make one \
             with `agent-r1 init-model --out DIR`)",
            args.config.display()
        ),
    };
    writable(&args.out)?;
    let tokenizer =
        HfTokenizer::from_dir(&base).with_context(|| format!("--model {}", base.display()))?;
    let rules = run_rules(&cfg, registries)?;
    let sequences = tokenized_demonstrations(&args.data, &rules, &tokenizer)?;
    let placement = cfg.placement()?;
    let mut model = PolicyModel::load(&base, placement, false)?;
    let config = SftConfig {
        steps: args.steps,
        batch_size: args.batch_size,
        learning_rate: args.learning_rate,
        final_lr_fraction: 1.0,
        warmup_steps: (args.steps / 10).min(20),
        max_len: cfg.rollout.max_context_length,
        seed: args.seed,
        ..SftConfig::default()
    };
    let every = (args.steps / 10).max(1);
    let report = train_sft(&mut model, &sequences, &config, |step, loss| {
        if step % every == 0 || step == args.steps {
            eprintln!("sft step {step}/{}: loss {loss:.4}", args.steps);
        }
        ControlFlow::Continue(())
    })?;
    model.save(&args.out, Some(&base))?;
    println!(
        "{}",
        json!({
            "out": args.out.display().to_string(),
            "conversations": sequences.len(),
            "steps": report.steps,
            "tokens_trained": report.tokens,
            "first_loss": report.first_loss,
            "last_loss": report.last_loss,
        })
    );
    Ok(())
}

/// That `out` can be created and written, before any training.
fn writable(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("--out {}: cannot create the directory", out.display()))?;
    let probe = out.join(".agent-r1-write-probe");
    std::fs::write(&probe, b"")
        .with_context(|| format!("--out {}: cannot write there", out.display()))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}
