//! Every key of a config type, read from its JSON schema: type, default, range, meaning.

use std::fmt;

use schemars::JsonSchema;
use serde_json::{Map, Value};

/// One key of a config type.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDoc {
    /// Dotted path; a table of named tables shows its names as `NAME` (`tools.NAME`).
    pub key: String,
    /// `integer`, `number`, `boolean`, `string`, `list`, `table` or `choice`.
    pub kind: String,
    /// The default as a TOML value; `None` when the key is required or has no default.
    pub default: Option<String>,
    /// What values are allowed.
    pub allowed: Allowed,
    /// The first sentence of the field's doc comment.
    pub meaning: String,
}

/// An end of a numeric range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The limit.
    pub value: f64,
    /// Whether the limit itself is allowed.
    pub inclusive: bool,
}

/// What values a key allows, as its schema declares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allowed {
    /// The JSON-schema type (`integer`, `number`, `boolean`, `string`, `array`, `object`).
    pub ty: String,
    /// Lower end, for numbers.
    pub min: Option<Bound>,
    /// Upper end, for numbers.
    pub max: Option<Bound>,
    /// The spellings of an enum.
    pub choices: Vec<String>,
    /// A list's length, when fixed.
    pub len: Option<usize>,
    /// What each item of a list allows.
    pub items: Option<Box<Allowed>>,
}

impl Allowed {
    fn numeric(&self) -> bool {
        self.ty == "number" || self.ty == "integer"
    }

    /// Whether `v` is allowed. Only what serde does not already check is looked at: ranges,
    /// finiteness and items.
    pub fn admits(&self, v: &toml::Value) -> bool {
        if let (Some(items), toml::Value::Array(list)) = (&self.items, v) {
            return list.iter().all(|item| items.admits(item));
        }
        if !self.numeric() {
            return true;
        }
        let x = match v {
            toml::Value::Integer(i) => *i as f64,
            toml::Value::Float(f) => *f,
            _ => return true,
        };
        if !x.is_finite() {
            return false;
        }
        let above = self.min.is_none_or(|b| {
            if b.inclusive {
                x >= b.value
            } else {
                x > b.value
            }
        });
        let below = self.max.is_none_or(|b| {
            if b.inclusive {
                x <= b.value
            } else {
                x < b.value
            }
        });
        above && below
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.choices.is_empty() {
            return write!(f, "one of {}", self.choices.join(", "));
        }
        match self.ty.as_str() {
            "integer" | "number" => {
                f.write_str(if self.ty == "integer" {
                    "an integer"
                } else {
                    "a finite number"
                })?;
                match (self.min, self.max) {
                    (Some(lo), Some(hi)) => write!(
                        f,
                        " in {}{}, {}{}",
                        if lo.inclusive { '[' } else { '(' },
                        lo.value,
                        hi.value,
                        if hi.inclusive { ']' } else { ')' }
                    ),
                    (Some(lo), None) => {
                        write!(f, " {} {}", if lo.inclusive { ">=" } else { ">" }, lo.value)
                    }
                    (None, Some(hi)) => {
                        write!(f, " {} {}", if hi.inclusive { "<=" } else { "<" }, hi.value)
                    }
                    (None, None) => Ok(()),
                }
            }
            "array" => {
                f.write_str("a list")?;
                if let Some(n) = self.len {
                    write!(f, " of {n}")?;
                }
                match &self.items {
                    Some(items) => write!(f, ", each {items}"),
                    None => Ok(()),
                }
            }
            "boolean" => f.write_str("true or false"),
            "string" => f.write_str("a string"),
            "object" => f.write_str("a table"),
            _ => f.write_str("see the meaning"),
        }
    }
}

/// Every key of `T`, sorted by path: leaves only (a nested section lists its own keys).
pub fn key_docs<T: JsonSchema + ?Sized>() -> Vec<KeyDoc> {
    let schema = schemars::schema_for!(T);
    let root = schema.as_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    Walker { defs: &defs }.section(root, "", None, &mut out);
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

struct Walker<'a> {
    defs: &'a Map<String, Value>,
}

impl Walker<'_> {
    /// `node` with a `$ref` replaced by its definition (the property's own keywords win), and
    /// `Option<T>`'s `anyOf [T, null]` by `T`.
    fn resolve(&self, node: &Value) -> Map<String, Value> {
        let mut own = node.as_object().cloned().unwrap_or_default();
        if let Some(target) = own
            .remove("$ref")
            .and_then(|r| r.as_str().map(str::to_string))
        {
            let name = target.rsplit('/').next().unwrap_or_default();
            let mut def = self.resolve(self.defs.get(name).unwrap_or(&Value::Null));
            for (k, v) in own {
                def.insert(k, v);
            }
            own = def;
        }
        if let Some(Value::Array(variants)) = own.get("anyOf").cloned() {
            let non_null: Vec<&Value> = variants
                .iter()
                .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
                .collect();
            if let [only] = non_null[..] {
                own.remove("anyOf");
                let mut inner = self.resolve(only);
                for (k, v) in own {
                    inner.insert(k, v);
                }
                own = inner;
            }
        }
        own
    }

    /// The keys under `node` (a struct's properties), `default` being the section's own
    /// default value when its parent gave one.
    fn section(&self, node: &Value, prefix: &str, default: Option<&Value>, out: &mut Vec<KeyDoc>) {
        let node = self.resolve(node);
        let Some(Value::Object(properties)) = node.get("properties") else {
            return;
        };
        for (name, property) in properties {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            let resolved = self.resolve(property);
            // The parent's default for this section is what an absent table gives.
            let field_default = default
                .and_then(|d| d.get(name))
                .or_else(|| resolved.get("default"));
            if resolved.contains_key("properties") {
                self.section(&Value::Object(resolved.clone()), &key, field_default, out);
            } else {
                out.push(self.leaf(key, &resolved, field_default));
            }
        }
    }

    fn leaf(&self, key: String, node: &Map<String, Value>, default: Option<&Value>) -> KeyDoc {
        let allowed = self.allowed(node);
        let map_of_tables = allowed.ty == "object"
            && node
                .get("additionalProperties")
                .is_some_and(|a| a.get("type").and_then(Value::as_str) == Some("object"));
        let kind = match allowed.ty.as_str() {
            _ if !allowed.choices.is_empty() => "choice",
            "array" => "list",
            "object" => "table",
            "" => "any",
            other => other,
        };
        KeyDoc {
            key: if map_of_tables {
                format!("{key}.NAME")
            } else {
                key
            },
            kind: kind.to_string(),
            // A table of named tables has names, not a default.
            default: default.filter(|_| !map_of_tables).and_then(toml_literal),
            allowed,
            meaning: node
                .get("description")
                .and_then(Value::as_str)
                .map(first_sentence)
                .unwrap_or_default(),
        }
    }

    fn allowed(&self, node: &Map<String, Value>) -> Allowed {
        let ty = match node.get("type") {
            Some(Value::String(t)) => t.clone(),
            Some(Value::Array(types)) => types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        };
        let number = |k: &str| node.get(k).and_then(Value::as_f64);
        let bound = |inclusive: &str, exclusive: &str| match (number(inclusive), number(exclusive))
        {
            (_, Some(value)) => Some(Bound {
                value,
                inclusive: false,
            }),
            (Some(value), None) => Some(Bound {
                value,
                inclusive: true,
            }),
            (None, None) => None,
        };
        let mut choices: Vec<String> = node
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        if let Some(Value::Array(variants)) = node.get("oneOf") {
            choices.extend(
                variants
                    .iter()
                    .filter_map(|v| v.get("const").and_then(Value::as_str).map(str::to_string)),
            );
        }
        let len = match (number("minItems"), number("maxItems")) {
            (Some(a), Some(b)) if a == b => Some(a as usize),
            _ => None,
        };
        Allowed {
            ty: if ty.is_empty() && !choices.is_empty() {
                "string".into()
            } else {
                ty
            },
            min: bound("minimum", "exclusiveMinimum"),
            max: bound("maximum", "exclusiveMaximum"),
            choices,
            len,
            items: node
                .get("items")
                .filter(|i| i.is_object())
                .map(|i| Box::new(self.allowed(&self.resolve(i)))),
        }
    }
}

/// A JSON default written as TOML (`None` for `null`: no default).
fn toml_literal(v: &Value) -> Option<String> {
    if v.is_null() {
        return None;
    }
    toml::Value::try_from(v).ok().map(|t| t.to_string())
}

/// The first sentence of a doc comment's first paragraph, on one line.
fn first_sentence(doc: &str) -> String {
    // Rustdoc links read as plain code here.
    let paragraph = doc
        .split("\n\n")
        .next()
        .unwrap_or(doc)
        .replace('\n', " ")
        .replace("[`", "`")
        .replace("`]", "`");
    let bytes = paragraph.as_bytes();
    for (i, _) in paragraph.match_indices(". ") {
        let next = bytes.get(i + 2).copied().unwrap_or(b' ');
        let abbreviation = ["e.g", "i.e", "etc", "vs"]
            .iter()
            .any(|a| paragraph[..i].ends_with(a));
        if (next.is_ascii_uppercase() || next == b'`') && !abbreviation {
            return paragraph[..=i].to_string();
        }
    }
    paragraph.trim().to_string()
}
