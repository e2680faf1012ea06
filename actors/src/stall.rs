//! The stall detector: names the stage of a run that stopped making progress.
//!
//! Each stage (the env calls, each tool pool, the engine, the learner, weight publication,
//! checkpoint writes) is watched through a [`Probe`] that says which piece of its work is
//! stuck and since when, against the stage's deadline ([`StallConfig`]). A watchdog on its
//! own OS thread checks the probes, so a stage that blocks the runtime's threads (a tool
//! that blocks its thread, say) cannot silence it. A stage past its deadline is a [`Stall`]:
//! logged once (naming the stage and the stuck episode, call or step), counted in
//! `agent_r1_stalls_total{stage}`, shown by `agent_r1_stalled{stage}` while it lasts, and
//! handed to the caller, who decides what a stall means (the train daemon fails the run with
//! it when `stall.fail_run` is set).

mod config;
mod operations;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use config::StallConfig;
pub use operations::{Operation, Operations};

/// What a probe found stuck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// The stuck piece of work: an episode's env call, a tool call, the waiting turns.
    pub item: String,
    /// Since when it has made no progress.
    pub since: Instant,
}

/// Says what of a stage's work has made no progress, and since when.
pub trait Probe: Send + Sync + 'static {
    /// The piece of work that has gone longest without progress at `now`, if any work is
    /// under way.
    fn stuck(&self, now: Instant) -> Option<Stuck>;
}

/// A stage past its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The stage (`env`, `tool search`, `engine`, `learner`, `publication`, `checkpoint`).
    pub stage: String,
    /// What is stuck in it.
    pub item: String,
    /// How long it has made no progress.
    pub stuck_for: Duration,
    /// The stage's deadline.
    pub deadline: Duration,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stuck stage: {}: {} made no progress for {:.1} s (deadline {:.1} s)",
            self.stage,
            self.item,
            self.stuck_for.as_secs_f64(),
            self.deadline.as_secs_f64()
        )
    }
}

struct Watched {
    stage: String,
    deadline: Duration,
    probe: Arc<dyn Probe>,
}

#[derive(Default)]
struct Registry {
    stages: Vec<Watched>,
    /// Operation registries by stage, so that a stage asked for twice is one stage.
    operations: BTreeMap<String, Operations>,
    /// Stalls found by the last check.
    current: Vec<Stall>,
}

/// The stages of one run and their deadlines (cheap to clone; one per run).
#[derive(Clone, Default)]
pub struct StallDetector {
    inner: Arc<Mutex<Registry>>,
}

impl fmt::Debug for StallDetector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.lock();
        f.debug_struct("StallDetector")
            .field(
                "stages",
                &r.stages.iter().map(|s| &s.stage).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl StallDetector {
    /// A detector watching nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `probe` as `stage`, stalled once it reports work stuck for `deadline`.
    pub fn watch(&self, stage: impl Into<String>, deadline: Duration, probe: Arc<dyn Probe>) {
        self.lock().stages.push(Watched {
            stage: stage.into(),
            deadline,
            probe,
        });
    }

    /// The operation registry of `stage` (created and watched with `deadline` on first use;
    /// later calls return the same registry).
    pub fn operations(&self, stage: &str, deadline: Duration) -> Operations {
        let mut r = self.lock();
        if let Some(ops) = r.operations.get(stage) {
            return ops.clone();
        }
        let ops = Operations::default();
        r.operations.insert(stage.to_string(), ops.clone());
        r.stages.push(Watched {
            stage: stage.to_string(),
            deadline,
            probe: Arc::new(ops.clone()),
        });
        ops
    }

    /// Every stage stalled at `now`.
    pub fn check(&self, now: Instant) -> Vec<Stall> {
        let r = self.lock();
        r.stages
            .iter()
            .filter_map(|w| {
                let stuck = w.probe.stuck(now)?;
                let stuck_for = now.saturating_duration_since(stuck.since);
                (stuck_for >= w.deadline).then(|| Stall {
                    stage: w.stage.clone(),
                    item: stuck.item,
                    stuck_for,
                    deadline: w.deadline,
                })
            })
            .collect()
    }

    /// The stalls the watchdog found at its last check (empty without a watchdog).
    pub fn current(&self) -> Vec<Stall> {
        self.lock().current.clone()
    }

    /// How often the watchdog looks: a quarter of the shortest deadline, between 10 ms and
    /// 1 s, so a stall is reported at most a quarter past its deadline.
    fn interval(&self) -> Duration {
        let shortest = self.lock().stages.iter().map(|w| w.deadline).min();
        shortest
            .map_or(Duration::from_secs(1), |d| d / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Starts the watchdog thread. Each new stall (a stage, and the item stuck in it) is
    /// logged, counted and passed to `on_stall` once; the thread stops when the returned
    /// [`Watchdog`] is dropped.
    pub fn spawn_watchdog(
        &self,
        mut on_stall: impl FnMut(&Stall) + Send + 'static,
    ) -> std::io::Result<Watchdog> {
        let detector = self.clone();
        let (stop, stopped) = crossbeam::channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("agent-r1-stall-watchdog".into())
            .spawn(move || {
                let mut reported: BTreeSet<(String, String)> = BTreeSet::new();
                let mut stalled_stages: BTreeSet<String> = BTreeSet::new();
                while let Err(crossbeam::channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(detector.interval())
                {
                    let stalls = detector.check(Instant::now());
                    // Published before anyone hears of them, so that whoever is told of a
                    // stall finds it in `current`.
                    detector.lock().current = stalls.clone();
                    let now_stalled: BTreeSet<String> =
                        stalls.iter().map(|s| s.stage.clone()).collect();
                    for stage in stalled_stages.difference(&now_stalled) {
                        metrics::gauge!(crate::metric_names::STALLED.name, "stage" => stage.clone()).set(0.0);
                        tracing::warn!(stage = %stage, "stage made progress again");
                    }
                    for stall in &stalls {
                        metrics::gauge!(crate::metric_names::STALLED.name, "stage" => stall.stage.clone())
                            .set(1.0);
                        if reported.insert((stall.stage.clone(), stall.item.clone())) {
                            metrics::counter!(crate::metric_names::STALLS_TOTAL.name, "stage" => stall.stage.clone())
                                .increment(1);
                            tracing::error!("{stall}");
                            on_stall(stall);
                        }
                    }
                    stalled_stages = now_stalled;
                }
            })?;
        Ok(Watchdog {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A run's detector with the deadlines its stages are watched under; the names of the
/// stages are defined here.
#[derive(Clone, Debug)]
pub struct StallWatch {
    /// The detector every stage registers with.
    pub detector: StallDetector,
    /// The deadlines.
    pub config: StallConfig,
}

impl StallWatch {
    /// A watch over a new detector.
    pub fn new(config: StallConfig) -> Self {
        Self {
            detector: StallDetector::new(),
            config,
        }
    }

    /// Env calls (`episode E: score`, ...).
    pub fn env(&self) -> Operations {
        self.operations("env", self.config.env_secs)
    }

    /// The calls of the tool `name`'s pool.
    pub fn tool(&self, name: &str) -> Operations {
        self.operations(&format!("tool {name}"), self.config.tool_secs)
    }

    /// Learner updates.
    pub fn learner(&self) -> Operations {
        self.operations("learner", self.config.learner_secs)
    }

    /// Weight publications to the engine.
    pub fn publication(&self) -> Operations {
        self.operations("publication", self.config.publish_secs)
    }

    /// Checkpoint writes.
    pub fn checkpoint(&self) -> Operations {
        self.operations("checkpoint", self.config.checkpoint_secs)
    }

    /// Watches the engine's decode loop ([`crate::engine::EngineHandle::stall_probe`]).
    pub fn engine(&self, probe: Arc<dyn Probe>) {
        self.detector.watch(
            "engine",
            Duration::from_secs_f64(self.config.engine_secs),
            probe,
        );
    }

    fn operations(&self, stage: &str, secs: f64) -> Operations {
        self.detector
            .operations(stage, Duration::from_secs_f64(secs))
    }
}

/// The running watchdog thread; dropping it stops the thread.
#[derive(Debug)]
pub struct Watchdog {
    stop: Option<crossbeam::channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When a stage that works in a loop (the engine's steps) last went round it; its probe
/// combines this with whether work is waiting.
#[derive(Debug)]
pub struct Heartbeat {
    base: Instant,
    /// Microseconds after `base` of the last beat.
    last: std::sync::atomic::AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    /// Records progress now.
    pub fn beat(&self) {
        let micros = self.base.elapsed().as_micros() as u64;
        self.last
            .store(micros, std::sync::atomic::Ordering::Relaxed);
    }

    /// When progress was last recorded.
    pub fn last(&self) -> Instant {
        self.base + Duration::from_micros(self.last.load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Option<Stuck>);

    impl Probe for Fixed {
        fn stuck(&self, _now: Instant) -> Option<Stuck> {
            self.0.clone()
        }
    }

    #[test]
    fn a_stage_is_stalled_once_its_oldest_operation_passes_the_deadline() {
        let detector = StallDetector::new();
        let env = detector.operations("env", Duration::from_secs(10));
        let t0 = Instant::now();
        let first = env.start_at("episode 3: score", t0);
        let _second = env.start_at("episode 4: score", t0 + Duration::from_secs(5));
        assert!(detector.check(t0 + Duration::from_secs(9)).is_empty());
        let stalls = detector.check(t0 + Duration::from_secs(10));
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].stage, "env");
        assert_eq!(stalls[0].item, "episode 3: score");
        assert_eq!(stalls[0].stuck_for, Duration::from_secs(10));
        assert!(stalls[0]
            .to_string()
            .starts_with("stuck stage: env: episode 3: score"));
        // The first finishes: the next oldest is not past the deadline yet, then is.
        drop(first);
        assert!(detector.check(t0 + Duration::from_secs(14)).is_empty());
        assert_eq!(
            detector.check(t0 + Duration::from_secs(15))[0].item,
            "episode 4: score"
        );
        // Asking for the stage again gives the same registry.
        assert_eq!(detector.operations("env", Duration::from_secs(1)).len(), 1);
    }

    #[test]
    fn only_stages_past_their_own_deadline_are_reported() {
        let detector = StallDetector::new();
        let t0 = Instant::now();
        let stuck = |item: &str| {
            Arc::new(Fixed(Some(Stuck {
                item: item.into(),
                since: t0,
            })))
        };
        detector.watch("engine", Duration::from_secs(2), stuck("3 turns waiting"));
        detector.watch("learner", Duration::from_secs(60), stuck("update 4"));
        detector.watch("idle", Duration::from_secs(1), Arc::new(Fixed(None)));
        let stalls = detector.check(t0 + Duration::from_secs(30));
        assert_eq!(
            stalls.iter().map(|s| s.stage.as_str()).collect::<Vec<_>>(),
            ["engine"]
        );
        assert_eq!(detector.interval(), Duration::from_millis(250));
    }

    #[test]
    fn the_watchdog_reports_each_stall_once_and_clears_it_when_work_ends() {
        let detector = StallDetector::new();
        let ops = detector.operations("checkpoint", Duration::from_millis(40));
        let (tx, rx) = crossbeam::channel::unbounded();
        let _watchdog = detector
            .spawn_watchdog(move |s| tx.send(s.clone()).unwrap())
            .unwrap();
        let op = ops.start("step 3");
        // Waits on the report itself, not on a clock: the stall arrives once the deadline
        // has passed, however slow the machine.
        let stall = rx.recv_timeout(Duration::from_secs(60)).expect("reported");
        assert_eq!(
            (stall.stage.as_str(), stall.item.as_str()),
            ("checkpoint", "step 3")
        );
        assert!(stall.stuck_for >= stall.deadline);
        drop(op);
        // The same operation is never reported twice; a new one is.
        let _again = ops.start("step 4");
        let next = rx.recv_timeout(Duration::from_secs(60)).expect("reported");
        assert_eq!(next.item, "step 4");
    }

    #[test]
    fn a_heartbeat_reports_its_last_beat() {
        let h = Heartbeat::default();
        let before = Instant::now();
        h.beat();
        assert!(h.last() <= Instant::now());
        assert!(h.last() + Duration::from_millis(1) >= before);
    }
}
