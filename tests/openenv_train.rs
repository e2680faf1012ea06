//! `agent-r1 train` on an OpenEnv environment served by `openenv-core`
//! (`tests/py/openenv_digits.py`, `examples/openenv.toml`): agent-r1 is the OpenEnv client,
//! one WebSocket session per episode, the env's rewards placed on the steps that earned them,
//! and the env's `done` ending the episode. The return must rise over the run. And a wrong
//! `action_field` or a missing `url` is refused in one line naming the key.

use std::path::Path;
use std::process::Command;

#[path = "support/py_service.rs"]
mod py_service;
#[path = "support/run_log.rs"]
mod run_log;

use py_service::PyService;
use run_log::{assert_reward_rose, jsonl};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// examples/openenv.toml pointed at `url`, with `edit` applied to its text.
fn config(dir: &Path, url: &str, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join("examples/openenv.toml")).unwrap();
    let text = text.replace(
        "url = \"http://127.0.0.1:8011\"",
        &format!("url = \"{url}\""),
    );
    assert!(text.contains(url), "the example names its server in `url`");
    let path = dir.join("openenv.toml");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

/// The OpenEnv server of `tests/py/openenv_digits.py`, its log in `dir`.
fn digits_server(dir: &Path) -> PyService {
    PyService::start(
        Path::new(ROOT),
        "tests/py/openenv_digits.py",
        &[],
        dir.join("server.log"),
    )
}

#[test]
fn train_on_an_openenv_server_raises_the_env_return() {
    let tmp = tempfile::tempdir().unwrap();
    let server = digits_server(tmp.path());
    let config = config(tmp.path(), &server.url, |t| t);
    let run = tmp.path().join("run");
    let out = run_log::train(ROOT, &config, &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The example has no held-out tasks, and says so.
    assert!(
        stderr.contains("warning: no held-out tasks (env.test_files is empty)"),
        "{stderr}"
    );
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(rows.len(), 20, "twenty updates");
    for row in &rows {
        // 8 tasks x group 4, every episode a session that ran to the env's `done`.
        assert_eq!(row["episodes"], 32, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        assert_eq!(row["metrics"]["env_done"], 1.0, "{row}");
        assert_eq!(row["metrics"]["env_steps"], 2.0, "{row}");
        // The return the run reports is the env's, summed over its steps.
        let ret = row["metrics"]["env_return"].as_f64().unwrap();
        assert!(
            (row["reward_mean"].as_f64().unwrap() - ret).abs() < 1e-9,
            "{row}"
        );
    }
    // Two actions, each rewarded 0 to 1: a random policy earns about 0.02 per episode.
    assert_reward_rose(&rows, "the env's return");
    // Each trajectory is the env's episode: two steps, each with the env's reward for its
    // action (a share, 0 to 1), the second context continuing the first in token space.
    let episodes = jsonl(&run.join("rollouts/train-step-000020.jsonl"));
    assert!(!episodes.is_empty());
    for e in &episodes {
        let steps = e["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2, "{e}");
        let total: f64 = steps.iter().map(|s| s["reward"].as_f64().unwrap()).sum();
        assert!(steps
            .iter()
            .all(|s| (0.0..=1.0).contains(&s["reward"].as_f64().unwrap())));
        assert!((total - e["metrics"]["env_return"].as_f64().unwrap()).abs() < 1e-9);
        let first_len = steps[0]["context_len"].as_u64().unwrap()
            + steps[0]["action_ids"].as_array().unwrap().len() as u64
            + steps[0]["observation_ids"].as_array().unwrap().len() as u64;
        assert_eq!(steps[1]["context_len"].as_u64().unwrap(), first_len, "{e}");
        assert!(steps[0]["observation_text"]
            .as_str()
            .unwrap()
            .contains("More digits."));
    }
}

#[test]
fn a_wrong_action_field_fails_the_run_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let server = digits_server(tmp.path());
    let config = config(tmp.path(), &server.url, |t| {
        t.replace("action_field = \"message\"", "action_field = \"text\"")
            .replace("updates = 20", "updates = 20\nmax_failed_batches = 2")
    });
    let run = tmp.path().join("run");
    let out = run_log::train(ROOT, &config, &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Every episode fails with the reason; two such batches in a row end the run.
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "every episode of the last 2 batches failed (training.max_failed_batches = 2)"
        ) && stderr.contains(
            "env.options.action_field: the env's action has no field \"text\"; its fields: message"
        ),
        "{stderr}"
    );
    assert!(!run.join("metrics.jsonl").exists() || jsonl(&run.join("metrics.jsonl")).len() < 2);
}

#[test]
fn check_config_refuses_an_openenv_without_a_url() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path(), "http://127.0.0.1:8011", |t| {
        t.replace("url = \"http://127.0.0.1:8011\"\n", "")
    });
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .arg("check-config")
        .arg(&config)
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("env.options.url") && stderr.contains("missing"),
        "{stderr}"
    );
}
