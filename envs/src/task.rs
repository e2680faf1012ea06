//! A task: one question an episode is about, as read from a dataset or generated.

use serde::{Deserialize, Serialize};

use crate::message::Message;

/// One task. Datasets of every format are read into this shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Stable id (the dataset's own id where it has one), used in logs and for resume.
    pub id: String,
    /// Where it came from (`hotpotqa`, `2wikimultihopqa`, `musique`, `synthetic_multihop`, ...).
    pub data_source: String,
    /// The question as plain text.
    pub question: String,
    /// Accepted gold answers; the first is the canonical one.
    pub answers: Vec<String>,
    /// A ready-made prompt (Agent-R1 parquet rows carry one); `None` means the env builds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Vec<Message>>,
    /// Anything else the source row had that an env or reward may use (supporting facts, type).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub extra: serde_json::Value,
}

/// Train or test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training questions.
    Train,
    /// Held-out questions (disjoint question texts).
    Test,
}

impl Split {
    /// `train` or `test`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}
