//! Steps with their own contexts, trained by the real learner on a tiny model.
//!
//! The same trajectories are stored two ways: packed (steps whose contexts chain share a
//! row; a rebuilt context starts a row) and as a reference in which every step is a row of
//! its own. Every step sees the same context in both, so one update must give the same
//! loss, gradient norm and weights, for a group estimator (GRPO) and for step-level GAE
//! with a critic on the policy's trunk.

mod learner_common;

use agent_r1_actors::learner::{AlgorithmConfig, Estimator, KlConfig, LearnerConfig};
use agent_r1_actors::learner::{PolicyWeights, UpdateStats};
use agent_r1_actors::testing;
use agent_r1_actors::trajectory::{RebuiltContext, Trajectory};
use learner_common::{learner, runtime, save_policy, trajectory, TestStep};

fn config(estimator: Estimator) -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator,
            // AdamW's first step moves each weight by about the rate whatever the size of its
            // gradient, so float noise in a near-zero gradient moves a weight by up to twice
            // the rate: small enough to compare weights at 1e-5.
            actor_lr: 1e-3,
            critic_lr: 1e-3,
            micro_batch_size: 3,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        ..testing::learner_config()
    }
}

/// Four trajectories of three steps. In the even ones, step 2's context is a window: the
/// prompt and step 1's action and observation (step 0's turn dropped); the odd ones chain,
/// so trajectories have different numbers of rows.
fn packed(group: u64) -> Vec<Trajectory> {
    (0..4u64)
        .map(|i| {
            let mut t = trajectory(
                10 + i,
                group,
                &[1, 2, 4],
                vec![
                    TestStep::plain(5 + i as u32, 4, 0),
                    TestStep::plain(9 + i as u32, 3, 0),
                    TestStep::plain(2 + i as u32, 2, 0),
                ],
                if i % 2 == 0 { 1.0 } else { 0.0 },
            );
            t.steps[1].reward = 0.25 * i as f64;
            if i % 2 == 1 {
                return t;
            }
            let chained: Vec<u32> = t.contexts().nth(2).unwrap();
            let mut window = t.prompt_ids.clone();
            window.extend(&t.steps[1].action_ids);
            window.extend(&t.steps[1].observation_ids);
            t.steps[2].rebuilt = Some(RebuiltContext::between(&chained, &window, "window"));
            t.steps[2].context_len = window.len();
            t.check_contexts().unwrap();
            assert_eq!(t.rows().len(), 2);
            t
        })
        .collect()
}

/// The same steps, each in its own row (every later context stored as rebuilt).
fn one_row_per_step(packed: &[Trajectory]) -> Vec<Trajectory> {
    packed
        .iter()
        .map(|t| {
            let contexts: Vec<Vec<u32>> = t.contexts().collect();
            let mut r = t.clone();
            let mut chained = r.prompt_ids.clone();
            for (k, context) in contexts.iter().enumerate() {
                if k > 0 {
                    r.steps[k].rebuilt = Some(RebuiltContext::between(&chained, context, "test"));
                }
                chained = context.clone();
                chained.extend(&r.steps[k].action_ids);
                chained.extend(&r.steps[k].observation_ids);
            }
            r.check_contexts().unwrap();
            assert_eq!(r.contexts().collect::<Vec<_>>(), contexts);
            assert_eq!(r.rows().len(), r.steps.len());
            r
        })
        .collect()
}

fn update(
    batch: Vec<Trajectory>,
    estimator: Estimator,
    value_head: bool,
) -> (UpdateStats, PolicyWeights) {
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 3);
    let learner = learner(tmp.path(), config(estimator), value_head, false);
    runtime().block_on(async {
        let stats = learner.update(batch).await.unwrap();
        (stats, learner.weights().await.unwrap())
    })
}

fn max_weight_diff(a: &PolicyWeights, b: &PolicyWeights) -> f64 {
    assert_eq!(a.tensors.len(), b.tensors.len());
    a.tensors
        .iter()
        .zip(&b.tensors)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

fn assert_same_update(estimator: Estimator, value_head: bool) {
    let packed = packed(0);
    let reference = one_row_per_step(&packed);
    let (a, wa) = update(packed, estimator, value_head);
    let (b, wb) = update(reference, estimator, value_head);
    assert!(a.policy_updated && b.policy_updated, "{a:?}");
    assert_eq!(a.action_tokens, b.action_tokens);
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-5 * (1.0 + y.abs());
    assert!(
        close(a.policy_loss, b.policy_loss),
        "loss {} vs {}",
        a.policy_loss,
        b.policy_loss
    );
    assert!(
        close(a.grad_norm, b.grad_norm),
        "grad norm {} vs {}",
        a.grad_norm,
        b.grad_norm
    );
    assert!(
        close(a.advantage_mean, b.advantage_mean),
        "advantage mean {} vs {}",
        a.advantage_mean,
        b.advantage_mean
    );
    if value_head {
        let (va, vb) = (a.value_loss.unwrap(), b.value_loss.unwrap());
        assert!(close(va, vb), "value loss {va} vs {vb}");
    }
    let diff = max_weight_diff(&wa, &wb);
    eprintln!(
        "{estimator:?}: loss {} vs {}, grad norm {} vs {}, max weight difference {diff:e}",
        a.policy_loss, b.policy_loss, a.grad_norm, b.grad_norm
    );
    assert!(diff <= 1e-5, "weights differ by {diff}");
    // The update moved the weights: the comparison is not between two untouched models.
    let tmp = tempfile::tempdir().unwrap();
    save_policy(tmp.path(), 3);
    let untouched = runtime()
        .block_on(learner(tmp.path(), config(estimator), value_head, false).weights())
        .unwrap();
    assert!(max_weight_diff(&wa, &untouched) > 1e-4);
}

#[test]
fn grpo_on_packed_rows_equals_one_row_per_step() {
    assert_same_update(Estimator::Grpo, false);
}

#[test]
fn step_gae_with_a_critic_on_packed_rows_equals_one_row_per_step() {
    assert_same_update(Estimator::StepGae, true);
}

#[test]
fn token_gae_with_a_critic_on_packed_rows_equals_one_row_per_step() {
    assert_same_update(Estimator::Gae, true);
}
