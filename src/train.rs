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

mod base_model;
mod build;
mod checkpointing;
mod evaluate;
pub mod faults;
mod journal;
pub mod learner_ranks;
pub mod plot;
pub mod records;
mod sampler;
mod scenario;
mod skip;
mod summary;
pub mod tasks;
mod update;

use base_model::{base_model, StartPoint};
use build::{check_memory, resume_point, serve_metrics, start_learner, start_watchdog};
pub(crate) use build::{rollout_setups, start_engines};
pub use evaluate::{evaluate_tasks, write_trajectories};
use scenario::log_scenario;
pub use scenario::{scenario, Scenario};
use summary::{engine_summary, log_line, progress_bar, summarize, write_plots};
pub use summary::{lift_standard_error, summary_table, EngineSummary, RunSummary};
use update::{publish, republish_after_restarts};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agent_r1_actors::engine::EngineFaults;
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::LearnerRef;
use agent_r1_actors::runtime::{CallLedger, LiveBoard, RolloutSetup};
use agent_r1_actors::stall::StallWatch;
use agent_r1_actors::tokenizer::HfTokenizer;

use crate::critic_prefix::TemplatePrefix;
use agent_r1_envs::call_journal::CallJournal;
use agent_r1_envs::task::Task;
use anyhow::Context;
use sampler::Sampler;
use serde_json::Value;

use crate::cluster::trainer::TrainerCluster;
use crate::config::{FileCheck, TrainConfig};
use crate::preflight::{preflight, Preflight};
use crate::registries::Registries;
use crate::setup;
use faults::Faults;
use records::{append_row, UpdateRow};
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
    /// The plan the engines read (handed to them when `faults` has any fault; the update
    /// loop arms it at the moments `faults` names).
    engine_faults: EngineFaults,
    /// Finished tool calls, kept for the episodes a resume would sample again.
    journal: Arc<CallJournal>,
    /// Remote workers, when `[cluster] listen` is set.
    cluster: Option<TrainerCluster>,
    /// Batches in a row in which every episode failed (`training.max_failed_batches`).
    failed_batches: u64,
}

impl Run {}

/// Runs `agent-r1 train`; returns the final summary (also printed as the last line).
///
/// The stages, in order: the run directory and its config, the resume point, the env and its
/// tasks, the base model (a preset and the warm start), the start point (policy, state,
/// pending samples), the engine, the supervised learner, the rollout service, the loop, the
/// summary.
pub fn run(args: &TrainArgs) -> anyhow::Result<RunSummary> {
    let started = Instant::now();
    let cfg = args.config.load(&args.registries)?;
    // What the run will read is read before anything is created (as `check-config` does).
    args.config.preflight(&cfg, &args.registries)?;
    let run_dir = args.out.clone().unwrap_or(cfg.training.run_dir.clone());
    std::fs::create_dir_all(run_dir.join("rollouts"))
        .with_context(|| format!("{}: cannot create the run directory", run_dir.display()))?;
    let placement = cfg.placement()?;
    check_memory(&cfg, placement)?;
    learner_ranks::check_ranks(&cfg.learner_config(), placement)?;
    let rt = setup::actor_runtime()?;
    let stop = Arc::new(AtomicBool::new(false));
    install_signal_handler(&rt, stop.clone());
    let live = LiveBoard::default();
    let stall = StallWatch::new(cfg.stall.clone());
    let _watchdog = start_watchdog(&stall)?;
    let _metrics = serve_metrics(&cfg, &run_dir, &live, &stall)?;
    let resumed = resume_point(&cfg, &run_dir, args.resume)?;
    let journal = journal::open(&run_dir)?;
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
            return Ok(RunSummary::stopped_before_training(
                run_dir,
                Value::Null,
                started.elapsed().as_secs_f64(),
            ));
        }
        Err(e) => return Err(e),
    };
    log_scenario(&cfg, &scenario);
    args.faults.apply_to_scenario(&mut scenario)?;
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
        return Ok(RunSummary::stopped_before_training(
            run_dir,
            base.warm,
            started.elapsed().as_secs_f64(),
        ));
    }
    let start = StartPoint::load(&run_dir, resumed.as_ref(), &base.dir, cfg.adapter_source())?;
    let tokenizer = Arc::new(
        HfTokenizer::from_dir(&start.policy_dir)?
            .with_template_kwargs(cfg.model.chat_template_kwargs.clone())?,
    );
    let engine_faults = EngineFaults::new();
    let engine = start_engines(
        rt.handle(),
        &cfg,
        &start.policy_dir,
        start.adapter.as_ref(),
        args.faults.any().then_some(&engine_faults),
    )?;
    stall.engine(engine.stall_probe());
    // The asymmetric critic's prefix, checked on every task with the policy's tokenizer
    // before anything trains.
    let critic_prefix = TemplatePrefix::new(&cfg.critic, tokenizer.clone())?;
    if let Some(prefix) = &critic_prefix {
        let longest = prefix.check(scenario.train.iter().chain(&scenario.test))?;
        eprintln!("critic prefix: up to {longest} tokens");
    }
    // Dropped after the learner (declared before it): rank 0's learner tells the other
    // ranks to stop as it closes, and they are given a moment to end on their own.
    let (learner, _followers) = rt.block_on(start_learner(
        &cfg,
        &start,
        &base.dir,
        placement,
        critic_prefix,
        &args.faults,
        &run_dir,
    ))?;
    let republisher = {
        let _in_runtime = rt.enter();
        republish_after_restarts(&engine, learner.clone(), &stall)
    };
    let (mut train_setup, eval_setup) =
        rollout_setups(&cfg, &engine, &tokenizer, &scenario, &live, &stall)?;
    train_setup.calls = CallLedger::journaled(journal.clone());
    let mut sampler = rt.block_on(Sampler::start(
        train_setup,
        TaskStream::new(scenario.train, cfg.training.seed),
        start.state.data_position,
        cfg.rollout.group_size,
        cfg.rollout.batch_size,
        stop,
    ))?;
    sampler.restore(start.pending);
    sampler.restore_in_flight(start.in_flight);
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
        engine_faults,
        journal,
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
    summarize(
        &run,
        interrupted,
        &sampled?.summary,
        base.warm,
        engines,
        cluster,
    )
}

/// The exit code of a run failed by the stall detector.
pub const STALL_EXIT_CODE: i32 = 3;

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

#[cfg(test)]
mod tests {
    use agent_r1_actors::runtime::EnvSource;
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
