//! The binary's model commands end to end: `init-model` writes a loadable directory,
//! `generate --json` prints exactly one well-formed object, and bad input gives one line on
//! stderr naming the file or flag, with exit code 2.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn agent_r1(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(args)
        .output()
        .expect("run agent-r1")
}

fn init_tiny(dir: &Path) {
    let out = agent_r1(&[
        "init-model",
        "--preset",
        "tiny",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "init-model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.join(f).is_file(), "init-model did not write {f}");
    }
}

fn assert_usage_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "expected exit code 2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "stderr should name `{needle}`: {stderr}"
    );
}

#[test]
fn init_model_then_generate_json() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    init_tiny(&dir);
    let d = dir.to_str().unwrap();
    let run = |chat: bool| {
        let mut args = vec![
            "generate",
            "--model",
            d,
            "--prompt",
            "Who founded Acme?",
            "--max-new-tokens",
            "12",
            "--seed",
            "5",
            "--device",
            "cpu",
            "--json",
        ];
        if chat {
            args.push("--chat");
        }
        let out = agent_r1(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            stdout.trim().lines().count(),
            1,
            "exactly one JSON line: {stdout}"
        );
        serde_json::from_str::<Value>(stdout.trim()).unwrap()
    };
    let plain = run(false);
    let chat = run(true);
    for v in [&plain, &chat] {
        let ids = v["token_ids"].as_array().unwrap();
        let lps = v["logprobs"].as_array().unwrap();
        assert!(!ids.is_empty() && ids.len() <= 12);
        assert_eq!(ids.len(), lps.len());
        assert!(lps.iter().all(|x| x.as_f64().unwrap() <= 0.0));
        assert!(v["text"].is_string());
        assert!(!v["prompt_token_ids"].as_array().unwrap().is_empty());
    }
    // The chat prompt is the template's rendering: longer than the bare text.
    assert!(
        chat["prompt_token_ids"].as_array().unwrap().len()
            > plain["prompt_token_ids"].as_array().unwrap().len()
    );
    // Same seed, same tokens.
    assert_eq!(run(false)["token_ids"], plain["token_ids"]);
}

#[test]
fn bad_input_is_one_line_and_exit_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = agent_r1(&[
        "generate",
        "--model",
        missing.to_str().unwrap(),
        "--prompt",
        "x",
    ]);
    assert_usage_error(&out, "nope");

    let dir = tmp.path().join("tiny");
    init_tiny(&dir);
    let d = dir.to_str().unwrap();
    let out = agent_r1(&[
        "generate",
        "--model",
        d,
        "--prompt",
        "x",
        "--temperature=-1",
    ]);
    assert_usage_error(&out, "temperature");
    let out = agent_r1(&["generate", "--model", d, "--prompt", "x", "--top-p", "1.5"]);
    assert_usage_error(&out, "top_p");
    let out = agent_r1(&["generate", "--model", d, "--prompt", "x", "--device", "tpu"]);
    assert_usage_error(&out, "--device");
    let out = agent_r1(&["generate", "--model", d, "--prompt", "x", "--bogus"]);
    assert_usage_error(&out, "--bogus");

    // Unsupported architecture names the field and value.
    let cfg_path = dir.join("config.json");
    let original = std::fs::read_to_string(&cfg_path).unwrap();
    let mut cfg: Value = serde_json::from_str(&original).unwrap();
    cfg["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = agent_r1(&["generate", "--model", d, "--prompt", "x"]);
    assert_usage_error(&out, "GPT2LMHeadModel");

    // A weight of the wrong shape names the file, the tensor and its shape.
    let mut cfg: Value = serde_json::from_str(&original).unwrap();
    cfg["hidden_size"] = 96.into();
    cfg["head_dim"] = 24.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = agent_r1(&["generate", "--model", d, "--prompt", "x"]);
    assert_usage_error(&out, "model.safetensors: tensor `model.");
    assert_usage_error(&out, "config.json implies");

    // A non-empty --out is refused.
    let out = agent_r1(&["init-model", "--out", d]);
    assert_usage_error(&out, "not empty");
}
