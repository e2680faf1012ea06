//! Envs by name: built-ins plus whatever a user registers.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::config::{key_docs, KeyDoc};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::generated_env::GeneratedEnv;

pub use super::options::{check_option_keys, parse_options};

/// Builds an env from its JSON options (`{}` when the config gives none).
pub type EnvFactory = Arc<dyn Fn(&Value) -> Result<Box<dyn Env>> + Send + Sync>;

/// Builds an env that generates its own tasks from its JSON options.
pub type GeneratedEnvFactory = Arc<dyn Fn(&Value) -> Result<Box<dyn GeneratedEnv>> + Send + Sync>;

/// How a registered env is built: over dataset files, or generating its own tasks.
#[derive(Clone)]
enum Factory {
    Plain(EnvFactory),
    Generated(GeneratedEnvFactory),
}

/// Env factories by name.
#[derive(Clone)]
pub struct EnvRegistry {
    factories: BTreeMap<String, Factory>,
    option_keys: BTreeMap<String, fn() -> Vec<KeyDoc>>,
}

impl std::fmt::Debug for EnvRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvRegistry")
            .field("names", &self.names())
            .finish()
    }
}

impl Default for EnvRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl EnvRegistry {
    /// A registry with no envs.
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
            option_keys: BTreeMap::new(),
        }
    }

    /// A registry with the built-in envs: `multihop_qa` and `math` over dataset files,
    /// `synthetic_multihop` and `synthetic_math` generating their own tasks.
    pub fn with_builtins() -> Self {
        let mut registry = Self::empty();
        registry.register(super::multihop_qa::NAME, |o: &Value| {
            Ok(Box::new(super::MultihopQaEnv::from_options(o)?) as Box<dyn Env>)
        });
        registry.register(super::math::NAME, |o: &Value| {
            Ok(Box::new(super::MathEnv::from_options(o)?) as Box<dyn Env>)
        });
        registry.register_generated(super::synthetic_multihop::NAME, |o: &Value| {
            Ok(Box::new(super::SyntheticMultihopEnv::from_options(o)?) as Box<dyn GeneratedEnv>)
        });
        registry.register_generated(super::synthetic_math::NAME, |o: &Value| {
            Ok(Box::new(super::SyntheticMathEnv::from_options(o)?) as Box<dyn GeneratedEnv>)
        });
        // `synthetic_multihop`'s world and corpus path are set by the trainer, not in
        // `[env.options]`: only its QA settings are listed.
        registry
            .describe(
                super::multihop_qa::NAME,
                key_docs::<super::MultihopQaOptions>,
            )
            .describe(super::math::NAME, key_docs::<super::MathOptions>)
            .describe(
                super::synthetic_multihop::NAME,
                key_docs::<super::QaOptions>,
            )
            .describe(
                super::synthetic_math::NAME,
                key_docs::<super::SyntheticMathOptions>,
            );
        registry
    }

    /// Lists the option keys of `name` for `check-config --explain` (e.g.
    /// `key_docs::<MyOptions>` for options that derive `schemars::JsonSchema`).
    pub fn describe(&mut self, name: impl Into<String>, keys: fn() -> Vec<KeyDoc>) -> &mut Self {
        self.option_keys.insert(name.into(), keys);
        self
    }

    /// The option keys `name` was described with; none when it was not.
    pub fn option_keys(&self, name: &str) -> Vec<KeyDoc> {
        self.option_keys
            .get(name)
            .map_or_else(Vec::new, |keys| keys())
    }

    /// Registers (or replaces) the factory for `name`: an env over dataset files.
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Value) -> Result<Box<dyn Env>> + Send + Sync + 'static,
    {
        self.factories
            .insert(name.into(), Factory::Plain(Arc::new(factory)));
        self
    }

    /// Registers (or replaces) the factory for `name`: an env that generates its own tasks
    /// (and so takes no dataset files, and can make a tokenizer and a warm start).
    pub fn register_generated<F>(&mut self, name: impl Into<String>, factory: F) -> &mut Self
    where
        F: Fn(&Value) -> Result<Box<dyn GeneratedEnv>> + Send + Sync + 'static,
    {
        self.factories
            .insert(name.into(), Factory::Generated(Arc::new(factory)));
        self
    }

    fn factory(&self, name: &str) -> Result<&Factory> {
        self.factories.get(name).ok_or_else(|| Error::Unknown {
            kind: "env",
            name: name.to_string(),
            known: self.names().join(", "),
        })
    }

    /// Builds the env `name` with `options`; an unknown name lists the known ones.
    pub fn create(&self, name: &str, options: &Value) -> Result<Box<dyn Env>> {
        match self.factory(name)? {
            Factory::Plain(factory) => factory(options),
            Factory::Generated(factory) => Ok(factory(options)?),
        }
    }

    /// Builds the env `name`, which must generate its own tasks.
    pub fn create_generated(&self, name: &str, options: &Value) -> Result<Box<dyn GeneratedEnv>> {
        match self.factory(name)? {
            Factory::Generated(factory) => factory(options),
            Factory::Plain(_) => Err(Error::Config {
                key: "env.name".into(),
                message: format!("`{name}` reads dataset files; it does not generate tasks"),
            }),
        }
    }

    /// Whether `name` is registered as an env that generates its own tasks.
    pub fn generates_tasks(&self, name: &str) -> bool {
        matches!(self.factories.get(name), Some(Factory::Generated(_)))
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }
}
