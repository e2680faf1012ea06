//! `agent-r1 train` as a child process for the tests that drive the binary: its stderr lines
//! arrive on a channel, every wait is bounded, and signals go to it by pid.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");
/// The most any one phase of a test may take: a bound against a hang, not a speed check,
/// so far above an idle machine's time (seconds) that a loaded one stays within it.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

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
        let mut args = vec![
            "train".to_string(),
            "--config".to_string(),
            config.display().to_string(),
            "--out".to_string(),
            out.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::command(&args)
    }

    /// Starts `agent-r1 ARGS...` (any subcommand: `worker --join ...`).
    pub fn command(args: &[String]) -> Self {
        Self::spawn(Command::new(BIN), args)
    }

    /// Starts `agent-r1 ARGS...` inside the network namespace `ns` (`ip netns exec`, which
    /// execs it: the child's pid is agent-r1's).
    pub fn command_in_netns(ns: &str, args: &[String]) -> Self {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, BIN]);
        Self::spawn(cmd, args)
    }

    fn spawn(mut cmd: Command, args: &[String]) -> Self {
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("AGENT_R1_LOG", "warn");
        let mut child = cmd.spawn().expect("starting agent-r1");
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

    /// Waits for exit (bounded) and returns (code, stdout, the whole stderr). A waiter thread
    /// reads stdout to its end and reaps the process, so the wait ends when the process does.
    pub fn finish(self) -> (Option<i32>, String, String) {
        let Trainer {
            mut child,
            lines,
            mut log,
        } = self;
        let pid = child.id();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            let _ = tx.send((child.wait(), out));
        });
        let (status, out) = match rx.recv_timeout(PHASE_TIMEOUT) {
            Ok((status, out)) => (status.unwrap(), out),
            Err(_) => {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
                panic!(
                    "train did not exit within {PHASE_TIMEOUT:?}; log:\n{}",
                    log.join("\n")
                );
            }
        };
        // The process has exited: its stderr ends, and the reader thread with it.
        while let Ok(line) = lines.recv_timeout(PHASE_TIMEOUT) {
            log.push(line);
        }
        (status.code(), out, log.join("\n"))
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
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// splitmix64: a kill schedule that is the same on every run of a test.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The newest `checkpoints/step-K` (a write in progress is a `.tmp-step-*` directory until
/// it commits by renaming).
pub fn newest_checkpoint(run: &Path) -> u64 {
    std::fs::read_dir(run.join("checkpoints"))
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("step-")?.parse::<u64>().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}
