//! Tools backed by a Model Context Protocol server, over stdio or Streamable HTTP.
//!
//! [`connect_tools`] starts the server ([`McpClient`]), lists its tools, and wraps each as a
//! [`Tool`] whose parameters are the server's `inputSchema`. A call is a `tools/call`; the
//! result's `content` text parts are joined into the observation, and `isError: true`
//! becomes a tool error (the model sees the server's message). A dead server is restarted
//! on the next call; a call past the timeout is cancelled with `notifications/cancelled`.

pub mod client;
mod current;
mod http;
mod server_config;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::call_key::{CallKey, MCP_META_FIELD};
use crate::error::{Error, Result};
use crate::kinds::KindOptions;
use crate::tool::{Tool, ToolOutput};

pub use client::{McpClient, McpServerConfig, McpToolInfo, PROTOCOL_VERSION};

/// One tool of an MCP server.
#[derive(Debug, Clone)]
pub struct McpTool {
    client: Arc<McpClient>,
    info: McpToolInfo,
    exposed_name: String,
}

impl McpTool {
    /// The tool `info` of the server behind `client`, exposed as `prefix + info.name`.
    pub fn new(client: Arc<McpClient>, info: McpToolInfo) -> Self {
        let exposed_name = format!("{}{}", client.config().prefix, info.name);
        Self {
            client,
            info,
            exposed_name,
        }
    }

    /// The client (shared by all tools of the server).
    pub fn client(&self) -> &Arc<McpClient> {
        &self.client
    }
}

impl KindOptions for McpServerConfig {
    fn validate(&self) -> Result<()> {
        for (key, value) in [
            ("timeout_secs", self.timeout_secs),
            ("init_timeout_secs", self.init_timeout_secs),
        ] {
            if !(value > 0.0 && value <= 86_400.0) {
                return Err(Error::Config {
                    key: format!("tools.mcp.{key}"),
                    message: format!(
                        "must be a number of seconds in (0, 86400] (a day), got {value}"
                    ),
                });
            }
        }
        for (key, value, least) in [
            ("max_concurrency", self.max_concurrency, 1),
            ("max_line_bytes", self.max_line_bytes, 1024),
            (
                "restart_after_timeouts",
                self.restart_after_timeouts as usize,
                1,
            ),
        ] {
            if value < least {
                return Err(Error::Config {
                    key: format!("tools.mcp.{key}"),
                    message: format!("must be at least {least}, got {value}"),
                });
            }
        }
        match (&self.url, self.command.as_os_str().is_empty()) {
            (None, true) => {
                return Err(Error::Config {
                    key: "tools.mcp.command".into(),
                    message: "required: the server program (stdio), or `url` for a server \
                              over Streamable HTTP"
                        .into(),
                })
            }
            (Some(_), false) => {
                return Err(Error::Config {
                    key: "tools.mcp.url".into(),
                    message: "give `command` (a server over stdio) or `url` (Streamable HTTP), \
                              not both"
                        .into(),
                })
            }
            (Some(url), true) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                return Err(Error::Config {
                    key: "tools.mcp.url".into(),
                    message: format!("must be an http:// or https:// URL, got {url:?}"),
                })
            }
            _ => {}
        }
        Ok(())
    }
}

/// Starts the server, lists its tools and wraps them (filtered by `config.tools`).
pub fn connect_tools(config: McpServerConfig) -> Result<Vec<Arc<dyn Tool>>> {
    let wanted = config.tools.clone();
    let client = McpClient::connect(config)?;
    let listed = client.list_tools()?;
    if let Some(wanted) = &wanted {
        if let Some(missing) = wanted
            .iter()
            .find(|w| !listed.iter().any(|t| &t.name == *w))
        {
            return Err(Error::Config {
                key: "tools.mcp.tools".into(),
                message: format!(
                    "the server has no tool `{missing}` (it has: {})",
                    listed
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    Ok(listed
        .into_iter()
        .filter(|t| wanted.as_ref().is_none_or(|w| w.contains(&t.name)))
        .map(|info| Arc::new(McpTool::new(client.clone(), info)) as Arc<dyn Tool>)
        .collect())
}

/// The observation of a `tools/call` result: its text parts, one per line (other content
/// types are named, not shown), and whether the server flagged it as an error.
pub fn format_call_result(result: &Value) -> (String, bool) {
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let parts: Vec<String> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|c| match c.get("type").and_then(Value::as_str) {
                    Some("text") => c
                        .get("text")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    Some(other) => format!("[{other} content]"),
                    None => "[unknown content]".to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut text = parts.join("\n");
    if text.is_empty() {
        if let Some(structured) = result.get("structuredContent") {
            text = structured.to_string();
        }
    }
    (text, is_error)
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.exposed_name
    }
    fn description(&self) -> &str {
        &self.info.description
    }
    fn parameters(&self) -> Value {
        self.info.input_schema.clone()
    }
    fn timeout(&self) -> Duration {
        // The client enforces the call limit itself (and cancels); this is the backstop.
        Duration::from_secs_f64(self.client.config().timeout_secs.max(0.1) + 2.0)
    }
    fn max_concurrency(&self) -> usize {
        self.client.config().max_concurrency
    }
    async fn call(&self, arguments: Value) -> Result<ToolOutput> {
        self.call_with(json!({"name": self.info.name, "arguments": arguments}))
            .await
    }

    /// The key goes in the request's `_meta` (as `agent-r1/idempotency-key`), where an MCP
    /// server may read it to tell a repeated call from a new one.
    async fn call_keyed(&self, key: &CallKey, arguments: Value) -> Result<ToolOutput> {
        self.call_with(json!({
            "name": self.info.name,
            "arguments": arguments,
            "_meta": {MCP_META_FIELD: key.to_string()},
        }))
        .await
    }
}

impl McpTool {
    /// Sends one `tools/call` with `params` and reads its result.
    async fn call_with(&self, params: Value) -> Result<ToolOutput> {
        let limit = Duration::from_secs_f64(self.client.config().timeout_secs.max(0.1));
        let result = self.client.request("tools/call", params, limit).await?;
        let (text, is_error) = format_call_result(&result);
        if is_error {
            return Err(Error::Tool {
                tool: self.exposed_name.clone(),
                message: text,
            });
        }
        let mut out = ToolOutput::text(text);
        if let Some(structured) = result.get("structuredContent") {
            out.metadata.insert("structured".into(), structured.clone());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_results_become_text() {
        let (text, err) = format_call_result(&json!({
            "content": [{"type": "text", "text": "a"}, {"type": "image", "data": "x"},
                        {"type": "text", "text": "b"}],
            "isError": false
        }));
        assert_eq!((text.as_str(), err), ("a\n[image content]\nb", false));
        let (text, err) = format_call_result(
            &json!({"content": [{"type": "text", "text": "bad tz"}], "isError": true}),
        );
        assert_eq!((text.as_str(), err), ("bad tz", true));
        let (text, _) = format_call_result(&json!({"content": [], "structuredContent": {"a": 1}}));
        assert_eq!(text, "{\"a\":1}");
    }

    #[test]
    fn a_missing_server_is_a_clear_error() {
        let e = connect_tools(McpServerConfig::new("/nonexistent/mcp-server", &[]))
            .map(|_| ())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot start `/nonexistent/mcp-server`"),
            "{e}"
        );
    }

    #[test]
    fn a_server_that_is_not_mcp_fails_the_handshake() {
        let mut cfg =
            McpServerConfig::new("/bin/sh", &["-c", "echo not json; echo oops >&2; sleep 5"]);
        cfg.init_timeout_secs = 0.5;
        let e = connect_tools(cfg).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("initialize") && e.contains("no answer"), "{e}");
        let mut cfg = McpServerConfig::new("/bin/sh", &["-c", "echo died >&2; exit 3"]);
        cfg.init_timeout_secs = 5.0;
        let e = connect_tools(cfg).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("initialize"), "{e}");
    }
}
