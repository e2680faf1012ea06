//! 256 outside episodes at once through the OpenAI-compatible endpoint, with agent programs
//! killed or hanging (fault injection: `tests/py/flaky_agent.py` kills itself or stops
//! answering on purpose, chosen by a seeded draw). Every episode must end completed or failed
//! with its reason, none lost; no process an agent started may outlive its episode; and the
//! engine must hold nothing for them afterwards.
//!
//! The idle limit is the one short limit: it is what a hanging program meets, and a program
//! that works never waits on itself that long (time its requests spend on the engine does
//! not count).

#[path = "support/tiny_agent.rs"]
mod tiny_agent;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use agent_r1_actors::endpoint::{ExternalAgent, ExternalAgentOptions};
use agent_r1_actors::trajectory::EpisodeEnd;
use agent_r1_envs::task::Task;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;
use tiny_agent::{collect, tiny_agent};

const EPISODES: usize = 256;
const KILLED: usize = 13;
const HANGING: usize = 13;

/// Whether `pid` is a live process (a zombie has ended).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

#[test]
fn killed_and_hanging_agents_fail_or_retry_and_leave_nothing_behind() {
    let f = tiny_agent(64, 512);
    let state = tempfile::tempdir().unwrap();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(python.exists(), "{}: `make venv` first", python.display());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/flaky_agent.py");
    let workflow = Arc::new(
        ExternalAgent::new(ExternalAgentOptions {
            command: vec![python.display().to_string(), script.display().to_string()],
            timeout_secs: 3600.0,
            idle_timeout_secs: 60.0,
            max_processes: EPISODES,
            ..Default::default()
        })
        .unwrap(),
    );

    let mut order: Vec<usize> = (0..EPISODES).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(7));
    let killed: HashSet<usize> = order[..KILLED].iter().copied().collect();
    let hanging: HashSet<usize> = order[KILLED..KILLED + HANGING].iter().copied().collect();
    let tasks = (0..EPISODES)
        .map(|i| {
            let mode = if killed.contains(&i) {
                "killed"
            } else if hanging.contains(&i) {
                "hang"
            } else {
                "ok"
            };
            let task = Task {
                id: format!("task-{i}"),
                data_source: "test".into(),
                question: format!("What is item {i}?"),
                answers: vec![],
                prompt: None,
                extra: json!({"mode": mode, "state_dir": state.path()}),
            };
            (task, i as u64)
        })
        .collect();
    let setup = f.workflow_setup(workflow, 1.0, 8, EPISODES);
    let (report, trajectories) = collect(setup, tasks);

    // Every episode ended, once.
    assert_eq!(trajectories.len(), EPISODES, "{:?}", report.summary);
    let mut seen = HashSet::new();
    for t in &trajectories {
        let i: usize = t.task.id.trim_start_matches("task-").parse().unwrap();
        assert!(seen.insert(i), "episode {i} delivered twice");
        match (&t.end, killed.contains(&i)) {
            (EpisodeEnd::Failed { reason }, true) => {
                assert!(reason.contains("exited with signal: 9"), "{i}: {reason}")
            }
            (EpisodeEnd::Completed { .. }, false) => {
                // A hanging program's episode was retried and completed; two requests each.
                assert_eq!(t.steps.len(), 2, "episode {i}");
                assert_eq!(t.reward, 1.0);
            }
            (end, k) => panic!("episode {i} (killed: {k}) ended {end:?}"),
        }
    }
    // Every hanging program was taken as hung on its first run.
    for &i in &hanging {
        assert!(
            state.path().join(format!("task-{i}.hung")).exists(),
            "task {i} did not hang"
        );
    }
    // No process an agent started is alive: the programs, and the helpers they left behind
    // (every program's helper outlives the program itself unless its group is killed).
    let mut runs = 0;
    for entry in std::fs::read_dir(state.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("pids") {
            continue;
        }
        runs += 1;
        for pid in std::fs::read_to_string(&path).unwrap().split_whitespace() {
            let pid: u32 = pid.parse().unwrap();
            assert!(
                !alive(pid),
                "{}: process {pid} outlived its episode",
                path.display()
            );
        }
    }
    // Killed programs ran twice (the episode was retried once), hanging ones twice.
    assert_eq!(runs, EPISODES + KILLED + HANGING);
    // The engine holds nothing for them: every episode's KV was released.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stats = rt.block_on(f.engine.stats()).unwrap();
    assert_eq!(stats.parked_episodes, 0);
}
