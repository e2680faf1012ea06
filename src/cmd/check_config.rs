//! `agent-r1 check-config`: validates a training config the way `train` will, before a run
//! is started, and prints it with every default filled in.
//!
//! The resolved TOML goes to stdout (it is itself a valid config, so it can be saved to pin
//! the defaults of this version); a summary goes to stderr.

use std::path::PathBuf;

use agent_r1::checkpoint::latest_complete;
use agent_r1::config::{FileCheck, TrainConfig};

/// Arguments of `agent-r1 check-config`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// The training config (TOML).
    config: PathBuf,
    /// Skip what depends on this machine: that model and dataset files exist, that the
    /// device is present, and the resume look-up (for checking a config elsewhere).
    #[arg(long)]
    skip_machine_checks: bool,
}

pub(crate) fn run(args: CheckConfigArgs) -> anyhow::Result<()> {
    let files = if args.skip_machine_checks {
        FileCheck::Skip
    } else {
        FileCheck::Require
    };
    let config = TrainConfig::load(&args.config, files)?;
    print!("{}", config.to_toml_string());
    let learner = config.learner_config();
    eprintln!(
        "ok: {} (estimator {}, {} updates, {} tasks x {} episodes per update)",
        args.config.display(),
        learner.estimator.as_str(),
        config.training.updates,
        config.rollout.batch_size,
        config.rollout.group_size,
    );
    if !args.skip_machine_checks {
        let placement = config.placement()?;
        eprintln!(
            "device: {:?}, dtype: {:?}",
            placement.device, placement.kind
        );
        if config.checkpoint.resume {
            match latest_complete(&config.training.run_dir)? {
                Some(c) => eprintln!(
                    "resume: from {} (step {}, policy version {})",
                    c.dir.display(),
                    c.step(),
                    c.manifest.state.policy_version
                ),
                None => eprintln!(
                    "resume: no complete checkpoint in {}; a fresh run",
                    config.training.run_dir.display()
                ),
            }
        }
    }
    Ok(())
}
