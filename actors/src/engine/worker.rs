//! The engine thread: admit, prefill, decode, finish, repeat.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError};
use tch::{Kind, Tensor};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::decode_graph::DecodeGraphs;
use super::faults::FaultReader;
use super::kv_pool::KvPool;
use super::parked::{ParkedStore, SpareSlots};
use super::slots::{ParkedKv, SlotCache};
use super::{Command, EngineConfig, EngineStats, TurnOutput, TurnRequest};
use crate::device::memory;
use crate::error::panic_message;
use crate::memory_plan::{engine_share, EngineShare, ShareRequest};
use crate::model::generate::FinishReason;
use crate::model::sampling::{sample_batch, token_draw, RowSampling};
use crate::model::PolicyModel;
use crate::stall::Heartbeat;
use crate::tokenizer::HfTokenizer;
use crate::weight_digest::{TensorDigest, WeightDigest};
use crate::{Error, Result};

/// A turn accepted and not yet admitted into the batch; also what a crashed thread hands
/// to its successor.
pub(super) struct Waiting {
    pub(super) request: TurnRequest,
    pub(super) reply: oneshot::Sender<Result<TurnOutput>>,
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) submitted: Instant,
    /// Engine threads that crashed while this turn was running.
    pub(super) crashes: u32,
}

struct Running {
    request: TurnRequest,
    reply: oneshot::Sender<Result<TurnOutput>>,
    _permit: OwnedSemaphorePermit,
    submitted: Instant,
    crashes: u32,
    admitted: Instant,
    generated: Vec<u32>,
    logprobs: Vec<f32>,
    /// The policy version that sampled each generated token.
    token_versions: Vec<u64>,
    prefill: usize,
    reused: usize,
    /// The episode's own parked KV this turn was restored from; parking the turn copies
    /// only the slots past `reused` into it, when they fit.
    own_kv: Option<ParkedKv>,
    finish: Option<FinishReason>,
    /// The engine's policy version when the turn was admitted. Weights may be swapped while
    /// the turn decodes (between steps), so this is the oldest version that produced any of
    /// its tokens, and the one reported: staleness is then never under-estimated.
    version: u64,
}

/// Where an admitted turn's KV starts from.
enum ReusableKv {
    /// The episode's own parked KV, covering this many context tokens.
    Own(ParkedKv, usize),
    /// The shared prompt prefix, covering this many context tokens.
    Shared(ParkedKv, usize),
    None,
}

impl ReusableKv {
    fn reused(&self) -> usize {
        match self {
            ReusableKv::Own(_, n) | ReusableKv::Shared(_, n) => *n,
            ReusableKv::None => 0,
        }
    }
}

impl Running {
    fn budget(&self) -> usize {
        self.request.context.len() + self.request.params.max_new_tokens
    }
}

struct Worker {
    model: PolicyModel,
    tokenizer: Option<Arc<HfTokenizer>>,
    config: EngineConfig,
    slots: SlotCache,
    /// Captured decode steps, on a GPU where they can be made.
    graphs: Option<DecodeGraphs>,
    parked: ParkedStore,
    /// Where parked KV lives (the episodes' own; the shared prefix is a heap tensor).
    pool: KvPool,
    /// KV of one prompt under the current weights, reused for the common prefix of episodes
    /// that have nothing parked (the system message and tools are the same for all).
    shared_prefix: Option<(Vec<u32>, ParkedKv)>,
    park_spare: SpareSlots,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    stats: EngineStats,
    version: u64,
    /// See [`Start::hold_until`].
    hold_until: u64,
    /// The fault plan as this thread has read it (tests and fault-injection flags).
    faults: Option<Arc<FaultReader>>,
    /// Fault injection: the thread panics after this many more steps.
    panic_after_steps: Option<u64>,
    /// Fault injection: the thread panics on its next weight update.
    panic_on_update: bool,
    /// Steps left before a pause ([`Command::PauseAfterSteps`]); `Some(0)` while paused.
    pause_after_steps: Option<u64>,
    window: PhaseWindow,
}

/// Where the engine thread's time went since the last export of `agent_r1_engine_time_ratio`.
struct PhaseWindow {
    started: Instant,
    at_start: [f64; 5],
    /// The engine's `engine` label.
    label: String,
}

impl PhaseWindow {
    /// Exported about this often, so a dashboard sees the share of each phase live.
    const LENGTH: Duration = Duration::from_secs(2);
    const PHASES: [&'static str; 5] = ["forward", "admit", "finish", "stop_check", "idle"];

    fn totals(stats: &EngineStats) -> [f64; 5] {
        [
            stats.forward_seconds,
            stats.admit_seconds,
            stats.finish_seconds,
            stats.stop_check_seconds,
            stats.idle_seconds,
        ]
    }

    fn new(stats: &EngineStats, label: String) -> Self {
        Self {
            started: Instant::now(),
            at_start: Self::totals(stats),
            label,
        }
    }

    /// Sets the gauge per phase (and `other`, the loop's own time) once a window has passed.
    fn export_if_due(&mut self, stats: &EngineStats) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if elapsed < Self::LENGTH.as_secs_f64() {
            return;
        }
        let now = Self::totals(stats);
        let mut accounted = 0.0;
        for (phase, (end, start)) in Self::PHASES.iter().zip(now.iter().zip(&self.at_start)) {
            let share = (end - start) / elapsed;
            accounted += share;
            metrics::gauge!(crate::metric_names::ENGINE_TIME_RATIO.name, "engine" => self.label.clone(), "phase" => *phase)
                .set(share);
        }
        metrics::gauge!(crate::metric_names::ENGINE_TIME_RATIO.name, "engine" => self.label.clone(), "phase" => "other")
            .set((1.0 - accounted).max(0.0));
        *self = Self::new(stats, std::mem::take(&mut self.label));
    }
}

/// What an engine thread starts with besides its model.
pub(super) struct Start {
    pub(super) tokenizer: Option<Arc<HfTokenizer>>,
    pub(super) config: EngineConfig,
    pub(super) rx: Receiver<Command>,
    pub(super) heartbeat: Arc<Heartbeat>,
    /// Turns a crashed predecessor had accepted, served before the channel.
    pub(super) carried: Vec<Waiting>,
    /// The predecessor's counters, continued.
    pub(super) stats: EngineStats,
    /// No turn is admitted before a weight update brings the version to at least this (the
    /// version the predecessor served: a restarted thread starts from the loaded weights,
    /// and sampling with them would be sampling with a policy the run has left behind).
    pub(super) hold_until: u64,
    /// The engine's view of its fault plan (tests and fault-injection flags), carried from
    /// thread to thread; `None` in production.
    pub(super) faults: Option<Arc<FaultReader>>,
}

impl Start {
    /// A first start: nothing carried, counters at zero, no hold.
    pub(super) fn new(
        tokenizer: Option<Arc<HfTokenizer>>,
        config: EngineConfig,
        rx: Receiver<Command>,
        heartbeat: Arc<Heartbeat>,
        faults: Option<Arc<FaultReader>>,
    ) -> Self {
        Self {
            tokenizer,
            config,
            rx,
            heartbeat,
            carried: Vec::new(),
            stats: EngineStats::default(),
            hold_until: 0,
            faults,
        }
    }
}

/// How an engine thread ended.
pub(super) struct Exit {
    pub(super) reason: String,
    /// False only for a requested shutdown (or every handle dropped).
    pub(super) crashed: bool,
    /// Whether the model loaded and the thread served (false: loading failed).
    pub(super) served: bool,
    /// Turns accepted and not answered: queued, and running (their tokens so far dropped).
    pub(super) carried: Vec<Waiting>,
    pub(super) stats: EngineStats,
    /// The policy version it served when it ended.
    pub(super) version: u64,
}

impl Exit {
    /// Ends the engine: records why in `failure` (first, so callers stop waiting on what they
    /// send from now on), then answers what is left.
    pub(super) fn stop_for_good(
        self,
        failure: &std::sync::OnceLock<String>,
        rx: &Receiver<Command>,
    ) {
        let _ = failure.set(self.reason.clone());
        self.fail_everything(rx);
    }

    /// Answers every turn this thread left, and whatever is still queued in the channel, with
    /// `EngineStopped`, so no caller waits for its timeout.
    fn fail_everything(self, rx: &Receiver<Command>) {
        fail_turns(self.carried, &self.reason);
        while let Ok(cmd) = rx.try_recv() {
            if let Command::Generate { reply, .. } = cmd {
                let _ = reply.send(Err(Error::EngineStopped(self.reason.clone())));
            }
        }
    }
}

/// The engine's share of its device for `model` under `config` (see [`engine_share`]).
fn plan_memory(
    model: &PolicyModel,
    config: &EngineConfig,
    fraction: f64,
) -> std::result::Result<EngineShare, String> {
    let p = model.placement();
    let request = ShareRequest {
        fraction,
        model: model.config(),
        kind: p.kind,
        weights_bytes: model.weights_bytes(),
        max_context: config.max_context as u64,
        wanted_rows: config.max_batch_rows as u64,
        max_batch_tokens: config.max_batch_tokens as u64,
        max_prefill_tokens: config.max_prefill_tokens as u64,
    };
    engine_share::plan(&request, memory::now(p.device)?)
}

/// Answers `turns` the engine gives up on, while it goes on serving, with
/// `TurnFailed(reason)`.
pub(super) fn give_up_turns(turns: Vec<Waiting>, reason: &str) {
    for w in turns {
        let _ = w.reply.send(Err(Error::TurnFailed(reason.to_string())));
    }
}

/// Answers `turns` with `EngineStopped(reason)`.
pub(super) fn fail_turns(turns: Vec<Waiting>, reason: &str) {
    for w in turns {
        let _ = w.reply.send(Err(Error::EngineStopped(reason.to_string())));
    }
}

/// Loads the model with `load` and serves `start.rx` until shutdown or a failure; reports
/// loading on `ready`. A failure (an error or a panic, libtorch's included) hands every
/// accepted turn back in the [`Exit`] instead of answering it.
pub(super) fn run(
    load: impl FnOnce() -> Result<PolicyModel>,
    start: Start,
    ready: impl FnOnce(Result<()>),
) -> Exit {
    let Start {
        tokenizer,
        mut config,
        rx,
        heartbeat,
        carried,
        mut stats,
        hold_until,
        faults,
    } = start;
    let not_started = |reason: String, carried, stats| Exit {
        reason,
        crashed: true,
        served: false,
        carried,
        stats,
        version: hold_until,
    };
    tch::manual_seed(config.seed);
    let loaded =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)).unwrap_or_else(|panic| {
            Err(Error::Panicked {
                what: "loading the engine's model".into(),
                message: panic_message(panic.as_ref()),
            })
        });
    let model = match loaded {
        Ok(m) => m,
        Err(e) => {
            let reason = format!("loading the model failed: {e}");
            ready(Err(e));
            return not_started(reason, carried, stats);
        }
    };
    let c = model.config();
    if let Err(message) = c.check_context(config.max_context) {
        let e = Error::invalid("engine max_context", message);
        let reason = e.to_string();
        ready(Err(e));
        return not_started(reason, carried, stats);
    }
    let p = model.placement();
    if let Some(fraction) = config.memory_fraction {
        match plan_memory(&model, &config, fraction) {
            Ok(plan) => {
                config.max_batch_rows = plan.rows as usize;
                config.parked_kv_bytes = plan.parked_bytes as usize;
                stats.memory_plan = Some(plan);
            }
            Err(message) => {
                let e = Error::invalid("engine memory_fraction", message);
                let reason = e.to_string();
                ready(Err(e));
                return not_started(reason, carried, stats);
            }
        }
    }
    let slots = SlotCache::new(
        c.num_hidden_layers,
        config.max_batch_rows as i64,
        config.max_context as i64,
        c.num_key_value_heads as i64,
        c.head_dim as i64,
        p.kind,
        p.device,
    );
    // Without reuse nothing is ever parked, so the pool would be memory held for nothing.
    let pool_bytes = if config.kv_reuse {
        config.parked_kv_bytes
    } else {
        0
    };
    let pool = match KvPool::new(
        pool_bytes,
        c.num_hidden_layers as i64,
        c.num_key_value_heads as i64,
        c.head_dim as i64,
        p.kind,
        p.device,
        config.prefault_parked_kv,
    ) {
        Ok(pool) => pool,
        Err(e) => {
            let reason = e.to_string();
            ready(Err(e));
            return not_started(reason, carried, stats);
        }
    };
    let graphs = match (config.cuda_graphs, p.device) {
        (true, tch::Device::Cuda(_)) => match DecodeGraphs::new(&model, config.max_batch_rows) {
            Ok(graphs) => Some(graphs),
            Err(e) => {
                tracing::warn!(
                    "engine {}: decoding without CUDA graphs: {e}",
                    config.metrics_label
                );
                stats.cuda_graphs_off = Some(e.to_string());
                None
            }
        },
        _ => None,
    };
    let label = config.metrics_label.clone();
    let mut worker = Worker {
        graphs,
        parked: ParkedStore::default(),
        pool,
        shared_prefix: None,
        park_spare: SpareSlots::default(),
        model,
        tokenizer,
        config,
        slots,
        waiting: carried.into(),
        running: Vec::new(),
        window: PhaseWindow::new(&stats, label),
        stats,
        version: 0,
        hold_until,
        faults,
        panic_after_steps: None,
        panic_on_update: false,
        pause_after_steps: None,
    };
    worker.stats.slot_bytes = worker.slots.bytes_allocated() as u64;
    ready(Ok(()));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        worker.serve(&rx, &heartbeat)
    }));
    let (reason, crashed) = match outcome {
        Ok(Ok(())) => ("engine shut down".to_string(), false),
        Ok(Err(e)) => (format!("engine failed: {e}"), true),
        Err(panic) => (
            format!("engine panicked: {}", panic_message(panic.as_ref())),
            true,
        ),
    };
    if crashed {
        tracing::error!("{reason}");
    }
    if crashed {
        worker.stats.turns_rerun += worker.running.len() as u64;
    }
    let mut carried: Vec<Waiting> = Vec::with_capacity(worker.running.len() + worker.waiting.len());
    carried.extend(worker.running.drain(..).map(|r| Waiting {
        request: r.request,
        reply: r.reply,
        permit: r._permit,
        submitted: r.submitted,
        crashes: r.crashes + u32::from(crashed),
    }));
    carried.extend(worker.waiting.drain(..));
    Exit {
        reason,
        crashed,
        served: true,
        carried,
        stats: worker.snapshot(),
        version: worker.version,
    }
}

impl Worker {
    fn serve(&mut self, rx: &Receiver<Command>, heartbeat: &Heartbeat) -> Result<()> {
        loop {
            // Held for weights, it still goes round its loop: the wait for them is on record
            // where they come from (the learner, then a publication), not as a stuck engine.
            heartbeat.beat();
            if self.paused()
                || (self.running.is_empty() && (self.waiting.is_empty() || self.held()))
            {
                let waited = Instant::now();
                let received = rx.recv_timeout(Duration::from_millis(100));
                self.stats.idle_seconds += waited.elapsed().as_secs_f64();
                match received {
                    Ok(cmd) => {
                        if !self.handle(cmd)? {
                            return Ok(());
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        self.window.export_if_due(&self.stats);
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                if !self.handle(cmd)? {
                    return Ok(());
                }
            }
            self.arm_faults();
            // Only steps with turns to run count towards a pause or an injected panic: a pass
            // that only handled commands (a stats request, say) is not a step.
            let has_work = !self.running.is_empty() || !(self.waiting.is_empty() || self.held());
            if self.paused() || !has_work {
                continue;
            }
            self.step()?;
            if let Some(steps) = self.pause_after_steps.as_mut() {
                *steps = steps.saturating_sub(1);
            }
            if let Some(steps) = self.panic_after_steps.as_mut() {
                *steps = steps.saturating_sub(1);
                if *steps == 0 {
                    panic!("fault injection: the engine thread panics mid-decode");
                }
            }
            self.window.export_if_due(&self.stats);
        }
    }

    /// Takes what the fault plan armed since the last look: a hang stops the thread here for
    /// good; a panic is armed for a step count or the next weight update.
    fn arm_faults(&mut self) {
        let Some(faults) = &self.faults else {
            return;
        };
        if faults.hang() {
            tracing::warn!("fault injection: the engine thread stops stepping");
            loop {
                std::thread::park();
            }
        }
        if let Some(steps) = faults.panic_after() {
            self.panic_after_steps = Some(steps);
        }
        if faults.panic_on_update() {
            self.panic_on_update = true;
        }
    }

    /// Applies a command; false means shut down.
    fn handle(&mut self, cmd: Command) -> Result<bool> {
        match cmd {
            Command::Generate {
                request,
                reply,
                _permit,
                submitted,
            } => self.waiting.push_back(Waiting {
                request,
                reply,
                permit: _permit,
                submitted,
                crashes: 0,
            }),
            Command::Release(episode) => self.parked.remove(episode),
            Command::UpdateWeights {
                version,
                tensors,
                digest,
                reply,
            } => {
                self.arm_faults();
                if std::mem::take(&mut self.panic_on_update) {
                    panic!("fault injection: the engine thread panics during a weight update");
                }
                let result = self.update_weights(version, &tensors, digest.as_ref());
                let _ = reply.send(result);
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
            Command::PauseAfterSteps(steps) => self.pause_after_steps = Some(steps),
            Command::Resume => self.pause_after_steps = None,
            Command::Shutdown => return Ok(false),
        }
        Ok(true)
    }

    /// Whether a test has paused the thread ([`Command::PauseAfterSteps`]).
    fn paused(&self) -> bool {
        self.pause_after_steps == Some(0)
    }

    /// Whether turns wait for a weight update after a restart ([`Start::hold_until`]).
    fn held(&self) -> bool {
        self.version < self.hold_until
    }

    fn snapshot(&self) -> EngineStats {
        EngineStats {
            evictions: self.parked.evictions,
            evicted_tokens: self.parked.evicted_tokens,
            parked_bytes: self.parked.bytes() as u64,
            parked_episodes: self.parked.len() as u64,
            policy_version: self.version,
            awaiting_version: self.held().then_some(self.hold_until),
            queued_turns: self.waiting.len() as u64,
            paused: self.paused(),
            ..self.stats.clone()
        }
    }

    fn update_weights(
        &mut self,
        version: u64,
        tensors: &[(String, Tensor)],
        digest: Option<&WeightDigest>,
    ) -> Result<()> {
        if let Some(sent) = digest {
            // What arrived is what was sent, checked before anything is applied.
            sent.verify(
                &WeightDigest::of(tensors)?,
                "weights received by the engine",
            )?;
        }
        let vars = self.model.var_store().variables();
        for (name, value) in tensors {
            let var = vars.get(name).ok_or_else(|| {
                Error::invalid("weight update", format!("unknown weight `{name}`"))
            })?;
            if var.size() != value.size() {
                return Err(Error::invalid(
                    "weight update",
                    format!(
                        "`{name}` has shape {:?}, expected {:?}",
                        value.size(),
                        var.size()
                    ),
                ));
            }
        }
        tch::no_grad(|| {
            for (name, value) in tensors {
                let mut var = vars[name].shallow_clone();
                var.copy_(&value.to_kind(var.kind()).to_device(var.device()));
            }
        });
        if digest.is_some() {
            // What the engine serves is what it received, in the engine's own dtype.
            for (name, value) in tensors {
                let var = &vars[name];
                let received =
                    TensorDigest::of(&value.to_kind(var.kind()).to_device(var.device()))?;
                let served = TensorDigest::of(var)?;
                if received != served {
                    return Err(Error::WeightSyncMismatch {
                        stage: "weights served by the engine".into(),
                        tensor: name.clone(),
                        detail: format!("checksum {received:?} expected, {served:?} found"),
                    });
                }
            }
        }
        self.parked.clear();
        self.shared_prefix = None;
        self.version = version;
        metrics::gauge!(crate::metric_names::ENGINE_POLICY_VERSION.name, "engine" => self.config.metrics_label.clone()).set(version as f64);
        Ok(())
    }

    fn step(&mut self) -> Result<()> {
        let began = Instant::now();
        let forward_before = self.stats.forward_seconds + self.stats.stop_check_seconds;
        self.admit_and_prefill()?;
        let prefill = self.stats.forward_seconds + self.stats.stop_check_seconds - forward_before;
        self.stats.admit_seconds += (began.elapsed().as_secs_f64() - prefill).max(0.0);
        self.finish_rows();
        if self.running.is_empty() {
            return Ok(());
        }
        self.decode()?;
        self.finish_rows();
        Ok(())
    }

    /// Moves waiting requests into free rows under the token budget and prefills them.
    fn admit_and_prefill(&mut self) -> Result<()> {
        if self.held() {
            return Ok(());
        }
        let mut used: usize = self.running.iter().map(Running::budget).sum();
        let first_new = self.running.len();
        let capacity = self.slots.capacity() as usize;
        let vocab = self.model.config().vocab_size as u32;
        let mut admitted: Vec<(Waiting, ReusableKv)> = Vec::new();
        while first_new + admitted.len() < self.config.max_batch_rows {
            let Some(next) = self.waiting.front() else {
                break;
            };
            let ctx_len = next.request.context.len();
            let budget = ctx_len + next.request.params.max_new_tokens;
            // The first row is admitted whatever its size (`used` counts every row so far).
            if used > 0 && used + budget > self.config.max_batch_tokens {
                break;
            }
            let w = self.waiting.pop_front().expect("front exists");
            if w.reply.is_closed() {
                self.abandon();
                continue;
            }
            let invalid = if ctx_len == 0 {
                Some("the context has no tokens".to_string())
            } else if ctx_len >= capacity {
                Some(format!(
                    "the context has {ctx_len} tokens; the engine holds at most {capacity} per sequence (max_context)"
                ))
            } else {
                w.request
                    .context
                    .iter()
                    .find(|&&t| t >= vocab)
                    .map(|t| format!("token id {t} is outside the vocabulary (size {vocab})"))
            };
            if let Some(message) = invalid {
                let _ = w.reply.send(Err(Error::invalid("turn request", message)));
                continue;
            }
            used += budget;
            let kv = self.reusable_kv(w.request.episode, &w.request.context);
            admitted.push((w, kv));
        }
        if admitted.is_empty() {
            return Ok(());
        }
        // Rows in order of prefill length, so prefill buckets of similar length are
        // contiguous rows; deciding the order before restoring copies each prefix once.
        admitted.sort_by_key(|(w, kv)| w.request.context.len() - kv.reused());
        let now = Instant::now();
        for (w, kv) in admitted {
            let row = self.running.len();
            let reused = kv.reused();
            let own_kv = match kv {
                ReusableKv::Own(kv, reused) => {
                    self.slots.restore(row, &kv, reused as i64);
                    Some(kv)
                }
                ReusableKv::Shared(kv, reused) => {
                    self.slots.restore(row, &kv, reused as i64);
                    None
                }
                ReusableKv::None => {
                    self.slots.truncate(row, 0);
                    None
                }
            };
            self.running.push(Running {
                prefill: w.request.context.len() - reused,
                reused,
                own_kv,
                request: w.request,
                reply: w.reply,
                _permit: w.permit,
                submitted: w.submitted,
                crashes: w.crashes,
                admitted: now,
                generated: Vec::new(),
                logprobs: Vec::new(),
                token_versions: Vec::new(),
                finish: None,
                version: self.version,
            });
        }
        self.prefill(first_new)
    }

    /// The KV a turn starts from and how many of its context tokens that covers: the
    /// episode's parked KV, else the shared prompt prefix (a new or evicted episode's prompt
    /// usually opens with the same system message and tool list as every other episode's).
    /// At least one token is left to run, so the turn has logits to sample from.
    fn reusable_kv(&mut self, episode: u64, context: &[u32]) -> ReusableKv {
        if !self.config.kv_reuse {
            return ReusableKv::None;
        }
        let common = |tokens: &[u32]| {
            let n = tokens
                .iter()
                .zip(context)
                .take_while(|(a, b)| a == b)
                .count();
            n.min(context.len() - 1)
        };
        if let Some((tokens, kv)) = self.parked.take(episode) {
            let reused = common(&tokens);
            return ReusableKv::Own(kv, reused);
        }
        match &self.shared_prefix {
            Some((tokens, kv)) => {
                let reused = common(tokens);
                self.stats.shared_prefix_tokens += reused as u64;
                ReusableKv::Shared(kv.share(), reused)
            }
            None => ReusableKv::None,
        }
    }

    /// Prefills rows `first..` (sorted by prefill length) in buckets of similar length, so
    /// padding stays small, of at most `max_prefill_tokens` (a longer turn alone), and
    /// samples each row's first token.
    fn prefill(&mut self, first: usize) -> Result<()> {
        let cap = self.config.max_prefill_tokens.max(1);
        let mut start = first;
        while start < self.running.len() {
            let shortest = self.running[start].prefill;
            let mut end = start + 1;
            // Rows are sorted by prefill length, so row `end` is the bucket's longest.
            while end < self.running.len()
                && self.running[end].prefill <= shortest.max(16) * 2
                && (end + 1 - start) * self.running[end].prefill <= cap
            {
                end += 1;
            }
            self.prefill_bucket(start, end)?;
            start = end;
        }
        Ok(())
    }

    fn prefill_bucket(&mut self, start: usize, end: usize) -> Result<()> {
        let device = self.model.placement().device;
        let rows = end - start;
        let t = self.running[start..end]
            .iter()
            .map(|r| r.prefill)
            .max()
            .unwrap_or(1);
        let mut ids = vec![0i64; rows * t];
        let mut mask = vec![false; rows * t];
        let mut counts = Vec::with_capacity(rows);
        for (b, r) in self.running[start..end].iter().enumerate() {
            let new = &r.request.context[r.reused..];
            for (j, &tok) in new.iter().enumerate() {
                ids[b * t + j] = tok as i64;
                mask[b * t + j] = true;
            }
            counts.push(new.len() as i64);
        }
        let began = Instant::now();
        let ids = Tensor::from_slice(&ids)
            .view([rows as i64, t as i64])
            .to_device(device);
        let mask = Tensor::from_slice(&mask)
            .view([rows as i64, t as i64])
            .to_device(device);
        let last: Vec<i64> = counts.iter().map(|&c| c - 1).collect();
        let logits = tch::no_grad(|| {
            let mut chunk = self.slots.chunk(start, counts);
            let hidden = self.model.forward(&ids, &mask, Some(&mut chunk));
            let index = Tensor::from_slice(&last).to_device(device);
            let picked = hidden
                .gather(
                    1,
                    &index
                        .view([rows as i64, 1, 1])
                        .expand([rows as i64, 1, hidden.size()[2]], false),
                    false,
                )
                .squeeze_dim(1);
            self.model.logits(&picked)
        });
        let prefill_tokens: usize = self.running[start..end].iter().map(|r| r.prefill).sum();
        self.stats.prefill_padding_tokens += (rows * t - prefill_tokens) as u64;
        let reused: usize = self.running[start..end].iter().map(|r| r.reused).sum();
        self.stats.prefill_tokens += prefill_tokens as u64;
        self.stats.reused_tokens += reused as u64;
        metrics::counter!(crate::metric_names::ENGINE_PREFILL_TOKENS_TOTAL.name, "engine" => self.config.metrics_label.clone()).increment(prefill_tokens as u64);
        metrics::counter!(crate::metric_names::ENGINE_REUSED_TOKENS_TOTAL.name, "engine" => self.config.metrics_label.clone()).increment(reused as u64);
        let stop_check = self.sample_into(start, end, &logits)?;
        self.stats.prefill_passes += 1;
        self.stats.forward_seconds += began.elapsed().as_secs_f64() - stop_check;
        Ok(())
    }

    fn decode(&mut self) -> Result<()> {
        let device = self.model.placement().device;
        let rows = self.running.len();
        let began = Instant::now();
        let ids: Vec<i64> = self
            .running
            .iter()
            .map(|r| *r.generated.last().expect("every running row has sampled") as i64)
            .collect();
        let sampled = match self.graphed_decode(&ids) {
            Some(sampled) => sampled,
            None => {
                let ids = Tensor::from_slice(&ids)
                    .view([rows as i64, 1])
                    .to_device(device);
                let mask = ids.ones_like().to_kind(Kind::Bool);
                let logits = tch::no_grad(|| {
                    let mut chunk = self.slots.chunk(0, vec![1; rows]);
                    let hidden = self.model.forward(&ids, &mask, Some(&mut chunk));
                    self.model.logits(&hidden.squeeze_dim(1))
                });
                sample_batch(&logits, &row_sampling(&self.running, self.config.seed))
            }
        };
        let stop_check = self.take_sampled(0, &sampled)?;
        self.stats.decode_steps += 1;
        self.stats.decode_rows += rows as u64;
        let forward = began.elapsed().as_secs_f64() - stop_check;
        self.stats.forward_seconds += forward;
        self.stats.decode_seconds += forward;
        metrics::histogram!(crate::metric_names::ENGINE_BATCH_SIZE.name, "engine" => self.config.metrics_label.clone()).record(rows as f64);
        metrics::histogram!(crate::metric_names::ENGINE_STEP_SECONDS.name, "engine" => self.config.metrics_label.clone()).record(began.elapsed().as_secs_f64());
        Ok(())
    }

    /// Samples one token for rows `start..end` from `logits` [rows, V] in one pass over the
    /// batch, brings tokens and log-probabilities back in one device-to-host copy, and marks
    /// rows that finished. Returns the seconds spent on stop-string checks, which are not
    /// model work.
    fn sample_into(&mut self, start: usize, end: usize, logits: &Tensor) -> Result<f64> {
        let sampled = sample_batch(
            logits,
            &row_sampling(&self.running[start..end], self.config.seed),
        );
        self.take_sampled(start, &sampled)
    }

    /// The decode step of the running rows by a CUDA graph, where this engine has them;
    /// `None` sends the step down the eager path (and, after a graph failed, every later
    /// one: the failure is logged once and kept in the stats).
    fn graphed_decode(&mut self, ids: &[i64]) -> Option<Tensor> {
        let graphs = self.graphs.as_mut()?;
        let rows = row_sampling(&self.running, self.config.seed);
        let stepped = tch::no_grad(|| graphs.step(&self.model, &self.slots, ids, &rows));
        self.stats.graphs_captured = graphs.captured() as u64;
        match stepped {
            Ok(sampled) => {
                self.slots.advance(ids.len());
                self.stats.graph_decode_steps += 1;
                Some(sampled)
            }
            Err(e) => {
                tracing::warn!(
                    "engine {}: decoding without CUDA graphs from now on: {e}",
                    self.config.metrics_label
                );
                self.stats.cuda_graphs_off = Some(e.to_string());
                self.graphs = None;
                None
            }
        }
    }

    /// Brings rows `start..`'s sampled [n, 2] (token, log-probability) back in one copy and
    /// marks rows that finished. Returns the seconds spent on stop-string checks, which are
    /// not model work.
    fn take_sampled(&mut self, start: usize, sampled: &Tensor) -> Result<f64> {
        let picked = self.copy_to_host(sampled)?;
        let rows = picked.len() / 2;
        let capacity = self.slots.capacity() as usize;
        let checking = Instant::now();
        for (b, pick) in picked.chunks_exact(2).enumerate() {
            let (token, logprob) = (pick[0] as u32, pick[1] as f32);
            let r = &mut self.running[start + b];
            r.generated.push(token);
            r.logprobs.push(logprob);
            r.token_versions.push(self.version);
            self.stats.tokens_generated += 1;
            let params = &r.request.params;
            let stopped = params.stop_token_ids.contains(&token)
                || (!r.request.stop_strings.is_empty()
                    && hits_stop_string(self.tokenizer.as_deref(), r));
            if stopped {
                r.finish = Some(FinishReason::Stop);
            } else if r.generated.len() >= params.max_new_tokens {
                r.finish = Some(FinishReason::Length);
            } else if r.request.context.len() + r.generated.len() >= capacity {
                r.finish = Some(FinishReason::ContextFull);
            }
        }
        let stop_check = checking.elapsed().as_secs_f64();
        self.stats.stop_check_seconds += stop_check;
        metrics::counter!(crate::metric_names::ENGINE_TOKENS_GENERATED_TOTAL.name, "engine" => self.config.metrics_label.clone()).increment(rows as u64);
        Ok(stop_check)
    }

    /// The one way a forward pass's results come back to the host (counted, so a test can
    /// hold the engine to one copy per pass).
    fn copy_to_host(&mut self, picked: &Tensor) -> Result<Vec<f64>> {
        self.stats.device_to_host_copies += 1;
        Ok(Vec::<f64>::try_from(
            picked.to_device(tch::Device::Cpu).view([-1]),
        )?)
    }

    /// Counts a turn whose caller stopped waiting.
    fn abandon(&mut self) {
        self.stats.abandoned_turns += 1;
        metrics::counter!(crate::metric_names::ENGINE_ABANDONED_TURNS_TOTAL.name, "engine" => self.config.metrics_label.clone()).increment(1);
    }

    /// Replies to finished rows, parks their KV, and packs the running rows (dropping rows
    /// whose caller stopped waiting).
    fn finish_rows(&mut self) {
        let began = Instant::now();
        let mut row = 0;
        while row < self.running.len() {
            let abandoned = self.running[row].reply.is_closed();
            if self.running[row].finish.is_none() && !abandoned {
                row += 1;
                continue;
            }
            let last = self.running.len() - 1;
            let mut r = self.running.swap_remove(row);
            if abandoned {
                // Nobody waits for this turn: free its row, park nothing.
                self.slots.move_row(last, row);
                self.abandon();
                continue;
            }
            // The slots hold the context and every generated token but the last (sampled,
            // never fed back).
            let mut tokens = r.request.context.clone();
            tokens.extend(&r.generated[..r.generated.len() - 1]);
            debug_assert_eq!(tokens.len() as i64, self.slots.len(row));
            // A turn that spanned a weight update holds KV computed partly with the old
            // weights: parking it would let the episode's next turn, tagged with the new
            // version, build on the old policy's KV (the update already dropped the rest).
            let spanned_update = r.version != self.version;
            if spanned_update {
                self.stats.turns_spanning_updates += 1;
                metrics::counter!(crate::metric_names::ENGINE_TURNS_SPANNING_WEIGHT_UPDATE_TOTAL.name, "engine" => self.config.metrics_label.clone())
                    .increment(1);
            } else if self.config.kv_reuse {
                if self.shared_prefix.is_none() {
                    // The first prompt seen under these weights becomes the shared prefix
                    // (its system message and tool list are every episode's). A copy of its
                    // own, since the episode's parked KV is written into again.
                    let prompt = r.request.context.clone();
                    let kv = self.slots.park(row, prompt.len() as i64);
                    self.shared_prefix = Some((prompt, kv));
                }
                // A range too small for the turn is dropped (freed) here, so the new one
                // `park_new` leases may include it.
                let in_place = r.own_kv.take().and_then(|kv| {
                    self.park_spare.observe(self.slots.len(row) - kv.len);
                    self.slots.park_into(row, kv, r.reused as i64).ok()
                });
                let kv = match in_place {
                    Some(kv) => {
                        self.stats.parked_in_place += 1;
                        Some(kv)
                    }
                    None => self.park_new(row),
                };
                match kv {
                    Some(kv) => self.parked.insert(r.request.episode, tokens, kv),
                    None => self.parked.count_eviction(tokens.len()),
                }
            }
            self.slots.move_row(last, row);
            self.stats.turns += 1;
            let now = Instant::now();
            let out = TurnOutput {
                prompt_tokens: r.request.context.len(),
                prefill_tokens: r.prefill,
                reused_tokens: r.reused,
                queue_seconds: (r.admitted - r.submitted).as_secs_f64(),
                total_seconds: (now - r.submitted).as_secs_f64(),
                finish_reason: r.finish.expect("finished rows have a reason"),
                policy_version: r.version,
                final_policy_version: self.version,
                token_ids: r.generated,
                logprobs: r.logprobs,
                token_versions: r.token_versions,
            };
            let _ = r.reply.send(Ok(out));
        }
        metrics::gauge!(crate::metric_names::ENGINE_KV_PARKED_BYTES.name, "engine" => self.config.metrics_label.clone()).set(self.parked.bytes() as f64);
        metrics::gauge!(crate::metric_names::ENGINE_RUNNING_SEQUENCES.name, "engine" => self.config.metrics_label.clone()).set(self.running.len() as f64);
        metrics::gauge!(crate::metric_names::ENGINE_WAITING_REQUESTS.name, "engine" => self.config.metrics_label.clone()).set(self.waiting.len() as f64);
        self.stats.finish_seconds += began.elapsed().as_secs_f64();
    }

    /// Parks row `row` into a new pool range: with spare slots for the episode's next turn
    /// when the pool has that much free, else exactly; evicting the least recently parked
    /// entries until a range fits. `None` when the pool could never hold it.
    fn park_new(&mut self, row: usize) -> Option<ParkedKv> {
        let len = self.slots.len(row);
        if !self.pool.can_ever_hold(len) {
            return None;
        }
        // No more than the row could still grow (its context is capped at capacity).
        let spare = self
            .park_spare
            .slots()
            .min(self.slots.capacity() - len)
            .max(0);
        loop {
            let (free, _) = self.pool.free();
            let leased = (free >= len + spare)
                .then(|| self.pool.lease(len + spare))
                .flatten()
                .or_else(|| self.pool.lease(len));
            if let Some((kv, lease)) = leased {
                let parked = ParkedKv::pooled(kv, lease);
                return self.slots.park_into(row, parked, 0).ok();
            }
            if !self.parked.evict_oldest() {
                return None;
            }
        }
    }
}

/// Whether a stop string appears in the text of the last few generated tokens.
fn hits_stop_string(tokenizer: Option<&HfTokenizer>, r: &Running) -> bool {
    let Some(tok) = tokenizer else { return false };
    let longest = r
        .request
        .stop_strings
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    let window = (longest + 8).min(r.generated.len());
    let tail = &r.generated[r.generated.len() - window..];
    match tok.decode(tail, false) {
        Ok(text) => r
            .request
            .stop_strings
            .iter()
            .any(|s| text.contains(s.as_str())),
        Err(_) => false,
    }
}

/// Each row's sampling settings and its draw: a pure function of (seed, policy version,
/// episode, position), so what a row samples does not depend on the batch.
fn row_sampling(running: &[Running], seed: i64) -> Vec<RowSampling<'_>> {
    running
        .iter()
        .map(|r| {
            let position = (r.request.context.len() + r.generated.len()) as u64;
            // The policy version is part of the stream: callers that number episodes from 0
            // in every rollout still get fresh draws after each update.
            let stream = (seed as u64) ^ r.version.wrapping_mul(0x9e37_79b9);
            RowSampling {
                params: &r.request.params,
                draw: token_draw(stream, r.request.episode, position),
            }
        })
        .collect()
}
