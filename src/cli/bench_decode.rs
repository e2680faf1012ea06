//! `agent-r1 bench decode`: the engine's decode throughput at fixed batch sizes, and each
//! decode step against the floor the device's memory bandwidth sets (every weight and every
//! attended key and value read once per step).

use std::time::Instant;

use agent_r1_actors::device::parse_placement;
use agent_r1_actors::engine::{
    start_supervised, EngineConfig, EngineHandle, EngineRestartPolicy, TurnOutput, TurnRequest,
};
use agent_r1_actors::model::{ModelConfig, Placement, SamplingParams};
use anyhow::Context;
use tch::{Device, Kind, Tensor};

use crate::cli::bench_support::{peak_rss_mb, ModelFlags};
use crate::config::{ENGINE_MAX_PENDING, ENGINE_REQUEST_TIMEOUT};

/// Flags of `agent-r1 bench decode`.
#[derive(Debug, clap::Args)]
pub(crate) struct DecodeBench {
    #[command(flatten)]
    model: ModelFlags,
    /// Comma-separated batch sizes (rows decoded together).
    #[arg(long, default_value = "1,64,256", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// Tokens generated per sequence (no early stop).
    #[arg(long, default_value_t = 256)]
    new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Repetitions per batch size (the best is reported).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// float32, bf16 (CUDA) or auto.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Decode without CUDA graphs (on a GPU they are used where they can be captured).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Re-score this many of the last repeat's sequences with a plain forward pass (no KV
    /// cache, no graph) and report how far the engine's log-probabilities are from it.
    #[arg(long, default_value_t = 0)]
    verify: usize,
}

pub(crate) fn run(args: DecodeBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.repeats > 0, "--repeats: got 0; allowed: >= 1");
    anyhow::ensure!(args.prompt_len > 0, "--prompt-len: got 0; allowed: >= 1");
    anyhow::ensure!(args.new_tokens > 0, "--new-tokens: got 0; allowed: >= 1");
    anyhow::ensure!(
        !args.batch_sizes.is_empty() && args.batch_sizes.iter().all(|&b| b > 0),
        "--batch-sizes: every batch size must be >= 1"
    );
    let placement = parse_placement(&args.device, &args.dtype)?;
    let choice = args.model.choice();
    let config = choice.config()?;
    let name = choice.name();
    let bandwidth = copy_bandwidth(placement.device)?;
    eprintln!(
        "model {name}: {} parameters, {:?} {:?}; copy bandwidth {:.1} GB/s",
        config.num_parameters(),
        placement.device,
        placement.kind,
        bandwidth / 1e9
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    for &batch in &args.batch_sizes {
        let engine = runtime.block_on(start_engine(&args, placement, batch))?;
        let vocab = config.vocab_size as u64;
        let prompt = |episode: u64| -> Vec<u32> {
            (0..args.prompt_len as u64)
                .map(|i| ((episode * 7919 + i * 104_729) % vocab) as u32)
                .collect()
        };
        let params = SamplingParams {
            temperature: args.temperature,
            max_new_tokens: args.new_tokens,
            ..Default::default()
        };
        // Warm-up: the first passes pay for allocator growth and kernel selection.
        runtime.block_on(run_batch(&engine, 1, u64::MAX - 1, &prompt, &params))?;
        let mut best: Option<Measured> = None;
        let mut last = Vec::new();
        for repeat in 0..args.repeats {
            let before = runtime.block_on(engine.stats())?;
            let began = Instant::now();
            let first = (repeat * batch) as u64;
            last = runtime.block_on(run_batch(&engine, batch, first, &prompt, &params))?;
            let wall = began.elapsed().as_secs_f64();
            let after = runtime.block_on(engine.stats())?;
            let m = Measured {
                wall,
                steps: after.decode_steps - before.decode_steps,
                rows: after.decode_rows - before.decode_rows,
                decode_seconds: after.decode_seconds - before.decode_seconds,
                tokens: after.tokens_generated - before.tokens_generated,
            };
            if best.as_ref().is_none_or(|b| m.wall < b.wall) {
                best = Some(m);
            }
        }
        let stats = runtime.block_on(engine.stats())?;
        engine.shutdown();
        let verified = match args.verify {
            0 => None,
            n => Some(verify(&args, placement, &last, n, &prompt)?),
        };
        let m = best.expect("at least one repeat");
        let step_s = m.decode_seconds / m.steps.max(1) as f64;
        let floor = Floor::of(&config, placement, batch, &args).seconds(bandwidth);
        let out = serde_json::json!({
            "bench": "decode",
            "model": name,
            "device": format!("{:?}", placement.device),
            "dtype": format!("{:?}", placement.kind),
            "batch": batch,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "tokens_generated": m.tokens,
            "wall_s": m.wall,
            "tokens_per_s": m.tokens as f64 / m.wall,
            "decode_tokens_per_s": m.rows as f64 / m.decode_seconds.max(1e-12),
            "decode_steps": m.steps,
            "step_ms": step_s * 1e3,
            "floor_ms": floor * 1e3,
            "floor_fraction": floor / step_s.max(1e-12),
            "copy_bandwidth_gb_s": bandwidth / 1e9,
            "parameters": config.num_parameters(),
            "peak_rss_mb": peak_rss_mb(),
            "graph_decode_steps": stats.graph_decode_steps,
            "graphs_captured": stats.graphs_captured,
            "cuda_graphs_off": stats.cuda_graphs_off,
            "verify": verified,
        });
        println!("{out}");
    }
    Ok(())
}

struct Measured {
    wall: f64,
    steps: u64,
    rows: u64,
    decode_seconds: f64,
    tokens: u64,
}

/// Bytes one decode step must read at the least: every weight once, and the keys and values
/// of every row's context (on average half-way through the generation).
struct Floor {
    bytes: f64,
}

impl Floor {
    fn of(config: &ModelConfig, placement: Placement, batch: usize, args: &DecodeBench) -> Self {
        let element = placement.kind.elt_size_in_bytes() as f64;
        let weights = config.num_parameters() as f64 * element;
        let context = args.prompt_len as f64 + args.new_tokens as f64 / 2.0;
        let per_token =
            (config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim) as f64
                * element;
        Self {
            bytes: weights + batch as f64 * context * per_token,
        }
    }

    fn seconds(&self, bandwidth: f64) -> f64 {
        self.bytes / bandwidth
    }
}

/// An engine as `train` starts one (its actor, the default restart policy).
async fn start_engine(
    args: &DecodeBench,
    placement: Placement,
    batch: usize,
) -> anyhow::Result<EngineHandle> {
    let model = args.model.clone();
    let context = args.prompt_len + args.new_tokens + 1;
    let config = EngineConfig {
        max_batch_rows: batch,
        max_batch_tokens: batch * context,
        max_context: context,
        parked_kv_bytes: 0,
        kv_reuse: false,
        prefault_parked_kv: false,
        cuda_graphs: !args.no_cuda_graphs,
        max_pending: ENGINE_MAX_PENDING,
        request_timeout: ENGINE_REQUEST_TIMEOUT,
        seed: 0,
        metrics_label: "0".into(),
        memory_fraction: None,
        max_prefill_tokens: 16_384,
    };
    let (engine, _actor) = start_supervised(
        std::sync::Arc::new(move || {
            model
                .choice()
                .build(placement, false)
                .map_err(|e| agent_r1_actors::Error::invalid("bench decode model", e.to_string()))
        }),
        None,
        config,
        EngineRestartPolicy::default(),
        None,
    )
    .await
    .context("starting the engine")?;
    Ok(engine)
}

/// `batch` turns at once, episodes `first..`, each generating `params.max_new_tokens`.
async fn run_batch(
    engine: &EngineHandle,
    batch: usize,
    first: u64,
    prompt: &dyn Fn(u64) -> Vec<u32>,
    params: &SamplingParams,
) -> anyhow::Result<Vec<(u64, TurnOutput)>> {
    let turns: Vec<_> = (0..batch as u64)
        .map(|i| {
            let engine = engine.clone();
            let request = TurnRequest {
                episode: first.wrapping_add(i),
                context: prompt(first.wrapping_add(i)),
                params: params.clone(),
                stop_strings: vec![],
            };
            let episode = request.episode;
            tokio::spawn(async move { engine.generate(request).await.map(|out| (episode, out)) })
        })
        .collect();
    let mut outputs = Vec::with_capacity(batch);
    for turn in turns {
        outputs.push(turn.await??);
    }
    Ok(outputs)
}

/// The engine's log-probabilities of the first `n` sequences of `outputs` against a plain
/// forward pass of the same tokens (the model loaded again, no KV cache, no graph): the
/// largest and mean absolute difference over every generated token.
fn verify(
    args: &DecodeBench,
    placement: Placement,
    outputs: &[(u64, TurnOutput)],
    n: usize,
    prompt: &dyn Fn(u64) -> Vec<u32>,
) -> anyhow::Result<serde_json::Value> {
    let model = args
        .model
        .choice()
        .build(placement, false)
        .context("loading the model again to verify")?;
    let (mut max, mut sum, mut count) = (0f64, 0f64, 0usize);
    for (episode, out) in outputs.iter().take(n) {
        let mut ids = prompt(*episode);
        let context = ids.len();
        ids.extend(&out.token_ids);
        let logits = model.sequence_logits(&ids[..ids.len() - 1])?;
        let scale = if args.temperature > 0.0 {
            args.temperature
        } else {
            1.0
        };
        let generated = out.token_ids.len() as i64;
        let tokens: Vec<i64> = out.token_ids.iter().map(|&t| t as i64).collect();
        let tokens = Tensor::from_slice(&tokens).to_device(placement.device);
        let reference: Vec<f64> = Vec::try_from(
            (logits.narrow(0, context as i64 - 1, generated) / scale)
                .log_softmax(-1, Kind::Float)
                .gather(1, &tokens.unsqueeze(1), false)
                .to_kind(Kind::Double)
                .view([-1])
                .to_device(Device::Cpu),
        )?;
        for (&reference, &engine) in reference.iter().zip(&out.logprobs) {
            let diff = (reference - engine as f64).abs();
            max = max.max(diff);
            sum += diff;
            count += 1;
        }
    }
    Ok(serde_json::json!({
        "sequences": n.min(outputs.len()),
        "tokens": count,
        "max_abs_logprob_diff": max,
        "mean_abs_logprob_diff": sum / count.max(1) as f64,
    }))
}

/// Bytes per second of a large device-to-device copy (each byte read once and written once).
fn copy_bandwidth(device: Device) -> anyhow::Result<f64> {
    let bytes: i64 = if device.is_cuda() { 1 << 30 } else { 256 << 20 };
    let src = Tensor::f_ones([bytes / 4], (Kind::Float, device))?;
    let mut dst = src.f_empty_like()?;
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    dst.f_copy_(&src)?;
    sync();
    let reps = 5;
    let began = Instant::now();
    for _ in 0..reps {
        dst.f_copy_(&src)?;
    }
    sync();
    Ok(2.0 * bytes as f64 * reps as f64 / began.elapsed().as_secs_f64())
}
