//! `agent-r1 eval` end to end through the binary: a fresh tiny model directory on the default
//! synthetic world; a checkpoint of a one-update `train` run, evaluated on the world and
//! tools of the checkpoint's saved config; bad input gives one line naming the flag, with
//! exit code 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn agent_r1(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(args)
        .output()
        .expect("run agent-r1")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// `--json` prints exactly one object and nothing else on stdout.
fn one_json(out: &Output) -> Value {
    let stdout = ok(out);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one JSON line expected: {stdout}");
    let v: Value = serde_json::from_str(lines[0]).expect("stdout is JSON");
    assert!(v.is_object(), "{v}");
    v
}

fn assert_usage_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "expected exit code 2: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "stderr should name `{needle}`: {stderr}"
    );
}

fn init_tiny(dir: &Path) {
    ok(&agent_r1(&[
        "init-model",
        "--preset",
        "tiny",
        "--out",
        dir.to_str().unwrap(),
    ]));
}

fn assert_scores(v: &Value, episodes: u64) {
    for key in ["em", "f1"] {
        let x = v[key].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&x), "{key} in [0, 1]: {v}");
    }
    for key in ["reward", "tool_calls_per_episode"] {
        assert!(v[key].is_number(), "{key}: {v}");
    }
    assert_eq!(v["episodes"], episodes, "{v}");
    assert_eq!(v["failed"], 0, "{v}");
    assert_eq!(v["split"], "test", "{v}");
    assert!(v["model"].is_string(), "{v}");
    // The env's other metrics, at the top level and under `metrics`.
    assert!(v["metrics"]["em"].is_number(), "{v}");
    assert!(v["substring_em"].is_number(), "{v}");
}

#[test]
fn eval_of_a_model_directory_prints_one_json_object() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    init_tiny(&model);
    let traj = tmp.path().join("eval.jsonl");
    let v = one_json(&agent_r1(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--env",
        "synthetic_multihop",
        "--questions",
        "8",
        "--device",
        "cpu",
        "--out",
        traj.to_str().unwrap(),
        "--json",
    ]));
    assert_scores(&v, 8);
    assert_eq!(v["config"], "default", "{v}");
    assert_eq!(v["greedy"], true, "{v}");
    assert!(v["checkpoint_step"].is_null(), "{v}");
    let lines = std::fs::read_to_string(&traj).unwrap();
    assert_eq!(lines.lines().count(), 8);
    let first: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert!(first.to_string().contains("text"), "decoded text: {first}");
    // Nothing is written next to the model.
    assert!(!model.join("world").exists());
}

/// A 40-question world (8 held out): not the default world (500 questions, 200 held out), so
/// the episode count shows which config the evaluation used.
fn train_config(dir: &Path) -> PathBuf {
    let text = r#"
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 3
n_questions = 40
test_fraction = 0.2

[tools.search]
top_k = 2

[algorithm]
estimator = "grpo"
micro_batch_size = 8

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 1
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 16
max_context_length = 1024
concurrency = 4

[training]
updates = 1
seed = 0

[checkpoint]
every = 1

[eval]
every = 0

[metrics]
enabled = false
"#;
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn eval_of_a_checkpoint_uses_its_saved_config() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = train_config(tmp.path());
    ok(&agent_r1(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]));
    let step = run.join("checkpoints/step-1");
    assert!(step.join("policy/config.json").is_file());
    let s = step.to_str().unwrap();

    // No --env, no --questions: the checkpoint's env and its whole held-out split.
    let v = one_json(&agent_r1(&[
        "eval", "--model", s, "--device", "cpu", "--json",
    ]));
    assert_scores(&v, 8);
    assert_eq!(v["config"], "checkpoint", "{v}");
    assert_eq!(v["env"], "synthetic_multihop", "{v}");
    assert_eq!(v["checkpoint_step"], 1, "{v}");
    assert!(
        v["policy"].as_str().unwrap().ends_with("policy"),
        "the checkpoint's policy/ is evaluated: {v}"
    );

    // The run directory means its newest checkpoint; the table names it.
    let table = ok(&agent_r1(&[
        "eval",
        "--model",
        run.to_str().unwrap(),
        "--questions",
        "2",
        "--max-turns",
        "1",
        "--device",
        "cpu",
    ]));
    assert!(table.contains("checkpoint step 1"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("EM")), "{table}");

    // --env must agree with the checkpoint.
    assert_usage_error(
        &agent_r1(&["eval", "--model", s, "--env", "multihop_qa"]),
        "--env multihop_qa",
    );

    // A checkpoint whose files no longer match the manifest is refused.
    let config = step.join("policy/config.json");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push(' ');
    std::fs::write(&config, text).unwrap();
    assert_usage_error(&agent_r1(&["eval", "--model", s, "--json"]), "--model");
    assert_usage_error(&agent_r1(&["eval", "--model", s]), "manifest");
}

#[test]
fn bad_input_exits_2_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let m = missing.to_str().unwrap();
    assert_usage_error(&agent_r1(&["eval", "--model", m]), "--model");
    let empty = tmp.path().to_str().unwrap();
    assert_usage_error(
        &agent_r1(&["eval", "--model", empty]),
        "neither a model directory",
    );
    // Only synthetic_multihop builds its own tasks; other envs need --config.
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    assert_usage_error(
        &agent_r1(&[
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--env",
            "multihop_qa",
        ]),
        "needs --config",
    );
    for (args, needle) in [
        (&["--split", "dev"][..], "--split"),
        (&["--env", "nope"][..], "--env"),
        (&["--questions", "0"][..], "--questions"),
        (&["--concurrency", "0"][..], "--concurrency"),
        (&["--temperature=-1"][..], "--temperature"),
    ] {
        let mut all = vec!["eval", "--model", empty];
        all.extend_from_slice(args);
        let out = agent_r1(&all);
        assert_usage_error(&out, needle);
        if needle == "--split" {
            assert!(String::from_utf8_lossy(&out.stderr).contains("train, test"));
        }
    }
}

/// `rollout --memory-fraction`: the engine sizes itself from the machine's memory and says
/// so in one line; a share too small for one row is one line and exit 2, before any episode.
#[test]
fn rollout_sizes_its_engine_from_a_memory_fraction() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    init_tiny(&model);
    let m = model.to_str().unwrap();
    let out_dir = tmp.path().join("trajectories.jsonl");
    let args = |fraction: &'static str| {
        vec![
            "rollout",
            "--model",
            m,
            "--episodes",
            "16",
            "--concurrency",
            "16",
            "--max-batch",
            "16",
            "--max-context",
            "512",
            "--memory-fraction",
            fraction,
            "--out",
            out_dir.to_str().unwrap(),
        ]
    };
    let out = agent_r1(&args("0.000000001"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("memory_fraction = 0.000000001") && err.contains("less than one row"),
        "{err}"
    );
    let written = std::fs::read(&out_dir).unwrap_or_default();
    assert!(written.is_empty(), "no episode ran");

    let out = agent_r1(&args("0.005"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("engine memory on Cpu: "))
        .unwrap_or_else(|| panic!("no plan in {err}"));
    let rows: usize = line
        .split(", ")
        .find_map(|part| part.split_once(" rows of slots").map(|(n, _)| n))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rows in {line}"));
    assert!((1..=16).contains(&rows), "{line}");
    assert!(err.contains("16 completed, 0 failed"), "{err}");
}
