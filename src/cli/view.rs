//! `agent-r1 view RUN_DIR [--address HOST:PORT]`: serves a run directory's web UI
//! read-only (see [`crate::view`]) until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::metrics_server;
use crate::view::Site;
use anyhow::Context;

/// Flags of `agent-r1 view`.
#[derive(Debug, clap::Args)]
pub(crate) struct ViewArgs {
    /// The run directory (`train --out`), finished or still running.
    run_dir: PathBuf,
    /// Where to listen. Loopback unless told otherwise; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8765")]
    address: String,
}

pub(crate) fn run(args: ViewArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = args.address.parse().map_err(|_| {
        anyhow::anyhow!(
            "--address: got {:?}; allowed: IP:PORT, e.g. 127.0.0.1:8765 (0.0.0.0:PORT serves every interface)",
            args.address
        )
    })?;
    let site = Site::open(&args.run_dir, None).context("agent-r1 view")?;
    let server = metrics_server::serve_ui(addr, Arc::new(site))?;
    if !server.local_addr().ip().is_loopback() {
        eprintln!(
            "warning: serving {} on {} — reachable from other machines",
            args.run_dir.display(),
            server.local_addr()
        );
    }
    // The address line is the contract scripts and tests read.
    println!(
        "serving {} at http://{}/ui",
        args.run_dir.display(),
        server.local_addr()
    );
    server.wait();
    Ok(())
}
