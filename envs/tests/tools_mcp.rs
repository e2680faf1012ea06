//! The MCP tool against a real MCP server from PyPI: `mcp-server-time` (the reference
//! server of the Model Context Protocol project), installed by `make` into `.venv` from
//! `requirements.txt`. Set `AGENT_R1_MCP_TIME_SERVER` to use another install. When the server
//! is missing the tests skip loudly, unless `CI` is set: then they fail.

#[path = "support/process.rs"]
mod process;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_envs::call_guard::execute_call;
use agent_r1_envs::tool::{CallError, Tool, ToolCall};
use agent_r1_envs::tools::mcp::{connect_tools, McpClient, McpServerConfig, McpTool};
use agent_r1_envs::tools::{ToolRegistry, ToolsConfig};
use serde_json::json;

fn server() -> Option<PathBuf> {
    let path = std::env::var_os("AGENT_R1_MCP_TIME_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/mcp-server-time")
        });
    if path.exists() {
        return Some(path);
    }
    let msg = format!(
        "mcp-server-time not found at {} (run `make venv` or set AGENT_R1_MCP_TIME_SERVER)",
        path.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("\n*** SKIPPING MCP TEST: {msg} ***\n");
    None
}

fn config(path: PathBuf) -> McpServerConfig {
    let mut cfg = McpServerConfig::new(path, &["--local-timezone", "UTC"]);
    cfg.timeout_secs = 20.0;
    cfg.init_timeout_secs = 30.0;
    cfg
}

fn by_name(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.name() == name)
        .cloned()
        .unwrap_or_else(|| panic!("no tool {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_calls_the_real_time_server() {
    let Some(path) = server() else { return };
    let tools = tokio::task::spawn_blocking(move || connect_tools(config(path)))
        .await
        .unwrap()
        .unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    names.sort();
    assert_eq!(names, ["convert_time", "get_current_time"]);
    let convert = by_name(&tools, "convert_time");
    // The schema is the server's inputSchema.
    let schema = convert.parameters();
    assert_eq!(schema["type"], "object");
    assert!(schema["required"]
        .as_array()
        .unwrap()
        .contains(&json!("target_timezone")));
    assert!(!convert.description().is_empty());

    let tools_by_name: HashMap<String, Arc<dyn Tool>> = tools
        .iter()
        .map(|t| (t.name().to_string(), t.clone()))
        .collect();
    let calls = vec![
        Ok(ToolCall {
            name: "convert_time".into(),
            arguments: json!({"source_timezone": "UTC", "time": "12:00",
                                  "target_timezone": "Asia/Tokyo"}),
        }),
        Ok(ToolCall {
            name: "get_current_time".into(),
            arguments: json!({"timezone": "Not/AZone"}),
        }),
        Ok(ToolCall {
            name: "convert_time".into(),
            arguments: json!({"source_timezone": "UTC"}),
        }),
    ];
    let mut out = Vec::new();
    for call in calls {
        out.push(execute_call(&tools_by_name, call).await);
    }
    let text = out[0].observation(4000);
    assert!(out[0].result.is_ok(), "{text}");
    // Tokyo has no daylight saving time: 12:00 UTC is 21:00 there.
    assert!(text.contains("21:00"), "{text}");
    assert!(text.contains("Asia/Tokyo"), "{text}");
    // `isError: true` from the server becomes an error observation with its message.
    let err = out[1].observation(4000);
    assert!(matches!(out[1].result, Err(CallError::Failed(_))), "{err}");
    assert!(err.contains("Not/AZone"), "{err}");
    // The server's schema is enforced before the call is sent.
    assert!(
        matches!(out[2].result, Err(CallError::InvalidArguments(_))),
        "{:?}",
        out[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_restarted_on_the_next_call() {
    let Some(path) = server() else { return };
    let (client, infos) = tokio::task::spawn_blocking(move || {
        let client = McpClient::connect(config(path)).unwrap();
        let infos = client.list_tools().unwrap();
        (client, infos)
    })
    .await
    .unwrap();
    let info = infos
        .into_iter()
        .find(|t| t.name == "get_current_time")
        .unwrap();
    let tool = McpTool::new(client.clone(), info);
    let args = json!({"timezone": "UTC"});
    let first = tool.call(args.clone()).await.unwrap();
    assert!(first.text.contains("UTC"), "{}", first.text);
    let pid = client.server_pid().expect("server running");
    assert_eq!(client.starts(), 1);
    // SAFETY: killing the server process this test started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    // The next call must find the server dead, not dying, however long the kill takes.
    assert!(
        tokio::task::spawn_blocking(move || process::process_ends(pid as i32, 60_000))
            .await
            .unwrap(),
        "the killed server had not exited within 60 s"
    );
    let again = tool.call(args).await.unwrap();
    assert!(again.text.contains("UTC"), "{}", again.text);
    assert_eq!(client.starts(), 2, "restarted once");
    assert_ne!(client.server_pid(), Some(pid));
}

#[test]
fn builds_from_a_toml_table() {
    let Some(path) = server() else { return };
    let toml = format!(
        "[tools.clock]\ntype = \"mcp\"\ncommand = {:?}\nargs = [\"--local-timezone\", \"UTC\"]\n\
         prefix = \"clock_\"\ntools = [\"get_current_time\"]\n",
        path.display().to_string()
    );
    let cfg = ToolsConfig::from_toml_str(&toml).unwrap();
    let registry = ToolRegistry::with_builtins();
    let tools = cfg.build_all(&registry).unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name(), "clock_get_current_time");
    let one = cfg.build_one(&registry, "clock_get_current_time").unwrap();
    assert_eq!(one.name(), "clock_get_current_time");
}
