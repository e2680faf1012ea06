//! `agent-r1 generate`: the command users try first.

use std::path::PathBuf;

use agent_r1_actors::device::parse_placement;
use agent_r1_actors::model::lora::AdapterSource;
use agent_r1_actors::model::{PolicyModel, SamplingParams};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::message::Message;
use anyhow::Context;

/// Flags of `agent-r1 generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// Hugging Face model directory (config.json, safetensors, tokenizer files).
    #[arg(long, env = "AGENT_R1_MODEL")]
    model: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Render the prompt as one user message through the chat template, with the
    /// generation prompt.
    #[arg(long)]
    chat: bool,
    /// Largest number of tokens to generate.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Nucleus sampling mass in (0, 1]; 1 is off.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Keep only the k most likely tokens; 0 is off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// cpu, cuda, cuda:N or auto (CUDA when available).
    #[arg(long, default_value = "auto", env = "AGENT_R1_DEVICE")]
    device: String,
    /// float32, bf16 (CUDA only) or auto (float32 on CPU, bf16 on CUDA).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Print one JSON object: prompt_token_ids, token_ids, logprobs, text.
    #[arg(long)]
    json: bool,
    /// A LoRA adapter of --model (PEFT's format, or a checkpoint's `policy` when adapters
    /// trained) to generate with.
    #[arg(long)]
    adapter: Option<PathBuf>,
}

pub(crate) fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        max_new_tokens: args.max_new_tokens as usize,
        stop_token_ids: vec![],
    };
    params.validate()?;
    let placement = parse_placement(&args.device, &args.dtype)?;
    let tokenizer = HfTokenizer::from_dir(&args.model)?;
    let adapter = args.adapter.map(|dir| AdapterSource {
        config: Default::default(),
        from: Some(dir),
    });
    let model = PolicyModel::load_adapted(&args.model, placement, false, adapter.as_ref())?;
    let prompt_ids = if args.chat {
        tokenizer.encode_chat(&[Message::user(args.prompt.clone())], None, true)?
    } else {
        tokenizer.encode(&args.prompt, true)?
    };
    if prompt_ids.is_empty() {
        anyhow::bail!("--prompt: the prompt encodes to no tokens");
    }
    let mut stop: Vec<u32> = tokenizer.eos_token_ids().to_vec();
    stop.extend(&model.config().eos_token_ids);
    stop.sort_unstable();
    stop.dedup();
    let params = SamplingParams {
        stop_token_ids: stop,
        ..params
    };
    tch::manual_seed(args.seed);
    let generation = model
        .generate(std::slice::from_ref(&prompt_ids), &params)?
        .pop()
        .context("no generation returned")?;
    let text = tokenizer.decode(&generation.token_ids, true)?;
    if args.json {
        let out = serde_json::json!({
            "prompt_token_ids": prompt_ids,
            "token_ids": generation.token_ids,
            "logprobs": generation.logprobs,
            "text": text,
        });
        println!("{out}");
    } else {
        println!("{text}");
    }
    Ok(())
}
