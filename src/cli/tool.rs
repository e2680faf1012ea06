//! `agent-r1 tool call NAME --args JSON [--config FILE]`: builds one tool from the registry
//! (with its `[tools.NAME]` options from the config), validates the arguments against its
//! schema, runs it once with its timeout and prints the observation. A failed call prints
//! the observation the model would see and exits non-zero.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_r1_envs::call_guard::execute;
use agent_r1_envs::tools::{ToolRegistry, ToolsConfig};
use anyhow::Context;

use crate::config::{FileCheck, TrainConfig};
use crate::registries::Registries;

/// Arguments of `agent-r1 tool call`.
#[derive(Debug, clap::Args)]
pub(crate) struct ToolCallArgs {
    /// The tool's name as the model calls it (`search`, `calculator`, `python`, a configured
    /// table name, or a tool of a configured MCP server).
    name: String,
    /// The call's arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// A training config (its tools as the run builds them, the env's search corpus
    /// included), or a TOML file of `[tools.NAME]` tables.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the tool's OpenAI function spec instead of calling it.
    #[arg(long)]
    spec: bool,
}

/// The tools of `--config`: a training config's (its `[tools.*]` tables with the corpus its
/// env names, as `train` builds them), or a file of `[tools.*]` tables alone.
fn tools_of(config: Option<&Path>, registries: &Registries) -> anyhow::Result<ToolsConfig> {
    let Some(path) = config else {
        return Ok(ToolsConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let is_training_config = toml::from_str::<toml::Table>(&text)
        .map(|t| t.contains_key("env"))
        .unwrap_or(false);
    if is_training_config {
        let cfg = TrainConfig::load(path, FileCheck::Skip, registries)?;
        Ok(cfg.tools_config(None))
    } else {
        Ok(ToolsConfig::load(path)?)
    }
}

pub(crate) async fn run(
    args: ToolCallArgs,
    config: ToolsConfig,
    registry: ToolRegistry,
) -> anyhow::Result<()> {
    let arguments: serde_json::Value = serde_json::from_str(&args.args)
        .with_context(|| format!("--args is not JSON: {}", args.args))?;
    let name = args.name.clone();
    // Building may start a server or index a corpus: keep it off the async workers.
    let tool = tokio::task::spawn_blocking(move || config.build_one(&registry, &name))
        .await
        .context("building the tool")??;
    if args.spec {
        println!("{}", serde_json::to_string_pretty(&tool.spec())?);
        return Ok(());
    }
    let outcome = execute(Arc::clone(&tool), arguments).await;
    let text = outcome.observation(usize::MAX);
    match &outcome.result {
        Ok(_) => {
            println!("{text}");
            eprintln!("({} in {:?})", tool.name(), outcome.latency);
            Ok(())
        }
        Err(e) => {
            println!("{text}");
            anyhow::bail!("tool `{}` call failed ({})", tool.name(), e.kind())
        }
    }
}

/// `agent-r1 tool ...` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ToolCmd {
    /// Call one tool once and print its observation.
    Call(ToolCallArgs),
}

/// Runs a `tool` subcommand on its own runtime (for a sync `main`).
pub(crate) fn run_cmd(cmd: ToolCmd, registries: &Registries) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cmd {
        ToolCmd::Call(args) => {
            let config = tools_of(args.config.as_deref(), registries)?;
            runtime.block_on(run(args, config, registries.tools.clone()))
        }
    }
}
