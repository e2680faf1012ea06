//! The demo's env driven by an agent written in Python (`examples/demo_python_agent.toml`:
//! `[env.workflow]` runs `examples/agents/search_agent.py`, the official `openai` client in
//! its own loop, as an agent service) reproduces the built-in loop token for token.
//!
//! A shortened demo first trains with the built-in loop (its warm start taught the tool-call
//! format); the Python agent then starts from that run's warm-started model. Both evaluate
//! the held-out questions greedily with `rollout.deterministic` (every token's numerics
//! depend on its own context alone), so the same model must write the same tokens in both:
//! the same prompts (the env's first messages and the run's tool specs, which the agent
//! reads from the endpoint and sends back), the same actions, the same search results after
//! each call (the run's BM25 index, reached through `POST /v1/agent_r1/tool_calls`), and so
//! the same held-out EM. Then one GRPO update trains on the Python agent's episodes.

use std::path::Path;

use serde_json::Value;

#[path = "support/run_log.rs"]
mod run_log;

use run_log::jsonl;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Python-agent demo, shortened: a smaller world, a warm start long enough to teach the
/// tool-call format, one update, deterministic greedy evaluation of every held-out question.
fn shortened(dir: &Path) -> toml::Table {
    let text =
        std::fs::read_to_string(Path::new(ROOT).join("examples/demo_python_agent.toml")).unwrap();
    let mut config: toml::Table = text.parse().unwrap();
    let mut set = |path: &str, value: toml::Value| {
        let (table, key) = path.rsplit_once('.').unwrap();
        let mut at = &mut config;
        for part in table.split('.') {
            at = at[part]
                .as_table_mut()
                .unwrap_or_else(|| panic!("the example has no [{table}]"));
        }
        at.insert(key.into(), value);
    };
    use toml::Value::{Boolean, Integer, String as Text};
    set("env.world.n_questions", Integer(60));
    set("warm_start.steps", Integer(150));
    set("rollout.batch_size", Integer(4));
    set("rollout.group_size", Integer(2));
    set("rollout.concurrency", Integer(8));
    set("rollout.deterministic", Boolean(true));
    set("training.updates", Integer(1));
    set(
        "training.run_dir",
        Text(dir.join("unused").display().to_string()),
    );
    set("checkpoint.every", Integer(1));
    set("eval.every", Integer(1));
    set("eval.questions", Integer(0));
    set("metrics.address", Text("127.0.0.1:0".into()));
    // Gold demonstrations only: the bad-habit phase is for RL to remove, not for this check.
    config["warm_start"]
        .as_table_mut()
        .unwrap()
        .remove("bad_habit");
    config
}

fn train(config: &toml::Table, dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
    let run = dir.join(name);
    let out = run_log::train(ROOT, &path, &run);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Held-out episodes by task id.
fn by_task(path: &Path) -> std::collections::BTreeMap<String, Value> {
    jsonl(path)
        .into_iter()
        .map(|e| (e["task"]["id"].as_str().unwrap().to_string(), e))
        .collect()
}

#[test]
fn a_python_agent_on_the_demo_env_writes_what_the_built_in_loop_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let agent_config = shortened(tmp.path());
    let mut builtin_config = agent_config.clone();
    builtin_config["env"]
        .as_table_mut()
        .unwrap()
        .remove("workflow");
    let builtin = train(&builtin_config, tmp.path(), "builtin");

    let mut from_warm_start = agent_config;
    let model = from_warm_start["model"].as_table_mut().unwrap();
    model.remove("preset");
    model.insert(
        "dir".into(),
        toml::Value::String(builtin.join("model-sft").display().to_string()),
    );
    from_warm_start["warm_start"]
        .as_table_mut()
        .unwrap()
        .insert("steps".into(), toml::Value::Integer(0));
    let agent = train(&from_warm_start, tmp.path(), "agent");

    let eval = "rollouts/eval-step-000000.jsonl";
    let (expected, got) = (by_task(&builtin.join(eval)), by_task(&agent.join(eval)));
    assert_eq!(expected.len(), 12, "every held-out question evaluated");
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>()
    );
    let (mut calls, mut unparsed_ends) = (0, 0);
    for (id, want) in &expected {
        let have = &got[id];
        assert_eq!(
            ids(&have["prompt_ids"]),
            ids(&want["prompt_ids"]),
            "{id}: the prompt"
        );
        let (want_steps, have_steps) = (
            want["steps"].as_array().unwrap(),
            have["steps"].as_array().unwrap(),
        );
        // A tool call the endpoint cannot parse (cut off at `max_response_length`, or
        // malformed JSON such as `"arguments": "..."}}`): the built-in loop answers it with
        // an error and goes on; the endpoint returns it as content without `tool_calls`,
        // and the agent ends its episode there.
        let ends_unparsed = have_steps.last().is_some_and(|h| {
            h["tool_calls"].as_array().is_none_or(Vec::is_empty)
                && (h["finish_reason"] == "length"
                    || h["action_text"]
                        .as_str()
                        .is_some_and(|t| t.contains("<tool_call>")))
        });
        if ends_unparsed {
            unparsed_ends += 1;
            assert!(have_steps.len() <= want_steps.len(), "{id}: steps\n{have}");
        } else {
            assert_eq!(have_steps.len(), want_steps.len(), "{id}: steps\n{have}");
        }
        for (k, (w, h)) in want_steps.iter().zip(have_steps).enumerate() {
            assert_eq!(
                ids(&h["action_ids"]),
                ids(&w["action_ids"]),
                "{id}: step {k}'s action"
            );
            if !(ends_unparsed && k + 1 == have_steps.len()) {
                assert_eq!(
                    h["tool_calls"].as_array().map_or(0, Vec::len),
                    w["tool_calls"].as_array().map_or(0, Vec::len),
                    "{id}: step {k}'s tool calls"
                );
            }
            calls += h["tool_calls"].as_array().map_or(0, Vec::len);
            // Every reply went back unchanged: each step continues the one before.
            assert!(h["rebuilt"].is_null(), "{id}: step {k} rebuilt: {h}");
            if k + 1 < have_steps.len() {
                assert_eq!(
                    ids(&h["observation_ids"]),
                    ids(&w["observation_ids"]),
                    "{id}: what followed step {k} (the search results)"
                );
            }
        }
        if !ends_unparsed {
            assert_eq!(have["metrics"]["em"], want["metrics"]["em"], "{id}: em");
        }
    }
    assert!(
        unparsed_ends < expected.len(),
        "every episode ended on an unparsed call: nothing compared to its end"
    );
    assert!(
        calls > 0,
        "the warm-started model searched on no held-out question"
    );

    // Then GRPO trained on the Python agent's episodes.
    let rows = jsonl(&agent.join("metrics.jsonl"));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["episodes"], 8, "{}", rows[0]);
    assert_eq!(rows[0]["failed"], 0, "{}", rows[0]);
    assert!(rows[0]["policy_loss"].is_number(), "{}", rows[0]);
    let evals = jsonl(&agent.join("eval.jsonl"));
    assert_eq!(evals.len(), 2, "held-out EM at steps 0 and 1");
}

#[test]
fn check_config_refuses_a_bad_env_workflow_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::fs::read_to_string(Path::new(ROOT).join("examples/demo_python_agent.toml")).unwrap();
    let name = "name = \"external_agent\"";
    assert!(example.contains(name));
    for (what, bad, key) in [
        (
            "an unknown workflow",
            example.replace(name, "name = \"external_agnet\""),
            "env.workflow.name",
        ),
        (
            "no workflow named",
            example.replace(name, ""),
            "env.workflow.name",
        ),
        (
            "a misspelt option",
            example.replace("timeout_secs = 600", "timeout_sec = 600"),
            "env.workflow.timeout_sec",
        ),
        (
            "an option out of range",
            example.replace("max_processes = 128", "max_processes = 0"),
            "env.workflow.max_processes",
        ),
        (
            "a context policy beside it",
            format!("{example}\n[env.context]\npolicy = \"window\"\nturns = 1\n"),
            "env.context",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, bad).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .args(["check-config", path.to_str().unwrap()])
            .current_dir(ROOT)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains(key), "{what}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
    }
    // And an env that is itself a workflow takes no [env.workflow].
    let path = dir.path().join("twice.toml");
    let twice = std::fs::read_to_string(Path::new(ROOT).join("examples/external_agent.toml"))
        .unwrap()
        + "\n[env.workflow]\nname = \"external_agent\"\ncommand = [\"true\"]\n";
    std::fs::write(&path, twice).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["check-config", path.to_str().unwrap()])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("env.workflow") && stderr.contains("itself a workflow"),
        "{stderr}"
    );
}
