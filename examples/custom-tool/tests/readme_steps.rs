//! Runs the steps of this crate's README, in order, and checks what they claim: the config
//! with the crate's own tool kind passes `check-config`, `train` runs its updates through
//! the runtime with that tool called, and `eval` scores the result with it. Then the
//! misspellings the README mentions are refused with the key named.
//!
//! The README's `cargo build` line is what `cargo test` has already done: the binary under
//! test is that build's `custom-agent`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_custom-agent");

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The command lines of the README's block that follows the marker comment.
fn readme_steps() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let after = readme
        .split_once("<!-- The lines of this block are run")
        .expect("the README marks its steps")
        .1;
    let block = after
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    block.lines().map(str::to_string).collect()
}

fn run(args: &[String]) -> Output {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(repo_root())
        .env("AGENT_R1_LOG", "warn")
        .output()
        .unwrap();
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_readme_steps_train_the_demo_agent_with_this_crates_tool() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("custom-tool");
    let steps = readme_steps();
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(steps[0].starts_with("cargo build --release -p custom-agent"));
    let mut outputs = Vec::new();
    for line in &steps[1..] {
        let line = line.replace("runs/custom-tool", &run_dir.display().to_string());
        let mut words = line.split_whitespace().map(str::to_string);
        assert_eq!(words.next().as_deref(), Some("target/release/custom-agent"));
        let args: Vec<String> = words.collect();
        let out = run(&args);
        assert!(
            out.status.success(),
            "`{line}` failed ({}):\n{}",
            out.status,
            text(&out.stderr)
        );
        outputs.push(out);
    }

    // check-config: the custom kind is known, its options parsed.
    let check = text(&outputs[0].stderr);
    assert!(
        check.contains("ok: examples/custom-tool/agent.toml"),
        "{check}"
    );
    assert!(text(&outputs[0].stdout).contains("type = \"keyword_search\""));

    // train: three updates, and the episodes called this crate's tool.
    let stdout = text(&outputs[1].stdout);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["updates"], 3, "{summary}");
    let mut calls = 0;
    let mut by_keyword_search = 0;
    for entry in std::fs::read_dir(run_dir.join("rollouts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let episode: Value = serde_json::from_str(line).unwrap();
            for step in episode["steps"].as_array().unwrap() {
                for call in step["tool_calls"].as_array().unwrap() {
                    calls += 1;
                    if call["result"]["Ok"]["metadata"]["ranker"] == "keyword_search" {
                        by_keyword_search += 1;
                    }
                }
            }
        }
    }
    assert!(calls > 0, "no tool call in the run's rollouts");
    assert!(
        by_keyword_search > 0,
        "none of {calls} tool calls was answered by keyword_search"
    );
    eprintln!("{by_keyword_search} of {calls} recorded tool calls answered by keyword_search");

    // eval: the newest checkpoint, with the tool rebuilt from the checkpoint's config (a
    // kind the binary did not know would end it with exit code 2 before any episode).
    let stdout = text(&outputs[2].stdout);
    let eval: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(eval["config"], "checkpoint", "{eval}");
    assert_eq!(eval["checkpoint_step"], 3, "{eval}");
    assert_eq!(eval["episodes"], 8, "{eval}");
    assert_eq!(eval["failed"], 0, "{eval}");
}

#[test]
fn check_config_refuses_a_misspelt_kind_and_a_misspelt_option() {
    let config =
        std::fs::read_to_string(repo_root().join("examples/custom-tool/agent.toml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for (from, to, key) in [
        (
            "type = \"keyword_search\"",
            "type = \"keyword_serach\"",
            "tools.search.type",
        ),
        ("top_k = 2", "top_kk = 2", "tools.search.top_kk"),
        ("top_k = 2", "top_k = 0", "tools.search.top_k"),
    ] {
        assert!(config.contains(from));
        let path = tmp.path().join("bad.toml");
        std::fs::write(&path, config.replacen(from, to, 1)).unwrap();
        let out = run(&["check-config".into(), path.display().to_string()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{to}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{to}: one line: {stderr}");
        assert!(stderr.contains(key), "{to}: names `{key}`: {stderr}");
        if key == "tools.search.type" {
            assert!(
                stderr.contains("keyword_search"),
                "lists the kinds: {stderr}"
            );
        }
    }
}
