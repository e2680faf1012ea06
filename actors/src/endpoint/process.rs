//! An outside agent's process: its own process group, its input written, the ends of its
//! output kept, and the whole group killed when the episode is done with it (dropped
//! included), so nothing it started outlives its episode.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// The most of stdout kept (its end: the reward is its last line).
const STDOUT_TAIL: usize = 1 << 20;
/// The most of stderr kept (its end, for error messages).
const STDERR_TAIL: usize = 4 << 10;
/// Longest the pipes are read after the group is killed.
const DRAIN: Duration = Duration::from_secs(10);

/// A running agent program.
pub struct AgentProcess {
    child: Child,
    pgid: Option<i32>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

/// What a finished program left.
#[derive(Debug, Clone)]
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// The end of its stdout.
    pub stdout: String,
    /// The end of its stderr.
    pub stderr: String,
}

impl AgentProcess {
    /// Starts `command` in a new process group with `env` added and `input` on its stdin.
    pub fn spawn(
        command: &[String],
        dir: Option<&Path>,
        env: &[(&str, String)],
        input: Vec<u8>,
    ) -> std::io::Result<Self> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let pgid = child.id().map(|id| id as i32);
        if let Some(mut stdin) = child.stdin.take() {
            // A program that never reads its input must not hold the episode up.
            tokio::spawn(async move {
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        let stdout = child
            .stdout
            .take()
            .map(|s| tokio::spawn(tail(s, STDOUT_TAIL)));
        let stderr = child
            .stderr
            .take()
            .map(|s| tokio::spawn(tail(s, STDERR_TAIL)));
        Ok(Self {
            child,
            pgid,
            stdout,
            stderr,
        })
    }

    /// The process group's id.
    pub fn pgid(&self) -> Option<i32> {
        self.pgid
    }

    /// Waits for the program to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kills what is left of the group (the program's own children included) and reads the
    /// ends of its output.
    pub async fn finish(mut self, status: ExitStatus) -> Finished {
        self.kill_group();
        let read = |h: Option<JoinHandle<Vec<u8>>>| async move {
            match h {
                Some(h) => match tokio::time::timeout(DRAIN, h).await {
                    Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                    _ => String::new(),
                },
                None => String::new(),
            }
        };
        let stdout = read(self.stdout.take()).await;
        let stderr = read(self.stderr.take()).await;
        Finished {
            status,
            stdout,
            stderr,
        }
    }

    /// Sends SIGKILL to the whole group.
    pub fn kill_group(&mut self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg only sends a signal; a group that is gone answers ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(h) = self.stdout.take() {
            h.abort();
        }
        if let Some(h) = self.stderr.take() {
            h.abort();
        }
    }
}

/// Reads `r` to its end, keeping the last `keep` bytes.
async fn tail(mut r: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * keep {
                    kept.drain(..kept.len() - keep);
                }
            }
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}
