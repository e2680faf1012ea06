//! `keyword_search`: a retriever with no index. It ranks the documents of a JSONL corpus by
//! how many of the query's words they contain (a word in the title counts twice) and
//! answers like the built-in `search`, `Doc i (Title: ...) text`, so an agent trained on one
//! reads the other.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::tool::{Tool, ToolOutput};
use agent_r1_envs::{Error, Result};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

/// What `[tools.NAME] type = "keyword_search"` may hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Options {
    /// JSONL of `{"id", "title", "text"}`; with `synthetic_multihop` the trainer sets it to
    /// the generated world's corpus when the table is named `search`.
    corpus: PathBuf,
    /// Documents per answer.
    #[serde(default = "default_top_k")]
    top_k: usize,
}

fn default_top_k() -> usize {
    3
}

impl KindOptions for Options {
    fn validate(&self) -> Result<()> {
        if !(1..=50).contains(&self.top_k) {
            return Err(Error::Config {
                key: "tools.keyword_search.top_k".into(),
                message: format!("must be in 1..=50, got {}", self.top_k),
            });
        }
        Ok(())
    }
}

struct Document {
    id: String,
    title: String,
    text: String,
    /// Lower-cased words of the title and of the text.
    title_words: BTreeSet<String>,
    text_words: BTreeSet<String>,
}

/// The tool: the whole corpus in memory.
pub(crate) struct KeywordSearch {
    documents: Vec<Document>,
    top_k: usize,
}

/// The factory `main` registers.
pub(crate) fn build(options: Options) -> Result<Arc<dyn Tool>> {
    let text =
        std::fs::read_to_string(&options.corpus).map_err(|e| Error::io(&options.corpus, e))?;
    let mut documents = Vec::new();
    for (line, row) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let row: Value = serde_json::from_str(row).map_err(|e| Error::BadFile {
            path: options.corpus.clone(),
            message: format!("line {}: {e}", line + 1),
        })?;
        let field = |k: &str| {
            row.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (title, text) = (field("title"), field("text"));
        documents.push(Document {
            id: row.get("id").map_or_else(
                || line.to_string(),
                |v| v.as_str().map_or_else(|| v.to_string(), str::to_string),
            ),
            title_words: words(&title),
            text_words: words(&text),
            title,
            text,
        });
    }
    Ok(Arc::new(KeywordSearch {
        documents,
        top_k: options.top_k,
    }))
}

fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[async_trait]
impl Tool for KeywordSearch {
    fn name(&self) -> &str {
        "search"
    }

    fn description(&self) -> &str {
        "Search the document collection for a query; returns the best matching documents."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for."}},
            "required": ["query"]
        })
    }

    async fn call(&self, arguments: Value) -> Result<ToolOutput> {
        let query = words(arguments["query"].as_str().unwrap_or_default());
        let mut ranked: Vec<(usize, &Document)> = self
            .documents
            .iter()
            .map(|d| {
                let title = query.intersection(&d.title_words).count();
                let text = query.intersection(&d.text_words).count();
                (2 * title + text, d)
            })
            .filter(|(score, _)| *score > 0)
            .collect();
        // Best first; ties in corpus order, so answers do not depend on anything else.
        ranked.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
        ranked.truncate(self.top_k);
        let text = ranked
            .iter()
            .enumerate()
            .map(|(i, (_, d))| format!("Doc {} (Title: {}) {}", i + 1, d.title, d.text))
            .collect::<Vec<_>>()
            .join("\n");
        let mut output = ToolOutput::text(if text.is_empty() {
            "No document matches the query.".to_string()
        } else {
            text
        });
        output
            .metadata
            .insert("ranker".into(), json!("keyword_search"));
        output.metadata.insert(
            "ids".into(),
            json!(ranked
                .iter()
                .map(|(_, d)| d.id.as_str())
                .collect::<Vec<_>>()),
        );
        Ok(output)
    }
}
