//! Building a run's parts from its config: the memory check, the metrics server, the stall
//! watchdog, the engines, the learner and the rollout setups.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use agent_r1_actors::engine::{EngineConfig, EngineFaults};
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::{LearnerRef, LearnerStart, CRITIC_DIR};
use agent_r1_actors::model::lora::{AdapterSource, ADAPTER_CONFIG_FILE};
use agent_r1_actors::model::Placement;
use agent_r1_actors::runtime::{LiveBoard, RolloutSetup};
use agent_r1_actors::stall::{StallWatch, Watchdog};
use agent_r1_actors::tokenizer::HfTokenizer;

use super::base_model::StartPoint;
use super::faults::Faults;
use super::learner_ranks::{Followers, LearnerPlan, ModelPlan, ReferencePlan};
use super::scenario::Scenario;
use super::{OPTIMIZER_STATE, STALL_EXIT_CODE};
use crate::config::TrainConfig;
use crate::critic_prefix::TemplatePrefix;
use crate::setup::RolloutKnobs;
use crate::view::Site;
use crate::{checkpoint, memory, metrics_server, setup};

/// Refuses to start when the planned memory does not fit the device (unless
/// `learner.check_memory = false`).
pub(super) fn check_memory(cfg: &TrainConfig, placement: Placement) -> anyhow::Result<()> {
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
pub(super) fn serve_metrics(
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

/// Starts the stall detector's watchdog. With `stall.fail_run`, the first stall ends the
/// process with its diagnosis and [`STALL_EXIT_CODE`]: a stuck stage may hold the threads a
/// graceful stop would need, and the newest checkpoint is where a resume continues.
pub(super) fn start_watchdog(stall: &StallWatch) -> anyhow::Result<Watchdog> {
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

/// The newest complete checkpoint when resuming is allowed; an error when checkpoints exist
/// and it is not.
pub(super) fn resume_point(
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

/// The engines over the start policy (one per `rollout.devices` entry, else one on
/// `model.device`), each sized from `[rollout]`, all reading `faults` when given (fault
/// injection).
pub(crate) fn start_engines(
    rt: &tokio::runtime::Handle,
    cfg: &TrainConfig,
    policy_dir: &Path,
    adapter: Option<&AdapterSource>,
    faults: Option<&EngineFaults>,
) -> anyhow::Result<EngineSet> {
    let config = cfg.engine_config();
    let placements = cfg.engine_placements()?;
    let many = placements.len() > 1;
    let mut engines = Vec::new();
    for (i, (label, placement)) in placements.into_iter().enumerate() {
        let config = EngineConfig {
            metrics_label: i.to_string(),
            ..config.clone()
        };
        let engine = setup::engine(rt, policy_dir, adapter, placement, config, faults.cloned())
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
pub(super) async fn start_learner(
    cfg: &TrainConfig,
    start: &StartPoint,
    reference_dir: &Path,
    placement: Placement,
    critic_prefix: Option<TemplatePrefix>,
    faults: &Faults,
    run_dir: &Path,
) -> anyhow::Result<(LearnerRef, Option<Followers>)> {
    let seed = cfg.training.seed;
    let mut config = cfg.learner_config();
    config.initial_version = start.state.policy_version;
    config.seed = seed.wrapping_add(start.state.step);
    let needs_critic = config.algorithm.estimator.needs_critic();
    let with_reference = config.algorithm.kl.active().is_some();
    let policy_dir = start.policy_dir.clone();
    let adapter = start.adapter.clone();
    if let Some(a) = &adapter {
        let lora = a.resolved()?;
        eprintln!(
            "lora: rank {}, alpha {}, targets {}, from {}",
            lora.rank,
            lora.alpha,
            lora.target_modules.resolve().unwrap_or_default().join(","),
            a.from
                .as_ref()
                .map_or("fresh adapters".to_string(), |d| d.display().to_string())
        );
    }
    // Where a checkpoint saved the policy (the adapter's directory when adapters train).
    let saved_policy = adapter
        .as_ref()
        .and_then(|a| a.from.clone())
        .unwrap_or_else(|| policy_dir.clone());
    // A separate critic resumes from its checkpoint (`policy/critic`), else starts from
    // `critic.model` or the policy's starting weights with a fresh value head.
    // A critic with LoRA keeps its frozen base (`critic.model`, else the model the run started
    // from) and resumes its adapters (and value head) from the checkpoint.
    let critic_dir = (needs_critic && cfg.critic.separate).then(|| {
        let saved = saved_policy.join(CRITIC_DIR);
        match &cfg.critic.lora {
            Some(lora) => {
                let from = saved.join(ADAPTER_CONFIG_FILE).is_file().then_some(saved);
                let base = cfg
                    .critic
                    .model
                    .clone()
                    .unwrap_or_else(|| reference_dir.to_path_buf());
                let adapter = AdapterSource {
                    config: lora.clone(),
                    from,
                };
                (base, Some(adapter))
            }
            None if saved.join("config.json").is_file() => (saved, None),
            None => (
                cfg.critic
                    .model
                    .clone()
                    .unwrap_or_else(|| policy_dir.clone()),
                None,
            ),
        }
    });
    if let Some((dir, adapter)) = &critic_dir {
        match adapter {
            Some(a) => eprintln!(
                "critic: a separate model, from {}, with LoRA rank {} ({})",
                dir.display(),
                a.config.rank,
                a.from
                    .as_ref()
                    .map_or("fresh adapters".to_string(), |d| d.display().to_string())
            ),
            None => eprintln!("critic: a separate model, from {}", dir.display()),
        }
    }
    let reference_dir = reference_dir.to_path_buf();
    // With adapters on the reference's own weights, the reference is the policy's frozen base
    // with its adapters off: no second copy of the base.
    let reference_is_base = adapter.is_some() && policy_dir == reference_dir;
    if with_reference && reference_is_base {
        eprintln!("kl reference: the frozen base with the adapters off");
    }
    let teacher_dir = match &cfg.distill {
        Some(d) => {
            // `check-config`'s rules compared a configured model directory already; a policy
            // made at start-up (a preset) is compared now that it exists.
            if cfg.model.dir.is_none() {
                crate::config::check_teacher(&policy_dir, &d.teacher)?;
            }
            eprintln!("distill: teacher {}", d.teacher.display());
            Some(d.teacher.clone())
        }
        None => None,
    };
    let value_head_on_policy = needs_critic && critic_dir.is_none();
    let plan = LearnerPlan {
        config,
        seed,
        policy: ModelPlan::new(policy_dir, adapter),
        value_head_on_policy,
        critic: critic_dir.map(|(dir, adapter)| ModelPlan::new(dir, adapter)),
        reference: match (with_reference, reference_is_base) {
            (false, _) => ReferencePlan::None,
            (true, true) => ReferencePlan::PolicyBase,
            (true, false) => ReferencePlan::Model(reference_dir),
        },
        teacher: teacher_dir,
        critic_prefix: critic_prefix.is_some().then(|| cfg.critic.clone()),
    };
    let (followers, ranks) = match plan.ranks() {
        1 => (None, None),
        _ => {
            let (followers, join) = Followers::start(&plan, run_dir, |r| faults.rank_args(r))?;
            (Some(followers), Some(join))
        }
    };
    let config = plan.config.clone();
    let load = move || plan.load(placement, critic_prefix);
    let before_update = faults.before_update();
    let learner = LearnerRef::spawn(LearnerStart {
        before_update,
        ranks,
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
    Ok((learner, followers))
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
    let knobs = cfg.rollout_knobs();
    let eval_knobs = match cfg.eval.greedy {
        true => knobs.greedy(),
        false => knobs,
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
        Ok(setup)
    };
    let train = build(&knobs)?;
    Ok((train, build(&eval_knobs)?))
}
