//! Process rewards: small per-call rewards added to the step of a tool-calling turn.
//!
//! Agent-R1 designed these but left them off; here they are off by default (all amounts 0)
//! and switched on by config.

use serde::{Deserialize, Serialize};

use crate::tool::{CallError, CallOutcome};

/// Amounts of the per-call process rewards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessRewardConfig {
    /// Added per well-formed call: valid JSON, a known tool, arguments that fit its schema
    /// (the call was dispatched, whatever the tool then did).
    pub well_formed: f64,
    /// Added per call the tool answered without error.
    pub success: f64,
    /// Whether rewards the tools themselves return ([`crate::tool::ToolOutput::reward`])
    /// count too.
    pub tool_rewards: bool,
    /// Upper bound on the process reward of one turn (`None`: unbounded).
    pub max_per_turn: Option<f64>,
}

impl Default for ProcessRewardConfig {
    fn default() -> Self {
        Self {
            well_formed: 0.0,
            success: 0.0,
            tool_rewards: true,
            max_per_turn: None,
        }
    }
}

/// Whether a call got past parsing and validation.
pub fn is_well_formed(outcome: &CallOutcome) -> bool {
    match &outcome.result {
        Ok(_) => true,
        Err(
            CallError::Timeout(_)
            | CallError::Overloaded
            | CallError::Failed(_)
            | CallError::Panicked(_),
        ) => true,
        Err(
            CallError::InvalidJson(_)
            | CallError::MissingName
            | CallError::UnknownTool(_)
            | CallError::InvalidArguments(_)
            | CallError::TooManyCalls(_),
        ) => false,
    }
}

impl ProcessRewardConfig {
    /// The process reward of one turn's calls.
    pub fn turn_reward(&self, outcomes: &[CallOutcome]) -> f64 {
        let mut total = 0.0;
        for outcome in outcomes {
            if is_well_formed(outcome) {
                total += self.well_formed;
            }
            if let Ok(output) = &outcome.result {
                total += self.success;
                if self.tool_rewards {
                    total += output.reward.unwrap_or(0.0);
                }
            }
        }
        match self.max_per_turn {
            Some(max) => total.min(max),
            None => total,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tool::ToolOutput;

    fn outcome(result: Result<ToolOutput, CallError>) -> CallOutcome {
        CallOutcome {
            name: Some("search".into()),
            result,
            latency: Duration::ZERO,
        }
    }

    #[test]
    fn default_is_off_except_tool_rewards() {
        let out = ToolOutput {
            reward: Some(0.25),
            ..ToolOutput::text("hit")
        };
        let cfg = ProcessRewardConfig::default();
        assert_eq!(cfg.turn_reward(&[outcome(Ok(out.clone()))]), 0.25);
        let off = ProcessRewardConfig {
            tool_rewards: false,
            ..cfg
        };
        assert_eq!(off.turn_reward(&[outcome(Ok(out))]), 0.0);
    }

    #[test]
    fn amounts_per_call_and_cap() {
        let cfg = ProcessRewardConfig {
            well_formed: 0.1,
            success: 0.2,
            tool_rewards: false,
            max_per_turn: Some(0.5),
        };
        let outcomes = [
            outcome(Ok(ToolOutput::text("a"))),
            outcome(Err(CallError::Timeout(Duration::from_secs(1)))),
            outcome(Err(CallError::InvalidJson("eof".into()))),
        ];
        assert!((cfg.turn_reward(&outcomes) - 0.4).abs() < 1e-12);
        let many = vec![outcome(Ok(ToolOutput::text("a"))); 3];
        assert_eq!(cfg.turn_reward(&many), 0.5);
    }
}
