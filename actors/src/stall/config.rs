//! `[stall]`: each stage's deadline, and what a stall does to the run.

use serde::{Deserialize, Serialize};

/// Deadlines of the stall detector's stages, in seconds: a stage whose work makes no
/// progress for its deadline is reported as stalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StallConfig {
    /// Fail the run with the stall's diagnosis (exit code 3) instead of only reporting it.
    pub fail_run: bool,
    /// One env call (reset, turn decision, observation, score) still running.
    pub env_secs: f64,
    /// One tool call still running (beyond any timeout the episode already gave up at).
    pub tool_secs: f64,
    /// The engine taking no decode step while turns wait.
    pub engine_secs: f64,
    /// One learner update.
    pub learner_secs: f64,
    /// The engine taking new weights.
    pub publish_secs: f64,
    /// Writing one checkpoint.
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

    /// The first deadline that is not a number of seconds in (0, 1 week]: its key, the value
    /// and what is allowed.
    pub fn invalid(&self) -> Option<(&'static str, f64, &'static str)> {
        self.deadlines()
            .into_iter()
            .find(|(_, v)| !(v.is_finite() && *v > 0.0 && *v <= 604_800.0))
            .map(|(key, v)| (key, v, "seconds in (0, 604800]"))
    }
}
