//! `agent-r1 train` on an agent written in Python against the official `openai` client
//! (`examples/external_agent.toml`, `examples/agents/qa_agent.py`): the workflow runs the
//! program once per episode, every completion it asks for is a step, its printed reward is
//! what the learner trains on. And the config's mistakes are refused by `check-config`.

use std::path::Path;
use std::process::Command;

#[path = "support/run_log.rs"]
mod run_log;

use run_log::jsonl;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn train_runs_a_python_openai_agent_through_the_endpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = run_log::train(ROOT, Path::new("examples/external_agent.toml"), &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(rows.len(), 2, "two updates");
    for row in &rows {
        // 4 tasks x group 2, every program exited 0 with its reward line.
        assert_eq!(row["episodes"], 8, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        assert!(row["policy_loss"].is_number(), "{row}");
        // The agent's own metrics reached the log.
        assert!(row["metrics"]["turns"].as_f64().unwrap() >= 1.0, "{row}");
    }
    // Each trajectory holds one step per completion the program asked for, with the tool
    // it offered in the rendered context.
    let rollouts = run.join("rollouts/train-step-000002.jsonl");
    let episodes = jsonl(&rollouts);
    assert_eq!(episodes.len(), 8);
    for e in &episodes {
        let steps = e["steps"].as_array().unwrap();
        assert!(!steps.is_empty() && steps.len() <= 3, "{e}");
        assert_eq!(e["metrics"]["turns"].as_f64().unwrap(), steps.len() as f64);
    }
    let text = std::fs::read_to_string(&rollouts).unwrap();
    assert!(text.contains("lookup"), "the tool spec is in the prompt");
}

#[test]
fn check_config_refuses_an_external_agent_without_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let good = std::fs::read_to_string(Path::new(ROOT).join("examples/external_agent.toml"))
        .unwrap()
        .replace(
            "command = [\".venv/bin/python\", \"examples/agents/qa_agent.py\"]",
            "command = []",
        );
    std::fs::write(&bad, good).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["check-config", bad.to_str().unwrap()])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("env.options.command"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
