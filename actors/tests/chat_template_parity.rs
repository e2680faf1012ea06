//! The Rust chat template and tokenizer against transformers, byte for byte and id for id.
//!
//! Builds tokenizer directories with `train_tiny_tokenizer` (one with the real Qwen2.5 template,
//! one with a template exercising more Jinja features), renders the same conversations in Rust
//! and with `AutoTokenizer.apply_chat_template` from the project venv, and requires the text
//! and the token ids to be identical. Without the venv the test is skipped loudly, or fails when
//! `CI` is set, because then the parity claim would go unchecked.

use std::path::{Path, PathBuf};
use std::process::Command;

use agent_r1_actors::tiny_tokenizer::{train_tiny_tokenizer, BUILTIN_CORPUS};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::message::Message;
use serde_json::{json, Value};

/// The venv python, or why there is none.
fn venv_python() -> Result<PathBuf, String> {
    let venv = std::env::var_os("AGENT_R1_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"));
    let python = venv.join("bin/python");
    if !python.exists() {
        return Err(format!("{} does not exist", python.display()));
    }
    let probe = Command::new(&python)
        .args(["-c", "import transformers, jinja2"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} cannot import transformers: {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
    Ok(python)
}

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

struct Case {
    name: String,
    dir: PathBuf,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
}

fn to_values<T: serde::Serialize>(messages: &[T]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

fn cases(qwen_dir: &Path, features_dir: &Path) -> Vec<Case> {
    let ep = episode();
    let conversations: Vec<(&str, Vec<Value>)> = vec![
        ("episode", to_values(&ep)),
        ("prompt_only", to_values(&ep[..2])),
        ("no_system", to_values(&ep[1..5])),
        ("structured", structured_episode()),
    ];
    let mut out = Vec::new();
    for (dir_name, dir) in [("qwen2_5", qwen_dir), ("features", features_dir)] {
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
                    });
                }
            }
        }
    }
    out
}

#[test]
fn chat_template_matches_transformers() {
    let python = match venv_python() {
        Ok(p) => p,
        Err(why) => {
            if std::env::var_os("CI").is_some() {
                panic!("chat template parity needs the project venv with transformers: {why}");
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED chat_template_matches_transformers: {why}\n\
                 !!!!!!!! run `make venv` to check chat-template parity with transformers\n"
            );
            return;
        }
    };

    let work = tempfile::tempdir().unwrap();
    let trained = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 512, &[]).unwrap();
    let qwen_dir = work.path().join("qwen2_5");
    trained.write_to(&qwen_dir).unwrap();
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

    let cases = cases(&qwen_dir, &features_dir);
    let input = json!({"cases": cases.iter().map(|c| json!({
        "name": c.name,
        "tokenizer_dir": c.dir,
        "messages": c.messages,
        "tools": c.tools,
        "add_generation_prompt": c.add_generation_prompt,
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

    let qwen = HfTokenizer::from_dir(&qwen_dir).unwrap();
    let features = HfTokenizer::from_dir(&features_dir).unwrap();
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(results) {
        assert_eq!(want["name"], case.name.as_str());
        let tok = if case.dir == qwen_dir {
            &qwen
        } else {
            &features
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

    // The Message API and the JSON form of the same messages render alike.
    let ep = episode();
    assert_eq!(
        qwen.apply_chat_template(&ep, None, true).unwrap(),
        qwen.apply_chat_template(&to_values(&ep), None, true)
            .unwrap()
    );
}
