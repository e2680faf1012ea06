//! `agent-r1 rollout` and `agent-r1 bench rollout`: many concurrent episodes through the
//! actor runtime, writing trajectories or printing throughput figures.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_r1_actors::engine::{EngineConfig, EngineStats};
use agent_r1_actors::runtime::{run_rollout, ContextPolicies, ContextPolicy, RolloutReport};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{Trajectory, TrajectoryWriter};
use agent_r1_envs::env::Env;
use agent_r1_envs::synthetic::SyntheticConfig;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::Tool;
use agent_r1_envs::tool_call::ToolCallFormat;

use super::bench_support::peak_rss_mb;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::config::{RolloutSection, ENGINE_MAX_PENDING, ENGINE_REQUEST_TIMEOUT};
use crate::setup::{self, RolloutKnobs};

/// Environments these commands can build on their own.
const ENVS: &[&str] = &["synthetic_multihop"];

/// Flags shared by `rollout` and `bench rollout`.
#[derive(Debug, clap::Args)]
pub(crate) struct RolloutArgs {
    /// Model directory.
    #[arg(long)]
    model: PathBuf,
    /// How the model writes tool calls (hermes, llama3_json); default: what its chat
    /// template teaches.
    #[arg(long)]
    tool_call_format: Option<ToolCallFormat>,
    /// Environment.
    #[arg(long, default_value = "synthetic_multihop")]
    env: String,
    /// Episodes to run (tasks are cycled when there are fewer).
    #[arg(long, default_value_t = 64)]
    episodes: usize,
    /// Episodes in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Task split: train or test.
    #[arg(long, default_value = "train")]
    split: String,
    /// Most assistant turns per episode.
    #[arg(long, default_value_t = 5)]
    max_turns: usize,
    /// Longest generated turn, in tokens.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Longest episode context, in tokens.
    #[arg(long, default_value_t = 2048)]
    max_context: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Rows decoded together by the engine.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Size of the pool of KV parked for episodes waiting on tools (MiB).
    #[arg(long, default_value_t = 2048)]
    parked_kv_mib: usize,
    /// The share of the device's total memory the engine may use, its weights included: it
    /// then sizes its rows (at most --max-batch) and parked-KV pool from the device's memory
    /// (instead of --parked-kv-mib) and prints the plan.
    #[arg(long, value_parser = memory_fraction)]
    memory_fraction: Option<f64>,
    /// Decode without CUDA graphs (on a GPU they are used where they can be captured).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Most tokens one prefill pass runs (a longer turn gets a pass of its own).
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u64).range(1..))]
    max_prefill_tokens: u64,
    /// Fault the parked-KV pool's memory in as it is first used, instead of touching all of
    /// it when the engine starts (resident memory then grows with what is parked).
    #[arg(long)]
    lazy_parked_kv: bool,
    /// Prefill every turn's whole context: no parked or shared-prefix KV (the baseline that
    /// KV reuse is measured against).
    #[arg(long)]
    no_kv_reuse: bool,
    /// Seed of the world and of sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Faulty and slow tools (in a build with `fault-injection` only).
    #[cfg(feature = "fault-injection")]
    #[command(flatten)]
    tool_faults: ToolFaultFlags,
    /// What each turn sees of the history: full, window, elide or summary (docs/contexts.md).
    #[arg(long, default_value = "full")]
    context_policy: String,
    /// The context policy's options, as JSON: `{"turns": 2}` for window, `{"keep_turns": 1}`
    /// for elide, `{"budget_tokens": 512}` for summary.
    #[arg(long, default_value = "{}")]
    context_options: String,
    /// Where the world's corpus and search index are cached.
    #[arg(long, default_value = "runs/cache")]
    cache: PathBuf,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    device: String,
}

/// Flags of `rollout`.
#[derive(Debug, clap::Args)]
pub(crate) struct RolloutCmd {
    #[command(flatten)]
    common: RolloutArgs,
    /// Trajectories JSONL (ids and decoded text).
    #[arg(long, default_value = "rollouts.jsonl")]
    out: PathBuf,
}

/// Flags of `bench rollout`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchRolloutCmd {
    #[command(flatten)]
    common: RolloutArgs,
    /// Print one JSON object (always on; kept for scripts that pass it).
    #[arg(long)]
    json: bool,
}

struct Outcome {
    report: RolloutReport,
    engine: EngineStats,
    wall: Duration,
    steps: Vec<f64>,
    tokens: u64,
    step_count: u64,
    prefill_with_reuse: u64,
    context_tokens: u64,
    rebuilt_steps: u64,
}

fn validate(a: &RolloutArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        ENVS.contains(&a.env.as_str()),
        "--env: `{}` is not supported here (allowed: {})",
        a.env,
        ENVS.join(", ")
    );
    anyhow::ensure!(a.episodes > 0, "--episodes must be at least 1");
    anyhow::ensure!(a.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(a.max_turns > 0, "--max-turns must be at least 1");
    let (fault_rate, _) = a.tool_faults();
    anyhow::ensure!(
        (0.0..=1.0).contains(&fault_rate),
        "--tool-fault-rate must be in [0, 1], got {fault_rate}"
    );
    anyhow::ensure!(
        a.split == "train" || a.split == "test",
        "--split: `{}` (allowed: train, test)",
        a.split
    );
    Ok(())
}

/// `--context-policy` with `--context-options`, checked as `[env.context]` is.
fn context_policy(a: &RolloutArgs) -> anyhow::Result<Arc<dyn ContextPolicy>> {
    let options: serde_json::Value = serde_json::from_str(&a.context_options)
        .map_err(|e| anyhow::anyhow!("--context-options: not JSON ({e}): {}", a.context_options))?;
    let policy = ContextPolicies::with_builtins()
        .create(&a.context_policy, &options)
        .map_err(|e| anyhow::anyhow!("--context-policy {}: {e}", a.context_policy))?;
    policy
        .check_fits(a.max_context)
        .map_err(|e| anyhow::anyhow!("--context-options: {e}"))?;
    Ok(policy)
}

fn execute(
    a: &RolloutArgs,
    mut on_trajectory: impl FnMut(&Trajectory) -> anyhow::Result<()>,
) -> anyhow::Result<Outcome> {
    validate(a)?;
    let placement = agent_r1_actors::device::parse_placement(&a.device, "auto")?;
    let tokenizer = Arc::new(HfTokenizer::from_dir(&a.model)?);
    let scenario = setup::synthetic(
        &a.cache.join(format!("synthetic-{}", a.seed)),
        SyntheticConfig {
            seed: a.seed,
            ..Default::default()
        },
        3,
    )?;
    let pool: &[Task] = if a.split == "train" {
        &scenario.train
    } else {
        &scenario.test
    };
    anyhow::ensure!(!pool.is_empty(), "the {} split has no tasks", a.split);
    let tasks: Vec<(Task, u64)> = (0..a.episodes)
        .map(|i| (pool[i % pool.len()].clone(), i as u64))
        .collect();
    #[allow(unused_mut)] // set only in a build with `fault-injection`
    let mut search: Arc<dyn Tool> = scenario.search.clone();
    #[cfg(feature = "fault-injection")]
    {
        let (rate, latency_ms) = a.tool_faults();
        if rate > 0.0 || latency_ms > 0 {
            search = Arc::new(agent_r1_actors::runtime::fault::FaultyTool::new(
                search,
                rate,
                Duration::from_millis(latency_ms),
                a.seed,
            ));
        }
    }
    // What this command has no flag for is as a `train` config's `[rollout]` leaves it.
    let defaults = RolloutSection::default();
    let rt = setup::actor_runtime()?;
    let engine = setup::engine(
        rt.handle(),
        &a.model,
        None,
        placement,
        EngineConfig {
            max_batch_rows: a.max_batch,
            max_batch_tokens: a.max_batch * a.max_context,
            max_context: a.max_context,
            parked_kv_bytes: a.parked_kv_mib.saturating_mul(1 << 20),
            seed: a.seed as i64,
            kv_reuse: !a.no_kv_reuse,
            prefault_parked_kv: !a.lazy_parked_kv,
            memory_fraction: a.memory_fraction,
            cuda_graphs: !a.no_cuda_graphs,
            max_prefill_tokens: a.max_prefill_tokens as usize,
            max_pending: ENGINE_MAX_PENDING,
            request_timeout: ENGINE_REQUEST_TIMEOUT,
            metrics_label: "0".into(),
        },
        None,
    )?;
    let knobs = RolloutKnobs {
        concurrency: a.concurrency,
        max_turns: a.max_turns,
        max_context: a.max_context,
        max_prompt: None,
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        tool_call_format: a.tool_call_format,
        max_tool_calls_per_turn: 1,
        top_p: defaults.top_p,
        tool_schemas_in_prompt: defaults.tool_schemas_in_prompt,
        waits: defaults.waits(),
    };
    let env: Arc<dyn Env> = scenario.env.clone();
    let mut setup = setup::rollout_setup(engine.clone(), tokenizer, env, vec![search], &knobs)?;
    setup.context_policy = context_policy(a)?;
    let rt = setup::actor_runtime()?;
    let bar = ProgressBar::new(a.episodes as u64);
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} episodes {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let mut steps = Vec::new();
    let (mut tokens, mut step_count, mut prefill, mut context) = (0u64, 0u64, 0u64, 0u64);
    let mut rebuilt = 0u64;
    let result: anyhow::Result<(RolloutReport, EngineStats)> = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(256);
        let run = tokio::spawn(run_rollout(setup, tasks, tx));
        while let Some(t) = rx.recv().await {
            for s in &t.steps {
                steps.push((s.generate_seconds + s.tool_seconds) * 1000.0);
                prefill += s.prefill_tokens as u64;
                context += s.context_len as u64;
            }
            step_count += t.steps.len() as u64;
            rebuilt += t.rebuilt_steps() as u64;
            tokens += t.generated_tokens() as u64;
            on_trajectory(&t)?;
            bar.inc(1);
        }
        let report = run.await.context("the rollout task panicked")??;
        let stats = engine.stats().await?;
        engine.shutdown();
        Ok((report, stats))
    });
    bar.finish_and_clear();
    let (report, stats) = result?;
    if let Some(fatal) = &report.summary.fatal {
        anyhow::bail!("the rollout stopped: {fatal}");
    }
    Ok(Outcome {
        report,
        engine: stats,
        wall: started.elapsed(),
        steps,
        tokens,
        step_count,
        prefill_with_reuse: prefill,
        context_tokens: context,
        rebuilt_steps: rebuilt,
    })
}

pub(crate) fn run_rollout_cmd(cmd: RolloutCmd) -> anyhow::Result<()> {
    let tokenizer = Arc::new(HfTokenizer::from_dir(&cmd.common.model)?);
    let mut writer = TrajectoryWriter::create(&cmd.out, Some(tokenizer))?;
    let outcome = execute(&cmd.common, |t| Ok(writer.write(t)?))?;
    writer.flush()?;
    let s = &outcome.report.summary;
    eprintln!(
        "{} completed, {} failed, {} re-queued in {:.1}s; trajectories in {}",
        s.completed,
        s.failed,
        s.requeued,
        outcome.wall.as_secs_f64(),
        cmd.out.display()
    );
    Ok(())
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx]
}

pub(crate) fn run_bench(cmd: BenchRolloutCmd) -> anyhow::Result<()> {
    let mut outcome = execute(&cmd.common, |_| Ok(()))?;
    outcome.steps.sort_by(f64::total_cmp);
    let wall = outcome.wall.as_secs_f64();
    let s = &outcome.report.summary;
    let e = &outcome.engine;
    let mut out = json!({
        "episodes": cmd.common.episodes,
        "concurrency": cmd.common.concurrency,
        "max_batch": cmd.common.max_batch,
        "kv_reuse": !cmd.common.no_kv_reuse,
        "parked_kv_mib": cmd.common.parked_kv_mib,
        "parked_kv_prefaulted": !cmd.common.lazy_parked_kv,
        "tool_fault_rate": cmd.common.tool_faults().0,
        "tool_latency_ms": cmd.common.tool_faults().1,
        "episodes_completed": s.completed,
        "episodes_failed": s.failed,
        "episodes_requeued": s.requeued,
        "episodes_lost": cmd.common.episodes as u64 - s.completed - s.failed,
        "tool_restarts": outcome.report.tool_restarts.values().sum::<u64>(),
        "tool_calls_shed": outcome.report.tool_shed.values().sum::<u64>(),
        "steps": outcome.step_count,
        "tokens_generated": outcome.tokens,
        "wall_s": wall,
        "tokens_per_s": outcome.tokens as f64 / wall,
        "episodes_per_s": s.completed as f64 / wall,
        "mean_batch_size": e.mean_batch_size(),
        "p50_step_latency_ms": percentile(&outcome.steps, 0.5),
        "p99_step_latency_ms": percentile(&outcome.steps, 0.99),
        "peak_rss_mb": peak_rss_mb(),
        "overhead_fraction": (1.0 - e.forward_seconds / wall).max(0.0),
        "forward_s": e.forward_seconds,
        "decode_s": e.decode_seconds,
        "prefill_padding_tokens": e.prefill_padding_tokens,
        "engine_idle_s": e.idle_seconds,
        "engine_admit_s": e.admit_seconds,
        "engine_finish_s": e.finish_seconds,
        "engine_stop_check_s": e.stop_check_seconds,
        "context_policy": cmd.common.context_policy,
        "rebuilt_steps": outcome.rebuilt_steps,
        "context_tokens": outcome.context_tokens,
        "prefill_tokens": outcome.prefill_with_reuse,
        "reused_tokens": e.reused_tokens,
        "shared_prefix_tokens": e.shared_prefix_tokens,
        "kv_parked_in_place": e.parked_in_place,
        "kv_evictions": e.evictions,
        "kv_evicted_tokens": e.evicted_tokens,
        "kv_slot_mb": e.slot_bytes as f64 / 1048576.0,
    });
    out["decode_steps"] = json!(e.decode_steps);
    out["graph_decode_steps"] = json!(e.graph_decode_steps);
    out["cuda_graphs_off"] = json!(e.cuda_graphs_off);
    println!("{out}");
    Ok(())
}

/// `--memory-fraction`: a share in (0, 1].
fn memory_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("`{text}` is not a share of memory in (0, 1]")),
    }
}

/// Faulty and slow tools for `bench rollout` (fault injection, a test double).
#[cfg(feature = "fault-injection")]
#[derive(Debug, clap::Args)]
struct ToolFaultFlags {
    /// Fraction of tool calls that panic, hang past their timeout, or fail (fault injection).
    #[arg(long, default_value_t = 0.0)]
    tool_fault_rate: f64,
    /// Extra latency of every tool call, in milliseconds.
    #[arg(long, default_value_t = 0)]
    tool_latency_ms: u64,
}

impl RolloutArgs {
    /// The search tool's fault rate and extra latency in milliseconds (none in a build
    /// without `fault-injection`).
    fn tool_faults(&self) -> (f64, u64) {
        #[cfg(feature = "fault-injection")]
        return (
            self.tool_faults.tool_fault_rate,
            self.tool_faults.tool_latency_ms,
        );
        #[cfg(not(feature = "fault-injection"))]
        (0.0, 0)
    }
}
