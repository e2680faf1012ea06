//! Several engines behind one handle: one per device, episodes routed to them and kept
//! there.
//!
//! An episode's first turn goes where the [`RoutingPolicy`] says (by default the engine
//! holding the fewest episodes); every later turn of that episode goes to the same engine,
//! where its KV is parked, until the episode is released. Weight updates go to every engine
//! and must all succeed. A set of one engine routes nothing and costs nothing over the
//! engine's own handle.

mod routing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tch::Tensor;

pub use routing::{EngineLoad, LeastLoaded, RoutingPolicy};

use crate::engine::{EngineHandle, EngineStats, TurnOutput, TurnRequest};
use crate::stall::{Probe, Stuck};
use crate::weight_digest::WeightDigest;
use crate::{Error, Result};

/// One or more engines with sticky per-episode routing; cheap to clone.
#[derive(Clone)]
pub struct EngineSet {
    inner: Arc<Inner>,
}

struct Inner {
    engines: Vec<Member>,
    routes: Mutex<Routes>,
    policy: Box<dyn RoutingPolicy>,
}

struct Member {
    /// What the engine runs on, for logs and errors ("cuda:1", "cpu").
    label: String,
    handle: EngineHandle,
}

#[derive(Default)]
struct Routes {
    engine_of: HashMap<u64, usize>,
    /// Episodes routed to each engine and not yet released.
    episodes: Vec<usize>,
    /// Episodes ever routed to each engine.
    routed: Vec<u64>,
}

impl std::fmt::Debug for EngineSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self
            .inner
            .engines
            .iter()
            .map(|m| m.label.as_str())
            .collect();
        f.debug_struct("EngineSet")
            .field("engines", &labels)
            .finish()
    }
}

impl From<EngineHandle> for EngineSet {
    fn from(engine: EngineHandle) -> Self {
        Self::single(engine)
    }
}

impl From<&EngineHandle> for EngineSet {
    fn from(engine: &EngineHandle) -> Self {
        Self::single(engine.clone())
    }
}

impl From<&EngineSet> for EngineSet {
    fn from(set: &EngineSet) -> Self {
        set.clone()
    }
}

impl EngineSet {
    /// A set of one engine.
    pub fn single(engine: EngineHandle) -> Self {
        Self::build(vec![("engine".to_string(), engine)], Box::new(LeastLoaded))
    }

    /// Engines labelled by what they run on, routed least-loaded. Errors when `engines` is
    /// empty.
    pub fn new(engines: Vec<(String, EngineHandle)>) -> Result<Self> {
        Self::with_policy(engines, LeastLoaded)
    }

    /// [`Self::new`] with another routing policy.
    pub fn with_policy(
        engines: Vec<(String, EngineHandle)>,
        policy: impl RoutingPolicy,
    ) -> Result<Self> {
        if engines.is_empty() {
            return Err(Error::Other(
                "an engine set needs at least one engine".into(),
            ));
        }
        Ok(Self::build(engines, Box::new(policy)))
    }

    fn build(engines: Vec<(String, EngineHandle)>, policy: Box<dyn RoutingPolicy>) -> Self {
        let n = engines.len();
        Self {
            inner: Arc::new(Inner {
                engines: engines
                    .into_iter()
                    .map(|(label, handle)| Member { label, handle })
                    .collect(),
                routes: Mutex::new(Routes {
                    episodes: vec![0; n],
                    routed: vec![0; n],
                    ..Default::default()
                }),
                policy,
            }),
        }
    }

    /// How many engines.
    pub fn len(&self) -> usize {
        self.inner.engines.len()
    }

    /// Never true: a set has at least one engine.
    pub fn is_empty(&self) -> bool {
        self.inner.engines.is_empty()
    }

    /// The engines' labels, in order.
    pub fn labels(&self) -> Vec<String> {
        self.inner.engines.iter().map(|m| m.label.clone()).collect()
    }

    /// Episodes routed to each engine and not yet released, in order.
    pub fn episodes_held(&self) -> Vec<usize> {
        self.lock_routes().episodes.clone()
    }

    /// Episodes ever routed to each engine, in order; `None` for a set of one engine, which
    /// routes none (every episode goes to it).
    pub fn episodes_routed(&self) -> Option<Vec<u64>> {
        (self.len() > 1).then(|| self.lock_routes().routed.clone())
    }

    /// The engine `episode` is routed to, routing it now if it has none.
    fn route(&self, episode: u64) -> usize {
        if self.inner.engines.len() == 1 {
            return 0;
        }
        let mut routes = self.lock_routes();
        if let Some(&i) = routes.engine_of.get(&episode) {
            return i;
        }
        let load: Vec<EngineLoad> = self
            .inner
            .engines
            .iter()
            .zip(&routes.episodes)
            .map(|(m, &episodes)| EngineLoad {
                episodes,
                pending_turns: m.handle.pending(),
            })
            .collect();
        let i = self.inner.policy.pick(&load).min(load.len() - 1);
        routes.engine_of.insert(episode, i);
        routes.episodes[i] += 1;
        routes.routed[i] += 1;
        i
    }

    fn lock_routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        // The lock guards plain counters that every update leaves consistent, so a panic
        // elsewhere while it was held poisons nothing real.
        self.inner
            .routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Generates one turn on the episode's engine within that engine's `request_timeout`.
    pub async fn generate(&self, request: TurnRequest) -> Result<TurnOutput> {
        let i = self.route(request.episode);
        self.inner.engines[i].handle.generate(request).await
    }

    /// Generates one turn on the episode's engine under one deadline
    /// ([`EngineHandle::generate_within`]).
    pub async fn generate_within(
        &self,
        request: TurnRequest,
        limit: Duration,
    ) -> Result<TurnOutput> {
        let i = self.route(request.episode);
        self.inner.engines[i]
            .handle
            .generate_within(request, limit)
            .await
    }

    /// Drops an episode's parked KV and its route (call when the episode ends).
    pub fn release(&self, episode: u64) {
        if self.inner.engines.len() == 1 {
            self.inner.engines[0].handle.release(episode);
            return;
        }
        let mut routes = self.lock_routes();
        if let Some(i) = routes.engine_of.remove(&episode) {
            routes.episodes[i] -= 1;
            drop(routes);
            self.inner.engines[i].handle.release(episode);
        }
    }

    /// Swaps every engine's weights ([`EngineHandle::update_weights_verified`]), all at
    /// once; the first engine that fails is named in the error. An engine whose thread failed
    /// during the update and was restarted is not a failure of the update: it is logged, and
    /// the replacement holds its turns until it is sent weights again by whoever watches
    /// [`Self::restarted`].
    pub async fn update_weights_verified(
        &self,
        version: u64,
        tensors: Vec<(String, Tensor)>,
        digest: WeightDigest,
    ) -> Result<()> {
        self.swap_all(version, tensors, Some(digest)).await
    }

    /// Swaps every engine's weights, unverified ([`EngineHandle::update_weights`]).
    pub async fn update_weights(&self, version: u64, tensors: Vec<(String, Tensor)>) -> Result<()> {
        self.swap_all(version, tensors, None).await
    }

    async fn swap_all(
        &self,
        version: u64,
        tensors: Vec<(String, Tensor)>,
        digest: Option<WeightDigest>,
    ) -> Result<()> {
        let updates = self.inner.engines.iter().map(|m| {
            // Each engine copies the tensors onto its own device; they share the sender's
            // storage until then.
            let copy = tensors
                .iter()
                .map(|(name, t)| (name.clone(), t.shallow_clone()))
                .collect();
            let digest = digest.clone();
            async move {
                match m.handle.swap_weights(version, copy, digest).await {
                    Err(Error::EngineRestarted(why)) => {
                        tracing::warn!(
                            "engine on {}: {why}; it restarted and is sent the weights again",
                            m.label
                        );
                        Ok(())
                    }
                    other => other.map_err(|e| self.on_engine(&m.label, e)),
                }
            }
        });
        futures::future::try_join_all(updates).await?;
        Ok(())
    }

    fn on_engine(&self, label: &str, e: Error) -> Error {
        match self.inner.engines.len() {
            1 => e,
            _ => Error::Other(format!("engine on {label}: {e}")),
        }
    }

    /// Each engine's counters, in order.
    pub async fn stats_each(&self) -> Result<Vec<EngineStats>> {
        let all = self.inner.engines.iter().map(|m| async move {
            m.handle
                .stats()
                .await
                .map_err(|e| self.on_engine(&m.label, e))
        });
        futures::future::try_join_all(all).await
    }

    /// The engines' counters added up (the policy version is the oldest any engine serves).
    pub async fn stats(&self) -> Result<EngineStats> {
        Ok(total(&self.stats_each().await?))
    }

    /// The engines as one stall detector stage: stuck when any engine is, named.
    pub fn stall_probe(&self) -> Arc<dyn Probe> {
        let probes = self
            .inner
            .engines
            .iter()
            .map(|m| (m.label.clone(), m.handle.stall_probe()))
            .collect();
        Arc::new(SetProbe { probes })
    }

    /// The engines whose thread was restarted, as they restart (each one again after each
    /// restart). A restarted engine admits no turn until it is sent the weights it served
    /// before, so whoever owns the weights reads this and sends them. Forwarding stops when
    /// the returned value is dropped. Needs a tokio runtime.
    pub fn restarted(&self) -> RestartedEngines {
        let (tx, rx) = tokio::sync::mpsc::channel(self.len().max(1) * 4);
        let forwarders = self
            .inner
            .engines
            .iter()
            .map(|m| {
                let handle = m.handle.clone();
                let label = m.label.clone();
                let tx = tx.clone();
                let mut restarts = handle.restarts();
                tokio::spawn(async move {
                    while restarts.changed().await.is_ok() {
                        if tx.send((label.clone(), handle.clone())).await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        RestartedEngines { rx, forwarders }
    }

    /// Asks every engine to finish.
    pub fn shutdown(&self) {
        for m in &self.inner.engines {
            m.handle.shutdown();
        }
    }
}

/// Engines of a set as their threads restart ([`EngineSet::restarted`]).
pub struct RestartedEngines {
    rx: tokio::sync::mpsc::Receiver<(String, EngineHandle)>,
    forwarders: Vec<tokio::task::JoinHandle<()>>,
}

impl RestartedEngines {
    /// The next engine restarted: its label and handle.
    pub async fn next(&mut self) -> Option<(String, EngineHandle)> {
        self.rx.recv().await
    }
}

impl Drop for RestartedEngines {
    fn drop(&mut self) {
        for f in &self.forwarders {
            f.abort();
        }
    }
}

struct SetProbe {
    probes: Vec<(String, Arc<dyn Probe>)>,
}

impl Probe for SetProbe {
    fn stuck(&self, now: Instant) -> Option<Stuck> {
        let many = self.probes.len() > 1;
        self.probes
            .iter()
            .filter_map(|(label, p)| p.stuck(now).map(|s| (label, s)))
            .min_by_key(|(_, s)| s.since)
            .map(|(label, s)| match many {
                true => Stuck {
                    item: format!("{} on {label}", s.item),
                    since: s.since,
                },
                false => s,
            })
    }
}

/// Counters of several engines added up; gauges (parked bytes, slot bytes) too, and the
/// policy version is the oldest.
pub fn total(each: &[EngineStats]) -> EngineStats {
    let mut sum = EngineStats {
        policy_version: each.iter().map(|s| s.policy_version).min().unwrap_or(0),
        ..Default::default()
    };
    for s in each {
        // Destructured in full, so a new field cannot be left out of the sum unnoticed.
        let EngineStats {
            decode_steps,
            decode_rows,
            tokens_generated,
            prefill_tokens,
            reused_tokens,
            shared_prefix_tokens,
            parked_in_place,
            evictions,
            evicted_tokens,
            parked_bytes,
            parked_episodes,
            slot_bytes,
            forward_seconds,
            decode_seconds,
            idle_seconds,
            admit_seconds,
            finish_seconds,
            stop_check_seconds,
            turns,
            restarts,
            turns_rerun,
            awaiting_version,
            turns_spanning_updates,
            abandoned_turns,
            queued_turns,
            paused,
            policy_version: _,
            prefill_passes,
            prefill_padding_tokens,
            device_to_host_copies,
            graph_decode_steps,
            graphs_captured,
            cuda_graphs_off,
            // Per engine (each has its own device share); see `stats_each`.
            memory_plan: _,
        } = s;
        sum.decode_steps += decode_steps;
        sum.decode_rows += decode_rows;
        sum.tokens_generated += tokens_generated;
        sum.prefill_tokens += prefill_tokens;
        sum.reused_tokens += reused_tokens;
        sum.shared_prefix_tokens += shared_prefix_tokens;
        sum.parked_in_place += parked_in_place;
        sum.evictions += evictions;
        sum.evicted_tokens += evicted_tokens;
        sum.parked_bytes += parked_bytes;
        sum.parked_episodes += parked_episodes;
        sum.slot_bytes += slot_bytes;
        sum.forward_seconds += forward_seconds;
        sum.decode_seconds += decode_seconds;
        sum.idle_seconds += idle_seconds;
        sum.admit_seconds += admit_seconds;
        sum.finish_seconds += finish_seconds;
        sum.stop_check_seconds += stop_check_seconds;
        sum.turns += turns;
        sum.restarts += restarts;
        sum.turns_rerun += turns_rerun;
        sum.awaiting_version = sum.awaiting_version.max(*awaiting_version);
        sum.turns_spanning_updates += turns_spanning_updates;
        sum.abandoned_turns += abandoned_turns;
        sum.queued_turns += queued_turns;
        sum.paused |= paused;
        sum.prefill_passes += prefill_passes;
        sum.prefill_padding_tokens += prefill_padding_tokens;
        sum.device_to_host_copies += device_to_host_copies;
        sum.graph_decode_steps += graph_decode_steps;
        sum.graphs_captured += graphs_captured;
        if sum.cuda_graphs_off.is_none() {
            sum.cuda_graphs_off.clone_from(cuda_graphs_off);
        }
    }
    sum
}
