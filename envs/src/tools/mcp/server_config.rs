//! How to reach one MCP server (`[tools.mcp.NAME]`): a command or a URL, its limits, and the
//! protocol versions spoken.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol revision we speak first.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Revisions we accept from a server.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// How to start an MCP server (`[tools.NAME]` with `type = "mcp"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program of a server over stdio (leave out with `url`).
    #[serde(default)]
    pub command: PathBuf,
    /// The endpoint of a server over Streamable HTTP (`http://127.0.0.1:8000/mcp`), instead
    /// of a `command` to start.
    #[serde(default)]
    pub url: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: HashMap<String, String>,
    /// Working directory (default: inherited).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Limit for one `tools/call`, seconds.
    #[serde(default = "default_call_timeout")]
    pub timeout_secs: f64,
    /// Limit for start-up and the `initialize` handshake, seconds.
    #[serde(default = "default_init_timeout")]
    pub init_timeout_secs: f64,
    /// Expose only these server tools (default: all).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Prefix added to each tool's name (`time_` gives `time_get_current_time`).
    #[serde(default)]
    pub prefix: String,
    /// Calls of each tool that may run at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
    /// Longest line the server may write, bytes; a longer one is a broken server (it is
    /// restarted), and the client never holds more than this of one line.
    #[serde(default = "default_max_line_bytes")]
    pub max_line_bytes: usize,
    /// Calls in a row without an answer after which the server is restarted.
    #[serde(default = "default_restart_after_timeouts")]
    pub restart_after_timeouts: u32,
    /// Variables of the trainer's environment the server also gets, beside
    /// [`BASE_ENV`] and `env`; nothing else of the trainer's environment (its secrets)
    /// reaches it.
    #[serde(default)]
    pub env_passthrough: Vec<String>,
}

/// The trainer's variables every server gets (where set): what programs need to run.
pub const BASE_ENV: [&str; 9] = [
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

fn default_call_timeout() -> f64 {
    30.0
}
fn default_init_timeout() -> f64 {
    20.0
}
fn default_concurrency() -> usize {
    8
}
fn default_max_line_bytes() -> usize {
    16 << 20
}
fn default_restart_after_timeouts() -> u32 {
    3
}

impl McpServerConfig {
    /// A config running `command args...` with defaults for the rest.
    pub fn new(command: impl Into<PathBuf>, args: &[&str]) -> Self {
        Self {
            command: command.into(),
            url: None,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: HashMap::new(),
            cwd: None,
            timeout_secs: default_call_timeout(),
            init_timeout_secs: default_init_timeout(),
            tools: None,
            prefix: String::new(),
            max_concurrency: default_concurrency(),
            max_line_bytes: default_max_line_bytes(),
            restart_after_timeouts: default_restart_after_timeouts(),
            env_passthrough: Vec::new(),
        }
    }

    /// A config for the Streamable HTTP server at `url`, with defaults for the rest.
    pub fn http(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::new("", &[])
        }
    }
}
