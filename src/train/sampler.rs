//! Sampling for `train`: one rollout service for the whole run, fed from the task stream in
//! stream order, its trajectories gathered into group-complete batches.
//!
//! A stream position is one task and one group: its `group_size` episodes have the position
//! as their group id and `position * group_size + member` as their episode ids, so the
//! tokens sampled for a task do not depend on which episodes ran beside it. The feeder
//! records a position as open before submitting its group and closes it when the group's
//! last trajectory arrives. A checkpoint saves every trajectory not yet trained on (complete
//! groups, and the finished episodes of open groups, the channel's buffer included), the
//! next position, and the open positions; a resume restores the trajectories and samples
//! again only the open groups' episodes that had not finished.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use agent_r1_actors::runtime::{
    EpisodeRequest, GroupBatcher, InFlightBoard, InFlightEpisode, RolloutReport, RolloutService,
    RolloutSetup, TaskSender, RETRY_BIT,
};
use agent_r1_actors::trajectory::Trajectory;

use super::tasks::TaskStream;
use crate::cluster::remote_tasks::RemoteTasks;

/// Trajectories buffered between the service and the batcher.
const TRAJECTORY_BUFFER: usize = 256;
/// How long a failed feeder waits for the service's end, to report its reason.
const SERVICE_END: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the feeder is in the stream.
#[derive(Debug, Default)]
struct Feed {
    /// The next position to feed.
    next: u64,
    /// Positions fed whose group has not completed.
    open: BTreeSet<u64>,
}

/// What a checkpoint keeps of the sampler.
pub(crate) struct SamplerSnapshot {
    /// Trajectories not yet trained on: complete groups, then the finished episodes of open
    /// groups.
    pub(crate) pending: Vec<Trajectory>,
    /// Of those, the ones of open groups.
    pub(crate) partial: usize,
    /// The next position to feed.
    pub(crate) position: u64,
    /// Positions fed whose groups had not completed (sampled again on resume).
    pub(crate) open: Vec<u64>,
    /// Episodes of the built-in loop running at the snapshot, with their finished steps
    /// (continued from there on resume).
    pub(crate) in_flight: Vec<InFlightEpisode>,
}

/// The run's sampling stage.
pub(crate) struct Sampler {
    service: Option<RolloutService>,
    /// The service's sink, for other producers (remote workers).
    sink: mpsc::Sender<Trajectory>,
    /// Where tasks go besides (or instead of) the local service.
    remote: Option<RemoteTasks>,
    trajectories: mpsc::Receiver<Trajectory>,
    /// No more trajectories will come from the service.
    closed: bool,
    /// Why the service stopped on its own, once seen.
    stopped_with: Option<String>,
    /// The feeder's error, until reported.
    feeder_failed: Option<anyhow::Error>,
    batcher: GroupBatcher,
    group_size: usize,
    stream: Arc<Mutex<TaskStream>>,
    feed: Arc<Mutex<Feed>>,
    /// Episodes of open groups restored from a checkpoint, by group: not sampled again.
    restored: Arc<BTreeMap<u64, BTreeSet<u64>>>,
    /// Episodes in flight at the checkpoint, by id without the retry bit: continued from
    /// their last finished step.
    resumable: Arc<BTreeMap<u64, InFlightEpisode>>,
    /// Where the service's episodes keep their finished steps.
    board: InFlightBoard,
    feeder: Option<JoinHandle<anyhow::Result<()>>>,
    stop: Arc<AtomicBool>,
    /// Learner updates done, for the feeder's lookahead bound.
    step: watch::Sender<u64>,
    groups_per_batch: u64,
    /// A progress line every this many completed groups.
    progress_every: usize,
}

impl Sampler {
    /// Starts the run's rollout service; nothing is fed until [`Sampler::feed`].
    pub(crate) async fn start(
        setup: RolloutSetup,
        stream: TaskStream,
        position: u64,
        group_size: usize,
        groups_per_batch: usize,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let (tx, trajectories) = mpsc::channel(TRAJECTORY_BUFFER);
        let group_size = group_size.max(1);
        // About one line per `concurrency` episodes.
        let progress_every = (setup.concurrency / group_size).max(1);
        let board = setup.in_flight.clone();
        let service = RolloutService::start(setup, tx.clone())
            .await
            .context("starting the rollout service")?;
        Ok(Self {
            service: Some(service),
            sink: tx,
            remote: None,
            trajectories,
            closed: false,
            stopped_with: None,
            feeder_failed: None,
            batcher: GroupBatcher::new(group_size, groups_per_batch),
            group_size,
            stream: Arc::new(Mutex::new(stream)),
            feed: Arc::new(Mutex::new(Feed {
                next: position,
                open: BTreeSet::new(),
            })),
            restored: Arc::default(),
            resumable: Arc::default(),
            board,
            feeder: None,
            stop,
            step: watch::Sender::new(0),
            groups_per_batch: groups_per_batch.max(1) as u64,
            progress_every,
        })
    }

    /// Where other producers (remote workers) put finished trajectories: the same batcher.
    pub(crate) fn sink(&self) -> mpsc::Sender<Trajectory> {
        self.sink.clone()
    }

    /// Where the service takes tasks (for a producer besides the feeder: the cluster hands
    /// back tasks that no worker can take).
    pub(crate) fn tasks(&self) -> TaskSender {
        self.service().tasks()
    }

    /// Sends tasks to `remote` too (or only there); set before [`Sampler::feed`].
    pub(crate) fn set_remote(&mut self, remote: RemoteTasks) {
        self.remote = Some(remote);
    }

    /// Tells the feeder how many updates the learner has done (see [`Sampler::feed`]).
    pub(crate) fn set_step(&self, step: u64) {
        self.step.send_replace(step);
    }

    /// The next position to feed.
    pub(crate) fn position(&self) -> u64 {
        self.feed.lock().unwrap_or_else(|p| p.into_inner()).next
    }

    /// Groups held: complete ones waiting for a batch.
    pub(crate) fn complete_groups(&self) -> usize {
        self.batcher.complete_groups()
    }

    /// Adds trajectories saved by a checkpoint: complete groups wait for a batch, and the
    /// finished episodes of open groups wait for their group's other episodes, which are
    /// the only ones [`Sampler::feed`] samples again.
    pub(crate) fn restore(&mut self, pending: Vec<Trajectory>) {
        for t in pending {
            self.batcher.push(t);
        }
        let mut restored: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for t in self.batcher.partial() {
            restored
                .entry(t.group_id)
                .or_default()
                .insert(t.episode_id & !RETRY_BIT);
        }
        self.restored = Arc::new(restored);
    }

    /// Adds the episodes a checkpoint had in flight: [`Sampler::feed`] continues each from
    /// its last finished step instead of sampling it from its first turn.
    pub(crate) fn restore_in_flight(&mut self, records: Vec<InFlightEpisode>) {
        self.resumable = Arc::new(
            records
                .into_iter()
                .map(|r| (r.episode_id & !RETRY_BIT, r))
                .collect(),
        );
    }

    /// Feeds the `requeue` positions, then the stream from the current position up to `to`
    /// (exclusive), a whole group at a time, until the stop flag is set. With
    /// `batches_ahead`, position `p` (of batch `p / groups_per_batch`, counting from 0) waits
    /// until the learner has done `p / groups_per_batch - batches_ahead` updates: while the
    /// learner trains batch `s`, batches up to `s + batches_ahead` are sampled.
    pub(crate) fn feed(&mut self, requeue: Vec<u64>, to: u64, batches_ahead: Option<u64>) {
        if !requeue.is_empty() {
            let restored: usize = requeue
                .iter()
                .filter_map(|p| self.restored.get(p))
                .map(BTreeSet::len)
                .sum();
            let group = self.group_size as u64;
            let continued = self
                .resumable
                .keys()
                .filter(|&&id| {
                    requeue.contains(&(id / group))
                        && !self
                            .restored
                            .get(&(id / group))
                            .is_some_and(|done| done.contains(&id))
                })
                .count();
            eprintln!(
                "resuming {} groups in flight at the checkpoint: {restored} episodes restored, \
                 {continued} continued from their last finished step, {} sampled from the start",
                requeue.len(),
                requeue.len() * self.group_size - restored - continued
            );
        }
        let job = Feeder {
            sender: self.service().tasks(),
            remote: self.remote.clone(),
            stream: self.stream.clone(),
            feed: self.feed.clone(),
            restored: self.restored.clone(),
            resumable: self.resumable.clone(),
            group_size: self.group_size,
            stop: self.stop.clone(),
            ahead: batches_ahead.map(|a| (a, self.groups_per_batch, self.step.subscribe())),
        };
        self.feeder = Some(tokio::spawn(job.run(requeue, to)));
    }

    /// The next batch of whole groups; `None` once the feeder has finished (the stream's end
    /// or the stop flag) and no group is open.
    pub(crate) async fn next_batch(&mut self) -> anyhow::Result<Option<Vec<Trajectory>>> {
        loop {
            if let Some(batch) = self.batcher.next_batch() {
                return Ok(Some(batch));
            }
            if self.feeder.is_none() && self.open_groups() == 0 {
                return Ok(None);
            }
            self.receive().await?;
        }
    }

    /// Runs `work` (an update) while trajectories keep arriving into the batcher, so the
    /// engine never waits on a full trajectory channel during it.
    pub(crate) async fn while_sampling<F: Future>(&mut self, work: F) -> anyhow::Result<F::Output> {
        tokio::pin!(work);
        loop {
            if self.closed && self.feeder.is_none() {
                return Ok(work.await);
            }
            tokio::select! {
                biased;
                out = &mut work => return Ok(out),
                r = self.receive() => r?,
            }
        }
    }

    /// Takes in the trajectories already waiting in the channel, so a checkpoint taken next
    /// holds every episode that has finished.
    pub(crate) fn absorb_finished(&mut self) {
        if self.closed {
            return;
        }
        while let Ok(t) = self.trajectories.try_recv() {
            self.take_in(t);
        }
    }

    /// Whether a checkpoint taken now would hold an episode in flight to continue from its
    /// last finished step, or none could: every episode of the open groups has finished
    /// (those waiting in the channel counted).
    pub(crate) fn holds_a_finished_step_or_nothing_running(&self) -> bool {
        if !self.board.is_empty() {
            return true;
        }
        let finished = self.batcher.partial().count() + self.trajectories.len();
        self.open_groups() * self.group_size <= finished
    }

    /// What a checkpoint saves.
    pub(crate) fn snapshot(&self) -> SamplerSnapshot {
        // The board first: an episode that finishes meanwhile is then in both, and its
        // finished trajectory wins on resume; never in neither.
        let in_flight = self.board.snapshot();
        let feed = self.feed.lock().unwrap_or_else(|p| p.into_inner());
        let partial: Vec<Trajectory> = self.batcher.partial().cloned().collect();
        SamplerSnapshot {
            partial: partial.len(),
            pending: self.batcher.complete().cloned().chain(partial).collect(),
            position: feed.next,
            open: feed.open.iter().copied().collect(),
            in_flight,
        }
    }

    /// Stops the service (episodes still in flight are abandoned: their positions are in
    /// the last snapshot's `open`) and returns its counters.
    pub(crate) async fn finish(&mut self) -> anyhow::Result<RolloutReport> {
        if let Some(feeder) = self.feeder.take() {
            feeder.abort();
        }
        let Some(service) = self.service.take() else {
            return Ok(RolloutReport::default());
        };
        service.abort("the run is finishing");
        // Nothing more is read: episodes still sending get an error and stop.
        self.trajectories.close();
        self.closed = true;
        Ok(service.finish().await?)
    }

    /// `sample update U: G/B tasks, E episodes` as the next batch's groups complete.
    fn report_progress(&self) {
        let per_batch = self.groups_per_batch as usize;
        let complete = self.batcher.complete_groups();
        let in_batch = (complete - 1) % per_batch + 1;
        if in_batch % self.progress_every == 0 || in_batch == per_batch {
            let update = *self.step.borrow() + 1 + ((complete - 1) / per_batch) as u64;
            eprintln!(
                "sample update {update}: {in_batch}/{per_batch} tasks, {} episodes",
                in_batch * self.group_size
            );
        }
    }

    fn service(&self) -> &RolloutService {
        self.service
            .as_ref()
            .expect("the service lives until finish")
    }

    fn open_groups(&self) -> usize {
        self.feed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .len()
    }

    fn take_in(&mut self, t: Trajectory) {
        if let Some(group) = self.batcher.push(t) {
            self.feed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open
                .remove(&group);
            self.report_progress();
        }
    }

    /// Waits for one trajectory (or the feeder's end, or the service's) and takes it in.
    /// Cancel-safe (it runs inside `select!` beside an update): each branch only records
    /// what it saw, and the waits that follow pick up from `self`.
    async fn receive(&mut self) -> anyhow::Result<()> {
        self.check_end().await?;
        tokio::select! {
            t = self.trajectories.recv(), if !self.closed => match t {
                Some(t) => self.take_in(t),
                None => {
                    self.closed = true;
                    self.stopped_with
                        .get_or_insert_with(|| "the trajectory channel closed".into());
                }
            },
            // The sampler's own sink keeps the channel open: the service's end is seen here.
            fatal = async { self.service.as_ref().expect("guarded").stopped().await },
                if self.service.is_some() && !self.closed =>
            {
                while let Ok(t) = self.trajectories.try_recv() {
                    self.take_in(t);
                }
                self.closed = true;
                self.stopped_with =
                    Some(fatal.unwrap_or_else(|| "it ended without a reason".into()));
            }
            r = async { self.feeder.as_mut().expect("guarded").await }, if self.feeder.is_some() => {
                self.feeder = None;
                if let Err(e) = r.context("the task feeder panicked")? {
                    self.feeder_failed = Some(e);
                }
            }
        }
        self.check_end().await
    }

    /// Fails once sampling cannot go on: the service stopped (its reason), or the feeder
    /// failed (the service's reason when that is why: a feeder fails when the service stops
    /// taking tasks, so its end is waited for a little).
    async fn check_end(&mut self) -> anyhow::Result<()> {
        if self.feeder_failed.is_some() && self.stopped_with.is_none() {
            if let Some(service) = &self.service {
                if let Ok(fatal) = tokio::time::timeout(SERVICE_END, service.stopped()).await {
                    self.closed = true;
                    self.stopped_with =
                        Some(fatal.unwrap_or_else(|| "it ended without a reason".into()));
                }
            }
        }
        if let Some(why) = &self.stopped_with {
            anyhow::bail!("the rollout stopped: {why}");
        }
        match self.feeder_failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Submits whole groups to the service (and remote workers) in stream order.
struct Feeder {
    sender: TaskSender,
    remote: Option<RemoteTasks>,
    stream: Arc<Mutex<TaskStream>>,
    feed: Arc<Mutex<Feed>>,
    restored: Arc<BTreeMap<u64, BTreeSet<u64>>>,
    resumable: Arc<BTreeMap<u64, InFlightEpisode>>,
    group_size: usize,
    stop: Arc<AtomicBool>,
    /// (batches ahead, groups per batch, learner step).
    ahead: Option<(u64, u64, watch::Receiver<u64>)>,
}

impl Feeder {
    async fn run(mut self, requeue: Vec<u64>, to: u64) -> anyhow::Result<()> {
        for position in requeue {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            self.feed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open
                .insert(position);
            self.submit(position).await?;
        }
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let next = self.feed.lock().unwrap_or_else(|p| p.into_inner()).next;
            if next >= to {
                return Ok(());
            }
            if let Some((ahead, per_batch, step)) = &mut self.ahead {
                let needed = (next / *per_batch).saturating_sub(*ahead);
                // The sender lives in the sampler; its end means the run is ending.
                if step.wait_for(|&s| s >= needed).await.is_err() {
                    return Ok(());
                }
                if self.stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
            }
            let position = {
                let mut feed = self.feed.lock().unwrap_or_else(|p| p.into_inner());
                let p = feed.next;
                feed.next += 1;
                feed.open.insert(p);
                p
            };
            self.submit(position).await?;
        }
    }

    /// To the remote workers while they have room (capacity the run has no other use for),
    /// else to the local service when it samples too; only to the workers when it does not.
    /// A task sent to the workers that waits while none is a member goes back to the local
    /// service (the coordinator hands it back).
    async fn route(&self, request: EpisodeRequest) -> anyhow::Result<()> {
        let gone = || anyhow::anyhow!("the cluster's task pump has stopped");
        match &self.remote {
            None => Ok(self.sender.submit(request).await?),
            Some(remote) if !remote.local_too => {
                remote.reserve().await.ok_or_else(gone)?.send(request);
                Ok(())
            }
            Some(remote) => {
                tokio::select! {
                    biased;
                    far = remote.reserve() => {
                        far.ok_or_else(gone)?.send(request);
                        Ok(())
                    }
                    local = self.sender.reserve() => {
                        local?.send(request);
                        Ok(())
                    }
                }
            }
        }
    }

    async fn submit(&self, position: u64) -> anyhow::Result<()> {
        let task = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .task(position)
            .context("the task stream is empty")?;
        let group = self.group_size as u64;
        let restored = self.restored.get(&position);
        for member in 0..group {
            let episode_id = position * group + member;
            if restored.is_some_and(|ids| ids.contains(&episode_id)) {
                continue;
            }
            let resume = self.resumable.get(&episode_id);
            let request = EpisodeRequest {
                task: task.clone(),
                group_id: position,
                episode_id: resume.map_or(episode_id, |r| r.episode_id),
                resume: resume.map(|r| Box::new(r.clone())),
            };
            self.route(request).await?;
        }
        Ok(())
    }
}
