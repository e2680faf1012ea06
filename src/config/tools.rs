//! `[tools.NAME]` and `[scorer]`: read by the tools' and scorers' own factories, exactly as
//! `train` builds them.

use std::path::Path;

use agent_r1_envs::envs::synthetic_multihop;
use agent_r1_envs::tools::ToolsConfig;
use serde_json::{json, Value};

use super::{relabel, ConfigError, TrainConfig};
use crate::registries::Registries;

impl TrainConfig {
    /// Every tool table and the scorer table, checked by their kinds' factories.
    pub(super) fn check_tools_and_scorer(
        &self,
        registries: &Registries,
    ) -> Result<(), ConfigError> {
        let world = self.training.run_dir.join("world");
        self.tools_config(Some(&world))
            .check_all(&registries.tools)
            .map_err(|err| relabel(err, str::to_string, "tools"))?;
        match self.scorer_options()? {
            None => Ok(()),
            Some((kind, options)) => registries
                .scorers
                .check(&kind, &options)
                .map_err(|err| relabel(err, str::to_string, "scorer")),
        }
    }

    /// The `[scorer]` table's kind and its options (the table without `type`).
    pub fn scorer_options(&self) -> Result<Option<(String, Value)>, ConfigError> {
        let Some(table) = &self.scorer else {
            return Ok(None);
        };
        let mut table = table.clone();
        let kind = match table.remove("type") {
            Some(toml::Value::String(kind)) => kind,
            Some(other) => {
                return Err(ConfigError::range(
                    "scorer.type",
                    other,
                    "a scorer kind (string)",
                ))
            }
            None => {
                return Err(ConfigError::new(
                    "scorer.type",
                    "required: the scorer kind (http_judge, or a registered one)",
                ))
            }
        };
        let options =
            serde_json::to_value(&table).map_err(|e| ConfigError::new("scorer", e.to_string()))?;
        Ok(Some((kind, options)))
    }

    /// The `[tools.NAME]` tables as the envs crate's [`ToolsConfig`], as a run builds them.
    /// A table named `search` that names no corpus gets the env's: with
    /// `synthetic_multihop` the world's (`WORLD/corpus.jsonl`, written by the run, and the
    /// built-in kind its index directory there), else `[env.options] corpus` when set.
    pub fn tools_config(&self, world: Option<&Path>) -> ToolsConfig {
        let synthetic = self.env.name == synthetic_multihop::NAME;
        let env_corpus = if synthetic {
            world.map(|w| json!(w.join("corpus.jsonl")))
        } else {
            self.env
                .options
                .get("corpus")
                .and_then(|c| serde_json::to_value(c).ok())
        };
        let tables = self.tools.iter().map(|(name, table)| {
            let mut json = serde_json::to_value(table).unwrap_or(Value::Null);
            if let (Some(corpus), "search", Value::Object(map)) =
                (&env_corpus, name.as_str(), &mut json)
            {
                let builtin = map.get("type").is_none_or(|t| t == "search");
                if !map.contains_key("corpus") {
                    map.insert("corpus".into(), corpus.clone());
                    if let (true, true, Some(world)) = (builtin, synthetic, world) {
                        map.entry("index_dir")
                            .or_insert_with(|| json!(world.join("search-index")));
                    }
                }
            }
            (name.clone(), json)
        });
        ToolsConfig {
            tables: tables.collect(),
        }
    }
}
