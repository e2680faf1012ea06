//! What a run can build by name: the tools of `[tools.NAME]` and the env of `[env]`.
//!
//! The `agent-r1` binary runs with [`Registries::builtins`]. A user's crate adds its own
//! kinds and hands the result to [`crate::cli::main`], and every command (`train`, `eval`,
//! `check-config`, `tool call`, ...) knows them: `examples/custom-tool/` is such a crate.

use agent_r1_envs::envs::registry::EnvRegistry;
use agent_r1_envs::tools::ToolRegistry;

/// The tool and env factories a run builds from.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// Tool kinds (`search`, `calculator`, `python`, `mcp`, and a user's own).
    pub tools: ToolRegistry,
    /// Env kinds (`multihop_qa`, `synthetic_multihop`, and a user's own).
    pub envs: EnvRegistry,
}

impl Registries {
    /// The built-in tools and envs.
    pub fn builtins() -> Self {
        Self {
            tools: ToolRegistry::with_builtins(),
            envs: EnvRegistry::with_builtins(),
        }
    }
}
