//! Renders a Hugging Face Jinja chat template byte-for-byte as transformers does.
//!
//! The model was trained on the exact text transformers produces, so any drift (a separator in a
//! tool schema, a stripped newline) changes token ids and with them the policy's behaviour.
//! transformers renders with a Jinja2 `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` with loop controls, its own `tojson`, `raise_exception` and
//! `strftime_now`; this module sets minijinja up the same way, with Python string and dict methods
//! from `minijinja_contrib::pycompat`.

mod tojson;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};
use serde::Serialize;

use crate::error::{Error, Result};

/// The chat template that Qwen2.5-Instruct ships in its `tokenizer_config.json`, with the
/// `tools` / `<tool_call>` / `<tool_response>` sections that Agent-R1's hermes tool format uses.
pub const QWEN2_5_CHAT_TEMPLATE: &str = include_str!("chat_template/qwen2_5.jinja");

/// The chat template of Qwen3 (dense) as released in April 2025: Qwen2.5's tool sections plus
/// `<think>` handling (reasoning kept only after the last user query, `enable_thinking`).
pub const QWEN3_CHAT_TEMPLATE: &str = include_str!("chat_template/qwen3.jinja");

/// The chat template of Llama 3.1-8B-Instruct: JSON tool calls, the `ipython` role, tools in
/// the first user message by default.
pub const LLAMA3_1_CHAT_TEMPLATE: &str = include_str!("chat_template/llama3_1.jinja");

/// The chat template of Mistral-7B-Instruct v0.3: `[AVAILABLE_TOOLS]`, `[TOOL_CALLS]` and
/// `[TOOL_RESULTS]` around the last user message.
pub const MISTRAL_V0_3_CHAT_TEMPLATE: &str = include_str!("chat_template/mistral_v0_3.jinja");

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template.
///
/// Compiled once when a tokenizer is loaded so that syntax errors surface at load time, not in
/// the middle of a rollout.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// What a template sees besides the messages and tools.
///
/// transformers passes the tokenizer's named special tokens (`bos_token`, `eos_token`, ...) that
/// are set, and leaves the unset ones undefined (so `{{ bos_token }}` prints nothing rather than
/// `None`).
pub type TemplateVars = BTreeMap<String, String>;

/// Extra variables a template reads (`enable_thinking` for Qwen3), by name.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// Variables the renderer sets itself; a template kwarg may not replace them.
pub const RESERVED_TEMPLATE_VARS: [&str; 4] =
    ["messages", "tools", "documents", "add_generation_prompt"];

impl ChatTemplate {
    /// Compiles `source`; a syntax error is an [`Error::Template`] naming the line.
    pub fn new(source: impl Into<String>) -> Result<Self> {
        let mut env = Environment::new();
        // transformers: trim_blocks=True, lstrip_blocks=True, keep_trailing_newline left False.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        // Jinja2's default Undefined: missing attributes are falsy and print as "".
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        // Chat templates produce prompts, not HTML; transformers does not autoescape.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson::tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let source = source.into();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(template_error)?;
        Ok(Self { env, source })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation.
    ///
    /// `messages` are serialized to JSON objects first (so [`agent_r1_envs::message::Message`]
    /// and raw `serde_json::Value` messages with `tool_calls` work alike), and keys whose value
    /// is `null` are dropped, as transformers does before rendering. `tools` are OpenAI function
    /// specs; `None` leaves the template's `tools` as none, which Qwen-style templates test for.
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        vars: &TemplateVars,
    ) -> Result<String> {
        self.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            vars,
            &TemplateKwargs::new(),
        )
    }

    /// [`ChatTemplate::render`] with extra template variables, as transformers passes
    /// `apply_chat_template`'s other keyword arguments (Qwen3's `enable_thinking`, say).
    pub fn render_with_kwargs<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        vars: &TemplateVars,
        kwargs: &TemplateKwargs,
    ) -> Result<String> {
        let messages = messages
            .iter()
            .map(message_value)
            .collect::<Result<Vec<_>>>()?;
        let mut ctx: BTreeMap<String, Value> = vars
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), Value::from(Serde(v)));
        }
        ctx.insert("messages".into(), Value::from(Serde(&messages)));
        ctx.insert(
            "tools".into(),
            tools.map_or(Value::from(()), |t| Value::from(Serde(t))),
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        template.render(Value::from(ctx)).map_err(template_error)
    }
}

/// One message as the template sees it: a JSON object without null-valued keys.
fn message_value<M: Serialize>(message: &M) -> Result<serde_json::Value> {
    let value = serde_json::to_value(message)
        .map_err(|e| Error::Template(format!("a message is not serializable: {e}")))?;
    match value {
        serde_json::Value::Object(map) => Ok(serde_json::Value::Object(
            map.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        )),
        other => Err(Error::Template(format!(
            "a message must serialize to a JSON object, got {other}"
        ))),
    }
}

/// `raise_exception(message)`: templates call it to reject conversations they cannot render
/// (for example a role they do not know); it becomes [`Error::Template`] with the message.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time formatted as Python's `datetime.now().strftime`.
fn strftime_now(format: String) -> std::result::Result<Value, minijinja::Error> {
    let now = chrono::Local::now();
    let mut out = String::new();
    write!(out, "{}", now.format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format string {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// Flattens a minijinja error and its causes into one message, with the template line.
fn template_error(err: minijinja::Error) -> Error {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    Error::Template(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_r1_envs::message::Message;

    fn no_vars() -> TemplateVars {
        TemplateVars::new()
    }

    #[test]
    fn qwen_template_without_tools() {
        let t = ChatTemplate::new(QWEN2_5_CHAT_TEMPLATE).unwrap();
        let out = t
            .render(&[Message::user("hi")], None, true, &no_vars())
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
             assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn qwen_template_with_tools_and_tool_results() {
        let t = ChatTemplate::new(QWEN2_5_CHAT_TEMPLATE).unwrap();
        let tools = [serde_json::json!({
            "type": "function",
            "function": {"name": "search", "description": "Search <wiki> & more",
                         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
        })];
        let messages = [
            Message::system("Be brief."),
            Message::user("Q?"),
            Message::assistant("<tool_call>\n{\"name\": \"search\"}\n</tool_call>"),
            Message::tool("r1"),
            Message::tool("r2"),
            Message::assistant("<answer>A</answer>"),
        ];
        let out = t
            .render(&messages, Some(&tools), false, &no_vars())
            .unwrap();
        let want = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions \
            to assist with the user query.\n\nYou are provided with function signatures within \
            <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \
            \"search\", \"description\": \"Search <wiki> & more\", \"parameters\": {\"type\": \
            \"object\", \"properties\": {\"query\": {\"type\": \"string\"}}}}}\n</tools>\n\nFor \
            each function call, return a json object with function name and arguments within \
            <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
            \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nQ?\
            <|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"search\"}\n</tool_call>\
            <|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\
            \nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n<answer>A</answer><|im_end|>\n";
        assert_eq!(out, want);
    }

    #[test]
    fn special_tokens_are_variables_and_unset_ones_print_nothing() {
        let t = ChatTemplate::new("{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|").unwrap();
        let mut vars = no_vars();
        vars.insert("eos_token".into(), "<|im_end|>".into());
        let out = t.render::<Message>(&[], None, false, &vars).unwrap();
        assert_eq!(out, "|<|im_end|>||");
    }

    #[test]
    fn raise_exception_is_a_template_error() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}\
             {% endif %}{% endfor %}",
        )
        .unwrap();
        let err = t
            .render(&[Message::tool("x")], None, false, &no_vars())
            .unwrap_err();
        match err {
            Error::Template(message) => assert!(message.contains("no tools here"), "{message}"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_surface_at_compile_time() {
        let err = ChatTemplate::new("{% if messages %}unclosed").unwrap_err();
        assert!(matches!(err, Error::Template(_)), "{err:?}");
    }

    #[test]
    fn python_methods_loop_controls_and_trim_blocks() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if m.content.startswith('skip') %}{% continue %}{% endif %}\n\
             {{ m.content.strip().upper() }}\n{% endfor %}\n",
        )
        .unwrap();
        let out = t
            .render(
                &[
                    Message::user(" a "),
                    Message::user("skip me"),
                    Message::user("b"),
                ],
                None,
                false,
                &no_vars(),
            )
            .unwrap();
        assert_eq!(out, "A\nB\n");
    }

    #[test]
    fn null_message_keys_are_dropped() {
        let t = ChatTemplate::new("{{ messages[0].tool_calls is defined }}").unwrap();
        let msg = serde_json::json!({"role": "assistant", "content": "x", "tool_calls": null});
        // Booleans print as Python's, as in Jinja2.
        assert_eq!(t.render(&[msg], None, false, &no_vars()).unwrap(), "False");
    }

    #[test]
    fn strftime_now_formats_and_rejects_bad_formats() {
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
        let year = t.render::<Message>(&[], None, false, &no_vars()).unwrap();
        assert_eq!(year.len(), 4);
        assert!(year.chars().all(|c| c.is_ascii_digit()), "{year}");
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}").unwrap();
        assert!(t.render::<Message>(&[], None, false, &no_vars()).is_err());
    }
}
