//! On-policy distillation with the real pieces: a tiny student in libtorch sampled by the
//! continuous-batching engine, a teacher taught the task by supervised steps, and the learner
//! thread training the student on the teacher's per-token reverse KL alone.
//!
//! The task: each prompt `[BOS, Q, 4 + k]` (k in 0..4) has one right answer token, `8 + k`,
//! out of 16. The teacher is the student's starting weights after supervised steps on the
//! four right answers. Distillation alone never reads a reward (every trajectory is handed to
//! the learner with reward 0), so the student can only reach the task's optimum through the
//! teacher's log-probabilities of its own samples.

use agent_r1_actors::testing;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_r1_actors::engine::{EngineConfig, EngineHandle, TurnRequest};
use agent_r1_actors::learner::{
    AlgorithmConfig, DistillCombine, DistillConfig, Estimator, KlConfig, Learner, LearnerConfig,
    LearnerModels, LearnerRef, LearnerStart,
};
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::sft::{train_sft, SftConfig, SftSequence};
use agent_r1_actors::trajectory::{Step, Trajectory};

#[path = "support/bandit.rs"]
mod bandit;
use bandit::{model_config, prompt, target, trajectory, PROMPTS};

const GROUP: usize = 16;
const UPDATES: usize = 50;

/// The student's starting weights in `student`, and in `teacher` the same weights after
/// supervised steps on the right answers. Returns the teacher's mean probability of them.
fn save_models(student: &Path, teacher: &Path) -> f64 {
    tch::manual_seed(7);
    let mut model = PolicyModel::new(model_config(true), Placement::default(), false).unwrap();
    model.save(student, None).unwrap();
    let data: Vec<SftSequence> = (0..PROMPTS)
        .map(|k| {
            let mut ids = prompt(k);
            ids.push(target(k));
            SftSequence {
                trained: vec![false, false, false, true],
                ids,
            }
        })
        .collect();
    let config = SftConfig {
        steps: 60,
        batch_size: 4,
        learning_rate: 1e-2,
        warmup_steps: 0,
        max_len: 8,
        ..Default::default()
    };
    train_sft(&mut model, &data, &config, |_, _| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    model.save(teacher, None).unwrap();
    let p: f64 = (0..PROMPTS)
        .map(|k| {
            let ids: Vec<i64> = prompt(k).iter().map(|&i| i64::from(i)).collect();
            let ids = tch::Tensor::from_slice(&ids).view([1, 3]);
            let mask = ids.ones_like().to_kind(tch::Kind::Bool);
            let logits = tch::no_grad(|| model.logits(&model.forward_right_padded(&ids, &mask)));
            logits
                .get(0)
                .get(2)
                .softmax(-1, tch::Kind::Float)
                .double_value(&[target(k) as i64])
        })
        .sum::<f64>()
        / PROMPTS as f64;
    p
}

/// A trajectory of one model turn on prompt `k`, rewarded `reward`.
fn answer(id: u64, group: u64, k: u32, reward: f64, action: Step) -> Trajectory {
    trajectory(id, group, k, vec![action], reward)
}

/// The step of `action_ids` sampled with `logprobs` by `version`, right after the prompt.
fn step(action_ids: Vec<u32>, logprobs: Vec<f32>, version: u64) -> Step {
    Step {
        context_len: 3,
        action_ids,
        logprobs,
        policy_version: version,
        token_versions: vec![],
        finish_reason: FinishReason::Length,
        tool_calls: vec![],
        observation_ids: vec![],
        reward: 0.0,
        generate_seconds: 0.0,
        tool_seconds: 0.0,
        prefill_tokens: 0,
        rebuilt: None,
    }
}

/// One single-token answer; the trajectory's reward is 0 whatever the answer (distillation
/// alone must not need it), and whether it was right is returned beside it.
async fn episode(engine: &EngineHandle, id: u64, group: u64, k: u32) -> (Trajectory, bool) {
    let turn = engine
        .generate(TurnRequest {
            episode: id,
            context: prompt(k),
            params: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 1,
                ..Default::default()
            },
            stop_strings: vec![],
        })
        .await
        .unwrap();
    engine.release(id);
    let right = turn.token_ids.first() == Some(&target(k));
    let action = step(turn.token_ids, turn.logprobs, turn.policy_version);
    (answer(id, group, k, 0.0, action), right)
}

#[test]
fn distillation_alone_takes_the_student_to_the_teachers_answers_without_a_reward() {
    let tmp = tempfile::tempdir().unwrap();
    let (student_dir, teacher_dir) = (tmp.path().join("student"), tmp.path().join("teacher"));
    let teacher_p = save_models(&student_dir, &teacher_dir);
    assert!(
        teacher_p > 0.9,
        "the teacher should know the answers: mean p = {teacher_p}"
    );
    let engine = testing::start_engine(
        {
            let dir = student_dir.clone();
            move || PolicyModel::load(&dir, Placement::default(), false)
        },
        None,
        EngineConfig {
            max_batch_rows: 64,
            max_context: 16,
            seed: 3,
            ..testing::engine_config()
        },
    )
    .unwrap();
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            kl: KlConfig::OFF,
            // At 1e-2 a prompt whose student collapsed onto a wrong answer can stay there for
            // tens of updates (sampled reverse KL gives a token of probability ~1 no gradient);
            // at 5e-3 sixteen seeds of engine and learner all reached the teacher by update 40.
            actor_lr: 5e-3,
            mini_batch_size: 16,
            entropy_coef: 0.0,
            critic_warmup_updates: 0,
            filter_zero_variance_groups: true,
            ..Default::default()
        },
        max_len: 16,
        seed: 5,
        distill: Some(DistillConfig {
            teacher: teacher_dir.clone(),
            coef: 1.0,
            combine: DistillCombine::Alone,
        }),
        ..testing::learner_config()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load = move || {
        Ok(LearnerModels {
            policy: PolicyModel::load(&student_dir, Placement::default(), false)?,
            critic: None,
            reference: None,
            teacher: Some(PolicyModel::load(
                &teacher_dir,
                Placement::default(),
                false,
            )?),
            critic_prefix: None,
        })
    };
    let learner = rt
        .block_on(LearnerRef::spawn(LearnerStart::new(load, config)))
        .unwrap();
    let next_id = AtomicU64::new(0);
    let (mut right, mut kls) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for u in 0..UPDATES {
            let futures: Vec<_> = (0..PROMPTS)
                .flat_map(|k| (0..GROUP).map(move |_| k))
                .map(|k| {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    episode(&engine, id, u as u64 * PROMPTS as u64 + k as u64, k)
                })
                .collect();
            let (batch, hits): (Vec<_>, Vec<_>) =
                futures::future::join_all(futures).await.into_iter().unzip();
            right.push(hits.iter().filter(|&&h| h).count() as f64 / hits.len() as f64);
            let stats = learner.update(batch).await.unwrap();
            assert_eq!(stats.skipped_steps, 0, "{stats:?}");
            // Every reward is 0: with the zero-variance filter on, only distillation alone
            // keeps the groups.
            assert_eq!(stats.trajectories_kept, stats.trajectories, "{stats:?}");
            let d = stats.distill.expect("distillation statistics every update");
            assert!(d.reverse_kl.is_finite() && d.teacher_tokens_per_second > 0.0);
            kls.push(d.reverse_kl);
            eprintln!(
                "update {u:2}: right {:.3} reverse KL {:+.4} teacher {:.0} tokens/s",
                right[u], d.reverse_kl, d.teacher_tokens_per_second
            );
            learner.publish(&engine).await.unwrap();
        }
    });
    engine.shutdown();
    learner.shutdown();
    let n = right.len();
    let last: f64 = right[n - 3..].iter().sum::<f64>() / 3.0;
    assert!(right[0] < 0.5, "the student starts near chance: {right:?}");
    assert!(
        last >= 0.85,
        "distillation alone should bring the student to the teacher's answers: {right:?}"
    );
    let first_kl: f64 = kls[..3].iter().sum::<f64>() / 3.0;
    let last_kl: f64 = kls[n - 3..].iter().sum::<f64>() / 3.0;
    assert!(
        last_kl < first_kl / 4.0,
        "the reverse KL to the teacher should fall: {kls:?}"
    );
}

/// A batch of `n` two-token answers with made-up sampling log-probabilities and rewards that
/// differ within each group of 4.
fn fixed_batch(n: u64) -> Vec<Trajectory> {
    (0..n)
        .map(|i| {
            let k = (i % u64::from(PROMPTS)) as u32;
            let action = step(vec![8 + ((i * 7) % 8) as u32, 3], vec![-2.5, -2.0], 0);
            answer(i, i / 4, k, (i % 3) as f64, action)
        })
        .collect()
}

/// One update of a learner from `student`, with `[distill]` set to `distill` and the teacher
/// loaded from `teacher`: the weights after it and the update's reverse KL.
fn weights_after_update(
    student: &Path,
    teacher: Option<&Path>,
    distill: Option<DistillConfig>,
) -> (Vec<(String, tch::Tensor)>, Vec<f64>) {
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            kl: KlConfig::OFF,
            actor_lr: 1e-2,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        max_len: 16,
        seed: 5,
        distill,
        ..testing::learner_config()
    };
    let models = LearnerModels {
        policy: PolicyModel::load(student, Placement::default(), false).unwrap(),
        critic: None,
        reference: None,
        teacher: teacher.map(|t| PolicyModel::load(t, Placement::default(), false).unwrap()),
        critic_prefix: None,
    };
    let mut learner = Learner::new(models, config).unwrap();
    let stats = learner.update(fixed_batch(16)).unwrap();
    assert!(stats.policy_updated, "{stats:?}");
    let kls = stats.distill.map(|d| d.reverse_kl).into_iter().collect();
    (learner.policy_weights(), kls)
}

#[test]
fn a_teacher_equal_to_the_student_adds_nothing_to_the_reward_and_a_different_one_does() {
    let tmp = tempfile::tempdir().unwrap();
    let (student, teacher) = (tmp.path().join("student"), tmp.path().join("teacher"));
    save_models(&student, &teacher);
    let with_reward = |teacher: &Path| {
        Some(DistillConfig {
            teacher: teacher.to_path_buf(),
            coef: 0.5,
            combine: DistillCombine::WithReward,
        })
    };
    let (plain, none) = weights_after_update(&student, None, None);
    assert!(none.is_empty());
    // The student as its own teacher: the reverse KL is 0 at every token (the same code on
    // the same weights), so the update is RL's, bit for bit.
    let (same, kls) = weights_after_update(&student, Some(&student), with_reward(&student));
    assert_eq!(kls, vec![0.0], "{kls:?}");
    for ((name, a), (_, b)) in plain.iter().zip(&same) {
        assert!(
            a.equal(b),
            "{name} differs with a teacher equal to the student"
        );
    }
    // A teacher that knows the answers moves the weights elsewhere.
    let (taught, kls) = weights_after_update(&student, Some(&teacher), with_reward(&teacher));
    assert!(kls.len() == 1 && kls[0].abs() > 1e-3, "{kls:?}");
    let moved = plain
        .iter()
        .zip(&taught)
        .map(|((_, a), (_, b))| (a - b).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(moved > 1e-4, "the teacher's term changed nothing: {moved}");
}
