//! The engine actor: it owns the engine thread's lifecycle. It starts the thread, and when the
//! thread crashes (a panic, libtorch's included, or an error out of a step) it starts a new
//! one on a fresh model from the same loader, under a [`EngineRestartPolicy`].
//!
//! Callers never see the restart in their handles: every [`EngineHandle`] clone sends into one
//! channel that the actor keeps open, so what was queued waits for the new thread. Turns the
//! crashed thread had accepted (queued or decoding) are carried to the new one and run again
//! from their context: the tokens a crashed turn had sampled are dropped, never half-returned.
//! A turn that was decoding in two crashes is answered with the error instead (it may be the
//! cause). The new thread starts from the loaded weights, so it admits no turn until a weight
//! update brings it back to the version it served before the crash; the restart is announced
//! on [`EngineHandle::restarts`] for whoever owns the weights to send them (in `train`, the
//! learner). Counters continue across restarts and count them.
//!
//! The actor gives up when the thread crashes more than `max_restarts` times within `window`,
//! or when the model fails to load at the first start: then every turn is answered with the
//! reason, and every later call fails at once with it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::Receiver;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use super::faults::FaultReader;
use super::worker::{self, give_up_turns, Exit, Start};
use super::{check_config, Command, EngineConfig, EngineFaults, EngineHandle, EngineStats};
use crate::model::PolicyModel;
use crate::tokenizer::HfTokenizer;
use crate::{Error, Result};

/// Builds the engine's model; called on the engine thread at every (re)start.
pub type LoadModel = Arc<dyn Fn() -> Result<PolicyModel> + Send + Sync>;

/// When a crashed engine thread is replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRestartPolicy {
    /// Crashes tolerated within `window`; one more and the engine stops for good.
    pub max_restarts: u32,
    /// The window crashes are counted in.
    pub window: Duration,
    /// Pause before a replacement starts (a crash that repeats at once does not spin).
    pub backoff: Duration,
}

impl Default for EngineRestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 3,
            window: Duration::from_secs(600),
            backoff: Duration::from_secs(1),
        }
    }
}

/// Turns decoding in this many crashes are failed rather than run again.
const CRASHES_PER_TURN: u32 = 2;

/// Messages of the engine actor.
pub enum EngineMsg {
    /// The engine thread ended (sent by the thread itself).
    Exited(ThreadExit),
    /// Start the replacement thread (after the back-off).
    Restart(ThreadExit),
}

// Local only: never sent to another node.
impl ractor::Message for EngineMsg {}

/// How an engine thread ended (opaque: only the actor reads it).
pub struct ThreadExit(Box<Exit>);

/// The engine actor (see the module docs).
struct EngineActor;

struct EngineState {
    load: LoadModel,
    tokenizer: Option<Arc<HfTokenizer>>,
    config: EngineConfig,
    /// Keeps the channel open while no thread holds it (between a crash and the restart).
    rx: Receiver<Command>,
    handle: EngineHandle,
    policy: EngineRestartPolicy,
    /// The engine's view of its fault plan, handed from each thread to its replacement.
    faults: Option<Arc<FaultReader>>,
    crashes: VecDeque<Instant>,
    served: bool,
}

/// Starts the engine thread under an engine actor; returns once the model is loaded, or with
/// the loading error. See the module docs for what a restart keeps. `faults` is a
/// fault-injection plan (tests, benchmarks); `None` in production.
pub async fn start_supervised(
    load: LoadModel,
    tokenizer: Option<Arc<HfTokenizer>>,
    config: EngineConfig,
    policy: EngineRestartPolicy,
    faults: Option<EngineFaults>,
) -> Result<(EngineHandle, ActorRef<EngineMsg>)> {
    check_config(&config)?;
    let (tx, rx) = crossbeam::channel::bounded(config.max_pending + 64);
    let handle = EngineHandle::new(tx, &config);
    let (ready, loaded) = oneshot::channel();
    let state = EngineState {
        load,
        tokenizer,
        config,
        rx,
        handle: handle.clone(),
        policy,
        faults: faults.as_ref().map(EngineFaults::reader),
        crashes: VecDeque::new(),
        served: false,
    };
    let (actor, _) = Actor::spawn(None, EngineActor, (state, ready))
        .await
        .map_err(|e| Error::EngineStopped(format!("cannot start the engine actor: {e}")))?;
    match loaded.await {
        Ok(Ok(())) => Ok((handle, actor)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::EngineStopped(
            "the engine thread died while loading".into(),
        )),
    }
}

impl EngineState {
    /// Starts an engine thread that reports its end to `myself`.
    fn spawn_thread(
        &self,
        myself: ActorRef<EngineMsg>,
        start: Start,
        ready: impl FnOnce(Result<()>) + Send + 'static,
    ) -> std::io::Result<()> {
        let load = self.load.clone();
        let rx = self.rx.clone();
        let failure = self.handle.failure.clone();
        std::thread::Builder::new()
            .name("agent-r1-engine".into())
            .spawn(move || {
                let exit = worker::run(|| load(), start, ready);
                if let Err(ractor::MessagingErr::SendErr(EngineMsg::Exited(ThreadExit(exit)))) =
                    myself.cast(EngineMsg::Exited(ThreadExit(Box::new(exit))))
                {
                    // The actor is gone: nobody restarts, so nobody may be left waiting.
                    exit.stop_for_good(&failure, &rx);
                }
            })
            .map(drop)
    }

    fn start(&self, carried: Vec<worker::Waiting>, stats: EngineStats, hold_until: u64) -> Start {
        Start {
            carried,
            stats,
            hold_until,
            ..Start::new(
                self.tokenizer.clone(),
                self.config.clone(),
                self.rx.clone(),
                self.handle.heartbeat.clone(),
                self.faults.clone(),
            )
        }
    }

    /// Crashes within the window, this one included.
    fn count_crash(&mut self, now: Instant) -> usize {
        self.crashes.push_back(now);
        while self
            .crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.policy.window)
        {
            self.crashes.pop_front();
        }
        self.crashes.len()
    }

    /// Stops for good with `why`, logged (see [`Self::stop`]).
    fn give_up(&self, myself: &ActorRef<EngineMsg>, exit: Exit, why: String) {
        tracing::error!("engine {}: {why}", self.config.metrics_label);
        self.stop(
            myself,
            Exit {
                reason: why,
                ..exit
            },
        );
    }

    /// Ends the engine with `exit`'s reason ([`Exit::stop_for_good`]: recorded, so later calls
    /// fail at once, then every turn answered with it) and stops the actor.
    fn stop(&self, myself: &ActorRef<EngineMsg>, exit: Exit) {
        exit.stop_for_good(&self.handle.failure, &self.rx);
        myself.stop(None);
    }
}

impl Actor for EngineActor {
    type Msg = EngineMsg;
    type State = EngineState;
    /// The state to start with, and where to report the first load.
    type Arguments = (EngineState, oneshot::Sender<Result<()>>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (state, ready): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        metrics::counter!(crate::metric_names::ENGINE_RESTARTS_TOTAL.name, "engine" => state.config.metrics_label.clone())
            .increment(0);
        let start = state.start(Vec::new(), EngineStats::default(), 0);
        state.spawn_thread(myself, start, move |loaded| {
            let _ = ready.send(loaded);
        })?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            EngineMsg::Exited(ThreadExit(exit)) => {
                let mut exit = *exit;
                state.served |= exit.served;
                if !exit.crashed || !state.served {
                    // Shut down, or the first start failed to load (the caller has the error).
                    state.stop(&myself, exit);
                    return Ok(());
                }
                let crashes = state.count_crash(Instant::now());
                if crashes > state.policy.max_restarts as usize {
                    let why = format!(
                        "the engine thread crashed {crashes} times within {:?} (the restart \
                         policy allows {}); the last: {}",
                        state.policy.window, state.policy.max_restarts, exit.reason
                    );
                    state.give_up(&myself, exit, why);
                    return Ok(());
                }
                let (poisoned, carried) = std::mem::take(&mut exit.carried)
                    .into_iter()
                    .partition(|w| w.crashes >= CRASHES_PER_TURN);
                give_up_turns(
                    poisoned,
                    &format!(
                        "the engine thread crashed {CRASHES_PER_TURN} times while running this \
                         turn; the last: {}",
                        exit.reason
                    ),
                );
                exit.carried = carried;
                tracing::warn!(
                    "engine {}: restarting the engine thread in {:?} ({} turns carried over): {}",
                    state.config.metrics_label,
                    state.policy.backoff,
                    exit.carried.len(),
                    exit.reason
                );
                myself.send_after(state.policy.backoff, move || {
                    EngineMsg::Restart(ThreadExit(Box::new(exit)))
                });
            }
            EngineMsg::Restart(ThreadExit(exit)) => {
                let Exit {
                    carried,
                    mut stats,
                    version,
                    ..
                } = *exit;
                stats.restarts += 1;
                let restarts = stats.restarts;
                let start = state.start(carried, stats, version);
                state.spawn_thread(myself, start, |_| {})?;
                metrics::counter!(crate::metric_names::ENGINE_RESTARTS_TOTAL.name, "engine" => state.config.metrics_label.clone())
                    .increment(1);
                state.handle.restarts.send_replace(restarts);
            }
        }
        Ok(())
    }
}
