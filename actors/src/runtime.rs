//! The supervised actor runtime: many concurrent multi-turn episodes over one engine, or one
//! engine per device with each episode kept on one.
//!
//! ```text
//! RolloutService (one per run; tasks stream in, trajectories stream out)
//!  ├─ ToolPool per tool ── ToolWorker x max_concurrency     (restarts with back-off)
//!  └─ RolloutSupervisor ◄── feeder (one credit per episode slot)
//!       └─ Episode x concurrency                            (re-queued once on failure)
//!            ├─ EnvActor: this episode's env, calls on the blocking pool
//!            └─ EngineSet ── route ──> EngineHandle ── crossbeam ──> engine thread
//!                (sticky per episode)                    (owns the model; batching)
//! ```
//! Backpressure: at most `concurrency` episodes exist; the engine admits a bounded number of
//! pending turns; each tool queue is bounded and sheds calls past it; the task stream and
//! the trajectory channel are bounded. Memory is bounded by those limits and the engine's
//! parked-KV budget, not by the number of tasks.

mod batcher;
mod call_ledger;
pub mod context_policy;
mod env_actor;
mod env_source;
mod episode;
mod episode_error;
#[cfg(any(test, feature = "fault-injection"))]
pub mod fault;
pub mod in_flight;
pub mod live;
mod render;
mod service;
mod supervisor;
mod tool_pool;
pub mod workflow;
mod workflow_registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, Tool};

pub use batcher::GroupBatcher;
pub use call_ledger::CallLedger;
pub use context_policy::{ContextPolicies, ContextPolicy};
pub use env_source::{EnvBuilder, EnvSource};
pub use episode_error::{EnvStage, EpisodeError};
pub use in_flight::{InFlightBoard, InFlightEpisode, WorkflowStep};
pub use live::{LiveBoard, LiveSnapshot};
pub use render::TurnRenderer;
pub use service::{RolloutService, TaskSender};
pub use supervisor::{EpisodeRequest, RolloutSummary, RETRY_BIT};
pub use tool_pool::{RestartPolicy, ToolPool, ToolPoolMsg, ToolPoolStats};
pub use workflow::{Agent, GenerateOptions, Generation, Workflow, WorkflowOutcome};
pub use workflow_registry::Workflows;

use crate::engine_set::EngineSet;
use crate::model::SamplingParams;
use crate::stall::StallWatch;
use crate::trajectory::Trajectory;
use crate::Result;

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
    /// Longest prompt in tokens (`rollout.max_prompt_length`): a task whose first messages
    /// render longer fails at once, is not retried, and is counted in
    /// `agent_r1_prompts_too_long_total`. `None`: only `max_context` bounds it.
    pub max_prompt: Option<usize>,
    /// Sampling for every turn (stop ids include the end-of-turn id and `</tool_call>`).
    pub sampling: SamplingParams,
    /// Stop strings that are not single tokens.
    pub stop_strings: Vec<String>,
    /// Deadline for one generated turn, queueing included.
    pub generate_timeout: Duration,
    /// Extra deadline for a tool call beyond the tool's own timeout (queue wait).
    pub tool_queue_timeout: Duration,
    /// Deadline for one env call (reset, turn decision, observation, score).
    pub env_timeout: Duration,
    /// Tool calls a turn may make (run concurrently); calls past it are answered
    /// [`CallError::TooManyCalls`] without running.
    pub max_tool_calls_per_turn: usize,
    /// Deadline for a whole episode driven by a [`Workflow`]; one past it fails with the
    /// reason and its calls are cancelled.
    pub workflow_timeout: Duration,
}

/// Everything a rollout needs besides its tasks.
#[derive(Clone)]
pub struct RolloutSetup {
    /// The running engines (one, or one per device); an episode's turns all go to one.
    pub engine: EngineSet,
    /// Where each episode's env comes from.
    pub env: EnvSource,
    /// Tools by name (the env's `tool_names` must all be here).
    pub tools: Vec<Arc<dyn Tool>>,
    /// Renders prompts and observations with the model's chat template.
    pub renderer: Arc<TurnRenderer>,
    /// What each turn sees of the episode's history (`[env.context]`).
    pub context_policy: Arc<dyn ContextPolicy>,
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
    /// Where env and tool calls are recorded for the stall detector (`None`: not watched).
    pub stall: Option<StallWatch>,
    /// The run id in tool calls' idempotency keys, and the call journal where the run
    /// keeps one.
    pub calls: CallLedger,
    /// Where episodes of the built-in loop keep their finished steps for a checkpoint.
    pub in_flight: InFlightBoard,
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

/// Runs a fixed list of `tasks` (each with its group id; episode ids are their indexes)
/// through a [`RolloutService`] and
/// streams trajectories into `sink` as they finish (the caller drains `sink` concurrently).
/// Returns when every task has ended (or the run stopped on a fatal error, which is in the
/// report's `summary.fatal`).
pub async fn run_rollout(
    setup: RolloutSetup,
    tasks: Vec<(Task, u64)>,
    sink: mpsc::Sender<Trajectory>,
) -> Result<RolloutReport> {
    let service = RolloutService::start(setup, sink).await?;
    let sender = service.tasks();
    let feed = tokio::spawn(async move {
        for (i, (task, group_id)) in tasks.into_iter().enumerate() {
            let request = EpisodeRequest {
                task,
                group_id,
                episode_id: i as u64,
                resume: None,
            };
            if sender.submit(request).await.is_err() {
                return;
            }
        }
    });
    let report = service.finish().await;
    feed.abort();
    report
}
