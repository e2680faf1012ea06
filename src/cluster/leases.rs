//! The trainer's book of remote work: tasks waiting, leases out, workers and their slots,
//! and the episodes already accepted. Pure bookkeeping with the clock passed in, so every
//! rule (grant, renew, expire, accept once) is tested without a network or a sleep.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use agent_r1_actors::runtime::{EpisodeRequest, RETRY_BIT};
use serde::Serialize;

/// A worker as the trainer knows it.
#[derive(Debug, Clone)]
struct Worker {
    slots: u32,
    version: Option<u64>,
    outstanding: u32,
    last_seen: Instant,
    stats: WorkerStats,
}

/// What one worker did, for the run's summary.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct WorkerStats {
    /// Leases granted to it.
    pub leases: u64,
    /// Trajectories of it accepted.
    pub episodes: u64,
    /// Its leases that ran out (or were returned when it left) and went back to the queue.
    pub requeued: u64,
    /// Its trajectories dropped because the episode had been accepted already.
    pub duplicates: u64,
    /// Times it joined (1, or more after it left or was given up on).
    pub joins: u64,
}

#[derive(Debug, Clone)]
struct Lease {
    worker: String,
    request: EpisodeRequest,
    expires: Instant,
}

/// A lease handed out by [`LeaseTable::grant`].
#[derive(Debug, Clone)]
pub struct Grant {
    /// The worker it goes to.
    pub worker: String,
    /// The lease id.
    pub lease: u64,
    /// The episode.
    pub request: EpisodeRequest,
}

/// A lease that ran out and went back to the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeued {
    /// The worker that held it.
    pub worker: String,
    /// The lease id.
    pub lease: u64,
    /// The episode.
    pub episode_id: u64,
}

/// What became of a finished episode reported by a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// First trajectory of its episode: goes to the batcher.
    Accepted,
    /// The episode was accepted before (a re-queued lease finished twice): dropped.
    Duplicate,
}

/// Tasks, leases, workers.
#[derive(Debug)]
pub struct LeaseTable {
    ttl: Duration,
    next_lease: u64,
    queue: VecDeque<EpisodeRequest>,
    leases: HashMap<u64, Lease>,
    /// Episodes accepted from a worker or handed back to the trainer's own rollout.
    settled: HashSet<u64>,
    workers: BTreeMap<String, Worker>,
    gone: BTreeMap<String, WorkerStats>,
}

fn key(episode_id: u64) -> u64 {
    episode_id & !RETRY_BIT
}

impl LeaseTable {
    /// Leases last `ttl` from their grant or their last renewal.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            next_lease: 1,
            queue: VecDeque::new(),
            leases: HashMap::new(),
            settled: HashSet::new(),
            workers: BTreeMap::new(),
            gone: BTreeMap::new(),
        }
    }

    /// Takes the first waiting task out of the table for another taker (the trainer's own
    /// rollout, while no worker can be leased it). Its episode counts as settled: a worker that
    /// reports it later (one dropped while it still ran it) is answered as a duplicate.
    pub fn hand_back(&mut self) -> Option<EpisodeRequest> {
        let request = self.queue.pop_front()?;
        self.settled.insert(key(request.episode_id));
        Some(request)
    }

    /// A new task from the stream, behind those waiting.
    pub fn enqueue(&mut self, request: EpisodeRequest) {
        self.queue.push_back(request);
    }

    /// A worker joins (or joins again: its old leases stay until renewed or expired).
    /// Returns true when it was not known.
    pub fn join(&mut self, name: &str, slots: u32, version: Option<u64>, now: Instant) -> bool {
        if let Some(w) = self.workers.get_mut(name) {
            w.slots = slots.max(1);
            w.version = version;
            w.last_seen = now;
            return false;
        }
        let mut stats = self.gone.remove(name).unwrap_or_default();
        stats.joins += 1;
        self.workers.insert(
            name.to_string(),
            Worker {
                slots: slots.max(1),
                version,
                outstanding: 0,
                last_seen: now,
                stats,
            },
        );
        true
    }

    /// Members that can be leased tasks now: those with weights of at least `min_version`.
    pub fn ready(&self, min_version: u64) -> usize {
        self.workers
            .values()
            .filter(|w| w.version.is_some_and(|v| v >= min_version))
            .count()
    }

    /// Whether `name` is a member.
    pub fn knows(&self, name: &str) -> bool {
        self.workers.contains_key(name)
    }

    /// Members.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Leases out.
    pub fn outstanding(&self) -> usize {
        self.leases.len()
    }

    /// Tasks waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Renews the leases `held` of `name` and records its weights; its other leases run
    /// out on their own.
    pub fn renew(&mut self, name: &str, version: Option<u64>, held: &[u64], now: Instant) {
        let Some(w) = self.workers.get_mut(name) else {
            return;
        };
        w.version = version;
        w.last_seen = now;
        for id in held {
            if let Some(lease) = self.leases.get_mut(id) {
                if lease.worker == name {
                    lease.expires = now + self.ttl;
                }
            }
        }
    }

    /// Hands waiting tasks to members with free slots whose weights are at least
    /// `min_version`, the member with the most free slots first (ties by name).
    pub fn grant(&mut self, min_version: u64, now: Instant) -> Vec<Grant> {
        let mut grants = Vec::new();
        while !self.queue.is_empty() {
            let pick = self
                .workers
                .iter()
                .filter(|(_, w)| w.version.is_some_and(|v| v >= min_version))
                .filter(|(_, w)| w.outstanding < w.slots)
                .max_by(|a, b| {
                    let free = |w: &Worker| w.slots - w.outstanding;
                    free(a.1).cmp(&free(b.1)).then(b.0.cmp(a.0))
                })
                .map(|(name, _)| name.clone());
            let Some(name) = pick else { break };
            let request = self.queue.pop_front().expect("checked non-empty");
            if self.settled.contains(&key(request.episode_id)) {
                continue;
            }
            let lease = self.next_lease;
            self.next_lease += 1;
            let w = self.workers.get_mut(&name).expect("picked from the map");
            w.outstanding += 1;
            w.stats.leases += 1;
            self.leases.insert(
                lease,
                Lease {
                    worker: name.clone(),
                    request: request.clone(),
                    expires: now + self.ttl,
                },
            );
            grants.push(Grant {
                worker: name,
                lease,
                request,
            });
        }
        grants
    }

    /// How many more tasks the members could take now: free slots of those with weights
    /// of at least `min_version`, less the tasks already waiting.
    pub fn wanted(&self, min_version: u64) -> usize {
        let free: u32 = self
            .workers
            .values()
            .filter(|w| w.version.is_some_and(|v| v >= min_version))
            .map(|w| w.slots.saturating_sub(w.outstanding))
            .sum();
        (free as usize).saturating_sub(self.queue.len())
    }

    /// Members silent for a whole lease period are dropped, and every lease they held goes
    /// back to the queue with them (also one granted after their last heartbeat); other
    /// leases past their expiry go back too. Re-queued episodes keep their ids and go to
    /// the front of the queue.
    pub fn expire(&mut self, now: Instant) -> (Vec<Requeued>, Vec<String>) {
        let silent: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now.duration_since(w.last_seen) >= self.ttl)
            .map(|(n, _)| n.clone())
            .collect();
        let mut due: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now || silent.contains(&l.worker))
            .map(|(id, _)| *id)
            .collect();
        due.sort_unstable();
        let mut requeued: Vec<Requeued> = due
            .into_iter()
            .rev()
            .filter_map(|id| self.requeue(id))
            .collect();
        requeued.reverse();
        for name in &silent {
            self.forget(name);
        }
        (requeued, silent)
    }

    /// A member leaves: its leases go back to the queue now.
    pub fn leave(&mut self, name: &str) -> Vec<Requeued> {
        let mut ids: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.worker == name)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        let mut out: Vec<Requeued> = ids
            .into_iter()
            .rev()
            .filter_map(|id| self.requeue(id))
            .collect();
        out.reverse();
        self.forget(name);
        out
    }

    /// A worker reports the trajectory of `episode_id` sampled under `lease`.
    pub fn complete(&mut self, name: &str, lease: u64, episode_id: u64) -> Completion {
        let k = key(episode_id);
        if let Some(l) = self.leases.get(&lease) {
            if l.worker == name && key(l.request.episode_id) == k {
                self.drop_lease(lease);
            }
        }
        if !self.settled.insert(k) {
            if let Some(w) = self.workers.get_mut(name) {
                w.stats.duplicates += 1;
            } else {
                self.gone.entry(name.to_string()).or_default().duplicates += 1;
            }
            return Completion::Duplicate;
        }
        // Another copy of this episode (re-queued after this worker's lease ran out) is no
        // longer needed, waiting or leased.
        self.queue.retain(|r| key(r.episode_id) != k);
        let others: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| key(l.request.episode_id) == k)
            .map(|(id, _)| *id)
            .collect();
        for id in others {
            self.drop_lease(id);
        }
        match self.workers.get_mut(name) {
            Some(w) => w.stats.episodes += 1,
            None => self.gone.entry(name.to_string()).or_default().episodes += 1,
        }
        Completion::Accepted
    }

    /// Per worker (members and those gone), by name.
    pub fn stats(&self) -> BTreeMap<String, WorkerStats> {
        let mut all = self.gone.clone();
        for (name, w) in &self.workers {
            all.insert(name.clone(), w.stats.clone());
        }
        all
    }

    /// The earliest lease expiry, to know when to look again.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.leases.values().map(|l| l.expires).min()
    }

    fn drop_lease(&mut self, id: u64) -> Option<Lease> {
        let lease = self.leases.remove(&id)?;
        if let Some(w) = self.workers.get_mut(&lease.worker) {
            w.outstanding = w.outstanding.saturating_sub(1);
        }
        Some(lease)
    }

    fn requeue(&mut self, id: u64) -> Option<Requeued> {
        let lease = self.drop_lease(id)?;
        match self.workers.get_mut(&lease.worker) {
            Some(w) => w.stats.requeued += 1,
            None => self.gone.entry(lease.worker.clone()).or_default().requeued += 1,
        }
        let episode_id = lease.request.episode_id;
        if !self.settled.contains(&key(episode_id)) {
            self.queue.push_front(lease.request);
        }
        Some(Requeued {
            worker: lease.worker,
            lease: id,
            episode_id,
        })
    }

    fn forget(&mut self, name: &str) {
        if let Some(w) = self.workers.remove(name) {
            self.gone.insert(name.to_string(), w.stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_r1_envs::task::Task;

    fn request(episode_id: u64) -> EpisodeRequest {
        EpisodeRequest {
            task: Task {
                id: format!("t{episode_id}"),
                data_source: "test".into(),
                question: format!("q{episode_id}"),
                answers: vec!["a".into()],
                prompt: None,
                extra: serde_json::Value::Null,
            },
            group_id: episode_id / 2,
            episode_id,
            resume: None,
        }
    }

    fn table(tasks: u64) -> (LeaseTable, Instant) {
        let mut t = LeaseTable::new(Duration::from_secs(10));
        for id in 0..tasks {
            t.enqueue(request(id));
        }
        (t, Instant::now())
    }

    #[test]
    fn grants_spread_over_free_slots_and_stop_at_capacity() {
        let (mut t, now) = table(10);
        t.join("a", 2, Some(0), now);
        t.join("b", 3, Some(0), now);
        let grants = t.grant(0, now);
        let to = |w: &str| grants.iter().filter(|g| g.worker == w).count();
        assert_eq!((to("a"), to("b")), (2, 3));
        assert_eq!((t.outstanding(), t.waiting(), t.wanted(0)), (5, 5, 0));
        assert_eq!(grants[0].request.episode_id, 0, "stream order is kept");
    }

    #[test]
    fn a_worker_with_old_weights_gets_nothing_until_it_catches_up() {
        let (mut t, now) = table(4);
        t.join("old", 4, Some(2), now);
        t.join("new", 1, None, now);
        assert!(t.grant(3, now).is_empty());
        assert_eq!(t.wanted(3), 0);
        t.renew("old", Some(3), &[], now);
        assert_eq!(t.grant(3, now).len(), 4);
    }

    #[test]
    fn an_expired_lease_is_requeued_first_and_its_episode_accepted_once() {
        let (mut t, now) = table(3);
        t.join("a", 1, Some(0), now);
        let first = t.grant(0, now).remove(0);
        assert_eq!(first.request.episode_id, 0);
        // Renewed at +5 s, it lives to +15 s.
        t.renew("a", Some(0), &[first.lease], now + Duration::from_secs(5));
        let (requeued, gone) = t.expire(now + Duration::from_secs(12));
        assert!(requeued.is_empty() && gone.is_empty());
        t.join("b", 1, Some(0), now + Duration::from_secs(12));
        // `a` goes silent: at +16 s its lease runs out and it is dropped.
        let (requeued, gone) = t.expire(now + Duration::from_secs(16));
        assert_eq!(
            requeued,
            vec![Requeued {
                worker: "a".into(),
                lease: first.lease,
                episode_id: 0
            }]
        );
        assert_eq!(gone, vec!["a".to_string()]);
        let again = t.grant(0, now + Duration::from_secs(16)).remove(0);
        assert_eq!((again.worker.as_str(), again.request.episode_id), ("b", 0));
        assert_ne!(again.lease, first.lease);
        assert_eq!(t.complete("b", again.lease, 0), Completion::Accepted);
        // The first holder finishes late: dropped, counted against it.
        assert_eq!(t.complete("a", first.lease, 0), Completion::Duplicate);
        let stats = t.stats();
        assert_eq!((stats["a"].requeued, stats["a"].duplicates), (1, 1));
        assert_eq!((stats["b"].episodes, stats["a"].episodes), (1, 0));
    }

    #[test]
    fn a_task_handed_back_is_settled_and_a_late_report_of_it_is_a_duplicate() {
        let (mut t, now) = table(2);
        t.join("a", 1, Some(0), now);
        let lease = t.grant(0, now).remove(0).lease;
        // `a` goes silent with episode 0: it is queued again, ahead of episode 1.
        let (requeued, gone) = t.expire(now + Duration::from_secs(10));
        assert_eq!((requeued.len(), gone.len(), t.workers()), (1, 1, 0));
        let back: Vec<u64> = std::iter::from_fn(|| t.hand_back())
            .map(|r| r.episode_id)
            .collect();
        assert_eq!(back, vec![0, 1], "re-queued first, then stream order");
        assert_eq!((t.waiting(), t.wanted(0)), (0, 0));
        // `a` was only slow: it rejoins and reports the episode the trainer ran itself.
        t.join("a", 1, Some(0), now + Duration::from_secs(11));
        assert_eq!(t.complete("a", lease, 0), Completion::Duplicate);
        assert_eq!(t.stats()["a"].duplicates, 1);
    }

    #[test]
    fn a_silent_worker_is_dropped_with_every_lease_it_held_even_a_fresh_one() {
        let (mut t, now) = table(1);
        t.join("a", 2, Some(0), now);
        let first = t.grant(0, now).remove(0);
        // A second task is leased 5 s after a's last word: alone it would live to +15 s.
        t.enqueue(request(9));
        let second = t.grant(0, now + Duration::from_secs(5));
        assert_eq!(second.len(), 1);
        let (requeued, gone) = t.expire(now + Duration::from_secs(10));
        assert_eq!(gone, vec!["a".to_string()]);
        let ids: Vec<u64> = requeued.iter().map(|r| r.lease).collect();
        assert_eq!(ids, vec![first.lease, second[0].lease]);
        assert_eq!((t.outstanding(), t.waiting()), (0, 2));
        assert_eq!(t.stats()["a"].requeued, 2);
    }

    #[test]
    fn a_late_trajectory_of_a_requeued_episode_cancels_the_copy() {
        let (mut t, now) = table(1);
        t.join("a", 1, Some(0), now);
        let lease = t.grant(0, now)[0].lease;
        let _ = t.leave("a");
        assert_eq!(t.waiting(), 1);
        // `a` was slow, not gone: its trajectory arrives after the lease was returned.
        assert_eq!(t.complete("a", lease, 0), Completion::Accepted);
        assert_eq!(t.waiting(), 0, "the queued copy is dropped");
        // A retry of the same episode counts as the same episode.
        assert_eq!(t.complete("b", 99, RETRY_BIT), Completion::Duplicate);
    }

    #[test]
    fn leaving_returns_every_lease_in_stream_order_and_a_rejoin_keeps_the_counts() {
        let (mut t, now) = table(4);
        t.join("a", 3, Some(0), now);
        let grants = t.grant(0, now);
        assert_eq!(grants.len(), 3);
        assert_eq!(t.complete("a", grants[0].lease, 0), Completion::Accepted);
        let back: Vec<u64> = t.leave("a").iter().map(|r| r.episode_id).collect();
        assert_eq!(back, vec![1, 2]);
        assert!(!t.knows("a"));
        assert!(t.join("a", 3, Some(0), now));
        let again: Vec<u64> = t
            .grant(0, now)
            .iter()
            .map(|g| g.request.episode_id)
            .collect();
        assert_eq!(again, vec![1, 2, 3]);
        let s = &t.stats()["a"];
        assert_eq!((s.joins, s.leases, s.episodes, s.requeued), (2, 6, 1, 2));
    }
}
