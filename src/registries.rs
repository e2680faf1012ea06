//! What a run can build by name: the tools of `[tools.NAME]`, the env of `[env]`, the
//! scorer of `[scorer]` and the context policy of `[env.context]`.
//!
//! The `agent-r1` binary runs with [`Registries::builtins`]. A user's crate adds its own
//! kinds and hands the result to [`crate::cli::main`], and every command (`train`, `eval`,
//! `check-config`, `tool call`, ...) knows them: `examples/custom-tool/` is such a crate.

use std::sync::Arc;

use agent_r1_actors::endpoint::{external_agent, ExternalAgent, ExternalAgentOptions};
use agent_r1_actors::openenv::{self, OpenEnv, OpenEnvOptions};
use agent_r1_actors::runtime::{ContextPolicies, Workflow, Workflows};
use agent_r1_envs::envs::registry::EnvRegistry;
use agent_r1_envs::reward::ScorerRegistry;
use agent_r1_envs::tools::ToolRegistry;

/// The tool, env and scorer factories a run builds from.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// Tool kinds (`search`, `calculator`, `python`, `mcp`, and a user's own).
    pub tools: ToolRegistry,
    /// Env kinds (`multihop_qa`, `synthetic_multihop`, and a user's own).
    pub envs: EnvRegistry,
    /// Scorer kinds (`http_judge`, and a user's own).
    pub scorers: ScorerRegistry,
    /// Context policies of `[env.context]` (`full`, `window`, `elide`, `summary`, and a
    /// user's own).
    pub context_policies: ContextPolicies,
    /// Workflows that drive whole episodes, named by `[env] name` like envs
    /// (`external_agent`: an outside program through the OpenAI-compatible endpoint;
    /// `openenv`: an OpenEnv environment server; and a user's own).
    pub workflows: Workflows,
}

impl Registries {
    /// The built-in tools and envs.
    pub fn builtins() -> Self {
        Self {
            tools: ToolRegistry::with_builtins(),
            envs: EnvRegistry::with_builtins(),
            scorers: ScorerRegistry::with_builtins(),
            context_policies: ContextPolicies::with_builtins(),
            workflows: builtin_workflows(),
        }
    }
}

fn builtin_workflows() -> Workflows {
    let mut workflows = Workflows::default();
    workflows.register(external_agent::NAME, |options: ExternalAgentOptions| {
        Ok(Arc::new(ExternalAgent::new(options)?) as Arc<dyn Workflow>)
    });
    workflows.register(openenv::NAME, |options: OpenEnvOptions| {
        Ok(Arc::new(OpenEnv::new(options)?) as Arc<dyn Workflow>)
    });
    workflows
}
