//! `agent-r1 bench ...`: benchmarks that print figures (not timed tests).

use std::time::Instant;

use super::bench_support::{peak_rss_mb, ModelFlags};
use agent_r1_actors::device::parse_placement;
use agent_r1_actors::model::SamplingParams;

/// Which benchmark.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BenchCmd {
    /// Generation throughput of the policy model at several batch sizes.
    Generate(GenerateBench),
    /// The engine's decode throughput at fixed batch sizes, against the floor of the
    /// device's memory bandwidth.
    Decode(crate::cli::bench_decode::DecodeBench),
    /// A built-in preset (`make demo`'s by default) trained on several seeds: each seed's
    /// held-out EM before and after RL, the lift, the wall time and the spread.
    Demo(crate::cli::bench_demo::DemoBench),
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
        BenchCmd::Demo(args) => crate::cli::bench_demo::run(args),
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
