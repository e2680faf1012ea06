//! Which scalar a QA env trains on, chosen by name in the config.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The reward a QA episode is trained on. Every kind reports all metrics; the kind only
/// picks which one becomes [`crate::env::Score::reward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RewardKind {
    /// Official HotpotQA exact match of the `<answer>` (metric `em`), in {0, 1}.
    HotpotqaEm,
    /// Official HotpotQA F1 of the `<answer>` (metric `f1`), in [0, 1].
    HotpotqaF1,
    /// Agent-R1's `qa_em_and_format` training reward (metric `agent_r1_reward`), in [-1, 1].
    #[default]
    AgentR1Qa,
    /// Agent-R1's substring "EM" of the `<answer>` (metric `substring_em`), in {0, 1}.
    SubstringEm,
}

impl RewardKind {
    /// Every kind, in the order docs list them.
    pub const ALL: [RewardKind; 4] = [
        RewardKind::HotpotqaEm,
        RewardKind::HotpotqaF1,
        RewardKind::AgentR1Qa,
        RewardKind::SubstringEm,
    ];

    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            RewardKind::HotpotqaEm => "hotpotqa_em",
            RewardKind::HotpotqaF1 => "hotpotqa_f1",
            RewardKind::AgentR1Qa => "agent_r1_qa",
            RewardKind::SubstringEm => "substring_em",
        }
    }

    /// The metric name whose value this kind uses as the reward.
    pub fn metric(self) -> &'static str {
        match self {
            RewardKind::HotpotqaEm => "em",
            RewardKind::HotpotqaF1 => "f1",
            RewardKind::AgentR1Qa => "agent_r1_reward",
            RewardKind::SubstringEm => "substring_em",
        }
    }
}

impl schemars::JsonSchema for RewardKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RewardKind".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names = RewardKind::ALL.map(RewardKind::as_str);
        schemars::json_schema!({ "type": "string", "enum": names })
    }
}

impl fmt::Display for RewardKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RewardKind {
    type Err = Error;

    /// Accepts the names of [`RewardKind::as_str`] and the aliases `em`, `f1`,
    /// `qa_em_and_format` and `subem` (case-insensitive, `-` read as `_`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key = s.trim().to_ascii_lowercase().replace('-', "_");
        Ok(match key.as_str() {
            "hotpotqa_em" | "em" | "exact_match" => RewardKind::HotpotqaEm,
            "hotpotqa_f1" | "f1" => RewardKind::HotpotqaF1,
            "agent_r1_qa" | "qa_em_and_format" => RewardKind::AgentR1Qa,
            "substring_em" | "subem" => RewardKind::SubstringEm,
            _ => {
                return Err(Error::Unknown {
                    kind: "reward",
                    name: s.to_string(),
                    known: RewardKind::ALL.map(RewardKind::as_str).join(", "),
                })
            }
        })
    }
}

impl TryFrom<String> for RewardKind {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<RewardKind> for String {
    fn from(kind: RewardKind) -> Self {
        kind.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_aliases() {
        for kind in RewardKind::ALL {
            assert_eq!(kind.as_str().parse::<RewardKind>().ok(), Some(kind));
        }
        assert_eq!(
            "qa_em_and_format".parse::<RewardKind>().ok(),
            Some(RewardKind::AgentR1Qa)
        );
        assert_eq!(
            "F1".parse::<RewardKind>().ok(),
            Some(RewardKind::HotpotqaF1)
        );
        let err = "bleu".parse::<RewardKind>().unwrap_err().to_string();
        assert!(
            err.contains("unknown reward `bleu`") && err.contains("hotpotqa_em"),
            "{err}"
        );
    }

    #[test]
    fn serde_uses_the_config_names() {
        let kind: RewardKind = serde_json::from_str("\"hotpotqa_f1\"").unwrap();
        assert_eq!(kind, RewardKind::HotpotqaF1);
        assert_eq!(
            serde_json::to_string(&RewardKind::SubstringEm).unwrap(),
            "\"substring_em\""
        );
        assert!(serde_json::from_str::<RewardKind>("\"nope\"").is_err());
    }
}
