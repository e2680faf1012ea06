//! A tiny agent on the real engine: the built-in `tiny` model with the tiny tokenizer and
//! chat template, an engine on the CPU over it, and a rollout that collects every
//! trajectory. Shared by the tests of context policies and workflows.
#![allow(dead_code)]

use agent_r1_actors::testing;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::model::presets::preset;
use agent_r1_actors::model::SamplingParams;
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::runtime::{
    run_rollout, EnvSource, EpisodeConfig, RolloutReport, RolloutSetup, TurnRenderer, Workflow,
};
use agent_r1_actors::tiny_tokenizer::write_tiny_tokenizer;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::Trajectory;
use agent_r1_envs::task::Task;
use serde_json::Value;
use tch::Kind;

pub struct TinyAgent {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub engine: testing::TestEngine,
    pub tokenizer: Arc<HfTokenizer>,
    /// The same weights as the engine's, for plain forward passes.
    pub model: PolicyModel,
    /// The engine's longest context.
    pub max_context: usize,
}

/// A seeded tiny model and an engine of `max_batch_rows` rows and `max_context` tokens.
pub fn tiny_agent(max_batch_rows: usize, max_context: usize) -> TinyAgent {
    tiny_agent_taught(max_batch_rows, max_context, |_, _| {})
}

/// [`tiny_agent`] whose model `teach` changes (supervised steps) before the engine loads it.
pub fn tiny_agent_taught(
    max_batch_rows: usize,
    max_context: usize,
    teach: impl FnOnce(&mut PolicyModel, &Arc<HfTokenizer>),
) -> TinyAgent {
    tiny_agent_with(
        EngineConfig {
            max_batch_rows,
            max_context,
            ..testing::engine_config()
        },
        teach,
    )
}

/// [`tiny_agent`] as `train`'s `rollout.deterministic` runs it: one row, no KV reuse, so
/// every turn is a prefill of its whole context and no token's arithmetic depends on
/// another's.
pub fn tiny_agent_deterministic(max_context: usize) -> TinyAgent {
    tiny_agent_with(
        EngineConfig {
            max_batch_rows: 1,
            max_context,
            kv_reuse: false,
            ..testing::engine_config()
        },
        |_, _| {},
    )
}

/// A seeded tiny model, changed by `teach`, on an engine of `config`.
pub fn tiny_agent_with(
    config: EngineConfig,
    teach: impl FnOnce(&mut PolicyModel, &Arc<HfTokenizer>),
) -> TinyAgent {
    let max_context = config.max_context;
    let dir = tempfile::tempdir().unwrap();
    let ids = write_tiny_tokenizer(dir.path(), None, 512, &[]).unwrap();
    tch::manual_seed(0);
    let mut model = PolicyModel::new(
        preset("tiny", ids.vocab_size, ids.eos_token_ids).unwrap(),
        Placement::default(),
        false,
    )
    .unwrap();
    teach(
        &mut model,
        &Arc::new(HfTokenizer::from_dir(dir.path()).unwrap()),
    );
    model.save(dir.path(), None).unwrap();
    let path = dir.path().to_path_buf();
    let load = path.clone();
    let engine = testing::start_engine(
        move || PolicyModel::load(&load, Placement::default(), false),
        None,
        config,
    )
    .unwrap();
    let tokenizer = Arc::new(HfTokenizer::from_dir(dir.path()).unwrap());
    let model = PolicyModel::load(dir.path(), Placement::default(), false).unwrap();
    TinyAgent {
        _dir: dir,
        path,
        engine,
        tokenizer,
        model,
        max_context,
    }
}

impl TinyAgent {
    /// The id that ends an assistant turn in the tiny chat template.
    pub fn end_of_turn(&self) -> u32 {
        TurnRenderer::new(self.tokenizer.clone(), vec![], None)
            .unwrap()
            .end_of_turn_id()
    }

    /// A rollout of `workflow` on this agent's engine: `concurrency` episodes at once, each
    /// turn sampled at `temperature` up to `max_new_tokens` (stopping at the end of a turn).
    pub fn workflow_setup(
        &self,
        workflow: Arc<dyn Workflow>,
        temperature: f64,
        max_new_tokens: usize,
        concurrency: usize,
    ) -> RolloutSetup {
        let renderer = Arc::new(TurnRenderer::new(self.tokenizer.clone(), vec![], None).unwrap());
        RolloutSetup {
            engine: self.engine.clone().into(),
            env: EnvSource::Workflow {
                workflow,
                tool_names: vec![],
            },
            tools: vec![],
            context_policy: Arc::new(agent_r1_actors::runtime::context_policy::Full),
            episode: EpisodeConfig {
                max_context: self.max_context,
                sampling: SamplingParams {
                    temperature,
                    max_new_tokens,
                    stop_token_ids: vec![renderer.end_of_turn_id()],
                    ..Default::default()
                },
                workflow_timeout: Duration::from_secs(3600),
                ..testing::episode_config()
            },
            renderer,
            concurrency,
            tool_queue_capacity: 8,
            restart: Default::default(),
            validate: Arc::new(|_, _| Ok(())),
            live: Default::default(),
            stall: None,
            calls: Default::default(),
            in_flight: Default::default(),
        }
    }
}

/// A task asking about `id`.
pub fn task(id: String) -> Task {
    Task {
        question: format!("What is {id}?"),
        id,
        data_source: "test".into(),
        answers: vec![],
        prompt: None,
        extra: Value::Null,
    }
}

/// Runs `tasks` through one rollout of `setup` and collects the trajectories.
pub fn collect(setup: RolloutSetup, tasks: Vec<(Task, u64)>) -> (RolloutReport, Vec<Trajectory>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let collector = tokio::spawn(async move {
            let mut out = Vec::new();
            while let Some(t) = rx.recv().await {
                out.push(t);
            }
            out
        });
        let report = tokio::time::timeout(Duration::from_secs(600), run_rollout(setup, tasks, tx))
            .await
            .expect("rollout must not hang")
            .unwrap();
        (report, collector.await.unwrap())
    })
}

/// Asserts that every recorded log-probability of `t` equals a plain forward pass of `model`
/// over the step's own context and action, within 1e-5 (float32 on the CPU).
pub fn assert_logprobs_match_forward(model: &PolicyModel, t: &Trajectory) {
    for (k, (s, context)) in t.steps.iter().zip(t.contexts()).enumerate() {
        assert_eq!(context.len(), s.context_len);
        let mut ids = context.clone();
        ids.extend(&s.action_ids);
        let lp = model
            .sequence_logits(&ids)
            .unwrap()
            .log_softmax(-1, Kind::Float);
        for (j, (&tok, &stored)) in s.action_ids.iter().zip(&s.logprobs).enumerate() {
            let v = lp.double_value(&[(context.len() + j - 1) as i64, tok as i64]);
            assert!(
                (v - stored as f64).abs() < 1e-5,
                "episode {} step {k} token {j}: forward {v}, engine {stored}",
                t.episode_id
            );
        }
    }
}
