//! `agent-r1 check-config`: validates a training config the way `train` will, before a run
//! is started, and prints it with every default filled in.
//!
//! The resolved TOML goes to stdout (it is itself a valid config, so it can be saved to pin
//! the defaults of this version); a summary goes to stderr. `--explain` prints every key
//! instead: its default, type, allowed values and meaning, one line each.

use std::path::PathBuf;

use crate::checkpoint::latest_complete;
use crate::config::{explain, explain_line, FileCheck, TrainConfig};
use crate::memory::{device_capacity, plan, sharding_plans, ShapeSource};
use crate::preflight::preflight;
use crate::registries::Registries;
use agent_r1_actors::device::parse_placement_elsewhere;
use agent_r1_actors::learner::ShardMode;
use agent_r1_actors::memory_plan::gib;
use agent_r1_actors::model::Placement;

/// Arguments of `agent-r1 check-config`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// The training config (TOML).
    #[arg(required_unless_present_any = ["explain", "explain_metrics"])]
    config: Option<PathBuf>,
    /// Print every config key, one per line, as `key = default  # type; allowed; meaning`
    /// (and check nothing).
    #[arg(long, conflicts_with_all = ["skip_machine_checks", "device_memory_gib", "shape"])]
    explain: bool,
    /// Print every series `/metrics` serves, one per line, as
    /// `name  # kind; unit; labels; meaning` (and check nothing).
    #[arg(
        long,
        conflicts_with_all = ["explain", "skip_machine_checks", "device_memory_gib", "shape"]
    )]
    explain_metrics: bool,
    /// Skip what depends on this machine: reading the model's tokenizer, the dataset files
    /// and the corpus (and the longest prompt), that the device is present, and the resume
    /// look-up (for checking a config elsewhere).
    #[arg(long)]
    skip_machine_checks: bool,
    /// Plan memory against this many GiB instead of the device's own (e.g. 80 for an H100
    /// when checking on another machine).
    #[arg(long)]
    device_memory_gib: Option<f64>,
    /// Plan memory with this built-in model shape instead of `model.dir`'s config (for a
    /// machine without the model): qwen2.5-0.5b, qwen2.5-1.5b, qwen3-1.7b, llama3.2-1b,
    /// qwen2.5-7b, llama3.1-8b.
    #[arg(long)]
    shape: Option<String>,
    /// Also plan the learner as this many ranks, one per device like the configured one
    /// (a full fine-tune spread over N GPUs), in each sharding mode, and say the least
    /// sharding that fits (1 to 64).
    #[arg(long, conflicts_with_all = ["explain", "explain_metrics"])]
    learner_ranks: Option<usize>,
}

pub(crate) fn run(args: CheckConfigArgs, registries: &Registries) -> anyhow::Result<()> {
    if args.explain_metrics {
        return print_lines(crate::metric_names::all().map(explain_metric));
    }
    let Some(path) = args.config.clone().filter(|_| !args.explain) else {
        return print_lines(explain(registries).iter().map(explain_line));
    };
    let files = if args.skip_machine_checks {
        FileCheck::Skip
    } else {
        FileCheck::Require
    };
    let config = TrainConfig::load(&path, files, registries)?;
    if !args.skip_machine_checks {
        let read = preflight(&config, registries).map_err(|e| e.in_file(&path))?;
        eprint!("{read}");
    }
    // Without machine checks the device need not exist here: plan for what it names.
    let placement = if args.skip_machine_checks {
        parse_placement_elsewhere(&config.model.device, &config.model.dtype)?
    } else {
        config.placement()?
    };
    let source = match &args.shape {
        Some(name) => Some(ShapeSource::Shape(name)),
        // The model is not looked at: its shape is unknown.
        None if args.skip_machine_checks && config.model.dir.is_some() => None,
        None => Some(ShapeSource::Config),
    };
    match source {
        Some(source) => check_memory(
            &config,
            placement,
            source,
            args.device_memory_gib,
            args.learner_ranks,
        )?,
        None => eprintln!(
            "memory plan: skipped (the model is not read with --skip-machine-checks; give \
             --shape NAME to plan with a built-in shape)"
        ),
    }
    print!("{}", config.to_toml_string());
    let learner = config.learner_config();
    eprintln!(
        "ok: {} (estimator {}, {} updates, {} tasks x {} episodes per update)",
        path.display(),
        learner.algorithm.estimator.as_str(),
        config.training.updates,
        config.rollout.batch_size,
        config.rollout.group_size,
    );
    if !args.skip_machine_checks {
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

/// Prints the memory plan and its verdict against `gib` GiB (or the device's own memory);
/// a plan that does not fit is the command's error.
fn check_memory(
    config: &TrainConfig,
    placement: Placement,
    source: ShapeSource<'_>,
    gib_given: Option<f64>,
    learner_ranks: Option<usize>,
) -> anyhow::Result<()> {
    if let Some(n) = learner_ranks.filter(|n| !(1..=64).contains(n)) {
        anyhow::bail!("--learner-ranks: got {n}; allowed: 1 to 64");
    }
    let memory = plan(config, placement, source)?;
    eprintln!(
        "memory plan ({:?} {:?}):\n{memory}",
        placement.device, placement.kind
    );
    let capacity = match gib_given {
        Some(g) if g.is_finite() && g > 0.0 => Some((g * (1u64 << 30) as f64) as u64),
        Some(g) => anyhow::bail!("--device-memory-gib: got {g}; allowed: a positive number"),
        None => device_capacity(placement.device),
    };
    if let Some(ranks) = learner_ranks {
        print_sharding(config, placement, source, ranks, capacity)?;
    }
    match capacity {
        Some(c) => match memory.check(placement.device, c) {
            Ok(()) => eprintln!("memory: fits ({} of {})", gib(memory.total()), gib(c)),
            Err(why) => anyhow::bail!("{why}"),
        },
        None => {
            eprintln!("memory: the device's capacity is unknown here; pass --device-memory-gib")
        }
    }
    Ok(())
}

/// Each sharding mode's per-rank peak on `ranks` devices of `capacity` bytes, and the
/// least sharding that fits.
fn print_sharding(
    config: &TrainConfig,
    placement: Placement,
    source: ShapeSource<'_>,
    ranks: usize,
    capacity: Option<u64>,
) -> anyhow::Result<()> {
    let plans = sharding_plans(config, placement, source, ranks)?;
    let on = capacity.map_or(String::new(), |c| format!(" of {}", gib(c)));
    eprintln!(
        "learner on {ranks} ranks, one per {:?}{on} (peak per rank; rank 0 beside the \
         engines on its device):",
        placement.device
    );
    let fits = |p: &agent_r1_actors::memory_plan::MemoryPlan| {
        capacity.map(|c| p.check(placement.device, c).is_ok())
    };
    // The least sharding that fits as configured, and with the engines on other devices.
    let (mut here, mut apart) = (None, None);
    for (mode, [leader, alone, other]) in &plans {
        let verdict = match (fits(leader), fits(alone), fits(other)) {
            (Some(true), _, Some(true)) => {
                here.get_or_insert(*mode);
                apart.get_or_insert(*mode);
                ": fits"
            }
            (_, Some(true), Some(true)) => {
                apart.get_or_insert(*mode);
                ": fits with the engines on other devices"
            }
            (None, _, _) => "",
            _ => ": does not fit",
        };
        let needs = if *mode == ShardMode::Parameters && !config.learner.recompute {
            " (with learner.recompute = true)"
        } else {
            ""
        };
        eprintln!(
            "  shard = {:<18} rank 0 {} ({} without the engines), ranks 1..{} {} each{needs}{verdict}",
            format!("{:?}", mode.as_str()),
            gib(leader.total()),
            gib(alone.total()),
            ranks - 1,
            gib(other.total()),
        );
    }
    match (capacity, here, apart) {
        (None, _, _) => {
            eprintln!("  (the device's capacity is unknown here: pass --device-memory-gib)")
        }
        (Some(_), Some(mode), _) => eprintln!(
            "  needs at least shard = {:?} on {ranks} ranks",
            mode.as_str()
        ),
        (Some(_), None, Some(mode)) => eprintln!(
            "  needs at least shard = {:?} on {ranks} ranks, with the engines on other devices \
             (rollout.devices)",
            mode.as_str()
        ),
        (Some(_), None, None) => eprintln!(
            "  no sharding fits on {ranks} ranks: more ranks, LoRA ([lora]), or smaller \
             micro-batches (learner.max_tokens_per_micro_batch)"
        ),
    }
    if ranks > 1 && placement.device != tch::Device::Cpu {
        eprintln!("  (learner ranks on GPUs, over NCCL, are not built yet: this is their plan)");
    }
    Ok(())
}

/// `name  # kind; unit; labels; meaning`, from the series' declaration.
fn explain_metric(m: &agent_r1_envs::metric::Metric) -> String {
    let unit = m.unit.map_or("-", |u| u.as_str());
    let labels = if m.labels.is_empty() {
        "no labels".to_string()
    } else {
        format!("labels {}", m.labels.join(", "))
    };
    let kind = format!("{:?}", m.kind).to_lowercase();
    format!("{}  # {kind}; {unit}; {labels}; {}", m.name, m.help_text())
}

/// Prints one line each; a closed stdout (`| head`) ends the listing quietly.
fn print_lines(lines: impl Iterator<Item = String>) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for line in lines {
        match writeln!(out, "{line}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
    }
    Ok(())
}
