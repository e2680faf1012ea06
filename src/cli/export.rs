//! `agent-r1 export --merge`: a LoRA adapter folded into its base, written as a plain
//! Hugging Face model directory that `transformers` (or any server) loads without `peft`.

use std::path::PathBuf;

use agent_r1_actors::device::parse_storage_dtype;
use agent_r1_actors::model::lora::{read_adapter_base, AdapterSource};
use agent_r1_actors::model::{Placement, PolicyModel};
use anyhow::Context;

#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// Merge the adapter into its base's weights (`W + scale * B A` per adapted projection).
    #[arg(long, required = true)]
    merge: bool,
    /// The adapter: PEFT's format, or a training checkpoint's `policy` directory when
    /// adapters trained.
    #[arg(long)]
    adapter: PathBuf,
    /// The base model directory; by default the adapter's `base_model_name_or_path`.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The directory to write (config, tokenizer, safetensors shards).
    #[arg(long)]
    out: PathBuf,
    /// Precision of the written weights: the base's stored precision (`auto`), `bf16`,
    /// `float16` or `float32`.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Write into a directory that already holds a model.
    #[arg(long)]
    force: bool,
}

pub(crate) fn run(args: ExportArgs) -> anyhow::Result<()> {
    let base = match args.model {
        Some(dir) => dir,
        None => read_adapter_base(&args.adapter)?
            .map(PathBuf::from)
            .with_context(|| {
                format!(
                    "{}: adapter_config.json names no base_model_name_or_path; give --model BASE",
                    args.adapter.display()
                )
            })?,
    };
    anyhow::ensure!(
        base.join("config.json").is_file(),
        "--model: {} is not a model directory (no config.json)",
        base.display()
    );
    let dtype = match args.dtype.as_str() {
        "auto" => None,
        name => Some(
            parse_storage_dtype(name)
                .map_err(|e| anyhow::anyhow!("{e}, or auto (the base's own)"))?,
        ),
    };
    if args.out.join("config.json").exists() && !args.force {
        anyhow::bail!(
            "--out: {} already holds a model (config.json); pass --force to overwrite it",
            args.out.display()
        );
    }
    anyhow::ensure!(
        args.out != base && args.out != args.adapter,
        "--out: {} is the base or the adapter itself; write the merged model elsewhere",
        args.out.display()
    );
    // Merged in float32 on the CPU whatever the stored precision: one rounding, at the end.
    let adapter = AdapterSource {
        config: Default::default(),
        from: Some(args.adapter.clone()),
    };
    let model = PolicyModel::load_adapted(&base, Placement::default(), false, Some(&adapter))?;
    let lora = model
        .lora()
        .context("the adapter attached no projections")?;
    let dtype = dtype.unwrap_or_else(|| model.stored_kind());
    model.save_as(&args.out, Some(&base), dtype)?;
    println!(
        "{}",
        serde_json::json!({
            "out": args.out.display().to_string(),
            "base": base.display().to_string(),
            "adapter": args.adapter.display().to_string(),
            "rank": lora.rank,
            "alpha": lora.alpha,
            "dtype": format!("{dtype:?}"),
            "parameters": model.config().num_parameters(),
        })
    );
    Ok(())
}
