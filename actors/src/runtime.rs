//! The supervised actor runtime: many concurrent multi-turn episodes over one engine.
//!
//! ```text
//! run_rollout
//!  ├─ EngineActor ── crossbeam ──> engine thread (owns the model; continuous batching)
//!  ├─ ToolPool per tool ── ToolWorker x max_concurrency   (restarts with back-off)
//!  └─ RolloutSupervisor                                   (re-queues failed episodes once)
//!       ├─ EnvActor                                       (restarted on failure)
//!       └─ Episode x concurrency ── Turn messages to itself
//! ```
//! Backpressure: at most `concurrency` episodes exist; the engine admits a bounded number of
//! pending turns; each tool queue is bounded and sheds calls past it; trajectories leave
//! through a bounded channel. Memory is bounded by those limits and the engine's parked-KV
//! budget, not by the number of tasks.

mod engine_actor;
mod env_actor;
mod episode;
pub mod fault;
pub mod live;
mod render;
mod supervisor;
mod tool_pool;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::Actor;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use agent_r1_envs::env::Env;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, Tool};

pub use engine_actor::{EngineActor, EngineMsg};
pub use env_actor::{EnvActor, EnvMsg, EnvReply};
pub use episode::{Episode, EpisodeMsg};
pub use live::{LiveBoard, LiveSnapshot};
pub use render::TurnRenderer;
pub use supervisor::{RolloutSummary, SupervisorMsg};
pub use tool_pool::{RestartPolicy, ToolPool, ToolPoolMsg, ToolPoolStats};

use crate::engine::EngineHandle;
use crate::model::SamplingParams;
use crate::trajectory::Trajectory;
use crate::{Error, Result};

/// Checks a call's arguments against its tool's schema before the call is queued.
pub type ArgValidator =
    Arc<dyn Fn(&dyn Tool, &serde_json::Value) -> Result<(), CallError> + Send + Sync>;

/// Per-episode limits and sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeConfig {
    /// Most assistant turns per episode (Agent-R1's `max_turns`).
    pub max_turns: usize,
    /// Longest context in tokens; the episode ends when the next turn would not fit.
    pub max_context: usize,
    /// Sampling for every turn (stop ids include the end-of-turn id and `</tool_call>`).
    pub sampling: SamplingParams,
    /// Stop strings that are not single tokens.
    pub stop_strings: Vec<String>,
    /// Deadline for one generated turn, queueing included.
    pub generate_timeout: Duration,
    /// Extra deadline for a tool call beyond the tool's own timeout (queue wait).
    pub tool_queue_timeout: Duration,
}

impl Default for EpisodeConfig {
    fn default() -> Self {
        Self {
            max_turns: 10,
            max_context: 2048,
            sampling: SamplingParams::default(),
            stop_strings: vec![],
            generate_timeout: Duration::from_secs(1800),
            tool_queue_timeout: Duration::from_secs(60),
        }
    }
}

/// Everything a rollout needs besides its tasks.
pub struct RolloutSetup {
    /// The running engine.
    pub engine: EngineHandle,
    /// The env.
    pub env: Arc<dyn Env>,
    /// Tools by name (the env's `tool_names` must all be here).
    pub tools: Vec<Arc<dyn Tool>>,
    /// Renders prompts and observations with the model's chat template.
    pub renderer: Arc<TurnRenderer>,
    /// Episode limits.
    pub episode: EpisodeConfig,
    /// Episodes in flight at once.
    pub concurrency: usize,
    /// Calls waiting per tool before new ones are shed.
    pub tool_queue_capacity: usize,
    /// Tool worker restarts.
    pub restart: RestartPolicy,
    /// Argument validation run by tool pools before a call is queued.
    pub validate: ArgValidator,
    /// Where episodes show what they are doing (the web UI's live page).
    pub live: LiveBoard,
}

/// Counters of a finished rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutReport {
    /// Episode outcomes.
    pub summary: RolloutSummary,
    /// Tool worker restarts, by tool.
    pub tool_restarts: HashMap<String, u64>,
    /// Calls shed, by tool.
    pub tool_shed: HashMap<String, u64>,
}

/// Runs `tasks` (each with its group id) and streams trajectories into `sink` as they finish.
/// Returns when every task has ended (or the run stopped on a fatal error, which is in the
/// report's `summary.fatal`).
pub async fn run_rollout(
    setup: RolloutSetup,
    tasks: Vec<(Task, u64)>,
    sink: mpsc::Sender<Trajectory>,
) -> Result<RolloutReport> {
    let missing: Vec<String> = setup
        .env
        .tool_names()
        .into_iter()
        .filter(|n| !setup.tools.iter().any(|t| t.name() == n))
        .collect();
    if !missing.is_empty() {
        return Err(Error::invalid(
            "rollout",
            format!(
                "the env uses tools that are not configured: {}",
                missing.join(", ")
            ),
        ));
    }
    let spawn_err = |what: &str, e: ractor::SpawnErr| Error::Other(format!("spawning {what}: {e}"));
    let (engine, engine_join) = Actor::spawn(None, EngineActor, setup.engine.clone())
        .await
        .map_err(|e| spawn_err("the engine actor", e))?;
    let mut pools = HashMap::new();
    let mut pool_joins = Vec::new();
    for tool in &setup.tools {
        let args = tool_pool::ToolPoolArgs {
            tool: tool.clone(),
            queue_capacity: setup.tool_queue_capacity,
            restart: setup.restart.clone(),
            validate: setup.validate.clone(),
        };
        let (pool, join) = Actor::spawn(None, ToolPool, args)
            .await
            .map_err(|e| spawn_err("a tool pool", e))?;
        pools.insert(tool.name().to_string(), (pool, tool.timeout()));
        pool_joins.push(join);
    }
    let (env_actor, _) = Actor::spawn(None, EnvActor, setup.env.clone())
        .await
        .map_err(|e| spawn_err("the env actor", e))?;
    let shared = Arc::new(episode::Shared {
        env: RwLock::new(env_actor.clone()),
        engine: engine.clone(),
        tools: pools.clone(),
        renderer: setup.renderer.clone(),
        config: setup.episode.clone(),
        live: setup.live.clone(),
    });
    let (done_tx, done_rx) = oneshot::channel();
    let args = supervisor::SupervisorArgs {
        tasks: tasks.into_iter().map(|(t, g)| (Arc::new(t), g)).collect(),
        concurrency: setup.concurrency,
        shared: shared.clone(),
        env: setup.env.clone(),
        results: sink,
        done: done_tx,
    };
    let (_sup, sup_join) = Actor::spawn(None, supervisor::RolloutSupervisor, args)
        .await
        .map_err(|e| spawn_err("the rollout supervisor", e))?;
    let _ = sup_join.await;
    let summary = done_rx
        .await
        .map_err(|_| Error::Other("the rollout supervisor ended without a summary".into()))?;
    let mut report = RolloutReport {
        summary,
        ..Default::default()
    };
    for (name, (pool, _)) in &pools {
        if let Ok(ractor::rpc::CallResult::Success(stats)) = pool
            .call(ToolPoolMsg::Stats, Some(Duration::from_secs(10)))
            .await
        {
            report.tool_restarts.insert(name.clone(), stats.restarts);
            report.tool_shed.insert(name.clone(), stats.shed);
        }
        pool.stop(None);
    }
    shared
        .env
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .stop(None);
    engine.stop(None);
    let _ = engine_join.await;
    for j in pool_joins {
        let _ = j.await;
    }
    Ok(report)
}
