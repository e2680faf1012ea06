//! The learner's guards against bad numbers, with a real tiny model on the learner thread.
//!
//! Fault injection: a NaN planted in a trajectory's stored log-probabilities stands for an
//! engine that produced garbage (an overflow in low precision, a broken kernel). The step
//! it poisons must be skipped, counted, blamed on the right episode and logged, and must
//! leave the weights and the version exactly as they were. A non-finite reward is a bug in
//! the env, not numerical noise: the whole batch is refused with an error naming the episode.

mod learner_common;

use agent_r1_actors::testing;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use agent_r1_actors::learner::{AlgorithmConfig, Estimator, KlConfig, LearnerConfig};
use learner_common::{group, learner, runtime, same_weights, save_policy};

/// Everything the learner thread logs at WARN and above, in this test binary.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The learner logs on its own thread, so the subscriber must be global (installed once).
fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// GRPO with a learning rate large enough that any applied step visibly moves the weights.
fn config() -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            actor_lr: 1e-2,
            micro_batch_size: 8,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        ..testing::learner_config()
    }
}

#[test]
fn nan_logprobs_skip_the_step_blame_the_episode_and_leave_weights_and_version_alone() {
    capture_logs();
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 1);
    let learner = learner(tmp.path(), config(), false, false);
    runtime().block_on(async {
        let before = learner.weights().await.unwrap();
        assert_eq!(before.version, 0);
        let mut batch = group(100, 0, 4, 0);
        batch[2].steps[0].logprobs[1] = f32::NAN;
        let stats = learner.update(batch).await.unwrap();
        assert_eq!(stats.skipped_steps, 1, "{stats:?}");
        assert_eq!(stats.optimizer_steps, 0);
        assert_eq!(
            stats.skipped_episode_ids,
            vec![102],
            "only the NaN row is blamed"
        );
        assert!(!stats.policy_updated);
        assert_eq!(stats.version, 0);
        // Nothing was applied, so there are no losses to report (and no NaN to export).
        assert_eq!(
            (stats.policy_loss, stats.entropy, stats.grad_norm),
            (0.0, 0.0, 0.0)
        );
        let after = learner.weights().await.unwrap();
        assert_eq!(
            after.version, 0,
            "a skipped update must not advance the version"
        );
        assert!(
            same_weights(&before, &after),
            "a skipped step changed the weights"
        );
        let log = logs();
        let line = log
            .lines()
            .find(|l| l.contains("optimizer step skipped") && l.contains("102"))
            .unwrap_or_else(|| panic!("no warning naming episode 102 in:\n{log}"));
        assert!(line.contains("WARN"), "{line}");

        // The skipped step left no trace in the optimizer: the next clean batch trains.
        let stats = learner.update(group(200, 0, 4, 0)).await.unwrap();
        assert_eq!(stats.skipped_steps, 0, "{stats:?}");
        assert!(stats.policy_updated && stats.version == 1, "{stats:?}");
        let trained = learner.weights().await.unwrap();
        assert!(
            !same_weights(&after, &trained),
            "a clean step must move the weights"
        );
        assert!(trained
            .tensors
            .iter()
            .all(|(_, t)| t.isfinite().all().int64_value(&[]) == 1));
    });
    learner.shutdown();
}

#[test]
fn a_nan_in_one_mini_batch_skips_only_that_step() {
    capture_logs();
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 2);
    let learner = learner(
        tmp.path(),
        LearnerConfig {
            algorithm: AlgorithmConfig {
                mini_batch_size: 2,
                micro_batch_size: 1,
                ..config().algorithm
            },
            ..config()
        },
        false,
        false,
    );
    runtime().block_on(async {
        let before = learner.weights().await.unwrap();
        let mut batch = group(300, 0, 4, 0);
        batch[3].steps[1].logprobs[0] = f32::NAN;
        let stats = learner.update(batch).await.unwrap();
        // Two mini-batches of two: the one holding episode 303 is skipped, the other steps.
        assert_eq!(stats.skipped_steps, 1, "{stats:?}");
        assert_eq!(stats.optimizer_steps, 1, "{stats:?}");
        assert_eq!(stats.skipped_episode_ids, vec![303]);
        assert!(stats.policy_updated && stats.version == 1, "{stats:?}");
        assert!(
            stats.grad_norm.is_finite() && stats.grad_norm > 0.0,
            "{stats:?}"
        );
        // The update's numbers come from the applied step only: the skipped one's NaN loss
        // must not leak into them.
        assert!(stats.policy_loss.is_finite(), "{stats:?}");
        assert!(
            stats.entropy > 0.0 && stats.approx_kl.is_finite(),
            "{stats:?}"
        );
        let after = learner.weights().await.unwrap();
        assert!(!same_weights(&before, &after));
        assert!(after
            .tensors
            .iter()
            .all(|(_, t)| t.isfinite().all().int64_value(&[]) == 1));
    });
    learner.shutdown();
}

#[test]
fn non_finite_rewards_are_refused_naming_the_episode_before_anything_changes() {
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 3);
    let learner = learner(tmp.path(), config(), false, false);
    runtime().block_on(async {
        let before = learner.weights().await.unwrap();
        let mut batch = group(400, 0, 4, 0);
        batch[1].reward = f64::NAN;
        let err = learner.update(batch).await.unwrap_err().to_string();
        assert!(
            err.contains("trajectory 401") && err.contains("outcome reward is NaN"),
            "{err}"
        );
        let mut batch = group(500, 0, 4, 0);
        batch[2].steps[1].reward = f64::INFINITY;
        let err = learner.update(batch).await.unwrap_err().to_string();
        assert!(
            err.contains("trajectory 502 step 1") && err.contains("process reward is inf"),
            "{err}"
        );
        let after = learner.weights().await.unwrap();
        assert_eq!(after.version, 0);
        assert!(same_weights(&before, &after));
        // The learner is still serving, and trains on a clean batch.
        let stats = learner.update(group(600, 0, 4, 0)).await.unwrap();
        assert!(stats.policy_updated && stats.version == 1, "{stats:?}");
    });
    learner.shutdown();
}
