//! What every crate's config types share: the error that names a key, and the checks and
//! documentation read from each type's own schema.
//!
//! A config type derives `serde` and [`schemars::JsonSchema`]. Its doc comments are the
//! keys' meanings, its `Default` the defaults, and `#[schemars(range(min = .., max = ..))]`
//! (or `extend("exclusiveMinimum" = ..)`) the allowed range. [`Section::validate`] checks
//! every declared range, and that every number is finite, from that schema, then the type's
//! own cross-key [`Section::rules`]; [`key_docs`] lists every key for `check-config
//! --explain`. A key's type, default, range and meaning are so written once, beside the field.

mod keys;

use std::fmt;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;

pub use keys::{key_docs, Allowed, Bound, KeyDoc};

/// One bad value, the one config error type of every crate: where (the file, when the config
/// came from one; the dotted key, relative to the type that found it until a caller places it
/// with [`ConfigError::under`]; the line and column when the parser knows them) and what was
/// given versus what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file, when the config came from one.
    pub file: Option<PathBuf>,
    /// Dotted key path, e.g. `gamma`, or `algorithm.gamma` once placed (empty for a
    /// document-level error).
    pub key: String,
    /// 1-based line and column of the offending text, when known.
    pub position: Option<(usize, usize)>,
    /// What was given and what is allowed.
    pub message: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            key: key.into(),
            position: None,
            message: message.into(),
        }
    }

    /// The same error, found in `file`.
    pub fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self
    }

    /// The same error, at 1-based `line` and `column` of its text.
    pub fn at(mut self, line: usize, column: usize) -> Self {
        self.position = Some((line, column));
        self
    }

    /// `key`: got `given`; allowed: `allowed`.
    pub fn range(
        key: impl Into<String>,
        given: impl fmt::Display,
        allowed: impl fmt::Display,
    ) -> Self {
        Self::new(key, format!("got {given}; allowed: {allowed}"))
    }

    /// The same error with its key placed under `section` (`gamma` -> `algorithm.gamma`).
    pub fn under(mut self, section: &str) -> Self {
        self.key = match (section.is_empty(), self.key.is_empty()) {
            (true, _) => self.key,
            (false, true) => section.to_string(),
            (false, false) => format!("{section}.{}", self.key),
        };
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some((line, column)) = self.position {
                write!(f, ":{line}:{column}")?;
            }
            f.write_str(": ")?;
        } else if let Some((line, column)) = self.position {
            write!(f, "line {line}, column {column}: ")?;
        }
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "`{}`: {}", self.key, self.message)
        }
    }
}

impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::Config {
            key: e.key,
            message: e.message,
        }
    }
}

/// A config type checked against its own schema. Implementors add [`Section::rules`] for what
/// involves more than one key; the ranges of single keys belong on the fields.
pub trait Section: Serialize + JsonSchema {
    /// Rules across keys (each error names the key to change). None by default.
    fn rules(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The declared ranges (every number finite), then [`Section::rules`]. Keys in the error
    /// are relative to this type.
    fn validate(&self) -> Result<(), ConfigError> {
        check_declared(self)?;
        self.rules()
    }
}

/// Checks every value of `value` against the range its field declares, and that every number,
/// declared or inside a free-form table, is finite (TOML reads `inf` and `nan`; no setting
/// means them).
pub fn check_declared<T: Serialize + JsonSchema + ?Sized>(value: &T) -> Result<(), ConfigError> {
    let tree = toml::Value::try_from(value)
        .map_err(|e| ConfigError::new("", format!("cannot check the config: {e}")))?;
    for doc in key_docs::<T>() {
        let Some(v) = lookup(&tree, &doc.key) else {
            continue;
        };
        if !doc.allowed.admits(v) {
            return Err(ConfigError::range(doc.key, shown(v), &doc.allowed));
        }
    }
    // Free-form tables (a tool's or an env's options) are read by their kind later, from
    // JSON, where `inf` would turn into `null`: refuse it here, named.
    match non_finite(&tree, "") {
        Some((key, v)) => Err(ConfigError::range(key, v, "a finite number")),
        None => Ok(()),
    }
}

/// The first non-finite float under `node`, with its dotted key.
fn non_finite(node: &toml::Value, key: &str) -> Option<(String, f64)> {
    let child = |k: &str| {
        if key.is_empty() {
            k.to_string()
        } else {
            format!("{key}.{k}")
        }
    };
    match node {
        toml::Value::Float(f) if !f.is_finite() => Some((key.to_string(), *f)),
        toml::Value::Table(t) => t.iter().find_map(|(k, v)| non_finite(v, &child(k))),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| non_finite(v, &format!("{key}[{i}]"))),
        _ => None,
    }
}

/// A value as an error shows it: TOML, with very large or small floats in `1e30` form.
pub fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(f) if f.is_finite() && *f != 0.0 && !(1e-4..1e15).contains(&f.abs()) => {
            format!("{f:e}")
        }
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(shown).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The top-level field names of `T` (flattened fields included), as its config spells them.
pub fn field_names<T: JsonSchema + ?Sized>() -> Vec<String> {
    let schema = schemars::schema_for!(T);
    schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// The value at a dotted key, if present (keys under a map's `NAME` are not looked up).
fn lookup<'a>(tree: &'a toml::Value, key: &str) -> Option<&'a toml::Value> {
    key.split('.').try_fold(tree, |node, part| node.get(part))
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// A section for the tests.
    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        /// Discount, in [0, 1]. More words here.
        #[schemars(range(min = 0.0, max = 1.0))]
        gamma: f64,
        /// Learning rate.
        #[schemars(extend("exclusiveMinimum" = 0))]
        lr: f64,
        /// Passes.
        #[schemars(range(min = 1))]
        epochs: usize,
        /// Betas.
        #[schemars(extend("items" = { "type": "number", "minimum": 0, "exclusiveMaximum": 1 }))]
        betas: [f64; 2],
        /// Unbounded but finite.
        bonus: f64,
        /// A nested section.
        inner: Inner,
    }

    /// Inner.
    #[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
    #[serde(default)]
    struct Inner {
        /// Seconds to wait.
        #[schemars(extend("exclusiveMinimum" = 0), range(max = 60))]
        wait: f64,
    }

    impl Default for Demo {
        fn default() -> Self {
            Self {
                gamma: 1.0,
                lr: 1e-3,
                epochs: 1,
                betas: [0.9, 0.999],
                bonus: 0.0,
                inner: Inner { wait: 5.0 },
            }
        }
    }

    impl Section for Demo {}

    #[test]
    fn declared_ranges_are_checked_with_the_key_the_value_and_the_range() {
        Demo::default().validate().unwrap();
        let cases: [(Demo, &str); 7] = [
            (
                Demo {
                    gamma: 1.5,
                    ..Default::default()
                },
                "`gamma`: got 1.5; allowed: a finite number in [0, 1]",
            ),
            (
                Demo {
                    lr: 0.0,
                    ..Default::default()
                },
                "`lr`: got 0.0; allowed: a finite number > 0",
            ),
            (
                Demo {
                    epochs: 0,
                    ..Default::default()
                },
                "`epochs`: got 0; allowed: an integer >= 1",
            ),
            (
                Demo {
                    betas: [0.9, 1.0],
                    ..Default::default()
                },
                "`betas`: got [0.9, 1.0]; allowed: a list of 2, each a finite number in [0, 1)",
            ),
            (
                Demo {
                    bonus: f64::NAN,
                    ..Default::default()
                },
                "`bonus`: got nan; allowed: a finite number",
            ),
            (
                Demo {
                    inner: Inner {
                        wait: f64::INFINITY,
                    },
                    ..Default::default()
                },
                "`inner.wait`: got inf; allowed: a finite number in (0, 60]",
            ),
            (
                Demo {
                    inner: Inner { wait: 1e30 },
                    ..Default::default()
                },
                "`inner.wait`: got 1e30; allowed: a finite number in (0, 60]",
            ),
        ];
        for (demo, want) in cases {
            assert_eq!(demo.validate().unwrap_err().to_string(), want);
        }
        let placed = Demo {
            gamma: 2.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .under("algorithm");
        assert_eq!(placed.key, "algorithm.gamma");
    }

    #[test]
    fn key_docs_list_type_default_range_and_the_first_sentence() {
        let docs = key_docs::<Demo>();
        let keys: Vec<&str> = docs.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(
            keys,
            ["betas", "bonus", "epochs", "gamma", "inner.wait", "lr"]
        );
        let gamma = &docs[3];
        assert_eq!(gamma.kind, "number");
        assert_eq!(gamma.default.as_deref(), Some("1.0"));
        assert_eq!(gamma.allowed.to_string(), "a finite number in [0, 1]");
        assert_eq!(gamma.meaning, "Discount, in [0, 1].");
        assert_eq!(docs[0].default.as_deref(), Some("[0.9, 0.999]"));
        assert_eq!(docs[4].default.as_deref(), Some("5.0"));
    }
}
