//! `agent-r1 bench train`: the training loop end to end, on one fixed short config, in several
//! variants run one after the other in one sitting:
//!
//! - `streaming sync` and `streaming async`: this binary's loop (one rollout service per run);
//! - `slow learner`: the regime async training is for, where sampling a batch takes longer
//!   than an update (long generations on a busy engine). At `--slow-learner-concurrency`
//!   episodes in flight a sync run measures a batch's sampling time S and an update's L; then
//!   sync and async runs whose learner sleeps at the start of every update (fault injection)
//!   so that an update lasts about 3/4 S; async samples up to two batches ahead;
//! - `chunked sync` and `chunked async`: the loop before the rollout service (the actor tree
//!   built and torn down per chunk of episodes), when `--old-binary` names a build of it.
//!
//! Every variant is a `train` subprocess on the same model, tasks and seed; its figures come
//! from its `metrics.jsonl`: samples per second over the loop (the sum of each update's wait
//! for its batch and the update itself), seconds per update, and the engine's idle share of
//! the learner's updates (and, beside it, of the loop's waits for batches: the engine's idle
//! share while only sampling runs). An async run's last `batches_ahead` updates come after its last
//! task was sampled (the engine has nothing left to do) and are left out of the idle share.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::{json, Value};

use crate::train::records::read_jsonl;

/// Flags of `agent-r1 bench train`.
#[derive(Debug, clap::Args)]
pub(crate) struct TrainBench {
    /// The policy to start from (a model directory). Without it, a short warm start on the
    /// synthetic env's demonstrations makes one first (so episodes call tools over several
    /// turns, as a real run's do).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Warm-start steps when no --model is given.
    #[arg(long, default_value_t = 400)]
    warm_start_steps: usize,
    /// A build of the old chunked loop (e.g. commit 3be517b's `agent-r1`), run on the same
    /// config as the `chunked` variants.
    #[arg(long)]
    old_binary: Option<PathBuf>,
    /// Updates per variant.
    #[arg(long, default_value_t = 6)]
    updates: u64,
    /// Tasks per update (each sampled `--group-size` times).
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Episodes per task.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Episodes in flight (and the engine's batch rows).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Episodes in flight in the slow-learner runs (fewer rows per decode step make sampling
    /// the longer stage, as it is on a real model).
    #[arg(long, default_value_t = 4)]
    slow_learner_concurrency: usize,
    /// The slow-learner runs' sleep per update in milliseconds, instead of the calibrated one
    /// (3/4 of a batch's sampling time less an update's, measured without contention: on
    /// shared CPU cores the learner computes slower beside sampling, and an update made that
    /// long outlasts a batch's sampling).
    #[arg(long)]
    slow_learner_delay_ms: Option<u64>,
    /// The device every run trains and samples on (`cpu`, `cuda`, `cuda:N`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where the runs go (default: a temporary directory, removed afterwards).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One run of the comparison.
struct Variant {
    name: String,
    binary: PathBuf,
    mode: &'static str,
    /// Extra `[training]` lines (keys the old binary does not know go only to new runs).
    training: String,
    learner_delay_ms: Option<u64>,
    concurrency: usize,
    /// Async: batches sampled ahead; the last this many updates run after the run's last
    /// task was sampled (the engine has nothing left to do), and are left out of the idle
    /// share.
    ahead: usize,
}

/// What a variant measured.
#[derive(Debug, Clone, Default)]
struct Figures {
    updates: usize,
    episodes: u64,
    loop_seconds: f64,
    learner_seconds: f64,
    sample_wait_seconds: f64,
    /// Engine idle seconds during learner calls, and those calls' wall seconds (new binary).
    engine_idle: Option<(f64, f64)>,
    /// Engine idle seconds while the loop waited for batches, and those waits' seconds.
    sampling_idle: Option<(f64, f64)>,
    stale_tokens_dropped: u64,
    staleness_max: u64,
}

impl Figures {
    fn of(rows: &[Value], ahead: usize) -> Self {
        let f = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let u = |r: &Value, k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
        let mut out = Figures {
            updates: rows.len(),
            ..Default::default()
        };
        let mut idle = Some((0.0, 0.0));
        let mut sampling_idle = Some((0.0, 0.0));
        let sampling = rows.len().saturating_sub(ahead);
        for (i, r) in rows.iter().enumerate() {
            out.episodes += u(r, "episodes");
            out.loop_seconds += f(r, "sample_seconds") + f(r, "seconds");
            out.sample_wait_seconds += f(r, "sample_seconds");
            out.learner_seconds += f(r, "update_seconds");
            out.stale_tokens_dropped += u(r, "stale_tokens_dropped");
            out.staleness_max = out.staleness_max.max(u(r, "staleness_max"));
            let during = r
                .get("engine_idle_during_update_seconds")
                .and_then(Value::as_f64);
            let window = r.get("update_window_seconds").and_then(Value::as_f64);
            let while_sampling = r
                .get("engine_idle_while_sampling_seconds")
                .and_then(Value::as_f64);
            sampling_idle = match (sampling_idle, while_sampling) {
                (Some((idle, w)), Some(d)) => Some((idle + d, w + f(r, "sample_seconds"))),
                _ => None,
            };
            idle = match (idle, during, window) {
                (Some(sums), Some(_), Some(_)) if i >= sampling => Some(sums),
                (Some((idle, w)), Some(d), Some(win)) => Some((idle + d, w + win)),
                _ => None,
            };
        }
        out.engine_idle = idle;
        out.sampling_idle = sampling_idle.filter(|(_, w)| *w > 0.1);
        out
    }

    fn samples_per_second(&self) -> f64 {
        self.episodes as f64 / self.loop_seconds.max(1e-9)
    }

    fn seconds_per_update(&self) -> f64 {
        self.loop_seconds / self.updates.max(1) as f64
    }

    fn idle_percent(&self) -> Option<f64> {
        self.engine_idle
            .map(|(idle, window)| 100.0 * idle / window.max(1e-9))
    }

    fn sampling_idle_percent(&self) -> Option<f64> {
        self.sampling_idle
            .map(|(idle, window)| 100.0 * idle / window.max(1e-9))
    }
}

pub(crate) fn run(args: TrainBench) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg!(feature = "fault-injection"),
        "bench train slows the learner down by fault injection (`train --learner-delay-ms`), \
         which this build leaves out: build with `cargo build --release --features \
         fault-injection`"
    );
    anyhow::ensure!(args.updates >= 2, "--updates must be at least 2");
    anyhow::ensure!(
        args.batch_size > 0
            && args.group_size > 0
            && args.concurrency > 0
            && args.slow_learner_concurrency > 0,
        "--batch-size, --group-size, --concurrency and --slow-learner-concurrency must be at \
         least 1"
    );
    let (_tmp, out) = crate::cli::bench_support::runs_dir(args.out.as_deref())?;
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create", out.display()))?;
    let this = std::env::current_exe().context("locating this binary")?;
    if let Some(old) = &args.old_binary {
        anyhow::ensure!(
            old.is_file(),
            "--old-binary {}: no such file",
            old.display()
        );
    }
    let model = match &args.model {
        Some(dir) => dir.clone(),
        None => warm_start(&this, &out, &args)?,
    };
    anyhow::ensure!(
        model.join("config.json").is_file(),
        "{}: not a model directory (no config.json)",
        model.display()
    );

    let mut variants = Vec::new();
    if let Some(old) = &args.old_binary {
        for mode in ["sync", "async"] {
            variants.push(Variant {
                name: format!("chunked {mode}"),
                binary: old.clone(),
                mode,
                training: String::new(),
                learner_delay_ms: None,
                concurrency: args.concurrency,
                ahead: usize::from(mode == "async"),
            });
        }
    }
    for mode in ["sync", "async"] {
        variants.push(Variant {
            name: format!("streaming {mode}"),
            binary: this.clone(),
            mode,
            training: String::new(),
            learner_delay_ms: None,
            concurrency: args.concurrency,
            ahead: usize::from(mode == "async"),
        });
    }
    let mut results: Vec<(String, Figures)> = Vec::new();
    for v in &variants {
        let figures = run_variant(v, &model, &out, &args)?;
        print_row(&v.name, &figures);
        results.push((v.name.clone(), figures));
    }
    // The slow learner: first the sync loop's sampling and update times at this concurrency,
    // then an update made to last about 3/4 of a batch's sampling.
    let c = args.slow_learner_concurrency;
    let calibration = Variant {
        name: format!("streaming sync, c={c}"),
        binary: this.clone(),
        mode: "sync",
        training: String::new(),
        learner_delay_ms: None,
        concurrency: c,
        ahead: 0,
    };
    let sync = run_variant(&calibration, &model, &out, &args)?;
    print_row(&calibration.name, &sync);
    results.push((calibration.name.clone(), sync.clone()));
    let per_batch_sampling = sync.sample_wait_seconds / sync.updates.max(1) as f64;
    let per_update_learner = sync.learner_seconds / sync.updates.max(1) as f64;
    let calibrated = ((0.75 * per_batch_sampling - per_update_learner).max(0.5) * 1000.0) as u64;
    let delay_ms = args.slow_learner_delay_ms.unwrap_or(calibrated);
    eprintln!(
        "slow learner: at {c} episodes in flight a batch took {per_batch_sampling:.2} s to \
         sample and an update {per_update_learner:.2} s; each update now sleeps {delay_ms} ms \
         first"
    );
    for (mode, training) in [
        ("sync", String::new()),
        (
            "async",
            "batches_ahead = 2\nmax_staleness = 2\n".to_string(),
        ),
    ] {
        let v = Variant {
            name: format!("streaming {mode}, c={c}, slow learner"),
            binary: this.clone(),
            mode,
            training,
            learner_delay_ms: Some(delay_ms),
            concurrency: c,
            ahead: if mode == "async" { 2 } else { 0 },
        };
        let figures = run_variant(&v, &model, &out, &args)?;
        print_row(&v.name, &figures);
        results.push((v.name, figures));
    }

    println!();
    println!(
        "{:<40}{:>11}{:>12}{:>11}{:>15}{:>15}{:>9}",
        "variant",
        "samples/s",
        "s / update",
        "learner s",
        "idle: updates",
        "idle: waiting",
        "dropped"
    );
    for (name, f) in &results {
        println!(
            "{name:<40}{:>11.1}{:>12.2}{:>11.2}{:>15}{:>15}{:>9}",
            f.samples_per_second(),
            f.seconds_per_update(),
            f.learner_seconds / f.updates.max(1) as f64,
            percent(f.idle_percent()),
            percent(f.sampling_idle_percent()),
            f.stale_tokens_dropped,
        );
    }
    Ok(())
}

fn percent(p: Option<f64>) -> String {
    p.map_or("-".to_string(), |p| format!("{p:.1}%"))
}

fn print_row(name: &str, f: &Figures) {
    let row = json!({
        "bench": "train",
        "variant": name,
        "updates": f.updates,
        "episodes": f.episodes,
        "loop_s": f.loop_seconds,
        "samples_per_s": f.samples_per_second(),
        "s_per_update": f.seconds_per_update(),
        "learner_s_per_update": f.learner_seconds / f.updates.max(1) as f64,
        "sample_wait_s": f.sample_wait_seconds,
        "engine_idle_during_updates_pct": f.idle_percent(),
        "engine_idle_while_waiting_for_batches_pct": f.sampling_idle_percent(),
        "stale_tokens_dropped": f.stale_tokens_dropped,
        "staleness_max": f.staleness_max,
    });
    println!("{row}");
}

/// The fixed config: the synthetic multi-hop env with BM25 search, GRPO, multi-turn episodes.
/// Only keys every compared build knows.
fn config(
    model: &Path,
    mode: &str,
    training: &str,
    args: &TrainBench,
    updates: u64,
    concurrency: usize,
) -> String {
    format!(
        r#"[model]
dir = "{model}"
device = "{device}"
dtype = "float32"
[env]
name = "synthetic_multihop"
[env.world]
seed = 0
n_questions = 400
test_fraction = 0.2
[env.options]
reward = "agent_r1_qa"
max_observation_chars = 1024
[tools.search]
top_k = 3
[algorithm]
estimator = "grpo"
actor_lr = 5e-4
micro_batch_size = 16
[algorithm.kl]
placement = "off"
[rollout]
batch_size = {batch}
group_size = {group}
max_turns = 4
max_prompt_length = 384
max_response_length = 64
max_context_length = 1024
concurrency = {concurrency}
[training]
updates = {updates}
mode = "{mode}"
seed = 0
{training}[warm_start]
steps = 0
[checkpoint]
every = 0
[eval]
every = 0
[metrics]
enabled = false
"#,
        model = model.display(),
        device = args.device,
        batch = args.batch_size,
        group = args.group_size,
    )
}

/// A short warm start (with this binary) whose model every variant starts from.
fn warm_start(this: &Path, out: &Path, args: &TrainBench) -> anyhow::Result<PathBuf> {
    let dir = out.join("warm-start");
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = config(Path::new("unused"), "sync", "", args, 1, args.concurrency)
        .replace("[model]\ndir = \"unused\"", "[model]\npreset = \"tiny\"");
    let cfg = cfg.replace(
        "[warm_start]\nsteps = 0",
        &format!(
            "[warm_start]\nsteps = {}\nbatch_size = 8\nlearning_rate = 5e-3\nfinal_lr_fraction = 1.0",
            args.warm_start_steps
        ),
    );
    eprintln!(
        "warm start: {} steps on the synthetic env's demonstrations",
        args.warm_start_steps
    );
    train(this, &dir, &cfg, None)?;
    Ok(dir.join("model-sft"))
}

fn run_variant(
    v: &Variant,
    model: &Path,
    out: &Path,
    args: &TrainBench,
) -> anyhow::Result<Figures> {
    let dir = out.join(v.name.replace([' ', ','], "-"));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{}: {} train ...", v.name, v.binary.display());
    let cfg = config(
        model,
        v.mode,
        &v.training,
        args,
        args.updates,
        v.concurrency,
    );
    train(&v.binary, &dir, &cfg, v.learner_delay_ms)?;
    let rows = read_jsonl(&dir.join("metrics.jsonl"))?;
    anyhow::ensure!(
        rows.len() as u64 == args.updates,
        "{}: {} of {} updates in {}",
        v.name,
        rows.len(),
        args.updates,
        dir.join("metrics.jsonl").display()
    );
    Ok(Figures::of(&rows, v.ahead))
}

/// Runs `binary train` on `cfg` into `dir`; its output goes to `dir/train.log`.
fn train(binary: &Path, dir: &Path, cfg: &str, delay_ms: Option<u64>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let config = dir.join("bench.toml");
    std::fs::write(&config, cfg).with_context(|| format!("{}: cannot write", config.display()))?;
    let log_path = dir.join("train.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("{}: cannot create", log_path.display()))?;
    let mut cmd = Command::new(binary);
    cmd.arg("train")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(dir)
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(ms) = delay_ms {
        cmd.arg("--learner-delay-ms").arg(ms.to_string());
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    anyhow::ensure!(
        status.success(),
        "{} train failed ({status}); see {}",
        binary.display(),
        log_path.display()
    );
    Ok(())
}
