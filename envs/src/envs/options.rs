//! Reading an env's options: unknown keys refused, `null` as all defaults, errors naming
//! the env.

use serde_json::Value;

use crate::error::{Error, Result};

/// Rejects option keys that are not fields of `T` (so a typo is an error, not a silent
/// default). For option types with flattened parts, where serde's `deny_unknown_fields`
/// cannot be used; the fields are read from `T`'s schema.
pub fn check_option_keys<T: schemars::JsonSchema>(env: &str, options: &Value) -> Result<()> {
    let known = crate::config::field_names::<T>();
    match options {
        Value::Null => Ok(()),
        Value::Object(map) => {
            for key in map.keys() {
                if !known.contains(key) {
                    return Err(Error::Config {
                        key: format!("env.{key}"),
                        message: format!(
                            "`{env}` has no option `{key}` (known: {})",
                            known.join(", ")
                        ),
                    });
                }
            }
            Ok(())
        }
        _ => Err(Error::Config {
            key: "env".into(),
            message: format!("`{env}` options must be a JSON object"),
        }),
    }
}

/// Deserialises env options (`null` means all defaults), naming the env in errors.
pub fn parse_options<T: serde::de::DeserializeOwned + Default>(
    env: &str,
    options: &Value,
) -> Result<T> {
    if options.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(options.clone()).map_err(|e| Error::Config {
        key: "env".into(),
        message: format!("`{env}` options: {e}"),
    })
}
