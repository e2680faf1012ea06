//! Scorers run against real programs: `command` runs a scorer program per episode (a python
//! script reading the episode's JSON; shell one-liners that fail, hang or print no number, as
//! fault injection), through [`ScoredEnv`] as the runtime calls it.

#[path = "support/venv.rs"]
mod venv;

#[path = "support/process.rs"]
mod process;

use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_envs::env::{Env, Score};
use agent_r1_envs::message::Message;
use agent_r1_envs::reward::{ScoredEnv, ScorerRegistry};
use agent_r1_envs::task::Task;
use serde_json::{json, Value};

/// An env whose own reward is always 0.25.
struct Quarter;

impl Env for Quarter {
    fn name(&self) -> &str {
        "quarter"
    }
    fn tool_names(&self) -> Vec<String> {
        vec![]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        Ok(vec![Message::user(task.question.clone())])
    }
    fn score(&self, _task: &Task, _transcript: &[Message]) -> Score {
        Score {
            reward: 0.25,
            metrics: Default::default(),
        }
    }
}

fn task() -> Task {
    Task {
        id: "t1".into(),
        data_source: "test".into(),
        question: "What is the capital of France?".into(),
        answers: vec!["Paris".into()],
        prompt: None,
        extra: Value::Null,
    }
}

fn scored(options: Value, answer: &str) -> agent_r1_envs::Result<Score> {
    let scorer = ScorerRegistry::with_builtins().create("command", &options)?;
    let env = ScoredEnv::new(Arc::new(Quarter), scorer);
    let transcript = [
        Message::user("What is the capital of France?"),
        Message::assistant(format!("<answer>{answer}</answer>")),
    ];
    env.try_score(&task(), &transcript)
}

fn python() -> Option<PathBuf> {
    venv::python("SCORER TEST")
}

const CONTAINS_REFERENCE: &str = r#"
import json, sys
episode = json.load(sys.stdin)
hit = any(a.lower() in episode["answer"].lower() for a in episode["task"]["answers"])
assert episode["env_score"]["reward"] == 0.25
print(json.dumps({"reward": 1.0 if hit else 0.0}))
"#;

#[test]
fn a_scorer_program_reads_the_episode_and_gives_the_reward() {
    let Some(py) = python() else { return };
    let options = json!({"command": py, "args": ["-c", CONTAINS_REFERENCE]});
    let right = scored(options.clone(), "Paris").unwrap();
    assert_eq!(right.reward, 1.0);
    assert_eq!(right.metrics["command"], 1.0);
    assert_eq!(right.metrics["env_reward"], 0.25);
    assert_eq!(scored(options, "Lyon").unwrap().reward, 0.0);
    // A bare number on stdout works too.
    let plain = json!({"command": "sh", "args": ["-c", "cat > /dev/null; echo 'score: 0.5'"]});
    assert_eq!(scored(plain, "x").unwrap().reward, 0.5);
}

#[test]
fn a_failing_a_hanging_and_a_mute_program_are_score_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let tries = tmp.path().join("tries");
    let failing = json!({
        "command": "sh",
        "args": ["-c", format!("echo try >> {}; echo 'judge broke' >&2; exit 3", tries.display())],
        "retries": 2,
    });
    let e = scored(failing, "x").unwrap_err().to_string();
    assert!(
        e.contains("exit status: 3") && e.contains("judge broke"),
        "{e}"
    );
    assert!(e.contains("after 3 tries"), "{e}");
    assert_eq!(std::fs::read_to_string(&tries).unwrap().lines().count(), 3);

    let pid_file = tmp.path().join("pid");
    let hanging = json!({
        "command": "sh",
        "args": ["-c", format!("echo $$ > {}; exec sleep 600", pid_file.display())],
        "timeout_secs": 1,
        "retries": 0,
    });
    let e = scored(hanging, "x").unwrap_err().to_string();
    assert!(e.contains("no answer within 1s (killed)"), "{e}");
    // The killed program ends: wait on its exit itself (a pidfd turns readable when the
    // process terminates), not on a clock; the 60 s bound only keeps a failure from hanging.
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        process::process_ends(pid, 60_000),
        "the hung scorer {pid} still runs"
    );

    let mute =
        json!({"command": "sh", "args": ["-c", "cat > /dev/null; echo correct"], "retries": 0});
    let e = scored(mute, "x").unwrap_err().to_string();
    assert!(e.contains("no number in its output"), "{e}");
}

#[test]
fn command_options_are_checked_without_running_anything() {
    let r = ScorerRegistry::with_builtins();
    r.check("command", &json!({"command": "/nonexistent/scorer"}))
        .unwrap();
    let e = r.check("command", &json!({})).unwrap_err().to_string();
    assert!(e.contains("scorer") && e.contains("command"), "{e}");
    let e = r
        .check("command", &json!({"command": "x", "timeout_secs": 0}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scorer.timeout_secs"), "{e}");
    let e = r
        .check("command", &json!({"command": "x", "timeout": 3}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scorer.timeout"), "{e}");
}
