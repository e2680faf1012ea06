//! A Model Context Protocol client over stdio: JSON-RPC 2.0, one JSON message per line.
//!
//! The server is a child process in its own process group, with only an allow-listed
//! environment. A writer thread owns its stdin: callers queue messages (a bounded queue,
//! never a blocking write on the caller's thread), so a server that stops reading costs its
//! callers a timeout, not a runtime thread. A reader thread routes responses to the waiting
//! request by id and answers the server's `ping`; it reads bytes, at most
//! `max_line_bytes` per line, decoded lossily. A third thread keeps the last lines of the
//! server's stderr for error messages. When the server dies, writes a line past the cap,
//! stops reading, or misses `restart_after_timeouts` answers in a row, it is killed, waiting
//! requests fail at once with the reason and its stderr tail, and the next request starts it
//! again (with the `initialize` handshake), so one bad server costs some calls, not the run.
//!
//! The handshake can run from a sync factory; async callers wait on a oneshot channel with a
//! timeout.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::current::{CancelOnDrop, Current};
use super::http::HttpTransport;
pub use super::server_config::{McpServerConfig, BASE_ENV, PROTOCOL_VERSION, SUPPORTED_VERSIONS};
use crate::error::{Error, Result};

/// Messages queued for a server's stdin before it counts as not reading.
const OUTBOX: usize = 64;
/// How long the reader may go on after the server exited (reading what it wrote before)
/// before the requests still waiting fail.
const READER_GRACE: Duration = Duration::from_secs(2);
/// How long past its deadline an HTTP call's async side waits for its blocking side, which
/// keeps the deadline itself.
const HTTP_GRACE: Duration = Duration::from_secs(1);

/// A tool as the server lists it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct McpToolInfo {
    /// The server's name for it.
    pub name: String,
    /// Its description.
    #[serde(default)]
    pub description: String,
    /// JSON schema of its arguments.
    #[serde(rename = "inputSchema", default = "empty_object_schema")]
    pub input_schema: Value,
}

fn empty_object_schema() -> Value {
    json!({"type": "object"})
}

type Reply = std::result::Result<Value, String>;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// One running server process.
struct Connection {
    child: Child,
    outbox: SyncSender<Vec<u8>>,
    /// When the writer thread began its current write (ms since `epoch`; 0 when idle).
    writing_since: Arc<AtomicU64>,
    epoch: Instant,
    pending: Pending,
    alive: Arc<AtomicBool>,
    /// Calls in a row that got no answer in time.
    timeouts: AtomicU32,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    server_info: Value,
    /// Set once the child is reaped (see [`kill_unreaped`]).
    reaped: Arc<Mutex<bool>>,
    /// A pidfd of the server, to see its exit before its reader does (none on kernels
    /// before 5.3).
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Connection {
    /// Queues one message for the server's stdin, without waiting on the server.
    fn write(&self, msg: &Value) -> std::result::Result<(), String> {
        match self.outbox.try_send(frame(msg)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.abandon();
                Err(format!(
                    "the server is not reading its input ({OUTBOX} messages queued); restarted"
                ))
            }
            Err(TrySendError::Disconnected(_)) => Err("the server's input is closed".into()),
        }
    }

    /// Whether a write has been blocked (the server not reading) for half of `limit` or
    /// more: a request that timed out behind it never reached the server.
    fn write_stuck(&self, limit: Duration) -> bool {
        let since = self.writing_since.load(Ordering::Acquire);
        since != 0
            && self.epoch.elapsed().as_millis() as u64 >= since + limit.as_millis() as u64 / 2
    }

    /// Kills the server: the reader sees its stdout close, fails every waiting request and
    /// marks the connection dead, so the next call starts a new server.
    fn abandon(&self) {
        self.alive.store(false, Ordering::Release);
        kill_unreaped(&self.reaped, self.child.id());
    }

    /// Alive, as far as the client can tell now: not marked dead, and the process has not
    /// exited (its reader may not have seen the end of its output yet).
    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && !self.exited()
    }

    /// Whether the server process has exited (its pidfd is readable).
    fn exited(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return false;
        };
        let mut probe = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut probe, 1, 0) > 0 }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        kill_unreaped(&self.reaped, self.child.id());
        // From here on its pid may be another process's: nothing kills it any more.
        *lock(&self.reaped) = true;
        let _ = self.child.wait();
    }
}

/// A pidfd of process `pid`, where the kernel has them.
fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    // SAFETY: a plain syscall; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    (fd >= 0).then(|| unsafe {
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as libc::c_int)
    })
}

/// Kills the server's process group, and the server itself should it have left its group,
/// unless it was reaped. `reaped` is held while killing: the reader thread can outlive the
/// connection, and its pid must not be signalled once it may belong to another process.
fn kill_unreaped(reaped: &Mutex<bool>, pid: u32) {
    let reaped = lock(reaped);
    if !*reaped {
        // SAFETY: plain syscalls on our child (not yet reaped) and its process group.
        unsafe {
            libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// A request sent and not yet settled: dropped armed (the caller's future was dropped), it
/// withdraws the request and tells the server.
struct Unanswered<'a> {
    client: &'a McpClient,
    conn: &'a Connection,
    id: u64,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.conn.pending).remove(&self.id);
            self.client
                .cancel(self.conn, self.id, "the caller stopped waiting");
        }
    }
}

/// A client of one MCP server; cheap to share (`Arc`), safe to call concurrently.
pub struct McpClient {
    config: McpServerConfig,
    /// Set for a server over Streamable HTTP (then `conn` stays empty).
    http: Option<HttpTransport>,
    conn: Current<Connection>,
    next_id: AtomicU64,
    starts: AtomicU64,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("command", &self.config.command)
            .field("starts", &self.starts.load(Ordering::Relaxed))
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn tail_text(tail: &Mutex<VecDeque<String>>) -> String {
    let lines: Vec<String> = lock(tail).iter().cloned().collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!("; server stderr: {}", lines.join(" | "))
    }
}

impl McpClient {
    /// Starts the server and completes the handshake.
    pub fn connect(config: McpServerConfig) -> Result<Arc<Self>> {
        let http = config
            .url
            .as_deref()
            .map(|url| HttpTransport::new(&config, url));
        let client = Arc::new(Self {
            http,
            config,
            conn: Current::default(),
            next_id: AtomicU64::new(1),
            starts: AtomicU64::new(0),
        });
        match &client.http {
            Some(_) => {
                let this = client.clone();
                unless_shutdown(move || {
                    let http = this.http.as_ref().expect("an HTTP client");
                    let deadline = Instant::now() + this.init_limit() + Duration::from_secs(1);
                    http.session(&this.next_id, deadline, &AtomicBool::new(false))
                        .map(drop)
                })
                .and_then(|r| r)
                .map_err(|e| client.server_err(format!("initialize: {e}")))?
            }
            None => {
                let deadline = Instant::now() + client.init_limit() + Duration::from_secs(1);
                client.connection(deadline, &AtomicBool::new(false))?;
            }
        }
        Ok(client)
    }

    /// The server's settings.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// How many times the server was started (1 + restarts after deaths).
    pub fn starts(&self) -> u64 {
        match &self.http {
            Some(http) => http.starts.load(Ordering::Relaxed),
            None => self.starts.load(Ordering::Relaxed),
        }
    }

    /// The server process's id, while one runs.
    pub fn server_pid(&self) -> Option<u32> {
        self.conn.live(Connection::is_alive).map(|c| c.child.id())
    }

    /// `serverInfo` from the handshake of the current server.
    pub fn server_info(&self) -> Option<Value> {
        if let Some(http) = &self.http {
            return http.server_info();
        }
        self.conn.get().map(|c| c.server_info.clone())
    }

    /// Requests sent and not yet answered, failed or given up.
    pub fn in_flight(&self) -> usize {
        if self.http.is_some() {
            return 0; // each HTTP request waits on its own connection
        }
        self.conn.get().map_or(0, |c| lock(&c.pending).len())
    }

    /// Calls now waiting for the server (or the HTTP session) that another call is starting.
    pub fn waiting_for_start(&self) -> usize {
        match &self.http {
            Some(http) => http.waiting_for_start(),
            None => self.conn.waiting(),
        }
    }

    fn init_limit(&self) -> Duration {
        Duration::from_secs_f64(self.config.init_timeout_secs.max(0.1))
    }

    /// The live connection, (re)starting the server when there is none or it died; when
    /// another call is starting it, waits for that start up to `deadline`.
    fn connection(&self, deadline: Instant, cancelled: &AtomicBool) -> Result<Arc<Connection>> {
        self.conn
            .get_or_start(deadline, cancelled, Connection::is_alive, || self.start())
            .map_err(|e| self.server_err(e))
    }

    fn server_err(&self, message: impl std::fmt::Display) -> Error {
        Error::Tool {
            tool: match &self.config.url {
                Some(url) => format!("mcp:{url}"),
                None => format!("mcp:{}", self.config.command.display()),
            },
            message: message.to_string(),
        }
    }

    /// Starts the server and runs the handshake (errors as bare text, named by the caller).
    fn start(&self) -> std::result::Result<Connection, String> {
        let cfg = &self.config;
        let mut cmd = Command::new(&cfg.command);
        cmd.env_clear();
        for name in BASE_ENV
            .iter()
            .copied()
            .chain(cfg.env_passthrough.iter().map(String::as_str))
        {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        cmd.args(&cfg.args)
            .envs(&cfg.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(dir) = &cfg.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", cfg.command.display()))?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("server pipes missing".into());
        };
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let stderr_tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let (outbox, queued) = sync_channel::<Vec<u8>>(OUTBOX);
        let epoch = Instant::now();
        let writing_since = Arc::new(AtomicU64::new(0));
        spawn_writer(stdin, queued, writing_since.clone(), epoch, alive.clone());
        spawn_stderr_reader(stderr, stderr_tail.clone());
        let (reader_done, reader_ended) = std::sync::mpsc::channel::<()>();
        let reaped = Arc::new(Mutex::new(false));
        let ends = Ends {
            pending: pending.clone(),
            alive: alive.clone(),
            stderr_tail: stderr_tail.clone(),
            reaped: reaped.clone(),
        };
        spawn_reader(
            stdout,
            outbox.clone(),
            ends.clone(),
            cfg.max_line_bytes.max(1024),
            child.id(),
            reader_done,
        );
        let child_pid = child.id();
        spawn_exit_watcher(child_pid, reader_ended, ends);
        let mut conn = Connection {
            child,
            outbox,
            writing_since,
            epoch,
            pending,
            alive,
            timeouts: AtomicU32::new(0),
            stderr_tail,
            server_info: Value::Null,
            reaped,
            pidfd: pidfd_open(child_pid),
        };
        let init_limit = self.init_limit();
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "agent-r1", "version": env!("CARGO_PKG_VERSION")},
        });
        let (_, rx) = self
            .send(&conn, "initialize", params)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "initialize: the server exited{}",
                    tail_text(&conn.stderr_tail)
                )
            })?;
        let result = wait_blocking(rx, Instant::now() + init_limit, init_limit)
            .map_err(|e| format!("initialize: {e}{}", tail_text(&conn.stderr_tail)))?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(format!(
                "server speaks protocol `{version}` (supported: {})",
                SUPPORTED_VERSIONS.join(", ")
            ));
        }
        conn.server_info = result.get("serverInfo").cloned().unwrap_or(Value::Null);
        conn.write(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .map_err(|e| format!("notifications/initialized: {e}"))?;
        Ok(conn)
    }

    /// Registers a request id and writes the request.
    fn send(
        &self,
        conn: &Connection,
        method: &str,
        params: Value,
    ) -> Result<Option<(u64, oneshot::Receiver<Reply>)>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&conn.pending).insert(id, tx);
        // The reader marks the connection dead before it fails every pending request, under
        // the same lock: a request inserted after that drain would wait out its limit for an
        // answer nobody will send. Seen here instead, it never reached the server.
        if !conn.is_alive() {
            lock(&conn.pending).remove(&id);
            return Ok(None);
        }
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if let Err(e) = conn.write(&msg) {
            lock(&conn.pending).remove(&id);
            conn.alive.store(false, Ordering::Release);
            return Err(self.server_err(format!(
                "{method}: cannot write to the server: {e}{}",
                tail_text(&conn.stderr_tail)
            )));
        }
        Ok(Some((id, rx)))
    }

    /// Sends `method` on the live connection; when that connection turns out to have died
    /// before the request was written, once more on a newly started server. Waiting for a
    /// start that another call runs ends at `deadline`.
    fn send_live(
        &self,
        method: &str,
        params: &Value,
        deadline: Instant,
        cancelled: &AtomicBool,
    ) -> Result<(Arc<Connection>, u64, oneshot::Receiver<Reply>)> {
        for _ in 0..2 {
            let conn = self.connection(deadline, cancelled)?;
            if let Some((id, rx)) = self.send(&conn, method, params.clone())? {
                return Ok((conn, id, rx));
            }
        }
        Err(self.died_twice(method))
    }

    fn died_twice(&self, method: &str) -> Error {
        self.server_err(format!(
            "{method}: the server died twice before the request"
        ))
    }

    /// Sends `method` and waits (blocking the thread) up to `limit`, start included.
    pub fn request_blocking(&self, method: &str, params: Value, limit: Duration) -> Result<Value> {
        let deadline = Instant::now() + limit;
        if let Some(http) = &self.http {
            return http
                .request(
                    &self.next_id,
                    method,
                    params,
                    limit,
                    deadline,
                    &AtomicBool::new(false),
                )
                .map_err(|e| self.server_err(format!("{method}: {e}")));
        }
        let (conn, id, rx) = self.send_live(method, &params, deadline, &AtomicBool::new(false))?;
        let sent = Instant::now();
        let outcome = wait_blocking(rx, deadline, limit);
        self.settle(&conn, (id, sent), method, limit, outcome)
    }

    /// The end of a request: an answer resets the count of missed ones; a miss is counted,
    /// cancelled, and restarts the server when its input is blocked or it missed
    /// `restart_after_timeouts` in a row.
    /// A miss is the server's only when the request had at least half of `limit` after it
    /// was `sent`: a call that spent its time waiting for a restart must not count against
    /// the new server.
    fn settle(
        &self,
        conn: &Connection,
        (id, sent): (u64, Instant),
        method: &str,
        limit: Duration,
        outcome: std::result::Result<Value, String>,
    ) -> Result<Value> {
        match outcome {
            Ok(v) => {
                conn.timeouts.store(0, Ordering::Relaxed);
                Ok(v)
            }
            Err(e) => {
                lock(&conn.pending).remove(&id);
                let mut why = e;
                if why.starts_with("no answer") && sent.elapsed() < limit / 2 {
                    why.push_str(" (most of it spent before the request was sent)");
                    self.cancel(conn, id, &why);
                } else if why.starts_with("no answer") {
                    let missed = conn.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                    if conn.write_stuck(limit) {
                        conn.abandon();
                        why.push_str(" (the server stopped reading its input; restarted)");
                    } else if missed >= self.config.restart_after_timeouts.max(1) {
                        conn.abandon();
                        why.push_str(&format!(" ({missed} in a row; restarted)"));
                    } else {
                        self.cancel(conn, id, &why);
                    }
                }
                Err(self.server_err(format!("{method}: {why}{}", tail_text(&conn.stderr_tail))))
            }
        }
    }

    /// Sends `method` and awaits the answer; `limit` bounds the whole call, a restart of
    /// the server included. A server that died is restarted first, on a blocking thread, by
    /// one call while the others wait for it. Dropping the future (the episode gave up)
    /// withdraws the request and tells the server.
    pub async fn request(
        self: &Arc<Self>,
        method: &str,
        params: Value,
        limit: Duration,
    ) -> Result<Value> {
        let deadline = Instant::now() + limit;
        let cancel = CancelOnDrop::default();
        if self.http.is_some() {
            let (this, method_owned, flag) = (self.clone(), method.to_string(), cancel.flag());
            let call = tokio::task::spawn_blocking(move || {
                let http = this.http.as_ref().expect("an HTTP client");
                http.request(&this.next_id, &method_owned, params, limit, deadline, &flag)
                    .map_err(|e| this.server_err(format!("{method_owned}: {e}")))
            });
            // The blocking side keeps the deadline itself; this is its backstop.
            let backstop = tokio::time::Instant::from_std(deadline + HTTP_GRACE);
            return match tokio::time::timeout_at(backstop, call).await {
                Ok(joined) => {
                    joined.map_err(|e| self.server_err(format!("request task failed: {e}")))?
                }
                Err(_) => Err(self.server_err(format!("{method}: no answer within {limit:?}"))),
            };
        }
        let mut tries = 0;
        let (conn, id, rx) = loop {
            let conn = match self.conn.live(Connection::is_alive) {
                Some(conn) => conn,
                None => {
                    let (this, flag) = (self.clone(), cancel.flag());
                    let start =
                        tokio::task::spawn_blocking(move || this.connection(deadline, &flag));
                    match tokio::time::timeout_at(deadline.into(), start).await {
                        Ok(joined) => joined
                            .map_err(|e| self.server_err(format!("start task failed: {e}")))??,
                        Err(_) => {
                            return Err(self.server_err(format!(
                                "{method}: the server did not start within {limit:?}"
                            )))
                        }
                    }
                }
            };
            if let Some((id, rx)) = self.send(&conn, method, params.clone())? {
                break (conn, id, rx);
            }
            tries += 1;
            if tries == 2 {
                return Err(self.died_twice(method));
            }
        };
        let sent = Instant::now();
        let mut unanswered = Unanswered {
            client: self,
            conn: &conn,
            id,
            armed: true,
        };
        let outcome = match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err("the server closed the connection".to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        };
        unanswered.armed = false;
        self.settle(&conn, (id, sent), method, limit, outcome)
    }

    /// Tells a live server we stopped waiting for request `id`.
    fn cancel(&self, conn: &Connection, id: u64, reason: &str) {
        if conn.alive.load(Ordering::Acquire) {
            let _ = conn.write(
                &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": id, "reason": reason}}),
            );
        }
    }

    /// All tools of the server (following `nextCursor` pages). Like the handshake, gives up
    /// at once when the process is asked to shut down.
    pub fn list_tools(self: &Arc<Self>) -> Result<Vec<McpToolInfo>> {
        if self.http.is_none() {
            return self.list_pages(); // its waits watch for a shutdown themselves
        }
        let this = self.clone();
        unless_shutdown(move || this.list_pages())
            .map_err(|e| self.server_err(format!("tools/list: {e}")))?
    }

    fn list_pages(&self) -> Result<Vec<McpToolInfo>> {
        let limit = Duration::from_secs_f64(self.config.init_timeout_secs.max(0.1));
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..1000 {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request_blocking("tools/list", params, limit)?;
            let listed: Vec<McpToolInfo> =
                serde_json::from_value(page.get("tools").cloned().unwrap_or(json!([])))
                    .map_err(|e| self.server_err(format!("tools/list: unexpected answer: {e}")))?;
            tools.extend(listed);
            cursor = page
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(String::from);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }
}

/// Runs a blocking setup step (an HTTP request, which cannot be interrupted) on a thread of
/// its own and waits for it, giving up as soon as the process is asked to shut down (the
/// step is left to end at its own deadline).
fn unless_shutdown<T: Send + 'static>(
    step: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("mcp-setup".into())
        .spawn(move || {
            let _ = tx.send(step());
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(done) => return Ok(done),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the request's thread ended without an answer".into())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if crate::shutdown::requested() {
                    return Err("given up: the process is shutting down".into());
                }
            }
        }
    }
}

fn wait_blocking(
    mut rx: oneshot::Receiver<Reply>,
    deadline: Instant,
    limit: Duration,
) -> std::result::Result<Value, String> {
    loop {
        match rx.try_recv() {
            Ok(reply) => return reply,
            Err(oneshot::error::TryRecvError::Closed) => {
                return Err("the server closed the connection".into())
            }
            Err(oneshot::error::TryRecvError::Empty) => {
                if Instant::now() >= deadline {
                    return Err(format!("no answer within {limit:?}"));
                }
                if crate::shutdown::requested() {
                    return Err("given up: the process is shutting down".into());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// One JSON-RPC message as the line written to the server.
fn frame(msg: &Value) -> Vec<u8> {
    let mut line = msg.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// Owns the server's stdin: writes queued messages one by one, recording when each write
/// began so a blocked one can be told from a slow server.
fn spawn_writer(
    mut stdin: ChildStdin,
    queued: std::sync::mpsc::Receiver<Vec<u8>>,
    writing_since: Arc<AtomicU64>,
    epoch: Instant,
    alive: Arc<AtomicBool>,
) {
    std::thread::spawn(move || {
        for line in queued {
            writing_since.store(epoch.elapsed().as_millis() as u64 + 1, Ordering::Release);
            let written = stdin.write_all(&line).and_then(|()| stdin.flush());
            writing_since.store(0, Ordering::Release);
            if written.is_err() {
                alive.store(false, Ordering::Release);
                break;
            }
        }
    });
}

/// One line of `r` into `buf` (without the newline), holding at most `cap` bytes: `Ok(true)`
/// for a line, `Ok(false)` at the end of input, an error for a line longer than `cap`.
fn read_capped_line(r: &mut impl BufRead, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<bool> {
    buf.clear();
    loop {
        let available = r.fill_buf()?;
        if available.is_empty() {
            return Ok(!buf.is_empty());
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        if buf.len() + take > cap {
            return Err(std::io::Error::other(format!(
                "the server wrote a line over {cap} bytes"
            )));
        }
        buf.extend_from_slice(&available[..take]);
        r.consume(take + usize::from(done));
        if done {
            return Ok(true);
        }
    }
}

/// What the threads that can see a server's end share: the requests waiting on it, whether
/// it is alive, and its stderr tail.
#[derive(Clone)]
struct Ends {
    pending: Pending,
    alive: Arc<AtomicBool>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    reaped: Arc<Mutex<bool>>,
}

impl Ends {
    /// Marks the connection dead, then fails every waiting request with `why` and the
    /// stderr tail (in that order, under the lock `send` inserts under: see there).
    fn fail_all(&self, why: &str) {
        self.alive.store(false, Ordering::Release);
        let why = format!("{why}{}", tail_text(&self.stderr_tail));
        for (_, tx) in lock(&self.pending).drain() {
            let _ = tx.send(Err(why.clone()));
        }
    }
}

fn spawn_reader(
    stdout: impl Read + Send + 'static,
    outbox: SyncSender<Vec<u8>>,
    ends: Ends,
    max_line_bytes: usize,
    pid: u32,
    done: std::sync::mpsc::Sender<()>,
) {
    let answer = move |msg: &Value| {
        let _ = outbox.try_send(frame(msg));
    };
    std::thread::spawn(move || {
        let _done = done; // dropped when this thread ends: the exit watcher's sign
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        let ended = loop {
            match read_capped_line(&mut reader, &mut buf, max_line_bytes) {
                Ok(true) => {}
                Ok(false) => break "the server exited".to_string(),
                Err(e) => {
                    // A runaway line: the server is broken; kill it rather than read on.
                    kill_unreaped(&ends.reaped, pid);
                    break format!("{e}; restarted");
                }
            }
            let line = String::from_utf8_lossy(&buf);
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                tracing::debug!("mcp: ignoring non-JSON line from the server: {line:.200}");
                continue;
            };
            let id = msg.get("id").and_then(Value::as_u64);
            match (msg.get("method").and_then(Value::as_str), id) {
                // A request from the server: answer pings, refuse the rest.
                (Some(method), Some(_)) => {
                    let reply = if method == "ping" {
                        json!({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
                    } else {
                        json!({"jsonrpc": "2.0", "id": msg["id"],
                               "error": {"code": -32601, "message": "method not found"}})
                    };
                    answer(&reply);
                }
                (Some(_), None) => {} // a notification (log, progress): ignored
                (None, Some(id)) => {
                    let reply = match (msg.get("result"), msg.get("error")) {
                        (Some(result), _) => Ok(result.clone()),
                        (None, Some(err)) => Err(format!(
                            "server error {}: {}",
                            err.get("code").cloned().unwrap_or(Value::Null),
                            err.get("message").and_then(Value::as_str).unwrap_or("?")
                        )),
                        (None, None) => Err("response without result or error".into()),
                    };
                    if let Some(tx) = lock(&ends.pending).remove(&id) {
                        let _ = tx.send(reply);
                    }
                }
                (None, None) => {}
            }
        };
        ends.fail_all(&ended);
    });
}

/// Watches the server process itself. Its stdout closing is the usual sign that it exited,
/// but a process it started outside its group (`setsid`) can hold stdout open after it
/// exited, and the calls waiting on it would each wait out their limit. Once the server has
/// exited, the reader gets `READER_GRACE` to read what was written before; when it is still
/// reading after that, the connection is marked dead and the waiting requests fail. (The
/// reader thread then ends when that other process closes its stdout.)
fn spawn_exit_watcher(pid: u32, reader_ended: std::sync::mpsc::Receiver<()>, ends: Ends) {
    let Some(pidfd) = pidfd_open(pid) else {
        return; // a kernel before 5.3: the reader's end of input is the only sign
    };
    std::thread::spawn(move || {
        let mut watched = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd; the pidfd becomes readable when the process exits.
            if unsafe { libc::poll(&mut watched, 1, -1) } > 0 {
                break;
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return; // cannot watch: the reader's end of input stays the only sign
            }
        }
        drop(pidfd);
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            reader_ended.recv_timeout(READER_GRACE)
        {
            ends.fail_all("the server exited (a process it started still holds its output)");
        }
    });
}

/// Keeps the last 5 lines of the server's stderr, 300 characters each, read as bytes (a
/// line without an end is cut, never held whole).
fn spawn_stderr_reader(stderr: impl Read + Send + 'static, tail: Arc<Mutex<VecDeque<String>>>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut chunk = [0u8; 4096];
        let mut line: Vec<u8> = Vec::new();
        let push = |line: &mut Vec<u8>| {
            let mut t = lock(&tail);
            if t.len() == 5 {
                t.pop_front();
            }
            t.push_back(String::from_utf8_lossy(line).chars().take(300).collect());
            line.clear();
        };
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for &b in &chunk[..n] {
                if b == b'\n' {
                    push(&mut line);
                } else if line.len() < 1200 {
                    line.push(b);
                }
            }
        }
        if !line.is_empty() {
            push(&mut line);
        }
    });
}
