//! Reading `tokenizer_config.json` and `generation_config.json` the way transformers does.
//!
//! The fields come in several shapes across model families (a special token as a string or as a
//! serialized `AddedToken` object, a chat template as one string or a list of named ones, an
//! `eos_token_id` as one id or a list). Each is checked here so that a malformed file fails at
//! load time with the file and the field named, instead of rendering a wrong prompt later.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The named special-token attributes transformers passes to chat templates
/// (`SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES`).
pub(crate) const SPECIAL_TOKEN_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// One entry of `added_tokens_decoder`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedTokenEntry {
    /// The token's text.
    pub(crate) content: String,
    /// Whether decoding with `skip_special_tokens` drops it.
    pub(crate) special: bool,
}

/// The chat template field: one template, or several by name (`default`, `tool_use`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplateSource {
    /// `"chat_template": "..."`, or a `chat_template.jinja` file.
    Single(String),
    /// `"chat_template": [{"name": ..., "template": ...}, ...]`.
    Named(BTreeMap<String, String>),
}

/// What the runtime needs from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TokenizerConfig {
    /// Named special tokens that are set, by attribute name (`eos_token` -> `<|im_end|>`).
    pub(crate) special_tokens: BTreeMap<String, String>,
    /// `added_tokens_decoder`, by id.
    pub(crate) added_tokens: BTreeMap<u32, AddedTokenEntry>,
    /// The chat template(s), if any.
    pub(crate) chat_template: Option<TemplateSource>,
    /// `model_max_length`, when it is a real limit (transformers writes 1e30 for "none").
    pub(crate) model_max_length: Option<usize>,
}

impl TokenizerConfig {
    /// Parses the text of `path`.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
        let Value::Object(root) = root else {
            return Err(Error::model(
                path,
                "expected a JSON object at the top level",
            ));
        };
        let mut config = TokenizerConfig::default();
        for name in SPECIAL_TOKEN_ATTRIBUTES {
            if let Some(token) = token_content(path, name, root.get(name))? {
                config.special_tokens.insert(name.to_string(), token);
            }
        }
        // transformers 5 lets a config name further special tokens, which templates then see.
        if let Some(Value::Object(extra)) = root.get("extra_special_tokens") {
            for (name, value) in extra {
                let field = format!("extra_special_tokens.{name}");
                if let Some(token) = token_content(path, &field, Some(value))? {
                    config.special_tokens.insert(name.clone(), token);
                }
            }
        }
        config.added_tokens = added_tokens(path, root.get("added_tokens_decoder"))?;
        config.chat_template = template_source(path, root.get("chat_template"))?;
        config.model_max_length = match root.get("model_max_length") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
            Some(other) => {
                return Err(Error::model(
                    path,
                    format!("model_max_length: expected a number, got {other}"),
                ))
            }
        };
        Ok(config)
    }
}

/// A special token field: a string, an `AddedToken` object `{"content": ...}`, or null.
fn token_content(path: &Path, field: &str, value: Option<&Value>) -> Result<Option<String>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(Error::model(
                path,
                format!("{field}: the token object has no string \"content\""),
            )),
        },
        Some(other) => Err(Error::model(
            path,
            format!("{field}: expected a string or an object with \"content\", got {other}"),
        )),
    }
}

fn added_tokens(path: &Path, value: Option<&Value>) -> Result<BTreeMap<u32, AddedTokenEntry>> {
    let mut out = BTreeMap::new();
    let obj = match value {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(obj)) => obj,
        Some(other) => {
            return Err(Error::model(
                path,
                format!("added_tokens_decoder: expected an object keyed by token id, got {other}"),
            ))
        }
    };
    for (key, entry) in obj {
        let field = format!("added_tokens_decoder.{key}");
        let id: u32 = key
            .parse()
            .map_err(|_| Error::model(path, format!("{field}: the key is not a token id")))?;
        let content = token_content(path, &field, Some(entry))?
            .ok_or_else(|| Error::model(path, format!("{field}: null token")))?;
        let special = match entry.get("special") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(Error::model(
                    path,
                    format!("{field}.special: expected true or false, got {other}"),
                ))
            }
        };
        out.insert(id, AddedTokenEntry { content, special });
    }
    Ok(out)
}

fn template_source(path: &Path, value: Option<&Value>) -> Result<Option<TemplateSource>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(TemplateSource::Single(s.clone()))),
        Some(Value::Array(items)) => {
            let mut named = BTreeMap::new();
            for (i, item) in items.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(name), Some(template)) => {
                        named.insert(name.to_string(), template.to_string());
                    }
                    _ => {
                        return Err(Error::model(
                            path,
                            format!(
                                "chat_template[{i}]: expected {{\"name\": string, \"template\": string}}"
                            ),
                        ))
                    }
                }
            }
            Ok(Some(TemplateSource::Named(named)))
        }
        Some(other) => Err(Error::model(
            path,
            format!("chat_template: expected a string or a list of named templates, got {other}"),
        )),
    }
}

/// `eos_token_id` from `generation_config.json`: generation stops on any of these.
pub(crate) fn generation_eos_ids(path: &Path, text: &str) -> Result<Vec<u32>> {
    let root: Value = serde_json::from_str(text)
        .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
    let id = |v: &Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| Error::model(path, format!("eos_token_id: {v} is not a token id")))
    };
    match root.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(id).collect(),
        Some(v) => Ok(vec![id(v)?]),
    }
}

/// The file names a model directory holds, so errors can name them.
#[derive(Debug, Clone)]
pub(crate) struct DirFiles {
    pub(crate) tokenizer_json: PathBuf,
    pub(crate) tokenizer_config: PathBuf,
    pub(crate) chat_template_jinja: PathBuf,
    pub(crate) generation_config: PathBuf,
}

impl DirFiles {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            tokenizer_json: dir.join("tokenizer.json"),
            tokenizer_config: dir.join("tokenizer_config.json"),
            chat_template_jinja: dir.join("chat_template.jinja"),
            generation_config: dir.join("generation_config.json"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TokenizerConfig> {
        TokenizerConfig::parse(Path::new("tokenizer_config.json"), text)
    }

    fn message(err: Error) -> String {
        match err {
            Error::Model { path, message } => {
                assert_eq!(path, Path::new("tokenizer_config.json"));
                message
            }
            other => panic!("expected Error::Model, got {other:?}"),
        }
    }

    #[test]
    fn tokens_as_strings_objects_or_null() {
        let c = parse(
            r#"{"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true},
                "pad_token": "<|endoftext|>", "model_max_length": 131072,
                "chat_template": "{{ x }}"}"#,
        )
        .unwrap();
        assert_eq!(c.special_tokens.get("bos_token"), None);
        assert_eq!(c.special_tokens["eos_token"], "<|im_end|>");
        assert_eq!(c.special_tokens["pad_token"], "<|endoftext|>");
        assert_eq!(c.model_max_length, Some(131072));
        assert_eq!(
            c.chat_template,
            Some(TemplateSource::Single("{{ x }}".into()))
        );
    }

    #[test]
    fn huge_model_max_length_means_no_limit() {
        let c = parse(r#"{"model_max_length": 1000000000000000019884624838656}"#).unwrap();
        assert_eq!(c.model_max_length, None);
    }

    #[test]
    fn named_templates_and_added_tokens() {
        let c = parse(
            r#"{"chat_template": [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}],
                "added_tokens_decoder": {"7": {"content": "<x>", "special": false}, "8": {"content": "<y>", "special": true}}}"#,
        )
        .unwrap();
        let Some(TemplateSource::Named(named)) = c.chat_template else {
            panic!("expected named templates");
        };
        assert_eq!(named["tool_use"], "b");
        assert_eq!(
            c.added_tokens[&7],
            AddedTokenEntry {
                content: "<x>".into(),
                special: false
            }
        );
        assert!(c.added_tokens[&8].special);
    }

    #[test]
    fn malformed_fields_name_the_field() {
        assert!(message(parse("{not json").unwrap_err()).contains("not valid JSON"));
        assert!(message(parse("[1]").unwrap_err()).contains("top level"));
        assert!(message(parse(r#"{"eos_token": 3}"#).unwrap_err()).contains("eos_token"));
        assert!(message(parse(r#"{"pad_token": {"id": 3}}"#).unwrap_err()).contains("pad_token"));
        assert!(message(parse(r#"{"chat_template": 5}"#).unwrap_err()).contains("chat_template"));
        assert!(
            message(parse(r#"{"chat_template": [{"name": "x"}]}"#).unwrap_err())
                .contains("chat_template[0]")
        );
        assert!(message(
            parse(r#"{"added_tokens_decoder": {"x": {"content": "a"}}}"#).unwrap_err()
        )
        .contains("added_tokens_decoder.x"));
        assert!(
            message(parse(r#"{"model_max_length": "big"}"#).unwrap_err())
                .contains("model_max_length")
        );
    }

    #[test]
    fn generation_eos_is_one_id_or_a_list() {
        let p = Path::new("generation_config.json");
        assert_eq!(
            generation_eos_ids(p, r#"{"eos_token_id": 5}"#).unwrap(),
            vec![5]
        );
        assert_eq!(
            generation_eos_ids(p, r#"{"eos_token_id": [5, 6]}"#).unwrap(),
            vec![5, 6]
        );
        assert_eq!(generation_eos_ids(p, r#"{}"#).unwrap(), Vec::<u32>::new());
        assert!(generation_eos_ids(p, r#"{"eos_token_id": "x"}"#).is_err());
        assert!(generation_eos_ids(p, r#"{"eos_token_id": [-1]}"#).is_err());
    }
}
