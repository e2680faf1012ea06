//! `agent-r1 tool call NAME --args JSON [--config FILE]`: builds one tool from the registry
//! (with its `[tools.NAME]` options from the config), validates the arguments against its
//! schema, runs it once with its timeout and prints the observation. A failed call prints
//! the observation the model would see and exits non-zero.

use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_envs::call_guard::execute;
use agent_r1_envs::tools::{ToolRegistry, ToolsConfig};
use anyhow::Context;

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
    /// TOML config whose `[tools.NAME]` tables hold the tools' options.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the tool's OpenAI function spec instead of calling it.
    #[arg(long)]
    spec: bool,
}

pub(crate) async fn run(args: ToolCallArgs, registry: ToolRegistry) -> anyhow::Result<()> {
    let arguments: serde_json::Value = serde_json::from_str(&args.args)
        .with_context(|| format!("--args is not JSON: {}", args.args))?;
    let config = match &args.config {
        Some(path) => ToolsConfig::load(path)?,
        None => ToolsConfig::default(),
    };
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
        ToolCmd::Call(args) => runtime.block_on(run(args, registries.tools.clone())),
    }
}
