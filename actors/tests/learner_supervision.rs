//! The learner as a supervised actor, with a real tiny model on its thread.
//!
//! Fault injection: the `before_update` hook panics inside the second update, standing for
//! libtorch failing mid-update. The caller gets that update's error, the supervisor reports
//! why the learner failed, and every later call answers with that reason instead of hanging
//! or training on half-updated weights.

mod learner_common;

use agent_r1_actors::testing;
use std::sync::Arc;

use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, LearnerConfig, LearnerRef, LearnerStart,
};
use agent_r1_actors::Error;
use learner_common::{group, load_models, runtime, save_policy};

fn config() -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            micro_batch_size: 8,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        ..testing::learner_config()
    }
}

#[test]
fn a_panic_inside_an_update_is_caught_and_reported_by_the_learners_supervisor() {
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 1);
    runtime().block_on(async {
        let learner = LearnerRef::spawn(LearnerStart {
            before_update: Some(Arc::new(|version| {
                if version == 1 {
                    panic!("injected: libtorch raised mid-update");
                }
            })),
            ..LearnerStart::new(load_models(tmp.path(), false, false), config())
        })
        .await
        .unwrap();
        let first = learner.update(group(0, 0, 4, 0)).await.unwrap();
        assert_eq!(first.version, 1);
        assert_eq!(learner.failure(), None, "a good update reports nothing");

        let second = learner.update(group(4, 1, 4, 1)).await;
        match &second {
            Err(Error::Panicked { what, message }) => {
                assert_eq!(what, "learner update");
                assert_eq!(message, "injected: libtorch raised mid-update");
            }
            other => panic!("expected the update's panic, got {other:?}"),
        }
        // The actor failed after answering; its supervisor's report reaches later callers.
        match learner.version().await {
            Err(Error::LearnerFailed(why)) => assert!(
                why.contains("learner update panicked: injected"),
                "the report names the panic: {why}"
            ),
            other => panic!("expected the supervisor's report, got {other:?}"),
        }
        let why = learner
            .failure()
            .expect("the supervisor recorded the failure");
        assert!(
            why.contains("injected: libtorch raised mid-update"),
            "{why}"
        );
        assert!(matches!(
            learner.update(group(8, 2, 4, 1)).await,
            Err(Error::LearnerFailed(_))
        ));
    });
}

#[test]
fn a_learner_that_cannot_load_fails_to_start_with_the_reason() {
    runtime().block_on(async {
        let missing = std::path::Path::new("/nonexistent/policy");
        let err = LearnerRef::spawn(LearnerStart::new(
            load_models(missing, false, false),
            config(),
        ))
        .await
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/policy"), "{err}");
    });
}
