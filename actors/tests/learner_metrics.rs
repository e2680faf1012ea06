//! The learner's Prometheus series, read back through a debugging recorder.
//!
//! The learner records on its own thread, so the recorder is installed process-wide; this
//! binary has one test, so nothing else writes to it. Every series must exist under the
//! `agent_r1_learner_` prefix and carry the same numbers as the returned `UpdateStats`.

mod learner_common;

use agent_r1_actors::testing;
use std::collections::HashMap;

use agent_r1_actors::learner::{AlgorithmConfig, Estimator, KlConfig, LearnerConfig};
use learner_common::{group, learner, runtime, save_policy};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Gauges and counters by name, and histogram samples by name. Reading drains the
/// recorder (counters and histograms restart from nothing).
fn read(snapshotter: &Snapshotter) -> (HashMap<String, f64>, HashMap<String, Vec<f64>>) {
    let mut values = HashMap::new();
    let mut histograms = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_string();
        match value {
            DebugValue::Counter(c) => {
                values.insert(name, c as f64);
            }
            DebugValue::Gauge(g) => {
                values.insert(name, g.into_inner());
            }
            DebugValue::Histogram(h) => {
                histograms.insert(name, h.into_iter().map(|v| v.into_inner()).collect());
            }
        }
    }
    (values, histograms)
}

#[test]
fn learner_series_exist_with_the_update_stats_values() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 4);
    // PPO with GAE on a value head sharing the trunk, a KL loss to the initial policy, two
    // epochs of two mini-batches (so that the policy has moved and the KL is not 0), and a
    // learner one version ahead of part of the batch (so that staleness is not 0).
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Gae,
            kl: KlConfig::default(),
            ppo_epochs: 2,
            mini_batch_size: 4,
            micro_batch_size: 2,
            actor_lr: 1e-2,
            critic_lr: 1e-2,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        initial_version: 1,
        ..testing::learner_config()
    };
    let learner = learner(tmp.path(), config, true, true);
    let rt = runtime();
    let mut batch = group(0, 0, 4, 1);
    batch.extend(group(4, 1, 4, 1));
    for t in &mut batch {
        t.steps[0].policy_version = 0;
    }
    let first = rt.block_on(learner.update(batch)).unwrap();
    assert_eq!(first.skipped_steps, 0, "{first:?}");
    assert_eq!(first.optimizer_steps, 4, "{first:?}");
    let (values, histograms) = read(&snapshotter);
    let gauge = |name: &str| {
        *values
            .get(&format!("agent_r1_learner_{name}"))
            .unwrap_or_else(|| panic!("no series agent_r1_learner_{name} in {values:?}"))
    };

    // The series carry the update's numbers.
    assert_eq!(gauge("policy_loss"), first.policy_loss);
    assert_eq!(Some(gauge("value_loss")), first.value_loss);
    assert_eq!(gauge("entropy"), first.entropy);
    assert_eq!(Some(gauge("kl")), first.kl);
    assert_eq!(gauge("clip_fraction"), first.clip_fraction);
    assert_eq!(gauge("grad_norm"), first.grad_norm);
    assert_eq!(Some(gauge("critic_grad_norm")), first.critic_grad_norm);
    assert_eq!(gauge("staleness_mean"), first.staleness_mean);
    assert_eq!(gauge("staleness_max"), first.staleness_max as f64);
    assert_eq!(gauge("policy_version"), 2.0);
    assert_eq!(gauge("updates_total"), 1.0);
    assert_eq!(gauge("optimizer_steps_total"), 4.0);
    assert_eq!(gauge("skipped_updates_total"), 0.0);
    assert_eq!(gauge("stale_tokens_dropped_total"), 0.0);
    assert_eq!(gauge("action_tokens_total"), first.action_tokens as f64);
    assert_eq!(
        histograms["agent_r1_learner_update_duration_seconds"],
        vec![first.duration_seconds]
    );

    // And the numbers are sane for this batch.
    assert!(first.policy_loss.is_finite());
    let value_loss = first.value_loss.unwrap();
    assert!(value_loss.is_finite() && value_loss > 0.0, "{first:?}");
    let max_entropy = (learner_common::VOCAB as f64).ln();
    assert!(
        first.entropy > 0.0 && first.entropy <= max_entropy + 1e-6,
        "{first:?}"
    );
    // k3 is >= 0, and > 0 once the second epoch reads a policy that has moved.
    let kl = first.kl.unwrap();
    assert!(kl.is_finite() && kl > 0.0, "{first:?}");
    assert!((0.0..=1.0).contains(&first.clip_fraction), "{first:?}");
    assert!(first.grad_norm.is_finite() && first.grad_norm > 0.0);
    // Step 0 (4 tokens) was sampled one version back, step 1 (3 tokens) by the current one.
    assert_eq!(first.staleness_max, 1);
    assert!(
        (first.staleness_mean - 4.0 / 7.0).abs() < 1e-12,
        "{first:?}"
    );
    assert!(first.duration_seconds > 0.0);

    // A poisoned row: its mini-batch is skipped in both epochs and counted; the gauges keep
    // the applied steps' finite numbers.
    let mut batch = group(8, 2, 8, 2);
    batch[5].steps[0].logprobs[2] = f32::NAN;
    let second = rt.block_on(learner.update(batch)).unwrap();
    assert_eq!(second.skipped_steps, 2, "{second:?}");
    assert_eq!(second.optimizer_steps, 2, "{second:?}");
    let (values, histograms) = read(&snapshotter);
    let gauge = |name: &str| values[&format!("agent_r1_learner_{name}")];
    // A snapshot drains the recorder: counters read as increments since the last one.
    assert_eq!(gauge("skipped_updates_total"), 2.0);
    assert_eq!(gauge("updates_total"), 1.0);
    assert_eq!(gauge("optimizer_steps_total"), 2.0);
    for name in ["policy_loss", "value_loss", "entropy", "kl", "grad_norm"] {
        assert!(gauge(name).is_finite(), "{name} = {}", gauge(name));
    }
    assert_eq!(gauge("policy_loss"), second.policy_loss);
    assert_eq!(
        histograms["agent_r1_learner_update_duration_seconds"],
        vec![second.duration_seconds]
    );
    learner.shutdown();
}
