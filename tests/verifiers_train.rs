//! `agent-r1 train` on a `verifiers` environment (`tests/py/vf_digits_env.py`, a tool
//! environment with one Python tool, defined with the `verifiers` package) through the
//! shipped helper `python/agent_r1_verifiers.py`, which the run starts as its agent service
//! (`examples/verifiers.toml`): the environment's own agent loop plays each episode against
//! the OpenAI-compatible endpoint, its rubric scores it, and the reward must rise. When the
//! run ends, nothing it started is left running.

use std::path::Path;
use std::process::Command;

#[path = "support/run_log.rs"]
mod run_log;

use run_log::{assert_reward_rose, jsonl};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Processes whose command line holds `needle`.
fn processes_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Waits for `pid` to exit (a pidfd turns readable when it has), at most a bound that only a
/// process left running reaches; false if it is still running then.
fn exits(pid: i32) -> bool {
    // SAFETY: pidfd_open returns a new descriptor (or -1) and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return true; // gone already
    }
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the descriptor is ours and closed after.
    let ready = unsafe { libc::poll(&mut poll, 1, 120_000) };
    unsafe { libc::close(fd) };
    ready == 1
}

#[test]
fn train_on_a_verifiers_environment_raises_its_rubric_reward() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = run_log::train(ROOT, Path::new("examples/verifiers.toml"), &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(rows.len(), 20, "twenty updates");
    for row in &rows {
        // 8 tasks x group 4, every episode played and scored by the environment.
        assert_eq!(row["episodes"], 32, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        // The reward is the rubric's: its one reward function, `digits`.
        let digits = row["metrics"]["digits"].as_f64().unwrap();
        assert!(
            (row["reward_mean"].as_f64().unwrap() - digits).abs() < 1e-9,
            "{row}"
        );
        assert!(row["metrics"]["turns"].as_f64().unwrap() >= 1.0, "{row}");
    }
    assert_reward_rose(&rows, "the rubric's reward");
    // Each completion the environment's loop asked for is a step, rendered with the
    // environment's tool in the prompt.
    let episodes = jsonl(&run.join("rollouts/train-step-000020.jsonl"));
    assert!(!episodes.is_empty());
    for e in &episodes {
        let steps = e["steps"].as_array().unwrap();
        assert_eq!(
            e["metrics"]["turns"].as_f64().unwrap(),
            steps.len() as f64,
            "{e}"
        );
    }
    let text = std::fs::read_to_string(run.join("rollouts/train-step-000020.jsonl")).unwrap();
    assert!(
        text.contains("count_digits"),
        "the tool spec is in the prompt"
    );
    // The service and the environment's tool server ended with the run.
    for needle in [
        "python/agent_r1_verifiers.py",
        "-m vf_digits_env",
        "vf_digits_env",
    ] {
        for pid in processes_with(needle) {
            assert!(exits(pid), "{needle} (pid {pid}) outlived the run");
        }
    }
}

#[test]
fn check_config_refuses_a_service_command_beside_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(ROOT).join("examples/verifiers.toml")).unwrap();
    let text = text.replace(
        "timeout_secs = 600\n",
        "timeout_secs = 600\ncommand = [\"python3\", \"agent.py\"]\n",
    );
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .arg("check-config")
        .arg(&config)
        .current_dir(ROOT)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("env.options.service_command") && stderr.contains("set with command"),
        "{stderr}"
    );
}
