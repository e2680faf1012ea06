//! The run's scenario: its config resolved, and the line that describes it.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value};

use agent_r1_actors::runtime::{ContextPolicy, EnvSource};
use agent_r1_envs::dataset::load_many;
use agent_r1_envs::env::Env;
use agent_r1_envs::envs::synthetic_multihop;
use agent_r1_envs::generated_env::GeneratedEnv;
use agent_r1_envs::reward::ScoredEnv;
use agent_r1_envs::task::{Split, Task};
use agent_r1_envs::tool::Tool;

use crate::config::TrainConfig;
use crate::registries::Registries;

/// The env, its tools and its tasks.
pub struct Scenario {
    /// The env named by `[env]`, or the workflow it names.
    pub env: EnvSource,
    /// The same env when it generates its own tasks (and so can make a tokenizer's text and
    /// demonstrations).
    pub generated: Option<Arc<dyn GeneratedEnv>>,
    /// The `[tools.NAME]` tools.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Training tasks.
    pub train: Vec<Task>,
    /// Held-out tasks.
    pub test: Vec<Task>,
    /// What each turn sees of the history (`[env.context]`).
    pub context_policy: Arc<dyn ContextPolicy>,
}

/// Builds the env named by the config, its tools and its task splits. The synthetic world's
/// corpus is written under `RUN/world/`, and the `search` tool is pointed at it (and its
/// index kept there) unless the config names a corpus itself. `agent-r1 eval` builds its
/// env the same way, from a checkpoint's saved config. Envs that read tool calls get the
/// model's tool-call format unless `[env.options]` names one.
pub fn scenario(
    cfg: &TrainConfig,
    run_dir: &Path,
    registries: &Registries,
) -> anyhow::Result<Scenario> {
    let world_dir = run_dir.join("world");
    std::fs::create_dir_all(&world_dir)
        .with_context(|| format!("{}: cannot create", world_dir.display()))?;
    let corpus = world_dir.join("corpus.jsonl");
    let mut options = cfg.run_env_options(registries);
    let (env, generated, train, test): (EnvSource, _, _, _) =
        if registries.workflows.contains(&cfg.env.name) {
            let workflow = registries
                .workflows
                .create(&cfg.env.name, &options)
                .context("building the workflow `[env]`")?;
            let train = load_many(&cfg.env.train_files, &cfg.env.dataset)
                .context("reading env.train_files")?;
            let test = load_many(&cfg.env.test_files, &cfg.env.dataset)
                .context("reading env.test_files")?;
            // A workflow may call any configured tool.
            let tool_names = vec![];
            (
                EnvSource::Workflow {
                    workflow,
                    tool_names,
                },
                None,
                train,
                test,
            )
        } else if registries.envs.generates_tasks(&cfg.env.name) {
            if let (true, Value::Object(map)) =
                (cfg.env.name == synthetic_multihop::NAME, &mut options)
            {
                map.insert("corpus_path".into(), json!(corpus));
            }
            let env: Arc<dyn GeneratedEnv> = Arc::from(
                registries
                    .envs
                    .create_generated(&cfg.env.name, &options)
                    .context("building the env `[env]`")?,
            );
            let (train, test) = (env.tasks(Split::Train), env.tasks(Split::Test));
            let shared: Arc<dyn Env> = env.clone();
            (shared.into(), Some(env), train, test)
        } else {
            let env: Arc<dyn Env> = Arc::from(
                registries
                    .envs
                    .create(&cfg.env.name, &options)
                    .context("building the env `[env]`")?,
            );
            let train = load_many(&cfg.env.train_files, &cfg.env.dataset)
                .context("reading env.train_files")?;
            let test = load_many(&cfg.env.test_files, &cfg.env.dataset)
                .context("reading env.test_files")?;
            (env.into(), None, train, test)
        };
    anyhow::ensure!(
        !train.is_empty(),
        "the env has no training tasks (env.train_files / env.world)"
    );
    let (env, train, test) = match (env, cfg.env.workflow.is_empty()) {
        (EnvSource::Shared(env), false) => driven_by_workflow(cfg, registries, env, train, test)?,
        (env, _) => (env, train, test),
    };
    let tools = cfg
        .tools_config(Some(&world_dir))
        .build_all(&registries.tools)
        .context("building the tools `[tools.*]`")?;
    let env = match (cfg.scorer_options()?, env) {
        (None, env) => env,
        (Some((kind, options)), EnvSource::Shared(env)) => {
            let scorer = registries
                .scorers
                .create(&kind, &options)
                .context("building the scorer `[scorer]`")?;
            EnvSource::Shared(Arc::new(ScoredEnv::new(env, scorer)))
        }
        (Some(_), _) => {
            anyhow::bail!("[scorer]: a workflow returns its own rewards; remove the [scorer] table")
        }
    };
    let context_policy = cfg
        .env
        .context_policy(registries)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Scenario {
        env,
        generated,
        tools,
        train,
        test,
        context_policy,
    })
}

/// `[env.workflow]`: the env's tasks, each carrying the env's first messages as its
/// `prompt`, run by the workflow it names, which may call the env's tools. A workflow that
/// serves tool results (`max_observation_chars` among its options) cuts them at the env's
/// limit unless its table sets one.
fn driven_by_workflow(
    cfg: &TrainConfig,
    registries: &Registries,
    env: Arc<dyn Env>,
    train: Vec<Task>,
    test: Vec<Task>,
) -> anyhow::Result<(EnvSource, Vec<Task>, Vec<Task>)> {
    const OBSERVATION_CHARS: &str = "max_observation_chars";
    let name = cfg
        .env
        .workflow_name()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut options = cfg.env.workflow_options_json();
    let serves_tools = registries
        .workflows
        .keys(name)
        .iter()
        .any(|k| k.key == OBSERVATION_CHARS);
    if let (true, Value::Object(map)) = (serves_tools, &mut options) {
        map.entry(OBSERVATION_CHARS)
            .or_insert_with(|| json!(env.max_observation_chars()));
    }
    let workflow = registries
        .workflows
        .create(name, &options)
        .context("building the workflow `[env.workflow]`")?;
    let with_prompt = |tasks: Vec<Task>| -> anyhow::Result<Vec<Task>> {
        tasks
            .into_iter()
            .map(|mut task| {
                let first = env
                    .reset(&task)
                    .with_context(|| format!("task {:?}: the env's first messages", task.id))?;
                task.prompt = Some(first);
                Ok(task)
            })
            .collect()
    };
    let (train, test) = (with_prompt(train)?, with_prompt(test)?);
    let source = EnvSource::Workflow {
        workflow,
        tool_names: env.tool_names(),
    };
    Ok((source, train, test))
}

pub(super) fn log_scenario(cfg: &TrainConfig, scenario: &Scenario) {
    eprintln!(
        "env {}: {} train / {} test tasks; tools: {}",
        cfg.env.name,
        scenario.train.len(),
        scenario.test.len(),
        scenario
            .tools
            .iter()
            .map(|t| t.name().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if scenario.test.is_empty() && cfg.eval.every > 0 {
        eprintln!(
            "warning: no held-out tasks (env.test_files is empty): nothing will be evaluated, \
             so the run reports no held-out EM"
        );
    }
}
