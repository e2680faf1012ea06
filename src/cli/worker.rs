//! `agent-r1 worker --join HOST:PORT --cookie-file F`: a remote rollout worker for a running
//! `train` (see [`crate::cluster::worker`]). The last stdout line is a JSON summary.

use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::worker::{self, WorkerArgs};
use crate::cluster::worker_faults::WorkerFaults;
use crate::registries::Registries;
use crate::setup;

/// Flags of `agent-r1 worker`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerCmdArgs {
    /// The trainer's `[cluster] listen` address, HOST:PORT.
    #[arg(long)]
    join: String,
    /// File whose first line is the cluster's cookie (the trainer's `cluster.cookie_file`).
    #[arg(long)]
    cookie_file: PathBuf,
    /// This worker's name, unique in the cluster (default: worker-PID).
    #[arg(long)]
    name: Option<String>,
    /// A device for an engine (repeat for several): `cpu`, `cuda:N`. Default: the trainer
    /// config's `rollout.devices` / `model.device`.
    #[arg(long = "device")]
    devices: Vec<String>,
    /// Episodes at once (default: the trainer config's `rollout.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Where fetched weights and the env's files go (default: a directory under the system's
    /// temporary directory, named after the worker).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Join over TLS (the trainer has `[cluster.tls]`), trusting the certificates in this PEM
    /// file (the trainer's own, or the authority that signed it).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// The name the trainer's certificate must carry (default: the host of --join).
    #[arg(long, requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// Serve this worker's Prometheus metrics (`/metrics`, `/healthz`) on HOST:PORT.
    #[arg(long)]
    metrics_address: Option<String>,
    /// File whose first line is the bearer token `/metrics` and `/healthz` want (required
    /// when --metrics-address is not loopback).
    #[arg(long, requires = "metrics_address")]
    metrics_token_file: Option<PathBuf>,
    /// A metrics path served without the token (repeatable), e.g. `/metrics`.
    #[arg(long = "metrics-open-path", requires = "metrics_token_file")]
    metrics_open_paths: Vec<String>,
    /// Seconds to wait for the trainer to accept and welcome this worker.
    #[arg(long, default_value_t = 60.0)]
    join_timeout_secs: f64,
    /// Fault injection (hidden flags, in a build with `fault-injection` only).
    #[cfg(feature = "fault-injection")]
    #[command(flatten)]
    faults: WorkerFaultFlags,
}

pub(crate) fn run(args: WorkerCmdArgs, registries: Registries) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.join_timeout_secs.is_finite() && args.join_timeout_secs > 0.0,
        "--join-timeout-secs: {} (allowed: a positive number of seconds)",
        args.join_timeout_secs
    );
    let name = args
        .name
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    anyhow::ensure!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "--name: {name:?} (allowed: letters, digits, '-', '_', '.')"
    );
    let dir = args
        .dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("agent-r1-{name}")));
    let rt = setup::actor_runtime()?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    rt.spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let summary = rt.block_on(worker::run(
        WorkerArgs {
            join: args.join,
            cookie_file: args.cookie_file,
            name,
            devices: args.devices,
            concurrency: args.concurrency,
            dir,
            join_timeout: Duration::from_secs_f64(args.join_timeout_secs),
            registries,
            metrics_address: args.metrics_address,
            metrics_token_file: args.metrics_token_file,
            metrics_open_paths: args.metrics_open_paths,
            #[cfg(feature = "fault-injection")]
            faults: args.faults.into(),
            #[cfg(not(feature = "fault-injection"))]
            faults: WorkerFaults,
            tls_ca: args.tls_ca,
            tls_server_name: args.tls_server_name,
        },
        stop,
    ))?;
    println!("{summary}");
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}

/// The hidden fault-injection flags of `worker`, for the cluster's tests.
#[cfg(feature = "fault-injection")]
#[derive(Debug, clap::Args)]
struct WorkerFaultFlags {
    /// Fault injection for tests: on receiving this many leases, stop doing anything
    /// (nothing more is sent, as a hung machine), until killed.
    #[arg(long, hide = true)]
    freeze_at_lease: Option<u64>,
    /// Fault injection for tests: from this many leases on, leases are held without running
    /// until the trainer has dropped this worker and taken it back.
    #[arg(long, hide = true)]
    hold_from_lease: Option<u64>,
    /// Fault injection for tests: the first weight swap after joining first waits this many
    /// seconds, as loading a large model would.
    #[arg(long, hide = true)]
    slow_swap_secs: Option<f64>,
}

#[cfg(feature = "fault-injection")]
impl From<WorkerFaultFlags> for WorkerFaults {
    fn from(f: WorkerFaultFlags) -> Self {
        Self {
            freeze_at_lease: f.freeze_at_lease,
            hold_from_lease: f.hold_from_lease,
            slow_swap: f
                .slow_swap_secs
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64),
        }
    }
}
