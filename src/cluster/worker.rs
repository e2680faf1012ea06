//! `agent-r1 worker`: engines, episodes and tools on another machine, for a running `train`.
//! It joins the trainer's node, is welcomed with the run's config and weight server, fetches
//! and verifies the current weights before it samples, then runs the episodes it is leased
//! and reports each trajectory. New versions are fetched while it samples and swapped in
//! between engine steps. It renews its leases with heartbeats, reconnects after losing the
//! trainer (its leases may have been re-queued meanwhile: the trainer keeps the first
//! trajectory of each episode), and leaves on SIGTERM, returning its leases.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::model::lora::{read_adapter_config, AdapterSource};
use agent_r1_actors::runtime::{EpisodeRequest, LiveBoard, RolloutService, RETRY_BIT};
use agent_r1_actors::stall::StallWatch;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::Trajectory;
use agent_r1_actors::weight_digest::WeightDigest;
use agent_r1_envs::access::{check_exposure, AccessKeys};

use super::wire::{worker_group, ClusterMsg, Wire};
use super::worker_faults::WorkerFaults;
use super::{read_cookie, tell_coordinator, Node, SessionEvent};
use crate::config::{FileCheck, MetricsSection, TrainConfig};
use crate::metrics_server;
use crate::registries::Registries;
use crate::train::{rollout_setups, scenario, start_engines};
use crate::weight_plane::{load_policy, Fetcher, FetcherConfig};

/// What `agent-r1 worker` was asked to do.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// The trainer's `[cluster] listen` address.
    pub join: String,
    /// The cookie file.
    pub cookie_file: PathBuf,
    /// This worker's name (unique in the cluster).
    pub name: String,
    /// Devices for its engines (empty: the trainer config's).
    pub devices: Vec<String>,
    /// Episodes at once (None: the trainer config's `rollout.concurrency`).
    pub concurrency: Option<usize>,
    /// Where it keeps fetched weights and the env's files.
    pub dir: PathBuf,
    /// How long to wait for the trainer to accept and welcome it.
    pub join_timeout: Duration,
    /// The tool and env kinds the config may name.
    pub registries: Registries,
    /// Serve `/metrics` and `/healthz` here.
    pub metrics_address: Option<String>,
    /// The bearer token they want (required off loopback).
    pub metrics_token_file: Option<PathBuf>,
    /// Paths served without it.
    pub metrics_open_paths: Vec<String>,
    /// Join over TLS, trusting the certificates in this PEM file.
    pub tls_ca: Option<PathBuf>,
    /// The name the trainer's certificate must carry (default: the host of `join`).
    pub tls_server_name: Option<String>,
    /// Fault injection for tests (inert in a build without `fault-injection`).
    pub faults: WorkerFaults,
}

/// Forwards what the trainer says to the worker's loop.
struct Agent;

impl Actor for Agent {
    type Msg = ClusterMsg<()>;
    type State = mpsc::UnboundedSender<Wire>;
    type Arguments = (String, mpsc::UnboundedSender<Wire>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (name, tx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(worker_group(&name), vec![myself.get_cell()]);
        Ok(tx)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ClusterMsg::Wire(wire) => {
                let _ = tx.send(wire);
            }
            ClusterMsg::Malformed(what) => {
                tracing::warn!("a cluster message that does not decode: {what}");
            }
            ClusterMsg::Local(()) => {}
        }
        Ok(())
    }
}

/// A task stopped when its owner is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The welcome's content.
struct Welcome {
    config: String,
    weights_url: String,
    weights_token: Option<String>,
    version: u64,
    manifest_sha256: String,
    base_manifest_sha256: Option<String>,
    heartbeat: Duration,
}

/// The flags that set the worker's metrics endpoint, as its errors name them.
const METRICS_FLAGS: AccessKeys = AccessKeys {
    section: "",
    address: "--metrics-address",
    token_file: "--metrics-token-file",
    open_paths: "--metrics-open-path",
};

/// Runs a worker until the trainer says stop, a signal, or an error; returns its summary.
pub async fn run(
    args: WorkerArgs,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Value> {
    let cookie = read_cookie(&args.cookie_file)?;
    let live = LiveBoard::default();
    let stall = StallWatch::new(Default::default());
    let _metrics = match &args.metrics_address {
        None => None,
        Some(address) => {
            let section = MetricsSection {
                address: address.clone(),
                token_file: args.metrics_token_file.clone(),
                open_paths: args.metrics_open_paths.clone(),
                ui: false,
                ..MetricsSection::default()
            };
            let addr = section
                .socket_addr()
                .map_err(|e| anyhow::anyhow!("--metrics-address: {e}"))?;
            // Named by the flags that set them, before the section's own check.
            check_exposure(
                METRICS_FLAGS,
                addr,
                section.token_file.as_deref(),
                &section.open_paths,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            section
                .check()
                .map_err(|e| anyhow::anyhow!("--metrics-address: {e}"))?;
            let progress = metrics_server::Progress {
                board: live.clone(),
                stalls: stall.detector.clone(),
            };
            let server = metrics_server::start(&section, None, Some(progress))?;
            eprintln!(
                "worker {}: metrics at http://{}/metrics",
                args.name,
                server.local_addr()
            );
            Some(server)
        }
    };
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("{}: cannot create the worker directory", args.dir.display()))?;
    let mut node = Node::start(&args.name, "worker", cookie).await?;
    if let Some(ca) = &args.tls_ca {
        let host = args
            .join
            .rsplit_once(':')
            .map_or(args.join.as_str(), |(h, _)| h);
        let name = args.tls_server_name.as_deref().unwrap_or(host);
        let (connector, name) = super::tls::connector(ca, name)?;
        node = node.with_client_tls(connector, name);
    }
    node.connect(&args.join).await?;
    let deadline = Instant::now() + args.join_timeout;
    wait_authenticated(&mut node, &args.join, deadline).await?;
    let (tx, mut inbox) = mpsc::unbounded_channel();
    let (agent, _agent_join) = Actor::spawn(None, Agent, (args.name.clone(), tx))
        .await
        .map_err(|e| anyhow::anyhow!("starting the worker's agent: {e}"))?;
    let welcome = wait_welcome(&args, &mut inbox, deadline).await?;
    let mut cfg = TrainConfig::from_toml_str(&welcome.config)
        .map_err(|e| anyhow::anyhow!("the trainer's config: {e}"))?;
    if !args.devices.is_empty() {
        cfg.rollout.devices = args.devices.clone();
    }
    if let Some(n) = args.concurrency {
        cfg.rollout.concurrency = n;
    }
    cfg.metrics.enabled = false;
    cfg.validate(FileCheck::Skip, &args.registries)
        .map_err(|e| anyhow::anyhow!("the trainer's config on this worker: {e}"))?;
    let slots = cfg.rollout.concurrency.max(1) as u32;

    let fetcher = Arc::new(
        Fetcher::new(
            &welcome.weights_url,
            &args.dir.join("weights"),
            FetcherConfig::default(),
        )
        .with_token(welcome.weights_token.as_deref()),
    );
    // Setting up takes longer than a lease on a busy machine: say it is alive meanwhile.
    let setting_up = keepalive(
        heartbeat(&args.name, None, slots, &HashMap::new()),
        welcome.heartbeat,
    );
    let first = fetch(
        fetcher.clone(),
        welcome.version,
        welcome.manifest_sha256.clone(),
    )
    .await?;
    // With LoRA, the versions are adapters over a frozen base fetched once.
    let base = match &welcome.base_manifest_sha256 {
        Some(sha256) => Some(fetch_base(fetcher.clone(), sha256.clone()).await?),
        None => None,
    };
    let scenario_dir = args.dir.join("env");
    let registries = args.registries.clone();
    let (engine, scenario, tokenizer) = {
        let cfg = cfg.clone();
        let (first, base) = (first.clone(), base.clone());
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let scenario = scenario(&cfg, &scenario_dir, &registries)?;
            // The adapters' settings come with each version; the weights arrive by swap.
            let (model_dir, adapter) = match &base {
                Some(base) => (
                    base.clone(),
                    Some(AdapterSource {
                        config: read_adapter_config(&first)?,
                        from: None,
                    }),
                ),
                None => (first.clone(), None),
            };
            let engine = start_engines(&rt, &cfg, &model_dir, adapter.as_ref(), None)?;
            let tokenizer = Arc::new(
                HfTokenizer::from_dir(&model_dir)?
                    .with_template_kwargs(cfg.model.chat_template_kwargs.clone())?,
            );
            Ok((engine, scenario, tokenizer))
        })
        .await
        .context("building the worker's engines")??
    };
    swap(&engine, welcome.version, &first).await?;
    drop(setting_up);
    let mut faults = args.faults.clone();
    let mut version = welcome.version;
    // The directory of the version the engines serve: a restarted engine is sent it again.
    let mut serving = first.clone();
    let mut restarted = engine.restarted();
    eprintln!(
        "worker {}: joined {} with weights version {version} ({} slots)",
        args.name, args.join, slots
    );
    let stall = StallWatch::new(cfg.stall.clone());
    let (setup, _) = rollout_setups(
        &cfg,
        &engine,
        &tokenizer,
        &scenario,
        &LiveBoard::default(),
        &stall,
    )?;
    let (sink, mut finished) = mpsc::channel::<Trajectory>(slots as usize * 2);
    let service = RolloutService::start(setup, sink)
        .await
        .context("starting the worker's rollout service")?;
    let (submit_tx, mut submit_rx) = mpsc::unbounded_channel::<EpisodeRequest>();
    let sender = service.tasks();
    let feeder = tokio::spawn(async move {
        while let Some(r) = submit_rx.recv().await {
            if sender.submit(r).await.is_err() {
                return;
            }
        }
    });

    let mut held: HashMap<u64, u64> = HashMap::new();
    let mut leases_received = 0u64;
    let mut episodes = 0u64;
    let mut versions_sampled: Vec<u64> = Vec::new();
    let mut renew_every = tokio::time::interval(welcome.heartbeat);
    renew_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (fetched_tx, mut fetched_rx) = mpsc::unbounded_channel::<FetchResult>();
    let mut fetching: Option<u64> = None;
    let mut wanted = (version, welcome.manifest_sha256.clone());
    let mut connected = true;
    let mut rejoined = false;
    let mut on_hold: Vec<EpisodeRequest> = Vec::new();
    let mut unsent: Vec<Wire> = Vec::new();
    let say = tell_coordinator;
    say(heartbeat(&args.name, Some(version), slots, &held));
    let reason = loop {
        tokio::select! {
            wire = inbox.recv() => {
                let Some(wire) = wire else { break "the agent stopped".to_string() };
                match wire {
                    Wire::Lease { lease, group_id, episode_id, task } => {
                        leases_received += 1;
                        faults.on_lease(&args.name, lease, episode_id, leases_received).await;
                        if let Some(old) = held.insert(episode_id & !RETRY_BIT, lease) {
                            // Leased again after this worker was dropped: the copy it already
                            // runs reports under the new lease; one episode id runs once here.
                            tracing::info!(episode_id, old, lease, "an episode leased again; not run twice");
                            continue;
                        }
                        let request = EpisodeRequest { task, group_id, episode_id, resume: None };
                        if !rejoined && faults.holds(leases_received) {
                            eprintln!(
                                "worker {}: fault injection: lease {lease} (episode {episode_id}) held until it rejoins",
                                args.name
                            );
                            on_hold.push(request);
                        } else {
                            let _ = submit_tx.send(request);
                        }
                    }
                    Wire::Weights { version: v, manifest_sha256 } => {
                        if v > wanted.0 {
                            wanted = (v, manifest_sha256);
                        }
                        if wanted.0 > version && fetching.is_none() {
                            fetching = Some(wanted.0);
                            start_fetch(fetcher.clone(), fetched_tx.clone(), wanted.clone());
                        }
                    }
                    Wire::Stop => break "the trainer finished the run".to_string(),
                    Wire::Welcome { .. } => {
                        // Welcomed again: the trainer had dropped this worker (a partition
                        // longer than a lease) and took it back.
                        eprintln!("worker {}: welcomed again after being dropped", args.name);
                        rejoined = true;
                        for request in on_hold.drain(..) {
                            let _ = submit_tx.send(request);
                        }
                    }
                    other => tracing::warn!(message = ?other, "a worker-bound message of the wrong direction; ignored"),
                }
            }
            t = finished.recv() => {
                let Some(t) = t else { break "the rollout service stopped".to_string() };
                let Some(lease) = held.remove(&(t.episode_id & !RETRY_BIT)) else { continue };
                episodes += 1;
                for v in t.steps.iter().flat_map(|s| s.versions()) {
                    if !versions_sampled.contains(&v) {
                        versions_sampled.push(v);
                    }
                }
                let done = Wire::Done { worker: args.name.clone(), lease, trajectory: Box::new(t) };
                if !connected || !say(done.clone()) {
                    // Sent again once the trainer is back (it keeps the first of each episode).
                    unsent.push(done);
                }
            }
            done = fetched_rx.recv() => {
                fetching = None;
                match done {
                    Some(Ok((v, dir))) => {
                        // Loading and applying a large model's weights can outlast a lease:
                        // the leases held are renewed meanwhile.
                        let beat = heartbeat(&args.name, Some(version), slots, &held);
                        let alive = keepalive(beat, welcome.heartbeat);
                        faults.before_swap(&args.name, v).await;
                        let swapped = swap(&engine, v, &dir).await;
                        drop(alive);
                        match swapped {
                            Ok(()) => {
                                version = v;
                                serving = dir;
                                eprintln!("worker {}: weights version {v} swapped in", args.name);
                                say(heartbeat(&args.name, Some(version), slots, &held));
                            }
                            Err(e) => break format!("swapping in weights version {v}: {e:#}"),
                        }
                    }
                    Some(Err(e)) => tracing::warn!("fetching weights: {e:#}; trying again"),
                    None => {}
                }
            }
            Some((label, handle)) = restarted.next() => {
                // The restarted engine reloads before it takes the weights: renewed meanwhile.
                let beat = heartbeat(&args.name, Some(version), slots, &held);
                let alive = keepalive(beat, welcome.heartbeat);
                let sent = swap(&handle.into(), version, &serving).await;
                drop(alive);
                if let Err(e) = sent {
                    break format!("sending weights version {version} again to the restarted engine on {label}: {e:#}");
                }
                eprintln!("worker {}: engine on {label} restarted; weights version {version} sent to it again", args.name);
            }
            event = node.events.recv() => match event {
                Some(SessionEvent::Lost(peer)) => {
                    connected = false;
                    eprintln!("worker {}: lost the trainer ({peer}); reconnecting", args.name);
                }
                Some(SessionEvent::Authenticated(_)) => {
                    connected = true;
                    rejoined = true;
                    eprintln!("worker {}: reconnected to {}", args.name, args.join);
                    for request in on_hold.drain(..) {
                        let _ = submit_tx.send(request);
                    }
                }
                Some(SessionEvent::Refused(peer)) => break format!("{peer} refused this worker: the cookie check failed"),
                None => break "the cluster node stopped".to_string(),
            },
            _ = renew_every.tick() => {
                if !connected {
                    // A partitioned peer swallows the SYN: bounded, so the loop goes on.
                    match tokio::time::timeout(welcome.heartbeat.max(Duration::from_secs(1)), node.connect(&args.join)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::info!("reconnecting: {e:#}"),
                        Err(_) => tracing::info!("reconnecting to {}: timed out", args.join),
                    }
                    continue;
                }
                if wanted.0 > version && fetching.is_none() {
                    fetching = Some(wanted.0);
                    start_fetch(fetcher.clone(), fetched_tx.clone(), wanted.clone());
                }
                say(heartbeat(&args.name, Some(version), slots, &held));
                let waiting = std::mem::take(&mut unsent);
                for done in waiting {
                    if !say(done.clone()) {
                        unsent.push(done);
                    }
                }
            }
            _ = stop.changed() => {
                say(Wire::Bye { worker: args.name.clone() });
                break "a signal: left the cluster, leases returned".to_string();
            }
        }
    };
    eprintln!("worker {}: stopping: {reason}", args.name);
    service.abort("the worker is stopping");
    feeder.abort();
    let _ = service.finish().await;
    engine.shutdown();
    // The engine thread must be gone before the process exits: libtorch's static state is
    // torn down at exit, under a forward pass still running. Its queue closes as it ends.
    let gone = Instant::now() + Duration::from_secs(10);
    while engine.stats().await.is_ok() && Instant::now() < gone {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.stop(None);
    versions_sampled.sort_unstable();
    Ok(json!({
        "worker": args.name,
        "joined_at_version": welcome.version,
        "final_version": version,
        "leases_received": leases_received,
        "episodes_reported": episodes,
        "versions_sampled": versions_sampled,
        "stopped": reason,
    }))
}

async fn wait_authenticated(node: &mut Node, join: &str, deadline: Instant) -> anyhow::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, node.events.recv()).await {
        Ok(Some(SessionEvent::Authenticated(_))) => Ok(()),
        Ok(Some(SessionEvent::Refused(_) | SessionEvent::Lost(_))) => anyhow::bail!(
            "{join} refused this worker: the cookie check failed (check --cookie-file against the trainer's cluster.cookie_file, and --tls-ca where the trainer has [cluster.tls])"
        ),
        Ok(None) => anyhow::bail!("the cluster node stopped while joining {join}"),
        Err(_) => anyhow::bail!("{join} did not accept this worker within the join timeout"),
    }
}

async fn wait_welcome(
    args: &WorkerArgs,
    inbox: &mut mpsc::UnboundedReceiver<Wire>,
    deadline: Instant,
) -> anyhow::Result<Welcome> {
    let mut hello = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.into()) => {
                anyhow::bail!("{}: no welcome from the trainer within the join timeout", args.join)
            }
            _ = hello.tick() => {
                tell_coordinator(Wire::Hello { worker: args.name.clone(), slots: args.concurrency.unwrap_or(0) as u32, version: None });
            }
            wire = inbox.recv() => match wire {
                Some(Wire::Welcome { config, weights_url, weights_token, version, manifest_sha256, base_manifest_sha256, heartbeat_ms }) => {
                    return Ok(Welcome { config, weights_url, weights_token, version, manifest_sha256, base_manifest_sha256, heartbeat: Duration::from_millis(heartbeat_ms.max(10)) });
                }
                Some(Wire::Stop) => anyhow::bail!("the trainer finished the run before this worker joined"),
                Some(_) => {}
                None => anyhow::bail!("the worker's agent stopped"),
            }
        }
    }
}

/// Sends `beat` every `every` until dropped: for the waits of the worker's loop that can
/// outlast a lease (setting up, swapping weights). It renews the leases held when the wait
/// began; none is reported during it. Leases granted during it (async mode, where a
/// swapping worker still has fresh enough weights) are read from the inbox only after it,
/// so they are not renewed meanwhile and may run out and be re-queued.
fn keepalive(beat: Wire, every: Duration) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            tell_coordinator(beat.clone());
        }
    }))
}

/// A heartbeat: renews the leases in `held` (episode id -> lease).
fn heartbeat(worker: &str, version: Option<u64>, slots: u32, held: &HashMap<u64, u64>) -> Wire {
    Wire::Heartbeat {
        worker: worker.to_string(),
        version,
        slots,
        leases: held.values().copied().collect(),
    }
}

type FetchResult = anyhow::Result<(u64, PathBuf)>;

fn start_fetch(
    fetcher: Arc<Fetcher>,
    tx: mpsc::UnboundedSender<FetchResult>,
    (version, manifest_sha256): (u64, String),
) {
    tokio::spawn(async move {
        let _ = tx.send(
            fetch(fetcher, version, manifest_sha256)
                .await
                .map(|d| (version, d)),
        );
    });
}

/// Fetches `version`, its manifest checked against the SHA-256 the trainer announced and
/// every file against the manifest, off the runtime's threads.
async fn fetch(
    fetcher: Arc<Fetcher>,
    version: u64,
    manifest_sha256: String,
) -> anyhow::Result<PathBuf> {
    let fetched =
        tokio::task::spawn_blocking(move || fetcher.fetch_pinned(version, &manifest_sha256))
            .await
            .context("the weight fetch panicked")??;
    metrics::counter!(crate::metric_names::CLUSTER_WEIGHT_FETCH_BYTES_TOTAL.name)
        .increment(fetched.bytes_received);
    Ok(fetched.dir)
}

/// Fetches a LoRA run's frozen base, its manifest checked against the SHA-256 the trainer
/// announced, off the runtime's threads (once: a base already here is kept).
async fn fetch_base(fetcher: Arc<Fetcher>, manifest_sha256: String) -> anyhow::Result<PathBuf> {
    let fetched = tokio::task::spawn_blocking(move || fetcher.fetch_base_pinned(&manifest_sha256))
        .await
        .context("the base's fetch panicked")??;
    eprintln!(
        "the frozen base: {:.1} MB ({:.1} MB received)",
        fetched.manifest.bytes() as f64 / 1e6,
        fetched.bytes_received as f64 / 1e6
    );
    Ok(fetched.dir)
}

/// Loads a fetched version and swaps it into every engine, verified tensor by tensor on
/// arrival and as served.
async fn swap(engine: &EngineSet, version: u64, dir: &Path) -> anyhow::Result<()> {
    let dir = dir.to_path_buf();
    let (tensors, digest) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let tensors = load_policy(&dir)?;
        let digest = WeightDigest::of(&tensors)?;
        Ok((tensors, digest))
    })
    .await
    .context("loading fetched weights panicked")??;
    engine
        .update_weights_verified(version, tensors, digest)
        .await?;
    Ok(())
}
