//! The OpenAI-compatible endpoint driven by the official `openai` Python package: a real
//! client in its own process (`tests/py/openai_agent.py`, run by the `external_agent`
//! workflow once per episode), the real engine over a tiny model in libtorch, the real
//! tokenizer and chat template.
//!
//! What the client sent is in its transcript; the test renders the contexts it expects from
//! those messages itself (the whole conversation through the chat template, or an earlier
//! context, its sampled ids and the template's continuation) and compares them with the
//! recorded trajectory token for token, and the log-probabilities with a plain forward pass.
//! A tiny model taught one conversation by supervised steps (a search call in the hermes
//! format, then an answer) shows the model's own calls coming back as `tool_calls`.

#[path = "support/tiny_agent.rs"]
mod tiny_agent;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_r1_actors::endpoint::{ExternalAgent, ExternalAgentOptions};
use agent_r1_actors::runtime::TurnRenderer;
use agent_r1_actors::sft::{train_sft, SftConfig, SftSequence};
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use serde_json::{json, Value};
use tiny_agent::{
    assert_logprobs_match_forward, collect, tiny_agent, tiny_agent_taught, TinyAgent,
};

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.exists(),
        "{}: missing; `make venv` installs the test's Python packages",
        venv.display()
    );
    venv
}

fn agent_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py/openai_agent.py")
        .display()
        .to_string()
}

fn external_agent(max_requests_per_episode: usize) -> Arc<ExternalAgent> {
    Arc::new(
        ExternalAgent::new(ExternalAgentOptions {
            command: vec![python().display().to_string(), agent_script()],
            timeout_secs: 600.0,
            max_requests_per_episode,
            ..Default::default()
        })
        .unwrap(),
    )
}

/// One episode of `scenario` through the runtime; the trajectory and the client's transcript.
fn run_scenario(
    f: &TinyAgent,
    scenario: &str,
    temperature: f64,
    max_new_tokens: usize,
) -> (Trajectory, Value) {
    run_scenario_with(f, scenario, temperature, max_new_tokens, 16, json!({}))
}

/// [`run_scenario`] with the episode's request allowance and more of the task's `extra`.
fn run_scenario_with(
    f: &TinyAgent,
    scenario: &str,
    temperature: f64,
    max_new_tokens: usize,
    max_requests_per_episode: usize,
    more: Value,
) -> (Trajectory, Value) {
    let workflow = external_agent(max_requests_per_episode);
    run_workflow(f, workflow, scenario, temperature, max_new_tokens, more)
}

/// One episode of `scenario` run by `workflow`.
fn run_workflow(
    f: &TinyAgent,
    workflow: Arc<ExternalAgent>,
    scenario: &str,
    temperature: f64,
    max_new_tokens: usize,
    more: Value,
) -> (Trajectory, Value) {
    let dir = tempfile::tempdir().unwrap();
    let transcript = dir.path().join("transcript.json");
    let setup = f.workflow_setup(workflow, temperature, max_new_tokens, 1);
    let mut extra = json!({"scenario": scenario, "transcript": transcript});
    for (k, v) in more.as_object().unwrap() {
        extra[k] = v.clone();
    }
    let task = Task {
        id: format!("{scenario}-0"),
        data_source: "test".into(),
        question: "Who founded Acme?".into(),
        answers: vec!["hi".into()],
        prompt: None,
        extra,
    };
    let (_, mut trajectories) = collect(setup, vec![(task, 0)]);
    assert_eq!(trajectories.len(), 1);
    let t = trajectories.remove(0);
    assert!(
        matches!(t.end, EpisodeEnd::Completed { .. }),
        "the episode failed: {:?}",
        t.end
    );
    let transcript: Value =
        serde_json::from_str(&std::fs::read_to_string(&transcript).unwrap()).unwrap();
    (t, transcript)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Messages as the chat template reads them: a call's arguments parsed into an object.
fn template_form(messages: &Value) -> Vec<Value> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if m["content"].is_null() {
                m["content"] = json!("");
            }
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for c in calls {
                    let args = c["function"]["arguments"].as_str().unwrap().to_string();
                    c["function"]["arguments"] = serde_json::from_str(&args).unwrap();
                }
            }
            m
        })
        .collect()
}

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {
        "name": "search", "description": "Searches the corpus.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}})]
}

#[test]
fn the_openai_client_drives_an_episode_recorded_token_for_token() {
    let f = tiny_agent(4, 1024);
    let (t, transcript) = run_scenario(&f, "conversation", 1.0, 16);
    let turns = transcript.as_array().unwrap();
    assert_eq!(turns.len(), 3);
    assert_eq!(t.steps.len(), 3, "one step per chat request");
    let received: Vec<&Value> = turns.iter().map(|x| &x["received"]).collect();
    let actions: Vec<Vec<u32>> = received.iter().map(|r| ids(&r["token_ids"])).collect();

    // Request 1: the whole conversation through the chat template, with the tools.
    let tools = tools();
    let ctx1 = f
        .tokenizer
        .encode_chat(&template_form(&turns[0]["messages"]), Some(&tools), true)
        .unwrap();
    // Request 2 sent the first reply back unchanged: its context is the first context, the
    // sampled ids as sampled, and the template's continuation (never re-tokenised).
    let with_tools = TurnRenderer::new(f.tokenizer.clone(), tools.clone(), None).unwrap();
    let mut ctx2 = ctx1.clone();
    ctx2.extend(&actions[0]);
    ctx2.extend(
        with_tools
            .continuation(&actions[0], &[Message::user("Go on.")])
            .unwrap(),
    );
    // Request 3 kept the first reply and replaced the second with a search call the agent
    // wrote: the first reply's sampled ids are kept, everything after them is rendered by
    // the template (the edited turn included), and the context is a rebuilt one.
    let messages3 = template_form(&turns[2]["messages"]);
    let mut ctx3 = ctx1.clone();
    ctx3.extend(&actions[0]);
    ctx3.extend(
        with_tools
            .continuation_of_values(&actions[0], &messages3[3..])
            .unwrap(),
    );
    let contexts: Vec<Vec<u32>> = t.contexts().collect();
    assert_eq!(contexts[0], ctx1);
    assert_eq!(contexts[1], ctx2);
    assert_eq!(contexts[2], ctx3);
    for (k, s) in t.steps.iter().enumerate() {
        assert_eq!(
            s.action_ids, actions[k],
            "step {k}: the ids the client received"
        );
        let lp: Vec<f32> = received[k]["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(
            s.logprobs, lp,
            "step {k}: the log-probs returned are the recorded ones"
        );
    }
    // The replayed reply was reused (a chained step), the edited one rebuilt.
    assert!(
        t.steps[1].rebuilt.is_none(),
        "the replayed reply is chained"
    );
    assert_eq!(
        received[1]["agent_r1"]["reused_tokens"],
        json!(ctx1.len() + actions[0].len())
    );
    assert_eq!(received[1]["agent_r1"]["rebuilt"], json!(false));
    assert!(
        t.steps[2].rebuilt.is_some(),
        "the edited reply is a rebuilt context"
    );
    assert_eq!(received[2]["agent_r1"]["rebuilt"], json!(true));
    assert_eq!(
        received[2]["agent_r1"]["reused_tokens"],
        json!(ctx1.len() + actions[0].len())
    );
    assert_eq!(messages3[3], json!({"role": "user", "content": "Go on."}));
    assert!(messages3[4]["tool_calls"].is_array(), "{}", messages3[4]);
    // The streamed turn came back whole through the client's stream parser.
    assert_eq!(turns[1]["stream"], json!(true));
    assert!(received[1]["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    // Token-in, token-out: the engine's log-probs are the model's own over each step.
    assert_logprobs_match_forward(&f.model, &t);
    // The reward line: the episode's reward and a step reward named by completion id.
    assert_eq!(t.metrics["requests"], 3.0);
    assert_eq!(t.steps[0].reward, 0.5);
}

#[test]
fn bad_requests_get_openai_error_objects() {
    let f = tiny_agent(4, 1024);
    let (t, transcript) = run_scenario(&f, "errors", 1.0, 16);
    let seen = transcript.as_array().unwrap()[0]["errors"].clone();
    let by_case = |name: &str| -> Value {
        seen.as_array()
            .unwrap()
            .iter()
            .find(|c| c["case"] == name)
            .unwrap_or_else(|| panic!("case {name} missing: {seen}"))
            .clone()
    };
    for (case, status, says) in [
        ("temperature", 400, "rollout.temperature"),
        ("max_tokens", 400, "max_response_length"),
        ("tool_choice", 400, "auto"),
        ("unknown_field", 400, "bogus"),
        ("role", 400, "messages[0].role"),
        ("top_logprobs", 400, "top_logprobs"),
        ("tool_schema", 400, "tools[0]"),
        ("wrong_key", 401, "no episode in flight"),
        ("malformed_json", 400, "not valid JSON"),
    ] {
        let c = by_case(case);
        assert_eq!(c["status"], json!(status), "{case}: {c}");
        let message = c["body"]["message"]
            .as_str()
            .or_else(|| c["body"]["error"]["message"].as_str())
            .unwrap_or_else(|| panic!("{case}: no error message: {c}"));
        assert!(message.contains(says), "{case}: {message}");
    }
    assert_eq!(by_case("models")["status"], json!(200));
    assert_eq!(by_case("completion_by_path")["status"], json!(200));
    // Only the completion made a step: refused requests sample nothing.
    assert_eq!(t.steps.len(), 1);
    assert_eq!(t.prompt_ids, vec![1, 2, 3]);
    assert_logprobs_match_forward(&f.model, &t);
}

const QUESTION: &str = "Who founded Acme?";
const SYSTEM: &str = "You answer questions; search when unsure.";
const CALL: &str = "<think>\nI will search.\n</think>\n\n<tool_call>\n{\"name\": \"search\", \
                    \"arguments\": {\"query\": \"Acme\"}}\n</tool_call>";
const ANSWER: &str = "<answer>hi</answer>";

#[test]
fn the_models_own_tool_calls_come_back_as_tool_calls() {
    // The conversation the agent will have, in token space, taught to the model.
    let teach = |model: &mut agent_r1_actors::model::PolicyModel,
                 tok: &Arc<agent_r1_actors::tokenizer::HfTokenizer>| {
        let r = TurnRenderer::new(tok.clone(), tools(), None).unwrap();
        let end = r.end_of_turn_id();
        let messages = vec![
            json!({"role": "system", "content": SYSTEM}),
            json!({"role": "user", "content": QUESTION}),
        ];
        let ctx1 = tok.encode_chat(&messages, Some(&tools()), true).unwrap();
        let mut a1 = tok.encode(CALL, false).unwrap();
        a1.push(end);
        let result = json!({"role": "tool", "tool_call_id": "call00001",
                            "content": "Nothing found for Acme."});
        let cont = r.continuation_of_values(&a1, &[result]).unwrap();
        let mut a2 = tok.encode(ANSWER, false).unwrap();
        a2.push(end);
        let mut stream = ctx1.clone();
        let mut trained = vec![false; ctx1.len()];
        for (part, on) in [(&a1, true), (&cont, false), (&a2, true)] {
            stream.extend(part.iter());
            trained.extend(std::iter::repeat_n(on, part.len()));
        }
        let report = train_sft(
            model,
            &[SftSequence {
                ids: stream,
                trained,
            }],
            &SftConfig {
                steps: 300,
                batch_size: 1,
                learning_rate: 3e-3,
                final_lr_fraction: 1.0,
                warmup_steps: 10,
                ..Default::default()
            },
            |_, _| std::ops::ControlFlow::Continue(()),
        )
        .unwrap();
        assert!(report.last_loss < 0.01, "not learnt: {report:?}");
    };
    let f = tiny_agent_taught(4, 1024, teach);
    let (t, transcript) = run_scenario(&f, "tool", 0.0, 64);
    let turns = transcript.as_array().unwrap();
    assert_eq!(turns.len(), 2);
    let first = &turns[0]["received"];
    assert_eq!(first["finish_reason"], json!("tool_calls"));
    let message = &first["message"];
    assert_eq!(
        message["content"],
        json!("<think>\nI will search.\n</think>")
    );
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], json!("search"));
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"query": "Acme"}));
    // The call's result went back with the call's id; the answer was streamed.
    let sent = turns[1]["messages"].as_array().unwrap();
    assert_eq!(sent[3]["tool_call_id"], calls[0]["id"]);
    assert_eq!(turns[1]["received"]["message"]["content"], json!(ANSWER));
    assert_eq!(t.reward, 1.0);
    // The call turn was reused as sampled: the answer's context chains onto it.
    assert_eq!(t.steps.len(), 2);
    assert!(t.steps[1].rebuilt.is_none());
    assert_eq!(
        turns[1]["received"]["agent_r1"]["reused_tokens"],
        json!(t.steps[0].context_len + t.steps[0].action_ids.len())
    );
    assert_logprobs_match_forward(&f.model, &t);
}

#[test]
fn an_agent_service_takes_many_episodes_in_one_process() {
    use std::io::BufRead;
    let mut service = std::process::Command::new(python())
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/py/agent_service.py")
                .display()
                .to_string(),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = service.stdout.take().unwrap();
    // The service ends with the test, failed or not.
    struct Ends(std::process::Child);
    impl Drop for Ends {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _service = Ends(service);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .parse()
        .unwrap();

    let f = tiny_agent(8, 1024);
    let workflow = Arc::new(
        ExternalAgent::new(ExternalAgentOptions {
            service_url: Some(format!("http://127.0.0.1:{port}/episode")),
            timeout_secs: 600.0,
            ..Default::default()
        })
        .unwrap(),
    );
    let setup = f.workflow_setup(workflow, 1.0, 16, 8);
    let tasks = (0..8)
        .map(|i| (tiny_agent::task(format!("service-{i}")), i as u64))
        .collect();
    let (_, trajectories) = collect(setup, tasks);
    assert_eq!(trajectories.len(), 8);
    for t in &trajectories {
        assert!(matches!(t.end, EpisodeEnd::Completed { .. }), "{:?}", t.end);
        assert_eq!(t.steps.len(), 2);
        // The service sent the first reply back unchanged: the second step chains onto it.
        assert!(t.steps[1].rebuilt.is_none());
        assert_eq!(t.reward, 1.0);
        assert!(t.metrics["reused_tokens"] > 0.0);
        assert_logprobs_match_forward(&f.model, t);
    }
}

#[test]
fn more_requests_at_once_than_allowed_are_refused_with_429() {
    let f = tiny_agent(8, 1024);
    let limit = 2;
    let marker_dir = tempfile::tempdir().unwrap();
    // The agent's signal: it writes to this pipe once it has seen its refusals.
    let marker = marker_dir.path().join("overloaded");
    let made = std::process::Command::new("mkfifo")
        .arg(&marker)
        .status()
        .unwrap();
    assert!(made.success());
    // The engine stops before its first step, so the first requests stay in flight and the
    // test decides when they may finish: once the agent has seen its refusals.
    f.engine.pause_after(0).unwrap();
    let engine = f.engine.clone();
    let watched = marker.clone();
    let resumer = std::thread::spawn(move || {
        // Blocks until the agent opens the pipe and closes it again.
        let said = std::fs::read_to_string(&watched).unwrap();
        engine.resume().unwrap();
        said
    });
    let (t, transcript) = run_scenario_with(
        &f,
        "overload",
        1.0,
        16,
        limit,
        json!({"limit": limit, "marker": marker}),
    );
    assert_eq!(resumer.join().unwrap(), "overloaded");
    let seen = &transcript.as_array().unwrap()[0];
    // `limit` in flight and `limit` waiting were answered; the three past them got 429.
    assert_eq!(seen["statuses"], json!([200, 200, 200, 200, 429, 429, 429]));
    for e in seen["errors"].as_array().unwrap() {
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains("max_requests_per_episode = 2"), "{e}");
    }
    assert_eq!(t.steps.len(), 2 * limit);
}

/// GET `path` from `addr` with `token` as the bearer (none: no header); the status.
fn status_of(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn off_loopback_the_openai_client_presents_the_runs_token() {
    let dir = tempfile::tempdir().unwrap();
    let refused = ExternalAgent::new(ExternalAgentOptions {
        command: vec!["true".into()],
        listen: "0.0.0.0:0".into(),
        ..Default::default()
    })
    .err()
    .expect("every interface without a token is refused")
    .to_string();
    assert!(
        refused.contains("env.options.listen") && refused.contains("env.options.token_file"),
        "{refused}"
    );

    let token = "9c8b7a6f5e4d3c2b1a0f9e8d";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "9c8b7a\n").unwrap();
    let refused = ExternalAgent::new(ExternalAgentOptions {
        command: vec!["true".into()],
        listen: "0.0.0.0:0".into(),
        token_file: Some(short),
        ..Default::default()
    })
    .err()
    .expect("a short token is refused when the workflow is made")
    .to_string();
    assert!(
        refused.contains("env.options.token_file") && refused.contains("at least 16"),
        "{refused}"
    );
    let workflow = Arc::new(
        ExternalAgent::new(ExternalAgentOptions {
            command: vec![python().display().to_string(), agent_script()],
            listen: "0.0.0.0:0".into(),
            token_file: Some(token_file),
            timeout_secs: 600.0,
            ..Default::default()
        })
        .unwrap(),
    );
    // The official client, given the token as its key and its episode's base URL, drives
    // the episode to its end.
    let f = tiny_agent(4, 1024);
    let (t, transcript) = run_workflow(&f, workflow.clone(), "conversation", 1.0, 16, json!({}));
    assert_eq!(t.steps.len(), 3, "one step per chat request");
    assert_eq!(transcript.as_array().unwrap().len(), 3);

    let port = workflow.endpoint().unwrap().local_addr().port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(status_of(addr, "/v1/models", None), 401);
    assert_eq!(
        status_of(addr, "/v1/models", Some("9c8b7a6f5e4d3c2b1a0f9e8e")),
        401
    );
    assert_eq!(status_of(addr, "/v1/models", Some(token)), 200);
    assert_eq!(status_of(addr, "/episodes/ar1-x/v1/models", None), 401);
}
