//! `agent-r1 train` as a child process for the tests that drive the binary: its stderr lines
//! arrive on a channel, every wait is bounded, and signals go to it by pid.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");
/// The most any one phase of a test may take.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

/// A running `agent-r1 train` whose stderr lines arrive on a channel.
pub struct Trainer {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Trainer {
    pub fn start(config: &Path, out: &Path, resume: bool) -> Self {
        let extra: &[&str] = if resume { &["--resume"] } else { &[] };
        Self::start_with(config, out, extra)
    }

    /// Starts `train --config CONFIG --out OUT EXTRA...`.
    pub fn start_with(config: &Path, out: &Path, extra: &[&str]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.arg("train")
            .arg("--config")
            .arg(config)
            .arg("--out")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("AGENT_R1_LOG", "warn");
        cmd.args(extra);
        let mut child = cmd.spawn().expect("starting agent-r1 train");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// Waits for a stderr line satisfying `pred` and returns it.
    pub fn wait_line(&mut self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no matching line within {PHASE_TIMEOUT:?}; log so far:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Waits for exit (bounded) and returns (code, stdout, the whole stderr).
    pub fn finish(mut self) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("train did not exit; log:\n{}", self.log.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.log.push(line);
        }
        (status.code(), out, self.log.join("\n"))
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

/// GET `path` from `addr` with a plain HTTP/1.0 request (bounded by timeouts).
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}
