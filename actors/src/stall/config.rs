//! `[stall]`: each stage's deadline, and what a stall does to the run.

use serde::{Deserialize, Serialize};

/// Deadlines of the stall detector's stages, in seconds: a stage whose work makes no
/// progress for its deadline is reported as stalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StallConfig {
    /// Fail the run with the stall's diagnosis (exit code 3) instead of only reporting it.
    pub fail_run: bool,
    /// One env call (reset, turn decision, observation, score) still running.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub env_secs: f64,
    /// One tool call still running (beyond any timeout the episode already gave up at).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub tool_secs: f64,
    /// The engine taking no decode step while turns wait.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub engine_secs: f64,
    /// One learner update.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub learner_secs: f64,
    /// The engine taking new weights.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub publish_secs: f64,
    /// Writing one checkpoint.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub checkpoint_secs: f64,
}

impl Default for StallConfig {
    fn default() -> Self {
        Self {
            fail_run: true,
            env_secs: 300.0,
            tool_secs: 600.0,
            engine_secs: 300.0,
            learner_secs: 7200.0,
            publish_secs: 600.0,
            checkpoint_secs: 1800.0,
        }
    }
}

impl StallConfig {
    /// Every deadline by its key, e.g. `("stall.env_secs", 300.0)`.
    pub fn deadlines(&self) -> [(&'static str, f64); 6] {
        [
            ("stall.env_secs", self.env_secs),
            ("stall.tool_secs", self.tool_secs),
            ("stall.engine_secs", self.engine_secs),
            ("stall.learner_secs", self.learner_secs),
            ("stall.publish_secs", self.publish_secs),
            ("stall.checkpoint_secs", self.checkpoint_secs),
        ]
    }
}

impl agent_r1_envs::config::Section for StallConfig {}
