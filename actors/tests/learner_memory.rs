//! The learner's memory knobs change memory, not the update: activations recomputed per
//! decoder layer (`recompute`), micro-batches packed by a token budget
//! (`max_tokens_per_micro_batch`) and the logits chunk size give the same gradients and the
//! same weights as the plain pass, for the policy and for a separate critic.
//!
//! How much memory each saves is measured by `agent-r1 bench learner` at a real shape (the
//! figures in docs/benchmarks.md), not here.

mod learner_common;

use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, KlPlacement, Learner, LearnerConfig, LearnerModels,
    MemoryConfig, Reference, UpdateStats,
};
use agent_r1_actors::model::{LoraConfig, Placement, PolicyModel};
use agent_r1_actors::testing;
use agent_r1_actors::trajectory::Trajectory;
use learner_common::{model_config, trajectory, TestStep, INIT};
use tch::{Kind, Tensor};

/// Trajectories of very different lengths (6 to 40 tokens), with process-free outcome
/// rewards that differ, so the token budget packs them unevenly.
fn batch() -> Vec<Trajectory> {
    (0..10u64)
        .map(|e| {
            let prompt: Vec<u32> = (0..(2 + e % 4))
                .map(|i| ((e * 3 + i) % 16) as u32)
                .collect();
            let steps = (0..(1 + e % 5))
                .map(|k| TestStep::plain((e * 5 + k) as u32, 2 + (e as usize * 3) % 6, 0))
                .collect();
            trajectory(e, e / 2, &prompt, steps, (e % 3) as f64 / 2.0)
        })
        .collect()
}

/// PPO with a separate critic, an entropy bonus and KL in the loss, two mini-batches of
/// micro-batches: every path the memory knobs touch.
fn base() -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Gae,
            kl: KlConfig {
                placement: KlPlacement::Loss,
                coef: 0.1,
                ..Default::default()
            },
            entropy_coef: 0.01,
            actor_lr: 1e-3,
            critic_lr: 1e-3,
            lr_warmup_steps: 0,
            grad_clip: 1e9,
            mini_batch_size: 5,
            micro_batch_size: 2,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        max_len: 64,
        ..testing::learner_config()
    }
}

/// A learner over fixed seeded weights (policy, separate critic, reference).
fn learner(config: LearnerConfig) -> Learner {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(21);
    let policy = PolicyModel::new(model_config(), Placement::default(), false).unwrap();
    let critic = PolicyModel::new(model_config(), Placement::default(), true).unwrap();
    let reference = PolicyModel::new(model_config(), Placement::default(), false).unwrap();
    Learner::new(
        LearnerModels {
            policy,
            critic: Some(critic),
            reference: Some(Reference::Model(Box::new(reference))),
            teacher: None,
            critic_prefix: None,
        },
        config,
    )
    .unwrap()
}

fn flat(l: &Learner) -> Tensor {
    let parts: Vec<Tensor> = l
        .master_weights()
        .iter()
        .map(|(_, t)| t.to_kind(Kind::Double).flatten(0, -1))
        .collect();
    Tensor::cat(&parts, 0)
}

/// Two updates; the stats of each and the policy's weights after them, flattened.
fn run(config: LearnerConfig) -> (Vec<UpdateStats>, Tensor) {
    let mut l = learner(config);
    let stats = (0..2).map(|_| l.update(batch()).unwrap()).collect();
    (stats, flat(&l))
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

#[test]
fn recomputation_token_budgets_and_logit_chunks_train_the_same() {
    let (plain_stats, plain_weights) = run(LearnerConfig {
        memory: MemoryConfig {
            logits_chunk_tokens: 1 << 20,
            ..base().memory
        },
        ..base()
    });
    let initial = flat(&learner(base()));
    let plain_update = &plain_weights - &initial;
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    assert!(norm(&plain_update) > 0.0);
    for (what, config) in [
        (
            "recompute",
            LearnerConfig {
                memory: MemoryConfig {
                    recompute: true,
                    ..base().memory
                },
                ..base()
            },
        ),
        (
            "token budget",
            LearnerConfig {
                memory: MemoryConfig {
                    max_tokens_per_micro_batch: 80,
                    ..base().memory
                },
                ..base()
            },
        ),
        (
            "all three",
            LearnerConfig {
                memory: MemoryConfig {
                    recompute: true,
                    max_tokens_per_micro_batch: 64,
                    logits_chunk_tokens: 3,
                    ..base().memory
                },
                ..base()
            },
        ),
    ] {
        let (stats, weights) = run(config);
        for (s, p) in stats.iter().zip(&plain_stats) {
            assert_eq!(s.optimizer_steps, p.optimizer_steps, "{what}");
            for (name, a, b) in [
                ("policy_loss", s.policy_loss, p.policy_loss),
                ("grad_norm", s.grad_norm, p.grad_norm),
                (
                    "critic_grad_norm",
                    s.critic_grad_norm.unwrap(),
                    p.critic_grad_norm.unwrap(),
                ),
                ("value_loss", s.value_loss.unwrap(), p.value_loss.unwrap()),
                ("entropy", s.entropy, p.entropy),
                ("kl", s.kl.unwrap(), p.kl.unwrap()),
            ] {
                assert!(relative(a, b) < 1e-4, "{what}: {name} {a} vs {b}");
            }
        }
        let diff = norm(&(&weights - &plain_weights)) / norm(&plain_update);
        println!("{what}: relative difference of the update {diff:.2e}");
        assert!(diff < 1e-3, "{what}: the update differs by {diff}");
    }
}

#[test]
fn a_token_budget_below_the_longest_sequence_is_refused() {
    let e = LearnerConfig {
        memory: MemoryConfig {
            max_tokens_per_micro_batch: 1000,
            ..Default::default()
        },
        max_len: 4096,
        ..testing::learner_config()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_tokens_per_micro_batch"), "{e}");
    assert!(e.contains("4096"), "{e}");
}

/// A LoRA learner over fixed seeded base weights whose KL reference is either a second copy
/// of the base or the policy's own base with its adapters off.
fn lora_learner(reference_is_base: bool) -> Learner {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    let base_model = || {
        tch::manual_seed(21);
        PolicyModel::new(model_config(), Placement::default(), false).unwrap()
    };
    let mut policy = base_model();
    let reference = if reference_is_base {
        Reference::PolicyBase
    } else {
        Reference::Model(Box::new(base_model()))
    };
    tch::manual_seed(22);
    policy
        .add_lora(&LoraConfig {
            rank: 4,
            alpha: 8.0,
            ..LoraConfig::default()
        })
        .unwrap();
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            actor_lr: 1e-2,
            ..base().algorithm
        },
        ..base()
    };
    Learner::new(
        LearnerModels {
            policy,
            critic: None,
            reference: Some(reference),
            teacher: None,
            critic_prefix: None,
        },
        config,
    )
    .unwrap()
}

#[test]
fn a_lora_policys_base_with_adapters_off_is_the_kl_reference_without_a_copy() {
    let run = |reference_is_base| {
        let mut l = lora_learner(reference_is_base);
        let stats: Vec<UpdateStats> = (0..3).map(|_| l.update(batch()).unwrap()).collect();
        (stats, flat(&l))
    };
    let (copy_stats, copy_weights) = run(false);
    let (base_stats, base_weights) = run(true);
    // Fresh adapters change nothing; from the second mini-batch on the adapters have moved
    // and the policy diverges from its base.
    for (i, (c, b)) in copy_stats.iter().zip(&base_stats).enumerate() {
        let (c, b) = (c.kl.unwrap(), b.kl.unwrap());
        eprintln!("update {i}: kl to a copy {c:e}, to the base with adapters off {b:e}");
        assert!(c > 0.0, "update {i}: the adapters did not move");
        assert!((c - b).abs() <= 1e-9, "update {i}: kl {c} against {b}");
    }
    // The adapters are on again after the reference pass: both runs train the same weights.
    let diff = (&copy_weights - &base_weights)
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff <= 1e-9, "weights differ by {diff}");
}

#[test]
fn the_policys_base_is_no_reference_without_adapters() {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    let policy = PolicyModel::new(model_config(), Placement::default(), false).unwrap();
    let err = Learner::new(
        LearnerModels {
            policy,
            critic: None,
            reference: Some(Reference::PolicyBase),
            teacher: None,
            critic_prefix: None,
        },
        LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator: Estimator::Grpo,
                ..base().algorithm
            },
            ..base()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("LoRA adapters"), "{err}");
}
