//! The engine actor restarts a crashed engine thread. A panic is injected into the engine
//! thread mid-decode (a test double for a libtorch error raised through tch). Every crash is
//! placed by construction, never by timing: the panic fires after a counted number of decode
//! steps, and a restarted engine admits nothing until it is sent its weights, so the test
//! decides what the new thread sees first.

use agent_r1_actors::testing;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::engine::{
    start_supervised, EngineConfig, EngineFaults, EngineHandle, EngineRestartPolicy, LoadModel,
    TurnOutput, TurnRequest,
};
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::Error;
use tch::Tensor;

#[path = "support/tiny_engine.rs"]
mod tiny_engine;

use tiny_engine::{make_model, runtime};

/// The weights of a later policy version: the saved ones moved by a fixed function of
/// themselves (no random generator: libtorch's is process-wide, and the engines in other tests
/// reseed it).
fn later_weights(dir: &Path) -> Vec<(String, Tensor)> {
    let model = PolicyModel::load(dir, Placement::default(), false).unwrap();
    model
        .var_store()
        .variables()
        .into_iter()
        .map(|(name, t)| {
            let moved = tch::no_grad(|| &t + (&t * 12.9898).sin() * 0.3);
            (name, moved)
        })
        .collect()
}

fn loader(dir: &Path) -> LoadModel {
    let dir = dir.to_path_buf();
    Arc::new(move || PolicyModel::load(&dir, Placement::default(), false))
}

fn config() -> EngineConfig {
    EngineConfig {
        max_batch_rows: 8,
        max_context: 256,
        ..testing::engine_config()
    }
}

fn turn(episode: u64, new_tokens: usize) -> TurnRequest {
    TurnRequest {
        episode,
        context: (0..5 + episode as u32 % 7)
            .map(|i| (episode as u32 * 31 + i * 17) % 96)
            .collect(),
        params: SamplingParams {
            temperature: 0.0,
            max_new_tokens: new_tokens,
            ..Default::default()
        },
        stop_strings: Vec::new(),
    }
}

fn policy(max_restarts: u32) -> EngineRestartPolicy {
    EngineRestartPolicy {
        max_restarts,
        window: Duration::from_secs(3600),
        backoff: Duration::from_millis(10),
    }
}

/// A supervised engine that restarts its thread at most `max_restarts` times, serving
/// [`later_weights`] as version 1, with the fault plan it reads.
async fn supervised_at_version_1(
    dir: &Path,
    max_restarts: u32,
) -> (EngineHandle, EngineFaults, impl Sized) {
    let faults = EngineFaults::new();
    let (engine, actor) = start_supervised(
        loader(dir),
        None,
        config(),
        policy(max_restarts),
        Some(faults.clone()),
    )
    .await
    .unwrap();
    engine.update_weights(1, later_weights(dir)).await.unwrap();
    (engine, faults, actor)
}

async fn wait_for_restarts(engine: &EngineHandle, n: u64) {
    let mut restarts = engine.restarts();
    tokio::time::timeout(
        Duration::from_secs(120),
        restarts.wait_for(|&seen| seen >= n),
    )
    .await
    .expect("the engine restarts within 120 s")
    .expect("the engine is alive");
}

#[test]
fn a_crashed_engine_thread_is_replaced_and_its_turns_finish_under_the_weights_it_served() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    let requests: Vec<TurnRequest> = (0..6).map(|e| turn(e, 24)).collect();

    // What an engine that never crashed answers, under version 3.
    let reference = testing::start_engine(
        {
            let load = loader(tmp.path());
            move || load()
        },
        None,
        config(),
    )
    .unwrap();
    let expected: Vec<TurnOutput> = rt.block_on(async {
        reference
            .update_weights(3, later_weights(tmp.path()))
            .await
            .unwrap();
        let turns = requests.iter().map(|r| reference.generate(r.clone()));
        futures::future::try_join_all(turns).await.unwrap()
    });
    reference.shutdown();

    let outputs: Vec<TurnOutput> = rt.block_on(async {
        let faults = EngineFaults::new();
        let (engine, _actor) = start_supervised(
            loader(tmp.path()),
            None,
            config(),
            policy(3),
            Some(faults.clone()),
        )
        .await
        .unwrap();
        engine
            .update_weights(3, later_weights(tmp.path()))
            .await
            .unwrap();
        // Counted in steps that have work, so the panic fires with turns decoding.
        faults.panic_after(3);
        let turns = tokio::spawn({
            let engine = engine.clone();
            let requests = requests.clone();
            async move {
                let turns = requests.iter().map(|r| engine.generate(r.clone()));
                futures::future::try_join_all(turns).await
            }
        });
        wait_for_restarts(&engine, 1).await;
        // The replacement runs on the reloaded version-0 weights and holds every turn until
        // it is sent version 3 again: nothing is sampled meanwhile.
        let held = engine.stats().await.unwrap();
        assert_eq!(held.awaiting_version, Some(3), "{held:?}");
        assert_eq!(held.policy_version, 0, "{held:?}");
        let still = engine.stats().await.unwrap();
        assert_eq!(still.tokens_generated, held.tokens_generated);
        assert_eq!(still.decode_steps, held.decode_steps);
        // Holding is not being stuck: its thread goes round its loop, so the stall detector
        // does not take a wait for weights (behind a long learner update) for a hung engine.
        let probe = engine.stall_probe();
        let since_held = std::time::Instant::now();
        let deadline = since_held + Duration::from_secs(60);
        loop {
            let stuck = probe.stuck(std::time::Instant::now()).expect("turns wait");
            if stuck.since > since_held {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a held engine's heartbeat stopped: {}",
                stuck.item
            );
            tokio::task::yield_now().await;
        }
        // The owner of the weights sends them again after a restart, as `train`'s learner does.
        engine
            .update_weights(3, later_weights(tmp.path()))
            .await
            .unwrap();
        let outputs = turns.await.unwrap().unwrap();
        let stats = engine.stats().await.unwrap();
        assert_eq!(stats.restarts, 1, "{stats:?}");
        assert!(
            stats.turns_rerun >= 1,
            "the panic fired with turns decoding: {stats:?}"
        );
        assert_eq!(stats.policy_version, 3);
        assert_eq!(stats.awaiting_version, None);
        assert_eq!(*engine.restarts().borrow(), 1);
        outputs
    });
    for (i, (out, want)) in outputs.iter().zip(&expected).enumerate() {
        assert_eq!(
            out.token_ids, want.token_ids,
            "turn {i}: the same tokens as an engine that never crashed"
        );
        assert_eq!(out.policy_version, 3, "turn {i}: admitted under version 3");
        assert!(
            out.token_versions.iter().all(|&v| v == 3),
            "turn {i}: no token sampled by the reloaded version-0 weights: {:?}",
            out.token_versions
        );
    }
}

#[test]
fn a_turn_in_two_crashes_fails_and_too_many_crashes_stop_the_engine_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    rt.block_on(async {
        let (engine, faults, _actor) = supervised_at_version_1(tmp.path(), 2).await;
        let long_turn = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(turn(7, 200)).await }
        });
        faults.panic_after(2);
        // The replacement holds every turn until it has version 1 again; the next crash is
        // armed before that, so it fires while the same turn decodes.
        wait_for_restarts(&engine, 1).await;
        faults.panic_after(2);
        engine
            .update_weights(1, later_weights(tmp.path()))
            .await
            .unwrap();
        let err = long_turn.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::TurnFailed(m) if m.contains("crashed 2 times while running this turn")),
            "{err}"
        );
        wait_for_restarts(&engine, 2).await;
        engine
            .update_weights(1, later_weights(tmp.path()))
            .await
            .unwrap();
        // The engine itself goes on: a new turn is served.
        let served = engine.generate(turn(8, 4)).await.unwrap();
        assert_eq!(served.token_ids.len(), 4);
        assert_eq!(engine.stats().await.unwrap().restarts, 2);

        // A third crash within the window is one more than the policy allows.
        let doomed = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(turn(9, 200)).await }
        });
        faults.panic_after(2);
        let err = doomed.await.unwrap().unwrap_err();
        let gave_up = |e: &Error| matches!(e, Error::EngineStopped(m) if m.contains("crashed 3 times within"));
        assert!(gave_up(&err), "{err}");
        // Every later call fails at once, naming why.
        let err = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match engine.generate(turn(10, 4)).await {
                    Err(e) if gave_up(&e) => return e,
                    // Accepted just before the channel closed: answered as dropped.
                    Err(Error::EngineStopped(_)) => tokio::task::yield_now().await,
                    other => panic!("expected the engine's failure, got {other:?}"),
                }
            }
        })
        .await
        .expect("later calls fail at once");
        assert!(gave_up(&err), "{err}");
    });
}

#[test]
fn a_crash_during_a_weight_update_is_a_restart_not_a_stopped_engine() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    rt.block_on(async {
        let (engine, faults, _actor) = supervised_at_version_1(tmp.path(), 3).await;
        // One engine's own answer: the update was not applied, and it says the thread
        // restarted rather than that the engine stopped.
        faults.panic_on_next_update();
        let err = engine
            .update_weights(2, later_weights(tmp.path()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::EngineRestarted(m) if m.contains("version 2")),
            "{err}"
        );
        wait_for_restarts(&engine, 1).await;
        let held = engine.stats().await.unwrap();
        assert_eq!(held.awaiting_version, Some(1), "{held:?}");

        // A publication to the set (what `train` does after each update) is not failed by a
        // restart: the replacement is sent the weights again by the restart watcher, as
        // `train`'s republisher does.
        let set = EngineSet::from(&engine);
        let mut restarted = set.restarted();
        faults.panic_on_next_update();
        set.update_weights(2, later_weights(tmp.path()))
            .await
            .expect("a restart during the update is not a failed publication");
        let (_, replacement) = tokio::time::timeout(Duration::from_secs(120), restarted.next())
            .await
            .expect("the restart is announced within 120 s")
            .expect("the engine is alive");
        replacement
            .update_weights(2, later_weights(tmp.path()))
            .await
            .unwrap();
        let served = engine.generate(turn(3, 4)).await.unwrap();
        assert_eq!(served.policy_version, 2);
        let stats = engine.stats().await.unwrap();
        assert_eq!((stats.restarts, stats.policy_version), (2, 2), "{stats:?}");
        assert_eq!(stats.awaiting_version, None);
    });
}

#[test]
fn a_crash_during_a_weight_update_past_the_restart_budget_fails_the_publication() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    rt.block_on(async {
        // No restart allowed: the first crash stops the engine for good, which the
        // supervisor decides only after the update's reply was dropped.
        let (engine, faults, _actor) = supervised_at_version_1(tmp.path(), 0).await;
        faults.panic_on_next_update();
        let err = EngineSet::from(&engine)
            .update_weights(2, later_weights(tmp.path()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::EngineStopped(m) if m.contains("crashed 1 times within")),
            "{err}"
        );
        assert_eq!(*engine.restarts().borrow(), 0);
    });
}

#[test]
fn a_model_that_cannot_load_fails_the_start_with_the_loader_error() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let err = rt
        .block_on(start_supervised(
            loader(&tmp.path().join("missing")),
            None,
            config(),
            policy(3),
            None,
        ))
        .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}
