//! A long-lived agent service the run starts itself (`service_command`): one process for
//! the whole run, which prints the URL episodes are posted to as the first line of its
//! stdout. It runs in a process group of its own, ended with the run (and with the thread
//! that started it, should the trainer die without cleaning up); a service that exits is
//! started again at the next episode, up to `max_restarts` times, with its stderr in the
//! error that says why.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{Error, Result};

/// The most of the service's stderr kept for error messages (its end).
const STDERR_TAIL: usize = 4 << 10;

/// The service: its command, started on first use.
pub struct AgentService {
    command: Vec<String>,
    dir: Option<PathBuf>,
    start_timeout: Duration,
    max_restarts: usize,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    starts: usize,
    last_failure: Option<String>,
}

struct Running {
    child: Child,
    pgid: Option<i32>,
    url: String,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Reads stderr into `stderr` until the pipe closes.
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// The end of the stderr of a service that has exited, read to the pipe's end (bounded:
    /// a child of the service may still hold it open).
    async fn last_words(&mut self) -> String {
        if let Some(reader) = self.stderr_reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        stderr_tail(&self.stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg only sends a signal; a group that is gone answers ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
    }
}

fn stderr_tail(stderr: &Mutex<VecDeque<u8>>) -> String {
    let bytes: Vec<u8> = stderr
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    let text = String::from_utf8_lossy(&bytes).trim().to_string();
    if text.is_empty() {
        "(nothing)".into()
    } else {
        text
    }
}

async fn keep_tail(mut r: impl AsyncRead + Unpin, kept: Arc<Mutex<VecDeque<u8>>>) {
    let mut buf = vec![0u8; 8 << 10];
    while let Ok(n @ 1..) = r.read(&mut buf).await {
        let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
        k.extend(&buf[..n]);
        let over = k.len().saturating_sub(STDERR_TAIL);
        k.drain(..over);
    }
}

impl AgentService {
    /// The service for `command` (run in `dir`), not started yet.
    pub fn new(
        command: Vec<String>,
        dir: Option<PathBuf>,
        start_timeout: Duration,
        max_restarts: usize,
    ) -> Self {
        Self {
            command,
            dir,
            start_timeout,
            max_restarts,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// The URL to post episodes to, starting (or restarting) the service when it is not
    /// running.
    pub async fn url(&self) -> Result<String> {
        let mut state = self.state.lock().await;
        if let Some(running) = &mut state.running {
            match running.child.try_wait() {
                Ok(None) => return Ok(running.url.clone()),
                Ok(Some(status)) => {
                    let why = format!(
                        "the agent service {:?} exited with {status}; its stderr ends: {}",
                        self.command[0],
                        running.last_words().await
                    );
                    tracing::warn!("{why}");
                    state.running = None;
                    state.last_failure = Some(why);
                }
                Err(e) => return Err(Error::Other(format!("the agent service: {e}"))),
            }
        }
        if state.starts > self.max_restarts {
            return Err(Error::Other(format!(
                "the agent service was started {} times (env.options.service_restarts {}) and \
                 is not restarted again; last: {}",
                state.starts,
                self.max_restarts,
                state.last_failure.as_deref().unwrap_or("(no reason)")
            )));
        }
        state.starts += 1;
        match self.start().await {
            Ok(running) => {
                tracing::info!("agent service at {}", running.url);
                let url = running.url.clone();
                state.running = Some(running);
                Ok(url)
            }
            Err(why) => {
                state.last_failure = Some(why.clone());
                Err(Error::Other(why))
            }
        }
    }

    async fn start(&self) -> std::result::Result<Running, String> {
        let program = &self.command[0];
        let mut cmd = Command::new(program);
        cmd.args(&self.command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; it makes the kernel kill the
        // service if the trainer dies without dropping it (a SIGKILL, an abort).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("the agent service {program:?} cannot start: {e}"))?;
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_reader = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(keep_tail(pipe, stderr.clone())));
        let mut running = Running {
            pgid: child.id().map(|id| id as i32),
            child,
            url: String::new(),
            stderr,
            stderr_reader,
        };
        let stdout = running.child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(self.start_timeout, lines.next_line()).await;
        let fail = |running: &Running, what: String| {
            format!(
                "the agent service {program:?} {what}; its stderr ends: {}",
                stderr_tail(&running.stderr)
            )
        };
        match first {
            Err(_) => {
                return Err(fail(
                    &running,
                    format!(
                        "printed no URL within {:?} (env.options.service_start_timeout_secs)",
                        self.start_timeout
                    ),
                ))
            }
            Ok(Err(e)) => return Err(fail(&running, format!("stdout cannot be read: {e}"))),
            Ok(Ok(None)) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), running.child.wait()).await;
                return Err(format!(
                    "the agent service {program:?} exited before printing its URL; its stderr \
                     ends: {}",
                    running.last_words().await
                ));
            }
            Ok(Ok(Some(line))) => {
                let url = line.trim().to_string();
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    return Err(fail(
                        &running,
                        format!(
                            "printed {url:?} as its first line, which must be the http:// URL \
                             episodes are posted to"
                        ),
                    ));
                }
                running.url = url;
            }
        }
        // The rest of its stdout is read and dropped, so the service never blocks on a full
        // pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(script: &str, restarts: usize) -> AgentService {
        AgentService::new(
            vec!["sh".into(), "-c".into(), script.into()],
            None,
            Duration::from_secs(600),
            restarts,
        )
    }

    #[tokio::test]
    async fn the_url_is_the_first_line_and_the_service_is_reused() {
        let s = service("echo http://127.0.0.1:9/; exec tail -f /dev/null", 0);
        assert_eq!(s.url().await.unwrap(), "http://127.0.0.1:9/");
        assert_eq!(s.url().await.unwrap(), "http://127.0.0.1:9/");
        assert_eq!(s.state.lock().await.starts, 1);
    }

    #[tokio::test]
    async fn a_service_that_prints_no_url_is_refused_with_its_stderr() {
        let e = service(
            "echo 'listening'; echo 'port taken' >&2; exec tail -f /dev/null",
            0,
        )
        .url()
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"listening\" as its first line"), "{e}");
        let e = service("echo 'no module named verifiers' >&2; exit 3", 0)
            .url()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exited before printing its URL") && e.contains("no module named verifiers"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_service_that_exits_is_restarted_then_given_up() {
        // Prints its URL, then exits: dead by the next call.
        let s = service("echo http://127.0.0.1:9/; echo 'crashed' >&2; exit 1", 1);
        assert!(s.url().await.is_ok());
        s.state
            .lock()
            .await
            .running
            .as_mut()
            .unwrap()
            .child
            .wait()
            .await
            .unwrap();
        assert!(s.url().await.is_ok(), "restarted once");
        s.state
            .lock()
            .await
            .running
            .as_mut()
            .unwrap()
            .child
            .wait()
            .await
            .unwrap();
        let e = s.url().await.unwrap_err().to_string();
        assert!(
            e.contains("started 2 times")
                && e.contains("service_restarts 1")
                && e.contains("crashed"),
            "{e}"
        );
    }
}
