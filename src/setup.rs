//! Building what a command runs on: env, tools, tasks, engine and rollout settings.
//!
//! The commands share this so that `demo`, `rollout` and `bench rollout` run the very same
//! episode path (engine, actors, tools, env scoring).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::engine::{spawn_engine, EngineConfig, EngineHandle};
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::{ArgValidator, EpisodeConfig, RolloutSetup, TurnRenderer};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::env::Env;
use agent_r1_envs::envs::synthetic_multihop::{SyntheticMultihopEnv, SyntheticMultihopOptions};
use agent_r1_envs::synthetic::{Split, SyntheticConfig};
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::search::{CorpusSource, SearchConfig, SearchTool};
use anyhow::Context;

/// The synthetic multi-hop world with its BM25 search tool over the world's corpus.
pub(crate) struct SyntheticScenario {
    pub(crate) env: Arc<SyntheticMultihopEnv>,
    pub(crate) search: Arc<SearchTool>,
    pub(crate) train: Vec<Task>,
    pub(crate) test: Vec<Task>,
}

/// Generates the world (writing its corpus and search index under `dir`).
pub(crate) fn synthetic(
    dir: &Path,
    world: SyntheticConfig,
    top_k: usize,
) -> anyhow::Result<SyntheticScenario> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let corpus = dir.join("corpus.jsonl");
    let env = SyntheticMultihopEnv::new(SyntheticMultihopOptions {
        world,
        corpus_path: Some(corpus.clone()),
        ..Default::default()
    })?;
    let search = SearchTool::open(SearchConfig {
        corpus: CorpusSource::Jsonl(corpus),
        index_dir: Some(dir.join("search-index")),
        top_k,
        ..Default::default()
    })?;
    Ok(SyntheticScenario {
        train: env.tasks(Split::Train),
        test: env.tasks(Split::Test),
        env: Arc::new(env),
        search: Arc::new(search),
    })
}

/// Starts the engine on a model directory.
pub(crate) fn engine(
    model: &Path,
    placement: Placement,
    config: EngineConfig,
) -> anyhow::Result<EngineHandle> {
    let dir: PathBuf = model.to_path_buf();
    let (handle, _join) = spawn_engine(
        move || PolicyModel::load(&dir, placement, false),
        None,
        config,
    )
    .with_context(|| format!("starting the engine on {}", model.display()))?;
    Ok(handle)
}

/// Rollout settings shared by the commands.
pub(crate) struct RolloutKnobs {
    pub(crate) concurrency: usize,
    pub(crate) max_turns: usize,
    pub(crate) max_context: usize,
    pub(crate) max_new_tokens: usize,
    pub(crate) temperature: f64,
}

/// A rollout setup over `env` and `tools` with the model's chat template.
pub(crate) fn rollout_setup(
    engine: EngineHandle,
    tokenizer: Arc<HfTokenizer>,
    env: Arc<dyn Env>,
    tools: Vec<Arc<dyn Tool>>,
    knobs: &RolloutKnobs,
) -> anyhow::Result<RolloutSetup> {
    let specs = tools.iter().map(|t| t.spec()).collect();
    let renderer = Arc::new(TurnRenderer::new(tokenizer.clone(), specs)?);
    let mut stops = vec![renderer.end_of_turn_id()];
    stops.extend(tokenizer.tool_call_stop_ids());
    stops.extend(tokenizer.eos_token_ids());
    stops.sort_unstable();
    stops.dedup();
    let validate: ArgValidator = Arc::new(|tool: &dyn Tool, args: &serde_json::Value| {
        agent_r1_envs::schema::validate_arguments(&tool.parameters(), args)
    });
    Ok(RolloutSetup {
        engine,
        env,
        tools,
        renderer,
        episode: EpisodeConfig {
            max_turns: knobs.max_turns,
            max_context: knobs.max_context,
            sampling: SamplingParams {
                temperature: knobs.temperature,
                max_new_tokens: knobs.max_new_tokens,
                stop_token_ids: stops,
                ..Default::default()
            },
            stop_strings: vec![],
            generate_timeout: Duration::from_secs(1800),
            tool_queue_timeout: Duration::from_secs(60),
        },
        concurrency: knobs.concurrency,
        tool_queue_capacity: 4 * knobs.concurrency.max(16),
        restart: Default::default(),
        validate,
    })
}
