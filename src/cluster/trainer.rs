//! The cluster as `train` runs it: the weight server and each version published on it, the
//! node workers join, the coordinator and its task pump.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use agent_r1_actors::learner::LearnerRef;
use agent_r1_actors::runtime::TaskSender;
use agent_r1_actors::trajectory::Trajectory;

use super::coordinator::{
    spawn_pump, ClusterSummary, Command, Coordinator, CoordinatorArgs, CoordinatorMsg,
};
use super::remote_tasks::RemoteTasks;
use super::wire::ClusterMsg;
use super::{read_cookie, Node};
use crate::config::{ClusterSection, TrainConfig, TrainMode};
use crate::file_digest::sha256_file;
use crate::weight_plane::{publish_base, publish_dir, WeightServer, MANIFEST_FILE};

/// The trainer's cluster stage.
pub struct TrainerCluster {
    section: ClusterSection,
    root: PathBuf,
    tokenizer_dir: PathBuf,
    _server: WeightServer,
    _node: Node,
    coordinator: ActorRef<CoordinatorMsg>,
    pump: JoinHandle<()>,
    members: watch::Receiver<usize>,
}

impl TrainerCluster {
    /// Publishes the start version, serves it, listens for workers and starts the
    /// coordinator; returns the stage and where the feeder sends tasks for workers. `local`
    /// is the trainer's own rollout service, which takes back tasks that wait while no worker
    /// is a member when `cluster.local_rollout` is set.
    pub async fn start(
        cfg: &TrainConfig,
        run_dir: &Path,
        learner: &LearnerRef,
        tokenizer_dir: &Path,
        version: u64,
        sink: mpsc::Sender<Trajectory>,
        local: TaskSender,
    ) -> anyhow::Result<(Self, RemoteTasks)> {
        let section = cfg.cluster.clone();
        let root = run_dir.join("weights");
        let weights_listen: SocketAddr = section.weights_listen.parse()?;
        let access = section
            .weights_access()
            .map_err(|e| anyhow::anyhow!("{}", e.under("cluster")))?;
        let weights_token = access.token().map(|t| t.expose().to_string());
        let server = WeightServer::start(weights_listen, access, &root)
            .with_context(|| format!("cluster.weights_listen = {weights_listen}"))?;
        let weights_url = section.weights_url.clone().unwrap_or_else(|| server.url());
        // With LoRA each version is the adapters alone; the frozen base they adapt is
        // published once beside them.
        let base_manifest_sha256 = match cfg.adapter_source() {
            Some(_) => {
                let (root, base) = (root.clone(), tokenizer_dir.to_path_buf());
                let published = tokio::task::spawn_blocking(move || publish_base(&root, &base))
                    .await
                    .context("publishing the base panicked")??;
                let manifest = published.dir.join(MANIFEST_FILE);
                let (_, sha256) = sha256_file(&manifest)
                    .with_context(|| format!("{}: cannot read", manifest.display()))?;
                eprintln!(
                    "cluster: the frozen base published once for workers ({:.1} MB); versions hold the adapters alone",
                    published.manifest.bytes() as f64 / 1e6
                );
                Some(sha256)
            }
            None => None,
        };
        let cookie_file = section.cookie_file.clone().context("cluster.cookie_file")?;
        let cookie = read_cookie(&cookie_file).context("cluster.cookie_file")?;
        let listen: SocketAddr = section.listen.parse()?;
        let tls = match &section.tls {
            None => None,
            Some(tls) => Some(super::tls::acceptor(tls)?),
        };
        let mut node = Node::start("trainer", "trainer", cookie).await?;
        let listen = node.listen(listen, tls).await.context("cluster.listen")?;
        let (wanted_tx, wanted) = watch::channel(0);
        let (members_tx, members) = watch::channel(0);
        let staleness = match cfg.training.mode {
            TrainMode::Sync => 0,
            TrainMode::Async => cfg.training.max_staleness,
        };
        let args = CoordinatorArgs {
            config: cfg.to_toml_string(),
            weights_url: weights_url.clone(),
            weights_token,
            // Set by the first publication, before any worker can join.
            version,
            manifest_sha256: String::new(),
            base_manifest_sha256,
            staleness,
            lease: section.lease(),
            heartbeat: section.heartbeat(),
            sink,
            local: section.local_rollout.then_some(local),
            wanted: wanted_tx,
            members: members_tx,
        };
        let (coordinator, _join) = Actor::spawn(None, Coordinator, args)
            .await
            .map_err(|e| anyhow::anyhow!("starting the cluster coordinator: {e}"))?;
        let (tasks, rx) = mpsc::channel(1);
        let pump = spawn_pump(rx, coordinator.clone());
        let stage = Self {
            section: section.clone(),
            root,
            tokenizer_dir: tokenizer_dir.to_path_buf(),
            _server: server,
            _node: node,
            coordinator,
            pump,
            members,
        };
        stage.publish(learner, version).await?;
        eprintln!(
            "cluster: listening for workers on {listen}{}; weights at {weights_url}; lease {:.1} s",
            if section.tls.is_some() { " (TLS)" } else { "" },
            section.lease_secs
        );
        let remote = RemoteTasks {
            tasks,
            wanted,
            local_too: section.local_rollout,
        };
        Ok((stage, remote))
    }

    /// Waits until `cluster.min_workers` have joined and have the run's weights, so they can
    /// be leased the first tasks (or its timeout).
    pub async fn wait_for_workers(&mut self) -> anyhow::Result<()> {
        let need = self.section.min_workers;
        if need == 0 {
            return Ok(());
        }
        eprintln!("cluster: waiting for {need} workers to join and fetch the run's weights");
        let timeout = Duration::from_secs_f64(self.section.min_workers_timeout_secs);
        let began = Instant::now();
        let joined = tokio::time::timeout(timeout, self.members.wait_for(|&n| n >= need))
            .await
            .map(|r| r.is_ok());
        match joined {
            Ok(true) => Ok(()),
            Ok(false) => anyhow::bail!("the cluster coordinator stopped"),
            Err(_) => anyhow::bail!(
                "cluster.min_workers = {need}: only {} joined and fetched the run's weights within {:.0} s (cluster.min_workers_timeout_secs)",
                *self.members.borrow(),
                began.elapsed().as_secs_f64()
            ),
        }
    }

    /// Saves the learner's policy as version `version` on the weight server and tells the
    /// workers.
    pub async fn publish(&self, learner: &LearnerRef, version: u64) -> anyhow::Result<()> {
        let began = Instant::now();
        let staging = self.root.join(format!(".save-{version}"));
        let _ = std::fs::remove_dir_all(&staging);
        learner
            .save(staging.clone(), Some(self.tokenizer_dir.clone()))
            .await
            .with_context(|| format!("saving version {version} for the weight server"))?;
        let (root, keep) = (self.root.clone(), self.section.keep_versions);
        let published =
            tokio::task::spawn_blocking(move || publish_dir(&root, version, &staging, keep))
                .await
                .context("publishing weights panicked")??;
        metrics::histogram!(crate::metric_names::CLUSTER_WEIGHT_PUBLISH_SECONDS.name)
            .record(began.elapsed().as_secs_f64());
        metrics::gauge!(crate::metric_names::CLUSTER_WEIGHT_VERSION_BYTES.name)
            .set(published.manifest.bytes() as f64);
        let manifest = published.dir.join(MANIFEST_FILE);
        let (_, sha256) = sha256_file(&manifest)
            .with_context(|| format!("{}: cannot read", manifest.display()))?;
        let _ = self
            .coordinator
            .cast(ClusterMsg::Local(Command::Version(version, sha256)));
        Ok(())
    }

    /// The cluster's figures.
    pub async fn summary(&self) -> ClusterSummary {
        match self
            .coordinator
            .call(
                |r| ClusterMsg::Local(Command::Summary(r)),
                Some(Duration::from_secs(10)),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(s)) => s,
            _ => ClusterSummary::default(),
        }
    }

    /// Tells the workers the run is over and stops the coordinator.
    pub async fn stop(self) {
        let _ = self.coordinator.cast(ClusterMsg::Local(Command::Stop));
        // The stop reaches the workers before the node goes away.
        let _ = self
            .coordinator
            .call(
                |r| ClusterMsg::Local(Command::Summary(r)),
                Some(Duration::from_secs(10)),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.pump.abort();
        self.coordinator.stop(None);
    }
}
