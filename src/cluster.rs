//! Remote rollout workers on ractor_cluster. The control plane (tasks as leases, finished
//! trajectories, heartbeats, weight versions) is one message type between the trainer's
//! [`coordinator`] and each [`worker`]; weights travel on the data plane
//! ([`crate::weight_plane`]). ractor_cluster may lose messages on a reconnect and has no
//! cross-node supervision, so the protocol does not trust delivery: leases expire unless
//! renewed, a worker says hello until it is welcomed, and a trajectory is accepted once per
//! episode id ([`leases::LeaseTable`]).
//!
//! ```text
//! trainer                                   worker (agent-r1 worker --join)
//!   Feeder --tasks--> Coordinator <--Hello/Heartbeat/Done/Bye--  WorkerAgent -> RolloutService
//!           (local service too)   --Welcome/Lease/Weights/Stop-->   EngineSet <- Fetcher
//!   sink <--accepted trajectories--'                              weight server (HTTP)
//! ```

pub mod coordinator;
pub mod leases;
mod listener;
pub(crate) mod remote_tasks;
pub mod tls;
pub(crate) mod trainer;
pub mod wire;
pub mod worker;
pub mod worker_faults;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;
use ractor::{Actor, ActorId, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use rustls_pki_types::ServerName;
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Reads a cookie file: its first line, which must not be empty.
pub fn read_cookie(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read the cookie file", path.display()))?;
    let cookie = text.lines().next().unwrap_or("").trim().to_string();
    anyhow::ensure!(
        !cookie.is_empty(),
        "{}: the cookie file's first line is empty",
        path.display()
    );
    Ok(cookie)
}

/// What a node's sessions do, as the node server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A peer passed the cookie check.
    Authenticated(String),
    /// A peer's connection ended before it passed the cookie check.
    Refused(String),
    /// An authenticated peer's connection ended.
    Lost(String),
}

/// Logs sessions and forwards them; remembers which sessions authenticated, so a
/// disconnect before that is reported as a refusal.
struct SessionLog {
    role: &'static str,
    authenticated: Mutex<HashSet<ActorId>>,
    events: mpsc::UnboundedSender<SessionEvent>,
}

impl NodeEventSubscription for SessionLog {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        tracing::debug!(
            role = self.role,
            peer = ses.peer_addr,
            "cluster connection opened"
        );
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let was = self
            .authenticated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ses.actor.get_id());
        if was {
            eprintln!("cluster: connection with {} closed", ses.peer_addr);
            let _ = self.events.send(SessionEvent::Lost(ses.peer_addr));
        } else {
            metrics::counter!(crate::metric_names::CLUSTER_REFUSED_TOTAL.name).increment(1);
            eprintln!(
                "cluster: connection with {} refused: it did not pass the cookie check (wrong cookie, TLS on one side only, or not an agent-r1 node)",
                ses.peer_addr
            );
            let _ = self.events.send(SessionEvent::Refused(ses.peer_addr));
        }
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.authenticated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ses.actor.get_id());
        tracing::info!(
            role = self.role,
            peer = ses.peer_addr,
            "cluster peer authenticated"
        );
        let _ = self.events.send(SessionEvent::Authenticated(ses.peer_addr));
    }
}

/// A running ractor_cluster node server.
pub struct Node {
    server: ActorRef<NodeServerMessage>,
    /// Session events, in order.
    pub events: mpsc::UnboundedReceiver<SessionEvent>,
    /// TLS for the connections this node opens.
    client_tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Where peers connect, once [`Node::listen`] was called.
    listener: Option<listener::Listener>,
}

impl Node {
    /// Starts a node named `name` that authenticates peers with `cookie`. It accepts no
    /// connections from elsewhere until [`Node::listen`]: ractor_cluster's own listener is
    /// kept on a loopback port nobody is told of.
    pub async fn start(name: &str, role: &'static str, cookie: String) -> anyhow::Result<Self> {
        let loopback = IpAddr::from([127, 0, 0, 1]);
        let server = NodeServer::new(
            0,
            cookie,
            name.to_string(),
            loopback.to_string(),
            None,
            None,
        )
        .with_listen_addr(loopback);
        let (server, _join) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| anyhow::anyhow!("starting the cluster node {name}: {e}"))?;
        metrics::counter!(crate::metric_names::CLUSTER_REFUSED_TOTAL.name).increment(0);
        let (tx, events) = mpsc::unbounded_channel();
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "agent_r1".into(),
                subscription: Box::new(SessionLog {
                    role,
                    authenticated: Mutex::default(),
                    events: tx,
                }),
            })
            .map_err(|e| anyhow::anyhow!("subscribing to cluster events: {e}"))?;
        Ok(Self {
            server,
            events,
            client_tls: None,
            listener: None,
        })
    }

    /// Accepts peers on `addr` (port 0: any free port); with `tls`, they must speak TLS.
    /// Returns the address bound.
    pub async fn listen(
        &mut self,
        addr: SocketAddr,
        tls: Option<TlsAcceptor>,
    ) -> anyhow::Result<SocketAddr> {
        let listener = listener::Listener::start(addr, self.server.clone(), tls)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let bound = listener.local_addr();
        self.listener = Some(listener);
        Ok(bound)
    }

    /// Opens its connections with TLS, checking the server's certificate and name.
    pub fn with_client_tls(mut self, connector: TlsConnector, name: ServerName<'static>) -> Self {
        self.client_tls = Some((connector, name));
        self
    }

    /// Connects to the node at `addr`.
    pub async fn connect(&self, addr: &str) -> anyhow::Result<()> {
        let connected = match &self.client_tls {
            None => ractor_cluster::client_connect(&self.server, addr).await,
            Some((connector, name)) => {
                ractor_cluster::client_connect_enc(
                    &self.server,
                    addr,
                    connector.clone(),
                    name.clone(),
                )
                .await
            }
        };
        connected.map_err(|e| anyhow::anyhow!("connecting to {addr}: {e}"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.stop(None);
    }
}

/// Sends `wire` to the actor `cell` (a member of a process group, on any node).
pub(crate) fn send(cell: &ractor::ActorCell, wire: wire::Wire) -> bool {
    let actor: ActorRef<wire::ClusterMsg<()>> = cell.clone().into();
    actor.cast(wire::ClusterMsg::Wire(wire)).is_ok()
}

/// Sends `wire` to the trainer's coordinator; false when it is not reachable now.
pub(crate) fn tell_coordinator(wire: wire::Wire) -> bool {
    remote_member(wire::COORDINATOR_GROUP).is_some_and(|c| send(&c, wire))
}

/// The first member of process group `group` on another node.
pub(crate) fn remote_member(group: &str) -> Option<ractor::ActorCell> {
    ractor::pg::get_members(&group.to_string())
        .into_iter()
        .find(|c| !c.get_id().is_local())
}
