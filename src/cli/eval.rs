//! `agent-r1 eval`: held-out (or training-split) scores of a model directory or a training
//! checkpoint, through the same episode path as training's evaluation
//! ([`crate::train::evaluate_tasks`]).
//!
//! What is evaluated on comes from, in order: `--config FILE.toml`; the checkpoint's saved
//! config (so the synthetic world, env options and tools are the ones trained on); or, for
//! a plain model directory, `examples/demo.toml` (the `synthetic_multihop` default world,
//! seed 0, with `search` top 3). Rollout lengths come from the same config; `--max-turns`,
//! `--concurrency` and `--device` override it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint::{self, Checkpoint, MANIFEST};
use crate::config::{FileCheck, TrainConfig};
use crate::registries::Registries;
use crate::train::{self, records::BatchSummary};
use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::model::lora::{read_adapter_base, AdapterSource, ADAPTER_CONFIG_FILE};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::envs::synthetic_multihop;
use anyhow::Context;
use serde_json::{json, Value};

use crate::setup::{self, RolloutKnobs};

/// Flags of `agent-r1 eval`.
#[derive(Debug, clap::Args)]
pub(crate) struct EvalArgs {
    /// A Hugging Face model directory, a checkpoint `RUN/checkpoints/step-K/`, or a run
    /// directory (its newest checkpoint that verifies).
    #[arg(long)]
    model: PathBuf,
    /// A LoRA adapter of --model (PEFT's format) to evaluate with. A checkpoint whose policy
    /// is an adapter needs none: its base is the one it was trained on.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// The env (default: the checkpoint's or --config's; synthetic_multihop otherwise).
    /// Envs other than synthetic_multihop need --config (for their data files).
    #[arg(long)]
    env: Option<String>,
    /// A training config whose env, tools and rollout settings to use (instead of the
    /// checkpoint's).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Task split: train or test.
    #[arg(long, default_value = "test")]
    split: String,
    /// Questions to evaluate, from the start of the split (default: all).
    #[arg(long)]
    questions: Option<usize>,
    /// Greedy decoding (the default).
    #[arg(long, conflicts_with = "temperature")]
    greedy: bool,
    /// Sample at this temperature instead of decoding greedily (0 = greedy).
    #[arg(long)]
    temperature: Option<f64>,
    /// cpu, cuda, cuda:N or auto (default: the config's `model.device`, auto without one).
    #[arg(long)]
    device: Option<String>,
    /// Episodes running at once (default: the config's `rollout.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Most model turns per episode (default: the config's `rollout.max_turns`).
    #[arg(long)]
    max_turns: Option<usize>,
    /// Sampling seed (default: the config's `training.seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the trajectories (ids and decoded text) here, one JSON object per line.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The policy to evaluate and the config it comes with.
struct Resolved {
    policy: PathBuf,
    /// The adapter the policy runs with, if any.
    adapter: Option<AdapterSource>,
    checkpoint: Option<Checkpoint>,
    cfg: TrainConfig,
    /// Where `cfg` came from: `--config FILE`, `checkpoint`, or `default`.
    config_source: String,
}

fn check_flags(a: &EvalArgs, registries: &Registries) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.split == "train" || a.split == "test",
        "--split: `{}` (allowed: train, test)",
        a.split
    );
    anyhow::ensure!(
        a.questions != Some(0),
        "--questions must be at least 1 (leave it out for the whole split)"
    );
    anyhow::ensure!(a.concurrency != Some(0), "--concurrency must be at least 1");
    anyhow::ensure!(a.max_turns != Some(0), "--max-turns must be at least 1");
    if let Some(t) = a.temperature {
        anyhow::ensure!(
            t.is_finite() && t >= 0.0,
            "--temperature must be a finite number >= 0 (0 = greedy), got {t}"
        );
    }
    if let Some(env) = &a.env {
        let registry = &registries.envs;
        anyhow::ensure!(
            registry.contains(env),
            "--env: unknown env `{env}` (allowed: {})",
            registry.names().join(", ")
        );
    }
    Ok(())
}

/// Finds the policy directory (a model directory, a checkpoint, or a run's newest
/// checkpoint) and the config to evaluate with.
fn resolve(a: &EvalArgs, registries: &Registries) -> anyhow::Result<Resolved> {
    let dir = &a.model;
    anyhow::ensure!(
        dir.exists(),
        "--model {}: no such directory (pass a model directory with config.json, or a checkpoint RUN/checkpoints/step-K)",
        dir.display()
    );
    anyhow::ensure!(
        dir.is_dir(),
        "--model {}: not a directory (pass a model directory with config.json, or a checkpoint RUN/checkpoints/step-K)",
        dir.display()
    );
    let checkpoint = if dir.join(MANIFEST).exists() {
        Some(Checkpoint::open(dir).map_err(|e| {
            anyhow::anyhow!(
                "--model: {e} (a checkpoint must verify against its {MANIFEST}; pass another RUN/checkpoints/step-K, or a model directory)"
            )
        })?)
    } else if !dir.join("config.json").exists() && checkpoint::checkpoints_dir(dir).is_dir() {
        let newest = checkpoint::latest_complete(dir)
            .with_context(|| format!("--model {}: reading its checkpoints", dir.display()))?;
        Some(newest.with_context(|| {
            format!(
                "--model {}: a run directory without a checkpoint that verifies (pass a model directory, or RUN/checkpoints/step-K)",
                dir.display()
            )
        })?)
    } else {
        None
    };
    let policy = match &checkpoint {
        Some(c) => c.path("policy"),
        None => dir.clone(),
    };
    // A checkpoint of adapters holds the adapter; its base is the model it names.
    let (policy, adapter) = match (&a.adapter, policy.join(ADAPTER_CONFIG_FILE).is_file()) {
        (Some(adapter), _) => (policy, Some(adapter.clone())),
        (None, true) => {
            let base = read_adapter_base(&policy)?.with_context(|| {
                format!(
                    "{}: no base_model_name_or_path (pass the base as --model and this directory as --adapter)",
                    policy.join(ADAPTER_CONFIG_FILE).display()
                )
            })?;
            (PathBuf::from(base), Some(policy))
        }
        (None, false) => (policy, None),
    };
    let adapter = adapter.map(|dir| AdapterSource {
        config: Default::default(),
        from: Some(dir),
    });
    anyhow::ensure!(
        policy.join("config.json").is_file(),
        "--model {}: {} (pass a Hugging Face model directory, a checkpoint RUN/checkpoints/step-K, or a run directory)",
        policy.display(),
        if checkpoint.is_some() {
            "the checkpoint's policy has no config.json"
        } else {
            "neither a model directory (no config.json) nor a checkpoint (no manifest.json)"
        }
    );

    let (mut cfg, config_source) = match (&a.config, &checkpoint) {
        (Some(path), _) => (
            TrainConfig::load(path, FileCheck::Skip, registries).context("--config")?,
            format!("--config {}", path.display()),
        ),
        (None, Some(c)) => (
            TrainConfig::load(&c.path("config.toml"), FileCheck::Skip, registries).context(
                "--model: the checkpoint's saved config (pass --config FILE.toml to use another)",
            )?,
            "checkpoint".to_string(),
        ),
        (None, None) => {
            let env = a.env.as_deref().unwrap_or(synthetic_multihop::NAME);
            anyhow::ensure!(
                env == synthetic_multihop::NAME,
                "--env {env}: needs --config FILE.toml (its [env] names the data files); without one only {} is allowed",
                synthetic_multihop::NAME
            );
            let mut cfg = TrainConfig::preset("demo", FileCheck::Skip, registries)
                .context("the built-in default config (examples/demo.toml)")?;
            cfg.model.device = "auto".into();
            cfg.model.dtype = "auto".into();
            (cfg, "default".to_string())
        }
    };
    if let Some(env) = &a.env {
        anyhow::ensure!(
            *env == cfg.env.name,
            "--env {env}: the {} config is for `{}` (leave --env out, or pass --config FILE.toml)",
            if config_source == "checkpoint" {
                "checkpoint's"
            } else {
                "--config"
            },
            cfg.env.name
        );
    }
    // The model evaluated is --model's, whatever the config trained.
    cfg.model.dir = Some(policy.clone());
    cfg.model.preset = None;
    Ok(Resolved {
        policy,
        adapter,
        checkpoint,
        cfg,
        config_source,
    })
}

pub(crate) fn run(a: EvalArgs, registries: &Registries) -> anyhow::Result<()> {
    check_flags(&a, registries)?;
    let Resolved {
        policy,
        adapter,
        checkpoint,
        cfg,
        config_source,
    } = resolve(&a, registries)?;
    let placement = match &a.device {
        Some(device) => agent_r1_actors::device::parse_placement(device, "auto")?,
        None => cfg.placement()?,
    };
    let started = Instant::now();
    // The world (corpus, search index) is built afresh in a temporary directory: nothing is
    // written into the model's or the run's directory.
    let world = tempfile::Builder::new()
        .prefix("agent-r1-eval-")
        .tempdir()
        .context("creating a temporary directory for the env's world")?;
    let scenario = train::scenario(&cfg, world.path(), registries)?;
    let pool = if a.split == "train" {
        &scenario.train
    } else {
        &scenario.test
    };
    anyhow::ensure!(
        !pool.is_empty(),
        "--split {}: the env has no {} tasks",
        a.split,
        a.split
    );
    let questions = a.questions.map_or(pool.len(), |q| q.min(pool.len()));
    let temperature = a.temperature.unwrap_or(0.0);
    let greedy = temperature == 0.0;
    eprintln!(
        "eval {}{}: env {} ({} config), {} split, {questions} questions, {}",
        a.model.display(),
        checkpoint
            .as_ref()
            .map(|c| format!(" (checkpoint step {})", c.step()))
            .unwrap_or_default(),
        cfg.env.name,
        config_source,
        a.split,
        if greedy {
            "greedy".to_string()
        } else {
            format!("temperature {temperature}")
        }
    );

    let r = &cfg.rollout;
    let concurrency = a.concurrency.unwrap_or(r.concurrency).max(1);
    let tokenizer = Arc::new(
        HfTokenizer::from_dir(&policy)?
            .with_template_kwargs(cfg.model.chat_template_kwargs.clone())?,
    );
    let rt = setup::actor_runtime()?;
    let engine = setup::engine(
        rt.handle(),
        &policy,
        adapter.as_ref(),
        placement,
        EngineConfig {
            max_batch_rows: concurrency,
            seed: a.seed.unwrap_or(cfg.training.seed) as i64,
            ..cfg.engine_config()
        },
        None,
    )?;
    let knobs = RolloutKnobs {
        concurrency,
        max_turns: a.max_turns.unwrap_or(r.max_turns),
        // A training bound (which tasks a batch takes); evaluation answers every task that
        // fits the context, whatever tokenizer the evaluated model has.
        max_prompt: None,
        temperature,
        ..cfg.rollout_knobs()
    };
    let knobs = if greedy { knobs.greedy() } else { knobs };
    let mut rollout = setup::rollout_setup(
        engine.clone(),
        tokenizer.clone(),
        scenario.env.clone(),
        scenario.tools.clone(),
        &knobs,
    )?;
    rollout.context_policy = scenario.context_policy.clone();
    let result = rt.block_on(train::evaluate_tasks(&rollout, pool, questions));
    engine.shutdown();
    let (trajectories, s) = result?;
    if let Some(out) = &a.out {
        train::write_trajectories(out, &tokenizer, &trajectories)
            .with_context(|| format!("--out {}", out.display()))?;
    }
    let mut report = report(
        &a,
        &cfg,
        &policy,
        checkpoint.as_ref(),
        &config_source,
        &s,
        temperature,
    );
    report["seconds"] = json!(started.elapsed().as_secs_f64());
    if a.json {
        println!("{report}");
    } else {
        println!("{}", table(&report, &s));
    }
    Ok(())
}

/// The JSON object `--json` prints: the fixed keys, then each env metric's mean at the top
/// level too (and all of them under `metrics`).
fn report(
    a: &EvalArgs,
    cfg: &TrainConfig,
    policy: &Path,
    checkpoint: Option<&Checkpoint>,
    config_source: &str,
    s: &BatchSummary,
    temperature: f64,
) -> Value {
    let mut v = json!({
        "model": a.model.display().to_string(),
        "policy": policy.display().to_string(),
        "checkpoint_step": checkpoint.map(Checkpoint::step),
        "policy_version": checkpoint.map(|c| c.manifest.state.policy_version),
        "config": config_source,
        "env": cfg.env.name,
        "split": a.split,
        "episodes": s.episodes,
        "failed": s.failed,
        "em": s.metric("em"),
        "f1": s.metric("f1"),
        "reward": s.reward_mean,
        "tool_calls_per_episode": s.tool_calls_per_episode,
        "turns_per_episode": s.turns_per_episode,
        "greedy": temperature == 0.0,
        "temperature": temperature,
        "metrics": s.metrics,
        "out": a.out.as_ref().map(|p| p.display().to_string()),
    });
    if let Value::Object(map) = &mut v {
        for (k, m) in &s.metrics {
            map.entry(k.clone()).or_insert(json!(m));
        }
    }
    v
}

/// The short table printed without `--json`.
fn table(report: &Value, s: &BatchSummary) -> String {
    let text = |k: &str| report.get(k).and_then(Value::as_str).unwrap_or("-");
    let mut head = text("model").to_string();
    if let Some(step) = report.get("checkpoint_step").and_then(Value::as_u64) {
        head.push_str(&format!(" (checkpoint step {step})"));
    }
    let decoding = if report["greedy"] == json!(true) {
        "greedy".to_string()
    } else {
        format!("temperature {}", report["temperature"])
    };
    let mut rows = vec![
        ("model".to_string(), head),
        (
            "env".to_string(),
            format!(
                "{} ({} config), {} split, {decoding}",
                text("env"),
                text("config"),
                text("split")
            ),
        ),
        (
            "episodes".to_string(),
            format!("{} ({} failed)", s.episodes, s.failed),
        ),
        ("EM".to_string(), format!("{:.3}", s.metric("em"))),
        ("F1".to_string(), format!("{:.3}", s.metric("f1"))),
        ("reward".to_string(), format!("{:+.3}", s.reward_mean)),
        (
            "tool calls run / episode".to_string(),
            format!("{:.2}", s.tool_calls_per_episode),
        ),
        (
            "turns / episode".to_string(),
            format!("{:.2}", s.turns_per_episode),
        ),
    ];
    for (k, m) in s.metrics.iter().filter(|(k, _)| *k != "em" && *k != "f1") {
        rows.push((k.clone(), format!("{m:.3}")));
    }
    if let Some(out) = report.get("out").and_then(Value::as_str) {
        rows.push(("trajectories".to_string(), out.to_string()));
    }
    rows.iter()
        .map(|(k, v)| format!("{k:<22}{v}"))
        .collect::<Vec<_>>()
        .join("\n")
}
