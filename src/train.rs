//! `agent-r1 train`: the training daemon.
//!
//! One config file ([`TrainConfig`]) describes the run. The loop is synchronous RL:
//! sample `batch_size` tasks × `group_size` episodes with the current policy through the
//! actor runtime, train the learner on them, publish the new weights to the engine, repeat.
//! Around it:
//!
//! - the run directory holds everything: the fresh preset model (`model-init/`), the warm
//!   start (`model-sft/`), the world (`world/`), `metrics.jsonl` (one line per update),
//!   `eval.jsonl` (one line per held-out evaluation, greedy), `rollouts/` (a sample of
//!   training episodes and every evaluation episode, each file with its `.idx` index),
//!   `checkpoints/step-K/`, the resolved `config.toml`, and the curves `curves.png` /
//!   `curves.svg`; the web UI ([`crate::view`]) reads them at `/ui` on the metrics address;
//! - one rollout service samples for the whole run ([`sampler::Sampler`]): tasks stream in
//!   in stream order, a group at a time, and trajectories stream out into group-complete
//!   batches; a SIGINT/SIGTERM stops feeding tasks, the episodes in flight finish, and the
//!   complete groups not yet trained on are saved in the checkpoint
//!   (`pending_trajectories.jsonl`), so a resume loses no samples;
//! - the task stream is a pure function of (seed, position) ([`tasks::TaskStream`]), so the
//!   checkpoint's `data_position` is all a resume needs to draw the same tasks;
//! - a resume (`--resume`, or `checkpoint.resume = true`, the default) starts from the newest
//!   checkpoint that verifies; damaged or partial ones are skipped with a warning.
//!
//! `mode = "sync"` feeds one batch, waits for it, trains, publishes: exactly on-policy.
//! `mode = "async"` feeds the whole run's tasks at once (paced by `rollout.concurrency`):
//! sampling never waits for an update, new weights are swapped in between engine steps
//! (turns in flight finish under them, each token recording its version), and the learner
//! masks tokens older than `max_staleness` versions. An async checkpoint also keeps the
//! finished episodes of groups still in flight and records those groups
//! (`requeue_positions`), whose unfinished episodes a resume samples again.
//!
//! - the optimizers' state (AdamW moments and step counts) is saved beside the policy
//!   (`optimizer.safetensors`), so the updates after a resume are the ones an uninterrupted
//!   run makes.
//!
//! A task whose prompt is longer than `rollout.max_prompt_length` fails its episode at once
//! (not retried, counted in `agent_r1_prompts_too_long_total`) and is not trained on.

pub mod faults;
pub mod plot;
pub mod records;
mod sampler;
mod skip;
pub mod tasks;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_r1_actors::engine::{EngineConfig, EngineStats};
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::{
    BeforeUpdate, LearnerModels, LearnerRef, LearnerStart, UpdateStats, CRITIC_DIR,
};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::runtime::fault::FaultyTool;
use agent_r1_actors::runtime::{
    run_rollout, ContextPolicy, EnvSource, LiveBoard, RolloutSetup, RolloutSummary,
};
use agent_r1_actors::sft::{train_sft, SftConfig};
use agent_r1_actors::stall::{Operations, StallWatch, Watchdog};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory, TrajectoryWriter};
use agent_r1_envs::dataset::load_many;
use agent_r1_envs::demo::DemoConfig;
use agent_r1_envs::env::Env;
use agent_r1_envs::envs::synthetic_multihop;
use agent_r1_envs::generated_env::GeneratedEnv;
use agent_r1_envs::reward::ScoredEnv;
use agent_r1_envs::task::Split;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::Tool;
use anyhow::Context;
use sampler::Sampler;
use serde_json::{json, Value};

use crate::checkpoint::{self, TrainingState, PENDING_TRAJECTORIES};
use crate::cluster::trainer::TrainerCluster;
use crate::config::{FileCheck, TrainConfig, TrainMode};
use crate::demonstrations::{chat_row_rules, tokenized_demonstrations};
use crate::preflight::{preflight, Preflight};
use crate::registries::Registries;
use crate::setup::{self, RolloutKnobs};
use crate::view::Site;
use crate::{memory, metrics_server};
use faults::{BlockingTool, Faults, FaultyEnv, HangStage};
use records::{
    append_row, read_jsonl, read_rows, truncate_after, BatchSummary, EvalRow, UpdateRow,
};
use skip::{no_reward_signal, unusable};
use tasks::TaskStream;

/// Where the training config comes from.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// A TOML file.
    File(PathBuf),
    /// A built-in config by name ([`crate::config::PRESETS`]).
    Preset(String),
}

impl ConfigSource {
    /// [`preflight`] of `cfg`, its error naming the config file.
    fn preflight(&self, cfg: &TrainConfig, registries: &Registries) -> anyhow::Result<Preflight> {
        preflight(cfg, registries).map_err(|e| match self {
            ConfigSource::File(path) => e.in_file(path).into(),
            ConfigSource::Preset(_) => e.into(),
        })
    }

    fn load(&self, registries: &Registries) -> anyhow::Result<TrainConfig> {
        Ok(match self {
            ConfigSource::File(path) => TrainConfig::load(path, FileCheck::Require, registries)?,
            ConfigSource::Preset(name) => {
                TrainConfig::preset(name, FileCheck::Require, registries)?
            }
        })
    }
}

/// What `agent-r1 train` was asked to do.
#[derive(Debug, Clone)]
pub struct TrainArgs {
    /// The TOML config.
    pub config: ConfigSource,
    /// Run directory (default: the config's `training.run_dir`).
    pub out: Option<PathBuf>,
    /// Continue from the newest complete checkpoint even when the config says not to.
    pub resume: bool,
    /// The tool and env kinds the config may name.
    pub registries: Registries,
    /// Fault injection for tests and `bench train` (none for real runs).
    pub faults: Faults,
}

/// Training episodes of each update written to `rollouts/` (a sample, not the batch).
const ROLLOUT_SAMPLE: usize = 8;
/// The learner's optimizer state inside a checkpoint.
const OPTIMIZER_STATE: &str = "optimizer.safetensors";
/// Tokenizer vocabulary of a preset model trained on the world's text.
const PRESET_VOCAB: usize = 2048;

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

/// Runs `tasks` through the runtime and returns their trajectories sorted by (group,
/// episode), so that the batch handed to the learner does not depend on finishing order.
async fn rollout(setup: &RolloutSetup, tasks: Vec<(Task, u64)>) -> anyhow::Result<Vec<Trajectory>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(256);
    let collect = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(t) = rx.recv().await {
            all.push(t);
        }
        all
    });
    let report = run_rollout(setup.clone(), tasks, tx).await?;
    let mut all = collect.await.context("collecting trajectories")?;
    if let Some(fatal) = &report.summary.fatal {
        anyhow::bail!("the rollout stopped: {fatal}");
    }
    all.sort_by_key(|t| (t.group_id, t.episode_id));
    Ok(all)
}

/// One episode of each of the first `questions` tasks (0 = all), in order, with the task's
/// index as its group id; returns the trajectories (sorted) and their summary. The held-out
/// evaluation of `train` and `agent-r1 eval` both run this.
pub async fn evaluate_tasks(
    setup: &RolloutSetup,
    tasks: &[Task],
    questions: usize,
) -> anyhow::Result<(Vec<Trajectory>, BatchSummary)> {
    let n = match questions {
        0 => tasks.len(),
        q => q.min(tasks.len()),
    };
    let tasks: Vec<(Task, u64)> = tasks[..n]
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, t)| (t, i as u64))
        .collect();
    let trajectories = rollout(setup, tasks).await?;
    let summary = BatchSummary::of(&trajectories);
    Ok((trajectories, summary))
}

/// Writes trajectories as JSON lines with their decoded text.
pub fn write_trajectories(
    path: &Path,
    tokenizer: &Arc<HfTokenizer>,
    trajectories: &[Trajectory],
) -> anyhow::Result<()> {
    let mut w = TrajectoryWriter::create(path, Some(tokenizer.clone()))?;
    for t in trajectories {
        w.write(t)?;
    }
    w.flush()?;
    Ok(())
}

/// Sets the stop flag on SIGINT or SIGTERM; a second signal exits at once (code 130).
fn install_signal_handler(rt: &tokio::runtime::Runtime, stop: Arc<AtomicBool>) {
    rt.spawn(async move {
        #[cfg(unix)]
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("cannot listen for SIGTERM: {e}");
                    None
                }
            };
        loop {
            #[cfg(unix)]
            let got = tokio::select! {
                r = tokio::signal::ctrl_c() => r.is_ok(),
                r = async {
                    match term.as_mut() {
                        Some(t) => t.recv().await,
                        None => std::future::pending().await,
                    }
                } => r.is_some(),
            };
            #[cfg(not(unix))]
            let got = tokio::signal::ctrl_c().await.is_ok();
            if !got {
                return;
            }
            if stop.swap(true, Ordering::SeqCst) {
                eprintln!("second signal: exiting now without a checkpoint");
                std::process::exit(130);
            }
            // Setup waits (an MCP server's handshake) give up rather than run out their time.
            agent_r1_envs::shutdown::request();
            eprintln!(
                "signal received: no new episodes; finishing the current work, then a checkpoint"
            );
        }
    });
}

/// Everything the loop needs after setup.
struct Run {
    cfg: TrainConfig,
    run_dir: PathBuf,
    /// Where the policy's tokenizer files come from when saving: the base model, which
    /// outlives the checkpoints that retention deletes.
    tokenizer_dir: PathBuf,
    tokenizer: Arc<HfTokenizer>,
    engine: EngineSet,
    learner: LearnerRef,
    live: LiveBoard,
    eval_setup: RolloutSetup,
    test: Vec<Task>,
    sampler: Sampler,
    /// Positions a resumed async checkpoint had in flight, fed again first.
    requeue: Vec<u64>,
    /// Whether the async feeder has been started.
    fed_ahead: bool,
    step: u64,
    version: u64,
    last_checkpoint: Option<u64>,
    last_eval: Option<u64>,
    started: Instant,
    stall: StallWatch,
    faults: Faults,
    /// Remote workers, when `[cluster] listen` is set.
    cluster: Option<TrainerCluster>,
    /// Batches in a row in which every episode failed (`training.max_failed_batches`).
    failed_batches: u64,
}

impl Run {
    fn state(&self, snapshot: &sampler::SamplerSnapshot) -> TrainingState {
        TrainingState {
            step: self.step,
            policy_version: self.version,
            data_position: snapshot.position,
            requeue_positions: snapshot.open.clone(),
            seed: self.cfg.training.seed,
            rng_state: json!({
                "task_stream": "epoch shuffles seeded by training.seed; position = data_position",
                "learner_seed": self.cfg.training.seed.wrapping_add(self.step),
                "engine": "tokens drawn from (engine seed, episode, position)",
            }),
        }
    }

    /// Writes `checkpoints/step-K` (policy + critic, pending trajectories, the resolved
    /// config) atomically, then prunes old ones.
    async fn checkpoint(&mut self) -> anyhow::Result<PathBuf> {
        let _writing = self
            .stall
            .checkpoint()
            .start(format!("writing checkpoint step {}", self.step));
        let pending = checkpoint::begin(&self.run_dir, self.step)?;
        self.learner
            .save(
                pending.dir().join("policy"),
                Some(self.tokenizer_dir.clone()),
            )
            .await
            .context("saving the policy into the checkpoint")?;
        self.learner
            .save_optimizer(pending.dir().join(OPTIMIZER_STATE))
            .await
            .context("saving the optimizer state into the checkpoint")?;
        if let Some(delay) = self.faults.checkpoint_delay {
            eprintln!(
                "checkpoint step {}: writing (paused {delay:?}: fault injection)",
                self.step
            );
            tokio::time::sleep(delay).await;
        }
        if self.faults.hangs(HangStage::Checkpoint) {
            faults::hang_forever("a checkpoint write");
        }
        self.sampler.absorb_finished();
        let snapshot = self.sampler.snapshot();
        if !snapshot.pending.is_empty() {
            pending.write_jsonl(PENDING_TRAJECTORIES, &snapshot.pending)?;
        }
        pending.write_file("config.toml", self.cfg.to_toml_string().as_bytes())?;
        let done = pending.commit(self.state(&snapshot))?;
        // The checkpoint is committed; failing to delete older ones is not worth a retry.
        if let Err(e) = checkpoint::prune(&self.run_dir, self.cfg.checkpoint.keep_last) {
            eprintln!("warning: pruning old checkpoints: {e}");
        }
        self.last_checkpoint = Some(self.step);
        self.live.touch(format!("checkpoint step {}", self.step));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        metrics::gauge!(crate::metric_names::TRAIN_LAST_CHECKPOINT_TIMESTAMP_SECONDS.name)
            .set(now.map_or(0.0, |d| d.as_secs_f64()));
        eprintln!(
            "checkpoint step {} -> {} ({} pending trajectories, {} of them in the {} groups in flight)",
            self.step,
            done.dir.display(),
            snapshot.pending.len(),
            snapshot.partial,
            snapshot.open.len()
        );
        Ok(done.dir)
    }

    /// [`Run::checkpoint`], retried `checkpoint.retries` times (1 s, 2 s, 4 s, ... apart).
    /// When every attempt fails, a periodic checkpoint is skipped with an alert (a log
    /// line and `agent_r1_train_checkpoint_failures_total`; older checkpoints stay), and the
    /// final one (`required`) fails the run.
    async fn checkpoint_with_retries(&mut self, required: bool) -> anyhow::Result<()> {
        let retries = self.cfg.checkpoint.retries;
        let mut wait = Duration::from_secs(1);
        for attempt in 0..=retries {
            match self.checkpoint().await {
                Ok(_) => return Ok(()),
                Err(e) if attempt < retries => {
                    eprintln!(
                        "warning: checkpoint step {} failed (attempt {} of {}): {e:#}; retrying in {wait:?}",
                        self.step,
                        attempt + 1,
                        retries + 1
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) if required => return Err(e),
                Err(e) => {
                    metrics::counter!(crate::metric_names::TRAIN_CHECKPOINT_FAILURES_TOTAL.name)
                        .increment(1);
                    eprintln!(
                        "ALERT: checkpoint step {} skipped after {} attempts: {e:#}; training goes on, \
                         the newest checkpoint is still step {}",
                        self.step,
                        retries + 1,
                        self.last_checkpoint
                            .map_or("none".to_string(), |s| s.to_string())
                    );
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Greedy (per config) episodes on the held-out tasks; appends to `eval.jsonl`.
    async fn evaluate(&mut self) -> anyhow::Result<Option<BatchSummary>> {
        if self.test.is_empty() {
            return Ok(None);
        }
        let t0 = Instant::now();
        let (trajectories, s) =
            evaluate_tasks(&self.eval_setup, &self.test, self.cfg.eval.questions).await?;
        let dir = self.run_dir.join("rollouts");
        write_trajectories(
            &dir.join(format!("eval-step-{:06}.jsonl", self.step)),
            &self.tokenizer,
            &trajectories,
        )?;
        let row = EvalRow {
            step: self.step,
            policy_version: self.version,
            episodes: s.episodes,
            em: s.metric("em"),
            f1: s.metric("f1"),
            reward_mean: s.reward_mean,
            tool_calls_per_episode: s.tool_calls_per_episode,
            metrics: s.metrics.clone(),
            greedy: self.cfg.eval.greedy,
            seconds: t0.elapsed().as_secs_f64(),
        };
        append_row(&self.run_dir.join("eval.jsonl"), &row)?;
        for (k, v) in &s.metrics {
            metrics::gauge!(crate::metric_names::TRAIN_EVAL_SCORE.name, "metric" => k.clone())
                .set(*v);
        }
        metrics::gauge!(crate::metric_names::TRAIN_EVAL_SCORE.name, "metric" => "reward")
            .set(s.reward_mean);
        eprintln!(
            "eval   step {:>4}  em {:.3}  f1 {:.3}  reward {:+.3}  calls/ep {:.2}  ({} episodes, {:.1}s)",
            self.step,
            s.metric("em"),
            s.metric("f1"),
            s.reward_mean,
            s.tool_calls_per_episode,
            s.episodes,
            t0.elapsed().as_secs_f64()
        );
        self.last_eval = Some(self.step);
        Ok(Some(s))
    }

    /// The next batch of whole groups: in sync mode, feeds exactly the groups the batch
    /// still needs and waits for them; in async mode, feeds the rest of the run's tasks once
    /// (the service paces them) and takes the next groups to complete. `None` when the stop
    /// flag ended feeding before a batch was complete.
    async fn next_batch(&mut self) -> anyhow::Result<Option<Vec<Trajectory>>> {
        let batch = self.cfg.rollout.batch_size as u64;
        let updates_fed = match self.cfg.training.mode {
            TrainMode::Sync => 1,
            TrainMode::Async if self.fed_ahead => 0,
            TrainMode::Async => self.cfg.training.updates.saturating_sub(self.step),
        };
        if self.faults.hangs(HangStage::Engine) {
            self.engine.inject_hang()?;
        }
        if updates_fed > 0 {
            let requeue = std::mem::take(&mut self.requeue);
            let held = self.sampler.complete_groups() as u64 + requeue.len() as u64;
            let to = self.sampler.position() + (updates_fed * batch).saturating_sub(held);
            let ahead = (self.cfg.training.mode == TrainMode::Async)
                .then_some(self.cfg.training.batches_ahead);
            self.sampler.feed(requeue, to, ahead);
            self.fed_ahead = self.cfg.training.mode == TrainMode::Async;
        }
        let got = self.sampler.next_batch().await?;
        let position = self.sampler.position();
        metrics::gauge!(crate::metric_names::TRAIN_DATA_POSITION.name).set(position as f64);
        if let Some(b) = &got {
            eprintln!(
                "sampled update {}: {} episodes (data position {position})",
                self.step + 1,
                b.len()
            );
        }
        Ok(got)
    }

    /// A batch in which every episode failed is reported with the first episode's reason;
    /// `training.max_failed_batches` of them in a row end the run with an error, since a run
    /// that cannot complete an episode cannot learn.
    fn check_failed_batches(
        &mut self,
        batch: &[Trajectory],
        summary: &BatchSummary,
    ) -> anyhow::Result<()> {
        if summary.episodes == 0 || summary.failed < summary.episodes {
            self.failed_batches = 0;
            return Ok(());
        }
        self.failed_batches += 1;
        let reason = batch
            .iter()
            .find_map(|t| match &t.end {
                EpisodeEnd::Failed { reason } => Some(reason.as_str()),
                _ => None,
            })
            .unwrap_or("(no reason recorded)");
        let limit = self.cfg.training.max_failed_batches;
        eprintln!(
            "every episode of update {} failed ({} of training.max_failed_batches {limit} in a \
             row); the first: {reason}",
            self.step + 1,
            self.failed_batches
        );
        anyhow::ensure!(
            limit == 0 || self.failed_batches < limit,
            "every episode of the last {} batches failed (training.max_failed_batches = \
             {limit}); the run cannot learn. The first episode's reason: {reason}",
            self.failed_batches
        );
        Ok(())
    }

    /// One update on `batch`: train, publish, write a sample of it. Trajectories keep
    /// arriving meanwhile (async mode samples on). Returns the batch summary, the learner's
    /// stats and the update's timings.
    async fn update(
        &mut self,
        batch: Vec<Trajectory>,
    ) -> anyhow::Result<(BatchSummary, UpdateStats, UpdateTimes)> {
        let t0 = Instant::now();
        metrics::counter!(crate::metric_names::TRAIN_EPISODES_TOTAL.name)
            .increment(batch.len() as u64);
        let summary = BatchSummary::of(&batch);
        self.check_failed_batches(&batch, &summary)?;
        if let Some(rewards) = no_reward_signal(&batch) {
            eprintln!(
                "warning: in every group of update {}, all episodes earned the same return \
                 (returns seen: {rewards}): group baselines give every token an advantage of 0 \
                 and nothing is learnt from this batch",
                self.step + 1
            );
        }
        // An episode that failed before its first turn has no tokens to train on.
        let (batch, empty): (Vec<_>, Vec<_>) = batch.into_iter().partition(|t| !t.steps.is_empty());
        if !empty.is_empty() {
            metrics::counter!(crate::metric_names::TRAIN_EMPTY_EPISODES_TOTAL.name)
                .increment(empty.len() as u64);
            tracing::warn!(
                episodes = empty.len(),
                "episodes ended before their first turn (their reasons are logged: a prompt over rollout.max_prompt_length, a failed reset, ...); not trained on"
            );
        }
        let sample: Vec<Trajectory> = batch.iter().take(ROLLOUT_SAMPLE).cloned().collect();
        if let Some((reason, why)) = unusable(&batch) {
            // The batch's tasks are consumed and the weights stay as they are; the run goes
            // on with the next batch instead of ending on one bad one.
            self.step += 1;
            self.sampler.set_step(self.step);
            metrics::counter!(crate::metric_names::TRAIN_SKIPPED_UPDATES_TOTAL.name, "reason" => reason)
                .increment(1);
            tracing::warn!(step = self.step, reason, "update skipped: {why}");
            let stats = UpdateStats {
                version: self.version,
                trajectories: batch.len(),
                skipped_reason: Some(reason.to_string()),
                ..Default::default()
            };
            let times = UpdateTimes {
                seconds: t0.elapsed().as_secs_f64(),
                ..Default::default()
            };
            return Ok((summary, stats, times));
        }
        let learner = self.learner.clone();
        let step = self.step + 1;
        let updating = self.stall.learner().start(format!("update {step}"));
        let train = async move {
            let _updating = updating;
            learner
                .update(batch)
                .await
                .with_context(|| format!("learner update {step}"))
        };
        let engine_before = self.engine.stats().await.ok();
        let window = Instant::now();
        let stats = self.sampler.while_sampling(train).await??;
        let window = window.elapsed().as_secs_f64();
        let engine_after = self.engine.stats().await.ok();
        let engine_idle = engine_before
            .zip(engine_after)
            .map(|(a, b)| b.idle_seconds - a.idle_seconds);
        if let Some(idle) = engine_idle {
            metrics::histogram!(crate::metric_names::TRAIN_ENGINE_IDLE_DURING_UPDATE_SECONDS.name)
                .record(idle);
        }
        if self.faults.hangs(HangStage::Publication) {
            self.engine.inject_hang()?;
        }
        let publish = publish(
            self.learner.clone(),
            self.engine.clone(),
            self.stall.publication(),
            format!("the weights of update {step}"),
        );
        self.version = self.sampler.while_sampling(publish).await??;
        if let Some(steps) = self
            .faults
            .engine_panic_after_steps
            .filter(|_| self.step == 0)
        {
            self.engine.inject_panic_after(steps)?;
        }
        if self.faults.engine_stop_after_first_update && self.step == 0 {
            self.engine.shutdown();
        }
        if let Some(cluster) = &self.cluster {
            let remote = cluster.publish(&self.learner, self.version);
            self.sampler.while_sampling(remote).await??;
        }
        self.step += 1;
        self.sampler.set_step(self.step);
        write_trajectories(
            &self
                .run_dir
                .join("rollouts")
                .join(format!("train-step-{:06}.jsonl", self.step)),
            &self.tokenizer,
            &sample,
        )?;
        let times = UpdateTimes {
            seconds: t0.elapsed().as_secs_f64(),
            learner_window: window,
            engine_idle,
        };
        Ok((summary, stats, times))
    }
}

/// Timings of one update.
#[derive(Debug, Clone, Copy, Default)]
struct UpdateTimes {
    /// Wall seconds: training, publishing, writing samples.
    seconds: f64,
    /// Wall seconds of the learner call as the loop saw it.
    learner_window: f64,
    /// Seconds the engine sat idle during that call (`None` when its stats were unavailable).
    engine_idle: Option<f64>,
}

/// Publishes the learner's weights to the engine, on record as `what` in the stall
/// detector's publication stage until it completes.
async fn publish(
    learner: LearnerRef,
    engine: EngineSet,
    stage: Operations,
    what: String,
) -> anyhow::Result<u64> {
    let _publishing = stage.start(what);
    learner
        .publish(&engine)
        .await
        .context("publishing the new weights to the engine")
}

/// Runs `agent-r1 train`; returns the final summary (also printed as the last line).
///
/// The stages, in order: the run directory and its config, the resume point, the env and its
/// tasks, the base model (a preset and the warm start), the start point (policy, state,
/// pending samples), the engine, the supervised learner, the rollout service, the loop, the
/// summary.
pub fn run(args: &TrainArgs) -> anyhow::Result<Value> {
    let started = Instant::now();
    let cfg = args.config.load(&args.registries)?;
    // What the run will read is read before anything is created (as `check-config` does).
    args.config.preflight(&cfg, &args.registries)?;
    let run_dir = args.out.clone().unwrap_or(cfg.training.run_dir.clone());
    std::fs::create_dir_all(run_dir.join("rollouts"))
        .with_context(|| format!("{}: cannot create the run directory", run_dir.display()))?;
    let placement = cfg.placement()?;
    check_memory(&cfg, placement)?;
    let rt = setup::actor_runtime()?;
    let stop = Arc::new(AtomicBool::new(false));
    install_signal_handler(&rt, stop.clone());
    let live = LiveBoard::default();
    let stall = StallWatch::new(cfg.stall.clone());
    let _watchdog = start_watchdog(&stall)?;
    let _metrics = serve_metrics(&cfg, &run_dir, &live, &stall)?;
    let resumed = resume_point(&cfg, &run_dir, args.resume)?;
    // The resolved config, for the web UI and for people reading the directory.
    let config_path = run_dir.join("config.toml");
    std::fs::write(&config_path, cfg.to_toml_string())
        .with_context(|| format!("{}: cannot write", config_path.display()))?;
    let mut scenario = match scenario(&cfg, &run_dir, &args.registries) {
        Ok(scenario) => scenario,
        Err(e) if stop.load(Ordering::SeqCst) => {
            eprintln!(
                "stopped by a signal while building the env and tools ({e:#}); nothing was trained"
            );
            return Ok(json!({
                "updates": 0,
                "interrupted": true,
                "wall_s": started.elapsed().as_secs_f64(),
                "run_dir": run_dir.display().to_string(),
                "checkpoint": null,
            }));
        }
        Err(e) => return Err(e),
    };
    log_scenario(&cfg, &scenario);
    inject_scenario_faults(&mut scenario, &args.faults)?;
    let base = base_model(
        &cfg,
        &run_dir,
        &scenario,
        resumed.is_some(),
        placement,
        &live,
        &stop,
    )?;
    if base.interrupted {
        return Ok(json!({
            "updates": 0,
            "interrupted": true,
            "warm_start": base.warm,
            "wall_s": started.elapsed().as_secs_f64(),
            "run_dir": run_dir.display().to_string(),
            "checkpoint": null,
        }));
    }
    let start = StartPoint::load(&run_dir, resumed.as_ref(), &base.dir)?;
    let tokenizer = Arc::new(
        HfTokenizer::from_dir(&start.policy_dir)?
            .with_template_kwargs(cfg.model.chat_template_kwargs.clone())?,
    );
    let engine = start_engines(rt.handle(), &cfg, &start.policy_dir)?;
    stall.engine(engine.stall_probe());
    let learner = rt.block_on(start_learner(
        &cfg,
        &start,
        &base.dir,
        placement,
        &args.faults,
    ))?;
    let republisher = {
        let _in_runtime = rt.enter();
        republish_after_restarts(&engine, learner.clone(), &stall)
    };
    let (train_setup, eval_setup) =
        rollout_setups(&cfg, &engine, &tokenizer, &scenario, &live, &stall)?;
    let mut sampler = rt.block_on(Sampler::start(
        train_setup,
        TaskStream::new(scenario.train, cfg.training.seed),
        start.state.data_position,
        cfg.rollout.group_size,
        cfg.rollout.batch_size,
        stop,
    ))?;
    sampler.restore(start.pending);
    sampler.set_step(start.state.step);
    let cluster = match cfg.cluster.enabled() {
        false => None,
        true => {
            let (mut cluster, remote) = rt.block_on(TrainerCluster::start(
                &cfg,
                &run_dir,
                &learner,
                &base.dir,
                start.state.policy_version,
                sampler.sink(),
                sampler.tasks(),
            ))?;
            sampler.set_remote(remote);
            rt.block_on(cluster.wait_for_workers())?;
            Some(cluster)
        }
    };
    let mut run = Run {
        cluster,
        sampler,
        requeue: start.state.requeue_positions.clone(),
        fed_ahead: false,
        live: live.clone(),
        test: scenario.test,
        tokenizer_dir: base.dir.clone(),
        step: start.state.step,
        version: start.state.policy_version,
        last_checkpoint: start.resumed_step,
        last_eval: None,
        cfg,
        run_dir,
        tokenizer,
        engine,
        learner,
        eval_setup,
        started,
        stall,
        faults: args.faults.clone(),
        failed_batches: 0,
    };
    let outcome = rt.block_on(train_loop(&mut run, start.resumed_step.is_some()));
    let cluster = run.cluster.take().map(|c| {
        rt.block_on(async {
            let summary = c.summary().await;
            c.stop().await;
            summary
        })
    });
    let sampled = rt.block_on(run.sampler.finish());
    republisher.abort();
    run.learner.shutdown();
    let interrupted = outcome?;
    let engines = engine_summary(&run.engine, rt.block_on(run.engine.stats_each()).ok());
    let mut summary = summarize(&run, interrupted, &sampled?.summary, base.warm)?;
    summary["engines"] = engines;
    if let Some(cluster) = cluster {
        summary["cluster"] = json!(cluster);
    }
    Ok(summary)
}

/// Sends the learner's current weights to each engine whose thread was restarted (it
/// admits no turn until it has them again). Runs until aborted.
fn republish_after_restarts(
    engine: &EngineSet,
    learner: LearnerRef,
    stall: &StallWatch,
) -> tokio::task::JoinHandle<()> {
    let mut restarted = engine.restarted();
    let (learner_stage, publication) = (stall.learner(), stall.publication());
    tokio::spawn(async move {
        while let Some((label, handle)) = restarted.next().await {
            // A restarted engine holds its turns until it has its weights again. Asking the
            // learner for them waits behind its update in progress, which can be far longer
            // than the engine's or a publication's deadline: that wait is on record as the
            // learner's, and only the transfer as a publication.
            let weights = {
                let _asked =
                    learner_stage.start(format!("the weights for the restarted engine on {label}"));
                learner.weights().await
            };
            let sent = match weights {
                Ok(w) => {
                    let version = w.version;
                    let _sending = publication.start(format!(
                        "weights version {version} to the restarted engine on {label}"
                    ));
                    handle
                        .update_weights_verified(version, w.tensors, w.digest)
                        .await
                        .map(|()| version)
                }
                Err(e) => Err(e),
            };
            match sent {
                Ok(version) => {
                    eprintln!(
                        "engine on {label} restarted; weights version {version} sent to it again"
                    )
                }
                // It holds its turns until the next publication (after the learner's update
                // in progress); they time out meanwhile, each with its episode's error.
                Err(e) => tracing::error!(
                    "engine on {label} restarted and its weights could not be sent again: {e}"
                ),
            }
        }
    })
}

/// Per engine: its device, the episodes routed to it, its turns and prefill figures.
fn engine_summary(engines: &EngineSet, stats: Option<Vec<EngineStats>>) -> Value {
    let routed = engines.episodes_routed();
    let stats = stats.unwrap_or_default();
    let rows: Vec<Value> = engines
        .labels()
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let s = stats.get(i);
            json!({
                "device": label,
                "episodes": routed.get(i),
                "turns": s.map(|s| s.turns),
                "prefill_tokens": s.map(|s| s.prefill_tokens),
                "restarts": s.map(|s| s.restarts),
                "reused_tokens": s.map(|s| s.reused_tokens),
                "mean_batch": s.map(|s| s.mean_batch_size()),
            })
        })
        .collect();
    Value::Array(rows)
}

/// Refuses to start when the planned memory does not fit the device (unless
/// `learner.check_memory = false`).
fn check_memory(cfg: &TrainConfig, placement: Placement) -> anyhow::Result<()> {
    if !cfg.learner.check_memory {
        return Ok(());
    }
    let memory = memory::plan(cfg, placement, memory::ShapeSource::Config)?;
    if let Some(capacity) = memory::device_capacity(placement.device) {
        if let Err(why) = memory.check(placement.device, capacity) {
            anyhow::bail!("{why} (learner.check_memory = false starts anyway)");
        }
    }
    Ok(())
}

/// The Prometheus endpoint and, when `metrics.ui`, the web UI, when metrics are enabled.
fn serve_metrics(
    cfg: &TrainConfig,
    run_dir: &Path,
    live: &LiveBoard,
    stall: &StallWatch,
) -> anyhow::Result<Option<metrics_server::MetricsServer>> {
    if !cfg.metrics.enabled {
        return Ok(None);
    }
    let site = if cfg.metrics.ui {
        Some(Arc::new(Site::open(run_dir, Some(live.clone()))?))
    } else {
        None
    };
    let progress = metrics_server::Progress {
        board: live.clone(),
        stalls: stall.detector.clone(),
    };
    let server = metrics_server::start(&cfg.metrics, site, Some(progress))?;
    eprintln!("metrics: http://{}/metrics", server.local_addr());
    if cfg.metrics.ui {
        eprintln!("web UI: http://{}/ui", server.local_addr());
    }
    Ok(Some(server))
}

/// The exit code of a run failed by the stall detector.
pub const STALL_EXIT_CODE: i32 = 3;

/// Starts the stall detector's watchdog. With `stall.fail_run`, the first stall ends the
/// process with its diagnosis and [`STALL_EXIT_CODE`]: a stuck stage may hold the threads a
/// graceful stop would need, and the newest checkpoint is where a resume continues.
fn start_watchdog(stall: &StallWatch) -> anyhow::Result<Watchdog> {
    let fail_run = stall.config.fail_run;
    stall
        .detector
        .spawn_watchdog(move |s| {
            if fail_run {
                eprintln!("the run fails: {s} (stall.fail_run = true)");
                std::process::exit(STALL_EXIT_CODE);
            }
        })
        .context("starting the stall detector's watchdog thread")
}

/// Applies the env and tool faults a test asked for (see [`faults`]).
fn inject_scenario_faults(scenario: &mut Scenario, faults: &Faults) -> anyhow::Result<()> {
    if let Some(rate) = faults.tool_fault_rate {
        anyhow::ensure!(
            (0.0..=1.0).contains(&rate),
            "--inject-tool-faults {rate}: allowed 0 to 1"
        );
        for (i, tool) in scenario.tools.iter_mut().enumerate() {
            *tool = Arc::new(FaultyTool::new(
                tool.clone(),
                rate,
                Duration::ZERO,
                i as u64,
            ));
        }
    }
    // With tool faults, every turn that made no call calls the first tool (an untrained
    // model rarely calls one by itself), so the faults are met.
    let faulted_tool = faults
        .tool_fault_rate
        .and(scenario.tools.first().map(|t| t.name().to_string()));
    let force_call = if faults.hangs(HangStage::Tool) {
        let first = scenario
            .tools
            .first_mut()
            .context("--inject-hang tool needs a [tools.NAME] table")?;
        let name = first.name().to_string();
        *first = Arc::new(BlockingTool(first.clone()));
        Some(name)
    } else {
        faulted_tool
    };
    let hang_score = faults.hangs(HangStage::Env);
    if hang_score || force_call.is_some() {
        let EnvSource::Shared(inner) = &scenario.env else {
            anyhow::bail!("the env faults inject into an env, and [env] names a workflow");
        };
        scenario.env = EnvSource::Shared(Arc::new(FaultyEnv {
            inner: inner.clone(),
            hang_score,
            force_call,
        }));
    }
    Ok(())
}

/// The newest complete checkpoint when resuming is allowed; an error when checkpoints exist
/// and it is not.
fn resume_point(
    cfg: &TrainConfig,
    run_dir: &Path,
    resume: bool,
) -> anyhow::Result<Option<checkpoint::Checkpoint>> {
    let allowed = resume || cfg.checkpoint.resume;
    match checkpoint::latest_complete(run_dir)? {
        Some(c) if allowed => Ok(Some(c)),
        Some(c) => anyhow::bail!(
            "{} holds checkpoints (newest: step {}); pass --resume or set checkpoint.resume = true to continue, or choose another --out",
            run_dir.display(),
            c.step()
        ),
        None => {
            if resume {
                eprintln!(
                    "--resume: no complete checkpoint in {}; starting fresh",
                    run_dir.display()
                );
            }
            Ok(None)
        }
    }
}

fn log_scenario(cfg: &TrainConfig, scenario: &Scenario) {
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

/// The model RL starts from (also the KL reference and the tokenizer's home).
struct BaseModel {
    dir: PathBuf,
    /// The warm start's report (`null` when there was none this time).
    warm: Value,
    /// A signal stopped the warm start: nothing is saved and the run ends.
    interrupted: bool,
}

/// The config's model directory, or a fresh preset in the run directory, then the warm start
/// on the env's demonstrations. On a resume these exist already and are reused.
fn base_model(
    cfg: &TrainConfig,
    run_dir: &Path,
    scenario: &Scenario,
    resuming: bool,
    placement: Placement,
    live: &LiveBoard,
    stop: &AtomicBool,
) -> anyhow::Result<BaseModel> {
    let seed = cfg.training.seed;
    let mut dir = match (&cfg.model.dir, &cfg.model.preset) {
        (Some(dir), _) => dir.clone(),
        (None, preset) => {
            let preset = preset.as_deref().unwrap_or("tiny");
            let dir = run_dir.join("model-init");
            if !resuming || !dir.join("config.json").is_file() {
                let corpus = match &scenario.generated {
                    Some(env) => Some(setup::tokenizer_corpus(
                        env.as_ref(),
                        &scenario.train,
                        &scenario.tools,
                    )?),
                    None => None,
                };
                setup::init_model(
                    preset,
                    &dir,
                    corpus.as_ref(),
                    PRESET_VOCAB,
                    seed as i64,
                    true,
                )?;
            }
            dir
        }
    };
    let mut warm = json!(null);
    if cfg.warm_start.steps == 0 {
        return Ok(BaseModel {
            dir,
            warm,
            interrupted: false,
        });
    }
    let sft_dir = run_dir.join("model-sft");
    if !resuming || !sft_dir.join("config.json").is_file() {
        let w = &cfg.warm_start;
        let sft = SftConfig {
            steps: w.steps,
            batch_size: w.batch_size,
            learning_rate: w.learning_rate,
            final_lr_fraction: w.final_lr_fraction,
            max_len: cfg.rollout.max_context_length,
            seed,
            ..Default::default()
        };
        let on_step = |step: usize, loss: f64| {
            live.touch(format!("warm start step {step}"));
            if step % 25 == 0 || step + 1 == w.steps {
                eprintln!("  sft step {step:>4}  loss {loss:.3}");
            }
            if stop.load(Ordering::SeqCst) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let t0 = Instant::now();
        let done = match &w.data {
            Some(data) => own_warm_start(
                cfg, scenario, data, &dir, &sft_dir, placement, &sft, on_step,
            )?,
            None => generated_warm_start(cfg, scenario, &dir, &sft_dir, placement, &sft, on_step)?,
        };
        warm = json!({
            "steps": done.report.steps,
            "demonstrations": done.demonstrations,
            "loss_first": done.report.first_loss,
            "loss_last": done.report.last_loss,
            "seconds": t0.elapsed().as_secs_f64(),
            "interrupted": done.report.interrupted,
        });
        if done.report.interrupted {
            eprintln!(
                "interrupted during the warm start (after {} steps): nothing saved, the next \
                 start redoes it",
                done.report.steps
            );
            return Ok(BaseModel {
                dir,
                warm,
                interrupted: true,
            });
        }
    }
    dir = sft_dir;
    Ok(BaseModel {
        dir,
        warm,
        interrupted: false,
    })
}

/// The warm start on the demonstrations a generated env makes (its skills, then the bad
/// habit of `[warm_start.bad_habit]`).
fn generated_warm_start(
    cfg: &TrainConfig,
    scenario: &Scenario,
    dir: &Path,
    sft_dir: &Path,
    placement: Placement,
    sft: &SftConfig,
    on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> anyhow::Result<setup::WarmStart> {
    let env = scenario
        .generated
        .as_ref()
        .context("warm_start needs an env that generates its own tasks, or warm_start.data")?;
    let w = &cfg.warm_start;
    let seed = cfg.training.seed;
    let demos = |early_wrong_answer_prob, variants_per_question| DemoConfig {
        early_wrong_answer_prob,
        variants_per_question,
        seed,
    };
    let mut phases = vec![setup::WarmStartPhase {
        steps: w.steps,
        learning_rate: w.learning_rate,
        demos: demos(w.early_wrong_answer_prob, w.variants_per_question),
    }];
    if let Some(h) = &w.bad_habit {
        phases.push(setup::WarmStartPhase {
            steps: h.steps,
            learning_rate: h.learning_rate,
            demos: demos(h.early_wrong_answer_prob, h.variants_per_question),
        });
    }
    let total: usize = phases.iter().map(|p| p.steps).sum();
    eprintln!(
        "warm start: {total} steps{}",
        w.bad_habit.as_ref().map_or(String::new(), |h| format!(
            " (the last {} on demonstrations that answer early at {})",
            h.steps, h.early_wrong_answer_prob
        ))
    );
    setup::warm_start(
        env.as_ref(),
        &scenario.train,
        &scenario.tools,
        dir,
        sft_dir,
        placement,
        sft,
        &phases,
        scenario.context_policy.as_ref(),
        on_step,
    )
}

/// The warm start on the user's own demonstrations (`[warm_start] data`), read as the run
/// shows its tools and prompts.
#[allow(clippy::too_many_arguments)]
fn own_warm_start(
    cfg: &TrainConfig,
    scenario: &Scenario,
    data: &Path,
    dir: &Path,
    sft_dir: &Path,
    placement: Placement,
    sft: &SftConfig,
    on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> anyhow::Result<setup::WarmStart> {
    let specs = scenario.tools.iter().map(|t| t.spec()).collect();
    let env = match &scenario.env {
        EnvSource::Shared(env) => Some(env.as_ref()),
        _ => None,
    };
    let rules = chat_row_rules(cfg, specs, env);
    let tokenizer = HfTokenizer::from_dir(dir)?;
    let sequences =
        tokenized_demonstrations(data, &rules, &tokenizer).context("reading warm_start.data")?;
    eprintln!(
        "warm start: {} steps on {} demonstrations of {}",
        sft.steps,
        sequences.len(),
        data.display()
    );
    let mut model = PolicyModel::load(dir, placement, false)?;
    let report = train_sft(&mut model, &sequences, sft, on_step)?;
    if !report.interrupted {
        model.save(sft_dir, Some(dir))?;
    }
    Ok(setup::WarmStart {
        dir: sft_dir.to_path_buf(),
        report,
        demonstrations: sequences.len(),
    })
}

/// Where the loop starts: the policy to load, the training state, and the samples a
/// checkpoint held that were not trained on yet.
struct StartPoint {
    policy_dir: PathBuf,
    state: TrainingState,
    pending: Vec<Trajectory>,
    /// The checkpoint's step, when resuming.
    resumed_step: Option<u64>,
    /// The checkpoint's optimizer state, when it has one.
    optimizer_state: Option<PathBuf>,
}

impl StartPoint {
    fn load(
        run_dir: &Path,
        resumed: Option<&checkpoint::Checkpoint>,
        base_dir: &Path,
    ) -> anyhow::Result<Self> {
        let Some(c) = resumed else {
            return Ok(Self {
                policy_dir: base_dir.to_path_buf(),
                state: TrainingState::default(),
                pending: vec![],
                resumed_step: None,
                optimizer_state: None,
            });
        };
        let pending: Vec<Trajectory> = match c.pending_trajectories() {
            Some(path) => read_jsonl(&path)?
                .into_iter()
                .map(serde_json::from_value)
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}: not trajectories", path.display()))?,
            None => vec![],
        };
        for log in ["metrics.jsonl", "eval.jsonl"] {
            let dropped = truncate_after(&run_dir.join(log), c.step())?;
            if dropped > 0 {
                eprintln!(
                    "{log}: dropped {dropped} lines written after checkpoint step {}",
                    c.step()
                );
            }
        }
        let state = c.manifest.state.clone();
        eprintln!(
            "resumed from step {} ({}): policy version {}, data position {}, {} pending trajectories",
            c.step(),
            c.dir.display(),
            state.policy_version,
            state.data_position,
            pending.len()
        );
        let optimizer_state = if c.manifest.files.iter().any(|f| f.path == OPTIMIZER_STATE) {
            Some(c.path(OPTIMIZER_STATE))
        } else {
            eprintln!(
                "warning: {} has no {OPTIMIZER_STATE} (written before it was saved): \
                 AdamW's moments restart from zero",
                c.dir.display()
            );
            None
        };
        Ok(Self {
            policy_dir: c.path("policy"),
            state,
            pending,
            resumed_step: Some(c.step()),
            optimizer_state,
        })
    }
}

/// The engines over the start policy (one per `rollout.devices` entry, else one on
/// `model.device`), each sized from `[rollout]`.
pub(crate) fn start_engines(
    rt: &tokio::runtime::Handle,
    cfg: &TrainConfig,
    policy_dir: &Path,
) -> anyhow::Result<EngineSet> {
    let r = &cfg.rollout;
    // Deterministic: one row, no reuse, so no token's arithmetic depends on another's.
    let (rows, kv_reuse) = match r.deterministic {
        true => (1, false),
        false => (r.concurrency.max(1), true),
    };
    // One seed for all: a token is drawn from (seed, episode, position), so what an episode
    // samples does not depend on which engine it was routed to.
    let config = EngineConfig {
        max_batch_rows: rows,
        max_context: r.max_context_length,
        parked_kv_bytes: r.parked_kv_mib.saturating_mul(1 << 20),
        prefault_parked_kv: r.prefault_parked_kv,
        memory_fraction: r.memory_fraction,
        cuda_graphs: r.cuda_graphs,
        max_prefill_tokens: r.max_prefill_tokens,
        seed: cfg.training.seed as i64,
        kv_reuse,
        ..Default::default()
    };
    let placements = cfg.engine_placements()?;
    let many = placements.len() > 1;
    let mut engines = Vec::new();
    for (i, (label, placement)) in placements.into_iter().enumerate() {
        let config = EngineConfig {
            metrics_label: i.to_string(),
            ..config.clone()
        };
        let engine = setup::engine(rt, policy_dir, placement, config)
            .with_context(|| format!("engine {i} on {label}"))?;
        if many {
            eprintln!("engine {i} on {label}");
        }
        engines.push((format!("{label} (engine {i})"), engine));
    }
    Ok(EngineSet::new(engines)?)
}

/// The supervised learner over the start policy (a critic and a KL reference when the
/// config needs them), its optimizer state restored on a resume. `faults` may slow every
/// update or hang the first (fault injection for `bench train` and tests).
async fn start_learner(
    cfg: &TrainConfig,
    start: &StartPoint,
    reference_dir: &Path,
    placement: Placement,
    faults: &Faults,
) -> anyhow::Result<LearnerRef> {
    let seed = cfg.training.seed;
    let mut config = cfg.learner_config();
    config.initial_version = start.state.policy_version;
    config.seed = seed.wrapping_add(start.state.step);
    let needs_critic = config.algorithm.estimator.needs_critic();
    let with_reference = config.algorithm.kl.active().is_some();
    let policy_dir = start.policy_dir.clone();
    // A separate critic resumes from its checkpoint (`policy/critic`), else starts from
    // `critic.model` or the policy's starting weights with a fresh value head.
    let critic_dir = (needs_critic && cfg.critic.separate).then(|| {
        let saved = policy_dir.join(CRITIC_DIR);
        if saved.join("config.json").is_file() {
            saved
        } else {
            cfg.critic
                .model
                .clone()
                .unwrap_or_else(|| policy_dir.clone())
        }
    });
    if let Some(dir) = &critic_dir {
        eprintln!("critic: a separate model, from {}", dir.display());
    }
    let reference_dir = reference_dir.to_path_buf();
    let value_head_on_policy = needs_critic && critic_dir.is_none();
    let load = move || {
        tch::manual_seed(seed as i64);
        let policy = PolicyModel::load(&policy_dir, placement, value_head_on_policy)?;
        let critic = critic_dir
            .map(|dir| PolicyModel::load(&dir, placement, true))
            .transpose()?;
        let reference = if with_reference {
            Some(PolicyModel::load(&reference_dir, placement, false)?)
        } else {
            None
        };
        Ok(LearnerModels {
            policy,
            critic,
            reference,
        })
    };
    let delay = faults.learner_delay;
    let hang = faults.hangs(HangStage::Learner);
    let before_update: Option<BeforeUpdate> = (delay.is_some() || hang).then(|| {
        Arc::new(move |_| {
            if hang {
                faults::hang_forever("a learner update");
            }
            if let Some(delay) = delay {
                std::thread::sleep(delay);
            }
        }) as BeforeUpdate
    });
    let learner = LearnerRef::spawn(LearnerStart {
        before_update,
        ..LearnerStart::new(load, config)
    })
    .await
    .context("starting the learner")?;
    if let Some(path) = &start.optimizer_state {
        learner
            .load_optimizer(path.clone())
            .await
            .with_context(|| format!("restoring the optimizer state {}", path.display()))?;
        eprintln!("AdamW state restored from {OPTIMIZER_STATE}");
    }
    Ok(learner)
}

/// The rollout setups of training (sampled) and of the held-out evaluation (greedy when
/// `eval.greedy`), with `[rollout]`'s waits.
pub(crate) fn rollout_setups(
    cfg: &TrainConfig,
    engine: &EngineSet,
    tokenizer: &Arc<HfTokenizer>,
    scenario: &Scenario,
    live: &LiveBoard,
    stall: &StallWatch,
) -> anyhow::Result<(RolloutSetup, RolloutSetup)> {
    let r = &cfg.rollout;
    let knobs = RolloutKnobs {
        concurrency: r.concurrency,
        max_turns: r.max_turns,
        max_context: r.max_context_length,
        max_prompt: Some(r.max_prompt_length),
        max_new_tokens: r.max_response_length,
        temperature: r.temperature,
        tool_call_format: cfg.model.tool_call_format,
        max_tool_calls_per_turn: cfg.env.max_tool_calls_per_turn,
    };
    let eval_knobs = RolloutKnobs {
        temperature: if cfg.eval.greedy { 0.0 } else { r.temperature },
        ..knobs
    };
    let build = |knobs: &RolloutKnobs| -> anyhow::Result<RolloutSetup> {
        let mut setup = setup::rollout_setup(
            engine.clone(),
            tokenizer.clone(),
            scenario.env.clone(),
            scenario.tools.clone(),
            knobs,
        )?;
        setup.live = live.clone();
        setup.stall = Some(stall.clone());
        setup.context_policy = scenario.context_policy.clone();
        setup.episode.generate_timeout = Duration::from_secs_f64(r.generate_timeout_secs);
        setup.episode.tool_queue_timeout = Duration::from_secs_f64(r.tool_queue_timeout_secs);
        setup.episode.env_timeout = Duration::from_secs_f64(r.env_timeout_secs);
        setup.episode.workflow_timeout = Duration::from_secs_f64(r.workflow_timeout_secs);
        Ok(setup)
    };
    let mut train = build(&knobs)?;
    train.episode.sampling.top_p = r.top_p;
    Ok((train, build(&eval_knobs)?))
}

/// The run's summary: updates, outcomes of the episodes, held-out scores before and after,
/// where things are; the curves are redrawn.
fn summarize(
    run: &Run,
    interrupted: bool,
    sampled: &RolloutSummary,
    warm: Value,
) -> anyhow::Result<Value> {
    let snapshot = run.sampler.snapshot();
    let curves = write_plots(&run.run_dir)?;
    let evals: Vec<EvalRow> = read_rows(&run.run_dir.join("eval.jsonl"))?;
    let (first, last) = (evals.first(), evals.last());
    Ok(json!({
        "updates": run.step,
        "interrupted": interrupted,
        "policy_version": run.version,
        "data_position": snapshot.position,
        "pending_trajectories": snapshot.pending.len(),
        "episodes_requeued": sampled.requeued,
        "episodes_failed": sampled.failed,
        "env_restarts": sampled.env_restarts,
        "em_before": first.map(|e| e.em),
        "em_after": last.map(|e| e.em),
        "f1_before": first.map(|e| e.f1),
        "f1_after": last.map(|e| e.f1),
        "tool_calls_before": first.map(|e| e.tool_calls_per_episode),
        "tool_calls_after": last.map(|e| e.tool_calls_per_episode),
        "eval_step_before": first.map(|e| e.step),
        "eval_step_after": last.map(|e| e.step),
        "warm_start": warm,
        "wall_s": run.started.elapsed().as_secs_f64(),
        "run_dir": run.run_dir.display().to_string(),
        "checkpoint": run.last_checkpoint.map(|s| checkpoint::checkpoints_dir(&run.run_dir).join(format!("step-{s}")).display().to_string()),
        "curves": curves.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    }))
}

/// The end-of-run table a person reads (the JSON summary follows it for scripts): held-out
/// scores before and after RL, tool use, wall time, and where the results are.
pub fn summary_table(summary: &Value) -> String {
    let num = |key: &str| match summary.get(key).and_then(Value::as_f64) {
        Some(v) => format!("{v:.3}"),
        None => "-".to_string(),
    };
    let text = |key: &str| summary.get(key).and_then(Value::as_str).unwrap_or("-");
    let step = |key: &str| {
        summary
            .get(key)
            .and_then(Value::as_u64)
            .map_or("-".to_string(), |s| format!("step {s}"))
    };
    let curves = summary
        .get("curves")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let rows = [
        (
            "held-out",
            format!("before RL ({})", step("eval_step_before")),
            format!("after RL ({})", step("eval_step_after")),
        ),
        ("EM", num("em_before"), num("em_after")),
        ("F1", num("f1_before"), num("f1_after")),
        (
            "tool calls / episode",
            num("tool_calls_before"),
            num("tool_calls_after"),
        ),
    ];
    let mut out = String::new();
    for (name, before, after) in rows {
        out.push_str(&format!("{name:<22}{before:>22}{after:>22}\n"));
    }
    out.push_str(&format!(
        "updates {}, wall {} s\nrun directory: {}\ncheckpoint: {}\ncurves: {}",
        summary.get("updates").and_then(Value::as_u64).unwrap_or(0),
        summary
            .get("wall_s")
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |w| format!("{w:.0}")),
        text("run_dir"),
        text("checkpoint"),
        if curves.is_empty() { "-" } else { &curves },
    ));
    out
}

/// The loop; returns whether it was interrupted by a signal.
async fn train_loop(run: &mut Run, resumed: bool) -> anyhow::Result<bool> {
    // The engine loaded the start weights as version 0: give it the learner's version.
    run.version = publish(
        run.learner.clone(),
        run.engine.clone(),
        run.stall.publication(),
        "the start weights".into(),
    )
    .await?;
    let updates = run.cfg.training.updates;
    if !resumed && run.cfg.eval.every > 0 {
        run.evaluate().await?;
    }
    let mut interrupted = false;
    let bar = progress_bar(updates, run.step);
    while run.step < updates {
        let sample_t0 = Instant::now();
        let idle_before = run.engine.stats().await.ok().map(|s| s.idle_seconds);
        let Some(batch) = run.next_batch().await? else {
            interrupted = true;
            break;
        };
        let sample_secs = sample_t0.elapsed().as_secs_f64();
        let idle_after = run.engine.stats().await.ok().map(|s| s.idle_seconds);
        let idle_while_sampling = idle_before.zip(idle_after).map(|(a, b)| b - a);
        let episode_ids = batch.iter().map(|t| t.episode_id).collect();
        let (s, stats, times) = run.update(batch).await?;
        let secs = times.seconds;
        let row = UpdateRow {
            policy_version: run.version,
            data_position: run.sampler.position(),
            engine_idle_during_update_seconds: times.engine_idle,
            engine_idle_while_sampling_seconds: idle_while_sampling,
            update_window_seconds: times.learner_window,
            sample_seconds: sample_secs,
            seconds: secs,
            wall_s: run.started.elapsed().as_secs_f64(),
            episode_ids,
            ..UpdateRow::new(run.step, &s, &stats)
        };
        append_row(&run.run_dir.join("metrics.jsonl"), &row)?;
        metrics::gauge!(crate::metric_names::TRAIN_UPDATE_STEP.name).set(run.step as f64);
        run.live.touch(format!("update {}", run.step));
        metrics::gauge!(crate::metric_names::TRAIN_REWARD_MEAN.name).set(s.reward_mean);
        metrics::gauge!(crate::metric_names::TRAIN_TOOL_CALLS_PER_EPISODE.name)
            .set(s.tool_calls_per_episode);
        for (k, v) in &s.metrics {
            metrics::gauge!(crate::metric_names::TRAIN_METRIC_MEAN.name, "metric" => k.clone())
                .set(*v);
        }
        metrics::histogram!(crate::metric_names::TRAIN_UPDATE_SECONDS.name).record(secs);
        metrics::histogram!(crate::metric_names::TRAIN_SAMPLE_SECONDS.name).record(sample_secs);
        bar.set_position(run.step);
        log_line(&bar, format!(
            "update {:>4}/{updates}  reward {:+.3}  em {:.3}  f1 {:.3}  calls/ep {:.2}  pg {:+.4}  ent {:.3}  kept {}/{}  sample {:.1}s  update {:.1}s",
            run.step,
            s.reward_mean,
            s.metric("em"),
            s.metric("f1"),
            s.tool_calls_per_episode,
            stats.policy_loss,
            stats.entropy,
            stats.trajectories_kept,
            s.episodes,
            sample_secs,
            secs
        ));
        let step = run.step;
        let every = |n: u64| n > 0 && step % n == 0;
        if every(run.cfg.eval.every) {
            run.evaluate().await?;
            write_plots(&run.run_dir)?;
        }
        if every(run.cfg.checkpoint.every) {
            run.checkpoint_with_retries(false).await?;
        }
    }
    bar.finish_and_clear();
    if !interrupted && run.cfg.eval.every > 0 && run.last_eval != Some(run.step) {
        run.evaluate().await?;
    }
    let snapshot = run.sampler.snapshot();
    if run.last_checkpoint != Some(run.step)
        || !snapshot.pending.is_empty()
        || !snapshot.open.is_empty()
    {
        run.checkpoint_with_retries(true).await?;
    }
    Ok(interrupted)
}

/// A bar over the updates on a terminal; hidden otherwise, where the per-update log lines
/// are the record (a bar's redraws would only litter a log file).
fn progress_bar(updates: u64, done: u64) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(updates).with_position(done);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} updates (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Writes a log line above the bar (or plainly, when the bar is hidden).
fn log_line(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Redraws the curves from `metrics.jsonl` and `eval.jsonl`.
fn write_plots(run_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let train: Vec<UpdateRow> = read_rows(&run_dir.join("metrics.jsonl"))?;
    let eval: Vec<EvalRow> = read_rows(&run_dir.join("eval.jsonl"))?;
    let curves = plot::Curves {
        reward: train
            .iter()
            .map(|r| (r.step as f64, r.reward_mean))
            .collect(),
        train_em: train.iter().map(|r| (r.step as f64, r.em)).collect(),
        eval_em: eval.iter().map(|r| (r.step as f64, r.em)).collect(),
    };
    plot::write_curves(run_dir, &curves)
}

#[cfg(test)]
mod tests {
    use agent_r1_envs::envs::prompt::qa_system_prompt;
    use agent_r1_envs::tool_call::ToolCallFormat;

    use super::*;

    fn system_prompt_of(extra_model: &str, extra_options: &str) -> String {
        let cfg = TrainConfig::from_toml_str(&format!(
            "[model]\npreset = \"tiny\"\ndevice = \"cpu\"\n{extra_model}\n\
             [env]\nname = \"synthetic_multihop\"\n[env.world]\nn_questions = 20\n\
             [env.options]\n{extra_options}\n"
        ))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let scenario = scenario(&cfg, dir.path(), &Registries::builtins()).unwrap();
        let EnvSource::Shared(env) = &scenario.env else {
            panic!("a plain env")
        };
        env.reset(&scenario.train[0]).unwrap()[0].content.clone()
    }

    /// The QA env reads calls in the model's format: the tiny preset's (hermes), the one
    /// `[model]` names, or the one `[env.options]` names over it.
    #[test]
    fn envs_read_tool_calls_in_the_models_format() {
        assert_eq!(
            system_prompt_of("", ""),
            qa_system_prompt(ToolCallFormat::Hermes)
        );
        assert_eq!(
            system_prompt_of("tool_call_format = \"mistral\"", ""),
            qa_system_prompt(ToolCallFormat::Mistral)
        );
        assert_eq!(
            system_prompt_of(
                "tool_call_format = \"mistral\"",
                "tool_call_format = \"llama3_json\""
            ),
            qa_system_prompt(ToolCallFormat::Llama3Json)
        );
        assert_ne!(
            qa_system_prompt(ToolCallFormat::Mistral),
            qa_system_prompt(ToolCallFormat::Llama3Json)
        );
    }
}
