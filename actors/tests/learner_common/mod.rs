//! Shared pieces of the learner tests: a tiny random model saved as an HF directory, a
//! learner thread over it, and hand-made trajectories.
//!
//! Each test binary uses a different subset, so unused helpers are allowed here.
#![allow(dead_code)]

use std::path::Path;

use agent_r1_actors::learner::{
    LearnerConfig, LearnerModels, LearnerRef, LearnerStart, PolicyWeights, Reference,
};
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel};
use agent_r1_actors::trajectory::{EpisodeEnd, Step, Trajectory};
use agent_r1_envs::task::Task;

pub const VOCAB: i64 = 16;

pub fn model_config() -> ModelConfig {
    ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap()
}

/// libtorch's CPU generator is process-wide and tests run on parallel threads: seeding and
/// initialising under one lock keeps each test's weights fixed.
pub static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes a seeded random policy (no value head) to `dir`.
pub fn save_policy(dir: &Path, seed: i64) {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    let model = PolicyModel::new(model_config(), Placement::default(), false).unwrap();
    model.save(dir, None).unwrap();
}

/// A supervised learner over the policy in `dir` (as production starts it): with a value
/// head on the trunk when `value_head`, and the same weights as a frozen reference when
/// `reference`.
pub async fn start_learner(
    dir: &Path,
    config: LearnerConfig,
    value_head: bool,
    reference: bool,
) -> LearnerRef {
    LearnerRef::spawn(LearnerStart::new(
        load_models(dir, value_head, reference),
        config,
    ))
    .await
    .unwrap()
}

/// [`start_learner`] for a test outside async code: the learner's actors run on a runtime of
/// their own, which lives as long as the learner; calls may be awaited on any runtime.
pub fn learner(
    dir: &Path,
    config: LearnerConfig,
    value_head: bool,
    reference: bool,
) -> TestLearner {
    let rt = runtime();
    let learner = rt.block_on(start_learner(dir, config, value_head, reference));
    TestLearner { learner, _rt: rt }
}

/// A learner and the runtime its actors run on.
pub struct TestLearner {
    learner: LearnerRef,
    _rt: tokio::runtime::Runtime,
}

impl std::ops::Deref for TestLearner {
    type Target = LearnerRef;
    fn deref(&self) -> &LearnerRef {
        &self.learner
    }
}

/// Loads the policy in `dir` (with a value head on the trunk when `value_head`) and, when
/// `reference`, the same weights as a frozen reference.
pub fn load_models(
    dir: &Path,
    value_head: bool,
    reference: bool,
) -> impl FnOnce() -> agent_r1_actors::Result<LearnerModels> + Send + 'static {
    let dir = dir.to_path_buf();
    move || {
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(11);
        let policy = PolicyModel::load(&dir, Placement::default(), value_head)?;
        let reference = if reference {
            Some(Reference::Model(Box::new(PolicyModel::load(
                &dir,
                Placement::default(),
                false,
            )?)))
        } else {
            None
        };
        Ok(LearnerModels {
            policy,
            critic: None,
            reference,
            teacher: None,
            critic_prefix: None,
        })
    }
}

/// One step of a hand-made trajectory: sampled ids, their log-probabilities, the ids the
/// "env" appended, and the version that sampled them.
pub struct TestStep {
    pub actions: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub observation: Vec<u32>,
    pub version: u64,
}

impl TestStep {
    /// `n` action tokens with plausible log-probabilities (about ln 1/16) and one
    /// observation token, sampled by `version`.
    pub fn plain(first: u32, n: usize, version: u64) -> Self {
        Self {
            actions: (0..n as u32).map(|i| (first + i) % VOCAB as u32).collect(),
            logprobs: (0..n).map(|i| -2.5 - 0.05 * i as f32).collect(),
            observation: vec![3],
            version,
        }
    }
}

pub fn trajectory(
    episode_id: u64,
    group_id: u64,
    prompt: &[u32],
    steps: Vec<TestStep>,
    reward: f64,
) -> Trajectory {
    let mut context_len = prompt.len();
    let steps = steps
        .into_iter()
        .map(|s| {
            let step = Step {
                context_len,
                action_ids: s.actions,
                logprobs: s.logprobs,
                policy_version: s.version,
                token_versions: vec![],
                finish_reason: FinishReason::Length,
                tool_calls: vec![],
                observation_ids: s.observation,
                reward: 0.0,
                generate_seconds: 0.0,
                tool_seconds: 0.0,
                prefill_tokens: 0,
                rebuilt: None,
            };
            context_len += step.action_ids.len() + step.observation_ids.len();
            step
        })
        .collect();
    Trajectory {
        episode_id,
        group_id,
        task: Task {
            id: format!("t{episode_id}"),
            data_source: "test".into(),
            question: String::new(),
            answers: vec![],
            prompt: None,
            extra: serde_json::Value::Null,
        },
        prompt_ids: prompt.to_vec(),
        steps,
        reward,
        metrics: Default::default(),
        end: EpisodeEnd::Completed {
            reason: "done".into(),
        },
        attempts: 1,
        wall_seconds: 0.0,
    }
}

/// A group of `n` two-step trajectories with ids `first_id..`, rewards alternating 1, 0 (so
/// group estimators see signal), every token sampled by `version`.
pub fn group(first_id: u64, group_id: u64, n: usize, version: u64) -> Vec<Trajectory> {
    (0..n as u64)
        .map(|i| {
            let id = first_id + i;
            trajectory(
                id,
                group_id,
                &[1, 2, 4 + (group_id % 4) as u32],
                vec![
                    TestStep::plain(5 + i as u32, 4, version),
                    TestStep::plain(9 + i as u32, 3, version),
                ],
                if i % 2 == 0 { 1.0 } else { 0.0 },
            )
        })
        .collect()
}

/// Whether two weight snapshots hold exactly the same tensors.
pub fn same_weights(a: &PolicyWeights, b: &PolicyWeights) -> bool {
    a.tensors.len() == b.tensors.len()
        && a.tensors
            .iter()
            .zip(&b.tensors)
            .all(|((na, ta), (nb, tb))| na == nb && ta.equal(tb))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
