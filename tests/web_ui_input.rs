//! `agent-r1 view` on run directories made by the test: bad input gets a clear page or line
//! (a missing or damaged run directory, truncated JSON lines, an index that points past its
//! data, an unknown update or row), the server binds loopback by default and refuses every
//! path outside its pages; and a run of 100,000 synthetic episodes lists its first page from
//! the index (the time is printed as a benchmark figure, not asserted). The synthetic
//! episodes have the demo's sizes (3 turns after a 300-token prompt), without decoded text.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

#[path = "support/http_get.rs"]
mod http_get;

use agent_r1_actors::trajectory::{Trajectory, TrajectoryWriter};
use http_get::get_as;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");

struct Viewer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn view(dir: &Path) -> Viewer {
    view_with(dir, &["--address", "127.0.0.1:0"])
}

/// `agent-r1 view DIR ARGS...`, once it has said where it listens.
fn view_with(dir: &Path, args: &[&str]) -> Viewer {
    let mut child = Command::new(BIN)
        .arg("view")
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.rsplit("http://").next().unwrap().trim();
    let addr = url.trim_end_matches("/ui").parse().expect(&line);
    Viewer { child, addr }
}

/// A raw GET of `target` exactly as given (no normalisation); (status, body).
fn get(addr: SocketAddr, target: &str) -> (u16, String) {
    get_as(addr, target, None)
}

/// A trajectory with one search call per turn: `turns` turns of 40 sampled tokens and 90
/// observation tokens after a 300-token prompt (the demo's sizes), or one turn of 3 tokens
/// after 4 (`turns` = 0).
fn trajectory(i: u64, reward: f64, turns: usize) -> Trajectory {
    let mut t: Trajectory = serde_json::from_value(json!({
        "episode_id": i,
        "group_id": i / 2,
        "task": {"id": format!("task-{}", i % 1000), "data_source": "test", "question": format!("question {i}?"), "answers": ["a"]},
        "prompt_ids": [1, 2, 3, 4],
        "steps": [{
            "context_len": 4, "action_ids": [5, 6, 7], "logprobs": [-0.1, -0.5, -2.0],
            "policy_version": i % 3, "finish_reason": "stop",
            "tool_calls": [{"name": "search", "result": {"Ok": {"text": format!("result {i}")}}, "latency": {"secs": 0, "nanos": 1000}}],
            "observation_ids": [8, 9], "reward": 0.0, "generate_seconds": 0.01, "tool_seconds": 0.001, "prefill_tokens": 4
        }],
        "reward": reward,
        "metrics": {"em": reward},
        "end": {"status": "completed", "reason": "done"},
        "attempts": 1,
        "wall_seconds": 0.02
    }))
    .unwrap();
    if turns > 0 {
        t.prompt_ids = (0..300).map(|k| (k * 7 + i as u32) % 2000).collect();
        let step = t.steps[0].clone();
        t.steps = (0..turns)
            .map(|k| {
                let mut s = step.clone();
                s.context_len = 300 + k * 130;
                s.action_ids = (0..40).map(|j| (j * 13 + k as u32) % 2000).collect();
                s.logprobs = (0..40).map(|j| -0.01 * j as f32).collect();
                s.observation_ids = (0..90).map(|j| (j * 3 + 1) % 2000).collect();
                s
            })
            .collect();
    }
    t
}

fn write_rollouts(path: &Path, n: u64, turns: usize) {
    let mut w = TrajectoryWriter::create(path, None).unwrap();
    for i in 0..n {
        w.write(&trajectory(i, (i % 10) as f64 / 10.0, turns))
            .unwrap();
    }
    w.flush().unwrap();
}

#[test]
fn bad_input_gets_a_clear_page_and_nothing_outside_the_pages_is_served() {
    let tmp = tempfile::tempdir().unwrap();

    // A missing run directory, or a file, is one line and exit code 2.
    for (path, says) in [
        (tmp.path().join("absent"), "cannot open the run directory"),
        (Path::new(BIN).to_path_buf(), "not a directory"),
    ] {
        let out = Command::new(BIN).arg("view").arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(says) && err.contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let out = Command::new(BIN)
        .args(["view", ".", "--address", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--address"));

    // A run directory with damage of every kind.
    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("rollouts")).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\":1,\"reward_mean\":0.5}\n{\"step\":2,\"reward_mean\":0.7}\n{\"step\":3,\"rew",
    )
    .unwrap();
    write_rollouts(&run.join("rollouts/train-step-000001.jsonl"), 30, 0);
    // No index beside this one, and its last line cut short.
    let eval = run.join("rollouts/eval-step-000000.jsonl");
    write_rollouts(&eval, 5, 0);
    std::fs::remove_file(eval.with_extension("idx")).unwrap();
    let mut text = std::fs::read_to_string(&eval).unwrap();
    text.truncate(text.len() - 40);
    std::fs::write(&eval, text).unwrap();
    // An index that promises more than its data file holds.
    let short = run.join("rollouts/train-step-000002.jsonl");
    write_rollouts(&short, 3, 0);
    let data = std::fs::read(&short).unwrap();
    std::fs::write(&short, &data[..data.len() / 2]).unwrap();

    let v = view(&run);
    assert!(v.addr.ip().is_loopback());
    let (status, body) = get(v.addr, "/ui");
    assert_eq!(status, 200);
    assert!(
        body.contains("metrics.jsonl: 1 line(s) could not be read") && body.contains("line 3"),
        "{body}"
    );
    assert!(body.contains("No evaluation yet") && body.contains("No checkpoints yet"));

    let (status, body) = get(v.addr, "/ui/episodes?source=eval-step-000000");
    assert_eq!(status, 200);
    assert!(body.contains("no index beside it"), "{body}");
    assert!(body.contains("1 line(s) could not be read"), "{body}");
    assert_eq!(body.matches("<tr data-reward").count(), 4);

    // Side by side: the tasks both files have, with each side's reward.
    let (status, body) = get(v.addr, "/ui/compare?a=eval-step-000000&b=train-step-000001");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("4 tasks in both"), "{body}");
    assert_eq!(
        body.matches("<tr><td>task-").count()
            + body.matches("<tr class=\"changed\"><td>task-").count(),
        4
    );

    let (status, body) = get(v.addr, "/ui/episode?source=train-step-000002&n=2");
    assert_eq!(status, 500);
    assert!(body.contains("is not all there"), "{body}");

    for (target, code, says) in [
        (
            "/ui/episodes?source=train-step-000099",
            404,
            "no rollouts file train-step-000099",
        ),
        (
            "/ui/episode?source=train-step-000001&n=30",
            404,
            "there is no row 30",
        ),
        ("/ui/episode?source=train-step-000001&n=x", 400, "`n`"),
        (
            "/ui/episodes?source=train-step-000001&page=9",
            404,
            "`page`",
        ),
        (
            "/ui/episodes?source=train-step-000001&reward_min=abc",
            400,
            "`reward_min`",
        ),
        ("/ui/compare?a=train-step-000001", 400, "`b`"),
        (
            "/ui/episodes?source=..%2F..%2Fetc%2Fpasswd",
            400,
            "`source`",
        ),
        (
            "/ui/episodes?source=train-step-000001/../../../etc/passwd",
            400,
            "`source`",
        ),
        ("/ui/../../etc/passwd", 404, "no page"),
        ("/ui/%2e%2e/%2e%2e/etc/passwd", 404, "no page"),
        ("/ui/rollouts/train-step-000001.jsonl", 404, "no page"),
        ("/etc/passwd", 404, "not found"),
        ("/../metrics.jsonl", 404, "not found"),
        ("/metrics", 404, "not found"),
    ] {
        let (status, body) = get(v.addr, target);
        assert_eq!(status, code, "{target}: {body}");
        assert!(body.contains(says), "{target}: {body}");
        assert!(
            !body.contains("root:x:0:0") && !body.contains("\"episode_id\""),
            "{target}"
        );
    }

    // The directory deleted while served.
    std::fs::remove_dir_all(&run).unwrap();
    let (status, body) = get(v.addr, "/ui");
    assert_eq!(status, 500);
    assert!(body.contains("the run directory is gone"), "{body}");
}

#[test]
fn the_default_address_is_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("view")
        .arg(tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    // Either it serves on 127.0.0.1:8765, or that port is taken and the refusal names it.
    let said = format!("{line}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("127.0.0.1:8765"), "{said}");
}

#[test]
fn a_hundred_thousand_episodes_list_their_first_page_from_the_index() {
    const N: u64 = 100_000;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let data = run.join("rollouts/train-step-000001.jsonl");
    let t0 = Instant::now();
    write_rollouts(&data, N, 3);
    let written = t0.elapsed();
    let v = view(&run);

    let timed = |target: &str| {
        let t0 = Instant::now();
        let (status, body) = get(v.addr, target);
        (status, body, t0.elapsed())
    };
    let (status, body, cold) = timed("/ui/episodes?source=train-step-000001");
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!("{N} episodes, {N} shown")),
        "{}",
        &body[..2000.min(body.len())]
    );
    assert_eq!(body.matches("<tr data-reward").count(), 50);
    let (_, _, warm) = timed("/ui/episodes?source=train-step-000001");
    let (status, body, sorted) =
        timed("/ui/episodes?source=train-step-000001&reward_min=0.85&sort=episode&desc=1");
    assert_eq!(status, 200);
    assert!(body.contains(&format!("{N} episodes, {} shown", N / 10)));
    // Highest episode id with reward 0.9 first: 99999 (99999 % 10 == 9).
    assert!(body.contains("<td class=\"n\">99999</td>"));
    let (status, _, last) = timed(&format!("/ui/episode?source=train-step-000001&n={}", N - 1));
    assert_eq!(status, 200);
    let (status, body, _) = timed("/ui/episodes?source=train-step-000001&page=1999");
    assert_eq!(status, 200);
    assert!(body.contains("page 2000 of 2000"));

    // The same file without its index, for comparison: read whole once.
    std::fs::remove_file(data.with_extension("idx")).unwrap();
    let (status, body, scanned) = timed("/ui/episodes?source=train-step-000001");
    assert_eq!(status, 200);
    assert!(body.contains("no index beside it"));

    let mb = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.len() as f64 / 1e6)
            .unwrap_or(0.0)
    };
    let _ = writeln!(
        std::io::stderr(),
        "web_ui bench: {N} episodes ({:.0} MB of rollouts, written in {:.1} s): first page {:.0} ms cold (index read), \
         {:.0} ms warm, filtered+sorted {:.0} ms, last episode {:.0} ms; without the index {:.0} ms",
        mb(&data),
        written.as_secs_f64(),
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        sorted.as_secs_f64() * 1e3,
        last.as_secs_f64() * 1e3,
        scanned.as_secs_f64() * 1e3,
    );
}

#[test]
fn the_episode_page_marks_a_rebuilt_context_with_what_it_kept_and_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("rollouts")).unwrap();
    let mut t = trajectory(0, 1.0, 3);
    // Step 2 sees the prompt and step 1's turn only: a window of one turn.
    let chained: Vec<u32> = t.contexts().nth(2).unwrap();
    let mut window = t.prompt_ids.clone();
    window.extend(&t.steps[1].action_ids);
    window.extend(&t.steps[1].observation_ids);
    let rebuilt = agent_r1_actors::trajectory::RebuiltContext::between(&chained, &window, "window");
    let (kept, dropped) = (rebuilt.kept, rebuilt.dropped);
    t.steps[2].rebuilt = Some(rebuilt);
    t.steps[2].context_len = window.len();
    t.check_contexts().unwrap();
    let mut w =
        TrajectoryWriter::create(&run.join("rollouts/train-step-000001.jsonl"), None).unwrap();
    w.write(&t).unwrap();
    w.flush().unwrap();
    let v = view(&run);
    let (status, body) = get(v.addr, "/ui/episode?source=train-step-000001&n=0");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body.matches("Context rebuilt by <b>window</b>").count(),
        1,
        "{body}"
    );
    assert!(
        body.contains(&format!(
            "kept the first {kept} tokens of the full history, dropped {dropped}"
        )),
        "{body}"
    );
}

/// Off loopback the viewer wants a bearer token: refused at start in one line without one;
/// with one, every page wants it except the paths opened on the command line.
#[test]
fn off_loopback_the_viewer_wants_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("rollouts")).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\":1,\"reward_mean\":0.5}\n",
    )
    .unwrap();

    let out = Command::new(BIN)
        .arg("view")
        .arg(&run)
        .args(["--address", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--address") && err.contains("--token-file"),
        "{err}"
    );

    let token = "c0ffee00c0ffee00c0ffee00";
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let v = view_with(
        &run,
        &[
            "--address",
            "0.0.0.0:0",
            "--token-file",
            token_file.to_str().unwrap(),
            "--open-path",
            "/healthz",
        ],
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], v.addr.port()));
    let (status, body) = get(addr, "/ui");
    assert_eq!(status, 401, "{body}");
    assert!(
        body.contains("--token-file") && !body.contains(token),
        "{body}"
    );
    assert_eq!(get_as(addr, "/ui", Some("c0ffee00c0ffee00c0ffee01")).0, 401);
    let (status, body) = get_as(addr, "/ui", Some(token));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("metrics.jsonl") || body.contains("reward"),
        "{body}"
    );
    assert_eq!(get(addr, "/healthz").0, 200, "opened on the command line");
    assert_eq!(
        get(addr, "/ui/../healthz").0,
        401,
        "not the open path once resolved"
    );
}
