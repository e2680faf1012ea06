//! End-to-end learning on a task with a known optimum, with the real pieces: a tiny model in
//! libtorch, the continuous-batching engine sampling from it, and the learner thread
//! publishing its weights to the engine after every update.
//!
//! The task: each prompt `[BOS, Q, 4 + k]` (k in 0..4) has exactly one rewarded answer token,
//! `8 + k`, out of a 16-token vocabulary; the reward is 1 when the answer step's first token
//! is it, else 0. A random policy scores about 1/16; the optimum is 1. Each estimator must
//! take the policy from chance to near-optimal within a bounded number of updates.
//!
//! Runs are reproducible: initial weights are seeded under a lock, the engine draws each
//! token from (seed, episode, position) whatever the batch, and the learner shuffles with its
//! own seeded RNG. Only float noise from batch composition can still flip a draw.

use agent_r1_actors::testing;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use agent_r1_actors::algo::{RejectLevel, RolloutCorrection, WeightLevel};
use agent_r1_actors::engine::{EngineConfig, EngineHandle, TurnRequest};
use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, LearnerConfig, LearnerModels, LearnerRef, LearnerStart,
};
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{LoraConfig, Placement, PolicyModel, SamplingParams};
use agent_r1_actors::trajectory::{Step, Trajectory};

#[path = "support/bandit.rs"]
mod bandit;
use bandit::{model_config, prompt, target, trajectory, PROMPTS};

const GROUP: usize = 16;
/// Observation the "environment" appends between steps of a multi-step episode.
const OBSERVATION: u32 = 3;
/// Mean batch reward counted as near-optimal (chance is 1/16).
const SOLVED: f64 = 0.9;
/// The most updates a run may take to get there.
const MAX_UPDATES: usize = 100;

/// libtorch's CPU generator is process-wide and the tests run on parallel threads: seeding
/// and initialising under one lock keeps each test's initial weights fixed.
static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The initial policy. A base for LoRA has an output head of a pretrained model's scale
/// (untied, std 0.2; a row of transformers' init scale, 0.02, would cap every logit near
/// 0.6): the adapters leave the head frozen, so at that scale no hidden state could give
/// the answer more than about a fifth of the probability.
fn save_initial_policy(dir: &Path, lora: bool) {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(7);
    let model = PolicyModel::new(model_config(!lora), Placement::default(), false).unwrap();
    if lora {
        tch::no_grad(|| {
            let mut head = model.var_store().variables()["lm_head.weight"].shallow_clone();
            let _ = head.g_mul_scalar_(10.0);
        });
    }
    model.save(dir, None).unwrap();
}

/// One episode: `steps` model turns of `tokens` tokens each, the observation appended
/// between turns; rewarded on the first token of the last turn.
async fn episode(
    engine: &EngineHandle,
    id: u64,
    group: u64,
    k: u32,
    steps: usize,
    tokens: usize,
) -> Trajectory {
    let mut context = prompt(k);
    let mut out = Vec::new();
    for s in 0..steps {
        let turn = engine
            .generate(TurnRequest {
                episode: id,
                context: context.clone(),
                params: SamplingParams {
                    temperature: 1.0,
                    max_new_tokens: tokens,
                    ..Default::default()
                },
                stop_strings: vec![],
            })
            .await
            .unwrap();
        let observation = if s + 1 < steps {
            vec![OBSERVATION]
        } else {
            vec![]
        };
        let step = Step {
            context_len: context.len(),
            action_ids: turn.token_ids.clone(),
            logprobs: turn.logprobs.clone(),
            policy_version: turn.policy_version,
            token_versions: vec![],
            finish_reason: FinishReason::Length,
            tool_calls: vec![],
            observation_ids: observation.clone(),
            reward: 0.0,
            generate_seconds: turn.total_seconds,
            tool_seconds: 0.0,
            prefill_tokens: turn.prefill_tokens,
            rebuilt: None,
        };
        context.extend(&turn.token_ids);
        context.extend(&observation);
        out.push(step);
    }
    engine.release(id);
    let answer = out.last().and_then(|s| s.action_ids.first()).copied();
    let reward = if answer == Some(target(k)) { 1.0 } else { 0.0 };
    trajectory(id, group, k, out, reward)
}

struct Run {
    rewards: Vec<f64>,
    /// Each update's largest |log π_learner - log π_engine| over the tokens its starting
    /// weights sampled.
    mismatch_max: Vec<f64>,
    seconds: f64,
}

/// Rollout, update, publish; repeated until two consecutive batches score at least
/// `SOLVED` or `updates` updates have run. Returns the mean reward of each batch.
fn train(
    config: LearnerConfig,
    critic: Option<bool>,
    steps: usize,
    tokens: usize,
    updates: usize,
) -> Run {
    train_with_sampler(config, critic, steps, tokens, updates, None, None)
}

/// The engine's copy of the weights of `version`: the learner's own, or, with `sigma`, each
/// tensor with Gaussian noise of that standard deviation added (seeded by the version): a
/// sampler that differs from the trainer on purpose, under the same version.
fn sampler_weights(
    weights: agent_r1_actors::learner::PolicyWeights,
    sigma: Option<f64>,
) -> Vec<(String, tch::Tensor)> {
    let Some(sigma) = sigma else {
        return weights.tensors;
    };
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(1000);
    weights
        .tensors
        .into_iter()
        .map(|(name, t)| {
            let noisy = &t + t.randn_like() * sigma;
            (name, noisy)
        })
        .collect()
}

fn train_with_sampler(
    config: LearnerConfig,
    critic: Option<bool>,
    steps: usize,
    tokens: usize,
    updates: usize,
    sampler_noise: Option<f64>,
    lora: Option<LoraConfig>,
) -> Run {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let with_lora = lora.is_some();
    save_initial_policy(tmp.path(), with_lora);
    let dir = tmp.path().to_path_buf();
    let engine = testing::start_engine(
        {
            let dir = dir.clone();
            let lora = lora.clone();
            move || {
                let mut model = PolicyModel::load(&dir, Placement::default(), false)?;
                if let Some(lora) = &lora {
                    model.add_lora(lora)?;
                }
                Ok(model)
            }
        },
        None,
        EngineConfig {
            max_batch_rows: 64,
            max_context: 64,
            seed: 3,
            ..testing::engine_config()
        },
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // critic: None = no critic, Some(true) = value head on the policy, Some(false) = separate.
    let load = move || {
        // The value head is not in the saved policy: it is initialised here, seeded.
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(11);
        let shared = critic == Some(true);
        let mut policy = PolicyModel::load(&dir, Placement::default(), shared)?;
        if let Some(lora) = &lora {
            policy.add_lora(lora)?;
        }
        let critic = match critic {
            Some(false) => Some(PolicyModel::load(&dir, Placement::default(), true)?),
            _ => None,
        };
        Ok(LearnerModels {
            policy,
            critic,
            reference: None,
            teacher: None,
            critic_prefix: None,
        })
    };
    let learner = rt
        .block_on(LearnerRef::spawn(LearnerStart::new(load, config)))
        .unwrap();
    let next_id = AtomicU64::new(0);
    let mut rewards = Vec::new();
    let mut mismatch_max = Vec::new();
    let publish = |learner: &LearnerRef, engine: &EngineHandle| {
        let (learner, engine) = (learner.clone(), engine.clone());
        async move {
            if sampler_noise.is_none() {
                return learner.publish(&engine).await.unwrap();
            }
            let weights = learner.weights().await.unwrap();
            let version = weights.version;
            engine
                .update_weights(version, sampler_weights(weights, sampler_noise))
                .await
                .unwrap();
            version
        }
    };
    rt.block_on(async {
        if sampler_noise.is_some() {
            publish(&learner, &engine).await;
        }
        for u in 0..updates {
            let n = rewards.len();
            if n >= 2 && rewards[n - 1] >= SOLVED && rewards[n - 2] >= SOLVED {
                break;
            }
            let episodes = (0..PROMPTS)
                .flat_map(|k| (0..GROUP).map(move |_| (k, u as u64 * PROMPTS as u64 + k as u64)));
            let futures: Vec<_> = episodes
                .map(|(k, group)| {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    episode(&engine, id, group, k, steps, tokens)
                })
                .collect();
            let batch = futures::future::join_all(futures).await;
            let mean = batch.iter().map(|t| t.reward).sum::<f64>() / batch.len() as f64;
            rewards.push(mean);
            let version_before = learner.version().await.unwrap();
            assert!(
                batch
                    .iter()
                    .all(|t| t.steps.iter().all(|s| s.policy_version == version_before)),
                "rollouts must come from the published policy"
            );
            let stats = learner.update(batch).await.unwrap();
            assert_eq!(stats.skipped_steps, 0, "{stats:?}");
            mismatch_max.extend(stats.mismatch.map(|m| m.abs_max));
            assert!(stats.policy_loss.is_finite() && stats.grad_norm.is_finite());
            if stats.critic_warmup {
                assert!(!stats.policy_updated);
                assert_eq!(stats.version, version_before);
            } else {
                assert!(stats.policy_updated, "{stats:?}");
                assert_eq!(stats.version, version_before + 1);
            }
            let published = publish(&learner, &engine).await;
            assert_eq!(published, stats.version);
            if with_lora && u == 0 {
                // Only the adapters travel: 2 layers x 7 projections x (A, B).
                let sent = learner.weights().await.unwrap().tensors;
                assert_eq!(sent.len(), 28);
                assert!(sent.iter().all(|(name, _)| name.contains(".lora_")));
            }
            eprintln!(
                "update {u:2}: reward {mean:.3} policy_loss {:+.4} value_loss {:?} \
                 entropy {:.3} clip {:.3} grad_norm {:.3} mismatch |Δ| {:.3} rejected {}",
                stats.policy_loss,
                stats.value_loss,
                stats.entropy,
                stats.clip_fraction,
                stats.grad_norm,
                stats.mismatch.map_or(0.0, |m| m.abs_mean),
                stats.rejected_tokens,
            );
        }
    });
    engine.shutdown();
    learner.shutdown();
    Run {
        rewards,
        mismatch_max,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn check(name: &str, run: &Run) {
    let first = run.rewards[0];
    let n = run.rewards.len();
    let last2 = (run.rewards[n - 1] + run.rewards[n - 2]) / 2.0;
    eprintln!(
        "{name}: first batch {first:.3}, last two {last2:.3}, {n} updates, {:.1} s",
        run.seconds
    );
    assert!(
        first <= 0.5,
        "{name}: first batch should be near chance, got {first}"
    );
    assert!(
        last2 >= SOLVED,
        "{name}: should be near-optimal after {n} updates, rewards {:?}",
        run.rewards
    );
}

#[test]
fn learning_ppo_gae_with_separate_critic_reaches_the_optimum() {
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Gae,
            actor_lr: 2e-3,
            entropy_coef: 0.003,
            critic_lr: 1e-2,
            critic_warmup_updates: 1,
            ppo_epochs: 2,
            mini_batch_size: 32,
            micro_batch_size: 8,
            lr_warmup_steps: 2,
            kl: KlConfig::OFF,
            ..Default::default()
        },
        seed: 1,
        ..testing::learner_config()
    };
    let run = train(config, Some(false), 1, 2, MAX_UPDATES);
    check("ppo/gae", &run);
}

#[test]
fn learning_ppo_step_gae_with_shared_value_head_over_two_turns_reaches_the_optimum() {
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::StepGae,
            actor_lr: 2e-3,
            entropy_coef: 0.003,
            critic_lr: 1e-2,
            critic_warmup_updates: 1,
            ppo_epochs: 2,
            mini_batch_size: 32,
            micro_batch_size: 8,
            kl: KlConfig::OFF,
            ..Default::default()
        },
        seed: 2,
        ..testing::learner_config()
    };
    let run = train(config, Some(true), 2, 1, MAX_UPDATES);
    check("ppo/step_gae", &run);
}

#[test]
fn learning_grpo_reaches_the_optimum() {
    let run = train(
        grpo_config(3, RolloutCorrection::default()),
        None,
        1,
        2,
        MAX_UPDATES,
    );
    check("grpo", &run);
}

/// LoRA (rank 4 on every projection, the base frozen, only the adapters published) takes
/// the bandit to its optimum with GRPO; the engine serves the base with the adapters beside
/// it, and its log-probabilities agree with the learner's recomputation within 1e-5 at every
/// update, as with the full weights.
#[test]
fn learning_grpo_with_lora_reaches_the_optimum_and_the_engine_agrees_with_the_learner() {
    let mut config = grpo_config(3, RolloutCorrection::default());
    config.algorithm.actor_lr = 1e-2;
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        ..LoraConfig::default()
    };
    let run = train_with_sampler(config, None, 1, 2, MAX_UPDATES, None, Some(lora));
    check("grpo+lora", &run);
    let worst = run.mismatch_max.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "engine vs learner, largest |Δ log π| over {} updates: {worst:.2e}",
        run.mismatch_max.len()
    );
    assert!(run.mismatch_max.len() >= 10, "{:?}", run.mismatch_max);
    assert!(worst < 1e-5, "{:?}", run.mismatch_max);
}

/// GRPO's settings on the bandit, with `correction`.
fn grpo_config(seed: u64, correction: RolloutCorrection) -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            actor_lr: 2e-3,
            entropy_coef: 0.003,
            ppo_epochs: 1,
            mini_batch_size: 32,
            micro_batch_size: 8,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            rollout_correction: correction,
            ..Default::default()
        },
        seed,
        ..testing::learner_config()
    }
}

/// Mean reward of the last five batches.
fn tail(rewards: &[f64]) -> f64 {
    let last = &rewards[rewards.len().saturating_sub(5)..];
    last.iter().sum::<f64>() / last.len() as f64
}

/// The engine samples with a perturbed copy of every published version (noise of 0.03 on
/// every weight: a sampler/trainer gap of about 0.3-1 nat per token, far above a bf16
/// engine's), on three seeds. Without rollout correction the PPO ratio is taken around the
/// sampler's log-probabilities and the runs stall near chance or fall back; with token TIS
/// (cap 2) and token rejection outside [0.5, 2] they learn.
#[test]
fn a_sampler_that_differs_from_the_trainer_stalls_without_rollout_correction_and_learns_with_it() {
    const SIGMA: f64 = 0.03;
    const UPDATES: usize = 60;
    let corrected = RolloutCorrection {
        weight: WeightLevel::Token,
        reject: RejectLevel::Token,
        ..Default::default()
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for seed in [4, 5, 6] {
        let plain = grpo_config(seed, RolloutCorrection::default());
        let plain = train_with_sampler(plain, None, 1, 2, UPDATES, Some(SIGMA), None);
        let fixed = train_with_sampler(
            grpo_config(seed, corrected),
            None,
            1,
            2,
            UPDATES,
            Some(SIGMA),
            None,
        );
        eprintln!(
            "seed {seed}: mean reward of the last 5 of {UPDATES} updates: without correction \
             {:.3}, with {:.3}",
            tail(&plain.rewards),
            tail(&fixed.rewards)
        );
        off.push(tail(&plain.rewards));
        on.push(tail(&fixed.rewards));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (off, on) = (mean(&off), mean(&on));
    eprintln!("over 3 seeds: without correction {off:.3}, with {on:.3} (chance 1/16)");
    assert!(on >= 0.45, "with correction the runs must learn: {on}");
    assert!(on - off >= 0.2, "correction must matter: {on} vs {off}");
}
