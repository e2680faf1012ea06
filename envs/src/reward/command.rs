//! `command`: a scorer that is a program. Each finished episode runs it once, with the
//! episode as JSON on stdin:
//!
//! ```json
//! {"task": {"id", "question", "answers"}, "answer": "the last assistant message",
//!  "transcript": [{"role", "content"}], "env_score": {"reward", "metrics"}}
//! ```
//!
//! and reads the reward from its stdout: a JSON object with a number `reward`, or the first
//! number printed. A non-zero exit, no number, or no answer within `timeout_secs` is a failed
//! try (the process group is killed); `retries` more tries follow; `max_concurrency` runs
//! at once. The program gets an allow-listed environment, as MCP servers do.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::http_judge::first_number;
use super::scorer::{check_call_limits, with_retries, ConcurrencyLimit, Scorer};
use crate::env::Score;
use crate::error::{Error, Result};
use crate::kinds::KindOptions;
use crate::message::{Message, Role};
use crate::task::Task;
use crate::tools::mcp::client::BASE_ENV;

/// Most bytes read of the program's stdout and of its stderr.
const MAX_OUTPUT: u64 = 1 << 20;

/// `[scorer] type = "command"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandScorerOptions {
    /// The program.
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables of the trainer's environment it also gets (beside PATH, HOME, LANG, ...).
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// Limit for one run, seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Further tries after a failed one.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Runs at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
}

fn default_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    1
}
fn default_concurrency() -> usize {
    8
}

impl KindOptions for CommandScorerOptions {
    fn validate(&self) -> Result<()> {
        if self.command.as_os_str().is_empty() {
            return Err(Error::Config {
                key: "scorer.command".into(),
                message: "required: the scorer program".into(),
            });
        }
        check_call_limits(self.timeout_secs, self.retries, self.max_concurrency)
    }
}

/// The scorer.
pub struct CommandScorer {
    options: CommandScorerOptions,
    limit: ConcurrencyLimit,
}

impl CommandScorer {
    /// A scorer with `options` (already validated by the registry).
    pub fn new(options: CommandScorerOptions) -> Self {
        Self {
            limit: ConcurrencyLimit::new(options.max_concurrency),
            options,
        }
    }

    /// One run: the reward, or why there is none.
    fn run_once(&self, input: &[u8]) -> std::result::Result<f64, String> {
        let o = &self.options;
        let mut cmd = Command::new(&o.command);
        cmd.args(&o.args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for name in BASE_ENV
            .iter()
            .copied()
            .chain(o.env_passthrough.iter().map(String::as_str))
        {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", o.command.display()))?;
        let pid = child.id();
        let mut stdin = child.stdin.take();
        let input = input.to_vec();
        // Writes, reads and the wait happen on their own thread, so a program that never
        // reads or never exits costs this call its deadline, not a thread forever: past the
        // deadline its process group is killed, which ends them.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        std::thread::spawn(move || {
            let writer = std::thread::spawn(move || {
                if let Some(stdin) = stdin.as_mut() {
                    let _ = stdin.write_all(&input);
                }
            });
            let err_reader = std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(e) = stderr.as_mut() {
                    let _ = e.take(MAX_OUTPUT).read_to_string(&mut text);
                }
                text
            });
            let mut out = Vec::new();
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut out);
            }
            let status = child.wait();
            let _ = writer.join();
            let err = err_reader.join().unwrap_or_default();
            let _ = tx.send((status, out, err));
        });
        let limit = Duration::from_secs_f64(o.timeout_secs);
        let (status, out, err) = match rx.recv_timeout(limit) {
            Ok(done) => done,
            Err(_) => {
                // SAFETY: kill(2) on the process group the child leads; no memory involved.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
                return Err(format!("no answer within {limit:?} (killed)"));
            }
        };
        let status = status.map_err(|e| format!("waiting for it: {e}"))?;
        let out = String::from_utf8_lossy(&out);
        if !status.success() {
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            return Err(format!(
                "{status}; stderr: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        let reward = serde_json::from_str::<Value>(out.trim())
            .ok()
            .and_then(|v| v.get("reward").and_then(Value::as_f64))
            .or_else(|| first_number(&out));
        reward.ok_or_else(|| format!("no number in its output {:?}", out.trim()))
    }
}

impl Scorer for CommandScorer {
    fn name(&self) -> &str {
        "command"
    }

    fn score(&self, task: &Task, transcript: &[Message], env_score: &Score) -> Result<f64> {
        let answer = transcript
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map_or("", |m| m.content.as_str());
        let input = json!({
            "task": {"id": task.id, "question": task.question, "answers": task.answers},
            "answer": answer,
            "transcript": transcript
                .iter()
                .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
                .collect::<Vec<_>>(),
            "env_score": env_score,
        })
        .to_string();
        let o = &self.options;
        let what = o.command.display().to_string();
        with_retries(&self.limit, o.timeout_secs, o.retries, &what, || {
            self.run_once(input.as_bytes()).map_err(|why| (true, why))
        })
    }
}
