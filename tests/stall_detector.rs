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
