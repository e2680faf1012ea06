//! Kinds by name, each registered with its options type: what the tool and scorer
//! registries are made of.
//!
//! A kind's config table is deserialised into its options type and checked with
//! [`KindOptions::validate`] before anything is built. [`Kinds::check`] does only that, with
//! no side effects (what `check-config` runs); [`Kinds::create`] does the same, then builds.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::KeyDoc;
use crate::error::{Error, Result};

/// A kind's options: what its config table deserialises into (use
/// `#[serde(deny_unknown_fields)]`, so that a misspelt key is an error).
pub trait KindOptions: DeserializeOwned + 'static {
    /// Checks beyond the types (ranges, combinations), without side effects. Errors name
    /// their key in full (`tools.python.timeout_secs`, `scorer.url`).
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The options' keys, for `check-config --explain`: none by default; a type that derives
    /// `schemars::JsonSchema` returns `crate::config::key_docs::<Self>()`.
    fn keys() -> Vec<KeyDoc>
    where
        Self: Sized,
    {
        Vec::new()
    }
}

type CheckFn = dyn Fn(&Value) -> Result<()> + Send + Sync;
type BuildFn<T> = dyn Fn(&Value) -> Result<T> + Send + Sync;

struct Factory<T> {
    check: Arc<CheckFn>,
    build: Arc<BuildFn<T>>,
    keys: fn() -> Vec<KeyDoc>,
}

impl<T> Clone for Factory<T> {
    fn clone(&self) -> Self {
        Self {
            check: self.check.clone(),
            build: self.build.clone(),
            keys: self.keys,
        }
    }
}

/// Factories of `T` by kind name; errors name keys under `table(kind)`.
pub struct Kinds<T> {
    factories: BTreeMap<String, Factory<T>>,
    table: fn(&str) -> String,
}

impl<T> Clone for Kinds<T> {
    fn clone(&self) -> Self {
        Self {
            factories: self.factories.clone(),
            table: self.table,
        }
    }
}

impl<T> std::fmt::Debug for Kinds<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl<T: 'static> Kinds<T> {
    /// No kinds; `table` names the config table of a kind (`tools.search`, `scorer`).
    pub fn new(table: fn(&str) -> String) -> Self {
        Self {
            factories: BTreeMap::new(),
            table,
        }
    }

    /// Adds (or replaces) the kind `name`, built from options `O`.
    pub fn register<O, F>(&mut self, name: impl Into<String>, build: F)
    where
        O: KindOptions,
        F: Fn(O) -> Result<T> + Send + Sync + 'static,
    {
        let name = name.into();
        let table = (self.table)(&name);
        let check = {
            let table = table.clone();
            move |options: &Value| parse_options::<O>(&table, options).map(|_| ())
        };
        let build = move |options: &Value| build(parse_options::<O>(&table, options)?);
        self.factories.insert(
            name,
            Factory {
                check: Arc::new(check),
                build: Arc::new(build),
                keys: O::keys,
            },
        );
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// The option keys the kind `name` describes (see [`KindOptions::keys`]); none for an
    /// unknown kind.
    pub fn keys(&self, name: &str) -> Vec<KeyDoc> {
        self.factories
            .get(name)
            .map_or_else(Vec::new, |f| (f.keys)())
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    fn factory(&self, name: &str, what: &'static str) -> Result<&Factory<T>> {
        self.factories.get(name).ok_or_else(|| Error::Unknown {
            kind: what,
            name: name.to_string(),
            known: self.names().join(", "),
        })
    }

    /// Parses and checks `options` for the kind `name` as [`Self::create`] will, with no side
    /// effects. `what` names the family in an unknown-kind error (`tool`, `scorer`).
    pub fn check(&self, what: &'static str, name: &str, options: &Value) -> Result<()> {
        (self.factory(name, what)?.check)(options)
    }

    /// Builds the kind `name` from `options`.
    pub fn create(&self, what: &'static str, name: &str, options: &Value) -> Result<T> {
        (self.factory(name, what)?.build)(options)
    }
}

/// Deserialises and validates a kind's options (`null` means defaults), naming keys under
/// `table`.
fn parse_options<O: KindOptions>(table: &str, options: &Value) -> Result<O> {
    let value = match options {
        Value::Null => Value::Object(Default::default()),
        Value::Object(_) => options.clone(),
        other => {
            return Err(Error::Config {
                key: table.to_string(),
                message: format!("expected a table, got {other}"),
            })
        }
    };
    let parsed: O = serde_path_to_error::deserialize(value).map_err(|e| {
        let mut key = table.to_string();
        let path = e.path().to_string();
        if path != "." {
            key = format!("{key}.{path}");
        }
        let message = e.inner().to_string();
        // An unknown key of a struct with no fields is reported at its table: name the key.
        if let Some(field) = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
        {
            if !key.ends_with(&format!(".{field}")) {
                key = format!("{key}.{field}");
            }
        }
        Error::Config { key, message }
    })?;
    parsed.validate()?;
    Ok(parsed)
}
