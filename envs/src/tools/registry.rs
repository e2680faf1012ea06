//! Tool factories by name.
//!
//! A factory builds a tool from its options: the `[tools.NAME]` TOML table converted to JSON
//! (`{}` when there is none). A user's own tool is one file with a type implementing
//! [`Tool`] plus one `registry.register("name", factory)` line (see `docs/tools.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tool::Tool;
use crate::tools::{calculator, mcp, python, search};

/// Builds one tool from its options.
pub type ToolFactory = Box<dyn Fn(&Value) -> Result<Arc<dyn Tool>> + Send + Sync>;
/// Builds a set of tools from one options table (an MCP server's tools).
pub type ToolSetFactory = Box<dyn Fn(&Value) -> Result<Vec<Arc<dyn Tool>>> + Send + Sync>;

/// Tool factories by name.
pub struct ToolRegistry {
    factories: BTreeMap<String, ToolSetFactory>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
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
            factories: BTreeMap::new(),
        }
    }

    /// A registry with the built-in tools: `search`, `calculator`, `python` and `mcp` (a
    /// set: the tools of the server the options start).
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register("search", |o| Ok(Arc::new(search_from_options(o)?)));
        r.register("calculator", |o| {
            no_options("calculator", o)?;
            Ok(Arc::new(calculator::CalculatorTool))
        });
        r.register("python", |o| {
            Ok(Arc::new(python::PythonTool::new(options::<
                python::PythonConfig,
            >(
                "python", o
            )?)?))
        });
        r.register_set("mcp", |o| {
            mcp::connect_tools(options::<mcp::McpServerConfig>("mcp", o)?)
        });
        r
    }

    /// Adds (or replaces) a factory of one tool.
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Value) -> Result<Arc<dyn Tool>> + Send + Sync + 'static,
    {
        self.factories
            .insert(name.into(), Box::new(move |o| Ok(vec![factory(o)?])));
        self
    }

    /// Adds (or replaces) a factory of a set of tools.
    pub fn register_set<F>(&mut self, name: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Value) -> Result<Vec<Arc<dyn Tool>>> + Send + Sync + 'static,
    {
        self.factories.insert(name.into(), Box::new(factory));
        self
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// Builds every tool the factory `name` makes from `options`.
    pub fn create_all(&self, name: &str, options: &Value) -> Result<Vec<Arc<dyn Tool>>> {
        let factory = self.factories.get(name).ok_or_else(|| Error::Unknown {
            kind: "tool",
            name: name.to_string(),
            known: self.names().join(", "),
        })?;
        factory(options)
    }

    /// Builds the one tool the factory `name` makes (an error for a set of several).
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

/// Deserialises a factory's options, naming the table in errors. `null` means defaults.
fn options<T: DeserializeOwned>(tool: &str, options: &Value) -> Result<T> {
    let value = match options {
        Value::Null => Value::Object(Default::default()),
        v => v.clone(),
    };
    serde_json::from_value(value).map_err(|e| Error::Config {
        key: format!("tools.{tool}"),
        message: e.to_string(),
    })
}

fn no_options(tool: &str, options: &Value) -> Result<()> {
    match options {
        Value::Null => Ok(()),
        Value::Object(m) if m.is_empty() => Ok(()),
        Value::Object(m) => Err(Error::Config {
            key: format!(
                "tools.{tool}.{}",
                m.keys().next().map(String::as_str).unwrap_or("")
            ),
            message: "this tool takes no options".into(),
        }),
        other => Err(Error::Config {
            key: format!("tools.{tool}"),
            message: format!("expected a table, got {other}"),
        }),
    }
}

/// `[tools.search]` options: `corpus` (a path with `format` = `jsonl` | `hotpotqa`, or a table
/// `{ jsonl = path }` / `{ hotpotqa = [paths] }`), `index_dir`, `top_k`, `max_doc_chars`,
/// `max_concurrency`, `index_threads`.
fn search_from_options(options: &Value) -> Result<search::SearchTool> {
    const KEYS: [&str; 7] = [
        "corpus",
        "format",
        "index_dir",
        "top_k",
        "max_doc_chars",
        "max_concurrency",
        "index_threads",
    ];
    let key = |k: &str| format!("tools.search.{k}");
    if let Some(obj) = options.as_object() {
        if let Some(bad) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Error::Config {
                key: key(bad),
                message: format!("unknown key (allowed: {})", KEYS.join(", ")),
            });
        }
    }
    let format = options.get("format").and_then(Value::as_str);
    let source = match (options.get("corpus"), format) {
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
                message: format!("{e} (expected {{ jsonl = path }} or {{ hotpotqa = [paths] }})"),
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
    config.index_dir = options
        .get("index_dir")
        .and_then(Value::as_str)
        .map(PathBuf::from);
    let positive = |name: &str| -> Result<Option<usize>> {
        match options.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&k| k > 0)
                .map(|k| Some(k as usize))
                .ok_or_else(|| Error::Config {
                    key: key(name),
                    message: format!("must be a positive integer, got {v}"),
                }),
        }
    };
    if let Some(k) = positive("top_k")? {
        config.top_k = k;
    }
    if let Some(k) = positive("max_doc_chars")? {
        config.max_doc_chars = k;
    }
    if let Some(k) = positive("max_concurrency")? {
        config.max_concurrency = k;
    }
    if let Some(k) = positive("index_threads")? {
        config.index_threads = k;
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
        let e = err(&r, "calculator", json!({"precision": 3}));
        assert!(e.contains("tools.calculator.precision"), "{e}");
        let e = err(&r, "python", json!({"timeout": 3}));
        assert!(e.contains("tools.python") && e.contains("timeout"), "{e}");
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
