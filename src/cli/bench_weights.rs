//! `agent-r1 bench weights`: one weights version through the data plane over loopback:
//! published (safetensors + SHA-256 manifest), served, fetched, verified and loaded, with the
//! time of each part and the bytes moved.

use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use crate::cli::bench_support::ModelFlags;
use crate::weight_plane::{load_tensors, publish, Fetcher, FetcherConfig, WeightServer};
use agent_r1_actors::device::{parse_placement, parse_storage_dtype};
use agent_r1_envs::access::Access;

/// Flags of `agent-r1 bench weights`.
#[derive(Debug, clap::Args)]
pub(crate) struct WeightsBench {
    #[command(flatten)]
    model: ModelFlags,
    /// float32 or bf16: the precision the weights are published in.
    #[arg(long, default_value = "float32")]
    dtype: String,
    /// Versions published and fetched in turn (the first also pays for cold caches).
    #[arg(long, default_value_t = 3)]
    versions: u64,
    /// Where the published and fetched copies go (default: a temporary directory).
    #[arg(long)]
    scratch: Option<std::path::PathBuf>,
    /// Publish what a LoRA run publishes: adapters of this rank on every projection (0: the
    /// full weights).
    #[arg(long, default_value_t = 0)]
    lora_rank: usize,
}

pub(crate) fn run(args: WeightsBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.versions > 0, "--versions must be at least 1");
    let kind = parse_storage_dtype(&args.dtype)?;
    let placement = parse_placement("cpu", "float32")?;
    tch::manual_seed(0);
    let mut model = args.model.choice().build(placement, false)?;
    let published = if args.lora_rank > 0 {
        model.add_lora(&agent_r1_actors::model::LoraConfig {
            rank: args.lora_rank,
            alpha: 2.0 * args.lora_rank as f64,
            ..Default::default()
        })?;
        // Adapters stay float32 whatever the base's precision.
        model.adapter_variables()
    } else {
        model
            .var_store()
            .variables()
            .into_iter()
            .map(|(name, t)| (name, t.to_kind(kind)))
            .collect()
    };
    let mut tensors: Vec<(String, tch::Tensor)> = published;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let params: i64 = tensors.iter().map(|(_, t)| t.numel() as i64).sum();
    let tmp = tempfile::tempdir().context("a scratch directory")?;
    let scratch = args
        .scratch
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let root = scratch.join("published");
    let server = WeightServer::start(
        "127.0.0.1:0".parse().expect("an address"),
        Access::unauthenticated(),
        &root,
    )?;
    let fetcher = Fetcher::new(
        &server.url(),
        &scratch.join("fetched"),
        FetcherConfig::default(),
    );
    eprintln!(
        "model {}: {params} parameters as {}, served at {}",
        args.model.choice().name(),
        if args.lora_rank > 0 {
            "float32 LoRA adapters"
        } else {
            &args.dtype
        },
        server.url()
    );
    for version in 1..=args.versions {
        let began = Instant::now();
        let published = publish(&root, version, &tensors, 2)?;
        let publish_s = began.elapsed().as_secs_f64();
        let fetched = fetcher.fetch(Some(version))?;
        let began = Instant::now();
        let loaded = load_tensors(&fetched.dir)?;
        let load_s = began.elapsed().as_secs_f64();
        anyhow::ensure!(
            loaded.len() == tensors.len(),
            "loaded {} tensors of {}",
            loaded.len(),
            tensors.len()
        );
        let bytes = published.manifest.bytes();
        let row = json!({
            "bench": "weights",
            "model": args.model.choice().name(),
            "dtype": args.dtype,
            "version": version,
            "bytes": bytes,
            "publish_s": publish_s,
            "fetch_verify_s": fetched.seconds,
            "fetch_mb_per_s": bytes as f64 / 1e6 / fetched.seconds.max(1e-9),
            "load_s": load_s,
            "digest_retries": fetched.digest_retries,
        });
        println!("{row}");
        // Keep the fetched side as small as the published side: only the newest version.
        if version > 1 {
            let _ = std::fs::remove_dir_all(
                scratch.join("fetched").join(format!("v{:08}", version - 1)),
            );
        }
    }
    Ok(())
}
