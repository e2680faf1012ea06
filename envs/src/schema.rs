//! Checking a call's arguments against its tool's JSON schema before the tool runs.
//!
//! The check uses the `jsonschema` crate (draft auto-detected, no remote `$ref` fetching).
//! Compiled validators are cached by schema text, so validating every call of a tool costs
//! one hash lookup plus the check itself. A failure becomes
//! [`CallError::InvalidArguments`] naming the field (`` `query`: 5 is not of type "string" ``),
//! which is what the model sees.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::tool::CallError;

/// Most distinct schemas kept compiled; past it the cache starts over.
const CACHE_CAPACITY: usize = 256;

/// A compiled argument schema.
#[derive(Debug, Clone)]
pub struct ArgSchema {
    validator: Arc<jsonschema::Validator>,
}

impl ArgSchema {
    /// Compiles `schema`. An invalid schema is a bug of the tool, reported as
    /// [`crate::Error::Config`].
    pub fn compile(schema: &Value) -> crate::Result<Self> {
        let validator = jsonschema::validator_for(schema).map_err(|e| crate::Error::Config {
            key: "parameters".into(),
            message: format!("invalid JSON schema: {e}"),
        })?;
        Ok(Self {
            validator: Arc::new(validator),
        })
    }

    /// Checks `args`; every violation is listed, most relevant first, `; `-separated.
    pub fn validate(&self, args: &Value) -> Result<(), CallError> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(args)
            .take(5)
            .map(|e| {
                let path = field_path(e.instance_path().as_str());
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("`{path}`: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CallError::InvalidArguments(problems.join("; ")))
        }
    }
}

/// Validates `args` against `schema` (compiled once per distinct schema and cached).
///
/// An invalid schema yields [`CallError::Failed`]: the call cannot be checked, and the fault
/// is the tool's, not the model's.
pub fn validate_arguments(schema: &Value, args: &Value) -> Result<(), CallError> {
    compiled(schema)
        .map_err(|e| CallError::Failed(e.to_string()))?
        .validate(args)
}

/// The cached compiled form of `schema`.
fn compiled(schema: &Value) -> crate::Result<ArgSchema> {
    static CACHE: OnceLock<Mutex<HashMap<String, ArgSchema>>> = OnceLock::new();
    let key = schema.to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = lock(cache).get(&key) {
        return Ok(hit.clone());
    }
    let fresh = ArgSchema::compile(schema)?;
    let mut map = lock(cache);
    if map.len() >= CACHE_CAPACITY {
        map.clear();
    }
    map.insert(key, fresh.clone());
    Ok(fresh)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `/items/0/name` -> `items[0].name`.
fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "k": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"enum": ["fast", "exact"]},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn message(args: Value) -> String {
        match validate_arguments(&schema(), &args) {
            Err(CallError::InvalidArguments(m)) => m,
            other => panic!("expected InvalidArguments, got {other:?}"),
        }
    }

    #[test]
    fn accepts_valid_arguments() {
        assert_eq!(
            validate_arguments(&schema(), &json!({"query": "x", "k": 3, "tags": ["a"]})),
            Ok(())
        );
    }

    #[test]
    fn names_the_failing_field() {
        assert!(message(json!({})).contains("\"query\" is a required property"));
        let m = message(json!({"query": 5}));
        assert!(m.starts_with("`query`:"), "{m}");
        assert!(m.contains("not of type \"string\""), "{m}");
        assert!(message(json!({"query": "x", "k": 0})).starts_with("`k`:"));
        assert!(message(json!({"query": "x", "k": 11})).contains("maximum"));
        assert!(message(json!({"query": "x", "mode": "slow"})).starts_with("`mode`:"));
        assert!(message(json!({"query": "x", "tags": ["a", 1]})).starts_with("`tags[1]`:"));
        assert!(message(json!({"query": "x", "extra": 1})).contains("extra"));
        assert!(message(json!("not an object")).contains("object"));
    }

    #[test]
    fn invalid_schema_is_the_tools_fault() {
        let bad = json!({"type": "no-such-type"});
        assert!(matches!(
            validate_arguments(&bad, &json!({})),
            Err(CallError::Failed(_))
        ));
    }

    #[test]
    fn field_paths_read_naturally() {
        assert_eq!(field_path(""), "");
        assert_eq!(field_path("/a/0/b~1c"), "a[0].b/c");
    }
}
