//! MCP servers that misbehave cannot freeze or flood the client: a fault-injecting server
//! (`tests/py/mcp_faulty_server.py`, a test double; the real-server tests use
//! mcp-server-time) stops reading its input, writes an endless line, writes invalid UTF-8,
//! hangs, or dies, on request. Each such call ends with an answer or a named error, the
//! server is restarted where it is broken, and the next call works. Each call is also
//! guarded by a 120 s test timeout, so a client that froze fails the test instead of hanging
//! it. The client's own limit is 2 s only for the calls that no server answers (they wait it
//! out by design); a call that is answered, or fails on an event (an exit, a cap), gets 60 s,
//! so that a slow restart on a loaded machine cannot turn it into a timeout.

#[path = "support/venv.rs"]
mod venv;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_envs::tools::mcp::{McpClient, McpServerConfig};
use serde_json::json;

/// The client's limit for a call that no server answers (a hang, a server that stopped reading).
const UNANSWERED: Duration = Duration::from_secs(2);
/// The client's limit for every other call: a bound against a hang, not a speed check.
const ANSWERED: Duration = Duration::from_secs(60);

fn python() -> Option<PathBuf> {
    venv::python("MCP FAULT TEST")
}

async fn act(
    client: &Arc<McpClient>,
    mode: &str,
    padding: usize,
    limit: Duration,
) -> Result<String, String> {
    let params =
        json!({"name": "act", "arguments": {"mode": mode, "padding": "p".repeat(padding)}});
    let call = client.request("tools/call", params, limit);
    match tokio::time::timeout(Duration::from_secs(120), call).await {
        Err(_) => panic!("`{mode}`: the client froze (no result within 120 s)"),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(v)) => Ok(v["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()),
    }
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_ends_in_an_answer_or_a_named_error_and_the_server_recovers() {
    let Some(py) = python() else { return };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/mcp_faulty_server.py");
    let mut config = McpServerConfig::new(py, &[script.to_str().unwrap()]);
    config.max_line_bytes = 1 << 20;
    config.restart_after_timeouts = 3;
    // The trainer's own environment holds a secret the server must not see.
    std::env::set_var("AGENT_R1_TEST_SECRET", "hunter2");
    let client = tokio::task::spawn_blocking(move || McpClient::connect(config))
        .await
        .unwrap()
        .unwrap();
    let ok = |text: Result<String, String>| {
        let text = text.unwrap();
        assert!(text.starts_with("ok "), "{text}");
        text
    };
    let first = ok(act(&client, "ok", 0, ANSWERED).await);
    assert_eq!(client.starts(), 1);

    // The environment is an allow-list.
    let env = act(&client, "env", 0, ANSWERED).await.unwrap();
    assert!(env.split(' ').any(|v| v == "PATH"), "{env}");
    assert!(!env.contains("AGENT_R1_TEST_SECRET"), "{env}");

    // A server that hangs: each call times out; the third in a row restarts it.
    for k in 1..=3 {
        let e = act(&client, "hang", 0, UNANSWERED).await.unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
        assert_eq!(e.contains("3 in a row; restarted"), k == 3, "{e}");
    }
    let second = ok(act(&client, "ok", 0, ANSWERED).await);
    assert_ne!(first, second, "a new server process");
    assert_eq!(client.starts(), 2);

    // A server that dies fails its call at once and is started again for the next.
    let e = act(&client, "die", 0, ANSWERED).await.unwrap_err();
    assert!(e.contains("the server exited"), "{e}");
    ok(act(&client, "ok", 0, ANSWERED).await);
    assert_eq!(client.starts(), 3);

    // Invalid UTF-8 is decoded lossily, not taken for the server's end.
    let text = act(&client, "bad_utf8", 0, ANSWERED).await.unwrap();
    assert_eq!(text, "before\u{fffd}\u{fffd}after");
    assert_eq!(client.starts(), 3);

    // A line without end: read up to the cap (1 MiB), then the server is killed; the
    // client's memory does not follow the server's 64 MiB.
    let before = rss_mib();
    let e = act(&client, "flood", 0, ANSWERED).await.unwrap_err();
    assert!(e.contains("a line over 1048576 bytes"), "{e}");
    let grown = rss_mib() - before;
    println!("flood: resident memory grew by {grown:.1} MiB (the server wrote 64 MiB)");
    assert!(grown < 32.0, "memory grew by {grown:.1} MiB");
    ok(act(&client, "ok", 0, ANSWERED).await);
    assert_eq!(client.starts(), 4);

    // A server that stops reading: the next request's write blocks in the writer thread,
    // not in the caller; the call times out and the server is restarted.
    ok(act(&client, "ok", 0, ANSWERED).await);
    assert_eq!(
        act(&client, "stop_reading", 0, ANSWERED).await.unwrap(),
        "not reading any more"
    );
    let e = act(&client, "ok", 200_000, UNANSWERED).await.unwrap_err();
    assert!(
        e.contains("no answer within") && e.contains("stopped reading its input; restarted"),
        "{e}"
    );
    ok(act(&client, "ok", 200_000, ANSWERED).await);
    assert_eq!(client.starts(), 5);
}

/// A faulty server with a control directory (see the script), and a client of it.
async fn controlled() -> Option<(Arc<McpClient>, tempfile::TempDir)> {
    let py = python()?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/mcp_faulty_server.py");
    let dir = tempfile::tempdir().unwrap();
    let fifo = std::ffi::CString::new(dir.path().join("release").to_str().unwrap()).unwrap();
    // SAFETY: a plain syscall on a path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let mut config = McpServerConfig::new(py, &[script.to_str().unwrap()]);
    config.env.insert(
        "MCP_FAULTY_CONTROL".into(),
        dir.path().to_str().unwrap().into(),
    );
    let client = tokio::task::spawn_blocking(move || McpClient::connect(config))
        .await
        .unwrap()
        .unwrap();
    Some((client, dir))
}

/// Waits (polling state, bounded far above any need) until `ready` holds.
async fn until(what: &str, ready: impl Fn() -> bool) {
    for _ in 0..120_000 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("not reached within 120 s: {what}");
}

/// Answers the `initialize` that the server holds (its FIFO open blocks until it reads).
async fn release(dir: &std::path::Path, line: &str) {
    let (path, line) = (dir.join("release"), format!("{line}\n"));
    let write = tokio::task::spawn_blocking(move || std::fs::write(path, line));
    tokio::time::timeout(Duration::from_secs(120), write)
        .await
        .expect("the server opens its release FIFO within 120 s")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_on_a_server_hung_at_start_up_share_one_start_and_send_nothing_late() {
    let Some((client, dir)) = controlled().await else {
        return;
    };
    assert_eq!(act(&client, "count", 0, ANSWERED).await.unwrap(), "count 1");
    std::fs::write(dir.path().join("hold_init"), "").unwrap();

    // The server dies; four calls find it dead. One starts it again and the start hangs in
    // `initialize`; the other three wait for that start instead of each starting one.
    assert!(act(&client, "die", 0, ANSWERED)
        .await
        .unwrap_err()
        .contains("exited"));
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { act(&client, "ok", 0, ANSWERED).await })
        })
        .collect();
    until("one start and three calls waiting for it", || {
        client.starts() == 2 && client.waiting_for_start() == 3
    })
    .await;
    // The start fails: every call waiting on it gets its error at once.
    release(dir.path(), "fail").await;
    for call in calls {
        let e = call.await.unwrap().unwrap_err();
        assert!(e.contains("initialize: the server exited"), "{e}");
    }
    assert_eq!(client.starts(), 2);

    // The next call starts it again.
    std::fs::remove_file(dir.path().join("hold_init")).unwrap();
    assert!(act(&client, "ok", 0, ANSWERED)
        .await
        .unwrap()
        .starts_with("ok "));
    assert_eq!(client.starts(), 3);

    // Calls that give up while a start hangs never reach the server later.
    std::fs::write(dir.path().join("hold_init"), "").unwrap();
    assert!(act(&client, "die", 0, ANSWERED)
        .await
        .unwrap_err()
        .contains("exited"));
    let starter = {
        let client = client.clone();
        tokio::spawn(async move { act(&client, "count", 0, ANSWERED).await })
    };
    let log = dir.path().join("log");
    until("a fourth server in initialize", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.matches("start ").count() == 4)
    })
    .await;
    for _ in 0..3 {
        // Their 2 s run out while the start is held: waited out by design.
        let e = act(&client, "count", 0, UNANSWERED).await.unwrap_err();
        assert!(e.contains("start"), "{e}");
    }
    release(dir.path(), "go").await;
    std::fs::remove_file(dir.path().join("hold_init")).unwrap();
    assert_eq!(starter.await.unwrap().unwrap(), "count 1");
    assert_eq!(act(&client, "count", 0, ANSWERED).await.unwrap(), "count 2");
    assert_eq!(client.starts(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_by_its_caller_is_withdrawn_and_cancelled() {
    let Some((client, dir)) = controlled().await else {
        return;
    };
    let log = dir.path().join("log");
    let call = {
        let client = client.clone();
        tokio::spawn(async move { act(&client, "hang", 0, ANSWERED).await })
    };
    until("the server took the call", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("hang "))
    })
    .await;
    assert_eq!(client.in_flight(), 1);
    // The episode gives up: its future is dropped.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(client.in_flight(), 0, "the request is withdrawn");
    let id = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("hang ").map(str::to_owned))
        .unwrap();
    let cancelled = act(&client, "cancelled", 0, ANSWERED).await.unwrap();
    assert_eq!(cancelled, id, "the server was told");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_while_its_helper_holds_stdout_fails_its_calls_at_once() {
    let Some((client, dir)) = controlled().await else {
        return;
    };
    // The server exits; a process it started in a session of its own keeps the server's
    // stdout open, so the reader never sees it close. The call still ends with the exit,
    // not after its 60 s.
    let e = act(&client, "detach_die", 0, ANSWERED).await.unwrap_err();
    let helper: i32 = std::fs::read_to_string(dir.path().join("helper"))
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: a plain syscall on the helper the test double started.
    unsafe { libc::kill(helper, libc::SIGKILL) };
    assert!(e.contains("the server exited"), "{e}");
    assert!(e.contains("still holds its output"), "{e}");
    assert!(act(&client, "ok", 0, ANSWERED)
        .await
        .unwrap()
        .starts_with("ok "));
    assert_eq!(client.starts(), 2);
}

#[test]
fn config_defaults_and_passthrough_parse() {
    let c: McpServerConfig = serde_json::from_value(json!({
        "command": "x", "env_passthrough": ["HF_TOKEN"], "max_line_bytes": 4096
    }))
    .unwrap();
    assert_eq!(c.env_passthrough, vec!["HF_TOKEN".to_string()]);
    assert_eq!((c.max_line_bytes, c.restart_after_timeouts), (4096, 3));
}
