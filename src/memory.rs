//! The memory planner applied to a training config: which model and critic the run loads,
//! what the engine reserves beside the learner, and how much memory the device has.
//! `check-config` prints the plan; `train` refuses, before loading anything, a config whose
//! predicted peak does not fit (`learner.check_memory = false` skips that). With learner
//! ranks, the plan is rank 0's (beside the engine) and one line for the other ranks'
//! processes on the same host.

use std::path::Path;

use agent_r1_actors::device::memory;
use agent_r1_actors::learner::{LearnerConfig, ShardMode};
use agent_r1_actors::memory_plan::{EnginePlan, MemoryPlan, PlanInput, Term};
use agent_r1_actors::model::presets::{preset, shape};
use agent_r1_actors::model::{ModelConfig, Placement};
use anyhow::Context;
use tch::Device;

use crate::config::TrainConfig;

/// Where the plan's model shape comes from.
#[derive(Debug, Clone, Copy)]
pub enum ShapeSource<'a> {
    /// `model.dir`'s `config.json`, or the preset's (the run's own model).
    Config,
    /// A built-in shape (`init-model --shape`), for a machine without the model.
    Shape(&'a str),
}

/// The model config the run trains.
fn policy_config(cfg: &TrainConfig, source: ShapeSource<'_>) -> anyhow::Result<ModelConfig> {
    match (source, &cfg.model.dir, &cfg.model.preset) {
        (ShapeSource::Shape(name), _, _) => Ok(shape(name)?.0),
        (ShapeSource::Config, Some(dir), _) => read(dir),
        // A preset's vocabulary is its tokenizer's (at most this); close enough to plan.
        (ShapeSource::Config, None, Some(name)) => Ok(preset(name, 4096, vec![])?),
        (ShapeSource::Config, None, None) => anyhow::bail!("model: neither dir nor preset"),
    }
}

fn read(dir: &Path) -> anyhow::Result<ModelConfig> {
    Ok(ModelConfig::from_file(&dir.join("config.json"))
        .with_context(|| format!("memory plan: {}", dir.display()))?
        .0)
}

/// The plan of `cfg` on `placement`.
pub fn plan(
    cfg: &TrainConfig,
    placement: Placement,
    source: ShapeSource<'_>,
) -> anyhow::Result<MemoryPlan> {
    let learner = cfg.learner_config();
    let [mut plan, _, other] = rank_plans(cfg, placement, source, &learner)?;
    // Learner ranks are processes on the same host (the CPU): the others' plans, without
    // the engine, add to rank 0's.
    let ranks = learner.memory.ranks as u64;
    if ranks > 1 {
        plan.terms.push(Term {
            name: "the other learner ranks (each its own process)",
            bytes: (ranks - 1) * other.total(),
            knobs: "learner.ranks, learner.shard = \"optimizer_state\" or \"parameters\"",
        });
    }
    Ok(plan)
}

/// What each sharding mode needs per rank when `cfg`'s learner runs on `ranks` devices
/// like `placement`: rank 0's plans (beside the engines sharing its device, and alone) and
/// another rank's, for `replicated`, `optimizer_state` and `parameters` (with
/// recomputation, which it needs).
pub fn sharding_plans(
    cfg: &TrainConfig,
    placement: Placement,
    source: ShapeSource<'_>,
    ranks: usize,
) -> anyhow::Result<Vec<(ShardMode, [MemoryPlan; 3])>> {
    [
        ShardMode::Replicated,
        ShardMode::OptimizerState,
        ShardMode::Parameters,
    ]
    .into_iter()
    .map(|mode| {
        let mut learner = cfg.learner_config();
        learner.memory.ranks = ranks;
        learner.memory.shard = mode;
        learner.memory.recompute |= mode == ShardMode::Parameters;
        Ok((mode, rank_plans(cfg, placement, source, &learner)?))
    })
    .collect()
}

/// Rank 0's plans of `cfg` with `learner` (beside the engines on its device, and alone)
/// and another rank's.
fn rank_plans(
    cfg: &TrainConfig,
    placement: Placement,
    source: ShapeSource<'_>,
    learner: &LearnerConfig,
) -> anyhow::Result<[MemoryPlan; 3]> {
    let model = policy_config(cfg, source)?;
    let critic = match (&cfg.critic.model, source) {
        _ if !(learner.algorithm.estimator.needs_critic() && cfg.critic.separate) => None,
        (Some(dir), ShapeSource::Config) => Some(read(dir)?),
        _ => Some(model.clone()),
    };
    let teacher = match (&cfg.distill, source) {
        (None, _) => None,
        (Some(d), ShapeSource::Config) => Some(read(&d.teacher)?),
        // Planned for a machine without the models: a teacher of the policy's shape.
        (Some(_), ShapeSource::Shape(_)) => Some(model.clone()),
    };
    // An adapter to start from has its own settings, read when it is at hand.
    let lora = match (cfg.adapter_source(), source) {
        (None, _) => None,
        (Some(a), ShapeSource::Config) => Some(a.resolved()?),
        (Some(a), ShapeSource::Shape(_)) => Some(a.config),
    };
    let r = &cfg.rollout;
    // The engines that share the learner's device (`rollout.devices` may put them all
    // elsewhere); an engine on another device is that device's whole load.
    let engines = match r.devices.is_empty() {
        true => 1,
        false => cfg
            .engine_placements()?
            .iter()
            .filter(|(_, p)| p.device == placement.device)
            .count(),
    };
    let mut input = PlanInput {
        device: placement.device,
        model: &model,
        kind: placement.kind,
        learner,
        separate_critic: critic.as_ref(),
        critic_lora: cfg.critic.lora.as_ref().filter(|_| critic.is_some()),
        teacher: teacher.as_ref(),
        lora: lora.as_ref(),
        engine: (engines > 0).then_some(EnginePlan {
            engines,
            rows: r.concurrency.max(1),
            max_context: r.max_context_length,
            parked_kv_bytes: r.parked_kv_mib.saturating_mul(1 << 20),
            share_bytes: r.memory_fraction.and_then(|f| {
                device_capacity(placement.device).map(|total| (f * total as f64) as u64)
            }),
        }),
        action_tokens: None,
        rank: 0,
    };
    let leader = MemoryPlan::predict(&input);
    input.engine = None;
    let alone = MemoryPlan::predict(&input);
    input.rank = 1;
    Ok([leader, alone, MemoryPlan::predict(&input)])
}

/// Bytes of memory `device` has for the run: a GPU's total (from `nvidia-smi`), the
/// host's total for the CPU, or this process's memory limit where lower (not what is free now: the verdict must not depend on what else
/// the machine is running); `None` where it cannot be read.
pub fn device_capacity(device: Device) -> Option<u64> {
    match device {
        Device::Cpu => memory::now(Device::Cpu).ok().map(|m| m.total),
        Device::Cuda(i) => {
            let out = std::process::Command::new("nvidia-smi")
                .args([
                    "--query-gpu=memory.total",
                    "--format=csv,noheader,nounits",
                    "-i",
                    &i.to_string(),
                ])
                .output()
                .ok()?;
            let mib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
            Some(mib << 20)
        }
        _ => None,
    }
}
