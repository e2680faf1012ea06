//! `python`: runs a snippet in a separate `python3` process.
//!
//! Each call gets a fresh scratch directory as cwd and `HOME` (deleted afterwards), a clean
//! environment, `python3 -I` (isolated mode: no user site-packages, no `PYTHON*` variables),
//! its own process group (killed as a whole on timeout or cancellation), resource limits set
//! with `setrlimit` before `exec` (address space, CPU seconds, file size, open files, no core
//! dumps) and, where the machine allows, an empty network namespace
//! ([`sandbox::net_isolation`]). Stdout and stderr are captured and cut to a byte limit.
//! It is not a security boundary against a determined attacker: the file system is the
//! host's (read and write where the user running agent-r1 may), see `docs/tools.md`.

pub mod sandbox;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, Result};
use crate::tool::{Tool, ToolOutput};

pub use sandbox::{net_isolation, NetIsolation};

/// Settings of the python tool (`[tools.python]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PythonConfig {
    /// The interpreter.
    pub python: PathBuf,
    /// Wall-clock limit of a run, seconds (the process group is killed past it).
    pub timeout_secs: f64,
    /// CPU-time limit, seconds (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// Address-space limit, MiB (`RLIMIT_AS`).
    pub memory_mib: u64,
    /// Largest file the snippet may write, MiB (`RLIMIT_FSIZE`).
    pub file_size_mib: u64,
    /// Most bytes kept of stdout and of stderr each.
    pub max_output_bytes: usize,
    /// Refuse to run when no network isolation is available (default: run and report it).
    pub require_no_network: bool,
    /// Calls that may run at once.
    pub max_concurrency: usize,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            python: PathBuf::from("python3"),
            timeout_secs: 10.0,
            cpu_secs: 10,
            memory_mib: 1024,
            file_size_mib: 16,
            max_output_bytes: 16 * 1024,
            require_no_network: false,
            max_concurrency: 4,
        }
    }
}

/// The python tool.
#[derive(Debug, Clone, Default)]
pub struct PythonTool {
    config: PythonConfig,
}

/// What one run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// Captured stdout (cut to the limit).
    pub stdout: String,
    /// Captured stderr (cut to the limit).
    pub stderr: String,
    /// Exit code, if the process exited.
    pub exit_code: Option<i32>,
    /// Signal that ended the process, if any.
    pub signal: Option<i32>,
    /// Whether the wall-clock limit killed it.
    pub timed_out: bool,
    /// Wall time.
    pub elapsed: Duration,
}

impl PythonTool {
    /// A tool with `config`.
    pub fn new(config: PythonConfig) -> Result<Self> {
        if !(config.timeout_secs > 0.0 && config.timeout_secs.is_finite()) {
            return Err(Error::Config {
                key: "tools.python.timeout_secs".into(),
                message: format!("must be a positive number, got {}", config.timeout_secs),
            });
        }
        if config.require_no_network && net_isolation() == NetIsolation::None {
            return Err(Error::Config {
                key: "tools.python.require_no_network".into(),
                message: "no network namespace can be created on this machine (needs root, \
                          CAP_SYS_ADMIN or unprivileged user namespaces)"
                    .into(),
            });
        }
        Ok(Self { config })
    }

    /// The settings.
    pub fn config(&self) -> &PythonConfig {
        &self.config
    }

    /// Runs `code` once under the limits.
    pub async fn run(&self, code: &str) -> Result<RunResult> {
        let cfg = &self.config;
        let scratch = tempfile::Builder::new()
            .prefix("agent-r1-python-")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let script = scratch.path().join("main.py");
        std::fs::write(&script, code).map_err(|e| Error::io(&script, e))?;
        let mut cmd = tokio::process::Command::new(&cfg.python);
        cmd.arg("-I")
            .arg("main.py")
            .current_dir(scratch.path())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", scratch.path())
            .env("TMPDIR", scratch.path())
            .env("LANG", "C.UTF-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONIOENCODING", "utf-8")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let limits = [
            (libc::RLIMIT_AS, cfg.memory_mib.saturating_mul(1 << 20)),
            (libc::RLIMIT_CPU, cfg.cpu_secs.max(1)),
            (
                libc::RLIMIT_FSIZE,
                cfg.file_size_mib.saturating_mul(1 << 20),
            ),
            (libc::RLIMIT_NOFILE, 256),
            (libc::RLIMIT_CORE, 0),
        ];
        let net = net_isolation().flags();
        // SAFETY: between fork and exec only async-signal-safe syscalls run (setrlimit,
        // unshare); no allocation happens (the arrays are copied in beforehand).
        unsafe {
            cmd.pre_exec(move || {
                for (resource, value) in limits {
                    // For CPU time the hard limit is one second later, so the process gets
                    // SIGXCPU (reported as such) rather than a bare SIGKILL.
                    let hard = if resource == libc::RLIMIT_CPU {
                        value + 1
                    } else {
                        value
                    };
                    let lim = libc::rlimit {
                        rlim_cur: value as libc::rlim_t,
                        rlim_max: hard as libc::rlim_t,
                    };
                    if libc::setrlimit(resource, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(flags) = net {
                    if libc::unshare(flags) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| Error::Tool {
            tool: "python".into(),
            message: format!("cannot start `{}`: {e}", cfg.python.display()),
        })?;
        let group = child.id().map(|pid| ProcessGroup(pid as libc::pid_t));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Error::Other("python: pipes missing".into()));
        };
        let limit = cfg.max_output_bytes;
        let out_task = tokio::spawn(read_capped(stdout, limit));
        let err_task = tokio::spawn(read_capped(stderr, limit));
        let wall = Duration::from_secs_f64(cfg.timeout_secs);
        let (status, timed_out) = match tokio::time::timeout(wall, child.wait()).await {
            Ok(status) => (
                Some(status.map_err(|e| Error::Other(format!("python: {e}")))?),
                false,
            ),
            Err(_) => {
                if let Some(g) = &group {
                    g.kill();
                }
                let status = child.wait().await.ok();
                (status, true)
            }
        };
        // Grandchildren that kept the pipes open go with the group too.
        if let Some(g) = &group {
            g.kill();
        }
        let stdout = out_task.await.unwrap_or_default();
        let stderr = err_task.await.unwrap_or_default();
        drop(group);
        Ok(RunResult {
            stdout,
            stderr,
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            timed_out,
            elapsed: start.elapsed(),
        })
    }
}

/// Kills the whole process group when dropped (a cancelled call leaves nothing behind).
struct ProcessGroup(libc::pid_t);

impl ProcessGroup {
    fn kill(&self) {
        // SAFETY: plain syscall; the group id is our child's pid (process_group(0)).
        unsafe {
            libc::kill(-self.0, libc::SIGKILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads all of `r`, keeping the first `limit` bytes (lossy UTF-8) plus a cut marker.
async fn read_capped(mut r: impl AsyncRead + Unpin, limit: usize) -> String {
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut buf = vec![0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                dropped += n.saturating_sub(room);
            }
        }
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        text.push_str(&format!("\n...[{dropped} more bytes truncated]"));
    }
    text
}

/// The observation for a run: stdout, then stderr and the exit status when there is
/// something to say.
pub fn format_run(r: &RunResult, timeout_secs: f64) -> String {
    let mut text = r.stdout.clone();
    if !r.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&r.stderr);
    }
    let status = if r.timed_out {
        Some(format!(
            "killed: wall-clock limit of {timeout_secs}s exceeded"
        ))
    } else if let Some(sig) = r.signal {
        let why = match sig {
            libc::SIGXCPU => " (CPU time limit exceeded)",
            libc::SIGXFSZ => " (file size limit exceeded)",
            libc::SIGKILL => " (killed)",
            _ => "",
        };
        Some(format!("killed by signal {sig}{why}"))
    } else {
        match r.exit_code {
            Some(0) | None => None,
            Some(code) => Some(format!("exit code {code}")),
        }
    };
    if let Some(status) = status {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[{status}]"));
    }
    if text.is_empty() {
        text.push_str("[no output]");
    }
    text
}

#[async_trait]
impl Tool for PythonTool {
    fn name(&self) -> &str {
        "python"
    }
    fn description(&self) -> &str {
        "Run a Python 3 snippet and return what it prints (stdout, then stderr). Each call \
         starts fresh: no state is kept between calls and there is no network."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run."}},
            "required": ["code"]
        })
    }
    fn timeout(&self) -> Duration {
        // The tool enforces its own wall-clock limit (and reports partial output); the
        // executor's limit is a backstop.
        Duration::from_secs_f64(self.config.timeout_secs + 5.0)
    }
    fn max_concurrency(&self) -> usize {
        self.config.max_concurrency
    }
    async fn call(&self, arguments: Value) -> Result<ToolOutput> {
        let code = arguments
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let run = self.run(code).await?;
        let mut out = ToolOutput::text(format_run(&run, self.config.timeout_secs));
        let meta = &mut out.metadata;
        meta.insert("exit_code".into(), json!(run.exit_code));
        meta.insert("signal".into(), json!(run.signal));
        meta.insert("timed_out".into(), json!(run.timed_out));
        meta.insert("elapsed_ms".into(), json!(run.elapsed.as_millis() as u64));
        meta.insert("network_isolation".into(), json!(net_isolation().label()));
        Ok(out)
    }
}
