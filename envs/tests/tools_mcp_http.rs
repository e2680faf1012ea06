//! MCP over both transports against a real server of the official Python SDK (`mcp`,
//! installed by `make` into `.venv`): `tests/py/mcp_sdk_server.py` serves the same tools over
//! stdio and over Streamable HTTP, and the same calls give the same observations. Over HTTP,
//! a call that hangs ends at its deadline, an answer larger than the byte cap is refused,
//! and a server that died is an error; each time the next call starts a new session and
//! works. Every call is also guarded by a 60 s test timeout, so a client that froze fails
//! the test instead of hanging it.

#[path = "support/venv.rs"]
mod venv;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agent_r1_envs::call_guard::{execute_call, run_guarded_holding};
use agent_r1_envs::call_key::CallKey;
use agent_r1_envs::tool::{Tool, ToolCall};
use agent_r1_envs::tools::mcp::{connect_tools, McpClient, McpServerConfig};
use serde_json::json;

fn python() -> Option<PathBuf> {
    venv::python("MCP HTTP TEST")
}

fn script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py/mcp_sdk_server.py")
        .display()
        .to_string()
}

/// The SDK server over Streamable HTTP; killed when dropped.
struct HttpServer {
    child: Child,
    url: String,
    port: u16,
}

impl HttpServer {
    /// Starts it on `port` (0: one of the system's choice, so that nothing can take it between
    /// a choice and its use) and returns once uvicorn says where it listens (on its stderr).
    fn start(py: &PathBuf, port: u16) -> Self {
        Self::start_with(py, port, &[])
    }

    /// [`Self::start`] with environment variables for the server.
    fn start_with(py: &PathBuf, port: u16, env: &[(&str, &std::path::Path)]) -> Self {
        let mut child = Command::new(py)
            .args([script(), "http".into(), port.to_string()])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("Uvicorn running on http://127.0.0.1:").nth(1) {
                    let _ = tx.send(
                        rest.split(|c: char| !c.is_ascii_digit())
                            .next()
                            .map(str::to_owned),
                    );
                }
            }
        });
        let said = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the SDK server did not start within 60 s");
        let port: u16 = said
            .and_then(|p| p.parse().ok())
            .expect("uvicorn's `running on` line names its port");
        assert_ne!(port, 0, "uvicorn names the port it bound");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            port,
        }
    }

    fn wait_exit(&mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn call(
    tools: &HashMap<String, Arc<dyn Tool>>,
    name: &str,
    args: serde_json::Value,
) -> String {
    let call = ToolCall {
        name: name.to_string(),
        arguments: args,
    };
    let outcome = tokio::time::timeout(Duration::from_secs(60), execute_call(tools, Ok(call)))
        .await
        .unwrap_or_else(|_| panic!("`{name}`: the client froze (no result within 60 s)"));
    outcome.observation(1 << 20)
}

async fn connect(config: McpServerConfig) -> HashMap<String, Arc<dyn Tool>> {
    tokio::task::spawn_blocking(move || connect_tools(config))
        .await
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|t| (t.name().to_string(), t))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_calls_over_stdio_and_streamable_http() {
    let Some(py) = python() else { return };
    let server = HttpServer::start(&py, 0);
    let stdio = connect(McpServerConfig::new(&py, &[&script(), "stdio"])).await;
    let http = connect(McpServerConfig::http(&server.url)).await;
    let mut names: Vec<&String> = http.keys().collect();
    names.sort();
    assert_eq!(names, ["add", "die", "echo", "effect", "flood", "slow"]);
    assert_eq!(
        stdio["echo"].spec(),
        http["echo"].spec(),
        "one server, one spec"
    );
    for (name, args, want) in [
        ("echo", json!({"text": "héllo, wörld"}), "héllo, wörld"),
        ("add", json!({"a": 2, "b": 40}), "42"),
    ] {
        let over_stdio = call(&stdio, name, args.clone()).await;
        let over_http = call(&http, name, args).await;
        assert_eq!(over_stdio, want);
        assert_eq!(over_http, want);
    }
    // The schema is checked before the call, for both.
    let bad = call(&http, "add", json!({"a": "two"})).await;
    assert!(bad.contains("Error"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_hung_a_flooding_and_a_dead_server_end_in_errors_and_the_next_call_works() {
    let Some(py) = python() else { return };
    let mut server = HttpServer::start(&py, 0);
    let port = server.port;
    let mut config = McpServerConfig::http(&server.url);
    config.timeout_secs = 2.0;
    config.max_line_bytes = 1 << 20;
    config.restart_after_timeouts = 1;
    let client = tokio::task::spawn_blocking(move || McpClient::connect(config))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(client.starts(), 1);
    // The client's limit is 2 s only for the call no server answers (`slow`, waited out by
    // design); every other call is answered or fails on an event (a cap, an exit, a refused
    // connection), and gets 60 s as a bound against a hang, so that a new session on a
    // loaded machine cannot turn it into a timeout.
    let ask = |name: &'static str, args: serde_json::Value| {
        let client = client.clone();
        let limit = Duration::from_secs(if name == "slow" { 2 } else { 60 });
        async move {
            let params = json!({"name": name, "arguments": args});
            tokio::time::timeout(
                Duration::from_secs(120),
                client.request("tools/call", params, limit),
            )
            .await
            .unwrap_or_else(|_| panic!("`{name}`: the client froze"))
            .map(|v| {
                v["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .map_err(|e| e.to_string())
        }
    };

    // Hangs: the call ends at its deadline, and the next one gets a new session.
    let e = ask("slow", json!({"seconds": 30})).await.unwrap_err();
    eprintln!("hang: {e}");
    assert!(e.contains("no answer within 2s"), "{e}");
    assert_eq!(
        ask("echo", json!({"text": "after hang"})).await.unwrap(),
        "after hang"
    );
    assert_eq!(client.starts(), 2);

    // Floods: 8 MiB against a 1 MiB cap is refused, not buffered.
    let e = ask("flood", json!({"megabytes": 8})).await.unwrap_err();
    eprintln!("flood: {e}");
    assert!(e.contains("max_line_bytes") || e.contains("limit"), "{e}");
    assert_eq!(
        ask("echo", json!({"text": "after flood"})).await.unwrap(),
        "after flood"
    );

    // Dies: an error now; once the server is back (on the same address), the next call works
    // on a new session.
    let e = ask("die", json!({})).await.unwrap_err();
    eprintln!("die: {e}");
    assert!(e.contains("a new session is started"), "{e}");
    server.wait_exit();
    let e = ask("echo", json!({"text": "nobody there"}))
        .await
        .unwrap_err();
    assert!(
        e.contains("request failed") || e.contains("initialize"),
        "{e}"
    );
    let _server = HttpServer::start(&py, port);
    assert_eq!(ask("echo", json!({"text": "back"})).await.unwrap(), "back");
    assert!(client.starts() >= 4, "{}", client.starts());
}

/// A keyed call reaches the server with its key in the request's `_meta`, over both
/// transports; the SDK server's `effect` tool records an effect once per key, as a service
/// that honours idempotency keys does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_calls_reach_the_server_with_their_key_in_meta_over_stdio_and_http() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.jsonl");
    let server = HttpServer::start_with(&py, 0, &[("AGENT_R1_TEST_EFFECTS", &effects)]);
    let mut stdio_config = McpServerConfig::new(&py, &[&script(), "stdio"]);
    stdio_config.env.insert(
        "AGENT_R1_TEST_EFFECTS".into(),
        effects.display().to_string(),
    );
    let stdio = connect(stdio_config).await;
    let http = connect(McpServerConfig::http(&server.url)).await;
    let key = |episode, step| CallKey {
        run: "r7".into(),
        episode,
        step,
        index: 0,
        branch: 0,
    };
    let mut answers = vec![];
    for (tools, key) in [
        (&stdio, key(3, 1)),
        (&http, key(4, 0)),
        // The same call again under a key already used: the server sees the same key.
        (&http, key(3, 1)),
    ] {
        let tool = tools["effect"].clone();
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            run_guarded_holding(tool, Some(key), json!({"note": "n"}), ()),
        )
        .await
        .expect("the client froze")
        .unwrap();
        answers.push(out.text);
    }
    assert_eq!(
        answers,
        [
            "done n under r7/e3/s1/c0",
            "done n under r7/e4/s0/c0",
            "done n under r7/e3/s1/c0"
        ]
    );
    let keys = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["key"].to_string())
            .collect()
    };
    assert_eq!(keys(&effects), [r#""r7/e3/s1/c0""#, r#""r7/e4/s0/c0""#]);
    assert_eq!(keys(&dir.path().join("effects.jsonl.attempts")).len(), 3);
    // An unkeyed call carries no key.
    let plain = call(&stdio, "effect", json!({"note": "p"})).await;
    assert_eq!(plain, "done p under None");
}
