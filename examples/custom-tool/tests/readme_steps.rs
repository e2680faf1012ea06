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

/// The command lines of the README's block that follows the marker comment `marker`.
fn readme_steps(marker: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let after = readme
        .split_once(marker)
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
    let steps = readme_steps(
        "<!-- The lines of this block are run, in order, by tests/readme_steps.rs. -->",
    );
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
fn the_readme_steps_train_this_crates_workflow() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("custom-workflow");
    let steps = readme_steps(
        "<!-- The lines of this block are run, in order, by tests/readme_steps.rs (workflow). -->",
    );
    assert_eq!(steps.len(), 2, "{steps:?}");
    let mut outputs = Vec::new();
    for line in &steps {
        let line = line.replace("runs/custom-workflow", &run_dir.display().to_string());
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
    assert!(text(&outputs[0].stderr).contains("ok: examples/custom-tool/workflow.toml"));
    let stdout = text(&outputs[1].stdout);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["updates"], 2, "{summary}");
    // Every recorded episode: the answer in the task's context, the check in its own, with
    // its own reward field; the learner trained both.
    let mut episodes = 0;
    for entry in std::fs::read_dir(run_dir.join("rollouts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let episode: Value = serde_json::from_str(line).unwrap();
            if episode["end"]["status"] != "completed" {
                continue;
            }
            episodes += 1;
            let steps = episode["steps"].as_array().unwrap();
            assert_eq!(steps.len(), 2, "{episode}");
            assert!(steps[0].get("rebuilt").is_none(), "{episode}");
            assert_eq!(steps[1]["rebuilt"]["by"], "self_check", "{episode}");
            let reward = steps[1]["reward"].as_f64().unwrap();
            assert!(reward == 0.0 || reward == 0.5, "{episode}");
            assert!(
                episode["metrics"]["check_calibrated"].is_number(),
                "{episode}"
            );
        }
    }
    assert!(episodes > 0, "no completed episode in the run's rollouts");
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    for line in metrics.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        assert!(row["action_tokens"].as_u64().unwrap_or(0) > 0, "{row}");
    }
    assert_eq!(metrics.lines().count(), 2);
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
