//! MCP over Streamable HTTP (protocol revision 2025-03-26 and later): every client message is
//! a POST to the server's one endpoint; the answer comes back as `application/json` or as a
//! `text/event-stream` whose events carry JSON-RPC messages, read until the one answering
//! the request. The server may give a session id at `initialize` (`Mcp-Session-Id`), sent
//! with every later request; a 404 for it means the session ended, and the client starts a
//! new one.
//!
//! Blocking (ureq), run on the blocking pool: each request has the call's deadline, the
//! answer is read up to `max_line_bytes`, and a failed or timed-out request drops the
//! session it used (not a newer one) so the next call starts a fresh one ("restart" for a
//! server the client does not own). One call at a time runs the `initialize` handshake;
//! the others wait for it.

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::current::Current;
use super::server_config::{McpServerConfig, PROTOCOL_VERSION, SUPPORTED_VERSIONS};

/// One session with a Streamable HTTP server.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    id: Option<String>,
    protocol: String,
    server_info: Value,
}

/// A client's HTTP side: the endpoint, the current session, and counters.
pub(crate) struct HttpTransport {
    url: String,
    agent: ureq::Agent,
    max_bytes: usize,
    init_limit: Duration,
    restart_after: u32,
    session: Current<Session>,
    /// Sessions started (1 + restarts).
    pub(crate) starts: AtomicU64,
    timeouts: AtomicU32,
}

/// Why a request got no answer.
pub(crate) enum Failure {
    /// Past its deadline.
    Timeout(String),
    /// Anything else (refused, reset, a bad answer, an HTTP error).
    Other(String),
}

impl Failure {
    pub(crate) fn text(&self) -> &str {
        match self {
            Failure::Timeout(m) | Failure::Other(m) => m,
        }
    }
}

impl HttpTransport {
    pub(crate) fn new(config: &McpServerConfig, url: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Self {
            url: url.to_string(),
            agent,
            max_bytes: config.max_line_bytes,
            init_limit: Duration::from_secs_f64(config.init_timeout_secs),
            restart_after: config.restart_after_timeouts.max(1),
            session: Current::default(),
            starts: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
        }
    }

    /// `serverInfo` of the current session.
    pub(crate) fn server_info(&self) -> Option<Value> {
        self.session.get().map(|s| s.server_info.clone())
    }

    /// Calls waiting for the `initialize` handshake another call runs.
    pub(crate) fn waiting_for_start(&self) -> usize {
        self.session.waiting()
    }

    /// The current session, or a new one (the handshake, run by one caller at a time; the
    /// others wait for it up to `deadline`).
    pub(crate) fn session(
        &self,
        next_id: &AtomicU64,
        deadline: Instant,
        cancelled: &AtomicBool,
    ) -> Result<Arc<Session>, String> {
        self.session.get_or_start(
            deadline,
            cancelled,
            |_| true,
            || self.initialize(next_id).map_err(|e| e.text().to_string()),
        )
    }

    fn initialize(&self, next_id: &AtomicU64) -> Result<Session, Failure> {
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let init = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "agent-r1", "version": env!("CARGO_PKG_VERSION")},
        }});
        let (result, session_id) = self.post(&init, None, Some(id), self.init_limit)?;
        let result = result.ok_or_else(|| Failure::Other("initialize: no answer".into()))?;
        let result =
            answer_of(result, id).map_err(|e| Failure::Other(format!("initialize: {e}")))?;
        let protocol = result["protocolVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !SUPPORTED_VERSIONS.contains(&protocol.as_str()) {
            return Err(Failure::Other(format!(
                "server speaks protocol `{protocol}` (supported: {})",
                SUPPORTED_VERSIONS.join(", ")
            )));
        }
        let session = Session {
            id: session_id,
            protocol,
            server_info: result.get("serverInfo").cloned().unwrap_or(Value::Null),
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&note, Some(&session), None, self.init_limit)
            .map_err(|e| match e {
                Failure::Timeout(m) | Failure::Other(m) => {
                    Failure::Other(format!("notifications/initialized: {m}"))
                }
            })?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(session)
    }

    /// Sends request `method` and returns its result, all by `deadline` (`limit` from the
    /// call's start, named in a timeout's message). A failure drops the
    /// session when it was not a timeout, or after `restart_after_timeouts` timeouts in a
    /// row; a 404 (the session ended) starts a new session and tries once more.
    pub(crate) fn request(
        &self,
        next_id: &AtomicU64,
        method: &str,
        params: Value,
        limit: Duration,
        deadline: Instant,
        cancelled: &AtomicBool,
    ) -> Result<Value, String> {
        let timed_out = || Failure::Timeout(format!("no answer within {limit:?}"));
        for attempt in 0..2 {
            let session = self.session(next_id, deadline, cancelled)?;
            if cancelled.load(Ordering::Acquire) {
                return Err("the call was given up".into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.failed(timed_out(), &session));
            }
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            match self.post(&msg, Some(&session), Some(id), left) {
                Ok((Some(answer), _)) => {
                    self.timeouts.store(0, Ordering::Relaxed);
                    return answer_of(answer, id);
                }
                Ok((None, _)) => {
                    return Err(self.failed(Failure::Other("no answer".into()), &session))
                }
                Err(Failure::Other(m)) if m.starts_with("HTTP 404") && attempt == 0 => {
                    // The session ended on the server: start another.
                    self.session.clear_if(&session);
                }
                Err(Failure::Timeout(_)) => return Err(self.failed(timed_out(), &session)),
                Err(e) => return Err(self.failed(e, &session)),
            }
        }
        Err("the session ended twice".into())
    }

    /// The text of a failure of a request on `session`, which it drops when the failure
    /// calls for a new session.
    fn failed(&self, failure: Failure, session: &Arc<Session>) -> String {
        match failure {
            Failure::Timeout(m) => {
                let missed = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if missed >= self.restart_after {
                    self.timeouts.store(0, Ordering::Relaxed);
                    self.session.clear_if(session);
                    format!("{m} ({missed} in a row; a new session is started)")
                } else {
                    m
                }
            }
            Failure::Other(m) => {
                self.session.clear_if(session);
                format!("{m} (a new session is started)")
            }
        }
    }

    /// One POST. Returns the JSON-RPC message answering `id` (none for a notification) and
    /// the session id the server gave.
    fn post(
        &self,
        msg: &Value,
        session: Option<&Session>,
        id: Option<u64>,
        limit: Duration,
    ) -> Result<(Option<Value>, Option<String>), Failure> {
        let mut request = self
            .agent
            .post(&self.url)
            .config()
            .timeout_global(Some(limit))
            .build()
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json");
        if let Some(s) = session {
            request = request.header("MCP-Protocol-Version", &s.protocol);
            if let Some(sid) = &s.id {
                request = request.header("Mcp-Session-Id", sid);
            }
        }
        let mut response = request
            .send(msg.to_string())
            .map_err(|e| classify(&e, limit))?;
        let status = response.status().as_u16();
        let session_id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if status == 202 || (id.is_none() && (200..300).contains(&status)) {
            return Ok((None, session_id));
        }
        if status != 200 {
            return Err(Failure::Other(format!("HTTP {status} from {}", self.url)));
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let reader = response
            .body_mut()
            .with_config()
            .limit(self.max_bytes as u64)
            .reader();
        let answer = if content_type.starts_with("text/event-stream") {
            read_events(reader, id, self.max_bytes).map_err(|e| classify_io(e, limit))?
        } else {
            let mut body = Vec::new();
            BufReader::new(reader)
                .read_to_end(&mut body)
                .map_err(|e| classify_io(e, limit))?;
            let value: Value = serde_json::from_slice(&body)
                .map_err(|e| Failure::Other(format!("the answer is not JSON: {e}")))?;
            Some(value)
        };
        Ok((answer, session_id))
    }
}

fn classify(e: &ureq::Error, limit: Duration) -> Failure {
    match e {
        ureq::Error::Timeout(_) => Failure::Timeout(format!("no answer within {limit:?}")),
        other => Failure::Other(format!("request failed: {other}")),
    }
}

fn classify_io(e: std::io::Error, limit: Duration) -> Failure {
    let text = e.to_string();
    if e.kind() == std::io::ErrorKind::TimedOut
        || text.contains("timeout")
        || text.contains("Timeout")
    {
        Failure::Timeout(format!("no answer within {limit:?}"))
    } else {
        Failure::Other(format!("reading the answer: {text}"))
    }
}

/// Reads server-sent events until the JSON-RPC message answering `id` (requests the server
/// makes of the client, and notifications, are skipped). Lines are read lossily: invalid
/// UTF-8 cannot end the stream.
fn read_events(
    reader: impl Read,
    id: Option<u64>,
    max_bytes: usize,
) -> std::io::Result<Option<Value>> {
    let mut reader = BufReader::new(reader);
    let mut data = String::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the event stream ended before the answer",
            ));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            if !data.is_empty() {
                if let Ok(msg) = serde_json::from_str::<Value>(&data) {
                    let answers = msg.get("method").is_none()
                        && id.is_none_or(|id| msg.get("id").and_then(Value::as_u64) == Some(id));
                    if answers {
                        return Ok(Some(msg));
                    }
                }
                data.clear();
            }
        } else if let Some(rest) = text.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            if data.len() > max_bytes {
                return Err(std::io::Error::other(format!(
                    "an event longer than max_line_bytes ({max_bytes})"
                )));
            }
        }
    }
}

/// The `result` of a JSON-RPC answer, or its `error` as text.
fn answer_of(answer: Value, id: u64) -> Result<Value, String> {
    if answer.get("id").and_then(Value::as_u64) != Some(id) {
        return Err(format!("an answer to another request: {answer}"));
    }
    if let Some(error) = answer.get("error") {
        return Err(format!(
            "server error {}: {}",
            error["code"],
            error["message"].as_str().unwrap_or_default()
        ));
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}
