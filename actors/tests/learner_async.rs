//! Async training: the engine keeps sampling while the learner updates and publishes.
//!
//! Two things are checked with the real engine and learner threads and a tiny model:
//! - the engine swaps weights between decode steps, so a turn in flight during an update
//!   samples its first tokens with the old weights and the rest with the new ones (a partial
//!   rollout); it is reported under the version it was admitted with (the oldest that
//!   produced any of its tokens), each token carries the version that sampled it, a learner
//!   with `max_staleness` drops exactly the tokens that are too old, and the turn's
//!   partly-old KV is not reused by the episode's next turn;
//! - with `max_staleness`, tokens sampled more than that many versions before the learner's
//!   current one are dropped from the loss and counted, the rest are trained on, and the
//!   staleness figures match what the trajectories' version tags say.

mod learner_common;

use agent_r1_actors::testing;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_r1_actors::engine::{EngineConfig, EngineHandle, EngineStats, TurnRequest};
use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, LearnerConfig, LearnerRef, UpdateStats,
};
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::trajectory::{Step, Trajectory};
use learner_common::{
    learner, runtime, same_weights, save_policy, start_learner, trajectory, TestStep,
};

fn engine(dir: &std::path::Path, max_context: usize) -> testing::TestEngine {
    let dir = dir.to_path_buf();
    testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        EngineConfig {
            max_batch_rows: 32,
            max_context,
            seed: 3,
            ..testing::engine_config()
        },
    )
    .unwrap()
}

/// Engine stats once `done` holds (polled between decode steps; bounded against a hang).
async fn until(
    engine: &EngineHandle,
    what: &str,
    done: impl Fn(&EngineStats) -> bool,
) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let stats = engine.stats().await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::task::yield_now().await;
    }
}

fn sampling(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        max_new_tokens,
        ..Default::default()
    }
}

#[test]
fn a_turn_in_flight_during_an_update_switches_weights_between_decode_steps() {
    const LONG: usize = 1500;
    let old_dir = tempfile::tempdir().unwrap();
    let new_dir = tempfile::tempdir().unwrap();
    save_policy(old_dir.path(), 1);
    save_policy(new_dir.path(), 2);
    let new_weights: Vec<(String, tch::Tensor)> =
        PolicyModel::load(new_dir.path(), Placement::default(), false)
            .unwrap()
            .var_store()
            .variables()
            .into_iter()
            .collect();
    let engine = engine(old_dir.path(), 2048);
    let request = |episode: u64, context: Vec<u32>, n: usize| TurnRequest {
        episode,
        context,
        params: sampling(n),
        stop_strings: vec![],
    };
    runtime().block_on(async {
        // Reference: the whole turn under the old weights. Draws depend only on (seed,
        // episode, position), so the same turn again repeats it token for token.
        let old = engine
            .generate(request(1, vec![1, 2, 4], LONG))
            .await
            .unwrap();
        engine.release(1);
        let base = engine.stats().await.unwrap().tokens_generated;

        // The engine is paused with the turn queued, let run for a counted number of steps
        // and paused again; the weights arrive while it is paused, so how many tokens the
        // old weights sampled does not depend on the machine's speed.
        engine.pause_after(0).unwrap();
        let in_flight = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(request(1, vec![1, 2, 4], LONG)).await }
        });
        until(&engine, "the turn queued", |s| {
            s.paused && s.queued_turns == 1
        })
        .await;
        engine.pause_after(40).unwrap();
        let paused = until(&engine, "40 steps of the turn", |s| {
            s.paused && s.tokens_generated > base
        })
        .await;
        let seen = (paused.tokens_generated - base) as usize;
        engine.update_weights(1, new_weights).await.unwrap();
        engine.resume().unwrap();
        let mixed = in_flight.await.unwrap().unwrap();

        assert_eq!(mixed.finish_reason, FinishReason::Length);
        assert_eq!(mixed.token_ids.len(), LONG);
        assert_eq!(
            mixed.policy_version, 0,
            "tagged with the version at admission"
        );
        assert_eq!(mixed.final_policy_version, 1);
        // Up to the swap the turn is the old policy's; after it, not. "The old policy's" is
        // the same ids and the same log-probabilities to 1e-4, not bit for bit: two runs of
        // the same forward pass need not agree in the last bits when other work changes how
        // libtorch's CPU kernels split their reductions (seen once on a loaded machine),
        // while other weights move a log-probability by far more than 1e-4.
        let swap = (0..LONG)
            .find(|&i| {
                mixed.token_ids[i] != old.token_ids[i]
                    || (mixed.logprobs[i] - old.logprobs[i]).abs() > 1e-4
            })
            .expect("the new weights never took effect within the turn");
        assert!(
            swap >= seen,
            "tokens sampled before the update ({seen}) differ from the old policy's at {swap}"
        );
        eprintln!("swap after {swap} of {LONG} tokens ({seen} seen before the update)");
        // Each token records the version that sampled it: the old one up to the swap, the
        // new one from there (a token sampled with other weights has another log-prob).
        let switch = mixed
            .token_versions
            .iter()
            .position(|&v| v == 1)
            .expect("tokens after the update carry version 1");
        assert!(mixed.token_versions[..switch].iter().all(|&v| v == 0));
        assert!(mixed.token_versions[switch..].iter().all(|&v| v == 1));
        assert_eq!(
            switch, swap,
            "the version tags put the switch where the tokens change"
        );
        assert_eq!(switch, seen, "the update took effect at the next step");
        // A learner two versions on with max_staleness = 1 drops exactly the version-0
        // tokens of that one step, and trains on the rest of it.
        let mut straddling = trajectory(
            1,
            0,
            &[1, 2, 4],
            vec![TestStep {
                actions: mixed.token_ids.clone(),
                logprobs: mixed.logprobs.clone(),
                observation: vec![],
                version: 0,
            }],
            1.0,
        );
        straddling.steps[0].token_versions =
            Step::compact_versions(0, mixed.token_versions.clone());
        assert_eq!(straddling.steps[0].versions(), vec![0, 1]);
        let late = start_learner(
            old_dir.path(),
            LearnerConfig {
                algorithm: AlgorithmConfig {
                    estimator: Estimator::Grpo,
                    kl: KlConfig::OFF,
                    critic_warmup_updates: 0,
                    ..Default::default()
                },
                max_staleness: Some(1),
                initial_version: 2,
                ..testing::learner_config()
            },
            false,
            false,
        )
        .await;
        let stats = late.update(vec![straddling]).await.unwrap();
        assert_eq!(stats.stale_tokens_dropped, switch as u64, "{stats:?}");
        assert_eq!(stats.action_tokens, (LONG - switch) as u64, "{stats:?}");
        assert_eq!(stats.staleness_max, 2, "{stats:?}");
        late.shutdown();

        let stats = engine.stats().await.unwrap();
        assert_eq!(stats.turns_spanning_updates, 1);
        assert_eq!(stats.policy_version, 1);

        // The mixed turn's KV is not parked: the episode's next turn recomputes its context
        // with the new weights, and is wholly the new version's.
        let mut context = vec![1, 2, 4];
        context.extend(&mixed.token_ids[..40]);
        let next = engine.generate(request(1, context, 8)).await.unwrap();
        assert_eq!(next.reused_tokens, 0);
        assert_eq!((next.policy_version, next.final_policy_version), (1, 1));

        // Decoupled PPO on a learner holding the new weights (version 1): it recomputes the
        // proximal log-probabilities and weighs each token by prox / behavior. A turn the new
        // weights sampled weighs 1 to float noise (the learner's log-probabilities line up
        // with the engine's token for token); the turn the old weights sampled does not.
        // (Deterministic: the draws depend only on (seed, episode, position).)
        let decoupled = |trajectory: Trajectory| {
            let config = LearnerConfig {
                algorithm: AlgorithmConfig {
                    estimator: Estimator::Grpo,
                    actor_lr: 1e-9,
                    kl: KlConfig::OFF,
                    critic_warmup_updates: 0,
                    ..Default::default()
                },
                behavior_weight_cap: Some(5.0),
                initial_version: 1,
                ..testing::learner_config()
            };
            let dir = new_dir.path().to_path_buf();
            async move {
                let l = start_learner(&dir, config, false, false).await;
                let stats = l.update(vec![trajectory]).await.unwrap();
                l.shutdown();
                (
                    stats.behavior_weight_mean.expect("reported with decoupled PPO"),
                    stats.behavior_kl.expect("reported with decoupled PPO"),
                )
            }
        };
        let mut fresh_context = vec![1, 2, 4];
        fresh_context.extend(&mixed.token_ids[..40]);
        let fresh_turn = engine.generate(request(2, fresh_context.clone(), 64)).await.unwrap();
        engine.release(2);
        assert_eq!(fresh_turn.policy_version, 1);
        let fresh = trajectory(
            2,
            0,
            &fresh_context,
            vec![TestStep {
                actions: fresh_turn.token_ids.clone(),
                logprobs: fresh_turn.logprobs.clone(),
                observation: vec![],
                version: 1,
            }],
            1.0,
        );
        let stale = trajectory(
            3,
            0,
            &[1, 2, 4],
            vec![TestStep {
                actions: old.token_ids.clone(),
                logprobs: old.logprobs.clone(),
                observation: vec![],
                version: 0,
            }],
            1.0,
        );
        let (fresh_weight, fresh_kl) = decoupled(fresh).await;
        let (stale_weight, stale_kl) = decoupled(stale).await;
        eprintln!(
            "behavior weight / KL: fresh {fresh_weight} / {fresh_kl}, stale {stale_weight} / {stale_kl}"
        );
        assert!((fresh_weight - 1.0).abs() < 1e-3, "fresh tokens weigh {fresh_weight}");
        assert!(fresh_kl.abs() < 1e-4, "fresh tokens are on-policy: {fresh_kl}");
        assert!(stale_kl > 1e-2, "the old weights' tokens are off-policy: {stale_kl}");
    });
    engine.shutdown();
}

/// Prompts and group size of the rollout batches.
const PROMPTS: u32 = 2;
const GROUP: usize = 4;

/// One two-step episode on the engine; each step carries the version its turn reports.
async fn episode(engine: &EngineHandle, id: u64, group: u64, k: u32) -> Trajectory {
    let prompt = vec![1, 2, 4 + k];
    let mut context = prompt.clone();
    let mut steps = Vec::new();
    for s in 0..2 {
        let turn = engine
            .generate(TurnRequest {
                episode: id,
                context: context.clone(),
                params: sampling(6),
                stop_strings: vec![],
            })
            .await
            .unwrap();
        assert!(turn.policy_version <= turn.final_policy_version);
        let observation = if s == 0 { vec![3] } else { vec![] };
        context.extend(&turn.token_ids);
        context.extend(&observation);
        steps.push(TestStep {
            actions: turn.token_ids,
            logprobs: turn.logprobs,
            observation,
            version: turn.policy_version,
        });
    }
    engine.release(id);
    let first = steps[1].actions[0];
    trajectory(id, group, &prompt, steps, f64::from(first % 2 == 0))
}

async fn rollout(engine: &EngineHandle, ids: &AtomicU64, batch: u64) -> Vec<Trajectory> {
    let futures: Vec<_> = (0..PROMPTS)
        .flat_map(|k| (0..GROUP).map(move |_| k))
        .map(|k| {
            let id = ids.fetch_add(1, Ordering::Relaxed);
            episode(engine, id, batch * PROMPTS as u64 + k as u64, k)
        })
        .collect();
    futures::future::join_all(futures).await
}

fn steps(batch: &[Trajectory]) -> impl Iterator<Item = &Step> {
    batch.iter().flat_map(|t| t.steps.iter())
}

fn action_tokens(batch: &[Trajectory]) -> u64 {
    steps(batch).map(|s| s.action_ids.len() as u64).sum()
}

/// Trains on `batch` and checks the staleness figures against the batch's own version tags,
/// measured against the learner's version before the update.
async fn update(learner: &LearnerRef, batch: Vec<Trajectory>, limit: u64) -> UpdateStats {
    let current = learner.version().await.unwrap();
    let age = |s: &Step| current.saturating_sub(s.policy_version);
    let total = action_tokens(&batch);
    let stale: u64 = steps(&batch)
        .filter(|s| age(s) > limit)
        .map(|s| s.action_ids.len() as u64)
        .sum();
    let age_sum: u64 = steps(&batch)
        .map(|s| age(s) * s.action_ids.len() as u64)
        .sum();
    let max_age = steps(&batch).map(age).max().unwrap_or(0);
    let stats = learner.update(batch).await.unwrap();
    assert_eq!(stats.stale_tokens_dropped, stale, "{stats:?}");
    assert_eq!(stats.action_tokens, total - stale, "{stats:?}");
    assert_eq!(stats.staleness_max, max_age, "{stats:?}");
    assert!(
        (stats.staleness_mean - age_sum as f64 / total as f64).abs() < 1e-9,
        "{stats:?}"
    );
    assert_eq!(stats.skipped_steps, 0, "{stats:?}");
    stats
}

#[test]
fn tokens_older_than_max_staleness_are_dropped_while_rollouts_run_during_updates() {
    const LIMIT: u64 = 1;
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 5);
    let engine = engine(tmp.path(), 64);
    let learner = learner(
        tmp.path(),
        LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator: Estimator::Grpo,
                actor_lr: 1e-3,
                kl: KlConfig::OFF,
                critic_warmup_updates: 0,
                ..Default::default()
            },
            max_staleness: Some(LIMIT),
            ..testing::learner_config()
        },
        false,
        false,
    );
    let ids = AtomicU64::new(0);
    runtime().block_on(async {
        // Sampled by version 0; `held` is kept back until it is two versions old.
        let held = rollout(&engine, &ids, 0).await;
        let first = rollout(&engine, &ids, 1).await;
        assert!(steps(&held)
            .chain(steps(&first))
            .all(|s| s.policy_version == 0));

        // Async: the next batch is sampled while the learner trains on the first and
        // publishes version 1; its turns carry 0 or 1, whichever they were admitted under.
        let (second, published) = tokio::join!(rollout(&engine, &ids, 2), async {
            let stats = update(&learner, first, LIMIT).await;
            assert_eq!(stats.stale_tokens_dropped, 0);
            assert!(stats.policy_updated && stats.version == 1, "{stats:?}");
            learner.publish(&engine).await.unwrap()
        });
        assert_eq!(published, 1);
        assert!(steps(&second).all(|s| s.policy_version <= 1));

        // One version behind at most: nothing is dropped.
        let stats = update(&learner, second, LIMIT).await;
        assert_eq!(stats.stale_tokens_dropped, 0, "{stats:?}");
        assert!(stats.staleness_max <= 1, "{stats:?}");
        assert!(stats.policy_updated && stats.version == 2, "{stats:?}");
        assert_eq!(learner.publish(&engine).await.unwrap(), 2);

        // Fresh tokens (version 2) beside held ones (version 0, two behind): the held ones
        // are dropped and counted, the fresh ones trained on.
        let fresh = rollout(&engine, &ids, 3).await;
        assert!(steps(&fresh).all(|s| s.policy_version == 2));
        let (held_tokens, fresh_tokens) = (action_tokens(&held), action_tokens(&fresh));
        let mut mixed = held.clone();
        mixed.extend(fresh);
        let stats = update(&learner, mixed, LIMIT).await;
        assert_eq!(stats.stale_tokens_dropped, held_tokens, "{stats:?}");
        assert_eq!(stats.action_tokens, fresh_tokens, "{stats:?}");
        assert_eq!(stats.staleness_max, 2);
        assert!(stats.policy_updated && stats.version == 3, "{stats:?}");

        // Nothing but stale tokens: no step is taken and the weights stay as they are.
        let before = learner.weights().await.unwrap();
        let stats = update(&learner, held, LIMIT).await;
        assert_eq!(stats.stale_tokens_dropped, held_tokens);
        assert_eq!(stats.action_tokens, 0);
        assert_eq!(stats.staleness_max, 3);
        assert_eq!(stats.optimizer_steps, 0, "{stats:?}");
        assert!(!stats.policy_updated && stats.version == 3, "{stats:?}");
        let after = learner.weights().await.unwrap();
        assert!(same_weights(&before, &after));
    });
    engine.shutdown();
    learner.shutdown();
}
