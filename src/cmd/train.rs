//! `agent-r1 train --config FILE.toml [--out DIR] [--resume]`: the training daemon (see
//! [`agent_r1::train`]). Logs go to stderr; the last stdout line is one JSON summary.

use std::path::PathBuf;

use agent_r1::train::{self, TrainArgs};

/// Flags of `agent-r1 train`.
#[derive(Debug, clap::Args)]
pub(crate) struct TrainCmdArgs {
    /// The training config (see examples/*.toml and `check-config`).
    #[arg(long)]
    config: PathBuf,
    /// Run directory (default: the config's training.run_dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the newest complete checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
}

pub(crate) fn run(args: TrainCmdArgs) -> anyhow::Result<()> {
    let summary = train::run(&TrainArgs {
        config: args.config,
        out: args.out,
        resume: args.resume,
    })?;
    println!("{summary}");
    Ok(())
}
