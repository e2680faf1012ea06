//! Scorer kinds by name, registered like tool kinds: each with its options type, so that
//! `check-config` checks a `[scorer]` table exactly as `train` builds it.

use std::sync::Arc;

use serde_json::Value;

use super::command::{CommandScorer, CommandScorerOptions};
use super::http_judge::{HttpJudge, HttpJudgeOptions};
use super::scorer::Scorer;
use crate::error::{Error, Result};
use crate::kinds::{KindOptions, Kinds};

/// Scorer kinds by name.
#[derive(Debug, Clone)]
pub struct ScorerRegistry {
    kinds: Kinds<Arc<dyn Scorer>>,
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
            kinds: Kinds::new(|_| "scorer".to_string()),
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
        O: KindOptions,
        F: Fn(O) -> Result<Arc<dyn Scorer>> + Send + Sync + 'static,
    {
        self.kinds.register(name, build);
        self
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.kinds.names()
    }

    /// Parses and checks `options` (the `[scorer]` table without `type`) with no side effects.
    pub fn check(&self, name: &str, options: &Value) -> Result<()> {
        self.kinds
            .check("scorer", name, options)
            .map_err(|e| self.unknown_at_type(e))
    }

    /// Builds the scorer.
    pub fn create(&self, name: &str, options: &Value) -> Result<Arc<dyn Scorer>> {
        self.kinds
            .create("scorer", name, options)
            .map_err(|e| self.unknown_at_type(e))
    }

    /// An unknown kind is reported at `scorer.type`, with the kinds allowed.
    fn unknown_at_type(&self, error: Error) -> Error {
        match error {
            Error::Unknown { name, known, .. } => Error::Config {
                key: "scorer.type".into(),
                message: format!("no scorer kind {name:?}; allowed: {known}"),
            },
            other => other,
        }
    }
}
