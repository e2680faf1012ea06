//! Scorer kinds by name, registered like tool kinds: each with its options type, so that
//! `check-config` checks a `[scorer]` table exactly as `train` builds it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::command::{CommandScorer, CommandScorerOptions};
use super::http_judge::{HttpJudge, HttpJudgeOptions};
use super::scorer::Scorer;
use crate::error::{Error, Result};
use crate::tools::registry::parse_options;
use crate::tools::ToolOptions;

type CheckFn = dyn Fn(&Value) -> Result<()> + Send + Sync;
type BuildFn = dyn Fn(&Value) -> Result<Arc<dyn Scorer>> + Send + Sync;

#[derive(Clone)]
struct Factory {
    check: Arc<CheckFn>,
    build: Arc<BuildFn>,
}

/// Scorer kinds by name.
#[derive(Clone)]
pub struct ScorerRegistry {
    factories: BTreeMap<String, Factory>,
}

impl std::fmt::Debug for ScorerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl Default for ScorerRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl ScorerRegistry {
    /// No kinds.
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
        }
    }

    /// The built-in kinds: `http_judge` and `command`.
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register("command", |o: CommandScorerOptions| {
            Ok(Arc::new(CommandScorer::new(o)))
        });
        r.register("http_judge", |o: HttpJudgeOptions| {
            Ok(Arc::new(HttpJudge::new(o)?))
        });
        r
    }

    /// Adds (or replaces) the kind `name`, built from options `O`.
    pub fn register<O, F>(&mut self, name: impl Into<String>, build: F) -> &mut Self
    where
        O: ToolOptions,
        F: Fn(O) -> Result<Arc<dyn Scorer>> + Send + Sync + 'static,
    {
        let check = |options: &Value| parse_options::<O>("scorer", options).map(|_| ());
        let build = move |options: &Value| build(parse_options::<O>("scorer", options)?);
        self.factories.insert(
            name.into(),
            Factory {
                check: Arc::new(check),
                build: Arc::new(build),
            },
        );
        self
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    fn factory(&self, name: &str) -> Result<&Factory> {
        self.factories.get(name).ok_or_else(|| Error::Config {
            key: "scorer.type".into(),
            message: format!(
                "no scorer kind {name:?}; allowed: {}",
                self.names().join(", ")
            ),
        })
    }

    /// Parses and checks `options` (the `[scorer]` table without `type`) with no side effects.
    pub fn check(&self, name: &str, options: &Value) -> Result<()> {
        (self.factory(name)?.check)(options)
    }

    /// Builds the scorer.
    pub fn create(&self, name: &str, options: &Value) -> Result<Arc<dyn Scorer>> {
        (self.factory(name)?.build)(options)
    }
}
