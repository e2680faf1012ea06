//! The inference engine: continuous batching over one policy model on a dedicated thread.
//!
//! Episodes send one request per turn (the whole context as token ids). The engine thread
//! owns the model (tensors are not `Sync`, grad mode is thread-local) and, at every decode
//! step, lets waiting requests join the running batch and finished ones leave, within a row
//! limit and a token budget. A finished turn's KV is parked under the episode's id, so the
//! next turn of that episode prefills only its new tokens (the tool observation and template);
//! parked KV has a byte budget with least-recently-parked eviction, and an evicted prefix is
//! recomputed. Weight updates are applied between decode steps, so no forward pass sees
//! half-updated weights and running turns pick the new weights up at their next token; every
//! turn reports the version it was admitted under (the oldest that produced any of its
//! tokens) and the version it finished under.

mod decode_graph;
mod faults;
mod kv_pool;
mod parked;
mod slots;
mod supervisor;
mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tch::Tensor;
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};

pub use faults::EngineFaults;
pub use supervisor::{start_supervised, EngineMsg, EngineRestartPolicy, LoadModel};

use crate::model::generate::FinishReason;
use crate::model::SamplingParams;
use crate::stall::{Heartbeat, Probe, Stuck};
use crate::weight_digest::WeightDigest;
use crate::{Error, Result};

/// How often a caller whose weight update was dropped looks whether the engine stopped for
/// good (a restart is announced; a stop is only recorded).
const FAILURE_POLL: Duration = Duration::from_millis(20);

/// Limits and budgets of the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Most sequences decoded together.
    pub max_batch_rows: usize,
    /// Token budget of the running batch: the sum over rows of context + max_new_tokens.
    pub max_batch_tokens: usize,
    /// Longest sequence (context + generation) a row can hold.
    pub max_context: usize,
    /// Bytes of the pool that KV is parked in for episodes waiting on tools. Allocated on
    /// the model's device when the engine starts: on a GPU it is reserved in full, beside the
    /// slots of the running batch (and, in `train`, the learner).
    pub parked_kv_bytes: usize,
    /// Requests accepted (queued or running) before callers wait for admission.
    pub max_pending: usize,
    /// The deadline of a turn from [`EngineHandle::generate`] (admission, queueing and
    /// decoding together); [`EngineHandle::generate_within`] takes its own.
    pub request_timeout: Duration,
    /// Seed of sampling: each token is drawn from (seed, episode, position), so results do
    /// not depend on batch composition.
    pub seed: i64,
    /// Whether a turn reuses KV (its episode's parked KV, or the shared prompt prefix).
    /// Off, every turn prefills its whole context: the baseline reuse is measured against.
    pub kv_reuse: bool,
    /// Whether the parked-KV pool (`parked_kv_bytes`) is zero-filled when the engine starts.
    /// On a CPU the process then holds the whole pool from the start, and parking never
    /// waits on the OS faulting fresh memory in; off, the pool's memory is faulted in as it
    /// is first used (resident memory grows with what is parked), on the engine's critical
    /// path. On a GPU the pool is reserved either way; this only adds the fill.
    pub prefault_parked_kv: bool,
    /// The value of the `engine` label on this engine's `agent_r1_engine_*` series (its
    /// index in a set), so several engines' gauges stay apart.
    pub metrics_label: String,
    /// The share of its device's total memory the engine may use, weights included. Set,
    /// it decides the rows of the running batch (at most `max_batch_rows`) and the
    /// parked-KV pool (instead of `parked_kv_bytes`) from the device's memory once the
    /// weights are loaded ([`crate::memory_plan::engine_share`]); too little for one row fails the start.
    pub memory_fraction: Option<f64>,
    /// Most tokens (rows x their longest prompt, padding included) one prefill pass runs:
    /// admitted turns are prefilled in passes up to this size, so the activations of a pass
    /// are bounded whatever the batch (a turn longer than this gets a pass of its own).
    /// `memory_fraction` reserves the activations of one such pass.
    pub max_prefill_tokens: usize,
    /// Whether decode steps on a GPU replay CUDA graphs (bf16 or f16 weights, a build with
    /// the CUDA shim). Where a graph cannot be captured the engine says why once and decodes
    /// without them.
    pub cuda_graphs: bool,
}

/// One turn to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRequest {
    /// The episode (KV of its earlier turns is reused when the context extends them).
    pub episode: u64,
    /// The whole context as token ids: never re-tokenised, so what was sampled stays.
    pub context: Vec<u32>,
    /// How to sample.
    pub params: SamplingParams,
    /// Strings that end the turn when they appear in the generated text (for stops that are
    /// not single tokens; single-token stops belong in `params.stop_token_ids`).
    pub stop_strings: Vec<String>,
}

/// A generated turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnOutput {
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// Their sampling log-probabilities.
    pub logprobs: Vec<f32>,
    /// The weights version that sampled each token (a turn decoding while the weights are
    /// swapped has two).
    pub token_versions: Vec<u64>,
    /// Why the turn ended.
    pub finish_reason: FinishReason,
    /// The weights version when the turn was admitted. Weights are swapped between decode
    /// steps, not between turns, so a turn in flight during an update samples its first
    /// tokens with this version and the rest with later ones (on KV computed by the earlier
    /// weights). Reporting the oldest version keeps staleness an upper bound: a learner that
    /// drops tokens older than `max_staleness` versions never keeps one that is older.
    pub policy_version: u64,
    /// The weights version when the turn finished; equal to `policy_version` unless the
    /// weights were swapped while the turn was decoding.
    pub final_policy_version: u64,
    /// Context tokens.
    pub prompt_tokens: usize,
    /// Context tokens run through the model for this turn.
    pub prefill_tokens: usize,
    /// Context tokens whose KV was reused from the episode's previous turn.
    pub reused_tokens: usize,
    /// Seconds from submission to joining the batch.
    pub queue_seconds: f64,
    /// Seconds from submission to the last token.
    pub total_seconds: f64,
}

/// Counters since the engine started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Decode steps taken.
    pub decode_steps: u64,
    /// Sum over decode steps of the rows decoded (mean batch = this / decode_steps).
    pub decode_rows: u64,
    /// Tokens sampled.
    pub tokens_generated: u64,
    /// Context tokens run through the model (prefill).
    pub prefill_tokens: u64,
    /// Context tokens reused from parked KV instead (the episode's own or the shared prefix).
    pub reused_tokens: u64,
    /// Of those, tokens reused from the shared prompt prefix by episodes with nothing parked.
    pub shared_prefix_tokens: u64,
    /// Turns parked into the spare slots of the KV they were restored from (copying only
    /// the tokens the turn added); the rest are parked into a new pool range.
    #[serde(default)]
    pub parked_in_place: u64,
    /// Parked entries evicted to make room in the pool, and finished turns that found no
    /// room to park at all.
    pub evictions: u64,
    /// Tokens in evicted entries (recomputed if their episode returns).
    pub evicted_tokens: u64,
    /// Parked KV bytes now.
    pub parked_bytes: u64,
    /// Parked episodes now.
    pub parked_episodes: u64,
    /// Bytes of the slot storage of the running batch.
    pub slot_bytes: u64,
    /// What the engine took of its device, when `memory_fraction` decided it.
    #[serde(default)]
    pub memory_plan: Option<crate::memory_plan::EngineShare>,
    /// Seconds inside model forward passes and sampling.
    pub forward_seconds: f64,
    /// Of those, seconds in decode steps (the rest is prefill).
    #[serde(default)]
    pub decode_seconds: f64,
    /// Seconds the engine thread waited with nothing to run (no request queued or running).
    #[serde(default)]
    pub idle_seconds: f64,
    /// Seconds spent admitting requests outside the prefill forward: validation, restoring
    /// parked KV into rows, ordering rows by prefill length, building the input ids.
    #[serde(default)]
    pub admit_seconds: f64,
    /// Seconds spent on finished turns: parking their KV, packing rows, replying.
    #[serde(default)]
    pub finish_seconds: f64,
    /// Seconds spent checking generated text for stop strings (detokenising each row's tail).
    #[serde(default)]
    pub stop_check_seconds: f64,
    /// Turns completed.
    pub turns: u64,
    /// Times the engine thread was restarted after a crash (the counters here continue
    /// across restarts).
    #[serde(default)]
    pub restarts: u64,
    /// Turns that were decoding when the engine thread crashed (run again from their context
    /// by its replacement, or failed if it was their second crash).
    #[serde(default)]
    pub turns_rerun: u64,
    /// Set while a restarted engine admits no turn until it is sent weights of at least this
    /// version (the one it served before the crash).
    #[serde(default)]
    pub awaiting_version: Option<u64>,
    /// Completed turns during which the weights were swapped (their KV is not parked).
    #[serde(default)]
    pub turns_spanning_updates: u64,
    /// Turns whose caller stopped waiting (deadline passed, task dropped): dropped from the
    /// queue before admission or from the batch mid-decode, never answered.
    #[serde(default)]
    pub abandoned_turns: u64,
    /// Turns waiting for a row when the snapshot was taken.
    #[serde(default)]
    pub queued_turns: u64,
    /// Whether the engine thread is paused by [`EngineHandle::pause_after`] (a test control).
    #[serde(default)]
    pub paused: bool,
    /// Current policy version.
    pub policy_version: u64,
    /// Prefill forward passes (one per bucket of admitted turns of similar length).
    #[serde(default)]
    pub prefill_passes: u64,
    /// Padding tokens run through prefill passes (a bucket's rows are padded to its
    /// longest): work done for no token.
    #[serde(default)]
    pub prefill_padding_tokens: u64,
    /// Copies from the model's device to the host made by forward passes: one per pass
    /// (its sampled tokens and their log-probabilities together).
    #[serde(default)]
    pub device_to_host_copies: u64,
    /// Decode steps run by replaying a CUDA graph.
    #[serde(default)]
    pub graph_decode_steps: u64,
    /// CUDA graphs captured (one per bucket of rows and sampling mode met).
    #[serde(default)]
    pub graphs_captured: u64,
    /// Why decode steps run without CUDA graphs on this engine's GPU, if they do.
    #[serde(default)]
    pub cuda_graphs_off: Option<String>,
}

impl EngineStats {
    /// Mean rows per decode step.
    pub fn mean_batch_size(&self) -> f64 {
        self.decode_rows as f64 / self.decode_steps.max(1) as f64
    }
}

pub(crate) enum Command {
    Generate {
        request: TurnRequest,
        reply: oneshot::Sender<Result<TurnOutput>>,
        _permit: OwnedSemaphorePermit,
        submitted: Instant,
    },
    Release(u64),
    UpdateWeights {
        version: u64,
        tensors: Vec<(String, Tensor)>,
        /// The sender's checksums, verified against what arrives and what is served.
        digest: Option<WeightDigest>,
        reply: oneshot::Sender<Result<()>>,
    },
    Stats(oneshot::Sender<EngineStats>),
    /// Test control: the thread stops stepping after this many more steps (0: before the
    /// next one) and only handles commands until [`Command::Resume`].
    PauseAfterSteps(u64),
    /// Test control: ends a pause.
    Resume,
    Shutdown,
}

/// A cheap, cloneable way to talk to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: crossbeam::channel::Sender<Command>,
    permits: Arc<Semaphore>,
    config: Arc<EngineConfig>,
    /// Beaten by the engine thread every time round its loop (every step, and every 100 ms
    /// when idle or holding turns for weights after a restart).
    heartbeat: Arc<Heartbeat>,
    /// Restarts of the engine thread so far (only a supervised engine restarts).
    restarts: Arc<watch::Sender<u64>>,
    /// Why the engine stopped for good, once it has.
    failure: Arc<std::sync::OnceLock<String>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("available_permits", &self.permits.available_permits())
            .finish()
    }
}

/// Checks the limits every engine needs before anything starts.
fn check_config(config: &EngineConfig) -> Result<()> {
    if config.max_batch_rows == 0 || config.max_context < 2 || config.max_pending == 0 {
        return Err(Error::invalid(
            "engine",
            "max_batch_rows and max_pending must be >= 1 and max_context >= 2",
        ));
    }
    Ok(())
}

impl EngineHandle {
    fn new(tx: crossbeam::channel::Sender<Command>, config: &EngineConfig) -> Self {
        Self {
            tx,
            permits: Arc::new(Semaphore::new(config.max_pending)),
            config: Arc::new(config.clone()),
            heartbeat: Arc::new(Heartbeat::default()),
            restarts: Arc::new(watch::channel(0).0),
            failure: Arc::default(),
        }
    }

    /// Why the engine thread is gone, for a caller that found its channel closed.
    fn stopped(&self) -> Error {
        Error::EngineStopped(
            self.failure
                .get()
                .cloned()
                .unwrap_or_else(|| "engine thread has exited".into()),
        )
    }

    /// Fails once the engine has stopped for good. Called after a send: the engine records
    /// its end before answering what is queued, so a request sent before that record was
    /// made is answered, and one sent after is not waited for (it would wait in the channel
    /// until its timeout).
    fn check_not_stopped(&self) -> Result<()> {
        match self.failure.get() {
            Some(_) => Err(self.stopped()),
            None => Ok(()),
        }
    }

    /// Restarts of the engine thread so far; changes with each one. A restarted engine
    /// admits no turn until it is sent weights of at least the version it served before
    /// (see [`start_supervised`]); whoever updates its weights watches this to send them.
    pub fn restarts(&self) -> watch::Receiver<u64> {
        self.restarts.subscribe()
    }

    /// Generates one turn within the configured `request_timeout`
    /// ([`Self::generate_within`]).
    pub async fn generate(&self, request: TurnRequest) -> Result<TurnOutput> {
        self.generate_within(request, self.config.request_timeout)
            .await
    }

    /// Generates one turn under one deadline, `limit` from now, covering admission into the
    /// queue, waiting for a row and decoding. A caller that stops waiting (the deadline
    /// passed, or its task was dropped) is noticed by the engine: a queued turn is never
    /// admitted and a running one leaves the batch at the next step, so no row decodes for
    /// nobody.
    pub async fn generate_within(
        &self,
        request: TurnRequest,
        limit: Duration,
    ) -> Result<TurnOutput> {
        request.params.validate()?;
        let deadline = tokio::time::Instant::now() + limit;
        let timed_out = || Error::Timeout {
            what: "a generated turn (admission, queueing and decoding)".into(),
            after: limit,
        };
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| Error::EngineStopped("engine closed".into()))?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Command::Generate {
                request,
                reply,
                _permit: permit,
                submitted: Instant::now(),
            })
            .map_err(|e| match e {
                crossbeam::channel::TrySendError::Full(_) => {
                    Error::Overloaded("the engine queue".into())
                }
                crossbeam::channel::TrySendError::Disconnected(_) => self.stopped(),
            })?;
        self.check_not_stopped()?;
        match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => Err(timed_out()),
            // Dropped by an engine that stopped for good (it records why first), or by a
            // thread that failed and was restarted: then only this turn is lost.
            Ok(Err(_)) => match self.failure.get() {
                Some(_) => Err(self.stopped()),
                None => Err(Error::TurnFailed(
                    "the engine dropped the request (its thread failed)".into(),
                )),
            },
            Ok(Ok(result)) => result,
        }
    }

    /// Turns accepted and not yet answered (queued or running).
    pub fn pending(&self) -> usize {
        self.config.max_pending - self.permits.available_permits()
    }

    /// The engine as a stall detector's stage: stuck while turns are waiting (queued or
    /// running) and the engine thread has not gone round its loop since.
    pub fn stall_probe(&self) -> Arc<dyn Probe> {
        Arc::new(EngineProbe(self.clone()))
    }

    /// Test control: the engine thread stops stepping after `steps` more steps (0: before
    /// the next one) and until [`Self::resume`], while it still queues turns and answers
    /// [`Self::stats`] ([`EngineStats::paused`] says when it has stopped). Lets a test put
    /// the engine in a given state (turns queued together, a turn part-decoded) whatever the
    /// machine's speed.
    #[doc(hidden)]
    pub fn pause_after(&self, steps: u64) -> Result<()> {
        self.send_control(Command::PauseAfterSteps(steps))
    }

    /// Test control: ends a pause ([`Self::pause_after`]).
    #[doc(hidden)]
    pub fn resume(&self) -> Result<()> {
        self.send_control(Command::Resume)
    }

    /// Drops an episode's parked KV (call when the episode ends).
    pub fn release(&self, episode: u64) {
        let _ = self.tx.try_send(Command::Release(episode));
    }

    /// Swaps the engine's weights between decode steps and sets the policy version.
    /// Parked KV computed with the old weights is dropped; turns already decoding continue
    /// with the new weights and keep the version they were admitted under
    /// ([`TurnOutput::policy_version`]). Waits up to `request_timeout`.
    pub async fn update_weights(&self, version: u64, tensors: Vec<(String, Tensor)>) -> Result<()> {
        self.swap_weights(version, tensors, None).await
    }

    /// [`Self::update_weights`], verified: the engine checks the tensors it received against
    /// `digest` (the sender's checksums) before applying any, and what it then serves against
    /// what it received. A mismatch is [`Error::WeightSyncMismatch`] naming the tensor; when
    /// it is caught on arrival the engine keeps serving the weights it had.
    pub async fn update_weights_verified(
        &self,
        version: u64,
        tensors: Vec<(String, Tensor)>,
        digest: WeightDigest,
    ) -> Result<()> {
        self.swap_weights(version, tensors, Some(digest)).await
    }

    pub(crate) async fn swap_weights(
        &self,
        version: u64,
        tensors: Vec<(String, Tensor)>,
        digest: Option<WeightDigest>,
    ) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        // Seen before the update is sent, so a restart caused by it counts as a change.
        let mut restarts = self.restarts.subscribe();
        self.send_control(Command::UpdateWeights {
            version,
            tensors,
            digest,
            reply,
        })?;
        self.check_not_stopped()?;
        let limit = self.config.request_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let timed_out = || Error::Timeout {
            what: "the engine to apply a weight update".into(),
            after: limit,
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => Err(timed_out()),
            // The thread failed while it had the update, which was not applied. Whether it
            // is restarted or the engine stops for good is decided after the reply is
            // dropped: wait for that decision.
            Ok(Err(_)) => loop {
                if self.failure.get().is_some() {
                    return Err(self.stopped());
                }
                let slice = deadline.min(tokio::time::Instant::now() + FAILURE_POLL);
                match tokio::time::timeout_at(slice, restarts.changed()).await {
                    Ok(_) => {
                        return Err(Error::EngineRestarted(format!(
                            "its thread failed during the update to weights version {version}"
                        )))
                    }
                    Err(_) if tokio::time::Instant::now() >= deadline => return Err(timed_out()),
                    // `failure` has no notification of its own: looked at again.
                    Err(_) => {}
                }
            },
            Ok(Ok(result)) => result,
        }
    }

    /// Counters since start.
    pub async fn stats(&self) -> Result<EngineStats> {
        let (reply, rx) = oneshot::channel();
        self.send_control(Command::Stats(reply))?;
        self.check_not_stopped()?;
        tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .map_err(|_| Error::Timeout {
                what: "engine stats".into(),
                after: Duration::from_secs(60),
            })?
            .map_err(|_| Error::EngineStopped("engine exited".into()))
    }

    /// Asks the engine to finish: queued and running requests get an error reply.
    pub fn shutdown(&self) {
        let _ = self
            .tx
            .send_timeout(Command::Shutdown, Duration::from_secs(5));
    }

    fn send_control(&self, command: Command) -> Result<()> {
        self.tx
            .send_timeout(command, Duration::from_secs(60))
            .map_err(|e| match e {
                crossbeam::channel::SendTimeoutError::Disconnected(_) => self.stopped(),
                crossbeam::channel::SendTimeoutError::Timeout(_) => {
                    Error::EngineStopped("engine thread is not accepting commands".into())
                }
            })
    }
}

struct EngineProbe(EngineHandle);

impl Probe for EngineProbe {
    fn stuck(&self, _now: Instant) -> Option<Stuck> {
        let waiting = self.0.pending();
        (waiting > 0).then(|| Stuck {
            item: format!("the decode loop ({waiting} turns waiting)"),
            since: self.0.heartbeat.last(),
        })
    }
}
