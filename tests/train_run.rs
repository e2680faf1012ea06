//! `agent-r1 train` end to end through the binary, on a tiny config (fresh tiny model, no
//! warm start, a 40-question world): a whole run writes its logs, checkpoints, rollouts and
//! curves; a SIGTERM mid-batch saves the sampled trajectories in the checkpoint and a restart
//! trains on them; a kill -9 after a checkpoint, then a restart, continues from that
//! checkpoint with the same step count; a SIGTERM during a (long) warm start ends the process
//! cleanly at the next step.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[path = "support/png_text.rs"]
mod png_text;
#[path = "support/tiny_run.rs"]
mod tiny_run;
#[path = "support/trainer.rs"]
mod trainer;

use tiny_run::tiny_config;

use trainer::{http_get, Trainer};

fn config(dir: &Path, updates: u64, batch: usize, concurrency: usize, every: u64) -> PathBuf {
    let text = format!(
        r#"{base}
[checkpoint]
every = {every}
keep_last = 2

[eval]
every = {every}
questions = 4

[metrics]
address = "127.0.0.1:0"
"#,
        base = tiny_config(dir, updates, batch, concurrency),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn steps(rows: &[Value]) -> Vec<u64> {
    rows.iter().map(|v| v["step"].as_u64().unwrap()).collect()
}

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("a summary line")).unwrap()
}

fn manifest(run: &Path, step: u64) -> Value {
    let text = std::fs::read_to_string(run.join(format!("checkpoints/step-{step}/manifest.json")))
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn train_runs_end_to_end_and_writes_logs_checkpoints_and_curves() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 4, 2, 4, 2);
    let run = tmp.path().join("run");
    let mut t = Trainer::start(&cfg, &run, false);
    // The Prometheus endpoint answers during the run, with the training series.
    let line = t.wait_line(|l| l.starts_with("metrics: http://"));
    let addr = line
        .trim_start_matches("metrics: http://")
        .trim_end_matches("/metrics")
        .to_string();
    t.wait_line(|l| l.starts_with("update    1/"));
    let body = http_get(&addr, "/metrics");
    assert!(body.contains("agent_r1_train_update_step"), "{body}");
    assert!(body.contains("agent_r1_engine_"), "{body}");
    assert!(http_get(&addr, "/healthz").contains("200"));
    // The web UI is on the same address while the run goes on.
    let page = http_get(&addr, "/ui");
    assert!(
        page.contains("200") && page.contains("Training curves"),
        "{page}"
    );
    let (code, out, err) = t.finish();
    assert_eq!(code, Some(0), "{err}");
    let summary = last_json(&out);
    assert_eq!(summary["updates"], 4, "{summary}");
    assert_eq!(summary["interrupted"], false);
    assert!(summary["em_before"].is_number() && summary["em_after"].is_number());

    assert_eq!(steps(&jsonl(&run.join("metrics.jsonl"))), vec![1, 2, 3, 4]);
    assert_eq!(steps(&jsonl(&run.join("eval.jsonl"))), vec![0, 2, 4]);
    for row in jsonl(&run.join("metrics.jsonl")) {
        assert_eq!(row["episodes"], 4, "2 tasks x group 2: {row}");
        assert!(row["reward_mean"].is_number() && row["policy_loss"].is_number());
    }
    for step in [2, 4] {
        let m = manifest(&run, step);
        assert_eq!(m["complete"], true);
        assert_eq!(m["state"]["step"], step);
        assert_eq!(m["state"]["data_position"], step * 2);
        assert!(run
            .join(format!("checkpoints/step-{step}/policy/model.safetensors"))
            .is_file());
    }
    png_text::assert_png_has_text(&run.join("curves.png"));
    let svg = std::fs::read_to_string(run.join("curves.svg")).unwrap();
    assert!(
        svg.contains("held-out EM") && svg.contains("update"),
        "{svg}"
    );
    let rollouts: Vec<_> = std::fs::read_dir(run.join("rollouts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        rollouts.contains(&"train-step-000004.jsonl".to_string()),
        "{rollouts:?}"
    );
    assert!(
        rollouts.contains(&"eval-step-000004.jsonl".to_string()),
        "{rollouts:?}"
    );

    // Running the finished run again resumes at step 4 and has nothing left to do.
    let (code, out, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("resumed from step 4"), "{err}");
    assert_eq!(last_json(&out)["updates"], 4);
    assert_eq!(steps(&jsonl(&run.join("metrics.jsonl"))), vec![1, 2, 3, 4]);
}

#[test]
fn sigterm_saves_pending_trajectories_and_kill_9_resumes_at_the_checkpoint_step() {
    let tmp = tempfile::tempdir().unwrap();
    // 8 tasks per update, one task (2 episodes) in flight at a time, so a signal lands
    // between the groups of a batch; a checkpoint after every update.
    let (batch, updates) = (8u64, 6u64);
    let cfg = config(tmp.path(), updates, batch as usize, 2, 1);
    let run = tmp.path().join("run");

    // 1. SIGTERM after the first group of update 2: the groups already fed finish, nothing
    //    new is fed, and the checkpoint at step 1 holds what was sampled for update 2.
    let mut t = Trainer::start(&cfg, &run, false);
    t.wait_line(|l| l.starts_with("sample update 2: 1/8"));
    t.signal("TERM");
    let (code, out, err) = t.finish();
    assert_eq!(code, Some(0), "{err}");
    let summary = last_json(&out);
    assert_eq!(summary["interrupted"], true, "{summary}");
    assert_eq!(summary["updates"], 1);
    let pending = summary["pending_trajectories"].as_u64().unwrap();
    assert!(pending >= 2 && pending < 2 * batch, "{summary}");
    let m = manifest(&run, 1);
    assert_eq!(m["state"]["step"], 1);
    assert_eq!(m["state"]["data_position"], batch + pending / 2);
    assert!(
        run.join("checkpoints/step-1/pending_trajectories.jsonl")
            .is_file(),
        "{m}"
    );

    // 2. Restart: resumes at step 1 with the pending trajectories, and update 2 trains on a
    //    full batch (the saved episodes plus the rest). Then kill -9 after checkpoint 3.
    let mut t = Trainer::start(&cfg, &run, true);
    let resumed = t.wait_line(|l| l.starts_with("resumed from step"));
    assert!(
        resumed.starts_with("resumed from step 1 ")
            && resumed.contains(&format!("{pending} pending trajectories")),
        "{resumed}"
    );
    t.wait_line(|l| l.starts_with("checkpoint step 3 "));
    t.signal("KILL");
    let (code, _, err) = t.finish();
    assert_ne!(code, Some(0), "{err}");
    let rows = jsonl(&run.join("metrics.jsonl"));
    let row2 = rows.iter().find(|r| r["step"] == 2).unwrap();
    assert_eq!(row2["episodes"], batch * 2, "saved + new episodes: {row2}");
    assert_eq!(row2["data_position"], 2 * batch);

    // 3. Restart after the kill: continues from the newest complete checkpoint (3, or 4 if
    //    it was committed before the kill landed) with the same step count, to the end.
    let newest = (3..=updates)
        .rev()
        .find(|s| {
            run.join(format!("checkpoints/step-{s}/manifest.json"))
                .is_file()
        })
        .unwrap();
    let (code, out, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("resumed from step {newest} ")),
        "newest checkpoint {newest}: {err}"
    );
    assert!(
        err.contains("AdamW state restored from optimizer.safetensors"),
        "the optimizer's moments must come back too: {err}"
    );
    let files = manifest(&run, updates)["files"].to_string();
    assert!(files.contains("optimizer.safetensors"), "{files}");
    let summary = last_json(&out);
    assert_eq!(summary["updates"], updates);
    assert_eq!(summary["interrupted"], false);
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(
        steps(&rows),
        (1..=updates).collect::<Vec<_>>(),
        "each step once"
    );
    for r in &rows {
        let s = r["step"].as_u64().unwrap();
        assert_eq!(r["data_position"], s * batch, "{r}");
        assert_eq!(r["episodes"], batch * 2, "{r}");
    }
    assert_eq!(manifest(&run, updates)["state"]["step"], updates);
}

#[test]
fn ppo_with_a_separate_critic_trains_checkpoints_and_resumes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 3, 2, 4, 2);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            "estimator = \"grpo\"",
            "estimator = \"gae\"\ncritic_lr = 1e-3\ncritic_warmup_updates = 1",
        )
        .replace("[rollout]", "[critic]\nseparate = true\n\n[rollout]")
        // The memory knobs through `train`: both models recompute their layers, micro-batches
        // are packed by tokens, logits come 64 positions at a time.
        .replace(
            "[rollout]",
            "[learner]\nrecompute = true\nmax_tokens_per_micro_batch = 2048\n\
             logits_chunk_tokens = 64\n\n[rollout]",
        );
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (code, out, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(last_json(&out)["updates"], 3);
    let saved = std::fs::read_to_string(run.join("checkpoints/step-2/config.toml")).unwrap();
    assert!(
        saved.contains("recompute = true") && saved.contains("max_tokens_per_micro_batch = 2048"),
        "{saved}"
    );
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(steps(&rows), vec![1, 2, 3]);
    assert!(rows.iter().all(|r| r["value_loss"].is_number()), "{rows:?}");
    // The critic is a model of its own beside the policy, which has no value head.
    let policy = run.join("checkpoints/step-2/policy");
    assert!(policy.join("critic/model.safetensors").is_file());
    let weights = std::fs::read(policy.join("model.safetensors")).unwrap();
    assert!(!String::from_utf8_lossy(&weights[..4096.min(weights.len())]).contains("value_head"));
    let critic = std::fs::read(policy.join("critic/model.safetensors")).unwrap();
    assert!(String::from_utf8_lossy(&critic).contains("value_head.weight"));

    // A resume loads the critic from the checkpoint.
    let cfg_more = tmp.path().join("more.toml");
    std::fs::write(
        &cfg_more,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("updates = 3", "updates = 4"),
    )
    .unwrap();
    let (code, out, err) = Trainer::start(&cfg_more, &run, true).finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("resumed from step 3"), "{err}");
    assert!(
        err.contains("critic: a separate model, from ") && err.contains("step-3/policy/critic"),
        "{err}"
    );
    assert_eq!(last_json(&out)["updates"], 4);
}

#[test]
fn async_mode_samples_the_next_batch_during_the_update_and_checkpoints_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 4, 2, 4, 2);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("updates = 4", "updates = 4\nmode = \"async\"");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (code, out, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(last_json(&out)["updates"], 4);
    // While update 2 trained, the batch of update 3 was fed (one batch ahead) and update 4's
    // once it was published: the checkpoint holds every task fed past update 2's batches,
    // either as complete groups (pending) or as groups in flight (sampled again on resume).
    let m = manifest(&run, 2);
    let position = m["state"]["data_position"].as_u64().unwrap();
    assert!((6..=8).contains(&position), "{m}");
    let mut groups: Vec<u64> = m["state"]["requeue_positions"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
        .unwrap_or_default();
    let pending = run.join("checkpoints/step-2/pending_trajectories.jsonl");
    if pending.is_file() {
        for t in jsonl(&pending) {
            groups.push(t["group_id"].as_u64().unwrap());
        }
    }
    groups.sort_unstable();
    groups.dedup();
    assert_eq!(groups, (4..position).collect::<Vec<_>>(), "{m}");
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(steps(&rows), vec![1, 2, 3, 4]);
    assert!(rows.iter().all(|r| r["episodes"] == 4), "{rows:?}");
    // One batch ahead: no token is more than one version old, so none is dropped.
    for r in &rows {
        assert!(r["staleness_max"].as_u64().unwrap() <= 1, "{r}");
        assert_eq!(r["stale_tokens_dropped"], 0, "{r}");
    }
}

#[test]
fn sigterm_during_the_warm_start_stops_at_the_next_step_and_saves_no_model() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 2, 2, 2, 1);
    // A warm start far longer than the test waits: only the signal can end it in time.
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[warm_start]\nsteps = 100000\nbatch_size = 2\n");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let mut t = Trainer::start(&cfg, &run, false);
    t.wait_line(|l| l.trim_start().starts_with("sft step    0"));
    t.signal("TERM");
    let (code, out, err) = t.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("interrupted during the warm start"), "{err}");
    let summary = last_json(&out);
    assert_eq!(summary["interrupted"], true, "{summary}");
    assert_eq!(summary["updates"], 0, "{summary}");
    assert_eq!(summary["warm_start"]["interrupted"], true, "{summary}");
    let steps = summary["warm_start"]["steps"].as_u64().unwrap();
    assert!((1..100000).contains(&steps), "{summary}");
    // A part-way warm start is not saved (a restart redoes it), and no checkpoint exists.
    assert!(!run.join("model-sft/config.json").exists());
    assert!(!run.join("checkpoints").join("step-1").exists());
}

/// A SIGTERM while an MCP server's handshake is pending (the server, `sleep`, never answers;
/// the handshake would wait 600 s) ends the run at once: exit 0, nothing trained, the server
/// killed.
/// Sends SIGTERM to a run still building its tools, and requires it to end at once, cleanly,
/// with an interrupted summary and no update.
fn stop_while_building_tools(t: Trainer) {
    t.signal("TERM");
    let (code, out, err) = t.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("stopped by a signal while building the env and tools"),
        "{err}"
    );
    let summary = last_json(&out);
    assert_eq!(summary["interrupted"], true, "{summary}");
    assert_eq!(summary["updates"], 0, "{summary}");
}

#[test]
fn sigterm_during_a_pending_mcp_handshake_stops_at_once_and_kills_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 2, 2, 2, 1);
    // The server writes its pid into a FIFO, then becomes `sleep` (same pid): the test learns
    // that the handshake is pending by a blocking read, not by polling.
    let fifo = tmp.path().join("started");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let script = format!("echo $$ > '{}'; exec sleep 3600", fifo.display());
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "\n[tools.silent]\ntype = \"mcp\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\ninit_timeout_secs = 600\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (tx, started) = std::sync::mpsc::channel();
    std::thread::spawn({
        let fifo = fifo.clone();
        move || {
            let _ = tx.send(std::fs::read_to_string(fifo).unwrap_or_default());
        }
    });
    let t = Trainer::start(&cfg, &run, false);
    let server: u32 = started
        .recv_timeout(trainer::PHASE_TIMEOUT)
        .expect("the server starts within the phase timeout")
        .trim()
        .parse()
        .unwrap();
    stop_while_building_tools(t);
    let state = std::fs::read_to_string(format!("/proc/{server}/stat")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains(") Z "),
        "the server outlived the run: {state}"
    );
}

/// The same over Streamable HTTP: the server (a listener of this test) takes the connection
/// and never answers `initialize`. A blocking HTTP request cannot be interrupted, so the
/// handshake runs on a thread of its own that `train` stops waiting for on the signal.
#[test]
fn sigterm_during_a_pending_http_mcp_handshake_stops_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 2, 2, 2, 1);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "\n[tools.silent]\ntype = \"mcp\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ninit_timeout_secs = 600\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (tx, connected) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Held open, never answered, until the test ends.
        let _ = tx.send(listener.accept().map(|(stream, _)| stream));
    });
    let t = Trainer::start(&cfg, &run, false);
    let _held = connected
        .recv_timeout(trainer::PHASE_TIMEOUT)
        .expect("train connects within the phase timeout")
        .unwrap();
    stop_while_building_tools(t);
}

/// A batch with nothing to train on (here every prompt is longer than the context, so each
/// episode ends before its first turn) skips its update with a warning and a counted
/// reason; the run goes on to its last update and exits 0.
#[test]
fn an_empty_batch_skips_the_update_and_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 2, 2, 4, 0);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_context_length = 1024", "max_context_length = 64")
        .replace("max_prompt_length = 384", "max_prompt_length = 48");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (code, out, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(last_json(&out)["updates"], 2);
    assert!(
        err.contains("update skipped") && err.contains("empty_batch"),
        "{err}"
    );
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(steps(&rows), vec![1, 2]);
    assert!(
        rows.iter().all(|r| r["skipped"] == "empty_batch"),
        "{rows:?}"
    );
}

#[test]
fn a_failed_checkpoint_write_is_retried_then_skipped_keeping_the_older_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 3, 2, 4, 1);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("keep_last = 2", "keep_last = 2\nretries = 1");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let t = Trainer::start(&cfg, &run, false);
    // A real failure, not a mock: a file where checkpoint 2 of this process would create its
    // temporary directory (`.tmp-step-2-PID`), so every attempt at it fails.
    let checkpoints = run.join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    std::fs::write(
        checkpoints.join(format!(".tmp-step-2-{}", t.child.id())),
        "in the way",
    )
    .unwrap();
    let (code, out, err) = t.finish();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(last_json(&out)["updates"], 3);
    assert!(
        err.contains("checkpoint step 2 failed (attempt 1 of 2)"),
        "{err}"
    );
    assert!(
        err.contains("ALERT: checkpoint step 2 skipped after 2 attempts")
            && err.contains("the newest checkpoint is still step 1"),
        "{err}"
    );
    assert!(
        checkpoints.join("step-1").is_dir(),
        "the older checkpoint is kept"
    );
    assert!(!checkpoints.join("step-2").exists());
    assert!(checkpoints.join("step-3").is_dir());
    assert_eq!(manifest(&run, 3)["state"]["step"], 3);
}

/// Also the engine actor's restart, end to end: once the first update is published, both
/// engine threads panic at their next decode step (fault injection); each is restarted, holds
/// its turns until the learner sends it version 1 again, and the run finishes on-policy.
#[test]
fn two_engines_on_the_cpu_train_end_to_end_both_sample_and_survive_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 2, 2, 4, 2);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "concurrency = 4",
        "concurrency = 4\ndevices = [\"cpu\", \"cpu\"]",
    );
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let (code, out, err) =
        Trainer::start_with(&cfg, &run, &["--inject-engine-panic-after", "1"]).finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("engine 0 on cpu") && err.contains("engine 1 on cpu"),
        "{err}"
    );
    assert!(
        err.contains("restarted; weights version 1 sent to it again"),
        "{err}"
    );
    let summary = last_json(&out);
    assert_eq!(summary["updates"], 2);
    let engines = summary["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 2, "{summary}");
    for e in engines {
        assert!(e["episodes"].as_u64().unwrap() > 0, "{summary}");
        assert!(e["turns"].as_u64().unwrap() > 0, "{summary}");
        assert_eq!(e["restarts"], 1, "{summary}");
    }
    let rows = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(steps(&rows), vec![1, 2]);
    for row in &rows {
        // No token of update 2 was sampled by a restarted engine's reloaded start weights.
        assert_eq!(row["staleness_max"], 0, "{row}");
        assert_eq!(row["stale_tokens_dropped"], 0, "{row}");
    }
}

/// A rollout that fails as a whole ends the run with its reason: once the first update is
/// published, the engine stops for good (fault injection, as one past its restart policy
/// does). The sampler waits on trajectories from a channel it also holds a sender of, so it
/// must see the service's end itself rather than wait for the channel to close.
#[test]
fn a_rollout_that_stops_for_good_ends_the_run_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 3, 2, 4, 10);
    let run = tmp.path().join("run");
    let (code, _, err) =
        Trainer::start_with(&cfg, &run, &["--inject-engine-stop-after-update"]).finish();
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("the rollout stopped"), "{err}");
    assert!(err.contains("inference engine stopped"), "{err}");
}

/// The run directory's id and tool-call journal: a journal line that is not an entry refuses
/// the start in one line naming the file and the line, before anything is built; a last line
/// cut short by a crash is dropped and the run goes on, under the id it already had.
#[test]
fn a_corrupt_call_journal_refuses_the_start_and_a_cut_last_line_is_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 1, 2, 2, 1);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("run-id"), "run-abc\n").unwrap();
    let journal = run.join("tool-calls.jsonl");
    std::fs::write(
        &journal,
        "{\"key\": 1}\n{\"key\":{\"run\":\"run-abc\",\"epi",
    )
    .unwrap();
    let (code, _, err) = Trainer::start(&cfg, &run, false).finish();
    assert_ne!(code, Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("tool-calls.jsonl"))
        .unwrap_or_else(|| panic!("no line names the journal: {err}"));
    assert!(line.contains(&journal.display().to_string()), "{line}");
    assert!(
        line.contains("line 1") && line.contains("not a journal entry"),
        "{line}"
    );
    assert!(
        !run.join("checkpoints").exists(),
        "nothing was built: {err}"
    );

    std::fs::write(&journal, "{\"key\":{\"run\":\"run-abc\",\"epi").unwrap();
    let (code, _, err) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("cut short by a crash"), "{err}");
    assert_eq!(
        std::fs::read_to_string(run.join("run-id")).unwrap(),
        "run-abc\n"
    );
    // What remains reads as a journal of this run (the cut line is gone).
    agent_r1_envs::call_journal::CallJournal::open(&journal, "run-abc").unwrap();
}

/// A checkpoint whose episodes in flight cannot be read refuses the resume in one line naming
/// the file and the line (the file here matches the manifest: its bytes are what the
/// checkpoint wrote, but not episodes; a file that does not match the manifest makes the
/// whole checkpoint damaged, and the one before it is used).
#[test]
fn an_unreadable_in_flight_section_refuses_the_resume_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let (code, _, err) = Trainer::start(&config(tmp.path(), 1, 2, 2, 1), &run, false).finish();
    assert_eq!(code, Some(0), "{err}");
    let step = run.join("checkpoints/step-1");
    let file = step.join(agent_r1::checkpoint::IN_FLIGHT_EPISODES);
    std::fs::write(&file, "{\"episode_id\": 3}\n").unwrap();
    let (size, sha256) = agent_r1::file_digest::sha256_file(&file).unwrap();
    let mut m = manifest(&run, 1);
    m["files"].as_array_mut().unwrap().push(serde_json::json!({
        "path": agent_r1::checkpoint::IN_FLIGHT_EPISODES,
        "size": size,
        "sha256": sha256,
    }));
    std::fs::write(step.join("manifest.json"), m.to_string()).unwrap();

    let (code, _, err) = Trainer::start(&config(tmp.path(), 2, 2, 2, 1), &run, true).finish();
    assert_ne!(code, Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("in_flight_episodes.jsonl"))
        .unwrap_or_else(|| panic!("no line names the file: {err}"));
    assert!(line.contains(&file.display().to_string()), "{line}");
    assert!(
        line.contains("line 1") && line.contains("not an in-flight episode"),
        "{line}"
    );
}
