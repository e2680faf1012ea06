//! Small helpers that read typed fields out of a JSON row with a clear message when they
//! are missing or of the wrong type.

use serde_json::{Map, Value};

/// The row as an object.
pub(crate) fn object(row: &Value) -> Result<&Map<String, Value>, String> {
    row.as_object()
        .ok_or_else(|| format!("expected a JSON object, got {}", kind(row)))
}

/// A required non-empty string field.
pub(crate) fn string(row: &Map<String, Value>, key: &str) -> Result<String, String> {
    match row.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(format!("`{key}` is empty")),
        Some(other) => Err(format!("`{key}` must be a string, got {}", kind(other))),
        None => Err(missing(row, key)),
    }
}

/// "missing `key`", naming a key of the row that looks like a misspelling of it (one or two
/// letters off), so that `anwsers` is found without reading the file.
pub(crate) fn missing(row: &Map<String, Value>, key: &str) -> String {
    missing_what(row, key, "")
}

/// [`missing`] with what the key holds, e.g. ` (a string or a list of strings)`.
pub(crate) fn missing_what(row: &Map<String, Value>, key: &str, what: &str) -> String {
    let near = row
        .keys()
        .filter(|k| k.as_str() != key)
        .map(|k| (strsim::damerau_levenshtein(k, key), k))
        .filter(|(d, _)| *d <= 2)
        .min();
    match near {
        Some((_, k)) => format!("missing `{key}`{what}; the row has `{k}`: rename it to `{key}`"),
        None => {
            let mut keys: Vec<&str> = row.keys().map(String::as_str).collect();
            keys.sort_unstable();
            format!("missing `{key}`{what}; the row has: {}", keys.join(", "))
        }
    }
}

/// A required string field that may be empty (answers can be "").
pub(crate) fn string_allow_empty(row: &Map<String, Value>, key: &str) -> Result<String, String> {
    match row.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("`{key}` must be a string, got {}", kind(other))),
        None => Err(missing(row, key)),
    }
}

/// An id: the first of `keys` present, a string or an integer; `None` when none is present.
pub(crate) fn id(row: &Map<String, Value>, keys: &[&str]) -> Result<Option<String>, String> {
    for key in keys {
        match row.get(*key) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) if !s.is_empty() => return Ok(Some(s.clone())),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => return Ok(Some(n.to_string())),
            Some(other) => {
                return Err(format!(
                    "`{key}` must be a string or an integer, got {}",
                    kind(other)
                ))
            }
        }
    }
    Ok(None)
}

/// Answers given as a string, or a list of strings (numbers are written as text).
pub(crate) fn answers(value: &Value, what: &str) -> Result<Vec<String>, String> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Number(n) => Ok(vec![n.to_string()]),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    Value::Number(n) => out.push(n.to_string()),
                    other => {
                        return Err(format!("{what} must hold strings, found {}", kind(other)))
                    }
                }
            }
            if out.is_empty() {
                return Err(format!("{what} is an empty list"));
            }
            Ok(out)
        }
        other => Err(format!(
            "{what} must be a string or a list of strings, got {}",
            kind(other)
        )),
    }
}

/// The row without `keys`, as the task's `extra`.
pub(crate) fn rest(row: &Map<String, Value>, keys: &[&str]) -> Value {
    Value::Object(
        row.iter()
            .filter(|(k, _)| !keys.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// A JSON type name for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
