//! Tool factories by name.
//!
//! A tool kind is registered with its options type ([`KindOptions`]). The `[tools.NAME]`
//! table (without its `type` key) is deserialised into that type and validated: that is all
//! [`ToolRegistry::check`] does (what `check-config` runs: no server started, no corpus
//! indexed), and [`ToolRegistry::create_all`] does the same before it builds. A user's own
//! tool is one file (a type implementing [`Tool`] and its options) plus one
//! `registry.register(...)` line (see `docs/tools.md`).

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kinds::{KindOptions, Kinds};
use crate::tool::Tool;
use crate::tools::{calculator, mcp, python, search};

/// The options of a tool that takes none: any key is an error.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoOptions {}

impl KindOptions for NoOptions {}

/// Tool factories by name.
#[derive(Debug, Clone)]
pub struct ToolRegistry {
    kinds: Kinds<Vec<Arc<dyn Tool>>>,
    /// Whether `search` is the built-in BM25 tool (a user's crate may replace it).
    builtin_search: bool,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl ToolRegistry {
    /// A registry with no tools.
    pub fn empty() -> Self {
        Self {
            kinds: Kinds::new(|kind| format!("tools.{kind}")),
            builtin_search: false,
        }
    }

    /// A registry with the built-in tools: `search`, `calculator`, `python` and `mcp` (a
    /// set: the tools of the server the options start).
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register("search", |o: SearchOptions| {
            Ok(Arc::new(search::SearchTool::open(o.into_config()?)?))
        });
        r.register("calculator", |_: NoOptions| {
            Ok(Arc::new(calculator::CalculatorTool))
        });
        r.register("python", |o: python::PythonConfig| {
            Ok(Arc::new(python::PythonTool::new(o)?))
        });
        r.register_set("mcp", mcp::connect_tools);
        r.builtin_search = true;
        r
    }

    /// Adds (or replaces) the kind `name`, which builds one tool from options `O`.
    pub fn register<O, F>(&mut self, name: impl Into<String>, build: F) -> &mut Self
    where
        O: KindOptions,
        F: Fn(O) -> Result<Arc<dyn Tool>> + Send + Sync + 'static,
    {
        self.register_set(name, move |o: O| Ok(vec![build(o)?]))
    }

    /// Adds (or replaces) the kind `name`, which builds a set of tools from options `O`
    /// (an MCP server's tools).
    pub fn register_set<O, F>(&mut self, name: impl Into<String>, build: F) -> &mut Self
    where
        O: KindOptions,
        F: Fn(O) -> Result<Vec<Arc<dyn Tool>>> + Send + Sync + 'static,
    {
        let name = name.into();
        if name == "search" {
            self.builtin_search = false;
        }
        self.kinds.register(name, build);
        self
    }

    /// Whether the `search` kind is the built-in BM25 tool ([`search::SearchTool`]).
    pub fn is_builtin_search(&self) -> bool {
        self.builtin_search
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.kinds.names()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.kinds.contains(name)
    }

    /// Parses and checks `options` for the kind `name` as [`Self::create_all`] will, with no
    /// side effects (nothing started, indexed or probed).
    pub fn check(&self, name: &str, options: &Value) -> Result<()> {
        self.kinds.check("tool", name, options)
    }

    /// The option keys the kind `name` describes, for `check-config --explain`.
    pub fn option_keys(&self, name: &str) -> Vec<crate::config::KeyDoc> {
        self.kinds.keys(name)
    }

    /// Builds every tool the kind `name` makes from `options`.
    pub fn create_all(&self, name: &str, options: &Value) -> Result<Vec<Arc<dyn Tool>>> {
        self.kinds.create("tool", name, options)
    }

    /// Builds the one tool the kind `name` makes (an error for a set of several).
    pub fn create(&self, name: &str, options: &Value) -> Result<Arc<dyn Tool>> {
        let mut tools = self.create_all(name, options)?;
        match tools.len() {
            1 => Ok(tools.remove(0)),
            n => Err(Error::Config {
                key: format!("tools.{name}"),
                message: format!(
                    "makes {n} tools ({}); pick one by its name",
                    tools
                        .iter()
                        .map(|t| t.name().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }
}

/// `[tools.search]` options.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchOptions {
    /// A path (read as `format`), or a table `{ jsonl = path }` / `{ hotpotqa = [paths] }`
    /// (required; the synthetic env's world supplies its own).
    corpus: Option<Value>,
    /// `jsonl` (default) or `hotpotqa`, for a `corpus` given as a path.
    format: Option<String>,
    /// Where the BM25 index lives (default: `<first corpus file>.index/`, or a cache
    /// directory when that cannot be created).
    index_dir: Option<PathBuf>,
    /// Results per query (default 5, as Agent-R1).
    #[schemars(range(min = 1))]
    top_k: Option<usize>,
    /// Longest text shown per result, in characters (default 600).
    #[schemars(range(min = 1))]
    max_doc_chars: Option<usize>,
    /// Searches that may run at once (default 8).
    #[schemars(range(min = 1))]
    max_concurrency: Option<usize>,
    /// Indexing threads (default: tantivy's choice, at most 4).
    #[schemars(range(min = 1))]
    index_threads: Option<usize>,
}

impl KindOptions for SearchOptions {
    fn validate(&self) -> Result<()> {
        crate::config::check_declared(self).map_err(|e| e.under("tools.search"))?;
        self.clone().into_config().map(|_| ())
    }

    fn keys() -> Vec<crate::config::KeyDoc> {
        crate::config::key_docs::<Self>()
    }
}

impl SearchOptions {
    fn into_config(self) -> Result<search::SearchConfig> {
        let key = |k: &str| format!("tools.search.{k}");
        let source = match (&self.corpus, self.format.as_deref()) {
            (Some(Value::String(path)), None | Some("jsonl")) => {
                search::CorpusSource::Jsonl(PathBuf::from(path))
            }
            (Some(Value::String(path)), Some("hotpotqa")) => {
                search::CorpusSource::HotpotQa(vec![PathBuf::from(path)])
            }
            (Some(Value::String(_)), Some(other)) => {
                return Err(Error::Config {
                    key: key("format"),
                    message: format!("`{other}` (allowed: jsonl, hotpotqa)"),
                })
            }
            (Some(table @ Value::Object(_)), _) => {
                serde_json::from_value(table.clone()).map_err(|e| Error::Config {
                    key: key("corpus"),
                    message: format!(
                        "{e} (expected {{ jsonl = path }} or {{ hotpotqa = [paths] }})"
                    ),
                })?
            }
            _ => {
                return Err(Error::Config {
                    key: key("corpus"),
                    message: "required: path of a JSONL corpus or HotpotQA JSON file".into(),
                })
            }
        };
        let mut config = search::SearchConfig::new(source);
        config.index_dir = self.index_dir;
        // Ranges are checked in `validate`, from the declared ones.
        config.top_k = self.top_k.unwrap_or(config.top_k);
        config.max_doc_chars = self.max_doc_chars.unwrap_or(config.max_doc_chars);
        config.max_concurrency = self.max_concurrency.unwrap_or(config.max_concurrency);
        config.index_threads = self.index_threads.unwrap_or(config.index_threads);
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: &ToolRegistry, name: &str, options: Value) -> String {
        let checked = r.check(name, &options).map(|_| ()).unwrap_err().to_string();
        match r.create(name, &options) {
            Err(e) => {
                assert_eq!(e.to_string(), checked, "check and create disagree");
                checked
            }
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn unknown_names_and_keys_are_reported_by_check_as_by_create() {
        let r = ToolRegistry::with_builtins();
        let e = err(&r, "websearch", json!({}));
        assert_eq!(
            e,
            "unknown tool `websearch` (known: calculator, mcp, python, search)"
        );
        let e = err(&r, "search", json!({"corpus": "x", "topk": 3}));
        assert!(e.contains("tools.search.topk"), "{e}");
        let e = err(&r, "search", json!({}));
        assert!(e.contains("tools.search.corpus"), "{e}");
        let e = err(&r, "search", json!({"corpus": "x", "format": "csv"}));
        assert!(e.contains("tools.search.format"), "{e}");
        let e = err(&r, "search", json!({"corpus": "x", "top_k": -1}));
        assert!(e.contains("tools.search.top_k"), "{e}");
        let e = err(&r, "calculator", json!({"precision": 3}));
        assert!(e.contains("tools.calculator.precision"), "{e}");
        let e = err(&r, "python", json!({"timeout": 3}));
        assert!(e.contains("tools.python.timeout"), "{e}");
        let e = err(&r, "python", json!({"timeout_secs": 1e30}));
        assert!(e.contains("tools.python.timeout_secs"), "{e}");
        let e = err(&r, "python", json!({"memory_mib": "lots"}));
        assert!(e.contains("tools.python.memory_mib"), "{e}");
        let e = err(&r, "mcp", json!({"command": "x", "timeout_secs": 1e30}));
        assert!(e.contains("tools.mcp.timeout_secs"), "{e}");
        let e = err(&r, "mcp", json!({"args": []}));
        assert!(e.contains("tools.mcp") && e.contains("command"), "{e}");
    }

    #[test]
    fn check_has_no_side_effects() {
        let r = ToolRegistry::with_builtins();
        // A server that would fail to start, and a corpus that does not exist: both only
        // parsed.
        r.check("mcp", &json!({"command": "/nonexistent/server"}))
            .unwrap();
        r.check("search", &json!({"corpus": "/nonexistent/corpus.jsonl"}))
            .unwrap();
    }

    #[test]
    fn builds_tools_from_options() {
        let r = ToolRegistry::with_builtins();
        assert_eq!(
            r.create("calculator", &Value::Null).unwrap().name(),
            "calculator"
        );
        let py = r.create("python", &json!({"timeout_secs": 3.0})).unwrap();
        assert_eq!(py.timeout(), std::time::Duration::from_secs(8));
        let tmp = tempfile::tempdir().unwrap();
        let corpus = tmp.path().join("c.jsonl");
        std::fs::write(
            &corpus,
            "{\"id\": \"1\", \"title\": \"T\", \"text\": \"x\"}\n",
        )
        .unwrap();
        let s = r
            .create("search", &json!({"corpus": {"jsonl": corpus}, "top_k": 2}))
            .unwrap();
        assert_eq!(s.name(), "search");
    }
}
