//! Verified weight sync with a real learner and engine: every publication carries the
//! learner's per-tensor checksums, which the engine checks on arrival and again on what it
//! serves.
//!
//! Fault injection: one element of one tensor is changed in transit (between the learner's
//! copy and the engine), standing for a corrupted transfer.

mod learner_common;

use agent_r1_actors::learner::{AlgorithmConfig, KlConfig, LearnerConfig};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::testing;
use agent_r1_actors::Error;
use learner_common::{group, learner, runtime, save_policy};
use tch::Kind;

#[test]
fn a_tensor_corrupted_in_transit_is_a_named_error_and_the_engine_keeps_its_weights() {
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 1);
    let learner = learner(
        tmp.path(),
        LearnerConfig {
            algorithm: AlgorithmConfig {
                actor_lr: 1e-2,
                kl: KlConfig::OFF,
                critic_warmup_updates: 0,
                ..Default::default()
            },
            ..testing::learner_config()
        },
        false,
        false,
    );
    let dir = tmp.path().to_path_buf();
    let engine = testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        testing::engine_config(),
    )
    .unwrap();
    runtime().block_on(async {
        learner.update(group(0, 0, 4, 0)).await.unwrap();
        let weights = learner.weights().await.unwrap();
        assert_eq!(weights.version, 1);
        assert_eq!(weights.digest.0.len(), weights.tensors.len());

        // One bit of one element of the fourth tensor flips on the way.
        let mut tensors = weights.tensors;
        let (name, corrupted) = &mut tensors[3];
        let name = name.clone();
        let bits = corrupted.view_dtype(Kind::Int).flatten(0, -1);
        let _ = bits.get(7).g_add_scalar_(1);
        match engine
            .update_weights_verified(weights.version, tensors, weights.digest.clone())
            .await
        {
            Err(Error::WeightSyncMismatch { stage, tensor, .. }) => {
                assert_eq!(tensor, name);
                assert_eq!(stage, "weights received by the engine");
            }
            other => panic!("expected a weight sync mismatch, got {other:?}"),
        }
        let stats = engine.stats().await.unwrap();
        assert_eq!(stats.policy_version, 0, "nothing was applied");

        // The intact publication verifies and is served.
        assert_eq!(learner.publish(&engine).await.unwrap(), 1);
        assert_eq!(engine.stats().await.unwrap().policy_version, 1);
    });
    engine.shutdown();
    learner.shutdown();
}
