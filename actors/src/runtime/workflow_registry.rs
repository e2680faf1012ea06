//! Workflows by name, registered like tools: `[env] name = "..."` names a workflow as it
//! names an env, and `[env.options]` are its options, checked by its options type before a
//! run starts.

use std::sync::Arc;

use serde_json::Value;

use agent_r1_envs::config::KeyDoc;
use agent_r1_envs::kinds::{KindOptions, Kinds};

use super::workflow::Workflow;

/// Workflow kinds by name (none built in: a user's crate registers its own).
#[derive(Debug, Clone)]
pub struct Workflows {
    kinds: Kinds<Arc<dyn Workflow>>,
}

impl Default for Workflows {
    fn default() -> Self {
        Self {
            kinds: Kinds::new(|_| "env.options".to_string()),
        }
    }
}

impl Workflows {
    /// Adds (or replaces) the workflow `name`, built from options `O` (`[env.options]`).
    pub fn register<O, F>(&mut self, name: impl Into<String>, build: F) -> &mut Self
    where
        O: KindOptions,
        F: Fn(O) -> agent_r1_envs::Result<Arc<dyn Workflow>> + Send + Sync + 'static,
    {
        self.kinds.register(name, build);
        self
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.kinds.names()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.kinds.contains(name)
    }

    /// The option keys of `name`, for `check-config --explain`.
    pub fn keys(&self, name: &str) -> Vec<KeyDoc> {
        self.kinds.keys(name)
    }

    /// Checks `options` for `name` as [`Self::create`] will, with no side effects.
    pub fn check(&self, name: &str, options: &Value) -> agent_r1_envs::Result<()> {
        self.kinds.check("workflow", name, options)
    }

    /// Builds the workflow `name` from its options.
    pub fn create(&self, name: &str, options: &Value) -> agent_r1_envs::Result<Arc<dyn Workflow>> {
        self.kinds.create("workflow", name, options)
    }
}
