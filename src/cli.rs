//! The `agent-r1` command line, as a library function: [`main`] takes the [`Registries`] the
//! commands build tools and envs from, so a user's crate gets every command with its own
//! kinds known. One module per subcommand.
//!
//! Library crates return typed errors; here they become one line on stderr and exit code 2,
//! so scripts can tell a usage or input error from a crash.

use clap::{CommandFactory, Parser, Subcommand};

use crate::registries::Registries;

pub(crate) mod bench;
pub(crate) mod bench_decode;
pub(crate) mod bench_demo;
pub(crate) mod bench_fuzz;
pub(crate) mod bench_learner;
pub(crate) mod bench_support;
pub(crate) mod bench_train;
pub(crate) mod bench_weights;
pub(crate) mod check_config;
pub(crate) mod eval;
pub(crate) mod eval_answers;
pub(crate) mod export;
pub(crate) mod generate;
pub(crate) mod init_model;
pub(crate) mod rollout;
pub(crate) mod sft;
pub(crate) mod tool;
pub(crate) mod train;
pub(crate) mod view;
pub(crate) mod worker;

/// End-to-end reinforcement learning of tool-using LLM agents.
#[derive(Debug, Parser)]
#[command(name = "agent-r1", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Tells glibc's malloc to serve large blocks from its heaps and keep freed memory there.
///
/// libtorch allocates tensors with malloc. By default a block over 128 KiB (adjusted upward
/// as blocks are freed) gets fresh mmap'd pages, and the first write to each 4 KiB page
/// faults, so a tensor of a few MB allocated and freed every step pays its page faults every
/// step. Measured when the engine still parked each finished turn's KV in a new ~1 MB tensor
/// (1024 episodes, 2 cores): parking went from 0.59-0.94 s to 0.38 s, and peak RSS did not
/// grow. Parked KV now lives in the engine's own pool; other tensors of that size (the
/// learner's, the batch's temporaries) still come from malloc.
/// Blocks above 32 MiB (the largest threshold glibc allows) still get their own mapping;
/// free memory at a heap's top past 256 MiB is returned to the system.
fn keep_freed_memory_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evaluate a model directory or a training checkpoint on an env's tasks (EM, F1, reward,
    /// tool calls and the env's other metrics).
    Eval(eval::EvalArgs),
    /// Score predictions with the official HotpotQA answer metrics (em, f1, precision, recall).
    EvalAnswers(eval_answers::EvalAnswersArgs),
    /// Write a LoRA adapter merged into its base as a Hugging Face model directory
    /// (`--merge --adapter DIR --out DIR`).
    Export(export::ExportArgs),
    /// Generate a continuation of a prompt with a model directory.
    Generate(generate::GenerateArgs),
    /// Run episodes through the actor runtime and write their trajectories.
    Rollout(rollout::RolloutCmd),
    /// Create a model directory from a built-in preset (tokenizer, config, weights).
    InitModel(init_model::InitModelArgs),
    /// Call a tool by hand, as the model would.
    #[command(subcommand)]
    Tool(tool::ToolCmd),
    /// Validate a training config (as `train` will) and print it with defaults filled in.
    CheckConfig(check_config::CheckConfigArgs),
    /// Train a policy with RL as a config file describes (checkpoints, resume, evaluation,
    /// metrics, curves).
    Train(train::TrainCmdArgs),
    /// Join a running `train` as a remote rollout worker (its `[cluster] listen` address):
    /// engines, episodes and tools here, weights fetched from the trainer.
    Worker(worker::WorkerCmdArgs),
    /// Serve a run directory's web UI (run, episodes, episode and live pages) read-only.
    View(view::ViewArgs),
    /// Supervised warm start on one's own demonstrations (chat-messages JSONL with tool
    /// calls), rendered as the training config's run will render them.
    Sft(sft::SftArgs),
    /// Benchmarks that print figures.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// One learner rank other than 0, started by `train` with `learner.ranks > 1`.
    #[command(hide = true)]
    LearnerRank(LearnerRankArgs),
}

/// `agent-r1 learner-rank`: what `train` passes to each rank it starts.
#[derive(Debug, clap::Args)]
struct LearnerRankArgs {
    /// The learner plan `train` wrote (`RUN/learner-ranks/plan.json`).
    #[arg(long)]
    plan: std::path::PathBuf,
    /// The rendezvous file of the ranks.
    #[arg(long)]
    store: std::path::PathBuf,
    /// This rank, 1 to `learner.ranks - 1`.
    #[arg(long)]
    rank: usize,
    /// Fault injection (a test double): this rank kills itself (SIGKILL) as it starts this
    /// update (from 1).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    inject_kill_at_update: Option<u64>,
    /// Fault injection (a test double): this rank stops (SIGSTOP: it hangs) as it starts this
    /// update (from 1).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    inject_hang_at_update: Option<u64>,
}

/// The command line's definition (every subcommand and its arguments), for checking a command
/// line without running it: `definition().try_get_matches_from(args)`.
pub fn definition() -> clap::Command {
    Cli::command()
}

/// Runs the `agent-r1` command line with `registries`: parses the process's arguments, runs
/// the command and exits (code 2 with one line on stderr for a usage or input error).
///
/// The `agent-r1` binary is `main(Registries::builtins())`; a user's crate registers its own
/// tools and envs first and gets the same commands with them known.
pub fn main(registries: Registries) -> ! {
    keep_freed_memory_mapped();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENT_R1_LOG")
                .unwrap_or_else(|_| "warn,ractor_cluster=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Eval(args) => eval::run(args, &registries),
        Command::EvalAnswers(args) => eval_answers::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Export(args) => export::run(args),
        Command::InitModel(args) => init_model::run(args),
        Command::Rollout(args) => rollout::run_rollout_cmd(args),
        Command::Sft(args) => sft::run(args, &registries),
        Command::Bench(cmd) => bench::run(cmd),
        Command::CheckConfig(args) => check_config::run(args, &registries),
        Command::Tool(cmd) => tool::run_cmd(cmd, &registries),
        Command::Train(args) => train::run(args, registries),
        Command::View(args) => view::run(args),
        Command::Worker(args) => worker::run(args, registries),
        Command::LearnerRank(args) => {
            #[cfg(feature = "fault-injection")]
            let kill_at = match (args.inject_kill_at_update, args.inject_hang_at_update) {
                (Some(u), _) => Some((u, libc::SIGKILL)),
                (None, Some(u)) => Some((u, libc::SIGSTOP)),
                (None, None) => None,
            };
            #[cfg(not(feature = "fault-injection"))]
            let kill_at = None;
            crate::train::learner_ranks::follow(&args.plan, &args.store, args.rank, kill_at)
                .inspect_err(|e| {
                    eprintln!("error: learner rank {}: {e:#}", args.rank);
                    std::process::exit(crate::train::STALL_EXIT_CODE);
                })
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
    std::process::exit(0)
}
