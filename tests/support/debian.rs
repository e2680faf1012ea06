//! Programs a test needs from Debian packages (prometheus, chromium): found on PATH, or
//! installed with apt-get where the test runs as root and the environment allows it.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// apt-get update / install, each.
const APT_TIMEOUT: Duration = Duration::from_secs(300);

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion within `limit`; Err names what went wrong.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    // Drain the pipes on threads so that a chatty child never blocks on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    // The child is waited for on a thread, which reports its exit; past `limit` it is
    // killed by pid (the thread then reaps it).
    let pid = child.id() as libc::pid_t;
    let (tx, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match exited.recv_timeout(limit) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("{shown}: {e}")),
        Err(_) => {
            // SAFETY: plain syscall; the pid is our unreaped child's.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = exited.recv();
            return Err(format!("{shown}: still running after {limit:?}, killed"));
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if status.success() {
        Ok(())
    } else {
        let tail: String = format!("{out}\n{err}")
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        Err(format!("{shown} failed ({status}):\n{tail}"))
    }
}

/// `name` on PATH, or in /usr/bin, /usr/local/bin.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/usr/local/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `programs` (all of them), installing Debian's `package` where allowed: as root, with
/// apt-get, unless `AGENT_R1_INSTALL_{VAR}=0`. Err is why they cannot be had.
pub fn debian_programs(
    test: &str,
    package: &str,
    programs: &[&str],
    var: &str,
) -> Result<Vec<PathBuf>, String> {
    let found = || {
        programs
            .iter()
            .map(|p| find_program(p))
            .collect::<Option<Vec<_>>>()
    };
    if let Some(all) = found() {
        return Ok(all);
    }
    let missing = format!(
        "{} not installed (Debian package `{package}`)",
        programs
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let install_var = format!("AGENT_R1_INSTALL_{var}");
    if std::env::var(&install_var).as_deref() == Ok("0") {
        return Err(format!(
            "{missing}, and {install_var}=0 forbids installing it"
        ));
    }
    if !is_root() {
        return Err(format!(
            "{missing}, and installing it needs root (run `apt-get install {package}`)"
        ));
    }
    let Some(apt) = find_program("apt-get") else {
        return Err(format!("{missing}, and there is no apt-get to install it"));
    };
    let _ = writeln!(
        std::io::stderr(),
        "{test}: installing Debian's {package} package (apt-get update, install) ..."
    );
    let t0 = Instant::now();
    let apt_cmd = |args: &[&str]| {
        let mut c = Command::new(&apt);
        c.args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null());
        c
    };
    run_bounded(&mut apt_cmd(&["update"]), APT_TIMEOUT)
        .map_err(|e| format!("{missing}; apt-get update failed: {e}"))?;
    run_bounded(
        &mut apt_cmd(&["install", "-y", "--no-install-recommends", package]),
        APT_TIMEOUT,
    )
    .map_err(|e| format!("{missing}; installing it failed: {e}"))?;
    let _ = writeln!(
        std::io::stderr(),
        "{test}: installed in {:.0}s",
        t0.elapsed().as_secs_f64()
    );
    found()
        .ok_or_else(|| format!("{missing}; the package installed but the programs are not on PATH"))
}

/// Prints `SKIPPED: test: why` to the process's stderr (libtest swallows `eprintln!` of a
/// passing test, and a skip must never pass silently), or panics when `AGENT_R1_REQUIRE_{VAR}=1`.
pub fn skip(test: &str, var: &str, why: &str) {
    let require = format!("AGENT_R1_REQUIRE_{var}");
    if std::env::var(&require).as_deref() == Ok("1") {
        panic!("{require}=1 but {why}");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}
