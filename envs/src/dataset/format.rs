//! Dataset formats and their detection.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;

/// A supported dataset format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetFormat {
    /// HotpotQA official JSON: a list of `{_id, question, answer, supporting_facts, context,
    /// type, level}`.
    HotpotQa,
    /// 2WikiMultihopQA: JSON list or JSONL of `{_id | id, question, answer, context, type,
    /// evidences, ...}`.
    TwoWiki,
    /// MuSiQue JSONL: `{id, question, answer, answer_aliases, answerable, paragraphs}`.
    Musique,
    /// Agent-R1 (verl) training parquet: `data_source, prompt, ability, reward_model,
    /// extra_info[, agent_name, env_kwargs]`.
    AgentR1Parquet,
    /// Plain JSONL: `{question, answers[, id, data_source]}`.
    Jsonl,
    /// GSM8K JSONL: `{question, answer}` where the answer is a worked solution ending in
    /// `#### <number>`.
    Gsm8k,
}

impl DatasetFormat {
    /// Every format.
    pub const ALL: [DatasetFormat; 6] = [
        DatasetFormat::HotpotQa,
        DatasetFormat::TwoWiki,
        DatasetFormat::Musique,
        DatasetFormat::AgentR1Parquet,
        DatasetFormat::Jsonl,
        DatasetFormat::Gsm8k,
    ];

    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            DatasetFormat::HotpotQa => "hotpotqa",
            DatasetFormat::TwoWiki => "2wikimultihopqa",
            DatasetFormat::Musique => "musique",
            DatasetFormat::AgentR1Parquet => "agent_r1_parquet",
            DatasetFormat::Jsonl => "jsonl",
            DatasetFormat::Gsm8k => "gsm8k",
        }
    }

    /// The `data_source` given to tasks of this format (parquet rows carry their own).
    pub fn data_source(self) -> &'static str {
        match self {
            DatasetFormat::AgentR1Parquet => "agent_r1",
            other => other.as_str(),
        }
    }

    /// Guesses the format of a JSON/JSONL file from the keys of its first row.
    pub fn detect_from_row(row: &Value) -> Option<DatasetFormat> {
        let obj = row.as_object()?;
        let has = |k: &str| obj.contains_key(k);
        if has("paragraphs") {
            Some(DatasetFormat::Musique)
        } else if has("evidences") || has("entity_ids") {
            Some(DatasetFormat::TwoWiki)
        } else if has("context") && (has("supporting_facts") || has("level") || has("_id")) {
            Some(DatasetFormat::HotpotQa)
        } else if has("reward_model") && has("prompt") {
            Some(DatasetFormat::AgentR1Parquet)
        } else if has("question")
            && obj
                .get("answer")
                .and_then(Value::as_str)
                .is_some_and(|a| a.contains("####"))
        {
            Some(DatasetFormat::Gsm8k)
        } else if has("question") && (has("answers") || has("answer")) {
            Some(DatasetFormat::Jsonl)
        } else {
            None
        }
    }

    /// Whether the file is parquet: the `.parquet` extension or the `PAR1` magic.
    pub fn is_parquet(path: &Path, head: &[u8]) -> bool {
        path.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
            || head.starts_with(b"PAR1")
    }
}

impl schemars::JsonSchema for DatasetFormat {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DatasetFormat".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names = DatasetFormat::ALL.map(DatasetFormat::as_str);
        schemars::json_schema!({ "type": "string", "enum": names })
    }
}

impl fmt::Display for DatasetFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DatasetFormat {
    type Err = Error;

    /// Accepts [`DatasetFormat::as_str`] names and the aliases `hotpot`, `2wiki`,
    /// `two_wiki`, `parquet`, `agent_r1`, `plain`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key = s.trim().to_ascii_lowercase().replace('-', "_");
        Ok(match key.as_str() {
            "hotpotqa" | "hotpot" => DatasetFormat::HotpotQa,
            "2wikimultihopqa" | "2wiki" | "two_wiki" | "twowiki" => DatasetFormat::TwoWiki,
            "musique" => DatasetFormat::Musique,
            "agent_r1_parquet" | "agent_r1" | "parquet" => DatasetFormat::AgentR1Parquet,
            "jsonl" | "plain" => DatasetFormat::Jsonl,
            "gsm8k" => DatasetFormat::Gsm8k,
            _ => {
                return Err(Error::Unknown {
                    kind: "dataset format",
                    name: s.to_string(),
                    known: DatasetFormat::ALL.map(DatasetFormat::as_str).join(", "),
                })
            }
        })
    }
}

impl TryFrom<String> for DatasetFormat {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<DatasetFormat> for String {
    fn from(f: DatasetFormat) -> Self {
        f.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_round_trip_and_unknown_lists_known() {
        for f in DatasetFormat::ALL {
            assert_eq!(f.as_str().parse::<DatasetFormat>().ok(), Some(f));
        }
        assert_eq!(
            "2wiki".parse::<DatasetFormat>().ok(),
            Some(DatasetFormat::TwoWiki)
        );
        let err = "csv".parse::<DatasetFormat>().unwrap_err().to_string();
        assert!(
            err.contains("unknown dataset format `csv`") && err.contains("musique"),
            "{err}"
        );
    }

    #[test]
    fn detection_by_keys() {
        let d = DatasetFormat::detect_from_row;
        assert_eq!(
            d(
                &json!({"_id": "1", "question": "q", "answer": "a", "context": [], "supporting_facts": []})
            ),
            Some(DatasetFormat::HotpotQa)
        );
        assert_eq!(
            d(&json!({"_id": "1", "question": "q", "answer": "a", "context": [], "evidences": []})),
            Some(DatasetFormat::TwoWiki)
        );
        assert_eq!(
            d(&json!({"id": "1", "question": "q", "answer": "a", "paragraphs": []})),
            Some(DatasetFormat::Musique)
        );
        assert_eq!(
            d(&json!({"question": "q", "answers": ["a"]})),
            Some(DatasetFormat::Jsonl)
        );
        assert_eq!(d(&json!({"text": "q"})), None);
        assert_eq!(d(&json!([1, 2])), None);
    }
}
