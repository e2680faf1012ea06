//! The `[tools.NAME]` tables of a TOML config.
//!
//! Each table holds one tool's options. Its factory is the table's `type` key when present
//! (so `[tools.clock] type = "mcp"` starts an MCP server) and the table's name otherwise
//! (`[tools.search]` uses the `search` factory). `type` is removed before the factory sees
//! the options. Relative paths are relative to the working directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::tool::Tool;
use crate::tools::search::{CorpusSource, SearchTool};
use crate::tools::ToolRegistry;

/// The tool tables of a config, as JSON options by table name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsConfig {
    /// Options by table name (in name order).
    pub tables: BTreeMap<String, Value>,
}

impl ToolsConfig {
    /// Reads the `[tools.*]` tables of a TOML file (other sections are ignored).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text).map_err(|e| match e {
            Error::Config { key, message } => Error::BadFile {
                path: path.to_path_buf(),
                message: format!("`{key}`: {message}"),
            },
            other => other,
        })
    }

    /// Reads the `[tools.*]` tables of TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| Error::Config {
            key: "tools".into(),
            message: format!("not valid TOML: {e}"),
        })?;
        let json = serde_json::to_value(&doc).map_err(|e| Error::Other(e.to_string()))?;
        let tables = match json.get("tools") {
            None => BTreeMap::new(),
            Some(Value::Object(map)) => {
                let mut tables = BTreeMap::new();
                for (name, options) in map {
                    if !options.is_object() {
                        return Err(Error::Config {
                            key: format!("tools.{name}"),
                            message: "must be a table".into(),
                        });
                    }
                    tables.insert(name.clone(), options.clone());
                }
                tables
            }
            Some(_) => {
                return Err(Error::Config {
                    key: "tools".into(),
                    message: "must be a table of tables ([tools.NAME])".into(),
                })
            }
        };
        Ok(Self { tables })
    }

    /// The factory name and options of table `name`.
    fn factory_of(&self, name: &str, options: &Value) -> Result<(String, Value)> {
        let mut options = options.clone();
        let kind = match options.as_object_mut().and_then(|m| m.remove("type")) {
            None => name.to_string(),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(Error::Config {
                    key: format!("tools.{name}.type"),
                    message: format!("must be a string, got {other}"),
                })
            }
        };
        Ok((kind, options))
    }

    /// Checks every table's options with its kind's parser, as [`Self::build_all`] will,
    /// without building anything (no server started, no corpus indexed).
    pub fn check_all(&self, registry: &ToolRegistry) -> Result<()> {
        for (name, options) in &self.tables {
            let (kind, options) = self.factory_of(name, options)?;
            registry
                .check(&kind, &options)
                .map_err(|e| under_table(e, name, &kind))?;
        }
        Ok(())
    }

    /// The corpus of each table of the built-in `search` kind, by table name, as configured
    /// (`None`: the table names none).
    pub fn search_corpora(&self) -> Result<Vec<(String, Option<CorpusSource>)>> {
        let mut corpora = Vec::new();
        for (name, options) in &self.tables {
            let (kind, options) = self.factory_of(name, options)?;
            if kind != "search" {
                continue;
            }
            let corpus = match options.get("corpus") {
                None => None,
                Some(c) => Some(serde_json::from_value(c.clone()).map_err(|e| Error::Config {
                    key: format!("tools.{name}.corpus"),
                    message: format!("{e} (write {{ jsonl = \"docs.jsonl\" }} or {{ hotpotqa = [\"f.json\"] }})"),
                })?),
            };
            corpora.push((name.clone(), corpus));
        }
        Ok(corpora)
    }

    /// The specs the model is shown for every configured tool, as [`Self::build_all`]'s
    /// tools give them; `search` tables are not opened (no corpus is indexed), the other
    /// kinds are built.
    pub fn specs(&self, registry: &ToolRegistry) -> Result<Vec<Value>> {
        let mut specs = Vec::new();
        for (name, options) in &self.tables {
            let (kind, _) = self.factory_of(name, options)?;
            if kind == "search" && registry.is_builtin_search() {
                specs.push(SearchTool::unopened_spec());
            } else {
                specs.extend(
                    self.build_table(registry, name, options)?
                        .iter()
                        .map(|t| t.spec()),
                );
            }
        }
        Ok(specs)
    }

    /// Builds every configured tool.
    pub fn build_all(&self, registry: &ToolRegistry) -> Result<Vec<Arc<dyn Tool>>> {
        let mut tools = Vec::new();
        for (name, options) in &self.tables {
            tools.extend(self.build_table(registry, name, options)?);
        }
        Ok(tools)
    }

    fn build_table(
        &self,
        registry: &ToolRegistry,
        name: &str,
        options: &Value,
    ) -> Result<Vec<Arc<dyn Tool>>> {
        let (kind, options) = self.factory_of(name, options)?;
        registry
            .create_all(&kind, &options)
            .map_err(|e| under_table(e, name, &kind))
    }

    /// Builds the tool the model would call `name`: from table `[tools.NAME]` when there is
    /// one, else from a configured tool set (an MCP server) that has a tool of that name,
    /// else from the registry's factory `name` with default options.
    pub fn build_one(&self, registry: &ToolRegistry, name: &str) -> Result<Arc<dyn Tool>> {
        if let Some(options) = self.tables.get(name) {
            let tools = self.build_table(registry, name, options)?;
            if tools.len() == 1 {
                return tools
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::Other("empty".into()));
            }
            return pick(tools, name);
        }
        for (table, options) in &self.tables {
            let (kind, _) = self.factory_of(table, options)?;
            if kind == table.as_str() && registry.contains(table) && kind != "mcp" {
                continue; // a single-tool table named after its factory: not `name`
            }
            let tools = self.build_table(registry, table, options)?;
            if tools.iter().any(|t| t.name() == name) {
                return pick(tools, name);
            }
        }
        registry.create(name, &Value::Null)
    }
}

/// Reports an error of kind `kind`'s options under the table that holds them: with
/// `[tools.py] type = "python"`, `tools.python.timeout_secs` becomes `tools.py.timeout_secs`.
/// An unknown kind is reported at the key that named it (`type`, or the table's name).
fn under_table(error: Error, table: &str, kind: &str) -> Error {
    match error {
        Error::Unknown {
            kind: "tool",
            known,
            ..
        } => Error::Config {
            key: if table == kind {
                format!("tools.{table}")
            } else {
                format!("tools.{table}.type")
            },
            message: format!(
                "no tool kind {kind:?}; allowed: {known} (or set `type` to one of them)"
            ),
        },
        Error::Config { key, message } if table != kind => {
            let prefix = format!("tools.{kind}");
            let key = match key.strip_prefix(&prefix) {
                Some(rest) if rest.is_empty() || rest.starts_with('.') => {
                    format!("tools.{table}{rest}")
                }
                _ => key,
            };
            Error::Config { key, message }
        }
        other => other,
    }
}

fn pick(tools: Vec<Arc<dyn Tool>>, name: &str) -> Result<Arc<dyn Tool>> {
    let names: Vec<String> = tools.iter().map(|t| t.name().to_string()).collect();
    tools
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| Error::Unknown {
            kind: "tool",
            name: name.to_string(),
            known: names.join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tool_tables_and_their_types() {
        let cfg = ToolsConfig::from_toml_str(
            r#"
            [model]
            path = "x"
            [tools.calculator]
            [tools.py]
            type = "python"
            timeout_secs = 2.5
            "#,
        )
        .unwrap();
        assert_eq!(cfg.tables.len(), 2);
        let registry = ToolRegistry::with_builtins();
        let tools = cfg.build_all(&registry).unwrap();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        names.sort();
        assert_eq!(names, ["calculator", "python"]);
        let py = cfg.build_one(&registry, "py").unwrap();
        assert_eq!(py.timeout(), std::time::Duration::from_secs_f64(7.5));
        // Not configured, but a registered factory: built with defaults.
        assert_eq!(
            ToolsConfig::default()
                .build_one(&registry, "calculator")
                .unwrap()
                .name(),
            "calculator"
        );
    }

    #[test]
    fn bad_config_is_reported_with_its_key() {
        let e = ToolsConfig::from_toml_str("tools = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tools`"), "{e}");
        let e = ToolsConfig::from_toml_str("[tools]\ncalc = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tools.calc"), "{e}");
        let e = ToolsConfig::from_toml_str("[tools.x]\ntype = 1").unwrap();
        let e = e
            .build_all(&ToolRegistry::with_builtins())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tools.x.type"), "{e}");
        let e = ToolsConfig::from_toml_str("[tools.x]\ntype = \"nope\"").unwrap();
        let e = e
            .build_all(&ToolRegistry::with_builtins())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tools.x.type") && e.contains("no tool kind \"nope\""),
            "{e}"
        );
    }
}
