//! Building what a command runs on: env, tools, tasks, engine and rollout settings.
//!
//! The commands share this so that `demo`, `rollout`, `bench rollout` and `train` run the
//! very same episode path (engine, actors, tools, env scoring). It lives in the library so
//! that the training loop ([`crate::train`]) builds its run from the same pieces.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::chat_template::{ChatTemplate, TemplateVars, QWEN2_5_CHAT_TEMPLATE};
use agent_r1_actors::engine::{
    start_supervised, EngineConfig, EngineFaults, EngineHandle, EngineRestartPolicy,
};
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::model::lora::AdapterSource;
use agent_r1_actors::model::presets::{preset, shape, PRESETS};
use agent_r1_actors::model::{write_config, ModelConfig, Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::context_policy::Full;
use agent_r1_actors::runtime::{
    ArgValidator, ContextPolicy, EnvSource, EpisodeConfig, RolloutSetup, TurnRenderer,
};
use agent_r1_actors::sft::{
    sequences_under_policy, tokenize_demonstration, train_sft, Demonstration, SftConfig, SftReport,
};
use agent_r1_actors::tiny_tokenizer::{write_tiny_tokenizer, write_tokenizer, TinyTokenizerIds};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::demo::DemoConfig;
use agent_r1_envs::envs::synthetic_multihop::{SyntheticMultihopEnv, SyntheticMultihopOptions};
use agent_r1_envs::generated_env::GeneratedEnv;
use agent_r1_envs::synthetic::{Split, SyntheticConfig};
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::Tool;
use agent_r1_envs::tool_call::ToolCallFormat;
use agent_r1_envs::tools::search::{CorpusSource, SearchConfig, SearchTool};
use anyhow::Context;
use tch::Kind;

/// The synthetic multi-hop world with its BM25 search tool over the world's corpus.
pub struct SyntheticScenario {
    pub env: Arc<SyntheticMultihopEnv>,
    pub search: Arc<SearchTool>,
    pub train: Vec<Task>,
    pub test: Vec<Task>,
}

/// What a preset model's tokenizer is trained on.
#[derive(Debug, Clone, Default)]
pub struct TokenizerCorpus {
    /// Training text, one piece per line.
    pub text: String,
    /// Words kept as single tokens (see `train_tiny_tokenizer`).
    pub whole_words: Vec<String>,
}

/// The tokenizer corpus of a generated env: its own text (documents, problems,
/// demonstrations), every training prompt as the chat template renders it (system prompt,
/// tool list `specs` when the run shows one, question), and its whole words. Why the prompts:
/// they are in every context the model sees, and a tokenizer that never saw them splits them
/// into near-single characters, which doubles context lengths and pushes the question far
/// from where the model answers.
pub fn tokenizer_corpus(
    env: &dyn GeneratedEnv,
    tasks: &[Task],
    specs: &[serde_json::Value],
) -> anyhow::Result<TokenizerCorpus> {
    let template = ChatTemplate::new(QWEN2_5_CHAT_TEMPLATE)?;
    let specs = (!specs.is_empty()).then_some(specs);
    let mut text = env.tokenizer_text();
    for task in tasks {
        let prompt = template.render(&env.reset(task)?, specs, true, &TemplateVars::new())?;
        text.push_str(&prompt);
        text.push('\n');
    }
    Ok(TokenizerCorpus {
        text,
        whole_words: env.whole_words(),
    })
}

/// Generates the world (writing its corpus and search index under `dir`).
pub fn synthetic(
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

/// Starts the engine on a model directory, under its actor on `rt`: a crashed engine thread
/// is replaced on a fresh load of the same directory ([`start_supervised`]). `faults`: a
/// fault-injection plan (`train`'s `--inject-*` flags); `None` otherwise.
pub fn engine(
    rt: &tokio::runtime::Handle,
    model: &Path,
    adapter: Option<&AdapterSource>,
    placement: Placement,
    config: EngineConfig,
    faults: Option<EngineFaults>,
) -> anyhow::Result<EngineHandle> {
    let dir: PathBuf = model.to_path_buf();
    let adapter = adapter.cloned();
    let load =
        Arc::new(move || PolicyModel::load_adapted(&dir, placement, false, adapter.as_ref()));
    let planned = config.memory_fraction.is_some();
    let config_graphs = config.cuda_graphs;
    let (handle, _actor) = rt
        .block_on(start_supervised(
            load,
            None,
            config,
            EngineRestartPolicy::default(),
            faults,
        ))
        .with_context(|| format!("starting the engine on {}", model.display()))?;
    if planned || placement.device.is_cuda() {
        let stats = rt.block_on(handle.stats())?;
        if let Some(share) = stats.memory_plan {
            eprintln!("engine memory on {:?}: {share}", placement.device);
        }
        if placement.device.is_cuda() {
            match (config_graphs, stats.cuda_graphs_off) {
                (false, _) => eprintln!(
                    "engine on {:?}: CUDA graphs off (configured)",
                    placement.device
                ),
                (true, Some(why)) => {
                    eprintln!("engine on {:?}: CUDA graphs off: {why}", placement.device)
                }
                (true, None) => eprintln!(
                    "engine on {:?}: decode steps replay CUDA graphs",
                    placement.device
                ),
            }
        }
    }
    Ok(handle)
}

/// The async runtime the episode, tool and env actors run on.
///
/// Its threads are `SCHED_BATCH` on Linux: a woken batch thread does not preempt a running
/// one, so when a finished turn wakes its episode, the episode's work (parsing, searching,
/// tokenising the observation) waits for a free core instead of preempting the engine
/// thread between forward passes, where every preempted microsecond delays all rows of the
/// batch. Measured on 2 cores at 1024 episodes: replying to a finished turn took about 250 us
/// of the engine thread's time before, and finishing turns fell from 2.1 s to 0.7 s per 42 s
/// run with it. The episodes still get their fair share of CPU time; only wake-up preemption
/// changes.
pub fn actor_runtime() -> anyhow::Result<ActorRuntime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(batch_scheduling)
        .build()
        .map(|rt| ActorRuntime(Some(rt)))
        .context("starting the async runtime")
}

/// How long a command's end waits for the runtime's blocking work.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

/// The actor runtime of a command. Dropped on any return (an error included), it waits at
/// most `RUNTIME_SHUTDOWN` for blocking work: a plain runtime's drop waits for good, and a
/// hung env or tool call of an episode that already timed out would keep the process alive,
/// with its signal handling gone.
pub struct ActorRuntime(Option<tokio::runtime::Runtime>);

impl ActorRuntime {
    /// Shuts down now, waiting at most `limit` for blocking work.
    pub fn shutdown_timeout(mut self, limit: Duration) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_timeout(limit);
        }
    }
}

impl std::ops::Deref for ActorRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the runtime lives until dropped")
    }
}

impl Drop for ActorRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_timeout(RUNTIME_SHUTDOWN);
        }
    }
}

#[cfg(target_os = "linux")]
fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for SCHED_BATCH.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        // Unprivileged processes may always switch to SCHED_BATCH, so this is unexpected,
        // and harmless: the thread keeps the normal policy.
        tracing::debug!("SCHED_BATCH refused: {}", std::io::Error::last_os_error());
    }
}

#[cfg(not(target_os = "linux"))]
fn batch_scheduling() {}

/// Rollout settings shared by the commands.
#[derive(Debug, Clone, Copy)]
pub struct RolloutKnobs {
    pub concurrency: usize,
    pub max_turns: usize,
    pub max_context: usize,
    /// Longest prompt (`rollout.max_prompt_length`; `None`: only `max_context`).
    pub max_prompt: Option<usize>,
    pub max_new_tokens: usize,
    pub temperature: f64,
    /// The model's tool-call format (`None`: what its chat template teaches).
    pub tool_call_format: Option<ToolCallFormat>,
    /// Tool calls a turn may make (`env.max_tool_calls_per_turn`).
    pub max_tool_calls_per_turn: usize,
    /// Nucleus sampling's probability mass (`rollout.top_p`; 1 keeps every token).
    pub top_p: f64,
    /// Whether the chat template is given the tools' schemas
    /// (`rollout.tool_schemas_in_prompt`).
    pub tool_schemas_in_prompt: bool,
    /// How long each part of an episode may take (`[rollout]`'s `*_timeout_secs`).
    pub waits: EpisodeWaits,
}

impl RolloutKnobs {
    /// The same settings decoding greedily (temperature 0, no nucleus cut).
    pub fn greedy(self) -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            ..self
        }
    }
}

/// How long each part of an episode may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeWaits {
    /// One generated turn, queueing included.
    pub generate: Duration,
    /// A tool call's wait in its queue, beyond the tool's own timeout.
    pub tool_queue: Duration,
    /// One env call (reset, turn decision, observation, score).
    pub env: Duration,
    /// A whole episode driven by a workflow.
    pub workflow: Duration,
}

/// A rollout setup over `env` and `tools` with the model's chat template.
pub fn rollout_setup(
    engine: impl Into<EngineSet>,
    tokenizer: Arc<HfTokenizer>,
    env: impl Into<EnvSource>,
    tools: Vec<Arc<dyn Tool>>,
    knobs: &RolloutKnobs,
) -> anyhow::Result<RolloutSetup> {
    let specs = if knobs.tool_schemas_in_prompt {
        tools.iter().map(|t| t.spec()).collect()
    } else {
        Vec::new()
    };
    let renderer = Arc::new(TurnRenderer::new(
        tokenizer.clone(),
        specs,
        knobs.tool_call_format,
    )?);
    let stops = renderer.stop_ids(knobs.max_tool_calls_per_turn);
    let validate: ArgValidator = Arc::new(|tool: &dyn Tool, args: &serde_json::Value| {
        agent_r1_envs::schema::validate_arguments(&tool.parameters(), args)
    });
    Ok(RolloutSetup {
        engine: engine.into(),
        env: env.into(),
        tools,
        renderer,
        context_policy: Arc::new(Full),
        episode: EpisodeConfig {
            max_turns: knobs.max_turns,
            max_context: knobs.max_context,
            max_prompt: knobs.max_prompt,
            sampling: SamplingParams {
                temperature: knobs.temperature,
                top_p: knobs.top_p,
                max_new_tokens: knobs.max_new_tokens,
                stop_token_ids: stops,
                ..Default::default()
            },
            stop_strings: vec![],
            generate_timeout: knobs.waits.generate,
            tool_queue_timeout: knobs.waits.tool_queue,
            env_timeout: knobs.waits.env,
            max_tool_calls_per_turn: knobs.max_tool_calls_per_turn,
            workflow_timeout: knobs.waits.workflow,
        },
        concurrency: knobs.concurrency,
        tool_queue_capacity: 4 * knobs.concurrency.max(16),
        restart: Default::default(),
        validate,
        live: Default::default(),
        stall: None,
        calls: Default::default(),
        in_flight: Default::default(),
    })
}

/// Writes the model directory and returns a one-line JSON summary.
pub fn init_model(
    preset_name: &str,
    out: &Path,
    corpus: Option<&TokenizerCorpus>,
    vocab_size: usize,
    seed: i64,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        PRESETS.contains(&preset_name),
        "--preset: unknown preset `{preset_name}` (allowed: {})",
        PRESETS.join(", ")
    );
    check_out_dir(out, force)?;
    let ids = write_tiny_tokenizer(
        out,
        corpus.map(|c| c.text.as_str()),
        vocab_size,
        corpus.map_or(&[][..], |c| &c.whole_words),
    )?;
    let config = preset(preset_name, ids.vocab_size, ids.eos_token_ids.clone())?;
    tch::manual_seed(seed);
    let model = PolicyModel::new(config, Placement::default(), false)?;
    model.save(out, None)?;
    write_generation_config(out, &ids)?;
    Ok(serde_json::json!({
        "out": out.display().to_string(),
        "preset": preset_name,
        "parameters": model.config().num_parameters(),
        "vocab_size": model.config().vocab_size,
        "tokenizer_vocab_size": ids.vocab_size,
    }))
}

/// `generation_config.json` with the tokenizer's end ids.
fn write_generation_config(out: &Path, ids: &TinyTokenizerIds) -> anyhow::Result<()> {
    let path = out.join("generation_config.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&ids.generation_config())? + "\n",
    )
    .with_context(|| format!("{}: cannot write", path.display()))
}

/// `--out` must be absent or empty unless `force`.
fn check_out_dir(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.exists() && !force {
        let non_empty = std::fs::read_dir(out)
            .with_context(|| format!("--out {}: not a readable directory", out.display()))?
            .next()
            .is_some();
        anyhow::ensure!(
            !non_empty,
            "--out {}: directory is not empty (pass --force to overwrite)",
            out.display()
        );
    }
    Ok(())
}

/// Writes a randomly initialised model of a real model's shape (see [`shape`]): its layers,
/// widths, heads, rope and exact vocabulary size, with a byte-level BPE tokenizer of that
/// vocabulary in its family's style (special tokens, chat template), weights stored as
/// `dtype`. Returns a one-line JSON summary.
pub fn init_shape(
    shape_name: &str,
    out: &Path,
    corpus: Option<&TokenizerCorpus>,
    seed: i64,
    dtype: Kind,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    let (config, ids) = write_shape_files(shape_name, out, corpus, dtype, force)?;
    tch::manual_seed(seed);
    // Built in the saved dtype where the CPU model supports it: a billion-parameter shape in
    // float32 first is twice the memory to fault in and a conversion per tensor.
    let placement = Placement {
        kind: match dtype {
            Kind::BFloat16 => Kind::BFloat16,
            _ => Kind::Float,
        },
        ..Placement::default()
    };
    let model = PolicyModel::new(config, placement, false)?;
    model.save_as(out, None, dtype)?;
    Ok(serde_json::json!({
        "out": out.display().to_string(),
        "shape": shape_name,
        "model_type": model.config().model_type,
        "parameters": model.config().num_parameters(),
        "vocab_size": model.config().vocab_size,
        "tokenizer_vocab_size": ids.vocab_size,
        "dtype": format!("{dtype:?}"),
    }))
}

/// Everything of [`init_shape`]'s directory but the weights: the tokenizer, `config.json`
/// (for weights stored as `dtype`, with the tokenizer's token ids) and
/// `generation_config.json`. Returns the model's config and the tokenizer's ids. The shape's
/// architecture, sizes and chat template can be checked from these files alone, without
/// initialising and writing gigabytes of weights.
pub fn write_shape_files(
    shape_name: &str,
    out: &Path,
    corpus: Option<&TokenizerCorpus>,
    dtype: Kind,
    force: bool,
) -> anyhow::Result<(ModelConfig, TinyTokenizerIds)> {
    let (mut config, style) = shape(shape_name)?;
    check_out_dir(out, force)?;
    let ids = write_tokenizer(
        style,
        out,
        corpus.map(|c| c.text.as_str()),
        config.vocab_size,
        corpus.map_or(&[][..], |c| &c.whole_words),
        true,
    )?;
    config.bos_token_id = ids.bos_token_id;
    config.eos_token_ids = vec![ids.eos_token_id];
    write_config(out, &config, None, dtype)?;
    write_generation_config(out, &ids)?;
    Ok((config, ids))
}

/// A finished supervised warm start.
pub struct WarmStart {
    /// The warm-started model directory (tokenizer files copied from the base); nothing is
    /// written there when the warm start was interrupted.
    pub dir: PathBuf,
    /// What the SFT loop reports (steps, first and last loss, interrupted).
    pub report: SftReport,
    /// Demonstrations trained on.
    pub demonstrations: usize,
}

/// One phase of the warm start: `steps` optimizer steps on the demonstrations `demos` makes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmStartPhase {
    /// Optimizer steps of this phase.
    pub steps: usize,
    /// Its learning rate (a fresh AdamW per phase).
    pub learning_rate: f64,
    /// Which demonstrations (their share of early wrong answers, variants per question).
    pub demos: DemoConfig,
}

/// Supervised warm start of the model in `base` on a generated env's demonstrations (their
/// tool calls run through the real `tools`, so the observations are the ones RL will see),
/// saved to `out`. Each turn is taught in the context `context` (the env's context policy)
/// will give it.
///
/// RL from a fresh model almost never samples a well-formed tool call, so nothing gets
/// rewarded; a short warm start teaches the format. The phases run in order on the same
/// model, each with its own demonstrations: the demo recipe first teaches the skills on
/// mostly gold demonstrations, then gives the policy a habit of answering before the work
/// is done, so it is imperfect on purpose and RL has something to fix. Blocking; call it
/// outside async code. `on_step` may stop it (`Break`): the report says `interrupted` and no
/// model is saved, since a part-way warm start is not a model anyone asked for.
#[allow(clippy::too_many_arguments)]
pub fn warm_start(
    env: &dyn GeneratedEnv,
    train: &[Task],
    tools: &[Arc<dyn Tool>],
    shown_specs: &[serde_json::Value],
    base: &Path,
    out: &Path,
    placement: Placement,
    sft: &SftConfig,
    phases: &[WarmStartPhase],
    context: &dyn ContextPolicy,
    mut on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> anyhow::Result<WarmStart> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the warm start's async runtime")?;
    let tokenizer = Arc::new(HfTokenizer::from_dir(base)?);
    let tasks: HashMap<&str, &Task> = train.iter().map(|t| (t.id.as_str(), t)).collect();
    let by_name: HashMap<&str, &Arc<dyn Tool>> = tools.iter().map(|t| (t.name(), t)).collect();
    // Under a policy other than `full`, each turn is taught in the context that policy
    // will give it.
    let renderer = (context.name() != "full")
        .then(|| TurnRenderer::new(tokenizer.clone(), shown_specs.to_vec(), None))
        .transpose()?;
    let mut model = PolicyModel::load(base, placement, false)?;
    let mut report: Option<SftReport> = None;
    let mut demonstrations = 0;
    for (i, phase) in phases.iter().enumerate().filter(|(_, p)| p.steps > 0) {
        let all = env.demonstrations(&phase.demos);
        let mut sequences = Vec::with_capacity(all.len());
        for demo in &all {
            let task = tasks.get(demo.task_id.as_str()).with_context(|| {
                format!(
                    "a demonstration names task {:?}, which is not a training task",
                    demo.task_id
                )
            })?;
            if let Some(missing) = demo
                .turns
                .iter()
                .filter_map(|t| t.call.as_ref())
                .find(|c| !by_name.contains_key(c.tool.as_str()))
            {
                anyhow::bail!(
                    "the warm start's demonstrations call the `{}` tool, which no [tools.{}] table defines",
                    missing.tool,
                    missing.tool
                );
            }
            let messages = demo.messages(env.reset(task)?, |call| {
                let tool = by_name[call.tool.as_str()];
                rt.block_on(tool.call(call.arguments.clone()))
                    .map(|o| o.text)
                    .unwrap_or_else(|e| format!("Error: {e}"))
            });
            match &renderer {
                None => sequences.push(tokenize_demonstration(
                    &tokenizer,
                    &Demonstration {
                        messages,
                        tools: (!shown_specs.is_empty()).then(|| shown_specs.to_vec()),
                    },
                )?),
                Some(renderer) => {
                    sequences.extend(sequences_under_policy(renderer, context, &messages)?)
                }
            }
        }
        demonstrations += sequences.len();
        let offset = report.as_ref().map_or(0, |r| r.steps);
        let config = SftConfig {
            steps: phase.steps,
            learning_rate: phase.learning_rate,
            seed: sft.seed.wrapping_add(i as u64),
            ..sft.clone()
        };
        let r = train_sft(&mut model, &sequences, &config, |step, loss| {
            on_step(offset + step, loss)
        })?;
        report = Some(match report {
            None => r,
            Some(prev) => SftReport {
                steps: prev.steps + r.steps,
                first_loss: prev.first_loss,
                last_loss: r.last_loss,
                tokens: prev.tokens + r.tokens,
                interrupted: r.interrupted,
            },
        });
        if report.as_ref().is_some_and(|r| r.interrupted) {
            break;
        }
    }
    let report = report.context("the warm start has no phase with steps > 0")?;
    if !report.interrupted {
        model.save(out, Some(base))?;
    }
    Ok(WarmStart {
        dir: out.to_path_buf(),
        report,
        demonstrations,
    })
}
