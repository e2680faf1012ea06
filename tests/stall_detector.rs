//! The stall detector through the `train` binary: for each stage, an injected hang (a test
//! double, `train --inject-hang STAGE`: a tool that blocks its thread, an env that never
//! scores, an engine that stops stepping, a learner that never returns, a publication that
//! never completes, a checkpoint write that blocks) is reported with the stage and the stuck
//! item named, no earlier than the stage's deadline, and the run exits with code 3 and that
//! line (`stall.fail_run`, the default). With `fail_run = false` the stall is only reported:
//! `/healthz` turns 503 naming it, and the metrics count it.
//!
//! Nothing here waits on a clock: each step waits for the line the process prints, bounded
//! only against hanging forever. The reported delay past the deadline is printed as a figure.

use std::path::{Path, PathBuf};

#[path = "support/trainer.rs"]
mod trainer;

use trainer::{http_get, Trainer};

/// The deadline of the stage under test; every other stage keeps its default (minutes), so
/// a loaded machine cannot make another stage look stuck first.
const DEADLINE_SECS: f64 = 2.0;

fn config(dir: &Path, key: &str, fail_run: bool) -> PathBuf {
    let text = format!(
        r#"
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
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
batch_size = 2
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 16
max_context_length = 1024
concurrency = 4

[training]
updates = 3

[checkpoint]
every = 1

[eval]
every = 0

[metrics]
address = "127.0.0.1:0"

[stall]
fail_run = {fail_run}
{key} = {DEADLINE_SECS}
"#
    );
    let path = dir.join(format!("{key}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `... made no progress for 2.3 s (deadline 2.0 s)` -> (2.3, 2.0).
fn reported_times(line: &str) -> (f64, f64) {
    let after = |marker: &str| -> f64 {
        let rest = &line[line
            .find(marker)
            .unwrap_or_else(|| panic!("{marker} in {line}"))
            + marker.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    (after("made no progress for "), after("(deadline "))
}

#[test]
fn each_stage_that_hangs_is_named_within_its_deadline_and_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // (flag value, deadline key, the stage and stuck item the report must name)
    let cases = [
        ("tool", "tool_secs", "stuck stage: tool search: call search"),
        ("env", "env_secs", "stuck stage: env: episode "),
        (
            "engine",
            "engine_secs",
            "stuck stage: engine: the decode loop (",
        ),
        ("learner", "learner_secs", "stuck stage: learner: update 1 "),
        (
            "publication",
            "publish_secs",
            "stuck stage: publication: the weights of update 1 ",
        ),
        (
            "checkpoint",
            "checkpoint_secs",
            "stuck stage: checkpoint: writing checkpoint step 1 ",
        ),
    ];
    let mut figures = Vec::new();
    for (stage, key, named) in cases {
        let cfg = config(dir.path(), key, true);
        let out = dir.path().join(format!("run-{stage}"));
        let trainer = Trainer::start_with(&cfg, &out, &["--inject-hang", stage]);
        let (code, _stdout, log) = trainer.finish();
        let failed = log
            .lines()
            .find(|l| l.starts_with("the run fails: "))
            .unwrap_or_else(|| panic!("{stage}: no failing line; log:\n{log}"));
        assert!(
            failed.contains(named) && failed.ends_with("(stall.fail_run = true)"),
            "{stage}: {failed}"
        );
        assert_eq!(code, Some(3), "{stage}: exit code; log:\n{log}");
        // Only the injected stage stalled.
        let stalls: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("stuck stage: "))
            .collect();
        assert!(
            stalls.iter().all(|l| l.contains(named)),
            "{stage}: another stage reported: {stalls:#?}"
        );
        let (stuck_for, deadline) = reported_times(failed);
        assert_eq!(deadline, DEADLINE_SECS, "{stage}: {failed}");
        assert!(stuck_for >= deadline, "{stage}: reported early: {failed}");
        figures.push(format!("{stage} {:.2} s", stuck_for - deadline));
    }
    println!(
        "reported after the deadline by (the watchdog looks every deadline/4): {}",
        figures.join(", ")
    );
}

#[test]
fn a_stall_that_does_not_fail_the_run_turns_healthz_unhealthy_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "learner_secs", false);
    let out = dir.path().join("run");
    let mut trainer = Trainer::start_with(&cfg, &out, &["--inject-hang", "learner"]);
    let addr = trainer
        .wait_line(|l| l.starts_with("metrics: http://"))
        .trim_start_matches("metrics: http://")
        .trim_end_matches("/metrics")
        .to_string();
    let stall = trainer.wait_line(|l| l.contains("stuck stage: learner: update 1 "));
    assert!(!stall.contains("the run fails"), "{stall}");
    // The watchdog publishes a stall before it logs it, so /healthz already says so.
    let health = http_get(&addr, "/healthz");
    assert!(
        health.starts_with("HTTP/1.1 503") || health.starts_with("HTTP/1.0 503"),
        "{health}"
    );
    assert!(
        health.contains("stalled: stuck stage: learner: update 1 made no progress"),
        "{health}"
    );
    let metrics = http_get(&addr, "/metrics");
    assert!(
        metrics.contains("agent_r1_stalls_total{stage=\"learner\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("agent_r1_stalled{stage=\"learner\"} 1"),
        "{metrics}"
    );
    // The run keeps waiting on the stuck learner; a signal still stops it.
    assert!(
        trainer.child.try_wait().unwrap().is_none(),
        "the run went on"
    );
    trainer.signal("KILL");
    let _ = trainer.finish();
}

/// The shipped systemd unit's restart rules and command line, read from
/// `deploy/agent-r1.service` so that the test below plays exactly its part.
struct Unit {
    /// `ExecStart`'s arguments after the program.
    args: Vec<String>,
    /// `Restart=on-failure`.
    restarts_on_failure: bool,
    /// `RestartPreventExitStatus=`.
    prevented: Vec<i32>,
}

impl Unit {
    fn shipped() -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/agent-r1.service");
        let text = std::fs::read_to_string(&path).unwrap();
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{}: no {key}=", path.display()))
                .to_string()
        };
        let exec = value("ExecStart");
        let mut words = exec.split_whitespace().map(str::to_string);
        let program = words.next().unwrap();
        assert!(program.ends_with("/agent-r1"), "{exec}");
        Self {
            args: words.collect(),
            restarts_on_failure: value("Restart") == "on-failure",
            prevented: value("RestartPreventExitStatus")
                .split_whitespace()
                .map(|c| c.parse().unwrap())
                .collect(),
        }
    }

    /// Its arguments with the test's config and run directory for its paths.
    fn args_for(&self, config: &Path, out: &Path) -> Vec<String> {
        let mut args = self.args.clone();
        for (flag, value) in [("--config", config), ("--out", out)] {
            let at = args.iter().position(|a| a == flag).unwrap() + 1;
            args[at] = value.display().to_string();
        }
        args
    }

    /// Whether systemd starts the service again after it exited with `code` (`None`:
    /// killed by a signal, which `on-failure` restarts).
    fn restarts_after(&self, code: Option<i32>) -> bool {
        match code {
            Some(0) => false,
            Some(c) if self.prevented.contains(&c) => false,
            _ => self.restarts_on_failure,
        }
    }
}

/// Crash-only operation: a hung engine thread (injected after two updates and their
/// checkpoints) ends the run with the stage named and exit code 3; the test, playing the
/// shipped unit, starts its command again, and the run resumes from its newest checkpoint
/// and completes every update exactly once. A config mistake (exit 2) is not restarted.
#[test]
fn the_shipped_unit_restarts_a_stalled_run_which_resumes_and_completes() {
    let unit = Unit::shipped();
    assert!(unit.restarts_after(Some(3)) && unit.restarts_after(None));
    let dir = tempfile::tempdir().unwrap();
    // A deadline far above a decode step on a loaded machine, so only the injected hang
    // stalls the engine.
    let cfg = config(dir.path(), "engine_secs", true);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text.replace(
        &format!("engine_secs = {DEADLINE_SECS}\n"),
        "engine_secs = 20\n",
    );
    assert!(text.contains("engine_secs = 20\n"), "{text}");
    std::fs::write(&cfg, text).unwrap();
    let out = dir.path().join("run");

    let missing = dir.path().join("absent.toml");
    let (code, _, log) = Trainer::command(&unit.args_for(&missing, &out)).finish();
    assert_eq!(code, Some(2), "{log}");
    assert!(
        !unit.restarts_after(code),
        "a config mistake is not restarted"
    );

    let mut starts = 0;
    let mut logs = Vec::new();
    loop {
        starts += 1;
        assert!(
            starts <= 3,
            "still not done after {} starts:\n{}",
            starts - 1,
            logs.join("\n---\n")
        );
        let mut args = unit.args_for(&cfg, &out);
        if starts == 1 {
            args.extend(["--inject-engine-hang-after-updates".into(), "2".into()]);
        }
        let (code, _, log) = Trainer::command(&args).finish();
        logs.push(log.clone());
        if starts == 1 {
            assert_eq!(code, Some(3), "{log}");
            let failed = log
                .lines()
                .find(|l| l.starts_with("the run fails: "))
                .unwrap_or("");
            assert!(
                failed.contains("stuck stage: engine: the decode loop ("),
                "{log}"
            );
        }
        if !unit.restarts_after(code) {
            assert_eq!(code, Some(0), "{log}");
            break;
        }
    }
    assert_eq!(starts, 2, "one restart");
    assert!(logs[1].contains("resumed from step 2"), "{}", logs[1]);
    let steps: Vec<u64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, vec![1, 2, 3], "every update once, none lost");
}
