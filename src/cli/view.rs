//! `agent-r1 view RUN_DIR [--address HOST:PORT]`: serves a run directory's web UI
//! read-only (see [`crate::view`]) until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::metrics_server;
use crate::view::Site;
use agent_r1_envs::access::{Access, AccessKeys};
use anyhow::Context;

/// Flags of `agent-r1 view`.
#[derive(Debug, clap::Args)]
pub(crate) struct ViewArgs {
    /// The run directory (`train --out`), finished or still running.
    run_dir: PathBuf,
    /// Where to listen. Loopback unless told otherwise (then `--token-file` is required);
    /// port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8765")]
    address: String,
    /// File whose first line is the bearer token every request must carry.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// A path served without the token (repeatable), e.g. `/healthz`; `/ui/*` opens a prefix.
    #[arg(long = "open-path")]
    open_paths: Vec<String>,
}

const KEYS: AccessKeys = AccessKeys {
    section: "",
    address: "--address",
    token_file: "--token-file",
    open_paths: "--open-path",
};

pub(crate) fn run(args: ViewArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = args.address.parse().map_err(|_| {
        anyhow::anyhow!(
            "--address: got {:?}; allowed: IP:PORT, e.g. 127.0.0.1:8765 (0.0.0.0:PORT serves every interface)",
            args.address
        )
    })?;
    let access = Access::load(KEYS, addr, args.token_file.as_deref(), &args.open_paths)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let site = Site::open(&args.run_dir, None).context("agent-r1 view")?;
    let server = metrics_server::serve_ui(addr, access, Arc::new(site))?;
    // The address line is the contract scripts and tests read.
    println!(
        "serving {} at http://{}/ui",
        args.run_dir.display(),
        server.local_addr()
    );
    server.wait();
    Ok(())
}
