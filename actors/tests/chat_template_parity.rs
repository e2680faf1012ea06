//! The Rust chat template and tokenizer against transformers, byte for byte and id for id.
//!
//! Builds tokenizer directories with `train_tokenizer` (with the real Qwen2.5, Qwen3, Llama 3.1
//! and Mistral v0.3 templates and special tokens, and one with a template exercising more
//! Jinja features), renders the same conversations (with and without tools, Qwen3's
//! `<think>` handling and `enable_thinking` included) in Rust
//! and with `AutoTokenizer.apply_chat_template` from the project venv, and requires the text
//! and the token ids to be identical. Without the venv the test is skipped loudly, or fails when
//! `CI` is set, because then the parity claim would go unchecked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_r1_actors::tiny_tokenizer::{
    train_tiny_tokenizer, train_tokenizer, TokenizerStyle, BUILTIN_CORPUS,
};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::message::Message;
use agent_r1_envs::tool_call::ToolCallFormat;
use serde_json::{json, Value};

#[path = "support/venv.rs"]
mod venv;

fn tools() -> Vec<Value> {
    vec![
        json!({
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search Wikipedia (Zürich, 東京, 🦀) for <b>facts</b> & \"quotes\"; it's fast.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "What to look for.\nOne line."},
                        "top_k": {"type": "integer", "minimum": 1, "maximum": 10, "default": 5},
                        "threshold": {"type": "number", "default": 0.5, "maximum": 1e20, "minimum": 1e-7},
                        "exact": {"type": "boolean", "default": false},
                        "filters": {"type": "array", "items": {"type": "string"}, "default": []},
                        "extra": {"type": ["object", "null"], "properties": {}, "default": null}
                    },
                    "required": ["query"]
                }
            }
        }),
        json!({
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
            }
        }),
    ]
}

/// An Agent-R1 episode: tool calls live in the assistant text (hermes format), tool results
/// come back as two consecutive tool messages.
fn episode() -> Vec<Message> {
    vec![
        Message::system("You are a helpful assistant. Answer with <answer>...</answer>."),
        Message::user("Were Scott Derrickson and Ed Wood of the same nationality?"),
        Message::assistant(
            "<think>I need both nationalities.</think>\n<tool_call>\n{\"name\": \"search\", \
             \"arguments\": {\"query\": \"Scott Derrickson\"}}\n</tool_call>",
        ),
        Message::tool("Scott Derrickson is an American director."),
        Message::tool("Ed Wood was an American filmmaker.\n  (indented line)"),
        Message::assistant("<think>Both are American.</think>\n<answer>yes</answer>"),
    ]
}

/// Messages in the OpenAI shape (structured `tool_calls`), which templates print with `tojson`.
fn structured_episode() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "What is 17 * 23? Answer in <answer> tags."}),
        json!({"role": "assistant", "content": "<think>Use the calculator.</think>", "tool_calls": [
            {"type": "function", "function": {"name": "calculator",
             "arguments": {"expression": "17 * 23", "precision": 2.0, "verbose": true, "tags": ["a", "ü"]}}}
        ]}),
        json!({"role": "tool", "content": "391"}),
        json!({"role": "assistant", "content": "<think>So 391.</think>\n\n<answer>391</answer>", "tool_calls": null}),
    ]
}

/// Qwen3: reasoning in `reasoning_content` and in `<think>` blocks, before and after the last
/// real user query (tool responses do not count as queries).
fn qwen3_episode() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "Answer with <answer>...</answer>."}),
        json!({"role": "user", "content": "Capital of France?"}),
        json!({"role": "assistant", "reasoning_content": "\nEasy.\n", "content": "\n<answer>Paris</answer>"}),
        json!({"role": "user", "content": "And of Japan? Search first."}),
        json!({"role": "assistant", "content": "<think>\nI should search.\n</think>\n\n", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "capital of Japan"}}}
        ]}),
        json!({"role": "tool", "content": "Tokyo is the capital of Japan."}),
        json!({"role": "tool", "content": "Kyoto was the capital until 1868."}),
        json!({"role": "assistant", "content": "<think>Tokyo.</think><answer>Tokyo</answer>"}),
    ]
}

/// Mistral v0.3 needs 9-character tool-call ids on calls and results.
fn mistral_episode() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "What is 17 * 23?"}),
        json!({"role": "assistant", "tool_calls": [{"id": "abc123XYZ", "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": "17 * 23"}}}]}),
        json!({"role": "tool", "tool_call_id": "abc123XYZ", "content": "391"}),
        json!({"role": "assistant", "content": "391"}),
        json!({"role": "user", "content": "Thanks!"}),
    ]
}

struct Case {
    name: String,
    dir: PathBuf,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    kwargs: Value,
}

fn to_values<T: serde::Serialize>(messages: &[T]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

/// Every conversation in every directory, with and without tools and generation prompt.
fn cases(dirs: &BTreeMap<&str, PathBuf>) -> Vec<Case> {
    let ep = episode();
    let common: Vec<(&str, Vec<Value>)> = vec![
        ("episode", to_values(&ep)),
        ("prompt_only", to_values(&ep[..2])),
        ("no_system", to_values(&ep[1..5])),
        ("structured", structured_episode()),
    ];
    let mut out = Vec::new();
    for (dir_name, dir) in dirs {
        let mut conversations = match *dir_name {
            "mistral" => vec![
                ("prompt_only", to_values(&ep[..2])),
                ("tool_ids", mistral_episode()),
            ],
            _ => common.clone(),
        };
        if *dir_name == "qwen3" {
            conversations.push(("reasoning", qwen3_episode()));
        }
        for (conv_name, messages) in &conversations {
            for with_tools in [false, true] {
                for add_generation_prompt in [false, true] {
                    out.push(Case {
                        name: format!(
                            "{dir_name}/{conv_name}/tools={with_tools}/gen={add_generation_prompt}"
                        ),
                        dir: dir.to_path_buf(),
                        messages: messages.clone(),
                        tools: with_tools.then(tools),
                        add_generation_prompt,
                        kwargs: json!({}),
                    });
                }
            }
        }
    }
    // Qwen3 with thinking turned off: an empty think block after the generation prompt.
    for (conv_name, messages) in [
        ("prompt_only", to_values(&ep[..2])),
        ("reasoning", qwen3_episode()),
    ] {
        out.push(Case {
            name: format!("qwen3/{conv_name}/enable_thinking=false"),
            dir: dirs["qwen3"].clone(),
            messages,
            tools: Some(tools()),
            add_generation_prompt: true,
            kwargs: json!({"enable_thinking": false}),
        });
    }
    out
}

#[test]
fn chat_template_matches_transformers() {
    let Some(python) = venv::python_or_skip(&["transformers", "jinja2"]) else {
        return;
    };

    let work = tempfile::tempdir().unwrap();
    let trained = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 512, &[]).unwrap();
    let qwen_dir = work.path().join("qwen2_5");
    trained.write_to(&qwen_dir).unwrap();
    let mut dirs = BTreeMap::from([("qwen2_5", qwen_dir.clone())]);
    for (name, style) in [
        ("qwen3", TokenizerStyle::Qwen3),
        ("llama3_1", TokenizerStyle::Llama3_1),
        ("mistral", TokenizerStyle::Mistral),
    ] {
        let dir = work.path().join(name);
        train_tokenizer(style, BUILTIN_CORPUS.lines(), 512, &[], false)
            .unwrap()
            .write_to(&dir)
            .unwrap();
        dirs.insert(name, dir);
    }
    let features_dir = work.path().join("features");
    trained.write_to(&features_dir).unwrap();
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/parity_template.jinja"),
    )
    .unwrap();
    let mut config = trained.tokenizer_config().clone();
    config["chat_template"] = Value::from(template);
    std::fs::write(
        features_dir.join("tokenizer_config.json"),
        config.to_string(),
    )
    .unwrap();

    dirs.insert("features", features_dir.clone());
    let cases = cases(&dirs);
    let input = json!({"cases": cases.iter().map(|c| json!({
        "name": c.name,
        "tokenizer_dir": c.dir,
        "messages": c.messages,
        "tools": c.tools,
        "add_generation_prompt": c.add_generation_prompt,
        "kwargs": c.kwargs,
    })).collect::<Vec<_>>()});
    let cases_path = work.path().join("cases.json");
    let out_path = work.path().join("out.json");
    std::fs::write(&cases_path, input.to_string()).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/make_tokenizer_fixture.py");
    let run = Command::new(&python)
        .arg(&script)
        .arg("--cases")
        .arg(&cases_path)
        .arg("--out")
        .arg(&out_path)
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    let results = reference["results"].as_array().unwrap();
    assert_eq!(results.len(), cases.len());

    let loaded: BTreeMap<PathBuf, HfTokenizer> = dirs
        .values()
        .map(|d| (d.clone(), HfTokenizer::from_dir(d).unwrap()))
        .collect();
    let qwen = &loaded[&qwen_dir];
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(results) {
        assert_eq!(want["name"], case.name.as_str());
        let with_kwargs;
        let tok = match case.kwargs.as_object().filter(|k| !k.is_empty()) {
            Some(kwargs) => {
                with_kwargs = HfTokenizer::from_dir(&case.dir)
                    .unwrap()
                    .with_template_kwargs(kwargs.clone())
                    .unwrap();
                &with_kwargs
            }
            None => &loaded[&case.dir],
        };
        let tools = case.tools.as_deref();
        let text = tok
            .apply_chat_template(&case.messages, tools, case.add_generation_prompt)
            .unwrap();
        let ids = tok
            .encode_chat(&case.messages, tools, case.add_generation_prompt)
            .unwrap();
        let want_text = want["text"].as_str().unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(want["ids"].clone()).unwrap();
        if text != want_text {
            failures.push(format!(
                "{}: text differs\n--- rust\n{text:?}\n--- transformers\n{want_text:?}",
                case.name
            ));
        } else if ids != want_ids {
            failures.push(format!(
                "{}: ids differ\n--- rust\n{ids:?}\n--- transformers\n{want_ids:?}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from transformers {}:\n{}",
        failures.len(),
        cases.len(),
        reference["transformers"],
        failures.join("\n\n")
    );

    // Each template teaches its family's tool-call format.
    for (name, format) in [
        ("qwen2_5", Some(ToolCallFormat::Hermes)),
        ("qwen3", Some(ToolCallFormat::Hermes)),
        ("llama3_1", Some(ToolCallFormat::Llama3Json)),
    ] {
        assert_eq!(loaded[&dirs[name]].tool_call_format(), format, "{name}");
    }

    // The Message API and the JSON form of the same messages render alike.
    let ep = episode();
    assert_eq!(
        qwen.apply_chat_template(&ep, None, true).unwrap(),
        qwen.apply_chat_template(&to_values(&ep), None, true)
            .unwrap()
    );
}
