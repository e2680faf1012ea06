//! A user's own tool is one file plus one registration line: this test is that file
//! (the `WordCount` type, as in `docs/tools.md`) and that line, then calls it through the
//! registry, a TOML config, validation and the call guard.

use std::collections::HashMap;
use std::sync::Arc;

use agent_r1_envs::call_guard::execute_call;
use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::tool::{CallError, Tool, ToolOutput};
use agent_r1_envs::tool_call::parse_tool_calls;
use agent_r1_envs::tools::{ToolRegistry, ToolsConfig};
use async_trait::async_trait;
use serde_json::{json, Value};

// ---- the user's file -------------------------------------------------------------------

/// Counts words; `min_len` (from `[tools.word_count]`) ignores shorter words.
struct WordCount {
    min_len: usize,
}

/// `[tools.word_count]`: what the table may hold (any other key is an error).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WordCountOptions {
    #[serde(default = "one")]
    min_len: usize,
}

fn one() -> usize {
    1
}

impl KindOptions for WordCountOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        if self.min_len == 0 {
            return Err(agent_r1_envs::Error::Config {
                key: "tools.word_count.min_len".into(),
                message: "must be at least 1, got 0".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Tool for WordCount {
    fn name(&self) -> &str {
        "word_count"
    }
    fn description(&self) -> &str {
        "Count the words of a text."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        let text = args["text"].as_str().unwrap_or_default();
        let n = text
            .split_whitespace()
            .filter(|w| w.chars().count() >= self.min_len)
            .count();
        Ok(ToolOutput::text(n.to_string()))
    }
}

// ---- end of the user's file ------------------------------------------------------------

#[tokio::test]
async fn one_file_plus_one_registration_line() {
    let mut registry = ToolRegistry::with_builtins();
    // The one line:
    registry.register("word_count", |o: WordCountOptions| {
        Ok(Arc::new(WordCount { min_len: o.min_len }))
    });

    // Options are checked as `check-config` does, before anything is built.
    let misspelt = ToolsConfig::from_toml_str("[tools.word_count]\nmin_lenght = 3\n").unwrap();
    let e = misspelt.check_all(&registry).unwrap_err().to_string();
    assert!(e.contains("tools.word_count.min_lenght"), "{e}");
    let renamed =
        ToolsConfig::from_toml_str("[tools.wc]\ntype = \"word_count\"\nmin_len = 0\n").unwrap();
    let e = renamed.check_all(&registry).unwrap_err().to_string();
    assert!(
        e.contains("tools.wc.min_len") && e.contains("at least 1"),
        "{e}"
    );

    let config =
        ToolsConfig::from_toml_str("[tools.word_count]\nmin_len = 3\n[tools.calculator]\n")
            .unwrap();
    let tools = config.build_all(&registry).unwrap();
    let tools: HashMap<String, Arc<dyn Tool>> = tools
        .into_iter()
        .map(|t| (t.name().to_string(), t))
        .collect();
    let mut names: Vec<&String> = tools.keys().collect();
    names.sort();
    assert_eq!(names, ["calculator", "word_count"]);
    assert_eq!(tools["word_count"].spec()["function"]["name"], "word_count");

    let turn = r#"<think>count</think>
<tool_call>{"name": "word_count", "arguments": {"text": "a bb ccc dddd"}}</tool_call>
<tool_call>{"name": "word_count", "arguments": {"txt": "x"}}</tool_call>
<tool_call>{"name": "calculator", "arguments": {"expression": "0.1 + 0.2"}}</tool_call>
<tool_call>{"name": "translate", "arguments": {}}</tool_call>"#;
    let mut out = Vec::new();
    for call in parse_tool_calls(turn) {
        out.push(execute_call(&tools, call).await);
    }
    assert_eq!(
        out[0].observation(100),
        "2",
        "min_len = 3 from the TOML table"
    );
    assert!(matches!(out[1].result, Err(CallError::InvalidArguments(_))));
    assert!(out[1]
        .observation(200)
        .contains("\"text\" is a required property"));
    assert_eq!(out[2].observation(100), "0.3");
    assert_eq!(
        out[3].observation(100),
        "Error: ToolNotFoundError: no tool named `translate`"
    );
}
