//! `agent-r1 bench ...`: benchmarks that print figures (not timed tests).

use std::path::{Path, PathBuf};
use std::time::Instant;

use agent_r1_actors::device::parse_placement;
use agent_r1_actors::model::presets::{preset, shape};
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};

/// Which benchmark.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BenchCmd {
    /// Generation throughput of the policy model at several batch sizes.
    Generate(GenerateBench),
    /// The engine's decode throughput at fixed batch sizes, against the floor of the
    /// device's memory bandwidth.
    Decode(crate::cli::bench_decode::DecodeBench),
    /// Concurrent multi-turn episodes through the actor runtime.
    Rollout(crate::cli::rollout::BenchRolloutCmd),
    /// Learner update throughput (PPO-GAE, GRPO) on synthetic multi-turn trajectories.
    Learner(crate::cli::bench_learner::LearnerBench),
    /// The training loop end to end on a fixed short config: sync vs async, and (with
    /// --old-binary) the old chunked loop vs the streaming service.
    Train(crate::cli::bench_train::TrainBench),
    /// Random inputs against the tool-call parser, the rendering of tool results and the
    /// config parser, counting panics.
    Fuzz(crate::cli::bench_fuzz::FuzzBench),
    /// One weights version through the data plane over loopback: published, served,
    /// fetched, verified by SHA-256 and loaded.
    Weights(crate::cli::bench_weights::WeightsBench),
}

/// Flags of `agent-r1 bench generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateBench {
    #[command(flatten)]
    model: ModelFlags,
    /// Comma-separated batch sizes.
    #[arg(long, default_value = "1,64", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Tokens generated per sequence (no early stop).
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Repetitions per batch size (the best is reported beside the mean).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// float32, bf16 (CUDA) or auto.
    #[arg(long, default_value = "auto")]
    dtype: String,
}

pub(crate) fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Generate(args) => generate(args),
        BenchCmd::Decode(args) => crate::cli::bench_decode::run(args),
        BenchCmd::Rollout(args) => crate::cli::rollout::run_bench(args),
        BenchCmd::Learner(args) => crate::cli::bench_learner::run(args),
        BenchCmd::Fuzz(args) => crate::cli::bench_fuzz::run(args),
        BenchCmd::Train(args) => crate::cli::bench_train::run(args),
        BenchCmd::Weights(args) => crate::cli::bench_weights::run(args),
    }
}

fn generate(args: GenerateBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeats > 0, "--repeats must be at least 1");
    anyhow::ensure!(args.prompt_len > 0, "--prompt-len must be at least 1");
    anyhow::ensure!(
        args.batch_sizes.iter().all(|&b| b > 0),
        "--batch-sizes must be positive"
    );
    let placement = parse_placement(&args.device, &args.dtype)?;
    tch::manual_seed(0);
    let model = args.model.choice().build(placement, false)?;
    let vocab = model.config().vocab_size as u64;
    let params = SamplingParams {
        temperature: args.temperature,
        max_new_tokens: args.new_tokens,
        ..Default::default()
    };
    eprintln!(
        "model: {} parameters, device {:?}, {} torch threads",
        model.config().num_parameters(),
        placement.device,
        tch::get_num_threads()
    );
    for &batch in &args.batch_sizes {
        let prompts: Vec<Vec<u32>> = (0..batch as u64)
            .map(|b| {
                (0..args.prompt_len as u64)
                    .map(|i| ((b * 7919 + i * 104729) % vocab) as u32)
                    .collect()
            })
            .collect();
        // Warm-up: first calls pay for allocator growth and kernel selection.
        model.generate(
            &prompts[..1],
            &SamplingParams {
                max_new_tokens: 4,
                ..params.clone()
            },
        )?;
        let mut times = Vec::with_capacity(args.repeats);
        let mut generated = 0usize;
        for _ in 0..args.repeats {
            let start = Instant::now();
            let out = model.generate(&prompts, &params)?;
            times.push(start.elapsed().as_secs_f64());
            generated = out.iter().map(|g| g.token_ids.len()).sum();
        }
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
        let out = serde_json::json!({
            "bench": "generate",
            "batch": batch,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "tokens_generated": generated,
            "mean_s": mean,
            "best_s": best,
            "tokens_per_s": generated as f64 / mean,
            "best_tokens_per_s": generated as f64 / best,
            "parameters": model.config().num_parameters(),
            "peak_rss_mb": peak_rss_mb(),
        });
        println!("{out}");
    }
    Ok(())
}

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
