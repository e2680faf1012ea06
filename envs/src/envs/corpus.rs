//! What an env needs from the `search` tool: which corpus to index.
//!
//! Envs do not run tools; they describe the corpus and the runtime opens the search tool
//! (`tools::search::SearchTool`) over it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The corpus a search-using env expects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CorpusSpec {
    /// A JSONL file of `{"id", "title", "text"}` documents.
    Jsonl(PathBuf),
    /// HotpotQA-format files whose `context` paragraphs form the corpus.
    #[serde(rename = "hotpotqa")]
    HotpotQa(Vec<PathBuf>),
}
