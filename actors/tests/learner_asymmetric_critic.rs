//! The asymmetric critic: a separate critic that reads a critic-only prefix before each row.
//! The actor's side of an update (its input, its log-probabilities) is bit for bit what it is
//! without the prefix, while the critic's values (and so its loss) change.

mod learner_common;

use agent_r1_actors::learner::{
    AlgorithmConfig, CriticPrefix, Estimator, KlConfig, LearnerConfig, LearnerModels, LearnerRef,
    LearnerStart, UpdateStats,
};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::testing;
use agent_r1_envs::task::Task;
use learner_common::{group, runtime, save_policy, INIT};

/// Three ids that depend on the task (as a rendered "gold answer" would).
#[derive(Debug)]
struct GoldAnswer;

impl CriticPrefix for GoldAnswer {
    fn ids(&self, task: &Task) -> agent_r1_actors::Result<Vec<u32>> {
        let n: u32 = task.id.trim_start_matches('t').parse().unwrap_or(0);
        Ok(vec![13, 14, n % 16])
    }
}

fn update(dir: &std::path::Path, prefix: bool) -> UpdateStats {
    let dir = dir.to_path_buf();
    let load = move || {
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(11);
        Ok(LearnerModels {
            policy: PolicyModel::load(&dir, Placement::default(), false)?,
            critic: Some(PolicyModel::load(&dir, Placement::default(), true)?),
            reference: None,
            teacher: None,
            critic_prefix: prefix.then(|| Box::new(GoldAnswer) as Box<dyn CriticPrefix>),
        })
    };
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Gae,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        ..testing::learner_config()
    };
    let mut batch = group(0, 0, 4, 0);
    batch.extend(group(4, 1, 4, 0));
    runtime().block_on(async {
        let learner = LearnerRef::spawn(LearnerStart::new(load, config))
            .await
            .unwrap();
        let stats = learner.update(batch).await.unwrap();
        learner.shutdown();
        stats
    })
}

#[test]
fn the_prefix_reaches_the_critic_only() {
    let dir = tempfile::tempdir().unwrap();
    save_policy(dir.path(), 3);
    let plain = update(dir.path(), false);
    let asymmetric = update(dir.path(), true);
    // The actor's log-probabilities of the trained tokens (measured against the sampler's)
    // and its entropies are computed from its own input: identical.
    assert_eq!(plain.mismatch, asymmetric.mismatch);
    assert!(plain.mismatch.is_some());
    assert_eq!(plain.entropy.to_bits(), asymmetric.entropy.to_bits());
    assert_eq!(plain.action_tokens, asymmetric.action_tokens);
    assert_eq!(
        plain.tokens, asymmetric.tokens,
        "the rows are the actor's, unchanged"
    );
    // The critic read the prefix: its values, so its loss, are not the same.
    let (a, b) = (plain.value_loss.unwrap(), asymmetric.value_loss.unwrap());
    assert!(a.is_finite() && b.is_finite());
    assert_ne!(
        a.to_bits(),
        b.to_bits(),
        "value loss {a} with and without the prefix"
    );
}
