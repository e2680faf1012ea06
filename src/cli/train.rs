//! `agent-r1 train --config FILE.toml [--out DIR] [--resume]`: the training daemon (see
//! [`crate::train`]). Logs go to stderr; the last stdout line is one JSON summary.

use std::path::PathBuf;

use crate::registries::Registries;
#[cfg(not(feature = "fault-injection"))]
use crate::train::faults::Faults;
#[cfg(feature = "fault-injection")]
use crate::train::faults::{HangStage, RankFault};
use crate::train::{self, ConfigSource, TrainArgs};

/// Flags of `agent-r1 train`.
#[derive(Debug, clap::Args)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["config", "preset"])))]
pub(crate) struct TrainCmdArgs {
    /// The training config (see examples/*.toml and `check-config`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A built-in config instead of a file: `demo` (= examples/demo.toml).
    #[arg(long)]
    preset: Option<String>,
    /// Run directory (default: the config's training.run_dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the newest complete checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
    /// Fault injection (hidden flags, in a build with `fault-injection` only).
    #[cfg(feature = "fault-injection")]
    #[command(flatten)]
    faults: FaultFlags,
}

pub(crate) fn run(args: TrainCmdArgs, registries: Registries) -> anyhow::Result<()> {
    let source = match (args.config, args.preset) {
        (Some(path), _) => ConfigSource::File(path),
        (None, Some(name)) => ConfigSource::Preset(name),
        (None, None) => anyhow::bail!("pass --config FILE.toml or --preset demo"),
    };
    let summary = train::run(&TrainArgs {
        config: source,
        out: args.out,
        resume: args.resume,
        registries,
        #[cfg(feature = "fault-injection")]
        faults: args.faults.into(),
        #[cfg(not(feature = "fault-injection"))]
        faults: Faults,
    })
    .inspect_err(|e| {
        // A learner rank gone or hung ends the run as a stall does: with its exit code, so a
        // supervisor restarts it and the resume continues from the newest checkpoint.
        let rank_failed = e.chain().any(|c| {
            c.downcast_ref::<agent_r1_actors::Error>()
                .is_some_and(agent_r1_actors::Error::is_learner_rank_failure)
        });
        if rank_failed {
            eprintln!("error: {e:#}");
            eprintln!(
                "the run fails: a learner rank failed (exit code {})",
                train::STALL_EXIT_CODE
            );
            std::process::exit(train::STALL_EXIT_CODE);
        }
    })?;
    println!("{}", train::summary_table(&summary));
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

/// The hidden fault-injection flags of `train`, for tests, the soak and `bench train`.
#[cfg(feature = "fault-injection")]
#[derive(Debug, clap::Args)]
struct FaultFlags {
    /// Fault injection for `bench train`: the learner sleeps this many milliseconds at the
    /// start of every update.
    #[arg(long, hide = true)]
    learner_delay_ms: Option<u64>,
    /// Fault injection for tests: every checkpoint write pauses this many milliseconds
    /// before it commits.
    #[arg(long, hide = true)]
    checkpoint_delay_ms: Option<u64>,
    /// Fault injection for the crash-only test: every checkpoint write waits until an episode
    /// in flight has finished a step, so the checkpoint holds one to continue on resume.
    #[arg(long, hide = true)]
    checkpoint_with_a_finished_step: bool,
    /// Fault injection for the stall detector's tests: this stage hangs for good (env, tool,
    /// engine, learner, publication, checkpoint).
    #[arg(long, hide = true)]
    inject_hang: Option<HangStage>,
    /// Fault injection for the crash-only test: the engine thread hangs for good once this
    /// many updates are done.
    #[arg(long, hide = true)]
    inject_engine_hang_after_updates: Option<u64>,
    /// Fault injection for the soak (`scripts/soak.sh`): this fraction of every tool's calls
    /// panics, overruns its timeout or fails (a third each), and every turn that made no call
    /// calls every tool (0: calls without faults, for tests of tool side effects).
    #[arg(long, hide = true)]
    inject_tool_faults: Option<f64>,
    /// Fault injection for the engine actor's test: once the first update's weights are
    /// published, every engine thread panics after this many decode steps.
    #[arg(long, hide = true)]
    inject_engine_panic_after: Option<u64>,
    /// Fault injection for the sampler's test: once the first update's weights are
    /// published, every engine stops for good.
    #[arg(long, hide = true)]
    inject_engine_stop_after_update: bool,
    /// Fault injection for the learner ranks' test: `RANK:UPDATE[:STOP]`, that rank's
    /// process kills itself (SIGKILL), or stops (SIGSTOP: a hung rank), as it starts that
    /// update (from 1).
    #[arg(long, hide = true, value_parser = parse_rank_fault)]
    inject_learner_rank_kill: Option<RankFault>,
}

#[cfg(feature = "fault-injection")]
fn parse_rank_fault(s: &str) -> Result<RankFault, String> {
    let mut parts = s.split(':');
    let (Some(rank), Some(update)) = (parts.next(), parts.next()) else {
        return Err(format!(
            "{s:?}: expected RANK:UPDATE or RANK:UPDATE:STOP, e.g. 1:3"
        ));
    };
    let hang = match parts.next() {
        None => false,
        Some("STOP") => true,
        Some(other) => return Err(format!("{other:?}: expected STOP or nothing")),
    };
    Ok(RankFault {
        rank: rank.parse().map_err(|e| format!("{rank:?}: {e}"))?,
        update: update.parse().map_err(|e| format!("{update:?}: {e}"))?,
        hang,
    })
}

#[cfg(feature = "fault-injection")]
impl From<FaultFlags> for crate::train::faults::Faults {
    fn from(f: FaultFlags) -> Self {
        use std::time::Duration;
        Self {
            learner_delay: f.learner_delay_ms.map(Duration::from_millis),
            checkpoint_delay: f.checkpoint_delay_ms.map(Duration::from_millis),
            checkpoint_with_a_finished_step: f.checkpoint_with_a_finished_step,
            hang: f.inject_hang,
            engine_hang_after_updates: f.inject_engine_hang_after_updates,
            tool_fault_rate: f.inject_tool_faults,
            engine_panic_after_steps: f.inject_engine_panic_after,
            engine_stop_after_first_update: f.inject_engine_stop_after_update,
            learner_rank_kill: f.inject_learner_rank_kill,
        }
    }
}
