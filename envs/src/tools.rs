//! Built-in tools and the registry that builds tools by name from config.
//!
//! A user's own tool is one type implementing [`crate::tool::Tool`] and one
//! `registry.register("name", factory)` line; the factory receives the tool's options (a
//! `[tools.NAME]` TOML table, as JSON).

pub mod search;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::tool::Tool;

/// Builds a tool from its options.
pub type ToolFactory = Box<dyn Fn(&Value) -> Result<Arc<dyn Tool>> + Send + Sync>;

/// Tools by name.
pub struct ToolRegistry {
    factories: BTreeMap<String, ToolFactory>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl ToolRegistry {
    /// A registry with no tools.
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
        }
    }

    /// A registry with the built-in tools (`search`).
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register("search", |options| {
            Ok(Arc::new(search_from_options(options)?))
        });
        r
    }

    /// Adds (or replaces) a tool factory.
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Value) -> Result<Arc<dyn Tool>> + Send + Sync + 'static,
    {
        self.factories.insert(name.into(), Box::new(factory));
        self
    }

    /// Registered names.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// Builds the tool `name` with `options`.
    pub fn create(&self, name: &str, options: &Value) -> Result<Arc<dyn Tool>> {
        let factory = self.factories.get(name).ok_or_else(|| Error::Unknown {
            kind: "tool",
            name: name.to_string(),
            known: self.names().join(", "),
        })?;
        factory(options)
    }
}

/// `[tools.search]` options: `corpus` (path), `format` (`jsonl` | `hotpotqa`), `index_dir`,
/// `top_k`, `max_doc_chars`.
fn search_from_options(options: &Value) -> Result<search::SearchTool> {
    const KEYS: [&str; 5] = ["corpus", "format", "index_dir", "top_k", "max_doc_chars"];
    let key = |k: &str| format!("tools.search.{k}");
    if let Some(obj) = options.as_object() {
        if let Some(bad) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Error::Config {
                key: key(bad),
                message: format!("unknown key (allowed: {})", KEYS.join(", ")),
            });
        }
    }
    let corpus = options
        .get("corpus")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Config {
            key: key("corpus"),
            message: "required: path of a JSONL corpus or HotpotQA JSON file".into(),
        })?;
    let source = match options
        .get("format")
        .and_then(Value::as_str)
        .unwrap_or("jsonl")
    {
        "jsonl" => search::CorpusSource::Jsonl(PathBuf::from(corpus)),
        "hotpotqa" => search::CorpusSource::HotpotQa(vec![PathBuf::from(corpus)]),
        other => {
            return Err(Error::Config {
                key: key("format"),
                message: format!("`{other}` (allowed: jsonl, hotpotqa)"),
            })
        }
    };
    let mut config = search::SearchConfig::new(source);
    config.index_dir = options
        .get("index_dir")
        .and_then(Value::as_str)
        .map(PathBuf::from);
    if let Some(v) = options.get("top_k") {
        config.top_k = v.as_u64().filter(|&k| k > 0).ok_or_else(|| Error::Config {
            key: key("top_k"),
            message: format!("must be a positive integer, got {v}"),
        })? as usize;
    }
    if let Some(v) = options.get("max_doc_chars") {
        config.max_doc_chars = v.as_u64().filter(|&k| k > 0).ok_or_else(|| Error::Config {
            key: key("max_doc_chars"),
            message: format!("must be a positive integer, got {v}"),
        })? as usize;
    }
    search::SearchTool::open(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: &ToolRegistry, name: &str, options: Value) -> String {
        match r.create(name, &options) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn unknown_names_and_keys_are_reported() {
        let r = ToolRegistry::with_builtins();
        let e = err(&r, "websearch", json!({}));
        assert!(e.contains("websearch") && e.contains("search"), "{e}");
        let e = err(&r, "search", json!({"corpus": "x", "topk": 3}));
        assert!(e.contains("tools.search.topk"), "{e}");
        let e = err(&r, "search", json!({}));
        assert!(e.contains("tools.search.corpus"), "{e}");
    }
}
