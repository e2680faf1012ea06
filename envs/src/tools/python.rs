//! `python`: runs a snippet in a separate `python3` process.
//!
//! Each call gets a fresh scratch directory as cwd and `HOME` (deleted afterwards), a clean
//! environment, `python3 -I` (isolated mode: no user site-packages, no `PYTHON*` variables),
//! its own process group (killed as a whole on timeout or cancellation), resource limits set
//! with `setrlimit` before `exec` (address space, CPU seconds, file size, open files, no core
//! dumps, processes), and, where control groups can be made, a group of its own that bounds
//! the memory, processes and CPU of everything it starts ([`cgroup`]). Where bubblewrap is installed and works, the call runs in its sandbox
//! ([`bubblewrap`]: own namespaces, unprivileged, seccomp, read-only system, private /tmp);
//! else only in an empty network namespace where the machine allows
//! ([`sandbox::net_isolation`]), which is not a boundary (see `docs/tools.md`). Stdout and
//! stderr are captured and cut to a byte limit.

pub mod bubblewrap;
pub mod cgroup;
pub mod sandbox;

use std::ffi::OsString;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::call_key::{CallKey, PYTHON_ENV_VAR};
use crate::config::Section;
use crate::error::{Error, Result};
use crate::kinds::KindOptions;
use crate::tool::{Tool, ToolOutput};

pub use sandbox::{isolation, net_isolation, Isolation, NetIsolation};

/// Settings of the python tool (`[tools.python]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PythonConfig {
    /// The interpreter.
    pub python: PathBuf,
    /// Wall-clock limit of a run, seconds (the process group is killed past it).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub timeout_secs: f64,
    /// CPU-time limit, seconds (`RLIMIT_CPU`).
    #[schemars(range(min = 1))]
    pub cpu_secs: u64,
    /// Address-space limit of each process, MiB (`RLIMIT_AS`), and, where the call has a
    /// control group, the memory of all its processes together.
    #[schemars(range(min = 1))]
    pub memory_mib: u64,
    /// CPU a call may use per wall-clock second, in cores (enforced by its control group).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1024.0))]
    pub cpu_cores: f64,
    /// Largest file the snippet may write, MiB (`RLIMIT_FSIZE`).
    pub file_size_mib: u64,
    /// Most bytes kept of stdout and of stderr each.
    pub max_output_bytes: usize,
    /// Refuse to run when no network isolation is available (default: run and report it).
    pub require_no_network: bool,
    /// Refuse to run when the bubblewrap sandbox is not available (default: run in the
    /// weaker process isolation and report it).
    pub require_sandbox: bool,
    /// Run calls in the bubblewrap sandbox where it works (`false`: as plain processes,
    /// with the weaker isolation docs/tools.md describes, e.g. for an interpreter that needs
    /// files the sandbox does not show).
    pub sandbox: bool,
    /// Refuse to run when no control group per call can be made here (default: run without
    /// one and report it).
    pub require_cgroup: bool,
    /// Most processes (and threads) a snippet may have at once: its control group's
    /// `pids.max` where it has one, and `RLIMIT_NPROC` in the sandbox (without the sandbox
    /// that rlimit is not set, as it would count the user's processes).
    #[schemars(range(min = 1))]
    pub max_processes: u64,
    /// Size of the sandbox's private /tmp, MiB.
    #[schemars(range(min = 1))]
    pub tmp_mib: u64,
    /// The host uid the sandbox runs as when agent-r1 runs as root (default `nobody`).
    pub sandbox_uid: u32,
    /// Calls that may run at once.
    #[schemars(range(min = 1))]
    pub max_concurrency: usize,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            python: PathBuf::from("python3"),
            timeout_secs: 10.0,
            cpu_secs: 10,
            memory_mib: 1024,
            cpu_cores: 1.0,
            file_size_mib: 16,
            max_output_bytes: 16 * 1024,
            require_no_network: false,
            require_sandbox: false,
            sandbox: true,
            require_cgroup: false,
            max_processes: 64,
            tmp_mib: 64,
            sandbox_uid: 65534,
            max_concurrency: 4,
        }
    }
}

impl Section for PythonConfig {}

impl KindOptions for PythonConfig {
    fn validate(&self) -> Result<()> {
        Section::validate(self).map_err(|e| e.under("tools.python").into())
    }

    fn keys() -> Vec<crate::config::KeyDoc> {
        crate::config::key_docs::<Self>()
    }
}

/// The python tool.
#[derive(Debug, Clone)]
pub struct PythonTool {
    config: PythonConfig,
    isolation: Isolation,
    description: String,
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
    /// The memory limit of the call's control group, MiB, when the kernel killed a process
    /// of it for going past that limit.
    pub memory_exceeded_mib: Option<u64>,
    /// The call's control group version (`v2`, `v1`), if it had one.
    pub cgroup: Option<&'static str>,
    /// Wall time.
    pub elapsed: Duration,
}

impl PythonTool {
    /// A tool with `config`.
    pub fn new(config: PythonConfig) -> Result<Self> {
        KindOptions::validate(&config)?;
        if config.require_sandbox && !config.sandbox {
            return Err(Error::Config {
                key: "tools.python.require_sandbox".into(),
                message: "cannot be true while tools.python.sandbox is false".into(),
            });
        }
        // Probed here, at construction, so that no call pays for it on the async runtime.
        let isolation = match isolation() {
            Isolation::Bubblewrap(_) if !config.sandbox => Isolation::Process(net_isolation()),
            found => found.clone(),
        };
        if config.require_sandbox && !matches!(isolation, Isolation::Bubblewrap(_)) {
            return Err(Error::Config {
                key: "tools.python.require_sandbox".into(),
                message: "the bubblewrap sandbox is not available here (install Debian's \
                          `bubblewrap`; it needs user namespaces)"
                    .into(),
            });
        }
        if config.require_no_network && !isolation.no_network() {
            return Err(Error::Config {
                key: "tools.python.require_no_network".into(),
                message: "no network namespace can be created on this machine (needs root, \
                          CAP_SYS_ADMIN or unprivileged user namespaces)"
                    .into(),
            });
        }
        if config.require_cgroup {
            if let Err(why) = cgroup::hierarchy() {
                return Err(Error::Config {
                    key: "tools.python.require_cgroup".into(),
                    message: format!(
                        "no control group per call can be made here ({why}); it needs cgroup \
                         v2 with the memory and pids controllers delegated, or root on a \
                         cgroup v1 host"
                    ),
                });
            }
        }
        let description = description(&isolation, cgroup::hierarchy().is_ok());
        Ok(Self {
            config,
            isolation,
            description,
        })
    }

    /// A control group for one call, where they can be made (a failure to make one when the
    /// settings require it fails the call; else the call runs without and says so).
    fn call_group(&self) -> Result<Option<cgroup::CallGroup>> {
        let cfg = &self.config;
        let Ok(hierarchy) = cgroup::hierarchy() else {
            return Ok(None);
        };
        // The sandbox's own two processes (bubblewrap outside and its init inside) count too.
        let overhead = match self.isolation {
            Isolation::Bubblewrap(_) => 2,
            Isolation::Process(_) => 0,
        };
        let limits = cgroup::Limits {
            memory_bytes: cfg.memory_mib.saturating_mul(1 << 20),
            pids: cfg.max_processes.saturating_add(overhead),
            cpu_cores: cfg.cpu_cores,
        };
        match cgroup::CallGroup::create(hierarchy, limits) {
            Ok(group) => Ok(Some(group)),
            Err(e) if cfg.require_cgroup => Err(Error::Tool {
                tool: "python".into(),
                message: format!("cannot make the call's control group: {e}"),
            }),
            Err(e) => {
                tracing::warn!("python tool: a call runs without its control group: {e}");
                Ok(None)
            }
        }
    }

    /// The settings.
    pub fn config(&self) -> &PythonConfig {
        &self.config
    }

    /// How this tool's calls are isolated.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// Runs `code` once under the limits.
    pub async fn run(&self, code: &str) -> Result<RunResult> {
        self.run_with(code, &[]).await
    }

    /// [`Self::run`] with the environment variables `env` set for the snippet.
    pub async fn run_with(&self, code: &str, env: &[(&str, &str)]) -> Result<RunResult> {
        let cfg = &self.config;
        let scratch = tempfile::Builder::new()
            .prefix("agent-r1-python-")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let script = scratch.path().join("main.py");
        std::fs::write(&script, code).map_err(|e| Error::io(&script, e))?;
        let sandbox = match &self.isolation {
            Isolation::Bubblewrap(bwrap) => Some(bwrap.as_path()),
            Isolation::Process(_) => None,
        };
        let group = self.call_group()?;
        let joins = group.as_ref().map(|g| g.join_fds()).unwrap_or_default();
        let mut cmd =
            tokio::process::Command::from(command(cfg, scratch.path(), sandbox, joins, env)?);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| Error::Tool {
            tool: "python".into(),
            message: format!("cannot start `{}`: {e}", cfg.python.display()),
        })?;
        let process_group = child.id().map(|pid| ProcessGroup(pid as libc::pid_t));
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
                if let Some(g) = &process_group {
                    g.kill();
                }
                if let Some(g) = &group {
                    g.kill_all();
                }
                // The snippet itself too, should it have moved to another process group.
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                (status, true)
            }
        };
        // Grandchildren that kept the pipes open go with the group too (and, with a control
        // group, those that left the process group with setsid()).
        if let Some(g) = &process_group {
            g.kill();
        }
        let memory_exceeded_mib = group.as_ref().and_then(|g| {
            g.kill_all();
            g.oom_killed().then(|| g.memory_bytes() >> 20)
        });
        // Everything in the group is dead; a pipe still open now is held by something that
        // escaped it, so the drain is bounded too.
        let drain = Duration::from_secs(2);
        let stdout = match tokio::time::timeout(drain, out_task).await {
            Ok(r) => r.unwrap_or_default(),
            Err(_) => "[output not drained]".into(),
        };
        let stderr = match tokio::time::timeout(drain, err_task).await {
            Ok(r) => r.unwrap_or_default(),
            Err(_) => "[output not drained]".into(),
        };
        drop(process_group);
        let cgroup = group.as_ref().map(|g| g.version());
        if let Some(group) = group {
            if let Err(e) = group.remove(Duration::from_secs(1)).await {
                tracing::debug!("python tool: the call's control group is removed later: {e}");
            }
        }
        let (mut exit_code, mut signal) = (
            status.and_then(|s| s.code()),
            status.and_then(|s| s.signal()),
        );
        // bubblewrap exits with 128 + N when the snippet was killed by signal N.
        if let (Some(_), Some(code @ 129..=192)) = (sandbox, exit_code) {
            (exit_code, signal) = (None, Some(code - 128));
        }
        // Without the sandbox the scratch directory's random name would reach the model (in
        // tracebacks): it reads as the sandbox's working directory, so that the same snippet
        // gives the same output on every call, with the sandbox or without.
        let (stdout, stderr) = match sandbox {
            Some(_) => (stdout, stderr),
            None => {
                let dir = scratch.path().to_string_lossy().into_owned();
                (
                    stdout.replace(&dir, bubblewrap::WORKDIR),
                    stderr.replace(&dir, bubblewrap::WORKDIR),
                )
            }
        };
        Ok(RunResult {
            stdout,
            stderr,
            exit_code,
            signal,
            timed_out,
            memory_exceeded_mib,
            cgroup,
            elapsed: start.elapsed(),
        })
    }
}

/// The interpreter the sandbox runs: a bare name (`python3`) is looked up on the sandbox's
/// own PATH (the system's directories, not the user's, which the sandbox cannot see); a path
/// is canonicalised, and the directory to show read-only in the sandbox is returned when it
/// lives outside the system directories.
fn interpreter(python: &Path) -> (PathBuf, Option<PathBuf>) {
    let found = if python.components().count() > 1 {
        Some(python.to_path_buf())
    } else {
        ["/usr/local/bin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(python))
            .find(|p| p.is_file())
    };
    let Some(real) = found.and_then(|p| p.canonicalize().ok()) else {
        return (python.to_path_buf(), None);
    };
    let system = ["/usr/", "/bin/", "/lib/", "/lib64/", "/sbin/"];
    if system.iter().any(|d| real.starts_with(d)) {
        return (real, None);
    }
    // PREFIX/bin/python3 -> PREFIX
    let prefix = real.parent().and_then(Path::parent).map(Path::to_path_buf);
    (real, prefix)
}

/// Sets `RLIMIT_NPROC` inside the sandbox, then becomes the snippet's interpreter (the limit
/// must be set after the sandbox's user namespace exists: set before, it would also cap the
/// host user's own processes).
const NPROC_BOOTSTRAP: &str = "import os, resource, sys\n\
n = int(sys.argv[1])\n\
resource.setrlimit(resource.RLIMIT_NPROC, (n, n))\n\
os.execv(sys.executable, [sys.executable, '-I', 'main.py'])";

/// The command for one call in `scratch` (which holds `main.py`): under bubblewrap at
/// `sandbox`, else as a plain process in an empty network namespace where possible; the
/// child first joins the control groups whose `cgroup.procs` are open at `cgroup_joins`.
fn command(
    cfg: &PythonConfig,
    scratch: &Path,
    sandbox: Option<&Path>,
    cgroup_joins: Vec<RawFd>,
    env: &[(&str, &str)],
) -> Result<std::process::Command> {
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
    let mut net = None;
    let mut drop_to = None;
    let mut seccomp: Vec<std::fs::File> = vec![];
    let mut cmd = match sandbox {
        Some(bwrap) => {
            let (python, extra_ro) = interpreter(&cfg.python);
            let mut program: Vec<OsString> = vec![python.into(), "-I".into(), "-c".into()];
            program.push(NPROC_BOOTSTRAP.into());
            program.push(cfg.max_processes.to_string().into());
            let args = bubblewrap::arguments(
                scratch,
                cfg.tmp_mib.saturating_mul(1 << 20),
                &extra_ro.into_iter().collect::<Vec<_>>(),
                &program,
                env,
            );
            for bytes in bubblewrap::seccomp_programs().map_err(Error::Other)? {
                let mut f = tempfile::tempfile().map_err(|e| Error::io(std::env::temp_dir(), e))?;
                f.write_all(&bytes)
                    .and_then(|()| f.rewind())
                    .map_err(|e| Error::io(std::env::temp_dir(), e))?;
                seccomp.push(f);
            }
            if bubblewrap::running_as_root() {
                let uid = cfg.sandbox_uid;
                std::os::unix::fs::chown(scratch, Some(uid), Some(uid))
                    .map_err(|e| Error::io(scratch, e))?;
                drop_to = Some(uid);
            }
            // bubblewrap stays in the sandbox as its PID 1, whose /proc/1/environ the snippet
            // can read: it gets no environment of ours (the snippet's is set by --setenv).
            let mut c = std::process::Command::new(bwrap);
            c.args(args).env_clear();
            c
        }
        None => {
            net = net_isolation().flags();
            let mut c = std::process::Command::new(&cfg.python);
            c.arg("-I")
                .arg("main.py")
                .current_dir(scratch)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", scratch)
                .env("TMPDIR", scratch)
                .env("LANG", "C.UTF-8")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONIOENCODING", "utf-8")
                .envs(env.iter().copied());
            c
        }
    };
    cmd.process_group(0);
    let fds: Vec<libc::c_int> = seccomp.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: between fork and exec only async-signal-safe syscalls run (write, setrlimit,
    // fcntl, dup2, setgroups, setgid, setuid, unshare); nothing allocates (the arrays are
    // copied in beforehand). The seccomp files stay open in the parent until the child has
    // exec'd (they are moved into the closure, which lives as long as the command); the
    // control groups' files stay open as long as the call's `CallGroup`, past the spawn.
    unsafe {
        cmd.pre_exec(move || {
            let _keep_open = &seccomp;
            // First, so that nothing the child does happens outside its groups.
            cgroup::join(&cgroup_joins)?;
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
            // The seccomp programs go to fds 3, 4, ... (copied above 10 first, so that dup2
            // never meets a descriptor that already is its target).
            for (i, fd) in fds.iter().enumerate() {
                let high = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
                if high < 0 || libc::dup2(high, 3 + i as libc::c_int) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(uid) = drop_to {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0
                {
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
    Ok(cmd)
}

/// Runs `print(6 * 7)` under bubblewrap exactly as a call would; Err says why it failed.
pub(crate) fn probe_bubblewrap(bwrap: &Path) -> std::result::Result<(), String> {
    let scratch = tempfile::Builder::new()
        .prefix("agent-r1-python-probe-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    std::fs::write(scratch.path().join("main.py"), "print(6 * 7)").map_err(|e| e.to_string())?;
    let cfg = PythonConfig::default();
    let out = command(&cfg, scratch.path(), Some(bwrap), vec![], &[])
        .map_err(|e| e.to_string())?
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() && out.stdout == b"42\n" {
        Ok(())
    } else {
        Err(format!(
            "probe exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
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

/// What the tool tells the model about itself: what the isolation here really is.
fn description(isolation: &Isolation, limited: bool) -> String {
    let mut text = match isolation {
        Isolation::Bubblewrap(_) => {
            "Run a Python 3 snippet and return what it prints (stdout, then stderr). Each \
             call starts fresh in a sandbox: no network, no state kept between calls, a \
             read-only system with the standard library only, and a private working \
             directory and /tmp."
        }
        Isolation::Process(NetIsolation::None) => {
            "Run a Python 3 snippet and return what it prints (stdout, then stderr). Each \
             call starts fresh: no state is kept between calls."
        }
        Isolation::Process(_) => {
            "Run a Python 3 snippet and return what it prints (stdout, then stderr). Each \
             call starts fresh: no state is kept between calls and there is no network."
        }
    }
    .to_string();
    if limited {
        text.push_str(" Its memory, processes and CPU are limited.");
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
    let status = if let Some(mib) = r.memory_exceeded_mib {
        Some(format!(
            "memory limit of {mib} MiB exceeded: the kernel killed a process"
        ))
    } else if r.timed_out {
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
        &self.description
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
        self.call_with(arguments, &[]).await
    }

    /// The snippet finds the key in its environment, as `AGENT_R1_IDEMPOTENCY_KEY`.
    async fn call_keyed(&self, key: &CallKey, arguments: Value) -> Result<ToolOutput> {
        let key = key.to_string();
        self.call_with(arguments, &[(PYTHON_ENV_VAR, &key)]).await
    }
}

impl PythonTool {
    async fn call_with(&self, arguments: Value, env: &[(&str, &str)]) -> Result<ToolOutput> {
        let code = arguments
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let run = self.run_with(code, env).await?;
        let mut out = ToolOutput::text(format_run(&run, self.config.timeout_secs));
        let meta = &mut out.metadata;
        meta.insert("exit_code".into(), json!(run.exit_code));
        meta.insert("signal".into(), json!(run.signal));
        meta.insert("timed_out".into(), json!(run.timed_out));
        meta.insert("elapsed_ms".into(), json!(run.elapsed.as_millis() as u64));
        meta.insert("isolation".into(), json!(self.isolation.label()));
        meta.insert("cgroup".into(), json!(run.cgroup));
        meta.insert(
            "memory_exceeded".into(),
            json!(run.memory_exceeded_mib.is_some()),
        );
        Ok(out)
    }
}
