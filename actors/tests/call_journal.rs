//! Tool calls with side effects happen once across a crash: the runtime keys every call
//! (run, episode, step, call) and journals its result; a rollout stopped mid-way (a crash: the
//! service aborted with calls in flight, the journal's last line cut short) and started again
//! on the same episodes takes the journaled results of the calls already made, and makes again
//! only those that were in flight, under the same keys.
//!
//! The tool is a real MCP server (the official Python SDK, `envs/tests/py/mcp_sdk_server.py`)
//! whose `effect` tool appends every call it receives, with its `_meta` key, to a log. The
//! model is the tiny one in libtorch; the workflow's calls depend on the task only, so a
//! workflow told to call differently the second time (the `-d` tasks' second call) shows
//! the other path: a call that differs from the journaled one under its key is a new call,
//! made under the next branch's key.

#[path = "support/tiny_agent.rs"]
mod tiny_agent;
#[path = "../../envs/tests/support/venv.rs"]
mod venv;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::runtime::{
    Agent, CallLedger, EnvSource, EpisodeRequest, RolloutService, Workflow, WorkflowOutcome,
};
use agent_r1_actors::trajectory::Trajectory;
use agent_r1_envs::call_journal::CallJournal;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{Tool, ToolCall};
use agent_r1_envs::tools::mcp::{connect_tools, McpServerConfig};
use async_trait::async_trait;
use serde_json::{json, Value};
use tiny_agent::{assert_logprobs_match_forward, task, tiny_agent};

const EPISODES: u64 = 8;

/// Two steps, each followed by one `effect` call; the second call of a `-d` task names the
/// workflow's variant. Each answered call is told to `answered` (by then it is journaled).
struct TwoEffects {
    variant: Arc<AtomicU32>,
    answered: tokio::sync::mpsc::UnboundedSender<()>,
}

#[async_trait]
impl Workflow for TwoEffects {
    fn name(&self) -> &str {
        "two_effects"
    }

    async fn run(&self, task: &Task, agent: &Agent) -> agent_r1_actors::Result<WorkflowOutcome> {
        let prompt = agent
            .renderer()
            .prompt(&[Message::user(task.question.clone())])?;
        let first = agent.generate(prompt.clone()).await?;
        let effect = |note: String| {
            vec![Ok(ToolCall {
                name: "effect".into(),
                arguments: json!({ "note": note }),
            })]
        };
        agent
            .call_tools(Some(first.step), effect(format!("{}:first", task.id)))
            .await;
        let _ = self.answered.send(());
        let second = agent.generate(prompt).await?;
        let variant = match task.id.ends_with("-d") {
            true => self.variant.load(Ordering::SeqCst),
            false => 0,
        };
        agent
            .call_tools(
                Some(second.step),
                effect(format!("{}:second:v{variant}", task.id)),
            )
            .await;
        let _ = self.answered.send(());
        Ok(WorkflowOutcome {
            reward: 1.0,
            ..Default::default()
        })
    }
}

fn effect_tool(py: &Path, effects: &Path) -> Arc<dyn Tool> {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../envs/tests/py/mcp_sdk_server.py");
    let mut cfg = McpServerConfig::new(py, &[&script.display().to_string(), "stdio"]);
    cfg.env.insert(
        "AGENT_R1_TEST_EFFECTS".into(),
        effects.display().to_string(),
    );
    cfg.timeout_secs = 60.0;
    cfg.init_timeout_secs = 120.0;
    connect_tools(cfg)
        .unwrap()
        .into_iter()
        .find(|t| t.name() == "effect")
        .expect("the server has `effect`")
}

fn tasks() -> Vec<EpisodeRequest> {
    (0..EPISODES)
        .map(|i| EpisodeRequest {
            task: task(if i % 2 == 0 {
                format!("q{i}")
            } else {
                format!("q{i}-d")
            }),
            group_id: i,
            episode_id: i,
            resume: None,
        })
        .collect()
}

/// The keys in a log of the `effect` tool, with how often each came.
fn keys(path: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        *out.entry(v["key"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    out
}

#[test]
fn calls_made_before_a_crash_are_answered_from_the_journal_and_not_made_again() {
    let Some(py) = venv::python("CALL JOURNAL TEST") else {
        return;
    };
    let f = tiny_agent(1, 512);
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.jsonl");
    let attempts = dir.path().join("effects.jsonl.attempts");
    let journal_path = dir.path().join("tool-calls.jsonl");
    let variant = Arc::new(AtomicU32::new(0));
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = |journal: Arc<CallJournal>| {
        let workflow = Arc::new(TwoEffects {
            variant: variant.clone(),
            answered: answered.clone(),
        });
        let mut setup = f.workflow_setup(workflow.clone(), 1.0, 6, 2);
        setup.env = EnvSource::Workflow {
            workflow,
            tool_names: vec!["effect".into()],
        };
        setup.tools = vec![effect_tool(&py, &effects)];
        setup.calls = CallLedger::journaled(journal);
        setup
    };

    // The first life: stopped once 6 calls are journaled, whatever is in flight then.
    let journal = Arc::new(CallJournal::open(&journal_path, "run-a").unwrap());
    let first_setup = setup(journal.clone());
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let service = RolloutService::start(first_setup, tx).await.unwrap();
        let sender = service.tasks();
        let feed = tokio::spawn(async move {
            for t in tasks() {
                if sender.submit(t).await.is_err() {
                    return;
                }
            }
        });
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        // Six calls answered, so journaled (a bound, not a clock: the wait is for events).
        tokio::time::timeout(Duration::from_secs(600), async {
            for _ in 0..6 {
                answers
                    .recv()
                    .await
                    .expect("the workflow's sender lives in this test");
            }
        })
        .await
        .expect("6 calls answered within 600 s");
        service.abort("a crash (fault injection)");
        let _ = service.finish().await;
        feed.abort();
        drain.abort();
    });
    drop(journal);
    // The crash also cut the journal's last line short.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&journal_path)
            .unwrap();
        f.write_all(br#"{"key":{"run":"run-a","episode":7,"step":"#)
            .unwrap();
    }
    let journaled: Vec<(String, Value)> = std::fs::read_to_string(&journal_path)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| {
            let k = &e["key"];
            let key = format!("run-a/e{}/s{}/c{}", k["episode"], k["step"], k["index"]);
            (key, e["arguments"].clone())
        })
        .collect();
    assert!(journaled.len() >= 6, "{journaled:?}");
    let sent_before = keys(&attempts);

    // The second life: the same episodes from the start; the `-d` tasks' second calls differ.
    variant.store(1, Ordering::SeqCst);
    let journal = Arc::new(CallJournal::open(&journal_path, "run-a").unwrap());
    assert_eq!(journal.len(), journaled.len(), "the cut line was dropped");
    let second_setup = setup(journal.clone());
    let mut trajectories: Vec<Trajectory> = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let service = RolloutService::start(second_setup, tx).await.unwrap();
        let sender = service.tasks();
        for t in tasks() {
            sender.submit(t).await.unwrap();
        }
        drop(sender);
        let collect = tokio::spawn(async move {
            let mut out = vec![];
            while let Some(t) = rx.recv().await {
                out.push(t);
                if out.len() as u64 == EPISODES {
                    break;
                }
            }
            out
        });
        let out = tokio::time::timeout(Duration::from_secs(600), collect)
            .await
            .expect("the second life ends within 600 s")
            .unwrap();
        let report = service.finish().await.unwrap();
        assert_eq!(report.summary.completed, EPISODES, "{report:?}");
        out
    });
    trajectories.sort_by_key(|t| t.episode_id);
    let sent = keys(&attempts);
    let made = keys(&effects);

    // Every journaled call whose episode made it again was answered from the journal: it
    // reached the server once, in the first life.
    let mut replayed = 0;
    for (key, arguments) in &journaled {
        let second_of_d = arguments["note"].as_str().unwrap().contains("-d:second");
        if second_of_d {
            // Made differently this time: a new call, under the next branch.
            assert_eq!(sent[key], 1, "{key}");
            assert_eq!(sent.get(&format!("{key}/b1")), Some(&1), "{key}: {sent:?}");
        } else {
            assert_eq!(sent[key], 1, "{key} was made again: {sent:?}");
            replayed += 1;
        }
    }
    assert!(replayed > 0);
    // Calls in flight at the crash were made again, under the keys they had: the server saw
    // the same key twice and made its effect once.
    let in_flight: Vec<&String> = sent_before
        .keys()
        .filter(|k| !journaled.iter().any(|(j, _)| j == *k))
        .collect();
    for key in &in_flight {
        assert!(sent[*key] <= 2, "{key}: {sent:?}");
    }
    assert!(made.values().all(|&n| n == 1), "{made:?}");
    // Every episode's two calls are in its trajectory, with the outcome the server gave
    // under the call's key (replayed or made).
    for t in &trajectories {
        let calls: Vec<&str> = t
            .steps
            .iter()
            .flat_map(|s| &s.tool_calls)
            .map(|c| c.result.as_ref().unwrap().text.as_str())
            .collect();
        assert_eq!(calls.len(), 2, "episode {}: {calls:?}", t.episode_id);
        for (k, text) in calls.iter().enumerate() {
            let prefix = format!("run-a/e{}/s{k}/c0", t.episode_id);
            assert!(
                text.ends_with(&prefix) || text.ends_with(&format!("{prefix}/b1")),
                "{text}"
            );
        }
        assert_logprobs_match_forward(&f.model, t);
    }
    eprintln!(
        "journaled before the crash: {}; answered from the journal: {replayed}; in flight at the \
         crash and made again: {}; calls the server received: {}, effects: {}",
        journaled.len(),
        in_flight.len(),
        sent.values().sum::<usize>(),
        made.len()
    );
}
