//! The trainer's side of the cluster: one actor that takes tasks from the feeder while
//! workers have room, leases them out, renews and expires leases, accepts each episode's
//! trajectory once into the run's batcher, and tells workers about new weights. It never
//! waits on the rest of the run: accepted trajectories that the batcher has no room for wait
//! in its outbox (and count against the room it offers workers), and tasks waiting while no
//! worker can take them go back to the trainer's own rollout when that samples too.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use agent_r1_actors::runtime::{EpisodeRequest, TaskSender};
use agent_r1_actors::trajectory::Trajectory;

use super::leases::{Completion, LeaseTable, WorkerStats};
use super::wire::{worker_group, ClusterMsg, Wire, COORDINATOR_GROUP};
use super::{remote_member, send};

/// What the coordinator is told by its own process.
#[derive(Debug)]
pub enum Command {
    /// A task from the feeder; answered once it is queued.
    Task(Box<EpisodeRequest>, RpcReplyPort<()>),
    /// A new policy version is on the weight server, with its manifest's SHA-256.
    Version(u64, String),
    /// Look at lease expiries.
    Tick,
    /// The cluster's figures.
    Summary(RpcReplyPort<ClusterSummary>),
    /// The run is over: tell the workers.
    Stop,
}

/// The coordinator's message type.
pub type CoordinatorMsg = ClusterMsg<Command>;

/// How the coordinator is set up.
pub struct CoordinatorArgs {
    /// The resolved training config, sent to workers as they join.
    pub config: String,
    /// The weight server's URL.
    pub weights_url: String,
    /// The weight server's bearer token, when it wants one.
    pub weights_token: Option<String>,
    /// The current policy version.
    pub version: u64,
    /// The SHA-256 of its manifest.
    pub manifest_sha256: String,
    /// With LoRA: the SHA-256 of the frozen base's manifest.
    pub base_manifest_sha256: Option<String>,
    /// Versions a worker's weights may lag the current one and still get leases (0: sync).
    pub staleness: u64,
    /// Lease period.
    pub lease: Duration,
    /// Workers' renewal period.
    pub heartbeat: Duration,
    /// Where accepted trajectories go (the run's batcher).
    pub sink: mpsc::Sender<Trajectory>,
    /// The trainer's own rollout service, when it samples too (`cluster.local_rollout`):
    /// tasks waiting while no worker can take them go back to it.
    pub local: Option<TaskSender>,
    /// How many more tasks the workers could take now (read by the feeder).
    pub wanted: watch::Sender<usize>,
    /// How many members could be leased a task now (they have the run's weights).
    pub members: watch::Sender<usize>,
}

/// The cluster's figures for the run's summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterSummary {
    /// Per worker.
    pub workers: BTreeMap<String, WorkerStats>,
    /// Trajectories accepted from workers.
    pub accepted: u64,
    /// Leases that ran out or were returned, their tasks queued again.
    pub requeued: u64,
    /// Trajectories dropped because their episode had been accepted.
    pub duplicates: u64,
    /// Tasks that waited while no worker was a member and went to the trainer's own rollout.
    pub handed_back: u64,
    /// Tasks still waiting for a worker.
    pub waiting: usize,
    /// Leases still out.
    pub outstanding: usize,
}

/// The coordinator actor.
pub struct Coordinator;

/// Its state.
pub struct State {
    args: CoordinatorArgs,
    table: LeaseTable,
    version: u64,
    summary: ClusterSummary,
    /// Accepted trajectories the batcher had no room for yet, oldest first.
    outbox: VecDeque<Trajectory>,
    /// Whether "tasks wait and no worker is a member" has been said since the last member.
    said_stranded: bool,
}

impl State {
    fn min_version(&self) -> u64 {
        self.version.saturating_sub(self.args.staleness)
    }

    /// Delivers what the batcher has room for, hands tasks back while no worker is a
    /// member, leases what can be leased and publishes the figures.
    fn dispatch(&mut self) {
        self.deliver();
        self.hand_back();
        let now = Instant::now();
        for grant in self.table.grant(self.min_version(), now) {
            let delivered = remote_member(&worker_group(&grant.worker)).is_some_and(|cell| {
                send(
                    &cell,
                    Wire::Lease {
                        lease: grant.lease,
                        group_id: grant.request.group_id,
                        episode_id: grant.request.episode_id,
                        task: grant.request.task.clone(),
                    },
                )
            });
            metrics::counter!(crate::metric_names::CLUSTER_LEASES_GRANTED_TOTAL.name).increment(1);
            if !delivered {
                tracing::warn!(
                    worker = grant.worker,
                    lease = grant.lease,
                    "worker not reachable; the lease will run out and be re-queued"
                );
            }
        }
        let wanted = self.table.wanted(self.min_version());
        self.args
            .wanted
            .send_replace(wanted.saturating_sub(self.outbox.len()));
        self.args
            .members
            .send_replace(self.table.ready(self.min_version()));
        metrics::gauge!(crate::metric_names::CLUSTER_WORKERS.name).set(self.table.workers() as f64);
        metrics::gauge!(crate::metric_names::CLUSTER_LEASES.name)
            .set(self.table.outstanding() as f64);
        metrics::gauge!(crate::metric_names::CLUSTER_TASKS_WAITING.name)
            .set(self.table.waiting() as f64);
    }

    /// Moves accepted trajectories into the batcher's channel while it has room, without
    /// waiting: the coordinator must go on renewing leases meanwhile (during a checkpoint or
    /// an evaluation nothing reads that channel).
    fn deliver(&mut self) {
        while let Some(t) = self.outbox.pop_front() {
            match self.args.sink.try_send(t) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(t)) => {
                    self.outbox.push_front(t);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    tracing::warn!(
                        "the batcher is gone; {} trajectories dropped",
                        self.outbox.len() + 1
                    );
                    self.outbox.clear();
                }
            }
        }
        metrics::gauge!(crate::metric_names::CLUSTER_TRAJECTORIES_UNDELIVERED.name)
            .set(self.outbox.len() as f64);
    }

    /// While no worker can be leased a task (none is a member, or none has fresh enough
    /// weights: setting up, or its fetches failing), waiting tasks go to the trainer's own
    /// rollout (when it samples too) as it has room; otherwise they wait for a worker, which
    /// is said once.
    fn hand_back(&mut self) {
        if self.table.ready(self.min_version()) > 0 || self.table.waiting() == 0 {
            self.said_stranded = false;
            return;
        }
        let Some(local) = &self.args.local else {
            if !self.said_stranded {
                self.said_stranded = true;
                eprintln!(
                    "cluster: {} tasks wait and no worker can take them (none is a member with the run's weights; cluster.local_rollout = false): they run when one can",
                    self.table.waiting()
                );
            }
            return;
        };
        let mut back = 0u64;
        loop {
            match local.try_reserve() {
                Ok(Some(permit)) => match self.table.hand_back() {
                    Some(request) => {
                        permit.send(request);
                        back += 1;
                    }
                    None => break,
                },
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("handing tasks back: {e}");
                    break;
                }
            }
        }
        if back > 0 {
            self.summary.handed_back += back;
            metrics::counter!(crate::metric_names::CLUSTER_HANDED_BACK_TOTAL.name).increment(back);
            eprintln!(
                "cluster: no worker can take tasks; {back} waiting tasks went to the trainer's own rollout ({} still wait)",
                self.table.waiting()
            );
        }
    }

    fn welcome(&self, worker: &str) {
        let Some(cell) = remote_member(&worker_group(worker)) else {
            // Its group has not reached this node yet; its next hello is answered.
            return;
        };
        send(
            &cell,
            Wire::Welcome {
                config: self.args.config.clone(),
                weights_url: self.args.weights_url.clone(),
                weights_token: self.args.weights_token.clone(),
                version: self.version,
                manifest_sha256: self.args.manifest_sha256.clone(),
                base_manifest_sha256: self.args.base_manifest_sha256.clone(),
                heartbeat_ms: self.args.heartbeat.as_millis() as u64,
            },
        );
    }

    fn requeued(&mut self, requeued: Vec<super::leases::Requeued>, why: &str) {
        for r in requeued {
            self.summary.requeued += 1;
            metrics::counter!(crate::metric_names::CLUSTER_REQUEUED_TOTAL.name).increment(1);
            eprintln!(
                "cluster: lease {} of worker {} (episode {}) {why}; its task is queued again",
                r.lease, r.worker, r.episode_id
            );
        }
    }

    /// Makes `worker` a member; true (and a log line) when it was not one.
    fn admit(&mut self, worker: &str, slots: u32, version: Option<u64>, how: &str) -> bool {
        if !self.table.join(worker, slots, version, Instant::now()) {
            return false;
        }
        metrics::counter!(crate::metric_names::CLUSTER_JOINS_TOTAL.name).increment(1);
        eprintln!(
            "cluster: worker {worker} {how}; {} workers",
            self.table.workers()
        );
        true
    }

    fn on_wire(&mut self, wire: Wire) {
        let now = Instant::now();
        match wire {
            Wire::Hello {
                worker,
                slots,
                version,
            } => {
                self.admit(&worker, slots, version, "joined");
                self.welcome(&worker);
            }
            Wire::Heartbeat {
                worker,
                version,
                slots,
                leases,
            } => {
                if self.admit(&worker, slots, version, "rejoined") {
                    // It learns it was dropped: leases it still holds may run elsewhere too.
                    self.welcome(&worker);
                }
                self.table.renew(&worker, version, &leases, now);
            }
            Wire::Done {
                worker,
                lease,
                trajectory,
            } => match self.table.complete(&worker, lease, trajectory.episode_id) {
                Completion::Accepted => {
                    self.summary.accepted += 1;
                    metrics::counter!(crate::metric_names::CLUSTER_TRAJECTORIES_TOTAL.name, "outcome" => "accepted")
                        .increment(1);
                    self.outbox.push_back(*trajectory);
                }
                Completion::Duplicate => {
                    self.summary.duplicates += 1;
                    metrics::counter!(crate::metric_names::CLUSTER_TRAJECTORIES_TOTAL.name, "outcome" => "duplicate")
                        .increment(1);
                    tracing::info!(
                        worker,
                        episode = trajectory.episode_id,
                        "trajectory of an episode already accepted: dropped"
                    );
                }
            },
            Wire::Bye { worker } => {
                let back = self.table.leave(&worker);
                eprintln!(
                    "cluster: worker {worker} left; {} leases returned; {} workers",
                    back.len(),
                    self.table.workers()
                );
                self.requeued(back, "was returned");
            }
            other => {
                tracing::warn!(message = ?other, "a trainer-bound message of the wrong direction; ignored");
            }
        }
        self.dispatch();
    }
}

impl Actor for Coordinator {
    type Msg = CoordinatorMsg;
    type State = State;
    type Arguments = CoordinatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: CoordinatorArgs,
    ) -> Result<State, ActorProcessingErr> {
        ractor::pg::join(COORDINATOR_GROUP.to_string(), vec![myself.get_cell()]);
        // Counters exist from the start at 0, so a rate over them is 0 rather than missing.
        metrics::counter!(crate::metric_names::CLUSTER_LEASES_GRANTED_TOTAL.name).increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_REQUEUED_TOTAL.name).increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_JOINS_TOTAL.name).increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_HANDED_BACK_TOTAL.name).increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_MALFORMED_MESSAGES_TOTAL.name).increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_TRAJECTORIES_TOTAL.name, "outcome" => "accepted")
            .increment(0);
        metrics::counter!(crate::metric_names::CLUSTER_TRAJECTORIES_TOTAL.name, "outcome" => "duplicate")
            .increment(0);
        let tick = (args.lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        myself.send_interval(tick, || ClusterMsg::Local(Command::Tick));
        Ok(State {
            table: LeaseTable::new(args.lease),
            version: args.version,
            summary: ClusterSummary::default(),
            outbox: VecDeque::new(),
            said_stranded: false,
            args,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ClusterMsg::Wire(wire) => state.on_wire(wire),
            ClusterMsg::Malformed(what) => {
                metrics::counter!(crate::metric_names::CLUSTER_MALFORMED_MESSAGES_TOTAL.name)
                    .increment(1);
                tracing::warn!("a cluster message that does not decode: {what}");
            }
            ClusterMsg::Local(Command::Task(request, reply)) => {
                state.table.enqueue(*request);
                state.dispatch();
                let _ = reply.send(());
            }
            ClusterMsg::Local(Command::Version(version, manifest_sha256)) => {
                state.version = version;
                state.args.manifest_sha256 = manifest_sha256.clone();
                for name in state.table.stats().keys() {
                    if let Some(cell) = remote_member(&worker_group(name)) {
                        let manifest_sha256 = manifest_sha256.clone();
                        send(
                            &cell,
                            Wire::Weights {
                                version,
                                manifest_sha256,
                            },
                        );
                    }
                }
                state.dispatch();
            }
            ClusterMsg::Local(Command::Tick) => {
                let (requeued, silent) = state.table.expire(Instant::now());
                state.requeued(requeued, "ran out");
                for name in silent {
                    eprintln!(
                        "cluster: worker {name} silent for {:.1} s; dropped ({} workers)",
                        state.args.lease.as_secs_f64(),
                        state.table.workers()
                    );
                }
                state.dispatch();
            }
            ClusterMsg::Local(Command::Summary(reply)) => {
                let mut s = state.summary.clone();
                s.workers = state.table.stats();
                s.waiting = state.table.waiting();
                s.outstanding = state.table.outstanding();
                let _ = reply.send(s);
            }
            ClusterMsg::Local(Command::Stop) => {
                for name in state.table.stats().keys() {
                    if let Some(cell) = remote_member(&worker_group(name)) {
                        send(&cell, Wire::Stop);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Moves tasks from the feeder to the coordinator as they come. The feeder sends one only
/// while the coordinator says workers have room, so the coordinator's queue holds at most
/// the few sent on a figure that was about to drop; a task is never held here, where nothing
/// could hand it back.
pub fn spawn_pump(
    mut tasks: mpsc::Receiver<EpisodeRequest>,
    coordinator: ActorRef<CoordinatorMsg>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Some(request) = tasks.recv().await else {
                return;
            };
            let queued = coordinator
                .call(
                    |reply| ClusterMsg::Local(Command::Task(Box::new(request), reply)),
                    Some(Duration::from_secs(60)),
                )
                .await;
            if !matches!(queued, Ok(ractor::rpc::CallResult::Success(()))) {
                tracing::warn!("the cluster coordinator did not take a task; the pump stops");
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_r1_actors::trajectory::EpisodeEnd;
    use agent_r1_envs::task::Task;

    fn trajectory(episode_id: u64) -> Trajectory {
        Trajectory {
            episode_id,
            group_id: episode_id,
            task: Task {
                id: format!("t{episode_id}"),
                data_source: "test".into(),
                question: "q".into(),
                answers: vec!["a".into()],
                prompt: None,
                extra: serde_json::Value::Null,
            },
            prompt_ids: vec![1, 2],
            steps: Vec::new(),
            reward: 0.0,
            metrics: BTreeMap::new(),
            end: EpisodeEnd::Completed {
                reason: "done".into(),
            },
            attempts: 1,
            wall_seconds: 0.0,
        }
    }

    /// The coordinator's state as the actor holds it, without the actor: its handlers are
    /// plain functions of it, so a full batcher channel is a state, not a timing.
    fn state(sink: mpsc::Sender<Trajectory>) -> (State, watch::Receiver<usize>) {
        let (wanted, wanted_rx) = watch::channel(0);
        let (members, _) = watch::channel(0);
        let args = CoordinatorArgs {
            config: String::new(),
            weights_url: String::new(),
            weights_token: None,
            version: 0,
            manifest_sha256: String::new(),
            base_manifest_sha256: None,
            staleness: 0,
            lease: Duration::from_secs(10),
            heartbeat: Duration::from_secs(1),
            sink,
            local: None,
            wanted,
            members,
        };
        let state = State {
            table: LeaseTable::new(args.lease),
            version: 0,
            summary: ClusterSummary::default(),
            outbox: VecDeque::new(),
            said_stranded: false,
            args,
        };
        (state, wanted_rx)
    }

    #[test]
    fn trajectories_the_batcher_has_no_room_for_wait_in_order_and_count_against_the_room_offered() {
        let (sink, mut batcher) = mpsc::channel(1);
        let (mut state, wanted) = state(sink);
        state.on_wire(Wire::Hello {
            worker: "a".into(),
            slots: 4,
            version: Some(0),
        });
        assert_eq!(*wanted.borrow(), 4);
        // Three episodes finish while the batcher's channel has room for one: handling them
        // does not wait on it (the handler is not async), the rest wait in the outbox.
        for episode in 0..3 {
            state.on_wire(Wire::Done {
                worker: "a".into(),
                lease: 100 + episode,
                trajectory: Box::new(trajectory(episode)),
            });
        }
        assert_eq!(state.summary.accepted, 3);
        assert_eq!(state.outbox.len(), 2);
        assert_eq!(*wanted.borrow(), 2, "4 free slots less 2 undelivered");
        let mut got = vec![batcher.try_recv().unwrap().episode_id];
        // Each pass (a tick, a heartbeat) delivers what the channel has room for.
        for left in [1, 0] {
            state.dispatch();
            assert_eq!(state.outbox.len(), left);
            got.push(batcher.try_recv().unwrap().episode_id);
        }
        assert_eq!(got, vec![0, 1, 2], "delivered in the order accepted");
        assert_eq!(*wanted.borrow(), 4, "nothing undelivered");
        assert!(batcher.try_recv().is_err());
    }
}
