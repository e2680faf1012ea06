//! The policy's tokenizer: a Hugging Face model directory's `tokenizer.json`, its
//! `tokenizer_config.json` (special tokens, chat template) and `generation_config.json`
//! (end-of-turn ids).
//!
//! Rollouts are token-in/token-out: the prompt is rendered and encoded once, then generated ids
//! and encoded tool results are appended without re-tokenising (Agent-R1's NaN losses came from
//! decode/re-encode drift). So what matters here is that the first encoding equals transformers'
//! `apply_chat_template(..., tokenize=True)` exactly, and that generation knows every id that
//! ends a turn.

mod config;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_r1_envs::tool_call::ToolCallFormat;
use serde::Serialize;

use crate::chat_template::{ChatTemplate, TemplateKwargs, TemplateVars, RESERVED_TEMPLATE_VARS};
use crate::error::{Error, Result};
use config::{DirFiles, TemplateSource, TokenizerConfig};

/// End-of-turn tokens of the ChatML family, recognised when present even if the config does
/// not list them, so a model that ends a turn either way stops.
const CHATML_END_TOKENS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// A tokenizer loaded from a Hugging Face model directory.
#[derive(Debug)]
pub struct HfTokenizer {
    dir: PathBuf,
    tokenizer: tokenizers::Tokenizer,
    config: TokenizerConfig,
    templates: BTreeMap<String, ChatTemplate>,
    template_kwargs: TemplateKwargs,
    eos_token_ids: Vec<u32>,
}

/// The template name transformers uses when `chat_template` is a single string.
const DEFAULT_TEMPLATE: &str = "default";
/// The named template transformers prefers when tools are passed.
const TOOL_USE_TEMPLATE: &str = "tool_use";

impl HfTokenizer {
    /// Loads `dir/tokenizer.json` and `dir/tokenizer_config.json` (both required), plus
    /// `dir/chat_template.jinja` (which, as in transformers, overrides the config's template) and
    /// `dir/generation_config.json` when present.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let files = DirFiles::new(&dir);

        if !files.tokenizer_json.is_file() {
            return Err(Error::model(&files.tokenizer_json, "file not found"));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&files.tokenizer_json)
            .map_err(|e| Error::model(&files.tokenizer_json, format!("cannot load: {e}")))?;

        let config_text = read_required(&files.tokenizer_config)?;
        let mut config = TokenizerConfig::parse(&files.tokenizer_config, &config_text)?;
        if files.chat_template_jinja.is_file() {
            let text = std::fs::read_to_string(&files.chat_template_jinja)
                .map_err(|e| Error::io(&files.chat_template_jinja, e))?;
            config.chat_template = Some(TemplateSource::Single(text));
        }

        check_added_tokens(&files.tokenizer_config, &tokenizer, &config)?;
        let templates = compile_templates(&files, &config)?;

        let generation_eos = if files.generation_config.is_file() {
            let text = std::fs::read_to_string(&files.generation_config)
                .map_err(|e| Error::io(&files.generation_config, e))?;
            config::generation_eos_ids(&files.generation_config, &text)?
        } else {
            Vec::new()
        };
        let eos_token_ids = end_of_turn_ids(&files, &tokenizer, &config, &generation_eos)?;

        Ok(Self {
            dir,
            tokenizer,
            config,
            templates,
            template_kwargs: TemplateKwargs::new(),
            eos_token_ids,
        })
    }

    /// Passes `kwargs` to the chat template on every render, as transformers'
    /// `apply_chat_template(..., **kwargs)` does (`{"enable_thinking": false}` for Qwen3).
    /// A name the renderer sets itself (`messages`, `tools`, ...) is refused.
    pub fn with_template_kwargs(mut self, kwargs: TemplateKwargs) -> Result<Self> {
        if let Some(bad) = kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
        {
            return Err(Error::invalid(
                "chat_template_kwargs",
                format!(
                    "`{bad}` is set by the renderer and cannot be passed (reserved: {})",
                    RESERVED_TEMPLATE_VARS.join(", ")
                ),
            ));
        }
        self.template_kwargs = kwargs;
        Ok(self)
    }

    /// The directory this was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The underlying `tokenizers` tokenizer, for batch encoding or offsets.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// Encodes `text`; `add_special_tokens` runs the post-processor (BOS/EOS insertion) as
    /// transformers' `encode(..., add_special_tokens=...)` does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes `ids`; `skip_special_tokens` drops tokens marked special (`<|im_end|>`), not the
    /// added tool tags, which Qwen2.5 marks non-special so that they survive decoding.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    /// The id of a token (including added tokens), if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The text of a token id, if the id is in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The number of ids the tokenizer can produce, added tokens included (transformers'
    /// `len(tokenizer)`); the model's embedding must have at least this many rows.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Every id that ends a turn: the configured `eos_token`, `generation_config.json`'s
    /// `eos_token_id`(s), and `<|im_end|>` / `<|endoftext|>` when the vocabulary has them.
    /// Never empty: loading fails when no end-of-turn token can be found.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The id of a named special token (`"eos_token"`, `"pad_token"`, ...) when it is set and in
    /// the vocabulary.
    pub fn special_token_id(&self, name: &str) -> Option<u32> {
        self.special_token(name)
            .and_then(|token| self.tokenizer.token_to_id(token))
    }

    /// The text of a named special token (`"eos_token"`, `"bos_token"`, ...) when it is set.
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.config.special_tokens.get(name).map(String::as_str)
    }

    /// The padding id: `pad_token`, else the first end-of-turn id (as trainers usually fall back).
    pub fn pad_token_id(&self) -> u32 {
        self.special_token_id("pad_token")
            .unwrap_or(self.eos_token_ids[0])
    }

    /// The id `text` encodes to when it is exactly one token, `None` otherwise; stop sequences
    /// that are single tokens can be matched on ids instead of decoded text.
    pub fn single_token_id(&self, text: &str) -> Option<u32> {
        // Encoding, not a vocabulary lookup: byte-level vocab entries are byte-mapped strings
        // that can spell a different text than the one they decode to.
        match self.encode(text, false).ok()?.as_slice() {
            [id] => Some(*id),
            _ => None,
        }
    }

    /// `model_max_length` from the config, when it is a real limit.
    pub fn model_max_length(&self) -> Option<usize> {
        self.config.model_max_length
    }

    /// The tool-call format the chat template teaches (its `tool_use` template when it has
    /// several), if it teaches one.
    pub fn tool_call_format(&self) -> Option<ToolCallFormat> {
        self.templates
            .get(TOOL_USE_TEMPLATE)
            .or_else(|| self.templates.get(DEFAULT_TEMPLATE))
            .and_then(|t| ToolCallFormat::detect(t.source()))
    }

    /// Whether the directory has a chat template.
    pub fn has_chat_template(&self) -> bool {
        !self.templates.is_empty()
    }

    /// Renders `messages` (and `tools`, OpenAI function specs) with the chat template, as
    /// transformers' `apply_chat_template(..., tokenize=False)`: the special tokens of the config
    /// are template variables, and with several named templates `tool_use` is chosen when tools
    /// are given and `default` otherwise.
    pub fn apply_chat_template<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.select_template(tools.is_some())?;
        let vars: TemplateVars = self.config.special_tokens.clone();
        template.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            &vars,
            &self.template_kwargs,
        )
    }

    /// Renders and encodes the conversation without adding special tokens a second time (the
    /// template already wrote them), exactly as `apply_chat_template(..., tokenize=True)`.
    pub fn encode_chat<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, tools, add_generation_prompt)?;
        self.encode(&text, false)
    }

    fn select_template(&self, with_tools: bool) -> Result<&ChatTemplate> {
        let path = DirFiles::new(&self.dir).tokenizer_config;
        if self.templates.is_empty() {
            return Err(Error::model(path, "chat_template: not set"));
        }
        if with_tools {
            if let Some(t) = self.templates.get(TOOL_USE_TEMPLATE) {
                return Ok(t);
            }
        }
        self.templates.get(DEFAULT_TEMPLATE).ok_or_else(|| {
            Error::model(
                path,
                format!(
                    "chat_template: no \"{DEFAULT_TEMPLATE}\" template among {:?}",
                    self.templates.keys().collect::<Vec<_>>()
                ),
            )
        })
    }
}

fn read_required(path: &Path) -> Result<String> {
    if !path.is_file() {
        return Err(Error::model(path, "file not found"));
    }
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// transformers adds any token of `added_tokens_decoder` that `tokenizer.json` lacks, which would
/// silently shift ids between the two runtimes; a disagreement is a broken directory.
fn check_added_tokens(
    config_path: &Path,
    tokenizer: &tokenizers::Tokenizer,
    config: &TokenizerConfig,
) -> Result<()> {
    for (id, entry) in &config.added_tokens {
        match tokenizer.token_to_id(&entry.content) {
            Some(actual) if actual == *id => {}
            Some(actual) => {
                return Err(Error::model(
                    config_path,
                    format!(
                        "added_tokens_decoder.{id}: {:?} has id {actual} in tokenizer.json",
                        entry.content
                    ),
                ))
            }
            None => {
                return Err(Error::model(
                    config_path,
                    format!(
                        "added_tokens_decoder.{id}: {:?} is not in tokenizer.json",
                        entry.content
                    ),
                ))
            }
        }
    }
    Ok(())
}

fn compile_templates(
    files: &DirFiles,
    config: &TokenizerConfig,
) -> Result<BTreeMap<String, ChatTemplate>> {
    let sources: Vec<(String, String)> = match &config.chat_template {
        None => Vec::new(),
        Some(TemplateSource::Single(s)) => vec![(DEFAULT_TEMPLATE.to_string(), s.clone())],
        Some(TemplateSource::Named(named)) => {
            named.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        }
    };
    let mut out = BTreeMap::new();
    for (name, source) in sources {
        let template = ChatTemplate::new(source).map_err(|e| {
            let field = if files.chat_template_jinja.is_file() {
                (files.chat_template_jinja.clone(), "template".to_string())
            } else {
                (
                    files.tokenizer_config.clone(),
                    format!("chat_template ({name})"),
                )
            };
            Error::model(field.0, format!("{}: {e}", field.1))
        })?;
        out.insert(name, template);
    }
    Ok(out)
}

fn end_of_turn_ids(
    files: &DirFiles,
    tokenizer: &tokenizers::Tokenizer,
    config: &TokenizerConfig,
    generation_eos: &[u32],
) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    if let Some(eos) = config.special_tokens.get("eos_token") {
        let id = tokenizer.token_to_id(eos).ok_or_else(|| {
            Error::model(
                &files.tokenizer_config,
                format!("eos_token: {eos:?} is not in tokenizer.json"),
            )
        })?;
        ids.push(id);
    }
    let vocab = tokenizer.get_vocab_size(true);
    for &id in generation_eos {
        if usize::try_from(id).map_or(true, |id| id >= vocab) {
            return Err(Error::model(
                &files.generation_config,
                format!("eos_token_id: {id} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        ids.push(id);
    }
    ids.extend(
        CHATML_END_TOKENS
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t)),
    );
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    if ids.is_empty() {
        return Err(Error::model(
            &files.tokenizer_config,
            "eos_token: not set, and no generation_config.json eos_token_id or ChatML end token",
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny_tokenizer::{train_tiny_tokenizer, BUILTIN_CORPUS};
    use agent_r1_envs::message::Message;
    use agent_r1_envs::tool_call::CALL_CLOSE;

    fn tiny_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let trained = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 400, &[]).unwrap();
        trained.write_to(dir.path()).unwrap();
        dir
    }

    fn model_error(err: Error) -> (PathBuf, String) {
        match err {
            Error::Model { path, message } => (path, message),
            other => panic!("expected Error::Model, got {other:?}"),
        }
    }

    #[test]
    fn is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HfTokenizer>();
    }

    #[test]
    fn single_token_ids_only_for_single_tokens() {
        let dir = tiny_dir();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.single_token_id("<think>"), tok.token_to_id("<think>"));
        assert_eq!(tok.single_token_id("<think> and more words"), None);
        assert_eq!(tok.single_token_id(""), None);
    }

    #[test]
    fn loads_a_tiny_dir_and_round_trips_text() {
        let dir = tiny_dir();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let text = "Search for the capital of France.<tool_call>";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        assert_eq!(
            *ids.last().unwrap(),
            tok.token_to_id("<tool_call>").unwrap()
        );
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        let eot = tok.token_to_id("<|endoftext|>").unwrap();
        assert_eq!(tok.eos_token_ids(), &[im_end, eot]);
        assert_eq!(tok.pad_token_id(), eot);
        assert_eq!(
            tok.single_token_id(CALL_CLOSE),
            Some(tok.token_to_id(CALL_CLOSE).unwrap())
        );
        assert_eq!(tok.id_to_token(im_end).as_deref(), Some("<|im_end|>"));
        // Special tokens are dropped on request; the tool tags are not special.
        let ids = tok
            .encode("<|im_start|>a<tool_call><|im_end|>", false)
            .unwrap();
        assert_eq!(tok.decode(&ids, true).unwrap(), "a<tool_call>");
    }

    #[test]
    fn encode_chat_is_encode_of_the_rendered_text() {
        let dir = tiny_dir();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let messages = [Message::user("What is 2+2?")];
        let text = tok.apply_chat_template(&messages, None, true).unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        let ids = tok.encode_chat(&messages, None, true).unwrap();
        assert_eq!(ids, tok.encode(&text, false).unwrap());
        assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    }

    #[test]
    fn generation_config_eos_ids_are_added() {
        let dir = tiny_dir();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [3, 5]}"#,
        )
        .unwrap();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        let eot = tok.token_to_id("<|endoftext|>").unwrap();
        assert_eq!(tok.eos_token_ids(), &[im_end, 3, 5, eot]);

        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": 99999}"#,
        )
        .unwrap();
        let (path, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(path.ends_with("generation_config.json"));
        assert!(message.contains("eos_token_id"), "{message}");
    }

    #[test]
    fn named_templates_pick_tool_use_when_tools_are_given() {
        let dir = tiny_dir();
        let path = dir.path().join("tokenizer_config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["chat_template"] = serde_json::json!([
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools:{{ tools | length }}"}
        ]);
        std::fs::write(&path, cfg.to_string()).unwrap();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let m = [Message::user("x")];
        assert_eq!(tok.apply_chat_template(&m, None, false).unwrap(), "plain");
        let tools = [serde_json::json!({"type": "function"})];
        assert_eq!(
            tok.apply_chat_template(&m, Some(&tools), false).unwrap(),
            "tools:1"
        );
    }

    #[test]
    fn chat_template_jinja_overrides_the_config() {
        let dir = tiny_dir();
        std::fs::write(dir.path().join("chat_template.jinja"), "{{ eos_token }}\n").unwrap();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let m = [Message::user("x")];
        assert_eq!(
            tok.apply_chat_template(&m, None, false).unwrap(),
            "<|im_end|>"
        );
    }

    #[test]
    fn missing_and_malformed_files_name_file_and_field() {
        let empty = tempfile::tempdir().unwrap();
        let (path, message) = model_error(HfTokenizer::from_dir(empty.path()).unwrap_err());
        assert!(path.ends_with("tokenizer.json") && message.contains("not found"));

        let dir = tiny_dir();
        let cfg_path = dir.path().join("tokenizer_config.json");
        let original = std::fs::read_to_string(&cfg_path).unwrap();

        std::fs::write(&cfg_path, "{\"eos_token\": ").unwrap();
        let (path, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(path.ends_with("tokenizer_config.json") && message.contains("JSON"));

        let mut cfg: serde_json::Value = serde_json::from_str(&original).unwrap();
        cfg["eos_token"] = serde_json::json!("<|no_such_token|>");
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let (_, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(message.contains("eos_token"), "{message}");

        let mut cfg: serde_json::Value = serde_json::from_str(&original).unwrap();
        cfg["chat_template"] = serde_json::json!("{% for %}");
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let (_, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(message.contains("chat_template"), "{message}");

        let mut cfg: serde_json::Value = serde_json::from_str(&original).unwrap();
        cfg["added_tokens_decoder"]["0"] = serde_json::json!({"content": "<tool_call>"});
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let (_, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(message.contains("added_tokens_decoder.0"), "{message}");

        std::fs::remove_file(&cfg_path).unwrap();
        let (path, message) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(path.ends_with("tokenizer_config.json") && message.contains("not found"));

        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        let (path, _) = model_error(HfTokenizer::from_dir(dir.path()).unwrap_err());
        assert!(path.ends_with("tokenizer.json"));
    }

    #[test]
    fn no_template_is_an_error_at_render_time() {
        let dir = tiny_dir();
        let path = dir.path().join("tokenizer_config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg.as_object_mut().unwrap().remove("chat_template");
        std::fs::write(&path, cfg.to_string()).unwrap();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        assert!(!tok.has_chat_template());
        let (_, message) = model_error(
            tok.apply_chat_template(&[Message::user("x")], None, false)
                .unwrap_err(),
        );
        assert!(message.contains("chat_template"), "{message}");
    }
}
